/* The one door from the hooks to the container's quota (quota.c): every route that takes memory charges
 * through it before the driver call and gives the charge back through it after a failed call or a free;
 * spilled bytes go through it onto the region's host counter, and the driver's own memory (contexts,
 * modules) is noted through it. Nothing else in the shim writes a charge. `dev` is a GPU's region index
 * (dev_index, current_dev); every function here is a no-op, or a refusal, without a slot in the region. */
#ifndef MEMSLICE_QUOTA_H
#define MEMSLICE_QUOTA_H

#include <stdint.h>

#include "cuda_api.h"

/* quota_charge's `quiet`: a refusal is not counted or logged, because the caller decides what follows (it
 * spills to host memory, or refuses with figures of its own through quota_refuse). */
enum { QUOTA_LOUD = 0, QUOTA_QUIET = 1 };

/* Charge n bytes of HBM to the quota on dev. Past the quota dead processes are reclaimed (rate-limited when
 * oversubscribing) and the charge tried once more; a refusal is then counted and logged unless `quiet`.
 * CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY. */
CUresult quota_charge(int dev, uint64_t n, const char *call, int quiet);
/* Charge `want` bytes, or what is left of the quota when that is less (a context of unknown cost): the bytes
 * charged, 0 when nothing is left. */
uint64_t quota_charge_left(int dev, uint64_t want);
/* Charge n bytes whatever the quota: the driver took more than was charged (a pitch, an array, a pool,
 * memory NVML shows). */
void quota_force(int dev, uint64_t n);
/* Make a charge of `had` bytes one of `now` bytes, whatever the quota (the driver's figure after the call). */
void quota_settle(int dev, uint64_t had, uint64_t now);
/* Give n bytes back to the quota on dev. */
void quota_uncharge(int dev, uint64_t n);
/* Count and log a refusal of n bytes (after a quiet charge the caller could not serve another way). */
void quota_refuse(int dev, uint64_t n, const char *call);

/* Host memory (spill.c): charge n bytes to dev's host counter within the host spill cap, unless the host's
 * own memory cannot take them (`why_not`: the cgroup's or meminfo's figures, in words). 0, or -1 with the
 * refusal counted and logged. */
int quota_charge_host(int dev, uint64_t n, const char *call, const char *why_not);
void quota_uncharge_host(int dev, uint64_t n);

/* Note that n bytes of this process's charge on dev are the driver's own (contexts, limits, modules), or
 * (give_back) no longer: the region keeps them apart for the agent's metrics. */
void quota_note_taken(int dev, uint64_t n, int give_back);
/* What the container's processes have charged on dev, all of them. */
uint64_t quota_used(int dev);
/* What this process has charged on dev. */
uint64_t quota_mine(int dev);

#endif

/* Accounting glue between the hooks and the region: the container's region opened at start-up (and given
 * back at exit), which region device a CUDA ordinal is (by UUID, never by ordinal: ordinals change with
 * CUDA_VISIBLE_DEVICES), and the process-local table of what this process allocated. Charging the quota is
 * quota.c's. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ms_ptrmap.h"
#include "shim.h"

#define MAX_ORDINALS 64
static int g_devidx[MAX_ORDINALS];   /* ordinal -> region index + 1 (0 = not looked up yet) */
static ms_ptrmap g_ptrs; /* zero-initialised static storage: ready to use */

region_handle g_region;
int g_have_region;

/* Open the container's region (g_cfg.region_path) and claim this process's slot in it, at start-up
 * (lifecycle.c). A region that cannot be used fails closed; a usable one is swept once: a process start
 * reclaims what processes killed before it still hold. */
void accounting_open(void) {
    char err[1024];
    if (region_open(&g_region, g_cfg.region_path, 0, 0, NULL, NULL, err, sizeof err) < 0) {
        config_fail_closed("memslice: cannot use the shared region: %s.", err);
    } else if (region_claim(&g_region) < 0) {
        config_fail_closed("memslice: the shared region %s has no free process slot (%d processes); "
                           "raise no more processes in it.", g_cfg.region_path, MS_MAX_SLOTS);
    } else {
        g_have_region = 1;
        region_sweep(&g_region);
    }
}

/* A normal exit gives this process's charges back, and reclaims those of processes that died before it
 * (the last survivor of a container thus leaves its region exact). Processes exiting together can each
 * fail the other's sweep once (the region mutex held by one, or one inside an uncharge when the other
 * recounts a slot that died mid-charge: the chaos test's rare "825 MiB still charged"), so the sweep is
 * retried while dead slots remain, for MS_CALL_WAIT_MS at most; what is left then is named on stderr (the
 * next process of the container reclaims it). */
void accounting_at_exit(void) {
    if (!g_have_region) return;
    region_release(&g_region);
    struct timespec t0, now, pause = {0, 2000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int swept = region_sweep_now(&g_region), left = region_dead_slots(&g_region);
    for (long ms = 0; left > 0 && ms < MS_CALL_WAIT_MS; ) {
        nanosleep(&pause, NULL);
        swept = region_sweep_now(&g_region);
        left = region_dead_slots(&g_region);
        clock_gettime(CLOCK_MONOTONIC, &now);
        ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
    }
    if (left > 0)
        shim_log(LOG_WARN, "memslice: exiting with %d dead processes' charges unreclaimed in %s after %d ms (%s); "
                 "the container's next process reclaims them", left, g_cfg.region_path, MS_CALL_WAIT_MS,
                 swept < 0 ? strerror(g_region.lock_error) : "a live process stayed inside a charge: recount abandoned");
}

/* A forked child shares the region but not its parent's slot (the slot's byte lock is not inherited): it
 * claims one of its own at its first charge. */
void accounting_after_fork(void) {
    if (g_have_region) region_forget_slot(&g_region);
}

/* Enforcing a quota: MODE_ENFORCE with the region open. */
int enforcing(void) { return g_cfg.mode == MODE_ENFORCE && g_have_region; }
/* Charging at all (enforcing, or observing usage without a quota). */
int accounting(void) { return g_have_region && (g_cfg.mode == MODE_ENFORCE || g_cfg.mode == MODE_OBSERVE); }

/* The NVML-style UUID text of a CUDA ordinal, from the driver: how the region and NVML name a GPU. */
int uuid_text(CUdevice ordinal, char *text, unsigned len) {
    CUuuid u;
    __auto_type get_uuid = REAL(cuDeviceGetUuid_v2);
    if (!get_uuid) get_uuid = REAL(cuDeviceGetUuid);
    if (!get_uuid || get_uuid(&u, ordinal) != CUDA_SUCCESS) return -1;
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(text, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return 0;
}

/* The region index of a GPU named by UUID (NVML's hooks name GPUs that way), adding it if new; -1 without a region. */
int dev_index_by_uuid(const char *uuid, uint64_t physical_total) {
    if (!g_have_region) return -1;
    return region_device(&g_region, uuid, physical_total);
}

/* The region index of a CUDA ordinal, looked up once per ordinal (by UUID) and cached; the GPU's quota is
 * written with it. -1 if not accounted, DEV_UNCHARGEABLE if it must be charged and cannot be. */
int dev_index(CUdevice ordinal) {
    if (!g_have_region || ordinal < 0 || ordinal >= MAX_ORDINALS) return -1;
    int v = __atomic_load_n(&g_devidx[ordinal], __ATOMIC_ACQUIRE);
    if (v) return v - 1;
    size_t total = 0;
    __auto_type get_total = REAL(cuDeviceTotalMem_v2);
    char text[MS_UUID_LEN];
    if (uuid_text(ordinal, text, sizeof text) < 0) return -1;
    if (get_total) get_total(&total, ordinal);
    int idx = region_device(&g_region, text, total);
    if (idx == -2) {
        shim_log(LOG_ERROR, "memslice: GPU %s could not be added to the region %s: its device table was locked for more "
                 "than %d ms (%s; a stopped process of the container?); a later call retries", text,
                 g_cfg.region_path, MS_LOCK_WAIT_MS, strerror(g_region.lock_error));
        return enforcing() ? DEV_UNCHARGEABLE : -1;
    }
    if (idx >= 0) {
        __atomic_store_n(&g_region.r->dev[idx].limit, g_cfg.mode == MODE_ENFORCE ? g_cfg.limit : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&g_devidx[ordinal], idx + 1, __ATOMIC_RELEASE);
    } else {
        shim_log(LOG_ERROR, "memslice: the region has no room for GPU %s (%d GPUs at most)", text, MS_MAX_DEVICES);
        return enforcing() ? DEV_UNCHARGEABLE : -1;
    }
    return idx;
}

/* The region index of the current context's GPU (its ordinal into *ordinal): where an allocation is charged. */
int current_dev(CUdevice *ordinal) {
    __auto_type get = REAL(cuCtxGetDevice);
    CUdevice d;
    if (!get || get(&d) != CUDA_SUCCESS) return -1;
    if (ordinal) *ordinal = d;
    return dev_index(d);
}

/* Remember an allocation (pointer or handle) so that its free gives back exactly what was charged. */
int track(uint64_t key, uint64_t size, int dev, enum alloc_kind kind, uint64_t aux) {
    ms_rec r = {.key = key, .size = size, .aux = aux, .dev = dev, .kind = (uint32_t)kind};
    return ms_ptrmap_put(&g_ptrs, &r);
}

/* Forget an allocation, returning its record: 1 if it was ours. */
int untrack(uint64_t key, ms_rec *out) {
    return ms_ptrmap_take(&g_ptrs, key, out);
}

/* An allocation's record without forgetting it: 1 if it is ours. */
int lookup(uint64_t key, ms_rec *out) {
    return ms_ptrmap_get(&g_ptrs, key, out);
}

/* The record of the allocation containing addr (slow: prefetch only). */
int lookup_range(uint64_t addr, ms_rec *out) { return ms_ptrmap_find_range(&g_ptrs, addr, out); }

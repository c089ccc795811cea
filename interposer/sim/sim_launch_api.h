/* Kernels on the simulated GPU: function handles (simcuda_module.c), launches and host functions
 * (simcuda_launch.c), and how streams, contexts and events find their place on the GPU's timeline
 * (simtimeline.h). Every exported function has its prototype here or in cuda_api.h (-Wmissing-prototypes). */
#ifndef MEMSLICE_SIM_LAUNCH_API_H
#define MEMSLICE_SIM_LAUNCH_API_H

#include "cuda_api.h"
#include "sim_internal.h"
#include "simtimeline.h"

typedef struct CUkern_st *CUkernel;
typedef void (*CUhostFn)(void *userData);

/* A function of a loaded image: `spin` (or its C++-mangled _Z4spin...) occupies the GPU for its first
 * parameter's nanoseconds; any other name for SIM_KERNEL_NS. */
#define SIM_FUNC_MAGIC 0x46554e43u
#define SIM_FUNC_NAME 128
#define SIM_KERNEL_NS 2000ull
#define SIM_SPIN_MAX_NS (600ull * 1000000000ull)   /* a spin longer than 10 minutes is refused */
#define SIM_SYNC_NS (60ull * 1000000000ull)        /* a synchronisation gives up after a minute */
struct sim_func { uint32_t magic; int spin; char name[SIM_FUNC_NAME]; struct sim_func *next; };
struct sim_func *sim_func_of(CUfunction f);      /* NULL for anything that is not a live function */

/* Where the work queued so far on stream s (0, legacy, per-thread, or created) completes: its context's
 * client and completion point. CUDA_SUCCESS, or the error the stream handle deserves. */
CUresult sim_stream_point(CUstream s, struct tl_ref *ref, uint64_t *target);
/* Record that the stream's queued work now ends at target (a launch on a created stream). */
void sim_stream_set_target(CUstream s, uint64_t target);
/* Wait (bounded by SIM_SYNC_NS) for everything queued on s; for everything of the current context when
 * s is NULL and ctx_wide. */
CUresult sim_stream_drain(CUstream s, int ctx_wide);

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name);
CUresult cuKernelGetFunction(CUfunction *f, CUkernel k);
CUresult cuFuncGetName(const char **name, CUfunction f);
CUresult cuKernelGetName(const char **name, CUkernel k);
CUresult cuFuncGetAttribute(int *v, int attrib, CUfunction f);
CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value);
CUresult cuFuncSetCacheConfig(CUfunction f, int config);
CUresult cuKernelGetAttribute(int *v, int attrib, CUkernel k, CUdevice dev);
CUresult cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev);
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data);
CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data);

#endif

/* Work submission in elastic mode: kernel launches, graph launches, copies and sets pass the work gate
 * (elastic.c) so that none is submitted while this process moves an elastic range between HBM and host
 * memory, and each counts as activity (a process that makes none for idle_after is idle). Without elastic
 * mode the gate is one predictable branch. Every hook here forwards its arguments unchanged. */
#define _GNU_SOURCE
#include "shim.h"

/* One gated forwarder per entry point: PROLOGUE, the gate around the driver's own call. */
#define GATED(name, params, args)                                                                          \
    HOOK CUresult CUDAAPI name params {                                                                    \
        PROLOGUE();                                                                                        \
        __auto_type real = REAL(name);                                                                     \
        if (!real) return CUDA_ERROR_NOT_SUPPORTED;                                                        \
        work_enter();                                                                                      \
        CUresult rc = real args;                                                                           \
        work_exit();                                                                                       \
        return rc;                                                                                         \
    }

/* Kernel launches: a kernel may read or write any elastic range. */
GATED(cuLaunchKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                       unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params, void **extra),
      (f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
GATED(cuLaunchKernel_ptsz, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params,
                            void **extra),
      (f, gx, gy, gz, bx, by, bz, shm, s, params, extra))
GATED(cuLaunchKernelEx, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), (c, f, params, extra))
GATED(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra),
      (c, f, params, extra))
GATED(cuLaunchCooperativeKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params),
      (f, gx, gy, gz, bx, by, bz, shm, s, params))
GATED(cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                       CUstream s, void **params),
      (f, gx, gy, gz, bx, by, bz, shm, s, params))
/* Graph launches: a graph's kernels and copies may touch any elastic range. */
GATED(cuGraphLaunch, (CUgraphExec g, CUstream s), (g, s))
GATED(cuGraphLaunch_ptsz, (CUgraphExec g, CUstream s), (g, s))
/* Copies: either side may be an elastic range. */
GATED(cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
GATED(cuMemcpy_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
GATED(cuMemcpyAsync, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyAsync_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
GATED(cuMemcpyHtoD_v2, (CUdeviceptr d, const void *h, size_t n), (d, h, n))
GATED(cuMemcpyHtoD_v2_ptds, (CUdeviceptr d, const void *h, size_t n), (d, h, n))
GATED(cuMemcpyDtoH_v2, (void *h, CUdeviceptr d, size_t n), (h, d, n))
GATED(cuMemcpyDtoH_v2_ptds, (void *h, CUdeviceptr d, size_t n), (h, d, n))
GATED(cuMemcpyHtoDAsync_v2, (CUdeviceptr d, const void *h, size_t n, CUstream st), (d, h, n, st))
GATED(cuMemcpyDtoHAsync_v2, (void *h, CUdeviceptr d, size_t n, CUstream st), (h, d, n, st))
/* Sets: the destination may be an elastic range. */
GATED(cuMemsetD8_v2, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))
GATED(cuMemsetD8_v2_ptds, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))
GATED(cuMemsetD32_v2, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))

/* A tenant's own libnvidia-ml.so.1 that lies (issue 35 item 2): every call is answered by the NVML named in
 * LYING_NVML_REAL (the simulated one), except that the per-process list reports 0 bytes for every process,
 * so a shim that measured contexts through it would charge them nothing. Built by the test as a shared
 * library with the soname libnvidia-ml.so.1 and put first in LD_LIBRARY_PATH (or named as nvml_path). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

#include "cuda_api.h"

#define EXPORT __attribute__((visibility("default")))

/* The honest NVML's function `name`, or NULL. Looked up with glibc's own dlsym: the preloaded shim's
 * exported dlsym answers NVML names with its hooks, which would call back into this library. */
static void *honest(const char *name) {
    static void *h;
    static void *(*real_dlsym)(void *, const char *);
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!h) {
        const char *path = getenv("LYING_NVML_REAL");
        h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    }
    return h && real_dlsym ? real_dlsym(h, name) : NULL;
}

#define FORWARD(name, params, args)                                                                        \
    EXPORT nvmlReturn_t name params {                                                                      \
        __typeof__(&name) f = (__typeof__(&name))honest(#name);                                            \
        return f ? f args : NVML_ERROR_UNINITIALIZED;                                                      \
    }

FORWARD(nvmlInit_v2, (void), ())
FORWARD(nvmlShutdown, (void), ())
FORWARD(nvmlDeviceGetCount_v2, (unsigned int *n), (n))
FORWARD(nvmlDeviceGetHandleByIndex_v2, (unsigned int i, nvmlDevice_t *d), (i, d))
FORWARD(nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *d), (uuid, d))
FORWARD(nvmlDeviceGetUUID, (nvmlDevice_t d, char *uuid, unsigned int n), (d, uuid, n))
FORWARD(nvmlDeviceGetMemoryInfo, (nvmlDevice_t d, nvmlMemory_t *m), (d, m))
FORWARD(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t d, nvmlMemory_v2_t *m), (d, m))

/* The lie: every process listed, each using nothing. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p) {
    __typeof__(&nvmlDeviceGetComputeRunningProcesses_v3) f =
        (__typeof__(&nvmlDeviceGetComputeRunningProcesses_v3))honest("nvmlDeviceGetComputeRunningProcesses_v3");
    nvmlReturn_t rc = f ? f(d, n, p) : NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; rc == NVML_SUCCESS && p && i < *n; i++) p[i].usedGpuMemory = 0;
    return rc;
}

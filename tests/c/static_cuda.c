/* A statically linked program that reaches the CUDA driver the only way a static binary can: dlopen of
 * libcuda.so.1 at run time. No dynamic loader runs at its start, so /etc/ld.so.preload is never read and the
 * shim is never loaded (tests/deploy/test_deploy_ld_so_preload.py asserts what that means). It asks the driver for
 * the device's size and allocates nothing: with glibc's static dlopen the loaded library gets a libc of its
 * own, and the simulated driver faults at its first thread-local access (making a context), which says
 * nothing about memslice. Prints whether libmemslice.so is mapped before and after, and what it was told. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

/* 1 when a mapping of this process names libmemslice.so (the shim), else 0; -1 if /proc cannot be read. */
static int shim_mapped(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) found |= strstr(line, "libmemslice.so") != NULL;
    fclose(f);
    return found;
}

/* name##_p: the driver's `name`, typed from its prototype in cuda_api.h (never bound at link time). */
#define LOOK(name) __typeof__(&name) name##_p = (__typeof__(&name))dlsym(lib, #name)

/* Loads the driver by dlopen and prints what it says about device 0, one key=value per line. */
int main(void) {
    printf("shim_mapped=%d\n", shim_mapped());
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    printf("dlopen=%d\n", lib != NULL);
    if (!lib) { printf("dlerror=%s\n", dlerror()); return 2; }
    LOOK(cuInit);
    LOOK(cuDeviceGet);
    LOOK(cuDeviceTotalMem_v2);
    if (!cuInit_p || !cuDeviceGet_p || !cuDeviceTotalMem_v2_p) { printf("dlsym failed\n"); return 2; }
    CUdevice dev;
    size_t total = 0;
    CUresult rc = cuInit_p(0);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGet_p(&dev, 0);
    if (rc == CUDA_SUCCESS) rc = cuDeviceTotalMem_v2_p(&total, dev);
    printf("rc=%d\ndevtotal_mib=%zu\n", (int)rc, total >> 20);
    printf("shim_mapped_after=%d\n", shim_mapped());
    return 0;
}

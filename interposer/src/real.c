/* Finding the driver's own functions without ever calling our own exported dlsym (which would recurse).
 * glibc's real dlsym is taken with dlvsym(RTLD_NEXT, "dlsym", <version>); the versions are those glibc
 * has used for dlsym on the architectures we build for. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#include "shim.h"

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;
static void *g_cuda, *g_nvml;

static dlsym_fn get_real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (f) return f;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !f; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

void *real_dlsym_call(void *handle, const char *name) {
    dlsym_fn f = get_real_dlsym();
    return f ? f(handle, name) : NULL;
}

/* The driver library as the application would find it (same name, same search path). */
void *real_cuda(const char *name) {
    void *h = __atomic_load_n(&g_cuda, __ATOMIC_ACQUIRE);
    if (!h) {
        h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY);
        if (!h) return NULL;
        __atomic_store_n(&g_cuda, h, __ATOMIC_RELEASE);
    }
    return real_dlsym_call(h, name);
}

void *real_nvml(const char *name) {
    void *h = __atomic_load_n(&g_nvml, __ATOMIC_ACQUIRE);
    if (!h) {
        h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h) h = dlopen("libnvidia-ml.so.1", RTLD_LAZY);
        if (!h) return NULL;
        __atomic_store_n(&g_nvml, h, __ATOMIC_RELEASE);
    }
    return real_dlsym_call(h, name);
}

/* Our dlsym. Every cu* and nvml* name is routed through the hook table whatever the handle
 * (RTLD_NEXT included, which is how some libraries try to reach "the real" driver function); everything
 * else is a tail call into glibc, so glibc still sees its caller's return address (RTLD_NEXT keeps its
 * meaning for other libraries' own interposers). */
__attribute__((noinline)) static void *hooked_dlsym(void *handle, const char *name) {
    void *r = real_dlsym_call(handle, name);
    void *h = hook_for_name(name);
    if (!h) return r;
    if (r) return h;
    /* RTLD_NEXT/RTLD_DEFAULT from a caller that loaded the driver privately: the hook still applies if the
     * driver has the symbol at all. */
    return (name[0] == 'c' ? real_cuda(name) : real_nvml(name)) ? h : NULL;
}

HOOK void *dlsym(void *handle, const char *name) {
    if (((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v' && name[2] == 'm')))
        return hooked_dlsym(handle, name);
    return get_real_dlsym()(handle, name);
}

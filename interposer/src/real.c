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

/* The sanitizer runtimes look their interceptors up through dlsym before their shadow memory exists, so the
 * code on that path (the trampoline's target choice and glibc's dlsym) must not be instrumented. */
#define NOT_INSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

/* glibc's own dlsym, found once. */
NOT_INSTRUMENTED static dlsym_fn get_real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (f) return f;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !f; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

/* glibc's dlsym on a handle (never our exported one, which would route back to the hooks). */
void *real_dlsym_call(void *handle, const char *name) {
    dlsym_fn f = get_real_dlsym();
    return f ? f(handle, name) : NULL;
}

/* A driver library: the node's own file when the limits name it (nvml_path, cuda_path: a
 * tenant's copy earlier in its library path must not answer the shim's measurements), else by name as the
 * application would find it. Loaded by path first, its soname then answers the application's own dlopen by
 * name too. NULL if it cannot be loaded. */
static void *open_driver_lib(const char *trusted, const char *soname) {
    if (!trusted[0]) {
        void *h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
        return h ? h : dlopen(soname, RTLD_LAZY);
    }
    void *h = dlopen(trusted, RTLD_LAZY);
    if (!h) shim_log(LOG_ERROR, "memslice: the node's driver library %s cannot be loaded (%s)", trusted, dlerror());
    return h;
}

/* One driver per process: a libcuda.so.1 loaded before the node's (a direct binding through the tenant's
 * library path) is another library than the one the shim calls and measures with, so nothing is allowed. */
static void require_one_driver(void *trusted) {
    void *first = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (first && first != trusted) {
        config_fail_closed("memslice: this process loaded a libcuda.so.1 other than the node's driver %s (cuda_path); "
                           "remove the other copy from LD_LIBRARY_PATH or the image.", g_cfg.cuda_path);
        shim_log(LOG_ERROR, "%s", g_cfg.error);
    }
    if (first) dlclose(first);
}

/* The handle of a driver library, opened once (after the configuration is read, which names it). */
static void *driver_lib(void **cache, const char *trusted, const char *soname, int is_cuda) {
    void *h = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (h) return h;
    config_ensure();
    h = open_driver_lib(trusted, soname);
    if (!h) return NULL;
    void *prev = NULL;
    if (!__atomic_compare_exchange_n(cache, &prev, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        dlclose(h); /* another thread won: one reference is enough */
        return prev;
    }
    if (is_cuda && trusted[0]) require_one_driver(h);
    return h;
}

/* The driver library (the node's, else as the application would find it). */
void *real_cuda(const char *name) {
    void *h = driver_lib(&g_cuda, g_cfg.cuda_path, "libcuda.so.1", 1);
    return h ? real_dlsym_call(h, name) : NULL;
}

/* NVML (the node's, else as the application would find it). */
void *real_nvml(const char *name) {
    void *h = driver_lib(&g_nvml, g_cfg.nvml_path, "libnvidia-ml.so.1", 0);
    return h ? real_dlsym_call(h, name) : NULL;
}

/* Our dlsym. Every cu* and nvml* name is routed through the hook table whatever the handle
 * (RTLD_NEXT included, which is how some libraries try to reach "the real" driver function); everything
 * else goes to glibc's dlsym. */
__attribute__((noinline)) static void *hooked_dlsym(void *handle, const char *name) {
    void *r = real_dlsym_call(handle, name);
    void *h = hook_for_name(name);
    if (!h) return r;
    if (r) return h;
    /* RTLD_NEXT/RTLD_DEFAULT from a caller that loaded the driver privately: the hook still applies if the
     * driver has the symbol at all. */
    return (name[0] == 'c' && name[1] == 'u' ? real_cuda(name) : real_nvml(name)) ? h : NULL;
}

/* Which function the exported dlsym continues in: ours for driver names, else glibc's. Called only by
 * the trampoline below, which then jumps there with the caller's own return address still in place. */
void *ms_dlsym_target(const void *handle, const char *name);
NOT_INSTRUMENTED void *ms_dlsym_target(const void *handle, const char *name) {
    (void)handle;
    if (name && ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v' && name[2] == 'm')))
        return (void *)hooked_dlsym;
    return (void *)get_real_dlsym();
}

/* The exported dlsym is a trampoline that JUMPS (never calls) into glibc's dlsym or into hooked_dlsym.
 * glibc resolves RTLD_NEXT (and RTLD_DEFAULT's scope) relative to the object its caller's return address
 * lies in; a C wrapper that calls glibc puts libmemslice there instead, so another preloaded library's
 * dlsym(RTLD_NEXT, "puts") would get its own puts back (and an ASan runtime's interceptor set-up would
 * recurse). A C tail call keeps the caller's address only where the compiler chooses to make it one
 * (-O2, not -O0/-O1, not under the sanitizers); GCC 12 has no `musttail`, so the jump is written out.
 * The arguments are saved across the choice and restored for the target. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"                 /* 16-byte stack alignment at the call */
        "  .cfi_adjust_cfa_offset 8\n"
        "  call ms_dlsym_target\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  jmp *%rax\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  stp x29, x30, [sp, #-32]!\n"
        "  .cfi_def_cfa_offset 32\n"
        "  .cfi_offset 29, -32\n"
        "  .cfi_offset 30, -24\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl ms_dlsym_target\n"
        "  mov x16, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  .cfi_restore 30\n"
        "  .cfi_restore 29\n"
        "  .cfi_def_cfa_offset 0\n"
        "  br x16\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
#error "libmemslice: write the dlsym trampoline for this architecture (see the comment above)"
#endif

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

/* NVML as the application would find it (same name, same search path). */
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

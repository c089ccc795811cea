/* Another library's interposer, preloaded after the shim (`make check`, tests/shim/test_shim_routes.py):
 * dlsym(RTLD_NEXT) must mean "after me", not "after libmemslice" (else this finds itself). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

__attribute__((visibility("default"))) int puts(const char *s);

/* puts, prefixed with "wrapped: "; -1 if RTLD_NEXT handed back this very function. */
__attribute__((visibility("default"))) int puts(const char *s) {
    int (*next)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
    if (!next || next == puts) return -1;
    fputs("wrapped: ", stdout);
    return next(s);
}

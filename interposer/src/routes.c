/* The routing table: exported wrapper name -> wrapper, and the driver's function of the same name.
 * Every name in hooks.def is declared in cuda_api.h, so a hook listed here without a prototype (or with a
 * misspelt name) does not compile. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "shim.h"

struct route { const char *name; void *hook; void *real; };
#define HOOK_ENTRY(name) {#name, (void *)name, NULL},
static struct route g_routes[] = {
#include "hooks.def"
};
#undef HOOK_ENTRY
#define NROUTES (sizeof g_routes / sizeof g_routes[0])
static pthread_once_t g_routes_once = PTHREAD_ONCE_INIT;

/* Find the driver's own function for every hooked name (once, on the first cuGetProcAddress). */
static void build_routes(void) {
    for (size_t i = 0; i < NROUTES; i++)
        g_routes[i].real = strncmp(g_routes[i].name, "nvml", 4) == 0 ? real_nvml(g_routes[i].name)
                                                                      : real_cuda(g_routes[i].name);
}

/* Our wrapper for an exact exported name, or NULL (dlsym routing). */
void *hook_for_name(const char *name) {
    for (size_t i = 0; i < NROUTES; i++)
        if (strcmp(g_routes[i].name, name) == 0) return g_routes[i].hook;
    return NULL;
}

/* Our wrapper for the driver function at this address, or NULL (cuGetProcAddress routing). */
void *hook_for_real(void *real_fn) {
    pthread_once(&g_routes_once, build_routes);
    for (size_t i = 0; i < NROUTES; i++)
        if (g_routes[i].real == real_fn) return g_routes[i].hook;
    return NULL;
}


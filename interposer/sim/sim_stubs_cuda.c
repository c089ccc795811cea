/* Every function the public cuda.h declares, so that a client resolving any of them (by name, or through
 * cuGetProcAddress) finds it. Each is a weak stub answering CUDA_ERROR_NOT_SUPPORTED, as a driver without
 * the feature does; what the simulator models is a strong definition elsewhere that replaces the stub at
 * link time. The list is cuda_exports.def, generated from the toolkit's headers by gen_exports.py. */
#include "sim_internal.h"

#include <string.h>

/* A stub takes no parameters: on the SysV ABIs the caller owns its arguments, so ignoring them is safe. */
#define SIM_STUB(sym) \
    int sym(void); \
    __attribute__((weak, visibility("default"))) int sym(void) { return CUDA_ERROR_NOT_SUPPORTED; }
#define SIM_PROC(base, ver, ptds, sym)
#include "cuda_exports.def"
#undef SIM_STUB
#undef SIM_PROC

struct sim_proc { const char *base; int ver; int ptds; void *fn; };
#define SIM_STUB(sym)
#define SIM_PROC(base, ver, ptds, sym) {base, ver, ptds, (void *)sym},
static const struct sim_proc g_generated[] = {
#include "cuda_exports.def"
};

/* cuGetProcAddress's rules over the generated table: the newest variant introduced at or before
 * cuda_version; a per-thread-default-stream request takes the _ptsz/_ptds variant where one exists. */
void *sim_proc_lookup(const char *symbol, int cuda_version, int want_ptds, int *known) {
    const struct sim_proc *best = NULL, *best_ptds = NULL;
    *known = 0;
    for (size_t i = 0; i < sizeof g_generated / sizeof g_generated[0]; i++) {
        const struct sim_proc *p = &g_generated[i];
        if (strcmp(p->base, symbol) != 0) continue;
        *known = 1;
        if (p->ver > cuda_version) continue;
        if (p->ptds) { if (!best_ptds || p->ver > best_ptds->ver) best_ptds = p; }
        else if (!best || p->ver > best->ver) best = p;
    }
    const struct sim_proc *pick = want_ptds && best_ptds ? best_ptds : best;
    return pick ? pick->fn : NULL;
}

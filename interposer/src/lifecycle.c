/* Start-up, fork and exit of the shim: the one place that calls each part's start and after-fork handler,
 * in order; no part calls back into it.
 *
 * No constructor: the shim starts on the first CUDA or NVML call it sees (PROLOGUE -> ensure_init ->
 * shim_init), so merely being preloaded into a process that never touches the GPU (a shell, `ls`) costs
 * nothing and can fail nothing. Start-up, once (pthread_once):
 *   1. config_ensure        the limits file and the environment into g_cfg (fails closed on a bad value);
 *                           real.c may have done it already, to choose the driver libraries
 *   2. accounting_open      the container's region and this process's slot in it (when a region is set)
 *   3. atexit               accounting_at_exit: the charges go back at a normal exit
 *   4. pthread_atfork       after_fork_child below
 *   5. elastic_start        elastic mode on when 0 < request < limit (enforcing only)
 *   6. compute_start        the compute share on when a request, limit or compute directory is set
 * then the shim is ready. In a forked child: accounting_after_fork (its own slot), ctx_after_fork (no context
 * charged), measure_after_fork (no measured memory), elastic_after_fork (no ranges, threads nor board slot), compute_after_fork (no events, thread nor record). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "shim.h"

volatile int g_shim_ready;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The pthread_atfork child handler: each part forgets what belongs to the parent, in start-up order. */
static void after_fork_child(void) {
    accounting_after_fork();
    ctx_after_fork();
    measure_after_fork();
    elastic_after_fork();
    compute_after_fork();
}

/* Say once, at start-up, what the shim enforces (or why it fails closed). */
static void log_started(void) {
    if (g_cfg.mode == MODE_FAIL_CLOSED) {
        shim_log(LOG_ERROR, "%s", g_cfg.error);
    } else if (g_cfg.mode == MODE_ENFORCE) {
        char a[32];
        shim_log(LOG_INFO, "memslice: enforcing %s per GPU (region %s)%s", fmt_bytes(g_cfg.limit, a, sizeof a),
                 g_cfg.region_path, g_cfg.oversubscribe ? ", oversubscription on" : "");
    }
}

/* Start every part, in order (see the top of this file). */
static void init_once(void) {
    config_ensure();
    if (g_cfg.mode != MODE_FAIL_CLOSED && g_cfg.region_path[0]) {
        accounting_open();
        if (g_have_region) atexit(accounting_at_exit);
    }
    pthread_atfork(NULL, NULL, after_fork_child);
    if (enforcing()) elastic_start();
    if (g_cfg.mode != MODE_FAIL_CLOSED) compute_start();
    log_started();
    __atomic_store_n(&g_shim_ready, 1, __ATOMIC_RELEASE);
}

/* Start the shim, once, whichever thread comes first; the others wait for it. */
void shim_init(void) { pthread_once(&g_once, init_once); }

/* What every CUDA call answers while the configuration is bad. */
CUresult fail_closed_result(void) { return CUDA_ERROR_NOT_PERMITTED; }

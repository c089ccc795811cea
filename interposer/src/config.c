/* Configuration (read once from the environment), logging, and start-up of the shim.
 * No constructor: the shim starts on the first CUDA or NVML call it sees, so merely being preloaded into
 * a process that never touches the GPU (a shell, `ls`) costs nothing and can fail nothing. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ms_size.h"
#include "shim.h"

struct shim_config g_cfg;
ms_ledger g_ledger;
int g_have_ledger;
volatile int g_shim_ready;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const char *fmt_bytes(uint64_t b, char *buf, unsigned len) {
    if (b >= (1ull << 30)) snprintf(buf, len, "%.1f GiB", (double)b / (1ull << 30));
    else snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
    return buf;
}

void shim_log(enum log_level lvl, const char *fmt, ...) {
    if (lvl > g_cfg.log_level) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(2, line, (size_t)n); /* one write: lines from several processes do not interleave */
    (void)w;
}

/* One line per second at most, with how many refusals it stands for. */
void shim_log_refusal(const char *call, uint64_t request, int dev, int host) {
    static uint64_t last_ns;
    static unsigned suppressed;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t prev = __atomic_load_n(&last_ns, __ATOMIC_RELAXED);
    if (prev && now - prev < 1000000000ull) {
        __atomic_fetch_add(&suppressed, 1, __ATOMIC_RELAXED);
        return;
    }
    if (!__atomic_compare_exchange_n(&last_ns, &prev, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&suppressed, 1, __ATOMIC_RELAXED);
        return;
    }
    unsigned more = __atomic_exchange_n(&suppressed, 0, __ATOMIC_RELAXED);
    char a[32], b[32], c[32];
    const struct ms_device *d = &g_ledger.r->dev[dev];
    char tail[64] = "";
    if (more) snprintf(tail, sizeof tail, " (+%u more refused since the last message)", more);
    if (!host)
        shim_log(LOG_ERROR,
                 "memslice: %s of %s refused on %s: the container uses %s of its %s quota "
                 "(MEMSLICE_GPU_MEM_LIMIT=%s)%s",
                 call, fmt_bytes(request, a, sizeof a), d->uuid, fmt_bytes(ms_bytes(d->used), b, sizeof b),
                 fmt_bytes(g_cfg.limit, c, sizeof c), g_cfg.limit_text, tail);
    else
        shim_log(LOG_ERROR, "memslice: %s of %s could not spill to host memory on %s: %s already spilled%s",
                 call, fmt_bytes(request, a, sizeof a), d->uuid, fmt_bytes(ms_bytes(d->host_used), b, sizeof b),
                 tail);
}

static void fail_closed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_closed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_cfg.error, sizeof g_cfg.error, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof g_cfg.error)
        snprintf(g_cfg.error + n, sizeof g_cfg.error - (size_t)n, " Every CUDA call fails until this is fixed.");
    g_cfg.mode = MODE_FAIL_CLOSED;
}

/* Parse a size variable; 0 if absent (and *out untouched), 1 if read, -1 if malformed (fail closed). */
static int size_env(const char *name, uint64_t *out, int allow_zero) {
    const char *v = getenv(name);
    if (!v) return 0;
    uint64_t b;
    if (ms_parse_size(v, &b) < 0 || (!allow_zero && b == 0)) {
        size_t n = strlen(v);
        int decimal = n >= 2 && (v[n - 1] == 'B' || v[n - 1] == 'b') && strchr("KMGTkmgt", v[n - 2]);
        fail_closed("memslice: %s='%s' is not a valid size%s; use %s%s.",
                    name, v, decimal ? " (decimal units are ambiguous; write GiB/MiB)" : "", MS_SIZE_HELP,
                    allow_zero ? " (0 allowed)" : ", greater than zero");
        return -1;
    }
    *out = b;
    return 1;
}

static void read_config(void) {
    struct shim_config *c = &g_cfg;
    c->log_level = LOG_WARN;
    const char *lv = getenv("MEMSLICE_LOG");
    if (lv) {
        static const char *names[] = {"error", "warn", "info", "debug"};
        int found = -1;
        for (int i = 0; i < 4; i++) if (strcmp(lv, names[i]) == 0) found = i;
        if (found < 0) {
            fail_closed("memslice: MEMSLICE_LOG='%s' is not a log level; use error, warn, info or debug.", lv);
            return;
        }
        c->log_level = (enum log_level)found;
    }
    c->context_reserve = 300ull << 20;
    if (size_env("MEMSLICE_CONTEXT_RESERVE", &c->context_reserve, 1) < 0) return;
    const char *lim = getenv("MEMSLICE_GPU_MEM_LIMIT");
    c->limit = UINT64_MAX >> 2;
    if (lim) {
        snprintf(c->limit_text, sizeof c->limit_text, "%s", lim);
        if (size_env("MEMSLICE_GPU_MEM_LIMIT", &c->limit, 0) < 0) return;
        c->mode = MODE_ENFORCE;
    }
    const char *os = getenv("MEMSLICE_OVERSUBSCRIBE");
    if (os) {
        if (strcmp(os, "1") == 0 || strcmp(os, "true") == 0) c->oversubscribe = 1;
        else if (strcmp(os, "0") != 0 && strcmp(os, "false") != 0 && *os) {
            fail_closed("memslice: MEMSLICE_OVERSUBSCRIBE='%s' is not valid; use 1 (on) or 0 (off).", os);
            return;
        }
    }
    if (size_env("MEMSLICE_HOST_SPILL_LIMIT", &c->spill_limit, 1) < 0) return;
    if (size_env("MEMSLICE_CGROUP_MARGIN", &c->cgroup_margin, 1) < 0) return;
    const char *cg = getenv("MEMSLICE_CGROUP_DIR");
    if (cg) snprintf(c->cgroup_dir, sizeof c->cgroup_dir, "%s", cg);
    const char *dir = getenv("MEMSLICE_REGION_DIR");
    if (dir && *dir) {
        struct stat st;
        if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK) < 0) {
            fail_closed("memslice: MEMSLICE_REGION_DIR='%s' is not a writable directory (%s); point it at the "
                        "directory shared by the container's processes.",
                        dir, errno ? strerror(errno) : "not a directory");
            return;
        }
        snprintf(c->region_path, sizeof c->region_path, "%s/%s", dir, MS_REGION_FILE);
        if (c->mode == MODE_PASSTHROUGH) c->mode = MODE_OBSERVE;
    } else if (c->mode == MODE_ENFORCE) {
        fail_closed("memslice: MEMSLICE_GPU_MEM_LIMIT is set but MEMSLICE_REGION_DIR is not; set it to a directory "
                    "shared by all processes of the container (`memslice run` does this for you).");
        return;
    }
}

static void release_at_exit(void) {
    if (g_have_ledger) ms_ledger_release(&g_ledger);
}

void reset_after_fork(void); /* accounting.c */
static void after_fork_child(void) {
    if (g_have_ledger) ms_ledger_forget_slot(&g_ledger);
    reset_after_fork();
}

static void init_once(void) {
    read_config();
    if (g_cfg.mode == MODE_FAIL_CLOSED) {
        shim_log(LOG_ERROR, "%s", g_cfg.error);
    } else if (g_cfg.region_path[0]) {
        char err[512];
        if (ms_ledger_open(&g_ledger, g_cfg.region_path, 0, 0, NULL, NULL, err, sizeof err) < 0) {
            fail_closed("memslice: cannot use the shared region: %s.", err);
            shim_log(LOG_ERROR, "%s", g_cfg.error);
        } else if (ms_ledger_claim(&g_ledger) < 0) {
            fail_closed("memslice: the shared region %s has no free process slot (%d processes); "
                        "raise no more processes in it.", g_cfg.region_path, MS_MAX_SLOTS);
            shim_log(LOG_ERROR, "%s", g_cfg.error);
        } else {
            g_have_ledger = 1;
            atexit(release_at_exit);
        }
    }
    pthread_atfork(NULL, NULL, after_fork_child);
    if (g_cfg.mode == MODE_ENFORCE) {
        char a[32];
        shim_log(LOG_INFO, "memslice: enforcing %s per GPU (region %s)%s", fmt_bytes(g_cfg.limit, a, sizeof a),
                 g_cfg.region_path, g_cfg.oversubscribe ? ", oversubscription on" : "");
    }
    __atomic_store_n(&g_shim_ready, 1, __ATOMIC_RELEASE);
}

void shim_init(void) { pthread_once(&g_once, init_once); }

CUresult fail_closed_result(void) { return CUDA_ERROR_NOT_PERMITTED; }
int enforcing(void) { return g_cfg.mode == MODE_ENFORCE && g_have_ledger; }
int accounting(void) { return g_have_ledger && (g_cfg.mode == MODE_ENFORCE || g_cfg.mode == MODE_OBSERVE); }

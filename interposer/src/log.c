/* Logging: one line per write to stderr (lines from several processes never interleave), byte counts for
 * people, and the rate-limited line of a refusal. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

/* Bytes as people read them: GiB from 1 GiB up, else MiB, one decimal. */
const char *fmt_bytes(uint64_t b, char *buf, unsigned len) {
    if (b >= (1ull << 30)) snprintf(buf, len, "%.1f GiB", (double)b / (1ull << 30));
    else snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
    return buf;
}

/* One line at level lvl or more important, written with a single write(2). */
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
                 "memslice: %s of %s refused on %.48s: the container uses %s of its %s quota (%s)%s",
                 call, fmt_bytes(request, a, sizeof a), d->uuid, fmt_bytes(ms_bytes(d->used), b, sizeof b),
                 fmt_bytes(g_cfg.limit, c, sizeof c), g_cfg.limit_source, tail);
    else
        shim_log(LOG_ERROR, "memslice: %s of %s could not spill to host memory on %.48s: %s already spilled%s",
                 call, fmt_bytes(request, a, sizeof a), d->uuid, fmt_bytes(ms_bytes(d->host_used), b, sizeof b),
                 tail);
}

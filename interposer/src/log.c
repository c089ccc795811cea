/* Logging: one line per write to stderr (lines from several processes never interleave), and byte counts
 * for people. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
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

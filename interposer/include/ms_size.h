/* Sizes as people write them: "4096" (MiB), "512MiB", "4GiB", "4Gi". The Python twin is memslice.sizes;
 * tests check that both accept and refuse the same strings. Header-only so the shim and the simulator
 * share it without exporting anything. */
#ifndef MEMSLICE_SIZE_H
#define MEMSLICE_SIZE_H

#include <stdint.h>
#include <string.h>

#define MS_SIZE_HELP "a whole number of MiB (4096) or a number with a binary unit: 512MiB, 4GiB, 4Gi, 1TiB"

/* Parse [s, s+len) (len < 0: NUL-terminated). Returns 0 and *out in bytes, or -1 if malformed. */
static inline int ms_parse_size_n(const char *s, long len, uint64_t *out) {
    static const struct { const char *u; uint64_t m; } units[] = {
        {"", 1ull << 20}, {"B", 1}, {"KiB", 1ull << 10}, {"Ki", 1ull << 10}, {"MiB", 1ull << 20},
        {"Mi", 1ull << 20}, {"GiB", 1ull << 30}, {"Gi", 1ull << 30}, {"TiB", 1ull << 40}, {"Ti", 1ull << 40}};
    if (!s) return -1;
    const char *end = len < 0 ? s + strlen(s) : s + len;
    while (s < end && (*s == ' ' || *s == '\t')) s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n')) end--;
    uint64_t v = 0;
    const char *p = s;
    if (p == end || *p < '0' || *p > '9') return -1;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    while (p < end && *p == ' ') p++;
    size_t ulen = (size_t)(end - p);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].u) == ulen && strncmp(units[i].u, p, ulen) == 0) {
            if (v > UINT64_MAX / units[i].m) return -1;
            *out = v * units[i].m;
            return 0;
        }
    }
    return -1;
}

static inline int ms_parse_size(const char *s, uint64_t *out) { return ms_parse_size_n(s, -1, out); }

#endif

/* Sizes as people write them: "4096" (MiB), "512MiB", "4GiB", "4Gi". The Python twin is memslice.sizes;
 * tests check that both accept and refuse the same strings. Header-only so the shim and the simulator
 * share it without exporting anything. */
#ifndef MEMSLICE_SIZE_H
#define MEMSLICE_SIZE_H

#include <stdint.h>
#include <string.h>

#define MS_SIZE_HELP "a whole number of MiB (4096) or a number with a binary unit: 512MiB, 4GiB, 4Gi, 1TiB"

/* Is c a blank that may surround a size (a value read from a file may end in a newline)? */
static inline int ms_size_blank(char c, int trailing) { return c == ' ' || c == '\t' || (trailing && c == '\n'); }

/* The decimal number at [*p, end) into *v, advancing *p. -1 if there is no digit or it overflows. */
static inline int ms_size_number(const char **p, const char *end, uint64_t *v) {
    if (*p == end || **p < '0' || **p > '9') return -1;
    for (*v = 0; *p < end && **p >= '0' && **p <= '9'; (*p)++) {
        if (*v > (UINT64_MAX - 9) / 10) return -1;
        *v = *v * 10 + (uint64_t)(**p - '0');
    }
    return 0;
}

/* The multiplier of the unit [u, u+len) ("" means MiB), or 0 if it is not one we accept. */
static inline uint64_t ms_size_unit(const char *u, size_t len) {
    static const struct { const char *u; uint64_t m; } units[] = {
        {"", 1ull << 20}, {"B", 1}, {"KiB", 1ull << 10}, {"Ki", 1ull << 10}, {"MiB", 1ull << 20},
        {"Mi", 1ull << 20}, {"GiB", 1ull << 30}, {"Gi", 1ull << 30}, {"TiB", 1ull << 40}, {"Ti", 1ull << 40}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strlen(units[i].u) == len && strncmp(units[i].u, u, len) == 0) return units[i].m;
    return 0;
}

/* Parse [s, s+len) (len < 0: NUL-terminated). Returns 0 and *out in bytes, or -1 if malformed. */
static inline int ms_parse_size_n(const char *s, long len, uint64_t *out) {
    if (!s) return -1;
    const char *end = len < 0 ? s + strlen(s) : s + len;
    while (s < end && ms_size_blank(*s, 0)) s++;
    while (end > s && ms_size_blank(end[-1], 1)) end--;
    uint64_t v;
    if (ms_size_number(&s, end, &v) < 0) return -1;
    while (s < end && *s == ' ') s++;
    uint64_t m = ms_size_unit(s, (size_t)(end - s));
    if (!m || v > UINT64_MAX / m) return -1;
    *out = v * m;
    return 0;
}

/* A NUL-terminated size string. */
static inline int ms_parse_size(const char *s, uint64_t *out) { return ms_parse_size_n(s, -1, out); }

#endif

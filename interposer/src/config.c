/* Configuration: read once (config_load, called by lifecycle.c's start-up) from the limits file and the
 * environment into g_cfg; anything wrong fails closed (g_cfg.mode = MODE_FAIL_CLOSED, g_cfg.error says
 * what and how to fix it). Parsing only: no other part of the shim is called from here. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ms_size.h"
#include "shim.h"

struct shim_config g_cfg;

/* Fail closed: record the message (with what it means for the application) and stop every CUDA call. Used by
 * the parsing below, and by start-up for a region that cannot be used. */
void config_fail_closed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_cfg.error, sizeof g_cfg.error, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof g_cfg.error)
        snprintf(g_cfg.error + n, sizeof g_cfg.error - (size_t)n, " Every CUDA call fails until this is fixed.");
    g_cfg.mode = MODE_FAIL_CLOSED;
}

/* Parse a size; 0 and *out in bytes, or -1 and fail closed naming `what` (a variable or a file key). */
static int parse_size_or_fail(const char *what, const char *v, uint64_t *out, int allow_zero) {
    uint64_t b;
    if (ms_parse_size(v, &b) == 0 && (allow_zero || b != 0)) {
        *out = b;
        return 0;
    }
    size_t n = strlen(v);
    int decimal = n >= 2 && (v[n - 1] == 'B' || v[n - 1] == 'b') && strchr("KMGTkmgt", v[n - 2]);
    config_fail_closed("memslice: %s='%.64s' is not a valid size%s; use %s%s.", what, v,
                decimal ? " (decimal units are ambiguous; write GiB/MiB)" : "", MS_SIZE_HELP,
                allow_zero ? " (0 allowed)" : ", greater than zero");
    return -1;
}

/* Parse a size variable; 0 if absent (and *out untouched), 1 if read, -1 if malformed (fail closed). */
static int size_env(const char *name, uint64_t *out, int allow_zero) {
    const char *v = getenv(name);
    if (!v) return 0;
    return parse_size_or_fail(name, v, out, allow_zero) < 0 ? -1 : 1;
}

/* ---- the limits file ----------------------------------------------------------------------------------
 * The enforced limits come from a file the container cannot write: the node agent's Allocate mounts it
 * read-only at MS_LIMITS_PATH; `memslice run` writes MS_LIMITS_FILE in its region directory before the
 * command starts. Where one exists, the environment's values for what it fixes are ignored, so a process
 * that unsets or raises MEMSLICE_GPU_MEM_LIMIT changes nothing. Format (docs/architecture.md, "Limits
 * file"): at most MS_LIMITS_MAX bytes of `key=value` lines, `#` comments and blank lines; each key once;
 * an unknown key, a bad value or anything else is an error (fail closed). */
struct limits_file {
    char path[600];
    int has_limit, has_reserve, has_over, has_spill, has_region, over;
    int has_request, has_edir, has_idle;       /* elastic mode (elastic.c) */
    int has_eslot, has_release, has_prio;      /* elastic slot, idle release, priority */
    int has_creq, has_clim, has_cdir, has_cslot; /* compute share */
    uint64_t limit, reserve, spill, request, idle_ms, eslot, release;
    int64_t prio, creq, clim, cslot;
    char cdir[sizeof g_cfg.compute_dir];
    char region[sizeof g_cfg.region_path];
    char edir[sizeof g_cfg.elastic_dir];
    int has_nvml, has_cuda;                    /* the node's driver libraries */
    char nvml[sizeof g_cfg.nvml_path];
    char cuda[sizeof g_cfg.cuda_path];
};

/* Read at most MS_LIMITS_MAX bytes of a regular file, never following a symlink nor blocking on a FIFO.
 * 0, 1 if it does not exist, -1 (fail closed) otherwise. */
static int read_small_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 1;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        config_fail_closed("memslice: the limits file %s cannot be read (%s); it must be a regular file written by the "
                    "node agent or `memslice run`.", path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return -1;
    }
    ssize_t n = pread(fd, buf, cap, 0);
    close(fd);
    if (n < 0 || (size_t)n >= cap) {
        config_fail_closed("memslice: the limits file %s is %s; it holds a few key=value lines (at most %d bytes).", path,
                    n < 0 ? "unreadable" : "too large", MS_LIMITS_MAX);
        return -1;
    }
    buf[n] = 0;
    if (strlen(buf) != (size_t)n) {
        config_fail_closed("memslice: the limits file %s contains a NUL byte; it holds key=value lines.", path);
        return -1;
    }
    return 0;
}

/* An absolute directory path that fits `cap` (the elastic boards' directory). 0, or -1 (fail closed). */
static int parse_dir_or_fail(const char *what, const char *v, char *out, size_t cap) {
    if (v[0] == '/' && strlen(v) + 80 < cap) {
        snprintf(out, cap, "%s", v);
        return 0;
    }
    config_fail_closed("memslice: %s='%.64s' is not an absolute directory path of at most %zu characters.", what, v, cap - 80);
    return -1;
}

/* Seconds, decimals allowed ("300", "0.5"), at most a week, as milliseconds. 0, or -1 (fail closed). */
static int parse_seconds_or_fail(const char *what, const char *v, uint64_t *ms) {
    char *end = NULL;
    errno = 0;
    double s = strtod(v, &end);
    if (*v && end && !*end && !errno && s >= 0 && s <= 604800) {
        *ms = (uint64_t)(s * 1000 + 0.5);
        return 0;
    }
    config_fail_closed("memslice: %s='%.64s' is not a number of seconds; use e.g. 300 or 0.5 (0 to 604800).", what, v);
    return -1;
}

/* An integer in [lo, hi] (a board slot, a flag, a priority). 0, or -1 (fail closed). */
static int parse_int_or_fail(const char *what, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*v && end && !*end && !errno && x >= lo && x <= hi) {
        *out = x;
        return 0;
    }
    config_fail_closed("memslice: %s='%.64s' is not an integer from %lld to %lld.", what, v, (long long)lo, (long long)hi);
    return -1;
}

/* A percent of one GPU (a compute request from 0, a limit from 1, to 100). 0, or -1 (fail closed, naming the
 * value and the fix). */
static int parse_percent_or_fail(const char *what, const char *v, int64_t lo, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*v && end && !*end && !errno && x >= lo && x <= 100) {
        *out = x;
        return 0;
    }
    config_fail_closed("memslice: %s='%.64s': a share is a percent of one GPU, %lld to 100; write a whole number "
                       "such as 30.", what, v, (long long)lo);
    return -1;
}

/* The compute share (compute.c enforces it): the limits file's gpu_compute_request,
 * gpu_compute_limit, compute_dir and compute_slot, else the environment's (MEMSLICE_GPU_COMPUTE_REQUEST,
 * MEMSLICE_GPU_COMPUTE_LIMIT, MEMSLICE_COMPUTE_DIR, MEMSLICE_COMPUTE_SLOT) when there is no file; a limit
 * below the request fails closed. 0, or -1. */
static int read_compute(const struct limits_file *f, int have_file) {
    struct shim_config *c = &g_cfg;
    int64_t req = -1, lim = 0, slot = -1;
    const char *v, *src = have_file ? f->path : "the environment";
    if (have_file) {
        if (f->has_creq) req = f->creq;
        if (f->has_clim) lim = f->clim;
        if (f->has_cslot) slot = f->cslot;
        if (f->has_cdir) snprintf(c->compute_dir, sizeof c->compute_dir, "%s", f->cdir);
    } else {
        if ((v = getenv("MEMSLICE_GPU_COMPUTE_REQUEST")) && *v &&
            parse_percent_or_fail("MEMSLICE_GPU_COMPUTE_REQUEST", v, 0, &req) < 0) return -1;
        if ((v = getenv("MEMSLICE_GPU_COMPUTE_LIMIT")) && *v &&
            parse_percent_or_fail("MEMSLICE_GPU_COMPUTE_LIMIT", v, 1, &lim) < 0) return -1;
        if ((v = getenv("MEMSLICE_COMPUTE_SLOT")) && *v && parse_int_or_fail("MEMSLICE_COMPUTE_SLOT", v, 0, 63, &slot) < 0)
            return -1;
        if ((v = getenv("MEMSLICE_COMPUTE_DIR")) && *v &&
            parse_dir_or_fail("MEMSLICE_COMPUTE_DIR", v, c->compute_dir, sizeof c->compute_dir) < 0) return -1;
    }
    if (lim && req > lim) {
        config_fail_closed("memslice: gpu_compute_limit=%lld is below gpu_compute_request=%lld (%.400s); the limit "
                           "must be at least the request.", (long long)lim, (long long)req, src);
        return -1;
    }
    c->compute_request = (int)req;
    c->compute_limit = (int)lim;
    c->compute_slot = (int)slot;
    return 0;
}

/* The elastic roles the node agent assigns: the board slot, the idle-release opt-in and the
 * pod's priority; the limits file's, else the environment's (MEMSLICE_ELASTIC_SLOT, MEMSLICE_IDLE_RELEASE,
 * MEMSLICE_PRIORITY) when there is no file. 0, or -1 (fail closed). */
static int read_elastic_roles(const struct limits_file *f, int have_file) {
    struct shim_config *c = &g_cfg;
    int64_t slot = -1, rel = 0, prio = 0;
    const char *v;
    if (have_file) {
        if (f->has_eslot) slot = (int64_t)f->eslot;
        rel = (int64_t)f->release;
        prio = f->prio;
    } else {
        if ((v = getenv("MEMSLICE_ELASTIC_SLOT")) && *v && parse_int_or_fail("MEMSLICE_ELASTIC_SLOT", v, 0, 63, &slot) < 0)
            return -1;
        if ((v = getenv("MEMSLICE_IDLE_RELEASE")) && *v && parse_int_or_fail("MEMSLICE_IDLE_RELEASE", v, 0, 1, &rel) < 0)
            return -1;
        if ((v = getenv("MEMSLICE_PRIORITY")) && *v &&
            parse_int_or_fail("MEMSLICE_PRIORITY", v, INT32_MIN, INT32_MAX, &prio) < 0) return -1;
    }
    c->elastic_slot = (int)slot;
    c->idle_release = (int)rel;
    c->priority = (int32_t)prio;
    return 0;
}

/* Elastic mode's settings: the limits file's, else the environment's (MEMSLICE_GPU_MEM_REQUEST,
 * MEMSLICE_ELASTIC_DIR, MEMSLICE_IDLE_AFTER; MEMSLICE_YIELD_WAIT and MEMSLICE_HOST_POOL_KEEP from the
 * environment only: they bound this process's own waits and its own pinned host memory). Elastic mode is on when 0 < request < limit. 0, or -1 (fail closed). */
static int read_elastic(const struct limits_file *f, int have_file) {
    struct shim_config *c = &g_cfg;
    const char *v;
    c->idle_after_ms = 300000;
    c->yield_wait_ms = 3000;
    c->pool_keep_ms = 3000;
    if (have_file && f->has_request) c->request = f->request;
    else if (!have_file && size_env("MEMSLICE_GPU_MEM_REQUEST", &c->request, 0) < 0) return -1;
    if (have_file && f->has_edir) snprintf(c->elastic_dir, sizeof c->elastic_dir, "%s", f->edir);
    else if ((v = getenv("MEMSLICE_ELASTIC_DIR")) && *v &&
             parse_dir_or_fail("MEMSLICE_ELASTIC_DIR", v, c->elastic_dir, sizeof c->elastic_dir) < 0) return -1;
    if (have_file && f->has_idle) c->idle_after_ms = f->idle_ms;
    else if ((v = getenv("MEMSLICE_IDLE_AFTER")) && parse_seconds_or_fail("MEMSLICE_IDLE_AFTER", v, &c->idle_after_ms) < 0)
        return -1;
    if ((v = getenv("MEMSLICE_YIELD_WAIT")) && parse_seconds_or_fail("MEMSLICE_YIELD_WAIT", v, &c->yield_wait_ms) < 0)
        return -1;
    if ((v = getenv("MEMSLICE_HOST_POOL_KEEP")) &&
        parse_seconds_or_fail("MEMSLICE_HOST_POOL_KEEP", v, &c->pool_keep_ms) < 0) return -1;
    if (read_elastic_roles(f, have_file) < 0) return -1;
    if (!c->request) return 0;
    char a[32], b[32];
    if (c->mode != MODE_ENFORCE || c->request > c->limit) {
        config_fail_closed("memslice: the GPU memory request %s is above the limit %s (%s); the request must be at most "
                    "the limit.", fmt_bytes(c->request, a, sizeof a),
                    c->mode == MODE_ENFORCE ? fmt_bytes(c->limit, b, sizeof b) : "(none)", c->limit_source);
        return -1;
    }
    if (c->request < c->limit && !c->elastic_dir[0]) {
        config_fail_closed("memslice: a GPU memory request below the limit (elastic mode) needs the node's arbitration "
                    "directory: set MEMSLICE_ELASTIC_DIR (`memslice run` and the node agent do this).");
        return -1;
    }
    return 0;
}

/* A driver library's path (nvml_path, cuda_path): absolute, shorter than `cap`, no `..` component, naming a
 * regular file (the node agent resolved it from the node's driver; a tenant's search path never decides
 * which library measures it). 0, or -1 (fail closed). */
static int parse_lib_or_fail(const char *what, const char *v, char *out, size_t cap) {
    struct stat st;
    const char *why = v[0] != '/' ? "not absolute" : strlen(v) >= cap ? "too long"
                    : strstr(v, "/../") || (strlen(v) >= 3 && !strcmp(v + strlen(v) - 3, "/..")) ? "has a .. component"
                    : stat(v, &st) < 0 ? strerror(errno) : !S_ISREG(st.st_mode) ? "not a regular file" : NULL;
    if (!why) {
        snprintf(out, cap, "%s", v);
        return 0;
    }
    config_fail_closed("memslice: %s='%.128s' is not usable (%s); it must be the absolute path (at most %zu characters) "
                       "of the node's driver library, as the node agent or `memslice run` writes it.", what, v, why,
                       cap - 1);
    return -1;
}

/* Apply one `key=value` line of the limits file. 0, or -1 (fail closed). */
static int limits_line(struct limits_file *f, char *key, char *val, int lineno) {
    char what[700];
    if (snprintf(what, sizeof what, "%.512s line %d: %.100s", f->path, lineno, key) < 0) what[0] = 0; /* a label */
    int *seen = NULL;
    if (strcmp(key, "gpu_mem_limit") == 0) {
        seen = &f->has_limit;
        if (!*seen && parse_size_or_fail(what, val, &f->limit, 0) < 0) return -1;
    } else if (strcmp(key, "context_reserve") == 0) {
        seen = &f->has_reserve;
        if (!*seen && parse_size_or_fail(what, val, &f->reserve, 1) < 0) return -1;
    } else if (strcmp(key, "host_spill_limit") == 0) {
        seen = &f->has_spill;
        if (!*seen && parse_size_or_fail(what, val, &f->spill, 1) < 0) return -1;
    } else if (strcmp(key, "oversubscribe") == 0) {
        seen = &f->has_over;
        if (strcmp(val, "0") && strcmp(val, "1")) {
            config_fail_closed("memslice: %s='%.16s' is not valid; use 0 or 1.", what, val);
            return -1;
        }
        f->over = val[0] == '1';
    } else if (strcmp(key, "region_dir") == 0) {
        seen = &f->has_region;
        if (val[0] != '/' || strlen(val) + 1 + strlen(MS_REGION_FILE) >= sizeof f->region) {
            config_fail_closed("memslice: %s='%.64s' is not an absolute directory path of at most %zu characters.", what,
                        val, sizeof f->region - 2 - strlen(MS_REGION_FILE));
            return -1;
        }
        snprintf(f->region, sizeof f->region, "%s", val);
    } else if (strcmp(key, "gpu_mem_request") == 0) {
        seen = &f->has_request;
        if (!*seen && parse_size_or_fail(what, val, &f->request, 0) < 0) return -1;
    } else if (strcmp(key, "elastic_dir") == 0) {
        seen = &f->has_edir;
        if (parse_dir_or_fail(what, val, f->edir, sizeof f->edir) < 0) return -1;
    } else if (strcmp(key, "idle_after") == 0) {
        seen = &f->has_idle;
        if (parse_seconds_or_fail(what, val, &f->idle_ms) < 0) return -1;
    } else if (strcmp(key, "elastic_slot") == 0) {
        int64_t x;
        seen = &f->has_eslot;
        if (parse_int_or_fail(what, val, 0, 63, &x) < 0) return -1;
        f->eslot = (uint64_t)x;
    } else if (strcmp(key, "idle_release") == 0) {
        int64_t x;
        seen = &f->has_release;
        if (parse_int_or_fail(what, val, 0, 1, &x) < 0) return -1;
        f->release = (uint64_t)x;
    } else if (strcmp(key, "priority") == 0) {
        seen = &f->has_prio;
        if (parse_int_or_fail(what, val, INT32_MIN, INT32_MAX, &f->prio) < 0) return -1;
    } else if (strcmp(key, "nvml_path") == 0) {
        seen = &f->has_nvml;
        if (parse_lib_or_fail(what, val, f->nvml, sizeof f->nvml) < 0) return -1;
    } else if (strcmp(key, "cuda_path") == 0) {
        seen = &f->has_cuda;
        if (parse_lib_or_fail(what, val, f->cuda, sizeof f->cuda) < 0) return -1;
    } else if (strcmp(key, "gpu_compute_request") == 0) {
        seen = &f->has_creq;
        if (parse_percent_or_fail(what, val, 0, &f->creq) < 0) return -1;
    } else if (strcmp(key, "gpu_compute_limit") == 0) {
        seen = &f->has_clim;
        if (parse_percent_or_fail(what, val, 1, &f->clim) < 0) return -1;
    } else if (strcmp(key, "compute_dir") == 0) {
        seen = &f->has_cdir;
        if (parse_dir_or_fail(what, val, f->cdir, sizeof f->cdir) < 0) return -1;
    } else if (strcmp(key, "compute_slot") == 0) {
        seen = &f->has_cslot;
        if (parse_int_or_fail(what, val, 0, 63, &f->cslot) < 0) return -1;
    } else {
        config_fail_closed("memslice: %s is not a known key (gpu_mem_limit, gpu_mem_request, context_reserve, "
                    "oversubscribe, host_spill_limit, region_dir, elastic_dir, idle_after, elastic_slot, "
                    "idle_release, priority, nvml_path, cuda_path, gpu_compute_request, gpu_compute_limit, "
                    "compute_dir, compute_slot).", what);
        return -1;
    }
    if (*seen) {
        config_fail_closed("memslice: %s appears twice.", what);
        return -1;
    }
    *seen = 1;
    return 0;
}

/* Load the limits file at f->path. 0 if it does not exist, 1 if loaded, -1 (fail closed) if invalid.
 * region_dir is required in the node agent's file (`fixed`), and refused in one found in the region
 * directory (which that directory already is). */
static int load_limits(struct limits_file *f, int fixed) {
    char buf[MS_LIMITS_MAX + 1];
    int rc = read_small_file(f->path, buf, sizeof buf);
    if (rc != 0) return rc > 0 ? 0 : -1;
    int lineno = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        if (!*line || *line == '#') continue;
        char *eq = strchr(line, '=');
        if (!eq || eq == line) {
            config_fail_closed("memslice: %s line %d is not key=value.", f->path, lineno);
            return -1;
        }
        *eq = 0;
        if (limits_line(f, line, eq + 1, lineno) < 0) return -1;
    }
    const char *missing = !f->has_limit ? "gpu_mem_limit" : fixed && !f->has_region ? "region_dir" : NULL;
    if (missing || (!fixed && f->has_region)) {
        config_fail_closed("memslice: the limits file %s %s %s.", f->path, missing ? "lacks" : "may not set",
                    missing ? missing : "region_dir (it is the directory the file is in)");
        return -1;
    }
    return 1;
}

/* Find the limits file: the node agent's mount first, else one `memslice run` wrote in the region dir. */
static int find_limits(struct limits_file *f, const char *env_dir) {
    snprintf(f->path, sizeof f->path, "%s", MS_LIMITS_PATH);
    int rc = load_limits(f, 1);
    if (rc != 0 || !env_dir || !*env_dir) return rc;
    memset(f, 0, sizeof *f);
    if (snprintf(f->path, sizeof f->path, "%s/%s", env_dir, MS_LIMITS_FILE) >= (int)sizeof f->path) return 0;
    return load_limits(f, 0); /* (a directory too long for this is refused below, with its own message) */
}

/* The quota: the limits file's, else MEMSLICE_GPU_MEM_LIMIT. 0, or -1 (fail closed). */
static int read_quota(const struct limits_file *f, int have_file) {
    struct shim_config *c = &g_cfg;
    const char *env = getenv("MEMSLICE_GPU_MEM_LIMIT");
    c->limit = UINT64_MAX >> 2;
    if (have_file) {
        char a[32];
        c->limit = f->limit;
        c->mode = MODE_ENFORCE;
        snprintf(c->limit_source, sizeof c->limit_source, "gpu_mem_limit=%s in %.400s",
                 fmt_bytes(f->limit, a, sizeof a), f->path);
        uint64_t v;
        if (env && (ms_parse_size(env, &v) < 0 || v != f->limit))
            shim_log(LOG_WARN, "memslice: MEMSLICE_GPU_MEM_LIMIT='%.64s' ignored: the quota comes from %s", env,
                     c->limit_source);
        return 0;
    }
    if (!env) return 0;
    snprintf(c->limit_source, sizeof c->limit_source, "MEMSLICE_GPU_MEM_LIMIT=%.64s", env);
    if (size_env("MEMSLICE_GPU_MEM_LIMIT", &c->limit, 0) < 0) return -1;
    c->mode = MODE_ENFORCE;
    return 0;
}

/* Oversubscription and its host cap: from the limits file when it sets oversubscribe (a missing
 * host_spill_limit is then "no cap"), else from the environment. 0 means zero: nothing spills. */
static int read_oversubscription(const struct limits_file *f, int have_file) {
    struct shim_config *c = &g_cfg;
    c->spill_limit = UINT64_MAX >> 2;
    snprintf(c->spill_source, sizeof c->spill_source, "no MEMSLICE_HOST_SPILL_LIMIT");
    if (have_file && f->has_over) {
        char a[32];
        c->oversubscribe = f->over;
        if (f->has_spill) c->spill_limit = f->spill;
        snprintf(c->spill_source, sizeof c->spill_source, "host_spill_limit=%s in %.400s",
                 f->has_spill ? fmt_bytes(f->spill, a, sizeof a) : "(none)", f->path);
        return 0;
    }
    if (have_file && f->has_spill) {
        config_fail_closed("memslice: the limits file %s sets host_spill_limit without oversubscribe.", f->path);
        return -1;
    }
    const char *os = getenv("MEMSLICE_OVERSUBSCRIBE");
    if (os) {
        if (strcmp(os, "1") == 0 || strcmp(os, "true") == 0) c->oversubscribe = 1;
        else if (strcmp(os, "0") != 0 && strcmp(os, "false") != 0 && *os) {
            config_fail_closed("memslice: MEMSLICE_OVERSUBSCRIBE='%.64s' is not valid; use 1 (on) or 0 (off).", os);
            return -1;
        }
    }
    int rc = size_env("MEMSLICE_HOST_SPILL_LIMIT", &c->spill_limit, 1);
    if (rc > 0) {
        char a[32];
        snprintf(c->spill_source, sizeof c->spill_source, "MEMSLICE_HOST_SPILL_LIMIT=%s",
                 fmt_bytes(c->spill_limit, a, sizeof a));
    }
    return rc < 0 ? -1 : 0;
}

/* MEMSLICE_CGROUP_DIR, if set, must be a memory cgroup (v2 memory.max + memory.current, or v1
 * memory.limit_in_bytes + memory.usage_in_bytes): a wrong one would silently turn the margin off. */
static int read_cgroup_dir(void) {
    const char *cg = getenv("MEMSLICE_CGROUP_DIR");
    if (!cg || !*cg) return 0;
    char a[300], b[300];
    int fits = snprintf(g_cfg.cgroup_dir, sizeof g_cfg.cgroup_dir, "%s", cg) < (int)sizeof g_cfg.cgroup_dir;
    snprintf(a, sizeof a, "%s/memory.max", g_cfg.cgroup_dir);
    snprintf(b, sizeof b, "%s/memory.current", g_cfg.cgroup_dir);
    int v2 = access(a, R_OK) == 0 && access(b, R_OK) == 0;
    snprintf(a, sizeof a, "%s/memory.limit_in_bytes", g_cfg.cgroup_dir);
    snprintf(b, sizeof b, "%s/memory.usage_in_bytes", g_cfg.cgroup_dir);
    int v1 = access(a, R_OK) == 0 && access(b, R_OK) == 0;
    if (fits && (v1 || v2)) return 0;
    config_fail_closed("memslice: MEMSLICE_CGROUP_DIR='%.300s' is not a readable memory cgroup directory (%s); unset it "
                "to use the process's own cgroup, or point it at the container's.", cg,
                fits ? "no memory.max + memory.current, nor memory.limit_in_bytes + memory.usage_in_bytes"
                     : "path too long");
    return -1;
}

/* The region file's path: the limits file's region_dir, else MEMSLICE_REGION_DIR. 0, or -1. */
static int read_region_dir(const struct limits_file *f, int have_file) {
    struct shim_config *c = &g_cfg;
    const char *dir = have_file && f->has_region ? f->region : getenv("MEMSLICE_REGION_DIR");
    const char *what = have_file && f->has_region ? "region_dir" : "MEMSLICE_REGION_DIR";
    if (!dir || !*dir) {
        if (c->mode != MODE_ENFORCE) return 0;
        config_fail_closed("memslice: MEMSLICE_GPU_MEM_LIMIT is set but MEMSLICE_REGION_DIR is not; set it to a directory "
                    "shared by all processes of the container (`memslice run` does this for you).");
        return -1;
    }
    size_t need = strlen(dir) + 1 + strlen(MS_REGION_FILE);
    if (need >= sizeof c->region_path) {
        config_fail_closed("memslice: %s is %zu characters long; the shim supports at most %zu: use a shorter directory.",
                    what, strlen(dir), sizeof c->region_path - 2 - strlen(MS_REGION_FILE));
        return -1;
    }
    struct stat st;
    errno = 0;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK) < 0) {
        config_fail_closed("memslice: %s='%s' is not a writable directory (%s); point it at the directory shared by the "
                    "container's processes.", what, dir, errno ? strerror(errno) : "not a directory");
        return -1;
    }
    int n = snprintf(c->region_path, sizeof c->region_path, "%s/%s", dir, MS_REGION_FILE);
    if (n < 0 || (size_t)n >= sizeof c->region_path) return -1; /* checked above; keeps every -O level quiet */
    if (c->mode == MODE_PASSTHROUGH) c->mode = MODE_OBSERVE;
    return 0;
}

/* The driver libraries the shim calls and measures with: the limits file's nvml_path/cuda_path, else (no
 * file) MEMSLICE_NVML_PATH/MEMSLICE_CUDA_PATH; empty: found by name (libnvidia-ml.so.1, libcuda.so.1). */
static int read_driver_paths(const struct limits_file *f, int have_file) {
    struct shim_config *c = &g_cfg;
    const char *v;
    if (have_file) {
        if (f->has_nvml) snprintf(c->nvml_path, sizeof c->nvml_path, "%s", f->nvml);
        if (f->has_cuda) snprintf(c->cuda_path, sizeof c->cuda_path, "%s", f->cuda);
        return 0;
    }
    if ((v = getenv("MEMSLICE_NVML_PATH")) && *v &&
        parse_lib_or_fail("MEMSLICE_NVML_PATH", v, c->nvml_path, sizeof c->nvml_path) < 0) return -1;
    if ((v = getenv("MEMSLICE_CUDA_PATH")) && *v &&
        parse_lib_or_fail("MEMSLICE_CUDA_PATH", v, c->cuda_path, sizeof c->cuda_path) < 0) return -1;
    return 0;
}

/* config_load, once per process, whoever asks first: start-up, or real.c choosing the driver libraries. */
void config_ensure(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, config_load);
}

/* Read the whole configuration into g_cfg, once, at start-up (lifecycle.c). Fails closed on any bad value. */
void config_load(void) {
    struct shim_config *c = &g_cfg;
    c->log_level = LOG_WARN;
    const char *lv = getenv("MEMSLICE_LOG");
    if (lv) {
        static const char *names[] = {"error", "warn", "info", "debug"};
        int found = -1;
        for (int i = 0; i < 4; i++) if (strcmp(lv, names[i]) == 0) found = i;
        if (found < 0) {
            config_fail_closed("memslice: MEMSLICE_LOG='%.64s' is not a log level; use error, warn, info or debug.", lv);
            return;
        }
        c->log_level = (enum log_level)found;
    }
    static struct limits_file f; /* static: it is large, and this runs once */
    int have_file = find_limits(&f, getenv("MEMSLICE_REGION_DIR"));
    if (have_file < 0) return;
    c->context_reserve = 300ull << 20;
    if (have_file) {
        if (f.has_reserve) c->context_reserve = f.reserve;
    } else if (size_env("MEMSLICE_CONTEXT_RESERVE", &c->context_reserve, 1) < 0) {
        return;
    }
    if (read_quota(&f, have_file) < 0 || read_oversubscription(&f, have_file) < 0) return;
    if (size_env("MEMSLICE_CGROUP_MARGIN", &c->cgroup_margin, 1) < 0 || read_cgroup_dir() < 0) return;
    if (read_region_dir(&f, have_file) < 0) return;
    if (read_driver_paths(&f, have_file) < 0) return;
    if (read_elastic(&f, have_file) < 0) return;
    read_compute(&f, have_file);
}

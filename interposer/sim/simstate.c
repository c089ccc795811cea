/* The simulated node's shared state: opened once per process, on first use, by either simulated library. */
#define _GNU_SOURCE
#include "simstate.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "ms_size.h"

static struct sim g_sim;
static struct sim *g_ready;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Parse "SIZE[:NUMA][:mig],..." — e.g. "16GiB,24GiB:1,80GiB:0:mig". */
int sim_parse_gpus(const char *spec, struct sim_node *node, char *err, size_t errlen) {
    const char *p = spec;
    unsigned n = 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[96];
        if (len == 0 || len >= sizeof item) goto bad;
        memcpy(item, p, len);
        item[len] = 0;
        if (n >= SIM_MAX_GPUS) {
            snprintf(err, errlen, "MEMSLICE_SIM_GPUS=%s lists more than %d GPUs", spec, SIM_MAX_GPUS);
            return -1;
        }
        struct sim_gpu *g = &node->gpu[n];
        memset(g, 0, sizeof *g);
        char *save = NULL, *tok = strtok_r(item, ":", &save);
        if (!tok || ms_parse_size(tok, &g->total) < 0 || g->total < (1ull << 20)) goto bad;
        while ((tok = strtok_r(NULL, ":", &save))) {
            if (strcmp(tok, "mig") == 0) g->mig = 1;
            else {
                char *end;
                long v = strtol(tok, &end, 10);
                if (*end || v < 0 || v > 63) goto bad;
                g->numa = (int32_t)v;
            }
        }
        unsigned char b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
            for (int i = 0; i < 16; i++) b[i] = (unsigned char)(rand() ^ getpid() ^ (i * 37));
        }
        b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* shaped like a v4 UUID, as real ones are */
        b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
        snprintf(g->uuid, sizeof g->uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        snprintf(g->name, sizeof g->name, "Simulated GPU %lluGiB (memslice)",
                 (unsigned long long)(g->total >> 30));
        g->pci_bus = 0x10 + n * 0x10;
        n++;
        if (!comma) break;
        p = comma + 1;
    }
    if (n == 0) goto bad;
    node->ngpus = n;
    snprintf(node->config, sizeof node->config, "%s", spec);
    return 0;
bad:
    snprintf(err, errlen,
             "MEMSLICE_SIM_GPUS=%s is not valid; use a comma list of SIZE[:NUMA][:mig], e.g. 16GiB,24GiB:1 "
             "(SIZE: " MS_SIZE_HELP ")", spec);
    return -1;
}

static int init_node(void *extra, void *arg, char *err, size_t errlen) {
    struct sim_node *node = extra;
    if (sim_parse_gpus((const char *)arg, node, err, errlen) < 0) return -1;
    node->magic = 0x53494d31; /* "SIM1" */
    return 0;
}

static void open_sim(void) {
    struct sim *s = &g_sim;
    const char *spec = getenv("MEMSLICE_SIM_GPUS");
    if (!spec || !*spec) spec = "16GiB";
    const char *path = getenv("MEMSLICE_SIM_STATE");
    char def[256];
    if (!path || !*path) {
        snprintf(def, sizeof def, "/tmp/memslice-sim-%u.state", (unsigned)getuid());
        path = def;
    }
    s->context_overhead = 300ull << 20;
    const char *ov = getenv("MEMSLICE_SIM_CONTEXT_OVERHEAD");
    if (ov && *ov && ms_parse_size_n(ov, -1, &s->context_overhead) < 0 && strcmp(ov, "0") != 0) {
        snprintf(s->error, sizeof s->error, "memslice-sim: MEMSLICE_SIM_CONTEXT_OVERHEAD=%s is not valid; use %s",
                 ov, MS_SIZE_HELP);
        return;
    }
    if (ov && strcmp(ov, "0") == 0) s->context_overhead = 0;
    s->driver_version = SIM_DRIVER_VERSION_DEFAULT;
    const char *dv = getenv("MEMSLICE_SIM_DRIVER_VERSION");
    if (dv && *dv) s->driver_version = atoi(dv);
    char err[400];
    if (ms_ledger_open(&s->ledger, path, sizeof(struct sim_node), 0, init_node, (void *)spec, err, sizeof err) < 0) {
        snprintf(s->error, sizeof s->error, "memslice-sim: %s", err);
        return;
    }
    s->node = s->ledger.extra;
    if (s->node->magic != 0x53494d31) {
        snprintf(s->error, sizeof s->error, "memslice-sim: %s is not a simulator state file", path);
        return;
    }
    for (unsigned g = 0; g < s->node->ngpus; g++)
        if (ms_ledger_device(&s->ledger, s->node->gpu[g].uuid, s->node->gpu[g].total) != (int)g) {
            snprintf(s->error, sizeof s->error, "memslice-sim: %s has an inconsistent GPU table", path);
            return;
        }
    if (strcmp(s->node->config, spec) != 0 && getenv("MEMSLICE_SIM_GPUS"))
        fprintf(stderr, "memslice-sim: %s was created with MEMSLICE_SIM_GPUS=%s; ignoring %s\n", path,
                s->node->config, spec);
    g_ready = s;
}

static void after_fork_child(void) {
    if (g_ready) ms_ledger_forget_slot(&g_ready->ledger);
}

static void release_at_exit(void) {
    if (g_ready) ms_ledger_release(&g_ready->ledger);
}

/* A real driver frees a process's memory the moment it dies; the simulator does it at the next
 * opportunity: when another process starts, when memory runs out, and when NVML is asked. */
static void init_once(void) {
    open_sim();
    if (g_ready) {
        ms_sweep(&g_ready->ledger);
        atexit(release_at_exit);
    }
    pthread_atfork(NULL, NULL, after_fork_child);
}

struct sim *sim_get(void) {
    pthread_once(&g_once, init_once);
    return g_ready;
}

const char *sim_error(void) { return g_sim.error[0] ? g_sim.error : "memslice-sim: not initialised"; }

/* Physical charge for this process; claims the process's slot on first use. */
int sim_charge(struct sim *s, int g, uint64_t n, int host) {
    if (s->ledger.slot < 0 && ms_ledger_claim(&s->ledger) < 0) return -1;
    uint64_t cap = host ? UINT64_MAX >> 2 : s->node->gpu[g].total;
    if (ms_charge(&s->ledger, g, n, cap, host) == 0) return 0;
    /* out of memory: a dead process may still be holding some, reclaim and retry once */
    if (ms_sweep(&s->ledger) > 0 && ms_charge(&s->ledger, g, n, cap, host) == 0) return 0;
    return -1;
}

void sim_uncharge(struct sim *s, int g, uint64_t n, int host) {
    if (s->ledger.slot >= 0) ms_uncharge(&s->ledger, g, n, host);
}

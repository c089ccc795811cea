/* A process of the container stopped at the worst moment, made deterministic: it opens the region, takes
 * the region mutex (`lock`) and, with `recount`, also freezes every total as a recount does, prints
 * "held", and stops itself (SIGSTOP) until the test continues or kills it. Built with region*.c.
 * Usage: holdlock REGION_FILE lock|recount */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "memslice_region.h"

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    region_handle l;
    char err[512];
    if (region_open(&l, argv[1], 0, 0, NULL, NULL, err, sizeof err) < 0) {
        printf("open failed: %s\n", err);
        return 3;
    }
    if (pthread_mutex_lock((pthread_mutex_t *)l.r->hdr.lock) != 0) return 4;
    if (strcmp(argv[2], "recount") == 0)
        for (uint32_t d = 0; d < l.r->hdr.ndevices; d++) {
            __atomic_fetch_or(&l.r->dev[d].used, MS_FROZEN, __ATOMIC_SEQ_CST);
            __atomic_fetch_or(&l.r->dev[d].host_used, MS_FROZEN, __ATOMIC_SEQ_CST);
        }
    printf("held\n");
    fflush(stdout);
    raise(SIGSTOP);
    return 0;
}

/* Internal interface between compute.c (the gate and the board thread) and compute_board.c (the files). */
#ifndef MEMSLICE_COMPUTE_INT_H
#define MEMSLICE_COMPUTE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "compute.h"

#define CS_FRESH_NS 500000000ull        /* a record older than this is a process that stopped publishing */
#define CS_DEMAND_FRESH_NS 50000000ull  /* a demand flag older than this is no demand */

/* This process's view of one GPU's board. */
struct cs_board {
    int fd;                               /* its container's slot file, read-write */
    int slot, rec;                        /* the slot, and this process's record in it */
    int have_roster;
    struct cs_roster_ent roster[CS_SLOTS];
    int peer_fd[CS_SLOTS];                /* neighbours' slot files, read-only (-1: none) */
    char gpu_dir[300];
};

int cb_open(struct cs_board *b, const char *dir, const char *uuid, int want, char *err, size_t errlen);
int cb_read_roster(struct cs_board *b);
void cb_rescan(struct cs_board *b, int reopen);
void cb_publish(const struct cs_board *b, const struct cs_record *mine);
int cb_read_peers(const struct cs_board *b, uint64_t now, struct cs_peer peers[CS_SLOTS], int *siblings_pm);
void cb_close(struct cs_board *b);

#endif

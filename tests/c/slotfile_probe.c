/* The board layout as the C side sees it, and a slot claimed through slotfile.c (tests/elastic/test_board_layout.py):
 * prints the offsets and sizes, claims a slot in argv[1], writes argv[2] into it, says "held N" and waits
 * for stdin to close. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "elastic_board.h"

int main(int argc, char **argv) {
    printf("%u %d %d %d %d %d %zu %zu %zu %zu\n", ELASTIC_VERSION, ELASTIC_NOTE_OFF, ELASTIC_ANSWER_OFF, ELASTIC_ASK_OFF,
           ELASTIC_FILE_SIZE, SF_LIVE_OFF, sizeof(struct elastic_slot), sizeof(struct elastic_hostnote), sizeof(struct elastic_answer),
           offsetof(struct elastic_slot, ack_seq));
    if (argc < 3) return 0;
    struct sf_dir d;
    char err[256];
    int rc = sf_open(&d, argv[1], -1, 1, ELASTIC_FILE_SIZE, err, sizeof err);
    if (rc != 0) { printf("no slot %d %s\n", rc, err); return 1; }
    sf_write_own(&d, argv[2], strlen(argv[2]), 0);
    printf("held %d\n", d.own);
    fflush(stdout);
    while (getchar() != EOF) {}
    return 0;
}

/* Elastic memory's pool of pinned host memory (elastic_vmm.h): host handles of ELASTIC_CHUNK bytes, each mapped
 * once, with access, at its own slot of one reserved range, so a move to host memory neither pins memory nor
 * stages a mapping on its critical path: it copies straight to a slot. A handle is pinned lazily (the first
 * move that needs it), comes back to the pool when its chunk returns to HBM (no unpin on a move's path
 * either), and is given back to the driver once it has sat unused for MEMSLICE_HOST_POOL_KEEP (g_cfg.pool_keep_ms;
 * 0: no pool, each move pins and unpins its own chunks). The pool never
 * holds more slots than the process's limit has chunks (what it could ever have in host memory); its pages
 * are pinned by the mover's thread, so the tenant's memory cgroup is charged for them, and the mover checks
 * that cgroup for only what the pool cannot give (host_room). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "elastic_vmm.h"

/* The pool's range and slot table, made at the first use: `slots` chunks of address space (no memory). -1 if
 * the driver or malloc refuse (then moves pin each chunk as before). */
static int pool_ready(struct elastic_pool *p) {
    if (p->e) return 0;
    if (!p->slots) return -1;
    p->e = calloc(p->slots, sizeof p->e[0]);
    if (!p->e) return -1;
    if (REAL(cuMemAddressReserve)(&p->va, (uint64_t)p->slots * ELASTIC_CHUNK, ELASTIC_CHUNK, 0, 0) != CUDA_SUCCESS) {
        free(p->e);
        p->e = NULL;
        p->slots = 0; /* not asked again */
        return -1;
    }
    return 0;
}

/* Set the pool's bound (once, before its first use): at most `limit` bytes, in whole chunks; none if chunks are
 * not to be kept (keep_ms 0). */
void elastic_pool_init(struct elastic_pool *p, uint64_t limit, uint64_t keep_ms, CUdevice ord) {
    p->slots = keep_ms ? (unsigned)(limit / ELASTIC_CHUNK) : 0;
    p->ord = ord;
}

/* Pin a new handle into free slot i and map it there with access. 0, or -1 with the slot still empty. */
static int fill(struct elastic_pool *p, unsigned i) {
    CUmemGenericAllocationHandle h;
    CUdeviceptr at = p->va + (uint64_t)i * ELASTIC_CHUNK;
    if (elastic_create_phys(&h, ELASTIC_CHUNK, 1, p->ord) != CUDA_SUCCESS) return -1;
    if (elastic_map_rw(at, ELASTIC_CHUNK, h, p->ord) != CUDA_SUCCESS) {
        REAL(cuMemRelease)(h);
        return -1;
    }
    p->e[i] = (struct elastic_pool_slot){.h = h, .filled = 1};
    p->pinned += ELASTIC_CHUNK;
    p->pins++;
    return 0;
}

/* A pinned host chunk for a move: a free filled slot, else a new one pinned into an empty slot. The slot index,
 * or -1 (pool full or the driver refused: the caller pins a chunk of its own). *h is its handle, *at where it
 * is mapped with access. */
int elastic_pool_get(struct elastic_pool *p, CUmemGenericAllocationHandle *h, CUdeviceptr *at) {
    if (pool_ready(p) < 0) return -1;
    int empty = -1;
    for (unsigned i = 0; i < p->slots; i++) {
        if (p->e[i].filled && !p->e[i].used) {
            p->e[i].used = 1;
            *h = p->e[i].h;
            *at = p->va + (uint64_t)i * ELASTIC_CHUNK;
            p->reuses++;
            return (int)i;
        }
        if (!p->e[i].filled && empty < 0) empty = (int)i;
    }
    if (empty < 0 || fill(p, (unsigned)empty) < 0) return -1;
    p->e[empty].used = 1;
    *h = p->e[empty].h;
    *at = p->va + (uint64_t)empty * ELASTIC_CHUNK;
    return empty;
}

/* Slot i's chunk holds no tenant bytes any more: it stays pinned and mapped, free for the next move. */
void elastic_pool_put(struct elastic_pool *p, int i) {
    if (i < 0 || !p->e || (unsigned)i >= p->slots || !p->e[i].used) return;
    p->e[i].used = 0;
    p->e[i].since = now_ns();
}

/* Bytes pinned in free slots (what a move to host memory gets without pinning). */
uint64_t elastic_pool_free_bytes(const struct elastic_pool *p) {
    uint64_t n = 0;
    for (unsigned i = 0; p->e && i < p->slots; i++) n += p->e[i].filled && !p->e[i].used ? ELASTIC_CHUNK : 0;
    return n;
}

/* Give back to the driver the free slots unused for keep_ms (all of them with 0). The bytes unpinned. */
uint64_t elastic_pool_trim(struct elastic_pool *p, uint64_t keep_ms) {
    uint64_t now = now_ns(), gone = 0;
    for (unsigned i = 0; p->e && i < p->slots; i++) {
        struct elastic_pool_slot *s = &p->e[i];
        if (!s->filled || s->used || now - s->since < keep_ms * 1000000ull) continue;
        REAL(cuMemUnmap)(p->va + (uint64_t)i * ELASTIC_CHUNK, ELASTIC_CHUNK);
        REAL(cuMemRelease)(s->h);
        *s = (struct elastic_pool_slot){0};
        p->pinned -= ELASTIC_CHUNK;
        gone += ELASTIC_CHUNK;
    }
    return gone;
}

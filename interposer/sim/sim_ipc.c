/* Legacy CUDA IPC on the simulated node: cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle.
 *
 * The memory is really shared. Device memory of 1 MiB and more is an anonymous mapping; exporting it moves
 * the allocation, in place and with its contents, onto a memfd (MAP_SHARED at the same address), and the
 * handle names that memfd by (exporter PID, fd number). The opener maps /proc/<pid>/fd/<fd>, which the kernel
 * allows to a process of the same user that may ptrace the exporter: processes of one container, as on a
 * real node, where IPC works between processes that see each other. The opener is not charged: the memory is
 * the exporter's, and stays valid until the exporter frees it (the fd closes then; mappings keep the pages).
 * Smaller allocations live in the malloc heap and cannot be shared: cuIpcGetMemHandle answers
 * CUDA_ERROR_NOT_SUPPORTED for them. IPC event handles are not modelled (the generated stub answers). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim_internal.h"
#include "sim_ipc_api.h"
#include "simstate.h"

#define API SIM_EXPORT
#define IPC_MAGIC 0x4d534950u /* "MSIP" */
#define MEMFD_NAME "memslice-ipc"

struct ipc_wire { uint32_t magic; uint32_t pid; int32_t fd; int32_t dev; uint64_t size, offset, base; };
_Static_assert(sizeof(struct ipc_wire) <= sizeof(CUipcMemHandle), "IPC handle layout exceeds 64 bytes");

struct exported { uint64_t base, size; int fd; struct exported *next; };
static struct exported *g_exported;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* Copy the resident pages of [p, p+n) to dst (untouched pages are zero in both: copying them would only
 * turn a sparse simulated allocation into real memory). */
static void copy_resident(char *dst, char *p, uint64_t n) {
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = (size_t)((n + (uint64_t)page - 1) / (uint64_t)page);
    unsigned char *vec = malloc(pages);
    if (!vec || mincore(p, n, vec) < 0) {
        memcpy(dst, p, n);
    } else {
        for (size_t i = 0; i < pages; i++) {
            if (!(vec[i] & 1)) continue;
            size_t off = i * (size_t)page, len = off + (size_t)page > n ? n - off : (size_t)page;
            memcpy(dst + off, p + off, len);
        }
    }
    free(vec);
}

/* Move the allocation [base, base+size) onto a new memfd at the same address; the fd, or -1. */
static int make_shareable(uint64_t base, uint64_t size) {
    int fd = memfd_create(MEMFD_NAME, MFD_CLOEXEC);
    if (fd < 0) return -1;
    void *tmp = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0)
        tmp = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (tmp == MAP_FAILED) { close(fd); return -1; }
    copy_resident(tmp, (char *)(uintptr_t)base, size);
    munmap(tmp, size);
    if (mmap((void *)(uintptr_t)base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        close(fd); /* the original anonymous mapping is still in place: nothing lost */
        return -1;
    }
    return fd;
}

/* The memfd behind an exported allocation (made on first export), or -1. Called with g_mu held. */
static int exported_fd(uint64_t base, uint64_t size) {
    for (struct exported *e = g_exported; e; e = e->next)
        if (e->base == base) return e->fd;
    struct exported *e = malloc(sizeof *e);
    int fd = e ? make_shareable(base, size) : -1;
    if (fd < 0) { free(e); return -1; }
    *e = (struct exported){base, size, fd, g_exported};
    g_exported = e;
    return fd;
}

/* An allocation is freed: close its memfd (openers keep their mappings, as with the real driver). */
void sim_ipc_release(uint64_t base) {
    pthread_mutex_lock(&g_mu);
    for (struct exported **pe = &g_exported; *pe; pe = &(*pe)->next) {
        if ((*pe)->base != base) continue;
        struct exported *e = *pe;
        *pe = e->next;
        close(e->fd);
        free(e);
        break;
    }
    pthread_mutex_unlock(&g_mu);
}

/* Export: make the allocation shareable (once) and describe it in the 64-byte handle. */
API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    ms_rec r;
    if (!h || !sim_ptr_range(p, &r) || r.kind != SIM_K_DEVICE || r.aux != 0) return CUDA_ERROR_INVALID_VALUE;
    if (r.size < SIM_SMALL_ALLOC) return CUDA_ERROR_NOT_SUPPORTED; /* heap memory: see the file comment */
    pthread_mutex_lock(&g_mu);
    int fd = exported_fd(r.key, r.size);
    pthread_mutex_unlock(&g_mu);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    /* the GPU by the node's index: the importer may number its GPUs differently (CUDA_VISIBLE_DEVICES) */
    struct ipc_wire w = {IPC_MAGIC, (uint32_t)getpid(), fd, sim_phys(r.dev), r.size, p - r.key, r.key};
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &w, sizeof w);
    return CUDA_SUCCESS;
}

/* Is fd (in process pid, or this process when pid is 0) one of the simulator's IPC memfds? */
static int is_ipc_memfd(unsigned int pid, int fd) {
    char path[64], target[128];
    if (pid) snprintf(path, sizeof path, "/proc/%u/fd/%d", pid, fd);
    else snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    return strncmp(target, "/memfd:" MEMFD_NAME, strlen("/memfd:" MEMFD_NAME)) == 0;
}

/* Open the exporter's memfd through /proc (a magic link: O_NOFOLLOW would refuse it), then check what was
 * opened — one of our memfds, a regular file at least as large as the handle says — so a handle naming
 * another file or a shrunken one is refused instead of mapped. */
static int open_exported(const struct ipc_wire *w) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%d", w->pid, w->fd);
    if (!is_ipc_memfd(w->pid, w->fd)) return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd >= 0 && (!is_ipc_memfd(0, fd) || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
                    (uint64_t)st.st_size < w->size)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Import: map the exporter's memfd; the pointer keeps the handle's offset into the allocation. */
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    struct ipc_wire w;
    memcpy(&w, h.reserved, sizeof w);
    if (!pdptr || flags > 1 || w.magic != IPC_MAGIC || w.offset >= w.size || w.size < SIM_SMALL_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    if (w.pid == (uint32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* not in the exporting process */
    /* on another GPU the memory is reached as a peer's: only where the two GPUs can (cuDeviceCanAccessPeer) */
    if (!sim_ctx_can_reach(sim_current_ctx(), w.dev)) return (CUresult)217; /* CUDA_ERROR_PEER_ACCESS_UNSUPPORTED */
    int fd = open_exported(&w);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE; /* exporter gone, freed, or not visible from here */
    void *m = mmap(NULL, w.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    int ord = sim_ordinal(w.dev);
    ms_rec r = {.key = (uint64_t)(uintptr_t)m, .size = w.size, .aux = w.offset,
                .dev = ord >= 0 ? ord : sim_ctx_device(sim_current_ctx()), .kind = SIM_K_IPC};
    if (sim_ptr_put(&r) < 0) { munmap(m, w.size); return CUDA_ERROR_OUT_OF_MEMORY; }
    *pdptr = r.key + w.offset;
    return CUDA_SUCCESS;
}
/* The pre-11.0 ABI name: same contract. */
API CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int f) {
    return cuIpcOpenMemHandle_v2(p, h, f);
}

/* Unmap an imported allocation (only pointers cuIpcOpenMemHandle returned). */
API CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    ms_rec r;
    if (!sim_ptr_range(p, &r) || r.kind != SIM_K_IPC || p != r.key + r.aux) return CUDA_ERROR_INVALID_VALUE;
    if (!sim_ptr_take(r.key, &r)) return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)(uintptr_t)r.key, r.size);
    return CUDA_SUCCESS;
}

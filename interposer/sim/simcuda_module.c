/* Simulated driver: modules and libraries. Code has no meaning here, but the device memory a module's
 * __device__ globals take does: an image that starts with SIM_MODULE_MAGIC (simcuda.h) takes the bytes its
 * header says, on the current context's GPU, until it is unloaded. Every image has a function of every name
 * (cuModuleGetFunction, cuLibraryGetKernel): what a launch of it costs in GPU time is simcuda_launch.c's. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_launch_api.h"
#include "simcuda.h"

struct sim_module { uint32_t magic; int dev; uint64_t bytes; struct sim_func *funcs; pthread_mutex_t mu; };
#define MODULE_MAGIC 0x4d4f4431u

/* The globals' size an image declares, or -1 when it is not an image the simulator can load. */
static int64_t image_bytes(const void *image) {
    if (!image || memcmp(image, SIM_MODULE_MAGIC, 8) != 0) return -1;
    uint64_t n;
    memcpy(&n, (const char *)image + 8, sizeof n);
    return n > (1ull << 50) ? -1 : (int64_t)n;
}

/* Load an image: charge its globals to the current context's GPU (a library, which needs no context: GPU 0
 * when none is current), then hand out a handle. */
static CUresult load_image(void **out, const void *image, int library) {
    NEED_INIT();
    if (!t_ctx && !library) return CUDA_ERROR_INVALID_CONTEXT;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    int64_t n = image_bytes(image);
    if (n < 0) return CUDA_ERROR_INVALID_IMAGE;
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *m = (struct sim_module){MODULE_MAGIC, t_ctx ? t_ctx->dev : 0, (uint64_t)n, NULL, PTHREAD_MUTEX_INITIALIZER};
    if (n && sim_charge(S(), m->dev, (uint64_t)n, 0) < 0) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = m;
    return CUDA_SUCCESS;
}

/* Load an image from a file: its first 16 bytes are all the simulator reads. */
static CUresult load_file(void **out, const char *path, int library) {
    char head[16];
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
    if (fd < 0) return CUDA_ERROR_FILE_NOT_FOUND;
    ssize_t got = read(fd, head, sizeof head);
    close(fd);
    return got == (ssize_t)sizeof head ? load_image(out, head, library) : CUDA_ERROR_INVALID_IMAGE;
}

/* Unload: the globals' memory comes back. */
static CUresult unload(void *h) {
    NEED_INIT();
    struct sim_module *m = h;
    if (!m || m->magic != MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    m->magic = 0;
    if (m->bytes) sim_uncharge(S(), m->dev, m->bytes, 0);
    for (struct sim_func *f = m->funcs, *next; f; f = next) {
        next = f->next;
        f->magic = 0;
        free(f);
    }
    free(m);
    return CUDA_SUCCESS;
}

/* cuModuleLoad: an image file. */
API CUresult cuModuleLoad(CUmodule *m, const char *fname) { return load_file((void **)m, fname, 0); }
/* cuModuleLoadData: an image in memory. */
API CUresult cuModuleLoadData(CUmodule *m, const void *image) { return load_image((void **)m, image, 0); }
/* cuModuleLoadDataEx: JIT options are accepted and ignored. */
API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v) {
    (void)n; (void)o; (void)v;
    return load_image((void **)m, image, 0);
}
/* cuModuleLoadFatBinary: the same images. */
API CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatCubin) { return load_image((void **)m, fatCubin, 0); }
/* cuModuleUnload. */
API CUresult cuModuleUnload(CUmodule m) { return unload(m); }

/* cuLibraryLoadData: context-independent, as on a real driver; its memory is on the current context's GPU. */
API CUresult cuLibraryLoadData(CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned int jn,
                               CUlibraryOption *lo, void **lv, unsigned int ln) {
    (void)jo; (void)jv; (void)jn; (void)lo; (void)lv; (void)ln;
    return load_image((void **)l, code, 1);
}
/* cuLibraryLoadFromFile: the same from a file. */
API CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *path, CUjit_option *jo, void **jv, unsigned int jn,
                                   CUlibraryOption *lo, void **lv, unsigned int ln) {
    (void)jo; (void)jv; (void)jn; (void)lo; (void)lv; (void)ln;
    return load_file((void **)l, path, 1);
}
/* cuLibraryUnload. */
API CUresult cuLibraryUnload(CUlibrary l) { return unload(l); }

/* The function `name` of a loaded image: the same handle for the same name, made on first use (a function
 * lives as long as its module, as on a real driver). */
static CUresult get_function(void **out, void *h, const char *name) {
    NEED_INIT();
    struct sim_module *m = h;
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!m || m->magic != MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    size_t len = strnlen(name, SIM_FUNC_NAME);
    if (len == 0 || len >= SIM_FUNC_NAME) return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&m->mu);
    struct sim_func *f = m->funcs;
    while (f && strcmp(f->name, name) != 0) f = f->next;
    if (!f && (f = calloc(1, sizeof *f))) {
        f->magic = SIM_FUNC_MAGIC;
        memcpy(f->name, name, len + 1);
        f->spin = strcmp(name, "spin") == 0 || strncmp(name, "_Z4spin", 7) == 0; /* C, or C++-mangled */
        f->next = m->funcs;
        m->funcs = f;
    }
    pthread_mutex_unlock(&m->mu);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = f;
    return CUDA_SUCCESS;
}

/* cuModuleGetFunction: any name names a function of any simulator image. */
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { return get_function((void **)f, m, name); }
/* cuLibraryGetKernel: a library's kernel is the same object as a module's function. */
API CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) { return get_function((void **)k, l, name); }
/* cuKernelGetFunction: the kernel's function in the current context (the same object here). */
API CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
    NEED_CTX();
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    if (!sim_func_of((CUfunction)k)) return CUDA_ERROR_INVALID_HANDLE;
    *f = (CUfunction)k;
    return CUDA_SUCCESS;
}
/* cuFuncGetName: the name it was looked up by. */
API CUresult cuFuncGetName(const char **name, CUfunction f) {
    NEED_INIT();
    struct sim_func *x = sim_func_of(f);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    *name = x->name;
    return CUDA_SUCCESS;
}
/* cuKernelGetName: the same for a library's kernel. */
API CUresult cuKernelGetName(const char **name, CUkernel k) { return cuFuncGetName(name, (CUfunction)k); }

/* ---- function attributes: what an H100 reports for a small kernel; settings are accepted ---------------- */
#define FUNC_ATTRIBUTE_MAX 16   /* CU_FUNC_ATTRIBUTE_MAX */

/* cuFuncGetAttribute: 1024 threads per block, PTX/binary version 9.0, nothing else used. */
API CUresult cuFuncGetAttribute(int *v, int attrib, CUfunction f) {
    NEED_INIT();
    if (!v || attrib < 0 || attrib >= FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    if (!sim_func_of(f)) return CUDA_ERROR_INVALID_HANDLE;
    *v = attrib == 0 ? 1024 : attrib == 5 || attrib == 6 ? 90 : 0;
    return CUDA_SUCCESS;
}
/* cuFuncSetAttribute (dynamic shared memory, carveout, cluster settings): accepted, no effect on GPU time. */
API CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
    NEED_INIT();
    (void)value;
    if (attrib < 0 || attrib >= FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    return sim_func_of(f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
/* cuFuncSetCacheConfig: accepted (CU_FUNC_CACHE_PREFER_NONE..EQUAL = 0..3). */
API CUresult cuFuncSetCacheConfig(CUfunction f, int config) {
    NEED_INIT();
    if (config < 0 || config > 3) return CUDA_ERROR_INVALID_VALUE;
    return sim_func_of(f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
/* cuKernelGetAttribute: the same answers for a library's kernel on a device. */
API CUresult cuKernelGetAttribute(int *v, int attrib, CUkernel k, CUdevice dev) {
    NEED_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    return cuFuncGetAttribute(v, attrib, (CUfunction)k);
}
/* cuKernelSetAttribute: accepted. */
API CUresult cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev) {
    NEED_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    return cuFuncSetAttribute((CUfunction)k, attrib, value);
}

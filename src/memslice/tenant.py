"""A tiny GPU tenant for the demo and the tests: allocates blocks through the CUDA driver API (ctypes over
libcuda.so.1, so it goes through whatever shim is preloaded), reports each step as a JSON line, then holds
its memory until stdin closes.

usage: python -m memslice.tenant MiB [MiB ...]
"""

from __future__ import annotations

import ctypes
import json
import sys


def main(argv: list[str]) -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_ulonglong
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ptr), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ptr]
    cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]

    def say(**kw: object) -> None:
        print(json.dumps(kw), flush=True)

    rc = cuda.cuInit(0)
    if rc != 0:
        say(event="init", result=rc)
        return 1
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = cuda.cuDeviceGet(ctypes.byref(dev), 0) or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    rc = rc or cuda.cuCtxSetCurrent(ctx)
    if rc != 0:
        say(event="context", result=rc)
        return 1
    held = []
    for mib in (int(a) for a in argv):
        p = ptr()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(p), mib << 20)
        if rc == 0:
            held.append(p)
            # touch it: the memory is real and usable
            pattern = (ctypes.c_ubyte * 64)(*range(64))
            back = (ctypes.c_ubyte * 64)()
            cuda.cuMemcpyHtoD_v2(p, pattern, 64)
            cuda.cuMemcpyDtoH_v2(back, p, 64)
            if bytes(back) != bytes(pattern):
                say(event="corrupt", mib=mib)
                return 1
        say(event="alloc", mib=mib, result=rc)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    say(event="ready", free_mib=free.value >> 20, total_mib=total.value >> 20)
    sys.stdin.read()
    for p in held:
        cuda.cuMemFree_v2(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Oversubscription on a real GPU (issue 23, item 3): what spilled memory costs, in figures apart.

Under `memslice run --gpu-mem QUOTA --oversubscribe`, a child fills the quota, then allocates --gib GiB more
(cudaMalloc: the shim serves it from host memory) and measures:
  - the allocation's cost per GiB of spilled memory (best and first of --rounds allocations), and its free;
  - what backs it: "vmm-host" (cuMemCreate with a HOST location, mapped at device addresses: the fast path),
    "pinned-host" (cuMemHostAlloc, mapped) or "device" (not spilled at all: the figures would be HBM's);
  - a kernel streaming it (read: 16-byte loads reduced per thread; write: 16-byte stores), best of 3, GB/s;
  - the same kernels on plain zero-copy memory (cudaHostAlloc mapped|portable) of the same size, and that
    allocation's cost per GiB: the machine's own bound for memory across the bus;
  - a data check: a pattern written by the kernel read back with cudaMemcpy at the start, middle and end.
Needs an NVIDIA GPU and CuPy (cupy.RawModule; the kernels are compiled by NVRTC, no internet needed).

usage: python benchmarks/bench_spill.py [--gib N] [--quota-mib M] [--rounds R] [--json]
       (with --child it is the measuring process itself, to be run under memslice run)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

GiB = 1 << 30

KERNELS = r"""
extern "C" __global__ void rd(const ulonglong2* __restrict__ p, unsigned long long n, unsigned long long* out) {
    unsigned long long acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        ulonglong2 v = p[i];
        acc ^= v.x + v.y;
    }
    if (acc == 0x9e3779b97f4a7c15ull) out[0] = acc;  /* keeps the loads; practically never true */
}
extern "C" __global__ void wr(ulonglong2* p, unsigned long long n, unsigned long long seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = make_ulonglong2(seed ^ i, i);
}
"""


def backing(ptr: int) -> str:
    """What memory backs a device pointer: vmm-host, vmm-device, pinned-host, device (driver API, ctypes)."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    h = ctypes.c_uint64()
    if cuda.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(ptr)) == 0:
        prop = (ctypes.c_int * 8)()  # CUmemAllocationProp: type, handle types, location {type, id}, ...
        rc = cuda.cuMemGetAllocationPropertiesFromHandle(prop, h)
        cuda.cuMemRelease(h)
        # CU_MEM_LOCATION_TYPE_HOST = 2, HOST_NUMA = 3, HOST_NUMA_CURRENT = 4
        return "vmm-host" if rc == 0 and prop[2] in (2, 3, 4) else "vmm-device"
    mtype = ctypes.c_uint()
    cuda.cuPointerGetAttribute(ctypes.byref(mtype), 2, ctypes.c_uint64(ptr))  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    return "pinned-host" if mtype.value == 1 else "device"  # CU_MEMORYTYPE_HOST = 1


def child(gib: int, rounds: int) -> dict[str, Any]:
    """The measurement, in a process under the shim with oversubscription on."""
    import cupy as cp
    import numpy as np
    from cupy.cuda import runtime as rt

    n = gib * GiB
    elems = n // 16
    mod = cp.RawModule(code=KERNELS)
    rd, wr = mod.get_function("rd"), mod.get_function("wr")
    out = cp.zeros(1, dtype=cp.uint64)
    grid, block = cp.cuda.Device().attributes["MultiProcessorCount"] * 8, 512

    def gbps(kernel: Any, ptr: int, extra: Any) -> float:
        args = (cp.uint64(ptr), cp.uint64(elems), extra)
        kernel((grid,), (block,), args)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        best = float("inf")
        for _ in range(3):
            start.record()
            kernel((grid,), (block,), args)
            end.record()
            end.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
        return round(n / best / 1e9, 2)

    def data_ok(ptr: int, seed: int) -> bool:
        wr((grid,), (block,), (cp.uint64(ptr), cp.uint64(elems), cp.uint64(seed)))
        rt.deviceSynchronize()
        chunk = np.empty(1 << 17, dtype=np.uint64)  # 1 MiB
        for first in (0, elems // 2, elems - chunk.size // 2):
            rt.memcpy(chunk.ctypes.data, ptr + first * 16, chunk.nbytes, 2)  # cudaMemcpyDeviceToHost
            idx = np.arange(first, first + chunk.size // 2, dtype=np.uint64)
            if not (np.array_equal(chunk[0::2], idx ^ np.uint64(seed)) and np.array_equal(chunk[1::2], idx)):
                return False
        return True

    free, _total = rt.memGetInfo()
    ballast = rt.malloc(free - (64 << 20)) if free > (128 << 20) else 0  # the quota is full: what follows spills
    allocs, frees = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        p = rt.malloc(n)
        allocs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rt.free(p)
        frees.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    spill = rt.malloc(n)
    allocs.append(time.perf_counter() - t0)
    res: dict[str, Any] = {"gib": gib, "spill_backing": backing(spill),
                           "spill_alloc_s_per_gib": round(min(allocs) / gib, 4),
                           "spill_alloc_first_s_per_gib": round(allocs[0] / gib, 4),
                           "spill_free_s_per_gib": round(min(frees) / gib, 4) if frees else None,
                           "spill_read_GBps": gbps(rd, spill, out), "spill_write_GBps": gbps(wr, spill, cp.uint64(1)),
                           "spill_data_ok": data_ok(spill, 0x5EED)}
    rt.free(spill)
    t0 = time.perf_counter()
    host = rt.hostAlloc(n, 1 | 2)  # cudaHostAllocPortable | cudaHostAllocMapped
    res["zero_copy_alloc_s_per_gib"] = round((time.perf_counter() - t0) / gib, 4)
    try:
        dev = rt.hostGetDevicePointer(host, 0)
    except AttributeError:  # an older CuPy: with unified addressing the host address is the device address
        dev = host
    res["zero_copy_read_GBps"] = gbps(rd, dev, out)
    res["zero_copy_write_GBps"] = gbps(wr, dev, cp.uint64(1))
    rt.freeHost(host)
    if ballast:
        rt.free(ballast)
    res["read_ratio"] = round(res["spill_read_GBps"] / res["zero_copy_read_GBps"], 3)
    res["write_ratio"] = round(res["spill_write_GBps"] / res["zero_copy_write_GBps"], 3)
    return res


def measure(gib: int, quota_mib: int, rounds: int, timeout: float = 150) -> dict[str, Any]:
    """Run the child under `memslice run` (a temporary region) and return its figures."""
    region = tempfile.mkdtemp(prefix="memslice-bench-spill-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    cmd = [sys.executable, "-m", "memslice.cli", "run", "--gpu-mem", f"{quota_mib}MiB", "--region-dir", region,
           f"--oversubscribe={gib * 4}GiB", "--", sys.executable, os.path.abspath(__file__), "--child",
           "--gib", str(gib), "--rounds", str(rounds)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate(timeout=30)
        raise RuntimeError(f"bench_spill: the child did not finish within {timeout:.0f} s: {err[-2000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"bench_spill: the child failed (rc={proc.returncode}): {err[-3000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=int, default=4, help="spilled allocation size, GiB (default 4)")
    ap.add_argument("--quota-mib", type=int, default=2048, help="the quota that is filled first (default 2048)")
    ap.add_argument("--rounds", type=int, default=2, help="timed allocate/free rounds before the measured one")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.gib, a.rounds)))
        return 0
    res = measure(a.gib, a.quota_mib, a.rounds)
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:>28}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

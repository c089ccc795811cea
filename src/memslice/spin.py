"""A compute tenant for the simulated GPU, for demos and tests: runs `spin` kernels (each occupies the GPU for
--ns nanoseconds of GPU time, docs/guide.md "Kernels in GPU time") through the CUDA driver API (ctypes over
libcuda.so.1, so through whatever shim is preloaded), synchronizing after each, for --seconds or --count
kernels, then prints one JSON object: kernels, gpu_ns (asked for), wall_ns, lat_ns_p50/p99 (launch to
synchronize returned), share (gpu_ns / wall_ns: the share of the GPU it got).

usage: python -m memslice.spin [--ns N] [--seconds T | --count K] [--gpu G]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any

SIM_IMAGE = b"MSSIMMOD" + bytes(8)  # a simulator module image with no globals


def percentile(values: list[int], pct: int) -> int:
    """The pct-th percentile (nearest rank) of values; 0 when empty."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, (len(ordered) * pct) // 100)]


def figures(lat_ns: list[int], spin_ns: int, wall_ns: int) -> dict[str, Any]:
    """What a run prints, from each kernel's latency."""
    gpu_ns = len(lat_ns) * spin_ns
    return {"kernels": len(lat_ns), "gpu_ns": gpu_ns, "wall_ns": wall_ns, "lat_ns_p50": percentile(lat_ns, 50),
            "lat_ns_p99": percentile(lat_ns, 99), "share": round(gpu_ns / wall_ns, 4) if wall_ns else 0.0}


class Driver:
    """The few driver calls a spin loop needs; each failure raises RuntimeError naming the call."""

    def __init__(self, gpu: int) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.stream = ctypes.c_void_p()
        self.func = ctypes.c_void_p()
        dev, ctx, mod = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
        self.ok(self.cu.cuInit(0), "cuInit")
        self.ok(self.cu.cuDeviceGet(ctypes.byref(dev), gpu), "cuDeviceGet")
        self.ok(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.ok(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        image = ctypes.create_string_buffer(SIM_IMAGE, len(SIM_IMAGE))
        self.ok(self.cu.cuModuleLoadData(ctypes.byref(mod), image),
                "cuModuleLoadData (spin kernels exist on the simulated GPU only)")
        self.ok(self.cu.cuModuleGetFunction(ctypes.byref(self.func), mod, b"spin"), "cuModuleGetFunction")
        self.ok(self.cu.cuStreamCreate(ctypes.byref(self.stream), 0), "cuStreamCreate")

    @staticmethod
    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUresult {rc}")

    def spin(self, ns: int) -> None:
        """One spin(ns) kernel, waited for."""
        arg = ctypes.c_ulonglong(ns)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
        self.ok(self.cu.cuLaunchKernel(self.func, 1, 1, 1, 1, 1, 1, 0, self.stream, params, None), "cuLaunchKernel")
        self.ok(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m memslice.spin", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", type=int, default=1_000_000, help="GPU time of each kernel (default 1 ms)")
    ap.add_argument("--seconds", type=float, default=1.0, help="run this long (default 1)")
    ap.add_argument("--count", type=int, default=0, help="run exactly this many kernels instead")
    ap.add_argument("--gpu", type=int, default=0)
    a = ap.parse_args(argv)
    if not 0 <= a.ns <= 600 * 10**9 or not 0 < a.seconds <= 3600 or a.count < 0:
        print("memslice.spin: --ns must be 0..6e11, --seconds 0..3600, --count >= 0", file=sys.stderr)
        return 2
    try:
        drv = Driver(a.gpu)
        lat: list[int] = []
        start = time.monotonic_ns()
        until = start + int(a.seconds * 1e9)
        while len(lat) < a.count if a.count else time.monotonic_ns() < until:
            t0 = time.monotonic_ns()
            drv.spin(a.ns)
            lat.append(time.monotonic_ns() - t0)
    except RuntimeError as e:
        print(f"memslice.spin: {e}", file=sys.stderr)
        return 1
    print(json.dumps(figures(lat, a.ns, time.monotonic_ns() - start)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Memory the driver takes outside allocation calls, on the real driver (issue 23 item 4): under a quota, a
large stack limit, a module with a 2 GiB __device__ array, a VMM handle exported, imported, mapped and the
original released, and 16 more contexts. After each call NVML's per-process figure (read from outside the
shim) must stay within the quota, and cuMemAlloc afterwards gets only what is left of it."""

from __future__ import annotations

import sys

import pytest
from gpukit import held, need_nvml, no_gpu_reason, nvml_outside, real_env, report, run_cmd_argv

pytestmark = pytest.mark.skipif(no_gpu_reason() is not None, reason=no_gpu_reason() or "")

QUOTA = 2048

# One JSON line after each step, then a line on stdin before the next: the test reads NVML in between.
STEPS = r"""
import ctypes, json, os, sys
cuda = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_uint64
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0
cuda.cuDeviceGet(ctypes.byref(dev), 0)
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)

def free_mib():
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
    return f.value >> 20

def say(step, rc=0, **kw):
    print(json.dumps({"step": step, "rc": rc, "free_mib": free_mib(), **kw}), flush=True)
    sys.stdin.readline()

say("start")
cuda.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
say("stack_256k", cuda.cuCtxSetLimit(0, 256 << 10))          # CU_LIMIT_STACK_SIZE
PTX = (b".version 7.8\n.target sm_80\n.address_size 64\n"
       b".visible .global .align 8 .b8 big[2147483648];\n")
mod = ctypes.c_void_p()
say("module_2gib", cuda.cuModuleLoadData(ctypes.byref(mod), PTX))

class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handles", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("flags", ctypes.c_uint64)]
prop = Prop(1, 1, 1, 0, None, 0)                                 # PINNED, POSIX fd, on device 0
size = 512 << 20
h, h2, fd, va = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_int(), P()
rc = cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_uint64(0))
rc = rc or cuda.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_uint64(0))
rc = rc or cuda.cuMemImportFromShareableHandle(ctypes.byref(h2), ctypes.c_void_p(fd.value), 1)
rc = rc or cuda.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0), P(0),
                                    ctypes.c_uint64(0))
rc = rc or cuda.cuMemMap(va, ctypes.c_size_t(size), ctypes.c_size_t(0), h2, ctypes.c_uint64(0))
rc = rc or cuda.cuMemRelease(h)
say("import_512m_original_released", rc)

ctxs, rcs = [], []
cuda.cuCtxCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
for _ in range(16):
    c = ctypes.c_void_p()
    r = cuda.cuCtxCreate_v2(ctypes.byref(c), 0, dev)
    rcs.append(r)
    if r == 0:
        ctxs.append(c)
cuda.cuCtxSetCurrent(ctx)
say("contexts_16", 0, created=len(ctxs), refused=sum(1 for r in rcs if r))

cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(P), ctypes.c_size_t]
got, p = 0, P()
while cuda.cuMemAlloc_v2(ctypes.byref(p), 16 << 20) == 0:
    got += 16
say("fill", 0, alloc_got_mib=got)
"""


def test_what_the_driver_takes_unseen_stays_within_the_quota(tmp_path):
    need_nvml()
    cmd = [*run_cmd_argv(QUOTA, tmp_path / "region"), sys.executable, "-u", "-c", STEPS]

    rows = []
    with held(cmd, real_env()) as h:
        line = h.read()
        while True:
            procs = nvml_outside()["procs"]
            # the kit runs alone on the GPU: every process NVML lists is this test's program
            line["nvml_mib"] = sum(procs.values())
            rows.append(line)
            if line["step"] == "fill":
                break
            line = h.ask("")
    figures = {f"{r['step']}_nvml_mib": r["nvml_mib"] for r in rows}
    figures.update({f"{r['step']}_rc": r["rc"] for r in rows})
    figures.update({f"{r['step']}_shim_free_mib": r["free_mib"] for r in rows})
    fill = rows[-1]
    report("unseen driver memory under a quota", quota_mib=QUOTA, **figures,
           contexts_created=rows[-2].get("created"), fill_alloc_got_mib=fill.get("alloc_got_mib"))
    for r in rows:
        assert r["nvml_mib"] <= QUOTA, f"after {r['step']} NVML shows {r['nvml_mib']} MiB: past the {QUOTA} MiB quota"


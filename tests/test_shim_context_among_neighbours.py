"""A context is charged what it takes even while a neighbour allocates on the same GPU (found by
tests/test_real_dra.py when its 8 tenants started at once: one context was refused as "4.3 GiB").

interposer/src/measure.c charges a context the LARGER of NVML's figure for the process and the drop in the
driver's free memory over the call. The drop also counts what other containers allocate meanwhile, so a
container whose process starts while a neighbour allocates is over-charged, up to a refusal of its context
(CUDA_ERROR_OUT_OF_MEMORY at start-up) though its quota is empty. NVML's per-process figure is exact here
(the node's own NVML, the process's host PID): the product bug is the max(). Marked xfail until measure.c is
changed; it runs, so a fix shows as XPASS."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import kv, run

QUOTA_MIB = 1024
CONTEXT_MIB = 520  # what a context takes on this simulated GPU
GROW = """import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
cuda.cuInit(0); cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
print("growing", flush=True)
while True:  # a neighbour loading a model: 64 MiB blocks, kept, up to 8 GiB; then it starts again
    held = []
    for _ in range(128):
        p = ctypes.c_ulonglong()
        if cuda.cuMemAlloc_v2(ctypes.byref(p), 64 << 20) == 0:
            held.append(p)
    for p in held:
        cuda.cuMemFree_v2(p)
"""


@pytest.mark.xfail(reason="measure.c charges max(NVML's per-process figure, the drop in free memory): a "
                          "neighbour's concurrent allocations inflate the drop, over-charging or refusing a "
                          "context (product bug, reported)", strict=False)
def test_a_context_made_while_a_neighbour_allocates_is_charged_what_it_takes(node, cbin, tmp_path):
    """A neighbour (another container, or a process outside memslice) keeps allocating on the GPU while new
    processes of sixteen 1 GiB containers start one after the other: each is charged its own context (520 MiB,
    with its 1 MiB allocation), none more, none refused."""
    n = node(context_overhead=f"{CONTEXT_MIB}MiB")
    neighbour = subprocess.Popen([sys.executable, "-c", GROW], env=n.env, stdout=subprocess.PIPE, text=True)
    try:
        assert neighbour.stdout is not None and neighbour.stdout.readline() == "growing\n"
        charged = []
        for i in range(16):
            out = run([cbin["alloc_direct"], "1"], n.container(tmp_path / f"c{i}", f"{QUOTA_MIB}MiB"))
            assert out.returncode == 0, f"start {i}: its context was refused: {out.stdout} {out.stderr}"
            info = next(line for line in out.stdout.splitlines() if line.startswith("info "))
            charged.append(QUOTA_MIB - int(kv(info)["free"]))
    finally:
        neighbour.kill()
        neighbour.wait(30)
    assert charged == [CONTEXT_MIB + 1] * 16, charged

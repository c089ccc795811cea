"""Real CUDA clients on the simulated GPU under `memslice run`: cuda-bindings (driver API), cuda.core (device,
streams, events, its memory resource until its own out-of-memory error) and numba-cuda (device arrays, memory
info, its OOM error). Each sees the quota as the GPU's total memory, fails at the quota with its own error, and
shows in `memslice top`."""

from __future__ import annotations

import pytest
from clients import CHUNK_MIB, QUOTA_MIB, holding, process_mib, quota_mib, read_until_held, top

pytest.importorskip("cuda.core", reason="cuda-core is in the test extra: pip install -e '.[test]'")

CUDA_CORE = f"""
import sys
from cuda.core import Device, EventOptions
from cuda.bindings import driver
d = Device(0)
d.set_current()
name = d.name
print("name=" + repr(name))
err, free, total = driver.cuMemGetInfo()
print(f"total={{total >> 20}}")
from cuda.core import StreamOptions
hi = d.create_stream(options=StreamOptions(priority=-5))
print(f"priority={{hi.priority}}")
s = d.create_stream()
e1 = d.create_event(EventOptions(timing_enabled=True))
e2 = d.create_event(EventOptions(timing_enabled=True))
s.record(e1)
s.record(e2)
e2.sync()
s.sync()
print(f"elapsed_ok={{(e2 - e1) >= 0}}")
print(f"stream_device={{s.device.device_id}}")
mr = d.memory_resource
bufs = []
try:
    while True:
        bufs.append(mr.allocate({CHUNK_MIB} << 20, stream=s))
except Exception as ex:
    print(f"oom={{type(ex).__name__}}:{{'CUDA_ERROR_OUT_OF_MEMORY' in str(ex)}}")
print(f"chunks={{len(bufs)}}")
print("held", flush=True)
sys.stdin.read()
"""


def test_cuda_core_streams_events_and_oom_at_quota(tmp_path):
    with holding(tmp_path, CUDA_CORE) as (env, proc, region):
        got = read_until_held(proc)
        assert got["name"] == repr("Simulated GPU 16GiB (memslice)")  # nothing after the NUL
        assert int(got["total"]) == QUOTA_MIB
        assert got["elapsed_ok"] == "True" and got["stream_device"] == "0" and got["priority"] == "-5"
        assert got["oom"] == "CUDAError:True"
        chunks = int(got["chunks"])
        assert chunks >= 4 and chunks * CHUNK_MIB <= QUOTA_MIB
        snap = top(region, env)
        assert quota_mib(snap) == QUOTA_MIB
        [held] = process_mib(snap).values()
        assert chunks * CHUNK_MIB <= held <= QUOTA_MIB


NUMBA = f"""
import sys
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError
ctx = cuda.current_context()
free, total = ctx.get_memory_info()
print(f"total={{total >> 20}}")
name = cuda.get_current_device().name
print(f"name={{name.decode() if isinstance(name, bytes) else name}}")
arrs = []
try:
    while True:
        arrs.append(cuda.device_array({CHUNK_MIB} << 18, dtype="float32"))
except Exception as ex:
    print(f"oom={{type(ex).__name__}}:{{'OUT_OF_MEMORY' in str(ex) or 'out of memory' in str(ex).lower()}}")
print(f"chunks={{len(arrs)}}")
s = cuda.stream()
e = cuda.event()
e.record(stream=s)
e.synchronize()
s.synchronize()
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("binding", ["nvidia", "ctypes"])
def test_numba_device_arrays_and_oom_at_quota(tmp_path, binding, monkeypatch):
    pytest.importorskip("numba.cuda", reason="numba-cuda is in the test extra")
    monkeypatch.setenv("NUMBA_CUDA_USE_NVIDIA_BINDING", "1" if binding == "nvidia" else "0")
    with holding(tmp_path, NUMBA) as (env, proc, region):
        got = read_until_held(proc)
        assert int(got["total"]) == QUOTA_MIB
        assert got["name"] == "Simulated GPU 16GiB (memslice)"
        assert got["oom"].endswith(":True"), got["oom"]
        chunks = int(got["chunks"])
        assert chunks >= 4 and chunks * CHUNK_MIB <= QUOTA_MIB
        [held] = process_mib(top(region, env)).values()
        assert chunks * CHUNK_MIB <= held <= QUOTA_MIB


BINDINGS = f"""
import sys
from cuda.bindings import driver as d
def ok(r):
    err, *rest = r
    assert err == d.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest
ok(d.cuInit(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))
ok(d.cuCtxSetCurrent(ctx))
free, total = ok(d.cuMemGetInfo())
print(f"total={{total >> 20}}")
ptrs = []
while True:
    err, p = d.cuMemAlloc({CHUNK_MIB} << 20)
    if err != d.CUresult.CUDA_SUCCESS:
        print(f"oom={{err.name}}")
        break
    ptrs.append(p)
print(f"chunks={{len(ptrs)}}")
print("held", flush=True)
sys.stdin.read()
"""


def test_cuda_bindings_driver_api_oom_at_quota(tmp_path):
    with holding(tmp_path, BINDINGS) as (env, proc, region):
        got = read_until_held(proc)
        assert int(got["total"]) == QUOTA_MIB
        assert got["oom"] == "CUDA_ERROR_OUT_OF_MEMORY"
        chunks = int(got["chunks"])
        assert chunks >= 4 and chunks * CHUNK_MIB <= QUOTA_MIB
        [held] = process_mib(top(region, env)).values()
        assert chunks * CHUNK_MIB <= held <= QUOTA_MIB

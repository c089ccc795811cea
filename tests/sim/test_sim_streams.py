"""Streams, events and device names on the simulated GPU, through the real cuda-bindings driver API (no shim):
priorities within cuCtxGetStreamPriorityRange, flags, owning context, per-thread and legacy default streams,
event timing, timing-disabled and unrecorded events, and cuDeviceGetName filling the buffer like the driver."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import run

pytest.importorskip("cuda.bindings", reason="cuda-bindings is in the test extra")

SCRIPT = r"""
import json, time
from cuda.bindings import driver as d
S = d.CUresult.CUDA_SUCCESS
def ok(r):
    err, *rest = r
    assert err == S, err
    return rest[0] if len(rest) == 1 else rest
def code(r):
    return int((r[0] if isinstance(r, tuple) else r))
ok(d.cuInit(0))
dev = ok(d.cuDeviceGet(0))
out = {}
raw = ok(d.cuDeviceGetName(256, dev))
out["name"] = raw.split(b"\0")[0].decode()
out["after_nul"] = sorted(set(raw[len(out["name"]):]))
out["no_ctx_range"] = code(d.cuCtxGetStreamPriorityRange())
ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
least, greatest = ok(d.cuCtxGetStreamPriorityRange())
out["range"] = [least, greatest]
hi = ok(d.cuStreamCreateWithPriority(d.CUstream_flags.CU_STREAM_NON_BLOCKING, -100))
lo = ok(d.cuStreamCreate(0))
out["prio"] = [ok(d.cuStreamGetPriority(hi)), ok(d.cuStreamGetPriority(lo))]
out["flags"] = [ok(d.cuStreamGetFlags(hi)), ok(d.cuStreamGetFlags(lo))]
out["ctx_same"] = int(ok(d.cuStreamGetCtx(hi))) == int(ctx)
per_thread = d.CUstream(d.CU_STREAM_PER_THREAD)
out["ptd_ctx_same"] = int(ok(d.cuStreamGetCtx(per_thread))) == int(ctx)
out["ptd_prio"] = ok(d.cuStreamGetPriority(per_thread))
out["ids_differ"] = ok(d.cuStreamGetId(hi)) != ok(d.cuStreamGetId(lo))
e1, e2 = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
out["unrecorded_elapsed"] = code(d.cuEventElapsedTime(e1, e2))
ok(d.cuEventRecord(e1, hi))
time.sleep(0.05)
ok(d.cuEventRecord(e2, per_thread))
out["elapsed_ms"] = ok(d.cuEventElapsedTime(e1, e2))
out["queries"] = [code(d.cuStreamQuery(hi)), code(d.cuEventQuery(e2)), code(d.cuEventSynchronize(e2)),
                  code(d.cuStreamWaitEvent(lo, e1, 0)), code(d.cuStreamSynchronize(hi))]
nt = ok(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING))
ok(d.cuEventRecord(nt, lo))
out["no_timing_elapsed"] = code(d.cuEventElapsedTime(e1, nt))
out["bad_ipc_event"] = code(d.cuEventCreate(d.CUevent_flags.CU_EVENT_INTERPROCESS))
out["destroy"] = [code(d.cuEventDestroy(e1)), code(d.cuStreamDestroy(hi))]
out["unmodelled"] = code(d.cuGraphCreate(0))
print(json.dumps(out))
"""


def test_streams_events_and_name(node):
    n = node(gpus="16GiB")
    out = run([sys.executable, "-c", SCRIPT], n.env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["name"] == "Simulated GPU 16GiB (memslice)" and got["after_nul"] == [0]
    assert got["no_ctx_range"] == 201  # CUDA_ERROR_INVALID_CONTEXT
    assert got["range"] == [0, -5]
    assert got["prio"] == [-5, 0]  # clamped to the greatest priority
    assert got["flags"] == [1, 0]
    assert got["ctx_same"] and got["ptd_ctx_same"] and got["ptd_prio"] == 0 and got["ids_differ"]
    assert got["unrecorded_elapsed"] == 400  # CUDA_ERROR_INVALID_HANDLE
    assert got["elapsed_ms"] >= 50.0
    assert got["queries"] == [0, 0, 0, 0, 0]
    assert got["no_timing_elapsed"] == 400
    assert got["bad_ipc_event"] == 1  # interprocess events must disable timing
    assert got["destroy"] == [0, 0]
    assert got["unmodelled"] == 801  # CUDA_ERROR_NOT_SUPPORTED from the generated stub

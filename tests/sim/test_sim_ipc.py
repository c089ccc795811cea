"""Legacy CUDA IPC on the simulated node, through the real cuda-bindings driver API: an allocation exported by
one process and opened by another is the same memory (writes go both ways), the opener is not charged, and
handles that cannot be honoured (small heap allocations, the exporting process, garbage) are refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import run

pytest.importorskip("cuda.bindings", reason="cuda-bindings is in the test extra")

PRELUDE = r"""
import json, sys
from cuda.bindings import driver as d
def ok(r):
    err, *rest = r
    assert err == d.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest
def code(r):
    return int(r[0] if isinstance(r, tuple) else r)
ok(d.cuInit(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))
ok(d.cuCtxSetCurrent(ctx))
import ctypes
def raw(h):  # the handle's 64 bytes (cuda-bindings exposes them only through getPtr)
    return (ctypes.c_char * 64).from_address(h.getPtr())
def peek(ptr, n=8):
    buf = bytearray(n)
    ok(d.cuMemcpyDtoH(buf, ptr, n))
    return bytes(buf).hex()
"""

EXPORTER = PRELUDE + r"""
p = ok(d.cuMemAlloc(8 << 20))
ok(d.cuMemsetD8(p, 0xAB, 8 << 20))
h = ok(d.cuIpcGetMemHandle(p))
small = ok(d.cuMemAlloc(4096))
print(json.dumps({"handle": bytes(raw(h)).hex(), "small": code(d.cuIpcGetMemHandle(small)),
                  "self_open": code(d.cuIpcOpenMemHandle(h, 1)), "before": peek(p)}), flush=True)
sys.stdin.readline()
print(json.dumps({"after": peek(p), "tail": peek(int(p) + (8 << 20) - 8)}), flush=True)
sys.stdin.readline()
"""

OPENER = PRELUDE + r"""
h = d.CUipcMemHandle()
raw(h)[:] = bytes.fromhex(sys.argv[1])
p = ok(d.cuIpcOpenMemHandle(h, d.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
seen = peek(p)
ok(d.cuMemsetD8(p, 0xCD, 8 << 20))
bad = d.CUipcMemHandle()
raw(bad)[:] = bytes(64)
out = {"seen": seen, "garbage": code(d.cuIpcOpenMemHandle(bad, 1)), "free_ipc": code(d.cuMemFree(p)),
       "close": code(d.cuIpcCloseMemHandle(p)), "close_again": code(d.cuIpcCloseMemHandle(p))}
print(json.dumps(out))
"""


def test_ipc_memory_is_shared_between_processes(node):
    n = node(gpus="4GiB", context_overhead="0")
    exporter = subprocess.Popen([sys.executable, "-c", EXPORTER], env=n.env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = exporter.stdout.readline()
        assert line, exporter.stderr.read()
        first = json.loads(line)
        assert first["before"] == "ab" * 8
        assert first["small"] == 801  # heap allocations are not shareable here
        assert first["self_open"] == 201  # CUDA_ERROR_INVALID_CONTEXT in the exporting process
        charged = n.physical()[0].used_bytes
        out = run([sys.executable, "-c", OPENER, first["handle"]], n.env)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["seen"] == "ab" * 8
        assert got["garbage"] == 1 and got["free_ipc"] == 1 and got["close"] == 0 and got["close_again"] == 1
        assert n.physical()[0].used_bytes == charged  # the opener was not charged
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        after = json.loads(exporter.stdout.readline())
        assert after == {"after": "cd" * 8, "tail": "cd" * 8}
    finally:
        exporter.stdin.close()
        exporter.wait(timeout=30)

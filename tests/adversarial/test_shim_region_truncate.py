"""A tenant truncates its own region file under its live processes (issue 25 item 8). Their mappings of the
lost pages used to raise SIGBUS at their next allocation or free: every CUDA process of the container died.
Now each survives and fails closed: its allocations are refused from then on (it cannot take more than its
quota, whatever the ledger says), it can still free what it holds and exit normally, and the simulated
GPU's physical high-water mark stays within the quota throughout. Real processes under the shim on the
simulated driver, driven over stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

MiB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2

TENANT = r"""
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
ptr = ctypes.c_ulonglong
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ptr), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ptr]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
held = []
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    word, _, arg = line.strip().partition(" ")
    if word == "alloc":
        p = ptr()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(p), int(arg) << 20)
        if rc == 0:
            held.append(p)
        print(json.dumps({"alloc": int(arg), "result": rc}), flush=True)
    elif word == "free":
        print(json.dumps({"free": 1, "result": cuda.cuMemFree_v2(held.pop())}), flush=True)
print(json.dumps({"bye": len(held)}), flush=True)
"""


class Tenant:
    def __init__(self, env: dict[str, str]) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", TENANT], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.line() == {"ready": True}

    def line(self) -> dict:
        assert self.p.stdout is not None
        text = self.p.stdout.readline()
        assert text, f"the tenant died: exit {self.p.wait(30)}, {self.p.stderr.read() if self.p.stderr else ''}"
        return json.loads(text)

    def ask(self, command: str) -> dict:
        assert self.p.stdin is not None
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        return self.line()

    def finish(self) -> tuple[int, str]:
        assert self.p.stdin is not None
        self.p.stdin.close()
        assert "bye" in self.line()
        err = self.p.stderr.read() if self.p.stderr else ""
        return self.p.wait(30), err


OVERHEAD = 64  # MiB of context per process on the simulated GPU (not charged: MEMSLICE_CONTEXT_RESERVE=0)


@pytest.mark.parametrize("size", [0, 4096])
def test_truncated_region_fails_closed_without_killing(size, node, tmp_path) -> None:
    """Truncated to nothing, or to its first page: the header, the device table and slots 0-1 are kept,
    the slots of A and B (3 and 4: three other processes allocated first) are not."""
    quota = 1024
    n = node(context_overhead=f"{OVERHEAD}MiB")
    region = tmp_path / "c"
    env = n.container(region, f"{quota}MiB", MEMSLICE_CONTEXT_RESERVE="0")
    others = [Tenant(env) for _ in range(3)] if size else []
    for t in others:
        assert t.ask("alloc 1")["result"] == 0  # slots 0, 1 and 2 (which straddles the page boundary)
    a, b = Tenant(env), Tenant(env)
    try:
        assert a.ask("alloc 600")["result"] == 0
        assert b.ask("alloc 300")["result"] == 0
        os.truncate(region / "memslice.region", size)
        # both live on; their charges are refused, whatever is left of the quota (124 MiB)
        assert a.ask("alloc 100")["result"] == CUDA_ERROR_OUT_OF_MEMORY
        assert b.ask("alloc 1")["result"] == CUDA_ERROR_OUT_OF_MEMORY
        assert a.ask("free")["result"] == 0  # what a process holds it can still give back
        assert a.ask("alloc 100")["result"] == CUDA_ERROR_OUT_OF_MEMORY  # and it stays closed
        assert b.ask("free")["result"] == 0
        for t in (a, b):
            rc, err = t.finish()
            assert rc == 0, err  # a normal exit, no SIGBUS
            assert "region file was truncated under this process" in err, err
        for t in others:  # held to the quota by what is left of the ledger (903 MiB charged), or closed once
            # they touch a lost page (the sweep after that refusal reads every slot): alive either way
            assert t.ask("alloc 1000")["result"] == CUDA_ERROR_OUT_OF_MEMORY
        for t in others:
            assert t.finish()[0] == 0
    finally:
        for t in (a, b, *others):
            t.p.kill()
            t.p.wait(30)
    peak = n.physical()[0].peak_bytes
    # nothing was allocated after the truncation but what the surviving ledger allowed
    most = (600 + 300 + len(others) + OVERHEAD * (2 + len(others))) * MiB
    assert 0 < peak <= most, f"physical peak {peak / MiB:.0f} MiB, over the {most / MiB:.0f} MiB held before"
    assert n.physical()[0].charged_bytes == 0  # everything was given back to the GPU


def test_a_sigbus_that_is_not_the_ledgers_still_kills(node, tmp_path) -> None:
    """The guard handles only faults in a ledger mapping: any other SIGBUS (here, another truncated file's
    mapping) ends the process as it would without the shim."""
    n = node()
    env = n.container(tmp_path / "c", "1GiB")
    other = tmp_path / "other"
    other.write_bytes(b"\0" * 8192)
    code = f"""
import ctypes, mmap, os
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
p = ctypes.c_ulonglong()
assert cuda.cuMemAlloc_v2(ctypes.byref(p), 1 << 20) == 0  # the ledger is open (and guarded)
f = open({str(other)!r}, "r+b")
m = mmap.mmap(f.fileno(), 8192)
os.truncate({str(other)!r}, 0)
print("touching", flush=True)
m[4096] = 1
print("survived", flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == -7, (out.returncode, out.stderr)  # SIGBUS, as always
    assert "touching" in out.stdout and "survived" not in out.stdout

"""The simulated GPU follows the driver's documented C ABI: cuGetProcAddress rules, NVML discovery,
memory, processes and Xid events, one physical capacity shared by every process of the node."""

from __future__ import annotations

import ctypes
import subprocess
import sys

from conftest import proc_lookup, run

PYNVML = """
import pynvml as n
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    bus = n.nvmlDeviceGetPciInfo(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    assert n.nvmlDeviceGetHandleByPciBusId(bus) is not None
    print(i, n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetMemoryInfo(h).total >> 20, n.nvmlDeviceGetNumaNodeId(h),
          n.nvmlDeviceGetMigMode(h)[0], n.nvmlDeviceGetName(h))
"""


def test_nvml_discovery(node):
    n = node(gpus="16GiB,24GiB:1,8GiB:0:mig")
    out = run([sys.executable, "-c", PYNVML], n.env)
    assert out.returncode == 0, out.stderr
    rows = [line.split(maxsplit=5) for line in out.stdout.splitlines()]
    # NVML's total adds what the driver reserves (480 MiB per 80 GiB, as an H100's 81,559 vs CUDA's 81,079)
    assert [(r[2], r[3], r[4]) for r in rows] == [("16480", "0", "0"), ("24720", "1", "0"), ("8240", "0", "1")]
    assert len({r[1] for r in rows}) == 3 and all(r[1].startswith("GPU-") for r in rows)
    # a second process sees the same node (same UUIDs)
    again = run([sys.executable, "-c", PYNVML], n.env)
    assert again.stdout == out.stdout


RESERVED = """
import ctypes, os, pynvml as n
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
total = ctypes.c_size_t()
cuda.cuDeviceTotalMem_v2(ctypes.byref(total), 0)
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
v1, v2 = n.nvmlDeviceGetMemoryInfo(h), n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
print(total.value >> 20, v1.total >> 20, v1.used >> 20, v1.free >> 20, v2.total >> 20, v2.reserved >> 20,
      v2.used >> 20, v2.free >> 20)
"""


def test_reserved_memory_is_in_nvmls_total_and_not_in_cudas(node):
    """As on an H100 (NVML 81,559 MiB; nvmlDeviceGetMemoryInfo_v2: 480 reserved, 81,079 free; CUDA 81,079):
    the driver's reserved memory counts in NVML's total and v1's used, never in what can be allocated."""
    out = run([sys.executable, "-c", RESERVED], node(gpus="80GiB").env)
    assert out.returncode == 0, out.stderr
    cuda, t1, u1, f1, t2, r2, u2, f2 = map(int, out.stdout.split())
    assert (cuda, t1, u1, f1) == (81920, 81920 + 480, 480, 81920)
    assert (t2, r2, u2, f2) == (81920 + 480, 480, 0, 81920)
    out = run([sys.executable, "-c", RESERVED], {**node(gpus="16GiB").env, "MEMSLICE_SIM_RESERVED": "200MiB"})
    assert out.stdout.split()[:2] == ["16384", "16584"]


def test_bad_gpu_list_is_explained(node):
    n = node(gpus="16GB")
    out = run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], n.env)
    assert out.returncode != 0
    assert "MEMSLICE_SIM_GPUS=16GB is not valid" in out.stderr


def test_physical_capacity_is_shared_by_all_processes(node, cbin):
    n = node(gpus="2GiB", context_overhead="0")
    holder = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "1500"], env=n.env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert '"result": 0' in holder.stdout.readline()
        holder.stdout.readline()
        out = run([cbin["alloc_direct"], "600", "400"], n.env)
        assert "alloc 600 MiB -> 2" in out.stdout and "alloc 400 MiB -> 0" in out.stdout
        assert "info free=148 total=2048" in out.stdout
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_context_overhead_is_device_memory(node, cbin):
    n = node(gpus="1GiB", context_overhead="300MiB")
    out = run([cbin["alloc_direct"], "800"], n.env)
    assert "alloc 800 MiB -> 2" in out.stdout  # 300 MiB taken by the context


XID = """
import pynvml as n, sys
n.nvmlInit()
s = n.nvmlEventSetCreate()
for i in range(n.nvmlDeviceGetCount()):
    n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(i), n.nvmlEventTypeXidCriticalError, s)
print("waiting", flush=True)
e = n.nvmlEventSetWait(s, 20000)
print("event", e.eventType, e.eventData, n.nvmlDeviceGetIndex(e.device), flush=True)
try:
    n.nvmlEventSetWait(s, 10)
except n.NVMLError_Timeout:
    print("timeout")
"""


def test_xid_injection_reaches_a_waiting_process(node):
    n = node(gpus="16GiB,16GiB")
    waiter = subprocess.Popen([sys.executable, "-c", XID], env=n.env, stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline().strip() == "waiting"
        out = subprocess.run([sys.executable, "-m", "memslice", "sim", "xid", "--gpu", "1", "--xid", "79", "--state",
                              n.state], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert waiter.stdout.readline().split() == ["event", "8", "79", "1"]
        assert waiter.stdout.readline().strip() == "timeout"
    finally:
        waiter.wait(timeout=30)


def test_xid_on_missing_gpu_is_refused(node):
    n = node()
    run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], n.env)
    out = subprocess.run([sys.executable, "-m", "memslice", "sim", "xid", "--gpu", "5", "--xid", "79", "--state",
                          n.state], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "no such GPU" in out.stderr


def test_getprocaddress_rules_without_the_shim(libs, node, monkeypatch):
    n = node()
    for k, v in n.env.items():
        monkeypatch.setenv(k, v)
    look, addr = proc_lookup(ctypes.CDLL(libs.sim_cuda))

    assert look(b"cuMemAlloc", 3020) == (0, addr("cuMemAlloc_v2"), 0)
    assert look(b"cuMemAlloc", 2000) == (0, addr("cuMemAlloc"), 0)
    assert look(b"cuCtxCreate", 12050) == (0, addr("cuCtxCreate_v4"), 0)
    assert look(b"cuCtxCreate", 12000) == (0, addr("cuCtxCreate_v3"), 0)
    assert look(b"cuMemAllocAsync", 11020, 2) == (0, addr("cuMemAllocAsync_ptsz"), 0)
    assert look(b"cuMemAlloc", 3020, 2) == (0, addr("cuMemAlloc_v2"), 0)  # no PTDS variant: legacy one
    assert look(b"cuMemAllocAsync", 11000) == (0, None, 2)
    assert look(b"cuNoSuch", 12000) == (0, None, 1)
    assert look(b"cuMemAlloc", 99999)[0] == 1

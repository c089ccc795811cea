"""A container on several GPUs (`memslice run --gpus`): real clients (cuda.core, cuda-bindings) on two simulated
GPUs under the shim. The quota holds on each GPU apart; peer access, peer copies, P2P mappings of VMM memory and
IPC between the container's processes on different GPUs work, keep the data, and are charged where the driver
really allocates (docs/architecture.md, "Several GPUs")."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from clients import memslice_env

from memslice.interposer.region import read_region_file

pytest.importorskip("cuda.core", reason="cuda-core is in the test extra: pip install -e '.[test]'")

QUOTA_MIB = 1024
CTX_MIB = 64
NODE = "4GiB,4GiB,4GiB;nvlink=0-2"

PRELUDE = """
import json, os, sys
import numpy as np
from cuda.bindings import driver as cu
def ok(r):
    if isinstance(r, tuple):
        err, *rest = r
    else:
        err, rest = r, []
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest
MiB = 1 << 20
ok(cu.cuInit(0))
ctx = [ok(cu.cuDevicePrimaryCtxRetain(d)) for d in range(ok(cu.cuDeviceGetCount()))]
def on(d):
    ok(cu.cuCtxSetCurrent(ctx[d]))
def free(d):
    on(d)
    return ok(cu.cuMemGetInfo())[0] // MiB
def put(ptr, data):
    ok(cu.cuMemcpyHtoD(ptr, data.ctypes.data, data.nbytes))
def get(ptr, n):
    out = np.zeros(n, dtype=np.uint8)
    ok(cu.cuMemcpyDtoH(out.ctypes.data, ptr, n))
    return out
pattern = np.frombuffer(np.random.default_rng(7).bytes(8 * MiB), dtype=np.uint8)
"""

QUOTA_EACH = """
import json, sys
import pynvml
from cuda.core import Device
pynvml.nvmlInit()
devs = [Device(i) for i in range(2)]
out = {"uuids": ["GPU-" + str(d.uuid) for d in devs],
       "nvml": [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]}
held = []
for d in devs:
    d.set_current()
    n = 0
    try:
        while True:
            held.append(d.memory_resource.allocate(64 << 20, stream=d.default_stream))
            n += 1
    except Exception as ex:
        out[f"oom{d.device_id}"] = "CUDA_ERROR_OUT_OF_MEMORY" in str(ex)
    out[f"chunks{d.device_id}"] = n
print(json.dumps(out), flush=True)
sys.stdin.read()
"""

PEER = PRELUDE + """
on(0); a = ok(cu.cuMemAlloc(8 * MiB))
on(1); b = ok(cu.cuMemAlloc(8 * MiB)); c = ok(cu.cuMemAlloc(8 * MiB))
before = [free(0), free(1)]
on(0); enable01 = int(cu.cuCtxEnablePeerAccess(ctx[1], 0)[0])
on(1); enable10 = int(cu.cuCtxEnablePeerAccess(ctx[0], 0)[0])
after_enable = [free(0), free(1)]
on(0); put(a, pattern)
ok(cu.cuMemcpyPeer(b, ctx[1], a, ctx[0], 8 * MiB))
stream = ok(cu.cuStreamCreate(0))
ok(cu.cuMemcpyPeerAsync(c, ctx[1], b, ctx[1], 8 * MiB, stream))
ok(cu.cuStreamSynchronize(stream))
on(1)
same_b = bool((get(b, 8 * MiB) == pattern).all())
same_c = bool((get(c, 8 * MiB) == pattern).all())
on(0)
disable = int(cu.cuCtxDisablePeerAccess(ctx[1])[0])
disable_again = int(cu.cuCtxDisablePeerAccess(ctx[1])[0])
print(json.dumps({"before": before, "after_enable": after_enable, "after_copy": [free(0), free(1)],
                  "enable": [enable01, enable10], "same": [same_b, same_c], "disable": [disable, disable_again]}))
"""

VMM_P2P = PRELUDE + """
T = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
DEV = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop = cu.CUmemAllocationProp()
prop.type = T
prop.location.type = DEV
prop.location.id = 0
size = 64 * MiB
before = [free(0), free(1)]
on(1)  # created for GPU 0, mapped from a context of GPU 1
h = ok(cu.cuMemCreate(size, prop, 0))
va = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
ok(cu.cuMemMap(va, size, 0, h, 0))
descs = []
for d in (0, 1):
    x = cu.CUmemAccessDesc()
    x.location.type = DEV
    x.location.id = d
    x.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    descs.append(x)
ok(cu.cuMemSetAccess(va, size, descs, 2))
mapped = [free(0), free(1)]
descs[1].location.id = 2  # the node's third GPU is not visible here
unseen = int(cu.cuMemSetAccess(va, size, descs, 2)[0])
on(0); put(va, pattern)
on(1); same = bool((get(va, 8 * MiB) == pattern).all())
ok(cu.cuMemUnmap(va, size)); ok(cu.cuMemRelease(h)); ok(cu.cuMemAddressFree(va, size))
print(json.dumps({"before": before, "mapped": mapped, "released": [free(0), free(1)], "same": same,
                  "unseen": unseen}))
"""

# Process A (GPU 0) exports 64 MiB of cuMemAlloc memory (legacy IPC) and a 64 MiB VMM allocation (a POSIX file
# descriptor over a Unix socket, as NCCL passes them); process B, current on GPU 1, imports both.
EXPORTER = PRELUDE + """
import socket
on(0)
size = 64 * MiB
a = ok(cu.cuMemAlloc(size)); put(a, pattern)
import ctypes
ipc = ctypes.string_at(ok(cu.cuIpcGetMemHandle(a)).getPtr(), 64)  # the 64 bytes of CUipcMemHandle
prop = cu.CUmemAllocationProp()
prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
h = ok(cu.cuMemCreate(size, prop, 0))
fd = ok(cu.cuMemExportToShareableHandle(h, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(1); srv.settimeout(60)
print(json.dumps({"ipc": ipc.hex(), "free": [free(0), free(1)]}), flush=True)
conn, _ = srv.accept()
socket.send_fds(conn, [b"x"], [fd])
conn.recv(1)  # the importer is done
"""

IMPORTER = PRELUDE + """
import socket
size = 64 * MiB
before = [free(0), free(1)]
on(1)
import ctypes
hd = cu.CUipcMemHandle()
ctypes.memmove(hd.getPtr(), bytes.fromhex(sys.argv[2]), 64)
flag = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
p = ok(cu.cuIpcOpenMemHandle(hd, flag))
same_ipc = bool((get(p, 8 * MiB) == pattern).all())
after_ipc = [free(0), free(1)]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(60)
sock.connect(sys.argv[1])
_, [fd], _, _ = socket.recv_fds(sock, 1, 1)
h = ok(cu.cuMemImportFromShareableHandle(fd, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
va = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
ok(cu.cuMemMap(va, size, 0, h, 0))
x = cu.CUmemAccessDesc()
x.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
x.location.id = 1
x.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
ok(cu.cuMemSetAccess(va, size, [x], 1))
put(va, pattern)
same_vmm = bool((get(va, 8 * MiB) == pattern).all())
mapped = [free(0), free(1)]
ok(cu.cuMemUnmap(va, size)); ok(cu.cuMemRelease(h)); ok(cu.cuMemAddressFree(va, size))
ok(cu.cuIpcCloseMemHandle(p))
print(json.dumps({"before": before, "after_ipc": after_ipc, "mapped": mapped, "released": [free(0), free(1)],
                  "same": [same_ipc, same_vmm]}))
sock.send(b"x")
"""


def env_for(tmp: pathlib.Path) -> dict[str, str]:
    env = memslice_env(tmp)
    env["MEMSLICE_SIM_CONTEXT_OVERHEAD"] = f"{CTX_MIB}MiB"
    return env


def run_cmd(region: pathlib.Path, gpus: str, *cmd: str) -> list[str]:
    return [sys.executable, "-m", "memslice.cli", "run", "--gpus", gpus, "--gpu-mem", f"{QUOTA_MIB}MiB",
            "--simulate-gpu", NODE, "--region-dir", str(region), "--", *cmd]


def run_script(tmp: pathlib.Path, script: str, *args: str, gpus: str = "0,2") -> dict:
    out = subprocess.run(run_cmd(tmp / "region", gpus, sys.executable, "-c", script, *args), env=env_for(tmp),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_device(region: pathlib.Path) -> dict[str, int]:
    """MiB charged per GPU UUID in the container's region (live processes)."""
    snap = read_region_file(str(region / "memslice.region"))
    assert snap is not None
    return {d.uuid: d.used_bytes >> 20 for d in snap.devices}


def test_quota_holds_on_each_gpu_apart_cuda_core(tmp_path):
    region = tmp_path / "region"
    proc = subprocess.Popen(run_cmd(region, "0,2", sys.executable, "-c", QUOTA_EACH), env=env_for(tmp_path),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        got = json.loads(line)
        # the program's GPUs 0 and 1 are the node's GPUs 0 and 2, in that order
        assert got["uuids"] == [got["nvml"][0], got["nvml"][2]]
        assert got["oom0"] and got["oom1"]
        # GPU 0 filled to its quota; GPU 1 still gets all of its own
        for i in (0, 1):
            assert (QUOTA_MIB - CTX_MIB) // 64 - 1 <= got[f"chunks{i}"] <= QUOTA_MIB // 64
        used = per_device(region)
        assert sorted(used) == sorted([got["nvml"][0], got["nvml"][2]])
        assert all(QUOTA_MIB - 128 <= mib <= QUOTA_MIB for mib in used.values())
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=60)


def test_peer_access_and_peer_copies_keep_data_and_cost_nothing(tmp_path):
    got = run_script(tmp_path, PEER)
    assert got["enable"] == [0, 0]  # GPUs 0 and 2 of the node are NVLinked
    assert got["after_enable"] == got["before"] == got["after_copy"]  # no device memory for peer access
    assert got["same"] == [True, True]
    assert got["disable"] == [0, 705]  # CUDA_ERROR_PEER_ACCESS_NOT_ENABLED the second time


def test_peer_access_refused_where_the_topology_has_no_path(tmp_path):
    env = env_for(tmp_path)
    script = PRELUDE + "on(0); print(json.dumps({'rc': int(cu.cuCtxEnablePeerAccess(ctx[1], 0)[0]), " \
                       "'can': ok(cu.cuDeviceCanAccessPeer(0, 1))}))"
    cmd = [sys.executable, "-m", "memslice.cli", "run", "--gpus", "2", "--gpu-mem", "1GiB", "--simulate-gpu",
           "4GiB:0,4GiB:1", "--region-dir", str(tmp_path / "region"), "--", sys.executable, "-c", script]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {"rc": 217, "can": 0}  # CUDA_ERROR_PEER_ACCESS_UNSUPPORTED across NUMA nodes


def test_vmm_memory_mapped_for_a_peer_is_charged_once_on_its_gpu(tmp_path):
    got = run_script(tmp_path, VMM_P2P)
    assert got["same"]
    assert got["mapped"] == [got["before"][0] - 64, got["before"][1]]  # GPU 0 only, though mapped from GPU 1
    assert got["released"] == got["before"]
    assert got["unseen"] == 101  # CUDA_ERROR_INVALID_DEVICE: access for a GPU the process does not see


def test_ipc_between_processes_on_different_gpus(tmp_path):
    sock = str(tmp_path / "fd.sock")
    region = tmp_path / "region"
    env = env_for(tmp_path)
    exporter = subprocess.Popen(run_cmd(region, "0,2", sys.executable, "-c", EXPORTER, sock), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert exporter.stdout
        line = exporter.stdout.readline()
        assert line, exporter.stderr.read() if exporter.stderr else ""
        shared = json.loads(line)
        got = run_script(tmp_path, IMPORTER, sock, shared["ipc"])
        assert got["same"] == [True, True]
        # the legacy IPC import maps the exporter's memory: nothing more is charged, on either GPU
        assert got["after_ipc"] == got["before"]
        # the imported VMM handle keeps GPU 0's memory alive: charged on GPU 0 (not on GPU 1, where it is used)
        assert got["mapped"] == [got["before"][0] - 64, got["before"][1]]
        assert got["released"] == got["before"]
        assert exporter.wait(timeout=60) == 0, exporter.stderr.read() if exporter.stderr else ""
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait(timeout=60)

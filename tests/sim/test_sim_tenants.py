"""Issue 11 item 13: on the simulated overlay, a tenant cannot break another tenant's simulated GPU.

Two containers are started from the node agent's real Allocate response (container paths translated to host
paths, as tests/agent/test_plugin_quota.py does). Tenant A then does its worst to every file the response lets it
write — truncates it, fills it with garbage, replaces it with a FIFO or a symlink, holds its locks — while
tenant B's process keeps allocating, querying memory and listing processes, and B starts new processes:
B never crashes, hangs or fails, and B still sees A's memory use while A's files are sane (one physical GPU)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run

from memslice.plugin.deviceplugin.allocator import Target
from memslice.plugin.deviceplugin.server import container_response
from memslice.plugin.gpu.nvml import GpuInfo
from memslice.plugin.regions import install_sim_driver
from memslice.plugin.response import ResponseConfig

HOLDER = r"""
import ctypes, json, sys
import pynvml
cuda = ctypes.CDLL("libcuda.so.1")
P, S = ctypes.c_ulonglong, ctypes.c_size_t
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(P), S]
cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(S), ctypes.POINTER(S)]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
held = []
def step(mib):
    p = P()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), mib << 20)
    held.append(p)
    f, t = S(), S()
    info = cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
    procs = len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    print(json.dumps({"rc": rc, "info": info, "total": t.value >> 20, "procs": procs}), flush=True)
step(int(sys.argv[1]))
for line in sys.stdin:
    step(int(line))
"""

PHYSICAL = """
import pynvml as n
n.nvmlInit()
# v2's used: allocations only (v1's adds the memory the driver reserves, as a real driver's does)
print(n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0), version=n.nvmlMemory_v2).used >> 20)
"""


def to_host(value: str, host: dict[str, str]) -> str:
    for cpath in sorted(host, key=len, reverse=True):
        if value == cpath or value.startswith(cpath + "/"):
            return host[cpath] + value[len(cpath):]
    return value


class Tenant:
    def __init__(self, env: dict[str, str], writable: list[Path], region: Path) -> None:
        self.env, self.writable, self.region = env, writable, region
        self.proc: subprocess.Popen[str] | None = None

    def start(self, mib: int) -> dict:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(mib)], env=self.env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return self.read()

    def read(self, timeout: float = 30) -> dict:
        assert self.proc and self.proc.stdout
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "no answer in 30 s: the tenant's process hangs"
        line = self.proc.stdout.readline()
        assert line, f"the tenant's process died (rc={self.proc.wait()}): {self.proc.stderr.read()[-2000:]}"
        return json.loads(line)

    def step(self, mib: int) -> dict:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(f"{mib}\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.proc:
            self.proc.stdin.close()
            self.proc.kill()
            self.proc.wait(timeout=30)

    def writable_files(self) -> list[Path]:
        """Every file the container can write: rw file mounts, and the files in rw directory mounts."""
        out = []
        for p in self.writable:
            out += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        return out


@pytest.fixture
def cluster(tmp_path, libs):
    state = tmp_path / "sim" / "node.state"
    state.parent.mkdir()
    regions = tmp_path / "regions"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    agent_env = dict(base, MEMSLICE_SIM_STATE=str(state), MEMSLICE_SIM_GPUS="4GiB", LD_LIBRARY_PATH=libs.sim_dir,
                     MEMSLICE_SIM_PEERS=str(regions), MEMSLICE_SIM_USAGE=str(tmp_path / "agent.usage"))
    out = run([sys.executable, "-c", PHYSICAL], agent_env)  # the agent's NVML creates the node
    assert out.returncode == 0, out.stderr
    cfg = ResponseConfig(shim_host_dir=Path(libs.shim).parent, preload="env",
                         sim_lib_dir=install_sim_driver(Path(libs.sim_dir), state), sim_state=state)
    gpu = GpuInfo(index=0, uuid="GPU-x", model="sim", mem_mib=4096, numa=None, mig=False)
    tenants = {}
    for name in ("a", "b"):
        region = regions / name
        region.mkdir(parents=True)
        resp = container_response(Target(gpu=gpu, device_ids=("g0-0",), mib=1024), region, cfg)
        host = {m.container_path: m.host_path for m in resp.mounts}
        env = dict(base, MEMSLICE_SIM_CONTEXT_OVERHEAD="0")
        env.update({k: to_host(v, host) for k, v in resp.envs.items() if k != "NVIDIA_VISIBLE_DEVICES"})
        writable = [Path(m.host_path) for m in resp.mounts if not m.read_only]
        tenants[name] = Tenant(env, writable, region)
    yield tenants, agent_env
    for t in tenants.values():
        t.stop()


def physical_mib(env: dict[str, str]) -> int:
    probe = {k: v for k, v in env.items() if k != "LD_PRELOAD"}  # the driver's view, not the quota's
    out = run([sys.executable, "-c", PHYSICAL], probe)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_a_tenant_cannot_break_another_tenants_simulated_gpu(cluster, tmp_path):
    tenants, agent_env = cluster
    a, b = tenants["a"], tenants["b"]
    assert b.start(300) == {"rc": 0, "info": 0, "total": 1024, "procs": 1}
    assert a.start(200)["rc"] == 0
    assert physical_mib(b.env) == 500  # B sees A's use: one physical GPU
    assert physical_mib(agent_env) == 500
    files = a.writable_files()
    assert files, "the response gives the tenant nothing writable?"
    attacks = {
        "truncate": lambda f: os.truncate(f, 0),
        "garbage": lambda f: f.write_bytes(os.urandom(1 << 16) + b"\xff" * (1 << 20)),
        "fifo": lambda f: (f.unlink(), os.mkfifo(f)),
        "symlink": lambda f: (f.unlink(), f.symlink_to(b.region / "sim.usage")),
    }
    for what, attack in attacks.items():
        for f in files:
            if f.exists() or f.is_symlink():
                if f.is_symlink() or not f.is_file():
                    f.unlink()
                    f.touch()
                attack(f)
        got = b.step(16)
        assert got["rc"] == 0 and got["info"] == 0 and got["total"] == 1024, (what, got)
        fresh = run([sys.executable, "-m", "memslice.tenant", "16"], b.env)  # a new process of B starts
        assert fresh.returncode == 0 and '"result": 0' in fresh.stdout, (what, fresh.stdout, fresh.stderr)
        assert physical_mib(b.env) >= 300, what


def test_a_tenant_holding_the_node_lock_forever_does_not_stop_another_allocating(cluster):
    """The simulator's wait for the node lock is bounded: B's allocations go on (each answers, where an
    unbounded wait would hang until the tenant's 30 s read deadline). How long each waits is a figure, not
    asserted here (no wall-clock limit in a test)."""
    import fcntl

    tenants, _ = cluster
    b = tenants["b"]
    assert b.start(100)["rc"] == 0
    lock = Path(b.env["MEMSLICE_SIM_LOCK"])
    with open(lock, "r+b") as f:  # tenant A takes the node lock and never lets go
        fcntl.lockf(f, fcntl.LOCK_EX)
        for _ in range(3):
            assert b.step(16)["rc"] == 0  # each waits at most the bounded lock wait


def test_a_damaged_node_description_is_refused_clearly_and_running_processes_go_on(cluster):
    tenants, _ = cluster
    b = tenants["b"]
    assert b.start(100)["rc"] == 0
    state = Path(b.env["MEMSLICE_SIM_STATE"])
    state.write_bytes(os.urandom(4096))  # only the agent can write it; the simulator still reads defensively
    assert b.step(16)["rc"] == 0  # a running process works from its validated private copy
    fresh = run([sys.executable, "-m", "memslice.tenant", "16"], b.env)
    assert fresh.returncode != 0
    assert f"memslice-sim: {state} is not a valid simulator node file" in fresh.stderr
    os.truncate(state, 10)
    assert b.step(16)["rc"] == 0

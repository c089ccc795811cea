"""The node agent fills the host PIDs a container cannot learn, so NVML process lists work in containers with
their own /proc (docs/architecture.md, "NVML process lists").

A tenant started with `unshare --pid --fork --mount-proc` has its own PID namespace *and* its own /proc, as a
container does: NSpid shows one level, so the shim records host_pid 0 and the tenant's NVML process list is
empty. The agent (here in the host PID namespace, as the DaemonSet runs with hostPID) asks the kernel who
holds each live slot's lock byte (F_GETLK answers in the asker's namespace) and writes that PID into the
slot at its next /metrics scrape: the tenant then sees its own process, under the PID it knows.

Real pieces only: `memslice node-agent --simulate` as a process, the kubelet stand-in's Allocate over gRPC,
the shim preloaded into the tenant on the simulated driver, pynvml (the real NVML client), /metrics over HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_standin import KubeletStandin
from test_plugin_agent import RESOURCE, AgentProcess
from test_plugin_agent import short_tmp as short_tmp  # noqa: F401 (fixture)

from memslice.interposer.region import layout, read_region
from memslice.proto import api_pb2

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare(1) to create PID namespaces")

REGION_MOUNT = "/run/memslice/region"

# PID 1 of the tenant's namespace: starts a process holding memory through the shim, then answers, each time
# it is asked, what NVML's process list shows it.
OBSERVER = r"""
import json, subprocess, sys
holder = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "200"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
assert '"result": 0' in holder.stdout.readline()
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
print(json.dumps({"holder": holder.pid}), flush=True)
while sys.stdin.readline().strip() == "look":
    print(json.dumps(sorted((p.pid, p.usedGpuMemory >> 20) for p in n.nvmlDeviceGetComputeRunningProcesses(h))),
          flush=True)
holder.stdin.close()
holder.wait()
"""


def to_host(value: str, host: dict[str, str]) -> str:
    """A container path (a mount, or a path under one) as the host sees it."""
    for c, h in host.items():
        if value == c or value.startswith(c + "/"):
            return h + value[len(c):]
    return value


def container_env(resp: api_pb2.ContainerAllocateResponse) -> tuple[dict[str, str], Path]:
    """The container's environment with each mount's container path replaced by its host path (the stand-in
    for a mount namespace, as in test_plugin_quota), and its region directory on the host."""
    host = {m.container_path: m.host_path for m in resp.mounts}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    env.update({k: to_host(v, host) for k, v in resp.envs.items()})
    env["MEMSLICE_CONTEXT_RESERVE"] = "0"
    return env, Path(host[REGION_MOUNT])


@pytest.fixture
def tenant(short_tmp: Path) -> Iterator[tuple[AgentProcess, subprocess.Popen[str], Path]]:  # noqa: F811
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    agent = AgentProcess(short_tmp, sim_gpus="16GiB", unit_mib=4, args=("--preload", "env")).start()
    proc: subprocess.Popen[str] | None = None
    try:
        kubelet.wait_registered(RESOURCE)
        env, region = container_env(kubelet.admit("uid-a", "ns", "a", [("c", 256)], RESOURCE)["c"])
        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", OBSERVER],
                                env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        yield agent, proc, region
    finally:
        if proc is not None:
            try:
                proc.communicate("stop\n", timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        agent.stop()
        kubelet.stop()


def look(proc: subprocess.Popen[str]) -> list[list[int]]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("look\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, "the tenant exited"
    return json.loads(line)


def host_pids(region: Path) -> list[int]:
    """The host_pid field of each live slot of the region, as the file holds it."""
    lo = layout()
    snap = read_region(region)
    assert snap is not None
    raw = (region / "memslice.region").read_bytes()
    at = lo.ffi.offsetof("struct ms_slot", "host_pid")
    out = []
    for i, p in enumerate(snap.processes):
        if p.alive:
            off = lo.slots_offset + i * lo.slot_size + at
            out.append(int.from_bytes(raw[off:off + 4], "little", signed=True))
    return out


def test_a_tenant_with_its_own_proc_sees_its_process_once_the_agent_filled_its_host_pid(tenant):
    agent, proc, region = tenant
    assert proc.stdout is not None
    holder = json.loads(proc.stdout.readline())["holder"]
    assert holder == 2  # its own namespace: PID 1 is the observer
    assert host_pids(region) == [0]  # its own /proc: the shim cannot know the host PID
    assert look(proc) == []  # so its NVML list is empty (what nvidia-smi shows in such a container today)

    agent.metrics()  # a scrape: the agent asks who holds each live slot and writes the PID it is told
    filled = host_pids(region)  # the holder's slot, and the observer's (its NVML use joined the region)
    assert filled and 0 not in filled
    inner = {}
    for pid in filled:
        nspid = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("NSpid:"))
        outer, in_ns = (int(x) for x in nspid.split()[1:])
        assert outer == pid  # what the agent wrote is the host PID of the slot's owner
        inner[in_ns] = pid
    assert holder in inner and 1 in inner  # of the tenant's own processes: the holder and the observer
    (seen,) = look(proc)  # the tenant now sees its own process, under its own PID (with its context's memory)
    assert seen[0] == holder and seen[1] >= 200
    # and the agent wrote 4 bytes, nothing else: the region still reads as valid, usage unchanged
    used = agent.sample("memslice_container_used_mib")  # the only container (its pod name may be learnt later)
    assert len(used) == 1 and used[0] >= 200, (used, agent.log()[-2000:])
    assert agent.sample("memslice_container_region_error") == [0.0]


def test_host_pids_overlay_adds_host_pid_to_the_agent_only():
    """hostPID is opt-in (deploy/overlays/host-pids): the base keeps the agent out of the host PID namespace,
    the overlay changes exactly that one field of the agent's DaemonSet."""
    from test_deploy_render import render

    base, overlay = render("base"), render("overlays/host-pids")
    assert len(base) == len(overlay)
    for b, o in zip(base, overlay, strict=True):
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "memslice-node-agent":
            assert "hostPID" not in b["spec"]["template"]["spec"]
            assert o["spec"]["template"]["spec"].pop("hostPID") is True
        assert o == b

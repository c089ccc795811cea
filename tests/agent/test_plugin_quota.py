"""A container started from the Allocate response, on the simulated GPU, is held to its quota, and the
agent reports its usage from the region.

The container runtime is stood in for by path translation: each mount's container path in the env is
replaced by its host path (no mount namespace is needed), the env is otherwise exactly the response's, and
the process loads the simulated libcuda.so.1 the way a container would load the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sim_truth import gpu_truth
from test_plugin_agent import RESOURCE
from test_plugin_agent import node as node  # fixtures, shared
from test_plugin_agent import short_tmp as short_tmp


def to_host(value: str, host: dict[str, str]) -> str:
    """A container path in an env value, as the host path its mount gives it (longest mount prefix)."""
    for cpath in sorted(host, key=len, reverse=True):
        if value == cpath or value.startswith(cpath + "/"):
            return host[cpath] + value[len(cpath):]
    return value


def test_container_started_from_the_allocate_response_is_held_to_its_quota(node):
    kubelet, make = node
    agent = make(sim_gpus="16GiB", unit_mib=4, args=("--preload", "env"))
    kubelet.wait_registered(RESOURCE)
    resp = kubelet.admit("uid-1", "ns", "train", [("main", 256)], RESOURCE)["main"]  # 1024 MiB
    host = {m.container_path: m.host_path for m in resp.mounts}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    env.update({k: to_host(v, host) for k, v in resp.envs.items()})
    assert env["LD_PRELOAD"] == str(agent.shim_dir / "libmemslice.so")
    assert env["MEMSLICE_GPU_MEM_LIMIT"] == "1024"
    # the simulated driver and the node's state come from the response too: read-only libraries, shared state
    assert host["/usr/local/memslice/sim/node.state"] == str(agent.sim_state)
    assert {m.container_path: m.read_only for m in resp.mounts}["/usr/local/memslice/sim/lib"] is True
    assert env["LD_LIBRARY_PATH"] == str(agent.sim_state.parent / "simlib")
    # the node's description is read-only to containers; a container writes only its own usage (region dir)
    assert {m.container_path: m.read_only for m in resp.mounts}["/usr/local/memslice/sim/node.state"] is True
    assert os.stat(agent.sim_state).st_mode & 0o777 == 0o644
    assert env["MEMSLICE_SIM_USAGE"].startswith(host["/run/memslice/region"])
    # the context (520 MiB on the simulated GPU, as on an H100, measured by the shim) + 400 MiB fit in
    # 1024 MiB; 600 MiB more do not
    tenant = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "400", "600"], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        events = []
        assert tenant.stdout is not None
        while not events or events[-1]["event"] not in ("ready", "init", "context"):
            line = tenant.stdout.readline()
            assert line, f"tenant ended early: {tenant.stderr.read() if tenant.stderr else ''}"
            events.append(json.loads(line))
        allocs = [(e["mib"], e["result"]) for e in events if e["event"] == "alloc"]
        assert allocs == [(400, 0), (600, 2)]  # 2 = CUDA_ERROR_OUT_OF_MEMORY
        assert events[-1]["total_mib"] == 1024
        # the agent reads the container's region: quota, usage and the refusal
        labels = {"pod": "train", "container": "main"}
        # the metrics name the pod once the agent has learnt the region's owner from the PodResources API;
        # the usage is read from the region at scrape time (the shim counts a refusal before it returns it)
        agent.wait_log("is ns/train/main's", "the region's owner learnt")
        assert agent.sample("memslice_container_refused_allocations_total", **labels) == [1.0]
        assert agent.sample("memslice_container_quota_mib", **labels) == [1024.0]
        (used,) = agent.sample("memslice_container_used_mib", **labels)
        assert used == 520 + 400
        assert agent.sample("memslice_container_context_cost_mib", **labels) == [520.0]
        assert agent.sample("memslice_gpu_used_mib", gpu="0")[0] >= 920
        # the simulated GPU's own figure, past the shim: what the process really holds is what it is charged
        assert gpu_truth(env).processes[tenant.pid] == (520 + 400) << 20
    finally:
        tenant.communicate(timeout=30)

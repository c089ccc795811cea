"""A container's NVML process lists show only its own processes, under its own PIDs. Two tenants of one
simulated node run in separate PID namespaces (`unshare --pid --fork`, as containers do), each with its own
region: the driver (simulated NVML, like the real one) reports host PIDs of both; through the shim each
tenant sees exactly its own process, translated to the PID it has in its namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import run

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare(1) to create PID namespaces")

# Runs as PID 1 of a new namespace: starts a tenant holding memory, then answers what NVML shows it.
OBSERVER = r"""
import json, os, subprocess, sys
holder = subprocess.Popen([sys.executable, "-m", "memslice.tenant", sys.argv[1]], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
assert '"result": 0' in holder.stdout.readline()
print(json.dumps({"ready": holder.pid}), flush=True)
sys.stdin.readline()
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
view = {
    "compute": sorted((p.pid, p.usedGpuMemory >> 20) for p in n.nvmlDeviceGetComputeRunningProcesses(h)),
    "graphics": len(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
    "mps": len(n.nvmlDeviceGetMPSComputeRunningProcesses(h)),
}
print(json.dumps(view), flush=True)
sys.stdin.readline()
holder.stdin.close()
holder.wait()
"""

RAW = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
print(json.dumps(sorted((p.pid, p.usedGpuMemory >> 20) for p in n.nvmlDeviceGetComputeRunningProcesses(h))))
"""


def ns_pids(host_pid: int) -> list[int]:
    for line in open(f"/proc/{host_pid}/status"):
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("no NSpid")


def test_each_container_sees_only_its_processes(node, tmp_path):
    n = node(gpus="16GiB", context_overhead="64MiB")
    tenants = {}
    try:
        for name, mib in (("a", 100), ("b", 200)):
            env = n.container(tmp_path / f"region-{name}", "1GiB")
            p = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", OBSERVER,
                                  str(mib)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            assert line, p.stderr.read()
            tenants[name] = (p, json.loads(line)["ready"], mib)
        # the driver's own view (no shim): both holders, by host PID
        raw = json.loads(run([sys.executable, "-c", RAW], n.env).stdout)
        assert [m for _, m in raw] == [100 + 64, 200 + 64]
        host_of = {}
        for pid, mib in raw:
            inner = ns_pids(pid)
            assert len(inner) == 2 and inner[0] == pid  # a host PID, also known inside as inner[1]
            host_of[mib - 64] = (pid, inner[1])
        for name, (p, inner_pid, mib) in tenants.items():
            p.stdin.write("\n")
            p.stdin.flush()
            view = json.loads(p.stdout.readline())
            assert view == {"compute": [[inner_pid, mib + 64]], "graphics": 0, "mps": 0}, (name, view)
            assert host_of[mib][1] == inner_pid and host_of[mib][0] != inner_pid
    finally:
        for p, _, _ in tenants.values():
            p.stdin.close()
            p.wait(timeout=30)

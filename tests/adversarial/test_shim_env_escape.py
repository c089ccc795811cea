"""Quota-escape attempts through the environment (issue 11, item 6).

The limits the shim enforces come from a read-only file written before the container starts: the node
agent's Allocate mounts `<region-id>.limits` at /run/memslice/limits, `memslice run` writes
REGION_DIR/memslice.limits. A process that unsets or raises MEMSLICE_GPU_MEM_LIMIT, turns on
oversubscription, zeroes its context reserve or points MEMSLICE_REGION_DIR elsewhere is still held to the
container's quota, and the ledger keeps showing that quota. Before, `env -u MEMSLICE_GPU_MEM_LIMIT` ran
unlimited."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import kv, run

from memslice.interposer.region import read_region

MiB = 1 << 20
ESCAPES = {
    "unset": ["env", "-u", "MEMSLICE_GPU_MEM_LIMIT"],
    "raised": ["env", "MEMSLICE_GPU_MEM_LIMIT=64GiB"],
    "oversubscribe": ["env", "MEMSLICE_OVERSUBSCRIBE=1", "MEMSLICE_HOST_SPILL_LIMIT=64GiB"],
    "no-reserve": ["env", "MEMSLICE_CONTEXT_RESERVE=0", "MEMSLICE_GPU_MEM_LIMIT=64GiB"],
}
# In a Kubernetes container the region directory comes from the limits file too; under `memslice run` (one
# user, who owns the file anyway) the file is found through MEMSLICE_REGION_DIR, so this one is not covered
# there (README, "Security model").
AGENT_ESCAPES = {**ESCAPES, "other-region": ["env", "MEMSLICE_REGION_DIR=/tmp", "MEMSLICE_GPU_MEM_LIMIT=64GiB"]}


def held_to_one_gib(out: subprocess.CompletedProcess[str], fits: int) -> None:
    """alloc_direct 2000 <fits> under a 1 GiB quota: the first is refused, the second fits."""
    assert "alloc 2000 MiB -> 2" in out.stdout, out.stdout + out.stderr
    assert f"alloc {fits} MiB -> 0" in out.stdout, out.stdout + out.stderr
    assert "total=1024" in out.stdout  # and the process is told the quota, not 64 GiB


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_memslice_run_limits_ignore_the_environment(escape, cbin, tmp_path):
    region = tmp_path / "r"
    env = {"PATH": os.environ["PATH"], "MEMSLICE_SIM_STATE": str(tmp_path / "n.state"),
           "MEMSLICE_SIM_CONTEXT_OVERHEAD": "64MiB", "MEMSLICE_CONTEXT_RESERVE": "64MiB"}
    cmd = [sys.executable, "-m", "memslice", "run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB", "--region-dir",
           str(region), "--", *ESCAPES[escape], cbin["alloc_direct"], "2000", "900"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    held_to_one_gib(out, 900)
    limits = region / "memslice.limits"
    assert limits.stat().st_mode & 0o777 == 0o444
    assert "gpu_mem_limit=1024MiB" in limits.read_text() and "context_reserve=64MiB" in limits.read_text()
    dev = read_region(region).devices[0]
    assert dev.limit_bytes == 1 << 30  # the ledger shows the container's quota, whatever the process said
    # the context was charged too (measured: 64 MiB): the file's context_reserve, not the environment's 0 (which
    # would turn charging contexts off), is what the shim follows
    assert dev.peak_bytes == (900 + 64) * MiB
    if "MEMSLICE_GPU_MEM_LIMIT=64GiB" in ESCAPES[escape]:
        assert "MEMSLICE_GPU_MEM_LIMIT='64GiB' ignored: the quota comes from gpu_mem_limit=1.0 GiB in" in out.stderr


def can_unshare() -> bool:
    unshare = shutil.which("unshare")
    return bool(unshare) and subprocess.run([unshare, "-Urm", "true"], capture_output=True).returncode == 0


# Inside a user + mount namespace, mount what the Allocate answer says at the container paths the shim
# reads (the limits file read-only, the simulated driver its nvml_path/cuda_path name), then run the tenant's
# command.
MOUNT_SCRIPT = """set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/memslice/region
touch /run/memslice/limits
mount --bind "$MS_REGION" /run/memslice/region
mount --bind "$MS_LIMITS" /run/memslice/limits
mount -o remount,bind,ro /run/memslice/limits
mount -t tmpfs tmpfs /usr/local
mkdir -p /usr/local/memslice/sim/lib
mount --bind "$MS_SIMLIB" /usr/local/memslice/sim/lib
exec "$@"
"""


@pytest.mark.skipif(not can_unshare(), reason="needs unprivileged user and mount namespaces (unshare -Urm)")
@pytest.mark.parametrize("escape", sorted(AGENT_ESCAPES))
def test_node_agent_limits_file_holds_every_process(escape, cbin, short_tmp):
    """The real agent answers Allocate over gRPC; the container's process sees its mounts (limits file
    read-only at /run/memslice/limits) and its env, and still cannot leave its quota by changing the env."""
    from kubelet_standin import KubeletStandin
    from test_plugin_agent import RESOURCE, AgentProcess

    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    agent = AgentProcess(short_tmp, sim_gpus="16GiB", unit_mib=4, env={"MEMSLICE_SIM_CONTEXT_OVERHEAD": "0"}).start()
    try:
        kubelet.wait_registered(RESOURCE)
        resp = kubelet.admit("uid-1", "ns", "pod-1", [("main", 256)], RESOURCE)["main"]  # 256 x 4 MiB
    finally:
        agent.stop()
        kubelet.stop()
    mounts = {m.container_path: m for m in resp.mounts}
    limits, region = mounts["/run/memslice/limits"], mounts["/run/memslice/region"]
    assert limits.read_only and not region.read_only
    assert Path(limits.host_path).parent == Path(region.host_path).parent  # beside it, not inside it
    assert "gpu_mem_limit=1024MiB" in Path(limits.host_path).read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    host = {k: m.host_path for k, m in mounts.items() if not k.startswith("/run/memslice")}
    env.update({k: host.get(v, v) for k, v in resp.envs.items()})
    env.update(LD_PRELOAD=mounts["/usr/local/memslice/lib/libmemslice.so"].host_path,
               MS_REGION=region.host_path, MS_LIMITS=limits.host_path,
               MS_SIMLIB=mounts["/usr/local/memslice/sim/lib"].host_path,
               MEMSLICE_SIM_CONTEXT_OVERHEAD="300MiB")  # what a context takes on this simulated GPU
    out = run(["unshare", "-Urm", "sh", "-c", MOUNT_SCRIPT, "sh", *AGENT_ESCAPES[escape], cbin["alloc_direct"], "2000",
               "700"], env)
    snap = read_region(region.host_path)
    assert snap is not None, f"no region in {region.host_path} (exit {out.returncode}): {out.stdout}{out.stderr}"
    dev = snap.devices[0]
    assert dev.limit_bytes == 1 << 30 and dev.peak_bytes == (700 + 300) * MiB  # 300 MiB: the context, measured
    if escape == "oversubscribe":
        # the agent's limits file says oversubscribe=0 (the pod did not ask with memslice.io/oversubscribe):
        # the environment cannot turn spilling on
        assert "oversubscribe=0" in Path(limits.host_path).read_text()
        assert "alloc 2000 MiB -> 2" in out.stdout and dev.host_peak_bytes == 0, out.stdout + out.stderr
        return
    held_to_one_gib(out, 700)
    assert "in /run/memslice/limits" in out.stderr


@pytest.fixture
def short_tmp(tmp_path_factory) -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))  # Unix socket paths must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def limits_case(region: Path, kind: str) -> str:
    """Put a hostile limits file in the region directory; return the message the shim must give."""
    f = region / "memslice.limits"
    if kind == "symlink":
        (region / "real").write_text("gpu_mem_limit=64GiB\n")
        f.symlink_to(region / "real")
        return "cannot be read"
    if kind == "fifo":
        os.mkfifo(f)
        return "not a regular file"
    if kind == "directory":
        f.mkdir()
        return "not a regular file"
    texts = {"large": ("# padding\n" * 500 + "gpu_mem_limit=1GiB\n", "too large"),
             "unknown": ("gpu_mem_limit=1GiB\nquota_exempt=1\n", "line 2: quota_exempt is not a known key"),
             "twice": ("gpu_mem_limit=1GiB\ngpu_mem_limit=64GiB\n", "line 2: gpu_mem_limit appears twice"),
             "missing": ("oversubscribe=0\n", "lacks gpu_mem_limit"),
             "region": ("gpu_mem_limit=1GiB\nregion_dir=/tmp\n", "may not set region_dir"),
             "size": ("gpu_mem_limit=lots\n", "gpu_mem_limit='lots' is not a valid size"),
             "zero": ("gpu_mem_limit=0\n", "greater than zero"),
             "noeq": ("gpu_mem_limit 1GiB\n", "line 1 is not key=value"),
             "nul": ("gpu_mem_limit=1GiB\0\n", "NUL byte"),
             "over": ("gpu_mem_limit=1GiB\noversubscribe=yes\n", "oversubscribe='yes' is not valid"),
             "spill": ("gpu_mem_limit=1GiB\nhost_spill_limit=1GiB\n", "host_spill_limit without oversubscribe")}
    text, message = texts[kind]
    f.write_text(text)
    return message


KINDS = ["symlink", "fifo", "directory", "large", "unknown", "twice", "missing", "region", "size", "zero", "noeq",
         "nul", "over", "spill"]


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_limits_file_fails_closed(kind, node, cbin, tmp_path):
    """A limits file that is not exactly what `memslice run` writes fails closed with one line naming it
    (and never hangs on a FIFO): nothing runs with limits it cannot read."""
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "64GiB")
    message = limits_case(region, kind)
    out = run([cbin["alloc_direct"], "10"], env, timeout=30)
    assert out.stdout.startswith("init 800"), out.stdout  # CUDA_ERROR_NOT_PERMITTED
    assert message in out.stderr and "memslice.limits" in out.stderr, out.stderr
    assert "Every CUDA call fails until this is fixed." in out.stderr
    assert kv(out.stdout) == {}

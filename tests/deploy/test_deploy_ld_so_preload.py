"""The enforcement as deployed: the shim loaded through a read-only /etc/ld.so.preload, never LD_PRELOAD.

deploy/ runs the node agent in its default preload mode: its Allocate answer mounts `<shim dir>/ld.so.preload`
read-only at /etc/ld.so.preload and the shim beside it, and the limits file read-only at /run/memslice/limits.
Here the real agent answers Allocate over gRPC (the kubelet stand-in asks), and every mount of that answer is
made as the container runtime makes it: in a private mount namespace, over a copy-on-write /etc (an overlay,
as a container's root filesystem), read-only where the answer says so. The tenant runs with the answer's
environment and `env -u LD_PRELOAD`:

- a dynamically linked program gets the shim from /etc/ld.so.preload alone and is held to its quota; it
  cannot rewrite the preload list or the limits file;
- a statically linked program never runs the dynamic loader, so nothing preloads the shim: it can reach the
  driver only by dlopen of libcuda.so.1, and then talks to the driver unshimmed, told the whole GPU. That is
  the documented limit of cooperative enforcement (README, "Security model"), shown here as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import C_DIR, kv, run

from memslice.interposer.region import read_region, read_region_file

MiB = 1 << 20
QUOTA_MIB = 1024
RESOURCE = "memslice.io/gpu-mem"
SIM_CONTEXT_MIB = 520  # the simulated GPU's default cost of a context (interposer/sim/simstate.h)

Answer = tuple[dict[str, str], list[tuple[str, str, bool]]]  # env, [(host path, container path, read-only)]
pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="needs root and unshare(1) for a private mount namespace"),
              pytest.mark.xdist_group("deploy_ld_so_preload")]  # one agent's answer for the module

# Every mount of the Allocate answer, made as the runtime makes it. /etc becomes an overlay on a tmpfs (the
# host's /etc untouched, as a container's root filesystem), /run and /usr/local fresh tmpfs; then each answer
# mount is bound at its container path, read-only where it says so. MS_MOUNTS: "host|container|ro" lines.
MOUNT_SCRIPT = """set -e
mount -t tmpfs tmpfs "$MS_SCRATCH"
mkdir "$MS_SCRATCH/upper" "$MS_SCRATCH/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$MS_SCRATCH/upper,workdir=$MS_SCRATCH/work" /etc
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /usr/local
printf '%s\\n' "$MS_MOUNTS" | while IFS='|' read -r host target ro; do
    if [ -d "$host" ]; then mkdir -p "$target"; else mkdir -p "$(dirname "$target")"; : > "$target"; fi
    mount --bind "$host" "$target"
    if [ "$ro" = ro ]; then mount -o remount,bind,ro "$target"; fi
done
unset MS_SCRATCH MS_MOUNTS
exec env -u LD_PRELOAD "$@"
"""


@pytest.fixture(scope="module")
def static_cuda(tmp_path_factory: pytest.TempPathFactory) -> str:
    exe = tmp_path_factory.mktemp("static") / "static_cuda"
    out = subprocess.run(["cc", "-static", "-O2", "-Wall", "-Werror", f"-I{C_DIR.parent.parent / 'interposer/include'}",
                          str(C_DIR / "static_cuda.c"), "-o", str(exe), "-ldl"], capture_output=True, text=True)
    if out.returncode:
        pytest.skip(f"no static libc to link a static program with: {out.stderr[-300:]}")
    return str(exe)


@pytest.fixture(scope="module")
def allocation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Answer]:
    """The real agent's Allocate answer for one container of 1 GiB: (env, [(host, container, read_only)])."""
    import tempfile

    from kubelet_standin import KubeletStandin
    from test_plugin_agent import AgentProcess

    root = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))  # Unix socket paths must stay short
    kubelet = KubeletStandin(root / "dp", root / "pr" / "kubelet.sock").start()
    agent = AgentProcess(root, sim_gpus="16GiB", unit_mib=4).start()  # the default --preload file
    try:
        kubelet.wait_registered(RESOURCE)
        resp = kubelet.admit("uid-1", "ns", "pod-1", [("main", QUOTA_MIB // 4)], RESOURCE)["main"]
    finally:
        agent.stop()
        kubelet.stop()
    yield dict(resp.envs), [(m.host_path, m.container_path, m.read_only) for m in resp.mounts]
    shutil.rmtree(root, ignore_errors=True)


def in_container(allocation: Answer, scratch: Path,
                 *cmd: str) -> subprocess.CompletedProcess[str]:
    """Run `cmd` as the container's process: the answer's mounts and environment, LD_PRELOAD unset."""
    envs, mounts = allocation
    scratch.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], **envs, "MS_SCRATCH": str(scratch),
           "MS_MOUNTS": "\n".join(f"{h}|{c}|{'ro' if ro else 'rw'}" for h, c, ro in mounts)}
    return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_SCRIPT, "sh", *cmd], env)


def host_path(allocation: Answer, container_path: str) -> Path:
    return Path(next(h for h, c, _ in allocation[1] if c == container_path))


def test_the_answer_preloads_by_a_read_only_file_and_sets_no_ld_preload(allocation):
    envs, mounts = allocation
    by_target = {c: (h, ro) for h, c, ro in mounts}
    assert "LD_PRELOAD" not in envs
    preload, ro = by_target["/etc/ld.so.preload"]
    assert ro and Path(preload).read_text().split() == ["/usr/local/memslice/lib/libmemslice.so"]
    assert by_target["/usr/local/memslice/lib/libmemslice.so"][1] and by_target["/run/memslice/limits"][1]
    assert f"gpu_mem_limit={QUOTA_MIB}MiB" in Path(by_target["/run/memslice/limits"][0]).read_text().splitlines()


def test_a_dynamic_program_is_held_to_its_quota_by_ld_so_preload_alone(allocation, cbin, tmp_path):
    maps = in_container(allocation, tmp_path / "s1", "cat", "/proc/self/maps")
    assert maps.returncode == 0, maps.stderr
    assert "/usr/local/memslice/lib/libmemslice.so" in maps.stdout  # from /etc/ld.so.preload: nothing else names it
    out = in_container(allocation, tmp_path / "s2", cbin["alloc_direct"], "2000", "400")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "alloc 2000 MiB -> 2" in out.stdout and "alloc 400 MiB -> 0" in out.stdout, out.stdout + out.stderr
    assert f"total={QUOTA_MIB}" in out.stdout  # told its quota, not the 16 GiB GPU
    region = host_path(allocation, "/run/memslice/region")
    dev = read_region(region).devices[0]
    assert dev.limit_bytes == QUOTA_MIB * MiB and dev.refused >= 1
    assert dev.peak_bytes == (SIM_CONTEXT_MIB + 400) * MiB  # the context, measured, and the allocation
    # the simulated GPU's own ledger of this container (MEMSLICE_SIM_USAGE in the answer) agrees: physical
    # memory never went past the quota
    assert allocation[0]["MEMSLICE_SIM_USAGE"] == "/run/memslice/region/sim.usage"
    physical = read_region_file(str(region / "sim.usage")).devices[0]
    assert physical.peak_bytes == (SIM_CONTEXT_MIB + 400) * MiB and physical.used_bytes == 0


def test_the_tenant_cannot_rewrite_the_preload_list_or_its_limits(allocation, tmp_path):
    for target in ("/etc/ld.so.preload", "/run/memslice/limits", "/usr/local/memslice/lib/libmemslice.so"):
        out = in_container(allocation, tmp_path / target.replace("/", "_"), "sh", "-c", f": > {target}")
        assert out.returncode != 0 and "Read-only file system" in out.stderr, (target, out.stderr)
    assert host_path(allocation, "/etc/ld.so.preload").read_text().strip() == "/usr/local/memslice/lib/libmemslice.so"
    assert not Path("/etc/ld.so.preload").exists() or "memslice" not in Path("/etc/ld.so.preload").read_text()


def test_a_static_program_never_loads_the_shim_and_sees_the_whole_gpu(allocation, static_cuda, tmp_path):
    """A static binary runs no dynamic loader, so /etc/ld.so.preload is never read: the only way it reaches the
    driver is dlopen("libcuda.so.1"), which loads the driver without the shim. It is told the physical GPU
    (16 GiB), not its quota, and the container's ledger never hears of it: outside cooperative enforcement."""
    out = in_container(allocation, tmp_path / "s", static_cuda)
    assert out.returncode == 0, out.stdout + out.stderr
    got = kv(out.stdout)
    assert got["shim_mapped"] == "0" and got["dlopen"] == "1" and got["rc"] == "0", out.stdout
    assert got["shim_mapped_after"] == "0", out.stdout  # dlopen of the driver did not bring the shim either
    assert got["devtotal_mib"] == "16384", out.stdout  # the whole simulated GPU: no quota view
    region = host_path(allocation, "/run/memslice/region")
    snap = read_region(region)
    assert snap is None or not [p for p in snap.processes if p.comm.startswith("static_cuda")]

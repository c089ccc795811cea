"""A tenant's region directory cannot stall the node agent or reach outside itself (issue 11 follow-up).

The region directory is mounted read-write in the container: a tenant can leave 100,000 files in it, a deep
tree, and symbolic links to anywhere on the host. Removing it must cost the reconcile loop one rename (the
contents are deleted by a background worker, in slices), never follow a link, and resume after a restart.

Real pieces only: `memslice node-agent --simulate` as a process, the kubelet stand-in admitting and
removing pods over real gRPC (Allocate, PodResources), /healthz and /metrics over HTTP.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_standin import KubeletStandin
from test_plugin_agent import RESOURCE, AgentProcess
from test_plugin_agent import short_tmp as short_tmp  # noqa: F401 (fixture)
from waiting import wait_until

from memslice.proto import api_pb2

REGION_MOUNT = "/run/memslice/region"
MANY = 100_000
DEPTH = 3000


def region_dir(resp: api_pb2.ContainerAllocateResponse) -> Path:
    return Path(next(m.host_path for m in resp.mounts if m.container_path == REGION_MOUNT))


def fill(d: Path, outside: Path) -> None:
    """What a hostile tenant leaves in its region directory: many files, a deep tree, links out of it."""
    flat = d / "many"
    flat.mkdir()
    for i in range(MANY):
        os.close(os.open(flat / str(i), os.O_CREAT | os.O_WRONLY, 0o600))
    # 3,000 levels: past any path length, and past recursion (shutil.rmtree raised RecursionError here)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEPTH):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.symlink(outside, "to-dir", dir_fd=fd)
    os.close(fd)
    (d / "to-dir").symlink_to(outside)                 # rmtree must delete the link, not what it names
    (d / "to-file").symlink_to(outside / "precious")
    (d / "to-root").symlink_to("/")


def outside_dir(root: Path) -> Path:
    """A host directory outside the region root that the tenant's links point at."""
    out = root / "host-data"
    (out / "sub").mkdir(parents=True)
    (out / "precious").write_text("keep me")
    (out / "sub" / "also").write_text("keep me too")
    return out


def outside_intact(out: Path) -> bool:
    return ((out / "precious").read_text() == "keep me" and (out / "sub" / "also").read_text() == "keep me too"
            and sorted(p.name for p in out.iterdir()) == ["precious", "sub"])


class HealthPoller:
    """GET /healthz every 0.2 s (each with a 10 s bound) in a thread; records every answer that is not 200."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.bad: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                code, body = self.agent.get("/healthz")
                if code != 200:
                    self.bad.append(f"{code} {body.strip()}")
            except OSError as exc:  # a timeout or a refused connection: the agent is stuck or gone
                self.bad.append(repr(exc))
            self.polls += 1
            self._stop.wait(0.2)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


@pytest.fixture
def agent(short_tmp: Path) -> Iterator[tuple[KubeletStandin, AgentProcess]]:  # noqa: F811 (fixture argument)
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    a = AgentProcess(short_tmp, sim_gpus="16GiB", unit_mib=4).start()
    try:
        kubelet.wait_registered(RESOURCE)
        yield kubelet, a
    finally:
        a.stop()
        kubelet.stop()


def trash_entries(region_root: Path) -> int:
    """Entries still in the trash, counted three levels down (enough to see a region's files), without
    following links; 0 when the trash is empty or absent."""
    n = 0
    stack = [(region_root / ".trash", 3)]
    while stack:
        d, depth = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    n += 1
                    if depth > 1 and e.is_dir(follow_symlinks=False):
                        stack.append((Path(e.path), depth - 1))
        except FileNotFoundError:
            pass
    return n


def test_removing_a_region_full_of_files_and_links_never_stalls_the_agent(agent, short_tmp: Path):
    kubelet, node = agent
    out = outside_dir(short_tmp)
    hostile = region_dir(kubelet.admit("uid-a", "ns", "a", [("c", 10)], RESOURCE)["c"])
    other = region_dir(kubelet.admit("uid-b", "ns", "b", [("c", 10)], RESOURCE)["c"])
    fill(hostile, out)

    # the disk a tenant uses in its directory is visible (a bounded count: lower bounds past it)
    m = node.metrics()  # by region: the pod names may be learnt later (PodResources)
    entries = {dict(lv)["region"]: v for (n, lv), v in m.items() if n == "memslice_container_region_dir_entries"}
    complete = {dict(lv)["region"]: v for (n, lv), v in m.items() if n == "memslice_container_region_dir_complete"}
    assert entries[hostile.name] >= 1024 and complete[hostile.name] == 0
    assert entries[other.name] == 0 and complete[other.name] == 1

    with HealthPoller(node) as health:
        kubelet.remove_pod("uid-a")
        node.wait_log(f"removed region {hostile.name}", "the hostile region removed")
        assert not hostile.exists()
        # removal was a rename: the contents are deleted by the reaper after the reconcile loop moved on (how
        # far it got by now is the machine's timing, not asserted; /healthz above and below must never stall)
        kubelet.remove_pod("uid-b")  # the loop keeps serving while the trash is emptied
        node.wait_log(f"removed region {other.name}", "the next removal, during the deletion")
        fresh = kubelet.admit("uid-c", "ns", "c", [("c", 10)], RESOURCE)["c"]  # and Allocate answers
        assert region_dir(fresh).is_dir()
        wait_until("the trash emptied", lambda: trash_entries(node.region_root) == 0, 120)
        wait_until("trash metric at 0", lambda: node.sample("memslice_region_trash_items") == [0.0], 15)
    assert health.polls > 0 and health.bad == [], health.bad
    assert outside_intact(out)
    assert Path("/").is_dir() and (short_tmp / "regions").is_dir() and region_dir(fresh).is_dir()


def test_trash_left_by_a_killed_agent_is_deleted_after_restart(agent, short_tmp: Path):
    kubelet, node = agent
    out = outside_dir(short_tmp)
    node.kill()
    # what an agent killed in the middle of a deletion leaves: a renamed region directory in the trash
    left = node.region_root / ".trash" / "g0-0123456789ab.5f5f5f5f5f5f"
    left.mkdir(parents=True)
    for i in range(2000):
        (left / str(i)).touch()
    (left / "nested" / "deeper").mkdir(parents=True)
    (left / "nested" / "deeper" / "to-dir").symlink_to(out)
    (left / "to-file").symlink_to(out / "precious")
    before = kubelet.registrations
    node.start()
    kubelet.wait_registered(RESOURCE, after=before)
    wait_until("the trash left before the restart emptied", lambda: trash_entries(node.region_root) == 0, 60)
    assert outside_intact(out)
    assert node.get("/healthz")[0] == 200

"""The node agent never removes a region that is being answered or that a live process uses, whatever the
timing (device-plugin mode's reconcile loop and orphan sweep).

Seen once under load (test_node_agent_limits_file_holds_every_process): the orphan sweep took the ledger as it
was, then listed the region directories and removed any older than the grace (1 s) that the ledger lacked. An
Allocate creates the directory first and enters the ledger only after two fsynced writes: on a loaded disk the
sweep found the new directory "old" and unowned, and moved it to the trash while the Allocate was still being
answered: the container got a region mount whose source was gone. The same clock decided ledger entries: one
the kubelet's record lacked was removed once `created_at` (taken before those writes) was a second old, measured
after a PodResources answer that could have been taken before the kubelet even had the answer.

Now a region is announced (under the ledger's lock) before its directory exists and stays announced until its
Allocate call has ended; the sweep and reconciliation decide under the same lock; an entry is removed on the
record's silence only when the look at the record began a grace after the answer; and neither removes a region
whose file a live process holds a write lock in (what every shimmed process of the container holds while it
lives, dropped by the kernel when it dies, and what only a writer of the file can take).

Real pieces: `memslice node-agent` as a process (or, where one thread must be held between two steps, its
device-plugin service and reconcile loop in this process), the kubelet stand-in over real gRPC (Allocate,
PodResources), the shim preloaded into a tenant on the simulated GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from test_agent_host_pids import container_env
from test_plugin_agent import RESOURCE
from test_plugin_agent import node as node  # noqa: F401 (fixture)
from test_plugin_agent import short_tmp as short_tmp  # noqa: F401 (fixture)
from waiting import wait_until

from memslice.interposer.region import REGION_FILE, read_region, user_of
from memslice.plugin.config import resolve
from memslice.plugin.deviceplugin.agent import DevicePluginMode
from memslice.plugin.deviceplugin.devices import device_id
from memslice.plugin.deviceplugin.reconcile import region_id_for
from memslice.plugin.deviceplugin.server import DevicePluginService, PluginServer
from memslice.plugin.gpu.health import HealthBook
from memslice.plugin.gpu.nvml import GpuInfo
from memslice.plugin.ledger import Allocation
from memslice.plugin.metrics import Metrics
from memslice.plugin.regions import RegionStore
from memslice.plugin.response import ResponseConfig
from memslice.proto import api_pb2, api_pb2_grpc

REGION_MOUNT = "/run/memslice/region"
GRACE_S = 1.0  # the agent's grace at --reconcile-interval-s 0.2: max(2 x 0.2, 1.0)

# A process holding a lock on the region file, the way the shim holds its slot (a write lock on one byte), or
# a reader's read lock; says "ready", then holds it until stdin closes.
HOLDER = r"""
import fcntl, os, sys
write = sys.argv[2] == "write"
fd = os.open(sys.argv[1], os.O_RDWR if write else os.O_RDONLY)
fcntl.lockf(fd, (fcntl.LOCK_EX if write else fcntl.LOCK_SH) | fcntl.LOCK_NB, 1, 1 << 20, os.SEEK_SET)
print("ready", flush=True)
sys.stdin.read()
"""


def region_dir(resp: api_pb2.ContainerAllocateResponse) -> Path:
    return Path(next(m.host_path for m in resp.mounts if m.container_path == REGION_MOUNT))


def holder(path: Path, kind: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), kind], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def end(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=30)


# --- who uses a region: a write lock, nothing else ----------------------------------------------------------

def test_only_a_live_writers_lock_makes_a_region_used(tmp_path: Path):
    d = tmp_path / "r"
    d.mkdir()
    assert user_of(d) is None and user_of(tmp_path / "absent") is None
    f = d / REGION_FILE
    f.write_bytes(b"\0" * 4096)
    assert user_of(d) is None  # a file nobody holds
    reader = holder(f, "read")
    try:
        assert user_of(d) is None  # a reader's lock (the simulated node's read-only peers) is no use
    finally:
        end(reader)
    writer = holder(f, "write")
    try:
        assert user_of(d) == writer.pid
    finally:
        end(writer)
    assert user_of(d) is None  # the kernel dropped it with the process
    # what a tenant can put there instead: never opened as a region, never "used"
    f.unlink()
    f.symlink_to(tmp_path / "elsewhere")
    assert user_of(d) is None
    f.unlink()
    os.mkfifo(f)
    assert user_of(d) is None
    f.unlink()
    f.mkdir()
    assert user_of(d) is None


# --- the kubelet's record lagging behind ---------------------------------------------------------------------

def test_an_allocation_answered_after_the_kubelet_was_asked_is_not_removed_on_its_late_answer(node):  # noqa: F811
    """The agent asks PodResources; the kubelet takes its answer, admits a pod (Allocate answered), and only
    then delivers the answer, which lacks it. However long that took, the allocation is not removed on it."""
    kubelet, make = node
    agent = make(sim_gpus="16GiB", unit_mib=4)
    kubelet.wait_registered(RESOURCE)
    with kubelet.held_lists():
        wait_until("the agent's look at the kubelet's record held", lambda: kubelet.lists_held >= 1, 15)
        d = region_dir(kubelet.admit("uid-1", "ns", "p1", [("c", 10)], RESOURCE)["c"])
        ino = d.stat().st_ino
        created = json.loads(d.with_suffix(".json").read_text())["created_at"]
        # the answer comes late: after the allocation is older than the grace (what removed it before)
        wait_until("the allocation older than the agent's grace", lambda: time.time() - created > GRACE_S, 10)
        calls = kubelet.list_calls
    # the agent's next look begins once the pass that got the late answer is over
    wait_until("the agent's next look at the record", lambda: kubelet.list_calls > calls, 15)
    assert f"removed region {d.name}" not in agent.log(), agent.log()
    assert d.stat().st_ino == ino and d.with_suffix(".limits").is_file()


def test_a_region_a_live_process_uses_is_kept_while_the_record_lacks_it(node):  # noqa: F811
    """Standalone (no pod watch), the kubelet's record is all the agent knows; a restarted kubelet lists none
    of its running pods at first. A container whose shimmed process runs keeps its region (the tenant's
    accounting file) until that process is gone, then the region goes as before."""
    kubelet, make = node
    agent = make(sim_gpus="16GiB", unit_mib=4, args=("--preload", "env"))
    kubelet.wait_registered(RESOURCE)
    env, region = container_env(kubelet.admit("uid-1", "ns", "p1", [("c", 256)], RESOURCE)["c"])
    tenant = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "64"], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert tenant.stdout is not None
        line = tenant.stdout.readline()
        assert '"result": 0' in line, line
        kubelet.remove_pod("uid-1")  # the record no longer lists it
        agent.wait_log(f"kept region {region.name}", "the region kept for its live process")
        snap = read_region(region)
        assert snap is not None and [p.alive for p in snap.processes] == [True]
        assert f"removed region {region.name}" not in agent.log()
        # a reader's lock does not keep it: once the tenant is gone, the region goes
        reader = holder(region / REGION_FILE, "read")
        try:
            end(tenant)
            agent.wait_log(f"removed region {region.name}", "the region removed once no process uses it")
        finally:
            end(reader)
    finally:
        if tenant.poll() is None:
            tenant.kill()
            tenant.wait()
    assert not region.exists() and not region.with_suffix(".limits").exists()


# --- the orphan sweep against an Allocate still being answered ---------------------------------------------

class HeldRegions(RegionStore):
    """The real store, with its `create` held after the files are written: where a slow disk (two fsyncs) or a
    starved thread leaves an Allocate, its directory made, its ledger entry not yet."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.created = threading.Event()
        self.go_on = threading.Event()

    def create(self, alloc: Allocation) -> Path:
        d = super().create(alloc)
        self.created.set()
        assert self.go_on.wait(60), "the test never let the Allocate go on"
        return d


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[DevicePluginMode, HeldRegions, api_pb2_grpc.DevicePluginStub]]:
    """Device-plugin mode's service and reconcile pass in this process, on one simulated 16 GiB GPU, with no
    PodResources (its record plays no part here) and the reconcile loop not started: the test runs the passes.
    Allocate is served over gRPC on a Unix socket."""
    cfg = resolve(argparse.Namespace(region_root=str(tmp_path / "regions"), device_plugin_dir=str(tmp_path / "dp"),
                                     shim_host_dir=str(tmp_path / "lib"), pod_resources_socket="",
                                     reconcile_interval_s="0.2"), env={})
    regions = HeldRegions(cfg.region_root)
    regions.prepare()
    metrics = Metrics()
    mode = DevicePluginMode(cfg, regions, metrics)
    st = mode.new_state([GpuInfo(0, "GPU-0", "sim", 16384, None, False)], HealthBook(["GPU-0"], frozenset(), 60))
    server = PluginServer(tmp_path / "p.sock", DevicePluginService(st, regions, ResponseConfig(tmp_path / "lib"),
                                                                   metrics), 4)
    server.start()
    channel = grpc.insecure_channel(f"unix:{tmp_path / 'p.sock'}")
    try:
        yield mode, regions, api_pb2_grpc.DevicePluginStub(channel)
    finally:
        regions.go_on.set()
        channel.close()
        server.stop()


def test_a_region_being_answered_is_never_taken_for_an_orphan(held):
    mode, regions, stub = held
    ids = [device_id(0, n) for n in range(4)]
    rid = region_id_for(ids)
    answer: list[api_pb2.AllocateResponse] = []
    call = threading.Thread(target=lambda: answer.append(stub.Allocate(api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]), timeout=60)))
    call.start()
    try:
        assert regions.created.wait(30), "the Allocate never created its region"
        d = regions.dir_of(rid)
        # held past the grace: by the directory's age, an orphan (what a loaded disk produced)
        wait_until("the directory older than the grace", lambda: time.time() - d.stat().st_mtime > GRACE_S, 10)
        mode.reconcile_once()
        assert d.is_dir() and regions.limits_of(rid).is_file()
    finally:
        regions.go_on.set()
        call.join(60)
    (resp,) = answer[0].container_responses
    assert region_dir(resp) == d
    mode.reconcile_once()  # answered, in the ledger: still kept
    assert d.is_dir() and regions.limits_of(rid).is_file() and rid in mode._st().ledger_copy()


def test_an_orphan_goes_at_once_unless_a_live_process_uses_it(held):
    """A directory no allocation holds (left by a crash between creating and recording it) needs no age to
    go; one a live process holds a write lock in stays until that process is gone."""
    mode, regions, _ = held
    regions.go_on.set()
    free, used = regions.dir_of("g0-00000000000a"), regions.dir_of("g0-00000000000b")
    for d in (free, used):
        d.mkdir()
        (d / REGION_FILE).write_bytes(b"\0" * 4096)
    p = holder(used / REGION_FILE, "write")
    try:
        mode.reconcile_once()
        assert not free.exists() and used.is_dir()
        mode.reconcile_once()
        assert used.is_dir()
    finally:
        end(p)
    mode.reconcile_once()
    assert not used.exists()

"""DRA mode never removes a region a live process uses, whatever its checkpoint says (issue 40's promise, as the
device-plugin mode keeps it: tests/agent/test_agent_region_liveness.py).

The start-up sweep removed every region directory and CDI spec no checkpointed claim held: a checkpoint that lost
a claim (an unreadable version moved away, a restored node disk, a bug) swept a running container's region, the
accounting file its shim uses, from under it. Now such a region is kept while a process holds its write lock in
the region file, with its claim's CDI spec (which the runtime reads again when the pod's container restarts), and
both go once no process uses it: at the kubelet's next NodeUnprepareResources or the next start.

Real pieces: `memslice node-agent --kubelet-api dra` as a process on a simulated GPU, the real kube-apiserver, the
kubelet DRA stand-in over gRPC on the agent's Unix socket, the shim preloaded into tenant processes with the CDI
spec's env and mounts.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from test_dra_node import DRIVER, KUBE, DraNode, _spec_env, make_claim, run_tenant
from test_dra_node import world as world  # noqa: F401 (fixture)
from waiting import wait_until

from memslice.interposer.region import read_region
from memslice.plugin.regions import CONTAINER_REGION_DIR


def region_of(node: DraNode, uid: str) -> Path:
    """The host directory the claim's CDI spec mounts as the container's region."""
    spec = json.loads((node.cdi / f"memslice.io-{uid}.json").read_text())
    [device] = spec["devices"]
    return Path(next(m["hostPath"] for m in device["containerEdits"]["mounts"]
                     if m["containerPath"] == CONTAINER_REGION_DIR))


def kept_gauge(node: DraNode) -> float:
    m = re.search(r"^memslice_dra_regions_kept_in_use (\S+)$", node.http("/metrics")[1], re.M)
    assert m, "no memslice_dra_regions_kept_in_use on /metrics"
    return float(m.group(1))


def restart_without_checkpoint(node: DraNode) -> None:
    """The agent killed, its checkpoint loses every claim (kept readable: a restored disk), the node restarts."""
    node.kill()
    ckpt = node.plugins / DRIVER / "checkpoint.json"
    doc = json.loads(ckpt.read_text())
    doc["claims"] = {}
    ckpt.write_text(json.dumps(doc))
    node.kubelet.restart()
    node.start()


def alive_users(region: Path) -> list[bool]:
    snap = read_region(region)
    return [p.alive for p in snap.processes] if snap is not None else []


@KUBE
def test_a_region_the_checkpoint_lost_is_kept_while_its_process_lives(world) -> None:  # noqa: F811
    kube, node = world
    claims = [make_claim(kube, name, "2Gi") for name in ("lost-a", "lost-b")]
    uids = [c["metadata"]["uid"] for c in claims]
    resp = node.kubelet.prepare(DRIVER, *claims)
    tenants: list[subprocess.Popen[str]] = []
    try:
        for uid in uids:
            entry = resp.claims[uid]
            assert entry.error == "", entry.error
            proc = run_tenant(_spec_env(node, entry.devices[0].cdi_device_ids[0]))
            tenants.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr and proc.poll() is not None else "no output"
            assert json.loads(line)["allocated_mib"] > 0, line
        regions = [region_of(node, uid) for uid in uids]
        inodes = [r.stat().st_ino for r in regions]
        specs = sorted(f"memslice.io-{uid}.json" for uid in uids)

        restart_without_checkpoint(node)
        assert node.left_behind()["checkpoint"] == []
        for region, ino, proc in zip(regions, inodes, tenants, strict=True):
            assert region.stat().st_ino == ino, node.log()  # the same directory: never moved to the trash
            assert f"removed region {region.name}" not in node.log()
            assert re.search(rf"kept region {region.name} of claim dra-node/lost-.*process {proc.pid} still uses "
                             rf"it", node.log()), node.log()
            assert alive_users(region) == [True]
        assert node.left_behind()["cdi"] == specs  # a restart of the container resolves its CDI device again
        assert kept_gauge(node) == 2

        # lost-a's process ends and the kubelet unprepares its claim (its pod is gone): the agent does not know
        # the claim, yet its kept region and spec go now; lost-b's stay, its process still running
        tenants[0].communicate("", timeout=30)
        out = node.kubelet.unprepare(DRIVER, claims[0])
        assert out.claims[uids[0]].error == ""
        wait_until("lost-a's region removed", lambda: not regions[0].exists(), 10)
        assert regions[1].stat().st_ino == inodes[1] and alive_users(regions[1]) == [True]
        assert node.left_behind()["cdi"] == [f"memslice.io-{uids[1]}.json"]
        assert kept_gauge(node) == 1

        # lost-b's process ends: the next start removes its region and spec
        tenants[1].communicate("", timeout=30)
        node.kill()
        node.kubelet.restart()
        node.start()
        assert node.left_behind() == {"regions": [], "cdi": [], "checkpoint": []}
        assert f"removed region {regions[1].name}" in node.log()
        assert kept_gauge(node) == 0
    finally:
        for proc in tenants:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)

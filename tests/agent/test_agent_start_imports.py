"""What a node agent imports, read from the real process: `memslice node-agent` runs with PYTHONPROFILEIMPORTTIME=1,
so its stderr names every module it imports, when it imports it.

The kubernetes client's generated API classes are pydantic-validated from kubernetes 37 on: `CoreV1Api` costs about
0.9 CPU-seconds to construct, `ResourceV1Api` 0.25, and both were constructed at every agent start (DRA mode: before
the kubelet got its first answer). The agent's calls go through memslice.kube.calls instead, which makes the same
requests (tests/agent/test_agent_kube_calls.py): these tests fail if a generated API module comes back, at start or
on the paths that talk to the API (DRA: NodePrepareResources and NodeUnprepareResources read the claim and write
its status; device-plugin mode: the node inventory, the pod watch, the swap-Events thread). Each mode imports only
its own wing of plugin/.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import kube_standin_dra as dra
import pytest
from kube_standin import KubeApiStandin
from kubelet_standin import KubeletStandin
from test_dra_node import CLASS, DRIVER, NODE, NS, DraNode
from test_plugin_agent import RESOURCE, AgentProcess
from test_plugin_agent import short_tmp as short_tmp  # the fixture, shared
from waiting import wait_until

from memslice.contract import ANN_GPUS
from memslice.paths import lib_paths

HEAVY = ("kubernetes.client.api.core_v1_api", "kubernetes.client.api.resource_v1_api")
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", re.M)


def imported(output: str) -> set[str]:
    """The modules a process started with PYTHONPROFILEIMPORTTIME=1 imported, from its output."""
    return set(IMPORT_LINE.findall(output))


def check(output: str, absent: tuple[str, ...]) -> None:
    mods = imported(output)
    # not vacuous: the import lines are there, and the agent did load the client and the calls module
    assert {"kubernetes", "memslice.kube.calls", "memslice.plugin.agent"} <= mods, sorted(mods)[:50]
    assert [m for m in absent if m in mods] == []


@pytest.fixture
def dra_node() -> Iterator[tuple[KubeApiStandin, DraNode]]:
    lib_paths()
    root = Path(tempfile.mkdtemp(prefix="ms-imp-", dir="/tmp"))  # short: Unix socket paths
    with KubeApiStandin() as kube:
        kube.put({"kind": "Node", "metadata": {"name": NODE}})
        kube.put(dra.device_class(CLASS))
        node = DraNode(root, kube)
        node.env["PYTHONPROFILEIMPORTTIME"] = "1"
        try:
            yield kube, node
        finally:
            node.stop()
            shutil.rmtree(root, ignore_errors=True)


def test_dra_agent_serves_and_prepares_without_the_generated_api_classes(dra_node) -> None:
    kube, node = dra_node
    node.start()  # registered with the kubelet stand-in, its ResourceSlice published
    assert node.http("/readyz")[0] == 200
    check(node.log(), HEAVY + ("memslice.plugin.deviceplugin.agent",))
    kube.put(dra.claim("c", "4Gi", namespace=NS, class_name=CLASS))
    claim = dra.allocate(kube, NS, "c", NODE)
    resp = node.kubelet.prepare(DRIVER, claim)
    assert resp.claims[claim["metadata"]["uid"]].error == ""
    stored = kube.get("ResourceClaim", NS, "c")
    assert stored is not None and stored["status"]["devices"][0]["driver"] == DRIVER  # written by the agent
    node.kubelet.unprepare(DRIVER, claim)
    check(node.log(), HEAVY + ("memslice.plugin.deviceplugin.agent",))


def test_device_plugin_agent_with_an_api_runs_without_the_generated_api_classes(short_tmp: Path) -> None:
    api = KubeApiStandin().start()
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    agent = AgentProcess(short_tmp, args=("--kubeconfig", api.kubeconfig(str(short_tmp / "kubeconfig")),
                                          "--node-name", "n1"), env={"PYTHONPROFILEIMPORTTIME": "1"})

    def alive() -> None:
        assert agent.proc is not None and agent.proc.poll() is None, agent.log()[-3000:]

    def annotations() -> dict[str, str]:
        node = api.get("Node", None, "n1") or {}
        return dict(node.get("metadata", {}).get("annotations") or {})

    try:
        api.put({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1"}})
        agent.start()
        kubelet.wait_registered(RESOURCE, timeout=30)
        wait_until("the node inventory published (a PATCH of the Node)", lambda: ANN_GPUS in annotations(), 30,
                   alive=alive)
        wait_until("/readyz 200 (the pod watch synced)", lambda: agent.get("/readyz")[0] == 200, 30, alive=alive)
        check(agent.log(), HEAVY + ("memslice.plugin.dra.agent",))
    finally:
        agent.stop()
        kubelet.stop()
        api.stop()

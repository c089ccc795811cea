"""What a node agent imports, read from the real process: `memslice node-agent` runs with a sitecustomize (on its
PYTHONPATH, from this test) that writes the names in sys.modules to a file when the process exits, after SIGTERM.

The kubernetes client's generated API classes are pydantic-validated from kubernetes 37 on: `CoreV1Api` costs about
0.9 CPU-seconds to construct, `ResourceV1Api` 0.25, and both were constructed at every agent start (DRA mode: before
the kubelet got its first answer). The agent's calls go through memslice.kube.calls instead, which makes the same
requests (tests/agent/test_agent_kube_calls.py): these tests fail if a generated API module comes back, at start or
on the paths that talk to the API (DRA: NodePrepareResources and NodeUnprepareResources read the claim and write
its status; device-plugin mode: the node inventory, the pod watch, the swap-Events thread). Each mode imports only
its own wing of plugin/.
"""

from __future__ import annotations

import os
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

# modules the kubernetes client imports lazily (kubernetes.client.__getattr__) when CoreV1Api / ResourceV1Api are named
HEAVY = ("kubernetes.client.api.core_v1_api", "kubernetes.client.api.resource_v1_api")
SITECUSTOMIZE = """\
import atexit, os, sys

def _modules(path=os.environ["MODULES_AT_EXIT"] + "." + str(os.getpid())):
    with open(path, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))

atexit.register(_modules)
"""


def spy_env(root: Path) -> dict[str, str]:
    """The environment that makes a Python process write its sys.modules to root/modules.PID when it exits."""
    (root / "spy").mkdir(exist_ok=True)
    (root / "spy" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(root / "spy"), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "MODULES_AT_EXIT": str(root / "modules")}


def check(root: Path, pid: int, absent: tuple[str, ...]) -> None:
    out = root / f"modules.{pid}"
    assert out.is_file(), "the agent did not exit cleanly after SIGTERM (no sys.modules written)"
    mods = set(out.read_text().split())
    # not vacuous: the agent did load the kubernetes client (and the client's API package, for ApiClient)
    assert {"kubernetes", "kubernetes.client.api_client", "memslice.plugin.agent"} <= mods, sorted(mods)[:50]
    assert [m for m in absent if m in mods] == []


@pytest.fixture
def dra_node() -> Iterator[tuple[KubeApiStandin, DraNode]]:
    lib_paths()
    root = Path(tempfile.mkdtemp(prefix="ms-imp-", dir="/tmp"))  # short: Unix socket paths
    with KubeApiStandin() as kube:
        kube.put({"kind": "Node", "metadata": {"name": NODE}})
        kube.put(dra.device_class(CLASS))
        node = DraNode(root, kube)
        node.env.update(spy_env(root))
        try:
            yield kube, node
        finally:
            node.stop()
            shutil.rmtree(root, ignore_errors=True)


def test_dra_agent_serves_and_prepares_without_the_generated_api_classes(dra_node) -> None:
    kube, node = dra_node
    node.start()  # registered with the kubelet stand-in, its ResourceSlice published
    assert node.http("/readyz")[0] == 200
    kube.put(dra.claim("c", "4Gi", namespace=NS, class_name=CLASS))
    claim = dra.allocate(kube, NS, "c", NODE)
    resp = node.kubelet.prepare(DRIVER, claim)
    assert resp.claims[claim["metadata"]["uid"]].error == ""
    stored = kube.get("ResourceClaim", NS, "c")
    assert stored is not None and stored["status"]["devices"][0]["driver"] == DRIVER  # written by the agent
    node.kubelet.unprepare(DRIVER, claim)
    assert node.proc is not None
    node.stop_agent()
    check(node.root, node.proc.pid, HEAVY + ("memslice.plugin.deviceplugin.agent",))


def test_device_plugin_agent_with_an_api_runs_without_the_generated_api_classes(short_tmp: Path) -> None:
    api = KubeApiStandin().start()
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    agent = AgentProcess(short_tmp, args=("--kubeconfig", api.kubeconfig(str(short_tmp / "kubeconfig")),
                                          "--node-name", "n1"), env=spy_env(short_tmp))

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
        assert agent.proc is not None
        agent.stop()
        check(short_tmp, agent.proc.pid, HEAVY + ("memslice.plugin.dra.agent",))
    finally:
        agent.stop()
        kubelet.stop()
        api.stop()

"""The extender across a restart of the real kube-apiserver: nothing is lost (the stand-in's version of this,
tests/extender/test_extender_cluster.py, only drops its own watch connections).

The extender lists and watches the real API server, reserves a pod's memory by binding it, then the API server
process is stopped and started again on the same etcd data: every connection and watch drops, the
resourceVersions go on. Afterwards the extender sees what is created and deleted, charges it, and its figures
match the API server's pods."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kube_real import RealCluster
from test_extender_support import Client, pod_obj

from memslice.kube.config import load_api_client
from memslice.scheduler_extender.app import Config, Extender
from memslice.scheduler_extender.kubeio.annotations import reservation_annotations

# one real control plane (the session fixture real_cluster) serves the test_real_* modules: one xdist worker
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
NS = "real-restart"
NODE = "real-c"


@pytest.fixture(scope="module")
def extender(real_cluster: RealCluster) -> Iterator[tuple[RealCluster, Extender, Client]]:
    cluster = real_cluster
    cluster.ensure_namespace(NS)
    cluster.register_node(NODE, capacity={"memslice.io/gpu-mem": "10000"})
    gpus = [{"uuid": f"GPU-{NODE}-0", "index": 0, "model": "Sim", "memMiB": 10000, "numa": 0, "healthy": True}]
    cluster.ok("PATCH", f"/api/v1/nodes/{NODE}", {"metadata": {"annotations": {
        "memslice.io/gpus": json.dumps(gpus), "memslice.io/unit-mib": "1"}}},
        content_type="application/merge-patch+json")
    api, _ = load_api_client(str(cluster.admin_kubeconfig))
    ext = Extender(api, Config(address="127.0.0.1", port=0, watch_timeout=30)).start()
    client = Client(ext.url)
    try:
        assert ext.wait_synced(30), "extender did not sync"
        yield cluster, ext, client
    finally:
        client.close()
        ext.stop()


def used(ext: Extender) -> list[int] | None:
    view = ext.state.view(NODE)
    return None if view is None else [g.used_mib for g in view.gpus]


def create(cluster: RealCluster, body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"]["namespace"] = NS
    return dict(cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", body))


def test_api_server_restart_loses_nothing(extender) -> None:
    cluster, ext, client = extender
    assert ext.state.wait_for(lambda s: used(ext) == [0], 30)
    a = create(cluster, pod_obj("a", {"main": 3000}, ns=NS))
    assert ext.state.wait_for(lambda s: s.pod(NS, "a") is not None, 30)
    assert client.bind(a, NODE) == ""  # the extender's Binding, carrying the reservation, to the real API server
    assert ext.state.wait_for(lambda s: used(ext) == [3000], 30), used(ext)
    rv_before = int(cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/a")["metadata"]["resourceVersion"])

    cluster.restart_apiserver()  # every watch connection drops; etcd keeps everything

    stored = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/a")
    assert stored["spec"]["nodeName"] == NODE and stored["metadata"]["annotations"]["memslice.io/gpu-uuid"]
    b = create(cluster, pod_obj("b", {"main": 2000}, ns=NS, node=NODE, annotations=reservation_annotations(
        f"GPU-{NODE}-0", {"main": 2000}, 0)))
    assert int(b["metadata"]["resourceVersion"]) > rv_before  # the same history goes on
    assert ext.state.wait_for(lambda s: used(ext) == [5000], 60), f"after the restart: {used(ext)}"
    # a bound pod's deletion is graceful on a real API server: it stays, terminating, until its kubelet says its
    # containers are gone (none here), and its memory stays charged meanwhile (the stand-in removed it at once)
    gone = cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/a")
    assert gone["metadata"]["deletionTimestamp"]
    rv = int(gone["metadata"]["resourceVersion"])
    assert ext.state.wait_for(lambda s: (r := s.pod(NS, "a")) is not None and r.rv >= rv, 60)
    assert used(ext) == [5000]
    cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/a?gracePeriodSeconds=0")  # what the kubelet's report does
    assert ext.state.wait_for(lambda s: used(ext) == [2000], 60), f"the deletion: {used(ext)}"
    assert ext.state.synced
    # and the extender still places and binds through the restarted server
    c = create(cluster, pod_obj("c", {"main": 8000}, ns=NS))
    assert ext.state.wait_for(lambda s: s.pod(NS, "c") is not None, 30)
    assert client.filter(c, [NODE])["NodeNames"] == [NODE]
    assert client.bind(c, NODE) == ""
    assert ext.state.wait_for(lambda s: used(ext) == [10000], 60), used(ext)
    d = create(cluster, pod_obj("d", {"main": 1}, ns=NS))
    assert ext.state.wait_for(lambda s: s.pod(NS, "d") is not None, 30)
    assert client.filter(d, [NODE])["NodeNames"] == []  # full: nothing was double-counted or forgotten

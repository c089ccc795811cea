"""The agent's ResourceSlice publisher against the real kube-apiserver (the session's, resource.k8s.io/v1 with
DRAConsumableCapacity on): what the API server does with what the publisher sends is the point here — names
generated from generateName, quantities stored canonical, strict validation of the device entries, a slice
found again by field selector, a rolling update's two writers. (The publisher's reactions to a torn watch and
compacted versions need fault hooks: tests/dra/test_dra_decisions.py, on the stand-in.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kube_real import RealCluster
from test_dra_decisions import GPU

from memslice.kube.config import load_api_client
from memslice.plugin.dra.kube import DraApi
from memslice.plugin.dra.slices import Pci, SlicePublisher, generate_name, slice_spec

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kube")]

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture(scope="module")
def real(real_cluster: RealCluster) -> Iterator[tuple[RealCluster, DraApi]]:
    api, how = load_api_client(str(real_cluster.admin_kubeconfig))
    assert api is not None, how
    yield real_cluster, DraApi(api)


def mine(cluster: RealCluster, node: str) -> list[dict[str, Any]]:
    return list(cluster.ok("GET", f"{SLICES}?fieldSelector=spec.nodeName={node}")["items"])


def publisher(api: DraApi, node: str, healthy: dict[str, bool], version: str = "570.1", **kw: Any) -> SlicePublisher:
    return SlicePublisher(api, node, lambda: [GPU], lambda: healthy, version, lambda: "u1", watch=False, **kw)


def test_publisher_keeps_one_slice_found_by_selector_and_bumps_the_generation_only_on_change(real) -> None:
    cluster, api = real
    node, healthy = "pub-keeps-one", {GPU.uuid: True}
    for name, gen in ((f"{node}-memslice.io-x7k2p", 4), (f"{node}-memslice.io", 2), ("pub-other-memslice.io", 0)):
        n = node if name.startswith(node) else "pub-other"
        cluster.ok("POST", SLICES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                    "metadata": {"name": name}, "spec": slice_spec(n, [GPU], healthy, None, gen)})
    pub = publisher(api, node, healthy)
    assert pub.sync_once() == "updated"  # the newest generation is kept (in place), the other deleted
    [kept] = mine(cluster, node)
    assert kept["metadata"]["name"] == f"{node}-memslice.io-x7k2p" == pub.name
    assert kept["spec"]["pool"]["generation"] == 5
    assert kept["metadata"]["ownerReferences"][0]["uid"] == "u1"
    cap = kept["spec"]["devices"][0]["capacity"]["memory"]
    assert (cap["value"], cap["requestPolicy"]["validRange"]["max"]) == ("141Gi", "141Gi")  # stored canonical
    assert pub.sync_once() == "unchanged"  # what the server stored equals what the publisher wants
    healthy[GPU.uuid] = False
    assert pub.sync_once() == "updated"
    [s] = mine(cluster, node)
    assert s["spec"]["pool"]["generation"] == 6
    assert s["spec"]["devices"][0]["taints"][0]["key"] == "memslice.io/unhealthy"  # DRADeviceTaints kept it
    assert pub.sync_once() == "unchanged"
    assert [x["metadata"]["name"] for x in mine(cluster, "pub-other")] == ["pub-other-memslice.io"]  # kept


@pytest.mark.parametrize("node", [".".join(["n" * 63] * 3) + "." + "n" * 61, "a" * 50 + "." + "b" * 20,
                                  "x" * 240, "y" * 241 + ".z"])
def test_generated_slice_names_are_accepted_for_any_node_name(real, node) -> None:
    """Issue 24.3: `<node>-memslice.io` is over 253 characters for a node name over 241, and the API server
    validates generateName itself before cutting it to 58 characters + 5."""
    cluster, api = real
    pub = publisher(api, node, {GPU.uuid: True})
    assert pub.sync_once() == "created"
    [s] = mine(cluster, node)
    prefix = generate_name(node)
    assert len(prefix) <= 58 and s["metadata"]["name"].startswith(prefix) and len(s["metadata"]["name"]) == \
        len(prefix) + 5
    assert pub.sync_once() == "unchanged"  # found again by selector, not by name


def test_the_slice_with_every_field_passes_strict_validation_as_sent(real) -> None:
    """What the agent publishes at its fullest (PCI attributes, a device taint, both capacities with their
    request policies) is a valid resource.k8s.io/v1 ResourceSlice for the real API server with
    fieldValidation=Strict (an unknown or misspelt field fails), and is stored as sent."""
    cluster, api = real
    node, healthy = "pub-strict", {GPU.uuid: False}
    spec = slice_spec(node, [GPU], healthy, "570.133.07", 0, {GPU.uuid: Pci("0000:3b:00.0", "pci0000:3a")})
    got = cluster.ok("POST", f"{SLICES}?fieldValidation=Strict", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-memslice.io"},
        "spec": spec})
    [taint] = got["spec"]["devices"][0].pop("taints")
    assert taint.pop("timeAdded") and [taint] == spec["devices"][0].pop("taints")  # the server stamps the time
    assert got["spec"] == spec
    pub = publisher(api, node, healthy, "570.133.07", pci={GPU.uuid: Pci("0000:3b:00.0", "pci0000:3a")})
    assert pub.sync_once() == "unchanged"


def test_during_a_rolling_update_the_old_instance_leaves_the_new_ones_slice_alone(real) -> None:
    """Issue 24.7: two agent versions publish different slices (here: a new driverVersion); the older instance
    defers to the newer one's write instead of rewriting it back at every change it sees."""
    cluster, api = real
    node, healthy = "pub-rolling", {GPU.uuid: True}
    old = publisher(api, node, healthy, "570.1", instance="old")
    assert old.sync_once() == "created"
    new = publisher(api, node, healthy, "580.2", instance="new")
    assert new.sync_once() == "updated"
    for _ in range(3):
        assert old.sync_once() == "deferred" and new.sync_once() == "unchanged"
    [s] = mine(cluster, node)
    assert s["spec"]["pool"]["generation"] == 1
    assert s["spec"]["devices"][0]["attributes"]["driverVersion"] == {"version": "580.2.0"}
    cluster.ok("DELETE", f"{SLICES}/{s['metadata']['name']}")  # the new one is gone (wiped): the old repairs
    assert old.sync_once() == "created"
    restarted = publisher(api, node, healthy, "570.1", instance="old")
    assert restarted.sync_once() == "unchanged"  # a restart with the same content writes nothing

"""The compute share in DRA mode (issue 33, items 2 and 6), the real node agent against the API and kubelet
stand-ins: each device of the ResourceSlice has a second consumable capacity, `compute` (100, a request that
names none consumes 0); NodePrepareResources reads a claim's `consumedCapacity.compute` and its GpuMemConfig
`computeLimit`, writes them into the container's read-only limits file, provisions the claim's slot in the GPU's
roster (the GPU's directory mounted read-only, the claim's slot read-write), and refuses by name a share over
100, compute requests over 100 on one GPU, and a computeLimit below the request; unprepare frees the slot. The
real allocator's side (two capacities allocated, a claim over 100 not) is tests/realcluster/test_real_dra.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kube_standin_dra as dra
from kube_standin import KubeApiStandin
from test_dra_node import DRIVER, make_claim, prepared_spec
from test_dra_node import world as world  # the fixture, shared

from memslice import compute

CONFIG = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig"}


def compute_claim(kube: KubeApiStandin, name: str, pct: int | str | None, limit: int | None = None) -> dict[str, Any]:
    """A claim of 1Gi on gpu-0 whose allocation consumed `pct` compute (as kube-scheduler writes it)."""
    cfg = {**CONFIG, "computeLimit": limit} if limit is not None else None
    c = make_claim(kube, name, "1Gi", **({"config": cfg} if cfg else {}))
    if pct is not None:
        c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["compute"] = str(pct)
    return kube.put(c)


def limits_of(mounts: dict[str, tuple[str, bool]]) -> dict[str, str]:
    text = Path(mounts["/run/memslice/limits"][0]).read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_the_slice_offers_compute_and_prepare_enforces_the_allocated_share(world) -> None:
    kube, node = world
    [sl] = node.slices()
    for d in sl["spec"]["devices"]:
        assert d["capacity"]["compute"] == {"value": "100", "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}
    a = compute_claim(kube, "a", 30, limit=60)
    b = compute_claim(kube, "b", 50)
    plain = compute_claim(kube, "plain", None)  # names no compute: best effort, no slot
    resp = node.kubelet.prepare(DRIVER, a, b, plain)
    (a_env, a_mounts), (_, b_mounts), (_, p_mounts) = (prepared_spec(node, resp, c) for c in (a, b, plain))
    uuid = a_env["NVIDIA_VISIBLE_DEVICES"]
    ka, kb, kp = limits_of(a_mounts), limits_of(b_mounts), limits_of(p_mounts)
    assert (ka["gpu_compute_request"], ka["gpu_compute_limit"], ka["compute_slot"]) == ("30", "60", "0"), ka
    assert (kb["gpu_compute_request"], kb["compute_slot"]) == ("50", "1") and "gpu_compute_limit" not in kb, kb
    assert ka["compute_dir"] == compute.CONTAINER_COMPUTE_DIR
    assert not any(k.startswith(("gpu_compute", "compute_")) for k in kp), kp
    gpu_dir, ro = a_mounts[f"{compute.CONTAINER_COMPUTE_DIR}/{uuid}"]
    assert ro and a_mounts[f"{compute.CONTAINER_COMPUTE_DIR}/{uuid}/slot-00"] == (f"{gpu_dir}/slot-00", False)
    assert f"{compute.CONTAINER_COMPUTE_DIR}/{uuid}" not in p_mounts
    host = Path(gpu_dir).parent
    assert compute.read_roster(host, uuid) == {0: compute.RosterEntry(0, 30, 60, 0),
                                               1: compute.RosterEntry(1, 50, None, 0)}
    # 30 + 50 + 21 > 100 on gpu-0: refused by name, nothing provisioned
    over = compute_claim(kube, "over", 21)
    entry = node.kubelet.prepare(DRIVER, over).claims[over["metadata"]["uid"]]
    assert "would prepare 101% compute requests on one GPU, over 100%" in entry.error, entry.error
    assert set(compute.read_roster(host, uuid) or {}) == {0, 1}
    # unprepare frees a's slot; a new claim takes it
    assert node.kubelet.unprepare(DRIVER, a).claims[a["metadata"]["uid"]].error == ""
    assert compute.read_roster(host, uuid) == {1: compute.RosterEntry(1, 50, None, 0)}
    c = compute_claim(kube, "c", 20)
    assert limits_of(prepared_spec(node, node.kubelet.prepare(DRIVER, c), c)[1])["compute_slot"] == "0"


def test_bad_compute_shares_are_refused_by_name_and_nothing_is_left(world) -> None:
    kube, node = world
    bad = {
        "limit below the request": (compute_claim(kube, "below", 50, limit=40),
                                    "computeLimit 40 is below the claim's compute request of 50"),
        "share over 100": (compute_claim(kube, "over", 101), "consumedCapacity.compute '101' is not a whole percent"),
        "fractional share": (compute_claim(kube, "frac", "1500m"), "'1500m' is not a whole percent"),
        "hostile share": (compute_claim(kube, "odd", "1e999999"), "is not a whole percent"),
        "limit over 100": (compute_claim(kube, "cap", 10, limit=101), "computeLimit=101 is not a whole percent"),
        "limit of 0": (compute_claim(kube, "zero", None, limit=0), "computeLimit=0 is not a whole percent"),
    }
    resp = node.kubelet.prepare(DRIVER, *(c for c, _ in bad.values()))
    for what, (claim, message) in bad.items():
        entry = resp.claims[claim["metadata"]["uid"]]
        assert message in entry.error and not entry.devices, (what, entry.error)
    assert node.left_behind() == {"regions": [], "cdi": [], "checkpoint": []}
    assert not list((node.regions.parent / "compute").glob("*/slot-*"))


def test_claims_without_compute_are_unchanged(world) -> None:
    """A claim allocated by a scheduler that wrote no consumedCapacity.compute (an older slice) is prepared as
    before: no compute keys, no slot."""
    kube, node = world
    claim = make_claim(kube, "old", "1Gi")
    assert "compute" not in claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    _, mounts = prepared_spec(node, node.kubelet.prepare(DRIVER, claim), claim)
    assert "compute_slot" not in limits_of(mounts)


def test_a_compute_claim_gets_its_pods_priority(world) -> None:
    """The pod's PriorityClass value orders who waits first: the agent reads the claim's consumer pod (as for
    an elastic claim) and writes its priority into the roster and the limits file."""
    kube, node = world
    pod = kube.put({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "hi", "namespace": "default"},
                    "spec": {"nodeName": "gpu-a", "priority": 500, "containers": [{"name": "lab", "image": "x"}]}})
    kube.put(dra.claim("hi", "1Gi"))
    claim = dra.allocate(kube, "default", "hi", "gpu-a", pod=pod)
    claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["compute"] = "25"
    claim = kube.put(claim)
    env, mounts = prepared_spec(node, node.kubelet.prepare(DRIVER, claim), claim)
    keys = limits_of(mounts)
    assert (keys["gpu_compute_request"], keys["priority"]) == ("25", "500"), keys
    host = Path(mounts[f"{compute.CONTAINER_COMPUTE_DIR}/{env['NVIDIA_VISIBLE_DEVICES']}"][0]).parent
    assert compute.read_roster(host, env["NVIDIA_VISIBLE_DEVICES"]) == {0: compute.RosterEntry(0, 25, None, 500)}

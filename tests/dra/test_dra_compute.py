"""The compute share in DRA mode (issue 33, items 2 and 6), the real node agent against the real kube-apiserver and the
kubelet stand-in: each device of the ResourceSlice has a second consumable capacity, `compute` (100, a request that
names none consumes 0); NodePrepareResources reads a claim's `consumedCapacity.compute` and its GpuMemConfig
`computeLimit`, writes them into the container's read-only limits file, provisions the claim's slot in the GPU's
roster (the GPU's directory mounted read-only, the claim's slot read-write), and refuses by name a share over 100,
compute requests over 100 on one GPU, and a computeLimit below the request; unprepare frees the slot. The real
allocator's side (two capacities allocated, a claim over 100 not) is tests/realcluster/test_real_dra.py's and
tests/dra/test_dra_allocator_real.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kube_standin_dra as dra
from test_dra_node import CLASS, DRIVER, KUBE, NODE, NS, make_claim, prepared_spec
from test_dra_node import standin_world as standin_world  # the fixtures, shared
from test_dra_node import world as world

from memslice import compute

CONFIG = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig"}


def compute_claim(kube: Any, name: str, pct: int | None, limit: int | None = None, edit: Any = None
                  ) -> dict[str, Any]:
    """A claim of 1Gi on gpu-0 asking `pct` compute (None: naming none), allocated by the stand-in's copy of the
    allocator, which consumes it as the real one does (tests/dra/test_dra_allocator_real.py)."""
    cfg = {**CONFIG, "computeLimit": limit} if limit is not None else None
    body = dra.claim(name, "1Gi", namespace=NS, class_name=CLASS, **({"config": cfg} if cfg else {}))
    if pct is not None:
        body["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["compute"] = str(pct)
    kube.put(body)
    return dra.allocate(kube, NS, name, NODE, edit=edit)


def forged(kube: Any, name: str, pct: str, limit: int | None = None) -> dict[str, Any]:
    """A claim whose result says it consumed `pct` compute, written by hand: what no real allocator writes (over
    100 on one GPU, not a whole percent), that the agent must refuse by name all the same."""
    return compute_claim(kube, name, None, limit, edit=lambda c: c["status"]["allocation"]["devices"]["results"][0][
        "consumedCapacity"].update(compute=pct))


def limits_of(mounts: dict[str, tuple[str, bool]]) -> dict[str, str]:
    text = Path(mounts["/run/memslice/limits"][0]).read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@KUBE
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
    # 30 + 50 + 21 > 100 on gpu-0 (the real allocator would not): refused by name, nothing provisioned
    over = forged(kube, "over", "21")
    entry = node.kubelet.prepare(DRIVER, over).claims[over["metadata"]["uid"]]
    assert "would prepare 101% compute requests on one GPU, over 100%" in entry.error, entry.error
    assert set(compute.read_roster(host, uuid) or {}) == {0, 1}
    # unprepare frees a's slot; a new claim takes it (a's and the refused claim's pods gone: deallocated)
    assert node.kubelet.unprepare(DRIVER, a).claims[a["metadata"]["uid"]].error == ""
    for gone in ("a", "over"):
        kube.delete("ResourceClaim", NS, gone)
    assert compute.read_roster(host, uuid) == {1: compute.RosterEntry(1, 50, None, 0)}
    c = compute_claim(kube, "c", 20)
    assert limits_of(prepared_spec(node, node.kubelet.prepare(DRIVER, c), c)[1])["compute_slot"] == "0"


def test_bad_compute_shares_are_refused_by_name_and_nothing_is_left(standin_world) -> None:
    """On the API stand-in: the real API server refuses to store a consumedCapacity that is no quantity."""
    kube, node = standin_world
    below, cap, zero = (compute_claim(kube, "below", 50, limit=40), compute_claim(kube, "cap", 10, limit=101),
                        compute_claim(kube, "zero", None, limit=0))
    forgeries = {"over": "101", "frac": "1500m", "odd": "1e999999"}
    forged_ = {n: compute_claim(kube, n, None) for n in forgeries}  # every claim allocated first, then forged
    for n, pct in forgeries.items():  # (in place: only the stand-in lets an allocation change)
        forged_[n]["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["compute"] = pct
        forged_[n] = kube.put(forged_[n])
    bad = {
        "limit below the request": (below, "computeLimit 40 is below the claim's compute request of 50"),
        "share over 100": (forged_["over"], "consumedCapacity.compute '101' is not a whole percent"),
        "fractional share": (forged_["frac"], "'1500m' is not a whole percent"),
        "hostile share": (forged_["odd"], "is not a whole percent"),
        "limit over 100": (cap, "computeLimit=101 is not a whole percent"),
        "limit of 0": (zero, "computeLimit=0 is not a whole percent"),
    }
    resp = node.kubelet.prepare(DRIVER, *(c for c, _ in bad.values()))
    for what, (claim, message) in bad.items():
        entry = resp.claims[claim["metadata"]["uid"]]
        assert message in entry.error and not entry.devices, (what, entry.error)
    assert node.left_behind() == {"regions": [], "cdi": [], "checkpoint": []}
    assert not list((node.regions.parent / "compute").glob("*/slot-*"))


@KUBE
def test_claims_without_compute_are_unchanged(world) -> None:
    """A claim allocated from an older slice (a device with no compute capacity: the scheduler wrote no
    consumedCapacity.compute; written by hand here) is prepared as before: no compute keys, no slot."""
    kube, node = world
    claim = make_claim(kube, "old", "1Gi", edit=lambda c: c["status"]["allocation"]["devices"]["results"][0][
        "consumedCapacity"].pop("compute"))
    assert "compute" not in claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    _, mounts = prepared_spec(node, node.kubelet.prepare(DRIVER, claim), claim)
    assert "compute_slot" not in limits_of(mounts)


@KUBE
def test_a_compute_claim_gets_its_pods_priority(world) -> None:
    """The pod's PriorityClass value orders who waits first: the agent reads the claim's consumer pod (as for
    an elastic claim) and writes its priority into the roster and the limits file."""
    kube, node = world
    pod = kube.put({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "hi", "namespace": NS},
                    "spec": {"nodeName": "gpu-a", "priority": 500, "containers": [{"name": "lab", "image": "x"}]}})
    kube.put(dra.claim("hi", "1Gi", namespace=NS, class_name=CLASS))
    claim = dra.allocate(kube, NS, "hi", "gpu-a", pod=pod, edit=lambda c: c["status"]["allocation"]["devices"][
        "results"][0]["consumedCapacity"].update(compute="25"))
    env, mounts = prepared_spec(node, node.kubelet.prepare(DRIVER, claim), claim)
    keys = limits_of(mounts)
    assert (keys["gpu_compute_request"], keys["priority"]) == ("25", "500"), keys
    host = Path(mounts[f"{compute.CONTAINER_COMPUTE_DIR}/{env['NVIDIA_VISIBLE_DEVICES']}"][0]).parent
    assert compute.read_roster(host, env["NVIDIA_VISIBLE_DEVICES"]) == {0: compute.RosterEntry(0, 25, None, 500)}

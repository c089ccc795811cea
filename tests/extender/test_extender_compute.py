"""The compute share in the extender (issue 33, items 2 and 6), over real HTTP against the API stand-in: a pod
asking for `memslice.io/gpu-compute` is placed only on a GPU with room for its memory AND its compute (the
requests of a GPU's pods add up to at most 100), a GPU with memory free but compute full is never chosen,
bin-packing and spreading weigh both, bind records the shares (`memslice.io/gpu-compute-pct`), a restarted
extender rebuilds the compute sums from them, preemption counts the victims' compute, and a share over 100,
a limit below the request or a compute share without memory are refused by name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_extender_support import Cluster, node_obj, pod_obj, running_cluster

from memslice import contract
from memslice.scheduler_extender.placement import decisions
from memslice.scheduler_extender.placement.resources import RequestError, pod_request
from memslice.scheduler_extender.placement.views import GpuView, NodeView

COMPUTE = "memslice.io/gpu-compute"


def shared(name: str, mib: int, pct: int | None, limit: str | None = None, **kw: Any) -> dict[str, Any]:
    """A one-container pod asking for `mib` MiB and `pct` percent of the GPU's time (limit: the annotation)."""
    pod = pod_obj(name, {"main": mib}, annotations={contract.ANN_GPU_COMPUTE_LIMIT: limit} if limit else None, **kw)
    if pct is not None:
        pod["spec"]["containers"][0]["resources"]["limits"][COMPUTE] = str(pct)
    return pod


def reserved(cl: Cluster, name: str) -> dict[str, str]:
    return cl.kube.get("Pod", "default", name)["metadata"].get("annotations") or {}


def compute_sums(cl: Cluster, node: str) -> dict[str, int]:
    view = cl.state.view(node)
    assert view is not None
    return view.compute_used()


def test_memory_and_compute_must_fit_on_the_same_gpu() -> None:
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n", [16384, 32768]))
        hog = cl.add_pod(shared("hog", 4096, 80))
        assert cl.c.bind(hog, "n") == ""
        assert reserved(cl, "hog")[contract.ANN_GPU_UUID] == "GPU-n-0"
        assert json.loads(reserved(cl, "hog")[contract.ANN_GPU_COMPUTE]) == {"main": [80, None]}
        cl.wait_used("n", [4096, 0])
        assert compute_sums(cl, "n") == {"GPU-n-0": 80}
        # 3 GiB and 30 %: GPU 0 has the memory and binpack on memory would take it (the least free), but its
        # compute is full: GPU 1
        plain = cl.add_pod(shared("plain", 3072, None))  # the same pod without a share: GPU 0
        assert cl.c.prioritize(plain, ["n"])["n"] == round(10 * (4096 + 3072) / 16384)
        pod = cl.add_pod(shared("p", 3072, 30))
        assert cl.c.filter(pod, ["n"])["NodeNames"] == ["n"]
        assert cl.c.bind(pod, "n") == ""
        assert reserved(cl, "p")[contract.ANN_GPU_UUID] == "GPU-n-1"
        cl.wait_used("n", [4096, 3072])
        assert compute_sums(cl, "n") == {"GPU-n-0": 80, "GPU-n-1": 30}
        # 1 GiB and 20 %: both GPUs have room; binpack on both takes GPU 0 (left: 11/16 of memory and no
        # compute, against 28/32 and 50 %)
        pod = cl.add_pod(shared("q", 1024, 20))
        assert cl.c.bind(pod, "n") == "" and reserved(cl, "q")[contract.ANN_GPU_UUID] == "GPU-n-0"
        cl.wait_used("n", [5120, 3072])
        # 1 GiB and 50 %: GPU 0's compute is full (100 %), GPU 1 has 70 % left
        pod = cl.add_pod(shared("r", 1024, 50))
        assert cl.c.bind(pod, "n") == "" and reserved(cl, "r")[contract.ANN_GPU_UUID] == "GPU-n-1"
        cl.wait_used("n", [5120, 4096])
        assert compute_sums(cl, "n") == {"GPU-n-0": 100, "GPU-n-1": 80}
        # 1 GiB and 30 %: memory free on both GPUs, compute on neither: refused by name, at every verb
        pod = cl.add_pod(shared("s", 1024, 30))
        result = cl.c.filter(pod, ["n"])
        assert result["NodeNames"] == [], result
        reason = result["FailedNodes"]["n"]
        assert "pod needs 30 percent compute (memslice.io/gpu-compute)" in reason, reason
        assert "over 100 percent" in reason, reason
        assert cl.c.prioritize(pod, ["n"])["n"] == 0
        error = cl.c.bind(pod, "n")
        assert "no longer fits on node n" in error and "30 percent compute" in error, error
        assert contract.ANN_GPU_UUID not in reserved(cl, "s")
        # a pod without a compute share still goes where the memory is (best effort)
        assert cl.c.filter(plain, ["n"])["NodeNames"] == ["n"]
        assert cl.c.bind(plain, "n") == "" and contract.ANN_GPU_COMPUTE not in reserved(cl, "plain")


def test_binpack_and_spread_weigh_memory_and_compute() -> None:
    # GPU 0: 8 GiB used, compute free; GPU 1: 2 GiB used, 70 % compute taken
    view = NodeView.of("n", 1, (GpuView.of("G0", 0, "Sim", 16384, True, 8192),
                                GpuView.of("G1", 1, "Sim", 16384, True, 2048)), compute=(0, 70))
    # free after a 1 GiB / 20 % pod: G0 7/16 + 80/100 = 1.24, G1 13/16 + 10/100 = 0.91
    assert decisions.choose_gpu(view, 1024, "binpack", None, 20).uuid == "G1"  # type: ignore[union-attr]
    assert decisions.choose_gpu(view, 1024, "spread", None, 20).uuid == "G0"  # type: ignore[union-attr]
    assert decisions.choose_gpu(view, 1024, "binpack").uuid == "G0"  # type: ignore[union-attr]  # memory alone
    # scores: the mean of the two fractions used (binpack) or free (spread) on the chosen GPU
    assert decisions.score(view, 1024, "binpack", None, 20) == round(10 * (1 - 0.91 / 2))
    assert decisions.score(view, 1024, "spread", None, 20) == round(10 * 1.24 / 2)
    assert decisions.choose_gpu(view, 1024, "binpack", None, 31).uuid == "G0"  # type: ignore[union-attr]
    assert decisions.verdict(view, 1024, "binpack", None, 100)[:2] == (True, False)
    full = NodeView.of("n", 1, view.gpus, compute=(100, 100))
    assert decisions.verdict(full, 1024, "binpack", None, 1)[:2] == (False, False)
    assert decisions.choose_gpu(full, 1024, "binpack", None, 1) is None
    assert decisions.fits_without(full, 1024, {}, 0, None, None, 1, {"G1": 40})


def test_spread_pods_land_on_the_gpu_with_most_of_both_free() -> None:
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n", [16384, 16384, 16384]))
        names = []
        for i in range(6):  # 6 pods of 2 GiB and 30 %: each GPU takes two (60 %), never three (90 % fits
            pod = cl.add_pod(shared(f"s{i}", 2048, 30, policy="spread"))  # but spread prefers the emptier)
            assert cl.c.bind(pod, "n") == ""
            cl.caught_up()
            names.append(reserved(cl, f"s{i}")[contract.ANN_GPU_UUID])
        assert sorted(names.count(f"GPU-n-{g}") for g in range(3)) == [2, 2, 2]
        assert compute_sums(cl, "n") == {f"GPU-n-{g}": 60 for g in range(3)}
        # binpack fills compute too: 40 % goes to one GPU with 60 % taken, leaving it at 100
        pod = cl.add_pod(shared("b", 1024, 40))
        assert cl.c.bind(pod, "n") == ""
        cl.caught_up()
        assert sorted(compute_sums(cl, "n").values()) == [60, 60, 100]


def test_a_restarted_extender_rebuilds_the_compute_sums_from_the_annotations() -> None:
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n", [16384]))
        pod = cl.add_pod(shared("a", 1024, 70, limit="90"))
        assert cl.c.bind(pod, "n") == ""
        assert json.loads(reserved(cl, "a")[contract.ANN_GPU_COMPUTE]) == {"main": [70, 90]}
        cl.stop()
        cl.start()  # a new extender: its state from the API server alone
        cl.caught_up()
        assert compute_sums(cl, "n") == {"GPU-n-0": 70}
        pod = cl.add_pod(shared("b", 1024, 31))
        assert "31 percent compute" in cl.c.filter(pod, ["n"])["FailedNodes"]["n"]


def test_preemption_counts_the_victims_compute() -> None:
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n", [16384]))
        low = cl.add_pod(shared("low", 1024, 60))
        assert cl.c.bind(low, "n") == ""
        other = cl.add_pod(shared("other", 1024, 30))
        assert cl.c.bind(other, "n") == ""
        cl.caught_up()
        uid = {n: cl.kube.get("Pod", "default", n)["metadata"]["uid"] for n in ("low", "other")}
        high = cl.add_pod(shared("high", 1024, 50))

        def preempt(victims: list[str]) -> dict[str, Any]:
            body = {"Pod": high, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": uid[v]} for v in victims],
                                                                 "NumPDBViolations": 0}}}
            status, answer = cl.c.post("preempt", body)
            assert status == 200, answer
            return answer["NodeNameToMetaVictims"] or {}

        assert preempt(["other"]) == {}  # 60 + 50 > 100: evicting the 30 % pod is not enough
        assert list(preempt(["low"])) == ["n"]  # 30 + 50 fits once the 60 % pod is gone


def no_memory() -> dict[str, Any]:
    pod = shared("nomem", 1024, None)
    pod["spec"]["containers"][0]["resources"]["limits"] = {COMPUTE: "20"}
    return pod


@pytest.mark.parametrize(("pod", "named"), [
    (shared("over", 1024, 101), "memslice.io/gpu-compute=101 is over 100 percent of one GPU"),
    (shared("below", 1024, 50, limit="40"), "memslice.io/gpu-compute-limit=40 is below the compute request of 50"),
    (shared("limit", 1024, 50, limit="150"), "memslice.io/gpu-compute-limit='150' is not a whole percent"),
    (no_memory(), "asks for memslice.io/gpu-compute without memslice.io/gpu-mem"),
])
def test_bad_shares_are_refused_by_name(pod: dict[str, Any], named: str) -> None:
    with pytest.raises(RequestError) as exc:
        pod_request(pod)
    assert named in str(exc.value), exc.value
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n", [16384]))
        result = cl.c.filter(cl.add_pod(pod), ["n"])
        assert not result["NodeNames"] and named in result["Error"], result


def test_init_containers_and_per_container_limits() -> None:
    pod = pod_obj("p", {"a": 1000, "b": 1000}, init={"i": 500},
                  annotations={contract.ANN_GPU_COMPUTE_LIMIT: "60", f"{contract.ANN_GPU_COMPUTE_LIMIT}.b": "30"})
    for c, pct in zip(pod["spec"]["containers"], (40, 10), strict=True):
        c["resources"]["limits"][COMPUTE] = str(pct)
    pod["spec"]["initContainers"][0]["resources"]["limits"][COMPUTE] = "55"
    req = pod_request(pod)
    assert req is not None and req.compute == 55  # the init container runs alone: max(55, 40 + 10)
    assert req.compute_record() == (contract.ComputeShare("a", 40, 60), contract.ComputeShare("b", 10, 30),
                                    contract.ComputeShare("i", 55, 60))

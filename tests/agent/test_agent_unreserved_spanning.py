"""Device-plugin mode, a pod asking for several GPUs (memslice.io/gpu-count, issue 34) bound WITHOUT the extender's
reservation (another scheduler, spec.nodeName by hand): the node agent as a process, the kubelet stand-in over real
gRPC on the plugin's Unix socket, the node's pods from the API stand-in's pod watch. Its devices would all come from
one GPU, so Allocate refuses them by name (the kubelet's UnexpectedAdmissionError), as it does for a reserved one
whose reserved GPUs the agent finds short; a one-GPU pod that could be the caller is never refused."""

from __future__ import annotations

import json

import pytest
from kubelet_standin import AdmissionError
from test_plugin_agent import RESOURCE
from test_plugin_agent import short_tmp as short_tmp  # the fixture, shared
from test_plugin_kube import NS, pod, published, uid_of
from test_plugin_kube import standin as standin  # the fixture, shared


def reserved(name: str, uuids: str, total: int, count: int) -> dict:
    """A pod bound to the node with the extender's reservation on `uuids`, its container asking `total` devices (4
    MiB each) over `count` GPUs."""
    body = unreserved(name, total, count if count > 1 else None)
    body["metadata"]["annotations"].update({"memslice.io/gpu-uuid": uuids,
                                            "memslice.io/gpu-mem-mib": json.dumps({"main": total * 4}),
                                            "memslice.io/assumed-at": "2026-11-21T00:00:00Z"})
    return body


def unreserved(name: str, total: int, count: int | None = None) -> dict:
    """A pod bound to the node with no reservation, its container asking `total` devices over `count` GPUs."""
    body = pod(name, None, {"main": 0})
    body["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: str(total)}}
    if count is not None:
        body["metadata"]["annotations"]["memslice.io/gpu-count"] = str(count)
    return body


def test_a_spanning_pod_bound_without_a_reservation_is_refused_at_allocate_by_name(standin):
    api, kubelet, make = standin
    api.put(unreserved("tp", 512, 2))  # 2048 MiB in 4 MiB devices, over two GPUs
    agent = make(sim_gpus="8GiB,8GiB", unit_mib=4)
    gpus, _ = published(api, agent)
    agent.wait_log("pod watch: 1 pods", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    uid = uid_of(api, "tp")
    with pytest.raises(AdmissionError) as exc:
        kubelet.admit(uid, NS, "tp", [("main", 512)], RESOURCE)
    msg = str(exc.value)
    for words in (f"UnexpectedAdmissionError: pod {NS}/tp container 'main' asks for 2048 MiB over 2 GPUs "
                  f"(memslice.io/gpu-count=2)", "no memslice.io/gpu-uuid annotation",
                  "the program would see 1 GPU, not 2",
                  "Schedule it with the memslice extender (spec.schedulerName: memslice-scheduler",
                  "or drop memslice.io/gpu-count"):
        assert words in msg, msg
    assert not list(agent.region_root.glob("*.json"))  # nothing handed out, nothing charged
    assert agent.sample("memslice_allocate_errors_total") == [1.0]
    assert agent.sample("memslice_gpu_allocated_mib", gpu="0") == agent.sample("memslice_gpu_allocated_mib",
                                                                               gpu="1") == [0.0]
    log = agent.log()
    assert f"Allocate refused: pod {NS}/tp container 'main'" in log
    assert f"pod {NS}/tp spans 2 GPUs: Allocate refuses one GPU for it" in log  # GetPreferredAllocation's line
    # scheduled again through the extender (its reservation on both GPUs): the pod gets its two GPUs
    a, b = gpus[0]["uuid"], gpus[1]["uuid"]
    api.put(reserved("tp", f"{b},{a}", 512, 2))
    agent.wait_log(f"{NS}/tp: the extender reserved GPU", "the reservation through the pod watch")
    resp = kubelet.admit(uid_of(api, "tp"), NS, "tp", [("main", 512)], RESOURCE)["main"]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{b},{a}"
    assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == "1024"  # per GPU


def test_a_one_gpu_pod_of_the_same_size_beside_it_is_never_refused(standin):
    """Allocate carries no pod: devices of the size both ask for may be either's, and the one-GPU pod must never be
    refused for the other. Once its container holds its devices (the kubelet's PodResources names it), the same
    size can only be the spanning pod's, which is refused."""
    api, kubelet, make = standin
    api.put(unreserved("tp", 512, 2))
    api.put(unreserved("one", 512))
    agent = make(sim_gpus="8GiB,8GiB", unit_mib=4)
    published(api, agent)
    agent.wait_log("pod watch: 2 pods", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    one = uid_of(api, "one")
    resp = kubelet.admit(one, NS, "one", [("main", 512)], RESOURCE)["main"]
    assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == "2048"
    assert len({i.split("-")[0] for i in kubelet.pods[one].containers["main"][RESOURCE]}) == 1
    agent.wait_log(f"is {NS}/one/main's (learnt from the PodResources API)", "the owner from PodResources")
    with pytest.raises(AdmissionError, match=f"pod {NS}/tp container 'main' asks for 2048 MiB"):
        kubelet.admit(uid_of(api, "tp"), NS, "tp", [("main", 512)], RESOURCE)
    assert len(list(agent.region_root.glob("*.json"))) == 1  # the one-GPU pod's only


def test_a_reserved_spanning_pod_whose_gpus_are_short_is_refused_rather_than_given_one_gpu(standin):
    """The extender reserved two GPUs, but this agent finds one of them without the pod's share free (its own
    record disagrees): the preference falls back to one GPU's best fit, and Allocate refuses it by name."""
    api, kubelet, make = standin
    agent = make(sim_gpus="8GiB,8GiB", unit_mib=4)
    gpus, _ = published(api, agent)
    a, b = gpus[0]["uuid"], gpus[1]["uuid"]
    api.put(reserved("big", b, 2000, 1))  # 8000 MiB: GPU 1 keeps 48 of its 2048 devices free
    api.put(reserved("tp", f"{a},{b}", 512, 2))  # 256 devices on each
    agent.wait_log(f"{NS}/tp: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    kubelet.admit(uid_of(api, "big"), NS, "big", [("main", 2000)], RESOURCE)
    with pytest.raises(AdmissionError) as exc:
        kubelet.admit(uid_of(api, "tp"), NS, "tp", [("main", 512)], RESOURCE)
    assert (f"pod {NS}/tp container 'main' asks for 2048 MiB over 2 GPUs, reserved on {a}, {b}, but this node's "
            f"agent found a reserved GPU short of free units") in str(exc.value)
    assert "Delete the pod so that the memslice extender schedules it again" in str(exc.value)
    assert f"GPU {b} reserved for {NS}/tp has only 48 free units, wanted 256" in agent.log()
    assert len(list(agent.region_root.glob("*.json"))) == 1  # "big"'s only

"""Device-plugin mode, a pod spanning two GPUs on a real node (issue 34, item 1, with the real components): the real
kube-scheduler places a `memslice.io/gpu-count: "2"` pod through the extender on a node of two simulated GPUs (an
NVLink pair); the real kubelet asks the agent's GetPreferredAllocation for the pod's devices (half from each
reserved GPU) and calls Allocate; containerd and runc start the container with the answer, which sees the two GPUs
in the reservation's order, each held by the shim to the pod's share (a CUDA program on each, in turn); the
kubelet's checkpoint and the agent's ledger agree, and deleting the pod gives both GPUs their share back."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from kube_node import CONTEXT_MIB, pod
from kube_node_images import TEST_IMAGE
from kube_real import RealCluster, wait_until
from test_deploy_render import RESOURCE, SCHEDULER_NAME
from test_realnode_deviceplugin import World, checkpoint_devices, device_plugin_world

from memslice.contract import ANN_GPU_COUNT
from memslice.plugin.regions import CONTAINER_SHIM

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("kube-dra")]  # one real node at a time
NODE = "kubelet-dp2"
NS = "realnode-dp2"
UNIT = 4  # MiB per device
GPUS = "3GiB,3GiB;nvlink=0-1"
SHARE_MIB = 1024  # on each GPU; the pod asks for twice that
# Each GPU in turn: the driver's device 0, then (CUDA_VISIBLE_DEVICES=1) the second GPU as device 0.
SCRIPT = """
echo "preload=$(cat /etc/ld.so.preload)"
echo "limit-env=$MEMSLICE_GPU_MEM_LIMIT visible=$NVIDIA_VISIBLE_DEVICES"
echo gpu=0; /bin/alloc_direct 400 200 100; echo "gpu0-exit=$?"
echo gpu=1; CUDA_VISIBLE_DEVICES=1 /bin/alloc_direct 400 200 100; echo "gpu1-exit=$?"
echo client-exit=0
exec sleep 100000
"""


@pytest.fixture(scope="module")
def world(real_cluster: RealCluster, cbin: dict[str, str]) -> Iterator[World]:
    with device_plugin_world(real_cluster, cbin, "rn2", NODE, NS, GPUS, 2 * 3 * 1024 // UNIT, []) as w:
        yield w


def test_a_two_gpu_pod_runs_on_both_gpus_each_held_to_its_share(world: World) -> None:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "tp", "namespace": NS, "annotations": {ANN_GPU_COUNT: "2"}},
            "spec": {"schedulerName": SCHEDULER_NAME, "hostNetwork": True, "automountServiceAccountToken": False,
                     "nodeSelector": {"kubernetes.io/hostname": NODE}, "terminationGracePeriodSeconds": 1,
                     "restartPolicy": "Never",
                     "containers": [{"name": "cuda", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", SCRIPT],
                                     "resources": {"limits": {RESOURCE: str(2 * SHARE_MIB // UNIT)}}}]}}
    world.cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", body)
    p = world.node.running_client(NS, "tp", world.alive)
    assert p["spec"]["nodeName"] == NODE
    uuids = p["metadata"]["annotations"]["memslice.io/gpu-uuid"].split(",")
    assert len(set(uuids)) == 2, uuids
    out = world.node.pod_log(p, "cuda")
    assert f"preload={CONTAINER_SHIM}" in out, out
    assert f"limit-env={SHARE_MIB} visible={','.join(uuids)}" in out, out  # the reservation's order, per-GPU quota
    stdout = world.node.pod_log(p, "cuda", "stdout")
    # on each GPU: its context and 400 MiB fit in the share, 200 more do not, 100 more do; each GPU's total is
    # the share, whichever of the two the process uses
    per_gpu = r"alloc 400 MiB -> 0\nalloc 200 MiB -> 2\nalloc 100 MiB -> 0\n" \
              rf"info free={SHARE_MIB - CONTEXT_MIB - 500} total={SHARE_MIB} devtotal={SHARE_MIB}\n"
    assert re.search(rf"gpu=0\ninit 0\n{per_gpu}.*gpu0-exit=0\ngpu=1\ninit 0\n{per_gpu}.*gpu1-exit=0", stdout,
                     re.S), stdout
    # the kubelet took the agent's preference (half on each reserved GPU), then allocated them as one container
    log = world.agent.output.text()
    assert f"GetPreferredAllocation: {2 * SHARE_MIB // UNIT} units -> GPU " in log, log
    assert re.search(rf"Allocate: {SHARE_MIB} MiB of GPU [01],[01] \({','.join(uuids)}\) for {NS}/tp/cuda, region ",
                     log), log
    held = checkpoint_devices()[p["metadata"]["uid"]]
    assert len(held) == 2 * SHARE_MIB // UNIT
    assert len({i.split("-")[0] for i in held}) == 2  # device IDs of both GPUs, half each
    gauge = world.agent.gauge("memslice_gpu_allocated_mib")
    # one entry for the container, however the kubelet's record orders its IDs (no second one "recovered")
    assert [gauge[u] for u in uuids] == [SHARE_MIB, SHARE_MIB], (gauge, [ln for ln in log.splitlines()
                                                                        if "recovered" in ln])

    world.cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/tp")
    wait_until("the pod gone and both GPUs' shares back", lambda: pod(world.cluster, NS, "tp") is None and all(
        world.agent.gauge("memslice_gpu_allocated_mib").get(u, 0) == 0 for u in uuids), 120, 0.5, world.alive)

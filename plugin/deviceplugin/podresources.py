"""Client of the kubelet's PodResources API: what the kubelet recorded as allocated, per container."""

from __future__ import annotations

from pathlib import Path

import grpc

from memslice.proto import podresources_pb2, podresources_pb2_grpc

from .allocator import RESOURCE_NAME
from .reconcile import LiveContainer

# List returns every pod's devices; with one device per MiB that can be large.
MAX_RECEIVE_BYTES = 64 * 1024 * 1024


class PodResourcesClient:
    def __init__(self, socket: Path, timeout_s: float = 5.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s

    def available(self) -> bool:
        return self.socket.exists()

    def live_containers(self) -> list[LiveContainer]:
        """Every container holding devices of memslice.io/gpu-mem; raises grpc.RpcError or OSError."""
        if not self.socket.exists():
            raise FileNotFoundError(f"{self.socket} does not exist")
        with grpc.insecure_channel(f"unix:{self.socket}",
                                   options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]) as ch:
            resp = podresources_pb2_grpc.PodResourcesListerStub(ch).List(
                podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        out = []
        for pod in resp.pod_resources:
            for c in pod.containers:
                ids = tuple(i for d in c.devices if d.resource_name == RESOURCE_NAME for i in d.device_ids)
                if ids:
                    out.append(LiveContainer(namespace=pod.namespace, pod=pod.name, container=c.name,
                                             device_ids=ids))
        return out

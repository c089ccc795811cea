"""The second DevicePlugin service: `memslice.io/gpu-compute`, on its own socket.

The kubelet counts a node's compute share with it: 100 devices per GPU, one per percent (devices.py,
`c<gpu-index>-<n>`), healthy as the GPU is. Which GPU a container's share is on, and the share itself, are
the extender's reservation (`memslice.io/gpu-compute-pct`, on the GPU of the container's memory): the memory
Allocate writes them into the container's read-only limits file and provisions the compute slot
(DevicePluginService._record). So this Allocate only checks the IDs are ours and answers an empty response:
the kubelet needs one per container, and nothing in it may contradict the limits file.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator

import grpc

from memslice.proto import api_pb2, api_pb2_grpc

from ..gpu.nvml import GpuInfo
from ..metrics import Metrics
from .devices import COMPUTE_PER_GPU, HEALTHY, UNHEALTHY, DeviceIdError, bounded_list, compute_id, parse_compute_id
from .state import PluginState

log = logging.getLogger(__name__)


def build_compute_list(gpus: Iterable[GpuInfo], healthy: dict[str, bool]) -> api_pb2.ListAndWatchResponse:
    """Every GPU's 100 compute devices, healthy as the GPU is, with its NUMA node."""
    resp = api_pb2.ListAndWatchResponse()
    for gpu in gpus:
        health = HEALTHY if healthy.get(gpu.uuid, False) else UNHEALTHY
        topology = (api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa)])
                    if gpu.numa is not None else None)
        resp.devices.extend(api_pb2.Device(ID=compute_id(gpu.index, n), health=health, topology=topology)
                            for n in range(COMPUTE_PER_GPU))
    return resp


def check_compute_ids(ids: list[str], gpu_indexes: set[int]) -> None:
    """DeviceIdError naming the first ID that is not one of ours (bad form, unknown GPU) or is repeated."""
    seen: set[str] = set()
    for text in ids:
        gpu, _ = parse_compute_id(text)
        if gpu not in gpu_indexes:
            raise DeviceIdError(f"compute device ID {text} names GPU {gpu}, which this node does not have "
                                f"(GPUs: {bounded_list([str(i) for i in sorted(gpu_indexes)], len(gpu_indexes))})")
        if text in seen:
            raise DeviceIdError(f"compute device ID {text} is requested twice")
        seen.add(text)


class ComputePluginService(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, state: PluginState, metrics: Metrics) -> None:
        self.state = state
        self.metrics = metrics
        self.closed = threading.Event()
        self._list: tuple[int, api_pb2.ListAndWatchResponse] | None = None

    def close(self) -> None:
        """End this instance's ListAndWatch streams (the server is being replaced)."""
        self.closed.set()
        with self.state.changed:
            self.state.changed.notify_all()

    def device_list(self) -> tuple[int, api_pb2.ListAndWatchResponse]:
        """The current list, built once per version of the node's state (health changes bump it)."""
        with self.state.lock:
            if self._list is None or self._list[0] != self.state.version:
                self._list = (self.state.version,
                              build_compute_list(self.state.gpus.values(), self.state.health.snapshot()))
            return self._list

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: grpc.ServicerContext
                               ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request: api_pb2.Empty, context: grpc.ServicerContext
                     ) -> Iterator[api_pb2.ListAndWatchResponse]:
        sent = [0]  # version last sent

        def due() -> bool:
            return self.state.version != sent[0] or self.closed.is_set()

        while not self.closed.is_set() and context.is_active():
            with self.state.changed:  # bounded: wakes at least every second to see a gone stream
                self.state.changed.wait_for(due, timeout=1.0)
            if self.closed.is_set():
                return
            if self.state.version != sent[0]:
                sent[0], resp = self.device_list()
                log.info("ListAndWatch (compute): sending %d devices (version %d)", len(resp.devices), sent[0])
                yield resp

    def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> api_pb2.PreferredAllocationResponse:
        return api_pb2.PreferredAllocationResponse()  # not offered (GetDevicePluginOptions)

    def Allocate(self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
                 ) -> api_pb2.AllocateResponse:
        indexes = set(self.state.gpus)
        out = api_pb2.AllocateResponse()
        for c in request.container_requests:
            ids = list(c.devices_ids)
            try:
                if len(ids) > COMPUTE_PER_GPU:
                    raise DeviceIdError(f"{len(ids)} compute devices requested for one container: a compute "
                                        f"share is at most 100 (one GPU); ask for memslice.io/gpu-compute <= 100")
                check_compute_ids(ids, indexes)
            except DeviceIdError as exc:
                self.metrics.allocate_errors.inc()
                log.warning("Allocate (compute) refused: %s", exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            out.container_responses.append(api_pb2.ContainerAllocateResponse())
        return out

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
                          ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

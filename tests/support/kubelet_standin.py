"""A kubelet stand-in for tests: the device manager's documented behaviour over real gRPC on Unix sockets.

Why hand-written: there is no kubelet on the test machines, and the behaviours the node agent must survive
(dial-back inside Register, the 4 MiB ListAndWatch limit, one Allocate per container, a restart that wipes
the socket directory) are exactly what a mock would hide. What it does, after docs/reference
kubernetes-apis.md §1-2:

- serves `v1beta1.Registration` on `<dir>/kubelet.sock`; Register checks the version and the resource name,
  then, still inside the call, dials the plugin's socket (blocking, 10 s) and calls GetDevicePluginOptions;
- reads `ListAndWatch` in the background with the kubelet's 4 MiB receive limit; each message replaces the
  device set; a stream that ends marks every device of the resource unhealthy (allocatable 0);
- `admit()` allocates a pod container by container: the IDs come from the healthy unallocated set, steered
  by GetPreferredAllocation when the plugin offers it (otherwise an arbitrary choice), then one Allocate per
  container; an error fails admission (UnexpectedAdmissionError);
- serves `v1.PodResourcesLister` (List, GetAllocatableResources) on its own socket from its allocations;
- `restart()`: the old kubelet goes away (its connections close), the socket directory is cleaned as
  CleanupPluginDirectory does (every non-directory file except the checkpoint), a fresh kubelet.sock
  appears; allocations survive (the checkpoint), registrations do not.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from memslice.proto import api_pb2, api_pb2_grpc, podresources_pb2, podresources_pb2_grpc

KUBELET_MAX_RECEIVE = 4 * 1024 * 1024  # grpc-go's default, which the kubelet keeps for plugin clients
CHECKPOINT = "kubelet_internal_checkpoint"
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/"
                        r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")


def is_extended_resource_name(name: str) -> bool:
    m = _QUALIFIED.match(name)
    if not m:
        return False
    domain, short = m.group(1), m.group(5)
    return (domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")
            and not short.startswith("requests."))


class AdmissionError(RuntimeError):
    """The pod would fail with UnexpectedAdmissionError."""


@dataclass
class Endpoint:
    resource: str
    socket: Path
    options: api_pb2.DevicePluginOptions
    channel: grpc.Channel
    stub: api_pb2_grpc.DevicePluginStub
    devices: dict[str, api_pb2.Device] = field(default_factory=dict)
    messages: int = 0
    last_message_bytes: int = 0
    stream_error: grpc.RpcError | None = None
    stopped: bool = False
    seq: int = 0  # the kubelet's registration count when this endpoint registered (1 for the first)


@dataclass
class PodRecord:
    uid: str
    namespace: str
    name: str
    containers: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # container -> resource -> ids
    responses: dict[str, api_pb2.ContainerAllocateResponse] = field(default_factory=dict)


class KubeletStandin:
    def __init__(self, plugin_dir: Path, pod_resources_socket: Path, seed: int = 0) -> None:
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.kubelet_socket = plugin_dir / "kubelet.sock"
        self.rng = random.Random(seed)
        self.cond = threading.Condition()
        self.endpoints: dict[str, Endpoint] = {}
        self.pods: dict[str, PodRecord] = {}
        self.registrations = 0
        self.register_errors: list[str] = []
        self.reject_registrations = 0  # refuse the next N Register calls (after the dial-back)
        self.reject_only: str | None = None  # ... of this resource only (None: of any)
        self.preferred_calls = 0
        self.call_seconds: dict[str, list[float]] = {"GetPreferredAllocation": [], "Allocate": []}
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None
        self.list_calls = 0  # PodResources List calls begun
        self.lists_held = 0  # List calls held now (held_lists)
        self._list_gate: threading.Event | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> KubeletStandin:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self._cleanup_plugin_dir()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet"))
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), self._server)
        self._server.add_insecure_port(f"unix:{self.kubelet_socket}")
        self._server.start()
        if self._pr_server is None:
            self.pod_resources_socket.unlink(missing_ok=True)
            pool = futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="podres")
            self._pr_server = grpc.server(pool)
            podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self),
                                                                            self._pr_server)
            self._pr_server.add_insecure_port(f"unix:{self.pod_resources_socket}")
            self._pr_server.start()
        return self

    def stop(self) -> None:
        self._stop_registration()
        if self._pr_server is not None:
            self._pr_server.stop(grace=0).wait(5)
            self._pr_server = None

    def restart(self) -> None:
        """A kubelet restart: connections to plugins close, the socket directory is cleaned, a new
        kubelet.sock appears. Allocations are kept (the checkpoint)."""
        self._stop_registration()
        self._cleanup_plugin_dir()
        self.start()

    def _stop_registration(self) -> None:
        with self.cond:
            endpoints = list(self.endpoints.values())
            self.endpoints.clear()
            self.cond.notify_all()
        for ep in endpoints:
            ep.stopped = True
            ep.channel.close()
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None

    def _cleanup_plugin_dir(self) -> None:
        for p in self.plugin_dir.iterdir():
            if p.name != CHECKPOINT and not p.is_dir():
                p.unlink(missing_ok=True)

    # --- registration -----------------------------------------------------------------------------------
    def _register(self, req: api_pb2.RegisterRequest) -> None:
        if req.version != "v1beta1":
            raise ValueError(f"requested device plugin API version {req.version!r} is not supported by "
                             f"kubelet; supported versions are [v1beta1]")
        if not is_extended_resource_name(req.resource_name):
            raise ValueError(f"invalid name of device plugin socket: {req.resource_name!r} is not an "
                             f"extended resource name")
        sock = self.plugin_dir / req.endpoint
        channel = grpc.insecure_channel(f"unix:{sock}",
                                        options=[("grpc.max_receive_message_length", KUBELET_MAX_RECEIVE)])
        try:
            grpc.channel_ready_future(channel).result(timeout=10)  # blocking dial, as the kubelet does
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            channel.close()
            raise ConnectionError(f"failed to dial device plugin {sock}: {exc}") from exc
        with self.cond:
            if self.reject_registrations > 0 and self.reject_only in (None, req.resource_name):
                self.reject_registrations -= 1
                channel.close()
                raise ConnectionError("registration rejected by the test")
        ep = Endpoint(resource=req.resource_name, socket=sock, options=options, channel=channel, stub=stub)
        with self.cond:
            old = self.endpoints.get(req.resource_name)
            self.endpoints[req.resource_name] = ep
            self.registrations += 1
            ep.seq = self.registrations
            self.cond.notify_all()
        if old is not None:
            old.stopped = True
            old.channel.close()
        threading.Thread(target=self._read_stream, args=(ep,), name="kubelet-law", daemon=True).start()

    def _read_stream(self, ep: Endpoint) -> None:
        try:
            for resp in ep.stub.ListAndWatch(api_pb2.Empty()):
                with self.cond:
                    ep.devices = {d.ID: d for d in resp.devices}  # full replacement
                    ep.messages += 1
                    ep.last_message_bytes = resp.ByteSize()
                    self.cond.notify_all()
        except grpc.RpcError as exc:
            with self.cond:
                ep.stream_error = exc
                self.cond.notify_all()
        finally:
            with self.cond:
                ep.stopped = True  # every device of the resource is now unhealthy
                self.cond.notify_all()

    # --- queries ----------------------------------------------------------------------------------------
    def endpoint(self, resource: str) -> Endpoint | None:
        with self.cond:
            return self.endpoints.get(resource)

    def healthy_ids(self, resource: str) -> set[str]:
        with self.cond:
            ep = self.endpoints.get(resource)
            if ep is None or ep.stopped:
                return set()
            return {i for i, d in ep.devices.items() if d.health == "Healthy"}

    def allocatable(self, resource: str) -> int:
        return len(self.healthy_ids(resource))

    def capacity(self, resource: str) -> int:
        with self.cond:
            ep = self.endpoints.get(resource)
            return 0 if ep is None else len(ep.devices)

    def allocated_ids(self, resource: str) -> set[str]:
        with self.cond:
            return {i for p in self.pods.values() for c in p.containers.values() for i in c.get(resource, [])}

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout=timeout)

    def wait_registered(self, resource: str, after: int = 0, timeout: float = 10.0) -> Endpoint:
        """Wait until the resource has registered after the `after`-th registration of any resource (a count
        read from `registrations` before a restart) and its list arrived. Per resource: an agent registers one
        plugin per resource, and another's registration must not pass for this one's."""
        ok = self.wait_for(lambda: resource in self.endpoints and self.endpoints[resource].seq > after
                           and self.endpoints[resource].messages > 0, timeout)
        if not ok:
            raise TimeoutError(f"{resource} did not register with the kubelet stand-in within {timeout}s "
                               f"(errors: {self.register_errors})")
        ep = self.endpoint(resource)
        assert ep is not None
        return ep

    # --- admission -------------------------------------------------------------------------------------
    def admit(self, uid: str, namespace: str, name: str, containers: list[tuple[str, int]],
              resource: str) -> dict[str, api_pb2.ContainerAllocateResponse]:
        """Allocate `count` devices of `resource` to each container, as the device manager does."""
        ep = self.endpoint(resource)
        if ep is None or ep.stopped:
            raise AdmissionError(f"UnexpectedAdmissionError: cannot allocate unregistered device {resource}")
        record = self.pods.setdefault(uid, PodRecord(uid=uid, namespace=namespace, name=name))
        out = {}
        for container, count in containers:
            available = self.healthy_ids(resource) - self.allocated_ids(resource)
            if count > len(available):
                raise AdmissionError(f"UnexpectedAdmissionError: requested number of devices unavailable for "
                                     f"{resource}. Requested: {count}, Available: {len(available)}")
            chosen: list[str] = []
            if ep.options.get_preferred_allocation_available:
                self.preferred_calls += 1
                req = api_pb2.PreferredAllocationRequest(container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=sorted(available),
                                                                must_include_deviceIDs=[],
                                                                allocation_size=count)])
                t0 = time.perf_counter()
                resp = ep.stub.GetPreferredAllocation(req, timeout=30)
                self.call_seconds["GetPreferredAllocation"].append(time.perf_counter() - t0)
                chosen = [i for i in resp.container_responses[0].deviceIDs if i in available][:count]
            if len(chosen) < count:  # the kubelet fills up from the available set, in no particular order
                rest = sorted(available - set(chosen))
                chosen += self.rng.sample(rest, count - len(chosen))
            areq = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(
                devices_ids=chosen)])
            try:
                t0 = time.perf_counter()
                resp = ep.stub.Allocate(areq)
                self.call_seconds["Allocate"].append(time.perf_counter() - t0)
            except grpc.RpcError as exc:
                raise AdmissionError(f"UnexpectedAdmissionError: {exc.details()}") from exc
            with self.cond:
                record.containers.setdefault(container, {})[resource] = chosen
                record.responses[container] = resp.container_responses[0]
            out[container] = resp.container_responses[0]
        return out

    def remove_pod(self, uid: str) -> None:
        with self.cond:
            self.pods.pop(uid, None)

    @contextmanager
    def held_lists(self) -> Iterator[None]:
        """A kubelet whose PodResources answers arrive late: inside the block, each List answers what the
        record held when it was asked, but only once the block ends (or after 60 s). `lists_held` counts
        the answers waiting."""
        gate = threading.Event()
        with self.cond:
            self._list_gate = gate
        try:
            yield
        finally:
            with self.cond:
                self._list_gate = None
            gate.set()


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStandin) -> None:
        self.kubelet = kubelet

    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        try:
            self.kubelet._register(request)
        except (ValueError, ConnectionError) as exc:
            self.kubelet.register_errors.append(str(exc))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT if isinstance(exc, ValueError)
                          else grpc.StatusCode.UNAVAILABLE, str(exc))
        return api_pb2.Empty()


class _PodResources(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletStandin) -> None:
        self.kubelet = kubelet

    def List(self, request: podresources_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
             ) -> podresources_pb2.ListPodResourcesResponse:
        out = podresources_pb2.ListPodResourcesResponse()
        k = self.kubelet
        with k.cond:
            for pod in k.pods.values():
                pr = out.pod_resources.add(name=pod.name, namespace=pod.namespace)
                for cname, resources in pod.containers.items():
                    c = pr.containers.add(name=cname)
                    for resource, ids in resources.items():
                        c.devices.add(resource_name=resource, device_ids=ids)
            k.list_calls += 1
            gate = k._list_gate
            if gate is not None:
                k.lists_held += 1
                k.cond.notify_all()
        if gate is not None:  # the answer taken above, delivered late
            gate.wait(60)
            with k.cond:
                k.lists_held -= 1
        return out

    def GetAllocatableResources(self, request: podresources_pb2.AllocatableResourcesRequest,
                                context: grpc.ServicerContext
                                ) -> podresources_pb2.AllocatableResourcesResponse:
        out = podresources_pb2.AllocatableResourcesResponse()
        with self.kubelet.cond:
            for resource, ep in self.kubelet.endpoints.items():
                out.devices.add(resource_name=resource, device_ids=sorted(ep.devices))
        return out

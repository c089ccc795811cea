"""The DevicePlugin gRPC service (kubelet API v1beta1) on a Unix socket in the device-plugin directory."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from memslice.compute import ComputeShareError, check_share
from memslice.contract import ANN_GPU_COUNT
from memslice.contract import RESOURCE as RESOURCE_NAME
from memslice.proto import api_pb2, api_pb2_grpc

from ..compute_slots import provision_all
from ..elastic.slots import assign_slot, write_roster
from ..ledger import Allocation
from ..metrics import Metrics
from ..regions import RegionStore
from ..response import ResponseConfig, container_edits
from .allocator import (
    AllocationError,
    ReservedPod,
    Target,
    allocation_target,
    check_disjoint,
    choose_preferred,
    group_by_gpu,
    one_gpu_callers,
    spanning_owner,
    spanning_refusal,
)
from .devices import DeviceIdError
from .reconcile import region_id_for
from .state import PluginState

if TYPE_CHECKING:
    from .compute import ComputePluginService

log = logging.getLogger(__name__)

# Requests carry up to every ID of the node (one per MiB): allow far more than grpcio's 4 MiB default.
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
_PREFERRED_MEMORY = 256
# How long GetPreferredAllocation waits for the pod watch to deliver a reservation it has not seen yet: the
# kubelet asks right after the Binding, and the watch event may still be on its way. Only with a pod watch.
RESERVATION_WAIT_S = 0.5


def container_response(target: Target, region_host_dir: Path, cfg: ResponseConfig, limit_mib: int = 0,
                       elastic_slot: int = -1, compute_slot: int = -1) -> api_pb2.ContainerAllocateResponse:
    """The Allocate answer for one container (container_edits in the device plugin's protobuf)."""
    e = container_edits([g.uuid for g in target.gpus], target.mib, region_host_dir, cfg, limit_mib, elastic_slot,
                        compute_slot)
    return api_pb2.ContainerAllocateResponse(
        envs=e.envs, mounts=[api_pb2.Mount(container_path=m.container_path, host_path=m.host_path,
                                           read_only=m.read_only) for m in e.mounts],
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in e.cdi_devices])


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, state: PluginState, regions: RegionStore, rcfg: ResponseConfig, metrics: Metrics
                 ) -> None:
        self.state = state
        self.regions = regions
        self.rcfg = rcfg
        self.metrics = metrics
        self.closed = threading.Event()

    def close(self) -> None:
        """End this instance's ListAndWatch streams (the server is being replaced)."""
        self.closed.set()
        with self.state.changed:
            self.state.changed.notify_all()

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: grpc.ServicerContext
                               ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: api_pb2.Empty, context: grpc.ServicerContext
                     ) -> Iterator[api_pb2.ListAndWatchResponse]:
        sent = [0]  # version last sent
        self.metrics.streams.inc()

        def due() -> bool:
            return self.state.version != sent[0] or self.closed.is_set()

        try:
            while not self.closed.is_set() and context.is_active():
                with self.state.changed:
                    self.state.changed.wait_for(due, timeout=1.0)
                if self.closed.is_set():
                    return
                if self.state.version != sent[0]:
                    sent[0], resp = self.state.device_list()
                    log.info("ListAndWatch: sending %d devices (version %d)", len(resp.devices), sent[0])
                    yield resp
        finally:
            self.metrics.streams.dec()

    def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> api_pb2.PreferredAllocationResponse:
        start = time.perf_counter()
        st = self.state
        out = api_pb2.PreferredAllocationResponse()
        deadline = time.monotonic() + RESERVATION_WAIT_S
        version = st.pods_version
        reservations = st.reservations()
        for creq in request.container_requests:
            while True:
                taken = st.taken()  # the kubelet calls Allocate right after this, before the next container
                try:
                    pref = choose_preferred(creq.available_deviceIDs, list(creq.must_include_deviceIDs),
                                            creq.allocation_size, st.unit_mib, st.gpus, reservations, taken)
                except DeviceIdError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"GetPreferredAllocation: {exc}")
                # The kubelet asks right after the Binding: the pod watch may not have delivered the pod's
                # reservation yet. Without a match, wait (bounded) for the next pod events and choose again.
                left = deadline - time.monotonic()
                if pref.reservation is not None or creq.must_include_deviceIDs or left <= 0 or version == 0 \
                        or not st.wait_pods_changed(version, left):
                    break
                version = st.pods_version
                reservations = st.reservations()
            if pref.reservation is not None and pref.container is not None:
                with st.lock:
                    st.preferred[frozenset(pref.device_ids)] = (pref.reservation, pref.container)
                    while len(st.preferred) > _PREFERRED_MEMORY:
                        st.preferred.pop(next(iter(st.preferred)))
            reason = pref.reason
            if pref.reservation is None and not creq.must_include_deviceIDs:
                with st.lock:
                    pods = list(st.pods.values())
                refused = one_gpu_callers(pods, creq.allocation_size, st.taken()).refused
                if refused is not None:
                    reason += (f"; pod {refused.pod.namespace}/{refused.pod.name} spans {refused.gpus} GPUs: "
                               f"Allocate refuses one GPU for it")
            log.info("GetPreferredAllocation: %d units -> GPU %s (%s)", creq.allocation_size, pref.gpu_index,
                     reason)
            out.container_responses.add(deviceIDs=list(pref.device_ids))
        self.metrics.preferred_seconds.observe(time.perf_counter() - start)
        return out

    def Allocate(self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
                 ) -> api_pb2.AllocateResponse:
        start = time.perf_counter()
        st = self.state
        healthy = st.health.snapshot()
        try:
            targets = [allocation_target(list(c.devices_ids), st.gpus, healthy, st.unit_mib)
                       for c in request.container_requests]
            check_disjoint(targets)
            owned = [self._owner(t) for t in targets]
        except AllocationError as exc:
            self.metrics.allocate_errors.inc()
            log.warning("Allocate refused: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        # Until this call has ended (its answer sent, or the call failed), its regions are being answered: the
        # orphan sweep and reconciliation leave them alone, whatever the files' ages or the kubelet's record
        # say (their directories exist before their ledger entries, and the kubelet records only after the
        # answer arrives).
        rids = [region_id_for(t.device_ids) for t, _ in owned]
        st.begin_answer(rids)
        if not context.add_callback(lambda: st.end_answer(rids, time.monotonic())):
            st.end_answer(rids, time.monotonic())
            context.abort(grpc.StatusCode.CANCELLED, "the Allocate call ended before it was answered")
        out = api_pb2.AllocateResponse()
        for target, owner in owned:
            try:
                alloc = self._record(target, owner)
            except ComputeShareError as exc:
                self.metrics.allocate_errors.inc()
                log.error("Allocate failed: %s", exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot provision the compute share: {exc}")
            except OSError as exc:
                self.metrics.allocate_errors.inc()
                msg = (f"cannot create the region directory under {self.regions.root}: {exc}; the agent "
                       f"needs a writable --region-root (a hostPath mounted read-write)")
                log.error("Allocate failed: %s", msg)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, msg)
            out.container_responses.append(
                container_response(target, self.regions.dir_of(alloc.region_id), self.rcfg, alloc.limit_mib,
                                   elastic_slot=alloc.elastic_slot, compute_slot=alloc.compute_slot))
            log.info("Allocate: %d MiB of GPU %s (%s) for %s, region %s%s%s", alloc.mib,
                     ",".join(str(i) for i, _ in alloc.gpus()), ",".join(alloc.uuids()), alloc.owner(),
                     alloc.region_id,
                     f", elastic up to {alloc.limit_mib} MiB" if alloc.limit_mib else "",
                     f", compute {alloc.compute_request}%:{alloc.compute_limit or '-'} slot {alloc.compute_slot}"
                     if alloc.compute_slot >= 0 else "")
        self.metrics.allocate_seconds.observe(time.perf_counter() - start)
        return out

    def _owner(self, target: Target) -> tuple[Target, tuple[ReservedPod, str] | None]:
        """The container (reservation and name) these IDs were preferred for, and the target in its
        reservation's device order. IDs spanning GPUs must be a reservation's: the agent's preference
        for exactly them, else the one reservation on exactly those GPUs asking for as many devices; anything
        else is refused (AllocationError), as IDs spanning GPUs always were."""
        st = self.state
        with st.lock:
            owner = st.preferred.pop(frozenset(target.device_ids), None)
            existing = st.ledger.get(region_id_for(target.device_ids))
        if existing is not None and existing.more_gpus:  # the same devices again: the order it had
            return target.ordered(existing.uuids()), owner
        if owner is None and target.more:
            owner = spanning_owner(target, st.reservations(), st.unit_mib, st.taken())
        if target.more and (owner is None or sorted(owner[0].gpu_uuids) != sorted(g.uuid for g in target.gpus)):
            names = ", ".join(f"GPU {g} ({len(n) * st.unit_mib} MiB)"
                              for g, n in sorted(group_by_gpu(target.device_ids).items()))
            raise AllocationError(
                f"the {len(target.device_ids)} {RESOURCE_NAME} devices span {names}, and no pod is reserved on "
                f"exactly those GPUs with a container of that size; one container's memory comes from one GPU, "
                f"or from the GPUs the memslice scheduler extender reserved for a pod spanning GPUs "
                f"({ANN_GPU_COUNT}). Schedule the pod through the extender, or ask for no more than the largest "
                f"free slice of one GPU")
        if owner is not None and target.more:
            target = target.ordered(owner[0].gpu_uuids)
        if owner is None and not target.more and existing is None:
            self._refuse_spanning(len(target.device_ids))
        return target, owner

    def _refuse_spanning(self, size: int) -> None:
        """AllocationError when devices on one GPU, matched to no reservation, can only be for a pod spanning GPUs
        (allocator.one_gpu_callers: bound without the extender, or its reserved GPUs short): it would silently
        get one GPU."""
        st = self.state
        with st.lock:
            pods = list(st.pods.values())
        msg = spanning_refusal(one_gpu_callers(pods, size, st.taken()), size, st.unit_mib)
        if msg is not None:
            raise AllocationError(msg)

    def _record(self, target: Target, owner: tuple[ReservedPod, str] | None) -> Allocation:
        st = self.state
        rid = region_id_for(target.device_ids)
        with st.lock:
            existing = st.ledger.get(rid)
        if existing is not None:  # the same devices again (an init container's, reused): same region
            alloc = existing
        else:
            # Without the agent's own preference the owner stays unknown until PodResources names it: a guess
            # could label (and later clean up) the wrong container.
            r, container = owner if owner is not None else (None, "")
            share = r.compute_of(container) if r else None
            alloc = Allocation(region_id=rid, gpu_index=target.gpu.index, gpu_uuid=target.gpu.uuid,
                               more_gpus=tuple((g.index, g.uuid) for g in target.more),
                               device_ids=target.device_ids, mib=target.mib, created_at=time.time(),
                               namespace=r.namespace if r else "", pod=r.name if r else "",
                               container=container, pod_uid=r.pod_uid if r else "",
                               limit_mib=r.limit_of(container, target.mib) if r else 0,
                               spill=r.spill if r else None, priority=r.priority if r else 0,
                               idle_release=r.idle_release if r else False,
                               compute_request=share.request if share else 0,
                               compute_limit=share.limit or 0 if share else 0)
        if alloc.compute_slot < 0 and (alloc.compute_request or alloc.compute_limit) and self.rcfg.compute_host_dir:
            # the container's compute slot on its GPU(s), in the roster the shim trusts (fails closed:
            # a sum of requests over 100 on a GPU, or no slot free on all of them, refuses the container)
            slot = provision_all(self.rcfg.compute_host_dir, alloc.uuids(),
                                 check_share(alloc.compute_request, alloc.compute_limit or None), alloc.priority)
            alloc = replace(alloc, compute_slot=slot)
        elastic = alloc.limit_mib > alloc.mib
        with st.lock:
            if elastic and alloc.elastic_slot < 0:  # the container's own board slot (on each GPU)
                alloc = replace(alloc, elastic_slot=assign_slot(alloc, st.ledger.values()))
            others = [a for a in st.ledger.values() if a.region_id != rid]
        self.regions.create(alloc)
        if elastic and self.rcfg.elastic_host_dir is not None:
            for uuid in alloc.uuids():
                write_roster(self.rcfg.elastic_host_dir, uuid, [*others, alloc])
        with st.lock:
            st.ledger[rid] = alloc
        return alloc

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
                          ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """One gRPC server instance on the plugin socket; replaced as a whole on kubelet restarts."""

    def __init__(self, socket_path: Path, service: DevicePluginService | ComputePluginService, workers: int) -> None:
        self.socket_path = socket_path
        self.service = service
        self.workers = workers
        self._server: grpc.Server | None = None

    def start(self) -> None:
        if self.socket_path.exists() or self.socket_path.is_symlink():
            os.unlink(self.socket_path)
        # ListAndWatch holds a worker for its whole life; the rest stay free for the kubelet's dial-back
        # (GetDevicePluginOptions during Register), Allocate and GetPreferredAllocation.
        pool = futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="plugin")
        server = grpc.server(pool, options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                                      ("grpc.so_reuseport", 0)])
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}: is --device-plugin-dir writable?")
        server.start()
        self._server = server

    def stop(self) -> None:
        self.service.close()
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None

"""DRA: the kubelet-facing DRAPlugin service (gRPC `v1` and `v1beta1`, identical messages) on
`<kubelet plugins dir>/memslice.io/dra.sock`.

NodePrepareResources, per claim: read the ResourceClaim (GET by namespace/name, UID checked), decide its shares
(plugin/dra_prepare.py), create one region per share with that quota, write the claim's CDI spec, record it in
the checkpoint, return the CDI device IDs. A repeated call for a prepared claim answers from the checkpoint
(re-creating a region directory or spec file that went missing). Any failure undoes what that claim's call
created. NodeUnprepareResources removes the spec, the regions and the record; an unknown claim is already
unprepared. Calls are serialised (one lock): the kubelet sends few, and each takes milliseconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from memslice import errors
from memslice.plugin.allocator import Target
from memslice.plugin.dra_cdi import CDI_KIND, CdiDevice, CdiSpecs, cdi_device_name, extra_device_ids
from memslice.plugin.dra_checkpoint import Checkpoint, PreparedClaim
from memslice.plugin.dra_kube import DraApi, KubeError
from memslice.plugin.dra_prepare import ClaimError, ClaimRef, Share, check_fits, shares_for
from memslice.plugin.ledger import Allocation
from memslice.plugin.regions import RegionStore
from memslice.plugin.response import ResponseConfig, container_response
from memslice.plugin.state import NodeState
from memslice.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

log = logging.getLogger(__name__)

SOCKET_NAME = "dra.sock"
# The kubelet sends claims by reference (namespace, name, uid): requests are small.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024
MAX_CLAIMS_PER_CALL = 1024

# Reads one ResourceClaim as JSON: (namespace, name) -> dict; raises ClaimNotFound for 404.
ClaimReader = Callable[[str, str], Mapping[str, Any]]


class ClaimNotFound(errors.MemsliceError, LookupError):
    pass


def api_claim_reader(api: DraApi) -> ClaimReader:
    """GET a ResourceClaim (resource.k8s.io/v1) as plain JSON."""

    def read(namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return api.claim(namespace, name)
        except KubeError as exc:
            if exc.status == 404:
                raise ClaimNotFound(f"{namespace}/{name}") from None
            raise

    return read


class DraDriver:
    """Prepare/unprepare decisions applied to the node (regions, CDI specs, checkpoint, the agent's ledger)."""

    def __init__(self, state: NodeState, regions: RegionStore, specs: CdiSpecs, checkpoint: Checkpoint,
                 rcfg: ResponseConfig, read_claim: ClaimReader, pool: str,
                 capacity_mib: Callable[[], Mapping[int, int]]) -> None:
        self.state = state
        self.regions = regions
        self.specs = specs
        self.checkpoint = checkpoint
        self.rcfg = rcfg
        self.read_claim = read_claim
        self.pool = pool
        self.capacity_mib = capacity_mib
        self.lock = threading.Lock()
        self.prepared: dict[str, PreparedClaim] = {}

    # --- start-up ----------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Load the checkpoint, put its shares in the ledger, re-create missing regions/specs, and remove the
        regions and spec files that no record holds (a crash between creating and recording them)."""
        self.prepared = self.checkpoint.load()
        keep_regions: set[str] = set()
        for pc in self.prepared.values():
            self._materialise(pc, rewrite_spec=True)
            keep_regions.update(s.region_id for s in pc.shares)
        for rid in self.regions.directories():
            if rid not in keep_regions:
                self.regions.remove(rid)
                log.info("removed region %s: no prepared claim holds it", rid)
        for uid in self.specs.claim_uids():
            if uid not in self.prepared:
                self.specs.remove(uid)
                log.info("removed CDI spec of claim %s: not prepared", uid)
        if self.prepared:
            log.info("DRA checkpoint: %d prepared claim(s) recovered", len(self.prepared))

    # --- prepare -----------------------------------------------------------------------------------------
    def prepare(self, ref: ClaimRef) -> tuple[PreparedClaim | None, str]:
        """(the prepared claim, "") or (None, error message)."""
        with self.lock:
            try:
                pc = self.prepared.get(ref.uid)
                if pc is not None:
                    if pc.ref != ref:
                        raise ClaimError(f"{ref}: uid {ref.uid} was prepared as {pc.ref.namespace}/"
                                         f"{pc.ref.name}")
                    self._materialise(pc)
                    return pc, ""
                pc = self._prepare_new(ref)
                return pc, ""
            except ClaimError as exc:
                log.warning("NodePrepareResources refused: %s", exc)
                return None, str(exc)
            except OSError as exc:
                msg = (f"{ref}: cannot create its region or CDI spec: {exc}; the agent needs writable "
                       f"--region-root and --cdi-dir (hostPaths mounted read-write)")
                log.error("NodePrepareResources failed: %s", msg)
                return None, msg

    def _prepare_new(self, ref: ClaimRef) -> PreparedClaim:
        try:
            claim = self.read_claim(ref.namespace, ref.name)
        except ClaimNotFound:
            raise ClaimError(f"{ref} does not exist (deleted?); nothing was prepared") from None
        except Exception as exc:  # the API server unreachable or refusing: the kubelet retries
            raise ClaimError(f"{ref}: cannot read it from the API server: {exc}") from None
        st = self.state
        capacity = self.capacity_mib()
        shares = shares_for(claim, ref, self.pool, st.gpus, capacity, st.health.snapshot())
        check_fits(shares, (s for pc in self.prepared.values() for s in pc.shares), capacity)
        devices = [CdiDevice(cdi_device_name(ref.uid, s.share_id), self._response(s)) for s in shares]
        pc = PreparedClaim(ref=ref, shares=tuple(shares),
                           cdi_ids=tuple([d.qualified() for d in devices] + extra_device_ids(devices)))
        try:
            self._materialise(pc, devices)
            self.prepared[ref.uid] = pc
            self.checkpoint.save(self.prepared)
        except BaseException:
            self.prepared.pop(ref.uid, None)
            self._remove(pc)
            raise
        for s in shares:
            log.info("prepared %s: %d MiB of %s (%s), share %s, region %s", ref, s.mib, s.device, s.gpu_uuid,
                     s.share_id, s.region_id)
        return pc

    def _response(self, s: Share) -> Any:
        gpu = self.state.gpus[s.gpu_index]
        return container_response(Target(gpu=gpu, device_ids=(), mib=s.mib), self.regions.dir_of(s.region_id),
                                  self.rcfg)

    def _materialise(self, pc: PreparedClaim, devices: list[CdiDevice] | None = None,
                     rewrite_spec: bool = False) -> None:
        """Regions, ledger entries and the CDI spec of `pc` (idempotent; the spec is written when given,
        missing, or `rewrite_spec`)."""
        for s in pc.shares:
            alloc = Allocation(region_id=s.region_id, gpu_index=s.gpu_index, gpu_uuid=s.gpu_uuid,
                               device_ids=(f"{s.device}/{s.share_id}",), mib=s.mib, created_at=time.time(),
                               namespace=pc.ref.namespace, pod=f"claim:{pc.ref.name}", container=s.request)
            with self.state.lock:
                existing = self.state.ledger.get(s.region_id)
            if existing is None or not self.regions.dir_of(s.region_id).is_dir():
                self.regions.create(existing or alloc)
                with self.state.lock:
                    self.state.ledger.setdefault(s.region_id, alloc)
        if devices is None:
            devices = [CdiDevice(cdi_device_name(pc.ref.uid, s.share_id), self._response(s)) for s in pc.shares]
            if not rewrite_spec and self.specs.path_of(pc.ref.uid).exists():
                return
        self.specs.write(pc.ref.uid, devices)

    # --- unprepare ---------------------------------------------------------------------------------------
    def unprepare(self, ref: ClaimRef) -> str:
        with self.lock:
            pc = self.prepared.get(ref.uid)
            if pc is None:
                return ""
            try:
                self._remove(pc)
                del self.prepared[ref.uid]
                self.checkpoint.save(self.prepared)
            except OSError as exc:
                msg = f"{ref}: cannot remove its region, CDI spec or record: {exc}"
                log.error("NodeUnprepareResources failed: %s", msg)
                return msg
        log.info("unprepared %s (%d share(s) released)", ref, len(pc.shares))
        return ""

    def _remove(self, pc: PreparedClaim) -> None:
        self.specs.remove(pc.ref.uid)
        for s in pc.shares:
            self.regions.remove(s.region_id)
            with self.state.lock:
                self.state.ledger.pop(s.region_id, None)


def _ref(c: Any) -> ClaimRef:
    return ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid)


class _Service:
    """The DRAPlugin methods over one generated message module (v1 or v1beta1: the same fields)."""

    def __init__(self, driver: DraDriver, pb: Any) -> None:
        self.driver = driver
        self.pb = pb

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if len(request.claims) > MAX_CLAIMS_PER_CALL:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(request.claims)} claims in one call; at "
                                                            f"most {MAX_CLAIMS_PER_CALL}")
        out = self.pb.NodePrepareResourcesResponse()
        for c in request.claims:
            pc, err = self.driver.prepare(_ref(c))
            entry = out.claims[c.uid]
            if pc is None:
                entry.error = err
                continue
            for s in pc.shares:
                ids = [f"{CDI_KIND}={cdi_device_name(pc.ref.uid, s.share_id)}"]
                ids += [i for i in pc.cdi_ids if not i.startswith(f"{CDI_KIND}=")]
                entry.devices.add(request_names=[s.request] if s.request else [], pool_name=s.pool,
                                  device_name=s.device, cdi_device_ids=ids)
        return out

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if len(request.claims) > MAX_CLAIMS_PER_CALL:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(request.claims)} claims in one call; at "
                                                            f"most {MAX_CLAIMS_PER_CALL}")
        out = self.pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            out.claims[c.uid].error = self.driver.unprepare(_ref(c))
        return out


class V1Service(_Service, dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: DraDriver) -> None:
        super().__init__(driver, dra_v1_pb2)


class V1beta1Service(_Service, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: DraDriver) -> None:
        super().__init__(driver, dra_v1beta1_pb2)


# Advertised in GetInfo's supported_versions, newest first: the kubelet takes the first it knows.
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class DraServer:
    """The gRPC server on the DRA socket, serving both service versions."""

    def __init__(self, socket_path: Path, driver: DraDriver, workers: int) -> None:
        self.socket_path = socket_path
        self.driver = driver
        self.workers = workers
        self._server: grpc.Server | None = None

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        pool = futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dra")
        server = grpc.server(pool, options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                                            ("grpc.so_reuseport", 0)])
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(V1Service(self.driver), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(V1beta1Service(self.driver), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}: is --kubelet-plugins-dir writable?")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
            self._server = None

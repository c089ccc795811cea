"""DRA: the kubelet-facing DRAPlugin service (gRPC `v1` and `v1beta1`, identical messages) on
`<kubelet plugins dir>/memslice.io/dra.sock`.

NodePrepareResources, per claim: read the ResourceClaim (GET by namespace/name, UID checked; before taking the
lock, as the kubeletplugin helper does, so a slow API server does not hold up other calls), decide its shares
(plugin/dra/prepare.py), create one region per GPU with the sum of the claim's shares on it as its quota, write
the claim's CDI spec (one CDI device per region), record it in the checkpoint, and answer one Device per region
whose request_names are the base request names (a firstAvailable subrequest "gpu/small" is answered as "gpu",
the name containers use). A repeated call for a prepared claim answers from the checkpoint (re-creating a region
directory or spec file that went missing). An elastic claim (a GpuMemConfig limit above its request) gets what an
elastic pod of the device-plugin mode gets: the limit as its quota, the request guaranteed, a board slot, the
consumer pods' PriorityClass value (the lowest; the pods of status.reservedFor, read before the lock too) and the
GPU's roster rewritten. Any failure undoes what that claim's call created. A claim listed
twice in one call is prepared and answered once. NodeUnprepareResources removes the spec, the regions and the
record; an unknown claim is already unprepared; a known UID under another namespace/name is refused. Calls are
serialised: one lock in the process and, with rolling updates (--pod-uid), an flock on
`<plugin dir>/serialize.lock` shared with the other instance, re-reading the checkpoint inside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from memslice import errors
from memslice.compute import ComputeShareError, check_share
from memslice.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_health_v1beta1_pb2,
    dra_health_v1beta1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)

from ..compute_slots import provision_all, release_all
from ..elastic.slots import assign_slot, write_roster
from ..ledger import Allocation
from ..regions import RegionStore
from ..response import ResponseConfig, container_edits
from ..state import NodeState
from .cdi import CDI_KIND, CdiDevice, CdiSpecs, cdi_device_name, extra_device_ids
from .checkpoint import Checkpoint, CheckpointError, PreparedClaim
from .kube import DraApi, KubeError
from .prepare import (
    MAX_ELASTIC_PODS,
    ClaimError,
    ClaimRef,
    Compute,
    Elastic,
    Grant,
    asks_compute,
    check_fits,
    claim_config,
    claim_event,
    compute_for,
    consumer_pods,
    consumers_priority,
    device_name,
    device_statuses,
    elastic_for,
    grants,
    pod_priority,
    shares_for,
    unhealthy_warning,
)

log = logging.getLogger(__name__)

SOCKET_NAME = "dra.sock"
UNHEALTHY_REASON = "PreparedOnUnhealthyGPU"  # the Warning Event of a claim that tolerates the unhealthy taint


def socket_name(pod_uid: str = "") -> str:
    """`dra.sock`; with rolling updates `dra-<pod uid>.sock` (the kubeletplugin helper's names)."""
    return f"dra-{pod_uid}.sock" if pod_uid else SOCKET_NAME
# The kubelet sends claims by reference (namespace, name, uid): requests are small.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024
MAX_CLAIMS_PER_CALL = 1024
# The device-health stream (kubelet feature gate ResourceHealthStatus): each stream holds a worker thread for its
# lifetime, so at most MAX_HEALTH_STREAMS are served at once, whatever the version (the kubelet opens one per
# plugin; more are refused with RESOURCE_EXHAUSTED, and at least 2 of the >= 4 workers stay for
# prepare/unprepare). A stream sends the health of every device at once, on every change (checked every
# HEALTH_POLL_S) and every HEALTH_RESEND_S: well inside the kubelet's timeout after which a device it has not
# heard of reads Unknown (DefaultHealthTimeout, 30 s, for every version; v1beta1/v1 carry ours,
# HEALTH_TIMEOUT_S, per device, so a slow poll never turns a healthy GPU Unknown).
MAX_HEALTH_STREAMS = 2
HEALTH_POLL_S = 1.0
HEALTH_RESEND_S = 10.0
HEALTH_TIMEOUT_S = 60
MAX_HEALTH_MESSAGE = 1024  # characters; the kubelet truncates longer messages
LOCK_FILE = "serialize.lock"  # the kubeletplugin helper's name, in the plugin data directory
LOCK_WAIT_S = 30.0
PODS_READ_S = 20.0  # an elastic claim's consumer pods are read (for their priority) within this, else refused

# Reads one ResourceClaim as JSON: (namespace, name) -> dict; raises ClaimNotFound for 404.
ClaimReader = Callable[[str, str], Mapping[str, Any]]
# Reads one Pod as JSON: (namespace, name) -> dict, None for 404.
PodReader = Callable[[str, str], Mapping[str, Any] | None]
# Writes one core/v1 Event: (namespace, body).
EventPoster = Callable[[str, dict[str, Any]], None]
# Merge-patches one ResourceClaim's status: (namespace, name, body); KubeError 409 when it changed meanwhile.
StatusWriter = Callable[[str, str, dict[str, Any]], None]
STATUS_TRIES = 3


@dataclass(frozen=True)
class Fetched:
    """What NodePrepareResources reads from the API server before taking the lock: the claim and, when it is
    elastic, its consumer pods' priority (None: not read, the claim is not elastic or its config is refused)."""

    claim: Mapping[str, Any]
    priority: int | None = None


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


def api_pod_reader(api: DraApi) -> PodReader:
    """GET a Pod as plain JSON; None when it does not exist."""

    def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return api.pod(namespace, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    return read


class DraMetrics:
    """Prepare/unprepare counts, refusals and latencies per claim (in the agent's registry)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        buckets = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
        self.seconds = Histogram("memslice_dra_operation_seconds", "NodePrepareResources/NodeUnprepareResources "
                                 "time per claim (the claim's API read included)", ["operation"],
                                 buckets=buckets, registry=registry)
        self.errors = Counter("memslice_dra_operation_errors", "Claims whose prepare/unprepare failed or was "
                              "refused", ["operation"], registry=registry)
        self.kept_in_use = Gauge("memslice_dra_regions_kept_in_use", "Region directories no prepared claim holds "
                                 "(the checkpoint lacks them), kept because a live process uses them; each is "
                                 "logged with its PID and removed once no process does", registry=registry)

    def observe(self, operation: str, seconds: float, failed: bool) -> None:
        self.seconds.labels(operation).observe(seconds)
        if failed:
            self.errors.labels(operation).inc()


class DraDriver:
    """Prepare/unprepare decisions applied to the node (regions, CDI specs, checkpoint, the agent's ledger)."""

    def __init__(self, state: NodeState, regions: RegionStore, specs: CdiSpecs, checkpoint: Checkpoint,
                 rcfg: ResponseConfig, read_claim: ClaimReader, pool: str,
                 capacity_mib: Callable[[], Mapping[int, int]], lock_file: Path | None = None,
                 read_pod: PodReader | None = None, post_event: EventPoster | None = None,
                 node: str = "", write_status: StatusWriter | None = None,
                 metrics: DraMetrics | None = None) -> None:
        self.state = state
        self.regions = regions
        self.specs = specs
        self.checkpoint = checkpoint
        self.rcfg = rcfg
        self.read_claim = read_claim
        self.read_pod = read_pod  # None: consumer pods are not read (their priority is 0)
        self.pool = pool
        self.capacity_mib = capacity_mib
        self._lock = threading.Lock()
        self.lock_file = lock_file  # set with rolling updates: an flock shared with the other instance
        self.prepared: dict[str, PreparedClaim] = {}
        self.post_event = post_event  # None: no Events (the claim's Warnings are logged only)
        self.node = node
        self._warnings: list[tuple[ClaimRef, str]] = []  # said after the lock is released
        self.write_status = write_status  # None: the claims' status.devices are not written
        self._statuses: list[tuple[ClaimRef, Mapping[str, Any], PreparedClaim]] = []  # written after the lock
        self.metrics = metrics  # None: the kept regions are logged only
        # Regions no prepared claim holds, kept for the live process using them: region ID -> the claim UID its
        # record names ("" when it has none). Looked at again at every NodeUnprepareResources and every start.
        self._kept: dict[str, str] = {}

    @contextlib.contextmanager
    def serialised(self) -> Iterator[None]:
        """One call at a time in this process and, with `lock_file`, across both instances of a rolling update
        (the kubeletplugin helper's serialize.lock); the checkpoint is re-read inside, since the other
        instance may have prepared or unprepared claims meanwhile. Waits at most LOCK_WAIT_S."""
        with self._lock:
            if self.lock_file is None:
                yield
                return
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                deadline = time.monotonic() + LOCK_WAIT_S
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise ClaimError(f"{self.lock_file} stayed locked by the other instance for "
                                             f"{LOCK_WAIT_S:.0f} s; the kubelet retries") from None
                        time.sleep(0.005)  # polling the flock: a held lock is released within milliseconds
                self._reload()
                yield
            finally:
                os.close(fd)

    def _reload(self) -> None:
        """Adopt the checkpoint as the other instance left it: the ledger follows (claims it unprepared are
        gone, claims it prepared are added with their regions and specs)."""
        now = self.checkpoint.load()
        for uid, pc in self.prepared.items():
            if uid not in now:
                for rid in {s.region_id for s in pc.shares}:
                    with self.state.lock:
                        self.state.ledger.pop(rid, None)
        for uid, pc in now.items():
            if uid not in self.prepared:
                self._materialise(pc)
        changed = {s.gpu_uuid for uid in set(now) ^ set(self.prepared)
                   for s in (now.get(uid) or self.prepared[uid]).shares}
        self.prepared = now
        self._rosters(changed)

    def device_health(self) -> tuple[tuple[str, str, bool, str], ...]:
        """(pool, device, healthy, message) of every GPU this node publishes, for the kubelet's health stream;
        the message of an Unhealthy GPU names its critical Xid and what follows from it."""
        healthy = self.state.health.snapshot()
        xids = self.state.health.xids()
        return tuple((self.pool, device_name(i), ok, "" if ok else health_message(g.uuid, xids.get(g.uuid)))
                     for i, g in sorted(self.state.gpus.items()) for ok in [bool(healthy.get(g.uuid, False))])

    # --- start-up ----------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Load the checkpoint, put its shares in the ledger, re-create missing regions/specs, and remove the
        regions and spec files that no record holds (a crash between creating and recording them), except a
        region a live process uses (and its claim's spec): see _sweep."""
        with self.serialised():
            self._recover()

    def _recover(self) -> None:
        self.prepared = self.checkpoint.load()
        for pc in self.prepared.values():
            self._materialise(pc, rewrite_spec=True)
        self._kept = {}
        self._sweep(self.regions.directories())
        kept_claims = set(self._kept.values())
        for uid in self.specs.claim_uids():
            if uid not in self.prepared and uid not in kept_claims:
                self.specs.remove(uid)
                log.info("removed CDI spec of claim %s: not prepared", uid)
        self._rosters(g.uuid for g in self.state.gpus.values())
        if self.prepared:
            log.info("DRA checkpoint: %d prepared claim(s) recovered", len(self.prepared))

    def _held(self) -> set[str]:
        return {s.region_id for pc in self.prepared.values() for s in pc.shares}

    def _sweep(self, rids: Iterable[str]) -> None:
        """Remove the regions of `rids` that no prepared claim holds, but keep one a live process uses (a write
        lock in its region file: RegionStore.user), whatever the checkpoint says: a checkpoint that lost a claim
        (an unreadable version moved away, a restored disk, a bug) must not pull the accounting file from under
        a running container. Such a region is kept with its claim's CDI spec (named by the region's record): the
        runtime reads the spec at every container creation, a restart of the pod's container included, for
        which the kubelet does not prepare again. Both go once no process uses the region, looked at again at
        every NodeUnprepareResources (the kubelet saying a pod is gone) and at every start."""
        held = self._held()
        records: dict[str, Allocation] | None = None
        for rid in rids:
            if rid in held:
                self._kept.pop(rid, None)  # prepared again (the kubelet re-sent the claim): its claim's region
                continue
            pid = self.regions.user(rid)
            if pid is None:
                owner = self._kept.pop(rid, "")
                self.regions.remove(rid)
                if owner and owner not in self.prepared and owner not in self._kept.values():
                    self.specs.remove(owner)
                    log.info("removed region %s and the CDI spec of claim %s: no prepared claim holds them and no "
                             "process uses the region any more", rid, owner)
                else:
                    log.info("removed region %s: no prepared claim holds it", rid)
                continue
            if rid in self._kept:
                continue  # said when first kept
            if records is None:
                records = self.regions.load()
            rec = records.get(rid)
            self._kept[rid] = rec.pod_uid if rec is not None else ""
            who = f"process {pid}" if pid else "a process (its PID not visible from here)"
            find = f" (its pod: the UID in /proc/{pid}/cgroup)" if pid else ""
            claim = f"claim {rec.namespace}/{rec.pod.removeprefix('claim:')} (uid {rec.pod_uid})" if rec else \
                "a claim its record no longer names"
            log.warning("kept region %s of %s: the DRA checkpoint holds no claim for it, but %s still uses it; it "
                        "is kept with its CDI spec and removed once no process uses it (looked at again at every "
                        "NodeUnprepareResources and every start). Meanwhile this node does not count its memory "
                        "against new claims: if that pod should not run, delete it%s", rid, claim,
                        who, find)
        if self.metrics is not None:
            self.metrics.kept_in_use.set(len(self._kept))

    def _sweep_kept(self) -> None:
        """The regions kept for a live process, looked at again (nothing to do, no probe, when there are none)."""
        if not self._kept:
            return
        try:
            self._sweep([rid for rid in self._kept if self.regions.dir_of(rid).is_dir()])
        except OSError as exc:  # the claim being unprepared must not fail for it: retried at the next call
            log.warning("cannot remove a region kept for a live process: %s; retried at the next "
                        "NodeUnprepareResources", exc)
        for rid in [r for r in self._kept if not self.regions.dir_of(r).is_dir()]:
            del self._kept[rid]  # gone meanwhile (the other instance of a rolling update removed it)
        if self.metrics is not None:
            self.metrics.kept_in_use.set(len(self._kept))

    def _rosters(self, uuids: Iterable[str]) -> None:
        """Rewrite the elastic roster of these GPUs from the ledger (the shim trusts it over the board)."""
        edir = self.rcfg.elastic_host_dir
        if edir is None:
            return
        with self.state.lock:
            ledger = list(self.state.ledger.values())
        for uuid in sorted(set(uuids)):
            write_roster(edir, uuid, ledger)

    # --- prepare -----------------------------------------------------------------------------------------
    def fetch(self, ref: ClaimRef) -> Fetched | ClaimError | None:
        """The claim from the API server, read before the lock (None: already prepared, nothing to read), with
        its consumer pods' priority when its driver config asks for a limit."""
        if ref.uid in self.prepared:
            return None
        try:
            claim = self.read_claim(ref.namespace, ref.name)
        except ClaimNotFound:
            return ClaimError(f"{ref} does not exist (deleted?); nothing was prepared")
        except Exception as exc:  # the API server unreachable or refusing: the kubelet retries
            return ClaimError(f"{ref}: cannot read it from the API server: {exc}")
        try:  # an elastic claim, or one with a compute share, gets its pods' PriorityClass value
            cfg = claim_config(claim, ref)
            elastic = cfg.limit_mib is not None or cfg.compute_limit is not None or asks_compute(claim)
        except ClaimError:
            elastic = False  # refused when prepared, with its message
        if not elastic or self.read_pod is None:
            return Fetched(claim)
        consumers = consumer_pods(claim)
        deadline = time.monotonic() + PODS_READ_S
        try:
            found: list[int | None] = []
            for name, uid in consumers if len(consumers) <= MAX_ELASTIC_PODS else []:  # else refused unread
                if time.monotonic() > deadline:
                    return ClaimError(f"{ref}: reading its pods took over {PODS_READ_S:.0f} s; the kubelet retries")
                found.append(pod_priority(self.read_pod(ref.namespace, name), uid))
            return Fetched(claim, consumers_priority(ref, consumers, found))
        except ClaimError as exc:
            return exc
        except Exception as exc:  # the API server unreachable or refusing: the kubelet retries
            return ClaimError(f"{ref}: cannot read its pod(s) from the API server (for their priority): {exc}")

    def prepare(self, ref: ClaimRef, claim: Fetched | ClaimError | None = None
                ) -> tuple[PreparedClaim | None, str]:
        """(the prepared claim, "") or (None, error message). `claim` is fetch()'s answer (read here if None
        and the claim is not prepared)."""
        try:
            with self.serialised():
                pc = self.prepared.get(ref.uid)
                if pc is not None:
                    if pc.ref != ref:
                        raise ClaimError(f"{ref}: uid {ref.uid} was prepared as {pc.ref.namespace}/"
                                         f"{pc.ref.name}")
                    self._materialise(pc)
                    return pc, ""
                if claim is None:
                    claim = self.fetch(ref)
                if isinstance(claim, ClaimError):
                    raise claim
                assert claim is not None
                pc = self._prepare_new(ref, claim)
                warnings, self._warnings = self._warnings, []  # this call's, taken under the lock
                statuses, self._statuses = self._statuses, []
            self._say_warnings(warnings)
            self._write_statuses(statuses)
            return pc, ""
        except ClaimError as exc:
            log.warning("NodePrepareResources refused: %s", exc)
            return None, str(exc)
        except CheckpointError as exc:
            log.error("NodePrepareResources failed: %s", exc)
            return None, str(exc)
        except OSError as exc:
            msg = (f"{ref}: cannot create its region or CDI spec: {exc}; the agent needs writable "
                   f"--region-root and --cdi-dir (hostPaths mounted read-write)")
            log.error("NodePrepareResources failed: %s", msg)
            return None, msg
        except Exception as exc:  # a bug must cost this claim only, with its name, never the call (gRPC UNKNOWN)
            log.exception("NodePrepareResources failed for %s", ref)
            return None, f"{ref}: the node agent failed to prepare it ({type(exc).__name__}: {str(exc)[:200]})"

    def _say_warnings(self, warnings: list[tuple[ClaimRef, str]]) -> None:
        """Log and post (as Warning Events on their claims) what prepare found worth a warning; an Event that
        cannot be written is logged, never fails the claim."""
        for ref, message in warnings:
            log.warning("%s", message)
            if self.post_event is None:
                continue
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            try:
                self.post_event(ref.namespace, claim_event(ref, UNHEALTHY_REASON, message, self.node, stamp))
            except Exception as exc:  # the API server refusing or away: the warning stays in the log
                log.warning("cannot post the %s Event on %s: %s", UNHEALTHY_REASON, ref, exc)

    def _write_statuses(self, todo: list[tuple[ClaimRef, Mapping[str, Any], PreparedClaim]]) -> None:
        """Write the status.devices of the claims just prepared (what the node enforces for them), a
        conditional merge patch re-read and retried on conflict (STATUS_TRIES in all). A status that cannot be
        written is logged, never fails the claim: the node enforces the quota either way."""
        if self.write_status is None:
            return
        for ref, claim, pc in todo:
            for attempt in range(STATUS_TRIES):
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                meta = claim.get("metadata") if isinstance(claim, Mapping) else None
                body = {"metadata": {"resourceVersion": str((meta or {}).get("resourceVersion") or "")},
                        "status": {"devices": device_statuses(claim, pc.shares, pc.elastic, pc.spill, stamp,
                                                              {g.region_id: g for g in pc.grants})}}
                try:
                    self.write_status(ref.namespace, ref.name, body)
                    break
                except KubeError as exc:
                    if exc.status != 409 or attempt == STATUS_TRIES - 1:
                        log.warning("cannot write status.devices of %s: %s", ref, exc)
                        break
                    try:
                        claim = self.read_claim(ref.namespace, ref.name)
                    except Exception as read_exc:  # gone or unreadable: nothing to write
                        log.warning("cannot write status.devices of %s: %s", ref, read_exc)
                        break
                    if (claim.get("metadata") or {}).get("uid") != ref.uid:
                        break
                except Exception as exc:  # the API server away: the status waits for the next prepare
                    log.warning("cannot write status.devices of %s: %s", ref, exc)
                    break

    def _prepare_new(self, ref: ClaimRef, fetched: Fetched) -> PreparedClaim:
        st = self.state
        capacity = self.capacity_mib()
        claim = fetched.claim
        healthy = st.health.snapshot()
        shares = shares_for(claim, ref, self.pool, st.gpus, capacity, healthy)
        check_fits(shares, (s for pc in self.prepared.values() for s in pc.shares), capacity)
        cfg = claim_config(claim, ref)
        [g] = grants(shares)  # one region per claim: its GPUs, the same quota on each
        elastic = elastic_for(claim, ref, g, capacity, cfg)
        if elastic is not None:
            elastic = replace(elastic, priority=fetched.priority or 0, slot=self._slot(g))
        share = compute_for(claim, ref, g, cfg)
        if share is not None and self.rcfg.compute_host_dir is not None:  # its slot in the rosters
            try:  # one slot number free on every GPU of the claim
                slot = provision_all(self.rcfg.compute_host_dir, g.uuids, check_share(share.request, share.limit),
                                     fetched.priority or 0)
            except ComputeShareError as exc:
                raise ClaimError(f"{ref}: cannot provision its compute share: {exc}") from None
            share = replace(share, slot=slot, priority=fetched.priority or 0)
        devices = self._cdi_devices(ref, [g], elastic, share)
        pc = PreparedClaim(ref=ref, shares=tuple(shares),
                           cdi_ids=tuple([d.qualified() for d in devices] + extra_device_ids(devices)),
                           elastic=elastic, spill=cfg.spill, compute=share)
        try:
            self._materialise(pc, devices)
            self.prepared[ref.uid] = pc
            self.checkpoint.save(self.prepared)
        except BaseException:
            self.prepared.pop(ref.uid, None)
            self._remove(pc)
            raise
        warning = unhealthy_warning(ref, shares, healthy)
        if warning is not None:
            self._warnings.append((ref, warning))
        self._statuses.append((ref, claim, pc))
        log.info("prepared %s: %d MiB of %s (%s), share(s) %s, region %s%s", ref, g.mib,
                 ", ".join(d.device for d in g.devices), ", ".join(g.uuids), ", ".join(g.share_ids), g.region_id,
                 f", elastic up to {elastic.limit_mib} MiB (priority {elastic.priority}, board slot "
                 f"{elastic.slot})" if elastic else "")
        return pc

    def _slot(self, g: Grant) -> int:
        """The board slot of a new elastic claim: the lowest that no prepared claim on any of its GPUs holds."""
        probe = Allocation(region_id=g.region_id, gpu_index=g.gpu_index, gpu_uuid=g.gpu_uuid, device_ids=(),
                           mib=g.mib, created_at=0.0, more_gpus=tuple((d.gpu_index, d.gpu_uuid) for d in g.devices[1:]))
        with self.state.lock:
            return assign_slot(probe, self.state.ledger.values())

    def _cdi_devices(self, ref: ClaimRef, regions: list[Grant], elastic: Elastic | None,
                     share: Compute | None = None) -> list[CdiDevice]:
        """One CDI device per region (one per claim, for all its GPUs), named after its first share (a claim of
        one share keeps the name it had before shares were grouped, so an older agent's checkpoint still matches
        its containers); its edits are what Allocate would answer for the same GPUs and quota."""
        return [CdiDevice(cdi_device_name(ref.uid, g.share_ids[0]),
                          container_edits(g.uuids, g.mib, self.regions.dir_of(g.region_id), self.rcfg,
                                          elastic.limit_mib if elastic else 0,
                                          elastic_slot=elastic.slot if elastic else -1,
                                          compute_slot=share.slot if share else -1))
                for g in regions]

    def _materialise(self, pc: PreparedClaim, devices: list[CdiDevice] | None = None,
                     rewrite_spec: bool = False) -> None:
        """Regions, ledger entries and the CDI spec of `pc` (idempotent; the spec is written when given,
        missing, or `rewrite_spec`)."""
        e, c = pc.elastic, pc.compute
        for g in pc.grants:
            alloc = Allocation(region_id=g.region_id, gpu_index=g.gpu_index, gpu_uuid=g.gpu_uuid,
                               more_gpus=tuple((d.gpu_index, d.gpu_uuid) for d in g.devices[1:]),
                               device_ids=tuple(f"{d.device}/{sid}" for d in g.devices for sid in d.share_ids),
                               mib=g.mib,
                               created_at=time.time(), namespace=pc.ref.namespace, pod=f"claim:{pc.ref.name}",
                               pod_uid=pc.ref.uid,  # the owner's uid: the claim's (its Events name it)
                               container=",".join(g.requests), limit_mib=e.limit_mib if e else 0,
                               elastic_slot=e.slot if e else -1,
                               priority=e.priority if e else c.priority if c else 0,
                               idle_release=e.idle_release if e else False, spill=pc.spill,
                               compute_request=c.request if c else 0, compute_limit=(c.limit or 0) if c else 0,
                               compute_slot=c.slot if c else -1)
            with self.state.lock:
                existing = self.state.ledger.get(g.region_id)
            if existing is None or not self.regions.dir_of(g.region_id).is_dir():
                self.regions.create(existing or alloc)
                with self.state.lock:
                    self.state.ledger.setdefault(g.region_id, alloc)
                if e is not None:
                    self._rosters(g.uuids)
        if devices is None:
            devices = self._cdi_devices(pc.ref, pc.grants, pc.elastic, pc.compute)
            if not rewrite_spec and self.specs.path_of(pc.ref.uid).exists():
                return
        self.specs.write(pc.ref.uid, devices)

    # --- unprepare ---------------------------------------------------------------------------------------
    def unprepare(self, ref: ClaimRef) -> str:
        """Remove a prepared claim's spec, regions and record, whether or not a process still uses a region: the
        kubelet sends NodeUnprepareResources only once every container of the claim's pods has stopped, the
        claim is deallocated and its memory handed to other claims, and refusing would hold the pod's deletion
        in the kubelet's retries. (A region no prepared claim holds is another matter: see _sweep, looked at
        again here.)"""
        try:
            with self.serialised():
                self._sweep_kept()
                pc = self.prepared.get(ref.uid)
                if pc is None:
                    return ""
                if pc.ref != ref:
                    msg = (f"{ref}: uid {ref.uid} was prepared as {pc.ref.namespace}/{pc.ref.name}; nothing was "
                           f"unprepared")
                    log.warning("NodeUnprepareResources refused: %s", msg)
                    return msg
                self._remove(pc)
                del self.prepared[ref.uid]
                self.checkpoint.save(self.prepared)
        except (ClaimError, CheckpointError) as exc:
            log.error("NodeUnprepareResources failed: %s", exc)
            return str(exc)
        except OSError as exc:
            msg = f"{ref}: cannot remove its region, CDI spec or record: {exc}"
            log.error("NodeUnprepareResources failed: %s", msg)
            return msg
        log.info("unprepared %s (%d share(s) released)", ref, len(pc.shares))
        return ""

    def _remove(self, pc: PreparedClaim) -> None:
        self.specs.remove(pc.ref.uid)
        for rid in dict.fromkeys(s.region_id for s in pc.shares):
            self.regions.remove(rid)
            with self.state.lock:
                self.state.ledger.pop(rid, None)
        if pc.elastic is not None:  # its slot leaves the roster: a later process in it cannot be trusted
            self._rosters(s.gpu_uuid for s in pc.shares)
        if pc.compute is not None and pc.compute.slot >= 0 and self.rcfg.compute_host_dir is not None:
            # the compute slot goes back too, on each of the claim's GPUs
            release_all(self.rcfg.compute_host_dir, dict.fromkeys(s.gpu_uuid for s in pc.shares), pc.compute.slot)


def _ref(c: Any) -> ClaimRef:
    return ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid)


class _Service:
    """The DRAPlugin methods over one generated message module (v1 or v1beta1: the same fields)."""

    def __init__(self, driver: DraDriver, pb: Any, metrics: DraMetrics | None) -> None:
        self.driver = driver
        self.pb = pb
        self.metrics = metrics
        self.share_ids = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if len(request.claims) > MAX_CLAIMS_PER_CALL:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(request.claims)} claims in one call; at "
                                                            f"most {MAX_CLAIMS_PER_CALL}")
        out = self.pb.NodePrepareResourcesResponse()
        refs = list({_ref(c): None for c in request.claims})  # a claim listed twice is answered once
        started = {ref: time.monotonic() for ref in refs}
        fetched = [self.driver.fetch(ref) for ref in refs]  # API reads before the serialising lock
        for ref, claim in zip(refs, fetched, strict=True):
            entry = out.claims[ref.uid]
            if entry.devices or entry.error:  # the same UID under two names: the first one answers
                continue
            pc, err = self.driver.prepare(ref, claim)
            if self.metrics is not None:
                self.metrics.observe("prepare", time.monotonic() - started[ref], pc is None)
            if pc is None:
                entry.error = err
                continue
            extra = [i for i in pc.cdi_ids if not i.startswith(f"{CDI_KIND}=")]
            for g in pc.grants:
                # One Device per GPU, each naming every request of the region (a container naming any of them
                # gets the whole claim: its GPUs, one quota on each). The CDI IDs ride on the first only: the
                # kubelet adds the CDI IDs of every Device a container's request names, without removing repeats,
                # and one region's edits applied twice would mount it twice.
                for k, d in enumerate(g.devices):
                    ids = [f"{CDI_KIND}={cdi_device_name(pc.ref.uid, g.share_ids[0])}", *extra] if k == 0 else []
                    dev = entry.devices.add(request_names=list(g.requests), pool_name=d.pool, device_name=d.device,
                                            cdi_device_ids=ids)
                    if self.share_ids:  # dra/v1 only: the share of the GPU (several merged: the first, its name)
                        dev.share_id = d.share_ids[0]
        return out

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if len(request.claims) > MAX_CLAIMS_PER_CALL:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(request.claims)} claims in one call; at "
                                                            f"most {MAX_CLAIMS_PER_CALL}")
        out = self.pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            t0 = time.monotonic()
            err = self.driver.unprepare(_ref(c))
            if self.metrics is not None:
                self.metrics.observe("unprepare", time.monotonic() - t0, bool(err))
            if not out.claims[c.uid].error:
                out.claims[c.uid].error = err
        return out


class V1Service(_Service, dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: DraDriver, metrics: DraMetrics | None = None) -> None:
        super().__init__(driver, dra_v1_pb2, metrics)


class V1beta1Service(_Service, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: DraDriver, metrics: DraMetrics | None = None) -> None:
        super().__init__(driver, dra_v1beta1_pb2, metrics)


def health_message(uuid: str, xid: int | None) -> str:
    """What the kubelet shows for an Unhealthy GPU (pod status allocatedResourcesStatus), within its bound."""
    why = f"critical Xid {xid}" if xid is not None else "NVML stopped answering"
    return (f"{uuid}: {why}; the slice taints it memslice.io/unhealthy:NoSchedule until it recovers: claims "
            f"that do not tolerate the taint are refused on it")[:MAX_HEALTH_MESSAGE]


class HealthStreams:
    """The kubelet's device-health streams (DRAResourceHealth/NodeWatchResources, every served version), bounded
    together: MAX_HEALTH_STREAMS at once; each ends when the kubelet goes away (checked every HEALTH_POLL_S) or
    the server stops."""

    def __init__(self, driver: DraDriver, stopping: threading.Event) -> None:
        self.driver = driver
        self.stopping = stopping
        self._lock = threading.Lock()
        self.open = 0

    def watch(self, pb: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with self._lock:
            full = self.open >= MAX_HEALTH_STREAMS
            if not full:
                self.open += 1
        if full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{MAX_HEALTH_STREAMS} health streams are open "
                                                              f"already; close one first")
        try:
            last: tuple[tuple[str, str, bool, str], ...] | None = None
            sent = 0.0
            while context.is_active() and not self.stopping.is_set():
                now = self.driver.device_health()
                if now != last or time.monotonic() - sent >= HEALTH_RESEND_S:
                    yield health_response(pb, now, int(time.time()))
                    last, sent = now, time.monotonic()
                self.stopping.wait(HEALTH_POLL_S)
        finally:
            with self._lock:
                self.open -= 1


def health_response(pb: Any, devices: tuple[tuple[str, str, bool, str], ...], now: int) -> Any:
    """One NodeWatchResourcesResponse of `pb` (a dra-health version: v1alpha1 as the kubelet 1.34 knows it has
    no timeout or message fields, later ones have both; a kubelet skips fields it does not know)."""
    return pb.NodeWatchResourcesResponse(devices=[
        pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name=pool, device_name=dev),
                        health=pb.HEALTHY if ok else pb.UNHEALTHY, last_updated_time=now,
                        health_check_timeout_seconds=HEALTH_TIMEOUT_S, message=msg[:MAX_HEALTH_MESSAGE])
        for pool, dev, ok, msg in devices])


class HealthService(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """v1alpha1.DRAResourceHealth."""

    def __init__(self, streams: HealthStreams) -> None:
        self.streams = streams

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        return self.streams.watch(dra_health_v1alpha1_pb2, context)


class HealthServiceV1beta1(dra_health_v1beta1_pb2_grpc.DRAResourceHealthServicer):
    """v1beta1.DRAResourceHealth."""

    def __init__(self, streams: HealthStreams) -> None:
        self.streams = streams

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        return self.streams.watch(dra_health_v1beta1_pb2, context)


class HealthServiceV1(dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    """v1.DRAResourceHealth."""

    def __init__(self, streams: HealthStreams) -> None:
        self.streams = streams

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        return self.streams.watch(dra_health_v1_pb2, context)


# Advertised in GetInfo's supported_versions, newest first: the kubelet takes the first it knows.
# The health services are listed too (each version's DRAResourceHealthService name): kubelets that pick their
# health service from this list (pickHealthService, newest first) find theirs; older kubelets (1.34) open
# v1alpha1 whenever their ResourceHealthStatus gate is on, and skip names they do not know when choosing the
# DRAPlugin version.
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1beta1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
HEALTH_SERVICE = HEALTH_SERVICES[-1]
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", *HEALTH_SERVICES)


class DraServer:
    """The gRPC server on the DRA socket, serving both service versions."""

    def __init__(self, socket_path: Path, driver: DraDriver, workers: int, metrics: DraMetrics | None = None
                 ) -> None:
        self.socket_path = socket_path
        self.driver = driver
        self.workers = workers
        self.metrics = metrics
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        pool = futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dra")
        server = grpc.server(pool, options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                                            ("grpc.so_reuseport", 0)])
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(V1Service(self.driver, self.metrics), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(V1beta1Service(self.driver, self.metrics), server)
        streams = HealthStreams(self.driver, self._stopping)
        dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthService(streams), server)
        dra_health_v1beta1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthServiceV1beta1(streams), server)
        dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthServiceV1(streams), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}: is --kubelet-plugins-dir writable?")
        server.start()
        self._server = server

    def stop(self) -> None:
        self._stopping.set()  # health streams end
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
            self._server = None
            self.socket_path.unlink(missing_ok=True)  # a newer instance cannot tell a stale socket from ours

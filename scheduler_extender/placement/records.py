"""Pods decoded once, at the edge: a typed PodView for the verbs (the pod in a request), a compact record for
the watch cache (every GPU pod of the cluster), and the charge a record puts on a GPU or node.

Why records are plain tuples: the extender keeps one per GPU pod (250,000 in a large cluster). A tuple
whose items are all str/int/float/None is untracked by CPython's cyclic garbage collector after its first
collection, so full collections never rescan them (with a dataclass per pod and per request they took
0.45 s at 235,000 pods); it is also the smallest container (no __dict__, no per-field objects).
Node names, GPU UUIDs and namespaces are interned: thousands of pods share each.

What a pod charges (`derive_charge`):
- a pod in phase Succeeded/Failed, or deleted: nothing;
- a pod with a valid reservation (`memslice.io/gpu-uuid` + `memslice.io/gpu-mem-mib`): the effective MiB
  (resources.py explains init containers) on that GPU, wherever the pod is bound, as long as it is bound;
- the same, not bound yet (a bind in flight, or a bind that failed after the annotations were written and
  could not be undone, or an extender that crashed in between): charged until `assumed-at + assume_ttl`,
  then no longer (the leak ends by itself; a later bind overwrites the annotations);
- a pod bound to a node and asking for `memslice.io/gpu-mem` without a reservation (bound without the
  extender): its MiB as "unplaced" on the node: it may be on any GPU there, so the node's total free memory
  must cover it too.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from memslice.contract import TERMINAL_PHASES, Reservation
from memslice.elastic import ANN_LIMIT, ANN_LIMIT_RECORD, LimitAnnotationError, parse_limit_record
from memslice.errors import ContractError

from .resources import (
    LimitSig,
    PodRequest,
    RequestError,
    effective_total,
    pod_request,
)

log = logging.getLogger(__name__)
_intern = sys.intern


def resource_version(meta: dict[str, Any]) -> int:
    """resourceVersion as an int (Kubernetes serves etcd revisions; opaque strings count as 0)."""
    try:
        return int(meta.get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


# ------------------------------------------------------------------------------------------ the verbs' pod

@dataclass(frozen=True, slots=True)
class PodView:
    """The pod of an extender request, decoded once: its UID ("" when absent) and its memslice request
    (None: not a memslice pod), or `error` when the request cannot be honoured."""

    uid: str
    request: PodRequest | None
    error: str

    @classmethod
    def of(cls, pod: Any) -> PodView:
        uid = ((pod.get("metadata") or {}).get("uid") if isinstance(pod, dict) else None) or ""
        try:
            return cls(uid if isinstance(uid, str) else "", pod_request(pod), "")
        except RequestError as exc:
            return cls(uid if isinstance(uid, str) else "", None, str(exc))

    def key(self, default_policy: str, capped: bool = False
            ) -> (tuple[int, str] | tuple[int, str, LimitSig] | tuple[int, str, LimitSig, int]
                  | tuple[int, str, LimitSig, int, int]):
        """(devices, policy): what the memo is kept by; with the limit cap on (`capped`) the pod's limit
        signature too (resources.PodRequest.limit_sig); with a compute share, (devices, policy, the limit
        signature or (), compute percent); for a pod spanning GPUs, (devices per GPU, policy, the limit
        signature or (), compute percent per GPU, GPUs)."""
        assert self.request is not None
        if self.request.gpus > 1:  # a pod spanning GPUs: per-GPU figures, the count last (fitmemo.gpus_of)
            sig = self.request.limit_sig() if capped else ()
            return (self.request.devices, self.request.policy or default_policy, sig, self.request.compute,
                    self.request.gpus)
        if self.request.compute:
            sig = self.request.limit_sig() if capped else ()
            return self.request.devices, self.request.policy or default_policy, sig, self.request.compute
        if capped:
            return self.request.devices, self.request.policy or default_policy, self.request.limit_sig()
        return self.request.devices, self.request.policy or default_policy


# ------------------------------------------------------------------------------------------ watched pods

# A watched GPU pod: (uid, namespace, name, resourceVersion, node or None, terminal, reserved GPU UUID or
# None, reserved MiB, assumed-at, devices asked, request, limit MiB above the reserved MiB). `request` is kept
# only while the pod is neither bound nor reserved (bind reads it from here instead of GETting the pod); else
# None, so the tuple holds atoms only. The last field is what the pod's elastic limits add on its GPU
# (reserved_over_mib; 0 for a pod without limits or without a reservation): --max-limit-ratio counts it. Then
# the compute percent the reservation holds on its GPU (memslice.io/gpu-compute-pct; 0 without).
Record = tuple[str, str, str, int, "str | None", bool, "str | None", int, float, int, "PodRequest | None", int,
               int]
# Field positions, Final so that the type checker knows each field's type from the index.
UID: Final = 0
NAMESPACE: Final = 1
NAME: Final = 2
RV: Final = 3
NODE: Final = 4
TERMINAL: Final = 5
GPU: Final = 6
MIB: Final = 7
ASSUMED_AT: Final = 8
DEVICES: Final = 9
REQUEST: Final = 10
OVER: Final = 11
COMPUTE: Final = 12
PodEntry = tuple[str, "Record | None", int]  # uid, the record (None: not a GPU pod), resourceVersion


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A record as the binder reads it (built on demand by ClusterState.pod)."""

    uid: str
    namespace: str
    name: str
    rv: int
    node: str | None
    terminal: bool
    reservation: str | None  # the reserved GPU's UUID; None without a reservation
    request: PodRequest | None  # only while the pod is neither bound nor reserved

    @classmethod
    def of(cls, r: Record) -> PodRecord:
        return cls(r[UID], r[NAMESPACE], r[NAME], r[RV], r[NODE], r[TERMINAL], r[GPU], r[REQUEST])


def _decode_request(obj: dict[str, Any], namespace: str, name: str) -> PodRequest | None:
    try:
        return pod_request(obj)
    except RequestError as exc:
        log.warning("pod %s/%s: %s", namespace, name, exc)
        return None


def _decode_reservation(annotations: Any, namespace: str, name: str, bound: bool) -> Reservation | None:
    if not isinstance(annotations, dict):
        return None
    try:  # "where" is only needed in an error message: not built for every pod
        return Reservation.parse(annotations, with_time=not bound)
    except ContractError:
        pass
    try:
        Reservation.parse(annotations, f"pod {namespace}/{name}", with_time=not bound)
    except ContractError as exc:
        log.warning("%s; the reservation is ignored", exc)
    return None


def reservation_mib(reservation: Reservation, request: PodRequest | None) -> int:
    """The MiB a reservation holds on its GPU: the effective total over the pod's containers (init
    containers do not add up), containers the pod does not have counted as app containers. With one amount,
    that amount, whatever the containers (pod_record relies on it; a test checks it)."""
    if request is not None:
        asks = request.asks
        if len(asks) == 1 and asks[0].kind == "app" and len(reservation.container_mib) == 1:
            # the usual pod: one app container and one reserved amount (its own, or one of a container the
            # pod lacks, which counts as an app container): that amount, whichever it is
            return reservation.container_mib[0][1]
    return _effective_mib(dict(reservation.container_mib), request)


def reservation_compute(reservation: Reservation, request: PodRequest | None) -> int:
    """The compute percent a reservation holds on its GPU: the effective total of its containers' requests
    (init containers as for memory), containers the pod does not have counted as app containers."""
    shares = reservation.container_compute
    if not shares:
        return 0
    if len(shares) == 1:
        return shares[0].request
    return _effective_mib({c.container: c.request for c in shares}, request)


def _effective_mib(amounts: dict[str, int], request: PodRequest | None) -> int:
    """The effective total of `amounts` (container -> MiB) over the pod's containers, as reservation_mib."""
    if request is None:
        return sum(amounts.values())
    known = {a.name for a in request.asks}
    extra = sum(v for k, v in amounts.items() if k not in known)
    return effective_total(amounts, request.asks) + extra


def reserved_over_mib(annotations: dict[str, Any], reservation: Reservation, request: PodRequest | None,
                      mib: int, where: str, count: int = 1) -> int:
    """What the pod's elastic limits add above its reserved `mib` on its GPU (its limit minus its request;
    the limit sum --max-limit-ratio caps is the GPU's used MiB plus these). Read from the limits the node
    agent gives the pod: the extender's record (`memslice.io/gpu-mem-limit-mib`, validated and bounded), or
    without one (a bind by an older extender) the users' annotation. A malformed record is logged and
    counted as the users' annotation says (the agent refuses such a pod at Allocate, and one allocated
    before the record was spoilt keeps the limit it got then): never below the request, never a crash.
    Only the reservation's containers count; each at least its reserved MiB. A pod spanning `count` GPUs:
    totals over them (the request's limits are per GPU, the records' totals)."""
    raw = annotations.get(ANN_LIMIT_RECORD)
    limits = {c: lim * count for c, lim in request.limits} if request is not None else {}
    if raw is not None:
        try:
            if not isinstance(raw, str):
                raise LimitAnnotationError(f"annotation {ANN_LIMIT_RECORD} is not a string")
            limits = parse_limit_record(raw)
        except LimitAnnotationError as exc:
            log.warning("%s: %s; its limit is counted from memslice.io/gpu-mem-limit (or as its request)",
                        where, exc)
    if not limits:
        return 0
    amounts = dict(reservation.container_mib)
    with_limits = {k: max(v, limits.get(k, 0)) for k, v in amounts.items()}
    return max(_effective_mib(with_limits, request) - mib, 0)


def pod_record(obj: dict[str, Any]) -> Record | None:
    """The record of a watched pod; None for pods without a UID or that neither ask for nor hold GPU
    memory."""
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    node = _node_of(obj)
    reservation = _decode_reservation(meta.get("annotations") or {}, namespace, name, node is not None)
    terminal = (obj.get("status") or {}).get("phase") in TERMINAL_PHASES
    if reservation is not None and "," in reservation.gpu_uuid:
        return _spanning_record(obj, meta, uid, namespace, name, node, terminal, reservation)
    if (reservation is not None and len(reservation.container_mib) == 1 and len(reservation.container_compute) < 2
            and not _has_limit_annotation(meta.get("annotations") or {})):
        # One reserved amount is the pod's effective MiB whatever its containers (reservation_mib), and a
        # reserved pod's devices are never read (derive_charge): its request need not be decoded, unless
        # its limits are (reserved_over_mib). This is nearly every running pod of a relist and both watch
        # events of each of the extender's own binds.
        return (uid, _intern(namespace), name, resource_version(meta), node, terminal,
                _intern(reservation.gpu_uuid), reservation.container_mib[0][1], reservation.assumed_ts, 0, None,
                0, reservation.container_compute[0].request if reservation.container_compute else 0)
    request = _decode_request(obj, namespace, name)
    if request is None and reservation is None:
        return None
    devices = request.node_devices if request is not None else 0
    if reservation is None:
        return (uid, _intern(namespace), name, resource_version(meta), node, terminal, None, 0, 0.0, devices,
                request if node is None else None, 0, 0)
    mib = reservation_mib(reservation, request)
    annotations: dict[str, Any] = meta.get("annotations") or {}  # a dict: a reservation was found in it
    over = (reserved_over_mib(annotations, reservation, request, mib, f"pod {namespace}/{name}")
            if ANN_LIMIT_RECORD in annotations or (request is not None and request.limits) else 0)
    return (uid, _intern(namespace), name, resource_version(meta), node, terminal, _intern(reservation.gpu_uuid),
            mib, reservation.assumed_ts, devices, None, over,
            reservation_compute(reservation, request))  # assumed_at 0 if bound


def _spanning_record(obj: dict[str, Any], meta: dict[str, Any], uid: str, namespace: str, name: str,
                     node: str | None, terminal: bool, reservation: Reservation) -> Record:
    """pod_record of a pod reserved on several GPUs: the record names them all (joined, as the annotation) and
    holds what the pod charges on EACH: its reserved MiB and its limits above them divided by the GPU count
    (the record's figures are totals), its compute share as recorded (per GPU)."""
    count = reservation.gpu_count
    request = _decode_request(obj, namespace, name)
    per_gpu = reservation._replace(container_mib=tuple((c, mib // count) for c, mib in reservation.container_mib))
    mib = reservation_mib(per_gpu, request)
    annotations: dict[str, Any] = meta.get("annotations") or {}
    over = 0
    if ANN_LIMIT_RECORD in annotations or (request is not None and request.limits):
        over = reserved_over_mib(annotations, reservation, request, mib * count, f"pod {namespace}/{name}",
                                 count) // count
    devices = request.node_devices if request is not None else 0
    return (uid, _intern(namespace), name, resource_version(meta), node, terminal, _intern(reservation.gpu_uuid),
            mib, reservation.assumed_ts, devices, None, over, reservation_compute(reservation, request))


def _has_limit_annotation(annotations: dict[str, Any]) -> bool:
    """Does the pod carry an elastic limit (the users' `memslice.io/gpu-mem-limit[.<container>]` or the
    extender's record `memslice.io/gpu-mem-limit-mib`)? All three names start with ANN_LIMIT."""
    return any(isinstance(k, str) and k.startswith(ANN_LIMIT) for k in annotations)


def _node_of(obj: dict[str, Any]) -> str | None:
    node = (obj.get("spec") or {}).get("nodeName")
    return _intern(node) if isinstance(node, str) and node else None


def pod_entry(obj: dict[str, Any]) -> PodEntry | None:
    """A listed pod, for ClusterState.replace_pods (a relist never holds the raw JSON of every pod)."""
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    return uid, pod_record(obj), resource_version(meta)


# ------------------------------------------------------------------------------------------ charges

class Charge(NamedTuple):
    """What a pod holds: `mib` on GPU `gpu_uuid`, or (`gpu_uuid` None) `devices` unplaced on `node`.
    ClusterState keeps charges as plain tuples (same fields, same order; see the module docstring)."""

    gpu_uuid: str | None  # None: unplaced on `node`
    node: str | None
    mib: int  # for a GPU charge
    devices: int  # for an unplaced charge (MiB = devices × the node's unit)
    expires: float | None  # an unbound reservation stops counting then
    over: int = 0  # for a GPU charge: what the pod's elastic limits add above `mib` (records.OVER)
    compute: int = 0  # for a GPU charge: the compute percent it holds (records.COMPUTE)


ChargeT = tuple["str | None", "str | None", int, int, "float | None", int, int]  # a Charge as a plain tuple


def derive_charge(r: Record, now: float, assume_ttl: float) -> ChargeT | None:
    if r[TERMINAL]:
        return None
    gpu, node = r[GPU], r[NODE]
    if gpu is not None:
        if node:
            return gpu, node, r[MIB], 0, None, r[OVER], r[COMPUTE]
        expires = r[ASSUMED_AT] + assume_ttl
        return (gpu, None, r[MIB], 0, expires, r[OVER], r[COMPUTE]) if expires > now else None
    if node and r[DEVICES]:
        return None, node, 0, r[DEVICES], None, 0, 0
    return None


def effect(c: ChargeT) -> tuple[object, ...]:
    """What a charge does to the views: MiB (and limit MiB above them) on a GPU (whichever node the pod is
    bound to, if any) and its compute percent, or devices unplaced on a node."""
    return (c[0], c[2], c[5], c[6]) if c[0] is not None else (None, c[1], c[3])

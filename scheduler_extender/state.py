"""The extender's picture of the cluster: node inventories and pod reservations, with per-GPU totals.

Built only from the API server (list + watch, see watch.py) and from the extender's own in-flight binds
("pending" charges, see below). All methods are thread-safe (one lock; every operation is O(GPUs of one
node) except relists). Read access for decisions goes through immutable `NodeView`s.

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

Pending charges: between choosing a GPU and the watch delivering the pod's new version, the extender's
own bind holds the GPU with a pending charge (so two binds never see the same room). A pending charge is
dropped when the watch delivers a version of the pod at least as new as the extender's last write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

from memslice.scheduler_extender.annotations import (
    AnnotationError,
    Gpu,
    Inventory,
    Reservation,
    parse_inventory,
    parse_reservation,
)
from memslice.scheduler_extender.constants import MAX_SCORE
from memslice.scheduler_extender.resources import PodRequest, RequestError, effective_total, pod_request
from memslice.scheduler_extender.wire import host_priority_json

log = logging.getLogger(__name__)
TERMINAL_PHASES = ("Succeeded", "Failed")
UNKNOWN_RV = 1 << 62  # pending charges wait for a version this new until the bind says otherwise
MAX_SUMMARY_TABLES = 32  # memoised tables (one per pod size and policy seen); all dropped beyond that
CHANGE_LOG = 4096  # (generation, node) of the latest view changes, for ClusterState.changed_since
Summary = tuple[bool, int, str]  # (surely fits now, score, its HostPriority JSON): see ClusterState.summaries
_SURE = itemgetter(0)


def resource_version(meta: dict[str, Any]) -> int:
    """resourceVersion as an int (Kubernetes serves etcd revisions; opaque strings count as 0)."""
    try:
        return int(meta.get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class GpuView(NamedTuple):
    """One GPU as decisions see it. A NamedTuple rather than a frozen dataclass: a node's view is rebuilt
    after every bind on it, and this is five times cheaper to build. Build with GpuView.of()."""

    uuid: str
    index: int
    model: str
    mem_mib: int
    healthy: bool
    used_mib: int
    free_mib: int  # mem - used (negative when over-committed)

    @classmethod
    def of(cls, uuid: str, index: int, model: str, mem_mib: int, healthy: bool, used_mib: int) -> GpuView:
        return cls(uuid, index, model, mem_mib, healthy, used_mib, mem_mib - used_mib)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as decisions see it. `error` is set when its inventory annotation is malformed.
    Build with NodeView.of(): the totals are computed once, so a fit check is O(1)."""

    name: str
    unit_mib: int
    gpus: tuple[GpuView, ...]
    unplaced_mib: int
    error: str | None
    max_free_mib: int  # over healthy GPUs
    max_mem_mib: int  # largest healthy GPU
    total_free_mib: int  # over healthy GPUs, negatives (over-commit) counted as 0
    healthy: tuple[GpuView, ...]  # in index order
    by_free: tuple[GpuView, ...]  # healthy GPUs sorted by (free, index): binpack takes the first that fits
    free_keys: tuple[int, ...]  # their free MiB, for bisect
    most_free: GpuView | None  # the healthy GPU with the most free MiB (lowest index on ties): spread's pick

    @classmethod
    def of(cls, name: str, unit_mib: int, gpus: tuple[GpuView, ...], unplaced_mib: int = 0,
           error: str | None = None) -> NodeView:
        healthy = tuple(sorted((g for g in gpus if g.healthy), key=lambda g: g.index))
        by_free = tuple(sorted(healthy, key=lambda g: (g.free_mib, g.index)))
        most_free = min(healthy, key=lambda g: (-g.free_mib, g.index)) if healthy else None
        return cls(name, unit_mib, gpus, unplaced_mib, error,
                   max((g.free_mib for g in healthy), default=0),
                   max((g.mem_mib for g in healthy), default=0),
                   sum(max(g.free_mib, 0) for g in healthy), healthy, by_free,
                   tuple(g.free_mib for g in by_free), most_free)


@dataclass(slots=True)
class SummaryTable:
    """The memo of one pod size and policy: node -> Summary, and node -> HostPriority JSON for the nodes
    where such a pod surely fits. The second is filter's usual case in one C-speed pass (`",".join` over
    the lookups fails on the first node missing from it), and its result is prioritize's answer."""

    score: Callable[[NodeView, int, str], int]
    all: dict[str, Summary]
    sure: dict[str, str]


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    rv: int
    node: str | None
    terminal: bool
    request: PodRequest | None
    reservation: Reservation | None


@dataclass(frozen=True, slots=True)
class Charge:
    gpu_uuid: str | None  # None: unplaced on `node`
    node: str | None
    mib: int  # for a GPU charge
    devices: int  # for an unplaced charge (MiB = devices × the node's unit)
    expires: float | None  # an unbound reservation stops counting then


@dataclass(frozen=True, slots=True)
class Pending:
    charge: Charge | None
    min_rv: int


def pod_record(obj: dict[str, Any]) -> PodRecord | None:
    """The part of a pod the extender keeps; None for pods that neither ask for nor hold GPU memory."""
    meta = obj.get("metadata") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    try:
        request = pod_request(obj)
    except RequestError as exc:
        log.warning("%s: %s", where, exc)
        request = None
    annotations = meta.get("annotations") or {}
    try:
        reservation = parse_reservation(where, annotations) if isinstance(annotations, dict) else None
    except AnnotationError as exc:
        log.warning("%s; the reservation is ignored", exc)
        reservation = None
    if request is None and reservation is None:
        return None
    return PodRecord(uid=str(meta.get("uid") or ""), namespace=str(meta.get("namespace") or ""),
                     name=str(meta.get("name") or ""), rv=resource_version(meta),
                     node=(obj.get("spec") or {}).get("nodeName") or None,
                     terminal=(obj.get("status") or {}).get("phase") in TERMINAL_PHASES,
                     request=request, reservation=reservation)


PodEntry = tuple[str, "PodRecord | None", int]  # uid, what the extender keeps of the pod, resourceVersion


def pod_entry(obj: dict[str, Any]) -> PodEntry | None:
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    return uid, pod_record(obj), resource_version(meta)


def reservation_mib(rec: PodRecord) -> int:
    assert rec.reservation is not None
    amounts = dict(rec.reservation.container_mib)
    if rec.request is None:
        return sum(amounts.values())
    known = {a.name for a in rec.request.asks}
    extra = sum(v for k, v in amounts.items() if k not in known)  # counted as app containers
    return effective_total(amounts, rec.request.asks) + extra


def derive_charge(rec: PodRecord, now: float, assume_ttl: float) -> Charge | None:
    if rec.terminal:
        return None
    if rec.reservation is not None:
        mib = reservation_mib(rec)
        if rec.node:
            return Charge(rec.reservation.gpu_uuid, rec.node, mib, 0, None)
        expires = rec.reservation.assumed_at + assume_ttl
        return Charge(rec.reservation.gpu_uuid, None, mib, 0, expires) if expires > now else None
    if rec.node and rec.request is not None:
        return Charge(None, rec.node, 0, rec.request.devices, None)
    return None


def _effect(c: Charge) -> tuple[object, ...]:
    """What a charge does to the views: MiB on a GPU (whichever node the pod is bound to, if any), or
    devices unplaced on a node."""
    return (c.gpu_uuid, c.mib) if c.gpu_uuid is not None else (None, c.node, c.devices)


class ClusterState:
    def __init__(self, assume_ttl: float = 120.0, clock: Callable[[], float] = time.time) -> None:
        self.assume_ttl = assume_ttl
        self.clock = clock
        self.lock = threading.RLock()
        self._inventory: dict[str, Inventory | None] = {}  # node -> inventory (None: not a memslice node)
        self._node_error: dict[str, str] = {}
        self._gpu_node: dict[str, str] = {}
        self._views: dict[str, NodeView] = {}
        self._dirty: set[str] = set()
        # per (devices, policy): the memo of summaries (see SummaryTable), recomputed for a node whenever its
        # view is rebuilt
        self._summaries: dict[tuple[int, str], SummaryTable] = {}
        self._host_json: dict[str, list[str]] = {}  # node -> its HostPriority JSON for each score 0..MAX_SCORE
        self._generation = 0  # bumped whenever a node's view (and so its summaries) may have changed
        self._changes: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)
        self._pods: dict[str, PodRecord] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        self._charges: dict[str, Charge] = {}
        self._used: dict[str, int] = {}
        self._unplaced: dict[str, int] = {}
        self._pending: dict[str, Pending] = {}
        self._expiring: dict[str, float] = {}
        self._changed = threading.Condition(self.lock)
        self.last_rv = {"nodes": 0, "pods": 0}  # newest resourceVersion seen per kind (tests wait on it)
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()

    def wait_for(self, predicate: Callable[[ClusterState], bool], timeout: float) -> bool:
        """Wait (at most `timeout` s) until `predicate(self)` holds; re-checked after every change."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    # ------------------------------------------------------------------ nodes
    def upsert_node(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return
        with self.lock:
            self._set_node(name, meta.get("annotations") or {})
            self._seen("nodes", resource_version(meta))

    def _set_node(self, name: str, annotations: dict[str, Any]) -> None:
        old = self._inventory.get(name)
        if old is not None:
            for g in old.gpus:
                if self._gpu_node.get(g.uuid) == name:
                    del self._gpu_node[g.uuid]
        try:
            inv = parse_inventory(name, annotations if isinstance(annotations, dict) else {})
            self._node_error.pop(name, None)
        except AnnotationError as exc:
            log.warning("%s; the node gets no memslice pods until it is fixed", exc)
            inv = None
            self._node_error[name] = str(exc)
        self._inventory[name] = inv
        if inv is not None:
            for g in inv.gpus:
                self._gpu_node[g.uuid] = name
        self._dirty.add(name)
        self._changed.notify_all()

    def delete_node(self, name: str, rv: int = 0) -> None:
        with self.lock:
            self._seen("nodes", rv)
            old = self._inventory.pop(name, None)
            if old is not None:
                for g in old.gpus:
                    if self._gpu_node.get(g.uuid) == name:
                        del self._gpu_node[g.uuid]
            self._node_error.pop(name, None)
            self._views.pop(name, None)
            self._forget_summaries(name)
            self._host_json.pop(name, None)
            self._dirty.discard(name)
            self._changed.notify_all()

    def replace_nodes(self, objs: Iterable[dict[str, Any]], list_rv: int = 0) -> None:
        with self.lock:
            seen = set()
            for obj in objs:
                meta = obj.get("metadata") or {}
                name = meta.get("name")
                if isinstance(name, str) and name:
                    seen.add(name)
                    self._set_node(name, meta.get("annotations") or {})
            for name in list(self._inventory):
                if name not in seen:
                    self.delete_node(name)
            self._seen("nodes", list_rv)

    # ------------------------------------------------------------------ pods
    def upsert_pod(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            return
        rec = pod_record(obj)
        with self.lock:
            self._set_pod(uid, rec, resource_version(meta))
            self._seen("pods", resource_version(meta))

    def delete_pod(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        if isinstance(uid, str) and uid:
            with self.lock:
                self._pending.pop(uid, None)
                self._set_pod(uid, None, UNKNOWN_RV)
                self._seen("pods", resource_version(meta))

    def replace_pods(self, entries: Iterable[PodEntry | None], list_rv: int) -> None:
        """A relist: `entries` (from pod_entry(), so that a relist of 40,000 pods never holds them all as
        raw JSON) is the complete set of pods; those absent are gone."""
        with self.lock:
            seen = set()
            for entry in entries:
                if entry is None:
                    continue
                uid, rec, rv = entry
                seen.add(uid)
                self._set_pod(uid, rec, rv)
            for uid in list(self._pods):
                if uid not in seen:
                    self._set_pod(uid, None, list_rv)
            for uid, p in list(self._pending.items()):
                if uid not in seen and p.min_rv <= list_rv:
                    del self._pending[uid]
                    self._recharge(uid)
            self._seen("pods", list_rv)

    def _seen(self, kind: str, rv: int) -> None:
        if rv > self.last_rv[kind]:
            self.last_rv[kind] = rv
            self._changed.notify_all()

    def _set_pod(self, uid: str, rec: PodRecord | None, rv: int) -> None:
        old = self._pods.get(uid)
        if old is not None:
            self._by_name.pop((old.namespace, old.name), None)
        if rec is None:
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = rec
            self._by_name[(rec.namespace, rec.name)] = uid
        p = self._pending.get(uid)
        if p is not None and rv >= p.min_rv:
            del self._pending[uid]
        self._recharge(uid)

    def _recharge(self, uid: str) -> None:
        old = self._charges.get(uid)
        p = self._pending.get(uid)
        if p is not None:
            new = p.charge
        else:
            rec = self._pods.get(uid)
            new = derive_charge(rec, self.clock(), self.assume_ttl) if rec is not None else None
        if new != old:
            if old is not None and new is not None and _effect(old) == _effect(new):
                # The same MiB on the same GPU (the watch delivering the pod a bind wrote: first unbound with
                # its reservation, then bound): the record changes, the views stay as they are.
                self._charges[uid] = new
            else:
                if old is not None:
                    del self._charges[uid]
                    self._apply(old, -1)
                if new is not None:
                    self._charges[uid] = new
                    self._apply(new, +1)
        self._expiring.pop(uid, None)
        if new is not None and new.expires is not None:
            self._expiring[uid] = new.expires
        self._changed.notify_all()

    def _apply(self, c: Charge, sign: int) -> None:
        if c.gpu_uuid is not None:
            left = self._used.get(c.gpu_uuid, 0) + sign * c.mib
            if left:
                self._used[c.gpu_uuid] = left
            else:
                self._used.pop(c.gpu_uuid, None)
            node = self._gpu_node.get(c.gpu_uuid)
            if node is not None:
                self._dirty.add(node)
        elif c.node is not None:
            left = self._unplaced.get(c.node, 0) + sign * c.devices
            if left:
                self._unplaced[c.node] = left
            else:
                self._unplaced.pop(c.node, None)
            self._dirty.add(c.node)

    def expire(self) -> None:
        """Drop unbound reservations whose assume TTL has passed (called before every decision)."""
        if not self._expiring:
            return
        now = self.clock()
        with self.lock:
            for uid, deadline in list(self._expiring.items()):
                if deadline <= now:
                    rec = self._pods.get(uid)
                    if rec is not None:
                        log.info("reservation of pod %s/%s on GPU %s expired unbound after %.0f s; released",
                                 rec.namespace, rec.name,
                                 rec.reservation.gpu_uuid if rec.reservation else "?", self.assume_ttl)
                    self._recharge(uid)

    # ------------------------------------------------------------------ in-flight binds
    def hold(self, uid: str, charge: Charge | None) -> None:
        """Charge `charge` (None: nothing) for pod `uid` now, until release() or until the watch catches up."""
        with self.lock:
            self._pending[uid] = Pending(charge, UNKNOWN_RV)
            self._recharge(uid)

    def confirm(self, uid: str, min_rv: int) -> None:
        """The bind succeeded; the pending charge stays until the watch delivers version `min_rv`."""
        with self.lock:
            p = self._pending.get(uid)
            if p is not None:
                rec = self._pods.get(uid)
                if rec is not None and rec.rv >= min_rv:
                    del self._pending[uid]
                    self._recharge(uid)
                else:
                    self._pending[uid] = Pending(p.charge, min_rv)

    def release(self, uid: str, undone_rv: int | None) -> None:
        """The bind failed. With `undone_rv` (the version that removed the annotations) the pod charges
        nothing until the watch delivers it; without (the undo failed), the watched state rules."""
        with self.lock:
            rec = self._pods.get(uid)
            if undone_rv is None or (rec is not None and rec.rv >= undone_rv):
                self._pending.pop(uid, None)
            else:
                self._pending[uid] = Pending(None, undone_rv)
            self._recharge(uid)

    # ------------------------------------------------------------------ reads
    def view(self, name: str) -> NodeView | None:
        """The node as decisions see it; None when it is unknown or not a memslice node."""
        with self.lock:
            if name in self._dirty:
                self._rebuild(name)
            return self._views.get(name)

    def knows_node(self, name: str) -> bool:
        with self.lock:
            return name in self._inventory

    def node_error(self, name: str) -> str | None:
        with self.lock:
            return self._node_error.get(name)

    def _rebuild(self, name: str) -> None:
        self._dirty.discard(name)
        inv = self._inventory.get(name)
        if inv is None:
            self._forget_summaries(name)
            if name in self._node_error:
                self._views[name] = NodeView.of(name, 1, (), 0, self._node_error[name])
            else:
                self._views.pop(name, None)
            return
        gpus = tuple(_gpu_view(g, self._used.get(g.uuid, 0)) for g in inv.gpus)
        view = self._views[name] = NodeView.of(name, inv.unit_mib, gpus,
                                               self._unplaced.get(name, 0) * inv.unit_mib)
        # Recomputed now rather than dropped: the memo stays complete, so filter's usual case stays one pass.
        # A few µs per table; the tables are bounded (MAX_SUMMARY_TABLES).
        for (devices, policy), table in self._summaries.items():
            summary = table.all[name] = self._summary(name, view, devices, policy, table.score)
            if summary[0]:
                table.sure[name] = summary[2]
            else:
                table.sure.pop(name, None)
        self._changed_node(name)

    def _forget_summaries(self, name: str) -> None:
        for table in self._summaries.values():
            table.all.pop(name, None)
            table.sure.pop(name, None)
        self._changed_node(name)

    def _changed_node(self, name: str) -> None:
        self._generation += 1
        self._changes.append((self._generation, name))

    def _summary(self, name: str, view: NodeView, devices: int, policy: str,
                 score: Callable[[NodeView, int, str], int]) -> Summary:
        need = devices * view.unit_mib
        sure = view.max_free_mib >= need and not view.unplaced_mib and not view.error and view.most_free is not None
        fragments = self._host_json.get(name)
        if fragments is None:
            fragments = self._host_json[name] = [host_priority_json(name, v) for v in range(MAX_SCORE + 1)]
        value = score(view, need, policy)
        return sure, value, fragments[value]

    def changed_since(self, generation: int) -> set[str] | None:
        """Nodes whose summaries may differ from those of `generation` (see summaries_at); None when
        that generation is too old to tell (then everything may have changed)."""
        with self.lock:
            self._flush()
            if generation == self._generation:
                return set()
            changes = self._changes
            if not changes or changes[0][0] > generation + 1:
                return None
            out = set()
            for g, name in reversed(changes):
                if g <= generation:
                    break
                out.add(name)
            return out

    def _flush(self) -> None:
        if self._dirty:
            names = list(self._dirty)
            self._dirty.clear()  # also shrinks the table: iterating a set that once held 5,000 names is slow
            for name in names:
                self._rebuild(name)

    def summaries(self, names: list[str], devices: int, policy: str,
                  score: Callable[[NodeView, int, str], int]) -> list[Summary]:
        return self.summaries_at(names, devices, policy, score)[1]

    def summaries_at(self, names: list[str], devices: int, policy: str,
                     score: Callable[[NodeView, int, str], int]) -> tuple[int, list[Summary], bool]:
        """(generation, summaries, whether every one "surely fits"): the summaries are valid at that
        generation; changed_since() names the nodes whose summaries may have changed after it (prioritize
        reuses filter's answer that way). A name that is not a string raises TypeError (or gets no memo).
        Per name, (surely fits, score, HostPriority JSON) for a pod of `devices` units under `policy`:
        "surely fits" is decisions.fit's O(1) case (False means "ask decisions.fit": it may still fit, or
        not, or the node is unknown), the score is `score(view, devices × unit, policy)` (0 without a view),
        the JSON is `{"Host":name,"Score":score}` as prioritize answers it. Memoised per node until its view
        changes, since kube-scheduler asks about the same nodes and pod sizes over and over; filter and
        prioritize of one pod read the same table, so the second finds it in the CPU caches."""
        with self.lock:
            self._flush()
            table = self._table(devices, policy, score)
            memo = table.all
            out: list[Summary | None] = list(map(memo.get, names))
            if None in out:
                views = self._views
                for i, n in enumerate(names):
                    if out[i] is None:
                        view = views.get(n)
                        if view is None:  # not memoised: the node may appear any time
                            out[i] = (False, 0, host_priority_json(n, 0))
                            continue
                        summary = out[i] = memo[n] = self._summary(n, view, devices, policy, score)
                        if summary[0]:
                            table.sure[n] = summary[2]
            return self._generation, out, all(map(_SURE, out))  # type: ignore[return-value]  # no None left

    def sure_items(self, names: list[str], devices: int, policy: str,
                   score: Callable[[NodeView, int, str], int]) -> tuple[int, str] | None:
        """Filter's usual case: when a pod of `devices` units surely fits on every one of `names`, the
        generation (as summaries_at) and their HostPriority JSON joined with commas (prioritize's answer
        inside its brackets); None otherwise, names that are not strings included (then ask summaries_at)."""
        with self.lock:
            self._flush()
            try:  # one pass in C: join() refuses the first None, a node missing from the sure memo
                return self._generation, ",".join(map(self._table(devices, policy, score).sure.get, names))
            except TypeError:  # that, or a name that is no string: summaries_at tells them apart
                return None

    def _table(self, devices: int, policy: str, score: Callable[[NodeView, int, str], int]) -> SummaryTable:
        key = (devices, policy)
        table = self._summaries.get(key)
        if table is None:
            if len(self._summaries) >= MAX_SUMMARY_TABLES:
                self._summaries.clear()
            table = self._summaries[key] = SummaryTable(score, {}, {})
        return table

    def views_of(self, names: list[str]) -> list[NodeView | None]:
        """Views of many nodes under one lock (filter and prioritize ask for hundreds at a time)."""
        with self.lock:
            dirty, views = self._dirty, self._views
            out = []
            for name in names:
                if name in dirty:
                    self._rebuild(name)
                out.append(views.get(name))
            return out

    def views(self) -> list[NodeView]:
        with self.lock:
            self._flush()
            return list(self._views.values())

    def pod(self, namespace: str, name: str) -> PodRecord | None:
        with self.lock:
            uid = self._by_name.get((namespace, name))
            return self._pods.get(uid) if uid else None

    def pod_by_uid(self, uid: str) -> PodRecord | None:
        with self.lock:
            return self._pods.get(uid)

    def charge_of(self, uid: str) -> Charge | None:
        with self.lock:
            return self._charges.get(uid)

    def gpu_node(self, uuid: str) -> str | None:
        with self.lock:
            return self._gpu_node.get(uuid)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"nodes": sum(1 for i in self._inventory.values() if i is not None),
                    "pods": len(self._pods), "reservations": len(self._charges),
                    "pending": len(self._pending)}

    @property
    def synced(self) -> bool:
        return self.nodes_synced.is_set() and self.pods_synced.is_set()


def _gpu_view(g: Gpu, used: int) -> GpuView:
    return GpuView.of(g.uuid, g.index, g.model, g.mem_mib, g.healthy, used)

"""The extender's picture of the cluster: node inventories and pod charges, with per-GPU totals.

Built only from the API server (list + watch, memslice.kube.informer) and from the extender's own in-flight
binds ("pending" charges, see below). All methods are thread-safe (one lock; every operation is O(GPUs of
one node) except relists). Decisions read immutable `NodeView`s (views.py); what a pod charges is
records.py's. Listeners registered with on_view_change() (the fit memo, fitmemo.py) hear of every view
rebuilt, under the lock.

Pending charges: between choosing a GPU and the watch delivering the pod's new version, the extender's
own bind holds the GPU with a pending charge (so two binds never see the same room). A pending charge is
dropped when the watch delivers a version of the pod at least as new as the extender's last write.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from memslice.contract import Inventory, closeness
from memslice.errors import ContractError

from .records import (
    GPU,
    NAME,
    NAMESPACE,
    NODE,
    RV,
    Charge,
    ChargeT,
    PodEntry,
    PodRecord,
    Record,
    derive_charge,
    effect,
    pod_entry,
    resource_version,
)
from .views import FAR, GpuView, NodeView, Topology

__all__ = ["Charge", "ClusterState", "GpuView", "NodeView", "PodRecord", "pod_entry", "resource_version"]
log = logging.getLogger(__name__)
UNKNOWN_RV = 1 << 62  # pending charges wait for a version this new until the bind says otherwise
MAX_TOPOLOGIES = 1024  # distinct topologies shared (a cluster has a few board types); forgotten when more
_TOPOLOGIES: dict[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]] = {}
MAX_TOPOLOGY_GPUS = 64  # GPUs of one node whose closeness is kept pair by pair (more: all counted far apart)
CHANGE_LOG = 4096  # (generation, node) of the latest view changes, for ClusterState.changed_since
ViewListener = Callable[[str, "NodeView | None"], None]
# A node's GPUs: (unit MiB, ((uuid, index, model, MiB, healthy), ...)), from annotations.Inventory
NodeGpus = tuple[int, tuple[tuple[str, int, str, int, bool], ...]]


@dataclass(frozen=True, slots=True)
class Pending:
    charge: ChargeT | None
    min_rv: int


class ClusterState:
    def __init__(self, assume_ttl: float = 120.0, clock: Callable[[], float] = time.time) -> None:
        self.assume_ttl = assume_ttl
        self.clock = clock
        self.lock = threading.RLock()
        self._inventory: dict[str, NodeGpus | None] = {}  # node -> its GPUs (None: not a memslice node)
        self._topology: dict[str, Topology] = {}  # node -> how close its GPUs are (absent: nothing known)
        self._node_error: dict[str, str] = {}
        self._gpu_node: dict[str, str] = {}
        self._views: dict[str, NodeView] = {}
        self._dirty: set[str] = set()
        self._listeners: list[Callable[[], ViewListener | None]] = []
        self._generation = 0  # bumped whenever a node's view may have changed
        self._changes: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)
        self._pods: dict[str, Record] = {}  # uid -> record (records.py: plain tuples)
        self._by_name: dict[tuple[str, str], str] = {}
        self._charges: dict[str, ChargeT] = {}
        self._used: dict[str, int] = {}
        self._over: dict[str, int] = {}  # GPU -> what its pods' elastic limits add above _used (limit sum - used)
        self._compute: dict[str, int] = {}  # GPU -> the sum of its pods' compute requests (percent)
        self._unplaced: dict[str, int] = {}
        self._pending: dict[str, Pending] = {}
        self.bound_without_reservation = 0  # binds of ours the watch delivered bound but unreserved (_settled)
        self._expiring: dict[str, float] = {}
        self._changed = threading.Condition(self.lock)
        self.last_rv = {"nodes": 0, "pods": 0}  # newest resourceVersion seen per kind (tests wait on it)
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()

    def wait_for(self, predicate: Callable[[ClusterState], bool], timeout: float) -> bool:
        """Wait (at most `timeout` s) until `predicate(self)` holds; re-checked after every change."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def on_view_change(self, listener: ViewListener) -> None:
        """Call `listener(name, view)` (view None: the node is gone) under the lock whenever a node's view
        is rebuilt or dropped."""
        ref = weakref.WeakMethod(listener) if inspect.ismethod(listener) else lambda: listener
        with self.lock:  # a bound method is held weakly: a memo that is dropped stops listening
            self._listeners = [r for r in self._listeners if r() is not None] + [ref]

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
        self._unmap_gpus(name)
        try:
            parsed = Inventory.parse(name, annotations if isinstance(annotations, dict) else {})
            inv = _node_gpus(parsed)
            self._node_error.pop(name, None)
        except ContractError as exc:
            log.warning("%s; the node gets no memslice pods until it is fixed", exc)
            parsed = inv = None
            self._node_error[name] = str(exc)
        self._inventory[name] = inv
        topo = topology(parsed) if parsed is not None else FAR
        if topo != FAR:
            self._topology[name] = topo
        else:
            self._topology.pop(name, None)
        if inv is not None:
            for g in inv[1]:
                self._gpu_node[g[0]] = name
        self._dirty.add(name)
        self._changed.notify_all()

    def _unmap_gpus(self, name: str) -> None:
        old = self._inventory.get(name)
        if old is not None:
            for g in old[1]:
                if self._gpu_node.get(g[0]) == name:
                    del self._gpu_node[g[0]]

    def delete_node(self, name: str, rv: int = 0) -> None:
        with self.lock:
            self._seen("nodes", rv)
            self._unmap_gpus(name)
            self._inventory.pop(name, None)
            self._topology.pop(name, None)
            self._node_error.pop(name, None)
            self._views.pop(name, None)
            self._dirty.discard(name)
            self._view_changed(name, None)
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
        entry = pod_entry(obj)
        if entry is not None:
            with self.lock:
                self._set_pod(*entry)
                self._seen("pods", entry[2])

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
                seen.add(entry[0])
                self._set_pod(*entry)
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

    def _set_pod(self, uid: str, rec: Record | None, rv: int) -> None:
        old = self._pods.get(uid)
        if old is not None:
            self._by_name.pop((old[NAMESPACE], old[NAME]), None)
        if rec is None:
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = rec
            self._by_name[(rec[NAMESPACE], rec[NAME])] = uid
        p = self._pending.get(uid)
        if p is not None and rv >= p.min_rv:
            del self._pending[uid]
            self._settled(p, rec)
        self._recharge(uid)

    def _settled(self, p: Pending, rec: Record | None) -> None:
        """A bind of ours that the watch has caught up with. The Binding carried the reservation, and the API server
        copies a Binding's annotations onto the pod in the update that binds it: a pod delivered bound WITHOUT it had
        them dropped on the way (a mutating webhook on pods/binding; an API server or proxy that does not copy them).
        Nothing is overbooked (the pod then counts as bound without the extender: its node's memory, no GPU; the
        node agent places it by best fit, and refuses it if it spans GPUs), but it must be seen: said loudly, counted
        (memslice_extender_tracked{what="bound_without_reservation"})."""
        if p.charge is None or rec is None or rec[NODE] is None or rec[GPU] is not None:
            return
        self.bound_without_reservation += 1
        log.error("pod %s/%s was bound to %s WITHOUT its reservation (GPU %s): the API server dropped the Binding's "
                  "annotations (a mutating webhook on pods/binding, or an API server or proxy that does not copy "
                  "them); it counts as bound without the extender. Let Bindings keep their memslice.io/ annotations",
                  rec[NAMESPACE], rec[NAME], rec[NODE], p.charge[0])

    def _charge_now(self, uid: str) -> ChargeT | None:
        """What pod `uid` charges now: its pending charge while a bind of ours is in flight, else its record's."""
        p = self._pending.get(uid)
        if p is not None:
            return p.charge
        rec = self._pods.get(uid)
        return derive_charge(rec, self.clock(), self.assume_ttl) if rec is not None else None

    def _recharge(self, uid: str) -> None:
        old = self._charges.get(uid)
        new = self._charge_now(uid)
        if new != old:
            if old is not None and new is not None and effect(old) == effect(new):
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
        if new is not None and new[4] is not None:
            self._expiring[uid] = new[4]
        self._changed.notify_all()

    def _apply(self, c: ChargeT, sign: int) -> None:
        gpu, node, mib, devices, _, over, compute = c
        if gpu is not None and "," in gpu:  # a pod spanning GPUs: its share on each (records.py)
            for one in gpu.split(","):
                self._apply((one, node, mib, devices, None, over, compute), sign)
            return
        if gpu is not None:
            if compute:  # pods with a compute share only
                left = self._compute.get(gpu, 0) + sign * compute
                if left:
                    self._compute[gpu] = left
                else:
                    self._compute.pop(gpu, None)
            left = self._used.get(gpu, 0) + sign * mib
            if left:
                self._used[gpu] = left
            else:
                self._used.pop(gpu, None)
            if over:  # elastic pods only
                left = self._over.get(gpu, 0) + sign * over
                if left:
                    self._over[gpu] = left
                else:
                    self._over.pop(gpu, None)
            node = self._gpu_node.get(gpu)
            if node is not None:
                self._dirty.add(node)
        elif node is not None:
            left = self._unplaced.get(node, 0) + sign * devices
            if left:
                self._unplaced[node] = left
            else:
                self._unplaced.pop(node, None)
            self._dirty.add(node)

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
                                 rec[NAMESPACE], rec[NAME], rec[GPU] or "?", self.assume_ttl)
                    self._recharge(uid)

    # ------------------------------------------------------------------ in-flight binds
    def hold(self, uid: str, charge: Charge | None) -> None:
        """Charge `charge` (None: nothing) for pod `uid` now, until release() or until the watch catches up."""
        with self.lock:
            plain: ChargeT | None = None
            if charge is not None:  # the Charge's fields as the plain tuple the records keep
                plain = (charge.gpu_uuid, charge.node, charge.mib, charge.devices, charge.expires, charge.over,
                         charge.compute)
            self._pending[uid] = Pending(plain, UNKNOWN_RV)
            self._recharge(uid)

    def in_flight(self, uid: str) -> bool:
        """A bind of pod `uid` holds a charge that the watch has not caught up with yet (the cache is stale)."""
        with self.lock:
            return uid in self._pending

    def confirm(self, uid: str, min_rv: int) -> None:
        """The bind succeeded; the pending charge stays until the watch delivers version `min_rv`."""
        with self.lock:
            p = self._pending.get(uid)
            if p is not None:
                rec = self._pods.get(uid)
                if rec is not None and rec[RV] >= min_rv:
                    del self._pending[uid]
                    self._settled(p, rec)
                    self._recharge(uid)
                else:
                    self._pending[uid] = Pending(p.charge, min_rv)

    def release(self, uid: str, undone_rv: int | None) -> None:
        """The bind failed. With `undone_rv` (the version that removed the annotations) the pod charges
        nothing until the watch delivers it; without (the undo failed), the watched state rules."""
        with self.lock:
            rec = self._pods.get(uid)
            if undone_rv is None or (rec is not None and rec[RV] >= undone_rv):
                self._pending.pop(uid, None)
            else:
                self._pending[uid] = Pending(None, undone_rv)
            self._recharge(uid)

    # ------------------------------------------------------------------ reads
    def view(self, name: str) -> NodeView | None:
        """The node as decisions see it; None when it is unknown or not a memslice node."""
        with self.lock:
            return self.view_unlocked(name)

    def view_unlocked(self, name: str) -> NodeView | None:
        """view() for a caller that holds the lock."""
        if name in self._dirty:
            self._rebuild(name)
        return self._views.get(name)

    def views_unlocked(self) -> dict[str, NodeView] | None:
        """Every view by node name, for a caller that holds the lock (read only); None while some view awaits its
        rebuild (view_unlocked() then rebuilds each as it is asked for). Why: the memo's fill of a spanning table
        reads hundreds of views in one C call (_nameids.span_fill), where a call of view_unlocked per node cost
        more than the rest of that fill (issue 34)."""
        return None if self._dirty else self._views

    def knows_node(self, name: str) -> bool:
        with self.lock:
            return name in self._inventory

    def _rebuild(self, name: str) -> None:
        self._dirty.discard(name)
        inv = self._inventory.get(name)
        view: NodeView | None = None
        if inv is not None:
            unit_mib, specs = inv
            used = self._used
            rows = tuple((*g, u, g[3] - u) for g in specs if (u := used.get(g[0], 0)) is not None)  # GpuView rows
            over = None  # the limit sums' column, only where an elastic pod is (else: limit sum = used)
            if self._over and any(g[0] in self._over for g in specs):
                over = tuple(self._over.get(g[0], 0) for g in specs)
            compute = None  # the compute requests' column, only where a pod with a compute share is
            if self._compute and any(g[0] in self._compute for g in specs):
                compute = tuple(self._compute.get(g[0], 0) for g in specs)
            view = NodeView.of_rows(name, unit_mib, rows, self._unplaced.get(name, 0) * unit_mib, over=over,
                                    compute=compute, topo=self._topology.get(name, FAR))
        elif name in self._node_error:
            view = NodeView.of(name, 1, (), 0, self._node_error[name])
        if view is None:
            self._views.pop(name, None)
        else:
            self._views[name] = view
        self._view_changed(name, view)

    def _view_changed(self, name: str, view: NodeView | None) -> None:
        self._generation += 1
        self._changes.append((self._generation, name))
        for ref in self._listeners:
            listener = ref()
            if listener is not None:
                listener(name, view)

    def changed_since(self, generation: int) -> set[str] | None:
        """Nodes whose views may differ from those of `generation` (see current()); None when that
        generation is too old to tell (then everything may have changed)."""
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

    @contextmanager
    def current(self) -> Iterator[int]:
        """Hold the lock with every view up to date (and its listeners told); yields the generation."""
        with self.lock:
            self._flush()
            yield self._generation

    def _flush(self) -> None:
        if self._dirty:
            names = list(self._dirty)
            self._dirty.clear()  # also shrinks the table: iterating a set that once held 5,000 names is slow
            for name in names:
                self._rebuild(name)

    def views(self) -> list[NodeView]:
        with self.lock:
            self._flush()
            return list(self._views.values())

    def snapshot(self) -> tuple[int, list[NodeView]]:
        """(generation, every view) under one lock: the same generation means the same views."""
        with self.lock:
            self._flush()
            return self._generation, list(self._views.values())

    def pod(self, namespace: str, name: str) -> PodRecord | None:
        with self.lock:
            uid = self._by_name.get((namespace, name))
            rec = self._pods.get(uid) if uid else None
            return PodRecord.of(rec) if rec is not None else None

    def charge_of(self, uid: str) -> Charge | None:
        with self.lock:
            c = self._charges.get(uid)
            return Charge._make(c) if c is not None else None

    def gpu_node(self, uuid: str) -> str | None:
        """The node of a GPU (or of the first of several joined by commas: a charge spanning GPUs)."""
        with self.lock:
            return self._gpu_node.get(uuid.split(",", 1)[0] if "," in uuid else uuid)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"nodes": sum(1 for i in self._inventory.values() if i is not None),
                    "pods": len(self._pods), "reservations": len(self._charges),
                    "pending": len(self._pending), "bound_without_reservation": self.bound_without_reservation}

    @property
    def synced(self) -> bool:
        return self.nodes_synced.is_set() and self.pods_synced.is_set()


def topology(inv: Inventory) -> Topology:
    """How close the node's GPUs are (views.Topology), in inventory order: the closeness of every pair when
    they differ, else the one value all pairs share."""
    gpus = inv.gpus
    if len(gpus) > MAX_TOPOLOGY_GPUS:  # bounded: a matrix per node of this size would cost more than it tells
        return FAR
    matrix = tuple(tuple(0 if a is b else closeness(a, b) for b in gpus) for a in gpus)
    values = {m for i, row in enumerate(matrix) for j, m in enumerate(row) if i != j}
    if len(values) <= 1:
        return values.pop() if values else FAR
    shared = _TOPOLOGIES.setdefault(matrix, matrix)  # one object per board type: spanning.py keys its sets by it
    if len(_TOPOLOGIES) > MAX_TOPOLOGIES:
        _TOPOLOGIES.clear()
    return shared


def _node_gpus(inv: Inventory | None) -> NodeGpus | None:
    """The inventory as plain tuples (never scanned by the cyclic GC; see records.py), UUIDs interned."""
    if inv is None:
        return None
    return inv.unit_mib, tuple((sys.intern(g.uuid), g.index, g.model, g.mem_mib, g.healthy) for g in inv.gpus)

"""Bind: choose the GPU, then ONE write: the Binding, carrying the reservation annotations (the API server
copies a Binding's metadata.annotations onto the pod in the same update that sets spec.nodeName:
BindingREST.setPodNodeAndMetadata), with the pod's UID and resourceVersion as preconditions. So the pod is
never bound without its reservation, and a failed bind writes nothing (nothing to undo). This used to
be two writes (annotate, then bind, then undo on failure): twice the latency under load. Old API servers: a
Binding's annotations were copied long before 1.30 (setPodHostAndAnnotations), its UID and resourceVersion
preconditions are honoured since 1.23 (kubernetes#105913; the UID kept through create since 1.27, #116550,
backported to 1.24-1.26 patches); deploy/ supports 1.30 and newer, where all hold (tests/extender/
test_extender_cluster.py checks them on the real API server). Should something drop the annotations on the way (a
mutating webhook on pods/binding), the pod counts as bound without the extender (no GPU overbooked) and
ClusterState._settled says so, counted (tests/extender/test_extender_cluster.py).

Concurrency:
- Within the extender, choosing the GPU and charging it (ClusterState.hold) happen under the state lock,
  so of two binds racing for the last room on a GPU exactly one gets it; the other gets another GPU or an
  `Error`. Binds of the same pod are serialised (the scheduler may retry a bind after a timeout).
- Against other writers, the Binding carries the pod's resourceVersion as a precondition (409 → re-read the
  pod once and retry) and its UID, so a pod deleted and re-created under the same name is never bound with
  another pod's reservation.
- One extender binds at a time: two called together would each trust their own in-memory holds (deploy/base:
  only the leader's kube-scheduler calls the extender of its own pod).

A Binding cannot delete an annotation: a limit record left by an earlier reservation of the pod (written by
an older extender, which annotated before binding, whose undo failed) is overwritten with an empty record
"{}" when the new reservation has no limits. A reservation left unbound by such an extender still stops counting after
`--assume-ttl` (state.py).

Who may be bound (every check before anything is written; a refusal is an `Error` and writes nothing):
- the request names the pod's UID (an empty PodUID is refused by the wire decoder) and it is the UID of the
  pod of that name now;
- the pod's spec.schedulerName is one the extender serves (--scheduler-names): the extender never binds
  pods another scheduler owns, whoever asks;
- the node is one the extender knows from its node watch; a pod asking for memslice.io/gpu-mem goes only
  to a memslice node where a healthy GPU has room (the GPU is chosen here, on that node's view).
The watch cache answers "which scheduler" only for pods ServedPods has seen pending with a served
scheduler name (spec.schedulerName is immutable); any other pod is read from the API server and checked.

The write goes through podwrites.PodWriter (the official client's pool, without the generated layer:
see there why); the pod is read, when the watch cache cannot answer, through the generated API.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import orjson

from memslice import errors
from memslice.contract import ANN_GPU_UUID
from memslice.elastic import ANN_LIMIT_RECORD as ANN_GPU_MEM_LIMIT_RECORD

from ..placement import decisions
from ..placement.resources import PodRequest, RequestError, pod_request
from ..placement.state import Charge, ClusterState, resource_version
from ..wire import BindingArgs
from .annotations import reservation_annotations
from .podwrites import PodWriter

log = logging.getLogger(__name__)


class BindError(errors.UnavailableError):
    """A bind that failed; `reason` is a short label for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PodFacts:
    uid: str
    rv: str
    node: str | None
    request: PodRequest | None
    gpu_uuid: str | None
    limit_record: bool = False  # the pod carries a limit record (of an earlier reservation)


@dataclass(frozen=True)
class BindOutcome:
    gpu_uuid: str | None  # a pod spanning GPUs: their UUIDs joined by commas (contract.ANN_GPU_UUID)
    mib: int  # on each GPU


def _body(resp: Any) -> bytes:
    """Read a raw (`_preload_content=False`) response and give its connection back to the pool."""
    data = resp.data
    resp.release_conn()
    return bytes(data)


DEFAULT_SCHEDULER_NAMES = ("memslice-scheduler",)


class ServedPods:
    """UIDs of the pending pods (no spec.nodeName) whose spec.schedulerName the extender serves, kept from
    the pod watch (see Extender): the binder trusts its watch cache for a pod only when the UID is here.
    Bounded by the number of pending pods of the memslice scheduler; a pod leaves when it is bound or
    deleted, and a relist keeps only the UIDs it listed."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self._uids: set[str] = set()
        self._lock = threading.Lock()

    def note(self, obj: dict[str, Any]) -> None:
        """A pod as the watch delivered it (added or modified)."""
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return
        spec = obj.get("spec") or {}
        served = not spec.get("nodeName") and spec.get("schedulerName") in self.names
        with self._lock:
            if served:
                self._uids.add(uid)
            else:
                self._uids.discard(uid)

    def forget(self, obj: dict[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            self._uids.discard(uid)

    def keep_only(self, uids: Iterable[str]) -> None:
        """After a relist: only the UIDs listed stay (the list's notes added them; pods deleted meanwhile go)."""
        with self._lock:
            self._uids = {uid for uid in uids if uid in self._uids}

    def __contains__(self, uid: object) -> bool:
        with self._lock:
            return uid in self._uids

    def __len__(self) -> int:
        with self._lock:
            return len(self._uids)


class Binder:
    def __init__(self, core: Any, writer: PodWriter, state: ClusterState, default_policy: str,
                 clock: Callable[[], float], served: ServedPods | None = None,
                 limit_ratio: Fraction | None = None) -> None:
        self.core = core
        self.limit_ratio = limit_ratio  # --max-limit-ratio; None: no cap on the sum of limits
        self.served = served if served is not None else ServedPods(frozenset(DEFAULT_SCHEDULER_NAMES))
        self.writer = writer
        self.state = state
        self.default_policy = default_policy
        self.clock = clock
        self._pod_locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _pod_lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._locks_guard:
            lock = self._pod_locks.get(key)
            if lock is None:
                if len(self._pod_locks) > 10_000:  # forget idle locks
                    for k, v in list(self._pod_locks.items()):
                        if not v.locked():
                            del self._pod_locks[k]
                lock = self._pod_locks[key] = threading.Lock()
            return lock

    def bind(self, args: BindingArgs) -> BindOutcome:
        with self._pod_lock((args.pod_namespace, args.pod_name)):
            return self._bind(args)

    def _read_pod(self, args: BindingArgs) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.core.read_namespaced_pod(args.pod_name, args.pod_namespace, _preload_content=False,
                                                 _request_timeout=10)
        except ApiException as exc:
            if exc.status == 404:
                raise BindError("not_found",
                                f"pod {args.pod_namespace}/{args.pod_name} does not exist") from None
            raise BindError("api", f"reading pod {args.pod_namespace}/{args.pod_name} failed: "
                                   f"{exc.status} {exc.reason}") from None
        pod: dict[str, Any] = orjson.loads(_body(resp))
        uid = pod["metadata"].get("uid", "")
        if uid != args.pod_uid:
            raise BindError("uid", f"pod {args.pod_namespace}/{args.pod_name} has UID {uid}, not "
                                   f"{args.pod_uid} (it was deleted and re-created); the scheduler will "
                                   f"retry the new pod")
        return pod

    def _facts(self, args: BindingArgs) -> PodFacts:
        """What bind needs of the pod: from the watch cache when it has the pod unbound and unreserved and no
        bind of it is in flight (saves a GET per bind; a stale cache only costs a 409 and a re-read), else from
        the API server (so a retry of a bind that succeeded, before the watch delivers it, writes nothing)."""
        rec = self.state.pod(args.pod_namespace, args.pod_name)
        if (rec is not None and rec.node is None and rec.reservation is None and rec.request is not None
                and rec.uid == args.pod_uid and rec.rv and rec.uid in self.served
                and not self.state.in_flight(rec.uid)):  # a retried bind the watch has not seen yet: GET
            return PodFacts(rec.uid, str(rec.rv), None, rec.request, None)
        pod = self._read_pod(args)
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        scheduler = (pod.get("spec") or {}).get("schedulerName")
        if scheduler not in self.served.names:
            raise BindError("scheduler", f"{where} has schedulerName {scheduler!r}; the memslice extender "
                                         f"binds only pods of {', '.join(sorted(self.served.names))} "
                                         f"(--scheduler-names)")
        try:
            request = pod_request(pod)
        except RequestError as exc:
            raise BindError("bad_request", f"{where}: {exc}") from None
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        return PodFacts(meta["uid"], meta["resourceVersion"], (pod.get("spec") or {}).get("nodeName"), request,
                        annotations.get(ANN_GPU_UUID), ANN_GPU_MEM_LIMIT_RECORD in annotations)

    def _bind(self, args: BindingArgs) -> BindOutcome:
        facts = self._facts(args)
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        if facts.node:
            if facts.node == args.node:  # a retried bind that already succeeded
                return BindOutcome(facts.gpu_uuid, 0)
            raise BindError("already_bound", f"{where} is already bound to node {facts.node}")
        request = facts.request
        if not self.state.knows_node(args.node):
            raise BindError("unknown_node", f"node {args.node} is unknown to the extender (not in its "
                                            f"node watch); {where} is not bound")
        if request is None:  # not a memslice pod: plain binding
            self._post_binding(args, facts.uid)
            return BindOutcome(None, 0)

        uid = facts.uid
        policy = request.policy or self.default_policy
        with self.state.lock:
            self.state.expire()
            self.state.hold(uid, None)  # a stale reservation of this same pod must not stand in its way
            view = self.state.view(args.node)
            chosen = None
            limit = None
            if view is not None:  # a pod spanning GPUs: need, limit and compute are its share on each
                need = request.mib(view.unit_mib)
                if self.limit_ratio is not None:  # the cap, re-checked here under the lock with the room
                    limit = decisions.LimitNeed(request.limit_mib(view.unit_mib), self.limit_ratio)
                chosen = decisions.choose_gpus(view, need, policy, limit, request.compute, request.gpus)
            if view is None or chosen is None:
                self.state.release(uid, None)
                if view is None:
                    raise BindError("unknown_node", f"node {args.node} " + (
                        "has no memslice GPUs (no memslice.io/gpus annotation)" if self.state.knows_node(args.node)
                        else "is unknown to the extender"))
                reason = (decisions.verdict(view, need, policy, limit, request.compute, request.gpus)[2]
                          if request.compute or request.gpus > 1 else decisions.fit(view, need, limit).reason)
                raise BindError("no_room", f"{where} no longer fits on node {args.node}: {reason}")
            try:  # elastic memory: each limit checked against its request at the node's unit, nothing written
                limits = request.limit_record_total(view.unit_mib)
            except RequestError as exc:
                self.state.release(uid, None)
                raise BindError("bad_request", f"{where}: {exc}") from None
            # the limit above the request is charged too (the GPU's limit sum), cap or not: a later restart
            # with the cap on rebuilds the same sums from the recorded limits
            over = request.limit_mib(view.unit_mib) - need
            uuids = ",".join(g.uuid for g in chosen)  # contract: N UUIDs in device order, each charged `need`
            self.state.hold(uid, Charge(uuids, args.node, need, 0, None, over, request.compute))
        now = self.clock()
        wanted = reservation_annotations(uuids, request.container_mib_total(view.unit_mib), now, limits,
                                         request.compute_record())
        if facts.limit_record and ANN_GPU_MEM_LIMIT_RECORD not in wanted:
            wanted[ANN_GPU_MEM_LIMIT_RECORD] = "{}"  # a Binding cannot delete a stale record: it empties it
        try:
            bound_rv = self._bind_with(args, uid, facts.rv, wanted)
        except BindError as exc:
            pod = self._read_or_none(args) if exc.reason == "ambiguous" else None
            if pod is not None and (pod.get("spec") or {}).get("nodeName") == args.node:
                self.state.confirm(uid, resource_version(pod["metadata"]))  # the watch's version rules
                return BindOutcome(uuids, need)
            self.state.release(uid, None)  # nothing was written (or the watch will tell): the watch rules
            raise
        if bound_rv is None:  # an earlier attempt bound it here already; its reservation stands
            self.state.release(uid, None)
            return BindOutcome(None, 0)
        self.state.confirm(uid, bound_rv)
        log.info("bound %s to %s GPU %s (index %s) with %d MiB (%s)", where, args.node, uuids,
                 ",".join(str(g.index) for g in chosen), need, policy)
        return BindOutcome(uuids, need)

    def _bind_with(self, args: BindingArgs, uid: str, rv: str, wanted: dict[str, str]) -> int | None:
        """ONE write: the Binding carrying the reservation annotations (the API server copies a Binding's
        annotations onto the pod in the same update that sets spec.nodeName) with the pod's UID and
        resourceVersion as preconditions. The version the pod then has is at least rv + 1 (the precondition
        makes the bound version the next one); None when the pod turns out to be bound to this node already.
        A 409 (the pod changed meanwhile) re-reads the pod and retries once with its new version."""
        for attempt in (1, 2):
            try:
                self._post_binding(args, uid, rv, wanted)
                return resource_version({"resourceVersion": rv}) + 1
            except BindError as exc:
                if exc.reason != "conflict" or attempt == 2:
                    raise
            pod = self._read_pod(args)  # the UID checked again: a re-created pod is another pod
            node = (pod.get("spec") or {}).get("nodeName")
            if node == args.node:
                return None
            if node:
                raise BindError("already_bound", f"pod {args.pod_namespace}/{args.pod_name} was bound to {node} "
                                                 f"meanwhile")
            rv = pod["metadata"]["resourceVersion"]
        raise AssertionError("unreachable")

    def _post_binding(self, args: BindingArgs, uid: str, rv: str | None = None,
                      annotations: dict[str, str] | None = None) -> None:
        from kubernetes.client.exceptions import ApiException

        meta: dict[str, Any] = {"name": args.pod_name, "namespace": args.pod_namespace, "uid": uid}
        if rv is not None:
            meta["resourceVersion"] = rv
        if annotations:
            meta["annotations"] = annotations
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": args.node}}
        try:
            self.writer.create_namespaced_pod_binding(args.pod_name, args.pod_namespace, body)
        except ApiException as exc:
            message = exc.reason
            try:
                message = orjson.loads(exc.body or b"").get("message", message)
            except (TypeError, ValueError, AttributeError):
                pass
            reason = "conflict" if exc.status == 409 else ("ambiguous" if exc.status >= 500 else "binding")
            raise BindError(reason, f"binding pod {args.pod_namespace}/{args.pod_name} to {args.node} "
                                    f"failed: {exc.status} {message}") from None
        except Exception as exc:  # noqa: BLE001 - the request may or may not have reached the server
            raise BindError("ambiguous", f"binding pod {args.pod_namespace}/{args.pod_name} to {args.node} "
                                         f"failed: {exc}") from None

    def _read_or_none(self, args: BindingArgs) -> dict[str, Any] | None:
        try:
            return self._read_pod(args)
        except BindError:
            return None

"""The extender verbs: decode the request, decide over ClusterState, encode the answer.

Each handler returns (HTTP status, JSON body). Requests that do not follow the extender API (not JSON,
missing or mistyped fields) get 400 with an `Error`; a well-formed request for a pod that cannot be
served (a negative quantity, an unknown policy, a bind that fails) gets 200 with an `Error`, because
kube-scheduler shows the `Error` text in the pod's events but only the status code of a non-200 answer.
Nothing here changes state except a successful bind.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from memslice.scheduler_extender import decisions, wire
from memslice.scheduler_extender.binder import Binder, BindError
from memslice.scheduler_extender.metrics import Metrics
from memslice.scheduler_extender.resources import PodRequest, RequestError, pod_request
from memslice.scheduler_extender.state import ClusterState, Summary
from memslice.scheduler_extender.wire import WireError

log = logging.getLogger(__name__)
RECENT_FILTERS = 64  # filter answers kept for the prioritize call that follows (one per pod in flight)
MEMO_NAMES = 200_000  # node names those answers may hold in all (bounds the memory hostile requests can pin)
NOT_SYNCED = ("the memslice extender has not finished listing nodes and pods from the API server yet; "
              "the scheduler will retry")


@dataclass(frozen=True, slots=True)
class FilterMemo:
    """What filter computed for a pod, for the prioritize call kube-scheduler makes next with (usually)
    the same node names: prioritize then reads none of the per-node tables again, only the nodes whose
    views changed in between (ClusterState.changed_since), so its answer is what a fresh one would be."""

    key: tuple[int, str]  # (devices, policy)
    names: list[str]
    generation: int
    summaries: list[Summary] | None  # None when filter took the usual case (ClusterState.sure_items) ...
    items: str | None = None  # ... and kept prioritize's answer instead: HostPriority JSON joined by commas


class Verbs:
    def __init__(self, state: ClusterState, binder: Binder, default_policy: str, metrics: Metrics) -> None:
        self.state = state
        self.binder = binder
        self.default_policy = default_policy
        self.metrics = metrics
        self._memos: dict[str, FilterMemo] = {}  # pod UID -> its latest filter, oldest first
        self._memo_names = 0  # names held by self._memos
        self._memos_lock = threading.Lock()

    def _remember(self, uid: Any, memo: FilterMemo) -> None:
        if not isinstance(uid, str) or not uid or len(memo.names) > MEMO_NAMES:
            return
        with self._memos_lock:
            self._forget(uid)
            self._memos[uid] = memo
            self._memo_names += len(memo.names)
            while len(self._memos) > RECENT_FILTERS or self._memo_names > MEMO_NAMES:
                self._forget(next(iter(self._memos)))

    def _forget(self, uid: str) -> FilterMemo | None:
        """Drop the memo of `uid` (caller holds _memos_lock); the memo, or None."""
        memo = self._memos.pop(uid, None)
        if memo is not None:
            self._memo_names -= len(memo.names)
        return memo

    def _recall(self, uid: Any, key: tuple[int, str], names: list[str]) -> bytes | None:
        """Prioritize's answer from filter's memo for this pod and these names, brought up to date; None if
        there is none (or it cannot be brought up to date cheaply)."""
        if not isinstance(uid, str) or not uid:
            return None
        with self._memos_lock:
            memo = self._forget(uid)
        if memo is None or memo.key != key or memo.names != names:
            return None
        changed = self.state.changed_since(memo.generation)
        if changed is None:
            return None
        if not changed or changed.isdisjoint(names):
            if memo.items is not None:
                return ("[" + memo.items + "]").encode()
            assert memo.summaries is not None
            return wire.host_priority_array([summary[2] for summary in memo.summaries])
        if memo.summaries is None:  # some of the nodes changed since filter's usual case: ask again
            return None
        summaries = list(memo.summaries)
        stale = [i for i, n in enumerate(names) if n in changed]
        fresh = self.state.summaries([names[i] for i in stale], key[0], key[1], decisions.score)
        for i, summary in zip(stale, fresh, strict=True):
            summaries[i] = summary
        return wire.host_priority_array([summary[2] for summary in summaries])

    def _unfit_reason(self, name: str) -> tuple[bool, str]:
        """(unresolvable, reason) for a node without a view."""
        if self.state.knows_node(name):
            return True, ("node has no memslice GPUs (no memslice.io/gpus annotation: is the memslice node "
                          "agent running there?)")
        return False, "node is not (yet) known to the memslice extender"

    def _own_charge(self, pod: dict[str, Any]) -> tuple[str, str, int] | None:
        """(node, GPU UUID, MiB) of a reservation this unbound pod already holds (a bind that failed and
        could not be undone): it must not count against the pod itself."""
        uid = (pod.get("metadata") or {}).get("uid")
        charge = self.state.charge_of(uid) if isinstance(uid, str) and uid else None
        if charge is None or charge.gpu_uuid is None or charge.node is not None:
            return None
        node = self.state.gpu_node(charge.gpu_uuid)
        return (node, charge.gpu_uuid, charge.mib) if node else None

    def _all_pass(self, args: wire.ExtenderArgs, memo: FilterMemo) -> tuple[int, Any]:
        """Filter's answer when every node passes; the memo is kept for the pod's prioritize."""
        self._remember(args.pod["metadata"].get("uid"), memo)
        return 200, wire.filter_result(args, list(memo.names), {}, {})

    def filter(self, body: Any) -> tuple[int, Any]:
        try:
            args = wire.decode_extender_args(body, check=False)
        except WireError as exc:
            return 400, wire.filter_result(None, [], {}, {}, str(exc))
        try:
            request: PodRequest | None = pod_request(args.pod)
            pod_error = ""
        except RequestError as exc:
            request, pod_error = None, str(exc)
        found = None
        if request is not None and self.state.synced and args.node_names is not None:
            # The usual case first, before the names are checked one by one: if the state knows them all
            # as nodes where the pod surely fits, they are nodes' names, valid by construction.
            self.state.expire()
            key = (request.devices, request.policy or self.default_policy)
            usual = self.state.sure_items(args.node_names, key[0], key[1], decisions.score)
            if usual is not None:
                return self._all_pass(args, FilterMemo(key, args.node_names, usual[0], None, usual[1]))
            try:  # some node not in the "sure" memo yet (or not surely fitting): the per-node summaries
                found = self.state.summaries_at(args.node_names, key[0], key[1], decisions.score)
            except TypeError:  # not a string: check_names says which
                found = None
            if found is not None and found[2]:
                return self._all_pass(args, FilterMemo(key, args.node_names, found[0], found[1]))
        try:
            args = wire.check_names(args)
        except WireError as exc:
            return 400, wire.filter_result(None, [], {}, {}, str(exc))
        names = args.names()
        if pod_error:
            return 200, wire.filter_result(args, [], {}, {}, pod_error)
        if request is None:  # not a memslice pod: untouched
            return 200, wire.filter_result(args, list(names), {}, {})
        if not self.state.synced:
            return 200, wire.filter_result(args, [], {}, {}, NOT_SYNCED)
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        self.state.expire()
        devices = request.devices
        own = self._own_charge(args.pod)
        key = (devices, request.policy or self.default_policy)
        generation, summaries, _ = found if found is not None else self.state.summaries_at(
            names, key[0], key[1], decisions.score)
        uid = args.pod["metadata"].get("uid")
        fast = [summary[0] for summary in summaries]
        slow = [n for n, ok in zip(names, fast, strict=True) if not ok]
        slow_views = dict(zip(slow, self.state.views_of(slow), strict=True))
        kept: list[Summary] = []  # the summaries of `passed`, for prioritize
        for name, ok, summary in zip(names, fast, summaries, strict=True):
            if ok:
                passed.append(name)
                kept.append(summary)
                continue
            view = slow_views[name]
            if view is None:
                final, reason = self._unfit_reason(name)
                (unresolvable if final else failed)[name] = reason
                continue
            if own is not None and own[0] == name and decisions.fits_without(
                    view, devices * view.unit_mib, {own[1]: own[2]}, 0):
                passed.append(name)  # room once the pod's own stale reservation is not counted
                kept.append(summary)
                continue
            f = decisions.fit(view, devices * view.unit_mib)
            if f.ok:
                passed.append(name)
                kept.append(summary)
            elif f.unresolvable:
                unresolvable[name] = f.reason
            else:
                failed[name] = f.reason
        self._remember(uid, FilterMemo(key, passed, generation, kept))
        return 200, wire.filter_result(args, passed, failed, unresolvable)

    def prioritize(self, body: Any) -> tuple[int, Any]:
        try:
            args = wire.decode_extender_args(body, check=False)
        except WireError as exc:
            return 400, {"Error": str(exc)}
        try:
            request: PodRequest | None = pod_request(args.pod)
        except RequestError as exc:
            request, pod_error = None, str(exc)
        else:
            pod_error = ""
        if request is not None and self.state.synced and args.node_names is not None:
            # the names filter answered (the usual case) were checked by filter: equal ones need no check
            key = (request.devices, request.policy or self.default_policy)
            self.state.expire()
            answer = self._recall(args.pod["metadata"].get("uid"), key, args.node_names)
            if answer is not None:
                return 200, answer
        try:
            args = wire.check_names(args)
        except WireError as exc:
            return 400, {"Error": str(exc)}
        names = args.names()
        if pod_error:
            return 400, {"Error": pod_error}  # HostPriorityList has no Error field
        if request is None or not self.state.synced:
            return 200, wire.encode_host_priority_list(names, [0] * len(names))
        key = (request.devices, request.policy or self.default_policy)
        self.state.expire()
        summaries = self.state.summaries(names, key[0], key[1], decisions.score)
        return 200, wire.host_priority_array([summary[2] for summary in summaries])

    def bind(self, body: Any) -> tuple[int, Any]:
        try:
            args = wire.decode_binding_args(body)
        except WireError as exc:
            self.metrics.bind_failures.labels("bad_request").inc()
            return 400, wire.binding_result(str(exc))
        if not self.state.synced:
            self.metrics.bind_failures.labels("not_synced").inc()
            return 200, wire.binding_result(NOT_SYNCED)
        try:
            self.binder.bind(args)
        except BindError as exc:
            log.warning("bind failed: %s", exc)
            self.metrics.bind_failures.labels(exc.reason).inc()
            return 200, wire.binding_result(str(exc))
        self.metrics.bound.inc()
        return 200, wire.binding_result("")

    def preempt(self, body: Any) -> tuple[int, Any]:
        """Keep the scheduler's victims on a node only if evicting them lets the pod fit on one GPU there;
        drop the node otherwise. Victims are never trimmed: the scheduler may need them for CPU/memory."""
        try:
            args = wire.decode_preemption_args(body)
        except WireError as exc:
            return 400, {"NodeNameToMetaVictims": None, "Error": str(exc)}
        try:
            request = pod_request(args.pod)
        except RequestError as exc:
            return 400, {"NodeNameToMetaVictims": None, "Error": str(exc)}
        if request is None:
            return 200, wire.preemption_result(args.victims)
        if not self.state.synced:
            return 200, wire.preemption_result({})
        keep: dict[str, wire.Victims] = {}
        self.state.expire()
        for node, victims in args.victims.items():
            view = self.state.view(node)
            if view is None:
                continue
            freed: dict[str, int] = {}
            freed_unplaced = 0
            for uid in victims.uids:
                charge = self.state.charge_of(uid)
                if charge is None:
                    continue
                if charge.gpu_uuid is not None:
                    if self.state.gpu_node(charge.gpu_uuid) == node:
                        freed[charge.gpu_uuid] = freed.get(charge.gpu_uuid, 0) + charge.mib
                elif charge.node == node:
                    freed_unplaced += charge.devices * view.unit_mib
            if decisions.fits_without(view, request.mib(view.unit_mib), freed, freed_unplaced):
                keep[node] = victims
        return 200, wire.preemption_result(keep)

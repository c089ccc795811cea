"""The extender verbs: decode the request, decide over ClusterState, encode the answer.

Each handler returns (HTTP status, JSON body). Requests that do not follow the extender API (not JSON,
missing or mistyped fields) get 400 with an `Error`; a well-formed request for a pod that cannot be
served (a negative quantity, an unknown policy, a bind that fails) gets 200 with an `Error`, because
kube-scheduler shows the `Error` text in the pod's events but only the status code of a non-200 answer.
Nothing here changes state except a successful bind.

The pod is decoded once (records.PodView); fit and score are decisions.py's, read through the memo
(fitmemo.py): filter's fast path is one lookup pass when the pod fits on every node, its slow path one pass
over the memoised verdicts. Filter and prioritize first try the request's bytes (filter_json,
prioritize_json): the names are then looked up, and compared, without being decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from .. import wire
from ..index.fitmemo import FitMemo, Key, Split, compute_of, gpus_of
from ..kubeio.binder import Binder, BindError
from ..kubeio.kubereads import pod_priority
from ..placement import decisions
from ..placement.records import PodView
from ..placement.state import ClusterState
from ..wire import ExtenderArgs, JsonParts, WireError
from .gate import BindGate
from .metrics import Metrics

log = logging.getLogger(__name__)
NOT_SYNCED = ("the memslice extender has not finished listing nodes and pods from the API server yet; "
              "the scheduler will retry")
KEPT_HEAD_BYTES = 64 << 10  # a filter head kept for its prioritize at most (a pod's JSON: 2-20 KB)
PREEMPT_NODE_READS = 16  # nodes per preempt request whose pods' priorities may be read from the API server
# Pods the N-GPU victim searches of one preempt request may weigh in all (decisions.SearchBudget), split evenly
# over the nodes it names: ~5 us each, so ~2.5 s at most (kube-scheduler's httpTimeout in deploy/: 10 s); 100
# nodes of 8 GPUs full of 1-2 GiB pods take a fifth of it (benchmarks/bench_preempt.py)
PREEMPT_SEARCH_BUDGET = 500_000
OwnCharge = tuple[str, str, int, int, int]  # (node, GPU UUID, MiB, limit MiB above, compute) of the pod's own
# stale reservation


class Verbs:
    def __init__(self, state: ClusterState, binder: Binder, default_policy: str, metrics: Metrics,
                 limit_ratio: Fraction | None = None,
                 node_pods: Callable[[str], dict[str, int]] | None = None, gate: BindGate | None = None,
                 best: bool = False) -> None:
        self.state = state
        self.gate = gate if gate is not None else BindGate()  # filter waits while its limit of binds is in flight
        metrics.gate = self.gate
        self.node_pods = node_pods  # node -> {uid: priority} of its pods (kubereads.node_pod_priorities)
        self.binder = binder
        self.default_policy = default_policy
        self.metrics = metrics
        self.memo = FitMemo(state, limit_ratio, best)  # best: filter passes its best-scoring nodes only
        # the last filter_json's head bytes (the ExtenderArgs before NodeNames) and its pod, for the prioritize
        # of the same cycle (one tuple, replaced whole: threads read it without a lock)
        self._last_head: tuple[bytes, PodView] | None = None
        self.capped = limit_ratio is not None  # --max-limit-ratio: the memo's key carries the pod's limit
        self.preempt_budget = PREEMPT_SEARCH_BUDGET  # per preempt request (tests lower it)

    # ------------------------------------------------------------------ filter
    def filter(self, body: Any) -> tuple[int, Any]:
        try:
            args = wire.decode_extender_args(body, check=False)  # names checked below, unless all are nodes
            pod = PodView.of(args.pod)
            if pod.error or pod.request is None or not self.state.synced:
                args = wire.check_names(args)
                names = args.names()
                error = pod.error or (NOT_SYNCED if pod.request is not None else "")
                return 200, wire.filter_result(args, [] if error else list(names), {}, {}, error)
            key = pod.key(self.default_policy, self.capped)
            self.state.expire()
            names = args.names()
            try:  # names still unchecked: a name found among the memo's nodes is a node's name
                split: Split | None = self.memo.split(names, key, pod.uid)
            except TypeError:  # an unhashable name
                split = None
            if split is not None and split.all_passed:  # the usual case: every name a node where the pod fits
                return 200, wire.filter_result(args, split.passed, {}, {})
            if split is None or split.unknown:
                args = wire.check_names(args)
                if split is None:
                    split = self.memo.split(args.names(), key, pod.uid)
        except WireError as exc:
            return 400, wire.filter_result(None, [], {}, {}, str(exc))
        return 200, self._filter_each(args, pod, args.names(), key, split)

    def filter_json(self, data: bytearray) -> tuple[int, Any] | None:
        """Filter's answer from the request's bytes, when its NodeNames come last (as kube-scheduler writes
        them: wire.split_names_last) as a plain JSON array of nodes' names: no name decoded when the pod fits
        on every one (the answer echoes the array), only then when it fails on some (FitMemo.split_json). None
        otherwise (the server then decodes the body for filter()), so every refusal is filter()'s."""
        split = wire.split_names_last_at(data)
        if split is None:
            return None
        head, names_json, cut = split
        try:
            obj = wire.decode_pod_of(head)
        except WireError:
            return None
        pod = PodView.of(obj)
        if pod.error or pod.request is None or not self.state.synced:
            return None
        if cut <= KEPT_HEAD_BYTES:  # for the prioritize that follows (prioritize_json)
            with memoryview(data) as view:
                self._last_head = (bytes(view[:cut]), pod)  # copied once (a bytearray's slice is a copy)
        key = pod.key(self.default_policy, self.capped)
        self.state.expire()
        out = self.memo.split_json(names_json, key, pod.uid, wire.MAX_NODE_NAMES, whole=True)
        if isinstance(out, JsonParts):  # failing on some names, written whole: as _filter_each's, unless
            if self._own_charge(pod.uid) is None:  # the pod holds a stale reservation of its own (rare)
                return 200, out
            out = self.memo.split_json(names_json, key, pod.uid, wire.MAX_NODE_NAMES)
        if out is None:
            return None
        if isinstance(out, bytes):
            return 200, wire.filter_names_answer(out)
        assert not isinstance(out, JsonParts)  # (whole=False)
        names, memo_split = out  # every name a node's (found among the memo's), so valid
        return 200, self._filter_each(ExtenderArgs(obj, names, None), pod, names, key, memo_split)

    def _filter_each(self, args: ExtenderArgs, pod: PodView, names: list[str], key: Key,
                     split: Split) -> dict[str, Any]:
        """The slow path: the names split by their memoised verdicts (reasons included)."""
        passed, failed, unresolvable = split.passed, split.failed, split.unresolvable
        for name in split.unknown:
            final, reason = self._unfit_reason(name)
            (unresolvable if final else failed)[name] = reason
        own = self._own_charge(pod.uid)
        again = bool(split.unknown)  # passed not narrowed to the best by the memo (judged one by one)
        if own is not None and own[0] in failed and self._fits_without_own(key, own):
            del failed[own[0]]  # room once the pod's own stale reservation is not counted
            passed, again = [n for n in names if n not in failed and n not in unresolvable], True
        if again and self.memo.best:  # --filter-answers best: the best-scoring among those that fit
            passed = self.memo.best_of(passed, key)
        return wire.filter_result(args, passed, failed, unresolvable)

    def _unfit_reason(self, name: str) -> tuple[bool, str]:
        """(unresolvable, reason) for a node without a view."""
        if self.state.knows_node(name):
            return True, ("node has no memslice GPUs (no memslice.io/gpus annotation: is the memslice node "
                          "agent running there?)")
        return False, "node is not (yet) known to the memslice extender"

    def _own_charge(self, uid: str) -> OwnCharge | None:
        """(node, GPU UUID, MiB, limit MiB above) of a reservation this unbound pod already holds (a bind that
        failed and could not be undone): it must not count against the pod itself."""
        charge = self.state.charge_of(uid) if uid else None
        if charge is None or charge.gpu_uuid is None or charge.node is not None:
            return None
        node = self.state.gpu_node(charge.gpu_uuid)
        return (node, charge.gpu_uuid, charge.mib, charge.over, charge.compute) if node else None

    def _fits_without_own(self, key: Key, own: OwnCharge) -> bool:
        """Does the pod fit on the node of its own stale reservation once that is not counted?"""
        node, gpu, mib, over, compute = own
        view = self.state.view(node)
        return view is not None and decisions.fits_without(view, key[0] * view.unit_mib, {gpu: mib}, 0,
                                                           self.memo.limit_need(key, view), {gpu: over},
                                                           compute_of(key), {gpu: compute}, gpus_of(key))

    # ------------------------------------------------------------------ prioritize
    def prioritize(self, body: Any) -> tuple[int, Any]:
        try:
            args = wire.decode_extender_args(body, check=False)  # names checked below, unless replayed
            pod = PodView.of(args.pod)
            if pod.error:
                return 400, {"Error": pod.error}  # HostPriorityList has no Error field
            if pod.request is not None and self.state.synced:
                self.state.expire()
                key = pod.key(self.default_policy, self.capped)
                answer = self.memo.replay(args.names(), key, pod.uid)  # the names filter's fast path passed
                if answer is not None:
                    return 200, answer
                names = wire.check_names(args).names()
                return 200, self.memo.prioritize(names, key)
            names = wire.check_names(args).names()
        except WireError as exc:
            return 400, {"Error": str(exc)}
        return 200, wire.encode_host_priority_list(names, [0] * len(names))

    def prioritize_json(self, data: bytearray) -> bytes | None:
        """Prioritize's answer straight from the request's bytes, when its NodeNames array is byte for byte the
        JSON of the names its pod's filter passed (wire.split_names_last, FitMemo.replay_json): no name is
        decoded or compared one by one. None otherwise (the server then decodes the body for prioritize())."""
        kept = self._last_head
        names_json = None if kept is None else wire.names_after_head(data, kept[0])
        if names_json is not None and kept is not None:
            pod = kept[1]  # the very pod bytes of the last filter: decoded the same
        else:
            split = wire.split_names_last(data)
            if split is None:
                return None
            head, names_json = split
            try:
                pod = PodView.of(wire.decode_pod_of(head))
            except WireError:
                return None
        if pod.error or pod.request is None or not self.state.synced:
            return None
        self.state.expire()
        return self.memo.replay_json(names_json, pod.key(self.default_policy, self.capped), pod.uid)

    # ------------------------------------------------------------------ bind
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
            with self.gate.binding():
                self.binder.bind(args)
        except BindError as exc:
            log.warning("bind failed: %s", exc)
            self.metrics.bind_failures.labels(exc.reason).inc()
            return 200, wire.binding_result(str(exc))
        self.metrics.bound.inc()
        return 200, wire.binding_result("")

    # ------------------------------------------------------------------ preempt
    def preempt(self, body: Any) -> tuple[int, Any]:
        """Per node the scheduler proposes, the victims that make room for the pod on ONE GPU there
        (decisions.preemption_victims: among the proposed victims, else any lower-priority pod of the node),
        plus the proposed victims that hold no GPU memory of this node (the scheduler may need them for
        CPU/memory); proposed victims on the node's other GPUs are dropped. A node where no GPU can be freed
        is dropped."""
        try:
            args = wire.decode_preemption_args(body)
        except WireError as exc:
            return 400, {"NodeNameToMetaVictims": None, "Error": str(exc)}
        pod = PodView.of(args.pod)
        if pod.error:
            return 400, {"NodeNameToMetaVictims": None, "Error": pod.error}
        if pod.request is None:
            return 200, wire.preemption_result(args.victims)
        if not self.state.synced:
            return 200, wire.preemption_result({})
        self.state.expire()
        key = pod.key(self.default_policy, self.capped)
        priority = pod_priority(args.pod)
        keep = {}
        reads = [PREEMPT_NODE_READS]  # API reads left for this request: a hostile node list stays bounded
        share = max(1, self.preempt_budget // max(len(args.victims), 1))
        capped = 0
        for node, victims in args.victims.items():
            budget = decisions.SearchBudget(share)
            uids = self._victims_for(node, key, priority, victims.uids, reads, budget)
            capped += budget.capped
            if uids:  # the scheduler refuses a node without victims ("expected at least one victim pod")
                keep[node] = wire.Victims(uids, None, victims.num_pdb_violations)
        if capped:
            self.metrics.preempt_capped.inc(capped)
            log.info("preempt: pod UID %.64s: the victim search stopped at its share of the request's budget (%d "
                     "pods weighed per node) on %d of %d nodes; those answer the best GPU set found by then",
                     pod.uid, share, capped, len(args.victims))
        return 200, wire.preemption_result(keep)

    def _victims_for(self, node: str, key: Key, priority: int, proposed: list[str],
                     reads: list[int], budget: decisions.SearchBudget | None = None) -> list[str] | None:
        """First among the scheduler's victims alone (no I/O: they are the node's lowest-priority pods); where
        they cannot free one GPU, among every lower-priority pod of the node (one API read, at most `reads`)."""
        view = self.state.view(node)
        if view is None:
            return None
        others: list[str] = []  # proposed, holding no GPU memory of this node: kept as the scheduler chose
        freed_unplaced = 0
        for uid in proposed:
            charge = self.state.charge_of(uid)
            if charge is None or (charge.gpu_uuid is None and charge.node != node):
                others.append(uid)
            elif charge.gpu_uuid is None:
                others.append(uid)
                freed_unplaced += charge.devices * view.unit_mib
        need, limit = key[0] * view.unit_mib, self.memo.limit_need(key, view)
        lower = {uid: priority - 1 for uid in proposed}  # lower than the pod's, by the scheduler's own rule
        chosen = decisions.preemption_victims(view, need, self._candidates(node, lower), freed_unplaced, limit,
                                              compute_of(key), gpus_of(key), budget)
        if chosen is None and self.node_pods is not None and reads[0] > 0:
            reads[0] -= 1
            lower.update(self._lower_priority_pods(node, priority))
            chosen = decisions.preemption_victims(view, need, self._candidates(node, lower), freed_unplaced, limit,
                                                  compute_of(key), gpus_of(key), budget)
        return None if chosen is None else [*chosen, *others]

    def _lower_priority_pods(self, node: str, priority: int) -> dict[str, int]:
        """UID -> priority of the node's pods below `priority`, read from the API server; {} when it fails."""
        assert self.node_pods is not None
        try:
            return {uid: p for uid, p in self.node_pods(node).items() if p < priority}
        except Exception as exc:  # noqa: BLE001 - an API error: the scheduler's proposal alone decides
            log.warning("preempt: cannot list the pods of node %s (%s); choosing among the proposed victims only",
                        node, exc)
            return {}

    def _candidates(self, node: str, lower: dict[str, int]) -> list[decisions.VictimCandidate]:
        """The pods of `lower` (UID -> priority) charged on a GPU of this node, as the decision takes them."""
        out = []
        for uid, prio in lower.items():
            charge = self.state.charge_of(uid)
            if charge is not None and charge.gpu_uuid is not None and self.state.gpu_node(charge.gpu_uuid) == node:
                out.append(decisions.VictimCandidate(uid, charge.gpu_uuid, charge.mib, charge.over, prio,
                                                     charge.compute))
        return out

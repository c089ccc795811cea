"""The extender verbs: decode the request, decide over ClusterState, encode the answer.

Each handler returns (HTTP status, JSON body). Requests that do not follow the extender API (not JSON,
missing or mistyped fields) get 400 with an `Error`; a well-formed request for a pod that cannot be
served (a negative quantity, an unknown policy, a bind that fails) gets 200 with an `Error`, because
kube-scheduler shows the `Error` text in the pod's events but only the status code of a non-200 answer.
Nothing here changes state except a successful bind.

The pod is decoded once (records.PodView); fit and score are decisions.py's, read through the memo
(fitmemo.py): filter's fast path is one lookup pass when the pod fits on every node, its slow path one pass
over the memoised verdicts.
"""

from __future__ import annotations

import logging
from fractions import Fraction
from typing import Any

from .. import wire
from ..index.fitmemo import FitMemo, Key, Split, compute_of
from ..kubeio.binder import Binder, BindError
from ..placement import decisions
from ..placement.records import PodView
from ..placement.state import ClusterState
from ..wire import ExtenderArgs, WireError
from .metrics import Metrics

log = logging.getLogger(__name__)
NOT_SYNCED = ("the memslice extender has not finished listing nodes and pods from the API server yet; "
              "the scheduler will retry")
OwnCharge = tuple[str, str, int, int, int]  # (node, GPU UUID, MiB, limit MiB above, compute) of the pod's own
# stale reservation


class Verbs:
    def __init__(self, state: ClusterState, binder: Binder, default_policy: str, metrics: Metrics,
                 limit_ratio: Fraction | None = None) -> None:
        self.state = state
        self.binder = binder
        self.default_policy = default_policy
        self.metrics = metrics
        self.memo = FitMemo(state, limit_ratio)
        self.capped = limit_ratio is not None  # --max-limit-ratio: the memo's key carries the pod's limit

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
                return 200, wire.filter_result(args, names, {}, {})
            if split is None or split.unknown:
                args = wire.check_names(args)
                if split is None:
                    split = self.memo.split(args.names(), key, pod.uid)
        except WireError as exc:
            return 400, wire.filter_result(None, [], {}, {}, str(exc))
        return 200, self._filter_each(args, pod, args.names(), key, split)

    def _filter_each(self, args: ExtenderArgs, pod: PodView, names: list[str], key: Key,
                     split: Split) -> dict[str, Any]:
        """The slow path: the names split by their memoised verdicts (reasons included)."""
        passed, failed, unresolvable = split.passed, split.failed, split.unresolvable
        for name in split.unknown:
            final, reason = self._unfit_reason(name)
            (unresolvable if final else failed)[name] = reason
        own = self._own_charge(pod.uid)
        if own is not None and own[0] in failed and self._fits_without_own(key, own):
            del failed[own[0]]  # room once the pod's own stale reservation is not counted
            passed = [n for n in names if n not in failed and n not in unresolvable]
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
                                                           compute_of(key), {gpu: compute})

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
            self.binder.bind(args)
        except BindError as exc:
            log.warning("bind failed: %s", exc)
            self.metrics.bind_failures.labels(exc.reason).inc()
            return 200, wire.binding_result(str(exc))
        self.metrics.bound.inc()
        return 200, wire.binding_result("")

    # ------------------------------------------------------------------ preempt
    def preempt(self, body: Any) -> tuple[int, Any]:
        """Keep the scheduler's victims on a node only if evicting them lets the pod fit on one GPU there;
        drop the node otherwise. Victims are never trimmed: the scheduler may need them for CPU/memory."""
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
        keep = {node: victims for node, victims in args.victims.items()
                if self._fits_after_eviction(node, key, victims.uids)}
        return 200, wire.preemption_result(keep)

    def _fits_after_eviction(self, node: str, key: Key, uids: list[str]) -> bool:
        view = self.state.view(node)
        if view is None:
            return False
        freed: dict[str, int] = {}
        freed_over: dict[str, int] = {}
        freed_compute: dict[str, int] = {}
        freed_unplaced = 0
        for uid in uids:
            charge = self.state.charge_of(uid)
            if charge is None:
                continue
            if charge.gpu_uuid is not None:
                if self.state.gpu_node(charge.gpu_uuid) == node:
                    freed[charge.gpu_uuid] = freed.get(charge.gpu_uuid, 0) + charge.mib
                    freed_over[charge.gpu_uuid] = freed_over.get(charge.gpu_uuid, 0) + charge.over
                    freed_compute[charge.gpu_uuid] = freed_compute.get(charge.gpu_uuid, 0) + charge.compute
            elif charge.node == node:
                freed_unplaced += charge.devices * view.unit_mib
        return decisions.fits_without(view, key[0] * view.unit_mib, freed, freed_unplaced,
                                      self.memo.limit_need(key, view), freed_over, compute_of(key), freed_compute)


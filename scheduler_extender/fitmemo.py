"""The memo behind filter and prioritize: per pod size and policy, every node's verdict (decisions.verdict)
and, for the nodes where such a pod fits, its HostPriority JSON as prioritize answers it.

kube-scheduler asks about the same nodes and pod sizes over and over, and a node's verdict changes only
when its view does (a charge, an inventory change): so a verdict is computed once per view and kept, and
refreshed for every table the moment the node's view is rebuilt (ClusterState.on_view_change). Filter's
usual case is then one C-speed pass over the "fits" table (every name found: all pass, and the joined JSON
is prioritize's answer); otherwise one pass over the verdicts (the failing nodes' reasons are memoised too,
so a full cluster costs what an empty one does).

With the limit cap (`--max-limit-ratio`) a verdict also depends on the pod's limit: the key then carries
what that limit is made of (a third part, resources.PodRequest.limit_sig; () for a pod without limit
annotations, whose limit is its request), and a GPU's limit sum is part of its node's view, so a change of it
rebuilds the view and refreshes the verdicts like any charge. Without the cap keys stay (devices, policy).

Bounded: at most MAX_ENTRIES verdicts in all tables; the least recently used table goes first.
Thread-safety: every method takes the state's lock (the memo is refreshed under it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import compress, repeat
from operator import is_
from typing import Any

from memslice.scheduler_extender import decisions
from memslice.scheduler_extender.constants import MAX_SCORE, MIN_SCORE
from memslice.scheduler_extender.decisions import LimitNeed, Verdict
from memslice.scheduler_extender.resources import LimitSig, limit_total
from memslice.scheduler_extender.state import ClusterState
from memslice.scheduler_extender.views import NodeView
from memslice.scheduler_extender.wire import host_priority_json

MAX_ENTRIES = 400_000  # verdicts kept in all tables (~100 B each): 80 tables of 5,000 nodes, 20 of 20,000
# (devices, policy), and with the limit cap on the pod's limit signature (() for a pod without limits)
Key = tuple[int, str] | tuple[int, str, LimitSig]
REPLAYS = 64  # filter answers kept for the prioritize that follows (one per pod in flight)
REPLAY_NAMES = 200_000  # node names those may hold in all (bounds what hostile requests can pin)
Replay = tuple[Key, int, list[str], list[str]]  # (key, generation, names, their HostPriority JSON)
PATCH_MAX = 64  # nodes changed since a kept answer that are recomputed in it; more: prioritize afresh
# A fitting verdict carries no text: one shared tuple per score instead of one per node and table.
_FITS = tuple((True, False, "", s) for s in range(MAX_SCORE + 1))


@dataclass(slots=True)
class _Table:
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    fits: dict[str, str] = field(default_factory=dict)  # node -> HostPriority JSON, where the pod fits
    failed: dict[str, str] = field(default_factory=dict)  # node -> reason, where it does not fit now
    unresolvable: dict[str, str] = field(default_factory=dict)  # node -> reason, where it never can

    def drop(self, name: str) -> None:
        self.fits.pop(name, None)
        self.failed.pop(name, None)
        self.unresolvable.pop(name, None)

    def clear(self) -> None:
        for d in (self.verdicts, self.fits, self.failed, self.unresolvable):
            d.clear()

    def split(self, names: list[str]) -> Split:
        """`names` split by their verdicts, each part in the order of `names`, in C-speed comprehensions;
        with the passing nodes' HostPriority JSON (what prioritize will answer for them)."""
        failed, unresolvable = self.failed, self.unresolvable
        items = list(map(self.fits.get, names))  # JSON fragments are non-empty strings: true where it fits
        passed = list(compress(names, items))
        jsons: list[str] = list(filter(None, items))
        if len(passed) == len(names):
            return Split(passed, {}, {}, [], jsons)
        rest = list(compress(names, map(is_, items, repeat(None)))) if passed else names
        reasons: list[Any] = list(map(failed.get, rest))  # str, or None where not failing now
        if not _has_none(reasons):  # every other node fails now (the usual case): no pass for unresolvable
            return Split(passed, dict(zip(rest, reasons, strict=True)), {}, [], jsons)
        out_failed = {n: r for n, r in zip(rest, reasons, strict=True) if r is not None}
        if not unresolvable:
            return Split(passed, out_failed, {}, [], jsons)
        return Split(passed, out_failed, {n: r for n in rest if (r := unresolvable.get(n)) is not None}, [], jsons)


@dataclass(frozen=True, slots=True)
class Split:
    """Filter's answer from the memo: names where the pod fits, fails now (-> reason), never can (->
    reason), and has no verdict (unknown nodes, not memoised)."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    unknown: list[str]
    passed_json: list[str] | None = None  # the passed nodes' HostPriority JSON, when the tables gave it


def _has_none(items: list[Any]) -> bool:
    """`None in items`, by identity: `in` compares each item with == (a failed str == None costs more than
    the dict lookup that produced it)."""
    return any(map(is_, items, repeat(None)))


def _split(names: list[str], verdicts: list[Verdict | None]) -> Split:
    pairs = list(zip(names, verdicts, strict=True))
    known = [(n, v) for n, v in pairs if v is not None]
    return Split([n for n, v in known if v[0]], {n: v[2] for n, v in known if not v[0] and not v[1]},
                 {n: v[2] for n, v in known if v[1]}, [n for n, v in pairs if v is None])


class FitMemo:
    def __init__(self, state: ClusterState, limit_ratio: Fraction | None = None) -> None:
        self.state = state
        self.limit_ratio = limit_ratio  # --max-limit-ratio; None: no cap
        self._tables: OrderedDict[Key, _Table] = OrderedDict()
        self._entries = 0
        self._host_json: dict[str, tuple[str, ...]] = {}  # node -> its HostPriority JSON for each score
        self._replays: OrderedDict[str, Replay] = OrderedDict()  # pod UID -> its filter's answer, oldest first
        self._replay_names = 0  # names they hold
        state.on_view_change(self._refresh)

    # ------------------------------------------------------------------ the two paths
    def all_fit(self, names: list[Any], key: Key, uid: str = "") -> bool:
        """Filter's fast path: does the pod fit on every one of `names`, all memoised (the usual case)?
        False also when some are not memoised yet (then ask split()). When it does, the answer of the
        prioritize that follows for pod `uid` is kept (see replay()). `names` may be unchecked request
        values: a name found in the table is a node's name (valid by construction); anything else, an
        unhashable value included, answers False."""
        with self.state.current() as generation:
            fits = self._table(key).fits
            # fewer fitting nodes than names: some name cannot be among them (a full cluster's usual case)
            if len(fits) < len(names):
                return False
            try:
                items = list(map(fits.get, names))
            except TypeError:  # a list or object among the names: not a node's name
                return False
            if _has_none(items):
                return False
            if uid and len(names) <= REPLAY_NAMES:
                self._keep_replay(uid, (key, generation, names, items))  # type: ignore[arg-type]
            return True

    def prioritize(self, names: list[str], key: Key, uid: str = "") -> bytes:
        """Prioritize's answer (HostPriorityList JSON): replay() when it has one, else host_json()."""
        answer = self.replay(names, key, uid)
        return answer if answer is not None else ("[" + ",".join(self.host_json(names, key)) + "]").encode()

    def replay(self, names: list[Any], key: Key, uid: str) -> bytes | None:
        """Prioritize's answer from the one kept when filter's fast path passed these very names for pod
        `uid` (same size and policy), with the HostPriority of each node whose view changed since (a bind in
        flight, at most PATCH_MAX of them) recomputed: byte for byte what a fresh answer is (a property test
        checks this with binds in between). None when there is no such answer. `names` may be unchecked: they
        are compared with the kept names, which filter found among the nodes."""
        if not uid:
            return None
        with self.state.current():
            replay = self._replays.pop(uid, None)
            if replay is None:
                return None
            self._replay_names -= len(replay[2])
            if replay[0] != key or replay[2] != names:
                return None
            changed = self.state.changed_since(replay[1])
            if changed is None or len(changed) > PATCH_MAX:
                return None
            kept, items = replay[2], replay[3]
            for name in changed.intersection(kept):  # the kept names' hashes are cached: a cheap pass
                fresh = self.host_json([name], key)[0]
                i = kept.index(name)
                while True:  # every occurrence (a request may repeat a name)
                    items[i] = fresh
                    try:
                        i = kept.index(name, i + 1)
                    except ValueError:
                        break
            return ("[" + ",".join(items) + "]").encode()

    def _keep_replay(self, uid: str, replay: Replay) -> None:
        old = self._replays.pop(uid, None)
        self._replay_names += len(replay[2]) - (len(old[2]) if old is not None else 0)
        self._replays[uid] = replay
        while len(self._replays) > REPLAYS or self._replay_names > REPLAY_NAMES:
            self._replay_names -= len(self._replays.popitem(last=False)[1][2])

    def split(self, names: list[Any], key: Key, uid: str = "") -> Split:
        """The slow path: the names split by verdict, computed for the nodes not memoised yet. When every
        name is memoised, the answer of the prioritize that follows for pod `uid` (the passed names) is kept,
        as all_fit() keeps it. `names` may be unchecked values: an unhashable one raises TypeError, and any
        that is not a node's name comes back in `unknown`."""
        with self.state.current() as generation:
            table = self._table(key)
            out = table.split(names)
            if len(out.passed) + len(out.failed) + len(out.unresolvable) == len(names):
                if uid and out.passed and len(out.passed) <= REPLAY_NAMES and out.passed_json is not None:
                    self._keep_replay(uid, (key, generation, out.passed, out.passed_json))
                return out
            # new nodes (or repeated names, or more than the memo holds): from the verdicts themselves
            return _split(names, self._verdicts(table, names, key))

    def verdicts(self, names: list[str], key: Key) -> list[Verdict | None]:
        """The slow path: every name's verdict (None: no view, the node is unknown or not a memslice node),
        computed for the nodes not memoised yet."""
        with self.state.current():
            return self._verdicts(self._table(key), names, key)

    def host_json(self, names: list[str], key: Key) -> list[str]:
        """Prioritize: each name's HostPriority JSON (score 0 where the pod does not fit)."""
        with self.state.current():
            table = self._table(key)
            items = list(map(table.fits.get, names))
            if not _has_none(items):
                return items  # type: ignore[return-value]
            verdicts = self._verdicts(table, names, key)
            return [self._json_of(n, v) for n, v in zip(names, verdicts, strict=True)]

    # ------------------------------------------------------------------ upkeep
    def _verdicts(self, table: _Table, names: list[str], key: Key) -> list[Verdict | None]:
        found = list(map(table.verdicts.get, names))
        if _has_none(found):
            for i, name in enumerate(names):
                if found[i] is None:
                    found[i] = self._fill(table, key, name)
        return found

    def _json_of(self, name: str, verdict: Verdict | None) -> str:
        fragments = self._host_json.get(name)
        value = verdict[3] if verdict is not None else MIN_SCORE
        return fragments[value] if fragments is not None else host_priority_json(name, value)

    def _table(self, key: Key) -> _Table:
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = _Table()
        else:
            self._tables.move_to_end(key)
        return table

    def _fill(self, table: _Table, key: Key, name: str) -> Verdict | None:
        view = self.state.view_unlocked(name)
        if view is None:
            return None  # not memoised: the node may appear any time
        if self._entries >= MAX_ENTRIES:
            self._evict(table)
        self._entries += name not in table.verdicts
        return self._set(table, key, name, view)

    def limit_need(self, key: Key, view: NodeView) -> LimitNeed | None:
        """The limit cap's side of decisions for a pod of `key` on this node (None: the cap is off)."""
        if self.limit_ratio is None:
            return None
        sig = key[2] if len(key) == 3 else ()
        return LimitNeed(limit_total(sig, view.unit_mib) if sig else key[0] * view.unit_mib, self.limit_ratio)

    def _set(self, table: _Table, key: Key, name: str, view: NodeView) -> Verdict:
        v = decisions.verdict(view, key[0] * view.unit_mib, key[1], self.limit_need(key, view))
        if v[0]:
            v = _FITS[v[3]]
            fragments = self._host_json.get(name)
            if fragments is None:  # kept per node (not per table) until the node goes
                fragments = self._host_json[name] = tuple(host_priority_json(name, s) for s in range(MAX_SCORE + 1))
            table.fits[name] = fragments[v[3]]
            table.failed.pop(name, None)
            table.unresolvable.pop(name, None)
        else:
            table.drop(name)
            (table.unresolvable if v[1] else table.failed)[name] = v[2]
        table.verdicts[name] = v
        return v

    def _evict(self, keep: _Table) -> None:
        """Drop least recently used tables (never `keep`) until there is room."""
        for key in list(self._tables):
            if self._entries < MAX_ENTRIES or self._tables[key] is keep:
                continue
            self._entries -= len(self._tables.pop(key).verdicts)
        if self._entries >= MAX_ENTRIES:  # `keep` alone fills the memo: start it afresh
            self._entries -= len(keep.verdicts)
            keep.clear()

    def _refresh(self, name: str, view: NodeView | None) -> None:
        """Called under the state's lock whenever the node's view is rebuilt (None: dropped): every table
        that holds the node gets its new verdict now, so the tables stay complete."""
        for key, table in self._tables.items():
            if view is not None:
                if name in table.verdicts:
                    self._set(table, key, name, view)
            elif table.verdicts.pop(name, None) is not None:
                self._entries -= 1
                table.drop(name)
        if view is None:
            self._host_json.pop(name, None)

    def size(self) -> int:
        with self.state.lock:
            return self._entries

"""The memo behind filter and prioritize: per pod size and policy, every node's verdict (decisions.verdict)
and, for the nodes where such a pod fits, its HostPriority JSON as prioritize answers it.

kube-scheduler asks about the same nodes and pod sizes over and over, and a node's verdict changes only
when its view does (a charge, an inventory change): so a verdict is computed once per view and kept, and
refreshed for every table the moment the node's view is rebuilt (ClusterState.on_view_change).

Layout (measured: benchmarks/README.md, "Node ids and shapes"): each node the memo meets gets a small
integer id, and a table (one per pod size and policy) is a set of arrays indexed by it: a byte per node for
the verdict's kind (none yet / fits / fails now / never fits) and one for its score, and lists of the
HostPriority JSON (where it fits) and the reasons (where not). A filter costs one lookup pass (name -> id,
one index for all pod sizes: nameids.py, natively in C), then C-speed passes: `take` reads every name's kind
at once, `bytes.translate` turns it into 0/1 masks for `compress`; prioritize joins the kept JSON texts of
the ids in one call. The first fill of a table
shares verdicts among nodes of one shape (see Shape) and writes the cells inline: a cold memo, where every
(node, pod size) is met once, costs half what one verdict per node did, and no verdict tuple is kept per
node and size.

With the limit cap (`--max-limit-ratio`) a verdict also depends on the pod's limit: the key then carries
what that limit is made of (a third part, resources.PodRequest.limit_sig; () for a pod without limit
annotations, whose limit is its request), and a GPU's limit sum is part of its node's view, so a change of it
rebuilds the view and refreshes the verdicts like any charge. Without the cap keys stay (devices, policy).

Pods spanning GPUs (issue 34): each (per-GPU size, N) is a table of its own, so a bind refreshes its node in many
(20 spanning tables in benchmarks/README.md's mix). The tables of one N and policy whose verdict the limit cap
and compute shares leave alone are refreshed together, in one native call (_nameids.span_refresh: the view's
column and rows read once, the set search shared by the sizes that leave the same GPUs with room, the scores, and
the cells that still fit written there; only those that need a reason, or a text not made yet, come back to
Python; all groups of a bind in one call, _nameids.span_refresh_node; the reference, where the module was not built:
spanning.codes and a loop, _refresh_group); the others one
by one, as above. The set searches a node's view met are kept
until it changes (_found), and a table of those groups that stopped sharing by shape fills the cells a request
finds empty in one C call reusing them (_fill_spanning, _nameids.span_fill: the views read by name, the searches
made, the fitting cells written; Python resolves the rest): a spanning key is asked rarely, so its requests meet
many nodes without a verdict. The scores are C (_nameids.span_scores, span_scores_each; the reference is
spanning.scores, and _fill_spanning_each the fill's, used where the module was not built). A filter that fails on
some names answers from the request's bytes in one C call too (split_json's `whole`, _nameids.filter_answer).

Bounded: at most MAX_ENTRIES verdicts and MAX_TABLES tables (each ~18 bytes per node id); the least recently
used table goes first. A node that goes frees its id for the next new node (every table's cell emptied).
Thread-safety: every method takes the state's lock (the memo is refreshed under it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, compress, repeat
from operator import itemgetter
from typing import Any

import orjson

from ..placement import decisions, spanning
from ..placement.constants import MAX_SCORE, MIN_SCORE
from ..placement.decisions import LimitNeed, Verdict
from ..placement.resources import LimitSig, limit_total
from ..placement.spanning import NO_ROOM, UNSEARCHED
from ..placement.state import ClusterState
from ..placement.views import NodeView
from ..wire import FILTER_NAMES_HEAD, JsonParts, host_priority_json
from ..wire import names_json as wire_names
from .nameids import Ids, SpanCell, has_none, name_ids

MAX_ENTRIES = 400_000  # verdicts kept in all tables: 80 tables of 5,000 nodes, 20 of 20,000
MAX_TABLES = 64  # pod sizes × policies (× limits) kept at once: 18 bytes per node each (5.8 MB at 5,000 nodes)
# (devices, policy), and with the limit cap on the pod's limit signature (() for a pod without limits)
# and with a compute share, (devices, policy, the limit signature or (), compute percent)
# and for a pod spanning GPUs, (devices per GPU, policy, the limit signature or (), compute percent per GPU, GPUs)
Key = (tuple[int, str] | tuple[int, str, LimitSig] | tuple[int, str, LimitSig, int]
       | tuple[int, str, LimitSig, int, int])
REPLAYS = 64  # filter answers kept for the prioritize that follows (one per pod in flight)
REPLAY_NAMES = 200_000  # node names those may hold in all (bounds what hostile requests can pin)
# (key, id epoch, the names or None, their JSON or None (one of the two is kept), their node ids, how many)
Replay = tuple[Key, int, list[str] | None, bytes | None, Ids, int]

# What decisions.verdict reads of a node: the unit, the unplaced MiB, the error, the limit sums' column, the
# compute column, the topology (pods spanning GPUs), then per GPU in `rows` order its index, MiB, health and
# used MiB. Not the node's name, nor a GPU's UUID or model: verdicts never read them (their texts name GPUs by
# index), so nodes of one shape share one verdict. Why: the first filters of each pod size compute a verdict
# per node; in an empty or regular cluster most nodes look alike, and one verdict per shape (a dict lookup) is
# a fraction of computing it (benchmarks/README.md, "Node indexes"). Only the first fill shares; a view change
# recomputes the node's verdicts directly.
Shape = tuple[object, ...]
_SHAPE_FIELDS = itemgetter(1, 3, 4, 5)
SHARED_MAX = 512  # shapes' verdicts kept per table (emptied when full): 64 tables hold at most ~7 MB
SHARE_TRIAL = 32  # a table whose fill met this many new shapes, more than repeats, stops sharing
SHAPES_MAX = 8192  # shapes numbered (_sid) at once, ~3 MB (all numbers dropped when full)
FOUND_MAX = 8192  # nodes whose view's spanning set searches are kept (_found; all dropped when full)

# A cell's kind: no verdict yet, fits, fails now, never fits (unresolvable)
NONE, FITS, FAILS, NEVER = 0, 1, 2, 3
_PASS = bytes(int(k == FITS) for k in range(256))  # bytes.translate tables: kinds -> 0/1 masks for compress
_FAIL = bytes(int(k == FAILS) for k in range(256))
_NEVER = bytes(int(k == NEVER) for k in range(256))
_EMPTY = bytes(int(k == NONE) for k in range(256))
_NO_FRAGMENTS: tuple[str | None, ...] = (None,) * (MAX_SCORE + 1)
_FITS = tuple((True, False, "", s) for s in range(MAX_SCORE + 1))  # a fitting verdict, per score
_TOP = tuple(bytes(int(k == s) for k in range(256)) for s in range(MAX_SCORE + 1))  # scores -> 0/1 where == s
# _nameids.span_fill's codes beyond spanning's: the cell written there, no cell to write, the cap may decide, a
# failing cell written there (NO_ROOM's reason; span_refresh hands it back for a cell that fitted: fitting - 1)
WRITTEN, SKIPPED, CAPPED, FAILED = 0xF8, 0xF9, 0xFA, 0xFB
_LEFT = bytes(int(k not in (WRITTEN, SKIPPED, FAILED)) for k in range(256))  # codes -> 1 where Python resolves it


# How _refresh goes over the tables: those refreshed one by one, (key, table); and the spanning tables refreshed
# together, per (N, policy): ((N, policy), ((key, table), ...), and per table its size per GPU and the arrays the
# native refresh writes (nameids.SpanCell)). Made when the set of tables changes, or a table's arrays (_trim).
# per topology met (by id) the group's set searches' plan (SearchPlan), whether its policy is spread, and the NO_ROOM
# reasons the native refresh writes (spanning.no_room_texts(N)).
Group = tuple[tuple[int, str], list[tuple[Key, "_Table"]], tuple[SpanCell, ...], bool, dict[int, "SearchPlan"],
              dict[int, str]]
# For the native set searches of a group (_nameids.span_refresh) on nodes of one topology: it, and spanning._plan's
# closest fitting sets per mask, closeness per distance and levels (None...: no search natively: the reference's).
SearchPlan = tuple[object, dict[int, spanning.Closest] | None, tuple[float, ...] | None, spanning.Levels | None]
PLANS_MAX = 256  # topologies a group keeps a SearchPlan for (a cluster has a few board types); emptied when full
RefreshPlan = tuple[list[tuple[Key, "_Table"]], list[Group]]


# What a spanning group's cells of a node were refreshed at (_refresh_groups): the view itself (its rows' index,
# MiB, health and free MiB are compared: nameids.span_above; then all else a verdict reads: unit, topology, the limit
# and compute columns, unplaced MiB, error). The view, not a copy of its columns: it is the node's current view until
# the next change (nothing more is held), and building the columns cost more than refreshing the cells.
Column = NodeView


def _search_plan(plans: dict[int, SearchPlan], topo: object, gpus: int) -> SearchPlan:
    """The SearchPlan of a group of N `gpus` for nodes of this topology, made (from spanning._plan, which keeps the
    masks met) and kept in `plans` (by the topology's id: views of a node share one topology per inventory)."""
    plan: SearchPlan = (topo, None, None, None)
    if not isinstance(topo, int):
        made = spanning._plan(topo, gpus)  # type: ignore[arg-type]  # a matrix
        if made[1] is not None:
            plan = (topo, made[2], made[3], made[1])
    if len(plans) >= PLANS_MAX:
        plans.clear()
    plans[id(topo)] = plan
    return plan


def compute_of(key: Key) -> int:
    """The compute percent of a memo key (0: the pod asks for none)."""
    return key[3] if len(key) >= 4 else 0


def gpus_of(key: Key) -> int:
    """The GPUs a pod of this key spans (memslice.io/gpu-count; records.PodView.key)."""
    return key[4] if len(key) == 5 else 1


class _Table:
    """One pod size and policy: per node id its verdict, as arrays (see the module's docstring)."""

    __slots__ = ("kinds", "scores", "jsons", "reasons", "filled", "fitting", "shared", "sharing")

    def __init__(self, capacity: int) -> None:
        self.clear(capacity)

    def clear(self, capacity: int) -> None:
        self.kinds = bytearray(capacity)  # NONE / FITS / FAILS / NEVER
        self.scores = bytearray(capacity)  # prioritize's score (MIN_SCORE where the pod does not fit)
        self.jsons: list[str | None] = [None] * capacity  # the HostPriority JSON, where FITS
        self.reasons: list[str | None] = [None] * capacity  # where FAILS or NEVER
        self.shared: dict[int, Verdict] = {}  # verdicts of node shapes met by _fill (at most SHARED_MAX)
        self.sharing = True  # False once a fill found the shapes mostly distinct (see FitMemo._fill)
        self.filled = 0  # cells with a verdict
        self.fitting = 0  # cells that FIT (fewer than a request's names: the pod cannot fit on them all)

    def grow(self, capacity: int) -> None:
        more = capacity - len(self.kinds)
        if more > 0:
            self.kinds.extend(bytes(more))
            self.scores.extend(bytes(more))
            self.jsons.extend(repeat(None, more))
            self.reasons.extend(repeat(None, more))

    def empty(self, i: int) -> None:
        kind = self.kinds[i]
        if kind != NONE:
            self.filled -= 1
            self.fitting -= kind == FITS
            self.kinds[i] = self.scores[i] = NONE
            self.jsons[i] = self.reasons[i] = None

    def verdict(self, i: int) -> Verdict | None:
        kind = self.kinds[i]
        if kind == NONE:
            return None
        if kind == FITS:
            return _FITS[self.scores[i]]
        return False, kind == NEVER, self.reasons[i] or "", MIN_SCORE


@dataclass(frozen=True, slots=True)
class Split:
    """Filter's answer from the memo: names where the pod fits, fails now (-> reason), never can (->
    reason), and has no verdict (unknown nodes, not memoised)."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    unknown: list[str]

    @property
    def all_passed(self) -> bool:
        return not (self.failed or self.unresolvable or self.unknown)


class FitMemo:
    def __init__(self, state: ClusterState, limit_ratio: Fraction | None = None, best: bool = False) -> None:
        self.state = state
        self.limit_ratio = limit_ratio  # --max-limit-ratio; None: no cap
        # --filter-answers best: filter passes only the fitting names of the highest score (see _top)
        self.best = best
        self._tables: OrderedDict[Key, _Table] = OrderedDict()
        self._entries = 0
        self._index = name_ids()  # node -> its id (index in every table's arrays)
        self._names: list[str | None] = []  # id -> node (None: free)
        self._free: list[int] = []  # ids of nodes gone, for the next new ones
        self._capacity = 0  # every table's arrays hold this many ids
        self._shape_ids: dict[Shape, int] = {}  # shapes met -> their numbers
        self._sids: list[int | None] = []  # id -> its view's shape number (None: not made since it changed)
        self._epoch = 0  # bumped when an id is freed: a kept (names -> ids) mapping is then stale
        self._host_json: list[tuple[str | None, ...] | None] = []  # id -> its HostPriority JSON per score
        self._replays: OrderedDict[str, Replay] = OrderedDict()  # pod UID -> its filter's answer, oldest first
        self._replay_names = 0  # names they hold
        self._plan: RefreshPlan | None = None  # how _refresh goes over the tables (None: made afresh at next need)
        self._found: dict[int, spanning.Found] = {}  # id -> the set searches of its view (emptied when it changes)
        self._columns: dict[int, Column] = {}  # id -> what its spanning group cells were last refreshed at
        self._group_sharing = True  # whether the last fill of a group's table (_refresh's) shared verdicts by shape
        state.on_view_change(self._refresh)

    # ------------------------------------------------------------------ the two verbs
    def split(self, names: list[Any], key: Key, uid: str = "") -> Split:
        """Filter: the names split by verdict, computed for the nodes not memoised yet, each part in the
        order of `names`. When every name is a node, the names and their ids are kept for the prioritize
        that follows for pod `uid` (see replay()). `names` may be unchecked request values: a name found
        among the ids is a node's name (valid by construction); an unhashable value raises TypeError, and any
        other value that is not a node's name comes back in `unknown`."""
        with self.state.current():
            out = self._split(names, key, uid)
            self._trim(key)
            return out

    def _split(self, names: list[Any], key: Key, uid: str) -> Split:
        table = self._table(key)
        index = self._index
        ids = index.ids(names)
        if ids is None:  # some name has no id (a node met for the first time, or not a node): each looked at
            found = self._assign(names, index.lookup(names))
            if has_none(found):  # not nodes (or no memslice GPUs): from the slow path
                return self._split_with_unknown(table, key, names, found)
            ids = index.pack(found)
        kinds = self._kinds(table, key, ids)
        if NONE in kinds:  # a node went while its verdict was computed
            return self._split_with_unknown(table, key, names, index.to_list(ids))
        if not table.fitting:
            return self._reasons(table, names, ids, kinds, [])
        mask = kinds.translate(_PASS)
        passed = list(compress(names, mask))
        all_passed = len(passed) == len(names)
        kept = ids if all_passed else index.select(ids, mask)
        if self.best:
            passed, kept = self._top(table, passed, kept)
        if uid and passed and len(passed) <= REPLAY_NAMES:
            self._keep_replay(uid, (key, self._epoch, passed, None, kept, len(passed)))
        return Split(passed, {}, {}, []) if all_passed else self._reasons(table, names, ids, kinds, passed)

    def split_json(self, names_json: bytes, key: Key, uid: str, limit: int,
                   whole: bool = False) -> bytes | JsonParts | tuple[list[str], Split] | None:
        """Filter from the request's NodeNames bytes (wire.split_names_last), no name decoded when the pod fits
        on all: then those very bytes (the answer's NodeNames echoes them; they are kept for the prioritize that
        follows, which compares its own bytes with them). When it fails on some: the names, decoded, and their
        split; with `whole` (and the native index), instead the whole answer (wire.filter_result's, as orjson
        encodes it) written from the bytes and the table in one C call (_nameids.filter_answer; the passing names'
        JSON kept for the prioritize), unless a reason is not plain text (then the split). None when the bytes are
        not a plain array of at most `limit` names of nodes with a view (the caller decodes the request: the slow
        path judges those). Why: a filter of all 5,000 nodes spent most of its time making, and then encoding
        again, 5,000 strings (benchmarks/README.md, "The extender at a third of its CPU"); and a pod spanning GPUs
        fails on some nodes of most requests (issue 34, sixth round)."""
        with self.state.current():
            ids = self._index.ids_json(names_json, limit)
            if ids is None:
                return None
            table = self._table(key)
            kinds = self._kinds(table, key, ids)
            if NONE in kinds:  # a node went while its verdict was computed
                return None
            count = len(kinds)
            if kinds.count(FITS) == count:
                if self.best and count > 1:
                    names_json, ids, count = self._top_json(table, names_json, ids, kinds)
                if uid and count and count <= REPLAY_NAMES:
                    self._keep_replay(uid, (key, self._epoch, None, names_json, ids, count))
                self._trim(key)
                return names_json
            answer = self._index.filter_answer if whole else None
            parts = answer(names_json, ids, kinds, table.scores, table.reasons, self.best) if answer else None
            if parts is not None:
                passed_json, rest, kept = parts
                count = len(kept) // 4  # (packed uint32 ids)
                if uid and count and count <= REPLAY_NAMES:
                    self._keep_replay(uid, (key, self._epoch, None, passed_json, kept, count))
                self._trim(key)
                return JsonParts((FILTER_NAMES_HEAD, passed_json, rest))
            names: list[str] = orjson.loads(names_json)  # plain strings (ids_json read them)
            passed: list[str] = []
            if table.fitting:
                mask = kinds.translate(_PASS)
                passed = list(compress(names, mask))
                kept = self._index.select(ids, mask)
                if self.best:
                    passed, kept = self._top(table, passed, kept)
                if uid and passed and len(passed) <= REPLAY_NAMES:
                    self._keep_replay(uid, (key, self._epoch, passed, None, kept, len(passed)))
            split = self._reasons(table, names, ids, kinds, passed)
            self._trim(key)
            return names, split

    def best_of(self, names: list[str], key: Key) -> list[str]:
        """The names (nodes where the pod fits, as a filter passed them) of the highest score among them, in
        their order: _top for a filter's slow path (names judged one by one). Names without an id are kept."""
        if len(names) < 2:
            return names
        with self.state.current():
            found = self._assign(names, self._index.lookup(names))
            if has_none(found):
                return names
            table = self._table(key)
            ids = self._index.pack(found)
            self._kinds(table, key, ids)
            best, _ = self._top(table, names, ids)
            self._trim(key)
            return best

    def _top(self, table: _Table, names: list[str], ids: Ids) -> tuple[list[str], Ids]:
        """Of fitting `names` (at `ids`), those whose score is the highest among them, and their ids.

        Why (--filter-answers best, deploy/base): the score is what prioritize would answer for each; when
        filter passes only the best, kube-scheduler needs no prioritize call (every name left would score the
        same), and when one node is left it skips scoring altogether (schedule_one.go: one feasible node is
        taken as it is). Its own scores then choose among the extender's best nodes only: binpacking (or
        spreading) across nodes comes first, the scheduler's soft preferences break its ties
        (benchmarks/README.md, "Filter answers the best nodes")."""
        if len(names) < 2:
            return names, ids
        scores = self._index.take(table.scores, ids)
        top = max(scores)
        if scores.count(top) == len(names):
            return names, ids
        mask = scores.translate(_TOP[top])
        return list(compress(names, mask)), self._index.select(ids, mask)

    def _top_json(self, table: _Table, names_json: bytes, ids: Ids, kinds: bytes) -> tuple[bytes, Ids, int]:
        """_top for names that all fit (`kinds`: every one FITS) and came as the request's JSON array, left
        undecoded: the array as it came when all score alike, else the JSON of the best ones' names, copied from
        the request's bytes in one C call (_nameids.filter_answer: nothing fails) or read from their ids (the
        request's order kept; the ids are current under the state's lock): the array, its ids and how many.
        Decoding the array cost more than the rest of a filter at 5,000 names. The C call scans every name (~95
        instructions each), the ids' names ~660 per best name (the list, its encoding): C where more than a
        seventh of the names are the best (callgrind, benchmarks/README.md, issue 34, sixth round)."""
        scores = self._index.take(table.scores, ids)
        top = max(scores)
        count = len(scores)
        best_count = scores.count(top)
        if best_count == count:
            return names_json, ids, count
        answer = self._index.filter_answer if best_count * 7 > count else None  # (see the docstring)
        parts = answer(names_json, ids, kinds, table.scores, table.reasons, True) if answer is not None else None
        if parts is not None:
            return parts[0], parts[2], len(parts[2]) // 4  # (packed uint32 ids)
        best = self._index.select(ids, scores.translate(_TOP[top]))
        chosen = [n for n in map(self._names.__getitem__, self._index.to_list(best)) if n is not None]  # all nodes
        return wire_names(chosen), best, len(chosen)

    def all_fit(self, names: list[Any], key: Key, uid: str = "") -> bool:
        """Does the pod fit on every one of `names`? (split(), answered yes or no.)"""
        try:
            return self.split(names, key, uid).all_passed
        except TypeError:  # a list or object among the names: not a node's name
            return False

    def prioritize(self, names: list[str], key: Key, uid: str = "") -> bytes:
        """Prioritize's answer (HostPriorityList JSON): replay() when it has one, else from the names' ids."""
        answer = self.replay(names, key, uid)
        if answer is not None:
            return answer
        with self.state.current():
            ids = self._assign(names, self._index.lookup(names))
            if has_none(ids):  # not all nodes: host_json() names the others with score 0
                answer = ("[" + ",".join(self.host_json(names, key)) + "]").encode()
            else:
                answer = self._priority_list(self._table(key), key, self._index.pack(ids))
            self._trim(key)
            return answer

    def replay(self, names: list[Any], key: Key, uid: str) -> bytes | None:
        """Prioritize's answer for the very names filter split for pod `uid` (same size and policy), from the
        ids it found them at: no name looked up again. The tables are current (refreshed at every view
        change), so this is byte for byte a fresh answer (a property test checks it with binds in between).
        None when filter kept no such answer, or a node went since (its id may be another node's now).
        `names` may be unchecked: they are compared with the kept names, which filter found among the nodes."""
        if not uid:
            return None
        with self.state.current():
            replay = self._replays.pop(uid, None)
            if replay is None:
                return None
            self._replay_names -= replay[5]
            if replay[0] != key or replay[1] != self._epoch or not self._same_names(replay, names):
                return None
            out = self._priority_list(self._table(key), key, replay[4])
            self._trim(key)
            return out

    def replay_json(self, names_json: bytes, key: Key, uid: str) -> bytes | None:
        """replay() for a prioritize whose NodeNames were not decoded (wire.split_names_last): the array's
        bytes compared with the names filter passed, encoded (one C call, where decoding the request's names
        made a string of each). Kept when they differ: replay() may still find the decoded names equal (a
        scheduler that writes them otherwise)."""
        if not uid:
            return None
        with self.state.current():
            replay = self._replays.get(uid)
            if replay is None or replay[0] != key or replay[1] != self._epoch or names_json != self._json_of(replay):
                return None
            del self._replays[uid]
            self._replay_names -= replay[5]
            table = self._table(key)  # written from the request's names and the scores (NameIds.hosts_json)
            out = self._index.hosts_json(names_json, replay[4], table.kinds, table.scores, FITS)
            if out is None:  # a node no longer fits (score 0): from the kept texts
                out = self._priority_list(table, key, replay[4])
            self._trim(key)
            return out

    def _same_names(self, replay: Replay, names: list[Any]) -> bool:
        """Are `names` (a request's, unchecked) the names of the kept answer?"""
        if replay[2] is not None:
            return self._index.same(replay[2], names)
        try:
            return replay[3] == wire_names(names)
        except (TypeError, orjson.JSONEncodeError):  # not names at all
            return False

    @staticmethod
    def _json_of(replay: Replay) -> bytes:
        """The kept answer's names as JSON (as kube-scheduler writes them back in prioritize)."""
        if replay[3] is not None:
            return replay[3]
        assert replay[2] is not None  # one of the two is kept
        return wire_names(replay[2])

    def verdicts(self, names: list[str], key: Key) -> list[Verdict | None]:
        """Every name's verdict (None: no view, the node is unknown or not a memslice node), computed for the
        nodes not memoised yet."""
        with self.state.current():
            table = self._table(key)
            ids = self._assign(names, self._index.lookup(names))
            self._kinds(table, key, self._index.pack([i for i in ids if i is not None]))
            out = [None if i is None else table.verdict(i) for i in ids]
            self._trim(key)
            return out

    def host_json(self, names: list[str], key: Key) -> list[str]:
        """Prioritize: each name's HostPriority JSON (score 0 where the pod does not fit)."""
        with self.state.current():
            table = self._table(key)
            ids = self._assign(names, self._index.lookup(names))
            if not has_none(ids):
                out = self._jsons(table, key, ids)
            else:
                it = iter(self._jsons(table, key, [i for i in ids if i is not None]))
                out = [next(it) if i is not None else host_priority_json(n, MIN_SCORE)
                       for n, i in zip(names, ids, strict=True)]
            self._trim(key)
            return out

    def limit_need(self, key: Key, view: NodeView) -> LimitNeed | None:
        """The limit cap's side of decisions for a pod of `key` on this node (None: the cap is off)."""
        if self.limit_ratio is None:
            return None
        sig = key[2] if len(key) >= 3 else ()
        return LimitNeed(limit_total(sig, view.unit_mib) if sig else key[0] * view.unit_mib, self.limit_ratio)

    def size(self) -> int:
        with self.state.lock:
            return self._entries

    # ------------------------------------------------------------------ reading the tables
    def _kinds(self, table: _Table, key: Key, ids: Ids) -> bytes:
        """Each id's verdict kind, in one C-speed pass; the verdicts not memoised yet computed first."""
        kinds = self._index.take(table.kinds, ids)
        if NONE in kinds:  # those ids picked in C (a request of a spanning pod meets hundreds)
            self._fill(table, key, self._index.to_list(self._index.select(ids, kinds.translate(_EMPTY))))
            kinds = self._index.take(table.kinds, ids)
        return kinds

    def _jsons(self, table: _Table, key: Key, ids: list[int]) -> list[str]:
        """Each id's HostPriority JSON (score 0 where the pod does not fit), in one C-speed pass when every
        id fits (joining these texts is 10× cheaper than writing the JSON afresh from names and scores)."""
        items = self._index.gather(table.jsons, self._index.pack(ids))
        if has_none(items):  # nodes that do not fit (score 0), or not filled yet: those alone looked at
            missing = [p for p, item in enumerate(items) if item is None]
            self._kinds(table, key, self._index.pack([ids[p] for p in missing]))
            jsons, fragment = table.jsons, self._fragment
            for p in missing:
                items[p] = jsons[ids[p]] or fragment(ids[p], MIN_SCORE)
        return items

    def _priority_list(self, table: _Table, key: Key, ids: Ids) -> bytes:
        """HostPriorityList JSON of the nodes at `ids`: when every one fits and is memoised (the usual replay),
        their texts joined as they are in one call; else (a None among them: score 0, or not filled yet)
        _jsons fills those in."""
        answer = self._index.join(table.jsons, ids)
        if answer is None:
            answer = ("[" + ",".join(self._jsons(table, key, self._index.to_list(ids))) + "]").encode()
        return answer

    def _reasons(self, table: _Table, names: list[str], ids: Ids, kinds: bytes, passed: list[str]) -> Split:
        """The split of names that are all nodes, some of which fail: their reasons, in C-speed passes."""
        index = self._index
        mask = kinds.translate(_FAIL)
        failed = dict(zip(compress(names, mask), index.gather(table.reasons, index.select(ids, mask)), strict=True))
        never: dict[str, str] = {}
        if NEVER in kinds:
            mask = kinds.translate(_NEVER)
            never = dict(zip(compress(names, mask), index.gather(table.reasons, index.select(ids, mask)),
                             strict=True))
        return Split(passed, failed, never, [])  # reasons are set where FAILS/NEVER

    def _split_with_unknown(self, table: _Table, key: Key, names: list[Any], ids: Sequence[int | None]) -> Split:
        """split() when some names are not nodes with a view (they come back in `unknown`)."""
        self._kinds(table, key, self._index.pack([i for i in ids if i is not None]))
        passed: list[str] = []
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        unknown: list[str] = []
        for name, i in zip(names, ids, strict=True):
            kind = table.kinds[i] if i is not None else NONE
            if kind == FITS:
                passed.append(name)
            elif kind == NONE:
                unknown.append(name)
            else:
                (never if kind == NEVER else failed)[name] = table.reasons[i] or ""  # type: ignore[index]
        return Split(passed, failed, never, unknown)

    # ------------------------------------------------------------------ upkeep
    def _assign(self, names: list[Any], ids: list[Any]) -> list[Any]:
        """`ids` with an id given to each name that is a node with a view and has none yet (first sight)."""
        for pos, i in enumerate(ids):
            if i is None and isinstance(name := names[pos], str):
                if (i := self._index.get(name)) is None and self.state.view_unlocked(name) is not None:
                    i = self._new_id(name)
                ids[pos] = i
        return ids

    def _new_id(self, name: str) -> int:
        if self._free:
            i = self._free.pop()
            self._names[i] = name
            self._host_json[i] = None
            self._sids[i] = None
        else:
            i = len(self._names)
            self._names.append(name)
            self._host_json.append(None)
            self._sids.append(None)
            if i >= self._capacity:  # every table grows with the ids (doubling: amortised O(1) per node)
                self._capacity = max(64, 2 * self._capacity)
                for table in self._tables.values():
                    table.grow(self._capacity)
        self._index.set(name, i)
        return i

    def _fragment(self, i: int, score: int) -> str:
        """The node's HostPriority JSON with this score, made at first need (most nodes are only ever seen
        with one or two scores) and kept until the node goes."""
        fragments = self._host_json[i] or _NO_FRAGMENTS
        text = fragments[score]
        if text is None:  # a tuple of atoms, not a list: the cyclic collector stops scanning it
            name = self._names[i]
            assert name is not None  # a live id
            text = host_priority_json(name, score)
            self._host_json[i] = (*fragments[:score], text, *fragments[score + 1:])
        return text

    def _table(self, key: Key) -> _Table:
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= MAX_TABLES:
                self._entries -= self._tables.popitem(last=False)[1].filled
            table = self._tables[key] = _Table(self._capacity)
            if len(key) == 5 and key[2] == () and key[3] == 0:  # a group's (_refresh): as its last fill found
                table.sharing = self._group_sharing
            self._plan = None
        else:
            self._tables.move_to_end(key)
        return table

    def _fill(self, table: _Table, key: Key, ids: list[int]) -> None:
        """Compute and keep the verdicts of these ids (repeats allowed), evicting tables to stay bounded;
        nodes of one shape share one verdict while shapes repeat (in a filled cluster each node is its own
        shape, and numbering them cost more than the verdicts: 6.4 against 4.0 ms per pod at 20,000 nodes,
        10 % full; a table whose fill finds mostly new shapes stops sharing). One loop, the cells written
        inline: it runs once per node and pod size in a cold memo (65,000 times over the first few hundred
        filters at 5,000 nodes). While sharing, the cells whose shape has a kept verdict are written by
        _nameids.shared_fill (this loop is its reference and runs without it): at 0 % full the spanning tables share
        one shape's verdicts, ~2,700 instructions a cell here (benchmarks/README.md, issue 34, ninth round)."""
        if self._entries + len(ids) > MAX_ENTRIES:
            self._evict(table, len(ids))
        if len(table.shared) > SHARED_MAX:
            table.shared.clear()
        group = len(key) == 5 and key[2] == () and key[3] == 0  # as _refresh's groups
        if not table.sharing and group:
            self._fill_spanning(table, key, ids)
            return
        names, view_of, sids, fragment = self._names, self.state.view_unlocked, self._sids, self._fragment
        kinds, scores, jsons, reasons, shared = table.kinds, table.scores, table.jsons, table.reasons, table.shared
        host_json, native = self._host_json, self._index.shared_fill
        filled = fitting = hits = misses = 0
        sharing = table.sharing
        rest: list[int] = []  # a group's table that stopped sharing in this fill: the ids left, for _fill_spanning
        pos, count = 0, len(ids)
        while pos < count:
            if sharing and native is not None:  # the cells of shapes with a kept verdict natively (shared_fill, this
                pos, more, fit, untexted = native(ids, pos, kinds, scores, jsons, reasons, sids, shared, host_json)
                filled += more  # loop its reference), up to the first cell it cannot write: a shape to number or a
                fitting += fit  # verdict to make, here
                hits += more
                if untexted is not None:  # fitting cells whose text for the score is not kept yet
                    for j in untexted:
                        jsons[j] = fragment(j, scores[j])
                if pos == count:
                    break
            i = ids[pos]
            pos += 1
            if kinds[i] != NONE:
                continue
            if sharing:
                sid, view = sids[i], None
                if sid is None:  # emptied at each change of the node's view (_refresh)
                    view = view_of(names[i])  # type: ignore[arg-type]  # a live id has a name
                    if view is None:
                        continue
                    sid = self._sid(i, view)
                    shared = table.shared  # (_sid may have started the shapes afresh)
                v = shared.get(sid)
                if v is None:
                    view = view or view_of(names[i])  # type: ignore[arg-type]
                    assert view is not None  # a shape is only kept for a node with a view
                    v = shared[sid] = self._verdict(key, view, i)
                    misses += 1
                    sharing = table.sharing = misses < SHARE_TRIAL or hits >= misses
                else:
                    hits += 1
            else:
                view = view_of(names[i])  # type: ignore[arg-type]
                if view is None:
                    continue
                v = self._verdict(key, view, i)
            filled += 1
            if v[0]:
                kinds[i] = FITS
                scores[i] = v[3]
                texts = host_json[i]  # the node's kept text for that score, else _fragment makes it (no call per cell:
                text = texts[v[3]] if texts is not None else None  # the 0 % band's spanning fills, eighth round)
                jsons[i] = text if text is not None else fragment(i, v[3])
                fitting += 1
            else:
                kinds[i] = NEVER if v[1] else FAILS
                reasons[i] = v[2]
            if group and not sharing:
                rest = ids[pos:]
                break
        table.filled += filled
        table.fitting += fitting
        self._entries += filled
        if group:  # what a new table of a group starts with (_table): shapes repeat or not for every size alike
            self._group_sharing = table.sharing
        if rest:
            self._fill_spanning(table, key, rest)

    def _fill_spanning(self, table: _Table, key: Key, ids: list[int]) -> None:
        """_fill for a spanning table of _refresh's groups (no limit signature, no compute share) that no longer
        shares verdicts by shape: one C call (_nameids.span_fill) reads each node's view, takes the set searches kept
        for it (_found: made by the refresh at its last change, or by fills of other sizes of that N and policy;
        the missing ones made where span_search can), and writes every cell where the pod fits and the node's
        HostPriority text for that score is kept, and every cell that finds no room now (FAILED: its reason from
        spanning.no_room_texts); Python resolves the others from their codes as _fill_spanning_each does (NO_ROOM's
        never path, the general path, a search left to the reference, a text to make, a node the cap may decide).
        Why: that loop cost ~3,300 instructions a cell in Python (a request of a spanning pod finds ~170 cells
        empty), and a cell whose search was missing went through spanning.codes alone (benchmarks/README.md, issue
        34, sixth round). Without the C module, or with a cap ratio below 1 (every node capped), the Python loop."""
        fill, ratio, views = self._index.span_fill, self.limit_ratio, self.state.views_unlocked()
        if fill is None or (ratio is not None and ratio < 1) or views is None:
            self._fill_spanning_each(table, key, ids)
            return
        gpus, policy = gpus_of(key), key[1]
        no_room = spanning.no_room_texts(gpus)
        first = views.get(self._names[ids[0]]) if ids else None  # type: ignore[arg-type]
        if first is not None and key[0] * first.unit_mib not in no_room:  # the reason the C writes where no N GPUs
            spanning._no_room(key[0] * first.unit_mib, 0, "", gpus)  # have room (a first fill: made here, once)
        codes, written = fill(ids, self._names, views, NodeView, self._found, (gpus, policy), key[0], gpus,
                              policy == "spread", spanning.plans(), FOUND_MAX, ratio is not None, table.kinds,
                              table.scores, table.jsons, self._host_json, table.reasons, no_room)
        failed = codes.count(FAILED)
        table.filled += written + failed
        table.fitting += written
        self._entries += written + failed
        if written + failed == len(ids):
            return
        kinds, founds, one, names = table.kinds, self._found, self._index.span_scores, self._names
        for pos in compress(range(len(ids)), codes.translate(_LEFT)):
            i = ids[pos]
            view = views.get(names[i])  # type: ignore[arg-type]  # a live id has a name
            if kinds[i] != NONE or view is None:  # an id repeated in `ids`: written once
                continue
            code = codes[pos]
            if code == CAPPED:  # not _without_cap: one by one
                self._put(table, i, self._verdict(key, view, i))
                continue
            need = key[0] * view.unit_mib
            if code == spanning.UNSEARCHED:  # the search the C left to the reference, made and kept, asked again
                found = founds.get(i)
                if found is None:
                    if len(founds) >= FOUND_MAX:
                        founds.clear()
                    found = founds[i] = {}
                code = spanning.codes(view, (need,), policy, gpus, found, one)[0]
            self._put(table, i, _FITS[code] if code <= MAX_SCORE else spanning.resolve(view, need, policy, gpus, code))

    def _fill_spanning_each(self, table: _Table, key: Key, ids: list[int]) -> None:
        """_fill_spanning in Python (the reference of _nameids.span_fill, and what a build without it runs): the
        nodes' scores in one spanning.codes_each call (_nameids.span_scores_each where it was built), each with the
        set searches kept for its view (_found), where the cap leaves the pod alone (else _verdict). Why: a spanning
        key is asked a few times per band of benchmarks/README.md's mix, and each ask finds ~half of its names
        without a verdict."""
        names, view_of, founds, ratio = self._names, self.state.view_unlocked, self._found, self.limit_ratio
        kinds, scores, jsons, reasons, fragment = table.kinds, table.scores, table.jsons, table.reasons, self._fragment
        todo: list[int] = []
        views: list[NodeView] = []
        found_of: list[spanning.Found] = []
        for i in ids:
            if kinds[i] != NONE:
                continue
            view = view_of(names[i])  # type: ignore[arg-type]  # a live id has a name
            if view is None:
                continue
            if ratio is not None and (view.over is not None or ratio < 1):  # not _without_cap: one by one
                self._put(table, i, self._verdict(key, view, i))
                continue
            found = founds.get(i)
            if found is None:
                if len(founds) >= FOUND_MAX:
                    founds.clear()
                found = founds[i] = {}
            todo.append(i)
            views.append(view)
            found_of.append(found)
        if not todo:
            return
        need, policy, gpus = key[0] * views[0].unit_mib, key[1], gpus_of(key)
        if any(v.unit_mib != views[0].unit_mib for v in views):  # (nodes of another unit: one size per unit)
            out = bytes(spanning.codes(v, (key[0] * v.unit_mib,), policy, gpus, f, self._index.span_scores)[0]
                        for v, f in zip(views, found_of, strict=True))
        else:
            out = spanning.codes_each(views, found_of, need, policy, gpus, self._index.span_scores_each,
                                      self._index.span_scores)
        filled = fitting = 0
        for i, view, code in zip(todo, views, out, strict=True):
            if kinds[i] != NONE:  # an id repeated in `ids`: written once
                continue
            filled += 1
            if code <= MAX_SCORE:
                kinds[i] = FITS
                scores[i] = code
                jsons[i] = fragment(i, code)
                fitting += 1
                continue
            v = spanning.resolve(view, key[0] * view.unit_mib, policy, gpus, code)
            if v[0]:
                kinds[i] = FITS
                scores[i] = v[3]
                jsons[i] = fragment(i, v[3])
                fitting += 1
            else:
                kinds[i] = NEVER if v[1] else FAILS
                reasons[i] = v[2]
        table.filled += filled
        table.fitting += fitting
        self._entries += filled

    def _sid(self, i: int, view: NodeView) -> int:
        """The number of the node's shape (see Shape), kept per id until its view changes. Verdicts are
        shared by these numbers: a small int hashes at once, a shape of 36 atoms does not."""
        shape = (view.unit_mib, view.unplaced_mib, view.error, view.over, view.compute, view.topo,
                 *chain.from_iterable(map(_SHAPE_FIELDS, view.rows)))
        sid = self._shape_ids.get(shape)
        if sid is None:
            if len(self._shape_ids) >= SHAPES_MAX:  # bounded: start the numbering and the sharing afresh
                self._shape_ids.clear()
                self._sids[:] = repeat(None, len(self._sids))  # in place: _fill holds the list
                for table in self._tables.values():
                    table.shared.clear()
            sid = self._shape_ids[shape] = len(self._shape_ids)
        self._sids[i] = sid
        return sid

    def _verdict(self, key: Key, view: NodeView, i: int) -> Verdict:
        """The verdict of node id `i` (its view: `view`) for `key`; for a spanning key as _refresh's groups, with
        the set searches kept for that view (_found: a fill of another size of that N and policy reuses them)."""
        if len(key) == 5 and key[2] == () and key[3] == 0 and self._without_cap(view):  # as _refresh's groups
            found = self._found.get(i)
            if found is None:
                if len(self._found) >= FOUND_MAX:
                    self._found.clear()
                found = self._found[i] = {}
            v = spanning.verdicts(view, [key[0] * view.unit_mib], key[1], key[4], found, self._index.span_scores)[0]
        else:
            v = decisions.verdict(view, key[0] * view.unit_mib, key[1], self.limit_need(key, view),
                                  compute_of(key), gpus_of(key))
        return _FITS[v[3]] if v[0] else v

    def _without_cap(self, view: NodeView) -> bool:
        """Does the limit cap leave alone a pod whose limit is its request (limit signature ()) on this node? Yes
        when it is off, or on a node without elastic pods (decisions._capped; the ratio is at least 1)."""
        return self.limit_ratio is None or (view.over is None and self.limit_ratio >= 1)

    def _set(self, table: _Table, key: Key, i: int, view: NodeView) -> None:
        self._put(table, i, self._verdict(key, view, i))

    def _put(self, table: _Table, i: int, v: Verdict) -> None:
        before = table.kinds[i]
        if before == NONE:
            table.filled += 1
            self._entries += 1
        elif before == FITS:
            table.fitting -= 1
        if v[0]:
            score = v[3]
            table.kinds[i], table.scores[i], table.reasons[i] = FITS, score, None
            table.jsons[i] = self._fragment(i, score)
            table.fitting += 1
        else:
            table.kinds[i], table.scores[i], table.reasons[i] = NEVER if v[1] else FAILS, MIN_SCORE, v[2]
            table.jsons[i] = None

    def _evict(self, keep: _Table, room: int) -> None:
        """Drop least recently used tables (never `keep`) until `room` more verdicts fit."""
        for key in list(self._tables):
            if self._entries + room <= MAX_ENTRIES:
                return
            if self._tables[key] is not keep:
                self._entries -= self._tables.pop(key).filled
                self._plan = None

    def _trim(self, key: Key) -> None:
        """After an answer: if one request's names alone overfilled the memo, start its table afresh."""
        if self._entries > MAX_ENTRIES and (table := self._tables.get(key)) is not None:
            self._entries -= table.filled
            table.clear(self._capacity)
            self._plan = None  # (the plan holds the table's arrays, new ones now)

    def _refresh(self, name: str, view: NodeView | None) -> None:
        """Called under the state's lock whenever the node's view is rebuilt (None: dropped): every table
        that holds the node gets its new verdict now, so the tables stay complete."""
        i = self._index.get(name)
        if i is None:
            return
        if view is not None:
            self._sids[i] = None
            self._found.pop(i, None)
            before = self._columns.pop(i, None)
            singles, groups = self._plan or self._make_plan()
            for key, table in singles:
                if table.kinds[i] != NONE:
                    self._set(table, key, i, view)
            if groups:
                self._refresh_groups(i, view, groups, before)
            return
        for table in self._tables.values():  # the node is gone: free its id in every table
            self._entries -= table.kinds[i] != NONE
            table.empty(i)
        self._index.discard(name)
        self._names[i] = self._host_json[i] = self._sids[i] = None
        self._found.pop(i, None)
        self._columns.pop(i, None)
        self._free.append(i)
        self._epoch += 1

    def _refresh_groups(self, i: int, view: NodeView, groups: list[Group], before: Column | None) -> None:
        """_refresh for the spanning tables grouped by (N, policy): all groups' cells of node `i` in one native call
        (_nameids.span_refresh_node: what follows, the change check, the kept searches and each group's plan included;
        per group as _nameids.span_refresh: the codes as spanning.codes, the cells that still fit written there, and
        those that find no room now with their reason), the rest left here (_refresh_one where no plan is kept,
        _refresh_left); where it is not built the same per group (_refresh_one), and where the view takes the general
        path in one spanning.codes call and a loop here (_refresh_group). Every cell held a
        verdict: the counts of filled cells stay. A cell whose
        size is above every free MiB a changed GPU had before or after the change keeps its verdict: those GPUs lack
        room for it in both views, so the GPUs with room, the sets among them, their free fractions and the chosen
        set's free MiB are the same (`before`: the column the cells were last refreshed at, kept only while nothing
        else a verdict reads differs: nameids.span_above; None: every cell afresh). While nothing but free MiB
        changed, a cell that failed and still finds too few GPUs with room (NO_ROOM) keeps its verdict too: on such a
        view every failing verdict of a size is spanning._without_room's, which reads only the GPUs' MiB and health
        (the same), where computing it again cost a scan of the GPUs per cell at every bind."""
        ratio = self.limit_ratio  # (_without_cap, written out: this runs at every bind)
        if ratio is not None and (view.over is not None or ratio < 1):  # the cap may change what these pods get
            for _, members, *_ in groups:  # here: one by one
                for key, table in members:
                    if table.kinds[i] != NONE:
                        self._set(table, key, i, view)
            return
        self._columns[i] = view
        whole = self._index.span_refresh_node
        if whole is not None:  # all of the below natively; what it leaves, as below
            left = whole(i, view, before, groups, self._found, FOUND_MAX, self._host_json, self._names)
            if left is not None:
                above, same, searches, todos = left  # (searches: the node's kept set searches, made there)
                for g, todo in todos:
                    if todo is False:  # no plan kept for the topology: made below
                        self._refresh_one(i, view, groups[g], searches, above, same)
                    else:
                        self._refresh_left(i, view, groups[g], searches, above, same, todo)
            return
        above, same = 1 << 62, False  # sizes above `above` keep their verdicts (none, unless `before` tells)
        if (before is not None and not view.unplaced_mib and not view.error and not before.unplaced_mib
                and not before.error and before.unit_mib == view.unit_mib and before.topo == view.topo
                and before.over == view.over and before.compute == view.compute):
            changed = self._index.span_above(before.rows, view.rows)
            if changed is not None:
                above, same = changed, True
        general = view.unplaced_mib or view.error or not view.rows  # every code GENERAL (spanning.codes): the loop
        found = self._found.get(i)  # the view's set searches, kept for the fills that follow (_verdict)
        if found is None:
            if len(self._found) >= FOUND_MAX:
                self._found.clear()
            found = self._found[i] = {}
        for group in groups:
            if general:
                self._refresh_group(i, view, group[1], group[0][1], group[0][0], found, above, same)
            else:
                self._refresh_one(i, view, group, found, above, same)

    def _refresh_one(self, i: int, view: NodeView, group: Group, found: spanning.Found, above: int,
                     same: bool) -> None:
        """One group of _refresh_groups: its plan for the view's topology (made where not kept), one native call
        (_nameids.span_refresh) where the module is built, and what it leaves (_refresh_left)."""
        at, _, cells, spread, plans, no_room = group
        gpus, policy = at
        native = self._index.span_refresh
        todo = None
        if native is not None:
            unit, rows, topo, keys = view.unit_mib, view.rows, view.topo, view.free_keys
            chosen = found.get(at)
            if chosen is None:
                chosen = found[at] = [None] * (len(keys) + 1)
            plan = plans.get(id(topo))
            if plan is None or plan[0] is not topo:
                plan = _search_plan(plans, topo, gpus)
            todo = native(i, keys, chosen, cells, gpus, spread, None if plan[1] is None else rows, view.free_rows,
                          plan[1], plan[2], self._host_json[i], above, same, unit, plan[3], rows, no_room)
        self._refresh_left(i, view, group, found, above, same, todo)

    def _refresh_left(self, i: int, view: NodeView, group: Group, found: spanning.Found, above: int, same: bool,
                      todo: bytes | None) -> None:
        """What a group's native refresh left: all of it where it answered None (_refresh_group), else its (position,
        code) pairs (_refresh_cells)."""
        at, members, _, _, plans, _ = group
        gpus, policy = at
        if todo is None:
            self._refresh_group(i, view, members, policy, gpus, found, above, same)
        elif todo:
            if UNSEARCHED in todo:  # the reference searches (and keeps the mask in spanning._plan's, which may be
                plans.pop(id(view.topo), None)  # a newer dict than the one kept here: read afresh next time)
            self._refresh_cells(i, view, members, todo, policy, gpus, found, same)

    def _refresh_group(self, i: int, view: NodeView, members: list[tuple[Key, _Table]], policy: str, gpus: int,
                       found: spanning.Found, above: int, same: bool) -> None:
        """_refresh_groups for one group in Python (the reference of _nameids.span_refresh): the codes of the cells
        held whose size is not above `above`, in one spanning.codes call, each written (_write_code)."""
        unit = view.unit_mib
        held = [m for m in members if m[1].kinds[i] != NONE and m[0][0] * unit <= above]
        if not held:
            return
        needs = [key[0] * unit for key, _ in held]
        for (_, table), need, code in zip(held, needs, spanning.codes(view, needs, policy, gpus, found,
                                                                      self._index.span_scores), strict=True):
            self._write_code(table, i, view, need, policy, gpus, code, same)

    def _refresh_cells(self, i: int, view: NodeView, members: list[tuple[Key, _Table]], todo: bytes, policy: str,
                       gpus: int, found: spanning.Found, same: bool) -> None:
        """The cells _nameids.span_refresh left (todo: (position in `members`, code) pairs): a set search it could
        not make (UNSEARCHED: made here, spanning.codes), a reason to write, a text not made yet. Nothing built per
        pair (a tuple made here can start the cyclic collector, at every bind)."""
        unit = view.unit_mib
        for p in range(0, len(todo), 2):
            key, table = members[todo[p]]
            need, code = key[0] * unit, todo[p + 1]
            if code == FAILED:  # a fit written failing there (NO_ROOM's reason): the count is kept here
                table.fitting -= 1
                continue
            if code == UNSEARCHED:
                code = spanning.codes(view, (need,), policy, gpus, found, self._index.span_scores)[0]
            self._write_code(table, i, view, need, policy, gpus, code, same)

    def _write_code(self, table: _Table, i: int, view: NodeView, need: int, policy: str, gpus: int, code: int,
                    same: bool) -> None:
        """Node i's cell of a spanning group's table (it holds a verdict) from its code (spanning.codes), written
        where it changed: a fit's score and text; else the verdict spanning.resolve makes of the code, unless the
        cell failed and still finds no room on a view where only free MiB changed (`same`: see _refresh_groups).
        One write a statement: an assignment of four values builds a tuple."""
        kinds = table.kinds
        if code <= MAX_SCORE:
            if kinds[i] == FITS:
                if table.scores[i] == code:  # unchanged: its text is the node's for it
                    return
                table.fitting -= 1
            self._write_fit(table, i, code)
            return
        if code == NO_ROOM and same and kinds[i] != FITS:  # as it was: see _refresh_groups
            return
        v = spanning.resolve(view, need, policy, gpus, code)
        table.fitting -= kinds[i] == FITS
        if v[0]:
            self._write_fit(table, i, v[3])
            return
        kinds[i] = NEVER if v[1] else FAILS
        table.scores[i] = MIN_SCORE
        table.reasons[i] = v[2]
        table.jsons[i] = None

    def _write_fit(self, table: _Table, i: int, score: int) -> None:
        table.kinds[i] = FITS
        table.scores[i] = score
        table.reasons[i] = None
        table.jsons[i] = self._fragment(i, score)
        table.fitting += 1

    def _make_plan(self) -> RefreshPlan:
        """Split the tables for _refresh: a spanning table whose key has no limit signature and no compute share
        joins its (N, policy) group; every other table is refreshed on its own."""
        singles: list[tuple[Key, _Table]] = []
        groups: dict[tuple[int, str], list[tuple[Key, _Table]]] = {}
        for key, table in self._tables.items():
            if len(key) == 5 and key[2] == () and key[3] == 0:
                groups.setdefault((key[4], key[1]), []).append((key, table))
            else:
                singles.append((key, table))
        plan = self._plan = singles, [(at, members, tuple((key[0], t.kinds, t.scores, t.jsons, t.reasons)
                                                          for key, t in members),
                                       at[1] == "spread", {}, spanning.no_room_texts(at[0]))
                                      for at, members in groups.items()]
        return plan

    def _keep_replay(self, uid: str, replay: Replay) -> None:
        old = self._replays.pop(uid, None)
        self._replay_names += replay[5] - (old[5] if old is not None else 0)
        self._replays[uid] = replay
        while len(self._replays) > REPLAYS or self._replay_names > REPLAY_NAMES:
            self._replay_names -= self._replays.popitem(last=False)[1][5]

"""Node name -> node id for the memo (fitmemo.py), and the reads by ids its filter and prioritize make.

One interface, two implementations with the same answers (tests/extender/test_nameids.py checks them against each
other): `NameIds`, plain Python and the reference, and `NativeNameIds`, whose bulk operations are C
(_nameids.c, built with the package). Why C at all: with every node's name in every filter (kube-scheduler
at percentageOfNodesToScore 100, or a small cluster), a filter and a prioritize of 5,000 names spent 0.6 ms
in the lookups and reads here in Python (benchmarks/README.md, "All names per filter, natively").

`Ids` are the ids of a list of names, in its order: a list of ints here, packed uint32 bytes natively. The
memo never looks inside: it passes them back to take, gather, join, select and to_list. `same` compares two
lists of names (prioritize's with those its filter passed).

`ids()` is all or nothing: None unless every item is a node's name with an id; the memo's Python path then
looks at each name (and gives new nodes their ids with set()). The native index also answers None for any
name that is not an ASCII str (node names are DNS subdomains, so only a hostile or broken request has one).
"""

from __future__ import annotations

import logging
import os
import re
from array import array
from collections.abc import Callable
from itertools import compress, repeat
from operator import is_, itemgetter
from typing import Any, Literal

import orjson

from ..placement.spanning import Chosen, Closest, Levels, Scores, ScoresEach
from ..placement.views import GpuRow
from ..wire import host_priority_array, host_priority_json

log = logging.getLogger(__name__)

Ids = Any  # list[int] (NameIds) or packed uint32 bytes (NativeNameIds)
SpanFill = Callable[..., tuple[bytes, int]]  # _nameids.span_fill (its arguments: _nameids.pyi)
SharedFill = Callable[..., tuple[int, int, int, "list[int] | None"]]  # _nameids.shared_fill (_nameids.pyi)
FilterAnswer = Callable[[bytes, Any, bytes, bytearray, list[Any], bool], "tuple[bytes, bytes, bytes] | None"]

try:
    from . import _nameids as _native
    _IMPORT_ERROR = ""
except ImportError as exc:  # a build without a C compiler: the Python reference serves (slower, same answers)
    _native = None  # type: ignore[assignment]
    _IMPORT_ERROR = str(exc)


def _gather(seq: Any, ids: list[int]) -> tuple[Any, ...]:
    """`seq[i]` for each id, as a tuple, in one C call: `itemgetter(*ids)` reads 5,000 ids of a bytearray in
    71 us where `bytes(map(seq.__getitem__, ids))` took 216 (its per-item method calls), and a list's items in
    50 us against 95. An id that is None raises TypeError before anything is read."""
    if len(ids) > 1:
        return itemgetter(*ids)(seq)  # type: ignore[no-any-return]
    return tuple(seq[i] for i in ids)  # itemgetter of one id answers the item itself, of none is an error


# A JSON array of plain strings: printable ASCII without `"` or `\\` (what ids_json reads without decoding)
_PLAIN_NAMES = re.compile(rb'[ \t\n\r]*\[[ \t\n\r]*(?:"[ !#-\[\]-~]*"(?:[ \t\n\r]*,[ \t\n\r]*"[ !#-\[\]-~]*")*'
                          rb'[ \t\n\r]*)?\][ \t\n\r]*')


def has_none(items: Any) -> bool:
    """`None in items`, by identity: `in` compares each item with == (a str == None costs more than the
    dict lookup that produced it)."""
    return any(map(is_, items, repeat(None)))


# _nameids.span_refresh (the memo's refresh of one spanning group on a node, FitMemo._refresh_groups): (node id,
# the view's free_keys, the group's set searches (spanning.Found's list), per table (size per GPU, kinds, scores,
# jsons), N, spread, the view's rows (None: no search natively) and free_rows, spanning._plan's closest sets per mask
# and closeness per distance, the node's HostPriority texts per score or None, above, same, unit, spanning._plan's
# levels (masks not kept yet are looked for there, and kept), the view's rows, spanning.no_room_texts(N) or None)
# -> (position, code) pairs left to Python, or None (a value not exact: nothing written)
SpanCell = tuple[int, bytearray, bytearray, list[str | None], list[str | None]]  # (size, kinds, scores, jsons, reasons)
SpanRefresh = Callable[[int, tuple[int, ...], list[Chosen], tuple[SpanCell, ...], int, bool,
                        tuple[GpuRow, ...] | None, tuple[GpuRow, ...], dict[int, Closest] | None,
                        tuple[float, ...] | None, tuple[str | None, ...] | None, int, bool, int, Levels | None,
                        tuple[GpuRow, ...], dict[int, str] | None],
                       bytes | None]

# _nameids.span_refresh_node (a bind's spanning groups of a node in one call, FitMemo._refresh_groups past the cap's
# check): (node id, its view, the view its cells were refreshed at or None, the refresh plan's groups, the memo's
# _found, FOUND_MAX, the memo's texts per node and names: a text missing made and kept as FitMemo._fragment would)
# -> None (every group done), or (above, same, the node's found dict, [(position in groups, what is left: the
# (position, code) pairs, None: the group in Python, False: no plan kept)])
SpanRefreshNode = Callable[[int, Any, Any, list[Any], dict[int, Any], int, list[Any], list[Any]],
                           tuple[int, bool, dict[Any, Any], list[tuple[int, bytes | None | Literal[False]]]] | None]


def span_above(before: tuple[GpuRow, ...], now: tuple[GpuRow, ...]) -> int | None:
    """For two views' rows of a node: None where they differ in anything but free MiB (the row count, a GPU's
    index, MiB or health), else the largest free MiB, before or after, of the GPUs whose free MiB changed (-1:
    none). The reference of _nameids.span_above (which also answers None for values it cannot read exactly: always
    right, the memo then refreshes every cell)."""
    if len(before) != len(now):
        return None
    above = -1
    for b, n in zip(before, now, strict=True):
        if b is n:
            continue
        if b[1] != n[1] or b[3] != n[3] or b[4] != n[4]:
            return None
        if b[6] != n[6]:
            above = max(above, b[6], n[6])
    return above


class NameIds:
    """Node name -> id, in a dict; the bulk operations in Python (the reference for NativeNameIds)."""

    # The memo's scores of pods spanning GPUs natively (_nameids.span_scores); None: spanning.scores, the reference
    span_scores: Scores | None = None
    span_scores_each: ScoresEach | None = None
    # The memo's refresh of a spanning group natively (_nameids.span_refresh); None: the Python loop (FitMemo)
    span_refresh: SpanRefresh | None = None
    span_above = staticmethod(span_above)  # natively _nameids.span_above
    span_refresh_node: SpanRefreshNode | None = None  # _nameids.span_refresh_node; None: per group (FitMemo)
    span_fill: SpanFill | None = None  # _nameids.span_fill (FitMemo._fill_spanning natively); None: its Python loop
    shared_fill: SharedFill | None = None  # _nameids.shared_fill (FitMemo._fill by shared shapes); None: the loop
    # _nameids.filter_answer (a failing filter's answer whole, FitMemo.split_json); None: the split, encoded by orjson
    filter_answer: FilterAnswer | None = None

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def get(self, name: Any) -> int | None:
        """The name's id, None when it has none (TypeError for an unhashable name)."""
        return self._ids.get(name)

    def lookup(self, names: list[Any]) -> list[int | None]:
        """Each name's id or None (TypeError for an unhashable name)."""
        return list(map(self._ids.get, names))

    def set(self, name: str, i: int) -> None:
        self._ids[name] = i

    def discard(self, name: str) -> None:
        self._ids.pop(name, None)

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self, names: list[Any]) -> Ids | None:
        """Every name's id, or None when some name has none (TypeError for an unhashable name)."""
        ids = self.lookup(names)
        return None if has_none(ids) else ids

    def ids_json(self, data: bytes, limit: int) -> Ids | None:
        """ids() of the names in `data`, the bytes of a JSON array of strings (a request's NodeNames, not
        decoded): None unless it is an array of plain strings (printable ASCII, no escapes) with at most
        `limit` names, every one held."""
        if _PLAIN_NAMES.fullmatch(data) is None:
            return None
        names = orjson.loads(data)
        return self.ids(names) if len(names) <= max(limit, 0) else None

    def pack(self, ids: list[int]) -> Ids:
        """Ids from a list of ids (every one an int)."""
        return ids

    def to_list(self, ids: Ids) -> list[int]:
        return list(ids)

    def take(self, table: bytearray, ids: Ids) -> bytes:
        """bytes(table[i] for i in ids)."""
        return bytes(_gather(table, ids))

    def gather(self, items: list[Any], ids: Ids) -> list[Any]:
        """[items[i] for i in ids]."""
        return list(_gather(items, ids))

    def select(self, ids: Ids, mask: bytes) -> Ids:
        """The ids whose mask byte is not 0."""
        return list(compress(ids, mask))

    def same(self, a: list[Any], b: list[Any]) -> bool:
        """a == b (prioritize's names against those its filter passed)."""
        return a == b

    def join(self, texts: list[str | None], ids: Ids) -> bytes | None:
        """b"[" + b",".join(texts[i] for i in ids) + b"]", or None when some texts[i] is None."""
        try:
            return ("[" + ",".join(_gather(texts, ids)) + "]").encode()
        except TypeError:  # a None among them (raised before anything was joined)
            return None


    def hosts_json(self, data: bytes, ids: Ids, kinds: bytearray, scores: bytearray, fits: int) -> bytes | None:
        """Prioritize's answer (HostPriorityList JSON) for the names in `data`, a JSON array of plain strings
        (as ids_json reads it) whose k-th name has the id ids[k]: each scored scores[id]; None unless `data` is
        such an array of as many names as `ids` and every kinds[id] is `fits` (the caller's path then writes
        it). The same bytes as join() of the names' host_priority_json texts."""
        if _PLAIN_NAMES.fullmatch(data) is None:
            return None
        names, at = orjson.loads(data), self.to_list(ids)
        if len(names) != len(at) or any(kinds[i] != fits for i in at):
            return None
        return host_priority_array([host_priority_json(n, scores[i]) for n, i in zip(names, at, strict=True)])


class NativeNameIds(NameIds):
    """NameIds with its bulk operations in C: the dict stays for single lookups (and is what the index
    mirrors); ids() asks the native index, whose hash is keyed by a random seed of this process's."""

    def __init__(self) -> None:
        super().__init__()
        self._c = _native  # (kept: the module this index was made with serves all its reads)
        self.span_scores = _native.span_scores
        self.span_scores_each = _native.span_scores_each
        self.span_refresh = _native.span_refresh
        self.span_above = _native.span_above
        self.span_refresh_node = _native.span_refresh_node
        self.span_fill = _native.span_fill
        self.shared_fill = _native.shared_fill
        self.filter_answer = _native.filter_answer
        self._native = _native.NameIndex(int.from_bytes(os.urandom(8), "little"))

    def set(self, name: str, i: int) -> None:
        self._ids[name] = i
        self._native.set(name, i)

    def discard(self, name: str) -> None:
        self._ids.pop(name, None)
        self._native.discard(name)

    def ids(self, names: list[Any]) -> Ids | None:
        return self._native.ids(names)

    def ids_json(self, data: bytes, limit: int) -> Ids | None:
        return self._native.ids_json(data, limit)

    def pack(self, ids: list[int]) -> Ids:
        return array("I", ids).tobytes()

    def to_list(self, ids: Ids) -> list[int]:
        return memoryview(ids).cast("I").tolist()

    def take(self, table: bytearray, ids: Ids) -> bytes:
        return self._c.take(table, ids)

    def gather(self, items: list[Any], ids: Ids) -> list[Any]:
        return self._c.gather(items, ids)

    def select(self, ids: Ids, mask: bytes) -> Ids:
        return self._c.select(ids, mask)

    def same(self, a: list[Any], b: list[Any]) -> bool:
        answer = self._c.same(a, b) if type(a) is list and type(b) is list else None
        return a == b if answer is None else answer

    def join(self, texts: list[str | None], ids: Ids) -> bytes | None:
        return self._c.join(texts, ids)

    def hosts_json(self, data: bytes, ids: Ids, kinds: bytearray, scores: bytearray, fits: int) -> bytes | None:
        return self._c.hosts_json(data, ids, kinds, scores, fits)


def name_ids() -> NameIds:
    """The native implementation when it was built, else the Python one (logged once per memo)."""
    if _native is None or array("I").itemsize != 4:
        log.warning("the native node-name index is not available (%s): filter and prioritize use the Python "
                    "implementation, with the same answers but slower for requests with thousands of names; "
                    "reinstall memslice with a C compiler to build it",
                    _IMPORT_ERROR or "array('I') is not 4 bytes here")
        return NameIds()
    return NativeNameIds()

"""The memo's node-name index: the C implementation (scheduler_extender/index/_nameids.c) answers what the Python
reference (nameids.NameIds) answers, whatever the names and operations, and refuses bad arguments without
crashing. With MEMSLICE_NAMEIDS_SO=path (`make sanitize`) the C module under test is that build, e.g. one
compiled with AddressSanitizer."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import json
import logging
import os
import platform
import random
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import QUICK, examples

from memslice.scheduler_extender.index import nameids
from memslice.scheduler_extender.index.nameids import NameIds, NativeNameIds


def _load_native(path: str | None = None) -> ModuleType:
    path = path or os.environ.get("MEMSLICE_NAMEIDS_SO")
    if not path:
        from memslice.scheduler_extender.index import _nameids

        return _nameids
    name = "memslice.scheduler_extender.index._nameids"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


NATIVE = _load_native()
SOURCE = Path(nameids.__file__).with_name("_nameids.c")


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The module built with MEMSLICE_NAMES_PORTABLE: names scanned a word at a time, as on a CPU without SSE2
    (aarch64), which no other test here would reach on x86_64. Under the sanitizer pass (MEMSLICE_NAMEIDS_SO
    set) it is built with the same sanitizers."""
    out = tmp_path_factory.mktemp("portable") / "_nameids.so"
    flags = ["-O2"] if not os.environ.get("MEMSLICE_NAMEIDS_SO") else [
        "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, *flags, "-DMEMSLICE_NAMES_PORTABLE", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(out)], check=True, timeout=120)
    return _load_native(str(out))


@pytest.fixture(autouse=True)
def native_under_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(nameids, "_native", NATIVE)
    yield


@pytest.fixture(params=["simd", "portable"])
def scan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Each of the two scans of names in turn (the build's own, and the portable one) as the native module."""
    module = NATIVE if request.param == "simd" else request.getfixturevalue("portable")
    monkeypatch.setattr(nameids, "_native", module)
    return module


def test_the_portable_build_scans_without_simd(portable: ModuleType) -> None:
    """The two builds differ where they should: x86_64's scans 16 bytes at a time, the portable one does not
    (so the tests taking `scan` reach both paths)."""
    assert portable.NAMES_SIMD == 0
    assert NATIVE.NAMES_SIMD == (1 if platform.machine() in ("x86_64", "AMD64") else 0)


def pair() -> tuple[NameIds, NativeNameIds]:
    return NameIds(), NativeNameIds()


def is_ascii_str(x: object) -> bool:
    return type(x) is str and x.isascii()


# Names: node-like ones (many share a prefix and differ in a digit), the empty name, NULs and lengths around
# the hash's 8-byte words, and any text (non-ASCII, lone surrogates): those the native index never holds.
node_names = st.builds(lambda n: f"node-{n:05d}", st.integers(0, 300))
odd_names = st.sampled_from(["", "a", "a\x00", "a\x00\x00", "x" * 7, "x" * 8, "x" * 9, "x" * 16, "x" * 300])
names = st.one_of(node_names, odd_names, st.text(max_size=20))
ops = st.lists(st.tuples(st.sampled_from(["set", "discard"]), names, st.integers(0, 2**32 - 1)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops, st.lists(st.one_of(names, st.integers(), st.none()), max_size=30))
def test_native_ids_answer_what_the_python_reference_answers(operations: list[tuple[str, str, int]],
                                                             query: list[Any]) -> None:
    py, native = pair()
    for op, name, i in operations:
        if op == "set":
            py.set(name, i)
            native.set(name, i)
        else:
            py.discard(name)
            native.discard(name)
    assert len(native._native) == sum(1 for n in py._ids if n.isascii())
    for q in (query, [n for _, n, _ in operations], [n for n in py._ids]):
        hashable = all(x is None or isinstance(x, (str, int)) for x in q)
        want = py.ids(q) if hashable else None
        got = native.ids(q)
        if got is None:  # native may only give up on a name it does not hold or cannot read
            assert want is None or not all(is_ascii_str(x) for x in q)
        else:
            assert native.to_list(got) == want
    assert [native.get(n) for n in py._ids] == list(py._ids.values())  # the dict it mirrors


def test_many_names_grow_shrink_and_come_back() -> None:
    """Growth (rehashing), deletes that shift probe runs back, and the arena compacted after many deletes."""
    py, native = pair()
    rng = random.Random(7)
    names = [f"ip-10-{rng.randrange(256)}-{n}.ec2.internal" for n in range(20_000)]
    for i, name in enumerate(names):
        py.set(name, i)
        native.set(name, i)
    for name in names[::2]:
        py.discard(name)
        native.discard(name)
    for i, name in enumerate(names[::4]):
        py.set(name, 50_000 + i)
        native.set(name, 50_000 + i)
    rng.shuffle(names)
    live = [n for n in names if py.get(n) is not None]
    assert len(native._native) == len(live) == len(py)
    assert native.to_list(native.ids(live)) == py.ids(live)
    assert native.ids(names) is None and py.ids(names) is None  # some are gone
    for name in live:
        native.discard(name)
    assert len(native._native) == 0 and native.ids(live[:1]) is None and native.ids([]) == b""


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.data())
def test_reads_by_ids_answer_what_python_answers(size: int, data: st.DataObject) -> None:
    py, native = pair()
    table = bytearray(data.draw(st.binary(min_size=size, max_size=size)))
    texts: list[Any] = data.draw(st.lists(st.one_of(st.none(), st.text(max_size=6), st.just('{"Host":"n"}')),
                                          min_size=size, max_size=size))
    ids = data.draw(st.lists(st.integers(0, max(size - 1, 0)), max_size=30)) if size else []
    mask = data.draw(st.binary(min_size=len(ids), max_size=len(ids)))
    packed = native.pack(ids)
    assert native.to_list(packed) == ids
    assert native.take(table, packed) == py.take(table, ids)
    assert native.gather(texts, packed) == py.gather(texts, ids)
    assert native.to_list(native.select(packed, mask)) == py.select(ids, mask)
    joined = native.join(texts, packed)
    if all(is_ascii_str(texts[i]) for i in ids):
        assert joined == py.join(texts, ids) == ("[" + ",".join(texts[i] for i in ids) + "]").encode()
    else:  # None, or a text that is not ASCII: the memo's Python path writes those
        assert joined is None


items = st.one_of(names, st.text(alphabet=st.characters(min_codepoint=0x100)), st.integers(), st.none(),
                  st.just(float("nan")))


@settings(max_examples=300, deadline=None)
@given(st.lists(items, max_size=12), st.data())
def test_same_answers_list_equality(a: list[Any], data: st.DataObject) -> None:
    """Prioritize's names against those filter passed: equal copies (not the same objects), a changed item,
    one more or fewer, strings of every width (1-, 2- and 4-byte kinds), and items that are not strings."""
    native = NativeNameIds()
    copies = [x.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass") if type(x) is str else x
              for x in a]
    b = data.draw(st.sampled_from([copies, copies[:-1], copies + ["x"], a]))
    if b and data.draw(st.booleans()):
        b = list(b)
        b[data.draw(st.integers(0, len(b) - 1))] = data.draw(items)
    assert native.same(a, b) == (a == b)
    assert native.same(a, tuple(b)) == (a == tuple(b))  # type: ignore[arg-type]  # not lists: compared in Python


def test_bad_arguments_are_refused_not_crashed_on() -> None:
    native = NativeNameIds()
    index = native._native
    for bad_id in (-1, 2**32, 2**64 + 5):
        with pytest.raises(OverflowError):
            index.set("node-a", bad_id)
    with pytest.raises(TypeError):
        index.set("node-a", "1")
    assert len(index) == 0
    index.set(b"node-a", 1)  # not a str: not held, so never found
    index.set("nöde", 2)  # not ASCII: not held
    assert len(index) == 0 and index.ids(["nöde"]) is None and index.ids(("node-a",)) is None
    table, texts = bytearray(3), ["a", "b", "c"]
    for op, args in ((NATIVE.take, (table,)), (NATIVE.gather, (texts,)), (NATIVE.join, (texts,))):
        with pytest.raises(IndexError, match="node id 3 outside a table of 3"):
            op(*args, native.pack([0, 3]))
        with pytest.raises(ValueError, match="4 bytes each"):
            op(*args, b"\x00" * 5)
    with pytest.raises(ValueError, match="a mask of 1 bytes for 2 ids"):
        NATIVE.select(native.pack([0, 1]), b"\x01")
    with pytest.raises(TypeError):
        NATIVE.gather("not a list", b"")
    uninitialised = NATIVE.NameIndex.__new__(NATIVE.NameIndex)
    for call in (lambda: uninitialised.ids([]), lambda: uninitialised.set("a", 1),
                 lambda: uninitialised.discard("a")):
        with pytest.raises(RuntimeError, match="before __init__"):
            call()
    assert len(uninitialised) == 0


def test_long_names_and_names_that_differ_only_at_the_end(scan: ModuleType) -> None:
    py, native = pair()
    names = ["n" * 1_000_000, "n" * 999_999 + "m", "n" * 1_000_001, "node-1", "node-1\x00", "node-10"]
    for i, name in enumerate(names):
        py.set(name, i)
        native.set(name, i)
    assert native.to_list(native.ids(names[::-1])) == py.ids(names[::-1]) == list(range(len(names)))[::-1]
    assert native.ids(["n" * 999_999]) is None


def test_without_the_native_module_the_memo_says_so_and_uses_python(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(nameids, "_native", None)
    monkeypatch.setattr(nameids, "_IMPORT_ERROR", "No module named '_nameids'")
    with caplog.at_level(logging.WARNING, logger="memslice.scheduler_extender.index.nameids"):
        index = nameids.name_ids()
    assert type(index) is NameIds
    assert "No module named '_nameids'" in caplog.text and "C compiler" in caplog.text


def _json_array(items: list[str], spaces: list[str]) -> bytes:
    """`items` as a JSON array (json.dumps: escapes where needed), with the given whitespace around each."""
    pad = itertools.cycle(spaces)
    return (next(pad) + "[" + next(pad) + (next(pad) + "," + next(pad)).join(json.dumps(x) for x in items)
            + next(pad) + "]" + next(pad)).encode()


@settings(max_examples=400, deadline=None)
@given(st.lists(names, max_size=20), st.lists(st.sampled_from(["", " ", "\n", "\t ", "\r\n"]), min_size=1,
                                              max_size=4),
       st.lists(st.tuples(st.integers(0, 400), st.binary(max_size=3)), max_size=2), st.integers(0, 25))
def test_ids_from_a_json_array_answer_what_the_python_reference_answers(
        query: list[str], spaces: list[str], edits: list[tuple[int, bytes]], limit: int) -> None:
    """ids_json (a filter's NodeNames read from the request's bytes) against the reference: the same ids for a
    plain array of held names within the limit, None for everything else (escapes, non-ASCII, broken JSON,
    trailing bytes, unknown names, too many names), whatever bytes are spliced in."""
    py, native = pair()
    for i, name in enumerate(sorted({*query, "node-00001", "a\\b", 'q"'})):
        py.set(name, i)
        native.set(name, i)
    data = _json_array(query, spaces)
    for at, insert in edits:
        data = data[:at] + insert + data[at:]
    want = py.ids_json(data, limit)
    got = native.ids_json(data, limit)
    assert (None if got is None else native.to_list(got)) == want
    plain = all(x.isascii() and x.isprintable() and '"' not in x and "\\" not in x for x in query)
    if not edits and plain and len(query) <= limit:  # a plain array of held names: found, in its order
        assert want == [py.get(x) for x in query]


def test_ids_from_json_refuse_what_is_not_a_plain_array() -> None:
    py, native = pair()
    for i, name in enumerate(["a", "node-2", "aa"]):
        py.set(name, i)
        native.set(name, i)
    for data in (b'["a","node-2"]', b' [ "a" ,\n"node-2" ]\r\n', b"[]", b"[ ]"):
        assert native.to_list(native.ids_json(data, 10)) == py.ids_json(data, 10) == [
            py.get(x) for x in json.loads(data)]
    for bad in (b'["a",]', b'["a" "aa"]', b'["x"]', b'["a\\u0061"]', b'["a"]x', b'["a"', b"", b'"a"', b"[1]",
                b'[["a"]]', b'["a",null]', b'{"a":1}', b'["a"]]', b"[,]", "[\"\u00e9\"]".encode()):
        assert native.ids_json(bad, 10) is None and py.ids_json(bad, 10) is None, bad
    assert native.ids_json(b'["a","a","a"]', 2) is None and py.ids_json(b'["a","a","a"]', 2) is None
    assert native.to_list(native.ids_json(b'["a","a"]', 2)) == [0, 0]
    for limit in (0, -1, -(2**62)):  # no room at all: only the empty array
        assert native.ids_json(b'["a"]', limit) is None and py.ids_json(b'["a"]', limit) is None
        assert native.ids_json(b"[]", limit) == b"" and py.ids_json(b"[]", limit) == []
    with pytest.raises(TypeError):
        native._native.ids_json("[]", 1)  # a str is not bytes


@settings(max_examples=400, deadline=None)
@given(st.lists(node_names, max_size=20), st.lists(st.sampled_from(["", " ", "\n", "\t ", "\r\n"]), min_size=1,
                                                   max_size=4),
       st.data(), st.lists(st.tuples(st.integers(0, 400), st.binary(max_size=3)), max_size=2))
def test_host_priorities_from_the_request_bytes_answer_what_the_joined_texts_answer(
        query: list[str], spaces: list[str], data: st.DataObject, edits: list[tuple[int, bytes]]) -> None:
    """hosts_json (prioritize's answer written from its request's NodeNames bytes and a score byte per node)
    against the reference and against join() of the nodes' host_priority_json texts, the answer it replaces:
    the same bytes when every node fits; None when one does not (kinds), the ids are not as many as the names,
    or the bytes are not a plain array, whatever bytes are spliced in."""
    from memslice.scheduler_extender.wire import host_priority_json

    py, native = pair()
    held = sorted(set(query))
    for i, name in enumerate(held):
        py.set(name, i)
        native.set(name, i)
    scores = bytearray(data.draw(st.lists(st.integers(0, 255), min_size=len(held), max_size=len(held))))
    kinds = bytearray(data.draw(st.lists(st.sampled_from([1, 1, 1, 2]), min_size=len(held), max_size=len(held))))
    body = _json_array(query, spaces)
    for at, insert in edits:
        body = body[:at] + insert + body[at:]
    ids = [py.get(x) for x in query]
    if data.draw(st.booleans()) and ids:  # one id too few or too many
        ids = ids[:-1] if data.draw(st.booleans()) else [*ids, ids[0]]
    want = py.hosts_json(body, ids, kinds, scores, 1)
    assert native.hosts_json(body, native.pack(ids), kinds, scores, 1) == want
    texts = [host_priority_json(name, scores[i]) if kinds[i] == 1 else None for i, name in enumerate(held)]
    if not edits and len(ids) == len(query) and all(kinds[i] == 1 for i in ids):
        assert want == py.join(texts, ids) == native.join(texts, native.pack(ids))  # type: ignore[arg-type]
        assert json.loads(want) == [{"Host": x, "Score": scores[i]} for x, i in zip(query, ids, strict=True)]
    elif not edits and len(ids) == len(query):
        assert want is None  # a node that does not fit: the caller writes its score 0


def test_host_priorities_refuse_bad_ids_and_arrays() -> None:
    native = NativeNameIds()
    kinds, scores = bytearray(b"\x01\x01"), bytearray(b"\x0a\x00")
    assert NATIVE.hosts_json(b'["a","b"]', native.pack([0, 1]), kinds, scores, 1) == (
        b'[{"Host":"a","Score":10},{"Host":"b","Score":0}]')
    assert NATIVE.hosts_json(b"[]", b"", kinds, scores, 1) == b"[]"
    with pytest.raises(IndexError, match="node id 2 outside a table of 2"):
        NATIVE.hosts_json(b'["a","b"]', native.pack([0, 2]), kinds, scores, 1)
    with pytest.raises(IndexError, match="outside a table of 1"):
        NATIVE.hosts_json(b'["a"]', native.pack([1]), kinds, scores[:1], 1)
    with pytest.raises(ValueError, match="4 bytes each"):
        NATIVE.hosts_json(b'["a"]', b"\x00" * 5, kinds, scores, 1)
    for bad in (b'["a",]', b'["a" "b"]', b'["a\\u0061"]', b'["a"]x', b'["a"', b"", b"[1]", "[\"\u00e9\"]".encode()):
        assert NATIVE.hosts_json(bad, native.pack([0]), kinds, scores, 1) is None, bad
    with pytest.raises(TypeError):
        NATIVE.hosts_json("[]", b"", kinds, scores, 1)  # a str is not bytes


# ------------------------------------------------------------------ scores of pods spanning GPUs (issue 34)

_EXACT = 1 << 52  # span_scores answers None beyond it (ints no longer exact as doubles): the reference answers


def _chosen_sets(gpus: int) -> st.SearchStrategy[Any]:
    """A set search's answer as spanning.Found keeps it: None, False or (closeness, free, MiB per GPU...); the
    MiB and free MiB as the memo's views hold them (whole GiB, ties), and now and then odd values (0 MiB,
    beyond the exact range, non-finite closeness)."""
    mib = st.one_of(st.integers(1, 80).map(lambda g: g * 1024), st.integers(0, 81920), st.integers(-5, 5),
                    st.sampled_from([_EXACT - 1, _EXACT, -_EXACT, 2**64]))
    close = st.one_of(st.sampled_from([0.75, 0.5, 0.625, 0.0]), st.floats(allow_nan=True, allow_infinity=True))
    sets = st.tuples(close, st.lists(st.tuples(mib, mib), min_size=gpus, max_size=gpus)).map(
        lambda t: (t[0], *itertools.chain.from_iterable(t[1])))
    return st.one_of(st.none(), st.just(False), sets)


@settings(max_examples=examples(400), derandomize=QUICK, deadline=None)
@given(st.sampled_from([2, 3, 4, 8]), st.booleans(), st.data())
def test_span_scores_answer_what_the_python_reference_answers(gpus: int, spread: bool, data: st.DataObject) -> None:
    """_nameids.span_scores (the memo's refresh and fills of spanning tables) gives, need by need, the code
    spanning.scores gives (a score 0..10 or NO_ROOM/UNSEARCHED/GENERAL), float for float and tie for tie; it
    answers None only where a value is outside what it computes exactly (the memo then asks the reference)."""
    from memslice.scheduler_extender.placement import spanning

    keys = tuple(sorted(data.draw(st.lists(st.one_of(st.integers(0, 80).map(lambda g: g * 1024),
                                                     st.integers(-10, 90000)), max_size=10))))
    if data.draw(st.integers(0, 9)) == 0:
        keys = (*keys, data.draw(st.sampled_from([_EXACT, 2**70])))
    chosen = data.draw(st.lists(_chosen_sets(gpus), min_size=len(keys) + 1, max_size=len(keys) + 1))
    needs = data.draw(st.lists(st.one_of(st.integers(1, 40).map(lambda g: g * 1024), st.integers(-5, 90000),
                                         st.sampled_from([_EXACT, 2**63])), max_size=12))
    got = NATIVE.span_scores(keys, chosen, needs, gpus, spread)
    want = spanning.scores(keys, chosen, needs, gpus, spread)
    if got is None:  # only where an int is outside the exact range
        values = [*keys, *needs, *(v for c in chosen if isinstance(c, tuple) for v in c[1:])]
        assert any(abs(v) >= _EXACT for v in values)
    else:
        assert got == want
        assert NATIVE.span_scores(keys, chosen, tuple(needs), gpus, spread) == want


def test_span_scores_on_a_view_answer_the_verdicts_of_decisions() -> None:
    """On real views (8 GPUs, NVLink pairs and PCIe switches, random use in whole GiB: ties), the memo's codes with
    the native scores and with the reference alone resolve to decisions.verdict's verdict for every size."""
    from memslice.contract import Gpu, Inventory
    from memslice.scheduler_extender.placement import decisions, spanning
    from memslice.scheduler_extender.placement.state import Charge, ClusterState

    rng = random.Random(34)
    state = ClusterState()
    gib = 1024
    for n in range(40):
        gpus = tuple(Gpu(f"n{n}-G{i}", i, "Sim", 80 * gib, i // 4, True, nvlink=(i ^ 1,), pcie=f"sw{i // 4}")
                     for i in range(8))
        state.upsert_node({"metadata": {"name": f"n{n}", "annotations": Inventory(1, gpus).format()}})
        for h in range(rng.randint(0, 12)):
            state.hold(f"h{n}-{h}", Charge(f"n{n}-G{rng.randrange(8)}", f"n{n}", rng.choice((4, 8, 16, 20)) * gib,
                                           0, None))
    needs = [g * gib for g in (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 40, 70)]
    for n in range(40):
        view = state.view(f"n{n}")
        assert view is not None
        for count in (2, 4):
            for policy in ("binpack", "spread"):
                native = spanning.codes(view, needs, policy, count, {}, NATIVE.span_scores)
                assert native == spanning.codes(view, needs, policy, count, {})
                for need, code in zip(needs, native, strict=True):
                    spanning.forget_quick()
                    want = decisions.verdict(view, need, policy, None, 0, count)
                    assert spanning.resolve(view, need, policy, count, code) == want, (n, need, count, policy)


def test_span_scores_refuse_bad_arguments_not_crash() -> None:
    chosen = [(0.75, 8192, 81920, 4096, 81920), None, False]
    assert NATIVE.span_scores((1024, 8192), chosen, [1024, 4096, 9000], 2, False) == b"\x0a\xf0\xf0"
    assert NATIVE.span_scores((1024, 8192), chosen, [4096, 9000], 1, False) == b"\xf1\xf0"
    assert NATIVE.span_scores((1024, 8192, 9000), [None, None, False, None], [9000], 1, False) == b"\xf2"
    assert NATIVE.span_scores((1024, 8192), chosen, [], 2, True) == b""
    with pytest.raises(ValueError, match="gpus 0 outside 1..64"):
        NATIVE.span_scores((1024, 8192), chosen, [1024], 0, False)
    with pytest.raises(ValueError, match="gpus 65 outside"):
        NATIVE.span_scores((1024, 8192), chosen, [1024], 65, False)
    with pytest.raises(TypeError, match="not None, False or a tuple of 3 items"):  # the set of 2 GPUs asked as 1
        NATIVE.span_scores((1024, 8192), chosen, [1024], 1, False)
    with pytest.raises(IndexError, match="k 1 outside the chosen sets"):
        NATIVE.span_scores((1024, 8192), chosen[:1], [2048], 1, False)
    with pytest.raises(TypeError, match="closeness is not a float"):
        NATIVE.span_scores((1024, 8192), [("x", 1, 1, 1, 1), None, None], [1024], 2, False)
    with pytest.raises(TypeError):
        NATIVE.span_scores([1024, 8192], chosen, [1024], 2, False)  # keys: a tuple
    with pytest.raises(TypeError):
        NATIVE.span_scores((1024, 8192), tuple(chosen), [1024], 2, False)  # chosen: a list
    with pytest.raises(TypeError, match="needs must be a list or a tuple"):
        NATIVE.span_scores((1024, 8192), chosen, 1024, 2, False)
    assert NATIVE.span_scores((1024, "8192"), chosen, [1024], 2, False) is None  # not ints: the reference's
    assert NATIVE.span_scores((1024, 8192), chosen, [True], 2, False) is None


@settings(max_examples=examples(200), derandomize=QUICK, deadline=None)
@given(st.sampled_from([2, 4]), st.booleans(), st.data())
def test_span_scores_each_answers_span_scores_node_by_node(gpus: int, spread: bool, data: st.DataObject) -> None:
    """_nameids.span_scores_each (a fill: one size on many nodes) is span_scores on each node; None when any node's
    values are outside the exact range, as span_scores then answers for that node."""
    nodes = data.draw(st.lists(st.lists(st.integers(0, 80).map(lambda g: g * 1024), max_size=8).map(
        lambda ks: tuple(sorted(ks))), max_size=12))
    chosen_of = [data.draw(st.lists(_chosen_sets(gpus), min_size=len(k) + 1, max_size=len(k) + 1)) for k in nodes]
    need = data.draw(st.one_of(st.integers(1, 40).map(lambda g: g * 1024), st.sampled_from([0, _EXACT])))
    got = NATIVE.span_scores_each(list(nodes), chosen_of, need, gpus, spread)
    each = [NATIVE.span_scores(k, c, (need,), gpus, spread) for k, c in zip(nodes, chosen_of, strict=True)]
    if got is None:
        assert any(e is None for e in each) or need >= _EXACT
    else:
        assert got == b"".join(each)  # type: ignore[arg-type]


def test_span_scores_each_refuses_bad_arguments_not_crash() -> None:
    chosen = [(0.75, 8192, 81920, 4096, 81920), None, False]
    assert NATIVE.span_scores_each([(1024, 8192), ()], [chosen, [None]], 1024, 2, False) == b"\x0a\xf0"
    assert NATIVE.span_scores_each([], [], 1024, 2, False) == b""
    with pytest.raises(ValueError, match="1 keys for 2 chosen lists"):
        NATIVE.span_scores_each([(1024, 8192)], [chosen, chosen], 1024, 2, False)
    with pytest.raises(ValueError, match="gpus 99 outside"):
        NATIVE.span_scores_each([(1024, 8192)], [chosen], 1024, 99, False)
    with pytest.raises(TypeError, match="node 1's keys are not a tuple"):
        NATIVE.span_scores_each([(1024, 8192), [1024]], [chosen, chosen], 1024, 2, False)
    with pytest.raises(TypeError, match="node 0's keys are not a tuple or its chosen sets not a list"):
        NATIVE.span_scores_each([(1024, 8192)], [tuple(chosen)], 1024, 2, False)
    with pytest.raises(IndexError, match="outside the chosen sets"):
        NATIVE.span_scores_each([(1024, 8192)], [[]], 1024, 2, False)
    assert NATIVE.span_scores_each([(1024, 8192)], [chosen], 2**60, 2, False) is None


def _topologies(n: int) -> st.SearchStrategy[Any]:
    """A node's closeness matrix (contract.closeness: 0..3, symmetric, 0 on the diagonal; now and then an entry
    beyond FAR, which no inventory makes and the C leaves to the reference)."""
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]

    def matrix(values: list[int]) -> tuple[tuple[int, ...], ...]:
        m = [[0] * n for _ in range(n)]
        for (a, b), v in zip(pairs, values, strict=True):
            m[a][b] = m[b][a] = v
        return tuple(map(tuple, m))

    value = st.one_of(st.integers(0, 3), st.just(1), st.integers(0, 3), st.sampled_from([4, 9]))
    return st.lists(value, min_size=len(pairs), max_size=len(pairs)).map(matrix)


def _span_view(data: st.DataObject, n: int) -> Any:
    """A node of n GPUs (index = position) as the memo's views hold it: MiB of a few board sizes, use in whole GiB
    (ties of free MiB and of free fractions), over-commit, unhealthy GPUs, a closeness matrix."""
    from memslice.scheduler_extender.placement.views import NodeView

    rows = []
    for i in range(n):
        mem = data.draw(st.sampled_from([80 * 1024, 40 * 1024, 24 * 1024, 81559, 3]))
        used = data.draw(st.one_of(st.integers(0, 80).map(lambda g: g * 1024), st.integers(0, mem + 10)))
        rows.append((f"G{i}", i, "Sim", mem, data.draw(st.integers(0, 9)) > 0, used, mem - used))
    return NodeView.of_rows("n", 1, tuple(rows), topo=data.draw(_topologies(n)))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([2, 3, 4, 6, 8]), st.sampled_from([2, 3, 4]), st.booleans(), st.data())
def test_span_search_chooses_the_set_the_python_reference_chooses(n: int, gpus: int, spread: bool,
                                                                  data: st.DataObject) -> None:
    """span_scores with a search (_nameids.span_search: the memo's set searches in C) keeps, for every k it
    searches, the set spanning._search (the reference) keeps: the same closeness float, the same GPUs' free MiB
    and MiB, so the same score codes; float for float and tie for tie (free fractions added left to right in both,
    spanning._added, not Python's sum, which compensates from 3.12 on). A mask the C has not met yet (spanning.
    _closest keeps each mask's sets the first time the reference scans them) is left to the reference; on a
    second view of the same topology the C searches every k itself."""
    from memslice.scheduler_extender.placement import spanning

    if gpus > n:
        gpus = n
    view = _span_view(data, n)
    policy = "spread" if spread else "binpack"
    needs = data.draw(st.lists(st.one_of(st.integers(1, 80).map(lambda g: g * 1024), st.integers(-5, 90000)),
                               min_size=1, max_size=10))
    reference: spanning.Found = {}
    want = spanning.codes(view, needs, policy, gpus, reference)  # the reference alone; keeps the masks met
    searched: list[int] = []
    reference_search = spanning._search

    def counted(*args: Any) -> Any:
        searched.append(args[1])
        return reference_search(*args)

    spanning._search = counted  # type: ignore[assignment]  # counts the searches left to the reference
    try:
        native: spanning.Found = {}
        got = spanning.codes(view, needs, policy, gpus, native, NATIVE.span_scores)
    finally:
        spanning._search = reference_search  # type: ignore[assignment]
    assert got == want
    assert native == reference
    for entries in (native.get((gpus, policy), ()), reference.get((gpus, policy), ())):
        for at in entries:  # the same types too: a float closeness, int MiB
            assert at is None or at is False or (type(at[0]) is float and all(type(v) is int for v in at[1:]))
    if spanning._native_search(view, gpus) is not None and all(v <= 3 for row in view.topo for v in row):  # type: ignore[union-attr]
        assert searched == []  # every mask was kept by the reference's run: the C made every search


def test_span_search_refuses_bad_arguments_not_crash() -> None:
    """A search tuple of the wrong shape is a TypeError naming it; rows, masks or sets the C cannot read exactly
    leave the search to the reference (UNSEARCHED) or raise a TypeError for the memo's own data malformed."""
    row0, row1 = ("a", 0, "Sim", 1024, True, 0, 1024), ("b", 1, "Sim", 1024, True, 0, 1024)
    rows = (row0, row1)
    by_mask = {3: (0, ((0, 1),))}
    closes = (0.75, 0.5, 0.25, 0.0)

    def codes(search: Any, chosen: list[Any] | None = None) -> Any:
        return NATIVE.span_scores((1024, 1024), chosen if chosen is not None else [None] * 3, [512], 2, False,
                                  search)

    chosen: list[Any] = [None] * 3
    assert codes((rows, rows, by_mask, closes), chosen) == bytes([round(10 * (0.75 + 0.25 * (1 - 0.5)))])
    assert chosen[0] == (0.75, 1024, 1024, 1024, 1024)
    assert codes(None) == b"\xf1"
    assert codes((rows, rows, {}, closes)) == b"\xf1"  # a mask not kept yet: the reference scans it
    assert codes((rows, rows, {3: (5, ((0, 1),))}, closes)) == b"\xf1"  # a distance beyond the closeness table
    assert codes((rows, rows, {3: (0, ())}, closes)) == b"\xf1"
    assert codes((rows, (row0, ("b", 70, "Sim", 1024, True, 0, 1024)), by_mask, closes)) == b"\xf1"  # not a position
    assert codes((rows, (row0, ("b", "1")), by_mask, closes)) == b"\xf1"
    assert codes(((row0, ("b", 1, "Sim", 0, True, 0, 0)), rows, {3: (0, ((0, 1), (0, 1)))}, closes)) == b"\xf1"
    assert codes(((row0, ("b", 1, "Sim", 2**60, True, 0, 2**60)), rows, by_mask, closes)) == b"\xf1"
    for bad in ((rows, rows, by_mask), [rows, rows, by_mask, closes], (rows, rows, list(by_mask), closes),
                (list(rows), rows, by_mask, closes), "x"):
        with pytest.raises(TypeError, match="search must be None or"):
            codes(bad)
    with pytest.raises(TypeError, match="not \\(distance, sets\\)"):
        codes((rows, rows, {3: [0, ((0, 1),)]}, closes))
    with pytest.raises(TypeError, match="not a tuple of 2 positions"):
        codes((rows, rows, {3: (0, ((0, 1, 1), (0,)))}, closes))
    with pytest.raises(TypeError, match="not a tuple of 2 positions"):
        codes((rows, rows, {3: (0, ((0,),))}, closes))


# Bytes that end a plain name (plain_run_end) and bytes that do not, at every place of names whose lengths
# straddle the 8-byte words the scan reads: each must be judged as the byte-by-byte reference judges it.
STOPPERS = [b'"', b"\\", b"\x00", b"\x1f", b"\x7f", b"\x80", b"\xff", b"\xc3\xa9"]
PLAIN = [b" ", b"!", b"#", b"[", b"]", b"~", b"\x20", b"\x7e", b"-", b"0"]


@settings(max_examples=examples(600), derandomize=QUICK, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # `scan` picks a module: same for all
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.data())
def test_names_with_any_byte_at_any_place_are_judged_as_the_reference_judges_them(scan: ModuleType,
                                                                                  lengths: list[int],
                                                                                  data: st.DataObject) -> None:
    """ids_json and hosts_json on raw arrays (no JSON escaping) whose names hold, at any place, a byte that ends
    a plain name (quote, backslash, control bytes, 0x7F and above) or a plain one next to those values: the
    same ids, the same answer or None, as the Python reference; held names of 0-40 bytes."""
    py, native = pair()
    raw_names = []
    for n in lengths:
        name = bytearray(b"n" * n)
        for _ in range(data.draw(st.integers(0, 2))):
            if name:
                at = data.draw(st.integers(0, len(name) - 1))
                name[at:at + 1] = data.draw(st.sampled_from(STOPPERS + PLAIN))
        raw_names.append(bytes(name))
    for i, name in enumerate(raw_names):
        try:
            text = name.decode("ascii")
        except UnicodeDecodeError:
            continue
        py.set(text, i)
        native.set(text, i)
    body = b"[" + b",".join(b'"' + n + b'"' for n in raw_names) + b"]"
    want = py.ids_json(body, 100)
    got = native.ids_json(body, 100)
    assert (None if got is None else native.to_list(got)) == want
    kinds, scores = bytearray([1] * len(raw_names)), bytearray(range(len(raw_names)))
    ids = want if want is not None else list(range(len(raw_names)))
    assert native.hosts_json(body, native.pack(ids), kinds, scores, 1) == py.hosts_json(body, ids, kinds, scores, 1)


@pytest.mark.parametrize("length", [7, 8, 15, 16, 17, 24, 33])
def test_each_odd_byte_at_each_place_of_a_name_is_judged_as_the_reference_judges_it(scan: ModuleType,
                                                                                    length: int) -> None:
    """Every stop byte and every plain byte next to one in value, at every place of a name of 7-33 bytes (so
    at each offset within the 16-byte and 8-byte reads and near a read's end), first in a long array and last
    in it: ids_json and hosts_json answer what the reference answers. Exhaustive where the property test above
    samples."""
    py, native = pair()
    for i, name in enumerate(("abc", "x" * 40)):
        py.set(name, i)
        native.set(name, i)
    for byte in STOPPERS + PLAIN + [b"\x1e", b"\x21", b"\x7e"]:
        for at in range(length):
            name = bytearray(b"n" * length)
            name[at:at + 1] = byte
            text = bytes(name).decode("ascii", errors="replace")
            if text.isascii():
                py.set(text, 2)
                native.set(text, 2)
            for body in (b'["' + bytes(name) + b'","abc","' + b"x" * 40 + b'"]',
                         b'["' + b"x" * 40 + b'","abc","' + bytes(name) + b'"]'):
                want = py.ids_json(body, 10)
                got = native.ids_json(body, 10)
                assert (None if got is None else native.to_list(got)) == want, (byte, at, body)
                kinds, scores = bytearray([1, 1, 1]), bytearray([3, 2, 1])
                ids = want if want is not None else [0, 1, 0]
                assert native.hosts_json(body, native.pack(ids), kinds, scores, 1) == \
                    py.hosts_json(body, ids, kinds, scores, 1), (byte, at, body)
            if text.isascii():
                py.discard(text)
                native.discard(text)


def _sharing_a_hash(module: ModuleType, seed: int, fmt: str) -> tuple[str, str]:
    """Two names `fmt % i` of one length held under the same hash in NameIndex(seed), found by brute force
    (32-bit hashes: ~10 pairs among 300,000 names)."""
    seen: dict[int, str] = {}
    for i in range(300_000):
        name = fmt % i
        h = module.name_hash(seed, name)
        if h in seen:
            return seen[h], name
        seen[h] = name
    raise AssertionError(f"no two names {fmt!r} share a hash under seed {seed}")


@pytest.mark.parametrize("fmt", ["%07d", "fixedpre%07d", "a-much-longer-node-name-%08d"])
def test_names_that_share_a_hash_keep_their_own_ids(scan: ModuleType, fmt: str) -> None:
    """Two held names of one length and one hash are told apart by every read (set, ids, ids_json, discard): a
    lookup compares the bytes of a name whose hash matches, and each format's names differ only where one
    way of comparing looks (byte by byte under 8 bytes; the last 1-7 bytes as the 8 ending there; whole
    words)."""
    seed = 0x5EED
    a, b = _sharing_a_hash(scan, seed, fmt)
    assert len(a) == len(b) and a != b and scan.name_hash(seed, a) == scan.name_hash(seed, b)
    index = scan.NameIndex(seed)
    index.set(a, 1)
    index.set(b, 2)
    assert len(index) == 2
    assert list(memoryview(index.ids([a, b, a])).cast("I")) == [1, 2, 1]
    body = json.dumps([b, a]).encode()
    assert list(memoryview(index.ids_json(body, 10)).cast("I")) == [2, 1]
    index.discard(a)
    assert index.ids([a]) is None and list(memoryview(index.ids([b])).cast("I")) == [2]
    assert index.ids_json(json.dumps([a]).encode(), 10) is None
    assert scan.name_hash(seed, "naïve") is None and scan.name_hash(seed, 7) is None


@pytest.mark.parametrize("stop", [b"\x01", b"\\", b"\x7f", b"\x80"])
@pytest.mark.parametrize("where", ["first", "last"])
def test_a_stop_byte_that_looks_like_a_names_end_is_refused(scan: ModuleType, stop: bytes, where: str) -> None:
    """A byte that ends a plain name but is no quote, right before `,"` (where a closing quote would be): the
    array is no plain one, and ids_json and hosts_json refuse it (None) as the reference does, whether the name
    is read from one 16-byte load (first) or byte by byte near the end of the buffer (last)."""
    py, native = pair()
    for i, name in enumerate(("ab", "cd", "e" * 20)):
        py.set(name, i)
        native.set(name, i)
    trap = b'"ab' + stop + b',"cd"'
    body = b"[" + trap + b',"' + b"e" * 20 + b'"]' if where == "first" else b'["' + b"e" * 20 + b'",' + trap + b"]"
    assert py.ids_json(body, 10) is None and native.ids_json(body, 10) is None
    kinds, scores = bytearray([1, 1, 1]), bytearray([1, 2, 3])
    for ids in ([0, 1, 2], [2, 0, 1]):
        assert native.hosts_json(body, native.pack(ids), kinds, scores, 1) is None
        assert py.hosts_json(body, ids, kinds, scores, 1) is None


# ------------------------------------------------------------------ the memo's refresh of a spanning group natively

_KINDS = st.sampled_from([0, 1, 2, 3])  # fitmemo's NONE, FITS, FAILS, NEVER


def _refresh_reference(i: int, keys: tuple[int, ...], chosen: list[Any], cells: tuple[Any, ...], gpus: int,
                       spread: bool, texts: Any, above: int, same: bool, unit: int, rows: tuple[Any, ...] = (),
                       no_room: dict[int, str] | None = None) -> Any:
    """What span_refresh must do (FitMemo._refresh_groups' Python loop, as written before it was native): each held
    cell's code by spanning.scores; a fit that fitted written (score, text) where the node's text is made, left
    where its score is the same; a failing cell left where it still finds no room on a `same` view; a NO_ROOM cell
    whose pod fails now (N healthy GPUs of `rows` that large: spanning._without_room's first branch) written failing
    with no_room's reason for its need where there is one (FitMemo._write_code's verdict; (position, FAILED) for one
    that fitted: the fitting count); every other one (position, code) to Python. None where the native scores
    cannot be exact (nothing written). The cells' arrays are written here (copies of the caller's)."""
    from memslice.scheduler_extender.placement import spanning

    if any(c[1][i] != 0 and abs(c[0] * unit) >= _EXACT for c in cells):  # a size it cannot read: None, even above
        return None
    held = [(j, c[0] * unit) for j, c in enumerate(cells) if c[1][i] != 0 and c[0] * unit <= above]
    if (
            held and NATIVE.span_scores(keys, list(chosen), [n for _, n in held], gpus, spread) is None):
        return None
    todo = bytearray()
    for j, need in held:
        _, kinds, scores, jsons, reasons = cells[j]
        code = spanning.scores(keys, chosen, [need], gpus, spread)[0]
        if code <= 10 and kinds[i] == 1:
            if scores[i] == code:
                continue
            if texts is not None and isinstance(texts[code], str):
                scores[i], jsons[i] = code, texts[code]
                continue
        elif code == spanning.NO_ROOM and same and kinds[i] != 1:
            continue
        elif (code == spanning.NO_ROOM and no_room is not None and need in no_room
              and sum(1 for r in rows if r[4] and r[3] >= need) >= gpus):
            fitted = kinds[i] == 1
            kinds[i], scores[i], reasons[i], jsons[i] = 2, 0, no_room[need], None
            if fitted:
                todo += bytes((j, 0xFB))
            continue
        todo += bytes((j, code))
    return bytes(todo)


@settings(max_examples=examples(400), derandomize=QUICK, deadline=None)
@given(st.sampled_from([2, 3, 4]), st.booleans(), st.booleans(), st.data())
def test_span_refresh_writes_what_the_python_loop_writes(gpus: int, spread: bool, same: bool,
                                                         data: st.DataObject) -> None:
    """_nameids.span_refresh (FitMemo._refresh_groups: a bind refreshes its node's cell in every spanning table of
    one N and policy) computes each held cell's code as spanning.scores does and writes, cell for cell, what the
    Python loop wrote: a fitting cell's new score and the node's text for it, nothing where the score or a failing
    cell's NO_ROOM stays, the rest handed back as (position, code); cells above `above` and cells without a verdict
    untouched; None, with nothing written, where a value is beyond the exact range."""
    i = data.draw(st.integers(0, 3))
    keys = tuple(sorted(data.draw(st.lists(st.integers(0, 80).map(lambda g: g * 1024), max_size=8))))
    chosen = data.draw(st.lists(_chosen_sets(gpus), min_size=len(keys) + 1, max_size=len(keys) + 1))
    unit = data.draw(st.sampled_from([1, 1024, 2**40]))
    sizes = st.one_of(st.integers(1, 40).map(lambda g: g * 1024 // (unit if unit == 1024 else 1)),
                      st.sampled_from([0, 2**60]))
    cells = []
    for _ in range(data.draw(st.integers(0, 12))):
        kinds = bytearray(data.draw(st.lists(_KINDS, min_size=4, max_size=4)))
        scores = bytearray(data.draw(st.lists(st.integers(0, 10), min_size=4, max_size=4)))
        jsons = [f"old{k}" if kinds[k] == 1 else None for k in range(4)]
        reasons = [f"why{k}" if kinds[k] in (2, 3) else None for k in range(4)]
        cells.append((data.draw(sizes), kinds, scores, jsons, reasons))
    texts = data.draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(0, 10).map(lambda s: f"t{s}")),
                                                    min_size=11, max_size=11).map(tuple)))
    above = data.draw(st.one_of(st.just(1 << 62), st.integers(-1, 90000)))
    rows = tuple((f"G{g}", g, "Sim", data.draw(st.sampled_from([80 * 1024, 24 * 1024, 4096])), data.draw(st.booleans()),
                  0, 0) for g in range(data.draw(st.integers(0, 8))))  # (only MiB and health read: large enough?)
    needs = sorted({c[0] * unit for c in cells})
    no_room = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(needs), unique=True).map(
        lambda ns: {n: f"no room for {n}" for n in ns}))) if needs else None
    mine = tuple((c[0], bytearray(c[1]), bytearray(c[2]), list(c[3]), list(c[4])) for c in cells)
    want = _refresh_reference(i, keys, list(chosen), mine, gpus, spread, texts, above, same, unit, rows, no_room)
    native_cells = tuple(cells)
    before = [(bytes(c[1]), bytes(c[2]), list(c[3]), list(c[4])) for c in cells]
    got = NATIVE.span_refresh(i, keys, chosen, native_cells, gpus, spread, None, (), None, None, texts, above, same,
                              unit, None, rows, no_room)
    assert got == want
    if got is None:  # nothing written
        assert [(bytes(c[1]), bytes(c[2]), c[3], c[4]) for c in cells] == before
    else:
        assert [(bytes(c[1]), bytes(c[2]), c[3], c[4]) for c in cells] == [(bytes(c[1]), bytes(c[2]), c[3], c[4])
                                                                           for c in mine]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([2, 3, 4, 6, 8]), st.sampled_from([2, 3, 4]), st.booleans(), st.data())
def test_span_refresh_searches_and_keeps_the_sets_the_reference_does(n: int, gpus: int, spread: bool,
                                                                     data: st.DataObject) -> None:
    """With the view's rows and spanning._plan's (the memo's refresh), span_refresh makes the set searches the
    chosen list lacks as spanning._search does (the same flat sets kept, so the same codes), and a mask the plan
    has not met yet it looks for in the levels and keeps as spanning._closest keeps it (the same distance and sets):
    on a fresh plan the reference alone and the native refresh leave the same masks and searches behind."""
    from memslice.scheduler_extender.placement import spanning

    gpus = min(gpus, n)
    view = _span_view(data, n)
    policy = "spread" if spread else "binpack"
    needs = data.draw(st.lists(st.integers(1, 80).map(lambda g: g * 1024), min_size=1, max_size=10))
    cells = tuple((need, bytearray([1]), bytearray([11]), ["x"], [None]) for need in needs)  # a score none answers
    spanning._LEVELS.clear()
    reference: spanning.Found = {}
    want = spanning.codes(view, needs, policy, gpus, reference)
    reference_masks = dict(spanning._plan(view.topo, gpus)[2]) if not isinstance(view.topo, int) else {}
    spanning._LEVELS.clear()
    plan = None if isinstance(view.topo, int) else spanning._plan(view.topo, gpus)
    search = plan is not None and plan[1] is not None
    chosen: list[Any] = [None] * (len(view.free_keys) + 1)
    got = NATIVE.span_refresh(0, view.free_keys, chosen, cells, gpus, spread, view.rows if search else None,
                              view.free_rows, plan[2] if search else None, plan[3] if search else None, None,  # type: ignore[index]
                              1 << 62, False, 1, plan[1] if search else None, view.rows, None)  # type: ignore[index]
    assert got is not None
    left = dict(zip(got[::2], got[1::2], strict=True))  # no text given: every cell is handed back with its code
    assert sorted(left) == list(range(len(needs)))
    assert all(left[j] in (code, spanning.UNSEARCHED) for j, code in enumerate(want))  # (UNSEARCHED: the reference's)
    late = [j for j, code in left.items() if code == spanning.UNSEARCHED]  # made by the reference, as the memo does
    assert spanning.codes(view, [needs[j] for j in late], policy, gpus, {(gpus, policy): chosen}) == bytes(
        want[j] for j in late)
    kept = reference[gpus, policy]
    assert [c for c in chosen if c is not None] == [kept[k] for k, c in enumerate(chosen) if c is not None]
    if search:
        assert all(reference_masks[m] == v for m, v in plan[2].items())  # type: ignore[index]


def test_span_refresh_refuses_bad_arguments_not_crash() -> None:
    """Every argument of the wrong type or shape is an error naming it (the memo's own plan malformed), never a
    crash; a cell's arrays too short for the node id an IndexError; a value beyond the exact range None with
    nothing written."""
    chosen: list[Any] = [(0.75, 8192, 81920, 4096, 81920), None, False]
    keys = (1024, 8192)

    def cells(kind: int = 1, score: int = 3) -> tuple[Any, ...]:
        return ((1024, bytearray([kind]), bytearray([score]), ["old"], [None]),)

    def one_cell() -> tuple[Any, ...]:
        return ((512, bytearray([1]), bytearray([0]), ["o"], [None]),)

    def call(*over: Any, **named: Any) -> Any:
        args: list[Any] = [0, keys, list(chosen), cells(), 2, False, None, (), None, None, None, 1 << 62, False, 1,
                           None, (), None]
        for k, v in named.items():
            args[int(k[1:])] = v
        return NATIVE.span_refresh(*args, *over)

    texts = tuple(f"t{s}" for s in range(11))
    written = cells()
    assert NATIVE.span_refresh(0, keys, list(chosen), written, 2, False, None, (), None, None, texts, 1 << 62, False,
                               1, None, (), None) == b""
    assert written[0][2][0] == 10 and written[0][3] == ["t10"]  # the fit's score and its text written
    assert call() == bytes((0, 10))  # no text made yet: Python's
    assert call(a3=cells(2)) == bytes((0, 10))  # a failing cell that fits now: Python's (the fitting count)
    assert call(a3=cells(0)) == b""  # no verdict held: untouched
    assert call(a11=512) == b""  # above every changed free MiB: kept
    assert call(a12=True, a3=((9000, bytearray([2]), bytearray([0]), [None], [None]),)) == b""  # still no room: kept
    assert call(a3=((9000, bytearray([2]), bytearray([0]), [None], [None]),)) == bytes((0, 0xF0))
    big_rows = tuple((f"G{g}", g, "Sim", 81920, True, 81920, 0) for g in range(2))  # full GPUs, large enough
    fails = ((9000, bytearray([2]), bytearray([0]), [None], ["old reason"]),)
    assert call(a3=fails, a15=big_rows, a16={9000: "no room"}) == b""  # fails now: its reason written here
    assert (fails[0][1], fails[0][4]) == (bytearray([2]), ["no room"])
    fitted = ((9000, bytearray([1]), bytearray([7]), ["old text"], [None]),)
    assert call(a3=fitted, a15=big_rows, a16={9000: "no room"}) == bytes((0, 0xFB))  # written; the count Python's
    assert tuple(fitted[0][1:]) == (bytearray([2]), bytearray([0]), [None], ["no room"])
    for rows, no_room in ((big_rows, None), (big_rows, {}), (big_rows, {9000: 5}), (big_rows[:1], {9000: "x"}),
                          (((*big_rows[0][:4], 1, 0, 0), big_rows[1]), {9000: "x"}),
                          (((*big_rows[0][:3], "81920", True, 0, 0), big_rows[1]), {9000: "x"}), ((5, 6), {9000: "x"}),
                          ((("G0", 0), big_rows[1]), {9000: "x"})):
        left = ((9000, bytearray([2]), bytearray([0]), [None], ["old"]),)
        assert call(a3=left, a15=rows, a16=no_room) == bytes((0, 0xF0))  # never, no text, rows not read: Python's
        assert left[0][4] == ["old"]
    for k, bad in ((15, None), (15, list(big_rows)), (16, [])):
        with pytest.raises(TypeError, match="view_rows must be a tuple, no_room a dict or None"):
            call(a3=fails, **{"a15": big_rows, "a16": {}, f"a{k}": bad})
    with pytest.raises(TypeError, match="reason or JSON is not a str or None"):
        call(a3=((9000, bytearray([2]), bytearray([0]), [None], [b"old"]),), a15=big_rows, a16={9000: "x"})
    big = cells()
    huge = ((2**60, bytearray([1]), bytearray([1]), ["o"], [None]),)
    assert NATIVE.span_refresh(0, keys, list(chosen), big + huge, 2,
                               False, None, (), None, None, texts, 1 << 62, False, 1, None, (), None) is None
    assert big[0][2][0] == 3 and big[0][3] == ["old"]  # nothing written
    assert call(a13=2**52) is None and call(a1=(1024, 2**60)) is None and call(a1=(1024, "8192")) is None
    assert call(a1=tuple(range(65))) is None  # more keys than GPUs searched: the Python loop
    with pytest.raises(TypeError, match="takes 17 arguments"):
        NATIVE.span_refresh(0, keys)
    for k, bad in ((1, [1024]), (2, tuple(chosen)), (3, [cells()[0]])):
        with pytest.raises(TypeError, match="keys must be a tuple, chosen a list, cells a tuple"):
            call(**{f"a{k}": bad})
    for k, bad in ((0, "0"), (4, 2.0), (11, None), (5, 1), (12, "yes")):
        with pytest.raises(TypeError, match="must be ints, spread and same bools"):
            call(**{f"a{k}": bad})
    for k, bad in ((4, 0), (4, 65), (0, -1), (3, cells() * 256)):
        with pytest.raises(ValueError, match="outside 1..64, node id"):
            call(**{f"a{k}": bad})
    with pytest.raises(OverflowError):
        call(a11=2**70)
    with pytest.raises(IndexError, match="outside a cell's arrays"):
        call(a0=1)
    with pytest.raises(IndexError, match="outside a cell's arrays"):
        call(a3=((1024, bytearray([1]), bytearray([1]), ["o"], []),))
    for bad in (((1024, bytes([1]), bytearray([1]), ["o"], [None]),),
                ((1024, bytearray([1]), bytearray([1]), ("o",), [None]),),
                ((1024, bytearray([1]), bytearray([1]), ["o"]),), ((1024, bytearray([1]), bytearray([1]), ["o"], ()),),
                ([1024, bytearray([1]), bytearray([1]), ["o"], [None]],), (5,)):
        with pytest.raises(TypeError, match="a cell is not"):
            call(a3=bad)
    with pytest.raises(TypeError, match="texts must be None or a tuple of 11"):
        call(a10=("t",) * 10)
    with pytest.raises(TypeError, match="a cell's JSON is not a str or None"):
        call(a3=((1024, bytearray([1]), bytearray([3]), [b"old"], [None]),), a10=texts)
    with pytest.raises(IndexError, match="outside the chosen sets"):
        call(a2=[])
    with pytest.raises(TypeError, match="chosen set 0 is not None, False or a tuple of 5 items"):
        call(a2=[(0.75, 1), None, None])
    with pytest.raises(TypeError, match="closeness is not a float"):
        call(a2=[(1, 8192, 81920, 4096, 81920), None, None])
    row0, row1 = ("a", 0, "Sim", 1024, True, 0, 1024), ("b", 1, "Sim", 1024, True, 0, 1024)
    for bad in ((row0, row1), [row0, row1], {}, (0.75,), None), ([row0, row1], (row0, row1), {}, (0.75,), None), (
            (row0, row1), (row0, row1), [], (0.75,), None), ((row0, row1), (row0, row1), {}, (0.75,), [()]):
        with pytest.raises(TypeError, match="rows, free_rows, by_mask, closes, levels must be"):
            call(a6=bad[0], a7=bad[1], a8=bad[2], a9=bad[3], a14=bad[4])
    searched: list[Any] = [None] * 3
    levels = ((0, ((3, (0, 1)),)),)
    by_mask: dict[int, Any] = {}
    assert NATIVE.span_refresh(0, (1024, 1024), searched, one_cell(), 2, False,
                               (row0, row1), (row0, row1), by_mask, (0.75,), None, 1 << 62, False, 1, levels, (),
                               None) == bytes(
        (0, 9))
    assert by_mask == {3: (0, ((0, 1),))} and searched[0] == (0.75, 1024, 1024, 1024, 1024)
    for odd in (((0, ((-1, (0, 1)),)),), ((0, ((2**70, (0, 1)),)),), ((0, [(3, (0, 1))]),), ((0, ((3,),)),), ("x",)):
        assert NATIVE.span_refresh(0, (1024, 1024), [None] * 3, one_cell(), 2,
                                   False, (row0, row1), (row0, row1), {}, (0.75,), None, 1 << 62, False, 1,
                                   odd, (), None) == bytes((0, 0xF1))  # malformed levels: the reference's search
    with pytest.raises(TypeError, match="not \\(distance, sets\\)"):
        NATIVE.span_refresh(0, (1024, 1024), [None] * 3, one_cell(), 2, False,
                            (row0, row1), (row0, row1), {3: [0, ()]}, (0.75,), None, 1 << 62, False, 1, None, (),
                            None)
    for rows in (((row0, ("b", 5, "Sim", 1024, True, 0, 1024))), (row0, ("b", 1)), (row0,) * 65):
        assert NATIVE.span_refresh(0, (1024, 1024), [None] * 3, one_cell(), 2,
                                   False, rows, (row0, row1), {}, (0.75,), None, 1 << 62, False, 1,
                                   levels, (), None) == bytes((0, 0xF1))  # rows the C cannot read as positions


def _rows_pair(data: st.DataObject) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    n = data.draw(st.integers(0, 8))
    before = tuple((f"G{i}", i, "Sim", 81920, data.draw(st.booleans()), 0, data.draw(st.integers(-5, 9) .map(
        lambda g: g * 8192))) for i in range(n))
    now = []
    for r in before:
        change = data.draw(st.sampled_from(["same", "same", "free", "free", "index", "mem", "health", "copy"]))
        if change == "same":
            now.append(r)
        elif change == "copy":
            now.append(tuple(r))
        else:
            at = {"free": 6, "index": 1, "mem": 3, "health": 4}[change]
            value = (not r[4]) if at == 4 else r[at] + data.draw(st.sampled_from([1, 1024, -8192]))
            now.append((*r[:at], value, *r[at + 1:]))
    if data.draw(st.booleans()) and now:
        now = now[:-1]
    return before, tuple(now)


@settings(max_examples=examples(400), derandomize=QUICK, deadline=None)
@given(st.data())
def test_span_above_answers_what_the_reference_answers(data: st.DataObject) -> None:
    """_nameids.span_above (FitMemo._refresh_groups: which spanning cells a change can touch) answers as
    nameids.span_above: the largest free MiB, before or after, of the GPUs whose free MiB changed (-1: none), None
    where the rows differ otherwise (count, index, MiB, health)."""
    before, now = _rows_pair(data)
    assert NATIVE.span_above(before, now) == nameids.span_above(before, now)


def test_span_above_answers_none_where_it_cannot_read_rows() -> None:
    """Rows it cannot read exactly (not tuples, too short, ints beyond 2^52, a health that is not a bool) are
    "changed otherwise" (None: every cell refreshed afresh, always right); a call of the wrong shape a TypeError."""
    r = ("G0", 0, "Sim", 1024, True, 0, 1024)
    assert NATIVE.span_above((r,), (r,)) == -1
    assert NATIVE.span_above((r,), (r[:6] + (512,),)) == 1024
    for odd in ([*r], r[:6], (*r[:6], 2**60), (*r[:4], 1, 0, 512), (*r[:3], "1024", *r[4:])):
        assert NATIVE.span_above((r,), (odd,)) is None
    with pytest.raises(TypeError, match="takes two tuples"):
        NATIVE.span_above([r], (r,))
    with pytest.raises(TypeError, match="takes two tuples"):
        NATIVE.span_above((r,))
# ------------------------------------------------------------------ a bind's spanning groups in one call (issue 34)


def _memo_cells(memo: Any) -> dict[Any, tuple[Any, ...]]:
    """Every table of a memo as its arrays and counts (what a refresh writes), and the nodes' texts per score."""
    return {"texts": list(memo._host_json), **{key: (bytes(t.kinds), bytes(t.scores), list(t.jsons), list(t.reasons),
                                                     t.filled, t.fitting) for key, t in memo._tables.items()}}


@pytest.mark.parametrize("ratio", [None, "3/2"])
def test_span_refresh_node_writes_the_cells_the_python_reference_writes(ratio: str | None) -> None:
    """_nameids.span_refresh_node (FitMemo._refresh_groups natively: the change check, the node's kept searches,
    each group's plan and span_refresh in one call per bind) leaves every spanning table as the Python reference
    does (_refresh_group per group: spanning.codes and _write_code), bind after bind: several groups (2 and 4 GPUs,
    binpack and spread, six sizes each), views that change only in free MiB (`above`, `same`) and views that change
    otherwise (a GPU's health: every cell afresh), nodes without a known topology (no native search: UNSEARCHED cells
    left to Python), unplaced memory (the general path), a node of another unit, elastic pods under the cap (the cap's
    own path). Also checked: most binds need no Python after the call, and each thing it leaves is met."""
    from fractions import Fraction

    from memslice.contract import Gpu, Inventory
    from memslice.scheduler_extender.index.fitmemo import FitMemo, compute_of, gpus_of
    from memslice.scheduler_extender.placement import decisions, spanning
    from memslice.scheduler_extender.placement.state import Charge

    rng = random.Random(9)
    count = 30
    state = _span_cluster(rng, count)
    gap = tuple(Gpu(f"n{count}-G{i}", i, "Sim", 80 * 1024, i // 4, True, nvlink=(i ^ 1,) if i < 6 else (),
                    pcie=f"sw{i // 4}") for i in (0, 1, 2, 3, 4, 5, 6, 9))  # index 9 at position 7: no native search
    state.upsert_node({"metadata": {"name": f"n{count}", "annotations": Inventory(1, gap).format()}})
    names = [f"n{n}" for n in range(count + 1)] + ['n"é']  # the last needs JSON escapes: its texts made in Python
    count += 2
    state.upsert_node({"metadata": {"name": names[-1], "annotations": Inventory(1, tuple(
        g._replace(uuid=f"{names[-1]}-G{g.index}") for g in gap[:6])).format()}})
    cap = Fraction(ratio) if ratio is not None else None
    native, python = FitMemo(state, cap), FitMemo(state, cap)
    python._index.span_refresh_node = python._index.span_refresh = None  # the reference: _refresh_group
    whole, group = native._index.span_refresh_node, native._index.span_refresh
    assert whole is not None and group is not None
    answers: list[Any] = []
    unsearched: list[bytes] = []  # the answers of span_refresh called by the Python (a plan made) with UNSEARCHED

    def counted(*args: Any) -> Any:
        answers.append(whole(*args))
        return answers[-1]

    def counted_group(*args: Any) -> Any:
        todo = group(*args)
        if todo is not None and spanning.UNSEARCHED in todo[1::2]:
            unsearched.append(todo)
        return todo

    native._index.span_refresh_node, native._index.span_refresh = counted, counted_group
    keys = [(gib * 1024, policy, (), 0, n) for gib in (2, 4, 8, 12, 20, 40) for n in (2, 4)
            for policy in ("binpack", "spread")]
    for key in keys:
        assert native.verdicts(names, key) == python.verdicts(names, key)
    holds: list[tuple[str, int]] = []
    for step in range(200):
        n = rng.randrange(count)
        name = names[n]
        if step % 9 == 8:  # the inventory changes (GPUs' health): every cell afresh, not `same`; with 5 or 7 GPUs
            bad = rng.sample(range(8), rng.choice((0, 1, 5, 7)))  # unhealthy, 4 (or 2) GPUs never fit: NEVER
            gpus = tuple(Gpu(f"{name}-G{i}", i, "Sim", 80 * 1024, i // 4, i not in bad, nvlink=(i ^ 1,),
                             pcie=f"sw{i // 4}") for i in range(8))
            state.upsert_node({"metadata": {"name": name, "annotations": Inventory(2 if n == 13 else 1,
                                                                                     gpus).format()}})
        elif rng.random() < 0.7 or not holds:
            view = state.view(name)
            assert view is not None
            on = rng.sample([r[0] for r in view.rows], rng.choice((1, 2, 4)))
            state.hold(f"b{step}", Charge(",".join(on), name, rng.choice((1, 3, 6, 10, 20)) * 1024, 0, None))
            holds.append((f"b{step}", n))
        else:
            uid, n = holds.pop(rng.randrange(len(holds)))
            state.release(uid, None)
        assert state.view(names[n]) is not None  # the view rebuilt: both memos refreshed
        assert _memo_cells(native) == _memo_cells(python), step
        if step % 40 == 39:  # and both are right: every verdict of the bound node as decisions answers it now
            view = state.view(names[n])
            assert view is not None
            for key in keys:
                spanning.forget_quick()
                want = decisions.verdict(view, key[0] * view.unit_mib, key[1], native.limit_need(key, view),
                                         compute_of(key), gpus_of(key))
                assert native.verdicts([names[n]], key) == [want], (step, key)
        if step % 50 == 49:  # a table asked again: more cells held
            for key in rng.sample(keys, 4):
                assert native.verdicts(names, key) == python.verdicts(names, key)
    left = [a for a in answers if a is not None]
    todos = [todo for a in left for _, todo in a[3]]
    if cap is None:  # (at 3/2 the nodes with elastic pods take the cap's path, before the call)
        assert len(answers) - len(left) > 40  # binds whose groups all were refreshed in the one call
        assert any(todo is False for todo in todos)  # a plan not kept yet: made in Python
        assert any(todo is None for todo in todos)  # the general path (unplaced MiB)
        assert unsearched or any(isinstance(todo, bytes) and spanning.UNSEARCHED in todo[1::2] for todo in todos)
        assert any(a[1] for a in left) and any(not a[1] for a in left)  # `same` and not
    assert native._entries == python._entries
    odd = native._host_json[native._index.get(names[-1])]  # (texts made in Python for it, the same)
    assert odd is not None and sum(t is not None for t in odd) > 1


def test_span_refresh_node_refuses_bad_arguments_not_crash() -> None:
    """span_refresh_node's arguments are the memo's own, yet each is checked: a wrong count or type, a node id
    outside the texts, a view of a type without the fields as slots (or a slot empty), a `before` of another type, a
    malformed group, a kept search that is not a dict raise TypeError, ValueError or AttributeError naming them."""
    from memslice.scheduler_extender.index.fitmemo import FOUND_MAX, FitMemo
    from memslice.scheduler_extender.placement.state import Charge
    from memslice.scheduler_extender.placement.views import NodeView

    state = _span_cluster(random.Random(3), 2)
    memo = FitMemo(state)
    memo.verdicts(["n0", "n1"], (4096, "binpack", (), 0, 2))
    state.hold("b", Charge("n0-G0", "n0", 1024, 0, None))  # a bind: the group's plan made in Python and kept
    view = state.view("n0")  # (the view rebuilt: the memo refreshed)
    assert memo._plan is not None
    groups, i = memo._plan[1], memo._index.get("n0")
    assert view is not None and len(groups) == 1 and groups[0][4]

    def call(*over: Any, **kw: Any) -> Any:
        args: dict[str, Any] = dict(i=i, view=view, before=None, groups=groups, founds={}, found_max=FOUND_MAX,
                                    host_json=[None, None], names=["n0", "n1"])
        args.update(kw)
        return NATIVE.span_refresh_node(*args.values(), *over)

    founds: dict[int, Any] = {}
    assert call(founds=founds, before=view) is None  # the same view: every cell keeps its verdict, nothing left
    assert list(founds) == [i] and list(founds[i]) == [groups[0][0]]  # the node's searches made, a list per group
    group = groups[0]
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        (dict(i="0"), TypeError, "i must be an int"), (dict(groups=tuple(groups)), TypeError, "groups a list"),
        (dict(founds=[]), TypeError, "founds a dict"), (dict(found_max=0), ValueError, "found_max 0 below 1"),
        (dict(host_json=(None,)), TypeError, "host_json and names lists"),
        (dict(names=("n0", "n1")), TypeError, "host_json and names lists"),
        (dict(i=5), ValueError, "node id 5 outside"),
        (dict(i=-1), ValueError, "node id -1 outside"), (dict(i=2**70), OverflowError, "too large"),
        (dict(host_json=["x", "x"]), TypeError, "texts are not a tuple"),
        (dict(view=("not", "a view")), TypeError, "tuple.unit_mib is not a slot"),
        (dict(view=object.__new__(NodeView)), AttributeError, "a view without"),
        (dict(before=object.__new__(NodeView)), AttributeError, "a view without"),
        (dict(before=(1, 2)), TypeError, "before is not None or a view"),
        (dict(founds={i: []}), TypeError, "kept set searches are not a dict"),
        (dict(groups=[(1, 2)]), TypeError, "a group is not"), (dict(groups=[group[:5]]), TypeError, "a group is not"),
        (dict(groups=[((2,), *group[1:])]), TypeError, "a group is not"),
        (dict(groups=[(*group[:4], [], group[5])]), TypeError, "a group is not"),
        (dict(groups=[(([2], "x"), *group[1:])]), TypeError, "is not \\(int, str\\)"),
        (dict(host_json=[(None,) * 3, None]), TypeError, "texts must be None or a tuple of 11"),
    ]
    for kw, err, match in bad:
        with pytest.raises(err, match=match):
            call(**kw)
    wrong = [(group[0], group[1], "not cells", *group[3:])]  # (its plan kept: span_refresh is called, and refuses)
    with pytest.raises(TypeError, match="keys must be a tuple, chosen a list, cells a tuple"):
        call(groups=wrong)
    with pytest.raises(TypeError, match="span_refresh_node takes 8 arguments"):
        call(None)
    with pytest.raises(TypeError, match="span_refresh_node takes 8 arguments"):
        NATIVE.span_refresh_node()


# ------------------------------------------------------------------ a spanning table's fill in one call (issue 34)

def _span_cluster(rng: random.Random, count: int) -> Any:
    """`count` nodes of 8 GPUs as the memo meets them: NVLink pairs and PCIe switches (every fifth node: nothing known
    of its topology), random use in whole GiB (ties), an unhealthy GPU now and then, elastic pods (their limits
    above their requests), pods bound without the extender (unplaced), and a node of another unit (2 MiB)."""
    from test_extender_support import pod_obj

    from memslice.contract import Gpu, Inventory
    from memslice.scheduler_extender.placement.state import Charge, ClusterState

    state, gib = ClusterState(), 1024
    for n in range(count):
        gpus = tuple(Gpu(f"n{n}-G{i}", i, "Sim", 80 * gib, i // 4, not (n % 7 == 0 and i == 3), nvlink=(i ^ 1,),
                         pcie=f"sw{i // 4}") for i in range(8))
        if n % 5 == 4:
            gpus = tuple(g._replace(nvlink=(), pcie=None, numa=None) for g in gpus)
        state.upsert_node({"metadata": {"name": f"n{n}", "annotations": Inventory(2 if n == 13 else 1,
                                                                                    gpus).format()}})
        for h in range(rng.randint(0, 12)):
            state.hold(f"h{n}-{h}", Charge(f"n{n}-G{rng.randrange(8)}", f"n{n}", rng.choice((4, 8, 16, 20)) * gib, 0,
                                           None, rng.choice((0, 0, 0, 4 * gib))))
        if n % 9 == 2:
            pod = pod_obj(f"u{n}", {"main": 6 * gib}, node=f"n{n}")
            pod["metadata"].update(uid=f"u{n}", resourceVersion=str(n + 1))
            state.upsert_pod(pod)
    return state


@pytest.mark.parametrize("ratio", [None, "1", "3/2", "1/2"])
def test_span_fill_writes_the_cells_the_python_reference_writes(ratio: str | None) -> None:
    """_nameids.span_fill (FitMemo._fill_spanning natively: one C call per request of a spanning table that stopped
    sharing by shape) leaves the table as the Python loop does (_fill_spanning_each, the reference): the same kinds,
    scores, HostPriority texts, reasons and counts, every verdict decisions.verdict's from scratch; the cells it
    writes itself are many (a fitting node whose text for that score is kept), the others resolved in Python from
    its codes (a text to make, NO_ROOM, the general path for unplaced memory, a search left to the reference, a node
    the cap decides). Over three rounds of requests for sizes of 2 and 4 GPUs and both policies, with binds and
    releases between them (the set searches kept per view must follow), with the cap off, at 1, 1.5 and 0.5 (below
    1 every node is capped: the Python loop alone)."""
    from fractions import Fraction

    from memslice.scheduler_extender.index.fitmemo import FitMemo, compute_of, gpus_of
    from memslice.scheduler_extender.placement import decisions, spanning
    from memslice.scheduler_extender.placement.state import Charge

    rng = random.Random(34)
    state = _span_cluster(rng, 48)
    for n in (n for n in range(48) if n % 3):  # most nodes fuller: pods of 2 and 4 GPUs find no room (NO_ROOM)
        for g in rng.sample(range(8), rng.randint(4, 8)):
            state.hold(f"full{n}-{g}", Charge(f"n{n}-G{g}", f"n{n}", rng.choice((48, 56, 64)) * 1024, 0, None))
    cap = Fraction(ratio) if ratio is not None else None
    native, python = FitMemo(state, cap), FitMemo(state, cap)
    python._index.span_fill = None
    written: list[int] = []
    failed: list[int] = []
    fill = native._index.span_fill
    assert fill is not None

    def counted(*args: Any) -> Any:
        out = fill(*args)
        written.append(out[1])
        failed.append(out[0].count(0xFB))

        return out

    native._index.span_fill = counted
    names = [f"n{n}" for n in range(48)]
    keys = [(gib * 1024, policy, (), 0, n) for gib in (2, 4, 8, 12, 20, 40, 64, 96) for n in (2, 4)
            for policy in ("binpack", "spread")]
    for step in range(3):
        for key in keys:
            for memo in (native, python):
                memo._table(key).sharing = False  # as after a fill that met mostly new shapes
            some = rng.sample(names, 30)
            got = native.verdicts(some, key)
            assert got == python.verdicts(some, key)
            a, b = native._tables[key], python._tables[key]
            assert (a.kinds, a.scores, a.jsons, a.reasons, a.filled, a.fitting) == (
                b.kinds, b.scores, b.jsons, b.reasons, b.filled, b.fitting), (step, key)
            for name, v in zip(some, got, strict=True):
                view = state.view(name)
                assert view is not None
                spanning.forget_quick()
                assert v == decisions.verdict(view, key[0] * view.unit_mib, key[1], native.limit_need(key, view),
                                              compute_of(key), gpus_of(key)), (name, key)
        for h in range(12):  # binds and releases: views rebuilt, their kept searches dropped
            n = rng.randrange(48)
            state.hold(f"s{step}-{h}", Charge(f"n{n}-G{rng.randrange(8)}", f"n{n}", rng.choice((2, 6)) * 1024, 0, None))
            state.release(f"h{n}-0", None)
    assert native._entries == python._entries
    assert sum(written) > 200 if cap is None or cap >= 1 else written == []
    assert sum(failed) > 20 if cap is None or cap >= 1 else failed == []  # NO_ROOM's reasons written natively


@pytest.mark.parametrize("gpus", [2, 4])
def test_span_fill_looks_for_a_new_mask_in_the_levels_as_the_reference_does(gpus: int) -> None:
    """A mask of GPUs with room that the topology's plan has not met yet: span_fill looks for it in the plan's levels
    and keeps it as spanning._closest does (the same distance and sets under that mask), then makes the search
    itself, so the code is the one spanning.codes answers (not UNSEARCHED, left to the reference's search)."""
    from memslice.scheduler_extender.placement import spanning
    from memslice.scheduler_extender.placement.views import NodeView

    state = _span_cluster(random.Random(7), 4)  # (nodes 0-3: NVLink pairs and PCIe switches)
    with state.current():
        views = state.views_unlocked()
    assert views is not None
    names: list[str | None] = [f"n{n}" for n in range(4)]
    for units in (1024, 4096, 16384):
        spanning._LEVELS.clear()
        want = [spanning.codes(views[f"n{n}"], (units,), "binpack", gpus, {})[0] for n in range(4)]
        reference = {key: dict(plan[2]) for key, plan in spanning._LEVELS.items()}
        for plan in spanning._LEVELS.values():
            plan[2].clear()  # the plans made, no mask met yet
        codes, _ = NATIVE.span_fill([0, 1, 2, 3], names, views, NodeView, {}, (gpus, "binpack"), units, gpus, False,
                                    spanning.plans(), 64, False, bytearray(4), bytearray(4), [None] * 4, [None] * 4,
                                    [None] * 4, None)
        assert list(codes) == want and spanning.UNSEARCHED not in codes, units
        assert {key: dict(plan[2]) for key, plan in spanning._LEVELS.items()} == reference


def test_span_fill_refuses_bad_arguments_not_crash() -> None:
    """span_fill's arguments are the memo's own, yet each is checked: a wrong type, an id outside the table, a
    table's arrays of other lengths, a view of another type, kept searches of the wrong shape raise TypeError,
    ValueError or IndexError naming them; nothing is written then beyond the cells before the bad one."""
    from memslice.scheduler_extender.placement import spanning
    from memslice.scheduler_extender.placement.state import Charge
    from memslice.scheduler_extender.placement.views import NodeView

    rng = random.Random(1)
    state = _span_cluster(rng, 3)
    for n, g in itertools.product((0, 1), range(8)):  # no GPU wholly free: a pod of a whole GPU finds no room
        state.hold(f"one{n}-{g}", Charge(f"n{n}-G{g}", f"n{n}", 1024, 0, None))
    with state.current():
        views = state.views_unlocked()
    assert views is not None
    names: list[str | None] = ["n0", "n1", None]

    def call(ids: Any = None, **kw: Any) -> Any:
        args: dict[str, Any] = dict(names=names, views=views, view_type=NodeView, founds={}, at=(2, "binpack"),
                                    units=4096, gpus=2, spread=False, levels={}, found_max=64, check_over=False,
                                    kinds=bytearray(4), scores=bytearray(4), jsons=[None] * 4,
                                    host_json=[None] * 3, reasons=[None] * 4, no_room=None)
        args.update(kw)
        return NATIVE.span_fill([0, 1, 2] if ids is None else ids, *args.values())

    codes, written = call()
    assert written == 0 and codes[2] == 0xF9 and all(c <= 10 or c in (0xF0, 0xF1, 0xF2) for c in codes[:2])
    founds: dict[int, Any] = {0: {}, 1: {}}
    for i in (0, 1):  # the searches made by the reference and kept: the C reads them
        spanning.codes(views[f"n{i}"], (4096,), "binpack", 2, founds[i])
    texts = tuple(f"t{s}" for s in range(11))
    kinds, scores, jsons = bytearray(4), bytearray(4), [None] * 4
    codes, written = call(kinds=kinds, scores=scores, jsons=jsons, host_json=[texts, texts, None], founds=founds)
    assert written == sum(c == 0xF8 for c in codes) > 0
    for i in range(2):  # a cell written: FITS, its score, the node's text for it; else left as it was
        assert (kinds[i], jsons[i]) == ((1, texts[scores[i]]) if codes[i] == 0xF8 else (0, None))
    assert call([0, 0], kinds=bytearray(b"\x02\x00\x00\x00"))[0] == b"\xf9\xf9"  # a cell with a verdict: skipped
    full = 80 * 1024  # a pod of a whole GPU on each of 2: no room on these nodes
    base, _ = call(units=full)
    assert base[:2] == b"\xf0\xf0"
    kinds, reasons = bytearray(4), [None] * 4
    codes, written = call(units=full, kinds=kinds, reasons=reasons, no_room={full: "no room"})
    assert (codes[:2], written, kinds[:2], reasons[:2]) == (b"\xfb\xfb", 0, b"\x02\x02", ["no room"] * 2)
    for no_room in ({}, {full: 3}, {full + 1: "other"}):  # no text for that need: Python's
        assert call(units=full, no_room=no_room)[0][:2] == b"\xf0\xf0"
    assert call(units=full + 1, no_room={full + 1: "x"})[0][:2] == b"\xf0\xf0"  # no GPU that large: never, Python's
    with pytest.raises(TypeError, match="reason or JSON is not a str or None"):
        call(units=full, reasons=[b"x"] * 4, no_room={full: "no room"})
    assert call([0], units=0)[1] == 0
    for ids, err in (([4], IndexError), ([-1], IndexError), ([2**70], IndexError), (["0"], IndexError)):
        with pytest.raises(err, match="not one of a table of 4"):
            call(ids)
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        (dict(gpus=0), ValueError, "gpus 0 outside"), (dict(gpus=65), ValueError, "gpus 65 outside"),
        (dict(scores=bytearray(3)), ValueError, "a table of 4 kinds, 3 scores"),
        (dict(jsons=[None]), ValueError, "1 texts and 4 reasons"), (dict(units=-1), ValueError, "units below 0"),
        (dict(units=2**60), ValueError, "units must be an int"), (dict(units="1"), ValueError, "units must be"),
        (dict(found_max=0), ValueError, "found_max below 1"), (dict(at=([2], "x")), TypeError, "unhashable"),
        (dict(views={"n0": "not a view"}), TypeError, "is not a NodeView"),
        (dict(view_type=int), TypeError, "int.unit_mib is not a slot"),
        (dict(founds={0: []}), TypeError, "kept set searches are not a dict"),
        (dict(founds={0: {(2, "binpack"): (None,)}}), TypeError, "chosen sets are not a list"),
        (dict(founds={0: {(2, "binpack"): []}}), IndexError, "outside the chosen sets"),
        (dict(kinds=b"\x00" * 4), TypeError, "read-write"), (dict(names=("n0",)), TypeError, "list"),
        (dict(views=[]), TypeError, "dict"), (dict(levels=None), TypeError, "dict"),
        (dict(reasons=[None] * 3), ValueError, "and 3 reasons"), (dict(reasons=(None,) * 4), TypeError, "list"),
        (dict(no_room=[]), TypeError, "no_room must be a dict"),
    ]
    for kw, err, match in bad:
        with pytest.raises(err, match=match):
            call(**kw)
    with pytest.raises(TypeError):
        NATIVE.span_fill([0])  # too few arguments


# ------------------------------------------------------------------ a table's fill by shared shapes (issue 34)

def _shaped_cluster(rng: random.Random, count: int, repeat: float) -> Any:
    """`count` nodes of 8 GPUs (NVLink pairs, a PCIe switch per four), a share `repeat` of them in one of three
    shapes (the same use of the same GPUs, so _sid numbers them alike), the others used at random (shapes met
    once); a GPU unhealthy now and then."""
    from memslice.contract import Gpu, Inventory
    from memslice.scheduler_extender.placement.state import Charge, ClusterState

    state, gib = ClusterState(), 1024
    patterns = [[(g, rng.choice((4, 8, 20, 40, 76)) * gib) for g in rng.sample(range(8), k)] for k in (0, 3, 7)]
    for n in range(count):
        gpus = tuple(Gpu(f"n{n}-G{i}", i, "Sim", 80 * gib, i // 4, not (n % 11 == 5 and i == 2), nvlink=(i ^ 1,),
                         pcie=f"sw{i // 4}") for i in range(8))
        state.upsert_node({"metadata": {"name": f"n{n}", "annotations": Inventory(1, gpus).format()}})
        uses = rng.choice(patterns) if rng.random() < repeat else [
            (rng.randrange(8), rng.choice((2, 6, 12, 30, 70)) * gib) for _ in range(rng.randint(1, 10))]
        for h, (g, mib) in enumerate(uses):
            state.hold(f"h{n}-{h}", Charge(f"n{n}-G{g}", f"n{n}", mib, 0, None))
    return state


@pytest.mark.parametrize(("seed", "repeat", "shapes_max"), [(1, 0.9, None), (2, 0.6, None), (3, 0.15, None),
                                                          (4, 0.97, 12)])
def test_shared_fill_leaves_the_tables_the_python_loop_leaves(seed: int, repeat: float, shapes_max: int | None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """_nameids.shared_fill (FitMemo._fill's loop while a table shares verdicts by node shape, natively) leaves
    every table as the Python loop does (the reference, shared_fill None): kinds, scores, HostPriority texts,
    reasons, counts, the shapes' kept verdicts and whether each table still shares, the memo's shape numbers and
    kept texts. Random clusters whose shapes repeat (most cells from a kept verdict), or mostly do not (the sharing
    trial stops a table mid-fill: a spanning table hands the ids left to _fill_spanning), or with the numbering
    bounded at 5 shapes (_sid starts it afresh mid-fill: every shape number and kept verdict dropped); pods of one
    GPU and of 2 and 4 that fit, fail now or never can; requests naming some nodes twice; texts kept for some
    scores only (prioritize makes them); binds and releases between rounds (shape numbers dropped)."""
    from memslice.scheduler_extender.index import fitmemo
    from memslice.scheduler_extender.index.fitmemo import FitMemo
    from memslice.scheduler_extender.placement.state import Charge

    renumbered = [0]
    if shapes_max is not None:
        monkeypatch.setattr(fitmemo, "SHAPES_MAX", shapes_max)
        sid = FitMemo._sid

        def counted_sid(memo: FitMemo, i: int, view: Any) -> int:
            renumbered[0] += len(memo._shape_ids) >= shapes_max  # the numbering started afresh in this call
            return sid(memo, i, view)

        monkeypatch.setattr(FitMemo, "_sid", counted_sid)
    rng, gib = random.Random(seed), 1024
    state = _shaped_cluster(rng, 90, repeat)
    native, python = FitMemo(state), FitMemo(state)
    python._index.shared_fill = None
    fill = native._index.shared_fill
    assert fill is not None
    written, texts = [0], [0]

    def counted(*args: Any) -> Any:
        out = fill(*args)
        written[0] += out[1]
        texts[0] += len(out[3] or ())
        return out

    native._index.shared_fill = counted
    names = [f"n{n}" for n in range(90)]
    keys: list[Any] = [(gib * g, p) for g in (1, 8, 40, 78, 90) for p in ("binpack", "spread")]
    keys += [(gib * g, p, (), 0, n) for g in (2, 10, 40) for n in (2, 4) for p in ("binpack", "spread")]
    for step in range(4):
        for key in rng.sample(keys, len(keys)):
            some = rng.sample(names, 60)
            some += rng.sample(some, 8)  # named twice: written once
            assert native.verdicts(some, key) == python.verdicts(some, key), (step, key)
            if rng.random() < 0.3:  # prioritize: texts made for the scores met
                assert native.host_json(some[:20], key) == python.host_json(some[:20], key)
            a, b = native._tables[key], python._tables[key]
            assert (a.kinds, a.scores, a.jsons, a.reasons, a.filled, a.fitting, a.shared, a.sharing) == (
                b.kinds, b.scores, b.jsons, b.reasons, b.filled, b.fitting, b.shared, b.sharing), (step, key)
        assert (native._sids, native._shape_ids, native._host_json, native._entries, native._group_sharing) == (
            python._sids, python._shape_ids, python._host_json, python._entries, python._group_sharing), step
        for h in range(15):  # binds and releases: those nodes' shape numbers dropped (_refresh)
            n = rng.randrange(90)
            state.hold(f"s{step}-{h}", Charge(f"n{n}-G{rng.randrange(8)}", f"n{n}", rng.choice((2, 6)) * gib, 0, None))
            state.release(f"h{n}-0", None)
    assert written[0] > (1000 if repeat > 0.8 else 200 if repeat > 0.5 else 10)  # the C wrote most cells
    assert texts[0] > (20 if repeat > 0.5 else 0)  # fitting cells whose text was not kept yet: made by the caller
    assert renumbered[0] > 3 if shapes_max is not None else renumbered[0] == 0
    if repeat < 0.5:  # the trial stopped some tables sharing
        assert not all(t.sharing for t in native._tables.values())


def test_shared_fill_writes_kept_verdicts_and_refuses_bad_arguments_not_crash() -> None:
    """shared_fill writes an empty cell from its shape's kept verdict as FitMemo._fill does (FITS, the score and the
    node's kept text, or the id handed back where that text is not kept; NEVER or FAILS and the reason), skips cells
    with a verdict (an id named twice), and stops at a node without a shape number or a shape without a verdict.
    Its arguments are the memo's own, yet each is checked: wrong types, arrays of other lengths, an id outside them,
    a verdict that is not (bool, bool, str, int), a reason not a str, a score outside 0..10, a shape number not an
    int raise TypeError, ValueError or IndexError; nothing of the bad cell is written."""
    fits, never = (True, False, "", 3), (False, True, "too big", 0)
    text3 = tuple(f"t{s}" if s == 3 else None for s in range(11))

    def args(**kw: Any) -> dict[str, Any]:
        out: dict[str, Any] = dict(ids=[0, 1, 0, 2, 3], start=0, kinds=bytearray(5), scores=bytearray(5),
                                   jsons=[None] * 5, reasons=[None] * 5, sids=[0, 1, None, 7, 0],
                                   shared={0: fits, 1: never}, host_json=[text3, None, None, None, None])
        out.update(kw)
        return out

    a = args()
    assert NATIVE.shared_fill(*a.values()) == (3, 2, 1, None)  # id 0 fits, 1 never, 0 again skipped, 2: no sid
    assert (a["kinds"][:2], a["scores"][:2], a["jsons"][:2], a["reasons"][:2]) == (b"\x01\x03", b"\x03\x00",
                                                                                   ["t3", None], [None, "too big"])
    a["sids"][2] = 0
    assert NATIVE.shared_fill(*{**a, "start": 3}.values()) == (4, 1, 1, [2])  # id 2 fits, no text; 7: a miss
    assert (a["kinds"][2], a["scores"][2], a["jsons"][2]) == (1, 3, None)
    assert NATIVE.shared_fill(*{**a, "ids": [3, 4], "shared": {7: (False, False, "later", 0)}}.values()) == (
        1, 1, 0, None)  # id 3 fails now; id 4's shape has no verdict in that dict
    assert (a["kinds"][3], a["reasons"][3]) == (2, "later")
    assert NATIVE.shared_fill(*{**a, "ids": []}.values()) == (0, 0, 0, None)
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        (dict(ids=(0,)), TypeError, "ids: list"), (dict(kinds=bytes(5)), TypeError, "kinds: bytearray"),
        (dict(scores=[0] * 5), TypeError, "bytearray"), (dict(jsons=(None,) * 5), TypeError, "jsons: list"),
        (dict(sids=None), TypeError, "sids: list"), (dict(shared=[]), TypeError, "shared: dict"),
        (dict(host_json={}), TypeError, "host_json: list"),
        (dict(start=-1), ValueError, "start"), (dict(start=6), ValueError, "start"),
        (dict(start=2**70), ValueError, "start"), (dict(start="0"), ValueError, "start"),
        (dict(scores=bytearray(4)), ValueError, "5 kinds, 4 scores"), (dict(jsons=[None]), ValueError, "1 texts"),
        (dict(reasons=[None] * 9), ValueError, "9 reasons"), (dict(host_json=[None]), ValueError, "kept texts"),
        (dict(ids=[5]), IndexError, "not one of a table of 5"), (dict(ids=[-1]), IndexError, "not one of"),
        (dict(ids=[2**70]), IndexError, "not one of"), (dict(ids=["0"]), IndexError, "not one of"),
        (dict(sids=[0, 1]), ValueError, "2 shape numbers and 5 kept texts"),
        (dict(sids=[0, 1], host_json=[text3, None]), IndexError, "table of 5 and 2 shape numbers"),
        (dict(shared={0: [True, False, "", 3]}), TypeError, "not a \\(bool, bool, str, int\\)"),
        (dict(shared={0: (True, False, "")}), TypeError, "not a \\(bool"),
        (dict(shared={0: (1, False, "", 3)}), TypeError, "not a \\(bool"),
        (dict(shared={0: (False, 0, "x", 0)}), TypeError, "not a \\(bool"),
        (dict(shared={0: (False, False, b"x", 0)}), TypeError, "reason is not a str"),
        (dict(shared={0: (False, False, None, 0)}), TypeError, "reason is not a str"),
        (dict(shared={0: (True, False, "", 11)}), ValueError, "score is not an int 0..10"),
        (dict(shared={0: (True, False, "", -1)}), ValueError, "score"),
        (dict(shared={0: (True, False, "", 2**70)}), ValueError, "score"),
        (dict(shared={0: (True, False, "", "3")}), ValueError, "score"),
        (dict(sids=["0", 1, None, 7, 0]), TypeError, "shape number is not an int"),
        (dict(host_json=[["t"] * 11, None, None, None, None]), TypeError, "kept texts are not a tuple"),
        (dict(jsons=[b"x", None, None, None, None]), TypeError, "text or reason is not a str or None"),
        (dict(ids=[1], reasons=[None, 1.5, None, None, None]), TypeError, "text or reason is not a str or None"),
    ]
    for kw, err, match in bad:
        a = args(**kw)
        with pytest.raises(err, match=match):
            NATIVE.shared_fill(*a.values())
        if {"shared", "jsons", "reasons"} & kw.keys():  # the bad cell the first met: nothing written
            assert (bytes(a["kinds"]), bytes(a["scores"])) == (bytes(5), bytes(5)), kw
    with pytest.raises(TypeError):
        NATIVE.shared_fill([0])  # too few arguments
    with pytest.raises(TypeError):
        NATIVE.shared_fill(*args().values(), None)  # too many

# ------------------------------------------------------------------ a failing filter's answer, whole (issue 34)

def _answer_reference(names: list[str], ids: list[int], kinds: bytes, scores: bytearray, reasons: list[Any],
                      best: bool) -> tuple[bytes, list[int]]:
    """What the memo's split (FitMemo._reasons, _top) and the server's orjson.dumps(wire.filter_result(...)) answer:
    the answer's bytes, and the passing names' ids."""
    from memslice.scheduler_extender.wire import filter_result

    passed = [(n, i) for n, i, k in zip(names, ids, kinds, strict=True) if k == 1]
    if best and passed:
        top = max(scores[i] for _, i in passed)
        passed = [(n, i) for n, i in passed if scores[i] == top]
    failed = {n: reasons[i] for n, i, k in zip(names, ids, kinds, strict=True) if k == 2}
    never = {n: reasons[i] for n, i, k in zip(names, ids, kinds, strict=True) if k == 3}
    return orjson.dumps(filter_result(None, [n for n, _ in passed], failed, never)), [i for _, i in passed]


REASONS = ["pod needs 4096 MiB on each of 2 GPUs (memslice.io/gpu-count); fewer than 2 GPUs of the node have that "
           "free now", "node advertises no memslice GPUs", "", "x" * 300]
ODD_REASONS = ['bad annotation: "gpus"', "back\\slash", "tab\there", "caf\u00e9", "del\x7f", None, 3]


@settings(max_examples=examples(400), derandomize=QUICK, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # `scan` picks a module: same for all
@given(st.lists(node_names, min_size=1, max_size=16), st.lists(st.sampled_from(["", " ", "\n", "\t "]), min_size=1,
                                                              max_size=3),
       st.data(), st.booleans())
def test_filter_answer_writes_the_bytes_orjson_writes_for_the_split(scan: ModuleType, query: list[str],
                                                                   spaces: list[str], data: st.DataObject,
                                                                   best: bool) -> None:
    """_nameids.filter_answer (a filter failing on some names, its answer written from the request's bytes and the
    table) answers b'{"Nodes":null,"NodeNames":' + its array + its rest == orjson.dumps(wire.filter_result(...)) of
    the split the memo answered before (the passing names, with `best` those of the highest score; FailedNodes and
    FailedAndUnresolvableNodes as dicts: a repeated name keeps its first place), and the passing names' ids; None
    where a failing name's reason is not plain printable ASCII (orjson escapes or re-encodes those: the Python path
    writes them), whatever the whitespace in the array (the names are copied, compact)."""
    from memslice.scheduler_extender.wire import FILTER_NAMES_HEAD

    held = sorted(set(query))
    ids = [held.index(n) for n in query]
    kind_of = data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=len(held), max_size=len(held)))
    kinds = bytes(kind_of[i] for i in ids)  # a node's kind, each time its name comes (take() of the table)
    scores = bytearray(data.draw(st.lists(st.integers(0, 10), min_size=len(held), max_size=len(held))))
    odd = data.draw(st.booleans())
    reasons = data.draw(st.lists(st.sampled_from(REASONS + (ODD_REASONS if odd else [])), min_size=len(held),
                                 max_size=len(held)))
    body = _json_array(query, spaces)
    got = scan.filter_answer(body, NativeNameIds().pack(ids), kinds, scores, reasons, best)  # (both scans of names)
    failing = {i for i, k in zip(ids, kinds, strict=True) if k != 1}
    if any(not (type(reasons[i]) is str and reasons[i].isascii() and reasons[i].isprintable() and '"' not in
                reasons[i] and "\\" not in reasons[i]) for i in failing):
        assert got is None
        return
    want, kept = _answer_reference(query, ids, kinds, scores, reasons, best)
    assert got is not None
    assert FILTER_NAMES_HEAD + got[0] + got[1] == want
    assert got[2] == NativeNameIds().pack(kept) and orjson.loads(got[0]) == [held[i] for i in kept]


def test_filter_answer_refuses_bad_arguments_and_arrays() -> None:
    """Not a plain array of as many names as ids (escapes, a trailing comma, text after it, too few or too many
    names), a kind that is no verdict: None; an id outside the scores or the reasons: IndexError; kinds of another
    count: ValueError; arguments of the wrong types: TypeError."""
    pack = NativeNameIds().pack
    scores, reasons = bytearray(b"\x05\x07"), ["r0", "r1"]
    assert NATIVE.filter_answer(b'["a","b"]', pack([0, 1]), b"\x01\x02", scores, reasons, False) == (
        b'["a"]', b',"FailedNodes":{"b":"r1"},"FailedAndUnresolvableNodes":{},"Error":""}', pack([0]))
    assert NATIVE.filter_answer(b'[ "a" ,\n"b" ]', pack([0, 1]), b"\x01\x01", scores, reasons, True)[0] == b'["b"]'
    for bad in (b'["a",]', b'["a" "b"]', b'["a\\u0061","b"]', b'["a","b"]x', b'["a","b"', b"", b"[1,2]", b'["a"]',
                b'["a","b","c"]', "[\"\u00e9\",\"b\"]".encode()):
        assert NATIVE.filter_answer(bad, pack([0, 1]), b"\x01\x02", scores, reasons, False) is None, bad
    assert NATIVE.filter_answer(b'["a","b"]', pack([0, 1]), b"\x01\x00", scores, reasons, False) is None
    with pytest.raises(IndexError, match="node id 2 outside a table of 2"):
        NATIVE.filter_answer(b'["a","b"]', pack([0, 2]), b"\x01\x01", scores, reasons, False)
    with pytest.raises(IndexError, match="node id 1 outside a table of 1"):
        NATIVE.filter_answer(b'["a","b"]', pack([0, 1]), b"\x01\x03", scores, reasons[:1], False)
    with pytest.raises(ValueError, match="1 kinds for 2 ids"):
        NATIVE.filter_answer(b'["a","b"]', pack([0, 1]), b"\x01", scores, reasons, False)
    with pytest.raises(ValueError, match="4 bytes each"):
        NATIVE.filter_answer(b'["a"]', b"\x00" * 5, b"\x01", scores, reasons, False)
    with pytest.raises(TypeError):
        NATIVE.filter_answer(b'["a"]', pack([0]), b"\x01", scores, tuple(reasons), False)
    with pytest.raises(TypeError):
        NATIVE.filter_answer('["a"]', pack([0]), b"\x01", scores, reasons, False)

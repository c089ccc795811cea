"""tests/support/build_cache.py: the image prefix of test_image_build.py is built once per change of its inputs,
never half-built, and never pruned while another run uses it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import build_cache
import pytest


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMSLICE_TEST_BUILD_CACHE", raising=False)
    return tmp_path / "cache" / "memslice-tests"


def counting_build(calls: list[Path]):
    def build(entry: Path) -> None:
        calls.append(entry)
        (entry / "out").write_text(f"build {len(calls)}")
    return build


def test_same_inputs_build_once_and_new_inputs_build_again(tmp_path: Path) -> None:
    calls: list[Path] = []
    build = counting_build(calls)
    with build_cache.cached_build("k", "aaaa", build, tmp_path / "fresh") as (entry, built):
        assert built and (entry / "out").read_text() == "build 1"
    with build_cache.cached_build("k", "aaaa", build, tmp_path / "fresh") as (again, built):
        assert not built and again == entry and (again / "out").read_text() == "build 1"
    with build_cache.cached_build("k", "bbbb", build, tmp_path / "fresh") as (other, built):
        assert built and other != entry and (other / "out").read_text() == "build 2"
    assert len(calls) == 2


def test_a_failed_build_is_not_used_and_is_built_again(tmp_path: Path) -> None:
    def broken(entry: Path) -> None:
        (entry / "half").write_text("x")
        raise AssertionError("build.sh failed")

    with pytest.raises(AssertionError, match="build.sh failed"):
        with build_cache.cached_build("k", "aaaa", broken, tmp_path / "fresh"):
            pass
    calls: list[Path] = []
    with build_cache.cached_build("k", "aaaa", counting_build(calls), tmp_path / "fresh") as (entry, built):
        assert built and calls == [entry] and not (entry / "half").exists()


def test_the_cache_off_builds_every_time_into_the_fresh_directory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSLICE_TEST_BUILD_CACHE", "0")
    calls: list[Path] = []
    for _ in range(2):
        with build_cache.cached_build("k", "aaaa", counting_build(calls), tmp_path / "fresh") as (entry, built):
            assert built and entry == tmp_path / "fresh"
    assert len(calls) == 2


def age(own_cache: Path, digest: str) -> None:
    """The entry as a run last used it long ago (more than RECENT_S): each aged later is the more recent."""
    old = time.time() - 2 * build_cache.RECENT_S + len(list((own_cache / "k").iterdir()))
    os.utime(own_cache / "k" / digest / ".complete", (old, old))


def test_old_entries_are_pruned_unless_another_run_holds_them(tmp_path: Path, own_cache: Path) -> None:
    build = counting_build([])
    with build_cache.cached_build("k", "held", build, tmp_path / "fresh"):
        pass
    age(own_cache, "held")
    # another test run (another process) using the oldest entry: a shared lock on it, as cached_build holds
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys
fd = os.open({str(own_cache / "k" / "held.lock")!r}, os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for digest in ("d1", "d2", "d3", "d4", "d5"):
            with build_cache.cached_build("k", digest, build, tmp_path / "fresh"):
                pass
            age(own_cache, digest)
        kept = sorted(d.name for d in (own_cache / "k").iterdir() if d.is_dir())
        assert kept == ["d3", "d4", "d5", "held"], "the newest KEEP entries and the one in use"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    with build_cache.cached_build("k", "d6", build, tmp_path / "fresh"):
        pass
    assert sorted(d.name for d in (own_cache / "k").iterdir() if d.is_dir()) == ["d4", "d5", "d6"]


def test_entries_used_recently_are_kept_beyond_keep_up_to_keep_recent(tmp_path: Path, own_cache: Path) -> None:
    """Several checkouts running the tests (each its own digest) within the hour: each one's entry is still there
    for its next run, up to KEEP_RECENT entries; past that the least recently used go."""
    build = counting_build([])
    digests = [f"d{i:02}" for i in range(build_cache.KEEP_RECENT + 2)]
    for i, digest in enumerate(digests):
        with build_cache.cached_build("k", digest, build, tmp_path / "fresh"):
            pass
        used = time.time() - 600 + i  # all within RECENT_S, in this order
        os.utime(own_cache / "k" / digest / ".complete", (used, used))
    kept = sorted(d.name for d in (own_cache / "k").iterdir() if d.is_dir())
    assert kept == digests[-build_cache.KEEP_RECENT:], kept
    now = time.time()
    assert build_cache.to_prune([("recent", now - 60), ("old", now - 2 * build_cache.RECENT_S), ("a", now - 1),
                                 ("half-built", 0.0)], now) == ["old", "half-built"]


def test_the_digest_follows_sources_and_ignores_generated_files(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.c").write_text("int a;\n")
    (tmp_path / "setup.py").write_text("x\n")

    def digest() -> str:
        return build_cache.tree_digest(tmp_path, ["src", "setup.py"], lambda rel: rel.endswith(".so"),
                                       extra=["cc 12"])

    first = digest()
    (tmp_path / "src" / "pkg" / "lib.so").write_bytes(b"\x7fELF")
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "src" / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"x")
    assert digest() == first, "generated files are not inputs"
    (tmp_path / "src" / "pkg" / "b.c").write_text("int b;\n")
    second = digest()
    assert second != first, "a new source file"
    (tmp_path / "src" / "pkg" / "b.c").write_text("int c;\n")
    assert digest() != second, "a changed source file"
    (tmp_path / "src" / "pkg" / "b.c").unlink()
    assert digest() == first
    assert build_cache.tree_digest(tmp_path, ["src", "setup.py"], lambda rel: False, extra=["cc 13"]) != first

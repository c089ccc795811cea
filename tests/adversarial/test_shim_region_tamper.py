"""A tenant edits its own region file (issue 11, item 9): the shim validates the header when it opens it
and fails closed with one line, never hangs on it, and never starts a second ledger beside a live one
(which would double the quota). Also: a region path too long for the shim is refused, not truncated
(item 12)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import run

from memslice.interposer.region import _ffi, read_region

MiB = 1 << 20


def poke(path, field: str, data: bytes) -> None:
    """Overwrite a header field of the region file in place."""
    off = _ffi().offsetof("struct ms_header", field)
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


@pytest.fixture
def live(node, cbin, tmp_path):
    """A container whose region holds one live process with 600 MiB charged (of 1 GiB)."""
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="0")
    p = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "600"], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert '"result": 0' in p.stdout.readline()
    assert '"ready"' in p.stdout.readline()
    yield env, region / "memslice.region", p
    p.kill()
    p.wait(timeout=30)


def refused_to_start(out: subprocess.CompletedProcess[str], message: str) -> None:
    assert out.stdout.startswith("init 800"), out.stdout + out.stderr  # nothing runs on a doubtful ledger
    assert message in out.stderr, out.stderr
    assert "Every CUDA call fails until this is fixed." in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("size", [0, 4096, 1 << 20])
def test_truncated_region_is_not_a_fresh_ledger(size, live, cbin):
    """Truncating the file under a live process used to let the next process re-initialise it and take
    the whole quota again beside the 600 MiB still in use. Once no process is in it, a fresh one is fine."""
    env, path, holder = live
    os.truncate(path, size)
    out = run([cbin["alloc_direct"], "900"], env)
    refused_to_start(out, f"was {'emptied' if size == 0 else 'truncated'} while processes of the container use it")
    holder.kill()
    holder.wait(timeout=30)
    assert "alloc 1000 MiB -> 0" in run([cbin["alloc_direct"], "1000"], env).stdout


def test_region_of_another_version_is_replaced_when_unused(node, cbin, tmp_path):
    """A region file nobody is in (left by an older version, or garbled) is made fresh instead of
    failing every process of the container until someone removes it."""
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="0")
    assert "alloc 10 MiB -> 0" in run([cbin["alloc_direct"], "10"], env).stdout
    poke(region / "memslice.region", "version", (99).to_bytes(4, "little"))
    out = run([cbin["alloc_direct"], "1000"], env)
    assert "alloc 1000 MiB -> 0" in out.stdout, out.stdout + out.stderr
    assert read_region(region).devices[0].peak_bytes == 1000 * MiB


@pytest.mark.parametrize(("field", "data", "message"), [
    ("ndevices", (1000).to_bytes(4, "little"), "a device count out of range"),
    ("slot_hwm", (70000).to_bytes(4, "little"), "a slot count out of range"),
    ("lock", bytes.fromhex("9bcc79b3b0cd7628") * 8, "a corrupt mutex"),  # fixed garbage: test ids must not vary (xdist)
    ("magic", b"XXXX", "bad magic"),
    ("version", (1).to_bytes(4, "little"), "another layout version"),
    ("slot_size", (64).to_bytes(4, "little"), "record sizes that are not this version's"),
    ("extra_size", (1 << 40).to_bytes(8, "little"), "a size that does not match its header"),
])
def test_edited_header_fails_closed(field, data, message, live, cbin):
    env, path, _ = live
    poke(path, field, data)
    refused_to_start(run([cbin["alloc_direct"], "10"], env, timeout=30), message)


def test_mutex_left_locked_by_a_thread_that_never_was(live, cbin):
    """A mutex word that says "locked by thread 12345" (a valid kind, a fake owner): waits on it are
    bounded, so allocations that fit go on, and one over the quota is refused within the bound."""
    env, path, _ = live
    poke(path, "lock", (12345).to_bytes(4, "little"))
    out = run([cbin["alloc_direct"], "300", "300"], env, timeout=60)
    assert "alloc 300 MiB -> 0" in out.stdout and "alloc 300 MiB -> 2" in out.stdout, out.stdout + out.stderr
    assert "was locked for more than 250 ms" in out.stderr


def test_region_file_that_is_a_symlink(node, cbin, tmp_path):
    """The region file is opened without following a symlink (a tenant's link must not point the shim, or
    the agent, at another file)."""
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB")
    (region / "memslice.region").symlink_to(tmp_path / "elsewhere")
    refused_to_start(run([cbin["alloc_direct"], "10"], env, timeout=30), "cannot use the shared region")
    assert not (tmp_path / "elsewhere").exists()


def test_unfinished_region_waits_for_its_processes(live, cbin):
    """A region with its magic cleared is not initialised again while a process is in it; once none is
    (as when its creator died half-way), the next process starts a fresh one and gets the whole quota."""
    env, path, holder = live
    poke(path, "magic", b"\0\0\0\0")
    refused_to_start(run([cbin["alloc_direct"], "10"], env), "emptied while processes of the container use it")
    holder.kill()
    holder.wait(timeout=30)
    out = run([cbin["alloc_direct"], "1000"], env)
    assert "alloc 1000 MiB -> 0" in out.stdout, out.stdout + out.stderr
    assert read_region(path.parent).devices[0].peak_bytes == 1000 * MiB


@pytest.mark.parametrize("length", [496, 500, 509, 600])
def test_region_dir_too_long_is_refused(length, node, cbin, tmp_path):
    """A directory path that leaves no room for the file name used to be truncated silently (the shim
    then used another file than the one `memslice top` and the agent read)."""
    n = node()
    base = str(tmp_path)
    parts, left = [], length - len(base)
    while left > 0:
        step = min(200, left - 1) if left > 1 else 1
        parts.append("d" * max(step, 1))
        left -= len(parts[-1]) + 1
    region = base + "/" + "/".join(parts)
    region = region[:length] if len(region) > length else region
    os.makedirs(region, exist_ok=True)
    assert len(region) == length
    env = n.container(tmp_path / "unused", "1GiB", MEMSLICE_REGION_DIR=region)
    out = run([cbin["alloc_direct"], "10"], env)
    refused_to_start(out, f"MEMSLICE_REGION_DIR is {length} characters long; the shim supports at most 495")
    assert os.listdir(region) == []

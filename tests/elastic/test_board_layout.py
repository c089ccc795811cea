"""The elastic board's layout is one contract between the shim (interposer/src/elastic_board.h, slotfile.h)
and its readers (memslice.elastic, memslice.slotfile): the C side's offsets and sizes equal the Python side's,
and a slot claimed through slotfile.c reads back through slotfile.py, live, named by the kernel (issue 35.3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import C_DIR

from memslice import slotfile
from memslice.elastic import ANSWER_OFF, ASK_OFF, FILE_SIZE, LIVE_OFF, NOTE_OFF, NOTE_SIZE, SLOT_SIZE, VERSION

SRC = Path(__file__).resolve().parents[2] / "interposer" / "src"


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> str:
    exe = tmp_path_factory.mktemp("probe") / "slotfile_probe"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{SRC}", str(C_DIR / "slotfile_probe.c"),
                    str(SRC / "slotfile.c"), "-o", str(exe)], check=True)
    return str(exe)


def test_the_c_and_python_sides_agree_on_the_layout(probe: str) -> None:
    out = subprocess.run([probe], capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert [int(x) for x in out] == [VERSION, NOTE_OFF, ANSWER_OFF, ASK_OFF, FILE_SIZE, LIVE_OFF, SLOT_SIZE,
                                     NOTE_SIZE, 32, 104]


def test_a_slot_claimed_in_c_reads_back_live_in_python_and_a_read_lock_is_no_owner(probe: str, tmp_path: Path
                                                                                    ) -> None:
    board = tmp_path / "GPU-x.board"
    slotfile.prepare(board, FILE_SIZE)
    # a read lock (all a read-only view allows) on slot 0, held by another process (a process's POSIX locks on
    # a file go when it closes any descriptor of it, as read_slot does)
    squat = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys
fd = os.open({str(board / "00.slot")!r}, os.O_RDONLY)
fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, {LIVE_OFF}, 0)
print("in", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert squat.stdout is not None and squat.stdout.readline() == "in\n"
        assert slotfile.read_slot(board, 0, 8) == (bytes(8), False, 0), "a read lock is not a live owner"
        p = subprocess.Popen([probe, str(board), "hello"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        p.stdout.readline()
        assert p.stdout.readline().strip() == "held 1", "slot 0 cannot be claimed while read-locked; 1 is next"
        assert slotfile.read_slot(board, 1, 5) == (b"hello", True, p.pid)
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=30)
        assert slotfile.read_slot(board, 1, 5) == (b"hello", False, 0), "its lock went with the process"
    finally:
        assert squat.stdin is not None
        squat.stdin.close()
        squat.wait(timeout=30)

"""What per-container elastic figures cost the node agent: one ElasticTracker.poll (every scrape, and every
2 s for swap Events) against the per-GPU figures alone (scan_boards, what the agent did before).

    .venv/bin/python benchmarks/bench_elastic_scrape.py [--json] [--runs N]

A board with 64 live slots (the most a GPU has), each held by its own process, which also holds a slot lock in
one of 8 region files (8 elastic containers of 8 processes): every slot is attributed, so every probe the
agent makes is paid. Then the same with one hostile region of 4096 live slots beside them (the most a tenant
can write). Medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_region_read import region_bytes  # noqa: E402 - a synthetic region file, shared

from memslice.elastic import FILE_SIZE, LIVE_OFF, SLOT_SIZE, scan_boards  # noqa: E402
from memslice.interposer.region import REGION_FILE, layout  # noqa: E402
from memslice.plugin.elastic.metrics import ElasticTracker, region_pid_reader  # noqa: E402
from memslice.plugin.ledger import Allocation  # noqa: E402

HOLDER = """
import fcntl, os, sys
board, slot, region, rslot, base = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
b = os.open(os.path.join(board, "%02d.slot" % slot), os.O_RDWR)
fcntl.lockf(b, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {live}, 0)
r = os.open(region, os.O_RDWR)
fcntl.lockf(r, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, base + rslot, 0)
print("held", flush=True)
sys.stdin.read()
"""


def slot_bytes(pid: int) -> bytes:
    return struct.pack("<IIiI12Q", 0x4C45534D, 2, pid, 2, 256 << 20, 1 << 30, 512 << 20, 256 << 20, 1000, 0,
                       10, 5, 10 ** 8, 10 ** 8, 0, 0).ljust(SLOT_SIZE, b"\0")


def median_ms(fn: object, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--runs", type=int, default=50, help="polls per case (default 50)")
    a = ap.parse_args()
    base = layout().lock_base
    holders: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory() as d:
        root, edir = Path(d) / "regions", Path(d) / "elastic"
        root.mkdir()
        edir.mkdir()
        board = edir / "GPU-bench.board"
        board.mkdir()
        for i in range(64):
            (board / f"{i:02d}.slot").write_bytes(b"\0" * FILE_SIZE)
        ledger = {}
        for c in range(8):
            (root / f"r{c}").mkdir()
            (root / f"r{c}" / REGION_FILE).write_bytes(region_bytes(8))
            ledger[f"r{c}"] = Allocation(f"r{c}", 0, "GPU-bench", (f"g0-{c}",), 1024, 0.0, "ns", f"p{c}", "c",
                                         f"uid{c}", limit_mib=4096)
        try:
            for i in range(64):
                h = subprocess.Popen([sys.executable, "-c", HOLDER.format(live=LIVE_OFF), str(board), str(i),
                                      str(root / f"r{i % 8}" / REGION_FILE), str(i // 8), str(base)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                holders.append(h)
                assert h.stdout is not None and h.stdout.readline() == "held\n"
                (board / f"{i:02d}.slot").write_bytes(slot_bytes(h.pid).ljust(FILE_SIZE, b"\0"))
            tracker = ElasticTracker(edir, lambda: ledger, region_pid_reader(lambda rid: str(root / rid)))
            view = tracker.poll()
            assert len(view.containers) == 8 and not view.unattributed, view.unattributed
            rows = {"per_gpu_only_ms": median_ms(lambda: scan_boards(edir), a.runs),
                    "per_container_ms": median_ms(tracker.poll, a.runs)}
            (root / "hostile").mkdir()
            (root / "hostile" / REGION_FILE).write_bytes(region_bytes(4096))
            ledger["hostile"] = Allocation("hostile", 0, "GPU-bench", ("g0-99",), 1024, 0.0, "ns", "h", "c", "uidh",
                                           limit_mib=4096)
            rows["per_container_with_hostile_region_ms"] = median_ms(tracker.poll, a.runs)
        finally:
            for h in holders:
                if h.stdin is not None:
                    h.stdin.close()
                h.wait(timeout=30)
    if a.json:
        print(json.dumps({"elastic_scrape": rows}, indent=2))
        return 0
    print("One poll of the elastic figures, 64 live tenants on one board, 8 containers (ms, median):")
    for k, v in rows.items():
        print(f"  {k:<40}{v:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

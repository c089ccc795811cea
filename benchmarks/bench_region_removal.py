"""Region-removal benchmark: what a tenant's files in its region directory cost the node agent.

    .venv/bin/python benchmarks/bench_region_removal.py [--json] [--files N] [--runs R]

A region directory holding N empty files (what a tenant can leave in its read-write region mount) is
removed three ways, each on a fresh copy: `shutil.rmtree` (what the reconcile loop did before), and
`RegionStore.remove` (what it does now: one rename into the trash), followed by the Reaper's background
deletion (slices of 2,000 entries). Also: one scrape's bounded walk of the directory (`dir_usage`).
Medians of R runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from memslice.plugin.regions import RegionStore, dir_usage

REGION_ID = "g0-0123456789ab"


def make_region(root: Path, files: int) -> Path:
    d = root / REGION_ID
    d.mkdir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(files):
            os.close(os.open(str(i), os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    return d


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_run(files: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ms-bench-rm-") as tmp:
        root = Path(tmp) / "old"
        root.mkdir()
        d = make_region(root, files)
        out["scrape_walk_ms"] = timed(lambda: dir_usage(d)) * 1e3
        out["rmtree_s"] = timed(lambda: shutil.rmtree(d))
        store = RegionStore(Path(tmp) / "new")
        store.prepare()
        make_region(store.root, files)
        out["remove_ms"] = timed(lambda: store.remove(REGION_ID)) * 1e3
        t0 = time.perf_counter()
        store.reaper.start()
        while store.reaper.pending():
            time.sleep(0.01)
        out["reaper_s"] = time.perf_counter() - t0
        store.reaper.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200_000, help="files in the region directory (200000)")
    ap.add_argument("--runs", type=int, default=3, help="runs; medians are printed (3)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = ap.parse_args()
    runs = [one_run(args.files) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if args.json:
        print(json.dumps({"files": args.files, "runs": args.runs, **med}))
        return
    print(f"region directory with {args.files} files, median of {args.runs}:")
    print(f"  shutil.rmtree (before: in the reconcile loop)  {med['rmtree_s']:8.2f} s")
    print(f"  RegionStore.remove (now: in the loop)         {med['remove_ms']:8.2f} ms")
    print(f"  Reaper, background deletion until empty       {med['reaper_s']:8.2f} s")
    print(f"  one scrape's bounded walk (dir_usage)         {med['scrape_walk_ms']:8.2f} ms")


if __name__ == "__main__":
    main()

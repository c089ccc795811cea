"""Region-read benchmark: what one container's region costs the node agent's scrape and `memslice top`.

    .venv/bin/python benchmarks/bench_region_read.py [--json] [--runs N]

Synthetic region files (16 devices) with 1, 8, 64 and 4096 slots marked live (4096 is the most a tenant can
write: the reader's worst case), read through `memslice.interposer.region.read_region` with and without the
per-process list (the agent's scrape reads without it). Every live slot costs one F_GETLK query. Medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from memslice.interposer.region import REGION_FILE, layout, read_region


def region_bytes(live: int) -> bytes:
    lo = layout()
    ffi = lo.ffi
    buf = bytearray(lo.region_size)
    h = ffi.from_buffer("struct ms_header *", buf)
    h.magic, h.version, h.ndevices, h.slot_hwm = lo.magic, lo.version, lo.max_devices, live
    h.header_size, h.device_size, h.slot_size = lo.header_size, lo.device_size, lo.slot_size
    h.max_devices, h.max_slots = lo.max_devices, lo.max_slots
    devs = ffi.from_buffer("struct ms_device[]", memoryview(buf)[lo.devices_offset:lo.slots_offset])
    for d in range(lo.max_devices):
        ffi.memmove(devs[d].uuid, f"GPU-{d:08d}".encode(), 12)
    slots = ffi.from_buffer("struct ms_slot[]", memoryview(buf)[lo.slots_offset:])
    for i in range(live):
        slots[i].state = lo.slot_live
        slots[i].device_bytes[0] = 1 << 20
    return bytes(buf)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--runs", type=int, default=50, help="reads per case (default 50)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for live in (1, 8, 64, 4096):
            with open(os.path.join(d, REGION_FILE), "wb") as f:
                f.write(region_bytes(live))
            row: dict[str, float | int] = {"live_slots": live}
            for name, procs in (("scrape_ms", False), ("top_ms", True)):
                times = []
                for _ in range(a.runs):
                    t0 = time.perf_counter()
                    read_region(d, with_processes=procs)
                    times.append((time.perf_counter() - t0) * 1000)
                row[name] = round(statistics.median(times), 3)
            rows.append(row)
    if a.json:
        print(json.dumps({"region_read": rows}, indent=2))
        return 0
    print("Reading one region (ms, median): 'scrape' = device figures only (the agent), 'top' = with processes")
    print(f"{'live slots':>10}{'scrape':>10}{'top':>10}")
    for r in rows:
        print(f"{r['live_slots']:>10}{r['scrape_ms']:>10}{r['top_ms']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

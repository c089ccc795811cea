"""`memslice top`: live per-process GPU memory of one or more containers (their region directories)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from memslice.sizes import format_bytes


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="show live GPU memory per process of a container (its region)",
                       description="Show the quota, device and host (spilled) bytes of every process sharing "
                                   "a region. Used is what live processes hold: a killed process's memory stops "
                                   "counting at once. A region that cannot be read is reported and the others "
                                   "are still shown (exit status 1 with --once/--json). REGION_DIR defaults to "
                                   "$MEMSLICE_REGION_DIR.")
    p.add_argument("region_dirs", nargs="*", metavar="REGION_DIR")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--json", action="store_true", help="print one machine-readable snapshot and exit")
    p.add_argument("--interval", type=_interval, default=1.0, metavar="SECONDS",
                   help="refresh period, 0.1 to 3600 (default 1)")
    p.add_argument("--elastic-dir", metavar="DIR",
                   help="also show elastic tenants (resident / swapped-out bytes, active or idle) from this "
                        "arbitration directory (default: $MEMSLICE_ELASTIC_DIR, else `memslice run`'s)")
    p.set_defaults(func=main)


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0.1 <= v <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a refresh period in seconds from 0.1 to 3600 (e.g. 2)")
    return v


def default_elastic_dir() -> str | None:
    """The elastic directory to show: --elastic-dir, $MEMSLICE_ELASTIC_DIR, or `memslice run`'s if it exists."""
    d = os.environ.get("MEMSLICE_ELASTIC_DIR") or os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/memslice-{os.getuid()}", "memslice", "elastic")
    return d if os.path.isdir(d) else None


def elastic_json(tenants: list[Any]) -> list[dict[str, Any]]:
    """The --json form of the elastic tenants: per process and GPU, HBM-resident and swapped-out bytes."""
    return [{"gpu": t.gpu, "pid": t.pid, "state": "swapped-out" if t.swapped_bytes and not t.resident_bytes
             else t.state, "resident_bytes": t.resident_bytes, "swapped_bytes": t.swapped_bytes,
             "request_bytes": t.request_bytes, "limit_bytes": t.limit_bytes,
             "seconds_since_last_call": t.idle_ms / 1000, "swap_outs": t.swap_outs, "swap_ins": t.swap_ins,
             "swap_out_seconds": t.swap_out_seconds, "swap_in_seconds": t.swap_in_seconds} for t in tenants]


def render_elastic(tenants: list[Any]) -> str:
    """The text form of the elastic tenants."""
    if not tenants:
        return "elastic: no tenant"
    lines = [f"elastic  {'PID':>8}  {'STATE':<11} {'RESIDENT':>10} {'SWAPPED':>10} {'REQUEST':>10} {'LIMIT':>10} "
             f"{'IDLE':>8} {'OUT/IN':>9}  GPU"]
    for t in elastic_json(tenants):
        lines.append(f"         {t['pid']:>8}  {t['state']:<11} {format_bytes(t['resident_bytes']):>10} "
                     f"{format_bytes(t['swapped_bytes']):>10} {format_bytes(t['request_bytes']):>10} "
                     f"{format_bytes(t['limit_bytes']):>10} {t['seconds_since_last_call']:>7.1f}s "
                     f"{t['swap_outs']:>4}/{t['swap_ins']:<4}  {t['gpu']}")
    return "\n".join(lines)


def snapshot_json(snap: Any) -> dict[str, Any]:
    """The --json form: devices and processes with device and host bytes. A device's device_bytes is what
    its live processes hold; charged_bytes is the shared total, which still includes the charges of killed
    processes until a shim of the container reclaims them (before it would refuse an allocation)."""
    return {
        "region": snap.path,
        "devices": [{"uuid": d.uuid, "limit_bytes": d.limit_bytes, "device_bytes": d.used_bytes,
                     "host_bytes": d.host_bytes, "peak_bytes": d.peak_bytes, "physical_bytes": d.physical_bytes,
                     "charged_bytes": d.charged_bytes,
                     "refused": d.refused, "spill_refused": d.spill_refused,
                     "spill_ratio": spill_ratio(d.used_bytes, d.host_bytes)} for d in snap.devices],
        "processes": [{"pid": p.pid, "command": p.comm, "alive": p.alive, "device_bytes": p.device_bytes,
                       "host_bytes": p.host_bytes, "peak_bytes": p.peak_bytes, "refused": p.refused,
                       "spill_ratio": spill_ratio(p.device_bytes, p.host_bytes)} for p in snap.processes],
    }


def spill_ratio(device: int, host: int) -> float:
    """Share of a working set that lives in host memory (0 = all on the GPU)."""
    return round(host / (device + host), 4) if device + host else 0.0


def _bar(used: int, limit: int, width: int = 20) -> str:
    if limit <= 0:
        return ""
    filled = min(width, round(width * used / limit))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def render(snaps: list[Any], title: str | None = None) -> str:
    lines: list[str] = []
    if title:
        lines.append(title)
    for snap in snaps:
        lines.append(f"region {snap.path}")
        for d in snap.devices:
            limit = d.limit_bytes or d.physical_bytes
            what = "quota" if d.limit_bytes else "capacity"
            lines.append(f"  {d.uuid}  {format_bytes(d.used_bytes)} of {format_bytes(limit)} {what} "
                         f"{_bar(d.used_bytes, limit)}  host {format_bytes(d.host_bytes)}  "
                         f"peak {format_bytes(d.peak_bytes)}  refused {d.refused}")
        if snap.processes:
            lines.append(f"  {'PID':>8}  {'COMMAND':<16} {'DEVICE':>10} {'HOST':>10} {'SPILL':>6} {'PEAK':>10} "
                         f"{'REFUSED':>7}  STATE")
            for p in sorted(snap.processes, key=lambda p: -p.device_bytes):
                lines.append(f"  {p.pid:>8}  {p.comm[:16]:<16} {format_bytes(p.device_bytes):>10} "
                             f"{format_bytes(p.host_bytes):>10} {spill_ratio(p.device_bytes, p.host_bytes):>6.0%} "
                             f"{format_bytes(p.peak_bytes):>10} {p.refused:>7}  "
                             f"{'running' if p.alive else 'dead (not counted)'}")
        else:
            lines.append("  no process is using the GPU")
    return "\n".join(lines)


def read_all(dirs: list[str]) -> tuple[list[Any], list[str], list[tuple[str, str]]]:
    """(snapshots, directories with no region yet, (directory, problem) of regions that cannot be read).
    One damaged region (its file is the tenant's to write) never hides the others."""
    from memslice.interposer.region import RegionError, read_region

    snaps, missing, errors = [], [], []
    for d in dirs:
        try:
            snap = read_region(d)
        except (RegionError, OSError) as exc:
            errors.append((d, str(exc)))
            continue
        if snap is None:
            missing.append(d)
        else:
            snaps.append(snap)
    return snaps, missing, errors


def main(args: argparse.Namespace) -> int:
    dirs = args.region_dirs or ([os.environ["MEMSLICE_REGION_DIR"]] if os.environ.get("MEMSLICE_REGION_DIR") else [])
    if not dirs:
        print("memslice top: give a REGION_DIR (or set MEMSLICE_REGION_DIR)", file=sys.stderr)
        return 2
    for d in dirs:
        if not os.path.isdir(d):
            print(f"memslice top: {d} is not a directory", file=sys.stderr)
            return 2
    from memslice.elastic import read_boards

    edir = args.elastic_dir or default_elastic_dir()
    while True:
        tenants = read_boards(edir) if edir and os.path.isdir(edir) else []
        present, missing, errors = read_all(dirs)
        if args.json:
            print(json.dumps({"regions": [snapshot_json(s) for s in present], "empty": missing,
                              "errors": [{"region": d, "error": e} for d, e in errors],
                              "elastic": elastic_json(tenants)}, indent=2))
            return 1 if errors else 0
        text = (render(present) + "".join(f"\nregion {d}: no process has used the GPU yet" for d in missing)
                + "".join(f"\nregion {d}: cannot be read: {e}" for d, e in errors)).lstrip("\n")
        if edir:
            text += "\n" + render_elastic(tenants)
        if args.once:
            print(text)
            return 1 if errors else 0
        sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + "memslice top (Ctrl-C to quit)\n" + text + "\n")
        sys.stdout.flush()
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0

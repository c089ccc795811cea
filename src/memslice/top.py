"""`memslice top`: live per-process GPU memory of one or more containers (their region directories)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

from .sizes import format_bytes


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="show live GPU memory per process of a container (its region)",
                       description="Show the quota, device and host (spilled) bytes of every process sharing "
                                   "a region. Used is what live processes hold: a killed process's memory stops "
                                   "counting at once. A region that cannot be read is reported and the others "
                                   "are still shown (exit status 1 with --once/--json). REGION_DIR defaults to "
                                   "$MEMSLICE_REGION_DIR. Elastic memory: per container and GPU, the bytes in GPU "
                                   "memory, swapped out to host memory and spilled to host memory (apart), and "
                                   "per process active/idle/swapped-out and the time since its last CUDA call. "
                                   "A process is put under its container by the kernel's word (who holds its "
                                   "board slot's and its region slot's locks), so run top where it sees the "
                                   "processes' PIDs (on a node: the host PID namespace).")
    p.add_argument("region_dirs", nargs="*", metavar="REGION_DIR")
    p.add_argument("--region-root", metavar="DIR",
                   help="show every container of a node: each region directory under DIR (the node agent's "
                        "--region-root, /var/lib/memslice/regions), named by the agent's records (namespace/pod/"
                        "container); the elastic directory defaults to 'elastic' beside it")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--json", action="store_true", help="print one machine-readable snapshot and exit")
    p.add_argument("--interval", type=_interval, default=1.0, metavar="SECONDS",
                   help="refresh period, 0.1 to 3600 (default 1)")
    p.add_argument("--elastic-dir", metavar="DIR",
                   help="also show elastic tenants (resident / swapped-out bytes, active or idle) from this "
                        "arbitration directory (default: $MEMSLICE_ELASTIC_DIR, else `memslice run`'s)")
    p.add_argument("--compute-dir", metavar="DIR",
                   help="also show compute shares (request, limit, share achieved, time throttled at the "
                        "limit and waiting for neighbours, per container and GPU) from this directory (default: "
                        "'compute' beside --region-root, else $MEMSLICE_COMPUTE_DIR or `memslice run`'s)")
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


def tenant_json(t: Any, region: str | None = None) -> dict[str, Any]:
    """One elastic process: its state (active, idle, swapped-out), bytes in GPU and host memory, time since its
    last CUDA call, swaps; `region` is its container's region directory when the kernel says whose it is."""
    return {"gpu": t.gpu, "pid": t.pid, "host_pid": t.owner_pid or None, "region": region, "state": t.shown_state,
            "resident_bytes": t.resident_bytes, "swapped_bytes": t.swapped_bytes,
            "request_bytes": t.request_bytes, "limit_bytes": t.limit_bytes,
            "seconds_since_last_call": t.idle_ms / 1000, "swap_outs": t.swap_outs, "swap_ins": t.swap_ins,
            "swap_out_seconds": t.swap_out_seconds, "swap_in_seconds": t.swap_in_seconds,
            "asks": t.asks, "asked_bytes": t.asked_mib << 20, "moved_for_asks_bytes": t.got_mib << 20,
            **host_note_json(t.note)}


def host_note_json(n: Any) -> dict[str, Any]:
    """Moves a process could not take to host memory, by cause, its bursts failed for a neighbour's refusal,
    and the cause of its last refusal with the figures it read."""
    if n is None:
        return {"refused_to_host": {"cgroup": 0, "host": 0}, "bursts_failed": 0, "last_refusal": None}
    last = {"cause": n.cause, "bytes": n.want_mib << 20, "limit_bytes": n.limit_bytes,
            "used_bytes": n.used_bytes} if n.cause else None
    return {"refused_to_host": {"cgroup": n.refused_cgroup, "host": n.refused_host},
            "bursts_failed": n.bursts_failed, "last_refusal": last}


def elastic_json(tenants: list[Any], region_of: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """The --json form of the elastic tenants: per process and GPU, HBM-resident and swapped-out bytes."""
    region_of = region_of or {}
    return [tenant_json(t, region_of.get(t.owner_pid) if t.owner_pid > 0 else None) for t in tenants]


def container_elastic(snap: Any, tenants: list[Any]) -> list[dict[str, Any]]:
    """Per GPU of one container (its region snapshot and its attributed elastic processes): bytes in GPU memory
    (what the container's live processes charged, less what is swapped out), elastic bytes resident and
    swapped out (the board), and bytes spilled to host memory (oversubscription, the region) - apart."""
    out = []
    for d in snap.devices:
        mine = [t for t in tenants if t.gpu == d.uuid]
        swapped = sum(t.swapped_bytes for t in mine)
        out.append({"gpu": d.uuid, "device_bytes": max(d.used_bytes - swapped, 0),
                    "elastic_resident_bytes": sum(t.resident_bytes for t in mine), "swapped_bytes": swapped,
                    "spilled_bytes": d.host_bytes, "processes": [tenant_json(t, snap.path) for t in mine]})
    return out


def render_elastic(tenants: list[Any], title: str = "elastic") -> str:
    """The text form of elastic tenants (those of no container shown, or all of them)."""
    if not tenants:
        return f"{title}: no tenant"
    lines = [f"{title}", f"  {'PID':>8}  {'STATE':<11} {'RESIDENT':>10} {'SWAPPED':>10} {'REQUEST':>10} "
             f"{'LIMIT':>10} {'IDLE':>8} {'OUT/IN':>9} {'ASKED':>10} {'MOVED':>10}  GPU"]
    for t in elastic_json(tenants):
        lines.append(f"  {t['pid']:>8}  {t['state']:<11} {format_bytes(t['resident_bytes']):>10} "
                     f"{format_bytes(t['swapped_bytes']):>10} {format_bytes(t['request_bytes']):>10} "
                     f"{format_bytes(t['limit_bytes']):>10} {t['seconds_since_last_call']:>7.1f}s "
                     f"{t['swap_outs']:>4}/{t['swap_ins']:<4} {format_bytes(t['asked_bytes']):>10} "
                     f"{format_bytes(t['moved_for_asks_bytes']):>10}  {t['gpu']}")
    return "\n".join(lines)


def region_of_pids(snaps: list[Any]) -> dict[int, str]:
    """Kernel-named PID -> the region (container) whose slot lock it holds (memslice.elastic.owners)."""
    from .elastic import owners

    return owners({s.path: s.owner_pids for s in snaps})


def snapshot_json(snap: Any, owner: dict[str, str] | None = None, tenants: list[Any] | None = None
                  ) -> dict[str, Any]:
    """The --json form: devices and processes with device and host bytes. A device's device_bytes is what
    its live processes hold; charged_bytes is the shared total, which still includes the charges of killed
    processes until a shim of the container reclaims them (before it would refuse an allocation)."""
    return {
        "region": snap.path,
        "devices": [{"uuid": d.uuid, "limit_bytes": d.limit_bytes, "device_bytes": d.used_bytes,
                     "host_bytes": d.host_bytes, "peak_bytes": d.peak_bytes, "physical_bytes": d.physical_bytes,
                     "charged_bytes": d.charged_bytes, "context_cost_bytes": d.context_cost_bytes,
                     "driver_taken_bytes": d.driver_taken_bytes,
                     "refused": d.refused, "spill_refused": d.spill_refused,
                     "spill_ratio": spill_ratio(d.used_bytes, d.host_bytes)} for d in snap.devices],
        "processes": [{"pid": p.pid, "command": p.comm, "alive": p.alive, "device_bytes": p.device_bytes,
                       "host_bytes": p.host_bytes, "peak_bytes": p.peak_bytes, "refused": p.refused,
                       "spill_ratio": spill_ratio(p.device_bytes, p.host_bytes)} for p in snap.processes],
        "owner": owner,
        "elastic": container_elastic(snap, tenants or []),
    }


def spill_ratio(device: int, host: int) -> float:
    """Share of a working set that lives in host memory (0 = all on the GPU)."""
    return round(host / (device + host), 4) if device + host else 0.0


def _bar(used: int, limit: int, width: int = 20) -> str:
    if limit <= 0:
        return ""
    filled = min(width, round(width * used / limit))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def refused_text(d: Any) -> str:
    """A device's refused allocations, as its processes count them: over the quota, plus those the host
    spill cap (or the cgroup margin) refused under oversubscription, which are named apart."""
    total = d.refused + d.spill_refused
    return f"{total} ({d.spill_refused} by the host spill cap)" if d.spill_refused else str(total)


def render(snaps: list[Any], title: str | None = None, owners: dict[str, dict[str, str]] | None = None,
           tenants: dict[str, list[Any]] | None = None) -> str:
    """Text: each region (container), its devices, its processes (with their elastic state when they have
    one), and per GPU its bytes in GPU memory, swapped out and spilled."""
    lines: list[str] = []
    if title:
        lines.append(title)
    owners, tenants = owners or {}, tenants or {}
    for snap in snaps:
        o = owners.get(snap.path)
        lines.append(f"region {snap.path}" + (f"  ({o['namespace']}/{o['pod']}/{o['container']})" if o else ""))
        mine = tenants.get(snap.path, [])
        by_host_pid = {t.owner_pid: t for t in mine}
        for d in snap.devices:
            limit = d.limit_bytes or d.physical_bytes
            what = "quota" if d.limit_bytes else "capacity"
            lines.append(f"  {d.uuid}  {format_bytes(d.used_bytes)} of {format_bytes(limit)} {what} "
                         f"{_bar(d.used_bytes, limit)}  host {format_bytes(d.host_bytes)}  "
                         f"peak {format_bytes(d.peak_bytes)}  refused {refused_text(d)}")
            if d.context_cost_bytes or d.driver_taken_bytes:
                lines.append(f"    a context takes {format_bytes(d.context_cost_bytes)} (measured); the driver "
                             f"holds {format_bytes(d.driver_taken_bytes)} of the use outside allocations "
                             f"(contexts, limits, modules)")
        if snap.processes:
            lines.append(f"  {'PID':>8}  {'COMMAND':<16} {'DEVICE':>10} {'HOST':>10} {'SPILL':>6} {'PEAK':>10} "
                         f"{'REFUSED':>7}  STATE")
            for p in sorted(snap.processes, key=lambda p: -p.device_bytes):
                t = by_host_pid.get(p.owner_pid) if p.alive and p.owner_pid > 0 else None
                state = ("running" if p.alive else "dead (not counted)") if t is None else (
                    f"{t.shown_state}, last CUDA call {t.idle_ms / 1000:.1f}s ago")
                lines.append(f"  {p.pid:>8}  {p.comm[:16]:<16} {format_bytes(p.device_bytes):>10} "
                             f"{format_bytes(p.host_bytes):>10} {spill_ratio(p.device_bytes, p.host_bytes):>6.0%} "
                             f"{format_bytes(p.peak_bytes):>10} {p.refused:>7}  {state}")
        else:
            lines.append("  no process is using the GPU")
        for e in container_elastic(snap, mine):
            if e["processes"]:
                lines.append(f"  elastic on {e['gpu']}: {format_bytes(e['device_bytes'])} in GPU memory, "
                             f"{format_bytes(e['swapped_bytes'])} swapped out to host memory, "
                             f"{format_bytes(e['spilled_bytes'])} spilled to host memory; swaps "
                             f"{sum(p['swap_outs'] for p in e['processes'])} out "
                             f"{sum(p['swap_ins'] for p in e['processes'])} in; asked neighbours for "
                             f"{format_bytes(sum(p['asked_bytes'] for p in e['processes']))}, they moved "
                             f"{format_bytes(sum(p['moved_for_asks_bytes'] for p in e['processes']))}"
                             + refusals_text(e["processes"]))
    return "\n".join(lines)


def refusals_text(procs: list[dict[str, Any]]) -> str:
    """The text suffix for a container whose processes refused moves to host memory."""
    cg = sum(p["refused_to_host"]["cgroup"] for p in procs)
    host = sum(p["refused_to_host"]["host"] for p in procs)
    failed = sum(p["bursts_failed"] for p in procs)
    out = ""
    if cg or host:
        out += f"; could not take memory to host memory {cg} time(s) for its cgroup, {host} for the host's memory"
    if failed:
        out += f"; {failed} burst(s) failed: a neighbour could not take its memory to host memory"
    return out


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


REGION_ID = re.compile(r"g\d{1,4}-[0-9a-f]{12}\Z")  # the node agent's region IDs (plugin/ledger.py)
MAX_RECORD = 64 << 10


def root_regions(root: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(region directories under a node agent's region root, region file -> its owner from the agent's
    record). Only names of the agent's form are taken (at most 4096); a record that cannot be read or is not
    the agent's shape names no owner."""
    dirs, owner = [], {}
    try:
        names = sorted(n for n in os.listdir(root) if REGION_ID.match(n))[:4096]
    except OSError:
        return [], {}
    for name in names:
        d = os.path.join(root, name)
        if os.path.islink(d) or not os.path.isdir(d):
            continue
        dirs.append(d)
        try:
            with open(os.path.join(root, name + ".json"), "rb") as f:
                rec = json.loads(f.read(MAX_RECORD))
            who = {k: rec[k] for k in ("namespace", "pod", "container")}
            if all(isinstance(v, str) and v for v in who.values()):
                owner[os.path.join(d, "memslice.region")] = who  # keyed like a snapshot's path
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return dirs, owner


def compute_owners(root: str) -> dict[tuple[str, int], str]:
    """(GPU uuid, compute slot) -> "namespace/pod/container" from the node agent's region records (bounded as
    root_regions reads them); a record that is not the agent's shape names nobody."""
    out: dict[tuple[str, int], str] = {}
    try:
        names = sorted(n for n in os.listdir(root) if n.endswith(".json") and REGION_ID.match(n[:-5]))[:4096]
    except OSError:
        return {}
    for name in names:
        try:
            with open(os.path.join(root, name), "rb") as f:
                rec = json.loads(f.read(MAX_RECORD))
            slot, uuid = rec.get("compute_slot", -1), rec["gpu_uuid"]
            more = rec.get("more_gpus") or []  # a container spanning GPUs: the same slot on each
            uuids = [uuid, *(m[1] for m in more[:16] if isinstance(m, list) and len(m) == 2)]
            if isinstance(slot, int) and slot >= 0 and all(isinstance(u, str) for u in uuids):
                for u in uuids:
                    out[(u, slot)] = "/".join(str(rec[k]) for k in ("namespace", "pod", "container"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return out


def compute_json(cdir: str, owners: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """Every slot of every GPU directory under `cdir` (at most 1024), the roster's figures bounding the
    tenants' (memslice.compute.read_gpu); a directory that cannot be read is skipped."""
    from .compute import ComputeShareError, read_gpu

    out = []
    try:
        gpus = sorted(n for n in os.listdir(cdir) if not n.startswith("."))[:1024]
    except OSError:
        return []
    for uuid in gpus:
        try:
            figures = read_gpu(cdir, uuid)
        except (OSError, ComputeShareError):
            continue
        out += [{"gpu": uuid, "slot": f.slot, "owner": owners.get((uuid, f.slot), ""), "request": f.request,
                 "limit": f.limit, "priority": f.priority, "share_pct": round(f.share_pct, 1),
                 "used_s": round(f.used_s, 3), "throttled_s": round(f.throttled_s, 3),
                 "waited_s": round(f.waited_s, 3), "processes": f.processes} for f in figures]
    return out


def render_compute(rows: list[dict[str, Any]]) -> str:
    """One line per compute slot: who, share achieved of request:limit, and where the time went."""
    if not rows:
        return "compute: no container has a compute share"
    lines = ["compute (percent of one GPU; share = achieved over the shim's recent window)"]
    for r in rows:
        lim = f"{r['limit']}" if r["limit"] is not None else "-"
        lines.append(f"  {r['gpu'][:16]} slot {r['slot']:2d} {r['owner'] or '(slot ' + str(r['slot']) + ')'}: "
                     f"share {r['share_pct']:5.1f}% of request {r['request']}% limit {lim}; used {r['used_s']:.1f} s,"
                     f" throttled {r['throttled_s']:.1f} s, waiting {r['waited_s']:.1f} s, "
                     f"{r['processes']} process(es)")
    return "\n".join(lines)


REGION_FILES = ("memslice.region", "memslice.limits")


def region_dir_problem(d: str) -> str | None:
    """Why `d` is not a region directory (None if it is one): a region directory holds memslice.region (once a
    process has used the GPU) or memslice.limits (memslice run writes it first), or is empty (the node agent
    made it at Allocate, no process ran yet)."""
    if not os.path.isdir(d):
        return f"{d} is not a directory; give the --region-dir of `memslice run` (or a container's region)"
    try:
        names = os.listdir(d)
    except OSError as exc:
        return f"{d} cannot be listed: {exc.strerror}"
    if names and not any(n in names for n in REGION_FILES):
        return (f"{d} is not a memslice region directory (it has neither {' nor '.join(REGION_FILES)}); give the "
                "--region-dir of `memslice run`, or --region-root for a node agent's regions")
    return None


def elastic_text(unknown: list[Any], present: bool, asked: bool) -> str:
    """The elastic processes no region shown accounts for; nothing when there are none, unless the elastic
    directory was asked for (--elastic-dir) and nothing else is shown."""
    if unknown:
        return render_elastic(unknown, "elastic processes of no region shown" if present else "elastic")
    return "" if present or not asked else render_elastic([], "elastic")


def main(args: argparse.Namespace) -> int:
    owners: dict[str, dict[str, str]] = {}
    dirs = list(args.region_dirs)
    found: list[str] = []
    if args.region_root:
        if not os.path.isdir(args.region_root):
            print(f"memslice top: --region-root {args.region_root} is not a directory", file=sys.stderr)
            return 2
        found, owners = root_regions(args.region_root)
        dirs += found
    if not dirs and not args.region_root:
        dirs = [os.environ["MEMSLICE_REGION_DIR"]] if os.environ.get("MEMSLICE_REGION_DIR") else []
    if not dirs and not args.region_root:
        print("memslice top: give a REGION_DIR (or set MEMSLICE_REGION_DIR, or --region-root)", file=sys.stderr)
        return 2
    for d in dirs[:len(dirs) - len(found)]:  # those found under --region-root are the agent's own regions
        problem = region_dir_problem(d)
        if problem:
            print(f"memslice top: {problem}", file=sys.stderr)
            return 2
    from .elastic import attribute, scan_boards

    edir = args.elastic_dir or (os.path.join(os.path.dirname(os.path.abspath(args.region_root)), "elastic")
                                if args.region_root else None) or default_elastic_dir()
    from .compute import default_dir as default_compute_dir

    cdir = args.compute_dir or (os.path.join(os.path.dirname(os.path.abspath(args.region_root)), "compute")
                                if args.region_root else None) or default_compute_dir(os.environ)
    cowners = compute_owners(args.region_root) if args.region_root else {}
    while True:
        crows = compute_json(cdir, cowners) if os.path.isdir(cdir) else []
        scan = scan_boards(edir) if edir and os.path.isdir(edir) else None
        present, missing, errors = read_all(dirs)
        region_of = region_of_pids(present)
        tenants = scan.tenants if scan else []
        mine, unknown = attribute(tenants, region_of)
        board_errors = scan.errors if scan else []
        bad = bool(errors or board_errors)
        if args.json:
            print(json.dumps({"regions": [snapshot_json(s, owners.get(s.path), mine.get(s.path)) for s in present],
                              "empty": missing,
                              "errors": [{"region": d, "error": e} for d, e in errors]
                              + [{"board": b, "error": e} for b, e in board_errors],
                              "elastic": elastic_json(tenants, region_of), "compute": crows}, indent=2))
            return 1 if bad else 0
        text = (render(present, owners=owners, tenants=mine)
                + "".join(f"\nregion {d}: no process has used the GPU yet" for d in missing)
                + "".join(f"\nregion {d}: cannot be read: {e}" for d, e in errors)).lstrip("\n")
        if edir:
            extra = elastic_text(unknown, bool(present or missing or errors), bool(args.elastic_dir))
            text += ("\n" + extra if extra else "") + "".join(f"\nboard {b}: cannot be read: {e}"
                                                             for b, e in board_errors)
        if crows or args.compute_dir:
            text += "\n" + render_compute(crows)
        if args.once:
            print(text)
            return 1 if bad else 0
        sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + "memslice top (Ctrl-C to quit)\n" + text + "\n")
        sys.stdout.flush()
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0

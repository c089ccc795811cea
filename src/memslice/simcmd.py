"""`memslice sim`: controls of the simulated GPU (inject an Xid, show physical usage)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sim", help="control the simulated GPU (Xid events, physical usage)",
                       description="The simulated GPU stands in for the NVIDIA driver on machines without one. "
                                   "Its node state lives in the file named by MEMSLICE_SIM_STATE.")
    ss = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND", required=True)
    x = ss.add_parser("xid", help="inject an Xid critical-error event on a simulated GPU")
    x.add_argument("--gpu", type=int, required=True, help="GPU index")
    x.add_argument("--xid", type=int, required=True, help="Xid number (e.g. 79: GPU fell off the bus)")
    x.add_argument("--state", help="state file (default: $MEMSLICE_SIM_STATE)")
    x.set_defaults(func=xid)
    s = ss.add_parser("status", help="physical usage of the simulated node")
    s.add_argument("--state", help="state file (default: $MEMSLICE_SIM_STATE)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=status)


def _state(args: argparse.Namespace) -> str | None:
    state = args.state or os.environ.get("MEMSLICE_SIM_STATE")
    if not state:
        print("memslice sim: no state file; pass --state PATH or set MEMSLICE_SIM_STATE", file=sys.stderr)
    return state


def xid(args: argparse.Namespace) -> int:
    from .simulator import inject_xid

    state = _state(args)
    if not state:
        return 2
    if not os.path.exists(state):
        print(f"memslice sim: {state} does not exist (no simulated process has run with it yet)", file=sys.stderr)
        return 2
    try:
        inject_xid(args.gpu, args.xid, state)
    except ValueError as exc:
        print(f"memslice sim: {exc}", file=sys.stderr)
        return 2
    return 0


def status(args: argparse.Namespace) -> int:
    from memslice.interposer.region import RegionError, read_region_file

    from .top import render

    state = _state(args)
    if not state:
        return 2
    from .simulator import usage_path

    try:
        snap = read_region_file(usage_path(state))
    except RegionError as exc:
        print(f"memslice sim: {exc}", file=sys.stderr)
        return 1
    if snap is None:
        print(f"memslice sim: {state} does not exist yet", file=sys.stderr)
        return 2
    if args.json:
        from .top import snapshot_json

        print(json.dumps(snapshot_json(snap), indent=2))
    else:
        print(render([snap], title="simulated node (physical usage)"))
    return 0

"""`memslice sim`: controls of the simulated GPU (inject an Xid, show physical usage and topology)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sim", help="control the simulated GPU (Xid events, physical usage)",
                       description="The simulated GPU stands in for the NVIDIA driver on machines without one. "
                                   "Its node state lives in a state file: --state, else $MEMSLICE_SIM_STATE, else "
                                   "the one this user's simulated processes made (`memslice run --simulate-gpu` "
                                   "makes one per GPU list in the temporary directory and prints it with -v).",
                       epilog=SUBCOMMANDS_TEXT, formatter_class=argparse.RawDescriptionHelpFormatter)
    ss = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    p.set_defaults(func=no_subcommand)
    x = ss.add_parser("xid", help="inject an Xid critical-error event on a simulated GPU")
    x.add_argument("--gpu", type=int, required=True, help="GPU index (0 for the first)")
    x.add_argument("--xid", type=int, required=True, help="Xid number (e.g. 79: GPU fell off the bus; 48: double-bit "
                                                          "ECC error)")
    x.add_argument("--state", help=STATE_HELP)
    x.set_defaults(func=xid)
    s = ss.add_parser("status", help="physical usage of the simulated node")
    s.add_argument("--state", help=STATE_HELP)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=status)
    t = ss.add_parser("topo", help="how the simulated GPUs are connected (as nvidia-smi topo -m shows it)")
    t.add_argument("--state", help=STATE_HELP)
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=topo)


STATE_HELP = "state file (default: $MEMSLICE_SIM_STATE, else this user's only simulated node)"
SUBCOMMANDS_TEXT = """subcommands:
  xid     inject an Xid critical-error event on a simulated GPU: memslice sim xid --gpu 0 --xid 79
  status  physical usage of the simulated node: memslice sim status
  topo    how its GPUs are connected (MEMSLICE_SIM_GPUS ;nvlink= ;pcie=): memslice sim topo"""
MAX_XID = 1 << 16  # Xid numbers in use are below 200; a larger one is a typo


def no_subcommand(args: argparse.Namespace) -> int:
    """`memslice sim` alone: name the subcommands rather than argparse's bare 'required: SUBCOMMAND'."""
    print("memslice sim: name a subcommand\n" + SUBCOMMANDS_TEXT, file=sys.stderr)
    return 2


def _state(args: argparse.Namespace) -> str | None:
    """The simulated node to act on: --state, $MEMSLICE_SIM_STATE, else this user's one simulated node. None
    (with the reason and the fix printed) when there is none, or several to choose from."""
    from .simulator import state_files

    state = args.state if args.state is not None else os.environ.get("MEMSLICE_SIM_STATE")
    if state is not None:
        if not state.strip():
            print("memslice sim: the state file's path is empty; pass --state PATH (see `memslice run -v "
                  "--simulate-gpu ...`)", file=sys.stderr)
            return None
        return state
    found = state_files()
    if len(found) == 1:
        return found[0]
    if not found:
        print("memslice sim: no simulated GPU has run yet for this user: start one first, e.g. `memslice run "
              "--gpu-mem 4GiB --simulate-gpu 16GiB -- python3 ...`, or pass --state PATH", file=sys.stderr)
    else:
        print("memslice sim: this user has several simulated nodes; choose one with --state:\n  "
              + "\n  ".join(found), file=sys.stderr)
    return None


def xid(args: argparse.Namespace) -> int:
    from .simulator import inject_xid

    if args.gpu < 0:
        print(f"memslice sim: --gpu {args.gpu}: GPU indices start at 0", file=sys.stderr)
        return 2
    if not 0 < args.xid < MAX_XID:
        print(f"memslice sim: --xid {args.xid} is not an Xid: they are positive numbers below {MAX_XID} (e.g. 79: GPU "
              "fell off the bus, 48: double-bit ECC error)", file=sys.stderr)
        return 2
    state = _state(args)
    if not state:
        return 2
    if os.path.isdir(state):
        print(f"memslice sim: --state {state} is a directory; name the state file in it", file=sys.stderr)
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


def topo(args: argparse.Namespace) -> int:
    from .simulator import read_topology, render_topology

    state = _state(args)
    if not state:
        return 2
    if not os.path.isfile(state):
        print(f"memslice sim: {state} does not exist (no simulated process has run with it yet)", file=sys.stderr)
        return 2
    try:
        got = read_topology(state)
    except (ValueError, OSError) as exc:
        print(f"memslice sim: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(got) if args.json else render_topology(got))
    return 0

"""`memslice paths`: where the built libraries are."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("paths", help="print where the shim and the simulated GPU libraries are")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from .paths import LibraryMissing, lib_paths

    try:
        paths = lib_paths().as_dict()
    except LibraryMissing as exc:
        print(f"memslice paths: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(paths, indent=2))
    else:
        for k, v in paths.items():
            print(f"{k:9} {v}")
    return 0

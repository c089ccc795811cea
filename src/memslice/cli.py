"""The `memslice` command. Each subcommand lives in its own module; heavy imports happen inside handlers
so that `memslice run` starts fast."""

from __future__ import annotations

import argparse
import importlib
import sys

from memslice import __version__, errors

# subcommand -> module that provides `add_parser(subparsers)`; the module sets `func` on its parser.
SUBCOMMANDS = {
    "run": "memslice.run",
    "top": "memslice.top",
    "paths": "memslice.pathscmd",
    "demo": "memslice.demo",
    "sim": "memslice.simcmd",
    "node-agent": "memslice.plugin.cli",
    "extender": "memslice.scheduler_extender.cli",
    "extender-certs": "memslice.extender_certs",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` (a subcommand's name) just that subcommand: each subcommand's
    module is imported to build its parser, and `memslice extender` need not import the node agent's or the
    demo's (tens of ms of a restart that issue 15 bounds)."""
    parser = argparse.ArgumentParser(
        prog="memslice",
        description="GPU memory slicing: run processes under a GPU-memory quota, inspect usage, "
                    "and run the Kubernetes node agent and scheduler extender.")
    parser.add_argument("--version", action="version", version=f"memslice {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue  # component not built yet
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except errors.MemsliceError as exc:
        # A refusal memslice makes on purpose is one line naming the problem and the fix, never a traceback.
        print(f"memslice {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, errors.ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())

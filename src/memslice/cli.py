"""The `memslice` command. Each subcommand lives in its own module; heavy imports happen inside handlers
so that `memslice run` starts fast."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from . import __version__, errors

# The kubernetes package imports its dynamic client, which imports kubernetes-validate where that is installed (it
# is in the test extra, so in every development venv); with it come jsonschema and rfc3987-syntax, which compiles
# a grammar as it is imported: 2.5 s of CPU in each memslice process that talks to the API server, for a
# validator memslice never calls. None in sys.modules makes that optional import fail as if the package were
# absent, as it is in the image. Here, not in __main__, so that the installed `memslice` command (whose
# console script imports this module) gets it as well as `python -m memslice`.
sys.modules.setdefault("kubernetes_validate", None)  # type: ignore[arg-type]

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
    demo's (tens of ms of a restart, whose time is bounded)."""
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


# Options whose value is a size: `--gpu-mem -1GiB` would otherwise read -1GiB as an option ("expected one
# argument"); joined as --gpu-mem=-1GiB, the size check names the value and the fix.
SIZE_OPTIONS = ("--gpu-mem", "--gpu-mem-request", "--simulate-gpu")


def join_dash_values(argv: list[str]) -> list[str]:
    """argv with `--size-option -VALUE` written as `--size-option=-VALUE` (before any `--`)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return out + argv[i:]
        if a in SIZE_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1] != "--":
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def near_option(sub: argparse.ArgumentParser, extras: list[str]) -> bool:
    """Whether an unplaced argument is a near miss of one of the subcommand's options (`--verbsoe`): then the
    nearest option is the answer, before any subcommand-specific explanation."""
    options = [o for action in sub._actions for o in action.option_strings if o.startswith("--")]
    return any(e.startswith("--") and difflib.get_close_matches(e.split("=", 1)[0], options, n=1, cutoff=0.75)
               for e in extras)


def unknown_options_message(sub: argparse.ArgumentParser, extras: list[str]) -> str:
    """What a subcommand says about arguments it does not take: each one, with the nearest option it has."""
    options = [o for action in sub._actions for o in action.option_strings if o.startswith("--")]
    parts = []
    for e in extras:
        near = difflib.get_close_matches(e.split("=", 1)[0], options, n=1, cutoff=0.6) if e.startswith("-") else []
        parts.append(f"{e!r} (did you mean {near[0]}?)" if near else repr(e))
    return f"unrecognized arguments: {', '.join(parts)}; see `{sub.prog} --help`"


def misspelled_option(sub: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """An option written with underscores or capitals (`--gpu_mem 4096`) that names one the subcommand has:
    argparse would only say that the real one is missing. Options after `--` or after the first word that is
    neither an option nor an option's value (a command's own) are not looked at."""
    actions = {o: action for action in sub._actions for o in action.option_strings if o.startswith("--")}
    args = iter(argv[1:])
    for a in args:
        if a == "--" or not a.startswith("--"):
            return None
        name = a.split("=", 1)[0]
        known = actions.get(name)
        if known is not None:
            if "=" not in a and known.nargs is None:
                next(args, None)  # its value
            continue
        fixed = name.replace("_", "-").lower()
        if fixed in actions:
            return f"unrecognized option {name!r}: did you mean {fixed}? (options use dashes); see `{sub.prog} --help`"
    return None


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(command)
            return found if isinstance(found, argparse.ArgumentParser) else None
    return None


def run_command(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except errors.MemsliceError as exc:
        # A refusal memslice makes on purpose is one line naming the problem and the fix, never a traceback.
        print(f"memslice {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, errors.ConfigError) else 1


def main(argv: list[str] | None = None) -> int:
    argv = join_dash_values(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        near = difflib.get_close_matches(argv[0], list(SUBCOMMANDS), n=1, cutoff=0.6)
        hint = f"did you mean `memslice {near[0]}`? " if near else ""
        build_parser().error(f"{argv[0]!r} is not a memslice command; {hint}the commands are: {', '.join(SUBCOMMANDS)}")
    parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    if argv and argv[0] in SUBCOMMANDS:
        sub = subparser(parser, argv[0])
        wrong = misspelled_option(sub, argv) if sub is not None else None
        if sub is not None and wrong:
            sub.error(wrong)
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = subparser(parser, args.command) if getattr(args, "command", None) else None
        if sub is None:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        # a subcommand may know better (`memslice run` without `--`: the command read as an option's value)
        explain = getattr(args, "explain_extras", None) if not near_option(sub, extras) else None
        sub.error((explain(args, extras) if explain else None) or unknown_options_message(sub, extras))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = run_command(args)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # The reader went away (`memslice top --once | head`): not an error of ours; no traceback, and no
        # second one when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command killed by it


if __name__ == "__main__":
    sys.exit(main())

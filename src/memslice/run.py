"""`memslice run`: run any command under a GPU-memory quota (optionally on the simulated GPU)."""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from . import compute
from .limits import LIMITS_FILE, Limits
from .limits import write as write_limits
from .sizes import _UNITS, SizeError, format_bytes, parse_size

# A quota above this is a typo (999999TiB), not a GPU: no GPU made has a tenth of it.
MAX_GPU_MEM = 16 << 40
SEPARATOR_HINT = ("memslice run reads its options up to the command: put `--` before the command "
                  "(memslice run --gpu-mem 4GiB -- CMD ARGS)")
# Unit words that a size split in two (`--gpu-mem 4 GiB`) leaves as the first word of the command.
UNIT_WORDS = {u for u in _UNITS if u} | {"KB", "MB", "GB", "TB", "K", "M", "G", "T", "kB", "Kb", "Mb", "Gb"}

EPILOG = """\
examples:
  memslice run --gpu-mem 4GiB -- python train.py
  memslice run --gpu-mem 4096 --simulate-gpu 16GiB -- python -c 'import pynvml'
  memslice run --gpu-mem 8GiB --oversubscribe=16GiB -- jupyter lab
  memslice run --gpu-mem 12GiB --gpu-mem-request 2GiB -- jupyter lab   # elastic: 2 GiB guaranteed
  memslice run --gpu-mem 4GiB --gpu-compute 30 -- python serve.py       # 30% of the GPU under contention
  memslice run --gpu-mem 4GiB --gpu-compute 20:40 -- python train.py    # 20% guaranteed, never over 40%
  memslice run --gpus 2 --gpu-mem 8GiB -- python serve.py --tp 2       # GPUs 0 and 1, 8 GiB on each
  memslice run --gpus 0,2 --gpu-mem 8GiB --simulate-gpu '16GiB,16GiB,16GiB;nvlink=0-2' -- python p2p.py

Several GPUs (--gpus N for the first N, or a list of indices such as 0,2, or all): CMD sees those GPUs
(CUDA_VISIBLE_DEVICES, in that order; CUDA_DEVICE_ORDER=PCI_BUS_ID so indices are nvidia-smi's) and the quota
holds on each of them apart: --gpus 2 --gpu-mem 8GiB is 8 GiB on each GPU. Without --gpus CMD sees the GPUs
its environment shows it, each under the quota.

All processes started by CMD share one quota (one region directory). Going over it makes the CUDA
allocation fail with CUDA_ERROR_OUT_OF_MEMORY and prints one line on stderr; with --oversubscribe the
excess is served from host memory instead (up to SIZE, default: bounded only by the memory cgroup;
--oversubscribe=0 spills nothing). Watch usage with `memslice top REGION_DIR` (use --region-dir to
choose it).

The limits are written to REGION_DIR/memslice.limits (read-only) before CMD starts, and the shim takes
them from there: a process of CMD that changes or unsets MEMSLICE_GPU_MEM_LIMIT (or the other
MEMSLICE_* limits) is still held to them. MEMSLICE_CONTEXT_RESERVE, if set when `memslice run` starts,
is written there too. This guards against accidents, not against you: the file is yours.

Elastic memory (--gpu-mem-request below --gpu-mem): the request is guaranteed in HBM, the limit is what
CMD may hold and what frameworks see as the GPU's size. Above the request CMD uses free HBM, else host
memory; when CMD has made no CUDA call for --idle-after seconds and another session on the same GPU needs
HBM, CMD's GPU memory moves to host memory (pointers unchanged) and comes back when it runs again. All
sessions of this user share one arbitration directory per machine (MEMSLICE_ELASTIC_DIR, default
$XDG_RUNTIME_DIR/memslice/elastic or /tmp/memslice-UID/elastic), created by the first one.

Compute share (--gpu-compute REQUEST[:LIMIT], percent of one GPU): under contention CMD gets at least
REQUEST of the GPU's time (the rest is shared in proportion to the requests), and never more than LIMIT,
even on an idle GPU; alone, without a limit, it gets the whole GPU. The shim measures CMD's GPU time and
delays its launches; sessions on one GPU see each other through a per-GPU board in one directory per
machine (MEMSLICE_COMPUTE_DIR, default $XDG_RUNTIME_DIR/memslice/compute or /tmp/memslice-UID/compute)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run a command under a GPU-memory quota", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run CMD with the memslice shim preloaded and a GPU-memory quota.")
    p.add_argument("--gpu-mem", required=True, metavar="SIZE",
                   help="quota per GPU: MiB as a bare number (4096) or with a unit (512MiB, 4GiB)")
    p.add_argument("--gpu-mem-request", metavar="SIZE",
                   help="elastic memory: the part of --gpu-mem guaranteed in HBM (default: all of it, no elastic); "
                        "the rest may be moved to host memory, charged to this process's memory cgroup: leave it "
                        "room for --gpu-mem minus the request (a move it has no room for is refused, never an "
                        "OOM kill)")
    p.add_argument("--idle-after", metavar="SECONDS", type=seconds,
                   help="elastic memory: idle after this long without a CUDA call (default 300)")
    p.add_argument("--gpu-compute", metavar="REQUEST[:LIMIT]",
                   help="compute share in percent of one GPU: REQUEST (0-100) is guaranteed under contention and "
                        "weighs the sharing of the rest; LIMIT (1-100, at least REQUEST) is a cap that holds even on "
                        "an idle GPU; e.g. 30 or 20:40")
    p.add_argument("--gpus", metavar="N|I,J..|all",
                   help="give CMD several GPUs, each under the quota: N (the first N), a list of indices (0,2; "
                        "device=1 for one), or all")
    p.add_argument("--simulate-gpu", metavar="SIZE[,SIZE..]",
                   help="use the simulated GPU instead of a real driver, e.g. 16GiB or 16GiB,24GiB (topology: "
                        "'80GiB,80GiB;nvlink=0-1')")
    p.add_argument("--oversubscribe", nargs="?", const="", metavar="SIZE",
                   help="serve allocations past the quota from host memory (at most SIZE of it; 0: none)")
    p.add_argument("--region-dir", metavar="DIR",
                   help="directory for the shared accounting region (default: a temporary one, removed at exit)")
    p.add_argument("-v", "--verbose", action="store_true", help="say where the region is; shim logs at info")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command to run")
    p.set_defaults(func=main, explain_extras=explain_extras)


def seconds(text: str) -> float:
    """--idle-after's value: a finite number of seconds (argparse names the option in front of the message)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 300, or 0.5)")
    return value


def build_env(args: argparse.Namespace, region_dir: str) -> dict[str, str]:
    from .paths import lib_paths

    env = dict(os.environ)
    if args.simulate_gpu:
        from .simulator import sim_env

        env = sim_env(args.simulate_gpu, base=env)
    env["MEMSLICE_GPU_MEM_LIMIT"] = args.gpu_mem.strip()
    env["MEMSLICE_REGION_DIR"] = region_dir
    chosen = chosen_gpus(args)
    if chosen is not None:
        # indices as NVML (nvidia-smi) numbers the GPUs: CUDA numbers them the same in PCI order
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in chosen)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if args.verbose:
        env.setdefault("MEMSLICE_LOG", "info")
    for key in ("MEMSLICE_GPU_MEM_REQUEST", "MEMSLICE_ELASTIC_DIR", "MEMSLICE_IDLE_AFTER",
                "MEMSLICE_GPU_COMPUTE_REQUEST", "MEMSLICE_GPU_COMPUTE_LIMIT", "MEMSLICE_COMPUTE_DIR",
                "MEMSLICE_COMPUTE_SLOT"):
        env.pop(key, None)  # the limits file decides
    if args.oversubscribe is not None:
        env["MEMSLICE_OVERSUBSCRIBE"] = "1"
        if args.oversubscribe:
            env["MEMSLICE_HOST_SPILL_LIMIT"] = args.oversubscribe.strip()
    shim = lib_paths().shim
    env["LD_PRELOAD"] = " ".join(p for p in (shim, env.get("LD_PRELOAD", "")) if p)
    return env


def elastic_dir(environ: dict[str, str]) -> str:
    """The machine's elastic arbitration directory for this user (MEMSLICE_ELASTIC_DIR wins): created 0700
    by the first session; refused if it is a symlink or someone else's."""
    path = environ.get("MEMSLICE_ELASTIC_DIR") or os.path.join(
        environ.get("XDG_RUNTIME_DIR") or f"/tmp/memslice-{os.getuid()}", "memslice", "elastic")
    if not os.path.isabs(path):
        raise ValueError(f"MEMSLICE_ELASTIC_DIR={path!r} is not an absolute path")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
        raise ValueError(f"the elastic directory {path} is not a directory of yours; remove it or set "
                         "MEMSLICE_ELASTIC_DIR to one")
    return path


def explain_extras(args: argparse.Namespace, extras: list[str]) -> str:
    """Arguments argparse could not place: the command's own options when `--` is missing. Name the option
    that took the command's first word as its SIZE, when one did."""
    for option, value in (("--gpu-mem", args.gpu_mem), ("--oversubscribe", args.oversubscribe),
                          ("--gpu-mem-request", args.gpu_mem_request)):
        if value:
            try:
                checked_size(option, value, allow_zero=option == "--oversubscribe")
            except SizeError as exc:
                return str(exc)
    return f"unrecognized arguments: {' '.join(extras)}; {SEPARATOR_HINT}"


def split_size_message(args: argparse.Namespace, cmd: list[str]) -> str | None:
    """`--gpu-mem 4 GiB`: the unit became the command's first word. Say so, naming the option and the fix."""
    if not cmd or cmd[0] not in UNIT_WORDS:
        return None
    for option, value in (("--gpu-mem", args.gpu_mem), ("--gpu-mem-request", args.gpu_mem_request),
                          ("--oversubscribe", args.oversubscribe), ("--simulate-gpu", args.simulate_gpu)):
        if value and value.strip().isdigit():
            return (f"{option} {value} {cmd[0]}: a size is one word; write {option} {value.strip()}{cmd[0]} "
                    f"(a bare number is MiB)")
    return f"{cmd[0]!r} is not a command; a size is one word (4GiB, not 4 GiB)"


def looks_like_a_command(value: str) -> bool:
    return bool(shutil.which(value)) or "/" in value or value.endswith((".py", ".sh"))


def checked_size(option: str, value: str, *, allow_zero: bool = False) -> int:
    """parse_size, with the fix for a forgotten `--` (the command read as the option's SIZE)."""
    try:
        return parse_size(value, what=option, allow_zero=allow_zero)
    except SizeError as exc:
        if looks_like_a_command(value.strip()):
            raise SizeError(f"{exc}; {value!r} looks like the command: give {option} its SIZE and put `--` before "
                            f"the command (memslice run --gpu-mem 4GiB -- {value} ...)") from None
        if option == "--oversubscribe":
            raise SizeError(f"{exc}; --oversubscribe takes an optional SIZE: write --oversubscribe=SIZE, or "
                            "--oversubscribe alone and `--` before the command") from None
        raise


def gpu_sizes(simulate: str | None) -> tuple[list[int], str]:
    """The GPUs a quota is for: the simulated ones, else what NVML reports (none if it cannot be read)."""
    if simulate:
        from .simulator import gpu_list

        return [parse_size(item.split(":")[0]) for item in gpu_list(simulate)], "the simulated GPU"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            sizes = [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                     for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
        return sizes, "this machine's largest GPU"
    except Exception:  # no driver, no GPU: nothing to compare with
        return [], ""


GPUS_FORMS = "a number of GPUs (2), a list of indices (0,2, or device=1 for one), or all"


def choose_gpus(text: str, count: int | None) -> list[int]:
    """--gpus's value: the node GPU indices CMD gets, in order. ValueError naming the value and the fix: more GPUs
    than the machine has, an index it does not have, one twice, or anything else."""
    value = text.strip()
    if count is None:
        raise ValueError(f"--gpus {text}: cannot count this machine's GPUs (NVML cannot be read); check the NVIDIA "
                         "driver, or add --simulate-gpu to try it without a GPU")
    if value == "all":
        return list(range(count))
    if value.isdigit() and len(value) <= 4:
        n = int(value)
        if n == 0:
            raise ValueError(f"--gpus {text}: give at least one GPU ({GPUS_FORMS})")
        if n > count:
            raise ValueError(f"--gpus {text}: this machine has {count} GPU{'s' if count != 1 else ''}; give at "
                             f"most --gpus {count} (or --gpus all)")
        return list(range(n))
    items = value.removeprefix("device=").split(",")
    if not all(i.strip().isdigit() and len(i.strip()) <= 4 for i in items) or (
            len(items) < 2 and not value.startswith("device=")):
        raise ValueError(f"--gpus {text} is not valid; give {GPUS_FORMS}")
    chosen = [int(i) for i in items]
    for i in chosen:
        if i >= count:
            raise ValueError(f"--gpus {text}: there is no GPU {i}, this machine has {count} (indices 0-{count - 1}); "
                             "give indices it has")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--gpus {text} names a GPU twice; name each GPU once")
    return chosen


def quota_bound_message(option: str, text: str, value: int, simulate: str | None,
                        chosen: list[int] | None = None) -> str | None:
    """A quota no GPU can give (a typo, or more than the GPU has): the message naming it and the fix."""
    if value > MAX_GPU_MEM:
        return (f"{option} {text} is larger than any GPU ({format_bytes(MAX_GPU_MEM)}); the quota is per GPU, "
                "e.g. --gpu-mem 4GiB")
    sizes, what = gpu_sizes(simulate)
    if chosen is not None and sizes:
        # the quota holds on each chosen GPU: it must fit the smallest of them
        small = min(chosen, key=lambda i: sizes[i])
        if value > sizes[small]:
            return (f"{option} {text} is larger than GPU {small} ({format_bytes(sizes[small])}) of --gpus: the "
                    f"quota is per GPU, so give at most {format_bytes(sizes[small])}, or other GPUs")
        return None
    if simulate and sizes and value > min(sizes):
        # every simulated GPU is visible to the command, and the quota holds on each: it must fit the smallest
        small = sizes.index(min(sizes))
        return (f"{option} {text} is larger than simulated GPU {small} ({format_bytes(min(sizes))}): the quota is "
                f"per GPU, so give at most {format_bytes(min(sizes))}, or larger GPUs in --simulate-gpu")
    if sizes and value > max(sizes):
        fix = "or a larger --simulate-gpu" if simulate else "the quota is per GPU"
        return (f"{option} {text} is larger than {what} ({format_bytes(max(sizes))}): give at most "
                f"{format_bytes(max(sizes))}, {fix}")
    return None


def driver_paths(simulate: bool) -> dict[str, str]:
    """The driver libraries the command's shim loads and measures with (nvml_path, cuda_path): the
    simulated ones with --simulate-gpu, else the files this process loads by name now, before the
    command can change anything. Empty where none loads (the shim then finds them by name)."""
    from .limits import DRIVER_SONAMES, own_mapped_libraries

    if simulate:
        from .paths import lib_paths

        return {soname: str(Path(lib_paths().sim_dir) / soname) for soname in DRIVER_SONAMES}
    for soname in DRIVER_SONAMES:
        try:
            ctypes.CDLL(soname)
        except OSError:
            continue
    return own_mapped_libraries()


def chosen_gpus(args: argparse.Namespace) -> list[int] | None:
    """The node GPUs --gpus names (None without --gpus), checked against the machine's (or simulated) GPUs."""
    if getattr(args, "gpus", None) is None:
        return None
    sizes, _ = gpu_sizes(args.simulate_gpu)
    return choose_gpus(args.gpus, len(sizes) if sizes or args.simulate_gpu else None)


def limits_for(args: argparse.Namespace, environ: dict[str, str]) -> Limits:
    """The limits file's content for these arguments (sizes already validated)."""
    reserve = environ.get("MEMSLICE_CONTEXT_RESERVE")
    spill = args.oversubscribe
    limit = checked_size("--gpu-mem", args.gpu_mem)
    if spill:
        checked_size("--oversubscribe", spill, allow_zero=True)
    if args.simulate_gpu is not None:  # `--simulate-gpu=` too: an empty list is refused by name
        from .simulator import validate_gpus

        validate_gpus(args.simulate_gpu)
    chosen = chosen_gpus(args)
    bound = quota_bound_message("--gpu-mem", args.gpu_mem, limit, args.simulate_gpu, chosen)
    if bound:
        raise ValueError(bound)
    request = checked_size("--gpu-mem-request", args.gpu_mem_request) if args.gpu_mem_request else None
    if request is not None and request > limit:
        raise ValueError(f"--gpu-mem-request {args.gpu_mem_request} is above --gpu-mem {args.gpu_mem}; the request "
                         "is the guaranteed part of the limit")
    if args.idle_after is not None and not 0 <= args.idle_after <= 604800:
        raise ValueError(f"--idle-after {args.idle_after:g}: idle_after={args.idle_after:g} is not between 0 and "
                         "604800 seconds")
    elastic = request is not None and request < limit
    driver = driver_paths(bool(args.simulate_gpu))
    share = compute.parse_share(args.gpu_compute) if args.gpu_compute is not None else None
    cdir = str(compute.ensure_dir(compute.default_dir(environ), 0o700)) if share is not None else None
    return Limits(gpu_mem_bytes=limit,
                  nvml_path=driver.get("libnvidia-ml.so.1"), cuda_path=driver.get("libcuda.so.1"),
                  gpu_compute_request=share.request if share else None,
                  gpu_compute_limit=share.limit if share else None,
                  compute_dir=cdir,
                  gpu_mem_request_bytes=request,
                  elastic_dir=elastic_dir(environ) if elastic else None,
                  idle_after_s=args.idle_after if elastic else None,
                  context_reserve_bytes=(parse_size(reserve, what="MEMSLICE_CONTEXT_RESERVE", allow_zero=True)
                                         if reserve is not None else None),
                  oversubscribe=spill is not None,
                  host_spill_limit_bytes=(parse_size(spill, what="--oversubscribe", allow_zero=True)
                                          if spill else None))


def private_dir_problem(region_dir: str) -> str | None:
    """The usage file (memslice.region) is writable by every process that can reach it (the shim makes it so,
    for containers whose processes run as several users): so the region directory must be reachable by its
    owner only. None when it is (memslice run creates a missing one 0700)."""
    st = os.stat(region_dir)
    if st.st_uid != os.getuid():
        return f"--region-dir {region_dir} belongs to uid {st.st_uid}, not to you; name a directory of yours"
    if st.st_mode & 0o077:
        return (f"--region-dir {region_dir} is open to other users (mode {st.st_mode & 0o777:o}), and its usage "
                f"file would be writable by them: `chmod 700 {region_dir}`, or name a directory that does not "
                "exist yet (memslice run creates it, mode 700)")
    return None


def region_dir_problem(path: str) -> str | None:
    """What is wrong with a --region-dir before anything is created: empty, a file, or a path whose parent
    does not exist (memslice run creates the last component only, never a tree of directories as root)."""
    if not path.strip():
        return "--region-dir '' is empty: name a directory (or leave the option out for a temporary one)"
    if os.path.exists(path) and not os.path.isdir(path):
        return f"--region-dir {path} is a file, not a directory: name a directory (memslice run creates a missing one)"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return (f"--region-dir {path}: its parent {parent} does not exist; create it first, or name a directory "
                "whose parent exists")
    return None


def driver_present() -> bool:
    """Whether the NVIDIA driver's libcuda.so.1 can be loaded from this machine's library path (the command
    would find no GPU without it). Loading it starts nothing: the driver initialises on cuInit."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def main(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    split = split_size_message(args, cmd)
    if split:
        print(f"memslice run: {split}", file=sys.stderr)
        return 2
    if not cmd:
        print("memslice run: no command given; usage: memslice run --gpu-mem 4GiB -- CMD [ARGS...]", file=sys.stderr)
        return 2
    try:
        limits = limits_for(args, dict(os.environ))
    except (SizeError, ValueError, OSError) as exc:
        print(f"memslice run: {exc}", file=sys.stderr)
        return 2
    own_dir = args.region_dir is None
    problem = None if own_dir else region_dir_problem(args.region_dir)
    if problem:
        print(f"memslice run: {problem}", file=sys.stderr)
        return 2
    if not args.simulate_gpu and not driver_present():
        print("memslice run: no NVIDIA driver found (libcuda.so.1 cannot be loaded), so the command will find no GPU; "
              "to try memslice without one, add --simulate-gpu 16GiB", file=sys.stderr)
    region_dir = tempfile.mkdtemp(prefix="memslice-region-") if own_dir else args.region_dir
    try:
        try:
            if not os.path.isdir(region_dir):
                os.mkdir(region_dir, mode=0o700)
            shared = private_dir_problem(region_dir)
            if shared:
                print(f"memslice run: {shared}", file=sys.stderr)
                return 2
            write_limits(Path(region_dir) / LIMITS_FILE, limits)
        except OSError as exc:
            print(f"memslice run: cannot write the limits file in --region-dir {region_dir}: {exc}; use a "
                  "directory you can write", file=sys.stderr)
            return 2
        env = build_env(args, region_dir)
        if args.verbose:
            print(f"memslice run: region {region_dir} (watch it with: memslice top {region_dir})", file=sys.stderr)
            if args.simulate_gpu:
                state = env["MEMSLICE_SIM_STATE"]
                print(f"memslice run: simulated GPU state {state} (memslice sim status --state {state})",
                      file=sys.stderr)
        try:
            proc = subprocess.Popen(cmd, env=env)
        except FileNotFoundError:
            print(f"memslice run: command not found: {cmd[0]}", file=sys.stderr)
            return 127
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: proc.send_signal(s))
        rc = proc.wait()
        return rc if rc >= 0 else 128 - rc
    finally:
        if own_dir:
            shutil.rmtree(region_dir, ignore_errors=True)

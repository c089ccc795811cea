"""Helpers of the real-GPU check kit (`tests/gpu/run.sh`, or `make gpu-check`): tests that need an NVIDIA
driver and a GPU, run through the real shim with `memslice run`. Without a driver every test here is skipped,
saying why; with one, each checks a framework or a figure on real hardware (docs/operations.md, "Checking a
real GPU").

Every figure is printed (`[gpu-check] name: k=v, ...`) and, when MEMSLICE_GPU_FIGURES names a file, appended
to it as one JSON line ({"check": name, ...figures}). Every child process runs under a timeout, so no check
can hang the kit.

MEMSLICE_GPU_KIT_SIM=SIZE (for checking the kit itself on a machine without a GPU, e.g. 16GiB) runs the checks
that need only the driver API on memslice's simulated GPU; those that need a framework skip as usual."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

QUOTA_MIB = 2048
MiB = 1 << 20
CHILD_TIMEOUT = 120  # seconds: no child of the kit runs longer (the whole kit is meant to take ~3 min on an H100)
KIT_SIM = os.environ.get("MEMSLICE_GPU_KIT_SIM", "")
REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _sim_state() -> str:
    return os.path.join(tempfile.mkdtemp(prefix="memslice-gpukit-"), "gpu.state")


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    if KIT_SIM:
        from memslice.simulator import sim_env

        env = sim_env(KIT_SIM, state=_sim_state(), base=env)
        env["MEMSLICE_SIM_CONTEXT_OVERHEAD"] = "300MiB"
    return env


@functools.cache
def no_gpu_reason() -> str | None:
    """Why the real-GPU checks cannot run here, or None when an NVIDIA driver with a GPU is present."""
    from memslice.paths import lib_paths

    try:
        sim_dir = os.path.realpath(lib_paths().sim_dir)
    except Exception as e:  # noqa: BLE001 - the reason is what the kit prints
        return f"memslice's libraries are not built: {e}"
    if KIT_SIM:
        return None
    probe = r"""
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print("no NVIDIA driver: libcuda.so.1 cannot be loaded (%s)" % e); sys.exit()
n, name = ctypes.c_int(), ctypes.create_string_buffer(256)
rc = cuda.cuInit(0)
if rc != 0:
    print("no usable NVIDIA driver: cuInit returned %d" % rc); sys.exit()
if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
    print("the NVIDIA driver sees no GPU"); sys.exit()
cuda.cuDeviceGetName(name, 256, 0)
if b"(memslice)" in name.value:
    print("libcuda.so.1 is memslice's simulated GPU, not a real driver"); sys.exit()
print("")
"""
    env = _base_env()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep)
                                             if p and os.path.realpath(p) != sim_dir)
    try:
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "the driver probe did not answer within 120 s"
    if out.returncode != 0:
        return f"the driver probe crashed: {out.stderr.strip()[-300:]}"
    return out.stdout.strip() or None


def real_env(**extra: str) -> dict[str, str]:
    """The caller's environment without memslice settings or the simulated driver (plus `extra`)."""
    env = _base_env()
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill a child and everything it started (it leads its own session): `memslice run` starts the command as a
    grandchild, which must not outlive a check that gave up on it, holding GPU memory."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_cmd(cmd: list[str], env: dict[str, str] | None = None,
            timeout: float = CHILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """A child of the kit, bounded: a hang becomes a failed result saying so, never a hung kit."""
    proc = subprocess.Popen(cmd, env=env or real_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate(timeout=30)
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\n[gpu-check] timed out after {timeout:.0f} s")
    except BaseException:  # KeyboardInterrupt (the kit's own deadline): take the child's group down too
        _kill_group(proc)
        raise


def run_cmd_argv(quota_mib: int, region: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """`memslice run` with a quota and a region directory (and extra options), up to the `--`."""
    return [sys.executable, "-m", "memslice.cli", "run", "--gpu-mem", f"{quota_mib}MiB", "--region-dir",
            str(region), *extra, "--"]


def memslice_run(region: Path, script: str, *args: str, quota_mib: int = QUOTA_MIB, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, timeout: float = CHILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run `python -c script args` under the real shim with a quota (and extra `memslice run` options)."""
    cmd = [*run_cmd_argv(quota_mib, region, extra), sys.executable, "-c", script, *args]
    return run_cmd(cmd, env=env, timeout=timeout)


def plain_run(script: str, *args: str, env: dict[str, str] | None = None,
              timeout: float = CHILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run `python -c script args` without the shim."""
    return run_cmd([sys.executable, "-c", script, *args], env=env, timeout=timeout)


def last_json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The script's result: its last stdout line, JSON (the whole output on failure, for the report)."""
    assert out.returncode == 0, f"rc={out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def report(name: str, **figures: object) -> None:
    """Figures a person reads (pytest -s, or the -rA summary): printed, and appended as a JSON line to the file
    MEMSLICE_GPU_FIGURES names. Figures are never asserted on here; the tests assert what they promise."""
    print(f"\n[gpu-check] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    path = os.environ.get("MEMSLICE_GPU_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"check": name, "time": round(time.time(), 3), **figures}, default=str) + "\n")


def physical_total_mib() -> int:
    """cuMemGetInfo's total outside the shim (a child process: the kit's own process never loads the driver)."""
    script = r"""
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
t, f = ctypes.c_size_t(), ctypes.c_size_t()
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuInit(0); cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
print(json.dumps({"total": t.value >> 20, "free": f.value >> 20}))
"""
    return int(last_json(plain_run(script, timeout=120))["total"])


class Held:
    """A child that runs until told to go: it prints JSON lines, the last of them ready ({"ready": ...}), then
    waits for a line on stdin. Every read has a deadline; the child is killed if it outlives the check."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.err = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty child never blocks on it
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, start_new_session=True)
        self.lines: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self, timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
        """The child's next JSON line, within the deadline (its stderr on failure)."""
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout)
        sel.close()
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.kill()
            self.err.seek(0)
            err = self.err.read()
            raise AssertionError(f"{self.proc.args[-3:]} gave no answer within {timeout:.0f} s "
                                 f"(rc={self.proc.returncode}): {err[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        self.lines.append(answer)
        return answer

    def ask(self, line: str, timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
        """Send one command line and read its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def finish(self, timeout: float = 60) -> int:
        """Close stdin (the child frees and exits) and wait for it, killing it past the deadline."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        _kill_group(self.proc)
        self.proc.wait(timeout=30)


@contextmanager
def held(cmd: list[str], env: dict[str, str]) -> Iterator[Held]:
    h = Held(cmd, env)
    try:
        yield h
    finally:
        h.finish()


def wait_for(cond: Callable[[], bool], timeout: float) -> bool:
    """Poll cond (cheap reads: boards, NVML) until it holds or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


NVML_PROCS = r"""
import json, sys, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
procs = {p.pid: (p.usedGpuMemory or 0) >> 20 for p in n.nvmlDeviceGetComputeRunningProcesses(h)}
m = n.nvmlDeviceGetMemoryInfo(h)
print(json.dumps({"procs": {str(k): v for k, v in procs.items()}, "used": m.used >> 20, "total": m.total >> 20}))
"""


def need_nvml() -> None:
    """Skip, saying why, where NVML's Python binding is missing (the GPU machine's Python has nvidia-ml-py)."""
    import pytest

    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed in this Python")


def nvml_outside() -> dict[str, Any]:
    """NVML outside the shim: per-process used MiB (by pid, as the driver reports it) and the device's used MiB."""
    return last_json(plain_run(NVML_PROCS, timeout=60))

"""Harness for the real-client tests (tests/clients/test_clients_*.py): run a third-party GPU client under
`memslice run --simulate-gpu` with a quota, hold it at its own out-of-memory point, and read `memslice top`."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

QUOTA_MIB = 1024
CHUNK_MIB = 64


def memslice_env(tmp: pathlib.Path) -> dict[str, str]:
    """The caller's environment without memslice settings, with its own simulated node state file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env["MEMSLICE_SIM_STATE"] = str(tmp / "node.state")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cmd(region: pathlib.Path, *cmd: str) -> list[str]:
    return [sys.executable, "-m", "memslice.cli", "run", "--gpu-mem", f"{QUOTA_MIB}MiB", "--simulate-gpu", "16GiB",
            "--region-dir", str(region), "--", *cmd]


def top(region: pathlib.Path, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "memslice.cli", "top", "--json", str(region)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@contextmanager
def holding(tmp: pathlib.Path, script: str) -> Iterator[tuple[dict[str, str], subprocess.Popen[str], pathlib.Path]]:
    """Start `python -c script` under memslice run; the script prints lines, then `held` and waits on stdin."""
    region = tmp / "region"
    env = memslice_env(tmp)
    proc = subprocess.Popen(run_cmd(region, sys.executable, "-c", script), env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield env, proc, region
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()


def read_until_held(proc: subprocess.Popen[str]) -> dict[str, str]:
    """key=value lines up to `held` (bounded by the test timeout; a crash ends the stream)."""
    got: dict[str, str] = {}
    assert proc.stdout
    for line in proc.stdout:
        line = line.strip()
        if line == "held":
            return got
        if "=" in line:
            k, v = line.split("=", 1)
            got[k] = v
    raise AssertionError(f"client exited before holding memory (rc={proc.wait()}): {proc.stderr.read()[-3000:]}")


def process_mib(snapshot: dict, command: str | None = None) -> dict[int, int]:
    """Device MiB per live process of the (single) region, from `memslice top --json`."""
    [region] = snapshot["regions"]
    return {p["pid"]: p["device_bytes"] >> 20 for p in region["processes"]
            if p["alive"] and (command is None or p["command"] == command)}


def quota_mib(snapshot: dict) -> int:
    [region] = snapshot["regions"]
    [dev] = region["devices"]
    return dev["limit_bytes"] >> 20

"""Shared fixtures: the built libraries, compiled C test programs, and simulated GPU nodes.

Everything here runs the real thing: the real shim preloaded into real processes on the simulated
driver, each test with its own simulated node (state file) and its own container region.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import time
from collections.abc import Callable

import pytest

from memslice.paths import LibPaths, lib_paths

TESTS = pathlib.Path(__file__).resolve().parent
C_DIR = TESTS / "c"
MiB = 1 << 20


@pytest.fixture(scope="session")
def libs() -> LibPaths:
    return lib_paths()


@pytest.fixture(scope="session")
def cbin(libs: LibPaths, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The C test programs, compiled once per session. Direct-binding programs link the simulated libcuda."""
    out = tmp_path_factory.mktemp("cbin")
    include = libs.include
    progs = {
        "alloc_direct": ["-L", libs.sim_dir, "-l:libcuda.so.1"],
        "kinds": ["-L", libs.sim_dir, "-l:libcuda.so.1"],
        "stress": ["-L", libs.sim_dir, "-l:libcuda.so.1", "-lpthread"],
        "routes": ["-ldl"],
        "spill": ["-L", libs.sim_dir, "-l:libcuda.so.1"],
        "sizecheck": [],
    }
    built = {}
    for name, flags in progs.items():
        exe = out / name
        subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{include}", str(C_DIR / f"{name}.c"), "-o", str(exe),
                        *flags], check=True)
        built[name] = str(exe)
    return built


class Node:
    """A simulated GPU node: its own state file, so tests never share physical memory."""

    def __init__(self, tmp: pathlib.Path, libs: LibPaths, gpus: str, context_overhead: str) -> None:
        self.state = str(tmp / "node.state")
        self.libs = libs
        self.gpus = gpus
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
        self.env.update(MEMSLICE_SIM_STATE=self.state, MEMSLICE_SIM_GPUS=gpus,
                        MEMSLICE_SIM_CONTEXT_OVERHEAD=context_overhead,
                        LD_LIBRARY_PATH=libs.sim_dir)
        self.env.pop("LD_PRELOAD", None)

    def container(self, region: pathlib.Path, limit: str | None, **extra: str) -> dict[str, str]:
        """Environment of a process in a container with this quota, the shim preloaded."""
        region.mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        env.update(MEMSLICE_REGION_DIR=str(region), LD_PRELOAD=self.libs.shim)
        if limit is not None:
            env["MEMSLICE_GPU_MEM_LIMIT"] = limit
        env.update(extra)
        return env

    def physical(self) -> list:
        """Physical usage of the node's GPUs, from the simulator's own ledger."""
        from memslice.interposer.region import read_region_file

        snap = read_region_file(self.state)
        return snap.devices if snap else []


@pytest.fixture
def node(tmp_path: pathlib.Path, libs: LibPaths) -> Callable[..., Node]:
    def make(gpus: str = "16GiB", context_overhead: str = "64MiB") -> Node:
        d = tmp_path / f"node-{len(list(tmp_path.glob('node-*')))}"
        d.mkdir()
        return Node(d, libs, gpus, context_overhead)

    return make


def run(cmd: list[str], env: dict[str, str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


def kv(text: str) -> dict[str, str]:
    """key=value pairs from a program's output (last one wins)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                out[k] = v
    return out


def wait_for(predicate: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> object:
    """Poll `predicate` (another process's state) until it returns something truthy; fail after `timeout` s.
    The short pause is the polling interval of a bounded wait, not a race fix."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)

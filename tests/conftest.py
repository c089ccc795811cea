"""Shared fixtures: the built libraries, compiled C test programs, and simulated GPU nodes.

Everything here runs the real thing: the real shim preloaded into real processes on the simulated
driver, each test with its own simulated node (state file) and its own container region.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
import testpaths

from memslice.paths import LibPaths, lib_paths

testpaths.add()  # every test folder's modules importable by name (tests/testpaths.py)
import build_cache  # noqa: E402
import hypothesis_budget  # noqa: E402 (importable once testpaths.add() has run)

hypothesis_budget.load()  # MEMSLICE_HYPOTHESIS: quick (unset) or deep, else refused by name

TESTS = pathlib.Path(__file__).resolve().parent
T = TypeVar("T")
C_DIR = TESTS / "c"
MiB = 1 << 20
# The sanitizer run of `make test` points MEMSLICE_LIB_DIR at interposer/build-asan, whose libraries need
# the ASan runtime loaded before anything else: this names it (empty otherwise).
PRELOAD_FIRST = os.environ.get("MEMSLICE_TEST_PRELOAD_FIRST", "")


def preload(*libs: str) -> str:
    """An LD_PRELOAD value for these libraries (after the sanitizer runtime, in the sanitizer run)."""
    return " ".join(p for p in (PRELOAD_FIRST, *libs) if p)


# `make test` runs the tests in parallel (pytest-xdist, --dist loadgroup): every test has its own temporary
# directories, simulated node, sockets and ports (port 0), so any two may run at once. A module whose fixture
# is expensive keeps its tests on one worker with a module-level `xdist_group` mark (the fixture then runs
# once; a mark added here would come too late for xdist, which reads it first), and the longest modules start
# first, so that none of them is the tail of a parallel run.
LONGEST_FIRST = ("test_dra_node.py", "test_image_build.py", "test_real_deploy.py", "test_real_dra.py",
                 "test_real_scheduler.py", "test_realnode_deviceplugin.py", "test_realnode_dra.py",
                 "test_realnode_multigpu.py", "test_shim_chaos.py", "test_extender_fastpaths.py",
                 "test_elastic_swap.py", "test_e2e_elastic.py", "test_elastic_drain.py", "test_elastic_gate.py",
                 "test_elastic_attribution.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the others keep their order


@pytest.fixture(autouse=True)
def _keep_recursion_limit() -> Iterator[None]:
    """A test (or a library it imports: celpy sets 2,500 when imported) that changes the process-wide recursion
    limit must not change what the next test in this worker measures: the extender's refusal of objects nested
    too deeply to encode depends on it. Restored after each test."""
    limit = sys.getrecursionlimit()
    yield
    if sys.getrecursionlimit() != limit:
        sys.setrecursionlimit(limit)


@pytest.fixture(scope="session")
def libs() -> LibPaths:
    return lib_paths()


@contextmanager
def compiled(kind: str, commands: dict[str, list[str]], fresh: pathlib.Path) -> Iterator[pathlib.Path]:
    """A directory holding, for each name, what `commands[name] + ["-o", name]` compiles (tests/c's programs),
    cached by the hash of the commands, the compiler, tests/c and the interposer's sources (the simulated driver
    they link against is built from them: tests/support/build_cache.py): compiled again when one changes, not
    by every worker of every run (1.2 CPU-s per worker for `cbin`, 0.35 per module for tests/c/elastic.c). With
    MEMSLICE_TEST_BUILD_CACHE=0, compiled into `fresh`."""
    root = str(TESTS.parent)
    cc = subprocess.run(["cc", "--version"], capture_output=True, text=True, timeout=30).stdout
    said = [f"{n}: {' '.join(c).replace(root, '<checkout>')}" for n, c in sorted(commands.items())]
    inputs = ["tests/c", "interposer/include", "interposer/src", "interposer/sim"]
    digest = build_cache.tree_digest(TESTS.parent, inputs, lambda rel: False, extra=[cc, *said])

    def build(entry: pathlib.Path) -> None:
        for name, cmd in commands.items():
            subprocess.run([*cmd, "-o", str(entry / name)], check=True)

    with build_cache.cached_build(kind, digest, build, fresh) as (entry, _):
        yield entry


@pytest.fixture(scope="session")
def cbin(libs: LibPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The C test programs (compiled(): once per change of their inputs). Direct-binding programs link the
    simulated libcuda."""
    include = libs.include
    progs = {
        "alloc_direct": ["-L", libs.sim_dir, "-l:libcuda.so.1"],
        "kinds": ["-L", libs.sim_dir, "-l:libcuda.so.1"],
        "unseen": ["-L", libs.sim_dir, "-l:libcuda.so.1", "-ldl"],
        "stress": ["-L", libs.sim_dir, "-l:libcuda.so.1", "-lpthread"],
        "ctxrace": ["-L", libs.sim_dir, "-l:libcuda.so.1", "-lpthread"],
        "routes": ["-ldl"],
        "spill": ["-L", libs.sim_dir, "-l:libcuda.so.1"],
        "spin_tenant": ["-L", libs.sim_dir, "-l:libcuda.so.1", "-ldl"],  # spin kernels on the sim (issue 33)
        "sizecheck": [],
    }
    commands = {name: ["cc", "-O2", "-Wall", "-Werror", f"-I{include}", str(C_DIR / f"{name}.c"), *flags]
                for name, flags in progs.items()}
    with compiled("cbin", commands, tmp_path_factory.mktemp("cbin")) as out:
        yield {name: str(out / name) for name in progs}


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
        if PRELOAD_FIRST:
            self.env["LD_PRELOAD"] = PRELOAD_FIRST

    def container(self, region: pathlib.Path, limit: str | None, **extra: str) -> dict[str, str]:
        """Environment of a process in a container with this quota, the shim preloaded."""
        region.mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        env.update(MEMSLICE_REGION_DIR=str(region), LD_PRELOAD=preload(self.libs.shim))
        if limit is not None:
            env["MEMSLICE_GPU_MEM_LIMIT"] = limit
        env.update(extra)
        return env

    def physical(self) -> list:
        """Physical usage of the node's GPUs, from the simulator's own ledger."""
        from memslice.interposer.region import read_region_file

        snap = read_region_file(self.state + ".usage")  # the node's usage ledger (one local "container")
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


class ChildLog:
    """A child process's output (stdout and stderr together), read by a thread as it comes: kept in memory
    and in `path` (for a person reading a failure), and waited on by condition: every line, and the end of
    the output, wake the waiters, so a test waits for what the process says instead of polling a file."""

    def __init__(self, proc: subprocess.Popen[bytes], path: pathlib.Path) -> None:
        assert proc.stdout is not None, "start the process with stdout=subprocess.PIPE"
        self.proc, self.path = proc, path
        self._chunks: list[str] = []
        self._ended = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, name=f"log-{path.name}", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.path, "wb") as copy:
            for line in iter(self.proc.stdout.readline, b""):
                copy.write(line)
                copy.flush()
                with self._cond:
                    self._chunks.append(line.decode(errors="replace"))
                    self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def text(self) -> str:
        """The output so far; all of it once the process has exited."""
        with self._cond:
            if self.proc.poll() is not None:
                self._cond.wait_for(lambda: self._ended, 10)
            return "".join(self._chunks)

    def wait_for(self, predicate: Callable[[str], T | None], timeout: float = 15.0, what: str = "a log line") -> T:
        """Wait until `predicate(output so far)` returns something truthy, and return it; fail when the
        process ends first or after `timeout` s, with the output."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate("".join(self._chunks))
                if value:
                    return value
                if self._ended:
                    raise AssertionError(f"the process ended (exit {self.proc.wait(10)}) before {what}:\n"
                                         f"{''.join(self._chunks)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {timeout} s:\n{''.join(self._chunks)}")
                self._cond.wait(left)




def proc_lookup(lib: Any) -> tuple[Callable[..., tuple[int, int | None, int]], Callable[[str], int]]:
    """(look, addr) for a loaded libcuda: look(name, cudaVersion, flags) is cuGetProcAddress_v2's
    (rc, address or None, symbolStatus); addr(name) the address of the library's exported `name`."""
    import ctypes

    gp = lib.cuGetProcAddress_v2
    gp.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_ulonglong,
                   ctypes.POINTER(ctypes.c_int)]
    fn, st = ctypes.c_void_p(), ctypes.c_int(-1)

    def look(name: bytes, ver: int, flags: int = 0) -> tuple[int, int | None, int]:
        rc = gp(name, ctypes.byref(fn), ver, flags, ctypes.byref(st))
        return rc, fn.value, st.value

    def addr(name: str) -> int:
        return int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0)

    return look, addr


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real kube-apiserver (tests/support/kube_real.py), one for the whole session; tests keep apart by names.
    Skips only where Go is missing (the binary cannot be built); with Go, a missing binary fails."""
    import kube_real

    why = kube_real.why_unavailable()
    if why:
        pytest.skip(why)
    with kube_real.running(tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster

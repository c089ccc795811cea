""""The hot path makes no syscall" (docs/architecture.md, "Interposer"): after its first call has read the
limits, opened the region and claimed a slot, an allocation and a free under the shim cost no system call of
the shim's own. Counted with strace on tests/c/hotloop.c: the system calls its main thread makes between two
marker calls around 1,000 cuMemAlloc_v2 + cuMemFree_v2 pairs, with the shim and without it on the same
simulated driver (which maps and unmaps host memory for each allocation: those are the driver's). The two
counts must be the same, call for call."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import C_DIR, run

from memslice.interposer.region import read_region

pytestmark = pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
PAIRS = 1000


@pytest.fixture(scope="module")
def hotloop(libs, tmp_path_factory) -> str:
    exe = tmp_path_factory.mktemp("hotloop") / "hotloop"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{libs.include}", str(C_DIR / "hotloop.c"), "-o", str(exe),
                    "-L", libs.sim_dir, "-l:libcuda.so.1"], check=True)
    return str(exe)


def loop_syscalls(trace: Path) -> collections.Counter[str]:
    """System calls of the thread that made the markers, strictly between its two getppid() calls."""
    lines = trace.read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if re.match(r"\d+ +getppid\(", line)]
    assert len(marks) == 2, f"expected two getppid markers in {trace}"
    tid = lines[marks[0]].split()[0]
    calls: collections.Counter[str] = collections.Counter()
    for line in lines[marks[0] + 1:marks[1]]:
        fields = line.split(None, 1)
        if fields[0] == tid and (m := re.match(r"(\w+)\(", fields[1])):
            calls[m.group(1)] += 1
    return calls


def test_an_allocation_and_a_free_under_the_shim_make_no_system_call_of_its_own(node, hotloop, tmp_path):
    n = node(context_overhead="64MiB")
    region = tmp_path / "c"
    counted = {}
    for name, env in (("driver", n.env), ("shim", n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="64MiB"))):
        trace = tmp_path / f"{name}.trace"
        out = run(["strace", "-f", "-qq", "-o", str(trace), hotloop, str(PAIRS), "2"], env, timeout=120)
        assert out.returncode == 0 and f"pairs={PAIRS}" in out.stdout, out.stdout + out.stderr
        counted[name] = loop_syscalls(trace)
    dev = read_region(region).devices[0]
    assert dev.limit_bytes == 1 << 30 and dev.peak_bytes == (64 + 2) << 20  # the shim was there, and charged
    assert counted["shim"] == counted["driver"], counted
    # the driver's own: the simulator maps each allocation's host memory and unmaps it at the free
    assert counted["driver"] == {"mmap": PAIRS, "munmap": PAIRS}, counted["driver"]

"""A kernel launch is held at the elastic work gate while its process moves a range (docs/architecture.md,
"The work gate"): the launch waits in the shim and reaches the driver only once the move is done.

The simulated GPU's kernels touch no memory, so a launch let through mid-move would corrupt nothing here;
what is checked is when each launch reaches the driver. Uprobes (perf) on the real functions trace, with the
kernel's timestamps, B's calls into the shim's cuLaunchKernel, the driver's cuLaunchKernel and cuMemUnmap,
and the shim's own el_gate_close/el_gate_open. Then: no launch reaches the driver between a move's unmap and
the gate's opening, and launches that entered the shim while the gate was closed reached the driver only
after it opened (held, not refused: every round of B's succeeds and its bytes are intact)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_elastic_swap import elastic, per_process, tenant_bin, wait_for  # noqa: F401  (fixtures)

from memslice.paths import lib_paths

MiB = 1 << 20
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("perf"), reason="needs root and perf (uprobes)")


@pytest.fixture
def probes() -> Iterator[str]:
    """Uprobes on the shim's launch hook and gate, and on the simulated driver's launch and unmap: their group."""
    libs = lib_paths()
    group = f"msgate{os.getpid()}"
    points = [(libs.shim, "shim_launch", "cuLaunchKernel"), (libs.shim, "gate_close", "el_gate_close"),
              (libs.shim, "gate_open", "el_gate_open"),
              (str(Path(libs.sim_dir) / "libcuda.so.1"), "drv_launch", "cuLaunchKernel"),
              (str(Path(libs.sim_dir) / "libcuda.so.1"), "drv_unmap", "cuMemUnmap")]
    try:
        for lib, name, fn in points:
            out = subprocess.run(["perf", "probe", "-q", "-x", lib, "-a", f"{group}:{name}={fn}"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode:
                pytest.skip(f"perf cannot place a uprobe on {fn} in {lib}: {out.stderr.strip()[-300:]}")
        yield group
    finally:
        subprocess.run(["perf", "probe", "-q", "-d", f"{group}:*"], capture_output=True, timeout=60)


def events(data: Path) -> list[tuple[float, int, str]]:
    """(time, tid, event name) in time order, from a perf recording."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,time,event"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = []
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+([\d.]+):\s+\w+:(\w+):", line)
        if m:
            got.append((float(m.group(2)), int(m.group(1)), m.group(3)))
    return sorted(got)


def test_a_kernel_launch_waits_at_the_gate_while_its_range_moves(elastic, probes, tmp_path):  # noqa: F811
    b = elastic("b", "896MiB", "128MiB", gpus="1GiB", ctx="64MiB", idle="600")
    assert b.cmd("alloc 768 32") == "allocated 24"
    data = tmp_path / "perf.data"
    perf = subprocess.Popen(["perf", "record", "-q", "-e", f"{probes}:*", "-p", str(b.proc.pid), "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert b.cmd("busy 1 launch") == "busy"  # one thread, by dlsym: cuLaunchKernel is the shim's
        state = elastic.node().state
        a = elastic("a", "512MiB", "256MiB", gpus="1GiB", ctx="64MiB", idle="600")
        for _ in range(2):
            assert a.cmd("alloc 256 32") == "allocated 8"
            wait_for(lambda: per_process(state)[a.proc.pid] == (64 + 256, 0), "A's request in HBM")
            assert per_process(state)[b.proc.pid][1] > 0, "B moved its busy blocks to host memory"
            assert a.cmd("free") == "freed 0"
            wait_for(lambda: per_process(state)[b.proc.pid] == (64 + 768, 0), "B's blocks back in HBM")
        out = b.cmd("stop")
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)
    rounds, errors = map(int, out.split()[1:])
    assert rounds > 0 and errors == 0, out
    assert b.cmd("check") == f"check ok {768 * MiB}"
    trace = events(data)
    windows = []  # (closed at, opened at): the gate's closed windows, in order
    closed = None
    for t, _, name in trace:
        if name == "gate_close" and closed is None:
            closed = t
        elif name == "gate_open" and closed is not None:
            windows.append((closed, t))
            closed = None
    assert len(windows) >= 4, f"B moved no blocks? {len(windows)} gate closings"
    launches = [(t, tid) for t, tid, name in trace if name == "drv_launch"]
    for t_closed, t_open in windows:
        unmaps = [t for t, _, name in trace if name == "drv_unmap" and t_closed <= t <= t_open]
        if unmaps:  # from the first unmap of the move to the opening, nothing is launched
            assert not [t for t, _ in launches if unmaps[0] <= t <= t_open], (t_closed, unmaps[0], t_open)
    held = 0
    for t, tid, name in trace:
        if name != "shim_launch":
            continue
        window = next((w for w in windows if w[0] < t < w[1]), None)
        if window is None:
            continue
        reached = next((lt for lt, ltid in launches if ltid == tid and lt > t), None)
        assert reached is not None and reached > window[1], (t, window, reached)  # let through only after opening
        held += 1
    assert held > 0, "no launch arrived while the gate was closed: nothing was shown held"
    print(f"gate: {len(windows)} closings, {held} launches held, {len(launches)} launches")

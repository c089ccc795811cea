"""Both services stop on a SIGTERM the kernel delivers to any of their threads, not only the main one.

Why (found by tests/adversarial/test_probe_starvation.py, 1 extender stop in ~15 hung): Python runs signal
handlers in the main thread only, and a process-directed signal may be delivered to any thread; a main
thread blocked in Event.wait() without a timeout is then never woken, and the service ignores the kubelet's
SIGTERM until SIGKILL. The signal is sent here to one non-main thread (tgkill), which makes the case
deterministic."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from kube_standin import KubeApiStandin
from test_plugin_agent import AgentProcess

SYS_TGKILL = {"x86_64": 234, "aarch64": 131}[os.uname().machine]


def sigterm_to_a_non_main_thread(pid: int) -> None:
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert tids, "the service has no thread but its main one"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(SYS_TGKILL, pid, tids[-1], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())


def test_the_extender_stops_on_a_sigterm_delivered_to_another_thread(tmp_path: Path) -> None:
    with KubeApiStandin() as kube:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_EXTENDER_")}
        proc = subprocess.Popen([sys.executable, "-m", "memslice", "extender", "--address", "127.0.0.1", "--port",
                                 "0", "--kubeconfig", kube.kubeconfig(str(tmp_path / "kc"))],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            assert proc.stdout is not None
            assert "serving" in proc.stdout.readline()
            assert "ready" in proc.stdout.readline()
            sigterm_to_a_non_main_thread(proc.pid)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_node_agent_stops_on_a_sigterm_delivered_to_another_thread() -> None:
    root = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))  # Unix socket paths must stay short
    agent = AgentProcess(root).start()
    try:
        agent.wait_log(re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/"), "the metrics endpoint", 60)
        assert agent.proc is not None
        sigterm_to_a_non_main_thread(agent.proc.pid)
        assert agent.proc.wait(60) == 0
    finally:
        agent.kill() if agent.proc is not None and agent.proc.poll() is None else None
        shutil.rmtree(root, ignore_errors=True)

"""Node-agent start-up cost: CPU-seconds and wall time from exec to the first answers, medians over N starts.

    .venv/bin/python benchmarks/bench_agent_start.py [--json] [--starts N] [--only standalone|device-plugin|dra]

Each start is a real `memslice node-agent --simulate` process in a fresh directory, next to the kubelet stand-in
(device-plugin modes) or the kubelet DRA stand-in (DRA mode) and, except standalone, the Kubernetes API stand-in.
Polled every 5 ms from exec: the first answer of /healthz (HTTP), the kubelet's first answer (device plugin:
the stand-in received the first ListAndWatch message; DRA: the stand-in's GetInfo and NotifyRegistrationStatus
went through: it polls the registry every 50 ms), /readyz 200; then the process's CPU once it is idle (two
0.25 s samples without a tick: what the threads started at start-up, the Kubernetes calls included, cost).
CPU is utime+stime of /proc/PID/stat (all threads; 10 ms ticks) at each of those moments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
__import__("testpaths").add()  # the test folders (tests/testpaths.py)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import kube_standin_dra  # noqa: E402
from kube_standin import KubeApiStandin  # noqa: E402
from kubelet_dra_standin import KubeletDraStandin  # noqa: E402
from kubelet_standin import KubeletStandin  # noqa: E402

RESOURCE = "memslice.io/gpu-mem"
DRIVER = "memslice.io"
NODE = "bench"
TICK = os.sysconf("SC_CLK_TCK")
MODES = ("standalone", "device-plugin", "dra")


def cpu_s(pid: int) -> float:
    """utime + stime of the whole process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(port: int, path: str) -> int | None:
    """The status of GET path, or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def command(mode: str, root: Path, port: int, kubeconfig: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "memslice", "node-agent", "--simulate", "16GiB", "--region-root",
           str(root / "regions"), "--shim-host-dir", str(root / "lib"), "--metrics-address", "127.0.0.1",
           "--metrics-port", str(port)]
    if mode == "dra":
        cmd += ["--kubelet-api", "dra", "--plugins-registry-dir", str(root / "registry"), "--kubelet-plugins-dir",
                str(root / "plugins"), "--cdi-dir", str(root / "cdi")]
    else:
        cmd += ["--unit-mib", "4", "--device-plugin-dir", str(root / "dp"), "--pod-resources-socket",
                str(root / "pr" / "kubelet.sock"), "--reconcile-interval-s", "10"]
    if kubeconfig is not None:
        cmd += ["--kubeconfig", kubeconfig, "--node-name", NODE]
    return cmd


def one_start(mode: str, api: KubeApiStandin | None, timeout: float = 60.0) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="msb-start-", dir="/tmp"))
    port = free_port()
    kubelet: Any
    if mode == "dra":
        kubelet = KubeletDraStandin(root / "registry", kube=api, node=NODE).start()
        registered = lambda: DRIVER in kubelet.registered  # noqa: E731
    else:
        kubelet = KubeletStandin(root / "dp", root / "pr" / "kubelet.sock").start()
        registered = lambda: RESOURCE in kubelet.endpoints and kubelet.endpoints[RESOURCE].messages > 0  # noqa: E731
    kubeconfig = api.kubeconfig(str(root / "kubeconfig")) if api is not None else None
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MEMSLICE_") and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "NODE_NAME")}
    env.update({"MEMSLICE_SIM_STATE": str(root / "sim.state"), "HOME": str(root)})
    out: dict[str, float] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(command(mode, root, port, kubeconfig), stdout=subprocess.DEVNULL,
                            stderr=open(root / "agent.log", "wb"), env=env, cwd=ROOT)  # noqa: SIM115
    try:
        deadline = t0 + timeout
        while "ready_s" not in out:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: the agent {'exited' if proc.poll() is not None else 'is not ready'}"
                                   f" ({out}):\n{(root / 'agent.log').read_text()[-3000:]}")
            if "health_s" not in out and http_status(port, "/healthz") is not None:
                out["health_s"], out["health_cpu_s"] = time.monotonic() - t0, cpu_s(proc.pid)
            if "kubelet_s" not in out and registered():
                out["kubelet_s"], out["kubelet_cpu_s"] = time.monotonic() - t0, cpu_s(proc.pid)
            if "kubelet_s" in out and http_status(port, "/readyz") == 200:
                out["ready_s"], out["ready_cpu_s"] = time.monotonic() - t0, cpu_s(proc.pid)
            time.sleep(0.005)
        last, still = cpu_s(proc.pid), 0
        settle = time.monotonic() + 20
        while still < 2 and time.monotonic() < settle:
            time.sleep(0.25)
            now = cpu_s(proc.pid)
            still = still + 1 if now == last else 0
            last = now
        out["idle_cpu_s"] = last
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def run(mode: str, starts: int) -> dict[str, Any]:
    api = KubeApiStandin() if mode != "standalone" else None
    try:
        if api is not None:
            api.__enter__()
            api.put({"kind": "Node", "metadata": {"name": NODE}})
            api.put(kube_standin_dra.device_class())
        runs = [one_start(mode, api) for _ in range(starts)]
    finally:
        if api is not None:
            api.__exit__(None, None, None)
    row: dict[str, Any] = {"mode": mode, "starts": starts}
    for key in runs[0]:
        row[key + "_median"] = round(statistics.median(r[key] for r in runs), 3)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--starts", type=int, default=5, help="agent starts per mode (default 5)")
    ap.add_argument("--only", choices=MODES, help="one mode only")
    a = ap.parse_args()
    rows = [run(m, a.starts) for m in MODES if a.only in (None, m)]
    if a.json:
        print(json.dumps({"agent_start": rows}, indent=2))
        return 0
    print(f"Node-agent start, medians of {a.starts} starts (s; cpu = CPU-seconds of the agent process at that "
          f"moment)")
    print(f"{'mode':<15}{'healthz':>9}{'cpu':>7}{'kubelet':>9}{'cpu':>7}{'ready':>8}{'cpu':>7}{'idle cpu':>10}")
    for r in rows:
        print(f"{r['mode']:<15}{r['health_s_median']:>9}{r['health_cpu_s_median']:>7}{r['kubelet_s_median']:>9}"
              f"{r['kubelet_cpu_s_median']:>7}{r['ready_s_median']:>8}{r['ready_cpu_s_median']:>7}"
              f"{r['idle_cpu_s_median']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

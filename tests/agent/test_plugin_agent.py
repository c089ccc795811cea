"""The node agent against the kubelet stand-in: real processes, real gRPC on Unix sockets, the simulated GPU.

Each test starts `memslice node-agent --simulate ...` as a process of its own (the simulated driver binds
a process to one simulated node, and restarts are real process restarts), next to a kubelet stand-in.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import ChildLog
from kubelet_standin import KubeletStandin
from prometheus_client.parser import text_string_to_metric_families

from memslice.paths import lib_paths
from memslice.proto import api_pb2

RESOURCE = "memslice.io/gpu-mem"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: Unix socket paths must stay under 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def inject_xid(state: Path, gpu: int, xid: int) -> None:
    """`memslice sim xid`: queue an Xid event on the simulated node (in a child process: a process binds to
    one simulated node)."""
    subprocess.run([sys.executable, "-m", "memslice", "sim", "xid", "--gpu", str(gpu), "--xid", str(xid),
                    "--state", str(state)], check=True, timeout=30)


class AgentProcess:
    """`memslice node-agent` as a child process, with every path inside one temporary directory."""

    def __init__(self, root: Path, sim_gpus: str = "16GiB,24GiB:1", unit_mib: int = 4,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.root = root
        self.plugin_dir = root / "dp"
        self.pod_resources = root / "pr" / "kubelet.sock"
        self.region_root = root / "regions"
        self.shim_dir = root / "lib"
        self.sim_state = root / "sim.state"
        self.log_path = root / f"agent-{len(list(root.glob('agent-*.log')))}.log"
        self.sim_gpus = sim_gpus
        self.unit_mib = unit_mib
        self.args = args
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.output: ChildLog | None = None
        self._port: int | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "memslice", "node-agent", "--simulate", self.sim_gpus,
                "--unit-mib", str(self.unit_mib), "--device-plugin-dir", str(self.plugin_dir),
                "--pod-resources-socket", str(self.pod_resources), "--region-root", str(self.region_root),
                "--shim-host-dir", str(self.shim_dir), "--metrics-address", "127.0.0.1",
                "--metrics-port", "0",
                "--reconcile-interval-s", "0.2", *self.args]

    def start(self) -> AgentProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST",
                                                                "MEMSLICE_SIM_GPUS", "NODE_NAME")}
        # HOME: a developer's ~/.kube/config is a place the agent looks for the API (memslice.kube.config)
        env.update({"MEMSLICE_SIM_STATE": str(self.sim_state), "HOME": str(self.root), **self.env})
        self._port = None
        self.log_path = self.root / f"agent-{len(list(self.root.glob('agent-*.log')))}.log"
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                     cwd=ROOT)
        self.output = ChildLog(self.proc, self.log_path)
        return self

    def log(self) -> str:
        assert self.output is not None
        return self.output.text()

    def wait_log(self, needle: str | re.Pattern[str], what: str | None = None, timeout: float = 15.0) -> Any:
        """Wait until the agent's output contains `needle` (a string, or a pattern: its match is returned);
        fails at once if the agent exits first."""
        assert self.output is not None
        if isinstance(needle, str):
            return self.output.wait_for(lambda text: needle in text, timeout, what or repr(needle))
        return self.output.wait_for(needle.search, timeout, what or needle.pattern)

    @property
    def port(self) -> int:
        if self._port is None:
            m = self.wait_log(re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/"), "the metrics endpoint")
            self._port = int(m.group(1))
        return self._port

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        _, text = self.get("/metrics")
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def sample(self, name: str, **labels: str) -> list[float]:
        return [v for (n, lv), v in self.metrics().items()
                if n == name and all(dict(lv).get(k) == want for k, want in labels.items())]

    def wait_exit(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def node(short_tmp: Path) -> Iterator[tuple[KubeletStandin, Callable[..., AgentProcess]]]:
    """A kubelet stand-in in `short_tmp`, and a factory for agents next to it (stopped at the end)."""
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    agents: list[AgentProcess] = []

    def make(**kw: object) -> AgentProcess:
        a = AgentProcess(short_tmp, **kw)  # type: ignore[arg-type]
        agents.append(a)
        return a.start()

    yield kubelet, make
    for a in agents:
        a.stop()
    kubelet.stop()


def gpu_of(ids: list[str]) -> set[str]:
    return {i.split("-")[0] for i in ids}


# --- discovery, registration, ListAndWatch ---------------------------------------------------------------

def test_discovery_registration_and_device_list(node):
    kubelet, make = node
    agent = make(sim_gpus="16GiB,24GiB:1,8GiB:0:mig", unit_mib=4)
    ep = kubelet.wait_registered(RESOURCE)
    assert ep.options.get_preferred_allocation_available and not ep.options.pre_start_required
    assert ep.socket.name == "memslice-gpu-mem.sock"
    devices = dict(ep.devices)
    assert len(devices) == 16384 // 4 + 24576 // 4  # the MIG-enabled GPU is skipped
    assert {d.health for d in devices.values()} == {"Healthy"}
    assert devices["g0-0"].topology.nodes[0].ID == 0 and devices["g1-6143"].topology.nodes[0].ID == 1
    assert "g1-6144" not in devices and not any(i.startswith("g2-") for i in devices)
    assert ep.last_message_bytes < 4 * 1024 * 1024
    log = agent.log()
    assert "MIG enabled: skipped" in log
    assert log.count("standalone:") == 1
    assert agent.get("/readyz")[0] == 200 and agent.get("/healthz")[0] == 200


def test_health_change_reaches_list_and_watch(node):
    kubelet, make = node
    agent = make(args=("--health-recovery-s", "2"))
    kubelet.wait_registered(RESOURCE)
    inject_xid(agent.sim_state, 1, 13)  # application Xid: ignored
    agent.wait_log("Xid 13 ignored", "the ignored Xid")
    assert kubelet.allocatable(RESOURCE) == (16384 + 24576) // 4
    inject_xid(agent.sim_state, 1, 79)
    seen: dict[str, str] = {}

    def gpu1_unhealthy() -> bool:  # snapshot the list the moment it arrives (recovery follows in 2 s)
        ep = kubelet.endpoints.get(RESOURCE)
        if ep is None or ep.devices["g1-0"].health != "Unhealthy":
            return False
        seen.update({i: d.health for i, d in ep.devices.items()})
        return True

    assert kubelet.wait_for(gpu1_unhealthy)
    assert {h for i, h in seen.items() if i.startswith("g1-")} == {"Unhealthy"}
    assert {h for i, h in seen.items() if i.startswith("g0-")} == {"Healthy"}
    assert len(seen) == (16384 + 24576) // 4  # capacity keeps the unhealthy devices
    # recovery: no further critical Xid for 2 s and NVML still answers
    kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == (16384 + 24576) // 4)
    assert "Healthy again" in agent.log()


def test_list_over_the_kubelet_limit_fails_at_start_and_names_the_unit(node):
    _, make = node
    agent = make(sim_gpus=",".join(["80GiB"] * 8), unit_mib=1)
    assert agent.wait_exit() == 1
    log = agent.log()
    assert "over the kubelet's 4194304-byte limit" in log and "--unit-mib 5 or larger" in log
    assert not (agent.plugin_dir / "memslice-gpu-mem.sock").exists()


# --- allocation ------------------------------------------------------------------------------------------

def test_allocate_response_gives_quota_region_shim_and_gpu(node):
    kubelet, make = node
    agent = make(unit_mib=4)
    kubelet.wait_registered(RESOURCE)
    resp = kubelet.admit("uid-1", "ns", "pod-1", [("main", 1000)], RESOURCE)["main"]
    ids = kubelet.pods["uid-1"].containers["main"][RESOURCE]
    assert len(gpu_of(ids)) == 1  # preferred allocation kept the kubelet on one GPU
    assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == "4000"
    assert resp.envs["MEMSLICE_REGION_DIR"] == "/run/memslice/region"
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    assert "LD_PRELOAD" not in resp.envs and not resp.cdi_devices
    mounts = {m.container_path: m for m in resp.mounts}
    shim = mounts["/usr/local/memslice/lib/libmemslice.so"]
    preload = mounts["/etc/ld.so.preload"]
    region = mounts["/run/memslice/region"]
    assert shim.read_only and preload.read_only and not region.read_only
    assert Path(shim.host_path) == agent.shim_dir / "libmemslice.so"
    assert Path(shim.host_path).read_bytes() == Path(lib_paths().shim).read_bytes()  # installed copy
    assert sorted(os.listdir(agent.shim_dir)) == ["ld.so.preload", "libmemslice.so"]  # no temp files left
    assert Path(preload.host_path).read_text() == "/usr/local/memslice/lib/libmemslice.so\n"
    region_dir = Path(region.host_path)
    assert region_dir.parent == agent.region_root and region_dir.is_dir()
    assert re.fullmatch(r"g[01]-[0-9a-f]{12}", region_dir.name) and region_dir.name[:2] == ids[0][:2]
    assert os.stat(region_dir).st_mode & 0o777 == 0o777
    # the GPU made visible is the one the IDs belong to
    gpu_index = ids[0][1]
    assert agent.sample("memslice_gpu_allocated_mib", gpu=gpu_index) == [4000.0]
    cap = [dict(lv) for (n, lv) in agent.metrics() if n == "memslice_gpu_capacity_mib"]
    assert {c["gpu"]: c["uuid"] for c in cap}[gpu_index] == resp.envs["NVIDIA_VISIBLE_DEVICES"]


def test_the_limits_file_names_the_nodes_driver_libraries(node):
    # issue 35 item 2: the shim loads NVML and libcuda from what the agent resolved, never the tenant's path
    kubelet, make = node
    make(unit_mib=4)
    kubelet.wait_registered(RESOURCE)
    resp = kubelet.admit("uid-1", "ns", "pod-1", [("main", 16)], RESOURCE)["main"]
    mounts = {m.container_path: m for m in resp.mounts}
    limits = Path(mounts["/run/memslice/limits"].host_path).read_text().splitlines()
    assert {"nvml_path=/usr/local/memslice/sim/lib/libnvidia-ml.so.1",
            "cuda_path=/usr/local/memslice/sim/lib/libcuda.so.1"} <= set(limits)
    sim = mounts["/usr/local/memslice/sim/lib"]  # the simulated driver, mounted read-only where the keys point
    assert sim.read_only and (Path(sim.host_path) / "libnvidia-ml.so.1").is_file()
    assert (Path(sim.host_path) / "libcuda.so.1").is_file()


def test_env_preload_and_cdi_visibility_options(node):
    kubelet, make = node
    make(args=("--preload", "env", "--visibility", "cdi"))
    kubelet.wait_registered(RESOURCE)
    resp = kubelet.admit("uid-1", "ns", "pod-1", [("main", 10)], RESOURCE)["main"]
    assert resp.envs["LD_PRELOAD"] == "/usr/local/memslice/lib/libmemslice.so"
    assert "NVIDIA_VISIBLE_DEVICES" not in resp.envs
    assert [d.name.split("=")[0] for d in resp.cdi_devices] == ["nvidia.com/gpu"]
    assert resp.cdi_devices[0].name.split("=")[1].startswith("GPU-")
    assert "/etc/ld.so.preload" not in {m.container_path for m in resp.mounts}


def test_preferred_allocation_packs_one_gpu_without_a_reservation(node):
    kubelet, make = node
    make(unit_mib=4)  # GPU 0: 4096 units, GPU 1: 6144 units
    kubelet.wait_registered(RESOURCE)
    kubelet.admit("a", "ns", "a", [("c", 3000)], RESOURCE)
    assert gpu_of(kubelet.pods["a"].containers["c"][RESOURCE]) == {"g0"}  # tightest fit
    kubelet.admit("b", "ns", "b", [("c", 2000)], RESOURCE)
    assert gpu_of(kubelet.pods["b"].containers["c"][RESOURCE]) == {"g1"}  # 1096 left on g0: too small
    kubelet.admit("c", "ns", "c", [("c", 1000), ("d", 96)], RESOURCE)
    assert gpu_of(kubelet.pods["c"].containers["c"][RESOURCE]) == {"g0"}
    assert gpu_of(kubelet.pods["c"].containers["d"][RESOURCE]) == {"g0"}


def test_bad_requests_get_grpc_errors_and_change_nothing(node):
    kubelet, make = node
    agent = make(unit_mib=4)
    ep = kubelet.wait_registered(RESOURCE)

    def allocate(ids: list[str]) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as exc:
            ep.stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
        return exc.value

    err = allocate(["g0-1", "g0-2", "g1-1"])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "span GPU 0 (8 MiB), GPU 1 (4 MiB)" in err.details() and "one GPU" in err.details()
    assert "not a memslice device ID" in allocate(["GPU-123-1"]).details()
    assert "GPU 5" in allocate(["g5-0"]).details()
    assert "no memslice.io/gpu-mem devices" in allocate([]).details()
    with pytest.raises(grpc.RpcError) as exc:
        ep.stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["nope"], allocation_size=1)]),
            timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'nope'" in exc.value.details()
    assert list(agent.region_root.iterdir()) == []
    assert agent.sample("memslice_allocate_errors_total") == [4.0]
    assert agent.sample("memslice_gpu_allocated_mib") == [0.0, 0.0]
    # the agent still serves the kubelet
    kubelet.admit("uid-1", "ns", "p", [("c", 1)], RESOURCE)


# --- restarts --------------------------------------------------------------------------------------------

def test_kubelet_restart_re_registers_and_keeps_serving(node):
    kubelet, make = node
    agent = make()
    kubelet.wait_registered(RESOURCE)
    kubelet.admit("uid-1", "ns", "p1", [("c", 100)], RESOURCE)
    before = kubelet.registrations
    kubelet.restart()  # wipes the socket directory, new kubelet.sock
    assert not kubelet.endpoints
    kubelet.wait_registered(RESOURCE, after=before)
    assert (agent.plugin_dir / "memslice-gpu-mem.sock").exists()
    assert kubelet.allocatable(RESOURCE) == (16384 + 24576) // 4
    kubelet.admit("uid-2", "ns", "p2", [("c", 100)], RESOURCE)
    assert "registering again" in agent.log()
    assert agent.sample("memslice_kubelet_registered") == [1.0]
    assert agent.sample("memslice_kubelet_registrations_total") == [2.0]


def test_agent_restart_recovers_allocations_from_pod_resources(node):
    kubelet, make = node
    agent = make(unit_mib=4)
    kubelet.wait_registered(RESOURCE)
    kubelet.admit("uid-1", "ns", "p1", [("a", 1000), ("b", 500)], RESOURCE)
    region_dirs = sorted(p.name for p in agent.region_root.iterdir() if p.is_dir())
    assert len(region_dirs) == 2
    agent.kill()
    for meta in agent.region_root.glob("*.json"):  # the agent's own records are lost too
        meta.unlink()
    before = kubelet.registrations
    agent.start()
    kubelet.wait_registered(RESOURCE, after=before)
    assert sorted(p.name for p in agent.region_root.iterdir() if p.is_dir()) == region_dirs
    ids = kubelet.pods["uid-1"].containers["a"][RESOURCE]
    assert agent.sample("memslice_gpu_allocated_mib", gpu=ids[0][1]) == [6000.0]
    quotas = {dict(lv)["container"]: v for (n, lv), v in agent.metrics().items()
              if n == "memslice_container_quota_mib"}
    assert quotas == {"a": 4000.0, "b": 2000.0}
    assert "recovered from the kubelet's record" in agent.log()
    # nothing is handed out twice: the next pod gets other devices
    kubelet.admit("uid-2", "ns", "p2", [("a", 100)], RESOURCE)
    first = kubelet.pods["uid-1"].containers
    taken = set(first["a"][RESOURCE]) | set(first["b"][RESOURCE])
    assert not taken & set(kubelet.pods["uid-2"].containers["a"][RESOURCE])


def test_region_directories_are_removed_when_the_pod_is_gone(node):
    kubelet, make = node
    agent = make()
    kubelet.wait_registered(RESOURCE)
    resp = kubelet.admit("uid-1", "ns", "p1", [("c", 10)], RESOURCE)["c"]
    keep = kubelet.admit("uid-2", "ns", "p2", [("c", 10)], RESOURCE)["c"]
    gone_dir = Path(next(m.host_path for m in resp.mounts if m.container_path == "/run/memslice/region"))
    keep_dir = Path(next(m.host_path for m in keep.mounts if m.container_path == "/run/memslice/region"))
    assert gone_dir.is_dir()
    kubelet.remove_pod("uid-1")
    agent.wait_log(f"removed region {gone_dir.name}", "the removal logged")  # logged once it is removed
    assert not gone_dir.exists()
    assert not gone_dir.with_suffix(".json").exists()  # removed first
    assert keep_dir.is_dir()


def test_metrics_are_scraped_over_http(node):
    kubelet, make = node
    agent = make(unit_mib=4)
    kubelet.wait_registered(RESOURCE)
    kubelet.admit("uid-1", "ns", "p1", [("c", 256)], RESOURCE)
    m = agent.metrics()
    def per_gpu(name: str) -> dict[str, float]:
        return {dict(lv)["gpu"]: v for (n, lv), v in m.items() if n == name}

    # advertised: what can be allocated (CUDA's total), not NVML's total, which adds the reserved memory
    assert per_gpu("memslice_gpu_capacity_mib") == {"0": 16384.0, "1": 24576.0}
    assert per_gpu("memslice_gpu_allocatable_mib") == {"0": 16384.0, "1": 24576.0}
    assert per_gpu("memslice_gpu_nvml_total_mib") == {"0": 16384.0 + 96, "1": 24576.0 + 144}
    assert per_gpu("memslice_gpu_reserved_mib") == {"0": 96.0, "1": 144.0}
    assert sorted(v for (n, _), v in m.items() if n == "memslice_gpu_used_mib") == [0.0, 0.0]
    assert m[("memslice_kubelet_registered", ())] == 1.0
    assert m[("memslice_allocate_seconds_count", ())] == 1.0
    assert m[("memslice_preferred_allocation_seconds_count", ())] == 1.0
    (quota,) = [(dict(lv), v) for (n, lv), v in m.items() if n == "memslice_container_quota_mib"]
    assert quota[1] == 1024.0 and re.fullmatch(r"g[01]-[0-9a-f]{12}", quota[0]["region"])
    status, body = agent.get("/nope")
    assert status == 404 and "/metrics" in body


def test_agent_started_before_the_kubelet_registers_when_it_appears(short_tmp):
    agent = AgentProcess(short_tmp).start()
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock")
    try:
        agent.wait_log("waiting for the kubelet", "the agent to wait for kubelet.sock")
        assert agent.get("/readyz")[0] == 503
        kubelet.start()
        kubelet.wait_registered(RESOURCE)
        assert agent.get("/readyz")[0] == 200
    finally:
        agent.stop()
        kubelet.stop()


def test_refused_registration_is_retried(node):
    kubelet, make = node
    kubelet.reject_registrations = 2
    kubelet.reject_only = RESOURCE  # the memory resource's (the metrics are its; gpu-compute registers apart)
    agent = make()
    kubelet.wait_registered(RESOURCE)
    assert "registration rejected by the test" in agent.log() and "(attempt 1)" in agent.log()
    assert agent.sample("memslice_kubelet_registration_errors_total") == [2.0]
    assert agent.sample("memslice_kubelet_registrations_total") == [1.0]


def test_allocatable_is_nvmls_total_less_reserved_and_at_most_cudas() -> None:
    """The H100's figures (NVML 81,559 MiB, 480 reserved, CUDA 81,079): what is advertised is what can be had."""
    from memslice.plugin.gpu.nvml import allocatable_mib

    mib = 1 << 20
    assert allocatable_mib(81559 * mib, 480 * mib, 81079 * mib) == 81079
    assert allocatable_mib(81559 * mib, 480 * mib, None) == 81079      # no libcuda on the node agent
    assert allocatable_mib(81559 * mib, None, 81079 * mib) == 81079    # a driver without the v2 call
    assert allocatable_mib(81559 * mib, 480 * mib, 80000 * mib) == 80000  # CUDA's word is the bound
    assert allocatable_mib(81559 * mib, None, None) == 81559           # nothing else to go by

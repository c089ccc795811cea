"""A real node for tests: containerd 2.x (with Debian's runc, CDI on) and the real kubelet, built from
k8s.io/kubernetes and containerd's Go module by tests/kubenode/build.sh (`make kubenode`), joined to the
real control plane of tests/support/kube_real.py.

What this machine kind imposes, and how it is met:
- cgroup v1 only: the kubelet runs with failCgroupV1: false and the cgroupfs driver (no systemd here);
- no registry: the pause image and the test image are assembled from local files (tests/support/kube_node_images.py)
  and imported with ctr into containerd's k8s.io namespace; pods use imagePullPolicy: Never;
- no CNI plugins: containerd reports its pod network not ready, so the Node stays NotReady and its test pods
  use the host's network (the kubelet runs host-network pods on such a node); the not-ready taint the API
  server put on the new Node is lifted by the admin, as the node lifecycle controller would.
- the kubelet's device-plugin directory is a constant of the kubelet (pluginapi.KubeletSocket:
  /var/lib/kubelet/device-plugins/kubelet.sock, whatever --root-dir says): one real node per machine at a
  time, held by an exclusive lock (LOCK); everything else (kubelet root, containerd root and state,
  CDI spec dir, pod logs, runc's state) lives under the node's temporary directory, and stop() leaves
  nothing behind: no process, no mount, no cgroup (the shims' sockets, in containerd's fixed
  /run/containerd/s, go with their shims).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from conftest import ChildLog
from kube_real import ROOT, Proc, RealCluster, free_port, kubelet_token, wait_until
from waiting import stop_process

from memslice.plugin.regions import CONTAINER_LIMITS_FILE, CONTAINER_PRELOAD

BIN_DIR = Path(os.environ.get("MEMSLICE_KUBENODE", ROOT / "build" / "kubenode"))
PROGRAMS = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # pluginapi.DevicePluginPath, fixed in the kubelet
LOCK = Path("/tmp/memslice-test-realnode.lock")  # one real node per machine: the device-plugin directory
LOCK_WAIT_S = 300.0  # another test session's node on this machine: wait for it this long, then fail
CGROUP_ROOT = Path("/sys/fs/cgroup")
SHIM_SOCKET_DIRS = (Path("/run/containerd/s"), Path("/run/containerd"))  # fixed in containerd: its shims' sockets
START_TIMEOUT_S = 180.0  # a kubelet start on a loaded 2-core machine: ~5-30 s
K8S_NS = "k8s.io"  # containerd's namespace for the CRI plugin's images and containers
AGENT_NS = "memslice-system"  # deploy/'s namespace: the node agent's ServiceAccount and pod

# The test pods' program (container "cuda" of the test image): what the shim's mounts look like from inside,
# then a CUDA program over its quota, then it stays (a pod that runs while the kubelet and the agent restart).
# alloc_direct's context takes CONTEXT_MIB of the quota (the simulated GPU's default, an H100's, as the shim
# counts it): a 1024 MiB quota holds 400 MiB more, not 200 more after that, and 100 more still.
CONTEXT_MIB = 520
CLIENT_SCRIPT = f"""
echo "preload=$(cat {CONTAINER_PRELOAD})"
echo "limit-env=$MEMSLICE_GPU_MEM_LIMIT visible=$NVIDIA_VISIBLE_DEVICES"
(echo x > {CONTAINER_PRELOAD}) 2>/dev/null && echo preload-writable || echo preload-read-only
(echo x > {CONTAINER_LIMITS_FILE}) 2>/dev/null && echo limits-writable || echo limits-read-only
/bin/alloc_direct 400 200 100
echo "client-exit=$?"
exec sleep 100000
"""


def why_unavailable() -> str | None:
    """Why a real node cannot run here (None when it can). Not root, no runc, no cgroup v1 memory controller:
    skip, saying so. With Go, missing binaries are a build step not run (`make kubenode`): a failure."""
    if os.geteuid() != 0:
        return "a real node (kubelet, containerd, runc) needs root"
    if shutil.which("runc") is None:
        return "a real node needs runc: `apt-get install runc`"
    if not (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists() and \
            not (CGROUP_ROOT / "cgroup.controllers").exists():
        return "a real node needs cgroups (v1 memory controller at /sys/fs/cgroup/memory, or v2)"
    missing = [p for p in PROGRAMS if not (BIN_DIR / p).is_file()]
    if not missing:
        return None
    if shutil.which("go") is None:
        return f"a real node needs Go to build {', '.join(missing)} in {BIN_DIR} (`make kubenode`)"
    raise AssertionError(f"{BIN_DIR}: {', '.join(missing)} missing: run `make kubenode` (make test builds it first)")


def containerd_config(d: Path, sock: Path) -> str:
    """containerd 2.x's configuration (version 3): its own root, state, socket and CDI spec directory;
    runc through the runc v2 shim with cgroupfs; the locally imported pause image as the sandbox image; an
    empty CNI directory of its own (no pod network: host-network pods only). restrict_oom_score_adj: this
    machine's root lacks CAP_SYS_RESOURCE, so no process may lower its oom_score_adj below containerd's (the
    kubelet asks -998 for a sandbox; runc fails "failed to update /proc/self/oom_score_adj: Permission
    denied" without it)."""
    from kube_node_images import PAUSE_IMAGE

    runc = os.environ.get("MEMSLICE_TEST_RUNC") or shutil.which("runc")
    return f"""version = 3
root = "{d / 'root'}"
state = "{d / 'state'}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile",
                    "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = "{sock}.debug"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d / 'opt'}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["{d / 'cdi'}"]
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d / 'runc'}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{d / 'cni-bin'}"]
    conf_dir = "{d / 'cni'}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def kubelet_config(d: Path, sock: Path, port: int) -> dict[str, Any]:
    """The KubeletConfiguration: cgroup v1 allowed (failCgroupV1: false), the cgroupfs driver, containerd's
    socket, its own pod-log directory; no anonymous or webhook auth (nothing calls it but the tests);
    eviction and image GC thresholds out of the way (a shared test machine is not this node's to manage)."""
    return {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{sock}", "address": "127.0.0.1", "port": port,
            "readOnlyPort": 0, "healthzPort": 0, "podLogsDir": str(d / "pod-logs"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}, "x509": {}},
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "2s", "syncFrequency": "10s", "serializeImagePulls": False,
            "shutdownGracePeriod": "0s", "registerNode": True}


class RealNode:
    """containerd and the kubelet of one Node `name` of `cluster`, everything under `workdir`."""

    def __init__(self, cluster: RealCluster, workdir: Path, name: str) -> None:
        self.cluster, self.dir, self.name = cluster, workdir, name
        self.ctrd_dir = workdir / "ctrd"
        self.sock = workdir / "containerd.sock"
        self.kubelet_root = workdir / "kubelet"
        self.pod_resources = self.kubelet_root / "pod-resources" / "kubelet.sock"
        self.plugins_registry = self.kubelet_root / "plugins_registry"
        self.cdi_dir = self.ctrd_dir / "cdi"
        self.containerd: Proc | None = None
        self.kubelet: Proc | None = None
        self.kubelet_runs = 0
        self._lock: int | None = None
        self._dp_before: set[str] = set()
        self._made_dirs = [d for d in (*SHIM_SOCKET_DIRS, DEVICE_PLUGIN_DIR, DEVICE_PLUGIN_DIR.parent)
                           if not d.exists()]

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self, images: list[Path]) -> RealNode:
        self._take_lock()
        for sub in ("root", "state", "opt", "cdi", "cni", "cni-bin"):
            (self.ctrd_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.ctrd_dir / "config.toml").write_text(containerd_config(self.ctrd_dir, self.sock))
        env = dict(os.environ, PATH=f"{BIN_DIR}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self.containerd = Proc("containerd", [str(BIN_DIR / "containerd"), "--config",
                                              str(self.ctrd_dir / "config.toml")], self.dir / "containerd.log", env)
        wait_until("containerd's socket", lambda: self.sock.exists() and self._ctr_ok(), START_TIMEOUT_S, 0.2,
                   self.containerd.check_alive)
        for archive in images:
            self.ctr("images", "import", "--platform", "linux/amd64", str(archive))
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        (self.dir / "pod-logs").mkdir(exist_ok=True)
        self.kubelet_port = free_port()
        (self.dir / "kubelet-config.yaml").write_text(yaml.safe_dump(kubelet_config(self.dir, self.sock,
                                                                                   self.kubelet_port)))
        self.kubeconfig = self.cluster.kubeconfig(f"kubelet-{self.name}", kubelet_token(self.name))
        self.start_kubelet()
        node = wait_until(f"Node {self.name} registered by its kubelet", self._node, START_TIMEOUT_S, 0.5,
                          self.check_alive)
        # The API server's TaintNodesByCondition admission tainted the new Node not-ready; the node lifecycle
        # controller (not run here) would lift it once Ready: the admin does, as in kube_real.register_node.
        taints = [t for t in node["spec"].get("taints", []) if t["key"] != "node.kubernetes.io/not-ready"]
        self.cluster.ok("PATCH", f"/api/v1/nodes/{self.name}", {"spec": {"taints": taints or None}},
                        content_type="application/merge-patch+json")
        return self

    def start_kubelet(self) -> Proc:
        self.kubelet_runs += 1
        cmd = [str(BIN_DIR / "kubelet"), f"--config={self.dir / 'kubelet-config.yaml'}",
               f"--kubeconfig={self.kubeconfig}", f"--root-dir={self.kubelet_root}",
               f"--cert-dir={self.dir / 'kubelet-pki'}", f"--hostname-override={self.name}", "--v=2"]
        self.kubelet = Proc("kubelet", cmd, self.dir / f"kubelet-{self.kubelet_runs}.log")
        return self.kubelet

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()

    def restart_kubelet(self) -> Proc:
        """The kubelet restarts (its pods and containerd go on), as on a node upgrade or crash."""
        self.stop_kubelet()
        return self.start_kubelet()

    def check_alive(self) -> None:
        for p in (self.containerd, self.kubelet):
            if p is not None:
                p.check_alive()

    def stop(self) -> None:
        """Stop the kubelet, every container containerd runs (their shims exit), containerd; unmount what is
        left under the node's directory; remove the kubelet's cgroups and its files in the device-plugin
        directory; release the node lock. Without the lock (another session's node) nothing here is ours."""
        if self._lock is None:
            return
        try:
            self.stop_kubelet()
            if self.containerd is not None and self.containerd.proc.poll() is None:
                self._remove_containers()
            if self.containerd is not None:
                self.containerd.stop()
            self._kill_shims()
            self._unmount_all()
            self._remove_cgroups()
            self._clean_device_plugin_dir()
            for d in self._made_dirs:  # made for this node (the shims' socket dirs: empty once they exit)
                _rmdir(str(d))
        finally:
            self._release_lock()

    # -- helpers ---------------------------------------------------------------------------------------
    def ctr(self, *args: str, timeout: float = 120) -> str:
        run = subprocess.run([str(BIN_DIR / "ctr"), "--address", str(self.sock), "--namespace", K8S_NS, *args],
                             capture_output=True, text=True, timeout=timeout)
        assert run.returncode == 0, f"ctr {' '.join(args)}: {run.returncode}\n{run.stdout}\n{run.stderr}"
        return run.stdout

    def _ctr_ok(self) -> bool:
        run = subprocess.run([str(BIN_DIR / "ctr"), "--address", str(self.sock), "version"],
                             capture_output=True, timeout=30)
        return run.returncode == 0

    def _node(self) -> dict[str, Any] | None:
        status, out = self.cluster.request("GET", f"/api/v1/nodes/{self.name}")
        return out if status == 200 else None

    def pod_log(self, pod: dict[str, Any], container: str, stream: str | None = None) -> str:
        """What the container wrote (the kubelet's log file of its latest run, CRI format "time stream tag text":
        the text only), of one stream ("stdout" or "stderr") if given: containerd copies the two pipes apart, so
        their lines interleave in no fixed order."""
        meta = pod["metadata"]
        d = self.dir / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
        files = sorted(d.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1) if d.exists() else []
        if not files:
            return ""
        out = []
        for line in files[-1].read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) < 4:
                out.append(line + "\n")
            elif stream is None or parts[1] == stream:
                out.append(parts[3] + "\n")
        return "".join(out)

    def running_client(self, ns: str, name: str, alive: Any) -> dict[str, Any]:
        """Pod `name` once its container "cuda" runs CLIENT_SCRIPT and the CUDA program has finished."""
        def ready() -> dict[str, Any] | None:
            p = pod(self.cluster, ns, name)
            if p is None or "running" not in container_state(p, "cuda"):
                return None
            return p if "client-exit=" in self.pod_log(p, "cuda") else None
        return dict(wait_until(f"pod {ns}/{name} running its CUDA client", ready, 180, 0.5, alive))

    def _remove_containers(self) -> None:
        """Kill and delete every task and container of the k8s.io namespace (the pods' and sandboxes')."""
        out = subprocess.run([str(BIN_DIR / "ctr"), "--address", str(self.sock), "--namespace", K8S_NS,
                              "containers", "list", "--quiet"], capture_output=True, text=True, timeout=60)
        for cid in out.stdout.split():
            base = [str(BIN_DIR / "ctr"), "--address", str(self.sock), "--namespace", K8S_NS]
            subprocess.run([*base, "tasks", "kill", "--signal", "SIGKILL", cid], capture_output=True, timeout=30)
            subprocess.run([*base, "tasks", "delete", "--force", cid], capture_output=True, timeout=30)
            subprocess.run([*base, "containers", "delete", cid], capture_output=True, timeout=30)

    def _kill_shims(self) -> None:
        """A shim of this containerd still running (its address is in its command line): killed."""
        for pid, cmd in _processes():
            if cmd and Path(cmd[0]).name == "containerd-shim-runc-v2" and str(self.sock) in cmd:
                _kill(pid)

    def _unmount_all(self) -> None:
        """Every mount under the node's directory (overlay rootfs, sandbox /dev/shm, kubelet volumes), deepest
        first."""
        prefix = str(self.dir) + "/"
        for _ in range(3):
            points = [p for p in _mountpoints() if p.startswith(prefix)]
            if not points:
                return
            for p in sorted(points, key=len, reverse=True):
                subprocess.run(["umount", "-l", p], capture_output=True, timeout=30)

    def _remove_cgroups(self) -> None:
        """The kubelet's cgroups (kubepods and below, in every v1 hierarchy), once no process is in them."""
        for hier in CGROUP_ROOT.iterdir():
            top = hier / "kubepods"
            if not top.is_dir():
                continue
            for dirpath, _, _ in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
                procs = Path(dirpath) / "cgroup.procs"
                if procs.exists():
                    for pid in procs.read_text().split():
                        _kill(int(pid))
                try:
                    os.rmdir(dirpath)
                except OSError:
                    wait_until(f"cgroup {dirpath} empty", lambda d=dirpath: _rmdir(d), 30, 0.2)

    # -- the device-plugin directory: shared by the machine --------------------------------------------
    def _take_lock(self) -> None:
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)

        def locked() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
        try:
            wait_until(f"the real-node lock {LOCK} (another test session's node)", locked,
                       LOCK_WAIT_S, 1.0)
        except BaseException:
            os.close(fd)
            raise
        self._lock = fd
        self._dp_before = set(os.listdir(DEVICE_PLUGIN_DIR))

    def _clean_device_plugin_dir(self) -> None:
        """The kubelet's socket and checkpoint, the plugins' sockets: what this node put there."""
        for name in set(os.listdir(DEVICE_PLUGIN_DIR)) - self._dp_before:
            path = DEVICE_PLUGIN_DIR / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for name in ("kubelet.sock", "kubelet_internal_checkpoint"):
            (DEVICE_PLUGIN_DIR / name).unlink(missing_ok=True)

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _processes() -> list[tuple[int, list[str]]]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            out.append((int(d.name), [c.decode(errors="replace") for c in cmd if c]))
    return out


def _mountpoints() -> list[str]:
    """Mount points of this mount namespace (field 5 of mountinfo; octal escapes decoded)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        field = line.split(" ")[4]
        points.append(field.encode().decode("unicode_escape"))
    return points


def node_status(cluster: RealCluster, name: str) -> dict[str, Any]:
    return dict(cluster.ok("GET", f"/api/v1/nodes/{name}"))


def pod(cluster: RealCluster, ns: str, name: str) -> dict[str, Any] | None:
    status, out = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return dict(out) if status == 200 else None


def container_state(p: dict[str, Any] | None, container: str) -> dict[str, Any]:
    if p is None:
        return {}
    for s in p.get("status", {}).get("containerStatuses", []):
        if s["name"] == container:
            return dict(s.get("state", {}))
    return {}


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)[:4000]




def node_images(workdir: Path, cbin: dict[str, str]) -> list[Path]:
    """The pause image and the test image (alloc_direct, the elastic tenant, and what the shim and the
    simulated driver load)."""
    from kube_node_images import client_archive, pause_archive

    from memslice.paths import lib_paths

    libs = lib_paths()
    workdir.mkdir(parents=True, exist_ok=True)
    elastic = workdir / "elastic"  # the elastic-memory tenant of tests/elastic/test_elastic_swap.py, driven on stdin
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{libs.include}", str(ROOT / "tests" / "c" / "elastic.c"),
                    "-o", str(elastic), "-L", libs.sim_dir, "-l:libcuda.so.1", "-lpthread", "-ldl"], check=True,
                   timeout=300)
    return [pause_archive(workdir), client_archive(workdir, {"alloc_direct": cbin["alloc_direct"],
                                                             "elastic": str(elastic)},
                                                   [Path(libs.shim), Path(libs.sim_cuda), Path(libs.sim_nvml)])]


def node_agent_token(cluster: RealCluster, node: str) -> str:
    """The node agent's ServiceAccount token, bound to its pod on `node` (so it names the node, as deploy/'s
    RBAC and admission policies require). The pod is the DaemonSet's as the admin creates it here (no
    DaemonSet controller); its container is a stand-in that sleeps: the agent itself runs on the host."""
    from kube_node_images import TEST_IMAGE

    name = f"memslice-node-agent-{node}"
    status, out = cluster.request("POST", f"/api/v1/namespaces/{AGENT_NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"serviceAccountName": "memslice-node-agent", "nodeName": node, "hostNetwork": True,
                 "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "agent", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["/bin/sleep", "100000"]}]}})
    assert status in (201, 409), out
    agent_pod = cluster.ok("GET", f"/api/v1/namespaces/{AGENT_NS}/pods/{name}")
    return cluster.token(AGENT_NS, "memslice-node-agent", agent_pod)


class NodeAgent:
    """`memslice node-agent` as a host process on the real node: deploy/'s host paths under `root`, the
    simulated GPUs' state there, its metrics on loopback; `args` are the mode's flags. Two agents on one
    `root` (another `name`) are two pods of the DaemonSet on one node, as during a rolling update."""

    def __init__(self, root: Path, node: str, kubeconfig: Path, args: list[str], name: str = "agent") -> None:
        self.root, self.name, self.runs = root, name, 0
        (root / "sim").mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("MEMSLICE_") and k not in ("KUBERNETES_SERVICE_HOST", "NODE_NAME", "LD_PRELOAD")}
        env.update(MEMSLICE_SIM_STATE=str(root / "sim" / "node.state"))
        self.env = env
        self.cmd = [sys.executable, "-m", "memslice", "node-agent", *args, "--region-root", str(root / "regions"),
                    "--shim-host-dir", str(root / "lib"), "--elastic-dir", str(root / "elastic"),
                    "--metrics-address", "127.0.0.1", "--metrics-port", "0", "--node-name", node,
                    "--kubeconfig", str(kubeconfig)]
        self.start()

    def start(self) -> None:
        self.runs += 1
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=ROOT)
        self.output = ChildLog(self.proc, self.root / f"{self.name}-{self.runs}.log")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"node agent exited {self.proc.returncode}:\n{self.output.text()}")

    def stop(self) -> None:
        stop_process(self.proc, 20)

    def count(self, text: str) -> int:
        return self.output.text().count(text)

    def gauge(self, name: str) -> dict[str, float]:
        """GPU UUID -> this agent process's gauge `name` (its /metrics)."""
        port = self.output.wait_for(lambda out: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", out), 30,
                                    "the agent's metrics address").group(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return {m.group(1): float(m.group(2))
                for m in re.finditer(rf'^{name}{{[^}}]*uuid="([^"]+)"[^}}]*}} (\S+)$', text, re.M)}

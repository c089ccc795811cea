"""The real Kubernetes control plane for tests: kube-apiserver (with an embedded etcd), kube-scheduler and
the resourceclaim controller, built from k8s.io/kubernetes into one binary (tests/kubecluster, `make
kubecluster`) and started here as processes on loopback.

The API server runs as a cluster's does in the ways memslice depends on: TLS, ServiceAccount tokens
(TokenRequest, bound to pods, with the pod's node), the Node and RBAC authorizers, the default admission
plugins (ValidatingAdmissionPolicy among them) plus NodeRestriction. What a cluster has and this one does
not: kubelets and the controller-manager (except the resourceclaim controller, when a test starts it), so
nobody creates a namespace's "default" ServiceAccount: `ensure_namespace` does.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from waiting import stop_process, wait_until  # re-exported: the tests of the real cluster import it from here

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MEMSLICE_KUBECLUSTER", ROOT / "build" / "kubecluster"))
ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_TOKEN = "memslice-test-admin-token"
SCHEDULER_TOKEN = "memslice-test-kube-scheduler-token"  # the cluster's own scheduler: user system:kube-scheduler
# kube-controller-manager's own identity (as it runs without --use-service-account-credentials)
CONTROLLER_MANAGER_TOKEN = "memslice-test-kube-controller-manager-token"
RESTART_GRACE_S = 3.0  # restart_apiserver: TERM, then KILL after this
START_TIMEOUT_S = 180.0  # a cold API server on a loaded 2-core machine: ~10-40 s
# Nodes that may "register" as kubelets do (user system:node:<name>, group system:nodes: the Node authorizer
# and NodeRestriction apply); their tokens are in the static token file, kubelet_token(name).
KUBELET_NODES = tuple([f"real-{c}" for c in "abcd"] + [f"gpu-{i:02d}" for i in range(48)]
                      + [f"dra-{i:02d}" for i in range(8)]
                + ["kubelet-dp", "kubelet-dra", "kubelet-dp2"])  # the real kubelets of tests/support/kube_node.py
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata"}]}


def kubelet_token(node: str) -> str:
    return f"kubelet-{node}-token"


def why_unavailable() -> str | None:
    """Why the real control plane cannot run here (None when it can). Only a missing Go toolchain is a
    reason to skip: with Go, a missing binary is a build step not run (`make kubecluster`), a failure."""
    if BINARY.is_file():
        return None
    if shutil.which("go") is None:
        return (f"the real control plane needs Go to build {BINARY} "
                f"(`make kubecluster`); go is not on PATH")
    raise AssertionError(f"{BINARY} is missing: run `make kubecluster` (make test builds it first)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A component process with its output in a file, stopped (TERM, then KILL) on close."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.log_path = name, log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)

    def tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def stop(self, grace: float = 20.0) -> None:
        stop_process(self.proc, grace)
        self._log.close()


def _rsa_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


class RealCluster:
    """A running kube-apiserver (and etcd); components are added with the start_* methods."""

    def __init__(self, workdir: Path, api_flags: tuple[str, ...] = ()) -> None:
        self.dir = workdir
        self.api_flags = api_flags  # more kube-apiserver flags, after the defaults (the last of a flag wins)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.procs: list[Proc] = []
        self.ca = self.dir / "certs" / "apiserver.crt"

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> RealCluster:
        d = self.dir
        (d / "certs").mkdir(parents=True)
        _rsa_key(d / "sa.key")
        lines = [f'{ADMIN_TOKEN},memslice-test-admin,admin-uid,"system:masters"',
                 f"{SCHEDULER_TOKEN},system:kube-scheduler,kube-scheduler-uid",
                 f"{CONTROLLER_MANAGER_TOKEN},system:kube-controller-manager,kube-controller-manager-uid"]
        lines += [f'{kubelet_token(n)},system:node:{n},node-{n},"system:nodes"' for n in KUBELET_NODES]
        (d / "tokens.csv").write_text("\n".join(lines) + "\n")
        (d / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log = d / "audit.log"
        cmd = [str(BINARY), "apiserver", str(d / "etcd"), str(free_port()), str(free_port()),
               "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
               f"--cert-dir={d / 'certs'}", "--service-cluster-ip-range=10.96.0.0/16",
               f"--service-account-issuer={ISSUER}", f"--api-audiences={ISSUER}",
               f"--service-account-key-file={d / 'sa.pub'}",
               f"--service-account-signing-key-file={d / 'sa.key'}",
               f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
               "--enable-admission-plugins=NodeRestriction", "--endpoint-reconciler-type=none",
               "--enable-priority-and-fairness=false", "--profiling=false", "--anonymous-auth=false",
               f"--audit-policy-file={d / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_log}",
               "--audit-log-mode=blocking", *self.api_flags]
        self.api_cmd = cmd
        api = Proc("kube-apiserver", cmd, d / "apiserver.log")
        self.procs.append(api)
        wait_until("kube-apiserver /readyz", lambda: self._readyz(), START_TIMEOUT_S, 0.5, api.check_alive)
        self.admin_kubeconfig = self.kubeconfig("admin", ADMIN_TOKEN)
        return self

    def restart_apiserver(self) -> None:
        """Stop the API server (SIGTERM, as a rolling restart does) and start it again on the same port with
        the same etcd data: every connection and watch drops, everything stored stays.

        The grace before SIGKILL is short (RESTART_GRACE_S): with clients' watches open, this kube-apiserver stops
        listening at once but does not exit (its log ends within 30 ms of the TERM); it was killed at the end of
        any grace, 20 s before, so a shorter one kills it the same way, sooner. etcd (in the same process) has
        its writes on disk before it acknowledges them."""
        old = self.procs[0]
        assert old.name == "kube-apiserver"
        old.stop(RESTART_GRACE_S)
        log = self.dir / f"apiserver-{len(list(self.dir.glob('apiserver*.log')))}.log"
        api = Proc("kube-apiserver", self.api_cmd, log)
        self.procs[0] = api
        wait_until("the restarted kube-apiserver's /readyz", lambda: self._readyz(), START_TIMEOUT_S, 0.5,
                   api.check_alive)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()

    def _readyz(self) -> bool:
        if not self.ca.exists():
            return False
        try:
            status, _ = self.request("GET", "/readyz")
        except (OSError, ssl.SSLError):
            return False
        return status == 200

    # -- talking to it ---------------------------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def request(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN,
                content_type: str = "application/json") -> tuple[int, Any]:
        """One HTTP request with a bearer token; (status, decoded JSON body or text)."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def ok(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN,
           content_type: str = "application/json") -> Any:
        status, out = self.request(method, path, body, token, content_type)
        assert 200 <= status < 300, f"{method} {path}: {status} {out}"
        return out

    def kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig file for this API server with a bearer token (the server's CA checked)."""
        path = self.dir / f"kubeconfig-{name}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": self.url, "certificate-authority": str(self.ca)}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": name}}]}))
        return path

    def ensure_namespace(self, ns: str) -> None:
        """The namespace and its "default" ServiceAccount (the controller-manager's job in a cluster)."""
        for path, body in (("/api/v1/namespaces", {"metadata": {"name": ns}}),
                           (f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})):
            status, out = self.request("POST", path, body)
            assert status in (201, 409), f"POST {path}: {status} {out}"

    def apply(self, objs: list[dict[str, Any]], token: str = ADMIN_TOKEN) -> None:
        """Server-side apply of manifests, in order (what `kubectl apply --server-side` sends)."""
        for obj in objs:
            path = resource_path(obj)
            self.ok("PATCH", f"{path}?fieldManager=memslice-test&force=true&fieldValidation=Strict",
                    json.dumps(obj).encode(), token, "application/apply-patch+yaml")

    def token(self, namespace: str, sa: str, pod: dict[str, Any] | None = None, seconds: int = 3600) -> str:
        """A ServiceAccount token from the TokenRequest API, bound to `pod` when given (then the API server
        adds the pod's node to the token, as for every projected token of a scheduled pod)."""
        spec: dict[str, Any] = {"audiences": [ISSUER], "expirationSeconds": seconds}
        if pod is not None:
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                                      "uid": pod["metadata"]["uid"]}
        out = self.ok("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
                      {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return str(out["status"]["token"])

    def whoami(self, token: str) -> dict[str, Any]:
        out = self.ok("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                      {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}, token)
        return dict(out["status"]["userInfo"])

    def audit(self, user: str) -> list[dict[str, Any]]:
        """The audit events of requests made as `user`, so far: each request's ResponseComplete, and a watch's
        ResponseStarted (it completes only when it ends)."""
        out = []
        with self.audit_log.open() as f:
            for line in f:
                ev = json.loads(line)
                done = ev.get("stage") == "ResponseComplete" or (ev.get("stage") == "ResponseStarted"
                                                                 and ev.get("verb") == "watch")
                if done and ev["user"].get("username") == user:
                    out.append(ev)
        return out

    def register_node(self, name: str, labels: dict[str, str] | None = None,
                      capacity: dict[str, str] | None = None) -> dict[str, Any]:
        """Create the Node and publish its status as its kubelet does (its own identity, through the Node
        authorizer and NodeRestriction): Ready, and capacity/allocatable with the device plugin's count."""
        token = kubelet_token(name)
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}}}
        status, out = self.request("POST", "/api/v1/nodes", node, token)
        assert status in (201, 409), f"node {name} registration: {status} {out}"
        self.publish_capacity(name, capacity or {})
        # The API server's TaintNodesByCondition admission gave the new node node.kubernetes.io/not-ready; the
        # controller-manager's node lifecycle controller lifts it once the node reports Ready: here, the admin.
        node = self.ok("GET", f"/api/v1/nodes/{name}")
        taints = [t for t in node["spec"].get("taints", []) if t["key"] != "node.kubernetes.io/not-ready"]
        self.ok("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints or None}},
                content_type="application/merge-patch+json")
        return dict(self.ok("GET", f"/api/v1/nodes/{name}"))

    def publish_capacity(self, name: str, extended: dict[str, str],
                         allocatable: dict[str, str] | None = None) -> None:
        """The kubelet's node status: its CPU/memory/pods and the device plugins' resources (capacity: all
        devices a plugin lists; allocatable: its healthy ones, `allocatable`, the same when not given), with
        the Ready condition (pkg/kubelet/nodestatus: MachineInfo, ReadyCondition)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        cond = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting "
                "ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}
        status = {"capacity": {**base, **extended}, "allocatable": {**base, **(allocatable or extended)},
                  "conditions": [cond]}
        self.ok("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, kubelet_token(name),
                "application/strategic-merge-patch+json")

    # -- more components -------------------------------------------------------------------------------
    def start_scheduler(self, config: dict[str, Any], name: str = "kube-scheduler", *extra: str) -> Proc:
        path = self.dir / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = Proc(name, [str(BINARY), "scheduler", f"--config={path}", "--secure-port=0", "--v=2", *extra],
                    self.dir / f"{name}.log")
        self.procs.append(proc)
        return proc

    def start_resourceclaim_controller(self, token: str) -> Proc:
        """The controller as kube-controller-manager runs it with --use-service-account-credentials: writes
        with its ServiceAccount's `token`, the shared informers read as system:kube-controller-manager."""
        kc = self.kubeconfig("resourceclaim-controller", token)
        informers = self.kubeconfig("kube-controller-manager", CONTROLLER_MANAGER_TOKEN)
        proc = Proc("resourceclaim-controller", [str(BINARY), "resourceclaim-controller", f"--kubeconfig={kc}",
                                                 f"--informer-kubeconfig={informers}"],
                    self.dir / "resourceclaim-controller.log")
        self.procs.append(proc)
        return proc


def resource_path(obj: dict[str, Any]) -> str:
    """The REST path of a named object, for the kinds deploy/ and the tests use."""
    api = obj["apiVersion"]
    kind, meta = obj["kind"], obj["metadata"]
    plural = PLURALS.get(kind) or kind.lower() + "s"
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    ns = meta.get("namespace")
    if ns and kind not in CLUSTER_SCOPED:
        base += f"/namespaces/{ns}"
    return f"{base}/{plural}/{meta['name']}"


PLURALS = {"PriorityClass": "priorityclasses", "DeviceClass": "deviceclasses", "NetworkPolicy": "networkpolicies",
           "ValidatingAdmissionPolicy": "validatingadmissionpolicies", "Ingress": "ingresses"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "Node", "DeviceClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ResourceSlice", "RuntimeClass"}


@contextmanager
def running(workdir: Path, api_flags: tuple[str, ...] = ()) -> Iterator[RealCluster]:
    cluster = RealCluster(workdir, api_flags)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()

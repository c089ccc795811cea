"""Anyone on the pod network against the HTTP ports of both services, without credentials (issue 25 items
1-2): many connections sending large headers, thousands of idle connections (before the TLS handshake on
the extender's verbs port), slow header dribbles. Each service runs as its own process, as deployed (the
extender with mutual TLS and a health port; the node agent on the simulated GPU with a kubelet stand-in);
its peak resident memory (VmHWM) must stay under its Deployment's limit (extender 448Mi, agent 384Mi) and
its threads under its connection caps, its memory must come back once the attack's sockets close, and it
must still serve its real work afterwards: filter and bind over mutual TLS, Allocate over the kubelet's
gRPC. Before the bounds, 69 (extender) and 55 (agent) connections sending large headers OOM-killed them,
and 6,000 idle connections cost 6,006 threads. Loopback only; attackers connect from other loopback
addresses (127.0.0.2, ...) than the legitimate clients, as they would from other pods."""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kube_standin import KubeApiStandin
from kubelet_standin import KubeletStandin
from test_extender_support import Client, node_obj, pod_obj
from test_extender_tls import certs, client_context
from test_plugin_agent import RESOURCE, AgentProcess
from waiting import wait_until

from memslice.lean_http import MAX_HEAD_BYTES
from memslice.plugin.metrics import METRICS_LIMITS
from memslice.scheduler_extender.edge.server import HEALTH_LIMITS, VERBS_LIMITS

MiB = 1 << 20
EXTENDER_LIMIT = 448 * MiB  # deploy/base/scheduler/deployment.yaml (the extender container)
AGENT_LIMIT = 384 * MiB  # deploy/base/node-agent/daemonset.yaml
LINE = b"X-Pad: " + b"a" * (64 << 10) + b"\r\n"  # the largest header line the stdlib accepts


def status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (bytes) and Threads of a process."""
    text = Path(f"/proc/{pid}/status").read_text()
    out = {k: int(re.search(rf"^{k}:\s+(\d+)", text, re.M).group(1)) for k in ("VmRSS", "VmHWM", "Threads")}  # type: ignore[union-attr]
    out["VmRSS"] *= 1024
    out["VmHWM"] *= 1024
    return out


def connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))


def sources(n: int) -> list[str]:
    return [f"127.0.0.{i}" for i in range(2, 2 + n)]


def big_headers(port: int, source: str, lines: int = 100) -> bytes:
    """One connection sending a request head of `lines` header lines of 64 KiB; what came back (b"" when the
    server closed it before answering)."""
    s = connect(port, source)
    try:
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            for _ in range(lines):
                s.sendall(LINE)
            s.sendall(b"\r\n")
        except OSError:
            pass  # the server stopped reading and closed: expected
        try:
            return s.recv(4096)
        except OSError:
            return b""
    finally:
        s.close()


def attack_with_big_headers(port: int, connections: int, peers: int) -> list[bytes]:
    """`connections` at once, spread over `peers` addresses; their first answers."""
    got: list[bytes] = []
    addrs = sources(peers)
    threads = [threading.Thread(target=lambda i=i: got.append(big_headers(port, addrs[i % peers])))
               for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return got


def first_line(data: bytes) -> bytes:
    return data.split(b"\r\n", 1)[0]


def held_open(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets the server has not closed (or refused) yet."""
    out = []
    for s in socks:
        s.setblocking(False)
        try:
            data = s.recv(4096)
        except BlockingIOError:
            out.append(s)
            continue
        except OSError:
            continue
        if not data:
            continue
        out.append(s) if not data.startswith(b"HTTP/1.1 503") else None
    return out


# --- the extender, as deployed: mutual TLS on the verbs port, plain HTTP health port ----------------------
class Extender:
    def __init__(self, tmp: Path) -> None:
        self.pki = certs(tmp / "pki")
        self.kube = KubeApiStandin().start()
        self.kube.put(node_obj("n", [80000]))
        d = self.pki
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memslice", "extender", "--address", "127.0.0.1", "--port", "0", "--health-port",
             "0", "--kubeconfig", self.kube.kubeconfig(str(tmp / "kc")), "--tls-cert-file", str(d / "server.crt"),
             "--tls-key-file", str(d / "server.key"), "--tls-client-ca-file", str(d / "ca.crt")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"serving https://127\.0\.0\.1:(\d+) .*health and metrics on http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        self.port, self.health_port = int(m.group(1)), int(m.group(2))
        assert "ready" in self.proc.stdout.readline()
        self.client = Client(f"https://127.0.0.1:{self.port}", client_context(d / "ca.crt", d / "client.crt",
                                                                              d / "client.key"))
        self.pods = 0

    def serves(self) -> None:
        """The scheduler's real work: filter and bind a pod, over mutual TLS; and the health port's probe."""
        self.pods += 1
        pod = self.kube.put(pod_obj(f"p{self.pods}", {"main": 10}))
        assert self.client.filter(pod, ["n"])["NodeNames"] == ["n"]
        assert self.client.bind(pod, "n") == ""
        self.client.close()
        with socket.create_connection(("127.0.0.1", self.health_port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.kube.stop()


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Extender]:
    e = Extender(tmp_path_factory.mktemp("ext"))
    yield e
    e.stop()


# --- the node agent on a simulated GPU, next to a kubelet stand-in ----------------------------------------
class Agent:
    def __init__(self, root: Path) -> None:
        self.kubelet = KubeletStandin(root / "dp", root / "pr" / "kubelet.sock").start()
        self.agent = AgentProcess(root, unit_mib=4).start()
        self.kubelet.wait_registered(RESOURCE)
        self.port = self.agent.port
        assert self.agent.proc is not None
        self.pid = self.agent.proc.pid
        self.pods = 0

    def serves(self) -> None:
        """Allocate through the kubelet, and the metrics port's probe."""
        self.pods += 1
        resp = self.kubelet.admit(f"uid-{self.pods}", "ns", f"pod-{self.pods}", [("main", 100)], RESOURCE)["main"]
        assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == "400"  # 100 units of 4 MiB
        assert self.agent.get("/healthz")[0] == 200

    def stop(self) -> None:
        self.agent.stop()
        self.kubelet.stop()


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))  # Unix socket paths must stay short
    a = Agent(root)
    yield a
    a.stop()
    shutil.rmtree(root, ignore_errors=True)


def services(extender: Extender, agent: Agent) -> list[tuple[str, int, int, int, Callable[[], None]]]:
    """(name, pid, plain-HTTP port, memory limit, its real work) of each plain-HTTP port."""
    return [("extender health port", extender.proc.pid, extender.health_port, EXTENDER_LIMIT, extender.serves),
            ("agent metrics port", agent.pid, agent.port, AGENT_LIMIT, agent.serves)]


def test_large_headers_are_refused_within_the_memory_limit(extender: Extender, agent: Agent) -> None:
    """120 connections at once, each sending 100 header lines of 64 KiB (6.4 MB): each gets 431 (its head
    is over 8 KiB) or 503 (over the connection caps), or is closed; memory stays under the limit, comes
    back, and the service serves its real work."""
    for name, pid, port, limit, serves in services(extender, agent):
        before = status(pid)
        answers = attack_with_big_headers(port, 120, 6)
        heads = {first_line(a) for a in answers}
        assert heads <= {b"HTTP/1.1 431 Request Header Fields Too Large", b"HTTP/1.1 503 Service Unavailable", b""}, (
            name, heads)
        assert b"HTTP/1.1 431 Request Header Fields Too Large" in heads, name  # the cap, not only the refusals
        after = status(pid)
        assert after["VmHWM"] < limit, (name, after)
        assert after["VmRSS"] < before["VmRSS"] + 32 * MiB, (name, before, after)  # nothing kept
        serves()


def test_a_request_line_alone_over_the_cap_is_refused(extender: Extender, agent: Agent) -> None:
    for name, _, port, _, serves in services(extender, agent):
        with connect(port, "127.0.0.2") as s:
            s.sendall(b"GET /" + b"a" * MAX_HEAD_BYTES + b" HTTP/1.1\r\n\r\n")
            assert first_line(s.recv(4096)) == b"HTTP/1.1 414 Request-URI Too Long", name
        serves()


def test_idle_connections_cost_no_thread_beyond_the_caps(extender: Extender, agent: Agent) -> None:
    """2,000 idle connections to each plain port, from 8 addresses: those over the caps are refused at once
    with 503 (no thread); the rest are held by at most `max_connections` threads, and closed by the server
    once idle for idle_s. Threads and memory come back when they close; the service serves meanwhile from
    an address of its own (the kubelet's probes, the scheduler)."""
    for (name, pid, port, limit, serves), limits in zip(services(extender, agent), (HEALTH_LIMITS, METRICS_LIMITS),
                                                        strict=True):
        before = status(pid)
        addrs = sources(8)
        socks = [connect(port, addrs[i % 8]) for i in range(2000)]
        try:
            # the accept loop works through its backlog: all but the caps' worth are refused
            wait_until(f"{name}: refusals",
                       lambda socks=socks, limits=limits: len(held_open(socks)) <= limits.max_connections, 20)
            during = status(pid)
            assert during["Threads"] <= before["Threads"] + limits.max_connections + 2, (name, before, during)
            assert during["VmHWM"] < limit
        finally:
            for s in socks:
                s.close()
        wait_until(f"{name}: threads back",
                   lambda pid=pid, before=before: status(pid)["Threads"] <= before["Threads"] + 2, 10)
        serves()  # the caps are free again


def test_idle_connections_before_the_tls_handshake(extender: Extender) -> None:
    """The verbs port (mutual TLS): 6,000 connections that never start the handshake (they cost 6,006
    threads and 493 MiB before), from 3 addresses. At most `per_peer` of each address are taken (the rest
    closed at once, without a thread), the scheduler (another address) is served meanwhile, and the server
    closes the taken ones at the handshake deadline."""
    pid = extender.proc.pid
    before = status(pid)
    addrs = sources(3)
    socks = [connect(extender.port, addrs[i % 3]) for i in range(6000)]
    try:
        wait_until("refusals", lambda: len(held_open(socks)) <= 3 * VERBS_LIMITS.per_peer, 10)
        during = status(pid)
        assert during["Threads"] <= before["Threads"] + 3 * VERBS_LIMITS.per_peer + 2, (before, during)
        extender.serves()
        t0 = time.monotonic()
        wait_until("the handshake deadline", lambda: not held_open(socks), VERBS_LIMITS.handshake_s + 5)
        assert time.monotonic() - t0 <= VERBS_LIMITS.handshake_s + 5
    finally:
        for s in socks:
            s.close()
    assert status(pid)["VmHWM"] < EXTENDER_LIMIT
    wait_until("threads back", lambda: status(pid)["Threads"] <= before["Threads"] + 2, 10)
    extender.serves()


def test_a_tls_handshake_dribbled_byte_by_byte_is_cut_at_its_deadline(extender: Extender) -> None:
    """A ClientHello sent one byte every 0.5 s: the socket timeout per read never fires, the handshake's
    deadline does."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    inb, outb = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inb, outb)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outb.read()
    with connect(extender.port, "127.0.0.9") as s:
        t0 = time.monotonic()
        closed = False
        for b in hello:
            try:
                s.sendall(bytes([b]))
            except OSError:
                closed = True
                break
            s.settimeout(0.5)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
            if time.monotonic() - t0 > VERBS_LIMITS.handshake_s + 5:
                break
        assert closed and time.monotonic() - t0 <= VERBS_LIMITS.handshake_s + 2


def test_a_header_dribble_is_cut_at_the_head_deadline(extender: Extender, agent: Agent) -> None:
    """20 connections per port, each sending one header byte every 0.3 s (each read returns in time; before,
    a byte every 10 s kept a connection forever): all are closed within head_s of their first byte."""
    ports = [(name, port, limits.head_s) for (name, _, port, _, _), limits in
             zip(services(extender, agent), (HEALTH_LIMITS, METRICS_LIMITS), strict=True)]
    socks = [(name, connect(port, "127.0.0.3"), head_s) for name, port, head_s in ports for _ in range(8)]
    t0 = time.monotonic()
    for _, s, _ in socks:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        s.setblocking(False)
    alive = list(socks)
    while alive and time.monotonic() - t0 < 15:
        threading.Event().wait(0.3)
        still = []
        for name, s, head_s in alive:
            try:
                s.send(b"X")
                data = s.recv(1)
            except BlockingIOError:
                still.append((name, s, head_s))
                continue
            except OSError:
                data = b""
            assert data == b"", (name, data)  # closed, no answer owed
            assert time.monotonic() - t0 <= head_s + 1.5, name
        alive = still
    for _, s, _ in socks:
        s.close()
    assert not alive, [n for n, _, _ in alive]
    extender.serves()
    agent.serves()

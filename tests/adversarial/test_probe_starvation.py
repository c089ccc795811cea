"""Liveness starvation and TLS handshake stalls (issue 35 items 1 and 5), over real sockets on loopback.

Item 1: five addresses each holding 8 keep-alive connections (one request each, then idle) took every slot
of the node agent's :9400 and of the extender's health port, and the kubelet's probes got 503 (which
would have restarted both services again and again). Item 5: 5 addresses x 64 connections that never
finish a TLS handshake made every filter call of the scheduler fail. Each service runs as its own process,
as deployed (the extender with mutual TLS, a health port and a probe port; the node agent on the simulated
GPU next to a kubelet stand-in, with a probe port). The attackers come from 127.0.0.2..., the kubelet and
the scheduler from 127.0.0.1; each attack is repeated a few rounds, the attackers reconnecting what the
server closed between rounds, as a persistent attacker would. Counts are bounded; nothing asserts a time.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_standin import KubeApiStandin
from kubelet_standin import KubeletStandin
from test_extender_support import Client, node_obj, pod_obj
from test_extender_tls import certs, client_context
from test_http_dos import AGENT_LIMIT, EXTENDER_LIMIT, held_open, sources, status
from test_plugin_agent import RESOURCE, AgentProcess
from waiting import wait_until

from memslice.lean_http import BoundedHTTPServer, ConnLimits, LeanRequestHandler, pick_victim
from memslice.plugin.metrics import METRICS_LIMITS
from memslice.probe_http import PROBE_LIMITS, probe_answer
from memslice.scheduler_extender.edge.server import HEALTH_LIMITS, VERBS_LIMITS

ROUNDS = 4
KEEPALIVE = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # an attacker's request: the connection stays open
STALLED = b"GET /healthz HTTP/1.1\r\n"  # a head that never ends (cut at head_s)


def connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))


def kubelet_probe(port: int, path: str) -> int:
    """What the kubelet's HTTP prober does: a new connection, one GET with Connection: close; the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Connection": "close", "User-Agent": "kube-probe/1.32"})
        return conn.getresponse().status
    finally:
        conn.close()


class Attack:
    """`per_addr` connections from each of `addrs` to `port`, each sending `opening` (then holding the
    connection); top_up() reconnects those the server closed, in one pass."""

    def __init__(self, port: int, addrs: list[str], per_addr: int, opening: bytes) -> None:
        self.port, self.opening = port, opening
        self.socks: dict[tuple[str, int], socket.socket | None] = {(a, i): None for a in addrs for i in range(per_addr)}

    def top_up(self) -> int:
        """Reconnect every connection the server closed (or refused); how many were reconnected."""
        alive = set(map(id, held_open([s for s in self.socks.values() if s is not None])))
        n = 0
        for key, s in self.socks.items():
            if s is not None and id(s) in alive:
                continue
            if s is not None:
                s.close()
            try:
                fresh = connect(self.port, key[0])
                if self.opening:
                    fresh.sendall(self.opening)
            except OSError:
                self.socks[key] = None
                continue
            self.socks[key] = fresh
            n += 1
        return n

    def held(self) -> list[socket.socket]:
        return held_open([s for s in self.socks.values() if s is not None])

    def close(self) -> None:
        for s in self.socks.values():
            if s is not None:
                s.close()


def probes_answered_under(probe_port: int, attack_port: int, opening: bytes, addrs: int, per_addr: int,
                          limits: ConnLimits) -> None:
    """ROUNDS rounds of (attackers top up, the kubelet probes /healthz and /readyz): every probe gets 200."""
    attack = Attack(attack_port, sources(addrs), per_addr, opening)
    try:
        for _ in range(ROUNDS):
            attack.top_up()
            assert addrs * per_addr >= limits.max_connections  # the attack fills the port's cap
            assert kubelet_probe(probe_port, "/healthz") == 200
            assert kubelet_probe(probe_port, "/readyz") == 200
    finally:
        attack.close()


# --- the pure pieces ----------------------------------------------------------------------------------------
def test_the_victim_is_the_longest_waiting_connection_of_the_peer_holding_most() -> None:
    from collections import Counter

    held = Counter({"10.0.0.9": 8, "10.0.0.1": 1, "10.0.0.7": 8})
    waiting = [("10.0.0.1", 0.0), ("10.0.0.9", 5.0), ("10.0.0.7", 3.0), ("10.0.0.9", 4.0)]
    assert pick_victim(waiting, held) == 2  # 8 held, waiting since 3.0 (before the other 8-holder's 4.0)
    assert pick_victim([("10.0.0.1", 0.0)], held) == 0
    assert pick_victim([], held) is None


def test_probe_answers() -> None:
    assert probe_answer("/healthz", lambda: True, lambda: False) == (200, b"ok\n")
    assert probe_answer("/livez?verbose", lambda: False, lambda: True)[0] == 503
    assert probe_answer("/readyz", lambda: True, lambda: "not registered with the kubelet") == (
        503, b"not registered with the kubelet\n")
    assert probe_answer("/readyz/", lambda: True, lambda: True) == (200, b"ok\n")
    assert probe_answer("/metrics", lambda: True, lambda: True)[0] == 404


# --- close idle keep-alives fast under pressure ----------------------------------------------------------
class _Ok(LeanRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_all(200, b"ok\n", "text/plain")

    def log_message(self, fmt: str, *args: object) -> None:
        pass


def test_idle_keepalives_are_closed_fast_once_half_the_connections_are_held() -> None:
    """idle_s of 10 minutes, pressure_idle_s 0.5 s, a cap of 8: 4 keep-alive connections (half the cap), each
    answered once, are closed by the server long before 10 minutes (polled for, bounded)."""
    import threading

    limits = ConnLimits(max_connections=8, per_peer=8, idle_s=600.0, pressure_idle_s=0.5)
    httpd = BoundedHTTPServer(("127.0.0.1", 0), _Ok, limits)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    port = httpd.server_address[1]
    socks = [connect(port, "127.0.0.2") for _ in range(4)]
    try:
        wait_until("the 4 connections admitted", lambda: httpd.active == 4, 10)
        for s in socks:
            s.sendall(KEEPALIVE)
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        wait_until("the idle keep-alives closed under pressure", lambda: not held_open(socks), 60)
    finally:
        for s in socks:
            s.close()
        httpd.shutdown()
        httpd.server_close()


# --- the node agent, as deployed (probe port 9401 next to the metrics port 9400) --------------------------
class Agent:
    def __init__(self, root: Path) -> None:
        self.kubelet = KubeletStandin(root / "dp", root / "pr" / "kubelet.sock").start()
        self.agent = AgentProcess(root, unit_mib=4, args=["--probe-port", "0"]).start()
        self.kubelet.wait_registered(RESOURCE)
        self.port = self.agent.port
        m = self.agent.wait_log(re.compile(r"probes on http://127\.0\.0\.1:(\d+)/"), "the probe endpoint")
        self.probe_port = int(m.group(1))

    def stop(self) -> None:
        self.agent.stop()
        self.kubelet.stop()


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    root = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))  # Unix socket paths must stay short
    a = Agent(root)
    wait_until("the agent ready", lambda: kubelet_probe(a.probe_port, "/readyz") == 200, 30)
    yield a
    a.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_agent_probes_are_answered_while_keepalives_fill_the_metrics_port(agent: Agent) -> None:
    """The issue's attack on :9400 (5 addresses x 8 keep-alives): the probes are answered on the probe port,
    and on the metrics port too (a newcomer takes an idle keep-alive's place)."""
    for probe_port in (agent.probe_port, agent.port):
        probes_answered_under(probe_port, agent.port, KEEPALIVE, 5, 8, METRICS_LIMITS)


def test_agent_probes_are_answered_while_stalled_heads_fill_the_probe_port(agent: Agent) -> None:
    """The probe port itself attacked, where NetworkPolicy is not enforced: 5 addresses x 8 connections
    holding unfinished heads, and 5 x 8 idle ones that never send a byte."""
    for opening in (STALLED, b""):
        probes_answered_under(agent.probe_port, agent.probe_port, opening, 5, 8, PROBE_LIMITS)
    assert agent.agent.proc is not None and status(agent.agent.proc.pid)["VmHWM"] < AGENT_LIMIT


# --- the extender, as deployed: mutual TLS verbs, health port, probe port ---------------------------------
class Extender:
    def __init__(self, tmp: Path) -> None:
        self.pki = d = certs(tmp / "pki")
        self.log_path = tmp / "extender.log"
        self.log = self.log_path.open("w")
        self.kube = KubeApiStandin().start()
        self.kube.put(node_obj("n", [80000]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memslice", "extender", "--address", "127.0.0.1", "--port", "0", "--health-port",
             "0", "--probe-port", "0", "--kubeconfig", self.kube.kubeconfig(str(tmp / "kc")), "--tls-cert-file",
             str(d / "server.crt"), "--tls-key-file", str(d / "server.key"), "--tls-client-ca-file",
             str(d / "ca.crt")], stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"serving https://127\.0\.0\.1:(\d+) .*health and metrics on http://127\.0\.0\.1:(\d+)"
                      r"; probes on http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        self.port, self.health_port, self.probe_port = (int(g) for g in m.groups())
        assert "ready" in self.proc.stdout.readline()
        self.pods = 0

    def scheduler(self) -> Client:
        d = self.pki
        return Client(f"https://127.0.0.1:{self.port}", client_context(d / "ca.crt", d / "client.crt",
                                                                       d / "client.key"))

    def filter_on_a_new_connection(self) -> None:
        """One filter call as the scheduler makes it, on a connection of its own (a fresh handshake)."""
        self.pods += 1
        pod = self.kube.put(pod_obj(f"p{self.pods}", {"main": 10}))
        client = self.scheduler()
        try:
            assert client.filter(pod, ["n"])["NodeNames"] == ["n"]
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM; a stop that hangs fails with every thread's stack (faulthandler, on SIGABRT)."""
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(30)
            stacks = self.log_path.read_text()[-20000:]
            raise AssertionError(f"the extender did not stop within 60 s of SIGTERM; its threads:\n{stacks}") from None
        finally:
            self.log.close()
            self.kube.stop()


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Extender]:
    e = Extender(tmp_path_factory.mktemp("ext"))
    yield e
    e.stop()


def test_extender_probes_are_answered_while_keepalives_fill_the_health_port(extender: Extender) -> None:
    """The issue's attack on the health port (4 and 5 addresses x 8 keep-alives)."""
    for addrs in (4, 5):
        for probe_port in (extender.probe_port, extender.health_port):
            probes_answered_under(probe_port, extender.health_port, KEEPALIVE, addrs, 8,
                                  HEALTH_LIMITS)


def test_extender_probes_are_answered_while_stalled_heads_fill_the_probe_port(extender: Extender) -> None:
    for opening in (STALLED, b""):
        probes_answered_under(extender.probe_port, extender.probe_port, opening, 5, 8,
                              PROBE_LIMITS)


def client_hello() -> bytes:
    """The first flight of a TLS client (what an attacker sends before stalling)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    inb, outb = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inb, outb)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outb.read()


@pytest.mark.parametrize("opening", ["nothing", "half a ClientHello", "a ClientHello"])
def test_filter_calls_get_through_handshakes_that_never_finish(extender: Extender, opening: str) -> None:
    """The issue's attack on the verbs port: 5 addresses x 64 connections that never finish a handshake
    (silent, half a ClientHello, or a whole one and then silence), topped up every round; at most
    handshakes_per_peer of each address are taken, and the scheduler's filter calls, each on a new
    connection (a fresh handshake), are all answered."""
    hello = client_hello()
    data = {"nothing": b"", "half a ClientHello": hello[: len(hello) // 2], "a ClientHello": hello}[opening]
    addrs = sources(5)
    keepalive = extender.scheduler()  # a connection past its handshake: the handshakes' pool is apart
    extender.pods += 1
    pod = extender.kube.put(pod_obj(f"p{extender.pods}", {"main": 10}))
    assert keepalive.filter(pod, ["n"])["NodeNames"] == ["n"]
    sock = keepalive.local.conn.sock
    attack = Attack(extender.port, addrs, 64, data)
    before = status(extender.proc.pid)
    try:
        for _ in range(ROUNDS):
            attack.top_up()
            assert 5 * 64 > VERBS_LIMITS.max_connections  # enough to fill the port's connections before
            # the server refuses all but handshakes_per_peer per address (closed at once)
            wait_until("refusals", lambda: len(attack.held()) <= 5 * VERBS_LIMITS.handshakes_per_peer, 20)
            extender.filter_on_a_new_connection()
            extender.filter_on_a_new_connection()
            assert keepalive.filter(pod, ["n"])["NodeNames"] == ["n"]
            assert keepalive.local.conn is not None and keepalive.local.conn.sock is sock  # never closed
        during = status(extender.proc.pid)
        # a thread per handshake in the pool (and a few evicted ones on their way out), not one per connection
        assert during["Threads"] <= before["Threads"] + VERBS_LIMITS.handshakes + 32, (before, during)
        assert during["VmHWM"] < EXTENDER_LIMIT, during
    finally:
        attack.close()
        keepalive.close()
    extender.filter_on_a_new_connection()


def test_filter_calls_get_through_when_many_addresses_fill_the_handshake_pool(extender: Extender) -> None:
    """More addresses than the handshakes' pool holds at handshakes_per_peer each (12 x 16 > 64): the
    scheduler's handshake takes a stalled one's place (that of the address holding most)."""
    addrs = sources(12)
    assert len(addrs) * VERBS_LIMITS.handshakes_per_peer > VERBS_LIMITS.handshakes
    attack = Attack(extender.port, addrs, VERBS_LIMITS.handshakes_per_peer, b"")
    try:
        for _ in range(ROUNDS):
            attack.top_up()
            extender.filter_on_a_new_connection()
    finally:
        attack.close()

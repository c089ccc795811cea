"""The extender's two bind writes (podwrites.PodWriter) over real sockets: the real kube-apiserver's error
answers and Binding (over its TLS, with a bearer token); on the API stand-in, for its connection counters and
hooks, keep-alive reuse, connections the server dropped and a proxy; HTTPS with the kubeconfig's CA and client
certificate; and answers as the wire may carry them (chunked, `Connection: close`, cut short, garbage)."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httptools
import pytest
from kube_real import RealCluster
from kube_standin import KubeApiStandin
from kubernetes.client.exceptions import ApiException

from memslice.scheduler_extender.cli import load_api_client
from memslice.scheduler_extender.kubeio.podwrites import PodWriter

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
PATCH = {"metadata": {"annotations": {"memslice.io/x": "1"}}}


def _pod(kube: KubeApiStandin, name: str = "p") -> None:
    kube.put({"kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
              "spec": {"containers": [{"name": "c", "image": "i"}]}})


@pytest.fixture
def kube() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as k:
        _pod(k)
        yield k


def test_writes_share_one_keep_alive_connection(kube: KubeApiStandin) -> None:
    writer = PodWriter(kube.api_client())
    for i in range(5):
        pod = writer.patch_namespaced_pod("p", "ns", {"metadata": {"annotations": {"n": str(i)}}})
        assert pod["metadata"]["annotations"]["n"] == str(i)
    assert kube.connections == 1
    writer.close()


def test_a_connection_the_server_dropped_is_replaced_not_used(kube: KubeApiStandin) -> None:
    writer = PodWriter(kube.api_client())
    writer.patch_namespaced_pod("p", "ns", PATCH)
    kube.restart()  # drops every connection, like an API-server restart
    pod = writer.patch_namespaced_pod("p", "ns", {"metadata": {"annotations": {"after": "restart"}}})
    assert pod["metadata"]["annotations"]["after"] == "restart"
    assert kube.connections == 2
    writer.close()


@pytest.mark.xdist_group("kube")  # one real control plane (the session fixture real_cluster): one worker
def test_errors_carry_status_reason_and_body(real_cluster: RealCluster) -> None:
    """The real API server's answers: 404 and 409 (a stale resourceVersion) as ApiExceptions with its Status
    body, a Binding refused for a pod already bound; the connection kept through every error answer."""
    ns = "ext-podwrites"
    real_cluster.ensure_namespace(ns)
    real_cluster.ok("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")  # a pod "p" of an earlier run
    real_cluster.ok("POST", f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "i"}]}})
    writer = PodWriter(load_api_client(str(real_cluster.admin_kubeconfig)))
    with pytest.raises(ApiException) as missing:
        writer.patch_namespaced_pod("ghost", ns, PATCH)
    assert missing.value.status == 404 and missing.value.reason == "Not Found"
    assert json.loads(missing.value.body)["reason"] == "NotFound"
    (conn,) = writer._idle  # the one connection, back for the next request after the error answer
    with pytest.raises(ApiException) as stale:
        writer.patch_namespaced_pod("p", ns, {"metadata": {"resourceVersion": "1", "annotations": {"a": "b"}}})
    assert stale.value.status == 409 and json.loads(stale.value.body)["reason"] == "Conflict"
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"name": "n1"}}
    writer.create_namespaced_pod_binding("p", ns, binding)
    assert real_cluster.ok("GET", f"/api/v1/namespaces/{ns}/pods/p")["spec"]["nodeName"] == "n1"
    with pytest.raises(ApiException) as bound:
        writer.create_namespaced_pod_binding("p", ns, {**binding, "target": {"name": "n2"}})
    assert bound.value.status == 409 and "already assigned to node" in json.loads(bound.value.body)["message"]
    assert list(writer._idle) == [conn]
    real_cluster.ok("DELETE", f"/api/v1/namespaces/{ns}/pods/p?gracePeriodSeconds=0")
    writer.close()


def test_through_the_clients_proxy(kube: KubeApiStandin) -> None:
    client = kube.api_client()
    client.configuration.proxy = kube.url  # the stand-in answers proxy-form (absolute URL) requests itself
    from kubernetes import client as k8s

    writer = PodWriter(k8s.ApiClient(client.configuration))
    assert writer.patch_namespaced_pod("p", "ns", PATCH)["metadata"]["annotations"] == PATCH["metadata"][
        "annotations"]
    assert kube.proxied == 1


# ------------------------------------------------------------------------------------------------ HTTPS

def _certificates(tmp: Path) -> None:
    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)

    for ca in ("ca", "other-ca"):
        ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={ca}",
             "-keyout", f"{ca}.key", "-out", f"{ca}.crt")
    (tmp / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    (tmp / "none.ext").write_text("basicConstraints=CA:FALSE\n")
    for who, cn, ext in (("server", "server", "san.ext"), ("client", "client", "san.ext"),
                         ("cn-only", "localhost", "none.ext")):  # a name in the subject only, no SAN
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", f"{who}.key",
             "-out", f"{who}.csr")
        ossl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", ext, "-out", f"{who}.crt")


def test_concurrent_writes_share_a_bounded_pool_of_connections(kube: KubeApiStandin) -> None:
    """Issue 39: a burst of concurrent binds reuses at most MAX_CONNECTIONS connections (before, each write
    that found none idle opened one: a TLS handshake per concurrent bind). The server holds every answer until
    either the writes beyond the pool wait for a connection, or all of them reached it (the unbounded way)."""
    from waiting import wait_until

    from memslice.scheduler_extender.kubeio.podwrites import MAX_CONNECTIONS

    writes = 3 * MAX_CONNECTIONS
    held, release, lock = [0], threading.Event(), threading.Lock()
    most = [0]

    def hold(method: str, path: str) -> None:
        with lock:
            held[0] += 1
            most[0] = max(most[0], held[0])
        release.wait(30)
        with lock:
            held[0] -= 1

    kube.before_request = hold
    writer = PodWriter(kube.api_client())
    done: list[object] = []

    def write(i: int) -> None:
        pod = writer.patch_namespaced_pod("p", "ns", {"metadata": {"annotations": {f"w{i}": "1"}}}, timeout=30)
        done.append(pod)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writes)]
    for t in threads:
        t.start()
    try:
        wait_until("the writes beyond the pool to wait for a connection (or all to reach the server)",
                   lambda: writer.waiting == writes - MAX_CONNECTIONS or held[0] == writes, timeout=30)
    finally:
        release.set()
        for t in threads:
            t.join(30)
    assert len(done) == writes
    assert most[0] <= MAX_CONNECTIONS and kube.connections == MAX_CONNECTIONS, (most[0], kube.connections)
    assert writer.waiting == 0
    writer.close()


def test_a_write_waits_for_a_busy_pool_no_longer_than_its_deadline(kube: KubeApiStandin) -> None:
    """With every connection busy, a write waits within its own timeout and then fails without sending
    anything; once a connection is given back, the next write uses it."""
    from waiting import wait_until

    from memslice.scheduler_extender.kubeio.podwrites import MAX_CONNECTIONS

    release = threading.Event()
    kube.before_request = lambda method, path: release.wait(30) and None
    writer = PodWriter(kube.api_client())
    threads = [threading.Thread(target=writer.patch_namespaced_pod, args=("p", "ns", PATCH), kwargs={"timeout": 30})
               for _ in range(MAX_CONNECTIONS)]
    for t in threads:
        t.start()
    try:
        wait_until("the pool to be busy", lambda: kube.connections == MAX_CONNECTIONS, timeout=30)
        with pytest.raises(TimeoutError, match="no connection to the API server free in time"):
            writer.patch_namespaced_pod("p", "ns", PATCH, timeout=0.2)
    finally:
        release.set()
        for t in threads:
            t.join(30)
    assert kube.count("patch", "pods") == MAX_CONNECTIONS  # the one that timed out sent nothing
    kube.before_request = None
    writer.patch_namespaced_pod("p", "ns", PATCH)
    assert kube.connections == MAX_CONNECTIONS
    writer.close()


def _kubeconfig(tmp: Path, url: str, cluster: dict[str, object], user: dict[str, object]) -> str:
    path = tmp / f"kubeconfig-{len(list(tmp.glob('kubeconfig-*')))}"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


@needs_openssl
def test_https_with_the_kubeconfigs_ca_and_client_certificate(tmp_path: Path) -> None:
    _certificates(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    tls.load_verify_locations(tmp_path / "ca.crt")
    tls.verify_mode = ssl.CERT_REQUIRED  # like an API server that authenticates clients by certificate
    with KubeApiStandin().start(tls) as kube:
        _pod(kube)
        assert kube.url.startswith("https://")
        client_cert = {"client-certificate": str(tmp_path / "client.crt"), "client-key": str(tmp_path / "client.key")}
        good = PodWriter(load_api_client(_kubeconfig(tmp_path, kube.url,
                                                     {"certificate-authority": str(tmp_path / "ca.crt")},
                                                     client_cert)))
        assert good.patch_namespaced_pod("p", "ns", PATCH)["metadata"]["name"] == "p"
        good.patch_namespaced_pod("p", "ns", PATCH)
        good.close()

        wrong_ca = PodWriter(load_api_client(_kubeconfig(tmp_path, kube.url,
                                                         {"certificate-authority": str(tmp_path / "other-ca.crt")},
                                                         client_cert)))
        with pytest.raises(ssl.SSLCertVerificationError):
            wrong_ca.patch_namespaced_pod("p", "ns", PATCH)

        no_client_cert = PodWriter(load_api_client(_kubeconfig(
            tmp_path, kube.url, {"certificate-authority": str(tmp_path / "ca.crt")}, {"token": "t"})))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            no_client_cert.patch_namespaced_pod("p", "ns", PATCH)

        insecure = PodWriter(load_api_client(_kubeconfig(tmp_path, kube.url, {"insecure-skip-tls-verify": True},
                                                         client_cert)))
        assert insecure.patch_namespaced_pod("p", "ns", PATCH)["metadata"]["name"] == "p"
        insecure.close()
    assert kube.connections == 2  # one each for the two writers that got in; `good` reused its own


@needs_openssl
def test_https_checks_subject_alt_names_only(tmp_path: Path) -> None:
    """A certificate naming the host only in its subject CN is refused, as the official client refuses it."""
    _certificates(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "cn-only.crt", tmp_path / "cn-only.key")
    with KubeApiStandin().start(tls) as kube:
        _pod(kube)
        url = kube.url.replace("127.0.0.1", "localhost")
        writer = PodWriter(load_api_client(_kubeconfig(tmp_path, url, {"certificate-authority": str(
            tmp_path / "ca.crt")}, {"token": "t"})))
        with pytest.raises(ssl.SSLCertVerificationError, match="localhost"):
            writer.patch_namespaced_pod("p", "ns", PATCH)


# ------------------------------------------------------------------------------------------------ raw answers

class CannedServer:
    """Answers each request with the next canned answer (bytes, and whether to close the connection after
    it); records the request targets and how many connections were opened."""

    def __init__(self, answers: list[tuple[bytes, bool]]) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.complete = False
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                parser = httptools.HttpRequestParser(self)
                close = False
                while self.answers and not close:
                    self.complete = False
                    while not self.complete:
                        data = conn.recv(65536)
                        if not data:
                            return
                        parser.feed_data(data)
                    answer, close = self.answers.pop(0)
                    conn.sendall(answer)
                if not close:
                    conn.recv(1)  # keep the connection open until the client closes it

    def on_url(self, url: bytes) -> None:  # httptools callbacks
        self.requests.append(url)

    def on_message_complete(self) -> None:
        self.complete = True

    def close(self) -> None:
        self.sock.close()


def _writer(url: str) -> PodWriter:
    from kubernetes import client

    conf = client.Configuration()
    conf.host = url
    return PodWriter(client.ApiClient(conf))


def test_chunked_and_connection_close_answers() -> None:
    body = b'{"metadata":{"name":"p","resourceVersion":"7"}}'
    chunked = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n")
    closing = (b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    server = CannedServer([(chunked, False), (chunked, False), (closing, True), (chunked, False)])
    writer = _writer(server.url)
    for _ in range(4):
        assert writer.patch_namespaced_pod("p", "ns", PATCH)["metadata"]["resourceVersion"] == "7"
    assert server.connections == 2  # kept alive through chunked answers, not after "Connection: close"
    assert server.requests == [b"/api/v1/namespaces/ns/pods/p"] * 4
    server.close()


def test_interim_1xx_answers_are_skipped() -> None:
    def pod(rv: int) -> bytes:
        body = b'{"metadata":{"name":"p","resourceVersion":"%d"}}' % rv
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    server = CannedServer([(b"HTTP/1.1 100 Continue\r\n\r\n" + pod(7), False),
                           (b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + pod(8), False)])
    writer = _writer(server.url)
    assert writer.patch_namespaced_pod("p", "ns", PATCH)["metadata"]["resourceVersion"] == "7"
    assert writer.patch_namespaced_pod("p", "ns", PATCH)["metadata"]["resourceVersion"] == "8"
    assert server.connections == 1
    server.close()
    # an interim answer alone is not the answer: the writer waits for the final one (here, in vain)
    server = CannedServer([(b"HTTP/1.1 100 Continue\r\n\r\n", False)])
    writer = _writer(server.url)
    with pytest.raises(TimeoutError):
        writer.patch_namespaced_pod("p", "ns", PATCH, timeout=0.3)
    assert not writer._idle
    server.close()


def test_an_answer_whose_body_ends_at_the_close() -> None:
    server = CannedServer([(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"kind":"Status"}', True),
                           (b'HTTP/1.1 201 Created\r\nConnection: close\r\n\r\n{"kind":"Pod"}', True)])
    writer = _writer(server.url)
    assert writer.patch_namespaced_pod("p", "ns", PATCH) == {"kind": "Status"}
    assert writer.patch_namespaced_pod("p", "ns", PATCH) == {"kind": "Pod"}
    assert server.connections == 2 and not writer._idle
    server.close()


def test_names_are_quoted_in_the_path() -> None:
    ok = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
    server = CannedServer([(ok, False)])
    _writer(server.url + "/prefix").create_namespaced_pod_binding("a b/c", "n s", {"kind": "Binding"})
    assert server.requests == [b"/prefix/api/v1/namespaces/n%20s/pods/a%20b%2Fc/binding"]
    server.close()


@pytest.mark.parametrize(("answer", "error"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut\":", ConnectionError),  # closed mid-body
    (b"", ConnectionError),  # closed without a word
    (b"SPDY/9 what\r\n\r\n", httptools.HttpParserError),
    (b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * (2 << 20), ValueError),  # headers beyond MAX_HEAD
])
def test_answers_cut_short_or_garbage_raise_and_drop_the_connection(answer: bytes, error: type) -> None:
    server = CannedServer([(answer, True)])
    writer = _writer(server.url)
    with pytest.raises(error):
        writer.patch_namespaced_pod("p", "ns", PATCH, timeout=5)
    assert not writer._idle  # a connection in an unknown state is never reused
    server.close()


def test_no_answer_in_time_is_a_timeout() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) but never answers
    writer = _writer(f"http://127.0.0.1:{listener.getsockname()[1]}")
    with pytest.raises(TimeoutError):
        writer.patch_namespaced_pod("p", "ns", PATCH, timeout=0.2)
    assert not writer._idle
    listener.close()

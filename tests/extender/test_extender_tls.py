"""Mutual TLS on the extender's port (issue 11, item 1): certificates from `memslice extender-certs`, the
extender requires a client certificate signed by the CA, kube-scheduler's side checks the server's; the
health port answers probes and /metrics in plain HTTP and nothing else."""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_standin import KubeApiStandin
from test_extender_support import Client, Cluster, node_obj, pod_obj, running_cluster

from memslice.scheduler_extender.app import Config


def certs(out: Path) -> Path:
    run = subprocess.run([sys.executable, "-m", "memslice", "extender-certs", "--out-dir", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (out / "server.key").stat().st_mode & 0o077 == 0
    return out


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False  # the server's names are the Service's; here it is 127.0.0.1
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return certs(tmp_path_factory.mktemp("pki")), certs(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture(scope="module")
def cluster(pki: tuple[Path, Path]) -> Iterator[Cluster]:
    d = pki[0]
    cfg = Config(address="127.0.0.1", port=0, watch_timeout=30, tls_cert_file=str(d / "server.crt"),
                 tls_key_file=str(d / "server.key"), tls_client_ca_file=str(d / "ca.crt"), health_port=0)
    with running_cluster(cfg) as c:
        c.start()
        assert c.ext is not None and c.ext.url.startswith("https://")
        c.client = Client(c.ext.url, client_context(d / "ca.crt", d / "client.crt", d / "client.key"))
        c.add_node(node_obj("n", [8000]))
        yield c


def test_the_scheduler_with_its_client_certificate_is_served(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"main": 100}))
    assert cluster.c.filter(pod, ["n"])["NodeNames"] == ["n"]
    assert cluster.c.bind(pod, "n") == ""


def refused(cluster: Cluster, ctx: ssl.SSLContext | None) -> None:
    assert cluster.ext is not None
    before = cluster.kube.resource_version
    conn = (http.client.HTTPSConnection("127.0.0.1", cluster.ext.port, timeout=10, context=ctx) if ctx
            else http.client.HTTPConnection("127.0.0.1", cluster.ext.port, timeout=10))
    body = b'{"PodName":"x","PodNamespace":"default","PodUID":"u","Node":"n"}'
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        conn.request("POST", "/bind", body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
    conn.close()
    assert cluster.kube.resource_version == before


def test_a_client_without_a_certificate_is_refused(cluster: Cluster, pki: tuple[Path, Path]) -> None:
    refused(cluster, client_context(pki[0] / "ca.crt"))


def test_a_certificate_of_another_ca_is_refused(cluster: Cluster, pki: tuple[Path, Path]) -> None:
    other = pki[1]
    refused(cluster, client_context(pki[0] / "ca.crt", other / "client.crt", other / "client.key"))


def test_plain_http_on_the_tls_port_is_refused(cluster: Cluster) -> None:
    refused(cluster, None)


def test_the_scheduler_side_rejects_a_server_of_another_ca(cluster: Cluster, pki: tuple[Path, Path]) -> None:
    d, other = pki
    assert cluster.ext is not None
    scheduler = Client(cluster.ext.url, client_context(other / "ca.crt", d / "client.crt", d / "client.key"))
    with pytest.raises(ssl.SSLCertVerificationError):
        scheduler.raw("GET", "/healthz")


def test_the_health_port_serves_probes_and_metrics_only(cluster: Cluster) -> None:
    assert cluster.ext is not None and cluster.ext.health_url is not None
    health = Client(cluster.ext.health_url)
    assert health.raw("GET", "/healthz")[0] == 200
    assert health.raw("GET", "/readyz")[0] == 200
    status, body, _ = health.raw("GET", "/metrics")
    assert status == 200 and b"memslice_extender" in body
    status, body, _ = health.raw("POST", "/bind", b'{"PodName":"x","PodNamespace":"d","PodUID":"u","Node":"n"}')
    assert status == 404 and b"only GET /healthz" in body
    assert health.raw("GET", "/filter")[0] == 404


def test_extender_certs_writes_two_tls_secrets_once(tmp_path: Path) -> None:
    def run(kc: str) -> str:
        env = {**os.environ, "KUBECONFIG": kc}
        out = subprocess.run([sys.executable, "-m", "memslice", "extender-certs", "--namespace", "ms"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout

    with KubeApiStandin() as kube:
        kc = kube.kubeconfig(str(tmp_path / "kc"))
        assert "wrote secrets ms/memslice-extender-tls" in run(kc)
        server = kube.get("Secret", "ms", "memslice-extender-tls")
        client = kube.get("Secret", "ms", "memslice-scheduler-extender-client")
        assert server["type"] == client["type"] == "kubernetes.io/tls"
        assert set(server["data"]) == set(client["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        assert server["data"]["ca.crt"] == client["data"]["ca.crt"]
        assert b"BEGIN CERTIFICATE" in base64.b64decode(server["data"]["tls.crt"])
        assert "kept" in run(kc)  # idempotent: the Job may run again
        kube.delete("Secret", "ms", "memslice-scheduler-extender-client")
        assert "wrote" in run(kc)  # one missing: both anew, from one new CA
        again = kube.get("Secret", "ms", "memslice-extender-tls")
        assert again["data"]["ca.crt"] != server["data"]["ca.crt"]
        assert again["data"]["ca.crt"] == kube.get("Secret", "ms", "memslice-scheduler-extender-client")["data"][
            "ca.crt"]


def test_the_servers_own_certificate_is_no_client_certificate(cluster: Cluster, pki: tuple[Path, Path]) -> None:
    """Same CA, wrong purpose: the extender's serverAuth certificate (which the extender's pod holds) does not
    open the verbs to whoever presents it as a client."""
    d = pki[0]
    refused(cluster, client_context(d / "ca.crt", d / "server.crt", d / "server.key"))


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2], ids=["tls1.3", "tls1.2"])
def test_no_session_tickets_are_minted(cluster: Cluster, pki: tuple[Path, Path], version: ssl.TLSVersion) -> None:
    """kube-scheduler's client never resumes a session (no session cache) and dials often: the extender sends
    it no tickets (minting them was half of each handshake's CPU, issue 39). A served request first, so the
    client has read whatever the server sent after the handshake."""
    assert cluster.ext is not None
    d = pki[0]
    ctx = client_context(d / "ca.crt", d / "client.crt", d / "client.key")
    ctx.minimum_version = ctx.maximum_version = version
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.ext.port, timeout=10, context=ctx)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok\n"
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket) and sock.version() == {ssl.TLSVersion.TLSv1_3: "TLSv1.3",
                                                                       ssl.TLSVersion.TLSv1_2: "TLSv1.2"}[version]
        assert sock.session is not None and not sock.session.has_ticket
    finally:
        conn.close()

"""`memslice extender` as a process: flags and environment, start against a cluster, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from kube_standin import KubeApiStandin
from test_extender_support import Client, node_obj, pod_obj


def extender(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_EXTENDER_") and k != "KUBECONFIG"}
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "memslice", "extender", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full)


def test_help_lists_flags_and_environment() -> None:
    out = subprocess.run([sys.executable, "-m", "memslice", "extender", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    for word in ("--port", "--policy", "--assume-ttl", "--tls-cert-file", "--kubeconfig", "MEMSLICE_EXTENDER_PORT",
                 "/filter", "/readyz", "--scheduler-names", "MEMSLICE_EXTENDER_SCHEDULER_NAMES", "--health-port",
                 "--filter-answers", "MEMSLICE_EXTENDER_FILTER_ANSWERS"):
        assert word in out.stdout


@pytest.mark.parametrize(("args", "env", "words"), [
    (["--port", "http"], {}, "--port='http' is not a TCP port"),
    (["--assume-ttl", "-5"], {}, "--assume-ttl='-5' must be positive"),
    ([], {"MEMSLICE_EXTENDER_POLICY": "fastest"}, "MEMSLICE_EXTENDER_POLICY='fastest' is not a policy"),
    ([], {"MEMSLICE_EXTENDER_FILTER_ANSWERS": "most"}, "--filter-answers='most' (or $MEMSLICE_EXTENDER_FILTER_ANSWERS) "
                                                       "is not one of best, all"),
    (["--tls-cert-file", "/nonexistent.crt"], {}, "TLS needs both"),
    (["--tls-client-ca-file", "/ca.crt"], {}, "--tls-client-ca-file needs --tls-cert-file"),
    (["--scheduler-names", "memslice-scheduler,Bad_Name"], {}, "'Bad_Name' is not a scheduler name"),
    ([], {"MEMSLICE_EXTENDER_SCHEDULER_NAMES": ""}, "'' is not a scheduler name"),
    (["--health-port", "http"], {}, "--health-port='http' is not a TCP port"),
    (["--probe-port", "-1"], {}, "--probe-port='-1' is not a TCP port"),
    (["--address", "0.0.0.0"], {}, "--address='0.0.0.0' (or $MEMSLICE_EXTENDER_ADDRESS) would serve the verbs"),
    ([], {"MEMSLICE_EXTENDER_ADDRESS": "10.0.0.5"}, "give a loopback address (--address=127.0.0.1"),
])
def test_bad_configuration_exits_2_naming_the_value(args, env, words, tmp_path) -> None:
    with KubeApiStandin() as kube:
        proc = extender("--kubeconfig", kube.kubeconfig(str(tmp_path / "kc")), "--port", "0", *args, env=env)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and words in err, err


def test_serves_a_cluster_and_stops_on_sigterm(tmp_path) -> None:
    with KubeApiStandin() as kube:
        kube.put(node_obj("n", [8000]))
        pod = kube.put(pod_obj("p", {"main": 1000}))
        proc = extender("--address", "127.0.0.1", "--port", "0", "--policy", "spread",
                        env={"KUBECONFIG": kube.kubeconfig(str(tmp_path / "kc"))})
        try:
            line = proc.stdout.readline()
            assert "serving http://127.0.0.1:" in line and "policy spread" in line, line
            client = Client(line.split("serving ", 1)[1].split()[0])
            synced = proc.stdout.readline()  # printed once the first list of nodes and pods is in
            assert "synced with the API server (GPU nodes: 1, GPU pods: 1); ready" in synced, synced
            assert client.raw("GET", "/readyz")[0] == 200
            assert client.filter(pod, ["n"])["NodeNames"] == ["n"]
            assert client.bind(pod, "n") == ""
            assert kube.get("Pod", "default", "p")["spec"]["nodeName"] == "n"
            client.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        assert proc.returncode == 0


def test_long_lived_objects_are_frozen_again_after_large_growth_only() -> None:
    """After the first sync the extender freezes what exists again only once the watched pods grew by
    10,000 and a tenth (a full collection would otherwise scan them all at once: 0.11-0.2 s at 20,000 nodes
    and 115,000 pods), never for small changes (each freeze may keep the cyclic garbage alive then)."""
    from memslice.scheduler_extender.cli import refreeze_due

    assert not refreeze_due(0, 9_999) and refreeze_due(0, 10_000)
    assert not refreeze_due(200_000, 219_999) and refreeze_due(200_000, 220_000)
    assert not refreeze_due(50_000, 40_000)


def test_plain_http_only_on_loopback() -> None:
    """The verbs bind any pod of a served scheduler: without TLS they are served only where no other pod or host
    can reach them (deploy/base: the scheduler's pod loopback); a name is refused, as what it resolves to can
    change."""
    from memslice.scheduler_extender.cli import plain_http_refusal

    for address in ("127.0.0.1", "127.0.0.53", "::1", "localhost"):
        assert plain_http_refusal(address, tls=False, client_ca=False) is None, address
    for address in ("0.0.0.0", "::", "", "10.1.2.3", "memslice-extender.memslice-system.svc", "127.0.0.1.nip.io"):
        refusal = plain_http_refusal(address, tls=False, client_ca=False)
        assert refusal is not None and "--tls-cert-file" in refusal and "--address=127.0.0.1" in refusal, address
        assert "in plain HTTP" in refusal, refusal
    assert plain_http_refusal("0.0.0.0", tls=True, client_ca=True) is None


def test_tls_without_client_certificates_only_on_loopback() -> None:
    """TLS alone authenticates the extender to its callers, not the callers to it: off loopback the verbs
    (which bind pods) also need --tls-client-ca-file, or anyone who reaches the port could call /bind."""
    from memslice.scheduler_extender.cli import plain_http_refusal

    assert plain_http_refusal("127.0.0.1", tls=True, client_ca=False) is None
    for address in ("0.0.0.0", "10.1.2.3"):
        refusal = plain_http_refusal(address, tls=True, client_ca=False)
        assert refusal is not None and "over TLS without client certificates" in refusal, address
        assert "--tls-client-ca-file" in refusal, refusal


def test_tls_without_a_client_ca_off_loopback_exits_2(tmp_path) -> None:
    """As a process: --address 0.0.0.0 with a server certificate but no client CA is refused before anything
    listens, naming the flag and the fix."""
    with KubeApiStandin() as kube:
        proc = extender("--kubeconfig", kube.kubeconfig(str(tmp_path / "kc")), "--port", "0", "--address", "0.0.0.0",
                        "--tls-cert-file", "/nonexistent.crt", "--tls-key-file", "/nonexistent.key")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "--address='0.0.0.0' (or $MEMSLICE_EXTENDER_ADDRESS) would serve the verbs" in err, err
    assert "over TLS without client certificates" in err and "--tls-client-ca-file" in err, err


def test_verbs_and_health_ports_listen_on_their_own_addresses(tmp_path) -> None:
    """As deploy/base runs it: the verbs on one loopback address only; the health and probe ports on
    --health-address (there the pod's, for the kubelet and Prometheus), which serve no verbs."""
    import socket
    import urllib.request
    from urllib.parse import urlsplit

    def refused(host: str, port: int) -> bool:
        try:
            socket.create_connection((host, port), timeout=5).close()
        except ConnectionRefusedError:
            return True
        return False

    with KubeApiStandin() as kube:
        proc = extender("--address", "127.0.0.1", "--port", "0", "--health-address", "127.0.0.2", "--health-port",
                        "0", "--probe-port", "0", env={"KUBECONFIG": kube.kubeconfig(str(tmp_path / "kc"))})
        try:
            line = proc.stdout.readline()
            urls = dict(part.rsplit(" ", 1) for part in line.strip().split("; ")[1:])
            verbs = urlsplit(line.split("serving ", 1)[1].split()[0])
            health, probes = urlsplit(urls["health and metrics on"]), urlsplit(urls["probes on"])
            assert (verbs.hostname, health.hostname, probes.hostname) == ("127.0.0.1", "127.0.0.2", "127.0.0.2"), line
            assert refused("127.0.0.2", verbs.port) and refused("127.0.0.1", health.port)
            assert refused("127.0.0.1", probes.port)
            with urllib.request.urlopen(f"http://127.0.0.2:{probes.port}/healthz", timeout=10) as resp:
                assert resp.status == 200
            assert Client(verbs.geturl()).raw("GET", "/healthz")[0] == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        assert proc.returncode == 0


def test_the_pods_own_scheduler_may_hold_every_verbs_connection_on_loopback() -> None:
    """In plain HTTP on loopback (deploy/base) every client is the pod's kube-scheduler, which dials a connection
    per bind in flight: it may hold the port's whole cap, not the per-address cap that keeps one host from
    holding all of a port reached over the network (there: 64 of 256; the 65th was refused)."""
    import socket

    from memslice.lean_http import ConnLimits
    from memslice.scheduler_extender.app import Config, Extender, verbs_limits
    from memslice.scheduler_extender.edge.server import VERBS_LIMITS

    assert verbs_limits("0.0.0.0", tls=True) == VERBS_LIMITS == verbs_limits("127.0.0.1", tls=True)
    assert verbs_limits("127.0.0.1", tls=False) == ConnLimits(max_connections=VERBS_LIMITS.max_connections,
                                                             per_peer=VERBS_LIMITS.max_connections)
    held = VERBS_LIMITS.per_peer + 8
    with KubeApiStandin() as kube:
        ext = Extender(kube.api_client(), Config(address="127.0.0.1", port=0)).start()
        socks = []
        try:
            for _ in range(held):  # keep-alive connections, as the scheduler's in flight hold them
                socks.append(socket.create_connection(("127.0.0.1", ext.port), timeout=10))
            last = socks[-1]
            last.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert last.recv(64).startswith(b"HTTP/1.1 200"), "the last connection was refused"
        finally:
            for s in socks:
                s.close()
            ext.stop()

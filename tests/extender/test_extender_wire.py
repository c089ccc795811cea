"""Filter / prioritize / bind / preempt round trips over real HTTP, in the exact wire format, against the
Kubernetes API stand-in through the official client."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator

import pytest
from test_extender_support import Client, Cluster, node_obj, plain_node, pod_obj, running_cluster

from memslice.scheduler_extender.app import Config

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("small", [4096, 4096]))
        c.add_node(node_obj("big", [16384, 16384]))
        c.add_node(plain_node("cpu-only"))
        yield c


def test_filter_wire_format_and_reasons(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"main": 8192}))
    body = cluster.c.filter(pod, ["small", "big", "cpu-only", "ghost"])
    assert set(body) == FILTER_KEYS
    assert body["NodeNames"] == ["big"] and body["Nodes"] is None and body["Error"] == ""
    assert set(body["FailedAndUnresolvableNodes"]) == {"small", "cpu-only"}
    assert "largest healthy GPU here has 4096 MiB" in body["FailedAndUnresolvableNodes"]["small"]
    assert "no memslice GPUs" in body["FailedAndUnresolvableNodes"]["cpu-only"]
    assert set(body["FailedNodes"]) == {"ghost"}  # not known yet: may appear, so not unresolvable


def test_full_node_reported_as_failed_not_unresolvable(cluster: Cluster) -> None:
    hog = cluster.add_pod(pod_obj("hog", {"main": 4000}))
    assert cluster.c.bind(hog, "small") == ""
    hog2 = cluster.add_pod(pod_obj("hog2", {"main": 4000}))
    assert cluster.c.bind(hog2, "small") == ""
    cluster.wait_used("small", [4000, 4000])
    pod = cluster.add_pod(pod_obj("p", {"main": 1000}))
    body = cluster.c.filter(pod, ["small", "big"])
    assert body["NodeNames"] == ["big"]
    assert "no GPU of the node has that much free now" in body["FailedNodes"]["small"]
    assert body["FailedAndUnresolvableNodes"] == {}


def test_non_memslice_pods_pass_through_untouched(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("web"))
    names = ["small", "cpu-only", "ghost"]
    body = cluster.c.filter(pod, names)
    assert body["NodeNames"] == names and body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == {}
    assert cluster.c.prioritize(pod, names) == {n: 0 for n in names}
    assert cluster.c.bind(pod, "cpu-only") == ""
    stored = cluster.kube.get("Pod", "default", "web")
    assert stored["spec"]["nodeName"] == "cpu-only"
    assert "annotations" not in stored["metadata"] or not any(
        k.startswith("memslice.io/") for k in stored["metadata"]["annotations"])


def test_prioritize_is_a_bare_array_in_range_and_follows_policy(cluster: Cluster) -> None:
    cluster.add_node(node_obj("half", [16384]))
    hog = cluster.add_pod(pod_obj("hog", {"main": 8192}))
    assert cluster.c.bind(hog, "half") == ""
    cluster.wait_used("half", [8192])
    pod = cluster.add_pod(pod_obj("p", {"main": 2048}))
    status, raw = cluster.c.post("prioritize", {"Pod": pod, "Nodes": None,
                                                "NodeNames": ["big", "half", "small"]})
    assert status == 200 and isinstance(raw, list)
    assert all(set(hp) == {"Host", "Score"} and isinstance(hp["Score"], int) and 0 <= hp["Score"] <= 10
               for hp in raw)
    binpack = {hp["Host"]: hp["Score"] for hp in raw}
    # after placement: half 10240/16384 used, small 2048/4096, big 2048/16384
    assert binpack == {"half": 6, "small": 5, "big": 1}
    spread = cluster.c.prioritize(cluster.add_pod(pod_obj("s", {"main": 2048}, policy="spread")),
                                  ["big", "half", "small"])
    assert spread["big"] > spread["half"]


def test_bind_is_one_binding_that_carries_the_reservation(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"train": 3000, "sidecar-cpu": None}))
    cluster.kube.reset_counts()
    assert cluster.c.bind(pod, "big") == ""
    stored = cluster.kube.get("Pod", "default", "p")
    ann = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "big"
    assert ann["memslice.io/gpu-uuid"] == "GPU-big-0"
    assert json.loads(ann["memslice.io/gpu-mem-mib"]) == {"train": 3000}
    assert ann["memslice.io/assumed-at"].endswith("Z")
    counts = cluster.kube.request_counts
    assert counts[("patch", "pods")] == 0 and counts[("create", "pods/binding")] == 1  # ONE write (issue 39)
    cluster.wait_used("big", [3000, 0])
    # the scheduler may retry a bind that timed out: the same answer, nothing written twice
    cluster.kube.reset_counts()
    assert cluster.c.bind(pod, "big") == ""
    assert cluster.kube.request_counts[("create", "pods/binding")] == 0
    assert "already bound" in cluster.c.bind(pod, "small")


def test_multi_container_and_init_container_reservation(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"a": 1000, "b": 2000}, init={"warmup": 2500}))
    assert cluster.c.bind(pod, "small") == ""
    ann = cluster.kube.get("Pod", "default", "p")["metadata"]["annotations"]
    assert json.loads(ann["memslice.io/gpu-mem-mib"]) == {"a": 1000, "b": 2000, "warmup": 2500}
    cluster.wait_used("small", [3000, 0])  # max(2500, 1000 + 2000)


def test_unit_mib_scales_devices(cluster: Cluster) -> None:
    cluster.add_node(node_obj("coarse", [16384], unit=256))
    pod = cluster.add_pod(pod_obj("p", {"main": 16}))  # 16 devices × 256 MiB
    assert cluster.c.filter(pod, ["coarse"])["NodeNames"] == ["coarse"]
    assert cluster.c.bind(pod, "coarse") == ""
    ann = cluster.kube.get("Pod", "default", "p")["metadata"]["annotations"]
    assert json.loads(ann["memslice.io/gpu-mem-mib"]) == {"main": 4096}
    cluster.wait_used("coarse", [4096])


def test_binpack_and_spread_pick_gpus_at_bind(cluster: Cluster) -> None:
    first = cluster.add_pod(pod_obj("first", {"main": 4000}))
    assert cluster.c.bind(first, "big") == ""  # binpack on an empty node: lowest index
    packed = cluster.add_pod(pod_obj("packed", {"main": 4000}))
    assert cluster.c.bind(packed, "big") == ""
    cluster.wait_used("big", [8000, 0])
    spread = cluster.add_pod(pod_obj("spread", {"main": 4000}, policy="spread"))
    assert cluster.c.bind(spread, "big") == ""
    cluster.wait_used("big", [8000, 4000])


def test_nodes_mode_answers_with_node_objects(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"main": 8192}))
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": [
        cluster.kube.get("Node", None, "small"), cluster.kube.get("Node", None, "big")]}
    status, body = cluster.c.post("filter", {"Pod": pod, "Nodes": nodes, "NodeNames": None})
    assert status == 200 and body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["big"]
    assert "small" in body["FailedAndUnresolvableNodes"]


def test_preempt_keeps_only_nodes_where_victims_make_room(cluster: Cluster) -> None:
    victim = cluster.add_pod(pod_obj("victim", {"main": 4000}))
    assert cluster.c.bind(victim, "small") == ""
    other = cluster.add_pod(pod_obj("other", {"main": 4000}))
    assert cluster.c.bind(other, "small") == ""
    cluster.wait_used("small", [4000, 4000])
    pod = cluster.add_pod(pod_obj("p", {"main": 3000}))
    uid = victim["metadata"]["uid"]
    args = {"Pod": pod, "NodeNameToMetaVictims": {
        "small": {"Pods": [{"UID": uid}], "NumPDBViolations": 0},
        "cpu-only": {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}}
    status, body = cluster.c.post("preempt", args)
    assert status == 200
    assert body == {"NodeNameToMetaVictims": {"small": {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}}
    too_big = cluster.add_pod(pod_obj("huge", {"main": 4096}))
    args["Pod"] = too_big
    status, body = cluster.c.post("preempt", args)  # 4000 freed on a 4096 GPU, 96 MiB... still no
    assert status == 200 and body["NodeNameToMetaVictims"] == {"small": {"Pods": [{"UID": uid}],
                                                                          "NumPDBViolations": 0}}
    args["Pod"] = cluster.add_pod(pod_obj("never", {"main": 5000}))
    status, body = cluster.c.post("preempt", args)
    assert status == 200 and body["NodeNameToMetaVictims"] == {}


def test_preempt_with_full_victim_pods_answers_meta_victims(cluster: Cluster) -> None:
    victim = cluster.add_pod(pod_obj("victim", {"main": 4000}))
    assert cluster.c.bind(victim, "small") == ""
    other = cluster.add_pod(pod_obj("other", {"main": 4000}))
    assert cluster.c.bind(other, "small") == ""
    cluster.wait_used("small", [4000, 4000])
    full = cluster.kube.get("Pod", "default", "victim")
    pod = cluster.add_pod(pod_obj("p", {"main": 4096}))  # fits GPU 0 of small once the victim is gone
    status, body = cluster.c.post("preempt", {"Pod": pod, "NodeNameToVictims": {
        "small": {"Pods": [full], "NumPDBViolations": 1}}})
    assert status == 200
    assert body == {"NodeNameToMetaVictims": {"small": {"Pods": [{"UID": full["metadata"]["uid"]}],
                                                        "NumPDBViolations": 1}}}


def test_filter_makes_no_api_requests(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"main": 1000}))
    cluster.kube.reset_counts()
    for _ in range(20):
        cluster.c.filter(pod, ["small", "big"])
        cluster.c.prioritize(pod, ["small", "big"])
    assert sum(n for (verb, _), n in cluster.kube.request_counts.items() if verb != "watch") == 0


def test_health_ready_and_metrics(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"main": 1000}))
    assert cluster.c.bind(pod, "big") == ""
    cluster.c.filter(pod, ["big"])
    status, body, _ = cluster.c.raw("GET", "/healthz")
    assert status == 200
    assert cluster.c.raw("GET", "/readyz")[0] == 200
    cluster.wait_used("big", [1000, 0])
    status, text, headers = cluster.c.raw("GET", "/metrics")
    metrics = text.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'memslice_extender_requests_total{code="200",verb="bind"} 1.0' in metrics
    assert 'memslice_extender_request_seconds_count{verb="filter"} 1.0' in metrics
    assert "memslice_extender_pods_bound_total 1.0" in metrics
    assert 'memslice_extender_gpu_free_mib{gpu="0",node="big",uuid="GPU-big-0"} 15384.0' in metrics
    assert cluster.c.bind(pod, "small").startswith("pod default/p is already bound")
    assert 'memslice_extender_bind_failures_total{reason="already_bound"} 1.0' in cluster.c.raw(
        "GET", "/metrics")[1].decode()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls(tmp_path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    config = Config(address="127.0.0.1", port=0, tls_cert_file=str(cert), tls_key_file=str(key))
    with running_cluster(config) as c:
        c.start()
        assert c.ext is not None and c.ext.url.startswith("https://")
        c.add_node(node_obj("n", [8000]))
        pod = c.add_pod(pod_obj("p", {"main": 1000}))
        secure = Client(c.ext.url, ssl.create_default_context(cafile=str(cert)))
        assert secure.filter(pod, ["n"])["NodeNames"] == ["n"]
        assert secure.bind(pod, "n") == ""
        secure.close()
        plain = Client(c.ext.url.replace("https://", "http://"))
        with pytest.raises(Exception):  # noqa: B017 - plain HTTP to a TLS port fails, whatever the error
            plain.filter(pod, ["n"])
        plain.close()
        # the server survives the failed handshake
        again = Client(c.ext.url, ssl.create_default_context(cafile=str(cert)))
        assert again.filter(pod, ["n"])["NodeNames"] == ["n"]
        again.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
def test_tls_with_client_certificates(tmp_path) -> None:
    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=memslice-test-ca",
         "-keyout", "ca.key", "-out", "ca.crt")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}", "-keyout", f"{who}.key",
             "-out", f"{who}.csr")
        ossl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "san.ext", "-out", f"{who}.crt")
    config = Config(address="127.0.0.1", port=0, tls_cert_file=str(tmp_path / "server.crt"),
                    tls_key_file=str(tmp_path / "server.key"), tls_client_ca_file=str(tmp_path / "ca.crt"))
    with running_cluster(config) as c:
        c.start()
        assert c.ext is not None
        c.add_node(node_obj("n", [8000]))
        pod = c.add_pod(pod_obj("p", {"main": 1000}))
        anonymous = Client(c.ext.url, ssl.create_default_context(cafile=str(tmp_path / "ca.crt")))
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            anonymous.filter(pod, ["n"])
        anonymous.close()
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        ctx.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        known = Client(c.ext.url, ctx)
        assert known.filter(pod, ["n"])["NodeNames"] == ["n"]
        known.close()

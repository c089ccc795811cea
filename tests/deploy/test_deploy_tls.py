"""The extender's transport security as deployed (issue 11, item 1). The standalone extender
(deploy/components/standalone-extender): the certificates its Job makes (or cert-manager issues) are the ones
the extender and kube-scheduler mount, kube-scheduler's tlsConfig reaches the extender's https port with its
hostname checked, the probes use the plain health port, and the NetworkPolicy admits only the scheduler's pods
to the verbs. deploy/base (issue 39: the extender in the scheduler's pods, its verbs on the pod's loopback):
its NetworkPolicy admits scrapers to the health port and nothing else."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kube_standin import KubeApiStandin
from test_deploy_render import NAMESPACE, Manifest, find, parse_memslice_args, pod_spec, render, serving

from memslice import extender_certs

STANDALONE = "overlays/standalone-extender"


def scheduler_extender_config(objs: list[Manifest]) -> dict[str, Any]:
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(
        "memslice-scheduler-config"))
    (ext,) = yaml.safe_load(cm["data"]["scheduler-config.yaml"])["extenders"]
    return ext


def mounted_secret(spec: Manifest, container: Manifest, path: str) -> tuple[str, str]:
    """(Secret name, key) that file `path` of the container comes from."""
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return volume["secret"]["secretName"], path[len(mount["mountPath"].rstrip("/")) + 1:]


def workload(objs: list[Manifest], name: str) -> tuple[Manifest, Manifest]:
    spec = pod_spec(find(objs, "Deployment", name))
    assert spec is not None
    return spec, spec["containers"][0]


def test_extender_and_scheduler_mount_the_secrets_the_job_writes() -> None:
    objs = render(STANDALONE)
    spec, c = workload(objs, "memslice-extender")
    args = parse_memslice_args(c)
    files = {mounted_secret(spec, c, p) for p in (args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)}
    assert files == {(extender_certs.DEFAULT_SERVER_SECRET, k) for k in ("tls.crt", "tls.key", "ca.crt")}
    sspec, sc = workload(objs, "memslice-scheduler")
    tls = scheduler_extender_config(objs)["tlsConfig"]
    assert set(tls) == {"certFile", "keyFile", "caFile"}  # no `insecure`
    assert {mounted_secret(sspec, sc, tls[k]) for k in ("certFile", "keyFile", "caFile")} == {
        (extender_certs.DEFAULT_CLIENT_SECRET, k) for k in ("tls.crt", "tls.key", "ca.crt")}
    job = find(objs, "Job", "memslice-extender-certs")
    jargs = parse_memslice_args(pod_spec(job)["containers"][0])  # type: ignore[index]
    assert (jargs.namespace, jargs.server_secret, jargs.client_secret) == (
        NAMESPACE, extender_certs.DEFAULT_SERVER_SECRET, extender_certs.DEFAULT_CLIENT_SECRET)
    assert urlsplit(scheduler_extender_config(objs)["urlPrefix"]).hostname in extender_certs.service_dns_names(
        jargs.service, jargs.namespace)
    for s in (spec, sspec):  # the key files are 0440 for the pod's group, not world-readable
        assert s["securityContext"]["fsGroup"] == s["securityContext"]["runAsGroup"]
        assert all(v["secret"]["defaultMode"] == 0o440 for v in s["volumes"] if "secret" in v)


def test_the_scheduler_reaches_the_deployed_extender_over_mutual_tls(tmp_path: Path) -> None:
    """The Job's command against an API stand-in; its Secrets laid out as the kubelet mounts them; the
    extender started with its Deployment's flags; a client configured as kube-scheduler's tlsConfig and
    urlPrefix (hostname checked against the certificate) calls filter."""
    from memslice.scheduler_extender.app import Config, Extender

    objs = render(STANDALONE)
    job = pod_spec(find(objs, "Job", "memslice-extender-certs"))["containers"][0]  # type: ignore[index]
    with KubeApiStandin() as kube:
        env = {**os.environ, "KUBECONFIG": kube.kubeconfig(str(tmp_path / "kc"))}
        run = subprocess.run([sys.executable, "-m", "memslice", *job["args"]], capture_output=True, text=True,
                             env=env, timeout=60)
        assert run.returncode == 0, run.stderr

        def materialize(spec: Manifest, c: Manifest, path: str) -> str:
            name, key = mounted_secret(spec, c, path)
            local = tmp_path / name / key
            local.parent.mkdir(exist_ok=True)
            local.write_bytes(base64.b64decode(kube.get("Secret", NAMESPACE, name)["data"][key]))
            return str(local)

        spec, c = workload(objs, "memslice-extender")
        args = parse_memslice_args(c)
        cfg = Config(address="127.0.0.1", port=0, health_port=0, scheduler_names=tuple(
            args.scheduler_names.split(",")), tls_cert_file=materialize(spec, c, args.tls_cert_file),
            tls_key_file=materialize(spec, c, args.tls_key_file),
            tls_client_ca_file=materialize(spec, c, args.tls_client_ca_file))
        sspec, sc = workload(objs, "memslice-scheduler")
        ext_cfg = scheduler_extender_config(objs)
        tls = {k: materialize(sspec, sc, v) for k, v in ext_cfg["tlsConfig"].items()}
        ctx = ssl.create_default_context(cafile=tls["caFile"])  # hostname checked, as Go's client does
        ctx.load_cert_chain(tls["certFile"], tls["keyFile"])
        url = urlsplit(ext_cfg["urlPrefix"])
        ext = Extender(kube.api_client(), cfg).start()
        try:
            assert ext.wait_synced(10)
            body = json.dumps({"Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {
                "containers": [{"name": "c"}]}}, "NodeNames": ["n"]}).encode()
            with socket.create_connection(("127.0.0.1", ext.port), timeout=10) as raw, \
                    ctx.wrap_socket(raw, server_hostname=url.hostname) as s:
                s.sendall(b"POST /filter HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (url.netloc.encode(), len(body))
                          + body)
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and b'"NodeNames":["n"]' in answer
        finally:
            ext.stop()


def test_probes_use_their_own_plain_port() -> None:
    """The kubelet's probes on the probe port alone (issue 35: on the health port, scrapers or anyone could
    starve them), plain HTTP (the verbs port requires a client certificate)."""
    spec, c = workload(render(STANDALONE), "memslice-extender")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    args = parse_memslice_args(c)
    assert args.health_port == ports["http"] and args.probe_port == ports["probes"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == "probes" and c[probe]["httpGet"].get("scheme", "HTTP") == "HTTP"


SCRAPER = {"memslice.io/metrics-scraper": "true"}  # the label the policies admit to the metrics ports
SCRAPERS_NS = {"kubernetes.io/metadata.name": "monitoring", **SCRAPER}  # a namespace labelled by an admin


def admitted(policy: Manifest, pod_labels: dict[str, str], namespace: str, port_name: str,
             ns_labels: dict[str, str] | None = None, number: int | None = None) -> bool:
    """Whether a NetworkPolicy's ingress rules admit a pod with these labels, in this namespace (with these
    labels), to the named container port (the subset of the semantics the manifests use:
    podSelector.matchLabels alone (the policy's namespace) or with a namespaceSelector (its matchLabels: the
    namespaces they select, together with the pod selector), named ports, or the port's `number` where a rule
    names it so)."""
    ns_labels = {"kubernetes.io/metadata.name": namespace, **(ns_labels or {})}
    for rule in policy["spec"].get("ingress", []):
        ports = rule.get("ports")
        if ports is not None and not any(p.get("port") in (port_name, number) for p in ports):
            continue
        peers = rule.get("from")
        if peers is None:
            return True
        for peer in peers:
            assert set(peer) <= {"podSelector", "namespaceSelector"}, "extend admitted() for this peer"
            if "namespaceSelector" in peer:
                selector = peer["namespaceSelector"]
                assert set(selector) <= {"matchLabels"}, "extend admitted() for this namespace selector"
                in_namespace = all(ns_labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
            else:
                in_namespace = namespace == policy["metadata"]["namespace"]
            if in_namespace and all(pod_labels.get(k) == v
                                    for k, v in peer.get("podSelector", {}).get("matchLabels", {}).items()):
                return True
    return False


def test_network_policy_admits_only_the_scheduler_to_the_verbs() -> None:
    objs = render(STANDALONE)
    policy = find(objs, "NetworkPolicy", "memslice-extender")
    ext = find(objs, "Deployment", "memslice-extender")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= ext.items()
    pods = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
            for o in objs if o["kind"] in ("Deployment", "DaemonSet")}
    verbs, health = "https", "http"
    assert admitted(policy, pods["memslice-scheduler"], NAMESPACE, verbs)
    for name in ("memslice-node-agent", "memslice-extender"):
        assert not admitted(policy, pods[name], NAMESPACE, verbs), name
    assert not admitted(policy, pods["memslice-scheduler"], "tenant", verbs)  # same labels, other namespace
    assert not admitted(policy, {"app": "notebook"}, "tenant", verbs)
    assert not admitted(policy, {**SCRAPER, "app": "prometheus"}, "monitoring", verbs, SCRAPERS_NS)
    # the health port: scrapers only (issue 25: anyone on the pod network could exhaust it), in a namespace
    # labelled as scrapers' (issue 35: a tenant can label its pods, not its namespace)
    assert admitted(policy, {**SCRAPER, "app": "prometheus"}, "monitoring", health, SCRAPERS_NS)
    assert not admitted(policy, {"app": "prometheus"}, "monitoring", health, SCRAPERS_NS)
    assert not admitted(policy, {**SCRAPER, "app": "notebook"}, "tenant", health)
    assert not admitted(policy, {"app": "notebook"}, "tenant", health)
    # the probe port: no pod at all (the kubelet's probes come from the node, which NetworkPolicy does not
    # filter)
    for labels, ns, ns_labels in ((pods["memslice-scheduler"], NAMESPACE, None),
                                  ({**SCRAPER, "app": "prometheus"}, "monitoring", SCRAPERS_NS)):
        assert not admitted(policy, labels, ns, "probes", ns_labels)


def test_network_policy_admits_only_scrapers_to_the_scheduler_pods() -> None:
    """deploy/base: the extender's verbs listen on the scheduler pod's loopback, out of every pod's reach; the
    policy admits labelled scrapers to the extender's health port and no pod to any other port."""
    objs = render("base")
    policy = find(objs, "NetworkPolicy", "memslice-scheduler")
    scheduler = find(objs, "Deployment", "memslice-scheduler")["spec"]["template"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= scheduler["metadata"]["labels"].items()
    number = {p["name"]: p["containerPort"] for c in serving(scheduler["spec"]) for p in c.get("ports", [])}
    assert set(number) == {"http", "probes"}  # the verbs (127.0.0.1:8888) are no port of the pod's address
    http = number["http"]  # the rule names the sidecar's port by number (test_deploy_render.targets)
    assert admitted(policy, {**SCRAPER, "app": "prometheus"}, "monitoring", "http", SCRAPERS_NS, http)
    assert not admitted(policy, {"app": "prometheus"}, "monitoring", "http", SCRAPERS_NS, http)
    assert not admitted(policy, {**SCRAPER, "app": "notebook"}, "tenant", "http", None, http)
    for port, n in (("probes", number["probes"]), ("https", 8888)):
        assert not admitted(policy, {**SCRAPER, "app": "prometheus"}, "monitoring", port, SCRAPERS_NS, n)
        assert not admitted(policy, scheduler["metadata"]["labels"], NAMESPACE, port, None, n)
    assert not [o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "memslice-extender"]


def test_network_policy_admits_only_scrapers_to_the_node_agent() -> None:
    objs = render("base")
    policy = find(objs, "NetworkPolicy", "memslice-node-agent")
    agent = find(objs, "DaemonSet", "memslice-node-agent")["spec"]["template"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= agent["metadata"]["labels"].items()
    ports = {p["name"] for c in agent["spec"]["containers"] for p in c.get("ports", [])}
    assert ports == {"metrics", "probes"}  # the TCP ports; everything else is a Unix socket
    assert admitted(policy, {**SCRAPER, "app": "prometheus"}, "monitoring", "metrics", SCRAPERS_NS)
    assert not admitted(policy, {"app": "prometheus"}, "monitoring", "metrics", SCRAPERS_NS)
    assert not admitted(policy, {**SCRAPER, "app": "notebook"}, "tenant", "metrics")  # labelled its way in
    assert not admitted(policy, {"app": "notebook"}, "tenant", "metrics")
    assert not admitted(policy, agent["metadata"]["labels"], NAMESPACE, "metrics")
    assert not admitted(policy, {**SCRAPER, "app": "prometheus"}, "monitoring", "probes", SCRAPERS_NS)
    c = agent["spec"]["containers"][0]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == "probes"
    assert [o["metadata"]["name"] for o in render("overlays/dra") if o["kind"] == "NetworkPolicy"] == [
        "memslice-node-agent"]  # the DRA overlay keeps it (and drops the extender's)


def test_cert_manager_overlay_issues_the_same_secrets_and_drops_the_job() -> None:
    objs = render("overlays/cert-manager")
    assert not [o for o in objs if o["metadata"]["name"] == "memslice-extender-certs"]
    certs = {o["spec"]["secretName"]: o for o in objs if o["kind"] == "Certificate"}
    server, client = certs[extender_certs.DEFAULT_SERVER_SECRET], certs[extender_certs.DEFAULT_CLIENT_SECRET]
    assert "server auth" in server["spec"]["usages"] and "client auth" in client["spec"]["usages"]
    host = urlsplit(scheduler_extender_config(objs)["urlPrefix"]).hostname
    assert host in server["spec"]["dnsNames"]
    issuer = server["spec"]["issuerRef"]["name"]
    assert client["spec"]["issuerRef"]["name"] == issuer  # one CA: each side's ca.crt checks the other
    ca = find(objs, "Issuer", issuer)["spec"]["ca"]["secretName"]
    assert certs[ca]["spec"]["isCA"] is True
    base = {(o["kind"], o["metadata"]["name"]) for o in render(STANDALONE)}
    assert base - {(o["kind"], o["metadata"]["name"]) for o in objs} == {
        (k, "memslice-extender-certs") for k in ("Job", "ServiceAccount", "Role", "RoleBinding")}

"""The second scheduler's KubeSchedulerConfiguration, checked against the extender it calls.

The verbs are not only compared with a list: the real extender (memslice.scheduler_extender.app) is
started against the Kubernetes API stand-in, and each configured verb is called at the URL the scheduler
would build from urlPrefix, with the body kube-scheduler sends in node-cache mode, for the notebook of
deploy/examples.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kube_standin import KubeApiStandin
from test_deploy_examples import example
from test_deploy_render import (
    NAMESPACE,
    RESOURCE,
    SCHEDULER_NAME,
    Manifest,
    extender_container,
    find,
    parse_memslice_args,
    pod_spec,
    render,
)
from waiting import wait_until

from memslice import contract

VERBS = ("filter", "bind", "preempt")
# Fields of kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1). kube-scheduler decodes its
# configuration strictly, so a misspelt field stops it from starting; catch that here.
CONFIG_FIELDS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
                 "healthzBindAddress", "metricsBindAddress", "enableProfiling", "enableContentionProfiling",
                 "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles",
                 "extenders", "delayCacheUntilActive"}
LEADER_ELECTION_FIELDS = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
                          "resourceName", "resourceNamespace"}
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
                   "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
                   "ignorable"}


def scheduler_config(rel: str = "base") -> dict[str, Any]:
    cm = next(o for o in render(rel) if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("memslice-scheduler-config"))
    return yaml.safe_load(cm["data"]["scheduler-config.yaml"])


def extender_config(rel: str = "base") -> dict[str, Any]:
    (ext,) = scheduler_config(rel)["extenders"]
    return ext


def duration_seconds(text: str) -> float:
    """A Go duration as the scheduler config takes it (only the forms used here: 500ms, 10s, 1m)."""
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    assert m, f"unsupported duration {text!r}"
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def test_configuration_is_v1_with_one_profile_and_the_extender() -> None:
    cfg = scheduler_config()
    assert set(cfg) <= CONFIG_FIELDS
    assert set(cfg["leaderElection"]) <= LEADER_ELECTION_FIELDS
    assert all(set(p) <= PROFILE_FIELDS for p in cfg["profiles"])
    assert all(set(e) <= EXTENDER_FIELDS for e in cfg["extenders"])
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in cfg["profiles"]] == [SCHEDULER_NAME]
    assert cfg["leaderElection"]["leaderElect"] is True
    ext = extender_config()
    assert {k: ext[f"{k}Verb"] for k in VERBS} == {k: k for k in VERBS}
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["managedResources"] == [{"name": contract.RESOURCE, "ignoredByScheduler": False},
                                       {"name": contract.RESOURCE_COMPUTE, "ignoredByScheduler": False}]
    assert contract.RESOURCE == RESOURCE
    # no prioritize: filter passes only the best-scoring nodes (the extender's --filter-answers best)
    assert "prioritizeVerb" not in ext and "weight" not in ext
    assert 1 <= duration_seconds(ext["httpTimeout"]) <= 30
    assert ext["enableHTTPS"] is (urlsplit(ext["urlPrefix"]).scheme == "https")


def test_the_extenders_filter_answers_what_the_configuration_expects() -> None:
    """Without a prioritizeVerb the scheduler ranks whatever filter passes by its own scores alone: the extender
    must then pass only its best nodes (--filter-answers best), in deploy/base and in the standalone extender."""
    for rel in ("base", "overlays/standalone-extender"):
        assert "prioritizeVerb" not in extender_config(rel), rel
        assert parse_memslice_args(extender_container(render(rel))[2]).filter_answers == "best", rel


def test_the_managed_resource_is_the_one_the_node_agent_advertises() -> None:
    from memslice.plugin.deviceplugin.allocator import RESOURCE_NAME

    assert extender_config()["managedResources"][0]["name"] == RESOURCE_NAME


def test_url_prefix_reaches_the_extender_in_the_schedulers_own_pod() -> None:
    """deploy/base: kube-scheduler calls the extender container of its own pod on the pod's loopback, in plain
    HTTP, where that container listens (and the extender accepts plain HTTP only there)."""
    objs = render("base")
    ext = extender_config()
    url = urlsplit(ext["urlPrefix"])
    assert (url.scheme, url.hostname, ext["enableHTTPS"]) == ("http", "127.0.0.1", False) and "tlsConfig" not in ext
    dep, _, c = extender_container(objs)
    assert dep["metadata"]["name"] == "memslice-scheduler"
    args = parse_memslice_args(c)
    assert (args.address, args.port) == (url.hostname, url.port)
    assert not [v for v in pod_spec(dep)["volumes"] if "secret" in v]  # type: ignore[index]  # no certificates


def test_url_prefix_reaches_the_standalone_extender_service_and_container_port() -> None:
    objs = render("overlays/standalone-extender")
    url = urlsplit(extender_config("overlays/standalone-extender")["urlPrefix"])
    host = url.hostname or ""
    svc_name, svc_ns = host.split(".")[:2]
    assert host in (f"{svc_name}.{svc_ns}.svc", f"{svc_name}.{svc_ns}.svc.cluster.local")
    assert svc_ns == NAMESPACE
    svc = find(objs, "Service", svc_name)
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    dep = find(objs, "Deployment", "memslice-extender")
    c = pod_spec(dep)["containers"][0]  # type: ignore[index]
    assert {p["name"]: p["containerPort"] for p in c["ports"]}[port["targetPort"]] == 8888
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_the_standalone_configuration_differs_only_in_how_the_extender_is_reached() -> None:
    base, standalone = scheduler_config(), scheduler_config("overlays/standalone-extender")
    (a,), (b,) = base.pop("extenders"), standalone.pop("extenders")
    assert base == standalone
    for key in ("urlPrefix", "enableHTTPS", "tlsConfig"):
        a.pop(key, None), b.pop(key)
    assert a == b


def test_scheduler_deployment_mounts_the_generated_config() -> None:
    objs = render("base")
    dep = find(objs, "Deployment", "memslice-scheduler")
    spec = pod_spec(dep)
    assert spec is not None
    (c,) = [x for x in spec["containers"] if x["name"] == "kube-scheduler"]
    config_arg = next(a for a in c["command"] if a.startswith("--config="))
    path = config_arg.split("=", 1)[1]
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    cm = find(objs, "ConfigMap", vol["configMap"]["name"])  # the hashed name kustomize generated
    assert path.rsplit("/", 1)[1] in cm["data"]
    assert c["image"].startswith("registry.k8s.io/kube-scheduler:v1.")


# ------------------------------------------------------------------ the verbs against the real extender

GPU_UUID = "GPU-0b6a8c1e-2f0e-4d8b-9d7a-5f3c2a1b0c9d"


@pytest.fixture
def extender() -> Iterator[tuple[KubeApiStandin, str]]:
    from memslice.scheduler_extender.app import Config, Extender

    kube = KubeApiStandin().start()
    kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node", "annotations": {
        contract.ANN_GPUS: json.dumps([{"uuid": GPU_UUID, "index": 0, "model": "Simulated GPU",
                                         "memMiB": 16384, "numa": 0, "healthy": True}]),
        contract.ANN_UNIT_MIB: "1"}},
        "status": {"allocatable": {RESOURCE: "16384"}, "capacity": {RESOURCE: "16384"}}})
    ext = Extender(kube.api_client(), Config(address="127.0.0.1", port=0)).start()
    try:
        assert ext.wait_synced(10), "the extender did not sync with the API stand-in"
        yield kube, ext.url
    finally:
        ext.stop()
        kube.stop()


def post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status


def test_the_extender_is_a_native_sidecar_that_kube_scheduler_starts_after() -> None:
    """deploy/base: the extender is an init container with restartPolicy Always, a native sidecar (KEP-753; on by
    default since Kubernetes 1.29, GA in 1.33): the kubelet starts kube-scheduler only once the extender's
    startupProbe succeeded, and stops it before the extender. That probe is the probe port's /readyz, which
    answers 200 only once the node and pod watches listed (next test): a newly leading kube-scheduler never calls
    an extender that does not listen yet or has not synced."""
    objs = render("base")
    spec = pod_spec(find(objs, "Deployment", "memslice-scheduler"))
    assert spec is not None
    assert [c["name"] for c in spec.get("initContainers", [])] == ["extender"]
    assert [c["name"] for c in spec["containers"]] == ["kube-scheduler"]
    _, _, c = extender_container(objs)
    assert c["restartPolicy"] == "Always"
    startup = c["startupProbe"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert startup["httpGet"]["path"] == "/readyz" and startup["httpGet"].get("scheme", "HTTP") == "HTTP"
    assert ports[startup["httpGet"]["port"]] == parse_memslice_args(c).probe_port
    assert startup["periodSeconds"] <= 2  # kube-scheduler starts within a period or two of the sync
    # a slow first list (250,000 pods; an API server just restarted) is waited for, not restarted in a loop
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def probe(url: str) -> tuple[int, bytes]:
    """GET `url` as the kubelet's HTTP prober does: (status, body), a 503 included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_startup_probe_succeeds_only_once_nodes_and_pods_are_listed() -> None:
    """Through real HTTP, as the kubelet probes it: the real extender with a probe port answers deploy/base's
    startupProbe with 503 while its list of pods is held at the API server (the nodes listed, the process
    live), and with 200 once that list is in."""
    from memslice.scheduler_extender.app import Config, Extender

    _, _, c = extender_container(render("base"))
    path = c["startupProbe"]["httpGet"]["path"]
    reached, release = threading.Event(), threading.Event()

    def hold_pod_list(method: str, url_path: str) -> None:
        if method == "GET" and url_path == "/api/v1/pods":
            reached.set()
            release.wait(30)

    with KubeApiStandin() as kube:
        kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}})
        kube.before_request = hold_pod_list
        ext = Extender(kube.api_client(), Config(address="127.0.0.1", port=0, health_address="127.0.0.1",
                                                 probe_port=0)).start()
        try:
            assert ext.probe_url is not None
            wait_until("the pod list held at the API server and the nodes listed",
                       lambda: reached.is_set() and ext.state.nodes_synced.is_set(), 30)
            assert probe(ext.probe_url + path) == (503, b"not synced with the API server\n")
            assert probe(ext.probe_url + c["livenessProbe"]["httpGet"]["path"])[0] == 200  # live meanwhile
            release.set()
            wait_until("the startup probe to succeed once the pods are listed",
                       lambda: probe(ext.probe_url + path)[0] == 200, 30)  # type: ignore[operator]
        finally:
            release.set()
            ext.stop()


def test_probe_paths_answer_on_the_running_extender(extender: tuple[KubeApiStandin, str]) -> None:
    _, base = extender
    _, _, c = extender_container(render("base"))
    for probe in ("livenessProbe", "readinessProbe"):
        assert get(base + c[probe]["httpGet"]["path"]) == 200
    assert get(base + "/metrics") == 200


def test_configured_verbs_schedule_the_example_notebook(extender: tuple[KubeApiStandin, str]) -> None:
    """filter → bind as kube-scheduler calls them in node-cache mode, then preempt."""
    kube, base = extender
    notebook: Manifest = example("notebook.yaml")
    notebook["metadata"]["namespace"] = "default"
    pod = kube.put(notebook)
    ext = extender_config()
    prefix = base + urlsplit(ext["urlPrefix"]).path.rstrip("/")
    args = {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-node"]}

    code, res = post(f"{prefix}/{ext['filterVerb']}", args)
    assert code == 200 and not res.get("Error")
    assert res["NodeNames"] == ["gpu-node"]

    code, res = post(f"{prefix}/{ext['preemptVerb']}", {
        "Pod": pod, "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {"gpu-node": {"Pods": [], "NumPDBViolations": 0}}})
    assert code == 200 and "NodeNameToMetaVictims" in res

    code, res = post(f"{prefix}/{ext['bindVerb']}", {
        "PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
        "Node": "gpu-node"})
    assert code == 200 and res.get("Error", "") == ""
    bound = kube.get("Pod", "default", pod["metadata"]["name"])
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-node"
    annotations = bound["metadata"]["annotations"]
    assert annotations[contract.ANN_GPU_UUID] == GPU_UUID
    assert json.loads(annotations[contract.ANN_GPU_MEM]) == {"notebook": 4096}

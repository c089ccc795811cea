"""deploy/: schema validity, least privilege, resources, probes, host paths, and agreement with the CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes.utils import parse_quantity

# memslice.cli blocks kubernetes_validate in its own processes (sys.modules entry None); a test module of the same
# pytest process that imported memslice.cli first must not blind these tests, which need the validator.
if "kubernetes_validate" in sys.modules and sys.modules["kubernetes_validate"] is None:
    del sys.modules["kubernetes_validate"]
from kubernetes_validate.utils import SchemaNotFoundError, all_versions, validate
from test_deploy_render import (
    DEPLOY,
    KUSTOMIZATIONS,
    NAMESPACE,
    Manifest,
    containers,
    extender_container,
    find,
    parse_memslice_args,
    pod_spec,
    render,
    serving,
    targets,
    workloads,
)

import memslice

K8S_VERSION = all_versions()[-1]  # the newest release kubernetes-validate ships schemas for
OUR_WORKLOADS = ("base", "overlays/simulated", "overlays/cdi", "overlays/cert-manager")
# Custom resources have no schema in kubernetes-validate; checked field by field below.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("cert-manager.io/v1", "Issuer"),
             ("cert-manager.io/v1", "Certificate")}


def validate_strict(obj: Manifest) -> None:
    """Validate against the Kubernetes OpenAPI schema; strict = unknown fields are errors."""
    validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_rendered_objects_match_kubernetes_schemas(rel: str) -> None:
    for obj in render(rel):
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        try:
            validate_strict(obj)
        except SchemaNotFoundError as exc:
            raise AssertionError(exc.message) from exc


def test_validation_catches_a_misspelt_field() -> None:
    """The schema check is strict: a typo in a field name fails (guards against a silent no-op check)."""
    ds = find(render("base"), "DaemonSet", "memslice-node-agent")
    ds["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(Exception, match="resource"):
        validate_strict(ds)


def test_service_monitors_select_our_services_and_ports() -> None:
    services = {o["metadata"]["name"]: o for o in render("base") if o["kind"] == "Service"}
    monitors = [o for o in render("monitoring") if o["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"memslice-node-agent", "memslice-extender"}
    for m in monitors:
        assert m["metadata"]["namespace"] == NAMESPACE
        svc = [s for s in services.values()
               if all(s["metadata"]["labels"].get(k) == v
                      for k, v in m["spec"]["selector"]["matchLabels"].items())]
        assert len(svc) == 1, f"ServiceMonitor {m['metadata']['name']} selects {len(svc)} Services"
        port_names = {p["name"] for p in svc[0]["spec"]["ports"]}
        for ep in m["spec"]["endpoints"]:
            assert ep["port"] in port_names
            assert ep["path"] == "/metrics"


# ------------------------------------------------------------------------------ pods: least privilege


def our_pods(rel: str) -> list[tuple[Manifest, Manifest]]:
    return list(workloads(render(rel)))


@pytest.mark.parametrize("rel", OUR_WORKLOADS)
def test_no_container_is_privileged_or_shares_host_namespaces(rel: str) -> None:
    for obj, spec in our_pods(rel):
        name = obj["metadata"]["name"]
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(field), f"{name} sets {field}"
        for c in containers(spec):
            sc = c.get("securityContext", {})
            assert sc.get("privileged") is not True, name
            assert sc.get("allowPrivilegeEscalation") is False, f"{name}/{c['name']}"
            assert sc.get("readOnlyRootFilesystem") is True, f"{name}/{c['name']}"
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}/{c['name']}"
            assert not sc.get("capabilities", {}).get("add"), f"{name}/{c['name']} adds capabilities"
            seccomp = sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile")
            assert seccomp == {"type": "RuntimeDefault"}, f"{name}/{c['name']}"


def run_as_root(spec: Manifest, c: Manifest) -> bool:
    sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    return sc.get("runAsUser", 0) == 0 or not sc.get("runAsNonRoot", False)


@pytest.mark.parametrize("rel", OUR_WORKLOADS)
def test_only_the_node_agent_runs_as_root(rel: str) -> None:
    root = {(o["metadata"]["name"], c["name"]) for o, spec in our_pods(rel) for c in containers(spec)
            if run_as_root(spec, c)}
    assert root == {("memslice-node-agent", "node-agent")}


def test_image_runs_as_non_root_by_default() -> None:
    """The Dockerfile's USER is not root, so the extender's runAsNonRoot holds without an override."""
    user = [line.split()[1] for line in (DEPLOY.parent / "Dockerfile").read_text().splitlines()
            if line.startswith("USER ")]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    for rel in ("base", "overlays/standalone-extender"):
        _, spec, _ = extender_container(render(rel))
        assert spec["securityContext"]["runAsUser"] == int(user[-1].split(":")[0])


# ------------------------------------------------------------------------ pods: resources and probes


@pytest.mark.parametrize("rel", OUR_WORKLOADS)
def test_every_container_has_requests_limits_and_probes(rel: str) -> None:
    for obj, spec in our_pods(rel):
        for c in serving(spec):
            where = f"{obj['metadata']['name']}/{c['name']}"
            res = c.get("resources", {})
            if obj["kind"] == "Job":  # runs to completion: resources, no probes
                assert {"cpu", "memory"} <= set(res.get("limits", {})), where
                continue
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(res.get(kind, {})), f"{where}: {kind} incomplete"
                for key in ("cpu", "memory"):
                    assert parse_quantity(res["requests"][key]) <= parse_quantity(res["limits"][key]), where
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in c, f"{where}: no {probe}"
                port = c[probe]["httpGet"]["port"]
                assert isinstance(port, int) or port in ports, f"{where}: {probe} port {port} undeclared"


def test_node_agent_is_guaranteed_qos() -> None:
    for rel in OUR_WORKLOADS:
        spec = pod_spec(find(render(rel), "DaemonSet", "memslice-node-agent"))
        assert spec is not None
        for c in containers(spec):
            res = c["resources"]
            assert set(res["requests"]) == set(res["limits"]) >= {"cpu", "memory"}
            for key, value in res["limits"].items():
                assert parse_quantity(res["requests"][key]) == parse_quantity(value), f"{rel}: {key}"
        assert spec["priorityClassName"] == "system-node-critical"


def test_images_are_this_release() -> None:
    images = {c["image"] for _, spec in our_pods("base") for c in containers(spec)}
    assert f"memslice:{memslice.__version__}" in images
    assert {i for i in images if not i.startswith("registry.k8s.io/kube-scheduler:")} == {
        f"memslice:{memslice.__version__}"}


# ------------------------------------------------------------------------------ node agent: host paths

NODE_AGENT_HOST_PATHS = {
    "/var/lib/kubelet/device-plugins": False,   # path -> mounted read-only
    "/var/lib/kubelet/pod-resources": True,
    "/var/lib/memslice/lib": False,
    "/var/lib/memslice/regions": False,
    "/var/lib/memslice/elastic": False,  # the agent creates boards and rosters there (read-only root filesystem)
}


def host_mounts(spec: Manifest) -> dict[str, tuple[str, bool]]:
    """hostPath -> (mountPath, readOnly) for the first container."""
    vols = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
    out = {}
    for m in spec["containers"][0].get("volumeMounts", []):
        if m["name"] in vols:
            out[vols.pop(m["name"])] = (m["mountPath"], bool(m.get("readOnly")))
    assert not vols, f"hostPath volumes declared but not mounted: {vols}"
    return out


def test_node_agent_host_paths_are_exactly_the_needed_ones() -> None:
    spec = pod_spec(find(render("base"), "DaemonSet", "memslice-node-agent"))
    assert spec is not None
    mounts = host_mounts(spec)
    assert {p: ro for p, (_, ro) in mounts.items()} == NODE_AGENT_HOST_PATHS
    for host, (inside, _) in mounts.items():
        # the agent passes paths it sees to the kubelet as host paths (Allocate mounts)
        assert host == inside, "the agent must see each host path at the same path"
    for obj, other in our_pods("base"):
        if obj["metadata"]["name"] != "memslice-node-agent":
            assert not [v for v in other.get("volumes", []) if "hostPath" in v], obj["metadata"]["name"]


def test_every_host_path_is_explained_in_a_comment() -> None:
    """Each hostPath volume in the sources has a comment right above it saying why it is there."""
    sources = [p for p in DEPLOY.rglob("*.yaml") if "examples" not in p.parts]
    seen = 0
    for path in sources:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "hostPath:":
                continue
            seen += 1
            j = i - 1
            while j >= 0 and not lines[j].lstrip().startswith("- name:"):
                j -= 1
            assert j >= 1 and lines[j - 1].lstrip().startswith("#"), \
                f"{path.relative_to(DEPLOY)}:{i + 1}: hostPath volume without a comment explaining it"
    assert seen >= len(NODE_AGENT_HOST_PATHS)


def node_agent(rel: str) -> tuple[Manifest, Manifest, Any]:
    """(pod spec, container, effective configuration): the container's args and env resolved by the node
    agent's own configuration code, so every flag must exist and every value must be valid."""
    from memslice.plugin.config import resolve

    spec = pod_spec(find(render(rel), "DaemonSet", "memslice-node-agent"))
    assert spec is not None
    c = spec["containers"][0]
    assert c["args"][0] == "node-agent"
    env = {e["name"]: e.get("value", f"<{e['name']} from {list(e.get('valueFrom', {}))}>")
           for e in c.get("env", [])}
    return spec, c, resolve(parse_memslice_args(c), env)


@pytest.mark.parametrize("rel", OUR_WORKLOADS)
def test_node_agent_configuration_points_at_the_mounted_paths(rel: str) -> None:
    spec, c, cfg = node_agent(rel)
    mounted = {inside for inside, _ in host_mounts(spec).values()}
    for path in (cfg.device_plugin_dir, cfg.shim_host_dir, cfg.region_root, cfg.elastic_dir):
        assert str(path) in mounted
    assert cfg.pod_resources_socket is not None
    assert str(cfg.pod_resources_socket.parent) in mounted and cfg.pod_resources_socket.name == "kubelet.sock"
    assert cfg.metrics_port == {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    assert cfg.metrics_address == "0.0.0.0", "Prometheus and the probes reach the pod IP"
    assert cfg.node_name == "<NODE_NAME from ['fieldRef']>"
    (node_env,) = [e for e in c["env"] if e["name"] == "NODE_NAME"]
    assert node_env["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    svc = find(render(rel), "Service", "memslice-node-agent")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_node_agent_paths_are_the_documented_defaults() -> None:
    """The manifests spell the host paths out; they must be the agent's defaults (docs/architecture.md),
    so that a user running the agent by hand gets the same layout."""
    from memslice.plugin.config import OPTIONS

    defaults = {o.flag: o.default for o in OPTIONS}
    _, c, _ = node_agent("base")
    given = dict(a.split("=", 1) for a in c["args"][1:])
    for flag in ("--device-plugin-dir", "--pod-resources-socket", "--shim-host-dir", "--region-root",
                 "--unit-mib"):
        assert given[flag] == defaults[flag], flag


def test_node_agent_runs_only_on_gpu_nodes_and_tolerates_gpu_taints() -> None:
    spec, _, _ = node_agent("base")
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert keys == {"nvidia.com/gpu.present", "memslice.io/gpu"}
    assert {t["key"] for t in spec["tolerations"]} >= {"nvidia.com/gpu", "memslice.io/gpu"}


# ---------------------------------------------------------------------------------------- overlays


def test_cdi_overlay_switches_gpu_visibility_to_cdi() -> None:
    _, _, base = node_agent("base")
    _, _, cdi = node_agent("overlays/cdi")
    assert (base.visibility, cdi.visibility) == ("env", "cdi")
    assert cdi.cdi_kind == "nvidia.com/gpu"
    assert not base.simulate and not cdi.simulate


def test_simulated_overlay_runs_the_simulated_backend_away_from_real_gpus() -> None:
    spec, c, cfg = node_agent("overlays/simulated")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert cfg.simulate is True
    assert cfg.sim_gpus == env["MEMSLICE_SIM_GPUS"]
    from memslice.sizes import parse_size

    for gpu in cfg.sim_gpus.split(","):
        assert parse_size(gpu.split(":")[0]) >= 1 << 30
    # The agent puts the simulated driver in <state dir>/simlib and hands that and the state file to the
    # kubelet as host paths: the state dir must be a read-write host path mounted at the same path.
    state = Path(env["MEMSLICE_SIM_STATE"])
    assert host_mounts(spec).get(str(state.parent)) == (str(state.parent), False), \
        "the simulator state must be on the host, shared with the node's containers"
    assert env.get("NVIDIA_VISIBLE_DEVICES", "void") == "void"  # an NVIDIA runtime must inject no real GPU
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert len(terms) == 1
    exprs = {e["key"]: e["operator"] for e in terms[0]["matchExpressions"]}
    assert exprs == {"memslice.io/gpu": "In", "nvidia.com/gpu.present": "DoesNotExist"}


def test_base_is_unchanged_by_overlays_outside_the_node_agent() -> None:
    def rest(rel: str) -> list[Manifest]:
        return [o for o in render(rel) if o["metadata"]["name"] != "memslice-node-agent"
                or o["kind"] != "DaemonSet"]

    assert rest("overlays/cdi") == rest("base") == rest("overlays/simulated")


# ---------------------------------------------------------------------------- services and budgets


@pytest.mark.parametrize("rel", ("base", "overlays/standalone-extender", "overlays/cert-manager"))
def test_services_select_pods_and_ports_exist(rel: str) -> None:
    objs = render(rel)
    pods = [(o, s) for o, s in workloads(objs)]
    for svc in (o for o in objs if o["kind"] == "Service"):
        sel = svc["spec"]["selector"]
        matched = [(o, s) for o, s in pods
                   if all(o["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        assert len(matched) == 1, f"Service {svc['metadata']['name']} selects {len(matched)} workloads"
        ports = targets(matched[0][1])
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"Service {svc['metadata']['name']}: targetPort {p['targetPort']}"


@pytest.mark.parametrize("rel", ("base", "overlays/standalone-extender", "overlays/cert-manager"))
def test_network_policies_name_ports_their_pods_serve(rel: str) -> None:
    """Each NetworkPolicy selects a workload's pods and admits only to ports those pods declare: a rule naming a
    port the pods lost (the standalone extender takes the extender container out of the scheduler's pods) is
    left over from another shape."""
    objs = render(rel)
    for policy in (o for o in objs if o["kind"] == "NetworkPolicy"):
        name = policy["metadata"]["name"]
        sel = policy["spec"]["podSelector"]["matchLabels"]
        matched = [spec for o, spec in workloads(objs)
                   if sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
        assert matched, f"{rel}: NetworkPolicy {name} selects no pods"
        served = {t for spec in matched for t in targets(spec)}
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                assert port["port"] in served, f"{rel}: NetworkPolicy {name} admits to {port['port']}, not served"


@pytest.mark.parametrize(("rel", "budgets"), [("base", {"memslice-scheduler"}),
                                             ("overlays/standalone-extender",
                                              {"memslice-extender", "memslice-scheduler"})])
def test_disruption_budgets_never_block_a_drain(rel: str, budgets: set[str]) -> None:
    objs = render(rel)
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    assert {p["metadata"]["name"] for p in pdbs} == budgets
    for pdb in pdbs:
        dep = find(objs, "Deployment", pdb["metadata"]["name"])
        assert dep["spec"]["template"]["metadata"]["labels"].items() >= \
            pdb["spec"]["selector"]["matchLabels"].items()
        replicas = dep["spec"]["replicas"]
        if "minAvailable" in pdb["spec"]:
            assert pdb["spec"]["minAvailable"] < replicas
        else:
            assert pdb["spec"]["maxUnavailable"] >= 1
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_extender_flags_and_ports_agree() -> None:
    """deploy/base: the extender in the scheduler's pods, its verbs on the pod's loopback in plain HTTP where
    kube-scheduler's urlPrefix points, its health port on the pod's address behind the Service."""
    from memslice.scheduler_extender.cli import plain_http_refusal

    objs = render("base")
    dep, _, c = extender_container(objs)
    assert dep["metadata"]["name"] == "memslice-scheduler"
    args = parse_memslice_args(c)
    assert args.address == "127.0.0.1" and args.tls_cert_file is None
    assert plain_http_refusal(args.address, False, False) is None
    assert args.health_address == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.health_port == ports["http"] and "https" not in ports  # the verbs port is not the pod's
    assert args.max_limit_ratio == 4  # elastic memory's cap on a GPU's sum of limits, parsed as the CLI does
    svc = find(objs, "Service", "memslice-extender")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"http": ports["http"]}  # sidecar: by number
    assert args.probe_port == ports["probes"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):  # the kubelet's probes alone on their port
        assert c[probe]["httpGet"]["port"] == "probes" and c[probe]["httpGet"].get("scheme", "HTTP") == "HTTP"
    cm = next(o for o in objs if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("memslice-scheduler-config"))
    url = urlsplit(yaml.safe_load(cm["data"]["scheduler-config.yaml"])["extenders"][0]["urlPrefix"])
    assert (url.scheme, url.hostname, url.port) == ("http", args.address, args.port)


def test_standalone_extender_flags_and_ports_agree() -> None:
    objs = render("overlays/standalone-extender")
    dep, _, c = extender_container(objs)
    assert dep["metadata"]["name"] == "memslice-extender"
    args = parse_memslice_args(c)
    assert args.tls_cert_file and args.tls_client_ca_file and args.address == "0.0.0.0"
    from memslice.scheduler_extender.cli import plain_http_refusal

    assert plain_http_refusal(args.address, True, True) is None  # what the CLI accepts off loopback
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.port == ports["https"] and args.health_port == ports["http"] and args.probe_port == ports["probes"]
    svc = find(objs, "Service", "memslice-extender")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"https": "https", "http": ports["http"]}
    scheduler = pod_spec(find(objs, "Deployment", "memslice-scheduler"))
    assert [x["name"] for x in containers(scheduler)] == ["kube-scheduler"]  # type: ignore[arg-type]


def test_namespace_waives_pod_security_only_for_memslice_system() -> None:
    ns = find(render("base"), "Namespace", NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # Nothing else in base creates or relabels a namespace.
    assert [o for o in render("base") if o["kind"] == "Namespace"] == [ns]


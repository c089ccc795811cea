"""deploy/overlays/dra: the node agent as DRA driver, its least privilege, the DeviceClass and the examples,
rendered by the real kustomize and validated against the newest Kubernetes schemas kubernetes-validate ships
(1.37: resource.k8s.io/v1 and admissionregistration.k8s.io/v1 included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_deploy_manifests import K8S_VERSION, host_mounts, node_agent, validate_strict
from test_deploy_render import DEPLOY, NAMESPACE, find, load_yaml, pod_spec, render

from memslice.plugin.dra.prepare import DRIVER
from memslice.plugin.dra.registration import registration_socket_name
from memslice.plugin.dra.server import SOCKET_NAME

REL = "overlays/dra"
EXAMPLES = DEPLOY / REL / "examples"
CLASS = "gpu-mem.memslice.io"


def test_schemas_are_1_37_or_newer() -> None:
    major, minor = (int(x) for x in K8S_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 37), K8S_VERSION


def test_overlay_is_valid_and_has_no_second_scheduler_nor_extender() -> None:
    objs = render(REL)
    for obj in objs:
        validate_strict(obj)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert not [n for n in names if "extender" in n[1] or "scheduler" in n[1]], sorted(names)
    assert {("DaemonSet", "memslice-node-agent"), ("DeviceClass", CLASS),
            ("ValidatingAdmissionPolicy", "memslice-node-agent-resourceslices"),
            ("ValidatingAdmissionPolicyBinding", "memslice-node-agent-resourceslices")} <= names


def test_node_agent_runs_in_dra_mode_with_exactly_the_dra_host_paths() -> None:
    spec, c, cfg = node_agent(REL)
    assert cfg.kubelet_api == "dra"
    mounts = host_mounts(spec)
    assert all(host == inside for host, (inside, _) in mounts.items())
    assert set(mounts) == {str(cfg.plugins_registry_dir), str(cfg.kubelet_plugins_dir / DRIVER), str(cfg.cdi_dir),
                           str(cfg.shim_host_dir), str(cfg.region_root), str(cfg.elastic_dir)}
    assert not any(ro for _, ro in mounts.values())
    # the kubelet dials the endpoint GetInfo names, a host path: the agent must see it at that path
    assert (cfg.kubelet_plugins_dir / DRIVER / SOCKET_NAME).parent == Path("/var/lib/kubelet/plugins/memslice.io")
    assert registration_socket_name(DRIVER) == "memslice.io-reg.sock"


def test_device_class_selects_shareable_memslice_devices() -> None:
    cls = find(render(REL), "DeviceClass", CLASS)
    [sel] = cls["spec"]["selectors"]
    expr = sel["cel"]["expression"]
    assert f'device.driver == "{DRIVER}"' in expr and "device.allowMultipleAllocations == true" in expr


def test_admission_policy_pins_slices_to_the_agents_node() -> None:
    objs = render(REL)
    vap = find(objs, "ValidatingAdmissionPolicy", "memslice-node-agent-resourceslices")
    [cond] = vap["spec"]["matchConditions"]
    assert f"system:serviceaccount:{NAMESPACE}:memslice-node-agent" in cond["expression"]
    assert vap["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["resourceslices"]
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "memslice-node-agent-resourceslices")
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_examples_ask_the_class_for_4gi_and_use_it() -> None:
    (tmpl,) = load_yaml(EXAMPLES / "resourceclaimtemplate.yaml")
    (pod,) = load_yaml(EXAMPLES / "notebook.yaml")
    for obj in (tmpl, pod):
        validate_strict(obj)
    [req] = tmpl["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == CLASS
    assert req["exactly"]["capacity"]["requests"]["memory"] == "4Gi"
    spec = pod_spec(pod)
    assert spec is not None and "schedulerName" not in spec
    [rc] = spec["resourceClaims"]
    assert rc["resourceClaimTemplateName"] == tmpl["metadata"]["name"]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": rc["name"]}]


@pytest.mark.parametrize("profile", range(2))
def test_jupyterhub_profiles_give_each_notebook_a_claim(profile: int) -> None:
    values = yaml.safe_load((EXAMPLES / "jupyterhub-values.yaml").read_text())
    over = values["singleuser"]["profileList"][profile]["kubespawner_override"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "jupyter-user"},
           "spec": {**over["extra_pod_config"],
                    "containers": [{"name": "notebook", "image": "jupyter", **over["extra_container_config"]}]}}
    validate_strict(pod)
    [rc] = pod["spec"]["resourceClaims"]
    assert rc["resourceClaimTemplateName"].startswith("gpu-mem-")
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": rc["name"]}]


def test_node_agent_updates_seamlessly() -> None:
    """Issue 24.7: maxSurge 1 / maxUnavailable 0, and the pod UID for per-pod socket names."""
    ds = find(render(REL), "DaemonSet", "memslice-node-agent")
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    [c] = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MEMSLICE_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert "NODE_NAME" in env  # the base's env is kept
    assert registration_socket_name(DRIVER, "u1") == "memslice.io-u1-reg.sock"


def test_the_elastic_example_asks_a_request_and_a_limit_the_agent_accepts() -> None:
    """deploy/overlays/dra/examples/notebook-elastic.yaml: valid v1 objects; its GpuMemConfig is one the agent's
    contract module reads (limit above the request), and the claim policy admits the template."""
    from test_dra_admission import admit

    from memslice.contract import GpuMemConfig, quantity_bytes

    tmpl, pod = load_yaml(EXAMPLES / "notebook-elastic.yaml")
    for obj in (tmpl, pod):
        validate_strict(obj)
    devices = tmpl["spec"]["spec"]["devices"]
    [req] = devices["requests"]
    assert req["exactly"]["deviceClassName"] == CLASS
    [cfg] = devices["config"]
    assert cfg["requests"] == [req["name"]] and cfg["opaque"]["driver"] == DRIVER
    parsed = GpuMemConfig.parse(cfg["opaque"]["parameters"], "example")
    request_mib = int(quantity_bytes(req["exactly"]["capacity"]["requests"]["memory"])) >> 20
    assert parsed == GpuMemConfig(limit_mib=8192, idle_release=True) and request_mib == 2048
    assert admit(tmpl) == []
    spec = pod_spec(pod)
    assert spec is not None
    [rc] = spec["resourceClaims"]
    assert rc["resourceClaimTemplateName"] == tmpl["metadata"]["name"]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": rc["name"]}]

"""deploy/examples: valid Kubernetes objects that request resources the way memslice understands them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes.utils import parse_quantity
from test_deploy_manifests import validate_strict
from test_deploy_render import (
    DEPLOY,
    RESOURCE,
    Manifest,
    containers,
    load_yaml,
    pod_spec,
    render,
)

from memslice import contract
from memslice.sizes import MiB

EXAMPLES = DEPLOY / "examples"
KUBE_EXAMPLES = ("notebook.yaml", "notebook-oversubscribed.yaml", "training-job.yaml", "simulated-check.yaml")


def scheduler_profile_names() -> set[str]:
    cm = next(o for o in render("base") if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("memslice-scheduler-config"))
    cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    return {p["schedulerName"] for p in cfg["profiles"]}


def example(name: str) -> Manifest:
    (obj,) = load_yaml(EXAMPLES / name)
    return obj


def gpu_mem_mib(c: Manifest, unit_mib: int = 1) -> int:
    """The container's memslice request in MiB; checks the rules the API server and kubelet enforce."""
    res = c.get("resources", {})
    limit = res.get("limits", {}).get(RESOURCE)
    request = res.get("requests", {}).get(RESOURCE, limit)
    assert limit is not None, f"{c['name']}: an extended resource must be set in limits"
    assert parse_quantity(request) == parse_quantity(limit), "extended resources cannot be overcommitted"
    q = parse_quantity(limit)
    assert q == int(q) and q > 0, f"{RESOURCE} must be a positive whole number, got {limit}"
    return int(q) * unit_mib


DRA_EXAMPLES = ("simulated-check-dra.yaml",  # issue 36.9; its script runs in tests/dra/test_dra_node.py
                "vllm-tp2-dra.yaml")  # issue 34: a claim on 2 GPUs, prepared in tests/realcluster/test_real_dra.py


def test_every_file_in_examples_is_covered() -> None:
    names = {p.name for p in EXAMPLES.iterdir()}
    assert names == {*KUBE_EXAMPLES, *DRA_EXAMPLES, "jupyterhub-values.yaml"}


def test_the_dra_check_pod_names_its_claim_and_runs_the_same_script() -> None:
    """The DRA mode's check pod: a ResourceClaimTemplate of gpu-mem.memslice.io and a pod of the default
    scheduler whose container names the claim; its script is simulated-check.yaml's."""
    template, pod = load_yaml(EXAMPLES / "simulated-check-dra.yaml")
    for obj in (template, pod):
        validate_strict(obj)
    [req] = template["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == "gpu-mem.memslice.io"
    assert parse_quantity(req["exactly"]["capacity"]["requests"]["memory"]) == 2 << 30
    spec = pod["spec"]
    assert "schedulerName" not in spec
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}]
    (c,) = spec["containers"]
    assert c["resources"]["claims"] == [{"name": "gpu"}] and RESOURCE not in c["resources"]["limits"]
    (plain,) = pod_spec(example("simulated-check.yaml"))["containers"]  # type: ignore[index]
    assert c["args"][0].replace("its claim's capacity.requests.memory", "its memslice.io/gpu-mem quota") \
        == plain["args"][0]


@pytest.mark.parametrize("name", KUBE_EXAMPLES)
def test_example_is_a_valid_object_for_memslice(name: str) -> None:
    obj = example(name)
    validate_strict(obj)
    spec = pod_spec(obj)
    assert spec is not None
    assert spec["schedulerName"] in scheduler_profile_names()
    gpu = [c for c in containers(spec) if RESOURCE in c.get("resources", {}).get("limits", {})]
    assert gpu, f"{name} asks for no {RESOURCE}"
    for c in gpu:
        gpu_mem_mib(c)
        sc = c.get("securityContext", {})
        assert sc.get("privileged") is not True, "privileged containers bypass the shim"


def test_notebook_asks_for_4096_mib() -> None:
    (c,) = pod_spec(example("notebook.yaml"))["containers"]  # type: ignore[index]
    assert gpu_mem_mib(c) == 4096


def test_training_job_never_restarts_in_place() -> None:
    job = example("training-job.yaml")
    assert job["kind"] == "Job"
    assert pod_spec(job)["restartPolicy"] == "Never"  # type: ignore[index]
    (c,) = pod_spec(job)["containers"]  # type: ignore[index]
    assert gpu_mem_mib(c) == 16384


def test_oversubscribed_notebook_leaves_room_for_the_spill() -> None:
    """Spilled GPU memory is pinned host memory of the container, and the shim keeps a margin of the memory
    cgroup free (docs/architecture.md, "Oversubscription"): the limit must hold what the notebook itself
    needs + the spill limit + the margin, or allocations fail before the spill limit is reached."""
    obj = example("notebook-oversubscribed.yaml")
    (c,) = pod_spec(obj)["containers"]  # type: ignore[index]
    env = {e["name"]: e["value"] for e in c.get("env", [])}
    assert not any(k.startswith("MEMSLICE_") for k in env), "in a pod the limits file, not the env, decides"
    raw = obj["metadata"]["annotations"]["memslice.io/oversubscribe"]  # type: ignore[index]
    spill = contract.parse_oversubscribe({"memslice.io/oversubscribe": raw}, "example")
    assert spill is not None and spill > 0
    limit = int(parse_quantity(c["resources"]["limits"]["memory"]))
    request = int(parse_quantity(c["resources"]["requests"]["memory"]))
    assert request == limit, "the spill is pinned host memory: reserve it, do not overcommit it"
    plain = pod_spec(example("notebook.yaml"))["containers"][0]  # type: ignore[index]
    margin = max(limit // 10, 256 * MiB)  # MEMSLICE_CGROUP_MARGIN's default
    assert "MEMSLICE_CGROUP_MARGIN" not in env
    assert limit - spill - margin >= int(parse_quantity(plain["resources"]["limits"]["memory"]))
    assert gpu_mem_mib(c) == 4096


def jupyterhub_profiles() -> list[dict[str, Any]]:
    values = yaml.safe_load((EXAMPLES / "jupyterhub-values.yaml").read_text())
    return values["singleuser"]["profileList"]


def test_jupyterhub_profiles_offer_4_8_and_16_gib_slices_and_an_elastic_one() -> None:
    sizes = []
    for profile in jupyterhub_profiles():
        o = profile["kubespawner_override"]
        assert o["scheduler_name"] in scheduler_profile_names()
        limit = o["extra_resource_limits"][RESOURCE]
        assert o["extra_resource_guarantees"][RESOURCE] == limit
        fake = {"name": profile["slug"], "resources": {"limits": {RESOURCE: limit}}}
        sizes.append(gpu_mem_mib(fake))
        # host memory grows with the slice (at least the slice itself: tensors are staged on the host)
        assert parse_quantity(o["mem_limit"]) >= sizes[-1] * MiB
    assert sizes == [4096, 8192, 16384, 2048]  # the last: the elastic profile's request
    assert [p.get("default", False) for p in jupyterhub_profiles()] == [True, False, False, False]


def test_jupyterhub_elastic_profile_asks_2_gib_up_to_8_gib_with_room_on_the_host() -> None:
    """The elastic profile's annotations as the extender and the node agent read them (memslice.elastic,
    memslice.contract), and host memory for what may move there: the limit (with idle release the request
    moves too) on top of what the default profile's notebook has."""
    from jupyterhub.traitlets import ByteSpecification

    from memslice import elastic

    (profile,) = [p for p in jupyterhub_profiles() if "extra_annotations" in p["kubespawner_override"]]
    o = profile["kubespawner_override"]
    request = int(o["extra_resource_limits"][RESOURCE])
    annotations = o["extra_annotations"]
    assert elastic.pod_limits(annotations, {"notebook": request}) == {"notebook": 8192}  # KubeSpawner's container
    assert request == 2048 and contract.parse_idle_release(annotations, "example") is True
    moved_mib = 8192  # idle release: the request may move to host memory too, so up to the whole limit
    size = ByteSpecification().validate  # as KubeSpawner reads mem_limit: G is GiB
    default = next(p for p in jupyterhub_profiles() if p.get("default"))["kubespawner_override"]
    assert size(None, o["mem_limit"]) == size(None, o["mem_guarantee"])
    assert size(None, o["mem_limit"]) - moved_mib * MiB >= size(None, default["mem_limit"])


def test_kubespawner_override_keys_are_kubespawner_traits() -> None:
    """Misspelt KubeSpawner traits are ignored silently by JupyterHub; only known ones are used here."""
    known = {"image", "scheduler_name", "extra_resource_limits", "extra_resource_guarantees", "cpu_limit",
             "cpu_guarantee", "mem_limit", "mem_guarantee", "environment", "extra_annotations"}
    for profile in jupyterhub_profiles():
        assert set(profile["kubespawner_override"]) <= known
        assert {"display_name", "slug", "description", "kubespawner_override"} <= set(profile)


def test_the_simulated_overlays_example_needs_no_framework_and_shows_the_quota(tmp_path) -> None:
    """deploy/examples/simulated-check.yaml's script, run as its container would run it: under its quota on
    the simulated GPU, with the image's Python (no PyTorch)."""
    import subprocess
    import sys

    (c,) = pod_spec(example("simulated-check.yaml"))["containers"]  # type: ignore[index]
    assert c["command"] == ["python", "-c"] and "torch" not in c["args"][0]
    mib = gpu_mem_mib(c)
    env = {"PATH": "/usr/bin:/bin", "MEMSLICE_SIM_STATE": str(tmp_path / "node.state")}
    out = subprocess.run([sys.executable, "-m", "memslice", "run", "--gpu-mem", f"{mib}MiB", "--simulate-gpu", "16GiB",
                          "--", sys.executable, "-c", c["args"][0]], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"NVML: this container's GPU has {mib} MiB" in out.stdout
    assert "the next one was refused with error 2 (2 = CUDA_ERROR_OUT_OF_MEMORY)" in out.stdout


def test_the_two_gpu_vllm_claim_asks_each_gpu_the_same_and_the_policy_admits_it() -> None:
    """Issue 34: the tensor-parallel example's claim is `count: 2` of gpu-mem.memslice.io with one capacity (each
    GPU's quota), admitted by the claim policy (cel-python, as the API server evaluates it; the real one:
    tests/realcluster/test_real_dra.py); its pod names the claim, runs vLLM with --tensor-parallel-size equal to the
    count, under RuntimeDefault seccomp (deploy/components/require-seccomp admits it)."""
    from test_dra_admission import admit

    template, pod = load_yaml(EXAMPLES / "vllm-tp2-dra.yaml")
    for obj in (template, pod):
        validate_strict(obj)
    assert admit(template) == []
    [req] = template["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == "gpu-mem.memslice.io" and req["exactly"]["count"] == 2
    assert parse_quantity(req["exactly"]["capacity"]["requests"]["memory"]) == 20 << 30
    spec = pod["spec"]
    assert "schedulerName" not in spec and spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}]
    (c,) = spec["containers"]
    assert c["resources"]["claims"] == [{"name": "gpus"}] and RESOURCE not in c["resources"].get("limits", {})
    args = c["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == str(req["exactly"]["count"])

"""Rendering deploy/ with the real kustomize, and the helpers the other test_deploy_* modules share.

kustomize is the one in `kubectl kustomize` (kubectl on PATH, or in this virtualenv), or a standalone
`kustomize`: no re-implementation, so what the tests check is what `kubectl apply -k` applies.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import build_cache
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "memslice-system"
RESOURCE = "memslice.io/gpu-mem"
SCHEDULER_NAME = "memslice-scheduler"
# Every kustomization a user may apply, and what it is for.
KUSTOMIZATIONS = ("base", "overlays/simulated", "overlays/cdi", "overlays/cert-manager", "overlays/host-pids",
                  "overlays/standalone-extender", "overlays/dra", "monitoring")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "RuntimeClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

Manifest = dict[str, Any]


def kustomize_command() -> list[str]:
    """The command that builds a kustomization directory to stdout."""
    standalone = shutil.which("kustomize")
    if standalone:
        return [standalone, "build"]
    for kubectl in (Path(sys.executable).parent / "kubectl", shutil.which("kubectl")):
        if kubectl and Path(kubectl).exists():
            return [str(kubectl), "kustomize"]
    raise RuntimeError("kustomize is needed to render deploy/: install kubectl (`kubectl kustomize`) or the "
                       "standalone kustomize binary")


@functools.cache
def _deploy_digest() -> str:
    return build_cache.tree_digest(ROOT, ["deploy"], lambda rel: False)


def _tool_id(path: str) -> str:
    """The kustomize binary as its real path, size and modification time (hashing 50 MB each time cost more)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def _kustomize(command: list[str], directory: Path) -> str:
    out = subprocess.run([*command, str(directory)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(command)} {directory} failed:\n{out.stderr}")
    return out.stdout


def _inputs_besides_deploy(directory: Path) -> str | None:
    """What a build of `directory` reads besides deploy/: its path in deploy/, or the text of a user's own
    kustomization next to a link to deploy/ that reads nothing else; None when it may read more (not cached)."""
    rel = os.path.relpath(directory, DEPLOY)
    if not rel.startswith(".."):
        return "deploy:" + rel
    alone = [p.name for p in directory.iterdir()] == ["kustomization.yaml"]
    if not alone or (directory.parent / "deploy").resolve() != DEPLOY:
        return None
    text = (directory / "kustomization.yaml").read_text()
    return None if re.search(r"\.\.(?!/deploy/)", text) else "own:" + text


def kustomized(command: list[str], directory: Path) -> str:
    """What `command directory` (a kustomize build) prints, cached across runs by the hash of deploy/ (every
    kustomization here reads only files in it), the binary and, for a directory outside deploy/ (a user's own
    kustomization over it), its kustomization.yaml (tests/support/build_cache.py): rendered again when one
    changes, not in every test process of every run (~20 CPU-s of `make test`). A failed build is not cached."""
    what = _inputs_besides_deploy(directory)
    if what is None or not build_cache.enabled():
        return _kustomize(command, directory)
    key = hashlib.sha256("\0".join([_tool_id(command[0]), *command[1:], what]).encode()).hexdigest()[:32]
    with build_cache.cached_build("kustomize", _deploy_digest(), lambda entry: None, directory) as (entry, _):
        done = entry / f"{key}.yaml"
        if done.exists():
            return done.read_text()
        text = _kustomize(command, directory)
        part = done.with_suffix(f".{os.getpid()}.part")
        part.write_text(text)
        part.rename(done)  # whole or not at all, for another process reading it
        return text


@functools.cache
def _render_text(rel: str) -> str:
    return kustomized(kustomize_command(), DEPLOY / rel)


def render(rel: str) -> list[Manifest]:
    """The objects `kubectl apply -k deploy/<rel>` would apply (fresh copies: tests may mutate them)."""
    return [d for d in yaml.safe_load_all(_render_text(rel)) if d]


def load_yaml(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find(objs: list[Manifest], kind: str, name: str) -> Manifest:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def pod_spec(obj: Manifest) -> Manifest | None:
    """The pod spec of a Pod or of a workload's pod template (Deployment, DaemonSet, Job, ...)."""
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    template = obj.get("spec", {}).get("template")
    return template["spec"] if isinstance(template, dict) and "spec" in template else None


def containers(spec: Manifest) -> Iterator[Manifest]:
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def is_sidecar(container: Manifest) -> bool:
    """An init container with restartPolicy Always: a native sidecar (KEP-753), running beside the app
    containers for the pod's life (deploy/base's extender), not to completion before them."""
    return container.get("restartPolicy") == "Always"


def serving(spec: Manifest) -> Iterator[Manifest]:
    """The containers that run for the pod's life and serve its ports and probes: the native sidecars, then
    the app containers (not the init containers that run to completion)."""
    yield from (c for c in spec.get("initContainers", []) if is_sidecar(c))
    yield from spec["containers"]


def targets(spec: Manifest) -> set[str | int]:
    """What a Service's targetPort or a NetworkPolicy's port may name in these pods: any port number a serving
    container declares, but a port name only where an app container declares it. A name declared by a native
    sidecar resolves in a Service's endpoints only from Kubernetes 1.32 (kubernetes/kubernetes#127958; deploy/
    supports 1.30 on), and network plugins need not match it in a NetworkPolicy (projectcalico/calico#8881)."""
    numbers: set[str | int] = {p["containerPort"] for c in serving(spec) for p in c.get("ports", [])}
    return numbers | {p["name"] for c in spec["containers"] for p in c.get("ports", []) if "name" in p}


def workloads(objs: list[Manifest]) -> Iterator[tuple[Manifest, Manifest]]:
    for o in objs:
        spec = pod_spec(o)
        if spec is not None:
            yield o, spec


def extender_container(objs: list[Manifest]) -> tuple[Manifest, Manifest, Manifest]:
    """(workload, pod spec, container) of the one container running `memslice extender` (deploy/base: a native
    sidecar, an init container, of the scheduler's pods; with components/standalone-extender: the container
    of the memslice-extender Deployment)."""
    hits = [(o, spec, c) for o, spec in workloads(objs) for c in containers(spec)
            if c.get("args", [None])[0] == "extender"]
    assert len(hits) == 1, f"expected one extender container, found {len(hits)}"
    return hits[0]


def cli_args(container: Manifest) -> list[str]:
    """The container's argv after the entrypoint, with $(VAR) references expanded from its env values
    (valueFrom ones become a placeholder), as the kubelet expands them."""
    env = {e["name"]: e.get("value", f"<{e['name']}>") for e in container.get("env", [])}
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
            for a in container.get("args", [])]


def parse_memslice_args(container: Manifest) -> Any:
    """Parse the container's args with the real `memslice` CLI parser (so every flag must exist)."""
    from memslice.cli import build_parser

    parser = build_parser()
    try:
        return parser.parse_args(cli_args(container))
    except SystemExit as exc:
        raise AssertionError(f"`memslice {' '.join(cli_args(container))}` is rejected by the CLI") from exc


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_kustomization_renders(rel: str) -> None:
    objs = render(rel)
    assert objs, f"deploy/{rel} renders nothing"
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), f"duplicate objects in deploy/{rel}"


@pytest.mark.parametrize("rel", ("base", "overlays/simulated", "overlays/cdi", "overlays/cert-manager"))
def test_namespaced_objects_live_in_memslice_system(rel: str) -> None:
    objs = render(rel)
    find(objs, "Namespace", NAMESPACE)
    for o in objs:
        md = o["metadata"]
        if o["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in md, f"{o['kind']}/{md['name']} is cluster-scoped"
        elif (o["kind"], md["name"]) == ("RoleBinding", "memslice-scheduler-auth-reader"):
            # kube-scheduler reads the extension-apiserver-authentication ConfigMap there
            assert md["namespace"] == "kube-system"
        else:
            assert md.get("namespace") == NAMESPACE, f"{o['kind']}/{md['name']} is not in {NAMESPACE}"


def test_every_file_under_deploy_is_used() -> None:
    """A manifest no kustomization lists is never applied: catch files forgotten in kustomization.yaml."""
    used: set[Path] = set()
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text())
        entries = list(k.get("resources", []))
        entries += list(k.get("components", []))
        entries += [p["path"] for p in k.get("patches", []) if "path" in p]
        for gen in k.get("configMapGenerator", []):
            entries += [f.split("=", 1)[-1] for f in gen.get("files", [])]
        for e in entries:
            target = (kfile.parent / e).resolve()
            assert target.exists(), f"{kfile.relative_to(ROOT)} lists {e}, which does not exist"
            used.add(target)
    for path in DEPLOY.rglob("*"):
        if path.suffix not in (".yaml", ".json") or path.name == "kustomization.yaml":
            continue
        if "examples" in path.relative_to(DEPLOY).parts:
            continue  # applied one by one with kubectl apply -f
        assert path.resolve() in used, f"{path.relative_to(ROOT)} is in no kustomization"

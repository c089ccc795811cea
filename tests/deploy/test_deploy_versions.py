"""deploy/ across the versions the README supports (issue 27 items 1-3, issue 28 item 6).

- Every kustomization and every combination of components renders, with the oldest and the newest kubectl of
  the support window (tests/deploy/kubectl_window.py), to the same objects.
- Nothing under deploy/ deletes from what it builds on ($patch: delete), except the cert-manager component,
  which swaps the standalone extender's default certificate source for cert-manager's, standalone-extender,
  which takes the extender container out of the scheduler's pods, and dra-beside-extender, which leaves
  the objects both modes share to the device-plugin side.
- The kube-scheduler version is one setting (deploy/base's image tag) with a default per Kubernetes version
  in docs/operations.md, and the scheduler configuration is valid for each of them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubectl_window import NEWEST, OLDEST, oldest_kubectl
from kubectl_window import newest_kubectl as newest
from test_deploy_render import DEPLOY, ROOT, kustomized, render
from test_deploy_scheduler import scheduler_config

README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"
MODES = ("base", "overlays/dra")
# Components that apply to each mode (cdi, standalone-extender and cert-manager concern the device-plugin mode
# only), and the components a component needs listed before it.
COMPONENTS = {"base": ("cdi", "host-pids", "simulated", "standalone-extender", "cert-manager", "require-seccomp"),
              "overlays/dra": ("host-pids", "simulated", "require-seccomp", "dra-beside-extender")}
NEEDS = {"cert-manager": ("standalone-extender",)}
# The combinations docs/operations.md shows, and every component with every other.
COMBINATIONS = [("base", ("simulated", "host-pids")), ("base", ("cdi", "host-pids")),
                ("base", ("cdi", "host-pids", "standalone-extender")),
                ("base", ("cdi", "host-pids", "standalone-extender", "cert-manager")),
                ("base", ("simulated", "host-pids", "standalone-extender", "cert-manager")),
                ("overlays/dra", ("simulated", "host-pids")), ("overlays/dra", ("simulated",)),
                ("overlays/dra", ("host-pids", "require-seccomp")),
                ("overlays/dra", ("simulated", "dra-beside-extender")),
                ("overlays/dra", ("dra-beside-extender", "simulated", "host-pids", "require-seccomp"))]
KUSTOMIZATIONS = sorted(str(k.parent.relative_to(DEPLOY)) for k in DEPLOY.rglob("kustomization.yaml")
                        if yaml.safe_load(k.read_text())["kind"] == "Kustomization")


def oldest() -> Path:
    path = oldest_kubectl()
    assert path.exists(), (f"kubectl {OLDEST} is missing at {path}: run `make install` (it runs "
                           "`python tests/deploy/kubectl_window.py fetch`)")
    return path


def build(kubectl: Path, directory: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kustomized([str(kubectl), "kustomize"], directory)) if d]


def combination(tmp_path: Path, mode: str, components: tuple[str, ...]) -> Path:
    """A kustomization of a user's own, next to this repository's deploy/ (docs/operations.md, "Overlays and
    components")."""
    (tmp_path / "deploy").symlink_to(DEPLOY)
    mine = tmp_path / "my-memslice"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"../deploy/{mode}"], "components": [f"../deploy/components/{c}" for c in components]}))
    return mine


def keys(objs: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]


def test_the_window_is_the_readmes() -> None:
    text = README.read_text()
    m = re.search(r"Kubernetes (1\.\d+) to (1\.\d+)", text)
    assert m and (m.group(1), m.group(2)) == (OLDEST, NEWEST), "README must name the supported Kubernetes versions"
    assert f"kubectl {OLDEST} to {NEWEST}" in text
    assert subprocess.run([str(oldest()), "version", "--client"], capture_output=True, text=True,
                          timeout=60).stdout.startswith(f"Client Version: v{OLDEST}.")
    assert subprocess.run([str(newest()), "version", "--client"], capture_output=True, text=True,
                          timeout=60).stdout.startswith(f"Client Version: v{NEWEST}.")


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_oldest_and_newest_kubectl_render_the_same_objects(rel: str) -> None:
    old, new = build(oldest(), DEPLOY / rel), build(newest(), DEPLOY / rel)
    assert new, f"deploy/{rel} renders nothing"
    assert len(set(keys(new))) == len(new), f"duplicate objects in deploy/{rel}"
    assert sorted(old, key=str) == sorted(new, key=str)


@pytest.mark.parametrize(("mode", "components"), COMBINATIONS, ids=lambda v: "+".join(v) if isinstance(v, tuple) else v)
def test_combinations_render_the_same_with_both_kubectls(tmp_path: Path, mode: str,
                                                          components: tuple[str, ...]) -> None:
    mine = combination(tmp_path, mode, components)
    old, new = build(oldest(), mine), build(newest(), mine)
    assert sorted(old, key=str) == sorted(new, key=str)
    assert len(set(keys(new))) == len(new)
    # each component does in the combination what it does alone on the same mode
    (ds,) = [o for o in new if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    assert spec.get("hostPID", False) is ("host-pids" in components)
    assert ("--visibility=cdi" in agent["args"]) is ("cdi" in components)
    assert any(e["name"] == "MEMSLICE_SIM_GPUS" for e in agent.get("env", [])) is ("simulated" in components)
    assert any(o["kind"] == "Certificate" for o in new) is ("cert-manager" in components)
    assert any(o["kind"] == "Job" for o in new) is ("standalone-extender" in components
                                                    and "cert-manager" not in components)
    scheduler = [o for o in new if o["kind"] == "Deployment" and o["metadata"]["name"] == "memslice-scheduler"]
    sidecar = [c["name"] for o in scheduler for c in o["spec"]["template"]["spec"].get("initContainers", [])
               if c["name"] == "extender" and c.get("restartPolicy") == "Always"]
    assert bool(sidecar) is (mode == "base" and "standalone-extender" not in components)
    assert any(o["kind"] == "DeviceClass" for o in new) is (mode == "overlays/dra")


@pytest.mark.parametrize("mode", MODES)
def test_every_component_adds_to_every_mode_it_names(tmp_path: Path, mode: str) -> None:
    for c in COMPONENTS[mode]:
        sub = tmp_path / c
        sub.mkdir()
        assert build(newest(), combination(sub, mode, (*NEEDS.get(c, ()), c)))
    have = sorted(p.name for p in (DEPLOY / "components").iterdir())
    assert have == sorted({*COMPONENTS["base"], *COMPONENTS["overlays/dra"]}), \
        "a new component: say which modes it applies to"


def test_modes_build_on_core_and_nothing_deletes_what_it_builds_on() -> None:
    """kustomize <= 5.4 (kubectl <= 1.33) crashes on several `$patch: delete` documents in one file; and an
    overlay that deletes builds on something that should not have had it. The cert-manager component deletes
    the standalone extender's self-signing Job (and its account), the default it replaces; standalone-extender
    the extender sidecar of the scheduler's pods, which it replaces."""
    deleting = sorted(str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*.yaml") if "$patch: delete" in p.read_text())
    assert deleting == ["components/cert-manager/kustomization.yaml",
                        "components/dra-beside-extender/kustomization.yaml",
                        "components/standalone-extender/kustomization.yaml"], deleting
    k = yaml.safe_load((DEPLOY / "components/cert-manager/kustomization.yaml").read_text())
    deleted = {yaml.safe_load(p["patch"])["metadata"]["name"] for p in k["patches"]}
    assert deleted == {"memslice-extender-certs"}
    k = yaml.safe_load((DEPLOY / "components/standalone-extender/kustomization.yaml").read_text())
    deletes = [p["patch"] for p in k["patches"] if "$patch: delete" in p["patch"]]
    assert len(deletes) == 1 and deletes[0].count("$patch: delete") == 1
    (container,) = [c for c in yaml.safe_load(deletes[0])["spec"]["template"]["spec"]["initContainers"]
                    if c.get("$patch") == "delete"]
    assert container["name"] == "extender"
    # the DRA side beside deploy/base leaves out only what deploy/base applies identically
    k = yaml.safe_load((DEPLOY / "components/dra-beside-extender/kustomization.yaml").read_text())
    deleted = {(d["kind"], d["metadata"]["name"]) for p in k["patches"]
               if "$patch: delete" in p["patch"] for d in [yaml.safe_load(p["patch"])]}
    assert deleted == {("Namespace", "memslice-system"), ("Service", "memslice-node-agent"),
                       ("NetworkPolicy", "memslice-node-agent"), ("ValidatingAdmissionPolicy", "memslice-gpu-count"),
                       ("ValidatingAdmissionPolicyBinding", "memslice-gpu-count")}  # core's pod policy (issue 34)
    base = {(o["kind"], o["metadata"]["name"]): o for o in render("base")}
    for obj in render("overlays/dra"):
        key = (obj["kind"], obj["metadata"]["name"])
        assert key not in deleted or base[key] == obj, key
    for mode in MODES:
        assert "../core" in "".join(yaml.safe_load((DEPLOY / mode / "kustomization.yaml").read_text())["resources"])
    dra = {(o["kind"], o["metadata"]["name"]) for o in render("overlays/dra")}
    assert not [n for n in dra if "extender" in n[1] or "scheduler" in n[1]]


# ------------------------------------------------------------------------------ the kube-scheduler version

# kubescheduler.config.k8s.io/v1 is served from Kubernetes 1.25 on (v1beta3 was removed in 1.29). Fields of
# v1 that came later, with the minor version that added them; the configuration must not use them while an
# older version is supported.
V1_SINCE = 25
FIELDS_ADDED_LATER = {"delayCacheUntilActive": 29}


def readme_scheduler_tags() -> dict[int, str]:
    """The install guide's table (docs/operations.md): Kubernetes minor version -> the kube-scheduler tag to set."""
    section = OPERATIONS.read_text().split("### kube-scheduler version", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| 1\.(\d+) \| `(v1\.\d+\.\d+)`", section, re.M)
    return {int(minor): tag for minor, tag in rows}


def test_scheduler_version_has_a_documented_default_for_every_supported_kubernetes() -> None:
    tags = readme_scheduler_tags()
    first, last = (int(v.split(".")[1]) for v in (OLDEST, NEWEST))
    assert sorted(tags) == list(range(first, last + 1)), "one row per supported Kubernetes minor version"
    for minor, tag in tags.items():
        assert tag.startswith(f"v1.{minor}."), f"Kubernetes 1.{minor}: {tag} is another minor version"
    k = yaml.safe_load((DEPLOY / "base/kustomization.yaml").read_text())
    (setting,) = [i for i in k["images"] if i["name"] == "registry.k8s.io/kube-scheduler"]
    assert setting["newTag"] == tags[last], "deploy/base's default is the documented row for the newest version"
    # the one setting: no other file names a kube-scheduler tag
    for path in DEPLOY.rglob("*.yaml"):
        assert not re.search(r"kube-scheduler:v\d", path.read_text()), f"{path} pins a kube-scheduler tag"


def test_scheduler_configuration_is_valid_for_every_supported_version() -> None:
    cfg = scheduler_config()
    first = int(OLDEST.split(".")[1])
    assert first >= V1_SINCE and cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    used = set(cfg) | {f"extenders.{f}" for e in cfg["extenders"] for f in e}
    too_new = {f: m for f, m in FIELDS_ADDED_LATER.items() if f in used and m > first}
    assert not too_new, f"kube-scheduler 1.{first} does not know {too_new}"

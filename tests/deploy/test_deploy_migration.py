"""The migration recipe of docs/guide.md ("Moving a node pool from the extender to DRA mode", issue 36.3): its
two kustomizations, taken from the guide as a user copies them, rendered by the real kustomize. The two sides
never both run an agent on one node, own no object of the same name with different content, and the DRA
side's admission policies still match its agent and its DeviceClass (the recipe it replaced, `nameSuffix:
-dra`, renamed both, so that the policies matched nothing).
tests/realcluster/test_real_admission_policies.py applies the same two renders to a real kube-apiserver."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_deploy_render import DEPLOY, NAMESPACE, ROOT
from test_deploy_versions import build, oldest
from test_deploy_versions import newest as newest_kubectl

GUIDE = ROOT / "docs" / "guide.md"
SIDES = ("my-memslice", "my-memslice-dra")
LABEL = "memslice.io/kubelet-api"


def guide_recipe() -> dict[str, str]:
    """The guide's two kustomization.yaml files, by directory name, as written there."""
    text = GUIDE.read_text()
    section = text[text.index("### Moving a node pool from the extender to DRA mode"):]
    section = section[:section.index("\n## ")]
    out: dict[str, str] = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.S):
        body = textwrap.dedent(block)
        m = re.match(r"# ([\w-]+)/kustomization\.yaml", body)
        if m:
            out[m.group(1)] = body
    assert sorted(out) == sorted(SIDES), f"the guide's recipe shows {sorted(out)}"
    return out


def write_recipe(root: Path) -> dict[str, Path]:
    """The recipe's two directories next to a `deploy` that is this repository's (as the guide lays it out)."""
    (root / "deploy").symlink_to(DEPLOY)
    dirs = {}
    for name, body in guide_recipe().items():
        (root / name).mkdir()
        (root / name / "kustomization.yaml").write_text(body)
        dirs[name] = root / name
    return dirs


def render_recipe(root: Path, kubectl: Path | None = None) -> dict[str, list[dict[str, Any]]]:
    return {name: build(kubectl or newest_kubectl(), d) for name, d in write_recipe(root).items()}


def agent(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    return dict(ds)


def runs_on(ds: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's nodeSelector and required node affinity admit a node with `labels` (the
    operators In, NotIn, Exists, DoesNotExist: the ones deploy/ uses)."""
    spec = ds["spec"]["template"]["spec"]
    if any(labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
        return False

    def holds(e: dict[str, Any]) -> bool:
        op, have = e["operator"], labels.get(e["key"])
        return {"In": have in e.get("values", []), "NotIn": have not in e.get("values", []),
                "Exists": have is not None, "DoesNotExist": have is None}[op]

    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return any(all(holds(e) for e in t.get("matchExpressions", [])) for t in terms)


def sa_username(ds: dict[str, Any]) -> str:
    return f"system:serviceaccount:{ds['metadata']['namespace']}:{ds['spec']['template']['spec']['serviceAccountName']}"


def find_one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return dict(obj)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return render_recipe(tmp_path_factory.mktemp("recipe"))


def test_the_oldest_kubectl_renders_the_recipe_the_same(tmp_path: Path, recipe) -> None:
    assert {k: sorted(v, key=str) for k, v in render_recipe(tmp_path, oldest()).items()} == \
        {k: sorted(v, key=str) for k, v in recipe.items()}


@pytest.mark.parametrize("labels", [{"nvidia.com/gpu.present": "true"}, {"memslice.io/gpu": "true"}],
                         ids=["gpu-operator", "by-hand"])
def test_every_gpu_node_runs_exactly_one_agent_chosen_by_its_label(recipe, labels: dict[str, str]) -> None:
    plugin, dra = agent(recipe["my-memslice"]), agent(recipe["my-memslice-dra"])
    assert (runs_on(plugin, labels), runs_on(dra, labels)) == (True, False)
    moved = {**labels, LABEL: "dra"}
    assert (runs_on(plugin, moved), runs_on(dra, moved)) == (False, True)
    assert "--kubelet-api=dra" in dra["spec"]["template"]["spec"]["containers"][0]["args"]
    assert plugin["metadata"]["name"] != dra["metadata"]["name"]


def test_the_two_sides_share_no_name_with_different_content(recipe) -> None:
    """Objects of one kind and name in both would be overwritten by whichever side is applied last."""
    def key(o: dict[str, Any]) -> tuple[str, str | None, str]:
        return (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])

    plugin = {key(o): o for o in recipe["my-memslice"]}
    dra = {key(o): o for o in recipe["my-memslice-dra"]}
    assert [k for k in set(plugin) & set(dra) if plugin[k] != dra[k]] == []
    # and the DRA side applies none of them: deleting it (`kubectl delete -k`) leaves the other side whole
    assert set(plugin) & set(dra) == set()
    assert ("Namespace", None, NAMESPACE) in plugin


def test_the_dra_sides_policies_still_match_its_agent_and_its_device_class(recipe) -> None:
    objs = recipe["my-memslice-dra"]
    ds = agent(objs)
    user = sa_username(ds)
    assert user.endswith(":memslice-node-agent-dra")
    find_one(objs, "ServiceAccount", "memslice-node-agent-dra")
    binding = find_one(objs, "ClusterRoleBinding", "memslice-node-agent-dra")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "memslice-node-agent-dra",
                                    "namespace": NAMESPACE}]
    rules = find_one(objs, "ClusterRole", binding["roleRef"]["name"])["rules"]
    assert any("resourceslices" in r["resources"] for r in rules)
    vap = find_one(objs, "ValidatingAdmissionPolicy", "memslice-node-agent-resourceslices")
    [cond] = vap["spec"]["matchConditions"]
    assert f'"{user}"' in cond["expression"], cond  # the CEL names the renamed account
    for policy in ("memslice-node-agent-resourceslices", "memslice-claims-one-gpu"):
        b = find_one(objs, "ValidatingAdmissionPolicyBinding", policy)
        assert b["spec"]["policyName"] == policy
        find_one(objs, "ValidatingAdmissionPolicy", policy)
    [cls] = [o for o in objs if o["kind"] == "DeviceClass"]
    spec = find_one(objs, "ValidatingAdmissionPolicy", "memslice-claims-one-gpu")["spec"]
    assert f'"{cls["metadata"]["name"]}"' in " ".join(v["expression"] for v in spec["variables"])

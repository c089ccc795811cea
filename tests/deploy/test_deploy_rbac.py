"""RBAC grants exactly the Kubernetes API calls the code makes.

The calls are read from the code: every `kubernetes.client` API method a component's modules name
(`core.patch_node(...)`, `watch.stream(core.list_namespaced_pod, ...)`) is mapped to the HTTP method and
path the client library itself uses for it, and from there to the RBAC (apiGroup, resource, verb). A list
method passed as a value (to `Watch().stream` or an informer) or called with `watch=True` is a watch.
The rules bound to the component's ServiceAccount must be exactly that set: a missing rule fails the
call in the cluster, an extra one is privilege nobody uses.

A class that makes some of those calls over HTTP itself, with the client's configuration (the extender's
PodWriter, see podwrites.py) is a "mirror": its methods carry the names of the generated methods they stand in for,
so they are mapped like them; a test here checks that each makes the request its name says.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import orjson
import pytest
import yaml
from test_deploy_render import NAMESPACE, ROOT, Manifest, extender_container, find, pod_spec, render

Perm = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# component -> (its ServiceAccount, the directories of its code)
COMPONENTS = {
    "node-agent": ("memslice-node-agent", ("plugin",)),
    "node-agent-dra": ("memslice-node-agent", ("plugin",)),
    # deploy/base: a container of the scheduler's pods, under the scheduler's account
    "extender": ("memslice-scheduler", ("scheduler_extender",)),
    "extender-standalone": ("memslice-extender", ("scheduler_extender",)),
    "extender-certs": ("memslice-extender-certs", ("src/memslice/extender_certs.py",)),  # the TLS Job
}
STANDALONE = "overlays/standalone-extender"
# Components sharing their account with another program, and the roles that are theirs (kube-scheduler's
# own bindings on the scheduler's account: test_scheduler_uses_the_builtin_scheduler_roles_and_its_own_lease).
OWN_ROLES = {"extender": frozenset({"memslice-extender"})}
# The node agent's two modes share plugin/ but not their API calls: DRA mode (--kubelet-api dra) makes the calls
# of plugin/dra/*.py and of the modules both modes run with the API (BOTH_MODES: the elastic Events, issue 36.6)
# and is granted them by deploy/overlays/dra; device-plugin mode makes all but plugin/dra's.
IS_DRA = re.compile(r"(^|/)plugin/dra/\w+\.py$")
BOTH_MODES = re.compile(r"(^|/)plugin/elastic/events\.py$")
MODE_FILES = {"node-agent": lambda p: not IS_DRA.search(str(p)),
              "node-agent-dra": lambda p: bool(IS_DRA.search(str(p)) or BOTH_MODES.search(str(p)))}
RENDERED = {"node-agent-dra": "overlays/dra", "extender-standalone": STANDALONE, "extender-certs": STANDALONE}
# Ways to reach the API server that this scanner cannot map to permissions; code using them needs the
# scanner extended first, so it fails here instead of silently passing.
OPAQUE_CALLS = re.compile(r"\bcall_api\(|\bDynamicClient\b|\burllib\.request\b|"
                          r"^\s*(?:import|from)\s+(?:requests|httpx|aiohttp|urllib3|httptools|http\.client)\b", re.M)
# mirror class -> the file that defines it (where reaching the API server by HTTP directly is expected)
MIRRORS = {"PodWriter": "scheduler_extender/kubeio/podwrites.py", "CoreReads": "scheduler_extender/kubeio/kubereads.py"}


@functools.cache
def api_methods() -> dict[str, list[tuple[str, str, str]]]:
    """method name -> [(API class, HTTP method, path template)] for every kubernetes.client API class,
    read from the client's own request serializers (`_<method>_serialize`)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    api_dir = Path(inspect.getfile(kubernetes.client.CoreV1Api)).parent
    serializer = re.compile(r"def _(\w+)_serialize\(.*?method='(\w+)',\s*resource_path='([^']+)'", re.S)
    for module in sorted(api_dir.glob("*_api.py")):
        text = module.read_text()
        cls = re.search(r"^class (\w+Api)\b", text, re.M)
        if cls is None:
            continue
        for name, http, path in serializer.findall(text):
            out.setdefault(name, []).append((cls.group(1), http, path))
    return out


def permission(http_method: str, path: str) -> tuple[str, str, bool]:
    """(apiGroup, resource[/subresource], names one object) for a path template of the client."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        assert parts[0] == "apis", path
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0]
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    return group, resource, named


VERBS = {("GET", True): "get", ("GET", False): "list", ("POST", True): "create", ("POST", False): "create",
         ("PUT", True): "update", ("PATCH", True): "patch", ("DELETE", True): "delete",
         ("DELETE", False): "deletecollection"}


def source_files(dirs: tuple[str, ...]) -> list[Path]:
    """The Python files of these directories (or the file itself, for a module)."""
    return sorted(p for d in dirs for p in ([ROOT / d] if d.endswith(".py") else (ROOT / d).rglob("*.py"))
                  if "__pycache__" not in p.parts)


def terminal(node: ast.AST) -> str | None:
    """`core` for `core`, `self.core` and `client.core`; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def api_receivers(trees: list[ast.AST]) -> frozenset[str]:
    """Names that hold a kubernetes API object: assigned from `XxxApi(...)`, parameters annotated with an
    API class, and names assigned from those (`self.core = core`)."""
    names: set[str] = set()
    assigns = []
    for tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, ast.Assign | ast.AnnAssign):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                assigns.append(([terminal(t) for t in targets], n.value))
                call = n.value
                if isinstance(call, ast.Call) and ((terminal(call.func) or "").endswith("Api")
                                                   or terminal(call.func) in MIRRORS) \
                        and terminal(call.func) != "ApiClient":
                    names.update(t for t in (terminal(t) for t in targets) if t)
            elif isinstance(n, ast.arg) and n.annotation is not None:
                ann = ast.unparse(n.annotation)
                if re.search(r"\b\w+V\d\w*Api\b", ann) or ann in MIRRORS:
                    names.add(n.arg)
    changed = True
    while changed:
        changed = False
        for targets, value in assigns:
            if value is not None and terminal(value) in names:
                new = {t for t in targets if t and t not in names}
                names |= new
                changed = changed or bool(new)
    return frozenset(names)


def referenced_api_methods(tree: ast.AST, text: str, own: frozenset[str] = frozenset(),
                           receivers: frozenset[str] = frozenset()) -> Iterator[tuple[str, str, bool]]:
    """(method, API class, watched) for each kubernetes API method the module names. Where the component
    defines a function of the same name itself (e.g. a cache's own `delete_node`), only references on a
    known API object (`receivers`) count."""
    methods = api_methods()
    called: set[int] = set()
    watch_kw: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            called.add(id(node.func))
            if any(k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value
                   for k in node.keywords):
                watch_kw.add(id(node.func))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr in methods):
            continue
        if node.attr in own and terminal(node.value) not in receivers:
            continue
        candidates = methods[node.attr]
        classes = [c for c, _, _ in candidates]
        if len(set(classes)) > 1:  # e.g. create_namespaced_event: CoreV1Api and EventsV1Api
            named = [c for c in classes if c in text]
            assert len(named) == 1, f"{node.attr}: cannot tell which of {classes} the code uses"
            cls = named[0]
        else:
            cls = classes[0]
        watched = node.attr.startswith("list_") and (id(node) not in called or id(node) in watch_kw)
        yield node.attr, cls, watched


# Checks the API server makes beside the request's own (apiGroup, resource, verb): with the
# DRAResourceClaimGranularStatusAuthorization gate (beta, on, since 1.36) a write of a ResourceClaim's
# status.devices also needs the synthetic subresource resourceclaims/driver with a node-aware verb
# (`associated-node:<verb>` for a node-local driver, limited by resourceNames to the driver's name).
IMPLIED: dict[Perm, set[Perm]] = {
    ("resource.k8s.io", "resourceclaims/status", "patch"): {("resource.k8s.io", "resourceclaims/driver",
                                                             "associated-node:patch")},
}


def code_permissions(dirs: tuple[str, ...], keep: Any = None) -> set[Perm]:
    perms = _code_permissions(dirs, keep)
    return perms.union(*(IMPLIED.get(p, set()) for p in perms))


def _code_permissions(dirs: tuple[str, ...], keep: Any = None) -> set[Perm]:
    perms: set[Perm] = set()
    trees = {path: (path.read_text(), ast.parse(path.read_text())) for path in source_files(dirs)
             if keep is None or keep(path)}
    own = frozenset(n.name for _, tree in trees.values() for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    receivers = api_receivers([tree for _, tree in trees.values()])
    for path, (text, tree) in trees.items():
        opaque = OPAQUE_CALLS.search(text) if str(path.relative_to(ROOT)) not in MIRRORS.values() else None
        assert opaque is None, f"{path.relative_to(ROOT)}: {opaque.group(0)!r} is unmapped; extend this test"
        for name, cls, watched in referenced_api_methods(tree, text, own, receivers):
            (_, http, tmpl), = [m for m in api_methods()[name] if m[0] == cls]
            group, resource, named = permission(http, tmpl)
            if watched:
                perms |= {(group, resource, "list"), (group, resource, "watch")}
            else:
                perms.add((group, resource, VERBS[(http, named)]))
    return perms


def granted(objs: list[Manifest], service_account: str, roles: frozenset[str] | None = None) -> set[Perm]:
    """Every (apiGroup, resource, verb) the roles bound to the ServiceAccount allow (no wildcards); only those
    of `roles` where given."""
    perms: set[Perm] = set()
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if roles is not None and b["roleRef"]["name"] not in roles:
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account
                   and s["namespace"] == NAMESPACE for s in b["subjects"]):
            continue
        role = find(objs, b["roleRef"]["kind"], b["roleRef"]["name"])
        for rule in role["rules"]:
            assert "resourceNames" not in rule or rule["verbs"] != ["list"], "resourceNames cannot limit list"
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        assert "*" not in (g, r, v), f"wildcard in {role['metadata']['name']}"
                        perms.add((g, r, v))
    return perms


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_rbac_grants_exactly_the_calls_in_the_code(component: str) -> None:
    sa, dirs = COMPONENTS[component]
    needed = code_permissions(dirs, MODE_FILES.get(component))
    assert needed, f"found no Kubernetes API call in {dirs}: the scanner or the code changed"
    have = granted(render(RENDERED.get(component, "base")), sa, OWN_ROLES.get(component))
    assert have - needed == set(), f"{component}: granted but never called: {sorted(have - needed)}"
    assert needed - have == set(), f"{component}: called but not granted: {sorted(needed - have)}"


def test_the_dra_driver_writes_only_its_own_devices_status() -> None:
    """Issue 36.8: the synthetic resourceclaims/driver permission names memslice.io alone (resourceNames), so
    the agent's token cannot write another driver's status.devices entries."""
    objs = render("overlays/dra")
    role = find(objs, "ClusterRole", "memslice-node-agent")
    [rule] = [r for r in role["rules"] if "resourceclaims/driver" in r["resources"]]
    assert rule["resources"] == ["resourceclaims/driver"] and rule["resourceNames"] == ["memslice.io"]
    assert rule["verbs"] == ["associated-node:patch"]


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_component_runs_under_its_own_service_account(component: str) -> None:
    """Each account is one workload's (the extender's, in deploy/base, is the scheduler's pods': one pod has one
    account)."""
    sa, _ = COMPONENTS[component]
    objs = render(RENDERED.get(component, "base"))
    users = [o["metadata"]["name"] for o, spec in ((o, pod_spec(o)) for o in objs) if spec
             and spec.get("serviceAccountName") == sa]
    assert users == [sa]
    if component.startswith("extender") and component != "extender-certs":
        dep, _, _ = extender_container(objs)
        assert pod_spec(dep)["serviceAccountName"] == sa  # type: ignore[index]
        # the extender's role is bound to that account alone
        (binding,) = [b for b in objs if b["kind"] == "ClusterRoleBinding"
                      and b["roleRef"]["name"] == "memslice-extender"]
        assert [(s["name"], s["namespace"]) for s in binding["subjects"]] == [(sa, NAMESPACE)]


def test_mirror_methods_make_the_requests_their_names_say() -> None:
    """Each public method of a mirror class is named after a generated API method and makes the same
    request (HTTP method and resource, hence the same permission) on a real API server stand-in, with the
    credentials of the client's kubeconfig."""
    from kube_standin import KubeApiStandin
    from kubernetes.client.exceptions import ApiException

    from memslice.scheduler_extender.cli import load_api_client
    from memslice.scheduler_extender.kubeio.podwrites import PodWriter

    calls = {  # method -> arguments for a pod `p` in namespace `ns`
        "patch_namespaced_pod": ("p", "ns", {"metadata": {"annotations": {"a": "b"}}}),
        "create_namespaced_pod_binding": ("p", "ns", {"apiVersion": "v1", "kind": "Binding",
                                                      "metadata": {"name": "p"}, "target": {"name": "n"}}),
    }
    public = {name for name, _ in inspect.getmembers(PodWriter, inspect.isfunction) if not name.startswith("_")}
    assert public - {"close"} == set(calls), "a new PodWriter method needs a case here"
    with KubeApiStandin() as kube, tempfile.TemporaryDirectory() as tmp:
        kube.put({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
                  "spec": {"containers": [{"name": "c", "image": "i"}]}})
        kube.require_token = "standin-token"  # the token of kube.kubeconfig()
        writer = PodWriter(load_api_client(kube.kubeconfig(f"{tmp}/kubeconfig")))
        with pytest.raises(ApiException) as denied:
            PodWriter(kube.api_client()).patch_namespaced_pod(*calls["patch_namespaced_pod"])  # no token
        assert denied.value.status == 401
        for name, args in calls.items():
            (_, http, tmpl), = [m for m in api_methods()[name] if m[0] == "CoreV1Api"]
            _, resource, named = permission(http, tmpl)
            kube.reset_counts()
            getattr(writer, name)(*args)
            assert kube.request_counts == {(VERBS[(http, named)], resource): 1}, name


def test_core_reads_make_the_requests_their_names_say() -> None:
    """The extender's reads without the generated CoreV1Api (kubereads.py) make the request of the generated
    method of the same name (hence the same permission), with the kubeconfig's credentials, and raise the
    client's ApiException for an error answer."""
    from kube_standin import KubeApiStandin
    from kubernetes.client.exceptions import ApiException

    from memslice.scheduler_extender.cli import load_api_client
    from memslice.scheduler_extender.kubeio.kubereads import CoreReads

    calls: dict[str, tuple[tuple[Any, ...], dict[str, Any], str]] = {  # method -> args, kwargs, verb
        "list_node": ((), {"limit": 5}, "list"),
        "list_pod_for_all_namespaces": ((), {"field_selector": "spec.nodeName=", "limit": 5}, "list"),
        "read_namespaced_pod": (("p", "ns"), {}, "get"),
    }
    public = {name for name, _ in inspect.getmembers(CoreReads, inspect.isfunction) if not name.startswith("_")}
    assert public == set(calls), "a new CoreReads method needs a case here"
    with KubeApiStandin() as kube, tempfile.TemporaryDirectory() as tmp:
        kube.put({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
                  "spec": {"containers": [{"name": "c", "image": "i"}]}})
        kube.put({"kind": "Node", "metadata": {"name": "n"}})
        kube.require_token = "standin-token"  # the token of kube.kubeconfig()
        reads = CoreReads(load_api_client(kube.kubeconfig(f"{tmp}/kubeconfig")))
        with pytest.raises(ApiException) as denied:
            CoreReads(kube.api_client()).read_namespaced_pod("p", "ns")  # no token
        assert denied.value.status == 401
        with pytest.raises(ApiException) as missing:
            reads.read_namespaced_pod("nope", "ns")
        assert missing.value.status == 404
        for name, (args, kwargs, verb) in calls.items():
            (_, http, tmpl), = [m for m in api_methods()[name] if m[0] == "CoreV1Api"]
            _, resource, named = permission(http, tmpl)
            assert VERBS[(http, named)] == verb
            kube.reset_counts()
            resp = getattr(reads, name)(*args, **kwargs)
            body = orjson.loads(resp.data)
            resp.release_conn()
            assert kube.request_counts == {(verb, resource): 1}, name
            assert body["kind"] == ("Pod" if verb == "get" else ("NodeList" if "node" in name else "PodList"))
        watch = reads.list_node(watch=True, resource_version="0", timeout_seconds=1, allow_watch_bookmarks=True)
        watch.release_conn()


def test_scanner_maps_known_calls() -> None:
    """The mapping itself, on calls whose permissions are known from the Kubernetes documentation."""
    src = ("from kubernetes import client, watch\n"
           "core = client.CoreV1Api()\n"
           "core.patch_node('n', {})\n"
           "core.read_node('n')\n"
           "core.create_namespaced_pod_binding('p', 'ns', body)\n"
           "watch.Watch().stream(core.list_pod_for_all_namespaces, field_selector='spec.nodeName=n')\n"
           "core.list_node(watch=True)\n"
           "client.CoordinationV1Api().replace_namespaced_lease('l', 'ns', body)\n"
           "self.state.delete_node('n')\n"
           "def f(api: client.CoreV1Api): api.delete_namespaced_pod('p', 'ns')\n")
    tree = ast.parse(src)
    own = frozenset({"delete_node", "delete_namespaced_pod"})
    found = set()
    for name, cls, watched in referenced_api_methods(tree, src, own, api_receivers([tree])):
        (_, http, tmpl), = [m for m in api_methods()[name] if m[0] == cls]
        group, resource, named = permission(http, tmpl)
        found.add((group, resource, VERBS[(http, named)], watched))
    assert found == {("", "nodes", "patch", False), ("", "nodes", "get", False),
                     ("", "pods/binding", "create", False), ("", "pods", "list", True),
                     ("", "nodes", "list", True), ("coordination.k8s.io", "leases", "update", False),
                     ("", "pods", "delete", False)}


# ------------------------------------------------------------------------------ the second scheduler


def test_scheduler_uses_the_builtin_scheduler_roles_and_its_own_lease() -> None:
    objs = render("base")
    sa = "memslice-scheduler"
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
             for b in objs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s["name"] == sa for s in b["subjects"])}
    assert bound == {("ClusterRole", "system:kube-scheduler", None),
                     ("ClusterRole", "system:volume-scheduler", None),
                     ("Role", "extension-apiserver-authentication-reader", "kube-system"),
                     ("Role", "memslice-scheduler-leader-election", NAMESPACE),
                     ("ClusterRole", "memslice-extender", None)}  # the extender in its pods (deploy/base)
    cm = next(o for o in objs if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("memslice-scheduler-config"))
    le = yaml.safe_load(cm["data"]["scheduler-config.yaml"])["leaderElection"]
    assert le["resourceNamespace"] == NAMESPACE
    role = find(objs, "Role", "memslice-scheduler-leader-election")
    assert role["metadata"]["namespace"] == le["resourceNamespace"]
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [le["resourceName"]], "verbs": ["get", "update"]}]

"""The Kubernetes API stand-in, exercised through the official `kubernetes` client over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from kube_standin import KubeApiStandin
from kubernetes import client, config, watch


@pytest.fixture
def kube() -> Iterator[KubeApiStandin]:
    s = KubeApiStandin().start()
    yield s
    s.stop()


@pytest.fixture
def core(kube: KubeApiStandin) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api_client())


def pod(name: str, ns: str = "default", node: str | None = None, mib: int = 0) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox",
                                  "resources": {"limits": {"memslice.io/gpu-mem": str(mib)}} if mib else {}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"gpu": "yes"}}}


def test_create_get_list_with_selectors(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    kube.put(node("n2") | {"metadata": {"name": "n2"}})
    core.create_namespaced_pod("default", pod("a", node="n1"))
    core.create_namespaced_pod("other", pod("b", ns="other", node="n2"))
    core.create_namespaced_pod("default", pod("c"))

    with pytest.raises(client.ApiException) as exc:
        core.create_namespaced_pod("default", pod("a"))
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"

    got = core.read_namespaced_pod("a", "default")
    assert got.spec.node_name == "n1" and got.metadata.uid and got.status.phase == "Pending"

    everything = core.list_pod_for_all_namespaces()
    assert sorted(p.metadata.name for p in everything.items) == ["a", "b", "c"]
    assert int(everything.metadata.resource_version) == kube.resource_version
    on_n1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert [p.metadata.name for p in on_n1.items] == ["a"]
    unbound = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=")
    assert [p.metadata.name for p in unbound.items] == ["c"]
    assert [p.metadata.name for p in core.list_namespaced_pod("other").items] == ["b"]
    named = core.list_node(field_selector="metadata.name=n2")
    assert [n.metadata.name for n in named.items] == ["n2"]
    assert [n.metadata.name for n in core.list_node(label_selector="gpu=yes").items] == ["n1"]
    with pytest.raises(client.ApiException) as exc:
        core.read_namespaced_pod("missing", "default")
    assert exc.value.status == 404


def test_patch_precondition_conflict_and_merge_semantics(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    rv = created.metadata.resource_version
    patched = core.patch_namespaced_pod(
        "p", "default", {"metadata": {"resourceVersion": rv, "annotations": {"k": "v", "gone": "x"}}})
    assert patched.metadata.annotations == {"k": "v", "gone": "x"}
    assert int(patched.metadata.resource_version) > int(rv)

    with pytest.raises(client.ApiException) as exc:  # stale resourceVersion: nothing changes
        core.patch_namespaced_pod("p", "default", {"metadata": {"resourceVersion": rv,
                                                                "annotations": {"k": "stale"}}})
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "Conflict"
    assert core.read_namespaced_pod("p", "default").metadata.annotations["k"] == "v"

    merged = core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"gone": None}}},
                                       _content_type="application/merge-patch+json")
    assert merged.metadata.annotations == {"k": "v"}
    jp = core.patch_namespaced_pod("p", "default", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": merged.metadata.resource_version},
        {"op": "add", "path": "/metadata/labels", "value": {"l": "1"}}])
    assert jp.metadata.labels == {"l": "1"}
    # strategic merge on a named list merges by name rather than replacing the list
    sm = core.patch_namespaced_pod("p", "default",
                                   {"spec": {"containers": [{"name": "main", "image": "new"}]}})
    assert [(c.name, c.image) for c in sm.spec.containers] == [("main", "new")]


def test_json_patch_out_of_range_index_is_refused_and_changes_nothing(core: client.CoreV1Api) -> None:
    """RFC 6902 (as the real server applies it): `add` at an index past the end of an array is an error, not
    an append; a failed `test` is 422 too. Either way the stored pod is unchanged."""
    created = core.create_namespaced_pod("default", pod("p"))
    for ops in ([{"op": "add", "path": "/spec/containers/5", "value": {"name": "x", "image": "y"}}],
                [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
                 {"op": "add", "path": "/metadata/labels", "value": {"l": "1"}}]):
        with pytest.raises(client.ApiException) as exc:
            core.patch_namespaced_pod("p", "default", ops)
        assert exc.value.status == 422, exc.value.body
    after = core.read_namespaced_pod("p", "default")
    assert after.metadata.resource_version == created.metadata.resource_version
    assert [c.name for c in after.spec.containers] == ["main"] and not after.metadata.labels


def test_store_layer_serves_the_verbs_without_http() -> None:
    """The store (tests/support/kube_store.py) alone: create, merge patch with a stale resourceVersion precondition
    (409, nothing written), and a watch from a version that sees the change."""
    from kube_store import ApiError, Store

    store = Store()
    made = store.create("pods", "default", pod("p"))
    rv = made["metadata"]["resourceVersion"]
    store.patch("pods", "default", "p", None, {"metadata": {"annotations": {"a": "1"}}},
                "application/merge-patch+json")
    with pytest.raises(ApiError) as exc:
        store.patch("pods", "default", "p", None, {"metadata": {"resourceVersion": rv, "annotations": {"a": "2"}}},
                    "application/merge-patch+json")
    assert exc.value.code == 409
    events = list(store.watch_events("pods", Store.selector("default", {}), rv, time.monotonic(), False))
    assert [(e["type"], e["object"]["metadata"]["annotations"]) for e in events] == [("MODIFIED", {"a": "1"})]


def test_replace_with_stale_resource_version_conflicts(core: client.CoreV1Api) -> None:
    first = core.create_node(node("n"))
    body = core.api_client.sanitize_for_serialization(first)
    body["metadata"]["annotations"] = {"memslice.io/unit-mib": "1"}
    replaced = core.replace_node("n", body)
    assert replaced.metadata.annotations == {"memslice.io/unit-mib": "1"}
    with pytest.raises(client.ApiException) as exc:
        core.replace_node("n", body)  # body still carries the first resourceVersion
    assert exc.value.status == 409


def test_binding_sets_node_once(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "p", "annotations": {"memslice.io/x": "1"}},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    resp = core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert resp.status == 201 and json.loads(resp.data)["status"] == "Success"
    bound = kube.get("Pod", "default", "p")
    assert bound is not None and bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == {"memslice.io/x": "1"}
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in bound["status"]["conditions"])
    with pytest.raises(client.ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", binding | {"target": {"name": "n2"}},
                                           _preload_content=False)
    assert exc.value.status == 409 and "already assigned" in json.loads(exc.value.body)["message"]
    assert kube.get("Pod", "default", "p")["spec"]["nodeName"] == "n1"
    assert kube.count("create", "pods/binding") == 2


def test_watch_streams_changes_and_selector_transitions(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    start = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").metadata.resource_version
    core.create_namespaced_pod_binding("p", "default", {"metadata": {"name": "p"}, "target": {"name": "n1"}},
                                       _preload_content=False)
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "1"}}})
    core.delete_namespaced_pod("p", "default")
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_pod_for_all_namespaces, field_selector="spec.nodeName=n1",
        resource_version=start, timeout_seconds=1)]
    assert seen == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


def test_watch_without_resource_version_lists_then_follows(kube: KubeApiStandin,
                                                           core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    w = watch.Watch()
    got: list[tuple[str, str]] = []
    first = threading.Event()
    done = threading.Event()

    def follow() -> None:
        for e in w.stream(core.list_node, timeout_seconds=5):
            got.append((e["type"], e["object"].metadata.name))
            first.set()
            if len(got) == 2:
                w.stop()
        done.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert first.wait(5)
    kube.put(node("n2"))
    assert done.wait(5)
    assert got == [("ADDED", "n1"), ("ADDED", "n2")]


def test_watch_timeout_is_honoured_with_bookmark(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    rv = core.list_node().metadata.resource_version
    t0 = time.monotonic()
    resp = core.list_node(watch=True, resource_version=rv, timeout_seconds=1, allow_watch_bookmarks=True,
                          _preload_content=False)
    lines = [json.loads(line) for line in resp.data.decode().splitlines() if line]
    assert 0.9 <= time.monotonic() - t0 < 4
    assert [ev["type"] for ev in lines] == ["BOOKMARK"]
    assert lines[0]["object"]["metadata"]["resourceVersion"] == str(kube.resource_version)


def test_compacted_resource_version_gives_410_and_relist_recovers(kube: KubeApiStandin,
                                                                  core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    old = core.list_pod_for_all_namespaces().metadata.resource_version
    kube.compact()
    raw = core.list_pod_for_all_namespaces(watch=True, resource_version=old, timeout_seconds=1,
                                           _preload_content=False)
    events = [json.loads(line) for line in raw.data.decode().splitlines() if line]
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
    with pytest.raises(client.ApiException) as exc:
        list(watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=1))
    assert exc.value.status == 410
    fresh = core.list_pod_for_all_namespaces()
    assert [p.metadata.name for p in fresh.items] == ["p"]
    kube.put(pod("q"))
    seen = [e["object"].metadata.name for e in watch.Watch().stream(
        core.list_pod_for_all_namespaces, resource_version=fresh.metadata.resource_version,
        timeout_seconds=1)]
    assert seen == ["q"]


def test_restart_closes_open_watches_and_keeps_state(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    rv = core.list_pod_for_all_namespaces().metadata.resource_version
    opened, ended = threading.Event(), threading.Event()

    def follow() -> None:
        resp = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, _preload_content=False)
        opened.set()
        try:
            for _ in resp.stream(1024):
                pass
        except Exception:  # noqa: BLE001 - a dropped connection is what we expect
            pass
        ended.set()

    threading.Thread(target=follow, daemon=True).start()
    assert opened.wait(5)
    assert kube.wait_for(lambda k: k.count("watch", "pods") == 1, 5)
    kube.restart()
    assert ended.wait(5), "restart() must end open watch streams"
    assert core.read_namespaced_pod("p", "default").metadata.resource_version == kube.get(
        "Pod", "default", "p")["metadata"]["resourceVersion"]


def test_delete_with_preconditions_and_watch_event(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    with pytest.raises(client.ApiException) as exc:
        core.delete_namespaced_pod("p", "default", body={"preconditions": {"uid": "not-the-uid"}})
    assert exc.value.status == 409 and kube.get("Pod", "default", "p") is not None
    core.delete_namespaced_pod("p", "default", body={"preconditions": {"uid": created.metadata.uid}})
    assert kube.get("Pod", "default", "p") is None
    events = list(watch.Watch().stream(core.list_pod_for_all_namespaces,
                                       resource_version=created.metadata.resource_version, timeout_seconds=1))
    assert [e["type"] for e in events] == ["DELETED"]


def test_fail_next_and_request_counts(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    kube.reset_counts()
    kube.fail_next("POST", "/binding", 500)
    binding = {"metadata": {"name": "p"}, "target": {"name": "n"}}
    with pytest.raises(client.ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert exc.value.status == 500
    assert kube.get("Pod", "default", "p")["spec"].get("nodeName") is None
    core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert kube.get("Pod", "default", "p")["spec"]["nodeName"] == "n"
    core.read_namespaced_pod("p", "default")
    assert kube.request_counts == {("create", "pods/binding"): 2, ("get", "pods"): 1}


def test_kubeconfig_works_with_load_kube_config(kube: KubeApiStandin, tmp_path) -> None:
    kube.put(node("n1"))
    path = kube.kubeconfig(str(tmp_path / "kubeconfig"))
    api_client = config.new_client_from_config(config_file=path)
    assert [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items] == ["n1"]


def test_bad_requests_are_rejected_without_change(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    with pytest.raises(client.ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "b"}}},
                                  _content_type="application/apply-patch+yaml")
    assert exc.value.status == 415
    with pytest.raises(client.ApiException) as exc:
        core.list_pod_for_all_namespaces(watch=True, resource_version="abc", _preload_content=False)
    assert exc.value.status == 400
    kube.put(pod("p", node="n1"))
    with pytest.raises(client.ApiException) as exc:  # pods may not move once bound
        core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "n2"}})
    assert exc.value.status == 422
    assert kube.get("Pod", "default", "p")["spec"]["nodeName"] == "n1"
    assert created.metadata.uid == kube.get("Pod", "default", "p")["metadata"]["uid"]


def test_paged_list_is_a_consistent_snapshot(kube: KubeApiStandin, core: client.CoreV1Api) -> None:
    for i in range(5):
        kube.put(pod(f"p{i}"))
    first = core.list_pod_for_all_namespaces(limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"] and first.metadata.var_continue
    kube.delete("Pod", "default", "p3")  # changes after the first page are not in later pages
    kube.put(pod("p5"))
    names = [p.metadata.name for p in first.items]
    token = first.metadata.var_continue
    while token:
        page = core.list_pod_for_all_namespaces(limit=2, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        names += [p.metadata.name for p in page.items]
        token = page.metadata.var_continue
    assert names == ["p0", "p1", "p2", "p3", "p4"]
    second = core.list_pod_for_all_namespaces(limit=2)
    kube.compact()
    with pytest.raises(client.ApiException) as exc:
        core.list_pod_for_all_namespaces(limit=2, _continue=second.metadata.var_continue)
    assert exc.value.status == 410

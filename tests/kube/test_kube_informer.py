"""The shared informer and backoff (memslice.kube) against the API stand-in: paged lists, watch events,
410 Gone relists, and a retry policy that grows, is capped, resets, and stops waiting when told."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kube_standin import KubeApiStandin

from memslice.kube.backoff import Backoff
from memslice.kube.informer import Informer, lines_of


def test_backoff_grows_to_its_cap_with_jitter_and_resets() -> None:
    b = Backoff(initial=0.1, maximum=1.0, factor=2.0, jitter=0.2)
    delays = [b.delay() for _ in range(8)]
    for got, base in zip(delays, (0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0), strict=True):
        assert base * 0.8 <= got <= base * 1.2
    assert b.failures == 8
    b.reset()
    assert b.failures == 0 and 0.08 <= b.delay() <= 0.12


@pytest.mark.parametrize("kwargs", [{"initial": 0}, {"initial": 2, "maximum": 1}, {"factor": 0.5},
                                    {"jitter": 1.0}])
def test_backoff_refuses_a_policy_that_cannot_work(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="need 0 < initial <= maximum"):
        Backoff(**kwargs)


def test_backoff_wait_ends_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    assert Backoff(initial=3600, maximum=3600).wait(stop) >= 3600 * 0.8  # returned: stop was set (pytest-timeout)


@given(st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=12), st.data())
def test_watch_lines_survive_any_chunking(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert list(lines_of(iter(chunks))) == [line for line in lines if line.strip()]


@pytest.fixture
def kube() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as k:
        yield k


def pod(name: str) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


def test_informer_pages_watches_and_relists_after_410(kube: KubeApiStandin) -> None:
    from kubernetes import client

    for i in range(5):
        kube.put(pod(f"p{i}"))
    names: set[str] = set()
    changed = threading.Condition()
    restarts: list[str] = []

    def replace(items: list[dict], rv: int) -> None:
        with changed:
            names.clear()
            names.update(o["metadata"]["name"] for o in items)
            changed.notify_all()

    def upsert(obj: dict) -> None:
        with changed:
            names.add(obj["metadata"]["name"])
            changed.notify_all()

    def delete(obj: dict) -> None:
        with changed:
            names.discard(obj["metadata"]["name"])
            changed.notify_all()

    stop, synced = threading.Event(), threading.Event()
    inf = Informer("pods", client.CoreV1Api(kube.api_client()).list_pod_for_all_namespaces,
                   on_replace=replace, on_upsert=upsert, on_delete=delete, synced=synced, stop=stop,
                   on_restart=lambda kind, why: restarts.append(why), page_size=2,
                   backoff=Backoff(initial=0.01, maximum=0.05)).start()
    try:
        assert synced.wait(10) and kube.count("list", "pods") == 3  # 5 pods in pages of 2
        with changed:
            assert changed.wait_for(lambda: names == {f"p{i}" for i in range(5)}, 10)
        kube.put(pod("p5"))
        kube.delete("Pod", "default", "p0")
        with changed:
            assert changed.wait_for(lambda: "p5" in names and "p0" not in names, 10)
        with kube.store.cond:  # the watch cannot deliver these, only a 410 once it reconnects
            kube.delete("Pod", "default", "p1")
            kube.put(pod("p6"))
            kube.compact()
        kube.restart()
        with changed:
            assert changed.wait_for(lambda: names == {"p2", "p3", "p4", "p5", "p6"}, 10), names
        assert "gone" in restarts
    finally:
        inf.stop()
        inf.join(5)

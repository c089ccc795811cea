"""benchmarks/goclient, bench_extender.py's load client in Go (--client go, issue 39), against a real extender
on the API stand-in over real HTTP: every pod's filter, prioritize and bind as kube-scheduler sends them, and
every pod bound to a node its filter passed. Skipped, saying why, where `go` is not on PATH."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
from test_extender_support import node_obj, pod_obj, running_cluster

from memslice.scheduler_extender.app import Config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_extender  # noqa: E402  (benchmarks/ is not a package)

needs_go = pytest.mark.skipif(shutil.which("go") is None,
                                reason="needs the Go toolchain (`go` on PATH) to build benchmarks/goclient")

BIG, SMALL = ["big-0", "big-1", "big-2", "big-3"], ["small-0", "small-1"]


@needs_go
@pytest.mark.parametrize("decode", ["bytes", "full"])
def test_the_go_client_binds_every_pod_to_a_node_its_filter_passed(decode: str) -> None:
    # filter passes every fitting node (--filter-answers all): the client ranks them by prioritize, as before
    with running_cluster(Config(address="127.0.0.1", port=0, watch_timeout=30, filter_answers="all")) as cluster:
        cluster.start()
        for name in BIG:
            cluster.add_node(node_obj(name, [81920, 81920]))
        for name in SMALL:  # 8 GiB GPUs: every 16 GiB pod fails here
            cluster.add_node(node_obj(name, [8192]))
        pods = [cluster.add_pod(pod_obj(f"p{i}", {"main": 16384}, ns="bench")) for i in range(12)]
        pods.append(cluster.add_pod(pod_obj("too-big", {"main": 100 * 1024}, ns="bench")))
        # each pod's candidates: two of the big nodes in turn (all pass: the answer the bytes reading echoes),
        # with both small ones for every other pod (some fail: an answer decoded); the last pod: all six
        candidates = [SMALL[:i % 2 * 2] + [BIG[i % 4], BIG[(i + 1) % 4]] for i in range(12)] + [SMALL + BIG]
        jobs = [bench_extender.go_job_line(pod, orjson.dumps(pod), orjson.dumps(
            {"Pod": pod, "Nodes": None, "NodeNames": names})) for pod, names in zip(pods, candidates, strict=True)]
        assert cluster.ext is not None
        port = urlsplit(cluster.ext.url).port
        assert port is not None
        client = bench_extender.GoClient(port, jobs, bind_workers=4, idle_conns=2, decode=decode,
                                         passed_names=True)
        try:
            results, summary = client.run()
        finally:
            client.close()

        assert summary["done"] and summary["pods"] == len(pods) and summary["connections_dialed"] >= 1
        assert [r["pod"] for r in results] == [f"bench/{p['metadata']['name']}" for p in pods]
        for pod, names, r in zip(pods[:-1], candidates, results, strict=False):
            assert sorted(r["passed_names"]) == sorted(n for n in names if n in BIG), r
            assert r["host"] in r["passed_names"] and not r.get("bind_error"), r
            stored = cluster.kube.get("Pod", "bench", pod["metadata"]["name"])
            assert stored is not None and stored["spec"].get("nodeName") == r["host"]
            assert stored["metadata"]["annotations"]["memslice.io/gpu-uuid"].startswith(f"GPU-{r['host']}-")
        last = results[-1]  # fits nowhere: filtered out everywhere, never bound
        assert last["passed"] == 0 and last["host"] == ""
        stored = cluster.kube.get("Pod", "bench", "too-big")
        assert stored is not None and not stored["spec"].get("nodeName")


def test_without_go_the_build_fails_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SystemExit, match=r"`go`.*not on PATH.*--client python"):
        bench_extender.build_go_client()

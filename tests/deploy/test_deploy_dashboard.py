"""The Grafana dashboard queries metrics the code exports, with labels they carry."""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_deploy_render import DEPLOY, ROOT, containers, find, render

DASHBOARD = DEPLOY / "monitoring" / "grafana" / "memslice-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_metrics() -> dict[str, str]:
    """metric name -> type, from the prometheus_client constructors in plugin/ and scheduler_extender/ (and the
    extender's per-GPU gauges written as text, metrics.GaugeText)."""
    out: dict[str, str] = {}
    pattern = re.compile(r"\b(Counter|Gauge|Histogram|CounterMetricFamily|GaugeMetricFamily|GaugeText)\(\s*"
                         r"\"(memslice_\w+)\"")
    for d in ("plugin", "scheduler_extender"):
        for path in (ROOT / d).rglob("*.py"):
            for cls, name in pattern.findall(path.read_text()):
                out[name] = {"Counter": "counter", "CounterMetricFamily": "counter",
                             "Histogram": "histogram"}.get(cls, "gauge")
    return out


def queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    return exprs


def test_dashboard_queries_only_exported_metrics() -> None:
    exported = exported_metrics()
    assert len(exported) >= 10, "the metric scan found too little: did the constructors change?"
    dash = json.loads(DASHBOARD.read_text())
    used = set()
    for expr in queries(dash):
        for name in re.findall(r"\bmemslice_\w+", expr):
            matches = [base for base, kind in exported.items()
                       for suffix in SUFFIXES[kind] if name == base + suffix]
            assert matches, f"dashboard queries {name}, which no component exports (in: {expr})"
            used.add(matches[0])
    # every family of container/GPU memory figures is on the dashboard
    assert {"memslice_container_quota_mib", "memslice_container_used_mib", "memslice_gpu_allocated_mib",
            "memslice_gpu_capacity_mib", "memslice_extender_gpu_free_mib"} <= used
    # and every elastic-memory family, per container and per GPU (issue 13)
    assert {n for n in exported if "elastic" in n or n.startswith(("memslice_container_swap",
                                                                   "memslice_container_resident",
                                                                   "memslice_container_swapped"))} - used == set()
    # and every compute-share family (issue 33)
    assert {n for n in exported if "compute" in n} - used == set()
    assert len({n for n in exported if "compute" in n}) >= 7


def test_node_label_used_by_the_dashboard_is_added_by_the_service_monitor() -> None:
    """Node-agent metrics carry no node label of their own; the ServiceMonitor adds it from the pod."""
    (mon,) = [o for o in render("monitoring") if o["kind"] == "ServiceMonitor"
              and o["metadata"]["name"] == "memslice-node-agent"]
    relabel = mon["spec"]["endpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in relabel
    agent_sources = "".join(p.read_text() for p in (ROOT / "plugin").rglob("*.py"))
    assert not re.search(r"labels=\[[^\]]*\"node\"", agent_sources), "the agent now sets node itself"


def test_dashboard_layout_is_valid() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert dash["uid"] == "memslice"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "node"}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["description"], f"panel {p['title']!r} does not say what it shows"
    cm = [o for o in render("monitoring") if o["kind"] == "ConfigMap"]
    assert len(cm) == 1 and cm[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm[0]["data"]["memslice-dashboard.json"]) == dash
    assert Path(DASHBOARD).read_text().endswith("\n")


def test_extender_gauges_are_one_series_per_gpu_across_scheduler_replicas() -> None:
    """deploy/base runs an extender in each of the scheduler's two pods and the ServiceMonitor scrapes both, so
    every GPU gauge of the extender comes twice (labels pod/instance apart): each panel must fold the replicas
    into one series per GPU (or per node) instead of drawing each GPU twice."""
    dep = find(render("base"), "Deployment", "memslice-scheduler")
    assert dep["spec"]["replicas"] > 1 and any(c.get("args", [None])[0] == "extender"
                                               for c in containers(dep["spec"]["template"]["spec"]))
    dash = json.loads(DASHBOARD.read_text())
    gauges = [n for n, kind in exported_metrics().items() if kind == "gauge" and n.startswith("memslice_extender_")]
    checked = 0
    for expr in queries(dash):
        for name in gauges:
            for m in re.finditer(rf"\b{name}\b", expr):
                head = expr[:m.start()]
                assert re.search(r"\b(min|max|sum|avg)\s+by\s*\([^)]*\)\s*\($", head), \
                    f"{name} is drawn once per scheduler replica (no aggregation by node/gpu) in: {expr}"
                checked += 1
    assert checked >= 2

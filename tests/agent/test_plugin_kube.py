"""The node agent with a Kubernetes API, next to the kubelet stand-in: on the real kube-apiserver, with deploy/'s
ServiceAccount, RBAC and admission policies and a token bound to its pod and node, the inventory annotations it
writes on its Node and the reservations its field-selected pod watch brings (through an API-server restart too),
steering preferred allocation and Allocate's limits file; on the API stand-in, for its fault hooks, the pod watch
through compaction (410 Gone) and the inventory through injected errors. A pod's deletion, graceful on a real
API server, and a reservation written by a real Binding: tests/realcluster/test_real_node_agent_pods.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from extender_real import RealKube
from kube_real import RealCluster
from kube_standin import KubeApiStandin
from kubelet_standin import KubeletStandin
from test_plugin_agent import RESOURCE, AgentProcess, inject_xid
from test_plugin_agent import short_tmp as short_tmp  # the fixture, shared
from test_real_deploy import AGENT_USER, deploy, node_agent_token

NODE = "gpu-40"  # one of the real control plane's kubelet identities (kube_real.KUBELET_NODES)
NS = "agent-kube"  # this module's namespace on the shared real API server
REAL = pytest.mark.xdist_group("kube")  # one real control plane (the session fixture real_cluster): one worker
Api = KubeApiStandin | RealKube


@pytest.fixture(scope="module")
def real_node(real_cluster: RealCluster) -> tuple[RealCluster, str]:
    """deploy/ applied, NODE registered by its kubelet, and the node agent's kubeconfig: deploy/'s ServiceAccount
    token bound to the agent's pod on NODE."""
    deploy(real_cluster, "base")
    real_cluster.register_node(NODE)
    return real_cluster, str(real_cluster.kubeconfig(f"agent-{NODE}", node_agent_token(real_cluster, NODE)))


@pytest.fixture
def cluster(real_node: tuple[RealCluster, str], short_tmp: Path
            ) -> Iterator[tuple[RealKube, KubeletStandin, Callable[..., AgentProcess]]]:
    real_cluster, kubeconfig = real_node
    api = RealKube(real_cluster, NS)
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    agents: list[AgentProcess] = []

    def make(args: tuple[str, ...] = (), **kw: object) -> AgentProcess:
        a = AgentProcess(short_tmp, args=("--kubeconfig", kubeconfig, "--node-name", NODE, *args),
                         **kw)  # type: ignore[arg-type]
        agents.append(a)
        return a.start()

    try:
        yield api, kubelet, make
    finally:
        for a in agents:
            a.stop()
        kubelet.stop()
        api.clean()  # this test's pods; and the inventory goes with the agent, for the next test's agent to write
        api.forget_inventory(NODE)


@pytest.fixture
def standin(short_tmp: Path) -> Iterator[tuple[KubeApiStandin, KubeletStandin, Callable[..., AgentProcess]]]:
    """The API stand-in, for the faults the real server cannot make on demand (compaction, injected errors)."""
    api = KubeApiStandin().start()
    api.put({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE}})
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    kubeconfig = api.kubeconfig(str(short_tmp / "kubeconfig"))
    agents: list[AgentProcess] = []

    def make(args: tuple[str, ...] = (), **kw: object) -> AgentProcess:
        a = AgentProcess(short_tmp, args=("--kubeconfig", kubeconfig, "--node-name", NODE, *args),
                         **kw)  # type: ignore[arg-type]
        agents.append(a)
        return a.start()

    yield api, kubelet, make
    for a in agents:
        a.stop()
    kubelet.stop()
    api.stop()


def inventory(api: Api) -> tuple[list[dict], str] | None:
    node = api.get("Node", None, NODE) or {}
    ann = node.get("metadata", {}).get("annotations") or {}
    if "memslice.io/gpus" not in ann:
        return None
    return json.loads(ann["memslice.io/gpus"]), ann["memslice.io/unit-mib"]


def published(api: Api, agent: AgentProcess, ok: Any = lambda inv: True,
              what: str = "the node inventory") -> tuple[list[dict], str]:
    """Wait until the agent's inventory is on the Node and `ok(it)` holds (a bound for a loaded machine: the
    agent's start-up and the API server's answers)."""
    assert api.wait_for(lambda k: (inv := inventory(k)) is not None and ok(inv), 60), \
        f"no {what} on the Node within 60 s; the agent's output:\n{agent.log()}"
    inv = inventory(api)
    assert inv is not None
    return inv


def pod(name: str, gpu_uuid: str | None, mem: dict[str, int] | str, at: str = "2026-11-21T00:00:00Z") -> dict:
    ann = {}
    if gpu_uuid is not None:
        ann = {"memslice.io/gpu-uuid": gpu_uuid,
               "memslice.io/gpu-mem-mib": mem if isinstance(mem, str) else json.dumps(mem),
               "memslice.io/assumed-at": at}
    containers = [{"name": c, "image": "x"} for c in (mem if isinstance(mem, dict) else {"main": 0})]
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": NS, "annotations": ann},
            "spec": {"nodeName": NODE, "containers": containers}, "status": {"phase": "Pending"}}


def uid_of(api: Api, name: str) -> str:
    obj = api.get("Pod", NS, name)
    assert obj is not None
    return obj["metadata"]["uid"]


@REAL
def test_inventory_is_published_and_follows_health(cluster):
    api, kubelet, make = cluster
    agent = make(sim_gpus="16GiB,24GiB:1", unit_mib=4)
    gpus, unit = published(api, agent)
    assert unit == "4"
    fields = {"uuid", "index", "model", "memMiB", "numa", "healthy", "nvmlTotalMiB", "reservedMiB"}
    assert all(fields <= set(g) <= fields | {"nvlink", "pcie"} for g in gpus)  # topology: when NVML knows it
    assert [(g["index"], g["memMiB"], g["numa"], g["healthy"]) for g in gpus] == [(0, 16384, 0, True),
                                                                                  (1, 24576, 1, True)]
    # memMiB is what can be allocated: NVML's total less what the driver reserves (480 MiB per 80 GiB on the
    # simulated GPU, as on an H100), never NVML's total
    assert [(g["nvmlTotalMiB"], g["reservedMiB"]) for g in gpus] == [(16384 + 96, 96), (24576 + 144, 144)]
    assert all(g["uuid"].startswith("GPU-") for g in gpus)
    assert "standalone" not in agent.log()
    kubelet.wait_registered(RESOURCE)
    inject_xid(agent.sim_state, 0, 48)
    published(api, agent, lambda inv: [g["healthy"] for g in inv[0]] == [False, True], "GPU 0 published unhealthy")
    assert agent.sample("memslice_gpu_healthy", gpu="0") == [0.0]
    assert agent.sample("memslice_gpu_healthy", gpu="1") == [1.0]


@REAL
def test_preferred_allocation_honours_the_reservation(cluster):
    api, kubelet, make = cluster
    gets = api.requests_by(AGENT_USER, "get", "pods")
    agent = make(unit_mib=4)
    gpus, _ = published(api, agent)
    big = gpus[1]["uuid"]  # best fit alone would choose GPU 0, the smaller one
    api.put(pod("train", big, {"a": 400, "b": 800}))
    agent.wait_log(f"{NS}/train: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    uid = uid_of(api, "train")
    kubelet.admit(uid, NS, "train", [("a", 100), ("b", 200)], RESOURCE)
    ids = kubelet.pods[uid].containers
    assert {i.split("-")[0] for i in ids["a"][RESOURCE] + ids["b"][RESOURCE]} == {"g1"}
    owners = {(dict(lv)["pod"], dict(lv)["container"], dict(lv)["gpu"]): v
              for (n, lv), v in agent.metrics().items() if n == "memslice_container_quota_mib"}
    assert owners == {("train", "a", big): 400.0, ("train", "b", big): 800.0}
    records = [json.loads(p.read_text()) for p in agent.region_root.glob("*.json")]
    assert sorted((r["pod"], r["container"], r["pod_uid"]) for r in records) == [("train", "a", uid),
                                                                                 ("train", "b", uid)]
    # Allocate reads no pod from the API: everything came through the watch (the API server's audit log)
    lists = api.requests_by(AGENT_USER, "list", "pods")
    kubelet.admit("x", NS, "x", [("c", 10)], RESOURCE)
    assert api.requests_by(AGENT_USER, "list", "pods") == lists
    assert api.requests_by(AGENT_USER, "get", "pods") == gets


@REAL
def test_preferred_allocation_serves_the_reservation_oldest_in_time(cluster):
    """GetPreferredAllocation does not name the pod: of two reservations of one size, the agent serves the one
    assumed first, by time as the extender reads memslice.io/assumed-at, not by how the time is spelled
    ("...00.5Z" sorts before "...00Z" as text)."""
    api, kubelet, make = cluster
    agent = make(unit_mib=4)
    gpus, _ = published(api, agent)
    api.put(pod("older", gpus[1]["uuid"], {"main": 400}, at="2026-01-01T00:00:00Z"))
    api.put(pod("newer", gpus[0]["uuid"], {"main": 400}, at="2026-01-01T00:00:00.5Z"))
    for name in ("older", "newer"):
        agent.wait_log(f"{NS}/{name}: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    uid = uid_of(api, "older")
    kubelet.admit(uid, NS, "older", [("main", 100)], RESOURCE)
    assert {i.split("-")[0] for i in kubelet.pods[uid].containers["main"][RESOURCE]} == {"g1"}  # best fit: g0


@REAL
def test_pod_watch_survives_an_api_server_restart(cluster):
    """The real kube-apiserver is stopped and started again on the same etcd data: the agent's pod watch
    drops, reconnects, and a reservation written after the restart still steers the kubelet."""
    api, kubelet, make = cluster
    agent = make(unit_mib=4)
    gpus, _ = published(api, agent)
    kubelet.wait_registered(RESOURCE)
    agent.wait_log(f"pods on node {NODE}", "the first pod list")
    api.cluster.restart_apiserver()  # every connection and watch drops; everything stored stays
    api.put(pod("after-restart", gpus[1]["uuid"], {"main": 40}))
    agent.wait_log(f"{NS}/after-restart: the extender reserved", "a pod after the restart", 60)
    uid = uid_of(api, "after-restart")
    kubelet.admit(uid, NS, "after-restart", [("main", 10)], RESOURCE)
    assert {i.split("-")[0] for i in kubelet.pods[uid].containers["main"][RESOURCE]} == {"g1"}


# compaction between two watches, on demand: the stand-in's fault hook
def test_pod_watch_relists_after_410_gone(standin):
    api, kubelet, make = standin
    agent = make(unit_mib=4)
    gpus, _ = published(api, agent)
    kubelet.wait_registered(RESOURCE)
    agent.wait_log("pod watch: 0 pods", "the first pod list")
    api.compact()
    api.restart()  # the agent resumes from a compacted resourceVersion: 410 Gone, then a new list
    api.put(pod("after-compaction", gpus[1]["uuid"], {"main": 80}))
    agent.wait_log(f"{NS}/after-compaction: the extender reserved", "a pod after 410")
    assert "410 Gone" in agent.log()
    uid = uid_of(api, "after-compaction")
    kubelet.admit(uid, NS, "after-compaction", [("main", 20)], RESOURCE)
    assert {i.split("-")[0] for i in kubelet.pods[uid].containers["main"][RESOURCE]} == {"g1"}


@REAL
def test_malformed_reservation_is_reported_and_best_fit_used(cluster):
    api, kubelet, make = cluster
    agent = make(unit_mib=4)
    gpus, _ = published(api, agent)
    api.put(pod("bad", gpus[1]["uuid"], '{"main": "4GiB"}'))
    agent.wait_log(f"{NS}/bad: the extender reserved", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    kubelet.admit(uid_of(api, "bad"), NS, "bad", [("main", 10)], RESOURCE)
    log = agent.log()
    assert "annotation memslice.io/gpu-mem-mib='{\"main\": \"4GiB\"}' is not a JSON object" in log
    assert {i.split("-")[0] for i in kubelet.pods[uid_of(api, "bad")].containers["main"][RESOURCE]} == {"g0"}


def test_api_configured_without_a_node_name_refuses_to_start(short_tmp):
    """Refused before any request: the kubeconfig names a port nothing listens on."""
    kubeconfig = short_tmp / "kc"
    kubeconfig.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    agent = AgentProcess(short_tmp, args=("--kubeconfig", str(kubeconfig))).start()
    try:
        assert agent.wait_exit() == 1
    finally:
        agent.stop()
    assert "--node-name or set NODE_NAME" in agent.log()


# injected 503/500 answers: the stand-in's fault hook
def test_inventory_publication_is_retried_after_api_errors(standin):
    api, _, make = standin
    api.fail_next("PATCH", f"/nodes/{NODE}", 503)
    api.fail_next("PATCH", f"/nodes/{NODE}", 500)
    agent = make()
    published(api, agent)
    agent.wait_log("published after 2 failed attempts", "the agent's log line")
    assert "publishing the node inventory failed (attempt 1): 503" in agent.log()


@REAL
def test_allocate_makes_elastic_containers_from_the_limit_in_the_reservation(cluster):
    """A reservation with a limit above the request: Allocate writes the limit as the quota, the request as
    the guaranteed part and the container's board slot in the read-only limits file, mounts the node's elastic
    directory read-only (boards and rosters made by the agent) with the container's own slot file of its GPU's
    board read-write on top (any container user; issue 35.3), and sets the same in the env; other containers are
    unchanged."""
    api, kubelet, make = cluster
    agent = make(("--idle-after", "7.5"), unit_mib=4)
    gpus, _ = published(api, agent)
    uuid = gpus[0]["uuid"]
    edir = agent.region_root.parent / "elastic"
    want = sorted(f"{g['uuid']}.{k}" for g in gpus for k in ("board", "roster"))
    assert sorted(p.name for p in edir.iterdir()) == want
    assert all((p.stat().st_mode & 0o777) == (0o755 if p.suffix == ".board" else 0o444) for p in edir.iterdir())
    assert all((f.stat().st_mode & 0o777) == 0o666 for p in edir.glob("*.board") for f in p.iterdir())
    assert len(list((edir / f"{uuid}.board").iterdir())) == 64
    assert (edir.stat().st_mode & 0o777) == 0o755
    nb = pod("nb", uuid, {"lab": 512, "side": 256})
    nb["metadata"]["annotations"]["memslice.io/gpu-mem-limit-mib"] = json.dumps({"lab": 2560})
    api.put(nb)
    # an older extender wrote no record: the users' annotation is read (per container wins over pod-wide)
    old = pod("old", uuid, {"main": 512})
    old["metadata"]["annotations"].update({"memslice.io/gpu-mem-limit": "4096",
                                           "memslice.io/gpu-mem-limit.main": "1024"})
    api.put(old)
    agent.wait_log(f"{NS}/nb: the extender reserved GPU", "the pod watch")
    agent.wait_log(f"{NS}/old: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    resp = kubelet.admit(uid_of(api, "nb"), NS, "nb", [("lab", 128), ("side", 64)], RESOURCE)
    lab, side = resp["lab"], resp["side"]
    assert lab.envs["MEMSLICE_GPU_MEM_LIMIT"] == "2560" and lab.envs["MEMSLICE_GPU_MEM_REQUEST"] == "512MiB"
    assert lab.envs["MEMSLICE_ELASTIC_DIR"] == "/run/memslice/elastic" and lab.envs["MEMSLICE_IDLE_AFTER"] == "7.5"
    mounts = {m.container_path: m for m in lab.mounts}
    assert mounts["/run/memslice/elastic"].host_path == str(edir) and mounts["/run/memslice/elastic"].read_only
    board = mounts[f"/run/memslice/elastic/{uuid}.board/00.slot"]
    assert board.host_path == str(edir / f"{uuid}.board/00.slot") and not board.read_only
    assert [k for k, m in mounts.items() if k.startswith("/run/memslice/elastic") and not m.read_only] == [
        f"/run/memslice/elastic/{uuid}.board/00.slot"]
    limits = Path(mounts["/run/memslice/limits"].host_path).read_text().splitlines()
    assert {"gpu_mem_limit=2560MiB", "gpu_mem_request=512MiB", "elastic_dir=/run/memslice/elastic",
            "idle_after=7.5", "elastic_slot=0"} <= set(limits)
    # the container without a limit: a plain quota, no elastic directory
    assert side.envs["MEMSLICE_GPU_MEM_LIMIT"] == "256" and "MEMSLICE_GPU_MEM_REQUEST" not in side.envs
    assert "/run/memslice/elastic" not in {m.container_path for m in side.mounts}
    side_limits = Path({m.container_path: m for m in side.mounts}["/run/memslice/limits"].host_path).read_text()
    assert "gpu_mem_limit=256MiB" in side_limits and "gpu_mem_request" not in side_limits
    main = kubelet.admit(uid_of(api, "old"), NS, "old", [("main", 128)], RESOURCE)["main"]
    assert main.envs["MEMSLICE_GPU_MEM_LIMIT"] == "1024" and main.envs["MEMSLICE_GPU_MEM_REQUEST"] == "512MiB"
    # the region record keeps the limit (an agent restart rewrites the same limits file)
    records = {r["container"]: r for r in (json.loads(p.read_text()) for p in agent.region_root.glob("*.json"))}
    assert records["lab"]["limit_mib"] == 2560 and records["side"]["limit_mib"] == 0


@REAL
def test_a_bad_limit_annotation_is_reported_and_the_container_is_not_elastic(cluster):
    api, kubelet, make = cluster
    agent = make(unit_mib=4)
    gpus, _ = published(api, agent)
    bad = pod("bad", gpus[0]["uuid"], {"main": 512})
    bad["metadata"]["annotations"]["memslice.io/gpu-mem-limit"] = "lots"
    api.put(bad)
    agent.wait_log(f"{NS}/bad: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    main = kubelet.admit(uid_of(api, "bad"), NS, "bad", [("main", 128)], RESOURCE)["main"]
    agent.wait_log(f"pod {NS}/bad: annotation memslice.io/gpu-mem-limit='lots' is not a whole number of MiB",
                   "the agent to report the bad annotation")
    assert main.envs["MEMSLICE_GPU_MEM_LIMIT"] == "512" and "MEMSLICE_GPU_MEM_REQUEST" not in main.envs


@REAL
def test_oversubscription_comes_from_the_pod_annotation_into_the_limits_file(cluster):
    """Spilling is the pod's choice (memslice.io/oversubscribe), written into the read-only limits file; a pod
    that did not ask gets oversubscribe=0 there, so no process of it can turn spilling on by its environment.
    A bad value is reported and the container is held to its plain quota without spilling."""
    api, kubelet, make = cluster
    agent = make(unit_mib=4)
    gpus, _ = published(api, agent)
    uuid = gpus[0]["uuid"]
    asks = pod("asks", uuid, {"main": 512})
    asks["metadata"]["annotations"]["memslice.io/oversubscribe"] = "2GiB"
    nocap = pod("nocap", uuid, {"main": 256})
    nocap["metadata"]["annotations"]["memslice.io/oversubscribe"] = "true"
    plain = pod("plain", uuid, {"main": 128})
    bad = pod("bad", uuid, {"main": 64})
    bad["metadata"]["annotations"]["memslice.io/oversubscribe"] = "lots"
    for p in (asks, nocap, plain, bad):
        api.put(p)
        agent.wait_log(f"{NS}/{p['metadata']['name']}: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)

    def limits_of(name: str, devices: int) -> set[str]:
        resp = kubelet.admit(uid_of(api, name), NS, name, [("main", devices)], RESOURCE)["main"]
        mount = {m.container_path: m for m in resp.mounts}["/run/memslice/limits"]
        assert mount.read_only
        return set(Path(mount.host_path).read_text().splitlines())

    assert {"gpu_mem_limit=512MiB", "oversubscribe=1", "host_spill_limit=2048MiB"} <= limits_of("asks", 128)
    got = limits_of("nocap", 64)
    assert "oversubscribe=1" in got and not any(x.startswith("host_spill_limit") for x in got)
    got = limits_of("plain", 32)
    assert "oversubscribe=0" in got and not any(x.startswith("host_spill_limit") for x in got)
    got = limits_of("bad", 16)
    assert "oversubscribe=0" in got and "gpu_mem_limit=64MiB" in got
    agent.wait_log("annotation memslice.io/oversubscribe='lots' is not a valid size", "the bad annotation reported")

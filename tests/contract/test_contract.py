"""The agent <-> extender contract (memslice.contract): format -> parse is the identity on valid values,
hostile annotations never raise anything but ContractError, the two binaries read reservations alike, and
both find the Kubernetes API in the same order (memslice.kube.config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import QUICK, examples
from kube_standin import KubeApiStandin
from test_extender_support import pod_obj

from memslice import contract
from memslice.contract import (
    ANN_ASSUMED_AT,
    ANN_GPU_MEM,
    ANN_GPU_UUID,
    ANN_GPUS,
    ANN_UNIT_MIB,
    Gpu,
    Inventory,
    Reservation,
)
from memslice.errors import ContractError
from memslice.kube.config import load_api_client
from memslice.plugin.deviceplugin.allocator import PodInfo, match_reservation, parse_reservation
from memslice.scheduler_extender.placement.records import ASSUMED_AT, GPU, pod_record

# ------------------------------------------------------------------------------------------ valid values

# Annotations are UTF-8 on the wire: no lone surrogates.
texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)))
uuids = texts.filter(lambda s: 0 < len(s) <= contract.MAX_UUID and "," not in s)  # commas join a pod's GPUs
gpus = st.builds(Gpu, uuid=uuids, index=st.integers(0, contract.MAX_GPU_INDEX),
                 nvlink=st.lists(st.integers(0, contract.MAX_GPU_INDEX), max_size=8, unique=True).map(
                     lambda xs: tuple(sorted(xs))),
                 pcie=st.none() | texts.filter(lambda s: 0 < len(s) <= contract.MAX_PCIE),
                 model=texts.filter(lambda s: len(s) <= contract.MAX_MODEL),
                 mem_mib=st.integers(1, contract.MAX_MIB),
                 numa=st.none() | st.integers(0, contract.MAX_NUMA), healthy=st.booleans(),
                 nvml_total_mib=st.none() | st.integers(1, contract.MAX_MIB),
                 reserved_mib=st.none() | st.integers(0, contract.MAX_MIB))
inventories = st.builds(
    Inventory, unit_mib=st.integers(1, contract.MAX_MIB),
    gpus=st.lists(gpus, max_size=12, unique_by=(lambda g: g.uuid, lambda g: g.index)).map(
        lambda gs: tuple(sorted(gs, key=lambda g: g.index))))
container_maps = st.dictionaries(texts.filter(lambda s: 0 < len(s) <= contract.MAX_CONTAINER_NAME),
                                 st.integers(1, contract.MAX_MIB), min_size=1, max_size=8)
times = st.datetimes(timezones=st.just(UTC))
shares = st.integers(0, 100).flatmap(lambda r: st.tuples(st.just(r), st.none() | st.integers(max(r, 1), 100)))
compute_maps = st.dictionaries(texts.filter(lambda s: 0 < len(s) <= contract.MAX_CONTAINER_NAME), shares,
                               max_size=4).map(
    lambda m: tuple(contract.ComputeShare(k, *v) for k, v in sorted(m.items())))
one_gpu_reservations = st.builds(Reservation, gpu_uuid=uuids,
                                 container_mib=container_maps.map(lambda m: tuple(sorted(m.items()))),
                                 assumed_at=st.none() | times, container_compute=compute_maps)


@st.composite
def spanning_reservations(draw: st.DrawFn) -> Reservation:
    """A pod on 2..16 GPUs: distinct UUIDs, each container's total a multiple of the count."""
    ids = draw(st.lists(uuids, min_size=2, max_size=contract.MAX_GPUS_PER_POD, unique=True))
    n = len(ids)
    mib = draw(st.dictionaries(texts.filter(lambda s: 0 < len(s) <= contract.MAX_CONTAINER_NAME),
                               st.integers(1, contract.MAX_MIB // n).map(lambda k: k * n), min_size=1, max_size=4))
    return Reservation(",".join(ids), tuple(sorted(mib.items())), draw(st.none() | times), draw(compute_maps))


reservations = one_gpu_reservations | spanning_reservations()


@settings(max_examples=examples(300), derandomize=QUICK, deadline=None)
@given(inventories)
def test_inventory_format_then_parse_is_the_identity(inv: Inventory) -> None:
    ann = inv.format()
    assert set(ann) == {ANN_GPUS, ANN_UNIT_MIB} and all(isinstance(v, str) for v in ann.values())
    assert Inventory.parse("n", ann) == inv


@settings(max_examples=examples(300), derandomize=QUICK, deadline=None)
@given(reservations)
def test_reservation_format_then_parse_is_the_identity(r: Reservation) -> None:
    ann = r.format()
    assert all(isinstance(v, str) for v in ann.values())
    assert Reservation.parse(ann, "pod ns/p") == r


def test_the_wire_format_is_the_documented_one() -> None:
    inv = Inventory(256, (Gpu("GPU-1", 0, "Sim", 16384, None, True),))
    assert inv.format() == {ANN_GPUS: '[{"uuid":"GPU-1","index":0,"model":"Sim","memMiB":16384,"numa":null,'
                                      '"healthy":true}]', ANN_UNIT_MIB: "256"}
    r = Reservation("GPU-1", (("a", 1), ("b", 2)), datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC))
    assert r.format() == {ANN_GPU_UUID: "GPU-1", ANN_GPU_MEM: '{"a":1,"b":2}',
                          ANN_ASSUMED_AT: "2026-01-02T03:04:05.123456Z"}


# ------------------------------------------------------------------------------------------ hostile values

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
                           max_leaves=20)
# strings that are near-misses of valid values: JSON of the right shape with wrong types, huge numbers, ...
near_misses = st.one_of(
    texts, json_values.map(json.dumps),
    st.lists(st.fixed_dictionaries({}, optional={"uuid": json_values, "index": json_values,
                                                 "memMiB": json_values, "model": json_values,
                                                 "numa": json_values, "healthy": json_values}),
             max_size=4).map(json.dumps),
    st.dictionaries(texts, st.integers() | json_values, max_size=4).map(json.dumps),
    st.just("[" * 100_000), st.just("x" * (contract.MAX_GPUS_TEXT + 1)), st.just('{"a": 1e400}'),
    st.just('{"a": 99999999999999999999999}'), st.just("NaN"), st.just("\x00"))
annotation_values = near_misses | json_values  # annotations from a decoded body need not even be strings
hostile = st.dictionaries(st.sampled_from([ANN_GPUS, ANN_UNIT_MIB, ANN_GPU_UUID, ANN_GPU_MEM, ANN_ASSUMED_AT]),
                          annotation_values)


@settings(max_examples=examples(500), derandomize=QUICK, deadline=None)
@given(hostile, st.booleans())
def test_hostile_annotations_raise_only_contract_errors(ann: dict[str, Any], with_time: bool) -> None:
    for parse in (lambda: Inventory.parse("n", ann), lambda: Reservation.parse(ann, "pod ns/p", with_time=with_time)):
        try:
            value = parse()
        except ContractError as exc:
            assert "annotation memslice.io/" in str(exc) and len(str(exc)) < 1000
        else:
            if value is not None:  # what is accepted formats back to annotations that parse the same
                again = Inventory.parse("n", value.format()) if isinstance(value, Inventory) \
                    else Reservation.parse(value.format(), with_time=with_time)
                assert again == value


def _item(g: Gpu) -> dict[str, Any]:
    return {"uuid": g.uuid, "index": g.index, "model": g.model, "memMiB": g.mem_mib, "numa": g.numa,
            "healthy": g.healthy, "nvmlTotalMiB": g.nvml_total_mib, "reservedMiB": g.reserved_mib,
            "nvlink": list(g.nvlink), "pcie": g.pcie}


gpu_items = st.one_of(gpus.map(_item), json_values)  # valid items, and any JSON value
# every field of a valid item, and the values it is set to: each bound, its neighbours, the wrong JSON types
FIELDS = ["uuid", "index", "model", "memMiB", "numa", "healthy", "nvmlTotalMiB", "reservedMiB", "nvlink", "pcie"]
EDGES = [-1, 0, 1, contract.MAX_MIB, contract.MAX_MIB + 1, contract.MAX_GPU_INDEX, contract.MAX_GPU_INDEX + 1,
         contract.MAX_NUMA, contract.MAX_NUMA + 1, True, False, None, "", "x" * contract.MAX_UUID,
         "x" * (contract.MAX_UUID + 1), "x" * contract.MAX_MODEL, "x" * (contract.MAX_MODEL + 1), 1.0, "1", [], {},
         "x" * contract.MAX_PCIE, "x" * (contract.MAX_PCIE + 1), [0, 3], [3, 3], [-1], [True], ["1"]]


def _fast_is_checked(item: Any) -> None:
    fast = contract._gpu_fast(item)
    try:
        checked: Gpu | None = contract._gpu_checked("w", 0, item)
    except ContractError:
        checked = None
    assert fast == checked


@pytest.mark.parametrize("field", FIELDS)
def test_the_fast_gpu_check_holds_every_bound(field: str) -> None:
    """Each field of a valid item set to each bound, its neighbours and the wrong JSON types, or dropped:
    _gpu_fast accepts exactly what _gpu_checked accepts."""
    item = {"uuid": "GPU-1", "index": 3, "model": "Sim", "memMiB": 81079, "numa": 1, "healthy": True,
            "nvmlTotalMiB": 81559, "reservedMiB": 480}
    _fast_is_checked({k: v for k, v in item.items() if k != field})
    for value in EDGES:
        _fast_is_checked({**item, field: value})


@settings(max_examples=examples(1000), derandomize=QUICK, deadline=None)
@given(gpu_items)
def test_the_fast_gpu_check_accepts_what_the_field_checks_accept(item: Any) -> None:
    """On decoded JSON, _gpu_fast (a restart's path) accepts exactly the items _gpu_checked accepts, as the
    same Gpu."""
    _fast_is_checked(json.loads(json.dumps(item)))


@settings(max_examples=examples(1000), derandomize=QUICK, deadline=None)
@given(st.dictionaries(texts, st.integers(-1, contract.MAX_MIB + 1) | json_values, max_size=3) | json_values)
def test_the_one_container_check_is_the_general_one(mem: Any) -> None:
    mem = json.loads(json.dumps(mem))
    assert contract._container_mib(mem) == contract._container_mib_checked(mem)


@pytest.mark.parametrize(("ann", "words"), [
    ({ANN_GPUS: "[]", ANN_UNIT_MIB: "4.5"}, "unit-mib='4.5' is not a positive whole number"),
    ({ANN_GPUS: '[{"uuid":"u","index":0,"memMiB":1},{"uuid":"v","index":0,"memMiB":1}]'}, "index 0 is listed twice"),
    ({ANN_GPUS: '[{"uuid":"u","index":0,"memMiB":1,"healthy":"yes"}]'}, "healthy='yes' is not true or false"),
    ({ANN_GPUS: '[{"uuid":"u","index":0,"memMiB":1,"numa":"0"}]'}, "numa='0' is neither null nor"),
    ({ANN_GPUS: json.dumps([{"uuid": f"u{i}", "index": i, "memMiB": 1} for i in range(1025)])}, "at most 1024 GPUs"),
    ({ANN_GPUS: "x" * 300_000}, "at most 262144 bytes"),
])
def test_bad_inventories_are_named(ann: dict[str, str], words: str) -> None:
    with pytest.raises(ContractError, match=words):
        Inventory.parse("n", ann)


@pytest.mark.parametrize(("ann", "words"), [
    ({ANN_GPU_UUID: "G", ANN_GPU_MEM: "{}"}, "gpu-mem-mib='{}' is not a JSON object of 1 to 256"),
    ({ANN_GPU_UUID: "G", ANN_GPU_MEM: orjson.dumps({f"c{i}": 1 for i in range(257)}).decode()}, "gpu-mem-mib="),
    ({ANN_GPU_UUID: "G", ANN_GPU_MEM: '{"a": 1099511627776}'}, "gpu-mem-mib=.*at most 1073741824"),
    ({ANN_GPU_UUID: "G" * 129, ANN_GPU_MEM: '{"a": 1}'}, r"gpu-uuid='G+\.\.\. is neither a GPU UUID"),
    ({ANN_GPU_UUID: 7, ANN_GPU_MEM: '{"a": 1}'}, "gpu-uuid=7 is neither a GPU UUID"),
    ({ANN_GPU_UUID: "G1,G1", ANN_GPU_MEM: '{"a": 2}'}, "gpu-uuid='G1,G1' is not 2 to 16 distinct GPU UUIDs"),
    ({ANN_GPU_UUID: "G1,", ANN_GPU_MEM: '{"a": 2}'}, "gpu-uuid='G1,' is not 2 to 16 distinct GPU UUIDs"),
    ({ANN_GPU_UUID: ",".join(f"G{i}" for i in range(17)), ANN_GPU_MEM: '{"a": 17}'}, "gpu-uuid=.* not 2 to 16"),
    ({ANN_GPU_UUID: "G1,G2,G3", ANN_GPU_MEM: '{"a": 4096}'},
     "gpu-mem-mib: container 'a' holds 4096 MiB, not divisible over its 3 GPUs"),
    ({ANN_GPU_UUID: "G", ANN_GPU_MEM: '{"a": 1}', ANN_ASSUMED_AT: "yesterday"}, "assumed-at='yesterday' is not an"),
])
def test_bad_reservations_are_named(ann: dict[str, Any], words: str) -> None:
    with pytest.raises(ContractError, match=f"pod ns/p: annotation memslice.io/{words}"):
        Reservation.parse(ann, "pod ns/p")


# ------------------------------------------------------------------------------------------ pods that span GPUs

def test_a_spanning_reservation_names_its_gpus_in_device_order() -> None:
    r = Reservation.parse({ANN_GPU_UUID: "GPU-b,GPU-a", ANN_GPU_MEM: '{"serve": 8192, "side": 2048}'}, "pod ns/p")
    assert r is not None and r.gpu_uuids == ("GPU-b", "GPU-a") and r.gpu_count == 2
    assert (r.per_gpu_mib("serve"), r.per_gpu_mib("side"), r.per_gpu_mib("none")) == (4096, 1024, 0)
    one = Reservation.parse({ANN_GPU_UUID: "GPU-a", ANN_GPU_MEM: '{"serve": 8192}'}, "pod ns/p")
    assert one is not None and one.gpu_uuids == ("GPU-a",) and one.per_gpu_mib("serve") == 8192


@pytest.mark.parametrize(("raw", "want"), [(None, 1), ("1", 1), ("2", 2), (" 4 ", 4), ("16", 16)])
def test_gpu_count_annotation(raw: str | None, want: int) -> None:
    ann = {} if raw is None else {contract.ANN_GPU_COUNT: raw}
    assert contract.parse_gpu_count(ann, "pod ns/p") == want


@pytest.mark.parametrize("bad", ["0", "17", "-1", "2.0", "two", "", "1" * 20, "٢"])
def test_bad_gpu_count_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ContractError, match=r"pod ns/p: annotation memslice.io/gpu-count=.* is not a whole number "
                                            r"of GPUs between 1 and 16 .*fix or remove it"):
        contract.parse_gpu_count({contract.ANN_GPU_COUNT: bad}, "pod ns/p")


def test_a_total_that_does_not_split_evenly_is_refused_naming_the_fix() -> None:
    assert contract.split_even(8192, 4, contract.RESOURCE, "pod ns/p container c") == 2048
    with pytest.raises(ContractError, match=r"pod ns/p container c: memslice.io/gpu-mem=1000 cannot be split "
                                            r"evenly over memslice.io/gpu-count=3 GPUs; request a multiple of 3 "
                                            r"\(e.g. 1002\)"):
        contract.split_even(1000, 3, contract.RESOURCE, "pod ns/p container c")


def test_closeness_orders_nvlink_then_switch_then_numa() -> None:
    g = [Gpu(f"G{i}", i, "Sim", 1024, i // 4, True, nvlink=(i ^ 1,), pcie=f"sw{i // 2}") for i in range(8)]
    g[2] = g[2]._replace(pcie="sw0")  # shares GPU 0's switch, no NVLink to it
    assert [contract.closeness(g[0], g[j]) for j in (1, 2, 3, 4)] == [0, 1, 2, 3]
    assert contract.set_distance([g[0], g[1]]) == 0 < contract.set_distance([g[0], g[2]])
    assert contract.set_distance([g[0], g[1], g[4], g[5]]) == 0 + 3 + 3 + 3 + 3 + 0


# ------------------------------------------------------------------------------------------ agent and extender agree

def _annotations(gpu: str, mem: str, at: str) -> dict[str, str]:
    return {ANN_GPU_UUID: gpu, ANN_GPU_MEM: mem, ANN_ASSUMED_AT: at}


def _extender_record(name: str, ann: dict[str, str]) -> Any:
    obj = pod_obj(name, annotations=ann)  # asks for nothing: only the reservation can make it a GPU pod
    obj["metadata"]["uid"] = f"uid-{name}"
    return pod_record(obj)


def test_agent_and_extender_both_refuse_an_empty_reservation() -> None:
    """`{}` reserves nothing on the GPU: the extender never writes it, and both binaries ignore it."""
    ann = _annotations("GPU-1", "{}", "2026-01-01T00:00:00Z")
    assert _extender_record("empty", ann) is None
    with pytest.raises(ContractError, match="gpu-mem-mib='{}'"):
        parse_reservation(PodInfo("u", "ns", "empty", "Pending", ann))
    good = _annotations("GPU-1", '{"main": 4}', "2026-01-01T00:00:00Z")
    assert _extender_record("good", good)[GPU] == "GPU-1"
    assert parse_reservation(PodInfo("u", "ns", "good", "Pending", good)) is not None


@pytest.mark.parametrize(("older", "newer"), [
    ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5Z"),  # as strings, ".5Z" < "Z"
    ("2026-01-01T01:00:00+02:00", "2026-01-01T00:00:00Z"),  # 23:00 the day before
    ("2026-01-01t00:00:00z", "2026-01-01T00:00:01Z"),  # RFC 3339 allows lowercase
])
def test_agent_and_extender_order_reservations_by_time(older: str, newer: str) -> None:
    """The agent hands a size to the oldest reservation first; it must be the one the extender thinks is
    oldest, whatever the spelling of the time."""
    old_ann, new_ann = _annotations("GPU-old", '{"main": 4}', older), _annotations("GPU-new", '{"main": 4}', newer)
    assert _extender_record("old", old_ann)[ASSUMED_AT] < _extender_record("new", new_ann)[ASSUMED_AT]
    old = parse_reservation(PodInfo("u-old", "ns", "z-old", "Pending", old_ann))
    new = parse_reservation(PodInfo("u-new", "ns", "a-new", "Pending", new_ann))
    assert old is not None and new is not None
    match = match_reservation([new, old], 4, 1, set())
    assert match is not None and match[0].gpu_uuid == "GPU-old"


# ------------------------------------------------------------------------------------------ one kube-config order

def test_both_binaries_find_the_api_in_one_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--kubeconfig, then in-cluster, then ~/.kube/config, then none (the agent runs standalone then, the
    extender refuses to start): the same for both, through the real kubernetes client."""
    from kubernetes import client

    from memslice.errors import ConfigError
    from memslice.scheduler_extender.cli import load_api_client as extender_api

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api, why = load_api_client(None)
    assert api is None and "~/.kube/config" in why and "KUBERNETES_SERVICE_HOST" in why
    with pytest.raises(ConfigError, match="no kubeconfig"):
        extender_api(None)
    kube = KubeApiStandin().start()
    try:
        (tmp_path / ".kube").mkdir()
        kube.kubeconfig(str(tmp_path / ".kube" / "config"))
        api, how = load_api_client(None)
        assert api is not None and how == f"kubeconfig {tmp_path}/.kube/config"
        for found in (api, extender_api(None)):
            assert client.CoreV1Api(found).list_node().items == []
        assert extender_api(None).configuration.connection_pool_maxsize == 64
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # in a pod, the service account wins...
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
        with pytest.raises(Exception, match="token"):  # ... and a pod without its token is an error, not a fallback
            load_api_client(None)
        api, how = load_api_client(str(tmp_path / ".kube" / "config"))  # an explicit file always wins
        assert api is not None and how.startswith("kubeconfig ")
    finally:
        kube.stop()


def test_no_api_is_decided_without_importing_the_kubernetes_client(tmp_path: Path) -> None:
    """A standalone agent (no kubeconfig, not in a pod, no ~/.kube/config) learns that it has no API without
    importing the kubernetes client, whose import costs each start about half a CPU-second; a named kubeconfig
    that is missing is still refused by name, first. In a fresh interpreter: this one has imported it."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    code = ("import sys\n"
            "from memslice.errors import ConfigError\n"
            "from memslice.kube.config import load_api_client\n"
            "api, why = load_api_client(None)\n"
            "try:\n"
            "    load_api_client(sys.argv[1])\n"
            "except ConfigError as exc:\n"
            "    why += ' | ' + str(exc)\n"
            "print(api is None, sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'), why)\n")
    missing = tmp_path / "missing.kubeconfig"
    out = subprocess.run([sys.executable, "-c", code, str(missing)], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.startswith("True [] no kubeconfig"), out
    assert f"the kubeconfig {missing} (--kubeconfig or KUBECONFIG) is not a file" in out


# ------------------------------------------------------------------------------------------ DRA driver config

configs = st.builds(contract.GpuMemConfig, limit_mib=st.none() | st.integers(1, contract.MAX_MIB),
                    idle_release=st.booleans(),
                    spill=st.none() | st.just(contract.NO_SPILL_CAP)
                    | st.integers(1, contract.MAX_MIB).map(lambda m: m * contract.MIB),
                    compute_limit=st.none() | st.integers(1, 100))


@settings(deadline=None)  # the first parse imports kubernetes.utils (seconds)
@given(configs)
def test_gpu_mem_config_format_then_parse_is_the_identity(cfg: contract.GpuMemConfig) -> None:
    assert contract.GpuMemConfig.parse(cfg.format(), "claim") == cfg
    # and through the wire: the parameters as the API server stores and returns them
    assert contract.GpuMemConfig.parse(orjson.loads(orjson.dumps(cfg.format())), "claim") == cfg


def test_gpu_mem_config_reads_the_documented_form() -> None:
    doc = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig", "limit": "6Gi", "idleRelease": True}
    assert contract.GpuMemConfig.parse(doc, "c") == contract.GpuMemConfig(limit_mib=6144, idle_release=True)
    assert contract.GpuMemConfig.parse({**doc, "limit": "1.5Gi"}, "c").limit_mib == 1536
    assert contract.GpuMemConfig.parse({**doc, "limit": "6442450944"}, "c").limit_mib == 6144
    assert contract.GpuMemConfig.parse(doc | {"limit": None}, "c").limit_mib is None
    # issue 36.9: oversubscription, as the pod annotation of extender mode says it
    assert contract.GpuMemConfig.parse({**doc, "oversubscribe": "8Gi"}, "c").spill == 8 << 30
    assert contract.GpuMemConfig.parse({**doc, "oversubscribe": True}, "c").spill == contract.NO_SPILL_CAP
    assert contract.GpuMemConfig.parse({**doc, "oversubscribe": False}, "c").spill is None
    assert contract.GpuMemConfig.parse(doc, "c").spill is None


KIND = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig"}
BAD_CONFIGS = {
    "not an object": (["limit", "6Gi"], "not an object"),
    "another kind": ({**KIND, "kind": "GpuConfig"}, "kind 'GpuConfig'; use apiVersion memslice.io/v1alpha1, kind "
                                                   "GpuMemConfig"),
    "unknown key": ({**KIND, "limits": "6Gi"}, "has no field(s) 'limits' (its fields: apiVersion, kind, limit, "
                                               "idleRelease, oversubscribe, computeLimit); remove them"),
    "nested elastic": ({**KIND, "elastic": {"limit": "6Gi"}}, "has no field(s) 'elastic'"),
    "unparsable": ({**KIND, "limit": "6 GiB"}, "limit='6 GiB' is not a quantity; use a quantity string"),
    "negative": ({**KIND, "limit": "-6Gi"}, "limit='-6Gi' is not a quantity (a limit cannot be negative)"),
    "a number": ({**KIND, "limit": 6144}, "limit=6144 is not a quantity string of at least 1Mi"),
    "zero": ({**KIND, "limit": "0"}, "limit='0' is under 1Mi"),
    "under a MiB": ({**KIND, "limit": "1Ki"}, "limit='1Ki' is under 1Mi"),
    "absurd": ({**KIND, "limit": "9Ei"}, "limit='9Ei' is absurdly large"),
    "hostile exponent": ({**KIND, "limit": "1e999999"}, "limit='1e999999' is not a quantity"),
    "1E99 (issue 35.9)": ({**KIND, "limit": "1E99"}, "limit='1E99' is absurdly large"),
    "64 nines (issue 35.9)": ({**KIND, "limit": "9" * 64}, "is absurdly large"),
    "oversubscribe text": ({**KIND, "oversubscribe": "yes"}, "oversubscribe='yes' is not true, false, or a quantity"),
    "oversubscribe number": ({**KIND, "oversubscribe": 8}, "oversubscribe=8 is not true, false, or a quantity"),
    "oversubscribe 1E99": ({**KIND, "oversubscribe": "1E99"}, "oversubscribe='1E99' is absurdly large"),
    "oversubscribe zero": ({**KIND, "oversubscribe": "0"}, "oversubscribe='0' is under 1Mi"),
    "idleRelease text": ({**KIND, "limit": "6Gi", "idleRelease": "yes"}, "idleRelease='yes' is not true or false"),
    "oversized blob": ({**KIND, "limit": "6Gi", "x": "y" * 5000}, "over 4096 bytes of JSON"),
}


@pytest.mark.parametrize("what", list(BAD_CONFIGS))
def test_bad_gpu_mem_configs_are_refused_naming_the_value_and_the_fix(what: str) -> None:
    raw, words = BAD_CONFIGS[what]
    with pytest.raises(ContractError) as err:
        contract.GpuMemConfig.parse(raw, "claim team/nb")
    assert str(err.value).startswith("claim team/nb: ") and words in str(err.value), str(err.value)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(texts, kids, max_size=4),
                           max_leaves=20)


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from(["apiVersion", "kind", "limit", "idleRelease", "oversubscribe", "x"]) | texts,
                       json_values,
                       max_size=6).map(lambda d: {**KIND, **d}))
def test_hostile_gpu_mem_configs_raise_only_contract_errors(raw: dict[str, Any]) -> None:
    try:
        cfg = contract.GpuMemConfig.parse(raw, "c")
    except ContractError:
        return
    assert cfg.limit_mib is None or 0 < cfg.limit_mib <= contract.MAX_MIB


# ------------------------------------------------------------------------------------------ compute share

def test_compute_wire_format_and_names() -> None:
    assert contract.RESOURCE_COMPUTE == "memslice.io/gpu-compute"
    assert contract.ANN_GPU_COMPUTE_LIMIT == "memslice.io/gpu-compute-limit"
    assert contract.ANN_GPU_COMPUTE == "memslice.io/gpu-compute-pct"
    r = Reservation("GPU-1", (("a", 1), ("b", 2)), None,
                    (contract.ComputeShare("a", 30, 60), contract.ComputeShare("b", 20, None)))
    assert r.format()[contract.ANN_GPU_COMPUTE] == '{"a":[30,60],"b":[20,null]}'
    assert r.compute_of("a") == (("a", 30, 60)) and r.compute_of("c") is None
    assert contract.ANN_GPU_COMPUTE not in Reservation("GPU-1", (("a", 1),), None).format()
    cfg = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig", "computeLimit": 40}
    assert contract.GpuMemConfig.parse(cfg, "c").compute_limit == 40


@pytest.mark.parametrize(("raw", "named"), [
    ('{"a":[101,null]}', "memslice.io/gpu-compute=101 is not a percent"),
    ('{"a":[40,30]}', "gpu-compute-limit=30 is below the compute request of 40"),
    ('{"a":[0,0]}', "gpu-compute-limit=0 is not a percent"),
    ('{"a":[-1,null]}', "memslice.io/gpu-compute=-1"),
    ('{"a":[1.5,null]}', "is not a JSON object of 1 to"),
    ('{"a":[true,null]}', "is not a JSON object of 1 to"),
    ('{"a":30}', "is not a JSON object of 1 to"),
    ("{}", "is not a JSON object of 1 to"),
    ("x" * 70000, "is not a JSON object of 1 to"),
])
def test_hostile_compute_records_are_refused_by_name(raw: str, named: str) -> None:
    ann = {ANN_GPU_UUID: "GPU-1", ANN_GPU_MEM: '{"a":1}', contract.ANN_GPU_COMPUTE: raw}
    with pytest.raises(ContractError, match="pod ns/p: annotation memslice.io/gpu-compute-pct") as e:
        Reservation.parse(ann, "pod ns/p")
    assert named in str(e.value)


@pytest.mark.parametrize(("ann", "want"), [
    ({}, None), ({"memslice.io/gpu-compute-limit": "40"}, 40), ({"memslice.io/gpu-compute-limit": " 100 "}, 100),
    ({"memslice.io/gpu-compute-limit": "40", "memslice.io/gpu-compute-limit.c": "60"}, 60),
    ({"memslice.io/gpu-compute-limit.other": "60"}, None),
])
def test_compute_limit_annotation(ann: dict[str, str], want: int | None) -> None:
    assert contract.parse_compute_limit(ann, "c", "pod ns/p") == want


@pytest.mark.parametrize("bad", ["0", "101", "40%", "-5", "1e2", "", "９"])
def test_bad_compute_limit_annotation_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ContractError, match=r"memslice.io/gpu-compute-limit=.* is not a whole percent of one GPU "
                                            r"between 1 and 100"):
        contract.parse_compute_limit({"memslice.io/gpu-compute-limit": bad}, "c", "pod ns/p")


@pytest.mark.parametrize("bad", [0, 101, "40", 40.0, True])
def test_bad_dra_compute_limit_is_refused_by_name(bad: object) -> None:
    cfg = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig", "computeLimit": bad}
    with pytest.raises(ContractError, match="claim c: computeLimit=.* is not a whole percent of one GPU"):
        contract.GpuMemConfig.parse(cfg, "claim c")


@pytest.mark.parametrize("qty", ["4096", "4Ki", "1e3", "0", "4096.0", "-0", "3.5", "-4", "1Ei", "4 Gi", "x", "1e400"])
def test_the_agent_and_the_extender_read_a_containers_devices_alike(qty: str) -> None:
    """contract.container_devices is the one parse of a container's memslice.io/gpu-mem: the extender's pod_request
    and the agent's container_asks (which pod an Allocate can be for) agree on every figure, and both refuse the
    same bad ones (the agent by not knowing the pod: never a refusal of its own)."""
    from memslice.plugin.deviceplugin.inventory import container_asks
    from memslice.scheduler_extender.placement.resources import pod_request

    pod = pod_obj("p", {"main": qty})
    asks = container_asks(pod["spec"])
    try:
        request = pod_request(pod)
    except contract.RequestError:
        assert asks is None
        return
    devices = request.asks[0].devices if request is not None else 0
    assert asks == ((("main", devices),) if devices else ())

"""The allocation ledger: region IDs and reconciliation with the kubelet's record."""

from __future__ import annotations

from dataclasses import replace

from memslice.plugin.deviceplugin.reconcile import LiveContainer, reconcile, region_id_for
from memslice.plugin.ledger import REGION_ID, Allocation


def alloc(ids, created=0.0, uid="", pod=""):
    return Allocation(region_id=region_id_for(ids), gpu_index=0, gpu_uuid="GPU-a", device_ids=tuple(ids),
                      mib=len(ids), created_at=created, pod_uid=uid, pod=pod, namespace="ns" if pod else "")


def test_region_id_names_the_gpu_and_ignores_order():
    a = region_id_for(["g3-1", "g3-2"])
    assert a == region_id_for(["g3-2", "g3-1"]) and a.startswith("g3-") and REGION_ID.match(a)
    assert a != region_id_for(["g3-1", "g3-3"])


def test_a_spanning_containers_region_id_depends_on_no_order_of_its_gpus():
    """Allocate sees a spanning container's IDs in its reservation's GPU order, PodResources in a Go map's: both
    must name the same region, or reconciliation recovers a second entry and the GPUs' memory counts twice."""
    ids = ["g1-1", "g1-2", "g0-1", "g0-2"]
    assert region_id_for(ids) == region_id_for(list(reversed(ids))) == region_id_for(sorted(ids))
    assert region_id_for(ids).startswith("g0-")


def test_a_spanning_entry_is_matched_however_the_kubelet_orders_its_ids():
    """The ledger's entry (Allocate's order: GPU 1 first) and the kubelet's record (GPU 0 first) are one
    container: kept once, nothing recovered; an entry an earlier agent named after its first ID's GPU too."""
    ids = ("g1-1", "g1-2", "g0-1", "g0-2")
    mine = alloc(ids, created=0, uid="u1", pod="tp")
    old = replace(alloc(("g3-1", "g2-1"), created=0, uid="u2", pod="tq"), region_id="g3-" + region_id_for(
        ("g3-1", "g2-1")).partition("-")[2])
    live = [LiveContainer("ns", "tp", "c", ("g0-2", "g0-1", "g1-2", "g1-1")),
            LiveContainer("ns", "tq", "c", ("g2-1", "g3-1"))]
    r = reconcile({mine.region_id: mine, old.region_id: old}, live, set(), {}, {}, 4, 1000, 30)
    assert not r.recovered and not r.removed
    assert sorted(r.keep) == sorted([mine.region_id, old.region_id])


def test_kubelet_record_recovers_missing_entries_and_names_owners():
    known = alloc(["g0-1"], created=100)
    live = [LiveContainer("ns", "p1", "c1", ("g0-1",)), LiveContainer("ns", "p2", "c2", ("g0-5", "g0-6"))]
    r = reconcile({known.region_id: known}, live, set(), {("ns", "p2"): "uid2"}, {0: "GPU-a"}, 4, 200, 30)
    assert not r.removed
    assert r.keep[known.region_id].pod == "p1" and r.keep[known.region_id].container == "c1"
    (rec,) = r.recovered
    assert (rec.pod, rec.pod_uid, rec.mib, rec.gpu_uuid) == ("p2", "uid2", 8, "GPU-a")


def test_entries_the_kubelet_forgot_are_removed_after_the_grace_period():
    fresh, old = alloc(["g0-1"], created=95), alloc(["g0-2"], created=10)
    r = reconcile({fresh.region_id: fresh, old.region_id: old}, [], set(), {}, {}, 1, 100, 30)
    assert list(r.keep) == [fresh.region_id] and r.removed == [old]


def test_an_entry_of_a_running_pod_is_kept_while_a_restarted_kubelet_does_not_list_it_yet():
    """issue 37: the real kubelet, just restarted, answers PodResources without the running pods it has not
    admitted again; the pod watch still sees the pod on the node: its entry stays (else its memory is handed
    out twice); once the pod is gone, it goes at once."""
    a = alloc(["g0-1"], created=10, uid="u1", pod="p")
    r = reconcile({a.region_id: a}, [], set(), {}, {}, 1, 100, 30, frozenset({"u1"}))
    assert list(r.keep) == [a.region_id] and not r.removed
    assert reconcile({a.region_id: a}, [], {"u1"}, {}, {}, 1, 100, 30, frozenset()).removed == [a]


def test_known_gone_pod_is_removed_at_once():
    a = alloc(["g0-1"], created=99, uid="u1", pod="p")
    assert reconcile({a.region_id: a}, [], {"u1"}, {}, {}, 1, 100, 30).removed == [a]


def test_without_the_kubelet_record_only_gone_pods_are_removed():
    a, b = alloc(["g0-1"], uid="u1", pod="p"), alloc(["g0-2"], uid="u2", pod="q")
    r = reconcile({a.region_id: a, b.region_id: b}, None, {"u1"}, {}, {}, 1, 10**9, 30)
    assert r.removed == [a] and list(r.keep) == [b.region_id]


def test_ids_this_agent_never_issues_in_the_kubelet_record_are_skipped_not_fatal():
    a = alloc(["g0-1"], created=100)
    live = [LiveContainer("ns", "odd", "c", ("nvidia0",)), LiveContainer("ns", "alias", "c", ("g0-01",)),
            LiveContainer("ns", "p1", "c1", ("g0-1",))]
    r = reconcile({a.region_id: a}, live, set(), {}, {0: "GPU-a"}, 4, 200, 30)
    assert list(r.keep) == [a.region_id] and r.keep[a.region_id].pod == "p1"
    assert not r.recovered and not r.removed


def test_an_entry_still_young_for_this_look_is_kept_and_silence_is_told_apart_from_a_gone_pod():
    """`young`: answered less than the grace before the look began (or still being answered): the kubelet may
    not have recorded it, however old `created_at` is. Of the removed, `unlisted` names those removed only on
    the record's silence (which the agent keeps while a live process uses them), not those whose pod is gone."""
    old, answered, gone = alloc(["g0-1"], created=10), alloc(["g0-2"], created=10), alloc(["g0-3"], 99, "u1", "p")
    ledger = {a.region_id: a for a in (old, answered, gone)}
    r = reconcile(ledger, [], {"u1"}, {}, {}, 1, 100, 30, frozenset(), frozenset({answered.region_id}))
    assert list(r.keep) == [answered.region_id]
    assert r.removed == [old, gone] and r.unlisted == {old.region_id}

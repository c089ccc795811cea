"""Device-plugin mode: which region directory belongs to which container, from the kubelet's record.

Pure: the region ID is derived from the device IDs (so the kubelet's own record, read back through the
PodResources API, tells the agent which region is whose), and `reconcile` decides what to keep.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..ledger import Allocation
from .devices import is_device_id, parse_device_id


def region_id_for(device_ids: Sequence[str]) -> str:
    """`g<gpu-index>-<12 hex>`: the lowest GPU the IDs name (a spanning container's IDs name several), then a
    digest of the sorted device IDs. The kubelet never hands the same device to two live containers, so the ID
    is unique on the node and stable across restarts; it depends on no order of the IDs (Allocate's follow the
    reservation's GPU order, PodResources' a Go map's: the first ID's GPU once named one container two ways)."""
    gpu = min(parse_device_id(i)[0] for i in device_ids)
    return f"g{gpu}-{_digest(device_ids)}"


def _digest(device_ids: Sequence[str]) -> str:
    return hashlib.sha256(",".join(sorted(device_ids)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class LiveContainer:
    """One container's devices of our resource, as the kubelet reports them (PodResources List)."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]


@dataclass
class ReconcileResult:
    keep: dict[str, Allocation] = field(default_factory=dict)
    removed: list[Allocation] = field(default_factory=list)
    # of `removed`, those removed only because the record lacks them (their pod is not known to be gone): the
    # caller keeps any of them a live process still uses (the record can lag: a restarted kubelet)
    unlisted: set[str] = field(default_factory=set)
    recovered: list[Allocation] = field(default_factory=list)


def reconcile(ledger: Mapping[str, Allocation], live: Sequence[LiveContainer] | None,
              gone_pod_uids: set[str], uid_of: Mapping[tuple[str, str], str],
              uuid_of: Mapping[int, str], unit_mib: int, now: float, grace_s: float,
              running_pod_uids: frozenset[str] = frozenset(), young: frozenset[str] = frozenset()
              ) -> ReconcileResult:
    """Decide the ledger after one look at the kubelet's record.

    - `live` None (PodResources unavailable): keep everything whose pod is not known to be gone.
    - Otherwise the kubelet's record wins: entries it lists are kept (and filled with their owner), entries
      it lists that the ledger lacks are recovered (agent restart), and other entries are removed once they
      are older than `grace_s` (the kubelet records an allocation just after Allocate returns) or at once
      when their pod is known to be gone. An entry whose pod the pod watch still sees on the node, not
      finished (`running_pod_uids`), is kept though the record lacks it: a restarted kubelet answers
      PodResources before it has admitted its running pods again (issue 37: seen with the real kubelet), and
      removing the entry then would hand its memory out twice. An entry in `young` is kept too: it was being
      answered, or answered less than `grace_s` before this look at the record began, so the kubelet may not
      have recorded it yet (`now` is when the look began; a look that started before an answer ended never
      removes it, however long the look took or the answer was written).
    """
    out = ReconcileResult()
    if live is None:
        for rid, a in ledger.items():
            if a.pod_uid and a.pod_uid in gone_pod_uids:
                out.removed.append(a)
            else:
                out.keep[rid] = a
        return out
    by_region = {}
    for lc in live:
        # IDs this agent did not issue (not canonical) name no region of ours: never let them stop the loop
        if lc.device_ids and all(map(is_device_id, lc.device_ids)):
            by_region[region_id_for(lc.device_ids)] = lc
    # a ledger entry is its container's by the digest of its devices: an earlier agent named a spanning
    # container's region after the GPU of its first ID in Allocate's order, which PodResources need not share
    by_digest = {rid.partition("-")[2]: rid for rid in by_region}
    for rid, a in ledger.items():
        live_rid = by_digest.get(rid.partition("-")[2])
        owner = by_region.pop(live_rid) if live_rid is not None else None
        if owner is not None:
            if a.pod != owner.pod or a.namespace != owner.namespace or a.container != owner.container:
                a = replace(a, namespace=owner.namespace, pod=owner.pod, container=owner.container,
                            pod_uid=uid_of.get((owner.namespace, owner.pod), a.pod_uid))
            out.keep[rid] = a
        elif a.pod_uid and a.pod_uid in gone_pod_uids:
            out.removed.append(a)
        elif now - a.created_at >= grace_s and a.pod_uid not in running_pod_uids and rid not in young:
            out.removed.append(a)
            out.unlisted.add(rid)
        else:
            out.keep[rid] = a
    for rid, lc in by_region.items():  # the containers no entry matched
        # the GPUs its IDs name (a pod spanning GPUs: each holds an even part; the record, when there was one,
        # had their device order: recovered without it, by index)
        gpus = sorted({parse_device_id(i)[0] for i in lc.device_ids})
        a = Allocation(region_id=rid, gpu_index=gpus[0], gpu_uuid=uuid_of.get(gpus[0], ""), device_ids=lc.device_ids,
                       mib=len(lc.device_ids) * unit_mib // len(gpus), created_at=now, namespace=lc.namespace,
                       pod=lc.pod, container=lc.container, pod_uid=uid_of.get((lc.namespace, lc.pod), ""),
                       more_gpus=tuple((g, uuid_of.get(g, "")) for g in gpus[1:]))
        out.keep[rid] = a
        out.recovered.append(a)
    return out

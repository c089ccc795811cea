"""DRA: from a ResourceClaim (as the API server returns it) to what this node must prepare. Pure.

Each allocation result of driver memslice.io on this node's pool is one *share* of one GPU: the device
(`gpu-<index>`), the `shareID` kube-scheduler gave it, and `consumedCapacity.memory` (the request rounded up by
the device's requestPolicy). ALL the shares of one claim become ONE region (decision, docs/architecture.md "DRA
contracts"): the claim is the unit of isolation, and a container mounts one quota region, which the shim holds
per device. On one GPU (two requests pinned by a matchAttribute constraint, firstAvailable subrequests) the
quota is their sum; on several GPUs (`count: N`, or requests kept apart by a distinctAttribute constraint)
the quota is each GPU's sum, which must be the same on every GPU (the limits file holds one quota per
visible GPU): a claim whose GPUs would hold different quotas is refused by name. Everything the claim says is
checked here; a refusal is a ClaimError whose message names the claim, the bad value and what to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memslice import contract, errors
from memslice.contract import quantity_bytes

from ..gpu.nvml import GpuInfo

DRIVER = "memslice.io"
CAPACITY = "memory"
COMPUTE_CAPACITY = "compute"  # percent of the GPU's time, 100 per device (plugin/dra/slices.py)
CONFIG_API_VERSION = contract.DRA_CONFIG_API_VERSION
CONFIG_KIND = contract.DRA_CONFIG_KIND
MiB = 1 << 20
_SHARE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
_DEVICE = re.compile(r"gpu-(0|[1-9]\d{0,3})\Z")  # device_name() exactly: no "gpu-0000"
MAX_DIGITS = contract.MAX_QUANTITY_DIGITS
MAX_CONSUMERS = 256  # status.reservedFor holds at most 256 entries (ResourceClaimReservedForMaxSize)
MAX_ELASTIC_PODS = 16  # consumer pods read for an elastic claim's priority (one GET each, before the lock)
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1  # spec.priority is an int32
__all__ = ["quantity_bytes"]  # re-exported: the parsing lives in the contract module (GpuMemConfig's limit too)


class ClaimError(errors.InputError):
    """A claim this node cannot prepare; the message is returned to the kubelet (and shown in pod events)."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class Share:
    """One allocation result of this driver: `mib` of GPU `gpu_index`, kept in region `region_id`."""

    request: str
    pool: str
    device: str
    share_id: str
    mib: int
    gpu_index: int
    gpu_uuid: str
    region_id: str
    compute: int = 0  # consumedCapacity.compute: percent of the GPU's time (0: none asked, or an older slice)


# The device taint the slice puts on an Unhealthy GPU (slices.py publishes it; resource.k8s.io/v1 DeviceTaint).
UNHEALTHY_TAINT = {"key": f"{DRIVER}/unhealthy", "value": "xid", "effect": "NoSchedule"}
MAX_TOLERATIONS = 16  # DeviceRequestAllocationResult.tolerations holds at most 16 (DeviceTolerationsMaxLength)


def tolerates(tolerations: object, taint: Mapping[str, str]) -> bool:
    """Whether an allocation result's `tolerations` (the request's, copied at allocation: DRADeviceTaints)
    tolerate `taint`, by the API's rule: the effect empty or equal; the key empty (with Exists) or equal;
    operator Exists, or Equal (the default) with an equal value. Malformed entries tolerate nothing."""
    for t in (tolerations if isinstance(tolerations, list) else [])[:MAX_TOLERATIONS]:
        if not isinstance(t, dict):
            continue
        op = t.get("operator") or "Equal"
        key, effect = t.get("key") or "", t.get("effect") or ""
        if effect and effect != taint["effect"]:
            continue
        if (not key and op != "Exists") or (key and key != taint["key"]):
            continue
        if op == "Exists" or (op == "Equal" and (t.get("value") or "") == taint["value"]):
            return True
    return False


def base_request(name: str) -> str:
    """The request a container names for result request `name`: "gpu/small" (a firstAvailable subrequest) is
    "gpu". The kubelet matches `resources.claims[].request` against NodePrepareResources' request_names
    exactly, and the kubeletplugin helper strips the same way (resourceclaim.BaseRequestRef)."""
    return name.split("/", 1)[0]


def device_name(index: int) -> str:
    """The ResourceSlice device name of GPU `index` (a DNS label)."""
    return f"gpu-{index}"


def gpu_index_of(device: str) -> int | None:
    m = _DEVICE.match(device)
    return int(m.group(1)) if m else None


def region_id_for_share(gpu_index: int, claim_uid: str, request: str, share_id: str) -> str:
    """`g<gpu>-<12 hex>` (the device plugin's region ID form, so RegionStore handles both): stable for the
    same share, so a repeated NodePrepareResources finds the same region."""
    digest = hashlib.sha256(f"{claim_uid}/{request}/{share_id}".encode()).hexdigest()[:12]
    return f"g{gpu_index}-{digest}"


def mib_floor(raw: object) -> int:
    """Whole MiB in a quantity (rounded down); ValueError for a non-quantity."""
    return contract.quantity_mib(raw)


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _our_requests(claim: Mapping[str, Any]) -> list[str]:
    """The request names (as allocated: "gpu" or the chosen subrequest "gpu/small") of this driver's results."""
    results = _get(claim, "status", "allocation", "devices", "results")
    return [r["request"] for r in (results if isinstance(results, list) else [])
            if isinstance(r, dict) and r.get("driver") == DRIVER and isinstance(r.get("request"), str)]


def config_scope(requests: object, ours: list[str]) -> list[str] | None:
    """Which of our results (`ours`, request names as allocated) a config entry with `requests` applies to: all
    of them when it names none (the API's rule), else those it names, by request ("gpu" covers its subrequests
    "gpu/small") or by subrequest. None: `requests` is malformed."""
    if requests is None or requests == []:
        return list(ours)
    if not isinstance(requests, list) or not all(isinstance(n, str) for n in requests):
        return None
    named = set(requests)
    return [r for r in ours if r in named or base_request(r) in named]


def claim_config(claim: Mapping[str, Any], ref: ClaimRef) -> contract.GpuMemConfig:
    """The driver config (contract.GpuMemConfig: the elastic limit) of the allocation's opaque config entries
    for this driver (class entries first, then the claim's, as status.allocation.devices.config lists them;
    later fields win). An entry scoped to requests (`requests: [...]`) applies only when it names this driver's
    requests of the claim: one naming only other requests (another driver's, a subrequest not chosen) is
    skipped; one naming some of them but not all is refused (a limit is of the claim's whole memory on its GPU,
    which all its requests share). Every applicable entry is checked on its own, so a bad one is named even
    when a later one would override it; ClaimError names the claim, the field, its value and the fix."""
    merged: dict[str, Any] = {}
    entries = _get(claim, "status", "allocation", "devices", "config") or []
    if not isinstance(entries, list):
        raise ClaimError(f"{ref}: status.allocation.devices.config is not a list")
    ours = _our_requests(claim)
    for i, entry in enumerate(entries):
        opaque = _get(entry, "opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER:
            continue
        params = opaque.get("parameters")
        source = _get(entry, "source")
        where = f"{ref}: opaque config {i} for {DRIVER} (from {source if isinstance(source, str) else 'claim'})"
        requests = _get(entry, "requests")
        scope = config_scope(requests, ours)
        if scope is None:
            raise ClaimError(f"{where}: requests={str(requests)[:80]} is not a list of request names")
        if not scope:
            continue  # for requests this driver was not allocated: not ours to apply
        if len(scope) < len(ours):
            missing = sorted({base_request(r) for r in ours if r not in scope})
            raise ClaimError(f"{where}: applies to request(s) {', '.join(sorted(set(map(base_request, scope))))} "
                             f"but not {', '.join(missing)}, which share its quota on the GPU ({CONFIG_KIND} "
                             f"limits the claim's whole memory there); list every request of the claim in "
                             f"requests, or remove requests")
        try:
            contract.GpuMemConfig.parse(params, where)
        except errors.ContractError as exc:
            raise ClaimError(str(exc)) from None
        assert isinstance(params, dict)
        merged.update(params)
    if not merged:
        return contract.GpuMemConfig()
    try:
        return contract.GpuMemConfig.parse(merged, f"{ref}: opaque config for {DRIVER}")
    except errors.ContractError as exc:  # each entry parsed: only their merge's size can be refused here
        raise ClaimError(str(exc)) from None


@dataclass(frozen=True)
class Elastic:
    """A claim's elastic memory on its GPU: the limit above its request (the sum of its shares), the idle-release
    opt-in, the consumer pods' PriorityClass value and the board slot the agent assigned (-1: none yet)."""

    limit_mib: int
    idle_release: bool = False
    priority: int = 0
    slot: int = -1


def elastic_for(claim: Mapping[str, Any], ref: ClaimRef, g: Grant, capacity_mib: Mapping[int, int],
                cfg: contract.GpuMemConfig | None = None) -> Elastic | None:
    """The claim's elastic memory (None: a plain quota of its request) from its GpuMemConfig (`cfg`, read from
    the claim when not given), checked against its request and its GPUs (the limit is per GPU, as the quota);
    ClaimError naming both values and the fix."""
    cfg = claim_config(claim, ref) if cfg is None else cfg
    if cfg.limit_mib is None or cfg.limit_mib == g.mib:
        if cfg.idle_release:
            raise ClaimError(f"{ref}: {CONFIG_KIND} idleRelease: true without a limit above the claim's request "
                             f"({g.mib} MiB) has no effect (a request stays in GPU memory unless it is elastic); "
                             f"add limit: \"<more than {g.mib}Mi>\" or remove idleRelease")
        return None
    small = min(g.devices, key=lambda d: capacity_mib.get(d.gpu_index, 0))
    cap = capacity_mib.get(small.gpu_index, 0)
    if cfg.limit_mib < g.mib:
        raise ClaimError(f"{ref}: {CONFIG_KIND} limit {cfg.limit_mib}Mi is below the claim's request of {g.mib}Mi "
                         f"(capacity.requests.memory, as allocated on {g.device}); set limit to at least "
                         f"\"{g.mib}Mi\", or remove it (the limit is then the request)")
    if cfg.limit_mib > cap:
        raise ClaimError(f"{ref}: {CONFIG_KIND} limit {cfg.limit_mib}Mi is above the {cap}Mi of {small.device} "
                         f"({small.gpu_uuid}), the most it can ever hold; set limit to at most \"{cap}Mi\"")
    return Elastic(limit_mib=cfg.limit_mib, idle_release=cfg.idle_release)


@dataclass(frozen=True)
class Compute:
    """A claim's compute share on its GPU: the request (its shares' consumedCapacity.compute, summed),
    the GpuMemConfig computeLimit (None: no cap) and the slot provisioned in the GPU's roster (-1: none yet)."""

    request: int
    limit: int | None = None
    slot: int = -1
    priority: int = 0  # the consumer pods' PriorityClass value (the lowest, as for an elastic claim)


def compute_for(claim: Mapping[str, Any], ref: ClaimRef, g: Grant, cfg: contract.GpuMemConfig | None = None
                ) -> Compute | None:
    """The claim's compute share on each of its GPUs (None: neither a request nor a computeLimit), checked: a
    request over 100 and a computeLimit below the request are refused by name (ClaimError)."""
    cfg = claim_config(claim, ref) if cfg is None else cfg
    if not g.compute and cfg.compute_limit is None:
        return None
    if g.compute > 100:
        raise ClaimError(f"{ref}: its requests consume {g.compute}% compute (capacity.requests.{COMPUTE_CAPACITY}) "
                         f"of {g.device}: a share is at most 100% of one GPU; ask for less")
    if cfg.compute_limit is not None and cfg.compute_limit < g.compute:
        raise ClaimError(f"{ref}: {CONFIG_KIND} computeLimit {cfg.compute_limit} is below the claim's compute "
                         f"request of {g.compute} (capacity.requests.{COMPUTE_CAPACITY}); set computeLimit to at "
                         f"least {g.compute}, or remove it")
    return Compute(request=g.compute, limit=cfg.compute_limit)


def asks_compute(claim: Mapping[str, Any]) -> bool:
    """Does an allocation result of this driver consume compute (anything but absent or "0")? (Bounded: the
    API server bounds the results; the value is only compared.)"""
    results = _get(claim, "status", "allocation", "devices", "results")
    return isinstance(results, list) and any(
        _get(r, "consumedCapacity", COMPUTE_CAPACITY) not in (None, "0") for r in results
        if isinstance(r, dict) and r.get("driver") == DRIVER)


def _compute_pct(raw: object, where: str, device: str) -> int:
    """consumedCapacity.compute as a whole percent 0..100 (absent: 0); ClaimError otherwise."""
    if raw is None:
        return 0
    try:
        value = quantity_bytes(raw)
    except ValueError:
        value = None
    if value is None or value != value.to_integral_value() or not 0 <= value <= 100:
        raise ClaimError(f"{where}: consumedCapacity.{COMPUTE_CAPACITY} {str(raw)[:32]!r} is not a whole percent "
                         f"0..100 of {device}; the allocation is inconsistent with the ResourceSlice: delete the "
                         f"pod and its claim")
    return int(value)


def consumer_pods(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, uid) of the pods the claim is reserved for (status.reservedFor, core group, at most
    MAX_CONSUMERS); other consumers and malformed entries are skipped."""
    out = []
    reserved = _get(claim, "status", "reservedFor")
    for r in (reserved if isinstance(reserved, list) else [])[:MAX_CONSUMERS]:
        if (isinstance(r, dict) and r.get("resource") == "pods" and r.get("apiGroup", "") in ("", None)
                and isinstance(r.get("name"), str) and isinstance(r.get("uid"), str)):
            out.append((r["name"], r["uid"]))
    return out


def pod_priority(pod: object, uid: str) -> int | None:
    """A pod's spec.priority (the PriorityClass value admission resolved; 0 when absent), clamped to int32;
    None when `pod` is not the pod with this uid (deleted, or re-created under the name)."""
    if _get(pod, "metadata", "uid") != uid:
        return None
    p = _get(pod, "spec", "priority")
    if not isinstance(p, int) or isinstance(p, bool):
        return 0
    return max(PRIORITY_MIN, min(p, PRIORITY_MAX))


def consumers_priority(ref: ClaimRef, consumers: list[tuple[str, str]], priorities: list[int | None]) -> int:
    """The priority an elastic claim's memory gets: the LOWEST of its consumer pods' (no pod gains priority by
    sharing a claim with a higher one); 0 when the claim names no pod. ClaimError when it names pods but none is
    there any more (the kubelet retries; the pod is being deleted)."""
    found = [p for p in priorities if p is not None]
    if len(consumers) > MAX_ELASTIC_PODS:
        raise ClaimError(f"{ref} is elastic and reserved for {len(consumers)} pods: the agent reads at most "
                         f"{MAX_ELASTIC_PODS} for the claim's priority; give each pod its own claim (a "
                         f"ResourceClaimTemplate), or remove the GpuMemConfig limit")
    if consumers and not found:
        names = ", ".join(n for n, _ in consumers[:3])
        raise ClaimError(f"{ref} is reserved for pod(s) {names} in {ref.namespace}, but none exists with its uid: "
                         f"the pod was deleted; nothing was prepared")
    return min(found, default=0)


def shares_for(claim: Mapping[str, Any], ref: ClaimRef, pool: str, gpus: Mapping[int, GpuInfo],
               capacity_mib: Mapping[int, int], healthy: Mapping[str, bool]) -> list[Share]:
    """The shares of `claim` this node prepares; ClaimError when the claim is not one this node can serve.

    `pool` is this node's pool name, `capacity_mib` the published memory capacity per GPU index."""
    meta = claim.get("metadata") if isinstance(claim, Mapping) else None
    uid = _get(meta, "uid")
    if uid != ref.uid:
        raise ClaimError(f"{ref}: the API server has uid {uid!r} under that name: the claim was deleted (and "
                         f"perhaps re-created); the pod must be re-created with its new claim")
    results = _get(claim, "status", "allocation", "devices", "results")
    if not isinstance(results, list):
        raise ClaimError(f"{ref} is not allocated (no status.allocation.devices.results); kube-scheduler "
                         f"allocates it before the pod is bound")
    ours = [r for r in results if isinstance(r, dict) and r.get("driver") == DRIVER]
    if not ours:
        drivers = sorted({str(r.get("driver")) for r in results if isinstance(r, dict)})
        raise ClaimError(f"{ref} has no allocation result for driver {DRIVER} (results are for: "
                         f"{', '.join(drivers) or 'none'}); the kubelet should not have asked this driver")
    claim_config(claim, ref)  # a bad driver config is refused before anything else
    out = []
    for r in ours:
        request = r.get("request")
        where = f"{ref}, request {request!r}"
        if r.get("pool") != pool:
            raise ClaimError(f"{where}: allocated from pool {r.get('pool')!r}, but this node's pool is "
                             f"{pool!r}: the claim belongs to another node")
        device = r.get("device")
        index = gpu_index_of(device) if isinstance(device, str) else None
        gpu = gpus.get(index) if index is not None else None
        if gpu is None:
            raise ClaimError(f"{where}: unknown device {device!r}; this node publishes "
                             f"{', '.join(device_name(i) for i in sorted(gpus))}")
        consumed = _get(r, "consumedCapacity", CAPACITY)
        if consumed is None:
            raise ClaimError(f"{where}: the result for {device} has no consumedCapacity.{CAPACITY}: the device "
                             f"was not allocated as a share (is the DRAConsumableCapacity feature gate on in "
                             f"kube-apiserver and kube-scheduler? Kubernetes >= 1.36 has it on by default)")
        try:
            mib = mib_floor(consumed)
        except ValueError as exc:
            raise ClaimError(f"{where}: consumedCapacity.{CAPACITY} {consumed!r}: {exc}") from None
        cap = capacity_mib.get(gpu.index, 0)
        if not 0 < mib <= cap:
            raise ClaimError(f"{where}: consumedCapacity.{CAPACITY} {consumed!r} ({mib} MiB) does not fit "
                             f"{device}, which has {cap} MiB; the allocation is inconsistent with the "
                             f"ResourceSlice: delete the pod and its claim")
        if r.get("adminAccess") is True:
            raise ClaimError(f"{where}: adminAccess to {device} is not served by {DRIVER}: admin access means "
                             f"monitoring a device without consuming it, and a memslice share is a quota of "
                             f"memory; use the GPU's own driver (e.g. gpu.nvidia.com) for monitoring access")
        share_id = r.get("shareID")
        if not isinstance(share_id, str) or not _SHARE_ID.match(share_id):
            raise ClaimError(f"{where}: shareID {share_id!r} is missing or malformed; {device} is published "
                             f"with allowMultipleAllocations, so kube-scheduler gives every share one")
        if not healthy.get(gpu.uuid, False) and not tolerates(r.get("tolerations"), UNHEALTHY_TAINT):
            raise ClaimError(f"{where}: {device} ({gpu.uuid}) is Unhealthy (critical Xid) and the claim does not "
                             f"tolerate its device taint {UNHEALTHY_TAINT['key']}:{UNHEALTHY_TAINT['effect']} (it "
                             f"was allocated before the taint): delete the pod so that its claim is allocated again "
                             f"on a healthy GPU; a request that tolerates the taint is prepared on it, with a "
                             f"Warning Event")
        req = request if isinstance(request, str) else ""
        pct = _compute_pct(_get(r, "consumedCapacity", COMPUTE_CAPACITY), where, str(device))
        out.append(Share(request=req, pool=pool, device=str(device), share_id=share_id, mib=mib,
                         gpu_index=gpu.index, gpu_uuid=gpu.uuid,
                         region_id=region_id_for_share(gpu.index, ref.uid, req, share_id), compute=pct))
    _check_even(ref, out)
    first = out[0].region_id  # all shares of the claim: one region (the first share's, stable)
    return [dataclasses.replace(s, region_id=first) for s in out]


def _check_even(ref: ClaimRef, shares: list[Share]) -> None:
    """ClaimError unless every GPU of the claim holds the same memory and compute (one quota per visible GPU
    in the limits file, one compute share) and the claim spans at most contract.MAX_GPUS_PER_POD GPUs."""
    mib: dict[str, int] = {}
    pct: dict[str, int] = {}
    for s in shares:
        mib[s.device] = mib.get(s.device, 0) + s.mib
        pct[s.device] = pct.get(s.device, 0) + s.compute
    if len(mib) > contract.MAX_GPUS_PER_POD:
        raise ClaimError(f"{ref} has shares on {len(mib)} GPUs: the shim holds a quota on at most "
                         f"{contract.MAX_GPUS_PER_POD} devices per container; ask for fewer")
    for what, per, unit in (("memory", mib, " MiB"), ("compute", pct, "%")):
        if len(set(per.values())) > 1:
            figures = ", ".join(f"{d} {v}{unit}" for d, v in per.items())
            raise ClaimError(f"{ref} holds different {what} on its GPUs ({figures}): a claim on several GPUs "
                             f"gets ONE quota per GPU, the same on each; give its requests the same "
                             f"capacity.requests.{what}, keep them apart with constraints: [{{distinctAttribute: "
                             f"{DRIVER}/uuid}}] (or pin them to one GPU with matchAttribute), or use one claim per "
                             f"GPU")


@dataclass(frozen=True)
class GrantDevice:
    """One GPU of a prepared claim: its device, and the shares the claim holds there (the first names it)."""

    device: str
    pool: str
    gpu_index: int
    gpu_uuid: str
    share_ids: tuple[str, ...]


@dataclass(frozen=True)
class Grant:
    """What one region of a prepared claim holds: the claim's shares, summed per GPU (the same on each of its
    GPUs: `mib` and `compute` are per GPU), its GPUs in device order (the order of its allocation results)."""

    region_id: str
    devices: tuple[GrantDevice, ...]
    mib: int
    requests: tuple[str, ...]  # base request names (what containers name), sorted, without repeats
    share_ids: tuple[str, ...]
    compute: int = 0  # percent of each GPU's time, summed

    @property
    def device(self) -> str:
        return self.devices[0].device

    @property
    def gpu_index(self) -> int:
        return self.devices[0].gpu_index

    @property
    def gpu_uuid(self) -> str:
        return self.devices[0].gpu_uuid

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.gpu_uuid for d in self.devices)


def grants(shares: Iterable[Share]) -> list[Grant]:
    """Shares grouped by region (in first-seen order), then by GPU; memory and compute summed per GPU (a claim
    has one region, shares_for checked that each GPU holds the same; the first GPU's sums are the grant's)."""
    groups: dict[str, list[Share]] = {}
    for s in shares:
        groups.setdefault(s.region_id, []).append(s)
    out = []
    for rid, group in groups.items():
        by_gpu: dict[str, list[Share]] = {}
        for s in group:
            by_gpu.setdefault(s.device, []).append(s)
        devices = tuple(GrantDevice(d, g[0].pool, g[0].gpu_index, g[0].gpu_uuid, tuple(s.share_id for s in g))
                        for d, g in by_gpu.items())
        first = by_gpu[devices[0].device]
        out.append(Grant(region_id=rid, devices=devices, mib=sum(s.mib for s in first),
                         requests=tuple(sorted({base_request(s.request) for s in group if s.request})),
                         share_ids=tuple(s.share_id for s in group), compute=sum(s.compute for s in first)))
    return out


def check_fits(new: Iterable[Share], prepared: Iterable[Share], capacity_mib: Mapping[int, int]) -> None:
    """Refuse shares that would take a GPU past its capacity together with the shares already prepared
    (kube-scheduler checks this; a second scheduler, or an allocation written by hand, may not have)."""
    used: dict[int, int] = {}
    compute: dict[int, int] = {}
    for s in prepared:
        used[s.gpu_index] = used.get(s.gpu_index, 0) + s.mib
        compute[s.gpu_index] = compute.get(s.gpu_index, 0) + s.compute
    for s in new:
        compute[s.gpu_index] = compute.get(s.gpu_index, 0) + s.compute
        if compute[s.gpu_index] > 100:
            raise ClaimError(f"share {s.share_id} of {s.device} ({s.compute}% compute) would prepare "
                             f"{compute[s.gpu_index]}% compute requests on one GPU, over 100%: the GPU is "
                             f"over-allocated (two schedulers, or an allocation not made by kube-scheduler)")
        used[s.gpu_index] = used.get(s.gpu_index, 0) + s.mib
        cap = capacity_mib.get(s.gpu_index, 0)
        if used[s.gpu_index] > cap:
            raise ClaimError(f"share {s.share_id} of {s.device} ({s.mib} MiB) would prepare "
                             f"{used[s.gpu_index]} MiB on a device of {cap} MiB: the GPU is over-allocated "
                             f"(two schedulers, or an allocation not made by kube-scheduler)")


def claim_event(ref: ClaimRef, reason: str, message: str, node: str, stamp: str) -> dict[str, Any]:
    """A Warning core/v1 Event on the claim (pure; `stamp` is the RFC 3339 time): `kubectl describe
    resourceclaim` and the consumer pods' describe (the kubelet links the claim) show it."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref.name[:200]}.", "namespace": ref.namespace},
            "involvedObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                               "namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
            "reason": reason, "message": message[:1024], "type": "Warning", "count": 1,
            "firstTimestamp": stamp, "lastTimestamp": stamp,
            "source": {"component": "memslice-node-agent", "host": node},
            "reportingComponent": "memslice.io/node-agent", "reportingInstance": node}


def unhealthy_warning(ref: ClaimRef, shares: Iterable[Share], healthy: Mapping[str, bool]) -> str | None:
    """What to say when a claim that tolerates the unhealthy taint is prepared on an Unhealthy GPU (None: all
    its GPUs are healthy). Decision: such a claim is prepared, as a pod tolerating a node taint
    runs; its owner asked for it (e.g. to debug the GPU), and refusing it would leave the pod in
    ContainerCreating for good."""
    sick = sorted({(s.device, s.gpu_uuid) for s in shares if not healthy.get(s.gpu_uuid, False)})
    if not sick:
        return None
    what = ", ".join(f"{d} ({u})" for d, u in sick)
    return (f"{ref} was prepared on {what}, which is Unhealthy (critical Xid) and tainted "
            f"{UNHEALTHY_TAINT['key']}:{UNHEALTHY_TAINT['effect']}, because its request tolerates that taint; "
            f"CUDA calls may fail on it. Remove the toleration to be allocated healthy GPUs only")


MAX_OTHER_STATUSES = 128  # other drivers' status.devices entries kept as they are (the API allows one per result)


def device_statuses(claim: Mapping[str, Any], shares: Iterable[Share], elastic: Elastic | None,
                    spill: int | None, stamp: str, by_region: Mapping[str, Grant] | None = None
                    ) -> list[dict[str, Any]]:
    """The claim's status.devices (resource.k8s.io/v1 AllocatedDeviceStatus) with this driver's entries
    replaced by one per prepared share: its driver/pool/device/shareID (the key the API server
    matches against the allocation results), a Ready condition, and in `data` what the node enforces for the
    claim on that GPU: the GPU's UUID, the quota (the claim's request there, all its shares summed), the
    limit, the elastic settings and oversubscription (false, true: no cap, or the spill cap). Other drivers'
    entries are kept (at most MAX_OTHER_STATUSES). Pure."""
    current = _get(claim, "status", "devices")
    others = [d for d in (current if isinstance(current, list) else [])[:MAX_OTHER_STATUSES]
              if isinstance(d, dict) and d.get("driver") != DRIVER]
    shares = list(shares)
    by_region = by_region if by_region is not None else {g.region_id: g for g in grants(shares)}
    out = []
    for s in shares:
        g = by_region[s.region_id]
        limit = elastic.limit_mib if elastic is not None else g.mib
        data: dict[str, Any] = {"gpuUUID": s.gpu_uuid, "quota": f"{g.mib}Mi", "limit": f"{limit}Mi",
                                "elastic": elastic is not None}
        if elastic is not None:
            data.update(idleRelease=elastic.idle_release, priority=elastic.priority)
        data["oversubscribe"] = spill is not None and (spill < 0 or f"{spill // MiB}Mi")
        out.append({"driver": DRIVER, "pool": s.pool, "device": s.device, "shareID": s.share_id,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                                    "message": f"{g.mib} MiB of GPU memory enforced"
                                               + (f", elastic up to {limit} MiB" if elastic else ""),
                                    "lastTransitionTime": stamp}],
                    "data": data})
    return others + out

"""Pure allocation decisions: which GPU a container's slice comes from, and whether a request is valid.

No I/O here. Inputs are plain values (the IDs the kubelet sent, the GPUs, the reservations the extender
wrote on pods), outputs are dataclasses or an AllocationError whose message a person can act on.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from memslice import contract, errors
from memslice.contract import RESOURCE as RESOURCE_NAME
from memslice.contract import units_for
from memslice.elastic import ANN_LIMIT_RECORD, LimitAnnotationError, parse_limit_record, pod_limits

from ..gpu.nvml import GpuInfo
from .devices import (
    bounded_list,
    device_id,
    devices_per_gpu,
    is_device_id,
    parse_device_id,
    show_id,
)

__all__ = ["RESOURCE_NAME"]  # re-exported: registration and pod-resources name the resource through here


class AllocationError(errors.InputError):
    """A request the agent refuses; the message names the bad value and the fix."""


@dataclass(frozen=True)
class PodInfo:
    """What the agent keeps of a pod on its node (from the pod watch)."""

    uid: str
    namespace: str
    name: str
    phase: str
    annotations: Mapping[str, str]
    priority: int = 0  # spec.priority (the PriorityClass value admission resolved): elastic memory
    # each container's (init ones too) memslice.io/gpu-mem devices, as the kubelet asks Allocate for them (only
    # containers asking some); None: unknown (a figure the agent could not read, or a pod built without its spec)
    asks: tuple[tuple[str, int], ...] | None = None


@dataclass(frozen=True)
class ReservedPod:
    """The extender's decision for a pod (memslice.contract.Reservation) and the pod it is for."""

    pod_uid: str
    namespace: str
    name: str
    gpu_uuid: str
    containers: tuple[tuple[str, int], ...]
    assumed_at: datetime | None  # None: the annotation is absent (sorted as the oldest)
    limits: tuple[tuple[str, int], ...] = ()  # elastic memory: container -> limit MiB (above its request)
    spill: int | None = None  # oversubscription of the pod's containers (contract.parse_oversubscribe)
    priority: int = 0  # elastic memory: the pod's PriorityClass value
    idle_release: bool = False  # elastic memory: idle, the request may move too (contract.ANN_IDLE_RELEASE)
    compute: tuple[contract.ComputeShare, ...] = ()  # compute shares by container (contract.ANN_GPU_COMPUTE)

    def compute_of(self, container: str) -> contract.ComputeShare | None:
        """The container's compute share; None without one."""
        return next((c for c in self.compute if c.container == container), None)

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        """The reserved GPUs in device order (one unless the pod spans GPUs: contract.ANN_GPU_COUNT)."""
        return tuple(self.gpu_uuid.split(","))

    def limit_of(self, container: str, mib: int) -> int:
        """The container's limit MiB per GPU when it is above `mib` (the quota per GPU Allocate grants), else 0:
        not elastic. A pod spanning N GPUs states its limit as a total, like its request: each GPU gets 1/N."""
        lim = dict(self.limits).get(container, 0) // len(self.gpu_uuids)
        return lim if lim > mib else 0


_NEVER = datetime.min.replace(tzinfo=UTC)


def parse_reservation(pod: PodInfo) -> ReservedPod | None:
    """The pod's reservation, None when it has none; errors.ContractError naming the bad annotation."""
    r = contract.Reservation.parse(pod.annotations, f"pod {pod.namespace}/{pod.name}")
    if r is None:
        return None
    where = f"pod {pod.namespace}/{pod.name}"
    # The limits: the extender's record when it wrote one, else the users' annotation (an older extender)
    try:
        record = pod.annotations.get(ANN_LIMIT_RECORD)
        limits = (parse_limit_record(record) if record is not None
                  else pod_limits(dict(pod.annotations), dict(r.container_mib)))
    except LimitAnnotationError as exc:
        raise errors.ContractError(f"{where}: {exc}") from None
    spill = contract.parse_oversubscribe(pod.annotations, where)
    release = contract.parse_idle_release(pod.annotations, where)
    return ReservedPod(pod_uid=pod.uid, namespace=pod.namespace, name=pod.name, gpu_uuid=r.gpu_uuid,
                       containers=r.container_mib, assumed_at=r.assumed_at, limits=tuple(sorted(limits.items())),
                       spill=spill, priority=pod.priority, idle_release=release, compute=r.container_compute)


def group_by_gpu(ids: Iterable[str]) -> dict[int, list[int]]:
    """IDs -> {gpu index: sorted device numbers}; DeviceIdError on an ID memslice did not issue."""
    out: dict[int, list[int]] = {}
    for text in ids:
        gpu, n = parse_device_id(text)
        out.setdefault(gpu, []).append(n)
    for numbers in out.values():
        numbers.sort()
    return out


@dataclass(frozen=True)
class Preference:
    device_ids: tuple[str, ...]
    gpu_index: int | None
    reservation: ReservedPod | None
    container: str | None
    reason: str


def best_fit_gpu(free: Mapping[int, int], size: int) -> int | None:
    """The GPU with the fewest free units that still has `size` (bin-packing; ties to the lower index)."""
    fitting = [(count, gpu) for gpu, count in free.items() if count >= size]
    return min(fitting)[1] if fitting else None


class AvailableIds:
    """The available IDs of one GetPreferredAllocation request, indexed without a Python loop per ID.

    The kubelet sends every free ID of the node (up to ~144,000). Joining them once and letting the C regex
    engine validate and scan the text is ~5x faster than parsing each ID, and only the chosen GPU's numbers
    are ever converted to integers."""

    _ALL = re.compile(r"(?:g(?:0|[1-9][0-9]{0,3})-(?:0|[1-9][0-9]{0,8})\n)*")  # canonical, as in devices.py

    def __init__(self, ids: Sequence[str], gpus: Iterable[int]) -> None:
        self._text = "\n".join(ids) + "\n"
        if ids and (self._ALL.fullmatch(self._text) is None or self._text.count("\n") != len(ids)):
            for i in ids:
                parse_device_id(i)  # raises DeviceIdError naming the first bad ID
        # "g1-" cannot occur inside another ID ("g11-5" does not contain it): an exact count per GPU
        self.free = {g: self._text.count(f"g{g}-") for g in gpus}

    def lowest(self, gpu: int, size: int, must: Sequence[str] = ()) -> tuple[str, ...]:
        """`must`, then the lowest-numbered free IDs of `gpu`, `size` in all, none twice."""
        numbers = list(map(int, re.findall(rf"(?m)^g{gpu}-([0-9]+)$", self._text)))
        chosen = list(dict.fromkeys(must))
        want = max(size, 0) + len(chosen)
        _extend(chosen, gpu, size, heapq.nsmallest(want, numbers))
        if len(chosen) < size and len(numbers) > want:  # a list with repeats (never the kubelet's): all of it
            _extend(chosen, gpu, size, sorted(set(numbers)))
        return tuple(chosen)


def _extend(chosen: list[str], gpu: int, size: int, numbers: Iterable[int]) -> None:
    """Append IDs of `gpu` with these numbers to `chosen`, skipping those already in it, up to `size`."""
    taken = set(chosen)
    for n in numbers:
        if len(chosen) >= size:
            return
        did = device_id(gpu, n)
        if did not in taken:
            chosen.append(did)
            taken.add(did)


def match_reservation(reservations: Sequence[ReservedPod], size: int, unit_mib: int,
                      taken: set[tuple[str, str]]) -> tuple[ReservedPod, str] | None:
    """The oldest reservation with a container not yet allocated that asks for exactly `size` units."""
    for r in sorted(reservations, key=lambda r: (r.assumed_at or _NEVER, r.namespace, r.name)):
        for container, mib in r.containers:
            if (r.pod_uid, container) not in taken and units_for(mib, unit_mib) == size:
                return r, container
    return None


def split_units(size: int, count: int) -> list[int]:
    """`size` devices over `count` GPUs as evenly as whole devices allow: the first `size % count` get one
    more (pure). A pod spanning GPUs asks the kubelet for its total; each GPU gives its part."""
    return [size // count + (1 if i < size % count else 0) for i in range(count)]


def _spread(avail: AvailableIds, indices: Sequence[int], size: int, must: Sequence[str] = ()) -> tuple[str, ...]:
    """`size` IDs split evenly over the GPUs `indices` (in that order), `must` among them, lowest first."""
    by_gpu = group_by_gpu(must)
    out: list[str] = []
    for index, part in zip(indices, split_units(size, len(indices)), strict=True):
        out += avail.lowest(index, part, [device_id(index, n) for n in by_gpu.get(index, [])])
    return tuple(out)


def choose_preferred(available: Sequence[str], must_include: Sequence[str], size: int, unit_mib: int,
                     gpus: Mapping[int, GpuInfo], reservations: Sequence[ReservedPod],
                     taken: set[tuple[str, str]]) -> Preference:
    """All `size` devices from one GPU: the reserved one for the pod being admitted, else the best fit. A pod
    spanning N GPUs: its N reserved GPUs, `size` split evenly over them (each device ID names its
    GPU, so the kubelet's count per GPU stays what each GPU holds)."""
    avail = AvailableIds(available, gpus)
    if must_include:
        must_gpus = sorted(group_by_gpu(must_include))  # every ID checked, not only the first
        reason = "the GPU(s) of the devices the kubelet must include"
        return Preference(_spread(avail, must_gpus, size, must_include), must_gpus[0], None, None, reason)
    free = avail.free
    match = match_reservation(reservations, size, unit_mib, taken)
    reason = "no reservation for a container of this size: best fit"
    if match is not None:
        r, container = match
        index_of = {g.uuid: g.index for g in gpus.values()}
        indices = [index_of.get(u) for u in r.gpu_uuids]
        parts = split_units(size, len(indices))
        short = [(u, i) for u, i, part in zip(r.gpu_uuids, indices, parts, strict=True)
                 if i is None or free.get(i, 0) < part]
        if not short:
            chosen = [i for i in indices if i is not None]
            return Preference(_spread(avail, chosen, size), chosen[0], r, container,
                              f"reserved by the extender for {r.namespace}/{r.name} container {container}")
        u, index = short[0]
        where = "is not on this node" if index is None else f"has only {free.get(index, 0)} free units"
        reason = (f"GPU {u} reserved for {r.namespace}/{r.name} {where}, wanted {parts[0]}: "
                  f"best fit instead")
    best = best_fit_gpu(free, size)
    if best is None:
        return Preference((), None, None, None, f"no single GPU has {size} free units")
    return Preference(avail.lowest(best, size), best, None, None, reason)


class Spanning(NamedTuple):
    """A container of a pod spanning GPUs that a one-GPU Allocate could be for: the pod, the container, its GPU
    count, and the GPUs the extender reserved for it (() when it has no reservation)."""

    pod: PodInfo
    container: str
    gpus: int
    reserved: tuple[str, ...]


@dataclass(frozen=True)
class OneGpuCallers:
    """Who devices on one GPU, matched to no reservation, can be for: the pods spanning GPUs among them
    (`spanning`), and whether any other pod could be the caller (`other`: a one-GPU pod, reserved or not, one
    whose reservation is malformed, one whose sizes are unknown)."""

    spanning: tuple[Spanning, ...]
    other: bool

    @property
    def refused(self) -> Spanning | None:
        """The container the devices can only be for, when that is a pod spanning GPUs: the one case Allocate
        refuses. None whenever another pod could be the caller (a legitimate one is never refused)."""
        return self.spanning[0] if self.spanning and not self.other else None


def one_gpu_callers(pods: Iterable[PodInfo], size: int, taken: set[tuple[str, str]]) -> OneGpuCallers:
    """Which pods of the node a container given `size` devices of one GPU, with no reservation matched, can be
    (pure). Allocate carries no pod: the candidates are the containers not yet allocated (`taken`) asking
    exactly `size` devices, of pods not finished.

    A pod spanning GPUs gets them only through the extender's reservation (contract.ANN_GPU_UUID): bound without
    one (another scheduler, spec.nodeName by hand, the extender down), or with one whose GPUs this agent found
    short of free units (choose_preferred then falls back to best fit), its whole total would land on one GPU.
    A candidate counts as spanning only when its pod is Pending (being admitted) and has either no reservation
    annotation and a valid ANN_GPU_COUNT above 1, or a valid reservation on several GPUs."""
    spanning: list[Spanning] = []
    other = False
    for p in pods:
        if p.phase in contract.TERMINAL_PHASES:
            continue
        if p.asks is None:  # its sizes are unknown: it could be the caller
            other = True
            continue
        mine = [c for c, n in p.asks if n == size and (p.uid, c) not in taken]
        if not mine:
            continue
        try:
            r = parse_reservation(p)
            count = len(r.gpu_uuids) if r is not None else contract.parse_gpu_count(p.annotations, "")
        except errors.ContractError:
            count = 0  # malformed (logged by the agent, refused by the extender): never taken for spanning here
        if p.phase == "Pending" and count > 1:
            spanning.append(Spanning(p, mine[0], count, r.gpu_uuids if r is not None else ()))
        else:
            other = True
    spanning.sort(key=lambda s: (s.pod.namespace, s.pod.name, s.container))
    return OneGpuCallers(tuple(spanning), other)


def spanning_refusal(found: OneGpuCallers, size: int, unit_mib: int) -> str | None:
    """The message Allocate refuses devices of one GPU for a pod spanning GPUs with (the kubelet shows it on the
    pod as UnexpectedAdmissionError), naming the pod and the fix; None when it does not refuse (pure)."""
    s = found.refused
    if s is None:
        return None
    more = len(found.spanning) - 1
    also = f" ({more} more pod(s) like it ask for as many devices)" if more else ""
    head = (f"pod {s.pod.namespace}/{s.pod.name} container {s.container!r} asks for {size * unit_mib} MiB over "
            f"{s.gpus} GPUs")
    squeezed = f"refused rather than put all of it on one GPU, where the program would see 1 GPU, not {s.gpus}"
    if s.reserved:
        return (f"{head}, reserved on {', '.join(s.reserved)}, but this node's agent found a reserved GPU short of "
                f"free units (its GetPreferredAllocation log names it){also}; {squeezed}. Delete the pod so that the "
                f"memslice extender schedules it again")
    return (f"{head} ({contract.ANN_GPU_COUNT}={s.gpus}), but the memslice scheduler extender did not reserve its "
            f"GPUs (no {contract.ANN_GPU_UUID} annotation: another scheduler placed it, or spec.nodeName was set by "
            f"hand){also}; {squeezed}. Schedule it with the memslice extender (spec.schedulerName: "
            f"memslice-scheduler, deploy/base/scheduler) or drop {contract.ANN_GPU_COUNT}")


@dataclass(frozen=True)
class Target:
    """A validated Allocate request: the GPU (device 0), the IDs, the quota in MiB per GPU, and for a container
    spanning GPUs its other GPUs in device order."""

    gpu: GpuInfo
    device_ids: tuple[str, ...]
    mib: int
    more: tuple[GpuInfo, ...] = ()

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every GPU of the container, in device order."""
        return (self.gpu, *self.more)

    def ordered(self, uuids: Sequence[str]) -> Target:
        """The same GPUs in the order of `uuids` (a reservation's device order); unchanged when they differ."""
        by_uuid = {g.uuid: g for g in self.gpus}
        if sorted(by_uuid) != sorted(uuids):
            return self
        first, *rest = (by_uuid[u] for u in uuids)
        return Target(gpu=first, device_ids=self.device_ids, mib=self.mib, more=tuple(rest))


def spanning_owner(target: Target, reservations: Sequence[ReservedPod], unit_mib: int,
                   taken: set[tuple[str, str]]) -> tuple[ReservedPod, str] | None:
    """The one reservation (and container) a container's IDs spanning GPUs can be: a pod reserved on exactly
    those GPUs with a container not yet allocated asking for as many devices; None when none or several are
    (pure). Allocate uses it when the kubelet did not take the agent's preference for these IDs."""
    mine = {g.uuid for g in target.gpus}
    size = len(target.device_ids)
    found = [(r, c) for r in reservations if set(r.gpu_uuids) == mine
             for c, mib in r.containers if (r.pod_uid, c) not in taken and units_for(mib, unit_mib) == size]
    return found[0] if len(found) == 1 else None


def _bad_ids(ids: Sequence[str]) -> str | None:
    """A bounded message naming the first IDs memslice did not issue and how many there are, or None."""
    bad = [i for i in ids if not is_device_id(i)]
    if not bad:
        return None
    named = bounded_list([show_id(i) for i in bad[:3]], len(bad))
    what = (f"device ID {named} is not a memslice device ID" if len(bad) == 1 else
            f"{len(bad)} device IDs are not memslice device IDs: {named}")
    return f"{what} (expected g<gpu-index>-<n> with no leading zeros, e.g. g0-17)"


def _duplicates(ids: Sequence[str]) -> str | None:
    """A bounded message naming the first IDs listed more than once, or None. Linear in the IDs."""
    counts = Counter(ids)
    if len(counts) == len(ids):
        return None
    dup = [i for i, c in counts.items() if c > 1]
    named = bounded_list([show_id(i) for i in dup[:3]], len(dup))
    return f"{len(dup)} device ID(s) listed more than once: {named}"


def allocation_target(ids: Sequence[str], gpus: Mapping[int, GpuInfo], healthy: Mapping[str, bool],
                      unit_mib: int) -> Target:
    """Validate one container's IDs; AllocationError (naming the bad value and the fix) when refused."""
    if not ids:
        raise AllocationError(f"Allocate asked for no {RESOURCE_NAME} devices; a container gets memslice "
                              f"memory only with a {RESOURCE_NAME} limit of at least 1")
    bad = _bad_ids(ids)
    if bad is not None:
        raise AllocationError(f"{bad}; this node's agent issues only its own IDs. If --unit-mib or the GPUs "
                              f"changed, restart the kubelet's pods on this node")
    dup = _duplicates(ids)
    if dup is not None:
        raise AllocationError(f"Allocate {dup}; the kubelet never does this: is another client calling the "
                              f"plugin socket?")
    by_gpu = group_by_gpu(ids)
    for index, numbers in by_gpu.items():
        gpu = gpus.get(index)
        if gpu is None:
            raise AllocationError(
                f"device ID {device_id(index, numbers[0])} names GPU {index}, which this node does not "
                f"advertise (GPUs: {', '.join(str(i) for i in sorted(gpus)) or 'none'})")
        limit = devices_per_gpu(gpu.mem_mib, unit_mib)
        if numbers[-1] >= limit:
            raise AllocationError(
                f"device ID {device_id(index, numbers[-1])} is beyond GPU {index}'s {limit} devices at "
                f"--unit-mib {unit_mib}; was the unit changed while pods held devices?")
    counts = [len(n) for n in by_gpu.values()]
    if len(by_gpu) > 1 and max(counts) - min(counts) > 1:
        parts = ", ".join(f"GPU {g} ({len(n) * unit_mib} MiB)" for g, n in sorted(by_gpu.items()))
        raise AllocationError(
            f"the {len(ids)} {RESOURCE_NAME} devices span {parts}, unevenly; one container's memory comes from "
            f"one GPU, or evenly from the GPUs of a pod spanning GPUs ({contract.ANN_GPU_COUNT}). Schedule the "
            f"pod through the memslice scheduler extender (it reserves the GPUs), or ask for no more than the "
            f"largest free slice of one GPU")
    chosen = [gpus[i] for i in sorted(by_gpu)]
    for gpu in chosen:
        if not healthy.get(gpu.uuid, False):
            raise AllocationError(f"GPU {gpu.index} ({gpu.uuid}) is Unhealthy (critical Xid); the pod cannot use "
                                  f"it. Delete the pod so it is scheduled again")
    return Target(gpu=chosen[0], device_ids=tuple(ids), mib=len(ids) * unit_mib // len(chosen),
                  more=tuple(chosen[1:]))



def check_disjoint(targets: Sequence[Target]) -> None:
    """AllocationError when two containers of one Allocate share a device ID (one unit, two quotas)."""
    if len(targets) < 2:
        return
    seen: set[str] = set()
    shared: list[str] = []
    for t in targets:
        shared.extend(i for i in t.device_ids if i in seen)
        seen.update(t.device_ids)
    if shared:
        raise AllocationError(
            f"Allocate gave {len(shared)} device ID(s) to more than one container: "
            f"{bounded_list([show_id(i) for i in shared[:3]], len(shared))}; the kubelet never does this: is "
            f"another client calling the plugin socket?")

"""The agent <-> extender contract, written once (docs/architecture.md, "Contracts").

The node agent (plugin/) publishes a node's GPUs as node annotations; the scheduler extender
(scheduler_extender/) reads them, and records its placement as pod annotations that the agent reads back
when the kubelet allocates. Both binaries import the names, the typed values and their parse/format from
here, so the two sides cannot drift apart.

Every annotation value comes from the API server and may have been written by anyone with patch rights, so
`parse` is strict and bounded: sizes, types and counts are checked, and anything else is an
errors.ContractError whose message names the object, the annotation and what is wrong. `format` produces
exactly what `parse` accepts (tests/contract/test_contract.py checks the round trip).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any, Final, NamedTuple, TypeGuard

import orjson

from . import errors

# ------------------------------------------------------------------------------------------ names

RESOURCE: Final = "memslice.io/gpu-mem"  # extended resource; one device = unit-mib MiB of one GPU
# Compute share: one device = 1 percent of one GPU's time, 100 per GPU; a container's request of it is
# its guaranteed share under contention (a weight), on the GPU that holds its memory.
RESOURCE_COMPUTE: Final = "memslice.io/gpu-compute"

# node annotations, written by the node agent
ANN_GPUS: Final = "memslice.io/gpus"
ANN_UNIT_MIB: Final = "memslice.io/unit-mib"

# pod annotations, written by the extender at bind
ANN_GPU_UUID: Final = "memslice.io/gpu-uuid"
ANN_GPU_MEM: Final = "memslice.io/gpu-mem-mib"
ANN_ASSUMED_AT: Final = "memslice.io/assumed-at"
# compute shares at bind: a JSON object of container name to [request percent, limit percent or null], only
# for containers with a share (request > 0 or a limit); absent when none has one
ANN_GPU_COMPUTE: Final = "memslice.io/gpu-compute-pct"
RESERVATION_ANNOTATIONS: Final = (ANN_GPU_UUID, ANN_GPU_MEM, ANN_ASSUMED_AT)  # always written (compute: if any)

# pod annotation, set by users
ANN_POLICY: Final = "memslice.io/policy"
# Pods that span GPUs: "N" (1..MAX_GPUS_PER_POD, default 1) GPUs of one node. Each container's
# `memslice.io/gpu-mem` (and `memslice.io/gpu-compute`) request is its TOTAL over the N GPUs, split evenly: a
# total not divisible by N is refused by name. The bind record then lists N UUIDs (ANN_GPU_UUID, comma
# separated, in the order the container sees them as devices 0..N-1) and each GPU enforces total / N.
ANN_GPU_COUNT: Final = "memslice.io/gpu-count"
POLICIES: Final = ("binpack", "spread")
# Oversubscription (spilling past the quota to host memory): "true" (no cap beyond the cgroup margin), a size
# (the spill cap, e.g. "8GiB"), or "false"/absent (nothing spills). The node agent reads it from the pod whose
# reservation it matched and writes it into the container's read-only limits file, so a process cannot turn
# spilling on or raise its cap through its environment.
ANN_OVERSUBSCRIBE: Final = "memslice.io/oversubscribe"
# Elastic memory: "true" lets an idle container give up its request too (a notebook whose owner
# accepts a slower first touch); absent or "false", a request stays in GPU memory idle or not. The node agent
# writes it into the container's read-only limits file (idle_release=1).
ANN_IDLE_RELEASE: Final = "memslice.io/gpu-mem-idle-release"

# The compute limit (a cap in percent of one GPU, held even on an idle GPU), set by users: pod-wide, or
# ANN_GPU_COMPUTE_LIMIT + "." + container for that container (it wins). At least the container's request.
ANN_GPU_COMPUTE_LIMIT: Final = "memslice.io/gpu-compute-limit"

# pod phases after which a pod holds nothing
TERMINAL_PHASES: Final = ("Succeeded", "Failed")

# ------------------------------------------------------------------------------------------ units and bounds

MIB: Final = 1 << 20  # bytes; every memory figure of the contract is in MiB
MAX_MIB: Final = 1 << 30  # 1 PiB: above any GPU; a larger figure is a corrupt annotation
MAX_GPUS: Final = 1024  # per node
MAX_GPU_INDEX: Final = 9999  # device IDs are g<index>-<n> with at most 4 index digits (plugin/deviceplugin/devices.py)
MAX_UUID: Final = 128  # characters; NVML UUIDs are 40 ("GPU-" + 36), MIG ones about 45
MAX_MODEL: Final = 256  # characters
MAX_NUMA: Final = 1 << 16
MAX_CONTAINERS: Final = 256  # per reservation
MAX_CONTAINER_NAME: Final = 253  # characters (a DNS subdomain at most; container names are shorter)
MAX_GPUS_TEXT: Final = 256 << 10  # the API server's limit on all annotations of an object together
MAX_GPU_MEM_TEXT: Final = 64 << 10
MAX_UNIT_TEXT: Final = 32
MAX_TIME_TEXT: Final = 64
MAX_PERCENT: Final = 100  # a compute share is at most one whole GPU
MAX_GPUS_PER_POD: Final = 16  # the shim holds a quota on at most 16 devices (MS_MAX_DEVICES)
MAX_PCIE: Final = 64  # characters of a GPU's PCIe switch label


def units_for(mib: int, unit_mib: int) -> int:
    """Devices of `memslice.io/gpu-mem` that hold `mib` MiB: requests are whole devices, rounded up (the
    extender reserves `devices × unit-mib` MiB per container; the agent matches a kubelet request of
    `units_for(reserved MiB)` devices to it)."""
    return -(-mib // unit_mib)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(raw: object) -> str:
    """An annotation value as it may appear in a message: repr, at most 80 characters."""
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------------------------ inventory

class Gpu(NamedTuple):
    """One GPU of a node's inventory (an item of `memslice.io/gpus`). A named tuple, not a frozen dataclass:
    a restart builds one per GPU of the cluster, and a tuple is built in a third of the time."""

    uuid: str
    index: int  # type: ignore[assignment]  # the GPU's index; shadows tuple.index, never called on a Gpu
    model: str
    mem_mib: int  # what can be allocated (NVML's total less the driver's reserved memory): what is advertised
    numa: int | None  # None when the driver does not know the GPU's NUMA node
    healthy: bool
    nvml_total_mib: int | None = None  # shown beside memMiB: NVML's total (reserved memory included) and the
    reserved_mib: int | None = None    # driver's reserved memory; None when the agent could not read them
    nvlink: tuple[int, ...] = ()       # indices of the GPUs of this node it reaches by NVLink (sorted)
    pcie: str | None = None            # its PCIe switch: GPUs with the same label share one (NVML topology)


def closeness(a: Gpu, b: Gpu) -> int:
    """How far apart two GPUs of one node are, lower is closer: 0 NVLink, 1 the same PCIe switch, 2 the same
    NUMA node, 3 otherwise (across the host bridge or sockets). A pod spanning GPUs prefers a set whose pairs
    sum lowest (tensor-parallel traffic goes between every pair)."""
    if b.index in a.nvlink or a.index in b.nvlink:
        return 0
    if a.pcie is not None and a.pcie == b.pcie:
        return 1
    if a.numa is not None and a.numa == b.numa:
        return 2
    return 3


def set_distance(gpus: tuple[Gpu, ...] | list[Gpu]) -> int:
    """The sum of closeness over every pair of a set of GPUs (0 for one GPU)."""
    return sum(closeness(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:])


@dataclass(frozen=True, slots=True)
class Inventory:
    """A node's memslice GPUs as the node agent publishes them: `memslice.io/gpus` (a JSON list, by index)
    and `memslice.io/unit-mib` (MiB per device of `memslice.io/gpu-mem`)."""

    unit_mib: int
    gpus: tuple[Gpu, ...]

    def format(self) -> dict[str, str]:
        """The node annotations."""
        items = [{"uuid": g.uuid, "index": g.index, "model": g.model, "memMiB": g.mem_mib, "numa": g.numa,
                  "healthy": g.healthy, **_totals(g), **_topology(g)} for g in sorted(self.gpus, key=lambda g: g.index)]
        return {ANN_GPUS: orjson.dumps(items).decode(), ANN_UNIT_MIB: str(self.unit_mib)}

    @classmethod
    def parse(cls, node: str, annotations: Mapping[str, Any]) -> Inventory | None:
        """The inventory the node's annotations hold; None when it has no `memslice.io/gpus` (not a memslice
        node); ContractError when they are malformed."""
        raw = annotations.get(ANN_GPUS)
        if raw is None:
            return None
        where = f"node {node}: annotation {ANN_GPUS}"
        if not isinstance(raw, str) or len(raw) > MAX_GPUS_TEXT:
            raise errors.ContractError(f"{where} is not a JSON text of at most {MAX_GPUS_TEXT} bytes "
                                       f"({_short(raw)})")
        try:
            items = orjson.loads(raw)  # refuses NaN and integers beyond 64 bits
        except orjson.JSONDecodeError:
            raise errors.ContractError(f"{where} is not JSON ({_short(raw)})") from None
        if not isinstance(items, list) or len(items) > MAX_GPUS:
            raise errors.ContractError(f"{where} is not a JSON list of at most {MAX_GPUS} GPUs")
        gpus = tuple(sorted((_gpu(where, i, g) for i, g in enumerate(items)), key=_by_index))
        if len({g.uuid for g in gpus}) != len(gpus) or len({g.index for g in gpus}) != len(gpus):
            _once(where, "GPU", [g.uuid for g in gpus])
            _once(where, "index", [str(g.index) for g in gpus])
        return cls(unit_mib=_unit(node, annotations.get(ANN_UNIT_MIB, "1")), gpus=gpus)


def _totals(g: Gpu) -> dict[str, int]:
    """The figures beside memMiB in the annotation: NVML's total and the driver's reserved memory, when known."""
    out = {}
    if g.nvml_total_mib is not None:
        out["nvmlTotalMiB"] = g.nvml_total_mib
    if g.reserved_mib is not None:
        out["reservedMiB"] = g.reserved_mib
    return out


def _topology(g: Gpu) -> dict[str, object]:
    """The topology fields of the annotation, when known: `nvlink` (peer indices) and `pcie` (switch label)."""
    out: dict[str, object] = {}
    if g.nvlink:
        out["nvlink"] = list(g.nvlink)
    if g.pcie is not None:
        out["pcie"] = g.pcie
    return out


def _nvlink(raw: object) -> tuple[int, ...] | None:
    """`nvlink` decoded: a sorted tuple of distinct GPU indices (at most MAX_GPUS); None when malformed."""
    if raw is None:
        return ()
    if type(raw) is not list or len(raw) > MAX_GPUS or not all(type(i) is int and 0 <= i <= MAX_GPU_INDEX
                                                               for i in raw):
        return None
    out = tuple(sorted(set(raw)))
    return out if len(out) == len(raw) else None


def _pcie_ok(raw: object) -> bool:
    return raw is None or (type(raw) is str and 0 < len(raw) <= MAX_PCIE)


def _by_index(g: Gpu) -> int:
    """The sort key of an inventory's GPUs (a function, not a lambda made at every parse)."""
    return g.index


def _once(where: str, kind: str, values: list[str]) -> None:
    """ContractError when a GPU UUID or index is listed twice."""
    if len(set(values)) != len(values):
        dup = next(v for v in values if values.count(v) > 1)
        raise errors.ContractError(f"{where}: {kind} {dup} is listed twice")


def _gpu(where: str, i: int, g: object) -> Gpu:
    """One item of `memslice.io/gpus`. A restart parses every GPU of the cluster (40,000 at 5,000 nodes): a
    well-formed item passes _gpu_fast, and only one that fails it is checked field by field, for a message
    naming the field (a test checks the two accept the same items alike)."""
    return _gpu_fast(g) or _gpu_checked(where, i, g)


def _gpu_fast(g: object) -> Gpu | None:
    """The item as a Gpu when it is well formed (the bounds of _gpu_checked, exact JSON types); None when
    _gpu_checked must look."""
    if type(g) is not dict:
        return None
    uuid, index, mem = g.get("uuid"), g.get("index"), g.get("memMiB")
    model, numa, healthy = g.get("model", ""), g.get("numa"), g.get("healthy", True)
    total, reserved = g.get("nvmlTotalMiB"), g.get("reservedMiB")
    nvlink, pcie = _nvlink(g.get("nvlink")), g.get("pcie")
    if nvlink is None or not _pcie_ok(pcie):
        return None
    if (type(uuid) is str and 0 < len(uuid) <= MAX_UUID and type(index) is int and 0 <= index <= MAX_GPU_INDEX
            and type(mem) is int and 0 < mem <= MAX_MIB and type(model) is str and len(model) <= MAX_MODEL
            and (numa is None or (type(numa) is int and 0 <= numa <= MAX_NUMA)) and type(healthy) is bool
            and (total is None or (type(total) is int and 0 < total <= MAX_MIB))
            and (reserved is None or (type(reserved) is int and 0 <= reserved <= MAX_MIB))):
        return Gpu(uuid, index, model, mem, numa, healthy, total, reserved, nvlink, pcie)
    return None


def _gpu_checked(where: str, i: int, g: object) -> Gpu:
    """One item of `memslice.io/gpus`, checked field by field."""
    if not isinstance(g, dict):
        raise errors.ContractError(f"{where}[{i}] is not an object")
    uuid, index, mem = g.get("uuid"), g.get("index"), g.get("memMiB")
    model, numa, healthy = g.get("model", ""), g.get("numa"), g.get("healthy", True)
    if not isinstance(uuid, str) or not 0 < len(uuid) <= MAX_UUID:
        raise errors.ContractError(f"{where}[{i}].uuid={_short(uuid)} is not a GPU UUID "
                                   f"(1 to {MAX_UUID} characters)")
    if not _is_int(index) or not 0 <= index <= MAX_GPU_INDEX:
        raise errors.ContractError(f"{where}[{i}].index={_short(index)} is not a GPU index (0..{MAX_GPU_INDEX})")
    if not _is_int(mem) or not 0 < mem <= MAX_MIB:
        raise errors.ContractError(f"{where}[{i}].memMiB={_short(mem)} is not a positive number of MiB "
                                   f"(at most {MAX_MIB})")
    if not isinstance(model, str) or len(model) > MAX_MODEL:
        raise errors.ContractError(f"{where}[{i}].model={_short(model)} is not a text of at most {MAX_MODEL} "
                                   f"characters")
    if numa is not None and (not _is_int(numa) or not 0 <= numa <= MAX_NUMA):
        raise errors.ContractError(f"{where}[{i}].numa={_short(numa)} is neither null nor a NUMA node number")
    if not isinstance(healthy, bool):
        raise errors.ContractError(f"{where}[{i}].healthy={_short(healthy)} is not true or false")
    total, reserved = g.get("nvmlTotalMiB"), g.get("reservedMiB")
    if total is not None and (not _is_int(total) or not 0 < total <= MAX_MIB):
        raise errors.ContractError(f"{where}[{i}].nvmlTotalMiB={_short(total)} is neither null nor a positive "
                                   f"number of MiB (at most {MAX_MIB})")
    if reserved is not None and (not _is_int(reserved) or not 0 <= reserved <= MAX_MIB):
        raise errors.ContractError(f"{where}[{i}].reservedMiB={_short(reserved)} is neither null nor a number of "
                                   f"MiB (0..{MAX_MIB})")
    nvlink, pcie = _nvlink(g.get("nvlink")), g.get("pcie")
    if nvlink is None:
        raise errors.ContractError(f"{where}[{i}].nvlink={_short(g.get('nvlink'))} is not a list of distinct GPU "
                                   f"indices (0..{MAX_GPU_INDEX})")
    if not _pcie_ok(pcie):
        raise errors.ContractError(f"{where}[{i}].pcie={_short(pcie)} is neither null nor a text of 1 to {MAX_PCIE} "
                                   f"characters")
    return Gpu(uuid=uuid, index=index, model=model, mem_mib=mem, numa=numa, healthy=healthy,
               nvml_total_mib=total, reserved_mib=reserved, nvlink=nvlink, pcie=pcie)


def _unit(node: str, raw: object) -> int:
    """`memslice.io/unit-mib`: a positive whole number of MiB per device."""
    unit = 0
    if isinstance(raw, str) and len(raw) <= MAX_UNIT_TEXT and raw.strip().isdigit():
        unit = int(raw.strip())
    if not 0 < unit <= MAX_MIB:
        raise errors.ContractError(f"node {node}: annotation {ANN_UNIT_MIB}={_short(raw)} is not a positive "
                                   f"whole number of MiB per device (at most {MAX_MIB})")
    return unit


# ------------------------------------------------------------------------------------------ reservation

class Reservation(NamedTuple):
    """The extender's placement of a pod, recorded on the pod at bind: its GPU (or, for a pod spanning GPUs,
    its GPUs: `gpu_uuid` is then their UUIDs joined by commas, in device order, see `gpu_uuids`), MiB per
    container (its total over the GPUs, sorted by name, never empty; each GPU holds total / count), and when
    the extender assumed it (None when the annotation is absent, or when the caller asked not to read it).
    Compute shares are per GPU (each GPU enforces the recorded request and limit). A named tuple, as Gpu: the
    extender's restart parses one per bound pod."""

    gpu_uuid: str
    container_mib: tuple[tuple[str, int], ...]
    assumed_at: datetime | None
    container_compute: tuple[ComputeShare, ...] = ()  # by name; only containers with a compute share

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        """The reserved GPUs in device order (one for a one-GPU pod)."""
        return tuple(self.gpu_uuid.split(",")) if "," in self.gpu_uuid else (self.gpu_uuid,)

    @property
    def gpu_count(self) -> int:
        """How many GPUs the pod spans."""
        return self.gpu_uuid.count(",") + 1

    def per_gpu_mib(self, container: str) -> int:
        """The container's MiB on each of its GPUs (its total / count); 0 when it holds none."""
        return next((mib for name, mib in self.container_mib if name == container), 0) // self.gpu_count

    def format(self) -> dict[str, str]:
        """The pod annotations."""
        out = {ANN_GPU_UUID: self.gpu_uuid,
               ANN_GPU_MEM: orjson.dumps(dict(self.container_mib), option=orjson.OPT_SORT_KEYS).decode()}
        if self.assumed_at is not None:
            out[ANN_ASSUMED_AT] = format_time(self.assumed_at)
        if self.container_compute:
            out[ANN_GPU_COMPUTE] = format_compute(self.container_compute)
        return out

    def compute_of(self, container: str) -> ComputeShare | None:
        """The container's compute share; None without one."""
        return next((c for c in self.container_compute if c.container == container), None)

    @property
    def assumed_ts(self) -> float:
        """`assumed_at` as Unix seconds; 0.0 without one (it sorts first, and has long expired)."""
        return 0.0 if self.assumed_at is None else self.assumed_at.timestamp()

    @classmethod
    def parse(cls, annotations: Mapping[str, Any], where: str = "", *, with_time: bool = True
              ) -> Reservation | None:
        """The reservation the pod's annotations hold; None without `memslice.io/gpu-uuid`. `where` (e.g.
        "pod ns/name") starts error messages. `with_time=False` does not read `assumed-at` (the extender's
        watch skips it for bound pods, whose reservation counts whatever its age). ContractError when an
        annotation is malformed, including an empty container map: a reservation holds memory for at least
        one container (docs/architecture.md, "Contracts")."""
        uuid = annotations.get(ANN_GPU_UUID)
        if uuid is None:
            return None
        if not isinstance(uuid, str) or not (0 < len(uuid) <= MAX_UUID or _uuid_list_ok(uuid)):
            raise errors.ContractError(f"{where}: annotation {ANN_GPU_UUID}={_short(uuid)} is neither a GPU UUID "
                                       f"(1 to {MAX_UUID} characters) nor 2 to {MAX_GPUS_PER_POD} distinct ones "
                                       f"joined by commas")
        count = uuid.count(",") + 1
        raw = annotations.get(ANN_GPU_MEM)
        try:  # orjson refuses NaN and integers beyond 64 bits
            mem = orjson.loads(raw) if isinstance(raw, str) and len(raw) <= MAX_GPU_MEM_TEXT else None
        except orjson.JSONDecodeError:
            mem = None
        container_mib = _container_mib(mem)
        if container_mib is None:
            raise errors.ContractError(
                f"{where}: annotation {ANN_GPU_MEM}={_short(raw)} is not a JSON object of 1 to {MAX_CONTAINERS} "
                f"container names to positive MiB (at most {MAX_MIB}), e.g. {{\"train\": 4096}}")
        at = None
        if with_time:
            text = annotations.get(ANN_ASSUMED_AT)
            if text is not None:
                at = parse_time(text)
                if at is None:
                    raise errors.ContractError(f"{where}: annotation {ANN_ASSUMED_AT}={_short(text)} is not an "
                                               f"RFC 3339 time, e.g. 2026-01-02T03:04:05.123456Z")
        if count > 1:
            if not _uuid_list_ok(uuid):
                raise errors.ContractError(f"{where}: annotation {ANN_GPU_UUID}={_short(uuid)} is not 2 to "
                                           f"{MAX_GPUS_PER_POD} distinct GPU UUIDs joined by commas")
            odd = next((name for name, mib in container_mib if mib % count), None)
            if odd is not None:
                raise errors.ContractError(f"{where}: annotation {ANN_GPU_MEM}: container {odd!r} holds "
                                           f"{dict(container_mib)[odd]} MiB, not divisible over its {count} GPUs")
        compute = annotations.get(ANN_GPU_COMPUTE)
        return cls(uuid, container_mib, at, parse_compute(compute, where) if compute is not None else ())


def _uuid_list_ok(text: str) -> bool:
    """ANN_GPU_UUID for a pod spanning GPUs: 2..MAX_GPUS_PER_POD distinct UUIDs of 1..MAX_UUID characters,
    joined by commas."""
    if len(text) > MAX_GPUS_PER_POD * (MAX_UUID + 1):
        return False
    parts = text.split(",")
    return (1 < len(parts) <= MAX_GPUS_PER_POD and len(set(parts)) == len(parts)
            and all(0 < len(p) <= MAX_UUID for p in parts))


def parse_gpu_count(annotations: Mapping[str, Any], where: str) -> int:
    """How many GPUs of one node the pod spans (ANN_GPU_COUNT): 1 without the annotation; a whole number
    1..MAX_GPUS_PER_POD; errors.ContractError naming the annotation, the value and the fix otherwise."""
    raw = annotations.get(ANN_GPU_COUNT)
    if raw is None:
        return 1
    text = raw.strip() if isinstance(raw, str) and len(raw) <= 16 else ""
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_GPUS_PER_POD:
        raise errors.ContractError(f"{where}: annotation {ANN_GPU_COUNT}={str(raw)[:16]!r} is not a whole number of "
                                   f"GPUs between 1 and {MAX_GPUS_PER_POD} (e.g. \"2\"); fix or remove it")
    return int(text)


def split_even(total: int, count: int, what: str, where: str) -> int:
    """A pod's per-GPU share of a container's `total` request of resource `what` over `count` GPUs;
    errors.ContractError naming the container's figure and the fix when it does not divide evenly."""
    if total % count:
        raise errors.ContractError(f"{where}: {what}={total} cannot be split evenly over {ANN_GPU_COUNT}={count} "
                                   f"GPUs; request a multiple of {count} (e.g. {total - total % count + count})")
    return total // count


def _container_mib(mem: object) -> tuple[tuple[str, int], ...] | None:
    """`memslice.io/gpu-mem-mib` decoded: its (container, MiB) pairs sorted by name, None when it is not a
    map of 1 to MAX_CONTAINERS names to MiB. One container (nearly every pod, and a restart reads every
    bound pod's) is checked without a generator; a test checks it against _container_mib_checked."""
    if type(mem) is dict and len(mem) == 1:
        ((name, mib),) = mem.items()
        if type(name) is str and 0 < len(name) <= MAX_CONTAINER_NAME and type(mib) is int and 0 < mib <= MAX_MIB:
            return ((name, mib),)
        return None
    return _container_mib_checked(mem)


def _container_mib_checked(mem: object) -> tuple[tuple[str, int], ...] | None:
    """_container_mib for any number of containers: every name and amount checked in one generator."""
    if not isinstance(mem, dict) or not 0 < len(mem) <= MAX_CONTAINERS or not all(
            isinstance(k, str) and 0 < len(k) <= MAX_CONTAINER_NAME and type(v) is int and 0 < v <= MAX_MIB
            for k, v in mem.items()):
        return None
    return tuple(sorted(mem.items()))


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 time as an aware datetime (a time without zone is UTC); None when it is not one. Every
    watched pod with an unbound reservation passes here, so it is fromisoformat (C) rather than strptime."""
    if not isinstance(text, str) or not text or len(text) > MAX_TIME_TEXT:
        return None
    try:
        dt = datetime.fromisoformat(text.upper())  # RFC 3339 allows a lowercase t and z
    except ValueError:
        return None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def format_time(at: datetime) -> str:
    """RFC 3339 UTC with microseconds, e.g. 2026-01-02T03:04:05.123456Z (a naive datetime is UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


# ------------------------------------------------------------------------------------------ compute share

class ComputeShare(NamedTuple):
    """A container's compute share, in percent of one GPU: `request` (0..100; 0 = best effort) and `limit`
    (1..100, >= request; None = no cap)."""

    container: str
    request: int
    limit: int | None


def check_share(request: int, limit: int | None, where: str) -> None:
    """errors.ContractError naming the value and the fix when a share is out of range: a request over 100, a
    limit outside 1..100 or below the request."""
    if not 0 <= request <= MAX_PERCENT:
        raise errors.ContractError(f"{where}: {RESOURCE_COMPUTE}={request} is not a percent of one GPU (0..100); "
                                   f"ask for at most 100 (one whole GPU)")
    if limit is not None and not 0 < limit <= MAX_PERCENT:
        raise errors.ContractError(f"{where}: {ANN_GPU_COMPUTE_LIMIT}={limit} is not a percent of one GPU (1..100);"
                                   f" set at most 100, or remove it for no cap")
    if limit is not None and limit < request:
        raise errors.ContractError(f"{where}: {ANN_GPU_COMPUTE_LIMIT}={limit} is below the compute request of "
                                   f"{request} ({RESOURCE_COMPUTE}); set a limit of at least the request, or "
                                   f"remove it")


def format_compute(shares: tuple[ComputeShare, ...]) -> str:
    """ANN_GPU_COMPUTE's value: {"container": [request, limit or null]}, keys sorted."""
    return orjson.dumps({c.container: [c.request, c.limit] for c in shares}, option=orjson.OPT_SORT_KEYS).decode()


def parse_compute(raw: object, where: str) -> tuple[ComputeShare, ...]:
    """ANN_GPU_COMPUTE's value as shares sorted by container; errors.ContractError naming it otherwise."""
    bad = errors.ContractError(f"{where}: annotation {ANN_GPU_COMPUTE}={_short(raw)} is not a JSON object of 1 to "
                               f"{MAX_CONTAINERS} container names to [request 0..100, limit 1..100 or null], "
                               f"e.g. {{\"train\": [30, 60]}}")
    try:
        value = orjson.loads(raw) if isinstance(raw, str) and len(raw) <= MAX_GPU_MEM_TEXT else None
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not 0 < len(value) <= MAX_CONTAINERS:
        raise bad
    out = []
    for name, pair in sorted(value.items()):
        if (not 0 < len(name) <= MAX_CONTAINER_NAME or type(pair) is not list or len(pair) != 2
                or not _is_int(pair[0]) or not (pair[1] is None or _is_int(pair[1]))):
            raise bad
        check_share(pair[0], pair[1], f"{where}: annotation {ANN_GPU_COMPUTE}, container {name!r}")
        out.append(ComputeShare(name, pair[0], pair[1]))
    return tuple(out)


def parse_compute_limit(annotations: Mapping[str, Any], container: str, where: str) -> int | None:
    """The container's compute limit from the users' annotation (ANN_GPU_COMPUTE_LIMIT[.container]): a whole
    percent 1..100; None without one; errors.ContractError naming the annotation and the fix otherwise."""
    key = f"{ANN_GPU_COMPUTE_LIMIT}.{container}"
    if key not in annotations:
        key = ANN_GPU_COMPUTE_LIMIT
    raw = annotations.get(key)
    if raw is None:
        return None
    text = raw.strip() if isinstance(raw, str) and len(raw) <= 16 else ""
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_PERCENT:
        raise errors.ContractError(f"{where}: annotation {key}={str(raw)[:16]!r} is not a whole percent of one GPU "
                                   f"between 1 and 100 (e.g. \"40\"); fix or remove it")
    return int(text)


# ------------------------------------------------------------------------------------------ oversubscription

NO_SPILL_CAP: Final = -1  # parse_oversubscribe: spilling on, bounded only by the cgroup margin


def parse_idle_release(annotations: Mapping[str, Any], where: str) -> bool:
    """Whether the pod opted in to giving up its request while idle (ANN_IDLE_RELEASE); errors.ContractError
    naming the annotation and the valid values otherwise."""
    raw = annotations.get(ANN_IDLE_RELEASE)
    if raw is None:
        return False
    text = raw.strip().lower() if isinstance(raw, str) and len(raw) <= 16 else None
    if text not in ("true", "false"):
        raise errors.ContractError(f"{where}: annotation {ANN_IDLE_RELEASE}={str(raw)[:16]!r} is not \"true\" or "
                                   f"\"false\"; fix or remove it")
    return text == "true"


def parse_oversubscribe(annotations: Mapping[str, Any], where: str) -> int | None:
    """The pod's oversubscription wish: None (off: nothing spills), NO_SPILL_CAP (on, no cap) or the spill cap
    in bytes (> 0). errors.ContractError naming the annotation, the value and the valid forms otherwise."""
    from .sizes import SizeError, parse_size

    raw = annotations.get(ANN_OVERSUBSCRIBE)
    if raw is None:
        return None
    if not isinstance(raw, str) or len(raw) > 64:
        raise errors.ContractError(f"{where}: annotation {ANN_OVERSUBSCRIBE} is not a short string")
    text = raw.strip().lower()
    if text in ("false", "0", ""):
        return None
    if text == "true":
        return NO_SPILL_CAP
    try:
        return parse_size(raw.strip(), what=f"{where}: annotation {ANN_OVERSUBSCRIBE}")
    except SizeError as exc:
        raise errors.ContractError(f"{exc}, or \"true\" / \"false\"") from None


# ------------------------------------------------------------------------------------------ DRA driver config

# The opaque config of the DRA driver memslice.io (a ResourceClaim's or DeviceClass's
# `spec.devices.config[].opaque.parameters` with `driver: memslice.io`), as the node agent reads it from the
# claim's status.allocation.devices.config (class entries first, then the claim's: later fields win):
#   {apiVersion: memslice.io/v1alpha1, kind: GpuMemConfig, limit: "6Gi", idleRelease: true, oversubscribe: "8Gi"}
# The claim's request is its consumable capacity (`capacity.requests.memory`, what kube-scheduler counts); `limit`
# (a Kubernetes quantity) is the elastic limit of all the claim's memory on its GPU, >= the request (equal: not
# elastic), at most the GPU's memory; `idleRelease: true` lets an idle container give up its request too (as
# ANN_IDLE_RELEASE does for a pod), only with a limit above the request; `oversubscribe` (as ANN_OVERSUBSCRIBE
# does for a pod) lets allocations past the quota spill to host memory: a quantity (the spill cap, e.g. "8Gi"),
# true (no cap but the memory cgroup's margin) or false (the default: nothing spills); `computeLimit` (an integer
# percent 1..100, at least the claim's `capacity.requests.compute`) caps the claim's GPU time. Any other field is
# refused. A new field is one entry of DRA_CONFIG_FIELDS and one parser in GpuMemConfig.parse.
DRA_CONFIG_API_VERSION: Final = "memslice.io/v1alpha1"
DRA_CONFIG_KIND: Final = "GpuMemConfig"
DRA_CONFIG_FIELDS: Final = ("apiVersion", "kind", "limit", "idleRelease", "oversubscribe", "computeLimit")
MAX_DRA_CONFIG_TEXT: Final = 4096  # bytes of one GpuMemConfig as JSON (the API server allows 10 KiB)
MAX_QUANTITY_DIGITS: Final = 1000  # a quantity of bytes has fewer digits than this
_QUANTITY_FIRST: Final = frozenset("0123456789.")
_QUANTITY_ALPHABET: Final = frozenset("0123456789.eE+-numkKMGTPEi")  # digits, exponent, SI and binary suffixes


def quantity_bytes(raw: object) -> Decimal:
    """A Kubernetes quantity ("4Gi", "4096Mi", "4294967296", "1.5Gi", "4e9") in bytes; ValueError otherwise.

    The parsing is kubernetes.utils.parse_quantity (imported here, not at module load: the extender imports
    this module without the kubernetes client); what is added bounds hostile input, which that parser would
    take (it hands the number to Decimal): at most 64 characters of the quantity alphabet only (no sign,
    whitespace, `_`, NaN or Infinity), and a value below 10^MAX_QUANTITY_DIGITS bytes (so that the whole MiB
    of it are a small int)."""
    from kubernetes.utils import parse_quantity

    if (not isinstance(raw, str) or not 0 < len(raw) <= 64 or raw[0] not in _QUANTITY_FIRST
            or not _QUANTITY_ALPHABET.issuperset(raw)):
        raise ValueError(f"{_short(raw)} is not a quantity")
    try:
        value: Decimal = parse_quantity(raw)
    except (ValueError, ArithmeticError) as exc:
        raise ValueError(f"{_short(raw)} is not a quantity ({exc})") from None
    if not value.is_finite() or value < 0 or value.adjusted() >= MAX_QUANTITY_DIGITS:
        raise ValueError(f"{_short(raw)} is not a quantity of at most {MAX_QUANTITY_DIGITS} digits of bytes")
    return value


def quantity_mib(raw: object) -> int:
    """Whole MiB in a quantity (rounded down); ValueError for a non-quantity. Exact for every value
    quantity_bytes admits: `int(value) // MIB` in integers, never Decimal's `//`, which raises
    DivisionImpossible (an ArithmeticError, not a ValueError) once the quotient needs more than the context's
    28 digits ("1E99", 64 nines)."""
    return int(quantity_bytes(raw)) // MIB


@dataclass(frozen=True, slots=True)
class GpuMemConfig:
    """The driver config of a DRA claim (see DRA_CONFIG_KIND above). `limit_mib` None: no limit (not elastic)."""

    limit_mib: int | None = None
    idle_release: bool = False
    spill: int | None = None  # oversubscribe, as parse_oversubscribe: None off, NO_SPILL_CAP, or the cap in bytes
    compute_limit: int | None = None  # percent of the GPU's time (1..100); None: no cap

    def format(self) -> dict[str, Any]:
        """The opaque parameters: what `parse` reads back as this config."""
        out: dict[str, Any] = {"apiVersion": DRA_CONFIG_API_VERSION, "kind": DRA_CONFIG_KIND}
        if self.limit_mib is not None:
            out["limit"] = f"{self.limit_mib}Mi"
        if self.idle_release:
            out["idleRelease"] = True
        if self.spill is not None:
            out["oversubscribe"] = True if self.spill == NO_SPILL_CAP else str(self.spill)
        if self.compute_limit is not None:
            out["computeLimit"] = self.compute_limit
        return out

    @classmethod
    def parse(cls, raw: object, where: str) -> GpuMemConfig:
        """The config in opaque parameters `raw`; errors.ContractError naming `where`, the bad field, its value
        and the fix. Strict (fail closed): a tenant must never believe a limit applies that does not."""
        fix = (f"write {{apiVersion: {DRA_CONFIG_API_VERSION}, kind: {DRA_CONFIG_KIND}, limit: \"6Gi\"}} "
               f"(optional idleRelease: true, oversubscribe: \"8Gi\")")
        if not isinstance(raw, dict):
            raise errors.ContractError(f"{where}: the opaque parameters are {type(raw).__name__}, not an object; "
                                       f"{fix}")
        try:
            size = len(orjson.dumps(raw))
        except (TypeError, orjson.JSONEncodeError):
            size = MAX_DRA_CONFIG_TEXT + 1
        if size > MAX_DRA_CONFIG_TEXT:
            raise errors.ContractError(f"{where}: the opaque parameters are over {MAX_DRA_CONFIG_TEXT} bytes of "
                                       f"JSON; {fix}")
        if raw.get("apiVersion") != DRA_CONFIG_API_VERSION or raw.get("kind") != DRA_CONFIG_KIND:
            raise errors.ContractError(f"{where}: apiVersion {_short(raw.get('apiVersion'))}, kind "
                                       f"{_short(raw.get('kind'))}; use apiVersion {DRA_CONFIG_API_VERSION}, kind "
                                       f"{DRA_CONFIG_KIND}")
        unknown = sorted(str(k)[:64] for k in raw if k not in DRA_CONFIG_FIELDS)
        if unknown:
            raise errors.ContractError(f"{where}: {DRA_CONFIG_KIND} has no field(s) {', '.join(map(repr, unknown[:8]))}"
                                       f" (its fields: {', '.join(DRA_CONFIG_FIELDS)}); remove them")
        release = raw.get("idleRelease", False)
        if not isinstance(release, bool):
            raise errors.ContractError(f"{where}: idleRelease={_short(release)} is not true or false; fix or remove "
                                       f"it")
        compute = raw.get("computeLimit")
        if compute is not None and (not _is_int(compute) or not 0 < compute <= MAX_PERCENT):
            raise errors.ContractError(f"{where}: computeLimit={_short(compute)} is not a whole percent of one GPU "
                                       f"(1..100); write e.g. computeLimit: 40, or remove it for no cap")
        return cls(limit_mib=_limit_mib(raw.get("limit"), where), idle_release=release,
                   spill=_spill(raw.get("oversubscribe"), where), compute_limit=compute)


def _spill(raw: object, where: str) -> int | None:
    """GpuMemConfig.oversubscribe: true (NO_SPILL_CAP), false/absent (None), or a quantity string of at least
    1Mi and at most MAX_MIB MiB (the spill cap in bytes, rounded down to whole MiB)."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return NO_SPILL_CAP
    form = 'true, false, or a quantity string (the spill cap), e.g. oversubscribe: "8Gi"'
    if not isinstance(raw, str):
        raise errors.ContractError(f"{where}: oversubscribe={_short(raw)} is not {form}")
    try:
        mib = quantity_mib(raw)
    except ValueError:
        raise errors.ContractError(f"{where}: oversubscribe={_short(raw)} is not {form}") from None
    if not 0 < mib <= MAX_MIB:
        size = "under 1Mi" if mib <= 0 else "absurdly large"
        raise errors.ContractError(f"{where}: oversubscribe={_short(raw)} is {size}; use {form}")
    return mib * MIB


def _limit_mib(raw: object, where: str) -> int | None:
    """GpuMemConfig.limit: a quantity string of whole MiB (rounded down), 1 MiB .. MAX_MIB; None when absent."""
    if raw is None:
        return None
    form = 'a quantity string of at least 1Mi, e.g. limit: "6Gi" or "6144Mi"'
    if not isinstance(raw, str):
        raise errors.ContractError(f"{where}: limit={_short(raw)} is not {form} (quote it in YAML)")
    hint = " (a limit cannot be negative)" if raw.strip().startswith("-") else ""
    try:
        mib = quantity_mib(raw)
    except ValueError:
        raise errors.ContractError(f"{where}: limit={_short(raw)} is not a quantity{hint}; use {form}") from None
    if not 0 < mib <= MAX_MIB:
        raise errors.ContractError(f"{where}: limit={_short(raw)} is {'under 1Mi' if mib <= 0 else 'absurdly large'};"
                                   f" use {form}, at most the GPU's memory")
    return mib


# ---------------------------------------------------------------- a container's devices (the pod spec's figures)
# One parse for the extender (placement.resources.pod_request) and the node agent (deviceplugin.inventory: which pod
# an Allocate can be for), so that both read a pod's memslice.io/gpu-mem alike.
MAX_DEVICES: Final = 1 << 40  # per container; anything above is absurd (1 TiB devices of 1 MiB is an EiB)
_QUANTITY = re.compile(r"^([+-]?)(\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d{1,3})?$")
_SUFFIX = {"": Fraction(1), "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
           "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
           "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
           "Pi": Fraction(2**50), "Ei": Fraction(2**60)}


class RequestError(errors.InputError):
    """A pod whose memslice request cannot be honoured; the message names the value and the fix."""


def parse_devices(text: Any, where: str, resource: str = RESOURCE) -> int:
    """A Kubernetes quantity of `memslice.io/gpu-mem` (or `resource`) devices: a whole, non-negative number."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise RequestError(f"{where}: {resource}={text!r} is not a quantity; write a whole number of "
                           f"devices, e.g. \"4096\"")
    if type(text) is str and len(text) <= 12 and text.isascii() and text.isdigit():  # usual "4096": fast
        return int(text)
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise RequestError(f"{where}: {resource}={text!r} is not a Kubernetes quantity; write a whole "
                           f"number of devices, e.g. \"4096\"")
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    scale = _SUFFIX[suffix] if suffix in _SUFFIX else Fraction(10) ** int(suffix[1:])  # or e<exponent>
    value = Fraction(number) * scale
    if sign == "-" and value != 0:
        raise RequestError(f"{where}: {resource}={text!r} is negative; ask for a positive whole number of "
                           f"devices")
    if value.denominator != 1:
        raise RequestError(f"{where}: {resource}={text!r} is not a whole number; extended resources are "
                           f"counted in whole devices")
    if value > MAX_DEVICES:
        raise RequestError(f"{where}: {resource}={text!r} is absurdly large (more than {MAX_DEVICES} "
                           f"devices); ask for the MiB one GPU can hold, in devices of the node's unit")
    return int(value)


def container_devices(container: Any, where: str, resource: str = RESOURCE) -> int:
    """A container's devices of `resource` (its limit, else its request; 0: none), request and limit equal."""
    if not isinstance(container, dict):
        raise RequestError(f"{where} is not an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise RequestError(f"{where}.resources is not an object")
    found: dict[str, int] = {}
    for field in ("requests", "limits"):
        values = resources.get(field) or {}
        if not isinstance(values, dict):
            raise RequestError(f"{where}.resources.{field} is not an object")
        if resource in values:
            found[field] = parse_devices(values[resource], f"{where}.resources.{field}", resource)
    if "requests" in found and "limits" in found and found["requests"] != found["limits"]:
        raise RequestError(f"{where}: {resource} request {found['requests']} differs from its limit "
                           f"{found['limits']}; extended resources need request == limit "
                           f"(set only the limit)")
    return found.get("limits", found.get("requests", 0))

"""Reading and writing the annotations of the contract (docs/architecture.md, "Contracts").

Node annotations come from the node agent; pod reservations are written by the extender itself at bind.
A malformed annotation is reported (AnnotationError naming the object, the value and the fix) and then
treated as absent; it never crashes the extender.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from memslice import errors
from memslice.scheduler_extender.constants import (
    ANN_ASSUMED_AT,
    ANN_GPU_MEM,
    ANN_GPU_MEM_LIMIT_RECORD,
    ANN_GPU_UUID,
    ANN_GPUS,
    ANN_UNIT_MIB,
)


class AnnotationError(errors.ContractError):
    """A malformed memslice annotation."""


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    index: int
    model: str
    mem_mib: int
    numa: int | None
    healthy: bool


@dataclass(frozen=True, slots=True)
class Inventory:
    """A node's memslice GPUs as the node agent published them."""

    unit_mib: int
    gpus: tuple[Gpu, ...]


def parse_inventory(node_name: str, annotations: dict[str, Any]) -> Inventory | None:
    """None when the node has no memslice annotations (not a memslice node)."""
    raw_gpus = annotations.get(ANN_GPUS)
    if raw_gpus is None:
        return None
    where = f"node {node_name}: annotation {ANN_GPUS}"
    try:
        items = json.loads(raw_gpus)
    except (TypeError, ValueError):
        raise AnnotationError(f"{where} is not JSON ({str(raw_gpus)[:80]!r})") from None
    if not isinstance(items, list):
        raise AnnotationError(f"{where} is not a JSON list of GPUs")
    gpus = []
    seen: set[str] = set()
    for i, g in enumerate(items):
        if not isinstance(g, dict):
            raise AnnotationError(f"{where}[{i}] is not an object")
        uuid, index, mem = g.get("uuid"), g.get("index"), g.get("memMiB")
        if not isinstance(uuid, str) or not uuid:
            raise AnnotationError(f"{where}[{i}].uuid={uuid!r} is not a GPU UUID")
        if uuid in seen:
            raise AnnotationError(f"{where}: GPU {uuid} is listed twice")
        seen.add(uuid)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise AnnotationError(f"{where}[{i}].index={index!r} is not a GPU index")
        if not isinstance(mem, int) or isinstance(mem, bool) or mem <= 0:
            raise AnnotationError(f"{where}[{i}].memMiB={mem!r} is not a positive number of MiB")
        numa = g.get("numa")
        gpus.append(Gpu(uuid=uuid, index=index, model=str(g.get("model", "")), mem_mib=mem,
                        numa=numa if isinstance(numa, int) and not isinstance(numa, bool) else None,
                        healthy=g.get("healthy", True) is True))
    raw_unit = annotations.get(ANN_UNIT_MIB, "1")
    try:
        unit = int(str(raw_unit).strip())
    except ValueError:
        unit = 0
    if unit <= 0:
        raise AnnotationError(f"node {node_name}: annotation {ANN_UNIT_MIB}={raw_unit!r} is not a positive "
                              f"whole number of MiB per device")
    return Inventory(unit_mib=unit, gpus=tuple(sorted(gpus, key=lambda g: g.index)))


@dataclass(frozen=True, slots=True)
class Reservation:
    """The extender's decision recorded on a pod: one GPU, MiB per container, when."""

    gpu_uuid: str
    container_mib: tuple[tuple[str, int], ...]
    assumed_at: float  # unix seconds; 0 when missing or unreadable


def parse_reservation(where: str, annotations: dict[str, Any], *, with_time: bool = True) -> Reservation | None:
    """The reservation the annotations record; None without one. `with_time=False` leaves `assumed_at` 0
    (a bound pod's reservation counts whatever its age: the watch skips parsing the time)."""
    uuid = annotations.get(ANN_GPU_UUID)
    if uuid is None:
        return None
    if not isinstance(uuid, str) or not uuid:
        raise AnnotationError(f"{where}: annotation {ANN_GPU_UUID}={uuid!r} is not a GPU UUID")
    raw = annotations.get(ANN_GPU_MEM)
    try:
        mem = orjson.loads(raw) if isinstance(raw, str) else None  # refuses NaN and integers beyond 64 bits
    except ValueError:
        mem = None
    if not isinstance(mem, dict) or not mem or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
            for k, v in mem.items()):
        raise AnnotationError(f"{where}: annotation {ANN_GPU_MEM}={raw!r} is not a JSON object of container "
                              f"name to positive MiB, e.g. {{\"train\": 4096}}")
    return Reservation(uuid, tuple(sorted(mem.items())),
                       parse_time(annotations.get(ANN_ASSUMED_AT)) if with_time else 0.0)


def parse_time(text: Any) -> float:
    """RFC 3339 time as a Unix timestamp (a time without zone is UTC); 0.0 when it is not one. Every
    watched pod with a reservation passes here, so it is fromisoformat (C) rather than strptime."""
    if not isinstance(text, str) or not text:
        return 0.0
    try:
        dt = datetime.fromisoformat(text.upper())  # RFC 3339 allows a lowercase t and z
    except ValueError:
        return 0.0
    return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()


def format_time(ts: float) -> str:
    """RFC 3339 UTC with microseconds, e.g. 2026-01-02T03:04:05.123456Z."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")[:-6] + "Z"


def reservation_annotations(gpu_uuid: str, container_mib: dict[str, int],
                            assumed_at: float, limits: dict[str, int] | None = None) -> dict[str, str]:
    out = {ANN_GPU_UUID: gpu_uuid,
           ANN_GPU_MEM: json.dumps(container_mib, sort_keys=True, separators=(",", ":")),
           ANN_ASSUMED_AT: format_time(assumed_at)}
    if limits:
        out[ANN_GPU_MEM_LIMIT_RECORD] = json.dumps(limits, sort_keys=True, separators=(",", ":"))
    return out

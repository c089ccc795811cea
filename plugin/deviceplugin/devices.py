"""Kubelet devices for GPU memory: device IDs, the device list, and the size of a ListAndWatch message.

One kubelet device is `unit` MiB of one GPU. IDs are `g<gpu-index>-<n>` (n in 0 .. memMiB/unit - 1): short,
because the kubelet reads ListAndWatch with a 4 MiB limit, and the GPU can be read from the ID alone.
Everything here is pure and cheap; the size is computed arithmetically (no message is built), so the
start-up check costs nothing even for nodes far over the limit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memslice import errors

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# grpc-go's default client receive limit, which the kubelet uses when reading ListAndWatch.
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# Canonical only, exactly as device_id() writes them: ASCII digits (\d would accept other scripts) and no
# leading zeros, so that one device has one name (g0-1, g0-01 and g0-001 would otherwise be three units).
_ID = re.compile(r"g(0|[1-9][0-9]{0,3})-(0|[1-9][0-9]{0,8})")
_SHOW = 40  # characters of a bad ID quoted in a message: requests are client-controlled and can be huge


class DeviceIdError(errors.InputError):
    """A device ID that memslice did not issue."""


@dataclass(frozen=True)
class GpuShape:
    """What the device list depends on: index, memory, NUMA node (None = unknown, no topology sent)."""

    index: int
    mem_mib: int
    numa: int | None


def device_id(gpu_index: int, n: int) -> str:
    return f"g{gpu_index}-{n}"


def show_id(text: str) -> str:
    """An ID quoted for a message, cut to a bounded length."""
    return repr(text) if len(text) <= _SHOW else f"{text[:_SHOW]!r}... ({len(text)} characters)"


def bounded_list(items: Sequence[str], total: int, shown: int = 3) -> str:
    """The first `shown` items, then how many more (messages stay short whatever the request)."""
    more = f" and {total - shown} more" if total > shown else ""
    return ", ".join(items[:shown]) + more


def parse_device_id(text: str) -> tuple[int, int]:
    """`g3-1024` -> (3, 1024); raise DeviceIdError naming the bad ID."""
    m = _ID.fullmatch(text)
    if not m:
        raise DeviceIdError(f"device ID {show_id(text)} is not a memslice device ID (expected "
                            f"g<gpu-index>-<n> with no leading zeros, e.g. g0-17)")
    return int(m.group(1)), int(m.group(2))


def is_device_id(text: str) -> bool:
    return _ID.fullmatch(text) is not None


# Compute share: `memslice.io/gpu-compute`, one device per percent of one GPU, 100 per GPU, IDs
# `c<gpu-index>-<n>` (n in 0..99). The kubelet only counts them (a node's total); which GPU a container's
# share is on is the extender's reservation, as for memory.
COMPUTE_PER_GPU = 100
_COMPUTE_ID = re.compile(r"c(0|[1-9][0-9]{0,3})-(0|[1-9][0-9]?)")


def compute_id(gpu_index: int, n: int) -> str:
    return f"c{gpu_index}-{n}"


def parse_compute_id(text: str) -> tuple[int, int]:
    """`c3-42` -> (3, 42); raise DeviceIdError naming the bad ID."""
    m = _COMPUTE_ID.fullmatch(text)
    if not m:
        raise DeviceIdError(f"device ID {show_id(text)} is not a memslice compute device ID (expected "
                            f"c<gpu-index>-<n> with n in 0..99 and no leading zeros, e.g. c0-17)")
    return int(m.group(1)), int(m.group(2))


def devices_per_gpu(mem_mib: int, unit_mib: int) -> int:
    """Whole units only: the remainder of a GPU's memory below one unit is not advertised."""
    return mem_mib // unit_mib


def _varint_len(value: int) -> int:
    if value < 0:
        return 10  # negative int64 is always ten bytes on the wire
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def _field_len(payload: int) -> int:
    """Bytes of a length-delimited field with a one-byte tag and `payload` bytes of content."""
    return 1 + _varint_len(payload) + payload


def topology_bytes(numa: int | None) -> int:
    """Bytes the `topology` field adds to one Device (0 when the NUMA node is unknown)."""
    if numa is None:
        return 0
    node = 0 if numa == 0 else 1 + _varint_len(numa)  # proto3 omits ID 0
    return _field_len(_field_len(node))


def device_entry_bytes(id_len: int, health: str, numa: int | None) -> int:
    """Bytes one Device adds to a ListAndWatchResponse (outer tag and length included)."""
    body = _field_len(id_len) + _field_len(len(health)) + topology_bytes(numa)
    return _field_len(body)


def _digit_classes(count: int) -> Iterable[tuple[int, int]]:
    """(number of decimal digits, how many of 0 .. count-1 have that many)."""
    low, digits = 0, 1
    while low < count:
        high = min(count, 10 ** digits)
        yield digits, high - low
        low, digits = high, digits + 1


def list_and_watch_bytes(gpus: Sequence[GpuShape], unit_mib: int, *, health: str = HEALTHY) -> int:
    """Exact serialized size of the ListAndWatchResponse for these GPUs, all with the given health."""
    total = 0
    for gpu in gpus:
        prefix = len(f"g{gpu.index}-")
        for digits, count in _digit_classes(devices_per_gpu(gpu.mem_mib, unit_mib)):
            total += count * device_entry_bytes(prefix + digits, health, gpu.numa)
    return total


def worst_case_bytes(gpus: Sequence[GpuShape], unit_mib: int) -> int:
    """The largest message the agent can ever send: every device Unhealthy (the longer string)."""
    return list_and_watch_bytes(gpus, unit_mib, health=UNHEALTHY)


def smallest_fitting_unit(gpus: Sequence[GpuShape], limit: int = KUBELET_MAX_MESSAGE_BYTES) -> int:
    """The smallest unit (MiB per device) whose worst-case message fits under `limit`."""
    unit = 1
    while worst_case_bytes(gpus, unit) > limit:
        unit += 1
    return unit


class ListTooLarge(errors.LimitError):
    """The device list would exceed the kubelet's ListAndWatch limit; the message says how to fix it."""


def check_list_fits(gpus: Sequence[GpuShape], unit_mib: int, limit: int = KUBELET_MAX_MESSAGE_BYTES) -> int:
    """Return the worst-case message size; raise ListTooLarge naming --unit-mib when it does not fit."""
    size = worst_case_bytes(gpus, unit_mib)
    if size <= limit:
        return size
    count = sum(devices_per_gpu(g.mem_mib, unit_mib) for g in gpus)
    total_mib = sum(g.mem_mib for g in gpus)
    fit = smallest_fitting_unit(gpus, limit)
    raise ListTooLarge(
        f"this node's {len(gpus)} GPU(s) ({total_mib} MiB) at --unit-mib {unit_mib} make {count} kubelet "
        f"devices; the ListAndWatch message would be {size} bytes, over the kubelet's {limit}-byte limit, "
        f"and the kubelet would drop the whole resource. Start every node agent of the cluster with "
        f"--unit-mib {fit} or larger (1 device = N MiB; the unit is cluster-wide and published in the "
        f"node annotation memslice.io/unit-mib).")

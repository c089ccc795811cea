"""Which MiB of which GPU are handed out: the node's allocations, one per container (device plugin) or claim
share (DRA), keyed by region ID.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

REGION_ID = re.compile(r"g\d{1,4}-[0-9a-f]{12}\Z")


@dataclass(frozen=True)
class Allocation:
    region_id: str
    gpu_index: int
    gpu_uuid: str
    device_ids: tuple[str, ...]
    mib: int
    created_at: float  # wall-clock seconds
    namespace: str = ""
    pod: str = ""
    container: str = ""
    pod_uid: str = ""
    limit_mib: int = 0  # elastic memory: the limit above `mib` (the request), 0 when not elastic
    spill: int | None = None  # oversubscription (contract.parse_oversubscribe): None off, -1 no cap, or bytes
    elastic_slot: int = -1  # elastic memory: the board slot the agent assigned (plugin/elastic/slots.py)
    priority: int = 0  # elastic memory: the pod's PriorityClass value
    idle_release: bool = False  # elastic memory: idle, the request may move too
    compute_request: int = 0  # compute share: percent of the GPU's time; 0 = best effort
    compute_limit: int = 0  # compute share: the cap in percent; 0 = none
    compute_slot: int = -1  # compute share: the slot provisioned on its GPU (memslice.compute); -1 = none
    # A pod spanning GPUs: its other GPUs (index, uuid), in device order after gpu_index/gpu_uuid
    # (device 0). `mib` (and `limit_mib`) are per GPU: each GPU holds that much; the slots are one number free
    # on every one of the GPUs' boards.
    more_gpus: tuple[tuple[int, str], ...] = ()

    def gpus(self) -> tuple[tuple[int, str], ...]:
        """(index, uuid) of every GPU the container holds memory on, in device order."""
        return ((self.gpu_index, self.gpu_uuid), *self.more_gpus)

    def uuids(self) -> tuple[str, ...]:
        return (self.gpu_uuid, *(u for _, u in self.more_gpus))

    def on_gpu(self, uuid: str) -> bool:
        return uuid == self.gpu_uuid or any(u == uuid for _, u in self.more_gpus)

    def owner(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}" if self.pod else "(pod not yet known)"


def allocated_mib(ledger: Mapping[str, Allocation]) -> dict[int, int]:
    """MiB handed out per GPU index (a container spanning GPUs holds `mib` on each)."""
    out: dict[int, int] = {}
    for a in ledger.values():
        for index, _ in a.gpus():
            out[index] = out.get(index, 0) + a.mib
    return out

"""The agent's shared state, both modes: the GPUs, their health and the allocation ledger, under one lock.

Device-plugin mode adds its device list and the node's pods (plugin/deviceplugin/state.py).
"""

from __future__ import annotations

import threading

from .gpu.health import HealthBook
from .gpu.nvml import GpuInfo
from .ledger import Allocation


class NodeState:
    def __init__(self, gpus: list[GpuInfo], unit_mib: int, health: HealthBook) -> None:
        self.gpus = {g.index: g for g in gpus}
        self.unit_mib = unit_mib
        self.health = health
        self.lock = threading.RLock()
        self.ledger: dict[str, Allocation] = {}

    def ledger_copy(self) -> dict[str, Allocation]:
        """A snapshot of the ledger, taken under the lock."""
        with self.lock:
            return dict(self.ledger)

"""GPU health from NVML Xid events.

A critical Xid (any Xid not in the ignored list) makes that GPU Unhealthy; every change, recovery included,
is announced through `on_change` so that the server resends the full ListAndWatch list and the inventory is
republished. A GPU comes back after `recovery_s` seconds without a further critical Xid, if NVML still
answers for it (0 = stays Unhealthy until the agent restarts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .nvml import GpuInfo, XidEventSet

log = logging.getLogger(__name__)

# Xids caused by applications, not by the GPU (as the NVIDIA device plugin treats them): 13 graphics engine
# exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
# exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_critical(xid: int, ignored: frozenset[int]) -> bool:
    return xid not in ignored


@dataclass
class GpuHealth:
    healthy: bool = True
    last_xid: int | None = None
    since: float = 0.0  # monotonic time of the last critical Xid


class HealthBook:
    """Per-GPU health, keyed by UUID. Thread-safe; all decisions are here, no NVML."""

    def __init__(self, uuids: Iterable[str], ignored: frozenset[int], recovery_s: float) -> None:
        self._lock = threading.Lock()
        self._gpus = {u: GpuHealth() for u in uuids}
        self.ignored = ignored
        self.recovery_s = recovery_s

    def healthy(self, uuid: str) -> bool:
        with self._lock:
            g = self._gpus.get(uuid)
            return g is not None and g.healthy

    def snapshot(self) -> dict[str, bool]:
        with self._lock:
            return {u: g.healthy for u, g in self._gpus.items()}

    def xids(self) -> dict[str, int | None]:
        """The last critical Xid of every GPU that is Unhealthy now (None: marked without one)."""
        with self._lock:
            return {u: g.last_xid for u, g in self._gpus.items() if not g.healthy}

    def on_xid(self, uuid: str, xid: int, now: float) -> bool:
        """Record an Xid; True when the GPU's health changed."""
        with self._lock:
            g = self._gpus.get(uuid)
            if g is None or not is_critical(xid, self.ignored):
                return False
            changed = g.healthy
            g.healthy, g.last_xid, g.since = False, xid, now
            return changed

    def recover(self, now: float, responds: Callable[[str], bool]) -> list[str]:
        """Mark healthy again the GPUs whose last critical Xid is older than recovery_s and that NVML answers
        for; return their UUIDs."""
        if self.recovery_s <= 0:
            return []
        with self._lock:
            due = [u for u, g in self._gpus.items() if not g.healthy and now - g.since >= self.recovery_s]
        back = [u for u in due if responds(u)]
        with self._lock:
            for u in back:
                self._gpus[u].healthy = True
        return back


class XidWatcher:
    """Background thread: waits on NVML Xid events and feeds the HealthBook."""

    def __init__(self, gpus: list[GpuInfo], book: HealthBook, responds: Callable[[str], bool],
                 on_change: Callable[[], None]) -> None:
        self._gpus = {g.uuid: g for g in gpus}
        self._book = book
        self._responds = responds
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events: XidEventSet | None = None

    def start(self) -> None:
        self._events = XidEventSet(list(self._gpus.values()))
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._events is not None:
            self._events.close()

    def _run(self) -> None:
        assert self._events is not None
        while not self._stop.is_set():
            try:
                event = self._events.wait(200)
            except Exception as exc:  # NVML failing must not kill health watching for good
                log.error("waiting for NVML Xid events failed: %s; retrying", exc)
                self._stop.wait(1.0)
                continue
            changed = False
            if event is not None:
                gpu = self._gpus.get(event.uuid)
                where = f"GPU {gpu.index} ({event.uuid})" if gpu else event.uuid
                if not is_critical(event.xid, self._book.ignored):
                    log.info("%s: Xid %d ignored (listed in --ignored-xids)", where, event.xid)
                elif self._book.on_xid(event.uuid, event.xid, time.monotonic()):
                    changed = True
                    log.error("%s: critical Xid %d: its memory is now advertised Unhealthy%s", where,
                              event.xid, f" for at least {self._book.recovery_s:g}s"
                              if self._book.recovery_s > 0 else " until the agent restarts")
            for uuid in self._book.recover(time.monotonic(), self._responds):
                changed = True
                log.warning("GPU %s: no critical Xid for %gs and NVML answers: Healthy again", uuid,
                            self._book.recovery_s)
            if changed:
                self._on_change()

"""DRA: the node's ResourceSlice (resource.k8s.io/v1): one device per healthy GPU, shared by memory.

One slice per node, named `<node>-memslice.io`, pool = the node name, `resourceSliceCount: 1`. Each device
`gpu-<index>` has attributes uuid, index, productName, numaNode (when known) and driverVersion, a
`capacity.memory` with a requestPolicy (1Mi steps, see REQUEST_*), and `allowMultipleAllocations: true`, so
kube-scheduler hands out shares of it (KEP-5075 consumable capacity). A GPU that turns Unhealthy is left out
(withdrawn) until it recovers. The publisher lists the node's slices of this driver and creates, updates or
deletes so that exactly one stays: a restart updates the slice in place, never duplicates it. Every change of
the devices bumps `pool.generation` (the scheduler ignores slices of an older generation of the pool).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memslice.plugin.dra_kube import DraApi, KubeError
from memslice.plugin.dra_prepare import CAPACITY, DRIVER, device_name, quantity_bytes
from memslice.plugin.gpus import GpuInfo

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
# requestPolicy: a claim that names no memory gets REQUEST_DEFAULT_MIB; smaller requests are raised to
# REQUEST_MIN_MIB (below that a CUDA context alone, ~300 MiB, would not fit); 1 MiB steps.
REQUEST_MIN_MIB = 256
REQUEST_DEFAULT_MIB = 1024
REQUEST_STEP = "1Mi"
_VERSION = re.compile(r"(\d{1,9})(?:\.(\d{1,9}))?(?:\.(\d{1,9}))?")


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def semver(version: str) -> str | None:
    """NVIDIA's "535.104.05" as the semantic version 535.104.5 (semver forbids leading zeros; missing parts
    are 0; anything after the dotted numbers is dropped); None when it does not start with a number."""
    m = _VERSION.match(version.strip())
    if not m:
        return None
    return ".".join(str(int(p)) if p else "0" for p in m.groups())


def mib_quantity(mib: int) -> str:
    """MiB in the API server's canonical form (16384 -> "16Gi", 1536 -> "1536Mi"): what it stores and returns,
    so that a slice read back compares equal to the one built."""
    for suffix, size in (("Ti", 1 << 20), ("Gi", 1 << 10)):
        if mib and mib % size == 0:
            return f"{mib // size}{suffix}"
    return f"{mib}Mi"


def _normalised(spec: Mapping[str, Any]) -> Any:
    """`spec` with every capacity quantity in bytes and the generation zeroed (for comparisons)."""
    def q(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: q(x) for k, x in v.items()}
        try:
            return quantity_bytes(v)
        except ValueError:
            return v

    devices = [{**d, "capacity": q(d.get("capacity") or {})} for d in spec.get("devices") or []]
    return {**spec, "devices": devices, "pool": {**(spec.get("pool") or {}), "generation": 0}}


def device_entry(gpu: GpuInfo, capacity_mib: int, driver_version: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {"uuid": {"string": gpu.uuid}, "index": {"int": gpu.index},
                             "productName": {"string": gpu.model[:64]}}
    if gpu.numa is not None:
        attrs["numaNode"] = {"int": gpu.numa}
    version = semver(driver_version) if driver_version else None
    if version is not None:
        attrs["driverVersion"] = {"version": version}
    lo = min(REQUEST_MIN_MIB, capacity_mib - 1)
    default = max(lo, min(REQUEST_DEFAULT_MIB, capacity_mib))
    policy = {"default": mib_quantity(default), "validRange": {
        "min": mib_quantity(lo), "max": mib_quantity(capacity_mib), "step": REQUEST_STEP}}
    return {"name": device_name(gpu.index), "attributes": attrs, "allowMultipleAllocations": True,
            "capacity": {CAPACITY: {"value": mib_quantity(capacity_mib), "requestPolicy": policy}}}


def capacities(gpus: Sequence[GpuInfo]) -> dict[int, int]:
    """Memory each GPU offers to claims, in MiB (all of it: memslice keeps nothing back; the shim charges
    each process's CUDA context to its own quota)."""
    return {g.index: g.mem_mib for g in gpus}


def slice_spec(node: str, gpus: Sequence[GpuInfo], healthy: Mapping[str, bool], driver_version: str | None,
               generation: int) -> dict[str, Any]:
    caps = capacities(gpus)
    devices = [device_entry(g, caps[g.index], driver_version)
               for g in sorted(gpus, key=lambda g: g.index) if healthy.get(g.uuid, False) and caps[g.index] > 1]
    return {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "devices": devices}


def same_devices(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal but for the generation and the spelling of quantities (what a restart must not rewrite)."""
    return bool(_normalised(a) == _normalised(b))


class SlicePublisher:
    """Keeps the node's one ResourceSlice equal to `devices()`; republishes on `mark_dirty` (health changes,
    the kubelet registering the driver again), retries with backoff, and re-checks every `resync_s` (one
    LIST by field selector: someone may have deleted or edited the slice)."""

    def __init__(self, api: DraApi, node: str, gpus: Callable[[], Sequence[GpuInfo]],
                 healthy: Callable[[], Mapping[str, bool]], driver_version: str | None,
                 node_uid: Callable[[], str | None], resync_s: float = 30.0) -> None:
        self.api = api
        self.node = node
        self.gpus = gpus
        self.healthy = healthy
        self.driver_version = driver_version
        self.node_uid = node_uid
        self.resync_s = resync_s
        self.published = threading.Event()
        self.generation = 0
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resourceslice", daemon=True)

    def start(self) -> None:
        self._dirty.set()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def mark_dirty(self) -> None:
        self._dirty.set()

    def _run(self) -> None:
        backoff, failures = 0.5, 0
        while not self._stop.is_set():
            self._dirty.wait(self.resync_s if failures == 0 else backoff)  # a change, a resync or a retry
            if self._stop.is_set():
                return
            self._dirty.clear()
            try:
                self.sync_once()
            except Exception as exc:  # the API server away or refusing: keep trying, say why
                failures += 1
                hint = str(exc)
                if isinstance(exc, KubeError) and exc.status == 403:
                    hint += (" (the agent's service account needs list/create/update/delete on "
                             "resourceslices.resource.k8s.io, and may write only its own node's slices)")
                if failures == 1 or failures % 10 == 0:
                    log.warning("publishing ResourceSlice %s failed (%d times): %s; retrying",
                                slice_name(self.node), failures, hint)
                backoff = min(backoff * 2, 30.0)
                continue
            if failures:
                log.info("ResourceSlice %s published after %d failed attempts", slice_name(self.node), failures)
            backoff, failures = 0.5, 0
            self.published.set()

    def sync_once(self) -> str:
        """One reconciliation; returns what it did ("created", "updated", "unchanged")."""
        have = self.api.slices(f"spec.nodeName={self.node},spec.driver={DRIVER}")
        name = slice_name(self.node)
        mine = next((s for s in have if s["metadata"]["name"] == name), None)
        for other in have:
            if other is not mine:
                self.api.delete_slice(other["metadata"]["name"])
                log.info("deleted duplicate ResourceSlice %s", other["metadata"]["name"])
        gens = [int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) for s in have]
        current = max(gens, default=0)
        want = slice_spec(self.node, self.gpus(), self.healthy(), self.driver_version, current)
        if mine is not None and len(have) == 1 and same_devices(mine.get("spec") or {}, want):
            self.generation = current
            return "unchanged"
        want["pool"]["generation"] = current + 1 if have else 0
        body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "ResourceSlice",
                                "metadata": {"name": name}, "spec": want}
        uid = self.node_uid()
        if uid:  # garbage-collected with the node, as the kubelet's own helper does
            body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                                    "uid": uid, "controller": True}]
        if mine is None:
            self.api.create_slice(body)
            what = "created"
        else:
            body["metadata"]["resourceVersion"] = mine["metadata"]["resourceVersion"]
            self.api.replace_slice(name, body)
            what = "updated"
        self.generation = want["pool"]["generation"]
        log.info("ResourceSlice %s %s: %d device(s), pool generation %d", name, what, len(want["devices"]),
                 self.generation)
        return what

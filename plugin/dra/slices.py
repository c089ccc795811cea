"""DRA: the node's ResourceSlice (resource.k8s.io/v1): one device per GPU, shared by memory.

One slice per node, created with `generateName: <node>-memslice.io-` cut to 58 characters (what the API server keeps
of it; uncut, it is an invalid generateName for a node name over 240 characters, and so it would be for the
kubeletplugin helper, which does not cut it) and found again by field selector (`spec.nodeName`, `spec.driver`),
never by name: pool = the node name, `resourceSliceCount: 1`. Each device `gpu-<index>` has attributes uuid, index,
productName, numaNode (when known), driverVersion, and the standard `resource.kubernetes.io/pcieRoot` and
`resource.kubernetes.io/pciBusID` (when NVML reports the PCI address; claims align GPUs with NICs on them), a
`capacity.memory` with a requestPolicy (1Mi steps, see REQUEST_*), a `capacity.compute` of 100 (percent of the
GPU's time; a claim that names none consumes 0), and `allowMultipleAllocations: true`, so
kube-scheduler hands out shares of it (KEP-5075 consumable capacity). A GPU that turns Unhealthy gets the NoSchedule
device taint `memslice.io/unhealthy` (resource.k8s.io/v1 DeviceTaint: running claims stay visible, new ones avoid
it); where the API server drops taints (DRADeviceTaints off) the device is withdrawn instead. The publisher keeps
exactly one slice: a restart updates it in place, never duplicates it. Every change of the devices bumps
`pool.generation` (the scheduler ignores slices of an older generation of the pool). Each write is stamped with the
annotation memslice.io/writer (start time and pod UID of the instance): during a rolling update the old instance
leaves a slice written by a newer one alone, so two versions never rewrite it back and forth.

Feature gates: fields the API server drops are detected by comparing what was sent with what it stored. Without
DRAConsumableCapacity (off by default before Kubernetes 1.36) `allowMultipleAllocations` and `requestPolicy`
are dropped: the agent says so once (log, a Warning Event on its Node, and /readyz answers 503 with the gate to
turn on) and compares later slices in the form the server keeps, so it does not rewrite the slice and bump the
generation at every resync. It sends the full slice again only when probing: at start, when the kubelet
registers the driver again, and every PROBE_S.

The slice is watched (field selector, bounded reconnecting watch): a slice deleted or edited by someone else
(the kubelet wipes a driver's slices 30 s after it goes away) is repaired at once; RESYNC_S stays as a backstop.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..gpu.nvml import GpuInfo
from .kube import DraApi, KubeError
from .prepare import CAPACITY, COMPUTE_CAPACITY, DRIVER, UNHEALTHY_TAINT, device_name, quantity_bytes

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
# requestPolicy: a claim that names no memory gets REQUEST_DEFAULT_MIB; smaller requests are raised to
# REQUEST_MIN_MIB (below that a CUDA context alone, ~300 MiB, would not fit); 1 MiB steps.
REQUEST_MIN_MIB = 256
REQUEST_DEFAULT_MIB = 1024
REQUEST_STEP = "1Mi"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
TAINT_KEY = UNHEALTHY_TAINT["key"]
RESYNC_S = 300.0  # a backstop only: the watch repairs at once
PROBE_S = 3600.0  # how often fields the API server dropped are offered again (a gate may have been turned on)
WATCH_S = 60  # timeoutSeconds of one watch request; then it is re-opened
MAX_WATCH_LINE = 4 * 1024 * 1024  # one event of this node's one slice: far less
MAX_GENERATED_PREFIX = 58  # apimachinery's maxGeneratedNameLength (63 - 5 random characters)
WRITER = f"{DRIVER}/writer"  # annotation: "<start time, ns>/<pod uid>" of the agent that wrote the slice
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
DEVICE_TAINTS = "DRADeviceTaints"
_BDF = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\Z")
_PCI_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}\Z")
_VERSION = re.compile(r"(\d{1,9})(?:\.(\d{1,9}))?(?:\.(\d{1,9}))?")


def generate_name(node: str) -> str:
    """The slice's generateName, `<node>-memslice.io-` cut to the 58 characters the API server keeps (it adds 5
    random ones). Cut here, not only there: the API server also validates generateName itself as a DNS
    subdomain of at most 253 characters (its trailing "-" masked), which `<node>-memslice.io-` is not for a
    node name over 240 characters, nor a prefix ending in "."."""
    base = f"{node}-{DRIVER}"
    if len(base) > MAX_GENERATED_PREFIX - 1:
        base = base[:MAX_GENERATED_PREFIX - 1].rstrip(".-")
    return base + "-"


def semver(version: str) -> str | None:
    """NVIDIA's "535.104.05" as the semantic version 535.104.5 (semver forbids leading zeros; missing parts
    are 0; anything after the dotted numbers is dropped); None when it does not start with a number."""
    m = _VERSION.match(version.strip())
    if not m:
        return None
    return ".".join(str(int(p)) if p else "0" for p in m.groups())


def pci_bus_id(nvml_bus_id: str) -> str | None:
    """NVML's "00000000:3B:00.0" as the standard attribute's "0000:3b:00.0" (domain:bus:device.function, lower
    case, 4-digit domain, as sysfs names it); None when it is not a PCI address."""
    m = _BDF.match(nvml_bus_id.strip())
    if not m or int(m.group(1), 16) > 0xFFFF:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def pcie_root(bdf: str, sysfs: Path = Path("/sys")) -> str | None:
    """The PCIe root complex of a device, "pci0000:00": the first component under /sys/devices of the path
    /sys/bus/pci/devices/<bdf> links to (what k8s.io/dynamic-resource-allocation/deviceattribute reads)."""
    try:
        target = os.path.realpath(sysfs / "bus" / "pci" / "devices" / bdf)
    except OSError:
        return None
    rel = Path(target).relative_to(sysfs) if Path(target).is_relative_to(sysfs) else None
    if rel is None or len(rel.parts) < 3 or rel.parts[0] != "devices" or not _PCI_ROOT.match(rel.parts[1]):
        return None
    return rel.parts[1]


def mib_quantity(mib: int) -> str:
    """MiB in the API server's canonical form (16384 -> "16Gi", 1536 -> "1536Mi"): what it stores and returns,
    so that a slice read back compares equal to the one built."""
    for suffix, size in (("Ti", 1 << 20), ("Gi", 1 << 10)):
        if mib and mib % size == 0:
            return f"{mib // size}{suffix}"
    return f"{mib}Mi"


def _normalised(spec: Mapping[str, Any]) -> Any:
    """`spec` with every capacity quantity in bytes, the generation zeroed and taints' timeAdded dropped (for
    comparisons)."""
    def q(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: q(x) for k, x in v.items()}
        try:
            return quantity_bytes(v)
        except ValueError:
            return v

    devices = []
    for d in spec.get("devices") or []:
        d = {**d, "capacity": q(d.get("capacity") or {})}
        if d.get("taints"):
            d["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]
        devices.append(d)
    return {**spec, "devices": devices, "pool": {**(spec.get("pool") or {}), "generation": 0}}


@dataclass(frozen=True)
class Pci:
    bus_id: str
    root: str | None


def device_entry(gpu: GpuInfo, capacity_mib: int, driver_version: str | None, pci: Pci | None = None,
                 healthy: bool = True) -> dict[str, Any]:
    attrs: dict[str, Any] = {"uuid": {"string": gpu.uuid}, "index": {"int": gpu.index},
                             "productName": {"string": gpu.model[:64]}}
    if gpu.numa is not None:
        attrs["numaNode"] = {"int": gpu.numa}
    version = semver(driver_version) if driver_version else None
    if version is not None:
        attrs["driverVersion"] = {"version": version}
    if pci is not None:
        attrs[PCI_BUS_ID] = {"string": pci.bus_id}
        if pci.root is not None:
            attrs[PCIE_ROOT] = {"string": pci.root}
    lo = min(REQUEST_MIN_MIB, capacity_mib - 1)
    default = max(lo, min(REQUEST_DEFAULT_MIB, capacity_mib))
    policy = {"default": mib_quantity(default), "validRange": {
        "min": mib_quantity(lo), "max": mib_quantity(capacity_mib), "step": REQUEST_STEP}}
    # the GPU's time in percent; a claim that names no compute consumes none (best effort)
    compute = {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100",
                                                                               "step": "1"}}}
    out = {"name": device_name(gpu.index), "attributes": attrs, "allowMultipleAllocations": True,
           "capacity": {CAPACITY: {"value": mib_quantity(capacity_mib), "requestPolicy": policy},
                        COMPUTE_CAPACITY: compute}}
    if not healthy:
        out["taints"] = [dict(UNHEALTHY_TAINT)]
    return out


def capacities(gpus: Sequence[GpuInfo]) -> dict[int, int]:
    """Memory each GPU offers to claims, in MiB (all of it: memslice keeps nothing back; the shim charges
    each process's CUDA context to its own quota)."""
    return {g.index: g.mem_mib for g in gpus}


def slice_spec(node: str, gpus: Sequence[GpuInfo], healthy: Mapping[str, bool], driver_version: str | None,
               generation: int, pci: Mapping[str, Pci] | None = None, taints: bool = True) -> dict[str, Any]:
    """The slice's spec. An unhealthy GPU is tainted (`taints`), or left out where taints are not kept."""
    caps = capacities(gpus)
    devices = [device_entry(g, caps[g.index], driver_version, (pci or {}).get(g.uuid), healthy.get(g.uuid, False))
               for g in sorted(gpus, key=lambda g: g.index)
               if (taints or healthy.get(g.uuid, False)) and caps[g.index] > 1]
    return {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "devices": devices}


def server_form(spec: Mapping[str, Any], dropped: frozenset[str]) -> dict[str, Any]:
    """`spec` as an API server with the gates in `dropped` off stores it (their fields removed)."""
    devices = []
    for d in spec.get("devices") or []:
        d = dict(d)
        if CONSUMABLE_CAPACITY in dropped:
            d.pop("allowMultipleAllocations", None)
            d["capacity"] = {k: {x: y for x, y in c.items() if x != "requestPolicy"}
                             for k, c in (d.get("capacity") or {}).items()}
        if DEVICE_TAINTS in dropped:
            d.pop("taints", None)
        devices.append(d)
    return {**spec, "devices": devices}


def dropped_gates(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> frozenset[str]:
    """The feature gates whose fields the API server dropped from `sent` (compared with what it `stored`)."""
    got = {d.get("name"): d for d in stored.get("devices") or [] if isinstance(d, dict)}
    out = set()
    for d in sent.get("devices") or []:
        g = got.get(d["name"]) or {}
        if "allowMultipleAllocations" in d and "allowMultipleAllocations" not in g:
            out.add(CONSUMABLE_CAPACITY)
        if d.get("taints") and not g.get("taints"):
            out.add(DEVICE_TAINTS)
    return frozenset(out)


def same_devices(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal but for the generation and the spelling of quantities (what a restart must not rewrite)."""
    return bool(_normalised(a) == _normalised(b))


def newer_writer(slice_: Mapping[str, Any], mine: str) -> bool:
    """True when `slice_` was written by another agent instance that started after this one (`mine`, the
    WRITER value of this instance): during a rolling update the old instance leaves the slice to the new one
    instead of rewriting it back to its own version's form."""
    theirs = str(((slice_.get("metadata") or {}).get("annotations") or {}).get(WRITER) or "")
    if not theirs or theirs == mine:
        return False
    try:
        return int(theirs.split("/", 1)[0]) > int(mine.split("/", 1)[0])
    except ValueError:
        return False


def gate_problem(gates: frozenset[str]) -> str | None:
    """What to tell the operator about gates that are off (None: nothing that stops memslice)."""
    if CONSUMABLE_CAPACITY not in gates:
        return None
    return (f"kube-apiserver dropped allowMultipleAllocations and requestPolicy from this node's ResourceSlice: "
            f"the {CONSUMABLE_CAPACITY} feature gate is off (the default before Kubernetes 1.36), so no claim can "
            f"get a share of a memslice GPU. Turn it on in kube-apiserver, kube-scheduler and "
            f"every kubelet (--feature-gates={CONSUMABLE_CAPACITY}=true; the kubelet's config file: "
            f"featureGates: {{{CONSUMABLE_CAPACITY}: true}}), then restart the memslice node agents")


class SlicePublisher:
    """Keeps the node's one ResourceSlice equal to `devices()`; republishes on `mark_dirty` (health changes,
    the kubelet registering the driver again: `probe=True` offers dropped fields again), on any change the
    watch sees to the node's slices of this driver, retries with backoff, and re-checks every `resync_s`."""

    def __init__(self, api: DraApi, node: str, gpus: Callable[[], Sequence[GpuInfo]],
                 healthy: Callable[[], Mapping[str, bool]], driver_version: str | None,
                 node_uid: Callable[[], str | None], resync_s: float = RESYNC_S,
                 pci: Mapping[str, Pci] | None = None, on_problem: Callable[[str], None] | None = None,
                 watch: bool = True, instance: str = "") -> None:
        self.api = api
        self.node = node
        self.gpus = gpus
        self.healthy = healthy
        self.driver_version = driver_version
        self.node_uid = node_uid
        self.resync_s = resync_s
        self.pci = dict(pci or {})
        self.on_problem = on_problem
        self.published = threading.Event()
        self.generation = 0
        self.name: str | None = None
        self.dropped: frozenset[str] = frozenset()  # gates whose fields the API server drops
        self.problem: str | None = None  # set once DRAConsumableCapacity is found off
        self.syncs = 0
        self.writer = f"{time.time_ns()}/{instance}"
        self.watches = 0  # watch requests that ended normally
        self._probe_at = 0.0  # monotonic time of the next probe (0: at the next sync)
        self._last_sent: list[dict[str, Any]] = []
        self._own_rvs: collections.deque[str] = collections.deque(maxlen=32)
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resourceslice", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="resourceslice-watch", daemon=True) if watch \
            else None
        self._watch_resp: Any = None

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node},spec.driver={DRIVER}"

    def start(self) -> None:
        self._dirty.set()
        self._thread.start()
        if self._watcher is not None:
            self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        resp = self._watch_resp
        if resp is not None:
            try:
                resp.shutdown()  # unblocks the watcher's read at once
            except Exception as exc:  # already closed
                log.debug("closing the ResourceSlice watch: %s", exc)
        for t in (self._thread, self._watcher):
            if t is not None and t.is_alive():
                t.join(timeout=10)

    def mark_dirty(self, probe: bool = False) -> None:
        if probe:
            self._probe_at = 0.0
        self._dirty.set()

    # --- the writer ----------------------------------------------------------------------------------------
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
                    hint += (" (the agent's service account needs list/watch/create/update/delete on "
                             "resourceslices.resource.k8s.io, and may write only its own node's slices)")
                if failures == 1 or failures % 10 == 0:
                    log.warning("publishing the ResourceSlice of node %s failed (%d times): %s; retrying",
                                self.node, failures, hint)
                backoff = min(backoff * 2, 30.0)
                continue
            if failures:
                log.info("ResourceSlice of node %s published after %d failed attempts", self.node, failures)
            backoff, failures = 0.5, 0
            self.published.set()

    def _want(self, generation: int) -> dict[str, Any]:
        return slice_spec(self.node, self.gpus(), self.healthy(), self.driver_version, generation, self.pci,
                          taints=DEVICE_TAINTS not in self.dropped)

    def sync_once(self) -> str:
        """One reconciliation; returns what it did ("created", "updated", "unchanged")."""
        self.syncs += 1
        have = sorted(self.api.slices(self.selector),
                      key=lambda s: (-int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0),
                                     s["metadata"]["name"]))
        mine = have[0] if have else None  # the newest generation is kept, found by selector (not by name)
        for other in have[1:]:
            self.api.delete_slice(other["metadata"]["name"])
            log.info("deleted duplicate ResourceSlice %s", other["metadata"]["name"])
        current = int(((mine or {}).get("spec") or {}).get("pool", {}).get("generation") or 0) if mine else 0
        if mine is not None and newer_writer(mine, self.writer):
            self.generation, self.name = current, mine["metadata"]["name"]
            return "deferred"  # a newer instance of the agent (rolling update) owns the slice now
        probe = time.monotonic() >= self._probe_at
        want = self._want(current)
        if mine is not None and len(have) == 1:
            stored = mine.get("spec") or {}
            if same_devices(stored, want) or (not probe and same_devices(stored, server_form(want, self.dropped))):
                self.generation, self.name = current, mine["metadata"]["name"]
                if probe:
                    self._probe_at = time.monotonic() + PROBE_S
                return "unchanged"
        want["pool"]["generation"] = current + 1 if have else 0
        meta: dict[str, Any] = {"annotations": {WRITER: self.writer}}
        uid = self.node_uid()
        if uid:  # garbage-collected with the node, as the kubelet's own helper does
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid,
                                        "controller": True}]
        body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": want}
        if mine is None:
            meta["generateName"] = generate_name(self.node)
            got = self.api.create_slice(body)
            what = "created"
        else:
            meta["name"] = mine["metadata"]["name"]
            meta["resourceVersion"] = mine["metadata"]["resourceVersion"]
            got = self.api.replace_slice(meta["name"], body)
            what = "updated"
        got_meta = (got or {}).get("metadata") or {}
        if got_meta.get("resourceVersion"):
            self._own_rvs.append(str(got_meta["resourceVersion"]))
        self.generation, self.name = want["pool"]["generation"], got_meta.get("name")
        self._probe_at = time.monotonic() + PROBE_S
        log.info("ResourceSlice %s %s: %d device(s), pool generation %d", self.name, what, len(want["devices"]),
                 self.generation)
        self._last_sent = want.get("devices") or []
        self._learn(dropped_gates(want, (got or {}).get("spec") or {}))
        return what

    def _learn(self, dropped: frozenset[str]) -> None:
        """Record which gates the API server has off; say once what that means; write again if a fallback
        (a withdrawn device instead of a taint) is needed."""
        before = self.dropped
        if not any(d.get("taints") for d in self._last_sent):  # nothing to learn about taints from this write
            dropped |= before & {DEVICE_TAINTS}
        self.dropped = dropped
        if DEVICE_TAINTS in dropped - before:
            log.info("kube-apiserver dropped the device taint of an unhealthy GPU (%s is off): unhealthy GPUs are "
                     "withdrawn from the ResourceSlice instead", DEVICE_TAINTS)
            self._dirty.set()
        problem, before_problem = gate_problem(dropped), self.problem
        self.problem = problem  # first: /readyz says it by the time anyone hears of it
        if problem and not before_problem:
            log.error("%s", problem)
            if self.on_problem is not None:
                self.on_problem(problem)
        elif before_problem and not problem:
            log.info("kube-apiserver now keeps allowMultipleAllocations: %s is on", CONSUMABLE_CAPACITY)

    # --- the watcher ---------------------------------------------------------------------------------------
    def _watch(self) -> None:
        """LIST for a resourceVersion, then WATCH from it, WATCH_S per request, re-opened from the last version
        seen (bookmarks included); any change that is not our own write marks the slice dirty. After an error
        or an ERROR event (410 Gone: the version is too old) it LISTs again, after a bounded backoff, and
        reconciles once (a change may have been missed)."""
        backoff, rv, failures = 0.5, "", 0
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self.api.slices_version(self.selector)
                    self._dirty.set()
                for kind, obj_rv in self.api.watch_slices(self.selector, rv, WATCH_S, MAX_WATCH_LINE, self._hold):
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":
                        rv = ""
                        break
                    rv = obj_rv or rv
                    if kind in ("ADDED", "MODIFIED", "DELETED") and obj_rv not in self._own_rvs:
                        self._dirty.set()
                self.watches += 1
                backoff, failures = 0.5, 0
            except Exception as exc:  # the API server away, the connection dropped: LIST again, bounded
                if self._stop.is_set():
                    return
                rv, failures = "", failures + 1
                if isinstance(exc, KubeError) and exc.status == 403 and failures in (1, 10):
                    log.warning("cannot watch ResourceSlices (%s): grant watch on resourceslices.resource.k8s.io "
                                "to the agent (deploy/overlays/dra/rbac.yaml); until then a deleted slice is "
                                "repaired only at the %.0f s resync", exc, self.resync_s)
                elif failures == 10:
                    log.warning("the ResourceSlice watch keeps failing (%s); retrying every %.0f s at most", exc,
                                30.0)
                log.debug("ResourceSlice watch ended (%s); again in %.1f s", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _hold(self, resp: Any) -> None:
        self._watch_resp = resp
        if self._stop.is_set():
            raise OSError("stopping")

"""resource.k8s.io/v1 for the API stand-in (tests/support/kube_store.py): ResourceSlices, ResourceClaims and
DeviceClasses (list/watch/get/create/update/patch/delete over HTTP, like every stand-in resource), and
`allocate()`, which writes a claim's allocation the way kube-scheduler does for consumable capacity
(KEP-5075, resource.k8s.io/v1 field docs):

- each request of the claim (`exactly` with `count`, default 1; or `firstAvailable`: the first subrequest
  that fits, its result named `<request>/<subrequest>`, as the real allocator names it) asks, per capacity of
  the device, `capacity.requests.<name>`, or the capacity's `requestPolicy.default` when it names none (the
  whole capacity without a policy); the amount is raised to `validRange.min` and rounded up to
  `min + n*step`; over `validRange.max` the device cannot be used;
- devices are taken first-fit, in slice and device order (upstream has no device scoring yet), among the
  node's slices of the class's driver with `allowMultipleAllocations: true`, where for every capacity the sum
  of the `consumedCapacity` of every allocated claim plus this amount stays within its `value`; the `count`
  shares of one request go to different devices (a request never takes one device twice);
- the result carries `request`, `driver`, `pool`, `device`, a fresh `shareID` and `consumedCapacity`
  (every capacity of the device, as the API requires); `config` gets each class's opaque config once (source
  FromClass, without `requests`: for all the requests of that class) then the claim's (FromClaim);
  `nodeSelector` pins the node; `reservedFor` names the pod.

These rules are checked case by case against the real kube-scheduler: tests/dra/test_dra_allocator_real.py.

ResourceSlices written over HTTP are treated as kube-apiserver treats them (pkg/registry/resource/resourceslice
strategy.go, apimachinery names.SimpleNameGenerator, metadata validation):
- `generateName`: validated as a DNS subdomain of at most 253 characters (a trailing "-" masked), then cut to
  58 characters and 5 random characters appended (a name of at most 63);
- `metadata.name` must be a DNS subdomain of at most 253 characters (422 Invalid otherwise);
- fields of a disabled feature gate are dropped unless the stored object already uses them:
  DRAConsumableCapacity (`allowMultipleAllocations`, `capacity.*.requestPolicy`; off by default before 1.36)
  and DRADeviceTaints (`taints`). `set_gates(kube, DRAConsumableCapacity=False, ...)` switches them; both are
  on by default here (a 1.37 cluster with DRADeviceTaints enabled).

What it does not do: evaluate CEL selectors (the class's driver is read from `DeviceClass.spec.selectors`
by the pattern `device.driver == "<name>"`), constraints, admin access, allocationMode All.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import kube_store
from kube_standin import KubeApiStandin

from memslice.plugin.dra.prepare import quantity_bytes

GROUP_VERSION = "resource.k8s.io/v1"
_NEW = {"resourceslices": ("ResourceSlice", False), "resourceclaims": ("ResourceClaim", True),
        "deviceclasses": ("DeviceClass", False)}
for _plural, (_kind, _namespaced) in _NEW.items():
    kube_store.RESOURCES[_plural] = (_kind, _namespaced)
    kube_store.KIND_TO_PLURAL[_kind.lower()] = _plural
    kube_store.API_VERSIONS[_plural] = GROUP_VERSION

GATES_DEFAULT = {"DRAConsumableCapacity": True, "DRADeviceTaints": True}
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
MAX_GENERATED_PREFIX = 58  # maxGeneratedNameLength = 63 - 5 random characters


def set_gates(kube: KubeApiStandin, **gates: bool) -> None:
    """Switch the API server's DRA feature gates (see the module docstring)."""
    kube.store.dra_gates = {**GATES_DEFAULT, **gates}  # type: ignore[attr-defined]


def _gates(store: kube_store.Store) -> dict[str, bool]:
    return getattr(store, "dra_gates", GATES_DEFAULT)


def _uses(spec: dict[str, Any] | None, gate: str) -> bool:
    for d in (spec or {}).get("devices") or []:
        if gate == "DRAConsumableCapacity" and ("allowMultipleAllocations" in d or any(
                isinstance(c, dict) and "requestPolicy" in c for c in (d.get("capacity") or {}).values())):
            return True
        if gate == "DRADeviceTaints" and d.get("taints"):
            return True
    return False


def _drop_disabled(store: kube_store.Store, new: dict[str, Any], old: dict[str, Any] | None) -> None:
    gates = _gates(store)
    spec = new.get("spec") if isinstance(new.get("spec"), dict) else None
    old_spec = (old or {}).get("spec")
    for d in (spec or {}).get("devices") or []:
        if not isinstance(d, dict):
            continue
        if not gates["DRAConsumableCapacity"] and not _uses(old_spec, "DRAConsumableCapacity"):
            d.pop("allowMultipleAllocations", None)
            for c in (d.get("capacity") or {}).values():
                if isinstance(c, dict):
                    c.pop("requestPolicy", None)
        if not gates["DRADeviceTaints"] and not _uses(old_spec, "DRADeviceTaints"):
            d.pop("taints", None)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise kube_store.ApiError(422, "Invalid", f"ResourceSlice.resource.k8s.io {str(name)[:80]!r} is invalid: "
                                  f"metadata.name: Invalid value: a lowercase RFC 1123 subdomain of at most 253 "
                                  f"characters is required")


_validate_new = kube_store.Store._validate_new
_commit = kube_store.Store.commit


def _validate_new_dra(self: kube_store.Store, plural: str, ns: str | None, body: Any) -> dict[str, Any]:
    if plural == "resourceslices" and isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        meta = body["metadata"]
        if not meta.get("name") and isinstance(meta.get("generateName"), str):
            prefix = meta["generateName"]
            masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix  # validation.NameIsDNSSubdomain(prefix)
            if len(masked) > 253 or not _DNS_SUBDOMAIN.match(masked):
                raise kube_store.ApiError(422, "Invalid", f"ResourceSlice.resource.k8s.io is invalid: "
                                          f"metadata.generateName: Invalid value: {prefix[:80]!r}: a lowercase RFC "
                                          f"1123 subdomain of at most 253 characters is required")
            meta["name"] = prefix[:MAX_GENERATED_PREFIX] + uuid.uuid4().hex[:5]
    obj = _validate_new(self, plural, ns, body)
    if plural == "resourceslices":
        _check_name(obj["metadata"]["name"])
        _drop_disabled(self, obj, None)
    return obj


def _commit_dra(self: kube_store.Store, plural: str, ns: str | None, name: str, sub: str | None,
                cur: dict[str, Any], new: Any, precondition_rv: str | None) -> dict[str, Any]:
    if plural == "resourceslices" and isinstance(new, dict):
        _drop_disabled(self, new, cur)
    return _commit(self, plural, ns, name, sub, cur, new, precondition_rv)


kube_store.Store._validate_new = _validate_new_dra  # type: ignore[method-assign]
kube_store.Store.commit = _commit_dra  # type: ignore[method-assign]

_DRIVER_IN_CEL = re.compile(r'device\.driver\s*==\s*"([^"]+)"')
_UNITS = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


class Unschedulable(Exception):
    pass


def quantity(n: int) -> str:
    """Bytes as the API server's canonical binary quantity (4294967296 -> "4Gi")."""
    for suffix, size in _UNITS:
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def device_class(name: str = "gpu-mem.memslice.io", driver: str = "memslice.io",
                 config: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}" && '
                                                                 f"device.allowMultipleAllocations == true"}}]}
    if config is not None:
        spec["config"] = [{"opaque": {"driver": driver, "parameters": config}}]
    return {"apiVersion": GROUP_VERSION, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def claim(name: str, memory: str | None, namespace: str = "default", class_name: str = "gpu-mem.memslice.io",
          request: str = "gpu", config: dict[str, Any] | None = None, driver: str = "memslice.io"
          ) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": class_name}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    devices: dict[str, Any] = {"requests": [{"name": request, "exactly": exactly}]}
    if config is not None:
        devices["config"] = [{"requests": [request], "opaque": {"driver": driver, "parameters": config}}]
    return {"apiVersion": GROUP_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}


Key = tuple[str, str, str, str]  # (driver, pool, device, capacity)


def _consumed(kube: KubeApiStandin) -> dict[Key, Decimal]:
    """(driver, pool, device, capacity) -> what every allocated claim consumes of it."""
    out: dict[Key, Decimal] = {}
    for c in kube.list("ResourceClaim"):
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
            for cap, amount in (r.get("consumedCapacity") or {}).items():
                key = (r["driver"], r["pool"], r["device"], cap)
                out[key] = out.get(key, Decimal(0)) + quantity_bytes(amount)
    return out


def consumed_amount(requested: Decimal | None, cap: dict[str, Any]) -> Decimal | None:
    """The amount a request consumes of a capacity with a requestPolicy (None: the device cannot serve it)."""
    policy = cap.get("requestPolicy") or {}
    value = quantity_bytes(cap["value"])
    if requested is None:
        requested = quantity_bytes(policy["default"]) if "default" in policy else value
    rng = policy.get("validRange")
    if rng:
        lo = quantity_bytes(rng["min"])
        amount = max(requested, lo)
        if "step" in rng:
            step = int(quantity_bytes(rng["step"]))
            amount = lo + (int(amount - lo) + step - 1) // step * step  # up to min + n*step
        if "max" in rng and amount > quantity_bytes(rng["max"]):
            return None
        return amount
    return requested


def _allocate_one(kube: KubeApiStandin, exactly: dict[str, Any], slices: list[dict[str, Any]],
                  used: dict[Key, Decimal], node: str, what: str
                  ) -> tuple[list[tuple[str, str, str, dict[str, Decimal]]], dict[str, Any]]:
    """`count` shares (default 1, each on a different device) for one request or subrequest, first-fit; each
    share consumes of every capacity of its device; Unschedulable when they do not fit."""
    cls = kube.get("DeviceClass", None, exactly["deviceClassName"])
    if cls is None:
        raise Unschedulable(f"DeviceClass {exactly['deviceClassName']} not found")
    drivers = {m for sel in cls["spec"].get("selectors", []) for m in _DRIVER_IN_CEL.findall(sel["cel"]["expression"])}
    wanted = (exactly.get("capacity") or {}).get("requests") or {}
    trial = dict(used)
    got: list[tuple[str, str, str, dict[str, Decimal]]] = []
    for _ in range(int(exactly.get("count", 1))):
        chosen = None
        for s in slices:
            if drivers and s["spec"]["driver"] not in drivers:
                continue
            for d in s["spec"].get("devices", []):
                caps = d.get("capacity") or {}
                dev = (s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])
                if not d.get("allowMultipleAllocations") or any(g[:3] == dev for g in got) or any(
                        n not in caps for n in wanted):
                    continue
                amounts = {n: consumed_amount(quantity_bytes(wanted[n]) if n in wanted else None, c)
                           for n, c in caps.items()}
                if any(a is None or trial.get((*dev, n), Decimal(0)) + a > quantity_bytes(caps[n]["value"])
                       for n, a in amounts.items()):
                    continue
                chosen = (dev, {n: a for n, a in amounts.items() if a is not None})
                break
            if chosen:
                break
        if chosen is None:
            raise Unschedulable(f"no device on {node} has {wanted} free for {what}")
        dev, amounts = chosen
        for n, a in amounts.items():
            trial[(*dev, n)] = trial.get((*dev, n), Decimal(0)) + a
        got.append((*dev, amounts))
    return got, cls


def allocate(kube: Any, namespace: str, name: str, node: str, pod: dict[str, Any] | None = None,
             edit: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Allocate claim namespace/name on `node` as kube-scheduler would; returns the stored claim. `edit` changes
    the claim's status before it is written (once: a real API server refuses to change an allocation): a test
    writing what another or a hostile scheduler would."""
    c = kube.get("ResourceClaim", namespace, name)
    assert c is not None, f"no claim {namespace}/{name}"
    used = _consumed(kube)
    slices = sorted((s for s in kube.list("ResourceSlice") if s["spec"].get("nodeName") == node),
                    key=lambda s: s["metadata"]["name"])
    results: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    classes: list[str] = []
    for req in c["spec"]["devices"]["requests"]:
        if "firstAvailable" in req:
            alternatives = [(f"{req['name']}/{sub['name']}", sub) for sub in req["firstAvailable"]]
        else:
            alternatives = [(req["name"], req["exactly"])]
        for i, (result_name, exactly) in enumerate(alternatives):
            try:
                got, cls = _allocate_one(kube, exactly, slices, used, node, f"{namespace}/{name}")
            except Unschedulable:
                if i == len(alternatives) - 1:
                    raise
                continue
            for drv, pool, dev, amounts in got:
                for n, a in amounts.items():
                    used[(drv, pool, dev, n)] = used.get((drv, pool, dev, n), Decimal(0)) + a
                results.append({"request": result_name, "driver": drv, "pool": pool, "device": dev,
                                "shareID": str(uuid.uuid4()),
                                "consumedCapacity": {n: quantity(int(a)) for n, a in amounts.items()}})
            if cls["metadata"]["name"] not in classes:  # once per class, for all its requests: no `requests`
                classes.append(cls["metadata"]["name"])
                configs.extend({"source": "FromClass", **cfg} for cfg in cls["spec"].get("config", []))
            break
    for cfg in c["spec"]["devices"].get("config", []):
        configs.append({"source": "FromClaim", **cfg})
    status: dict[str, Any] = {"allocation": {
        "devices": {"results": results, **({"config": configs} if configs else {})},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    if pod is not None:
        status["reservedFor"] = [{"resource": "pods", "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"]["uid"]}]
    c["status"] = status
    if edit is not None:
        edit(c)
    return kube.put(c)

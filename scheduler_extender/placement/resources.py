"""What a pod asks for: `memslice.io/gpu-mem` quantities per container, read from a pod object (a dict in
Kubernetes JSON). Pure functions; errors name the container, the value and the fix.

Init containers: a pod's GPU memory is the Kubernetes "effective request" rule applied to GPU MiB:
  max( largest regular init container + the sidecars declared before it,
       sum of app containers + all sidecars )
where sidecars are init containers with `restartPolicy: Always` (they keep running next to the app
containers). Regular init containers run one at a time, before the app containers, so their memory is
never needed at the same time as the app containers'. Every asking container (init, sidecar or app) gets
its own entry in the `memslice.io/gpu-mem-mib` annotation, so the node agent can give each its quota.

Pods that span GPUs (`memslice.io/gpu-count: N`, contract.ANN_GPU_COUNT): each container's `memslice.io/gpu-mem`
(and `memslice.io/gpu-compute`) is its TOTAL over the N GPUs, and elastic limits (`memslice.io/gpu-mem-limit`)
are totals too; a total not divisible by N is refused by name (contract.split_even). A PodRequest holds the
PER-GPU figures (what every decision fits on each GPU) and `gpus`; the bind record's MiB are totals again
(`container_mib_total`), its compute shares per GPU (contract.ANN_GPU_COMPUTE). The compute limit annotation is
a percent of one GPU: each GPU's cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from memslice import errors
from memslice.contract import (  # (MAX_DEVICES, RequestError, parse_devices: this module's names too)
    ANN_GPU_COMPUTE_LIMIT,
    ANN_GPU_COUNT,
    ANN_POLICY,
    MAX_DEVICES,
    MAX_PERCENT,
    POLICIES,
    RESOURCE,
    RESOURCE_COMPUTE,
    ComputeShare,
    RequestError,
    check_share,
    container_devices,
    parse_compute_limit,
    parse_devices,
    parse_gpu_count,
    split_even,
)
from memslice.elastic import LimitAnnotationError, limit_mib

__all__ = ["MAX_DEVICES", "RequestError", "parse_devices"]  # (re-exported from memslice.contract)


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    name: str
    devices: int
    kind: str  # "app", "init" or "sidecar"
    compute: int = 0  # percent of the GPU's time (memslice.io/gpu-compute); 0: best effort
    compute_limit: int | None = None  # memslice.io/gpu-compute-limit; None: no cap


@dataclass(frozen=True, slots=True)
class PodRequest:
    """The memslice asks of one pod, in devices (MiB = devices × the node's unit), on EACH of its `gpus` GPUs
    (the module's docstring: a pod spanning GPUs is held as its per-GPU share)."""

    asks: tuple[ContainerAsk, ...]
    policy: str | None  # from the pod annotation; None = the extender's default
    limits: tuple[tuple[str, int], ...] = ()  # elastic memory: container -> limit MiB (memslice.io/gpu-mem-limit)
    gpus: int = 1  # memslice.io/gpu-count: GPUs of one node the pod spans, each holding the figures above
    devices: int = dc_field(init=False)  # effective devices on the GPU (module docstring: init containers)
    compute: int = dc_field(init=False)  # effective compute percent on the GPU (the same rule); 0: none asked

    def __post_init__(self) -> None:
        asks = self.asks
        # one app container (the usual pod) is its own effective total: no map, no pass (every watched pod)
        one = len(asks) == 1 and asks[0].kind == "app"
        devices = asks[0].devices if one else effective_total({a.name: a.devices for a in asks}, asks)
        object.__setattr__(self, "devices", devices)
        compute = asks[0].compute if one else effective_total({a.name: a.compute for a in asks}, asks)
        object.__setattr__(self, "compute", compute)

    def compute_record(self) -> tuple[ComputeShare, ...]:
        """The compute shares bind records (contract.ANN_GPU_COMPUTE): containers with a request or a limit."""
        return tuple(sorted(ComputeShare(a.name, a.compute, a.compute_limit) for a in self.asks
                            if a.compute or a.compute_limit is not None))

    def mib(self, unit_mib: int) -> int:
        return self.devices * unit_mib

    def container_mib(self, unit_mib: int) -> dict[str, int]:
        return {a.name: a.devices * unit_mib for a in self.asks}

    def container_mib_total(self, unit_mib: int) -> dict[str, int]:
        """Each container's MiB over all its GPUs (what the bind record holds: contract.ANN_GPU_MEM)."""
        return {a.name: a.devices * unit_mib * self.gpus for a in self.asks}

    @property
    def node_devices(self) -> int:
        """The devices the pod takes of its node in all (what the kubelet counts): per GPU × GPUs."""
        return self.devices * self.gpus

    def limit_sig(self) -> LimitSig:
        """What the pod's limit on a GPU depends on besides the node's unit (the fit memo's key part; see
        limit_total): () when no container has a limit annotation (its limit is its request)."""
        return (self.asks, self.limits) if self.limits else ()

    def limit_mib(self, unit_mib: int) -> int:
        """The pod's limit on its GPU at this unit (what --max-limit-ratio counts): limit_total."""
        return limit_total(self.limit_sig(), unit_mib) if self.limits else self.mib(unit_mib)

    def limit_record(self, unit_mib: int) -> dict[str, int]:
        """Container -> limit MiB for the containers whose limit is above their request at this unit (what
        bind records for the agent: per GPU; limit_record_total for the record of a pod spanning GPUs);
        RequestError naming the annotation when a limit is below the request."""
        mib = self.container_mib(unit_mib)
        out = {}
        for name, lim in self.limits:
            if lim < mib[name]:
                raise RequestError(f"annotation memslice.io/gpu-mem-limit for container {name!r} is {lim} MiB, "
                                   f"below its request of {mib[name]} MiB ({RESOURCE}); set a limit of at least "
                                   f"the request, or remove it")
            if lim > mib[name]:
                out[name] = lim
        return out

    def limit_record_total(self, unit_mib: int) -> dict[str, int]:
        """limit_record over all the pod's GPUs (the record of limits is in totals, as contract.ANN_GPU_MEM)."""
        return {name: lim * self.gpus for name, lim in self.limit_record(unit_mib).items()}


def _with_compute_limit(ask: ContainerAsk, annotations: dict[str, Any]) -> ContainerAsk:
    """The ask with its compute limit (ANN_GPU_COMPUTE_LIMIT[.container]); RequestError naming the value when
    it is not a percent 1..100 or is below the container's compute request."""
    where = f"container {ask.name!r}"
    try:
        limit = parse_compute_limit(annotations, ask.name, where)
        check_share(ask.compute, limit, where)
    except errors.ContractError as exc:
        raise RequestError(str(exc)) from None
    return ContainerAsk(ask.name, ask.devices, ask.kind, ask.compute, limit) if limit is not None else ask


# (asks, limits) of a pod with limit annotations, () without: see PodRequest.limit_sig
LimitSig = tuple[()] | tuple[tuple[ContainerAsk, ...], tuple[tuple[str, int], ...]]


def limit_total(sig: LimitSig, unit_mib: int) -> int:
    """A pod's limit on its GPU: the effective total (init containers as for requests) of each asking
    container's limit, a container without one (or with one below its request) counting its request."""
    if not sig:
        return 0
    asks, limits = sig
    lim = dict(limits)
    return effective_total({a.name: max(a.devices * unit_mib, lim.get(a.name, 0)) for a in asks}, asks)


def effective_total(amounts: Mapping[str, int], asks: tuple[ContainerAsk, ...]) -> int:
    """Effective amount for containers `asks` (in spec order) with `amounts` by container name."""
    app = sum(amounts.get(a.name, 0) for a in asks if a.kind == "app")
    sidecars_so_far = 0
    init_peak = 0
    for a in asks:
        if a.kind == "sidecar":
            sidecars_so_far += amounts.get(a.name, 0)
        elif a.kind == "init":
            init_peak = max(init_peak, amounts.get(a.name, 0) + sidecars_so_far)
    return max(init_peak, app + sidecars_so_far)


def pod_request(pod: Any) -> PodRequest | None:
    """The pod's memslice request; None when no container asks for `memslice.io/gpu-mem`.
    Raises RequestError for a malformed pod or quantity."""
    if not isinstance(pod, dict):
        raise RequestError("Pod is not an object")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise RequestError("Pod.spec is missing or not an object")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    gpus = _gpu_count(annotations)
    asks: list[ContainerAsk] = []
    names: set[str] = set()
    for field, default_kind in (("initContainers", "init"), ("containers", "app")):
        containers = spec.get(field) or []
        if not isinstance(containers, list):
            raise RequestError(f"Pod.spec.{field} is not a list")
        for i, c in enumerate(containers):
            where = f"Pod.spec.{field}[{i}]"
            devices = container_devices(c, where)
            compute = container_devices(c, where, RESOURCE_COMPUTE)
            if compute > MAX_PERCENT * gpus:
                if gpus > 1:
                    raise RequestError(f"{where}: {RESOURCE_COMPUTE}={compute} is over 100 percent on each of its "
                                       f"{gpus} GPUs ({ANN_GPU_COUNT}); ask for at most {MAX_PERCENT * gpus}")
                raise RequestError(f"{where}: {RESOURCE_COMPUTE}={compute} is over 100 percent of one GPU; a "
                                   f"container's compute share is on one GPU: ask for at most 100")
            if compute and not devices:
                raise RequestError(f"{where} asks for {RESOURCE_COMPUTE} without {RESOURCE}: a compute share is "
                                   f"on the GPU that holds the container's memory; ask for {RESOURCE} too")
            name = c.get("name")
            if not isinstance(name, str) or not name:
                if devices:
                    raise RequestError(f"{where} asks for {RESOURCE} but has no name")
                continue
            if name in names:
                raise RequestError(f"{where}: container name {name!r} is used twice")
            names.add(name)
            sidecar = default_kind == "init" and c.get("restartPolicy") == "Always"
            kind = "sidecar" if sidecar else default_kind
            if devices:
                if gpus > 1:
                    devices, compute = _split(devices, compute, gpus, f"container {name!r}")
                asks.append(ContainerAsk(name, devices, kind, compute))
    if not asks:
        return None
    if isinstance(annotations, dict) and any(isinstance(k, str) and k.startswith(ANN_GPU_COMPUTE_LIMIT)
                                             for k in annotations):
        asks = [_with_compute_limit(a, annotations) for a in asks]
    policy = annotations.get(ANN_POLICY) if isinstance(annotations, dict) else None
    if policy is not None and policy not in POLICIES:
        raise RequestError(f"annotation {ANN_POLICY}={policy!r} is not a policy; use one of "
                           f"{', '.join(POLICIES)} (or remove it to use the extender's default)")
    limits = []
    for a in asks:
        try:  # the syntax here (filter and bind); the limit against the request at bind (it needs the unit)
            lim = limit_mib(annotations, a.name, 0) if isinstance(annotations, dict) else None
        except LimitAnnotationError as exc:
            raise RequestError(str(exc)) from None
        if lim is not None:
            limits.append((a.name, _split_limit(lim, gpus, a.name) if gpus > 1 else lim))
    return PodRequest(tuple(asks), policy, tuple(limits), gpus)


def _gpu_count(annotations: Any) -> int:
    """The pod's memslice.io/gpu-count (1 without it); RequestError naming the value and the fix."""
    if not isinstance(annotations, dict) or ANN_GPU_COUNT not in annotations:
        return 1
    try:
        return parse_gpu_count(annotations, "pod")
    except errors.ContractError as exc:
        raise RequestError(str(exc)) from None


def _split(devices: int, compute: int, gpus: int, where: str) -> tuple[int, int]:
    """A container's totals (devices, compute percent) as its share on each of `gpus` GPUs; RequestError with
    the contract's message (the figure and a multiple that divides) when one does not divide evenly."""
    try:
        return (split_even(devices, gpus, RESOURCE, where),
                split_even(compute, gpus, RESOURCE_COMPUTE, where) if compute else 0)
    except errors.ContractError as exc:
        raise RequestError(str(exc)) from None


def _split_limit(limit: int, gpus: int, container: str) -> int:
    """A container's elastic limit (its total over the GPUs, MiB) per GPU; RequestError when it does not divide."""
    try:
        return split_even(limit, gpus, "memslice.io/gpu-mem-limit (MiB)", f"container {container!r}")
    except errors.ContractError as exc:
        raise RequestError(str(exc)) from None

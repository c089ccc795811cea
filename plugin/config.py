"""The node agent's configuration: flags, each with an environment variable, validated in one place.

Imports nothing heavy (it builds `memslice --help`). A bad value raises ConfigError naming the flag or
variable, the value and a valid form; nothing starts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from memslice import errors

from .gpu.health import DEFAULT_IGNORED_XIDS

PRELOAD_MODES = ("file", "env")
VISIBILITY_MODES = ("env", "cdi")
KUBELET_APIS = ("device-plugin", "dra")


class ConfigError(errors.ConfigError):
    pass


@dataclass(frozen=True)
class Option:
    flag: str
    env: str
    default: str
    help: str


OPTIONS = [
    Option("--kubelet-api", "MEMSLICE_KUBELET_API", "device-plugin",
           "how the kubelet is served: 'device-plugin' advertises memslice.io/gpu-mem (with the scheduler "
           "extender); 'dra' is a DRA driver (memslice.io) publishing ResourceSlices with consumable memory "
           "capacity for the default kube-scheduler (Kubernetes >= 1.36, or 1.34+ with DRAConsumableCapacity)"),
    Option("--plugins-registry-dir", "MEMSLICE_PLUGINS_REGISTRY_DIR", "/var/lib/kubelet/plugins_registry",
           "dra: the kubelet's plugin-watcher directory (the registration socket memslice.io-reg.sock is "
           "created there). Mount it read-write from the host"),
    Option("--kubelet-plugins-dir", "MEMSLICE_KUBELET_PLUGINS_DIR", "/var/lib/kubelet/plugins",
           "dra: the DRA socket and checkpoint go in <this>/memslice.io/ (the kubelet dials the socket by its "
           "host path, so mount it at the same path)"),
    Option("--pod-uid", "MEMSLICE_POD_UID", "",
           "dra: this pod's UID (downward API metadata.uid). Set, the sockets are dra-<uid>.sock and "
           "memslice.io-<uid>-reg.sock and calls are serialised with the other instance by an flock, so a "
           "rolling update (maxSurge: 1) never leaves the kubelet without the driver (kubelet >= 1.33)"),
    Option("--cdi-dir", "MEMSLICE_CDI_DIR", "/var/run/cdi",
           "dra: where the container runtime reads CDI specs; one memslice.io-<claim uid>.json per prepared "
           "claim"),
    Option("--device-plugin-dir", "MEMSLICE_DEVICE_PLUGIN_DIR", "/var/lib/kubelet/device-plugins",
           "the kubelet's device-plugin directory (kubelet.sock is there; the agent's socket "
           "memslice-gpu-mem.sock is created there). Mount it read-write from the host"),
    Option("--pod-resources-socket", "MEMSLICE_POD_RESOURCES_SOCKET",
           "/var/lib/kubelet/pod-resources/kubelet.sock",
           "the kubelet's PodResources API socket, read to recover allocations after an agent restart and to "
           "remove region directories of finished pods; empty to do without"),
    Option("--unit-mib", "MEMSLICE_UNIT_MIB", "1",
           "MiB per kubelet device (1 device = N MiB). Cluster-wide: every node agent must use the same "
           "value; published as the node annotation memslice.io/unit-mib. Raise it when start-up says the "
           "device list does not fit the kubelet's 4 MiB message"),
    Option("--metrics-address", "MEMSLICE_METRICS_ADDRESS", "0.0.0.0", "address of the HTTP endpoint"),
    Option("--metrics-port", "MEMSLICE_METRICS_PORT", "9400",
           "port of /metrics (Prometheus), /healthz and /readyz; 0 picks a free port (logged)"),
    Option("--probe-port", "MEMSLICE_PROBE_PORT", "",
           "port of the kubelet's probes alone (/healthz, /readyz; one answer per connection, on --metrics-"
           "address), where no scraper or client of the metrics port can starve them; 0 picks a free port "
           "(logged); empty for none"),
    Option("--node-name", "NODE_NAME", "",
           "this node's name in Kubernetes (set NODE_NAME from the downward API spec.nodeName); required "
           "when a Kubernetes API is configured"),
    Option("--kubeconfig", "KUBECONFIG", "",
           "kubeconfig file for the Kubernetes API; without it the in-cluster service account is used, "
           "then ~/.kube/config, and with none the agent runs standalone (no inventory published, "
           "preferred allocation by best fit)"),
    Option("--shim-source", "MEMSLICE_SHIM_SOURCE", "",
           "the libmemslice.so to install on the host (default: the one built into this package)"),
    Option("--shim-host-dir", "MEMSLICE_SHIM_HOST_DIR", "/var/lib/memslice/lib",
           "host directory the shim and its ld.so.preload file are copied into at start-up (atomically) and "
           "mounted from into containers"),
    Option("--region-root", "MEMSLICE_REGION_ROOT", "/var/lib/memslice/regions",
           "host directory holding one region directory per container (mounted at /run/memslice/region)"),
    Option("--elastic-dir", "MEMSLICE_ELASTIC_HOST_DIR", "",
           "host directory of the node's elastic-memory boards (one per GPU, created at start-up; default: "
           "'elastic' beside --region-root, i.e. /var/lib/memslice/elastic); mounted "
           "read-write at /run/memslice/elastic in containers whose pod has a memslice.io/gpu-mem-limit above "
           "its request"),
    Option("--compute-dir", "MEMSLICE_COMPUTE_HOST_DIR", "",
           "host directory of the node's compute-share arbitration files (one directory per GPU: a roster and "
           "a slot file per container; default: 'compute' beside --region-root, i.e. /var/lib/memslice/compute); "
           "a container with a memslice.io/gpu-compute share gets its GPU's directory read-only and its own slot "
           "read-write under /run/memslice/compute"),
    Option("--idle-after", "MEMSLICE_IDLE_AFTER_S", "300",
           "elastic memory: seconds without a CUDA call after which a container's process is idle (its GPU "
           "memory may move to host memory when a neighbour needs it); 0..604800"),
    Option("--swap-event-interval-s", "MEMSLICE_SWAP_EVENT_INTERVAL_S", "60",
           "elastic memory: at most one GPUMemorySwappedOut and one GPUMemorySwappedIn Event per pod in this "
           "many seconds (swaps in between are counted into the next one); 1..86400"),
    Option("--preload", "MEMSLICE_PRELOAD", "file",
           "how containers load the shim: 'file' mounts an ld.so.preload at /etc/ld.so.preload (covers every "
           "process); 'env' sets LD_PRELOAD instead (for images with their own /etc/ld.so.preload)"),
    Option("--visibility", "MEMSLICE_VISIBILITY", "env",
           "how the container is given its GPU: 'env' sets NVIDIA_VISIBLE_DEVICES=<GPU uuid> (NVIDIA "
           "container runtime); 'cdi' returns the CDI device <--cdi-kind>=<GPU uuid>"),
    Option("--cdi-kind", "MEMSLICE_CDI_KIND", "nvidia.com/gpu",
           "CDI vendor/class used with --visibility cdi"),
    Option("--ignored-xids", "MEMSLICE_IGNORED_XIDS", ",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS)),
           "comma list of NVML Xids that do NOT make a GPU Unhealthy (application errors); 'none' to count "
           "every Xid"),
    Option("--health-recovery-s", "MEMSLICE_HEALTH_RECOVERY_S", "300",
           "seconds after its last critical Xid that a GPU is advertised Healthy again, if NVML still "
           "answers for it; 0 keeps it Unhealthy until the agent restarts"),
    Option("--reconcile-interval-s", "MEMSLICE_RECONCILE_INTERVAL_S", "10",
           "seconds between comparisons of the agent's allocations with the kubelet's PodResources record "
           "(region directories of finished pods are removed then, or at once on a pod deletion)"),
    Option("--grpc-workers", "MEMSLICE_GRPC_WORKERS", "8",
           "gRPC worker threads (ListAndWatch holds one per stream; at least 4)"),
    Option("--log-level", "MEMSLICE_AGENT_LOG_LEVEL", "info", "debug, info, warning or error"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for o in OPTIONS:
        parser.add_argument(o.flag, default=None, metavar=o.flag.lstrip("-").split("-")[-1].upper(),
                            help=f"{o.help}. Env {o.env}; default {o.default!r}")
    parser.add_argument("--simulate", nargs="?", const="", default=None, metavar="GPUS",
                        help="use memslice's simulated GPUs instead of NVIDIA's driver (no GPU needed). "
                             "GPUS is a comma list of SIZE[:NUMA][:mig], e.g. 16GiB,80GiB:1 (default: "
                             "MEMSLICE_SIM_GPUS or 16GiB). Setting MEMSLICE_SIM_GPUS alone also selects the "
                             "simulator; "
                             "MEMSLICE_SIM_STATE names the simulated node's state file")


@dataclass(frozen=True)
class AgentConfig:
    device_plugin_dir: Path
    pod_resources_socket: Path | None
    unit_mib: int
    metrics_address: str
    metrics_port: int
    node_name: str
    kubeconfig: str | None
    shim_source: str | None
    shim_host_dir: Path
    region_root: Path
    preload: str
    visibility: str
    cdi_kind: str
    ignored_xids: frozenset[int]
    health_recovery_s: float
    reconcile_interval_s: float
    grpc_workers: int
    log_level: str
    simulate: bool
    sim_gpus: str | None
    kubelet_api: str = "device-plugin"
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    kubelet_plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_dir: Path = Path("/var/run/cdi")
    pod_uid: str = ""
    elastic_dir: Path = Path("/var/lib/memslice/elastic")
    compute_dir: Path = Path("/var/lib/memslice/compute")
    idle_after_s: float = 300.0
    swap_event_interval_s: float = 60.0
    probe_port: int | None = None  # the kubelet's probes alone (memslice.probe_http); None: none


def _int(name: str, raw: str, lo: int, hi: int, what: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise ConfigError(f"{name}={raw!r} is not valid: use {what} ({lo}..{hi})")
    return v


def _float(name: str, raw: str, lo: float, what: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not v >= lo:
        raise ConfigError(f"{name}={raw!r} is not valid: use {what} (>= {lo:g})")
    return v


def _xids(name: str, raw: str) -> frozenset[int]:
    if raw.strip().lower() in ("", "none"):
        return frozenset()
    out = set()
    for part in raw.split(","):
        if not part.strip().isdigit():
            raise ConfigError(f"{name}={raw!r} is not valid: use a comma list of Xid numbers, e.g. 13,31,43, "
                              f"or 'none'")
        out.add(int(part))
    return frozenset(out)


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise ConfigError(f"{name}={raw!r} is not valid: use one of {', '.join(choices)}")
    return raw


def resolve(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Flags win over environment variables, which win over defaults."""
    env = os.environ if env is None else env
    raw: dict[str, tuple[str, str]] = {}  # attribute -> (name to cite, value)
    for o in OPTIONS:
        attr = o.flag.lstrip("-").replace("-", "_")
        flag_value = getattr(args, attr, None)
        if flag_value is not None:
            raw[attr] = (o.flag, flag_value)
        elif env.get(o.env):
            raw[attr] = (o.env, env[o.env])
        else:
            raw[attr] = (o.flag, o.default)

    def get(attr: str) -> str:
        return raw[attr][1]

    def n(attr: str) -> str:
        return raw[attr][0]

    sim_flag = getattr(args, "simulate", None)
    sim_gpus = sim_flag or env.get("MEMSLICE_SIM_GPUS") or None
    simulate = sim_flag is not None or bool(env.get("MEMSLICE_SIM_GPUS"))
    if sim_gpus:
        from memslice.simulator import validate_gpus

        try:
            validate_gpus(sim_gpus)
        except ValueError as exc:  # SizeError too: a bad simulated GPU is a bad flag (exit 2), named
            where = "--simulate" if sim_flag else "MEMSLICE_SIM_GPUS"
            raise ConfigError(f"{where}={sim_gpus!r} is not valid: {exc}") from None
    node = get("node_name")
    prs = get("pod_resources_socket")
    level = get("log_level").lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{n('log_level')}={get('log_level')!r} is not valid: use debug, info, warning or "
                          f"error")
    return AgentConfig(
        device_plugin_dir=Path(get("device_plugin_dir")),
        pod_resources_socket=Path(prs) if prs else None,
        unit_mib=_int(n("unit_mib"), get("unit_mib"), 1, 1 << 20, "a whole number of MiB per device"),
        metrics_address=get("metrics_address"),
        metrics_port=_int(n("metrics_port"), get("metrics_port"), 0, 65535,
                          "a TCP port, or 0 for any free port"),
        node_name=node,
        kubeconfig=get("kubeconfig") or None,
        shim_source=get("shim_source") or None,
        shim_host_dir=Path(get("shim_host_dir")),
        region_root=Path(get("region_root")),
        preload=_choice(n("preload"), get("preload"), PRELOAD_MODES),
        visibility=_choice(n("visibility"), get("visibility"), VISIBILITY_MODES),
        cdi_kind=get("cdi_kind"),
        ignored_xids=_xids(n("ignored_xids"), get("ignored_xids")),
        health_recovery_s=_float(n("health_recovery_s"), get("health_recovery_s"), 0, "seconds"),
        reconcile_interval_s=_float(n("reconcile_interval_s"), get("reconcile_interval_s"), 0.05, "seconds"),
        grpc_workers=_int(n("grpc_workers"), get("grpc_workers"), 4, 256, "a number of threads"),
        log_level=level,
        simulate=simulate,
        sim_gpus=sim_gpus,
        kubelet_api=_choice(n("kubelet_api"), get("kubelet_api"), KUBELET_APIS),
        plugins_registry_dir=Path(get("plugins_registry_dir")),
        kubelet_plugins_dir=Path(get("kubelet_plugins_dir")),
        cdi_dir=Path(get("cdi_dir")),
        pod_uid=get("pod_uid"),  # checked where it is used (plugin/dra/agent.py): a downward-API value
        elastic_dir=Path(get("elastic_dir") or Path(get("region_root")).parent / "elastic"),
        compute_dir=Path(get("compute_dir") or Path(get("region_root")).parent / "compute"),
        idle_after_s=_idle(n("idle_after"), get("idle_after")),
        swap_event_interval_s=_event_interval(n("swap_event_interval_s"), get("swap_event_interval_s")),
        probe_port=_int(n("probe_port"), get("probe_port"), 0, 65535, "a TCP port, 0 for any free port, or "
                        "empty for none") if get("probe_port").strip() else None,
    )


def _event_interval(name: str, raw: str) -> float:
    v = _float(name, raw, 1, "seconds")
    if v > 86400:
        raise ConfigError(f"{name}={raw!r} is not valid: use seconds (1..86400)")
    return v


def _idle(name: str, raw: str) -> float:
    v = _float(name, raw, 0, "seconds")
    if v > 604800:
        raise ConfigError(f"{name}={raw!r} is not valid: use seconds (0..604800)")
    return v

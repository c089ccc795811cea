"""`memslice extender`: run the scheduler extender. Heavy imports happen in the handler."""

from __future__ import annotations

import argparse
import os
import re
from fractions import Fraction
from typing import Any

ENV = "MEMSLICE_EXTENDER_"


def _env(name: str, default: str | None) -> str | None:
    return os.environ.get(ENV + name, default)


def _positive(kind: type, what: str) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}={text!r} is not a number; give a positive "
                                             f"{'whole ' if kind is int else ''}number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what}={text!r} must be positive")
        return value
    return parse


def _port_of(flag: str) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or not 0 <= int(text) <= 65535:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} is not a TCP port; give 0..65535 "
                                             f"(0: any free port)")
        return int(text)
    return parse


_port = _port_of("--port")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "extender", help="run the kube-scheduler extender (filter, prioritize, bind, preempt)",
        description="kube-scheduler extender for memslice.io/gpu-mem: a pod's slice must fit on one GPU. "
                    "Serves POST /filter /prioritize /bind /preempt and GET /healthz /readyz /metrics. "
                    "The cluster is reached through --kubeconfig, $KUBECONFIG, the in-cluster service "
                    "account, or ~/.kube/config, in that order. Every flag can also be set through the "
                    f"environment variable shown ({ENV}*). One kube-scheduler at a time may call it (deploy/base: "
                    "a container of the scheduler's pod, called by that pod's kube-scheduler on 127.0.0.1).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--address", default=_env("ADDRESS", "127.0.0.1"),
                   help=f"listen address of the verbs port (${ENV}ADDRESS). The verbs bind pods, so in plain HTTP "
                        f"only a loopback address is accepted (the default: kube-scheduler in the same pod, as "
                        f"deploy/base runs it); any other address needs mutual TLS (--tls-cert-file, --tls-key-file "
                        f"and --tls-client-ca-file: deploy/components/standalone-extender)")
    p.add_argument("--health-address", default=_env("HEALTH_ADDRESS", "0.0.0.0"),
                   help=f"listen address of --health-port and --probe-port, which serve no verbs: the kubelet's "
                        f"probes and Prometheus reach them from outside the pod (${ENV}HEALTH_ADDRESS)")
    p.add_argument("--port", type=_port, default=_env("PORT", "8888"), help=f"listen port of the verbs (${ENV}PORT)")
    p.add_argument("--policy", choices=("binpack", "spread"), default=_env("POLICY", "binpack"),
                   help=f"cluster default placement; a pod overrides it with annotation memslice.io/policy "
                        f"(${ENV}POLICY)")
    p.add_argument("--filter-answers", choices=("best", "all"), default=_env("FILTER_ANSWERS", "best"),
                   help=f"best: filter passes only the nodes where the pod fits best by --policy (ties kept), so "
                        f"kube-scheduler needs no prioritizeVerb and its own scores choose among those (deploy/base); "
                        f"all: every node where it fits, which the scheduler's configuration must then rank with "
                        f"prioritizeVerb: prioritize (${ENV}FILTER_ANSWERS)")
    p.add_argument("--assume-ttl", type=_positive(float, "--assume-ttl"), default=_env("ASSUME_TTL", "120"),
                   metavar="SECONDS",
                   help=f"how long a reservation written on a pod that never got bound keeps its GPU memory "
                        f"(${ENV}ASSUME_TTL)")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig file ($KUBECONFIG); default: in-cluster config, then ~/.kube/config")
    p.add_argument("--tls-cert-file", default=_env("TLS_CERT_FILE", None),
                   help=f"serve the verbs in HTTPS with this certificate (PEM) (${ENV}TLS_CERT_FILE); needed, with "
                        f"--tls-key-file and --tls-client-ca-file, only when kube-scheduler reaches the extender "
                        f"over the network (--address not loopback); kube-scheduler: enableHTTPS: true and tlsConfig")
    p.add_argument("--tls-key-file", default=_env("TLS_KEY_FILE", None),
                   help=f"private key of --tls-cert-file (${ENV}TLS_KEY_FILE)")
    p.add_argument("--tls-client-ca-file", default=_env("TLS_CLIENT_CA_FILE", None),
                   help=f"require client certificates signed by this CA (${ENV}TLS_CLIENT_CA_FILE); needed with "
                        f"TLS on any address but loopback")
    p.add_argument("--health-port", type=_port_of("--health-port"), default=_env("HEALTH_PORT", None),
                   help=f"also serve GET /healthz /readyz /metrics (and nothing else) over plain HTTP on this "
                        f"port, on --health-address, for Prometheus when the verbs port is on loopback or requires "
                        f"client certificates (${ENV}HEALTH_PORT); default: none")
    p.add_argument("--probe-port", type=_port_of("--probe-port"), default=_env("PROBE_PORT", None),
                   help=f"also serve the kubelet's probes alone (GET /healthz /readyz, one answer per "
                        f"connection) over plain HTTP on this port, where no scraper or client of the other "
                        f"ports can starve them (${ENV}PROBE_PORT); default: none")
    p.add_argument("--scheduler-names", default=_env("SCHEDULER_NAMES", "memslice-scheduler"),
                   metavar="NAME[,NAME...]",
                   help=f"/bind binds only pods whose spec.schedulerName is one of these: the profile names "
                        f"of the kube-scheduler that calls this extender (${ENV}SCHEDULER_NAMES)")
    p.add_argument("--max-body-mib", type=_positive(int, "--max-body-mib"),
                   default=_env("MAX_BODY_MIB", str(DEFAULT_MAX_BODY_MIB)),
                   help=f"largest request body accepted, MiB; a filter call of a 50,000-node cluster is "
                        f"about 2 MiB (${ENV}MAX_BODY_MIB)")
    p.add_argument("--watch-timeout", type=_positive(int, "--watch-timeout"),
                   default=_env("WATCH_TIMEOUT", "300"), metavar="SECONDS",
                   help=f"length of one watch request before it is renewed (${ENV}WATCH_TIMEOUT)")
    p.add_argument("--max-limit-ratio", type=limit_ratio, default=_env("MAX_LIMIT_RATIO", None), metavar="R",
                   help=f"elastic memory: a GPU takes a pod only while the limits of its pods "
                        f"(memslice.io/gpu-mem-limit; a pod without one counts its request) add up to at most "
                        f"R × the GPU's memory; R is a decimal number from 1 to {MAX_LIMIT_RATIO:g}. Pods are "
                        f"still fitted by their requests. The memory above a GPU's HBM is host memory of the "
                        f"pods' cgroups, so R bounds the host memory that bursting and swapped-out tenants can "
                        f"need per GPU to (R - 1) × its memory (${ENV}MAX_LIMIT_RATIO); default: no cap, "
                        f"as Kubernetes never schedules limits")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   default=_env("LOG_LEVEL", "info"), help=f"(${ENV}LOG_LEVEL)")
    p.set_defaults(func=run)


DEFAULT_MAX_BODY_MIB = 8  # docs/architecture.md, "Request limits": 4x the filter body of 50,000 nodes
MAX_LIMIT_RATIO = 100  # limits above 100 × the GPU are a typo, not a policy
_RATIO = re.compile(r"(\d{1,3})(\.\d{1,6})?")


def limit_ratio(text: str) -> Fraction:
    """--max-limit-ratio as an exact fraction (the cap is computed without float rounding); an argparse error
    naming the value and the fix when it is not a decimal number from 1 to MAX_LIMIT_RATIO."""
    value = Fraction(text) if _RATIO.fullmatch(text) else None
    if value is None or not 1 <= value <= MAX_LIMIT_RATIO:
        raise argparse.ArgumentTypeError(
            f"--max-limit-ratio={text[:32]!r} (or ${ENV}MAX_LIMIT_RATIO) is not a ratio from 1 to "
            f"{MAX_LIMIT_RATIO}; give a decimal number such as 2 or 1.5 (a GPU's pods' limits may add up to that "
            f"many times its memory; 1: no more than the GPU), or leave it unset for no cap")
    return value


DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def scheduler_names(text: str) -> tuple[str, ...] | str:
    """The names of --scheduler-names, or the error message naming the bad value (a pod's
    spec.schedulerName is a DNS-1123 subdomain)."""
    names = tuple(n.strip() for n in text.split(","))
    bad = [n for n in names if len(n) > 253 or not DNS1123_SUBDOMAIN.fullmatch(n)]
    if bad:
        return (f"--scheduler-names={text!r}: {bad[0]!r} is not a scheduler name; give a comma-separated list "
                f"of lower-case DNS names such as memslice-scheduler")
    return names


def plain_http_refusal(address: str, tls: bool, client_ca: bool) -> str | None:
    """Why the verbs may not be served on `address` (None: they may). Plain HTTP carries /bind, which binds
    any pod of a served scheduler anywhere, unauthenticated: it is allowed only on a loopback address, which
    only the processes of the same network namespace (in Kubernetes, the containers of the same pod) can
    reach. Elsewhere the verbs need TLS with client certificates (`client_ca`): TLS alone authenticates the
    extender to its callers, not the callers to it. Fails closed: a name other than `localhost` is refused,
    since what it resolves to can change."""
    from .app import is_loopback

    if is_loopback(address) or (tls and client_ca):
        return None
    where = (f"--address={address[:64]!r} (or ${ENV}ADDRESS) would serve the verbs (filter, bind, preempt) "
             f"{'in plain HTTP' if not tls else 'over TLS without client certificates'} to whoever can reach "
             f"that address")
    return (f"{where}; give a loopback address (--address=127.0.0.1, with kube-scheduler in the same pod as "
            f"deploy/base runs it), or serve mutual TLS with --tls-cert-file, --tls-key-file and "
            f"--tls-client-ca-file (deploy/components/standalone-extender)")


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc mallopt parameters (malloc.h)
MMAP_THRESHOLD = 1 << 20  # buffers from this size on are mapped on their own and unmapped when freed
TRIM_THRESHOLD = 4 << 20  # free memory at an arena's top beyond this goes back to the system


def tune_malloc() -> bool:
    """Why: each connection's thread would get its own glibc malloc arena, and glibc raises its mmap
    threshold after the first large free, so the memory of a large request, once freed, stayed in the
    process (RSS crept up ~30 MiB per large request). Two arenas and a fixed mmap threshold give large
    buffers back to the system when freed. The threshold is 1 MiB and the trim threshold 4 MiB, not 128 KiB:
    the buffers of a filter of 5,000 names (the 65 KB body parsed, a 160 KB prioritize answer joined and
    encoded, the page of a relist) are 128 KiB to 1 MiB, and at 128 KiB each was a fresh mapping whose every
    page faulted in again: joining and encoding the answer took 0.41 instead of 0.05 ms, the body's decode
    0.18 instead of 0.10 ms. What a fixed threshold keeps is bounded: at most TRIM_THRESHOLD at each arena's
    top (a test checks large requests leave RSS where it was). Call before threads start; False where not
    glibc."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return (bool(mallopt(M_ARENA_MAX, 2)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
            and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)))


SYNC_GC_GRACE = 300  # seconds the collector may stay off while the first list of nodes and pods runs
REFREEZE_POLL_S = 5.0  # how often the pod count is looked at for refreeze_due
REFREEZE_PODS = 10_000  # growth (and at least a tenth) after which what exists is frozen again


def refreeze_due(frozen_at: int, pods: int) -> bool:
    """Whether the pods grew enough since the last gc.freeze() (at `frozen_at` pods) to freeze again: by
    REFREEZE_PODS and by a tenth. Each freeze may keep what cyclic garbage is alive then for good, so it is
    done after growth only, not on a clock."""
    return pods - frozen_at >= max(REFREEZE_PODS, frozen_at // 10)
POOL_SIZE = 64  # HTTP connections kept to the API server: binds run concurrently (one per scheduler bind)


def load_api_client(kubeconfig: str | None) -> Any:
    """An ApiClient found in memslice.kube.config's order (--kubeconfig/$KUBECONFIG, the in-cluster service
    account, ~/.kube/config), with a connection pool big enough that concurrent binds reuse connections;
    errors.ConfigError when there is none."""
    from memslice.errors import ConfigError
    from memslice.kube.config import load_api_client as find_api

    api, how = find_api(kubeconfig, pool_maxsize=POOL_SIZE)
    if api is None:
        raise ConfigError(how)
    return api


def run(args: argparse.Namespace) -> int:
    import gc
    import logging
    import signal
    import sys
    import threading

    from .app import Config, Extender

    tune_malloc()
    logging.basicConfig(level=str(args.log_level).upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.policy not in ("binpack", "spread"):  # from the environment, which argparse does not check
        print(f"memslice extender: {ENV}POLICY={args.policy!r} is not a policy; use binpack or spread",
              file=sys.stderr)
        return 2
    refusal = plain_http_refusal(str(args.address), bool(args.tls_cert_file or args.tls_key_file),
                                 bool(args.tls_client_ca_file))
    if refusal is not None:
        print(f"memslice extender: {refusal}", file=sys.stderr)
        return 2
    try:
        api_client = load_api_client(args.kubeconfig)
    except Exception as exc:  # noqa: BLE001 - report and exit
        print(f"memslice extender: cannot load a Kubernetes configuration ({exc}); set --kubeconfig or "
              f"KUBECONFIG, or run in a pod with a service account", file=sys.stderr)
        return 2
    names = scheduler_names(str(args.scheduler_names))
    if isinstance(names, str):
        print(f"memslice extender: {names}", file=sys.stderr)
        return 2
    cfg = Config(address=args.address, health_address=args.health_address, port=int(args.port), policy=args.policy,
                 scheduler_names=names,
                 health_port=None if args.health_port is None else int(args.health_port),
                 probe_port=None if args.probe_port is None else int(args.probe_port),
                 assume_ttl=float(args.assume_ttl),
                 max_body_bytes=int(args.max_body_mib) << 20, watch_timeout=int(args.watch_timeout),
                 tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file,
                 tls_client_ca_file=args.tls_client_ca_file, max_limit_ratio=args.max_limit_ratio,
                 filter_answers=args.filter_answers)
    try:
        ext = Extender(api_client, cfg)
    except (OSError, ValueError) as exc:
        print(f"memslice extender: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    # The first list builds every record the extender keeps (hundreds of thousands of objects, all
    # long-lived): cyclic collections during it only rescan them (seven full ones, a fifth of the sync time
    # at 40,000 pods). So the collector is off until the first sync, or SYNC_GC_GRACE seconds at most.
    gc.disable()
    ext.start()
    health = f"; health and metrics on {ext.health_url}" if ext.health_url else ""
    health += f"; probes on {ext.probe_url}" if ext.probe_url else ""
    cap = "" if cfg.max_limit_ratio is None else f", limits per GPU up to {float(cfg.max_limit_ratio):g} × its memory"
    print(f"memslice extender: serving {ext.url} (policy {cfg.policy}{cap}){health}", flush=True)

    def settle() -> None:
        # After the first list, moving the records out of the collector's generations keeps full
        # collections (tens of ms) out of the verbs' latency. Frozen before the collector is enabled again
        # and without a collection first: the list makes almost no cyclic garbage (its pages are freed by
        # reference counting), and that collection would scan every object of the sync (0.14 s at 43,000 pods)
        # just as the first filters arrive. What little cyclic garbage there is stays, once.
        synced = ext.wait_synced(SYNC_GC_GRACE)
        if synced:
            gc.freeze()
        gc.enable()
        if synced or ext.wait_synced(3600):
            if not synced:
                gc.freeze()
            counts = ext.state.counts()
            print(f"memslice extender: synced with the API server (GPU nodes: {counts['nodes']}, GPU pods: "
                  f"{counts['pods']}); ready", flush=True)
            # Pods that arrive by watch later, and the memo's tables, are long-lived too: after each large
            # growth they are frozen as well, so the next full collection does not scan them all at once
            # (0.11-0.2 s at 20,000 nodes and 115,000 pods). No collection first (at that size a young one
            # took 0.1 s itself): what cyclic garbage the young generations hold then is kept, once.
            frozen_at = counts["pods"]
            while not done.wait(REFREEZE_POLL_S):
                pods = ext.state.counts()["pods"]
                if refreeze_due(frozen_at, pods):
                    gc.freeze()
                    frozen_at = pods
                frozen_at = min(frozen_at, pods)

    threading.Thread(target=settle, name="gc-freeze", daemon=True).start()
    # Bounded waits: a signal the kernel delivers to another thread (one of hundreds under a connection
    # flood) does not wake a main thread blocked in a lock, and Python runs its handler only in the main thread.
    while not done.wait(1.0):
        pass
    ext.stop()
    return 0

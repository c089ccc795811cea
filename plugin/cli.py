"""`memslice node-agent`: the DaemonSet process on every GPU node (kubelet device plugin for
memslice.io/gpu-mem). Heavy imports (grpc, kubernetes, pynvml) happen inside the handler."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

DESCRIPTION = """\
Advertise this node's GPU memory to the kubelet as memslice.io/gpu-mem (one device = --unit-mib MiB of one
GPU), hand each container its slice (env MEMSLICE_GPU_MEM_LIMIT, a region directory, the shim preloaded, the
GPU made visible), watch GPU health (NVML Xid events), publish the node inventory (annotations
memslice.io/gpus and memslice.io/unit-mib), and serve Prometheus metrics.

With --kubelet-api dra the agent is instead the DRA driver memslice.io (Kubernetes >= 1.36, default
kube-scheduler, no extender): it registers through --plugins-registry-dir, publishes one ResourceSlice with a
shareable device per healthy GPU (capacity.memory), and for each claim the kubelet prepares creates the
claim's region and a CDI spec in --cdi-dir carrying the same env and mounts. It needs the Kubernetes API.

Every flag has an environment variable (flags win). Exit status: 0 after SIGTERM/SIGINT, 2 for a bad flag
or env value, 1 when the agent cannot start (the message says why: e.g. a device list over the kubelet's
4 MiB ListAndWatch limit names the --unit-mib value that fits).
"""

EPILOG = """\
Per-node ceiling: the kubelet reads ListAndWatch with a 4 MiB limit. With IDs g<gpu>-<n> a device costs
27-29 bytes in the worst case (Unhealthy, NUMA topology), so one node advertises at most about 144,000
devices: at --unit-mib 1 about 141 GiB of GPU memory in total. 1x16 GiB and 1x80 GiB fit at 1; 2x80 GiB
needs --unit-mib 2, 8x80 GiB needs 5, 8x141 GiB needs 8. The agent checks this at start-up and names the
smallest unit that fits. Pick one unit for the whole cluster (the largest any node needs).
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    from .config import add_arguments

    p = subparsers.add_parser("node-agent", help="run the node agent (kubelet device plugin or DRA driver for GPU "
                                                 "memory)",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=handler)
    return p


def handler(args: argparse.Namespace) -> int:
    from .config import ConfigError, resolve

    try:
        cfg = resolve(args)
    except ConfigError as exc:
        print(f"memslice node-agent: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    from .agent import NodeAgent, StartupError

    agent = NodeAgent(cfg)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("memslice.plugin").info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.start()
    except StartupError as exc:
        logging.getLogger("memslice.plugin").error("cannot start: %s", exc)
        agent.stop()
        return 1
    # Bounded waits: a signal the kernel delivers to another thread does not wake a main thread blocked in a
    # lock, and Python runs its handler only in the main thread.
    while not stop.wait(1.0):
        pass
    agent.stop()
    return 0

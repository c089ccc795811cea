"""Kubernetes Events on a pod (in DRA mode: on its ResourceClaim) when its elastic GPU memory is swapped out to
host memory or back.

`SwapEventPolicy` (pure) turns the per-container swap totals of successive polls into notices: at most one
per pod and kind (GPUMemorySwappedOut, GPUMemorySwappedIn; the Warning ElasticHostMemoryFull when a container
could not take its memory to host memory for a neighbour, or its burst failed for that) per
interval, whatever the number of swaps in between (they are summed into the next notice), and at most
`max_per_step` per poll for the whole node. A tenant that swaps in a loop, or forges its counters, therefore
costs the API server at most one call per pod, kind and interval. `SwapEvents` (I/O) polls the tracker and
writes them as core/v1 Events: the first notice of a pod and kind creates an Event, the following ones patch
the same Event (count + 1, lastTimestamp, message), as the kubelet's own event correlator does; an Event gone
meanwhile (they expire) is created anew.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memslice.kube.calls import CoreV1ApiRaw, done

from ..ledger import Allocation
from .metrics import ContainerElastic, Counts, ElasticView, Key

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)
MiB = 1 << 20
OUT, IN = "GPUMemorySwappedOut", "GPUMemorySwappedIn"
FULL = "ElasticHostMemoryFull"  # a move to host memory refused, or a burst failed for one (Warning)
COMPONENT = "memslice-node-agent"
MAX_MESSAGE = 1024  # the API server keeps at most 1 KiB of a message anyway


@dataclass(frozen=True)
class Notice:
    """One Event to write: a pod, a kind, and what happened since the last notice of that pod and kind."""

    namespace: str
    pod: str
    pod_uid: str
    reason: str
    message: str


@dataclass
class _Pending:
    alloc: Allocation
    parts: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (container, gpu) -> [moves, s]


def _full_text(container: str, gpu: str, refused: float, failed: float, c: ContainerElastic | None) -> str:
    """ElasticHostMemoryFull: what the container refused (with the cause it read) and what of its own failed."""
    out = []
    if refused:
        n = c.note if c is not None else None
        why = ""
        if n is not None and n.cause == "cgroup":
            why = (f": its memory cgroup is near its limit (memory.max {n.limit_bytes // MiB} MiB, memory.current "
                   f"{n.used_bytes // MiB} MiB); raise the pod's memory limit by its GPU memory limit")
        elif n is not None and n.cause == "host":
            why = (f": the node is low on memory (MemAvailable {(n.limit_bytes - n.used_bytes) // MiB} MiB of "
                   f"{n.limit_bytes // MiB} MiB)")
        out.append(f"container {container} could not take its GPU memory to host memory for a neighbour on GPU "
                   f"{gpu} {int(refused)} time(s){why}")
    if failed:
        out.append(f"container {container}: {int(failed)} burst allocation(s) failed on GPU {gpu} "
                   f"(CUDA_ERROR_OUT_OF_MEMORY): GPU memory was full and a neighbour could not take its memory to "
                   f"host memory")
    return "; ".join(out)


def _part_text(reason: str, container: str, gpu: str, moves: float, seconds: float, c: ContainerElastic | None
               ) -> str:
    if reason == FULL:
        return _full_text(container, gpu, moves, seconds, c)
    where = "to host memory" if reason == OUT else "back to GPU memory"
    now = (f"; now {c.swapped_bytes // MiB} MiB in host memory, {c.resident_bytes // MiB} MiB in GPU memory"
           if c is not None else "")
    return (f"container {container}: {int(moves)} range(s) of its GPU memory moved {where} on GPU {gpu} in "
            f"{seconds:.2f} s{now}")


class SwapEventPolicy:
    """Decides which Events to write (pure: no clock, no I/O; `now` is given)."""

    def __init__(self, interval_s: float, max_per_step: int = 20) -> None:
        self.interval_s = interval_s
        self.max_per_step = max_per_step
        self.seen: dict[Key, Counts] = {}
        self.pending: dict[tuple[str, str], _Pending] = {}  # (pod uid or ns/pod, reason)
        self.sent_at: dict[tuple[str, str], float] = {}
        self.started = False

    @staticmethod
    def _pod_key(a: Allocation) -> str:
        return a.pod_uid or f"{a.namespace}/{a.pod}"

    def step(self, now: float, view: ElasticView) -> list[Notice]:
        """Fold one poll's totals in; the notices due now. The first poll only sets the baseline (a restarted
        agent does not announce old swaps); a container that appears later starts from zero (its swaps
        happened while the agent was watching)."""
        for key, c in view.containers.items():
            before = self.seen.get(key, Counts() if self.started else c.totals)
            self.seen[key] = c.totals
            if not c.alloc.pod:
                continue
            t, b = c.totals, before
            refused = t.refused_cgroup + t.refused_host - b.refused_cgroup - b.refused_host
            for reason, moves, secs in ((OUT, t.outs - b.outs, t.out_s - b.out_s),
                                        (IN, t.ins - b.ins, t.in_s - b.in_s),
                                        (FULL, max(refused, 0), max(t.bursts_failed - b.bursts_failed, 0))):
                if moves <= 0 and (reason != FULL or secs <= 0):
                    continue
                p = self.pending.setdefault((self._pod_key(c.alloc), reason), _Pending(c.alloc))
                acc = p.parts.setdefault((c.alloc.container, key[1]), [0.0, 0.0])
                acc[0] += moves
                acc[1] += max(secs, 0.0)
        self.started = True
        live = {self._pod_key(c.alloc) for c in view.containers.values()}
        for k in [k for k in self.seen if k not in view.containers]:
            del self.seen[k]
        for k in [k for k in self.pending if k[0] not in live]:
            del self.pending[k]
        for k in [k for k in self.sent_at if k[0] not in live and now - self.sent_at[k] >= self.interval_s]:
            del self.sent_at[k]
        due: list[Notice] = []
        for k, p in sorted(self.pending.items()):
            if len(due) >= self.max_per_step:
                break
            last = self.sent_at.get(k)
            if last is not None and now - last < self.interval_s:
                continue
            by = {(c.alloc.container, gpu): c for (_, gpu), c in view.containers.items()
                  if self._pod_key(c.alloc) == k[0]}
            text = "; ".join(_part_text(k[1], ctr, gpu, m, s, by.get((ctr, gpu)))
                             for (ctr, gpu), (m, s) in sorted(p.parts.items()))
            due.append(Notice(p.alloc.namespace, p.alloc.pod, p.alloc.pod_uid, k[1], text[:MAX_MESSAGE]))
            self.sent_at[k] = now
            del self.pending[k]
        return due


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


CLAIM_OWNER = "claim:"  # DRA mode: the ledger's owner of a prepared claim's region is "claim:<claim name>"


def involved_object(n: Notice) -> dict[str, str]:
    """What the Event is about: the pod, or in DRA mode the ResourceClaim (its owner in the ledger is
    CLAIM_OWNER + name and its uid the claim's; `kubectl describe resourceclaim` shows the Event)."""
    if n.pod.startswith(CLAIM_OWNER):
        out = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": n.namespace,
               "name": n.pod[len(CLAIM_OWNER):]}
    else:
        out = {"apiVersion": "v1", "kind": "Pod", "namespace": n.namespace, "name": n.pod}
    if n.pod_uid:
        out["uid"] = n.pod_uid
    return out


def event_body(n: Notice, node: str, name: str, wall: float) -> dict[str, Any]:
    """A core/v1 Event on the pod or DRA claim (pure); ElasticHostMemoryFull is a Warning."""
    involved = involved_object(n)
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": n.namespace},
            "involvedObject": involved, "reason": n.reason, "message": n.message,
            "type": "Warning" if n.reason == FULL else "Normal", "count": 1,
            "firstTimestamp": _stamp(wall), "lastTimestamp": _stamp(wall),
            "source": {"component": COMPONENT, "host": node},
            "reportingComponent": "memslice.io/node-agent", "reportingInstance": node}


class SwapEvents:
    """Polls the elastic tracker every `poll_s` and writes the policy's notices to the API (one thread)."""

    def __init__(self, api: ApiClient, node: str, poll: Callable[[], ElasticView], interval_s: float,
                 poll_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.node = node
        self.poll = poll
        self.policy = SwapEventPolicy(interval_s)
        self.poll_s = min(poll_s, interval_s)
        self.clock = clock
        self.written: dict[tuple[str, str, str], tuple[str, int]] = {}  # (ns, pod uid/name, reason) -> (name, count)
        self._stop = threading.Event()
        self._problem = ""
        self._thread = threading.Thread(target=self._run, name="swap-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        v1 = CoreV1ApiRaw(self.api)  # CoreV1Api's requests, without its import (memslice.kube.calls)
        while not self._stop.wait(self.poll_s):
            try:
                view = self.poll()
                notices = self.policy.step(self.clock(), view)
            except Exception as exc:  # noqa: BLE001 - the boards are the tenants'; never kill the loop
                self._report(f"elastic figures unreadable: {exc}")
                continue
            for n in notices:
                self._write(v1, n)
            live = {(c.alloc.namespace, c.alloc.pod_uid or c.alloc.pod) for c in view.containers.values()}
            self.written = {k: v for k, v in self.written.items() if (k[0], k[1]) in live}  # bounded by pods

    def _write(self, v1: Any, n: Notice) -> None:
        from kubernetes.client.exceptions import ApiException

        key = (n.namespace, n.pod_uid or n.pod, n.reason)
        wall = time.time()
        have = self.written.get(key)
        try:
            if have is not None:
                try:
                    done(v1.patch_namespaced_event(have[0], n.namespace, {
                        "count": have[1] + 1, "lastTimestamp": _stamp(wall), "message": n.message},
                        _content_type="application/merge-patch+json", _request_timeout=10))
                    self.written[key] = (have[0], have[1] + 1)
                    self._report("")
                    return
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            name = f"{n.pod.replace(CLAIM_OWNER, 'claim-', 1)[:200]}.{time.time_ns():x}"  # a DNS subdomain
            done(v1.create_namespaced_event(n.namespace, event_body(n, self.node, name, wall), _request_timeout=10))
            self.written[key] = (name, 1)
            self._report("")
        except ApiException as exc:
            hint = " (the agent's service account needs create/patch on events)" if exc.status == 403 else ""
            self._report(f"{n.reason} Event for {n.namespace}/{n.pod} not written: {exc.status} "
                         f"{exc.reason}{hint}")
        except Exception as exc:  # noqa: BLE001 - connection refused, timeouts: the notice is dropped
            self._report(f"{n.reason} Event for {n.namespace}/{n.pod} not written: {exc}")

    def _report(self, problem: str) -> None:
        """One log line per change of problem (a dead API server is not a line per poll)."""
        if problem and problem != self._problem:
            log.warning("%s", problem)
        elif not problem and self._problem:
            log.info("swap Events are written again")
        self._problem = problem

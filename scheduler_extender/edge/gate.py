"""Binds in flight, and filter's bounded wait while they are many (issue 39: the bind verb's latency).

Why: kube-scheduler binds in a goroutine per pod and decides the next pod at once. Its own binds wait in
its client's QPS limiter (50/s, burst 100); with the extender as binder nothing paces its decisions, so
when the API server applies Bindings more slowly than the scheduler decides (one shared core), every
decided pod's bind queued in the extender, behind its write pool (podwrites.MAX_CONNECTIONS): the bind verb
took seconds where its write took a few hundred ms, kube-scheduler held one connection per queued bind
(the verbs port's cap of 256 was reached: a refused bind is retried after a backoff), and a long enough
burst would pass the scheduler's 10 s httpTimeout.

So filter waits, before it decides anything, while LIMIT binds are in flight. The scheduler's loop is
serial, so the queue then forms before the next decision (the pod stays in the scheduling queue, holding
no goroutine, connection or reservation) and each bind waits only for its own write. Nothing of a bind
changes (no GPU overbooked, the reservation made under the state lock, a failed Binding written nowhere).
The wait is bounded by MAX_WAIT_S, well inside the scheduler's httpTimeout: then filter answers anyway,
so a stalled API server slows the scheduler to one decision per MAX_WAIT_S and never stops it (each bind
ends within its own write deadline and frees its place).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..kubeio.podwrites import MAX_CONNECTIONS

LIMIT = MAX_CONNECTIONS  # binds in flight before filter waits: more would only wait for a write connection
MAX_WAIT_S = 2.5  # the longest a filter waits: well inside kube-scheduler's extender httpTimeout (5 s when a
# configuration leaves it unset, DefaultExtenderTimeout; deploy/'s configurations set 10 s)


class BindGate:
    """A count of the binds in flight and a condition filter waits on."""

    def __init__(self, limit: int = LIMIT, max_wait_s: float = MAX_WAIT_S) -> None:
        if limit < 1 or not max_wait_s >= 0:
            raise ValueError(f"bind gate: limit {limit} and wait {max_wait_s} s; give a limit of at least 1 and a "
                             f"wait of at least 0 s")
        self.limit, self.max_wait_s = limit, max_wait_s
        self.in_flight = 0
        self.waited = 0  # filters that found the gate full, since start
        self.got_room = 0  # of those, filters that got room within max_wait_s (counted when they do: a counter)
        self.timed_out = 0  # of those, filters that answered after max_wait_s without room
        self._cond = threading.Condition(threading.Lock())

    @contextmanager
    def binding(self) -> Iterator[None]:
        """Counts one bind in flight for the duration of the block."""
        with self._cond:
            self.in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()  # every waiter: one whose client has gone must not take the only wake-up

    def wait_room(self) -> bool:
        """Return at once while fewer than `limit` binds are in flight, else when one ends or after max_wait_s
        (False: still full)."""
        with self._cond:
            if self.in_flight < self.limit:
                return True
            self.waited += 1
            room = self._cond.wait_for(lambda: self.in_flight < self.limit, self.max_wait_s)
            if room:
                self.got_room += 1
            else:
                self.timed_out += 1
            return room

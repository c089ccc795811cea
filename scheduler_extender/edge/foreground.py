"""The scheduling cycle's verbs first: binds and watch events give way to a filter or prioritize in progress.

Why: kube-scheduler's scheduling cycle is serial (filter, then prioritize, then the next pod) while its binds
run beside it, and every pod's bind brings the extender two stretches of Python besides (the bind itself,
then the watch event of the bound pod). All of them take turns on one GIL, and a thread that leaves it for a
system call (each recv and send of a filter's body and answer) gets it back only when the thread that took
it leaves it in turn: so the bind and watch work of the previous pods ran inside the next pod's filter and
prioritize, on the serial path that bounds pods/s (benchmarks/README.md, "500 pods/s with all names"). Here
that work waits, bounded by MAX_WAIT_S, while a filter or prioritize is being served, and for EXPECT_S after a
filter (its prioritize follows), so it runs in the gaps of the cycle (while kube-scheduler picks the host).
Nothing is skipped or reordered among binds or events: each only starts a little later, never more than
MAX_WAIT_S later, however busy the verbs are.
"""

from __future__ import annotations

import threading
import time

MAX_WAIT_S = 0.002  # the longest a bind or watch event waits for the verbs (about one filter + prioritize)
EXPECT_S = 0.001  # after a filter, how long its prioritize is waited for (the scheduler's gap between them)


class Foreground:
    """Counts the filters and prioritizes in progress; give_way() waits (bounded) until there are none."""

    def __init__(self, max_wait_s: float | None = None, expect_s: float | None = None) -> None:
        self.max_wait_s = MAX_WAIT_S if max_wait_s is None else max_wait_s
        self.expect_s = EXPECT_S if expect_s is None else expect_s
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._until = 0.0  # monotonic time until which a prioritize is expected (after a filter)
        self.waiting = 0  # binds and watch events waiting now
        self.waits = 0  # those that waited, since start

    def begin(self) -> None:
        """A filter or prioritize starts being served (the caller calls end() after its answer)."""
        with self._cond:
            self._active += 1

    def end(self, expect_more: bool) -> None:
        """It was answered; `expect_more`: the scheduler's next verb for the pod follows (after a filter)."""
        with self._cond:
            self._active -= 1
            self._until = time.monotonic() + self.expect_s if expect_more else 0.0
            if not self._active:
                self._cond.notify_all()

    def busy(self) -> bool:
        return self._active > 0 or time.monotonic() < self._until

    def give_way(self) -> float:
        """Wait until no filter or prioritize is being served nor expected, at most max_wait_s; the seconds
        waited. Called by binds and watch events before their work."""
        if not self.busy():  # the usual case in a gap: no lock taken
            return 0.0
        start = time.monotonic()
        deadline = start + self.max_wait_s
        with self._cond:
            self.waiting += 1
            self.waits += 1
            try:
                while (now := time.monotonic()) < deadline:
                    if self._active:
                        self._cond.wait(deadline - now)
                    elif now < self._until:
                        self._cond.wait(min(deadline, self._until) - now)
                    else:
                        break
            finally:
                self.waiting -= 1
        return time.monotonic() - start

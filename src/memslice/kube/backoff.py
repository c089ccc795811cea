"""One retry policy for every loop that talks to the API server: exponential, capped, with jitter (so that
many clients that lost the same API server do not come back in lockstep), reset after a success."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays initial, initial×factor, … up to `maximum`, each spread by ±`jitter` (a fraction)."""

    initial: float = 0.05
    maximum: float = 5.0
    factor: float = 2.0
    jitter: float = 0.2
    failures: int = 0  # consecutive failures so far
    _next: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"Backoff(initial={self.initial}, maximum={self.maximum}, factor={self.factor}, "
                             f"jitter={self.jitter}): need 0 < initial <= maximum, factor >= 1, 0 <= jitter < 1")
        self._next = self.initial

    def delay(self) -> float:
        """The delay before the next retry (and count a failure)."""
        base = self._next
        self.failures += 1
        self._next = min(base * self.factor, self.maximum)
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)

    def wait(self, stop: threading.Event) -> float:
        """Sleep the next delay, or less if `stop` is set meanwhile; the delay."""
        seconds = self.delay()
        stop.wait(seconds)
        return seconds

    def reset(self) -> None:
        """A success: the next failure waits `initial` again."""
        self.failures = 0
        self._next = self.initial

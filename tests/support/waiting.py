"""The one polling helper of the tests: wait for real state to reach a condition, with a bound.

A test never sleeps to make a race pass; it polls what it can observe (a file, a metric, an API object, a log
line) until the condition holds, and fails naming what it waited for when the bound passes first. The bound is a
failure deadline, never a measurement (no test asserts how fast something happens).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 0.05,
               alive: Callable[[], None] | None = None) -> Any:
    """Poll `predicate` until it returns something truthy (returned), at most `timeout` seconds; `alive` (if
    given) runs first on each round and raises when a process the wait depends on has died. AssertionError
    naming `what` and the last value otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None:
            alive()
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen[Any], grace: float = 20.0) -> None:
    """Stop a component the tests started: TERM, at most `grace` s for it to exit, then KILL (a stopped or hung
    process cannot hold a test past its bound)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)

"""How many examples the costliest property tests (Hypothesis) try on every run, and how to run them whole.

Why: ten property tests (3.5 to 25 s each at their full figure, 300 to 1,000 examples: about 120 of the 135 s
that all 43 property tests take) were a large share of `make test`'s CPU time on two cores. Those ten say
`@settings(max_examples=examples(N), derandomize=QUICK, ...)`: by default they run a quarter of N (at least 25),
derandomized (Hypothesis seeds each from its name: the same examples every run, so a run that fails fails
again with the same example). MEMSLICE_HYPOTHESIS=deep (`make test-deep`) runs them at N, drawn afresh each
run with Hypothesis' example database, as before: run it after changing what one of them covers, and now and
then. Every other property test runs its full figure, randomized, on every run.
"""

from __future__ import annotations

import os

MODES = ("quick", "deep")
MODE = os.environ.get("MEMSLICE_HYPOTHESIS", "quick")
QUICK = MODE != "deep"  # derandomize= for the tests that use examples()
QUICK_SHARE = 4  # quick runs 1/QUICK_SHARE of each figure...
QUICK_FLOOR = 25  # ...and no fewer than this (nor more than the figure)


def examples(figure: int, mode: str | None = None) -> int:
    """max_examples for a test whose full figure is `figure`, in `mode` (default: MEMSLICE_HYPOTHESIS's)."""
    if (mode or MODE) == "deep":
        return figure
    return max(min(figure, QUICK_FLOOR), figure // QUICK_SHARE)


def load() -> None:
    """Fail closed on a MEMSLICE_HYPOTHESIS that names no mode (before any test module is imported)."""
    if MODE not in MODES:
        raise SystemExit(f"MEMSLICE_HYPOTHESIS={MODE!r}: not a mode; use one of {', '.join(MODES)} "
                         "(or leave it unset for quick)")

"""How many examples the property tests (Hypothesis) try: a quarter of each test's figure, the same examples on
every run, unless MEMSLICE_HYPOTHESIS=deep asks for the whole figure, drawn afresh each run.

Why: the property tests were a sixth of `make test`'s CPU time on two cores (300 to 1,000 examples each, every
run). `make test` runs the "quick" profile: derandomized (Hypothesis seeds each test from its name, so a run
that passes passes again, and one that fails fails again with the same example), at least 25 examples a test
(or its whole figure where that is smaller). `make test-deep` (MEMSLICE_HYPOTHESIS=deep) runs every figure as
written, randomized and with Hypothesis' example database, as the tests ran before: run it after changing
what a property test covers, and from time to time (README, "Testing").
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILES = ("quick", "deep")
PROFILE = os.environ.get("MEMSLICE_HYPOTHESIS", "quick")
QUICK_SHARE = 4  # the quick profile runs 1/QUICK_SHARE of each figure...
QUICK_FLOOR = 25  # ...and no fewer than this (nor more than the figure)


def examples(figure: int, profile: str | None = None) -> int:
    """max_examples for a test whose full figure is `figure`, under `profile` (default: the loaded one)."""
    if (profile or PROFILE) == "deep":
        return figure
    return max(min(figure, QUICK_FLOOR), figure // QUICK_SHARE)


def load() -> None:
    """Register both profiles and load MEMSLICE_HYPOTHESIS's (before the test modules are imported: their
    @settings take the loaded profile's values for what they do not set)."""
    if PROFILE not in PROFILES:
        raise SystemExit(f"MEMSLICE_HYPOTHESIS={PROFILE!r}: not a profile; use one of {', '.join(PROFILES)} "
                         "(or leave it unset for quick)")
    settings.register_profile("quick", derandomize=True, max_examples=examples(100, "quick"))
    settings.register_profile("deep", max_examples=100)
    settings.load_profile(PROFILE)

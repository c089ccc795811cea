"""The test folders on sys.path, so that a test module, a benchmark or a stand-in imports a shared helper by
its name wherever it lives (tests/support/kube_standin.py, tests/extender/test_extender_support.py, ...).

Each folder is one concern (shim, sim, agent, dra, elastic, extender, deploy, realcluster, ...); every module
name is unique across them, so one flat namespace stays unambiguous. conftest.py and the benchmarks call add().
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
NOT_PYTHON = frozenset({"c", "gpu", "kubecluster", "__pycache__"})  # C programs, the GPU kit, Go programs


def folders() -> list[Path]:
    """tests/ and each of its folders of Python test modules."""
    return [TESTS, *sorted(d for d in TESTS.iterdir() if d.is_dir() and d.name not in NOT_PYTHON
                           and not d.name.startswith("."))]


def add() -> None:
    """Put tests/ and its folders on sys.path (once each, after what is there)."""
    for d in folders():
        if str(d) not in sys.path:
            sys.path.append(str(d))

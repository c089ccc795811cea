"""For the A/B run in benchmarks/README.md ("HTTP pieces"): with this directory on PYTHONPATH, the extender's
PodWriter sends the bind's two writes through the official client's urllib3 pool (its proxy path,
`manager.urlopen`) instead of its own connections: the library path, everything else unchanged.

    PYTHONPATH=benchmarks/urllib3_writes .venv/bin/python benchmarks/bench_extender.py ...
"""

from __future__ import annotations

from typing import Any

from memslice.scheduler_extender.kubeio import podwrites

_init = podwrites.PodWriter.__init__


def _through_urllib3(self: podwrites.PodWriter, api_client: Any) -> None:
    _init(self, api_client)
    self.direct = False


podwrites.PodWriter.__init__ = _through_urllib3  # type: ignore[method-assign]

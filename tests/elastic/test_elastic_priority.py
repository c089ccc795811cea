"""Priority under elastic memory (issue 26.3): a burst of a higher-priority pod (its PriorityClass value, which
the node agent writes into the limits file: MEMSLICE_PRIORITY here) may take a lower-priority pod's burst, never
the reverse; equal priorities leave each other's bursts alone. Real shimmed processes on the simulated GPU;
figures are the simulator's physical memory."""

from __future__ import annotations

import pytest
from conftest import MiB
from test_elastic_swap import elastic as elastic  # noqa: F401 - the fixture, shared
from test_elastic_swap import per_process
from test_elastic_swap import tenant_bin as tenant_bin  # noqa: F401 - the fixture, shared


@pytest.mark.parametrize(("first", "second", "taken"), [(0, 1000, True), (1000, 0, False), (500, 500, False)])
def test_a_burst_takes_only_a_lower_prioritys_burst(elastic, first, second, taken) -> None:
    """F (priority `first`) bursts to 1280 MiB and keeps running; S (priority `second`) then bursts to 1024 MiB
    on a 2 GiB GPU with 640 MiB free. Only when S's priority is higher does F move the 384 MiB S lacks (and no
    more than a chunk beyond) to host memory; otherwise S's burst beyond the free HBM is in host memory. Either
    way both requests stay in HBM and every byte reads back."""
    f = elastic("f", "1536MiB", "128MiB", gpus="2GiB", ctx="64MiB", idle="600", MEMSLICE_PRIORITY=str(first))
    assert f.cmd("alloc 1280 32") == "allocated 40"
    s = elastic("s", "1GiB", "128MiB", gpus="2GiB", ctx="64MiB", idle="600", MEMSLICE_PRIORITY=str(second))
    assert s.cmd("alloc 1024 32") == "allocated 32"
    use = per_process(elastic.node().state)
    if taken:
        assert use[s.proc.pid] == (64 + 1024, 0), "S's burst is all in HBM"
        assert 384 <= use[f.proc.pid][1] <= 384 + 32 and use[f.proc.pid][0] >= 64 + 128
    else:
        assert use[s.proc.pid] == (64 + 640, 384), "S's burst beyond the free HBM is in host memory"
        assert use[f.proc.pid] == (64 + 1280, 0), "F's burst was not taken"
    assert s.cmd("check") == f"check ok {1024 * MiB}"
    assert f.cmd("check") == f"check ok {1280 * MiB}"

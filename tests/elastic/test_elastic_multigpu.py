"""Elastic memory and spill caps in a pod that spans GPUs (issue 34), real processes under the real shim on two
simulated GPUs. The layout the node agent gives an N-GPU pod: one container quota per GPU, the same
elastic_slot on every GPU's board, one process per GPU (tensor parallel); each process is elastic on its own
GPU and arbitrated there with that GPU's neighbours. host_spill_limit caps each GPU's spill, as gpu_mem_limit
is each GPU's quota."""

from __future__ import annotations

from conftest import MiB
from test_elastic_swap import elastic, per_process, tenant_bin, wait_for  # noqa: F401  (fixtures)

from memslice.elastic import read_boards


def test_one_process_per_gpu_each_yields_to_its_own_gpus_neighbour(elastic):  # noqa: F811
    """Pod P (request 128 MiB, limit 768 MiB per GPU, elastic slot 0 on both boards): P0 fills 640 MiB of GPU 0,
    P1 640 MiB of GPU 1, both go idle. Neighbour A (slot 1) then takes its 512 MiB request on GPU 0 and B
    (slot 1) on GPU 1: each gets it all in HBM, from the pod's process on ITS GPU (both moved memory to host),
    and the pod's processes keep their request and every byte."""
    kw = dict(gpus="1GiB,1GiB", ctx="64MiB")
    p0 = elastic("pod", "768MiB", "128MiB", MEMSLICE_ELASTIC_SLOT="0", **kw)
    p1 = elastic("pod", "768MiB", "128MiB", MEMSLICE_ELASTIC_SLOT="0", **kw)
    assert p0.cmd("alloc 640 32") == "allocated 20"
    assert p1.cmd("device 1") == "device 1"
    assert p1.cmd("alloc 640 32") == "allocated 20"
    uuids = sorted(b.name.removesuffix(".board") for b in elastic.edir.glob("*.board"))
    assert len(uuids) == 2, "each process joined its own GPU's board"
    mine = {(t.gpu, t.slot): t.pid for t in read_boards(elastic.edir)}
    assert sorted(mine.values()) == sorted([p0.proc.pid, p1.proc.pid]) and {s for _, s in mine} == {0}, mine
    for p in (p0, p1):
        wait_for(lambda p=p: any(t.pid == p.proc.pid and t.state == "idle" for t in read_boards(elastic.edir)),
                 "the pod's process idle on its board")
    a = elastic("a", "1GiB", "512MiB", MEMSLICE_ELASTIC_SLOT="1", **kw)
    b = elastic("b", "1GiB", "512MiB", MEMSLICE_ELASTIC_SLOT="1", **kw)
    assert b.cmd("device 1") == "device 1"
    assert a.cmd("alloc 512 32") == "allocated 16"
    assert b.cmd("alloc 512 32") == "allocated 16"
    state = elastic.node().state
    wait_for(lambda: per_process(state)[a.proc.pid] == (64 + 512, 0), "A's request all in HBM on GPU 0")
    wait_for(lambda: per_process(state)[b.proc.pid] == (64 + 64 + 512, 0), "B's request all in HBM on GPU 1")
    use = per_process(state)
    for p, ctxs in ((p0, 64), (p1, 128)):
        dev, host = use[p.proc.pid]
        assert dev + host == ctxs + 640 and host > 0 and dev >= ctxs + 128, (p.proc.pid, dev, host)
    assert p0.cmd("check") == f"check ok {640 * MiB}"
    assert p1.cmd("check") == f"check ok {640 * MiB}"
    assert a.cmd("check") == f"check ok {512 * MiB}" and b.cmd("check") == f"check ok {512 * MiB}"


def test_the_host_spill_cap_is_per_gpu(elastic):  # noqa: F811
    """quota 256 MiB and host_spill_limit 128 MiB: each GPU spills up to 128 MiB (the container may pin 2 x the
    cap on two GPUs); past the cap on a GPU, an allocation there is refused."""
    t = elastic("s", "256MiB", None, gpus="1GiB,1GiB", ctx="64MiB", MEMSLICE_OVERSUBSCRIBE="1",
                MEMSLICE_HOST_SPILL_LIMIT="128MiB")
    assert t.cmd("alloc 384 32") == "allocated 12"            # GPU 0: 256 MiB in HBM, 128 MiB spilled
    assert t.cmd("device 1") == "device 1"
    assert t.cmd("alloc 384 32") == "allocated 12"            # GPU 1: its own 128 MiB of spill
    assert t.cmd("alloc 32 32").startswith("oom")             # GPU 1 past its cap
    assert per_process(elastic.node().state)[t.proc.pid] == (64 + 64 + 512, 256)
    assert t.cmd("check") == f"check ok {768 * MiB}"

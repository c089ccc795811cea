"""GPU topology in the node inventory (issue 34): NVLink peers and PCIe switches from NVML, as the agent publishes
them (contract.Gpu.nvlink / .pcie). The decision is pure (plugin.gpu.nvml.topology); the agent process reads the
simulated NVML through pynvml, as it reads a real one."""

from __future__ import annotations

from test_plugin_agent import short_tmp as short_tmp
from test_plugin_kube import NODE, REAL, published
from test_plugin_kube import cluster as cluster  # fixtures, shared
from test_plugin_kube import real_node as real_node

from memslice.contract import Inventory, closeness
from memslice.plugin.gpu.nvml import topology

pytestmark = REAL  # the agent's API is the session's real kube-apiserver (test_plugin_kube's fixtures)

# 4 GPUs: 0-1 behind one PCIe switch and NVLinked (NUMA 0), 2 alone on NUMA 0, 3 on NUMA 1; 2-3 NVLinked
TOPO = "4GiB:0,4GiB:0,4GiB:0,4GiB:1;nvlink=0-1,2-3;pcie=0-1"


def test_switch_groups_are_transitive_and_nvlink_pairs_symmetric():
    levels = {(0, 1): 10, (0, 2): 40, (0, 3): 50, (1, 2): 20, (1, 3): 50, (2, 3): 50}  # 1-2 via MULTIPLE
    nvlink = {(0, 1): True, (0, 2): False, (0, 3): None, (1, 2): False, (1, 3): False, (2, 3): True}
    assert topology([0, 1, 2, 3], levels, nvlink) == {0: ((1,), "pcie0"), 1: ((0,), "pcie0"),
                                                      2: ((3,), "pcie0"), 3: ((2,), "pcie3")}


def test_what_nvml_cannot_answer_is_unknown_never_a_guess():
    assert topology([0, 1], {(0, 1): None}, {(0, 1): None}) == {0: ((), None), 1: ((), None)}
    # one GPU answered with a neighbour, a third never answered: only the third is unknown
    got = topology([0, 1, 2], {(0, 1): 50, (0, 2): None, (1, 2): None}, {(0, 1): False, (0, 2): None, (1, 2): None})
    assert got == {0: ((), "pcie0"), 1: ((), "pcie1"), 2: ((), None)}


def test_the_agent_publishes_nvml_topology_that_the_extender_reads(cluster):
    api, _kubelet, make = cluster
    agent = make(sim_gpus=TOPO, unit_mib=4)
    gpus, _ = published(api, agent)
    assert [(g["index"], g.get("nvlink"), g.get("pcie")) for g in gpus] == [
        (0, [1], "pcie0"), (1, [0], "pcie0"), (2, [3], "pcie2"), (3, [2], "pcie3")]
    inv = Inventory.parse(NODE, api.get("Node", None, NODE)["metadata"]["annotations"])
    assert inv is not None
    g = inv.gpus
    assert [closeness(g[0], g[1]), closeness(g[0], g[2]), closeness(g[0], g[3])] == [0, 2, 3]

"""The simulated node's topology (MEMSLICE_SIM_GPUS `;nvlink=` and `;pcie=`): what real clients read from it.
nvidia-ml-py (what the node agent uses) asks the simulated NVML for the PCIe common ancestor, P2P status, NVLink
state and far ends, NUMA node and CPU affinity; cuda-bindings asks the simulated driver for peer capability and
peer access. A bad topology is refused by name, by the driver and by `memslice`."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import run

from memslice.simulator import validate_gpus

# 4 GPUs: 0-1 on NUMA 0 behind one PCIe switch and NVLinked, 2 on NUMA 0 alone, 3 on NUMA 1; 2-3 NVLinked.
TOPO = "4GiB:0,4GiB:0,4GiB:0,4GiB:1;nvlink=0-1,2-3;pcie=0-1"

NVML = """
import json, pynvml as n
n.nvmlInit()
h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
def links(d):
    try:
        out = []
        for k in range(4):
            if n.nvmlDeviceGetNvLinkState(d, k) == n.NVML_FEATURE_ENABLED:
                out.append([n.nvmlDeviceGetNvLinkRemoteDeviceType(d, k),
                            n.nvmlDeviceGetNvLinkRemotePciInfo(d, k).busId])
        return out
    except n.NVMLError_NotSupported:
        return None
print(json.dumps({
    "ancestor": [[n.nvmlDeviceGetTopologyCommonAncestor(a, b) for b in h] for a in h],
    "nvlink": [[n.nvmlDeviceGetP2PStatus(a, b, n.NVML_P2P_CAPS_INDEX_NVLINK) for b in h] for a in h],
    "read": [[n.nvmlDeviceGetP2PStatus(a, b, 0) for b in h] for a in h],  # NVML_P2P_CAPS_INDEX_READ (a tuple in pynvml)
    "links": [links(d) for d in h],
    "bus": [n.nvmlDeviceGetPciInfo(d).busId for d in h],
    "numa": [n.nvmlDeviceGetNumaNodeId(d) for d in h],
    "cpus": [list(n.nvmlDeviceGetCpuAffinity(d, 4)) for d in h],
}))
"""

CUDA = """
import json
from cuda.bindings import driver as cu
def ok(r):
    err, *rest = r
    return (int(err), *rest)
cu.cuInit(0)
_, count = cu.cuDeviceGetCount()
can = [[ok(cu.cuDeviceCanAccessPeer(a, b))[1] for b in range(count)] for a in range(count)]
A = cu.CUdevice_P2PAttribute
rank = ok(cu.cuDeviceGetP2PAttribute(A.CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, 0, 1))[1]
atom = ok(cu.cuDeviceGetP2PAttribute(A.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, 0, 2))[1]
same = int(cu.cuDeviceGetP2PAttribute(A.CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 1, 1)[0])
ctx = [ok(cu.cuDevicePrimaryCtxRetain(d))[1] for d in range(count)]
cu.cuCtxSetCurrent(ctx[0])
steps = {
    "enable": int(cu.cuCtxEnablePeerAccess(ctx[1], 0)[0]),
    "again": int(cu.cuCtxEnablePeerAccess(ctx[1], 0)[0]),
    "flags": int(cu.cuCtxEnablePeerAccess(ctx[2], 1)[0]),
    "self": int(cu.cuCtxEnablePeerAccess(ctx[0], 0)[0]),
    "numa": int(cu.cuCtxEnablePeerAccess(ctx[3], 0)[0]),
    "disable": int(cu.cuCtxDisablePeerAccess(ctx[1])[0]),
    "disable_again": int(cu.cuCtxDisablePeerAccess(ctx[1])[0]),
}
print(json.dumps({"count": count, "can": can, "rank": rank, "atom": atom, "same": same, "steps": steps}))
"""


def test_nvml_reads_pcie_nvlink_numa_and_affinity(node):
    n = node(TOPO)
    out = run([sys.executable, "-c", NVML], n.env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    S, N, X = 10, 40, 50  # NVML_TOPOLOGY_SINGLE, _NODE, _SYSTEM
    assert got["ancestor"] == [[0, S, N, X], [S, 0, N, X], [N, N, 0, X], [X, X, X, 0]]
    OK, NO, IOH = 0, 5, 3  # NVML_P2P_STATUS_OK, _NOT_SUPPORTED, _IOH_TOPOLOGY_NOT_SUPPORTED
    assert got["nvlink"] == [[NO, OK, NO, NO], [OK, NO, NO, NO], [NO, NO, NO, OK], [NO, NO, OK, NO]]
    assert got["read"] == [[NO, OK, OK, IOH], [OK, NO, OK, IOH], [OK, OK, NO, OK], [IOH, IOH, OK, NO]]
    bus = got["bus"]
    assert got["links"] == [[[0, bus[1]]], [[0, bus[0]]], [[0, bus[3]]], [[0, bus[2]]]]
    assert got["numa"] == [0, 0, 0, 1]
    cpus = [sum(word << (64 * i) for i, word in enumerate(mask)) for mask in got["cpus"]]
    assert cpus[0] == cpus[1] == cpus[2] and cpus[0] and cpus[3]  # the CPUs of each GPU's NUMA node
    assert cpus[0] & cpus[3] == 0 or os.cpu_count() == 1


def test_no_topology_means_pcie_per_gpu_and_no_nvlink(node):
    n = node("4GiB,4GiB")
    out = run([sys.executable, "-c", NVML], n.env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["ancestor"] == [[0, 40], [40, 0]]
    assert got["links"] == [None, None]  # NVML_ERROR_NOT_SUPPORTED, as a PCIe card answers
    assert got["read"] == [[5, 0], [0, 5]]


def test_cuda_peer_capability_and_access_follow_the_topology(node):
    pytest.importorskip("cuda.bindings")
    n = node(TOPO)
    out = run([sys.executable, "-c", CUDA], n.env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["count"] == 4
    assert got["can"] == [[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 1], [0, 0, 1, 0]]
    assert got["rank"] == 0 and got["atom"] == 0  # NVLink is rank 0; no native atomics over PCIe
    assert got["same"] == 101  # CUDA_ERROR_INVALID_DEVICE: a device and itself have no link
    assert got["steps"] == {"enable": 0, "again": 704, "flags": 1, "self": 201, "numa": 217, "disable": 0,
                            "disable_again": 705}


@pytest.mark.parametrize("spec, word", [
    ("4GiB,4GiB;nvlink=0-2", "nvlink group '0-2'"),
    ("4GiB,4GiB;nvlink=0-0", "nvlink group '0-0'"),
    ("4GiB,4GiB;nvlink=0", "nvlink group '0'"),
    ("4GiB,4GiB,4GiB;pcie=0-1,1-2", "pcie group '1-2'"),
    ("4GiB,4GiB;nvlonk=0-1", "option nvlonk=0-1"),
    ("4GiB,4GiB;nvlink=0-1;nvlink=0-1", "option nvlink=0-1"),
])
def test_bad_topology_is_refused_by_name(node, spec, word):
    n = node(spec)
    out = run([sys.executable, "-c", "import pynvml as n; n.nvmlInit()"], n.env)
    assert out.returncode != 0
    assert word in out.stderr and spec in out.stderr
    with pytest.raises(ValueError, match=word.split(" ")[0]):
        validate_gpus(spec)


def test_memslice_accepts_the_topology_syntax():
    validate_gpus(TOPO)
    validate_gpus("80GiB,80GiB,80GiB,80GiB;nvlink=0-1-2-3")


VISIBLE = """
import json, pynvml
from cuda.bindings import driver as cu
pynvml.nvmlInit()
nvml = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
err = int(cu.cuInit(0)[0])
seen = []
if err == 0:
    for d in range(cu.cuDeviceGetCount()[1]):
        u = cu.cuDeviceGetUuid(d)[1].bytes.hex()
        seen.append(next(i for i, x in enumerate(nvml) if x.replace("-", "")[3:] == u))
print(json.dumps({"init": err, "seen": seen, "nvml": nvml}))
"""


def visible(n, value: str | None) -> dict:
    env = dict(n.env)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if value is not None:
        env["CUDA_VISIBLE_DEVICES"] = value
    out = run([sys.executable, "-c", VISIBLE], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_cuda_visible_devices_numbers_the_gpus_as_the_driver_does(node):
    pytest.importorskip("cuda.bindings")
    n = node("4GiB,4GiB,4GiB")
    assert visible(n, None)["seen"] == [0, 1, 2]
    assert visible(n, "2,0")["seen"] == [2, 0]  # in the order given; NVML still lists all three
    uuid1 = visible(n, None)["nvml"][1]
    assert visible(n, f"{uuid1[:12]},0")["seen"] == [1, 0]  # a UUID prefix names a GPU
    assert visible(n, "1,7,0")["seen"] == [1]  # the list ends at the first entry naming no GPU
    assert visible(n, "0,0,1")["seen"] == [0]  # ... or one already listed
    assert visible(n, "")["init"] == 100  # CUDA_ERROR_NO_DEVICE


def test_memslice_sim_topo_shows_the_matrix(node):
    n = node(TOPO)
    assert run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], n.env).returncode == 0  # node created
    out = run([sys.executable, "-m", "memslice", "sim", "topo", "--state", n.state, "--json"], n.env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"matrix": [["X", "NV", "NODE", "SYS"], ["NV", "X", "NODE", "SYS"],
                                                 ["NODE", "NODE", "X", "NV"], ["SYS", "SYS", "NV", "X"]],
                                      "numa": [0, 0, 0, 1]}
    out = run([sys.executable, "-m", "memslice", "sim", "topo", "--state", n.state], n.env)
    assert out.returncode == 0 and out.stdout.splitlines()[1].split() == ["GPU0", "X", "NV", "NODE", "SYS", "0"]
    missing = run([sys.executable, "-m", "memslice", "sim", "topo", "--state", n.state + ".nope"], n.env)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_node_file_of_the_previous_layout_reads_as_no_topology(node):
    """A node file written before the topology part existed (56 bytes shorter) still opens: no NVLink, each GPU
    on its own switch; a file shorter still is refused by name."""
    n = node("4GiB,4GiB")
    assert run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], n.env).returncode == 0
    size = os.path.getsize(n.state)
    os.truncate(n.state, size - 56)  # struct sim_topo: magic, pad, 16 x u16 NVLink masks, 16 x u8 switches
    out = run([sys.executable, "-c", NVML], n.env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["links"] == [None, None] and got["ancestor"] == [[0, 40], [40, 0]]
    os.truncate(n.state, size - 57)
    bad = run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], n.env)
    assert bad.returncode != 0 and "not a valid simulator node file" in bad.stderr

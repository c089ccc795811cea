"""The elastic work gate (issue 13): every driver entry point that submits work which may read or write device
memory waits while this process moves an elastic range between HBM and host memory. Real processes under the
real shim on the simulated GPU: a busy tenant keeps issuing 2D/3D copies, peer copies, async and 2D memsets,
stream memory operations and batch copies (through dlsym and through cuGetProcAddress) on ranges that a
neighbour's guaranteed allocations move to host memory and back, again and again; and every gated name
resolves to the shim through both routes."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import TESTS, MiB, run
from test_elastic_swap import elastic, per_process, tenant_bin, wait_for  # noqa: F401  (fixtures)

from memslice.elastic import read_boards
from memslice.interposer.region import read_region_file

ROOT = TESTS.parent
HOOKS_LAUNCH = ROOT / "interposer" / "src" / "hooks_launch.c"
HOOKS_DEF = ROOT / "interposer" / "src" / "hooks.def"
CUDA_EXPORTS = ROOT / "interposer" / "sim" / "cuda_exports.def"

# Entry points of cuda.h that submit work but deliberately pass no gate (docs/architecture.md, "The work
# gate"): copies between host memory and CUDA arrays, or between two arrays, touch no linear device memory
# (elastic ranges are linear memory); a host function runs on a CPU thread, which cannot address an elastic
# range (only the device is given access to it).
NOT_GATED = re.compile(r"^cuMemcpy(AtoH|HtoA|AtoA)(Async)?(_v2)?(_ptds|_ptsz)?$|^cuLaunchHostFunc(_v2)?(_ptsz)?$")
# Every family of cuda.h that submits work which may touch device memory.
SUBMITS_WORK = re.compile(r"^cu(Memcpy|Memset|Launch|GraphLaunch|StreamWriteValue|StreamWaitValue|StreamBatchMemOp"
                          r"|MemBatchDecompressAsync)")


def gated() -> set[str]:
    return set(re.findall(r"^(?:GATED|LAUNCH)\((\w+),", HOOKS_LAUNCH.read_text(), re.M))  # LAUNCH: gated too (compute)


def driver_names() -> set[str]:
    return set(re.findall(r"^SIM_STUB\((\w+)\)", CUDA_EXPORTS.read_text(), re.M))


def proc_rows() -> list[tuple[str, int, int, str]]:
    """cuGetProcAddress's table from cuda.h/cudaTypedefs.h: (base name, version, per-thread, ABI symbol)."""
    rows = re.findall(r'^SIM_PROC\("(\w+)", (\d+), (\d), (\w+)\)', CUDA_EXPORTS.read_text(), re.M)
    return [(b, int(v), int(p), s) for b, v, p, s in rows]


def test_every_work_submission_of_cuda_h_is_gated_or_listed_as_not_touching_device_memory():
    """The list is checked against cuda.h (the generated export list): a new copy, set or launch entry point
    in a later cuda.h fails here until it is gated or its exclusion is argued."""
    candidates = {n for n in driver_names() if SUBMITS_WORK.match(n) and not NOT_GATED.match(n)}
    missing = candidates - gated()
    assert not missing, f"submit work but are not gated: {sorted(missing)}"
    hooked = set(re.findall(r"^HOOK_ENTRY\((\w+)\)", HOOKS_DEF.read_text(), re.M))
    assert gated() <= hooked, f"gated but not in hooks.def (unreachable): {sorted(gated() - hooked)}"
    assert gated() <= driver_names(), f"not in cuda.h: {sorted(gated() - driver_names())}"


ROUTES = r"""
import ctypes, json, sys
names, rows = json.loads(sys.argv[1]), json.loads(sys.argv[2])
lib = ctypes.CDLL("libcuda.so.1")
assert lib.cuInit(0) == 0
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]
libc = ctypes.CDLL(None)
libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
def who(addr):
    info = DlInfo()
    if not addr or not libc.dladdr(addr, ctypes.byref(info)):
        return "none"
    return "%s:%s" % (info.fname.decode().rsplit("/", 1)[-1], (info.sname or b"?").decode())
gp = lib.cuGetProcAddress_v2
gp.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_ulonglong,
               ctypes.POINTER(ctypes.c_int)]
out = {}
for n in names:  # dlsym on the driver's handle, exact ABI names
    out["dlsym " + n] = who(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value)
for base, ver, ptds, sym in rows:  # cuGetProcAddress_v2 at the version that introduced the variant
    fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = gp(base.encode(), ctypes.byref(fn), ver, 2 if ptds else 0, ctypes.byref(st))
    out["procaddr %s@%d/%d" % (base, ver, ptds)] = "rc=%d st=%d %s" % (rc, st.value, who(fn.value))
print(json.dumps(out))
"""


def test_every_gated_name_resolves_to_the_shim_through_dlsym_and_cuGetProcAddress(node, tmp_path):
    """dlsym(handle, name) and cuGetProcAddress_v2 (every version and per-thread-stream row cuda.h defines for
    a gated variant) both hand out the shim's wrapper of that exact variant."""
    names = sorted(gated())
    rows = [r for r in proc_rows() if r[3] in gated()]
    assert len(rows) >= len(names) - 5  # (a few legacy names have no cuGetProcAddress row)
    env = node().container(tmp_path / "c", "1GiB", MEMSLICE_SIM_DRIVER_VERSION="13050")  # a 13.5 driver
    out = run([sys.executable, "-c", ROUTES, json.dumps(names), json.dumps(rows)], env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    wrong = {k: v for k, v in got.items() if k.startswith("dlsym ") and v != f"libmemslice.so:{k[6:]}"}
    wrong |= {f"procaddr {b}@{v}/{p}": got[f"procaddr {b}@{v}/{p}"] for b, v, p, s in rows
              if got[f"procaddr {b}@{v}/{p}"] != f"rc=0 st=0 libmemslice.so:{s}"}
    assert not wrong, wrong


FAMILIES = ["copy2d", "copy3d", "peer", "setasync", "memop"]


@pytest.mark.parametrize("family", FAMILIES)
def test_busy_tenant_keeps_its_data_while_a_neighbour_moves_its_ranges_again_and_again(elastic, family):  # noqa: F811
    """B bursts above its request and two threads keep writing and reading its 4 newest blocks with one
    family of entry points (thread 0 through dlsym, thread 1 through cuGetProcAddress's per-thread-stream
    variants). A's guaranteed allocation, twice over, makes B move exactly those blocks to host memory; A
    frees, and B brings them back to HBM: 16 moves of blocks in use, the second round's into the pinned host
    chunks the first one left in the pool. Every round's bytes are right, no call fails, nothing faults, and
    all of B's bytes are intact at the end.

    Sizes: B's blocks are 8 MiB (each a range of one chunk, the unit that moves), so a busy round is short
    and the mover's gate waits on it briefly; HBM lacks exactly B's 4 busy blocks (512 - 64 - 256 - 64 - 160
    = -32 MiB). Two rounds, not more: the busy threads spin for ELASTIC_BACK_AFTER_MS (2 s) per round while
    the blocks stay in host memory, and a third round takes the same paths as the second."""
    b = elastic("b", "384MiB", "128MiB", gpus="512MiB", ctx="64MiB", idle="600")
    assert b.cmd("alloc 256 8") == "allocated 32"
    assert b.cmd(f"busy 2 {family}") == "busy"
    state = elastic.node().state
    a = elastic("a", "512MiB", "256MiB", gpus="512MiB", ctx="64MiB", idle="600")
    for _ in range(2):
        assert a.cmd("alloc 160 32") == "allocated 5"
        wait_for(lambda: per_process(state)[a.proc.pid] == (64 + 160, 0), "A's request in HBM")
        assert per_process(state)[b.proc.pid][1] > 0, "B moved its busy blocks to host memory"
        assert a.cmd("free") == "freed 0"
        wait_for(lambda: per_process(state)[b.proc.pid] == (64 + 256, 0), "B's blocks back in HBM")
    out = b.cmd("stop")
    rounds, errors = map(int, out.split()[1:])
    assert rounds > 0 and errors == 0, out
    assert b.cmd("check") == f"check ok {256 * MiB}"
    assert b.proc.poll() is None


def test_elastic_memory_is_on_the_first_gpu_a_process_uses_and_the_others_are_plain(elastic, tmp_path):  # noqa: F811
    """A process is elastic on one GPU (the first it allocates on); on another GPU its allocations take the
    plain path, which the shim says once, naming both GPUs: there A is not on the board, so it is never
    asked to yield (nor moved) even when idle, and B's allocation there that HBM cannot hold is served from
    host memory at once instead of waiting for A."""
    err = tmp_path / "a.err"
    with err.open("w") as f:
        a = elastic("a", "768MiB", "128MiB", gpus="1GiB,1GiB", ctx="64MiB", stderr=f)
    assert a.cmd("alloc 256 32") == "allocated 8"            # GPU 0: elastic
    assert a.cmd("device 1") == "device 1"
    assert a.cmd("alloc 512 32") == "allocated 16"           # GPU 1: plain
    state = elastic.node().state
    wait_for(lambda: per_process(state).get(a.proc.pid) == (64 + 256 + 64 + 512, 0), "A's bytes in HBM")
    boards = sorted(elastic.edir.glob("*.board"))
    assert len(boards) == 1, "A joined GPU 0's board only"
    gpu1 = read_region_file(state + ".usage").devices[1].uuid
    text = err.read_text()
    assert text.count("take the plain path") == 1 and gpu1 in text, text
    wait_for(lambda: any(t.pid == a.proc.pid and t.state == "idle" for t in read_boards(elastic.edir)), "A idle")
    b = elastic("b", "1GiB", "512MiB", gpus="1GiB,1GiB", ctx="64MiB")
    assert b.cmd("device 1") == "device 1"
    assert b.cmd("alloc 512 32") == "allocated 16"
    # on GPU 1: 1024 - A's 64 + 512 - B's 64 leaves 384 MiB of HBM; the rest of B is in host memory, A kept its
    assert per_process(state)[b.proc.pid] == (64 + 64 + 384, 128)
    assert per_process(state)[a.proc.pid] == (64 + 256 + 64 + 512, 0)
    assert b.cmd("check") == f"check ok {512 * MiB}"
    assert a.cmd("check") == f"check ok {768 * MiB}"


def test_on_another_gpu_oversubscription_spills_as_without_elastic_mode(elastic):  # noqa: F811
    """The plain path on a GPU that is not the process's elastic one is cuMemAlloc_v2's own: past the quota,
    with MEMSLICE_OVERSUBSCRIBE=1, the allocation spills to host memory instead of failing."""
    a = elastic("a", "512MiB", "128MiB", gpus="1GiB,1GiB", ctx="64MiB", idle="600", MEMSLICE_OVERSUBSCRIBE="1")
    assert a.cmd("alloc 64 32") == "allocated 2"             # GPU 0: elastic
    assert a.cmd("device 1") == "device 1"
    assert a.cmd("alloc 640 32") == "allocated 20"           # GPU 1: 512 MiB under the quota, 128 MiB spilled
    assert per_process(elastic.node().state)[a.proc.pid] == (64 + 64 + 64 + 512, 128)
    assert a.cmd("check") == f"check ok {704 * MiB}"

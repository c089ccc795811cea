"""Issues 25's and 35's attacks on the elastic board, each reproduced against real shimmed processes on the
simulated GPU (or the agent's real board preparation) and shown to fail: a FIFO in place of a board, slots
squatted and forged so a neighbour's request would fail or wait, asks posted every 5 ms to keep a neighbour's
memory in host memory, forged figures inflating the node's metrics, a forged host note failing a neighbour's
burst (35.3), asks claiming a need of 16 TiB (35.4). Figures are the simulator's physical memory."""

from __future__ import annotations

import os
import re
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MiB
from test_elastic_swap import elastic as elastic  # noqa: F401 - the fixture, shared
from test_elastic_swap import per_process, wait_for
from test_elastic_swap import tenant_bin as tenant_bin  # noqa: F401 - the fixture, shared

from memslice.elastic import ASK_OFF, FILE_SIZE, LIVE_OFF, SLOTS, RosterEntry, Tenant, read_boards, render_roster
from memslice.interposer.region import read_region_file
from memslice.plugin.elastic.metrics import per_gpu


def forged_idle(claim: int, pid: int = 1) -> bytes:
    """A slot claiming `claim` bytes resident, idle for a day, request 0: the most attractive one to ask."""
    return struct.pack("<IIiI10QiIQIIII", 0x4C45534D, 2, pid, 3, 0, claim, claim, 0, 86_400_000, 0, 0, 0, 0, 0,
                       0, 0, 0, 0, 0, 0, 0)


def squatter(board: Path, slots: list[int], claim: int, kind: str = "w") -> subprocess.Popen[str]:
    """A process that takes the liveness locks of `slots` (kind "w": write locks, writing forged idle slots
    there, as a process that can write those files could; "r": read locks, all that a read-only view of a
    neighbour's file allows) and never answers."""
    code = f"""
import fcntl, os, sys
flags = os.O_RDWR | os.O_CREAT if {kind!r} == "w" else os.O_RDONLY
for i in {slots!r}:
    fd = os.open(os.path.join({str(board)!r}, "%02d.slot" % i), flags)
    fcntl.lockf(fd, (fcntl.LOCK_EX if {kind!r} == "w" else fcntl.LOCK_SH) | fcntl.LOCK_NB, 1, {LIVE_OFF}, 0)
    if {kind!r} == "w":
        os.pwrite(fd, {forged_idle(claim)!r}, 0)
print("in", flush=True)
sys.stdin.read()
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "in\n"
    return p


def stop(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=30)


def test_a_fifo_file_or_link_in_place_of_a_board_never_hangs_the_agent_start(tmp_path: Path) -> None:
    """25.3, 35.3: what was left where a board goes (a FIFO, a link, a version 4 board file) is moved aside and a
    board directory (0755) of 64 slot files (0666, the mount decides who writes one) put there, without
    blocking; the agent's start (a separate process here, so a hang fails the test instead of stopping it)
    finishes. A board directory already there keeps its live slot files as they are."""
    d = tmp_path / "elastic"
    d.mkdir()
    os.mkfifo(d / "GPU-a.board")
    (d / "GPU-b.board").mkdir()
    os.mkfifo(d / "GPU-b.board" / "03.slot")
    (d / "GPU-b.board" / "04.slot").symlink_to("/etc/passwd")
    (d / "GPU-b.board" / "05.slot").write_bytes(b"keep")
    (d / "GPU-c.board").symlink_to("/etc/passwd")
    (d / "GPU-d.board").write_bytes(b"a version 4 board")
    code = ("import sys; from pathlib import Path; from memslice.plugin.regions import prepare_elastic_dir; "
            "prepare_elastic_dir(Path(sys.argv[1]), ['GPU-a', 'GPU-b', 'GPU-c', 'GPU-d'])")
    r = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    for g in "abcd":
        st = os.lstat(d / f"GPU-{g}.board")
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755
        for i in range(SLOTS):
            f = os.lstat(d / f"GPU-{g}.board" / f"{i:02d}.slot")
            assert stat.S_ISREG(f.st_mode) and stat.S_IMODE(f.st_mode) == 0o666
    assert (d / "GPU-b.board" / "05.slot").read_bytes().startswith(b"keep"), "a slot file is kept as it is"
    assert Path("/etc/passwd").stat().st_mode & 0o777 != 0o666
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


def test_containers_see_the_elastic_directory_read_only_and_only_their_own_slot_writable(tmp_path: Path) -> None:
    """25.3, 35.3: the Allocate response mounts the directory read-only and the container's own slot file of
    its GPU's board read-write, nothing else; without a slot (the board full), nothing read-write."""
    from memslice.elastic import CONTAINER_ELASTIC_DIR
    from memslice.plugin.deviceplugin.allocator import Target
    from memslice.plugin.deviceplugin.server import container_response
    from memslice.plugin.gpu.nvml import GpuInfo
    from memslice.plugin.response import ResponseConfig

    gpu = GpuInfo(index=0, uuid="GPU-x", model="m", mem_mib=8192, numa=None, mig=False)
    target = Target(gpu=gpu, device_ids=("g0-1",), mib=1024)
    cfg = ResponseConfig(shim_host_dir=tmp_path, elastic_host_dir=tmp_path / "e")
    resp = container_response(target, tmp_path / "r", cfg, 4096, 3)
    mounts = {m.container_path: (m.host_path, m.read_only) for m in resp.mounts}
    elastic = {k: v for k, v in mounts.items() if k.startswith(CONTAINER_ELASTIC_DIR)}
    assert elastic == {CONTAINER_ELASTIC_DIR: (str(tmp_path / "e"), True),
                       f"{CONTAINER_ELASTIC_DIR}/GPU-x.board/03.slot": (str(tmp_path / "e/GPU-x.board/03.slot"), False)}
    full = container_response(target, tmp_path / "r", cfg, 4096, -1)
    assert [(m.container_path, m.read_only) for m in full.mounts if m.container_path.startswith(CONTAINER_ELASTIC_DIR)
            ] == [(CONTAINER_ELASTIC_DIR, True)]


def test_squatted_and_forged_slots_do_not_stop_or_slow_a_neighbours_request(elastic, tmp_path) -> None:
    """25.4 and 25.6: every other slot of the board (62) is held by a neighbour that forged its own slot idle,
    claiming the whole GPU, and never answers (a tenant writes only its own slot file since board version 5:
    B's slot cannot be taken, test_a_slot_read_locked_by_a_neighbour_still_asks_and_gets_its_request). B still
    gets its request in HBM, from the bursting neighbour the agent's roster names: B asks A alone (never a
    forged slot, so no ack bound is waited out for one), and the forged figures count for nothing. (How long
    it takes: `bench_elastic.py --skip-only`.)"""
    a = elastic("a", "1536MiB", "128MiB", gpus="2GiB", ctx="64MiB", idle="600", MEMSLICE_ELASTIC_SLOT="0")
    assert a.cmd("alloc 1280 64") == "allocated 20"
    board = next(elastic.edir.glob("*.board"))
    uuid = board.name.removesuffix(".board")
    (elastic.edir / f"{uuid}.roster").write_bytes(render_roster([RosterEntry(0, 128, 1536),
                                                                 RosterEntry(1, 768, 1024)]))
    sq = squatter(board, list(range(2, SLOTS)), 1 << 40)
    try:
        b = elastic("b", "1GiB", "768MiB", gpus="2GiB", ctx="64MiB", MEMSLICE_ELASTIC_SLOT="1", MEMSLICE_LOG="info",
                    stderr=(tmp_path / "b.err").open("w"))
        assert b.cmd("alloc 768 32") == "allocated 24"
        state = elastic.node().state
        # (at once, unless a loaded machine delayed A's answer past the ack bound: then moments later)
        wait_for(lambda: per_process(state)[b.proc.pid] == (64 + 768, 0), "B's request all in HBM", timeout=20)
        dev, host = per_process(state)[a.proc.pid]
        assert 128 <= host <= 160 and dev >= 64 + 128, "A moved what B lacked of its burst, kept its request"
        assert b.cmd("check") == f"check ok {768 * MiB}"
        assert a.cmd("check") == f"check ok {1280 * MiB}"
        b.close()
    finally:
        stop(sq)
    err = (tmp_path / "b.err").read_text()
    asked = [int(n) for n in re.findall(r"elastic: asked (\d+) neighbour", err)]
    assert asked and set(asked) == {1}, err
    assert set(re.findall(r"slot (\d+) of the board did not", err)) <= {"0"}, "a forged slot was asked and waited for"


def test_a_slot_read_locked_by_a_neighbour_still_asks_and_gets_its_request(elastic) -> None:
    """25.4, 35.3: a neighbour that can only read the other slot files read-locks every liveness byte, B's
    assigned slot included (a read lock is not a live owner). B cannot take its slot's lock, yet it asks the
    bursting neighbour through its own file and gets its request in HBM; the read-locked slots are asked by
    nobody."""
    a = elastic("a", "1536MiB", "128MiB", gpus="2GiB", ctx="64MiB", idle="600", MEMSLICE_ELASTIC_SLOT="0")
    assert a.cmd("alloc 1280 64") == "allocated 20"
    board = next(elastic.edir.glob("*.board"))
    uuid = board.name.removesuffix(".board")
    (elastic.edir / f"{uuid}.roster").write_bytes(render_roster([RosterEntry(0, 128, 1536),
                                                                 RosterEntry(1, 768, 1024)]))
    for i in range(1, SLOTS):  # what the agent prepares
        (board / f"{i:02d}.slot").write_bytes(bytes(FILE_SIZE))
    sq = squatter(board, list(range(1, SLOTS)), 0, kind="r")
    try:
        assert [t.slot for t in read_boards(elastic.edir)] == [0], "read locks are no live owners"
        b = elastic("b", "1GiB", "768MiB", gpus="2GiB", ctx="64MiB", MEMSLICE_ELASTIC_SLOT="1")
        assert b.cmd("alloc 768 32") == "allocated 24"
        wait_for(lambda: per_process(elastic.node().state)[b.proc.pid] == (64 + 768, 0), "B's request in HBM",
                 timeout=20)
    finally:
        stop(sq)


def ask_flood(board: Path, slot: int, seconds: float, mib: int, mine: int = 63,
              roster: bytes | None = None) -> subprocess.Popen[str]:
    """From slot `mine` (its own file), post an ask for `mib` MiB (share and need, burst flag) to `slot` every
    5 ms for `seconds`. With `roster`: first say "ready" and wait for a line on stdin (the board may not be
    there yet), then put those bytes in place as the board's roster as the agent does (put_roster: a new file
    renamed over the old one) and post the first ask right after."""
    bits = min(mib, 0xFFFFFF) | (min(mib, 0xFFFFFF) << 24) | (1 << 63)
    path = board.parent / f"{board.name.removesuffix('.board')}.roster"
    code = f"""
import os, struct, sys, time
if {roster!r} is not None:
    print("ready", flush=True)
    sys.stdin.readline()
    with open({str(path) + ".new"!r}, "wb") as f:
        f.write({roster!r})
    os.replace({str(path) + ".new"!r}, {str(path)!r})
fd = os.open(os.path.join({str(board)!r}, "%02d.slot" % {mine}), os.O_RDWR | os.O_CREAT, 0o666)
end = time.monotonic() + {seconds}
n = 0
while time.monotonic() < end:
    n += 1
    os.pwrite(fd, struct.pack("<QQ", time.monotonic_ns(), {bits}), {ASK_OFF} + {slot} * 16)
    time.sleep(0.005)
print(n, flush=True)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if roster is not None:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def put_roster(edir: Path, uuid: str, entries: list[RosterEntry]) -> None:
    """GPU `uuid`'s roster, written as the agent writes it (plugin/elastic/slots.py: renamed into place)."""
    new = edir / f".{uuid}.roster.new"
    new.write_bytes(render_roster(entries))
    os.replace(new, edir / f"{uuid}.roster")


@pytest.mark.parametrize("idle", ["600", "0.3"])
def test_asks_every_5_ms_move_nothing_while_hbm_is_not_short(elastic, idle) -> None:
    """25.5: on an almost empty GPU, asks posted every 5 ms (each claiming the GPU short by 1 GiB) move none of
    an active or idle neighbour's memory: the driver's free memory says HBM is not short."""
    a = elastic("a", "1536MiB", "256MiB", gpus="4GiB", ctx="64MiB", idle=idle)
    assert a.cmd("alloc 1024 64") == "allocated 16"
    state = elastic.node().state
    slot = next(t.slot for t in read_boards(elastic.edir) if t.pid == a.proc.pid)
    flood = ask_flood(next(elastic.edir.glob("*.board")), slot, 2.0, 1024)
    samples = []
    while flood.poll() is None:
        samples.append(per_process(state)[a.proc.pid])
        time.sleep(0.05)
    assert flood.stdout is not None and int(flood.stdout.read()) > 100
    assert set(samples) == {(64 + 1024, 0)}, "nothing moved"
    assert a.cmd("check") == f"check ok {1024 * MiB}"


def test_asks_never_starve_the_swap_in_of_a_request(elastic) -> None:
    """25.5: A (opted in to giving up its request while idle) lost part of its request to B; B frees; while
    asks flood A every 5 ms, A runs again and its request comes back to HBM."""
    a = elastic("a", "1536MiB", "1280MiB", gpus="2GiB", ctx="64MiB", MEMSLICE_IDLE_RELEASE="1")
    assert a.cmd("alloc 1280 64") == "allocated 20"
    state = elastic.node().state
    wait_for(lambda: next(t.state for t in read_boards(elastic.edir) if t.pid == a.proc.pid) == "idle", "A idle")
    b = elastic("b", "1GiB", "896MiB", gpus="2GiB", ctx="64MiB")
    assert b.cmd("alloc 896 32") == "allocated 28"
    assert per_process(state)[a.proc.pid][1] >= 256
    assert b.cmd("free") == "freed 0"
    slot = next(t.slot for t in read_boards(elastic.edir) if t.pid == a.proc.pid)
    flood = ask_flood(next(elastic.edir.glob("*.board")), slot, 30.0, 2048)
    try:
        assert a.cmd("busy 1") == "busy"
        wait_for(lambda: per_process(state)[a.proc.pid] == (64 + 1280, 0), "A's request back in HBM", timeout=25)
        rounds, errors = map(int, a.cmd("stop").split()[1:])
        assert rounds > 0 and errors == 0
    finally:
        flood.kill()
        flood.wait(timeout=30)
    assert a.cmd("check") == f"check ok {1280 * MiB}"


def test_forged_figures_are_capped_by_what_the_nodes_limits_allow() -> None:
    """25.7: per-GPU sums of what slots claim are at most what the node's limits allow on that GPU."""
    def t(slot: int, resident: int) -> Tenant:
        return Tenant(gpu="GPU-a", slot=slot, pid=1, state="idle", request_bytes=0, limit_bytes=0,
                      resident_bytes=resident, swapped_bytes=resident, idle_ms=0, swap_outs=0, swap_ins=0,
                      swap_out_seconds=0.0, swap_in_seconds=0.0)
    forged = [t(i, 1 << 40) for i in range(60)]
    fig = per_gpu(forged, {"GPU-a": 4096 * MiB})["GPU-a"]
    assert fig["resident"] == 4096 and fig["swapped"] == 4096


def test_metrics_read_only_the_boards_of_this_nodes_gpus(tmp_path: Path) -> None:
    """25.7: 70 extra `*.board` directories (and a FIFO) are not read; the real board is."""
    from memslice.elastic import scan_boards

    d = tmp_path / "e"
    d.mkdir()
    (d / "GPU-real.board").mkdir()
    for i in range(70):
        (d / f"GPU-fake{i:02}.board").mkdir()
        (d / f"GPU-fake{i:02}.board" / "00.slot").write_bytes(forged_idle(1 << 40))
    os.mkfifo(d / "GPU-fifo.board")
    scan = scan_boards(d, ["GPU-real"])
    assert scan.errors == [] and scan.tenants == []


def contained(edir: Path, uuid: str, slot: int, code: str, *args: str) -> subprocess.Popen[str]:
    """Run `code` as a tenant of slot `slot` would: in a mount namespace with the elastic mounts the agent's
    Allocate response gives that container (the directory read-only, its own slot file read-write), as root
    there (a user namespace: all containers may run as root)."""
    from memslice.elastic import CONTAINER_ELASTIC_DIR
    from memslice.plugin.deviceplugin.allocator import Target
    from memslice.plugin.deviceplugin.server import container_response
    from memslice.plugin.gpu.nvml import GpuInfo
    from memslice.plugin.response import ResponseConfig

    if subprocess.run(["unshare", "-Urm", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs user and mount namespaces (unshare -Urm)")
    gpu = GpuInfo(index=0, uuid=uuid, model="m", mem_mib=2048, numa=None, mig=False)
    resp = container_response(Target(gpu=gpu, device_ids=("g0-1",), mib=64), edir / "r",
                              ResponseConfig(shim_host_dir=edir, elastic_host_dir=edir), 512, slot)
    script = []
    for m in resp.mounts:  # the container paths mapped back onto the host paths, in the response's order
        if m.container_path.startswith(CONTAINER_ELASTIC_DIR):
            mode = "ro" if m.read_only else "rw"
            script.append(f"mount --bind {m.host_path} {m.host_path} && "
                          f"mount -o remount,{mode},bind {m.host_path}")
    script.append('exec "$@"')
    return subprocess.Popen(["unshare", "-Urm", "sh", "-c", " && ".join(script), "sh", sys.executable, "-c", code,
                             *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


FORGER = f"""
import errno, fcntl, os, select, struct, sys
board, mine, roster = sys.argv[1], int(sys.argv[2]), sys.argv[3]
denied = 0
for i in range({SLOTS}):  # every neighbour's file, the roster, a new file: none can be written
    if i != mine:
        try:
            os.close(os.open(os.path.join(board, "%02d.slot" % i), os.O_WRONLY))
        except OSError as exc:
            denied += exc.errno == errno.EROFS
for path in (roster, os.path.join(board, "99.slot")):
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT))
    except OSError as exc:
        denied += exc.errno == errno.EROFS
fd = os.open(os.path.join(board, "%02d.slot" % mine), os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {LIVE_OFF}, 0)
big = 1 << 62  # answered, acknowledged and refused every ask, ever; idle a day holding a terabyte
slot = struct.pack("<IIiI10QiIQIIII", 0x4C45534D, 2, 1, 5, 0, 1 << 40, 1 << 40, 0, 86_400_000, big,
                   0, 0, 0, 0, 0, 0, big, 0, 0, 0, 0)
note = struct.pack("<QQIIQQIIII8x", big, 1, 2, 32, 64 << 30, 64 << 30, 0, 1, 0, 0)
answer = struct.pack("<QQII8x", 1, big, 0, 0)
print(denied, flush=True)
while not select.select([sys.stdin], [], [], 0.005)[0]:
    os.pwrite(fd, slot + note + answer, 0)
"""


def test_a_forged_host_note_cannot_fail_a_neighbours_burst(elastic, tmp_path) -> None:
    """35.3: a tenant with the agent's mounts for its slot (the board read-only, its own slot file read-write)
    cannot write any neighbour's slot file (nor the roster, nor a new file): its forged answers and host notes
    go only into its own file. There it claims to be idle with a terabyte, to have answered every ask and to
    have refused every one for host memory. B's burst asks it first, is refused, asks idle A for the rest, and
    gets every byte in HBM: no OOM below its limit, no slot blamed (before, the forger wrote a version 4 host
    note and done_seq into A's slot of the shared board, and B's burst failed blaming A)."""
    a = elastic("a", "1536MiB", "128MiB", gpus="2GiB", ctx="64MiB", MEMSLICE_ELASTIC_SLOT="0")
    assert a.cmd("alloc 1280 64") == "allocated 20"
    board = next(elastic.edir.glob("*.board"))
    uuid = board.name.removesuffix(".board")
    roster = elastic.edir / f"{uuid}.roster"
    roster.write_bytes(render_roster([RosterEntry(0, 128, 1536), RosterEntry(1, 256, 1024), RosterEntry(2, 64, 512)]))
    for i in range(1, SLOTS):  # what the agent prepares
        (board / f"{i:02d}.slot").write_bytes(bytes(FILE_SIZE))
    wait_for(lambda: next(t.state for t in read_boards(elastic.edir) if t.pid == a.proc.pid) == "idle", "A idle")
    m = contained(elastic.edir, uuid, 2, FORGER, str(board), "2", str(roster))
    try:
        assert m.stdout is not None
        assert m.stdout.readline().strip() == str(SLOTS - 1 + 2), "a neighbour's file (or the roster) was writable"
        forged = wait_for(lambda: next((t for t in read_boards(elastic.edir) if t.slot == 2), None), "its slot")
        assert isinstance(forged, Tenant)
        assert (forged.resident_bytes, forged.limit_bytes) == (512 * MiB, 512 * MiB), "claims bounded by the roster"
        b = elastic("b", "1GiB", "256MiB", gpus="2GiB", ctx="64MiB", MEMSLICE_ELASTIC_SLOT="1",
                    stderr=(tmp_path / "b.err").open("w"))
        assert b.cmd("alloc 768 64") == "allocated 12"
        state = elastic.node().state
        assert per_process(state)[b.proc.pid] == (64 + 768, 0), "B's burst all in HBM"
        dev, host = per_process(state)[a.proc.pid]
        assert 128 <= host <= 192 and dev >= 64 + 128, "idle A moved what B lacked"
        assert b.cmd("check") == f"check ok {768 * MiB}" and a.cmd("check") == f"check ok {1280 * MiB}"
        b.close()
    finally:
        assert m.stdin is not None
        m.stdin.close()
        m.wait(timeout=30)
    assert "failed (CUDA_ERROR_OUT_OF_MEMORY)" not in (tmp_path / "b.err").read_text()


def test_asks_claiming_a_need_of_16_tib_keep_no_burst_in_host_memory(elastic) -> None:
    """35.4: a neighbour assigned a slot (limit 1 GiB) asks an active tenant every 5 ms for 16 TiB, burst flag
    set. A's burst (partly in host memory while a plain tenant filled the GPU) comes back to HBM once that
    tenant frees, and stays there while the asks go on: the asked slot bounds a need by the asker's limit and
    request in the roster and by the GPU, and the driver has that much free (before, A moved its whole burst
    to host memory). A third of the bytes of the 6 GiB scenario it was: a 2 GiB GPU still has more free (1,472
    MiB) than the asker's limit once the plain tenant frees, which is what bounds the need."""
    p = elastic("p", "2GiB", None, gpus="2GiB", ctx="64MiB")
    assert p.cmd("alloc 1536 64") == "allocated 24"
    a = elastic("a", "640MiB", "128MiB", gpus="2GiB", ctx="64MiB", idle="600", MEMSLICE_ELASTIC_SLOT="0")
    assert a.cmd("alloc 512 64") == "allocated 8"
    state = elastic.node().state
    assert per_process(state)[a.proc.pid][1] >= 128, "part of A's burst in host memory"
    board = next(elastic.edir.glob("*.board"))
    put_roster(elastic.edir, board.name.removesuffix(".board"), [RosterEntry(0, 128, 640), RosterEntry(2, 256, 1024)])
    flood = ask_flood(board, 0, 30.0, 16 << 20, mine=2)
    try:
        assert p.cmd("free") == "freed 0"
        wait_for(lambda: per_process(state)[a.proc.pid] == (64 + 512, 0), "A's burst back in HBM", timeout=20)
        samples = []
        for _ in range(40):
            samples.append(per_process(state)[a.proc.pid])
            time.sleep(0.05)
        assert set(samples) == {(64 + 512, 0)}, "the asks moved some of A's burst out again"
        assert flood.poll() is None, "the asks went on throughout"
    finally:
        flood.kill()
        flood.wait(timeout=30)
    assert a.cmd("check") == f"check ok {512 * MiB}"


def test_a_slot_given_to_another_pod_is_bounded_by_its_new_roster_entry_from_its_first_ask(elastic) -> None:
    """35.4 when the agent gives a slot to another pod: slot 2 was a higher priority pod's with a limit of the
    whole GPU (its asks could take A's burst while HBM lacked its need); the agent rewrites the roster for the
    pod now in that slot (priority 0, request 256 MiB, limit 1 GiB), which at once asks A every 5 ms for 16 TiB.
    Every ask is bounded by the new entry: HBM has 1,472 MiB free, more than the new pod may need, so A moves
    nothing (before, A's mover kept the roster it had read for up to a second and moved its whole burst)."""
    a = elastic("a", "640MiB", "128MiB", gpus="2GiB", ctx="64MiB", idle="600", MEMSLICE_ELASTIC_SLOT="0")
    state = elastic.node().state
    snap = read_region_file(state + ".usage")
    assert snap is not None
    uuid = snap.devices[0].uuid
    put_roster(elastic.edir, uuid, [RosterEntry(0, 128, 640), RosterEntry(2, 2048, 2048, priority=1000)])
    board = elastic.edir / f"{uuid}.board"
    new = render_roster([RosterEntry(0, 128, 640), RosterEntry(2, 256, 1024)])
    flood = ask_flood(board, 0, 1.5, 16 << 20, mine=2, roster=new)
    try:
        assert a.cmd("alloc 512 64") == "allocated 8"  # A's mover starts: it reads the roster of the old pod
        assert per_process(state)[a.proc.pid] == (64 + 512, 0)
        assert flood.stdin is not None
        flood.stdin.write("go\n")
        flood.stdin.flush()
        samples = []
        while flood.poll() is None:
            samples.append(per_process(state)[a.proc.pid])
            time.sleep(0.05)
        assert len(samples) > 5 and set(samples) == {(64 + 512, 0)}, "the new pod's asks moved A's burst"
    finally:
        flood.kill()
        flood.wait(timeout=30)
    assert a.cmd("check") == f"check ok {512 * MiB}"

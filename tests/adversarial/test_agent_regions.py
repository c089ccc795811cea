"""A tenant owns its region file: whatever it does to it, the node agent and `memslice top` keep serving
everyone else (issue 11, items 5 and 8).

Real pieces only: `memslice node-agent --simulate` as a process, the kubelet stand-in admitting two pods over
real gRPC, each container's processes started from the Allocate response with the real shim preloaded on
the simulated driver, /metrics scraped over HTTP, `memslice top` run as a process. Container A is the
attacker (its region file is truncated, replaced by a FIFO or a symlink, filled with garbage, leased, made
read-only); container B is the bystander whose figures must stay right throughout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubelet_standin import KubeletStandin
from test_plugin_agent import RESOURCE, AgentProcess
from test_plugin_agent import short_tmp as short_tmp  # noqa: F401 (fixture)

from memslice.interposer.region import REGION_FILE, layout
from memslice.proto import api_pb2

MiB = 1 << 20
REGION_MOUNT = "/run/memslice/region"


@dataclass
class Container:
    """One admitted container: its environment (container paths mapped to host paths) and region."""

    name: str
    env: dict[str, str]
    region_dir: Path

    @property
    def region_id(self) -> str:
        return self.region_dir.name

    @property
    def region_file(self) -> Path:
        return self.region_dir / REGION_FILE

    def hold(self, mib: int) -> subprocess.Popen[str]:
        """A process of this container that allocates `mib` MiB through the shim and holds it."""
        p = subprocess.Popen([sys.executable, "-m", "memslice.tenant", str(mib)], env=self.env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None
        events = [json.loads(p.stdout.readline()) for _ in range(2)]
        assert events[0] == {"event": "alloc", "mib": mib, "result": 0}, events
        assert events[1]["event"] == "ready", events
        return p


def container_of(resp: api_pb2.ContainerAllocateResponse, name: str) -> Container:
    """The environment the runtime would give the container, with each mount's container path replaced by its
    host path (the stand-in for a mount namespace, as in test_plugin_quota)."""
    host = {m.container_path: m.host_path for m in resp.mounts}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    env.update({k: next((h + v[len(c):] for c, h in host.items() if v == c or v.startswith(c + "/")), v)
                for k, v in resp.envs.items()})  # a path under a mount too (MEMSLICE_SIM_USAGE)
    env["MEMSLICE_CONTEXT_RESERVE"] = "0"
    return Container(name, env, Path(host[REGION_MOUNT]))


@dataclass
class Node:
    agent: AgentProcess
    a: Container  # the attacker
    b: Container  # the bystander
    b_holder: subprocess.Popen[str]
    b_used: float = 0.0  # MiB B's live process holds, as first scraped

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return self.agent.metrics()

    def region_value(self, m: dict, name: str, c: Container) -> list[float]:
        return [v for (n, lv), v in m.items() if n == name and dict(lv).get("region") == c.region_id]

    def check_bystander(self, m: dict) -> None:
        """B's figures are present and right: what its live process holds (300 MiB and any context reserve),
        no region error."""
        assert self.region_value(m, "memslice_container_used_mib", self.b) == [self.b_used]
        assert self.region_value(m, "memslice_container_quota_mib", self.b) == [1024.0]
        assert self.region_value(m, "memslice_container_region_error", self.b) == [0.0]

    def threads(self) -> int:
        assert self.agent.proc is not None
        status = Path(f"/proc/{self.agent.proc.pid}/status").read_text()
        return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def stop(p: subprocess.Popen[str]) -> None:
    """End a holder the normal way (stdin closed: it frees its memory and exits), killing it only if stuck."""
    try:
        p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate(timeout=30)


@pytest.fixture
def two(short_tmp: Path) -> Iterator[Node]:  # noqa: F811 (fixture argument)
    """An agent with two admitted containers; A's region file exists (a process used the GPU and left), B has
    a live process holding 300 MiB."""
    kubelet = KubeletStandin(short_tmp / "dp", short_tmp / "pr" / "kubelet.sock").start()
    agent = AgentProcess(short_tmp, sim_gpus="16GiB", unit_mib=4, args=("--preload", "env")).start()
    procs: list[subprocess.Popen[str]] = []
    try:
        kubelet.wait_registered(RESOURCE)
        a = container_of(kubelet.admit("uid-a", "ns", "a", [("c", 256)], RESOURCE)["c"], "a")
        b = container_of(kubelet.admit("uid-b", "ns", "b", [("c", 256)], RESOURCE)["c"], "b")
        stop(a.hold(100))  # leaves a valid region file behind
        procs.append(b.hold(300))
        node = Node(agent, a, b, procs[0])
        (node.b_used,) = node.region_value(node.scrape(), "memslice_container_used_mib", b)
        assert 300 <= node.b_used < 1024
        yield node
    finally:
        for p in procs:
            stop(p)
        agent.stop()
        kubelet.stop()


def assert_refused(node: Node, m: dict, log_words: str) -> None:
    """A's region is reported broken (error 1, no usage figures), and the agent log names it and why."""
    assert node.region_value(m, "memslice_container_used_mib", node.a) == []
    assert node.region_value(m, "memslice_container_region_error", node.a) == [1.0]
    assert node.region_value(m, "memslice_container_quota_mib", node.a) == [1024.0]
    node.agent.wait_log(re.compile(rf"region {node.a.region_id} cannot be read.*(?:{log_words})"))
    node.check_bystander(m)


# --- truncate, FIFO, symlink, lease ------------------------------------------------------------------------

def test_truncating_the_region_while_metrics_are_scraped_never_kills_the_agent(two: Node):
    original = two.a.region_file.read_bytes()
    done = threading.Event()

    def churn() -> None:
        """The tenant keeps a complete region at the path (renamed into place) and shrinks each one it
        replaces: a reader always opens a full-size file that is truncated while it reads."""
        nxt, prev = two.a.region_dir / ".next", None
        while not done.is_set():
            fd = os.open(nxt, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
            os.pwrite(fd, original, 0)
            os.rename(nxt, two.a.region_file)
            if prev is not None:
                os.ftruncate(prev, 4096)
                os.close(prev)
            prev = fd
        if prev is not None:
            os.close(prev)

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    try:
        scrapes = [two.scrape() for _ in range(60)]  # raises once the agent died (SIGBUS) or did not answer
    finally:
        done.set()
        t.join(timeout=10)
    assert two.agent.proc is not None and two.agent.proc.poll() is None
    for m in scrapes:
        two.check_bystander(m)
        assert len(two.region_value(m, "memslice_container_region_error", two.a)) == 1
    os.truncate(two.a.region_file, 4096)
    assert_refused(two, two.scrape(), "shorter than a region")


def test_a_fifo_in_place_of_the_region_neither_hangs_the_scrape_nor_leaks_threads(two: Node):
    two.a.region_file.unlink()
    os.mkfifo(two.a.region_file, 0o666)
    before = two.threads()
    for _ in range(20):
        m = two.scrape()  # urllib's 10 s timeout: a scrape blocked on the FIFO fails here
        assert_refused(two, m, "is a FIFO")
    assert two.threads() <= before + 2  # one HTTP thread may still be finishing; none is stuck


@pytest.mark.parametrize("target", ["bystander", "/dev/zero", "/etc/hostname"])
def test_a_symlink_in_place_of_the_region_is_not_followed(two: Node, target: str):
    two.a.region_file.unlink()
    two.a.region_file.symlink_to(two.b.region_file if target == "bystander" else target)
    assert_refused(two, two.scrape(), "symbolic link")  # A never shows B's (or any host file's) figures


def test_a_lease_on_the_region_does_not_block_the_scrape(two: Node):
    """A write lease makes every other open() of the file wait up to lease-break-time (45 s) unless it is
    non-blocking: the tenant replaces its file by one it owns and leases it."""
    data = two.a.region_file.read_bytes()
    two.a.region_file.unlink()
    two.a.region_file.write_bytes(data)
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)  # keep the lease when the kernel asks to break it
fd = os.open({str(two.a.region_file)!r}, os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("leased", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "leased\n"
        for _ in range(3):
            assert_refused(two, two.scrape(), "cannot be opened")
    finally:
        stop(holder)


# --- garbage and resizing ----------------------------------------------------------------------------------

def _field(name: str) -> int:
    """Offset of `hdr.x`, `dev` or `slot` in the region (cffi's offsetof takes one level at a time)."""
    parts = name.split(".")
    return layout().ffi.offsetof("struct ms_region", *parts)


def _poke(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _u32(v: int) -> bytes:
    return v.to_bytes(4, sys.byteorder)


GARBAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "random bytes": (lambda p: _poke(p, 0, os.urandom(p.stat().st_size)), "bad magic|layout version|header field"),
    "device count": (lambda p: _poke(p, _field("hdr.ndevices"), _u32(1000)), "1000 devices, over the maximum"),
    "slot count": (lambda p: _poke(p, _field("hdr.slot_hwm"), _u32(1 << 31)), "high-water mark"),
    "version": (lambda p: _poke(p, _field("hdr.version"), _u32(99)), "layout version 99"),
    "record size": (lambda p: _poke(p, _field("hdr.slot_size"), _u32(8)), "slot_size is 8"),
    "uuid not terminated": (lambda p: _poke(p, _field("dev"), b"G" * 48), "device 0 has no valid UUID"),
    "uuid twice": (lambda p: (_poke(p, _field("hdr.ndevices"), _u32(2)),
                              _poke(p, _field("dev") + layout().device_size, p.read_bytes()[_field("dev"):][:48])),
                   "UUID is listed twice"),
    "grown to 1 TiB": (lambda p: os.truncate(p, 1 << 40), "header announces"),
    "empty directory": (lambda p: (p.unlink(), p.mkdir()), "is a directory"),
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_in_the_region_is_one_named_error_and_others_are_unaffected(two: Node, kind: str):
    damage, words = GARBAGE[kind]
    damage(two.a.region_file)
    assert_refused(two, two.scrape(), words)
    # and `memslice top` says the same, showing the healthy region beside it
    out = subprocess.run([sys.executable, "-m", "memslice", "top", "--json", str(two.a.region_dir),
                          str(two.b.region_dir)], capture_output=True, text=True, timeout=30)
    doc = json.loads(out.stdout)
    assert out.returncode == 1
    assert [e["region"] for e in doc["errors"]] == [str(two.a.region_dir)]
    assert re.search(words, doc["errors"][0]["error"])
    (b,) = doc["regions"]
    assert b["devices"][0]["device_bytes"] == two.b_used * MiB


def test_top_shows_a_fifo_region_as_an_error_beside_the_others(two: Node):
    two.a.region_file.unlink()
    os.mkfifo(two.a.region_file, 0o666)
    out = subprocess.run([sys.executable, "-m", "memslice", "top", "--once", str(two.a.region_dir),
                          str(two.b.region_dir)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert f"region {two.a.region_dir}: cannot be read: {two.a.region_file} is a FIFO" in out.stdout
    assert f"region {two.b.region_file}" in out.stdout and "running" in out.stdout


def test_a_tenant_chosen_command_name_cannot_write_terminal_escapes(two: Node):
    """`memslice top` prints each process's command name, which the tenant writes: control bytes are shown as
    '?' so that an operator's terminal cannot be driven from inside a container."""
    holder = two.a.hold(10)
    try:
        comm = _field("slot") + layout().ffi.offsetof("struct ms_slot", "comm")
        _poke(two.a.region_file, comm, b"\x1b]0;x\x07\x1b[2J\0")
        out = subprocess.run([sys.executable, "-m", "memslice", "top", "--once", str(two.a.region_dir)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
        assert "?]0;x??[2J" in out.stdout
    finally:
        stop(holder)


# --- stale charges (item 8) and a read-only region --------------------------------------------------------

def test_a_killed_process_stops_counting_at_the_next_scrape_and_in_top(two: Node):
    """Used is what live processes hold: a SIGKILLed process's charge leaves the figures at once, without
    waiting for another allocation to reclaim it. The file is made read-only first: the agent only reads."""
    holder = two.a.hold(500)
    m = two.scrape()
    (used,) = two.region_value(m, "memslice_container_used_mib", two.a)
    assert used >= 500
    os.chmod(two.a.region_file, 0o444)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    before = two.a.region_file.read_bytes()
    m = two.scrape()
    assert two.region_value(m, "memslice_container_used_mib", two.a) == [0.0]
    assert two.region_value(m, "memslice_container_peak_mib", two.a) == [used]
    two.check_bystander(m)
    doc = json.loads(subprocess.run([sys.executable, "-m", "memslice", "top", "--json", str(two.a.region_dir)],
                                    capture_output=True, text=True, timeout=30, check=True).stdout)
    (region,) = doc["regions"]
    assert region["devices"][0]["device_bytes"] == 0
    assert region["devices"][0]["charged_bytes"] == used * MiB  # not reclaimed yet: no allocation since
    (dead,) = region["processes"]
    assert dead["pid"] == holder.pid and dead["alive"] is False
    assert two.a.region_file.read_bytes() == before  # reading reclaimed nothing, wrote nothing


def test_liveness_query_needs_no_write_access(tmp_path: Path):
    """F_GETLK with a write-lock query answers on a descriptor opened read-only (what the reader relies on),
    with the holder's PID."""
    f = tmp_path / "f"
    f.write_bytes(b"\0" * 16)
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys
fd = os.open({str(f)!r}, os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {layout().lock_base + 7}, 0)
print("locked", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        from memslice.interposer.region import _owner

        fd = os.open(f, os.O_RDONLY)
        try:  # held, and by whom: the kernel names the holder (what attributes elastic figures to containers)
            assert _owner(fd, layout().lock_base + 7) == (True, holder.pid)
            assert _owner(fd, layout().lock_base + 8) == (False, 0)
        finally:
            os.close(fd)
    finally:
        stop(holder)


def test_sim_status_reports_a_damaged_state_file_instead_of_hanging(tmp_path: Path):
    """The simulated node's usage ledger has the region layout and a container writes its own:
    `memslice sim status` reads it with the same reader and says what is wrong."""
    state = tmp_path / "node.state"
    usage = tmp_path / "node.state.usage"  # memslice.simulator.usage_path: <state>.usage by default
    os.mkfifo(usage)
    env = {k: v for k, v in os.environ.items() if k != "MEMSLICE_SIM_USAGE"}
    out = subprocess.run([sys.executable, "-m", "memslice", "sim", "status", "--state", str(state)],
                         capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 1 and f"{usage} is a FIFO, not a region file" in out.stderr, out.stderr

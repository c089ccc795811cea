"""`memslice demo --elastic`: the issue's notebook example on one simulated 4 GiB GPU. Notebook A (limit
2.5 GiB, request 512 MiB) fills 2 GiB and goes idle; notebook B (limit 2 GiB, request 512 MiB) then gets
1792 MiB in GPU memory while A's bytes wait in host memory; A runs again and finds every byte, and its
memory comes back to the GPU as far as B leaves room.

`python -m memslice.demo_elastic tenant` is the notebook: commands on stdin (`alloc MiB`, `check`), one JSON
line per answer, through the CUDA driver API (ctypes over libcuda.so.1, so through the preloaded shim).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BLOCK_MIB = 256
MiB = 1 << 20


def _pattern(block: int) -> bytes:
    """1 MiB that differs per block, written at the start and the end of each block."""
    return bytes((block * 7 + i) & 0xFF for i in range(256)) * 4096


def tenant() -> int:
    """The notebook process: allocate, write, read back, on request."""
    cuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_ulonglong
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ptr), ctypes.c_size_t]
    cuda.cuMemcpyHtoD_v2.argtypes = [ptr, ctypes.c_char_p, ctypes.c_size_t]
    cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ptr, ctypes.c_size_t]
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), 0) or cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev):
        print(json.dumps({"error": "no CUDA context"}), flush=True)
        return 1
    blocks: list[int] = []
    for line in sys.stdin:
        cmd = line.split()
        if cmd[:1] == ["alloc"]:
            rc = 0
            for _ in range(int(cmd[1]) // BLOCK_MIB):
                p = ptr()
                rc = cuda.cuMemAlloc_v2(ctypes.byref(p), BLOCK_MIB * MiB)
                if rc:
                    break
                pat = _pattern(len(blocks))
                cuda.cuMemcpyHtoD_v2(p, pat, MiB)
                cuda.cuMemcpyHtoD_v2(ptr(p.value + (BLOCK_MIB - 1) * MiB), pat, MiB)
                blocks.append(p.value)
            print(json.dumps({"allocated_mib": len(blocks) * BLOCK_MIB, "result": rc}), flush=True)
        elif cmd[:1] == ["free"]:
            rcs = [cuda.cuMemFree_v2(ptr(b)) for b in blocks]
            blocks.clear()
            print(json.dumps({"freed": len(rcs), "result": max(rcs, default=0)}), flush=True)
        elif cmd[:1] == ["check"]:
            buf = ctypes.create_string_buffer(MiB)
            bad = 0
            for i, addr in enumerate(blocks):
                for off in (0, (BLOCK_MIB - 1) * MiB):
                    cuda.cuMemcpyDtoH_v2(buf, ptr(addr + off), MiB)
                    bad += buf.raw != _pattern(i)
            print(json.dumps({"checked_blocks": len(blocks), "bad": bad,
                              "pointers": [hex(b) for b in blocks[:2]]}), flush=True)
    return 0


def _table(edir: str, names: dict[int, str]) -> str:
    from .elastic import read_boards
    from .sizes import format_bytes

    rows = []
    for t in sorted(read_boards(edir), key=lambda t: names.get(t.pid, "")):
        state = "swapped-out" if t.swapped_bytes and not t.resident_bytes else t.state
        rows.append(f"    {names.get(t.pid, str(t.pid)):<11} {state:<11} in GPU {format_bytes(t.resident_bytes):>9}"
                    f"   in host memory {format_bytes(t.swapped_bytes):>9}   idle {t.idle_ms / 1000:5.1f} s")
    return "\n".join(rows)


@contextmanager
def _progress(what: str) -> Iterator[None]:
    """Say what the demo waits for, a dot per second while it waits, and how long it took."""
    print(f"    waiting for {what} ", end="", flush=True)
    start, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(1.0):
            print(".", end="", flush=True)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        print(f" {time.monotonic() - start:.1f} s", flush=True)


def _wait(cond: Any, what: str, timeout: float = 120) -> bool:
    with _progress(what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.05)
    return False


def _allocated(answer: dict[str, Any]) -> str:
    """A tenant's answer to `alloc`, in words."""
    if "error" in answer:
        return f"    -> the notebook failed: {answer['error']}"
    verdict = "all of it" if answer["result"] == 0 else f"then CUDA error {answer['result']}"
    return f"    -> it holds {answer['allocated_mib']} MiB ({verdict})"


def _checked(answer: dict[str, Any]) -> str:
    """A tenant's answer to `check`, in words."""
    if "error" in answer:
        return f"    -> the notebook failed: {answer['error']}"
    return (f"    -> read back its {answer['checked_blocks']} blocks of {BLOCK_MIB} MiB through the same pointers "
            f"({', '.join(answer['pointers'])}, ...): {answer['bad']} of the {2 * answer['checked_blocks']} MiB "
            "written (first and last MiB of each block) differ")


def main() -> int:
    from memslice.interposer.region import read_region_file

    from .elastic import read_boards
    from .paths import lib_paths
    from .simulator import sim_env, usage_path

    work = tempfile.mkdtemp(prefix="memslice-demo-elastic-")
    state, edir = os.path.join(work, "gpu.state"), os.path.join(work, "elastic")
    os.makedirs(edir)
    print("memslice demo --elastic: one simulated 4 GiB GPU, two notebooks "
          "(each CUDA context takes 300 MiB here; a real one ~520 MiB on an H100)\n")

    def start(name: str, limit: str, request: str) -> subprocess.Popen[str]:
        region = os.path.join(work, name)
        os.makedirs(region)
        env = sim_env("4GiB", state=state)
        env.update(MEMSLICE_GPU_MEM_LIMIT=limit, MEMSLICE_GPU_MEM_REQUEST=request, MEMSLICE_REGION_DIR=region,
                   MEMSLICE_ELASTIC_DIR=edir, MEMSLICE_IDLE_AFTER="1", MEMSLICE_CONTEXT_RESERVE="0",
                   MEMSLICE_YIELD_WAIT="30", LD_PRELOAD=lib_paths().shim,
                   MEMSLICE_SIM_CONTEXT_OVERHEAD="300MiB")  # the story's context size (a real one: ~520 MiB)
        return subprocess.Popen([sys.executable, "-m", "memslice.demo_elastic", "tenant"], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(p: subprocess.Popen[str], line: str) -> dict[str, Any]:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(line + "\n")
        p.stdin.flush()
        answer: dict[str, Any] = json.loads(p.stdout.readline() or '{"error": "tenant ended"}')
        return answer

    a = start("notebook-a", "2560MiB", "512MiB")
    b = None
    try:
        names = {a.pid: "notebook-a"}
        print("notebook-a (request 512 MiB, limit 2.5 GiB) allocates 2 GiB: above its request it uses free GPU memory")
        print(_allocated(ask(a, "alloc 2048")))
        print(_table(edir, names))
        print("\nnotebook-a makes no CUDA call for 1 s (MEMSLICE_IDLE_AFTER=1; 300 s by default): it is idle")
        _wait(lambda: any(t.state == "idle" for t in read_boards(edir)), "notebook-a to be idle")
        print(_table(edir, names))
        b = start("notebook-b", "2GiB", "512MiB")
        names[b.pid] = "notebook-b"
        print("\nnotebook-b (request 512 MiB, limit 2 GiB) allocates 1792 MiB; 300 + 2048 + 300 + 1792 MiB would "
              "not fit in 4 GiB,\nso what is missing (344 MiB) of the idle notebook-a's memory above its request "
              "moves to host memory\n(same pointers; its 512 MiB request stays in GPU memory) and notebook-b gets "
              "GPU memory")
        with _progress("notebook-b's allocation while what it lacks of notebook-a's memory moves to host memory"):
            answer = ask(b, "alloc 1792")
        print(_allocated(answer))
        _wait(lambda: any(t.swapped_bytes for t in read_boards(edir)), "the board to show notebook-a's move")
        print(_table(edir, names))
        tb = next((t for t in read_boards(edir) if t.pid == b.pid), None)
        if tb is not None:
            print(f"    notebook-b asked for {tb.asked_mib} MiB in {tb.asks} ask(s); its neighbour moved "
                  f"{tb.got_mib} MiB")
        print("\nnotebook-a runs again and reads its data back through the same pointers (at once; the part "
              "in host memory\nfrom there)")
        print(_checked(ask(a, "check")))
        print("\nnotebook-b frees its memory; notebook-a gets its memory back in the GPU")
        freed = ask(b, "free")
        print(f"    -> notebook-b freed {freed['freed']} block(s)")
        print(_checked(ask(a, "check")))
        _wait(lambda: any(t.pid == a.pid and not t.swapped_bytes for t in read_boards(edir)),
              "notebook-a's memory back in GPU memory", 60)
        # the table and the GPU's figure from the same moment: read both until neither changes
        def moment() -> tuple[Any, ...]:
            phys = read_region_file(usage_path(state))
            return (sorted((t.pid, t.state, t.resident_bytes, t.swapped_bytes) for t in read_boards(edir)),
                    phys.devices[0].used_bytes if phys else None)

        last = moment()
        for _ in range(50):
            time.sleep(0.1)
            now = moment()
            if now == last:
                break
            last = now
        print(_table(edir, names))
        phys = read_region_file(usage_path(state))
        if phys:
            d = phys.devices[0]
            resident = sum(t.resident_bytes for t in read_boards(edir)) >> 20
            other = (d.used_bytes >> 20) - resident - 2 * 300
            print(f"\nthe simulated GPU: {d.used_bytes >> 20} MiB in use now = {resident} MiB of the notebooks' "
                  "memory (the table's \"in GPU\") + 2 CUDA contexts of 300 MiB"
                  + (f" + {other} MiB not (yet) in the table's figures" if other else "")
                  + f"; at most {d.peak_bytes >> 20} MiB ever, of {d.physical_bytes >> 20} MiB: the notebooks' "
                  "limits (2.5 + 2 GiB) add up to more than the GPU, and it never overflowed")
    finally:
        for p in (a, b):
            if p is not None and p.stdin is not None:
                p.stdin.close()
                p.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    print("""
What you just saw: requests and limits for GPU memory. Each notebook is guaranteed its request in GPU
memory and may hold up to its limit; of an idle notebook's memory above its request, only what its
neighbour needed went to host memory, and it came back when the GPU had room, with the same pointers
and the same bytes.""")
    return 0


if __name__ == "__main__":
    sys.exit(tenant() if sys.argv[1:] == ["tenant"] else main())

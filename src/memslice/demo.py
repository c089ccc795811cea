"""`memslice demo`: three tenants share one simulated 16 GiB GPU with quotas of 4, 4 and 6 GiB: one fits, one is
refused past its quota, one spills past it to host memory (oversubscription); `--elastic` continues the story
with requests and limits (demo_elastic.py)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

CONTEXT_MIB = 300  # what the simulated GPU charges for each CUDA context in the demo (a real one: ~520 MiB on an H100)


@dataclass
class Tenant:
    name: str
    quota: str
    allocs_mib: list[int]
    story: str
    oversubscribe: bool = False


TENANTS = [
    Tenant("notebook-a", "4GiB", [1024, 1024, 1024], "allocates 3 GiB in three blocks: fits in its 4 GiB quota"),
    Tenant("notebook-b", "4GiB", [2048, 3072, 1024],
           "allocates 2 GiB, then asks for 3 GiB more: over its 4 GiB quota, so refused"),
    Tenant("training-c", "6GiB", [4096, 2048],
           "oversubscribed (MEMSLICE_OVERSUBSCRIBE=1): allocates 4 GiB, then 2 GiB more than its 6 GiB quota holds "
           "beside its context, which go to host memory instead of failing", oversubscribe=True),
]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="three tenants slicing one simulated 16 GiB GPU",
                       description="Runs three processes on one simulated 16 GiB GPU under quotas of 4, 4 and "
                                   "6 GiB: one fits, one is refused past its quota, one spills past it to host "
                                   "memory; prints what `memslice top` sees and explains each figure.")
    p.add_argument("--elastic", action="store_true",
                   help="instead: two notebooks with GPU memory requests and limits on a simulated 4 GiB GPU; the "
                        "idle one yields its memory to the other and gets it back")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if getattr(args, "elastic", False):
        from .demo_elastic import main as elastic_demo

        return elastic_demo()
    from memslice.interposer.region import read_region, read_region_file

    from .paths import lib_paths
    from .simulator import sim_env, usage_path
    from .top import render

    work = tempfile.mkdtemp(prefix="memslice-demo-")
    state = os.path.join(work, "gpu.state")
    print(f"memslice demo: one simulated 16 GiB GPU, three tenants (each process's CUDA context is charged "
          f"{CONTEXT_MIB} MiB in this demo; a real one is measured, ~520 MiB on an H100)\n")
    procs: list[tuple[Tenant, str, subprocess.Popen[str]]] = []
    for t in TENANTS:
        region = os.path.join(work, t.name)
        os.makedirs(region)
        env = sim_env("16GiB", state=state)
        env.update(MEMSLICE_GPU_MEM_LIMIT=t.quota, MEMSLICE_REGION_DIR=region, LD_PRELOAD=lib_paths().shim,
                   MEMSLICE_SIM_CONTEXT_OVERHEAD=f"{CONTEXT_MIB}MiB")
        if t.oversubscribe:
            env["MEMSLICE_OVERSUBSCRIBE"] = "1"
        cmd = [sys.executable, "-m", "memslice.tenant", *map(str, t.allocs_mib)]
        procs.append((t, region, subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True)))
    ok = True
    for t, _region, p in procs:
        print(f"{t.name} (quota {t.quota}) {t.story}")
        assert p.stdout is not None
        for line in p.stdout:
            ev = json.loads(line)
            if ev["event"] == "alloc":
                verdict = "ok" if ev["result"] == 0 else f"REFUSED (CUDA error {ev['result']}: out of memory)"
                print(f"    cuMemAlloc {ev['mib']:>5} MiB -> {verdict}")
            elif ev["event"] == "ready":
                print(f"    its CUDA sees a {ev['total_mib']} MiB GPU (the quota) with {ev['free_mib']} MiB free "
                      f"(quota - {CONTEXT_MIB} MiB context - what it holds on the GPU)")
                break
            else:
                print(f"    unexpected: {ev}")
                ok = False
                break
    print()
    for t, _region, p in procs:
        if t.name == "notebook-b":
            print("what notebook-b's stderr said when it went over its quota:")
            assert p.stderr is not None
            # the shim writes its line before the refused call returns, so it is there already
            os.set_blocking(p.stderr.fileno(), False)
            print("    " + (p.stderr.read() or "").strip().replace("\n", "\n    "))
    snaps = [s for s in (read_region(r) for _t, r, _p in procs) if s]
    print("\n$ memslice top --once " + " ".join(r for _t, r, _p in procs))
    print(render(snaps))
    print(explain(snaps, [t for t, _r, _p in procs], read_region_file(usage_path(state))))
    for _t, _r, p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)
    print("""
What you just saw: three processes shared one 16 GiB GPU. Each saw its quota as the size of the GPU
(cuMemGetInfo, cuDeviceTotalMem and NVML all report it). notebook-b asked for more than its 4 GiB and got
CUDA_ERROR_OUT_OF_MEMORY with a one-line explanation, while the others kept working and were never
squeezed; training-c, oversubscribed, went past its quota into host memory instead. In a cluster, the node
agent gives every container its quota the same way, and the scheduler extender places pods so the quotas
on each GPU never add up to more than the GPU.
Next: `memslice demo --elastic`, GPU memory requests and limits: an idle notebook's memory moves to host
memory while a neighbour needs the GPU, and comes back.""")
    return 0 if ok else 1


def explain(snaps: list[Any], tenants: list[Tenant], phys: Any) -> str:
    """Each figure of the picture above, from the same snapshots: per tenant what its device bytes are made
    of, and the GPU's physical usage as the sum of the tenants'."""
    lines = ["", "the figures:"]
    total = 0
    for t, snap in zip(tenants, snaps, strict=False):
        dev = sum(d.used_bytes for d in snap.devices) >> 20
        host = sum(d.host_bytes for d in snap.devices) >> 20
        total += dev
        on_gpu = dev - CONTEXT_MIB
        lines.append(f"  {t.name}: {dev} MiB on the GPU = {CONTEXT_MIB} MiB context + {on_gpu} MiB allocated"
                     + (f"; {host} MiB in host memory (spilled past its quota)" if host else ""))
    if phys:
        for d in phys.devices:
            lines.append(f"  the simulated GPU itself: {d.used_bytes >> 20} MiB of {d.physical_bytes >> 20} MiB in "
                         f"use = the sum of the three ({total} MiB); spilled bytes are in host memory, not here")
    return "\n".join(lines)

"""Helpers for the shim's adversarial tests: C programs built against the region code, and waiting for a
child to stop."""

from __future__ import annotations

import os
import pathlib
import subprocess

from memslice.paths import LibPaths

C_DIR = pathlib.Path(__file__).resolve().parent.parent / "c"
REGION_SRC = sorted((pathlib.Path(__file__).resolve().parents[2] / "interposer" / "src").glob("region*.c"))


def build_with_region(libs: LibPaths, name: str, out: pathlib.Path) -> str:
    """Compile tests/c/<name>.c together with the region code (interposer/src/region*.c)."""
    exe = out / name
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{libs.include}", str(C_DIR / f"{name}.c"),
                    *map(str, REGION_SRC), "-o", str(exe), "-lpthread"], check=True)
    return str(exe)


def wait_stopped(pid: int) -> None:
    """Wait until child `pid` has stopped (it prints its line and stops itself right after)."""
    _, status = os.waitpid(pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"process {pid} ended instead of stopping ({status:#x})"

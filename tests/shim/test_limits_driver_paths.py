"""The driver library keys of the limits file (issue 35 item 2): nvml_path and cuda_path, written by the node
agent and `memslice run`, read by the shim (interposer/src/config.c, which also checks the file exists)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memslice.limits import Limits, lib_path_problem, mapped_library, render

MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06
7f0000002000-7f0000003000 r-xp 00000000 08:01 1235 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f0000004000-7f0000005000 r-xp 00000000 08:01 1236 /opt/lib/libcudart.so.12
7f0000006000-7f0000007000 rw-p 00000000 00:00 0 [heap]
"""


def test_the_mapped_driver_libraries_are_found_by_soname() -> None:
    assert mapped_library(MAPS, "libnvidia-ml.so.1") == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06"
    assert mapped_library(MAPS, "libcuda.so.1") == "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"
    assert mapped_library("7f0-7f1 r-xp 0 0:0 1 /sim/lib/libcuda.so.1\n", "libcuda.so.1") == "/sim/lib/libcuda.so.1"
    assert mapped_library("7f0-7f1 r-xp 0 0:0 1 /x/libcudart.so.12\n", "libcuda.so.1") is None  # not the driver
    assert mapped_library("", "libcuda.so.1") is None


@pytest.mark.parametrize(("path", "why"), [("libcuda.so.1", "not an absolute path"), ("/a/../b.so", ".. component"),
                                           ("/" + "a" * 255, "at most 255"), ("/a\nb", "line break")])
def test_a_bad_library_path_is_refused_by_name(path: str, why: str) -> None:
    problem = lib_path_problem("cuda_path", path)
    assert problem is not None and why in problem and "cuda_path" in problem
    with pytest.raises(ValueError, match="cuda_path"):
        render(Limits(gpu_mem_bytes=1 << 30, cuda_path=path))


def test_the_keys_are_rendered_on_their_own_lines() -> None:
    text = render(Limits(gpu_mem_bytes=1 << 30, nvml_path="/d/libnvidia-ml.so.1", cuda_path="/d/libcuda.so.1"))
    assert {"nvml_path=/d/libnvidia-ml.so.1", "cuda_path=/d/libcuda.so.1"} <= set(text.splitlines())
    assert "nvml_path" not in render(Limits(gpu_mem_bytes=1 << 30))  # absent: the shim finds them by name


def test_memslice_run_names_the_simulated_driver(tmp_path: Path) -> None:
    region = tmp_path / "r"
    out = subprocess.run([sys.executable, "-m", "memslice.cli", "run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB",
                          "--region-dir", str(region), "--", "cat", str(region / "memslice.limits")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    keys = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert Path(keys["nvml_path"]).name == "libnvidia-ml.so.1" and Path(keys["nvml_path"]).is_file()
    assert Path(keys["cuda_path"]).name == "libcuda.so.1" and Path(keys["cuda_path"]).is_file()

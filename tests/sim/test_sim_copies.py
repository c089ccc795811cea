"""The simulated GPU's copies, sets and stream memory operations follow cuda.h's documented semantics
(descriptors with pitches, offsets, layer heights and memory types; widths, pitches and alignment of sets;
the comparisons of stream waits), refuse what the driver refuses, and fault on work against a reserved but
unmapped address: tests/c/copies.c, run on the simulator alone and under the shim (which forwards every one
of them through its work gate, unchanged)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import C_DIR, run


@pytest.fixture(scope="module")
def copies_bin(libs, tmp_path_factory: pytest.TempPathFactory) -> str:
    exe = tmp_path_factory.mktemp("copies") / "copies"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{libs.include}", str(C_DIR / "copies.c"), "-o", str(exe),
                    "-L", libs.sim_dir, "-l:libcuda.so.1"], check=True)
    return str(exe)


@pytest.mark.parametrize("shim", ["simulator alone", "under the shim", "under the elastic shim"])
def test_copies_sets_and_stream_memory_operations(node, tmp_path, copies_bin, shim):
    n = node(gpus="4GiB")
    if shim == "simulator alone":
        env = dict(n.env)
    else:
        elastic = {"MEMSLICE_GPU_MEM_REQUEST": "512MiB", "MEMSLICE_ELASTIC_DIR": str(tmp_path)}
        extra = elastic if "elastic" in shim else {}
        env = n.container(tmp_path / "c", "1GiB", **extra)
    out = run([copies_bin], env)
    bad = [line for line in out.stdout.splitlines() if " ok" not in line and not line.startswith("done")]
    assert out.returncode == 0 and not bad, out.stdout + out.stderr
    assert "done bad=0" in out.stdout and out.stdout.count(" ok\n") >= 36

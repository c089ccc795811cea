"""The real-GPU kit's own machinery, on this machine (issue 23, item 5): tests/gpu/run.sh needs no install and
no network — it builds the shim, imports memslice from the source tree through its tree of links, and runs
the checks with the Python it is given; without a GPU every check skips saying why, and on the simulated GPU
(MEMSLICE_GPU_KIT_SIM) the driver-API checks run through the real shim and write their figures as JSON lines."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

RUN = pathlib.Path(__file__).resolve().parents[1] / "gpu" / "run.sh"


def kit(tmp_path: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """tests/gpu/run.sh from an unrelated directory, with memslice importable only through the kit's own path
    (PYTHONPATH has a cffi that cannot be imported: GPU machines have no cffi)."""
    nocffi = tmp_path / "nocffi"
    nocffi.mkdir(exist_ok=True)
    (nocffi / "cffi.py").write_text("raise ImportError('no cffi here')\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k not in ("LD_PRELOAD",)}
    base.update(PYTHON=sys.executable, PYTHONPATH=str(nocffi), MEMSLICE_GPU_FIGURES=str(tmp_path / "figures.jsonl"),
                LD_LIBRARY_PATH="", **env)
    return subprocess.run([str(RUN), *args], env=base, cwd=tmp_path, capture_output=True, text=True, timeout=240)


def test_without_a_gpu_every_check_skips_saying_why(tmp_path):
    out = kit(tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    skips = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and " passed" not in out.stdout.splitlines()[-1] and "failed" not in out.stdout.splitlines()[-1]
    assert all("no NVIDIA driver" in s or "not installed" in s for s in skips), skips


def test_on_the_simulated_gpu_the_driver_checks_run_and_write_figures(tmp_path):
    out = kit(tmp_path, "-k", "versioned or newer or launch", MEMSLICE_GPU_KIT_SIM="16GiB")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "3 passed" in out.stdout.splitlines()[-1], out.stdout[-2000:]
    figures = [json.loads(line) for line in (tmp_path / "figures.jsonl").read_text().splitlines()]
    assert {f["check"] for f in figures} == {"names newer than the driver", "real libcuda",
                                              "allocation and launch cost (us, through ctypes)"}
    alloc = next(f for f in figures if f["check"].startswith("allocation"))
    assert alloc["alloc_free_2mib_us_plain"] > 0 and alloc["alloc_free_64mib_us_shim"] > 0

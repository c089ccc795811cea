"""`memslice run --gpus`: the command gets N GPUs (or the listed ones, in that order), each under the quota;
what the machine cannot give is refused by name, with the fix; --gpus works with elastic memory and a compute
share. The program is a real client (cuda-bindings) on the simulated node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memslice.run import choose_gpus

pytest.importorskip("cuda.bindings", reason="cuda-bindings is in the test extra: pip install -e '.[test]'")

SEES = """
import json, os
from cuda.bindings import driver as cu
cu.cuInit(0)
n = cu.cuDeviceGetCount()[1]
out = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": n, "total": [], "alloc": []}
for d in range(n):
    ctx = cu.cuDevicePrimaryCtxRetain(d)[1]
    cu.cuCtxSetCurrent(ctx)
    out["total"].append(cu.cuMemGetInfo()[2] >> 20)
    out["alloc"].append(int(cu.cuMemAlloc(256 << 20)[0]))
print(json.dumps(out))
"""


def env(tmp: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k not in ("LD_PRELOAD",
                                                                                           "CUDA_VISIBLE_DEVICES")}
    e.update(TMPDIR=str(tmp), MEMSLICE_SIM_STATE=str(tmp / "node.state"), MEMSLICE_SIM_CONTEXT_OVERHEAD="64MiB")
    return e


def run(tmp: Path, *args: str, script: str = SEES) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memslice", "run", *args, "--region-dir", str(tmp / "region"), "--",
                           sys.executable, "-c", script], env=env(tmp), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_gpus_n_gives_the_first_n_each_with_the_quota(tmp_path):
    out = run(tmp_path, "--gpus", "2", "--gpu-mem", "1GiB", "--simulate-gpu", "4GiB,4GiB,4GiB")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"visible": "0,1", "count": 2, "total": [1024, 1024], "alloc": [0, 0]}


def test_gpus_all_and_device_forms(tmp_path):
    out = run(tmp_path, "--gpus", "all", "--gpu-mem", "1GiB", "--simulate-gpu", "4GiB,4GiB,4GiB")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["count"] == 3
    out = run(tmp_path, "--gpus", "device=2", "--gpu-mem", "1GiB", "--simulate-gpu", "4GiB,4GiB,4GiB")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["visible"] == "2"


@pytest.mark.parametrize("gpus, sim, words", [
    ("3", "4GiB,4GiB", ["--gpus 3", "has 2 GPUs", "at most --gpus 2"]),
    ("0,2", "4GiB,4GiB", ["--gpus 0,2", "no GPU 2", "indices 0-1"]),
    ("1,1", "4GiB,4GiB", ["--gpus 1,1", "names a GPU twice"]),
    ("0", "4GiB,4GiB", ["--gpus 0", "at least one GPU"]),
    ("two", "4GiB,4GiB", ["--gpus two", "is not valid", "0,2"]),
])
def test_gpus_the_node_lacks_are_refused_by_name(tmp_path, gpus, sim, words):
    out = run(tmp_path, "--gpus", gpus, "--gpu-mem", "1GiB", "--simulate-gpu", sim)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    for w in words:
        assert w in out.stderr, (w, out.stderr)


def test_quota_must_fit_each_chosen_gpu(tmp_path):
    out = run(tmp_path, "--gpus", "0,1", "--gpu-mem", "6GiB", "--simulate-gpu", "8GiB,4GiB,8GiB")
    assert out.returncode == 2 and "larger than GPU 1 (4GiB) of --gpus" in out.stderr, out.stderr
    out = run(tmp_path, "--gpus", "0,2", "--gpu-mem", "6GiB", "--simulate-gpu", "8GiB,4GiB,8GiB")
    assert out.returncode == 0, out.stderr  # the small GPU is not chosen


def test_gpus_with_elastic_memory_and_a_compute_share(tmp_path):
    out = run(tmp_path, "--gpus", "2", "--gpu-mem", "1GiB", "--gpu-mem-request", "512MiB", "--gpu-compute", "30",
              "--simulate-gpu", "4GiB,4GiB")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["count"] == 2 and got["total"] == [1024, 1024] and got["alloc"] == [0, 0]  # the limit on each


def test_choose_gpus_is_pure():
    assert choose_gpus("2", 8) == [0, 1]
    assert choose_gpus("3,1", 4) == [3, 1]
    assert choose_gpus("all", 2) == [0, 1]
    with pytest.raises(ValueError, match="cannot count"):
        choose_gpus("2", None)

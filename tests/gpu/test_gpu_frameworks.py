"""JAX and CuPy on a real GPU under the shim: JAX preallocates 75% of the quota (not of the GPU), CuPy's pool
grows to the quota and fails with its own OutOfMemoryError."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gpukit import QUOTA_MIB, last_json, memslice_run, no_gpu_reason, report

# Skipped, saying why, without an NVIDIA driver and a GPU (make gpu-check runs these).
pytestmark = pytest.mark.skipif(no_gpu_reason() is not None, reason=no_gpu_reason() or "")

JAX = r"""
import json, jax, jax.numpy as jnp
x = jnp.ones((1 << 20,), dtype=jnp.float32).block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"limit": stats.get("bytes_limit", 0) >> 20, "reserved": stats.get("bytes_reserved", 0) >> 20}))
"""


def top_device_mib(region) -> int:
    out = subprocess.run([sys.executable, "-m", "memslice.cli", "top", "--json", str(region)], capture_output=True,
                         text=True, timeout=60)
    [r] = json.loads(out.stdout)["regions"]
    return r["devices"][0]["peak_bytes"] >> 20


def test_jax_preallocates_75_percent_of_the_quota(tmp_path):
    pytest.importorskip("jax", reason="JAX is not installed (pip install 'jax[cuda12]') — not in the test extra")
    region = tmp_path / "region"
    got = last_json(memslice_run(region, JAX, extra=()))
    # XLA sizes its preallocation from cuMemGetInfo's total, which the shim reports as the quota
    assert 0.70 * QUOTA_MIB <= got["limit"] <= 0.80 * QUOTA_MIB, got
    peak = top_device_mib(region)
    assert peak <= QUOTA_MIB
    report("jax preallocation", bytes_limit_mib=got["limit"], peak_charged_mib=peak, quota_mib=QUOTA_MIB)


CUPY = r"""
import json, cupy
pool = cupy.get_default_memory_pool()
blocks, err = [], None
try:
    while True:
        blocks.append(cupy.empty(64 << 20, dtype=cupy.uint8))
except cupy.cuda.memory.OutOfMemoryError as e:
    err = type(e).__name__
print(json.dumps({"err": err, "pool": pool.total_bytes() >> 20,
                  "total": cupy.cuda.runtime.memGetInfo()[1] >> 20}))
"""


def test_cupy_pool_grows_to_the_quota(tmp_path):
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda12x) — not in the test extra")
    got = last_json(memslice_run(tmp_path / "region", CUPY))
    assert got["err"] == "OutOfMemoryError" and got["total"] == QUOTA_MIB
    assert QUOTA_MIB - 1024 <= got["pool"] <= QUOTA_MIB
    report("cupy pool", pool_mib=got["pool"], quota_mib=QUOTA_MIB)

"""JAX and CuPy on a real GPU under the shim: JAX preallocates 75% of the quota (not of the GPU), CuPy's pool
grows to the quota and fails with its own OutOfMemoryError."""

from __future__ import annotations

import sys

import pytest
from gpukit import (
    QUOTA_MIB,
    held,
    last_json,
    memslice_run,
    need_nvml,
    no_gpu_reason,
    nvml_outside,
    real_env,
    report,
    run_cmd_argv,
)

# Skipped, saying why, without an NVIDIA driver and a GPU (tests/gpu/run.sh runs these).
pytestmark = pytest.mark.skipif(no_gpu_reason() is not None, reason=no_gpu_reason() or "")

JAX = r"""
import json, os, sys, jax, jax.numpy as jnp
x = jnp.ones((1 << 20,), dtype=jnp.float32).block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"pid": os.getpid(), "limit": stats.get("bytes_limit", 0) >> 20,
                  "reserved": stats.get("bytes_reserved", 0) >> 20}), flush=True)
sys.stdin.read()
"""


def test_jax_preallocates_75_percent_of_the_quota(tmp_path):
    pytest.importorskip("jax", reason="JAX is not installed here (it comes with the GPU machine's Python)")
    need_nvml()
    with held([*run_cmd_argv(QUOTA_MIB, tmp_path / "region"), sys.executable, "-c", JAX], real_env()) as j:
        got = j.read()
        physical = nvml_outside()["procs"].get(str(got["pid"]))
    # XLA sizes its preallocation from cuMemGetInfo's total, which the shim reports as the quota
    report("jax preallocation", bytes_limit_mib=got["limit"], nvml_physical_mib=physical, quota_mib=QUOTA_MIB)
    assert 0.70 * QUOTA_MIB <= got["limit"] <= 0.80 * QUOTA_MIB, got
    assert physical is not None and physical <= QUOTA_MIB, physical


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
    pytest.importorskip("cupy", reason="CuPy is not installed here (it comes with the GPU machine's Python)")
    got = last_json(memslice_run(tmp_path / "region", CUPY))
    assert got["err"] == "OutOfMemoryError" and got["total"] == QUOTA_MIB
    assert QUOTA_MIB - 1024 <= got["pool"] <= QUOTA_MIB
    report("cupy pool", pool_mib=got["pool"], quota_mib=QUOTA_MIB)

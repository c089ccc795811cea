"""PyTorch on a real GPU under the shim: the quota is the device's memory (mem_get_info), allocating past it
raises torch.OutOfMemoryError with each allocator (native, expandable_segments, cudaMallocAsync), and
oversubscribed memory spilled to the host comes back bit-identical."""

from __future__ import annotations

import pytest
from gpukit import QUOTA_MIB, last_json, memslice_run, no_gpu_reason, real_env, report

# Skipped, saying why, without an NVIDIA driver and a GPU (make gpu-check runs these).
pytestmark = pytest.mark.skipif(no_gpu_reason() is not None, reason=no_gpu_reason() or "")

pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch) — not part of the test extra")

FILL = r"""
import json, torch
free, total = torch.cuda.mem_get_info()
blocks, err = [], None
try:
    while True:
        blocks.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    err = type(e).__name__
held = len(blocks) * 64
del blocks
torch.cuda.empty_cache()
again = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # freed memory is usable again
print(json.dumps({"total": total >> 20, "free": free >> 20, "err": err, "held": held,
                  "backend": torch.cuda.get_allocator_backend()}))
"""


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "backend:cudaMallocAsync"])
def test_torch_allocates_to_the_quota_then_oom(tmp_path, conf):
    env = real_env()
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    got = last_json(memslice_run(tmp_path / "region", FILL, env=env))
    assert got["total"] == QUOTA_MIB
    assert got["err"] == "OutOfMemoryError"
    assert QUOTA_MIB - 1024 <= got["held"] <= QUOTA_MIB  # the context reserve comes out of the quota
    if "cudaMallocAsync" in conf:
        assert got["backend"] == "cudaMallocAsync"
    report(f"torch[{conf or 'native'}]", held_mib=got["held"], quota_mib=QUOTA_MIB)


ROUNDTRIP = r"""
import json, time, torch
torch.manual_seed(7)
x = torch.randint(0, 255, (3 << 30,), dtype=torch.uint8, device="cuda")  # 3 GiB: past a 2 GiB quota
ref = x[::4096].cpu().clone()
torch.cuda.synchronize()
t0 = time.perf_counter()
y = x.clone()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(json.dumps({"same": bool(torch.equal(y[::4096].cpu(), ref)), "gib_per_s": round(3 / dt, 2)}))
"""


def test_oversubscribed_tensors_come_back_bit_identical(tmp_path):
    out = memslice_run(tmp_path / "region", ROUNDTRIP, extra=("--oversubscribe=8GiB",))
    got = last_json(out)
    assert got["same"]
    report("spill copy bandwidth (device <-> host spill, 3 GiB)", gib_per_s=got["gib_per_s"])


def test_idle_tenant_swap_out_and_back():
    pytest.skip("memslice has no elastic memory (swapping an idle tenant out and back) yet: nothing to check")

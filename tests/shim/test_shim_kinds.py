"""Every allocation route that takes device memory is charged what it really takes, and released when
the driver frees it: pitched, managed, stream-ordered (pools), VMM, arrays, contexts.

"What it really takes" is the simulated GPU's own figure: after every step the C program reads the device bytes
the simulator holds (its usage ledger, past the shim) next to what the shim reports free, and each test checks
the two agree to the byte, not only the shim's own figure. The one difference is managed memory, which the
shim charges in full while the GPU holds none of it until its pages are touched (a bound, never an under-count)."""

from __future__ import annotations

from conftest import run

QUOTA_MIB = 1024
RESERVE_MIB = 64


def steps(out: str) -> dict[str, tuple[int, int]]:
    got = {}
    for line in out.splitlines():
        parts = dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)
        if "free_mib" in parts:
            got[line.split()[0]] = (int(parts.get("rc", 0)), int(parts["free_mib"]))
    return got


def charged_and_physical(out: str, quota_mib: int) -> dict[str, tuple[int, int]]:
    """Per step: (bytes the container is charged = quota - what the shim reports free, bytes the simulated GPU
    holds). The simulated GPU has 16 GiB, so the shim's free figure is the quota's side of its min()."""
    got = {}
    for line in out.splitlines():
        parts = dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)
        if "phys_b" in parts:
            got[line.split()[0]] = ((quota_mib << 20) - int(parts["free_b"]), int(parts["phys_b"]))
    return got


def run_kinds(node, cbin, tmp_path, *names, quota=QUOTA_MIB):
    n = node()
    env = n.container(tmp_path / "c", f"{quota}MiB", MEMSLICE_CONTEXT_RESERVE=f"{RESERVE_MIB}MiB")
    out = run([cbin["kinds"], *names], env)
    assert out.returncode == 0, out.stdout + out.stderr
    truth = charged_and_physical(out.stdout, quota)
    assert truth["start"] == (RESERVE_MIB << 20, RESERVE_MIB << 20)  # the context, as the simulator holds it
    for step, (charged, physical) in truth.items():
        if step != "managed_alloc":
            assert charged == physical, f"{step}: charged {charged} B, the GPU holds {physical} B\n{out.stdout}"
    return steps(out.stdout), n


def test_context_reserve_is_charged_once_per_process(node, cbin, tmp_path):
    got, _ = run_kinds(node, cbin, tmp_path)
    assert got["start"] == (0, QUOTA_MIB - RESERVE_MIB)


def test_pitch_is_charged_by_the_returned_pitch(node, cbin, tmp_path):
    got, _ = run_kinds(node, cbin, tmp_path, "pitch")
    base = QUOTA_MIB - RESERVE_MIB
    assert got["pitch_alloc"] == (0, base - 100)  # 1024-byte pitch x 100 Ki rows = 100 MiB, not 1000 x 100 Ki
    assert got["pitch_free"] == (0, base)


def test_managed_memory_is_charged_in_full_before_the_gpu_holds_it(node, cbin, tmp_path):
    got, n = run_kinds(node, cbin, tmp_path, "managed")
    base = QUOTA_MIB - RESERVE_MIB
    assert got["managed_alloc"] == (0, base - 100)
    assert got["managed_free"] == (0, base)
    # the simulated GPU holds none of it (managed pages live on the host until touched): the charge is the most
    # it can take on the device, an over-count by design
    assert n.physical()[0].peak_bytes == RESERVE_MIB << 20


def test_pools_are_charged_what_they_reserve(node, cbin, tmp_path):
    got, _ = run_kinds(node, cbin, tmp_path, "async", "pool")
    base = QUOTA_MIB - RESERVE_MIB
    assert got["async_alloc"] == (0, base - 100)
    assert got["async_free"] == (0, base - 100)      # freed, but the pool still holds it on the device
    assert got["async_realloc"] == (0, base - 100)   # served from the pool's cache: no new charge
    assert got["async_sync"] == (0, base)            # the pool released it at synchronize
    assert got["pool_alloc"] == (0, base - 64)
    assert got["pool_destroy"] == (0, base)


def test_pool_cache_never_pushes_the_container_over_its_quota(node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", f"{QUOTA_MIB}MiB", MEMSLICE_CONTEXT_RESERVE=f"{RESERVE_MIB}MiB")
    out = run([cbin["kinds"], "asyncbig"], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "asyncbig n=9 last_rc=2" in out.stdout     # 9 x 100 MiB fit in 1024 - 64
    got = steps(out.stdout)
    assert got["asyncbig_after"][0] == 0             # the pool was trimmed instead of refusing
    assert max(d.peak_bytes for d in n.physical()) <= QUOTA_MIB << 20
    truth = charged_and_physical(out.stdout, QUOTA_MIB)
    assert all(charged == physical for charged, physical in truth.values()), out.stdout


def test_vmm_is_charged_until_released_and_unmapped(node, cbin, tmp_path):
    got, _ = run_kinds(node, cbin, tmp_path, "vmm")
    base = QUOTA_MIB - RESERVE_MIB
    assert got["vmm_create"] == (0, base - 64)
    assert got["vmm_map"] == (0, base - 64)
    assert got["vmm_release"] == (0, base - 64)      # still mapped: the driver still holds it
    assert got["vmm_unmap"] == (0, base)


def test_arrays_are_charged(node, cbin, tmp_path):
    got, _ = run_kinds(node, cbin, tmp_path, "array", "array3d", "mipmap", "hostalloc")
    base = QUOTA_MIB - RESERVE_MIB
    assert got["array_create"] == (0, base - 16)     # 16,000,000 B rounds to 15.3 MiB: reported free drops 16
    assert got["array_destroy"] == (0, base)
    assert got["array3d_create"] == (0, base - 16)
    assert got["mipmap_create"][1] < base - 16       # base level 16 MiB plus the smaller levels
    assert got["mipmap_destroy"] == (0, base)
    assert got["host_alloc"] == (0, base)            # pinned host memory is not GPU memory


def test_quota_smaller_than_a_context_refuses_it_saying_so(node, cbin, tmp_path):
    n = node()  # a context takes 64 MiB on this simulated GPU: measured, whatever MEMSLICE_CONTEXT_RESERVE says
    env = n.container(tmp_path / "c", "32MiB", MEMSLICE_CONTEXT_RESERVE="16MiB")
    out = run([cbin["alloc_direct"], "1"], env)
    assert out.returncode == 4  # the context could not be created
    assert "cuDevicePrimaryCtxRetain of 64.0 MiB refused" in out.stderr and "32.0 MiB quota" in out.stderr

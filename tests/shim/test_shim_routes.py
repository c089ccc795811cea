"""The quota holds on every route by which programs reach the driver: direct symbols, dlopen+dlsym,
cuGetProcAddress_v2 the way libcudart uses it, the legacy 32-bit entry points, cuda.bindings and pynvml."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import build_cache
import pytest
from conftest import kv, preload, run


def test_direct_symbols(node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "512MiB", MEMSLICE_CONTEXT_RESERVE="64MiB")
    out = run([cbin["alloc_direct"], "200", "200", "200"], env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1:4] == ["alloc 200 MiB -> 0", "alloc 200 MiB -> 0", "alloc 200 MiB -> 2"]
    assert "info free=48 total=512 devtotal=512" in out.stdout  # 512 - 64 reserve - 400
    assert "cuMemAlloc_v2 of 200.0 MiB refused" in out.stderr and "MEMSLICE_GPU_MEM_LIMIT=512MiB" in out.stderr


def test_refusal_line_is_rate_limited(node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "1GiB", MEMSLICE_CONTEXT_RESERVE="0")
    out = run([cbin["alloc_direct"], "600", *["600"] * 40], env)
    assert out.stdout.count("-> 2") == 40
    assert out.stderr.count("refused") == 1  # one line, not forty


def test_without_the_shim_the_same_program_is_not_limited(node, cbin, tmp_path):
    """Control for the test above: the limit comes from the shim, not from the simulator."""
    n = node()
    env = dict(n.env)
    out = run([cbin["alloc_direct"], "200", "200", "200"], env)
    assert out.stdout.count("-> 0") == 3


@pytest.mark.parametrize("route", ["dlsym", "procaddr", "v1"])
def test_routes_are_all_counted(route, node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "300MiB", MEMSLICE_CONTEXT_RESERVE="64MiB")
    out = run([cbin["routes"], route, "200"], env)
    assert out.returncode == 0, out.stdout + out.stderr
    got = kv(out.stdout)
    assert got["first"] == "0" and got["second"] == "2", out.stdout
    # a free of a pointer the shim never saw reaches the driver, which answers for itself
    assert got["unknown_free"] == "1"
    if route != "v1":
        assert "libmemslice.so" in out.stdout.split("alloc_fn lib=")[1].split()[0]
    else:  # the legacy 32-bit queries report the quota too
        assert got["total_mib"] == "300" and got["devtotal_mib"] == "300" and got["free_mib"] == "236"


def test_procaddr_follows_driver_rules_and_returns_exact_variants(node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "1GiB")
    out = run([cbin["routes"], "procaddr", "16"], env)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    # cudart's bootstrap: the pointer it uses for everything after is our wrapper of the exact variant
    assert "getproc11030 lib=libmemslice.so sym=cuGetProcAddress\n" in text
    assert "getproc12000 lib=libmemslice.so sym=cuGetProcAddress_v2\n" in text
    assert "empty rc=0 fn=null status=1" in text          # "" passes through: SUCCESS, NULL, NOT_FOUND
    assert "unknown rc=0 fn=null status=1" in text
    assert "toonew rc=1" in text                          # cudaVersion above the driver: INVALID_VALUE
    assert "notyet rc=0 fn=null status=2" in text         # VERSION_NOT_SUFFICIENT, status filled by the driver
    assert "exporttable lib=libcuda.so.1" in text         # never wrapped
    assert "async_distinct=1" in text                     # legacy and per-thread-stream variants differ
    assert "lookup cuMemAllocAsync@11020/2 rc=0 status=0 lib=libmemslice.so sym=cuMemAllocAsync_ptsz" in text
    assert "lookup cuCtxCreate@3020/0 rc=0 status=0 lib=libmemslice.so sym=cuCtxCreate_v2" in text
    assert "lookup cuCtxCreate@12050/0 rc=0 status=0 lib=libmemslice.so sym=cuCtxCreate_v4" in text
    # copies pass the elastic work gate: the exact per-thread-stream variant's wrapper
    assert "lookup cuMemcpy@7000/2 rc=0 status=0 lib=libmemslice.so sym=cuMemcpy_ptds" in text
    # functions the shim does not wrap come straight from the driver, in the exact variant asked for
    assert "lookup cuStreamQuery@7000/2 rc=0 status=0 lib=libcuda.so.1 sym=cuStreamQuery_ptsz" in text


CUDA_BINDINGS = """
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == d.CUresult.CUDA_SUCCESS
err, dev = d.cuDeviceGet(0)
err, ctx = d.cuCtxCreate(None, 0, dev)
assert err == d.CUresult.CUDA_SUCCESS, err
err, free, total = d.cuMemGetInfo()
print("total", total >> 20, "free", free >> 20)
err, p = d.cuMemAlloc(256 << 20); print("alloc1", int(err))
err, q = d.cuMemAlloc(256 << 20); print("alloc2", int(err))
err, tm = d.cuDeviceTotalMem(dev); print("devtotal", tm >> 20)
"""


def test_cuda_python_bindings(node, tmp_path):
    import cuda.bindings.driver  # noqa: F401  (a test dependency: fail loudly if it is missing)

    n = node()
    env = n.container(tmp_path / "c", "512MiB", MEMSLICE_CONTEXT_RESERVE="64MiB")
    out = run([sys.executable, "-c", CUDA_BINDINGS], env)
    assert out.returncode == 0, out.stderr
    assert "total 512 free 448" in out.stdout
    assert "alloc1 0" in out.stdout and "alloc2 2" in out.stdout and "devtotal 512" in out.stdout


PYNVML = """
import ctypes, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m = pynvml.nvmlDeviceGetMemoryInfo(h)
m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
print("nvml", m.total >> 20, m.used >> 20, m.free >> 20, m2.total >> 20, m2.free >> 20)
"""


def test_pynvml_agrees_with_cuda(node, cbin, tmp_path):
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "2GiB", MEMSLICE_CONTEXT_RESERVE="64MiB")
    holder = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "500"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert '"ready"' in holder.stdout.readline() + holder.stdout.readline()
        out = run([sys.executable, "-c", PYNVML], env)
        assert out.returncode == 0, out.stderr
        # the holder's 500 MiB + its 64 MiB context reserve, seen from another process of the container
        assert "nvml 2048 564 1484 2048 1484" in out.stdout
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_ld_bind_now(node, cbin, libs, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "1GiB", LD_BIND_NOW="1")
    assert run(["/bin/true"], env).returncode == 0
    out = run([cbin["alloc_direct"], "10"], env)
    assert out.returncode == 0 and "alloc 10 MiB -> 0" in out.stdout


def test_exports_are_exactly_the_wrapped_names(libs):
    defs = (pathlib_root() / "interposer/src/hooks.def").read_text()
    wrapped = {line[len("HOOK_ENTRY("):-1] for line in defs.splitlines() if line.startswith("HOOK_ENTRY(")}
    nm = subprocess.run(["nm", "-D", "--defined-only", libs.shim], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}
    assert exported == wrapped | {"dlsym"}
    undefined = subprocess.run(["nm", "-D", "--undefined-only", libs.shim], capture_output=True, text=True).stdout
    assert " Py" not in undefined


def pathlib_root():
    import pathlib

    return pathlib.Path(__file__).resolve().parents[2]


@contextmanager
def shim_built_at(opt: str, fresh: Path) -> Iterator[Path]:
    """The shim built by interposer/Makefile with CFLAGS=`opt`, cached by the hash of its sources, the Makefile,
    `opt` and the compiler (tests/support/build_cache.py): built again when one changes, not on every run (the
    three builds were 13 CPU-s of every `make test`). With MEMSLICE_TEST_BUILD_CACHE=0, built into `fresh`."""
    root = pathlib_root()
    cc = subprocess.run(["cc", "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = build_cache.tree_digest(root, ["interposer/src", "interposer/include", "interposer/Makefile"],
                                     lambda rel: False, extra=[opt, cc])

    def build(entry: Path) -> None:
        out = subprocess.run(["make", "-s", "-C", str(root / "interposer"), f"B={entry}", f"CFLAGS={opt}",
                              str(entry / "libmemslice.so")], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"the shim at {opt} did not build:\n{out.stdout}\n{out.stderr}"

    with build_cache.cached_build(f"shim{opt}", digest, build, fresh) as (entry, _):
        yield entry / "libmemslice.so"


@pytest.mark.parametrize("opt", ["-O0", "-O1", "-O2"])
def test_rtld_next_keeps_its_meaning_for_other_libraries(libs, node, tmp_path, opt):
    """Another library preloaded after the shim wraps puts through dlsym(RTLD_NEXT, "puts"): it must get
    libc's puts, not its own, whatever level the shim is built at (glibc resolves RTLD_NEXT from its
    caller's return address, which a non-tail call from the shim's dlsym would make the shim's)."""
    c_dir = pathlib_root() / "tests" / "c"
    lib = tmp_path / "libnext.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(c_dir / "next_puts.c"), "-o", str(lib), "-ldl"], check=True)
    exe = tmp_path / "main"
    subprocess.run(["cc", str(c_dir / "next_puts_main.c"), "-o", str(exe)], check=True)
    env = node().container(tmp_path / "c", "1GiB")
    with shim_built_at(opt, tmp_path / "shim") as shim:
        env["LD_PRELOAD"] = preload(str(shim), str(lib))
        out = run([str(exe)], env, timeout=30)
    assert out.returncode == 0 and out.stdout == "wrapped: hello\n"

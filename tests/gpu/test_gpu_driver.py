"""The shim against the real driver: NVML inside the shim reports the quota, and outside it the GPU (whose
total includes memory the driver reserves, which CUDA's total leaves out); the real context size against
MEMSLICE_CONTEXT_RESERVE; a name the shim routes but the driver lacks answers as the driver would for an
unknown entry point and never crashes; no versioned variant of a routed function is left unrouted; what an
allocation and a kernel launch cost with and without the shim."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from gpukit import (
    QUOTA_MIB,
    last_json,
    memslice_run,
    need_nvml,
    no_gpu_reason,
    plain_run,
    report,
)

# Skipped, saying why, without an NVIDIA driver and a GPU (tests/gpu/run.sh runs these).
pytestmark = pytest.mark.skipif(no_gpu_reason() is not None, reason=no_gpu_reason() or "")

HOOKS = Path(__file__).resolve().parents[2] / "interposer" / "src" / "hooks.def"

MACHINE = r"""
import ctypes, json, platform, sys
cuda = ctypes.CDLL("libcuda.so.1")
name, ver, n = ctypes.create_string_buffer(256), ctypes.c_int(), ctypes.c_int()
cuda.cuInit(0); cuda.cuDriverGetVersion(ctypes.byref(ver)); cuda.cuDeviceGetCount(ctypes.byref(n))
cuda.cuDeviceGetName(name, 256, 0)
out = {"gpu": name.value.decode(), "gpus": n.value, "cuda_driver_api": ver.value, "python": platform.python_version()}
try:
    import pynvml
    pynvml.nvmlInit()
    out["driver"] = pynvml.nvmlSystemGetDriverVersion()
except Exception as e:
    out["driver"] = "unknown (%s)" % e
for mod in ("torch", "jax", "cupy"):
    try:
        out[mod] = __import__(mod).__version__
    except Exception:
        out[mod] = None
print(json.dumps(out))
"""


def test_machine():
    """The machine the figures come from (first in the figures file): GPU model, driver, frameworks."""
    got = last_json(plain_run(MACHINE, timeout=120))
    report("machine", **got)
    assert got["gpus"] >= 1 and got["gpu"]


NVML = r"""
import ctypes, json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
out = {"total": n.nvmlDeviceGetMemoryInfo(h).total >> 20}
try:
    m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    out.update(v2_total=m.total >> 20, v2_reserved=m.reserved >> 20)
except Exception as e:  # a driver or binding without nvmlDeviceGetMemoryInfo_v2
    out["v2_error"] = str(e)
cuda = ctypes.CDLL("libcuda.so.1")
t, f = ctypes.c_size_t(), ctypes.c_size_t()
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuInit(0); cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
out["cuda_total"] = t.value >> 20
print(json.dumps(out))
"""


def test_nvml_inside_the_shim_is_the_quota_outside_the_gpu(tmp_path):
    """Inside the shim NVML's total is the quota. Outside, NVML's total is the GPU's, and CUDA's total is that
    less what the driver reserves (nvmlDeviceGetMemoryInfo_v2's reserved: 480 MiB on an H100 with driver 580)."""
    need_nvml()
    inside = last_json(memslice_run(tmp_path / "region", NVML))
    outside = last_json(plain_run(NVML, timeout=120))
    report("nvml totals", inside_mib=inside["total"], quota_mib=QUOTA_MIB, nvml_total_mib=outside["total"],
           nvml_v2_total_mib=outside.get("v2_total"), nvml_v2_reserved_mib=outside.get("v2_reserved"),
           cuda_total_mib=outside["cuda_total"])
    assert inside["total"] == QUOTA_MIB
    assert outside["cuda_total"] <= outside["total"]
    if "v2_total" in outside:
        assert outside["v2_total"] == outside["total"]
        assert abs(outside["v2_total"] - outside["v2_reserved"] - outside["cuda_total"]) <= 1, outside


CONTEXT = r"""
import ctypes, json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
before = pynvml.nvmlDeviceGetMemoryInfo(h).used
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuInit(0); cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
after = pynvml.nvmlDeviceGetMemoryInfo(h).used
print(json.dumps({"delta": (after - before) >> 20, "listed": [m >> 20 for m in mine if m]}))
"""


def test_context_size_against_the_reserve():
    need_nvml()
    got = last_json(plain_run(CONTEXT, timeout=120))
    reserve = 300  # MEMSLICE_CONTEXT_RESERVE's default, MiB (docs/architecture.md)
    report("context size", measured_mib=got["delta"], nvml_listed_mib=got["listed"], reserve_mib=reserve)
    assert 0 < got["delta"] <= 2 * reserve, "the default reserve is far from what a context takes here"


def real_libcuda() -> str:
    out = plain_run("import ctypes, os; ctypes.CDLL('libcuda.so.1');"
                    "print([l.split()[-1] for l in open('/proc/self/maps') if 'libcuda.so' in l][0])", timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def elf_exports(path: str) -> set[str]:
    """The defined dynamic symbols of a 64-bit little-endian ELF library (its .dynsym), read without binutils
    (GPU machines may not have nm)."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is not a 64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for _name, kind, _fl, _addr, off, size, link, _info, _al, entsize in sections:
        if kind != 11 or not entsize:  # SHT_DYNSYM
            continue
        stroff = sections[link][4]
        for k in range(size // entsize):
            st_name, _st_info, _other, shndx = struct.unpack_from("<IBBH", data, off + k * entsize)
            if shndx and st_name:
                end = data.index(b"\0", stroff + st_name)
                names.add(data[stroff + st_name:end].decode())
    return names


# Through the shim (and, for comparison, without it), for each name: what cuGetProcAddress_v2 answers, whether
# dlsym on the driver's handle finds it, and what calling the name answers where a program linked against a
# newer libcuda finds it (the preloaded shim's export; without the shim, the driver's, if any). The call has
# zero arguments: a count of 0, NULL pointers, the legacy stream.
NEWER_THAN_DRIVER = r"""
import ctypes, json, os, sys
cuda = ctypes.CDLL("libcuda.so.1")
shim = [p for p in os.environ.get("LD_PRELOAD", "").split() if "libmemslice" in p]
linked = ctypes.CDLL(shim[0]) if shim else cuda
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuInit(0); cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
gpa = cuda.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_int)]
out = {}
for name in sys.argv[1:]:
    fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = gpa(name.encode(), ctypes.byref(fn), 13000, 0, ctypes.byref(status))
    entry = {"gpa_rc": rc, "gpa_status": status.value, "gpa_found": bool(fn.value),
             "dlsym_found": hasattr(cuda, name)}
    try:
        f = getattr(linked, name)
    except AttributeError:
        entry["call_rc"] = None
    else:
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_uint64] * 6
        entry["call_rc"] = f(0, 0, 0, 0, 0, 0)
    out[name] = entry
print(json.dumps(out))
"""


def test_names_newer_than_the_driver_answer_as_the_driver_would(tmp_path):
    """The shim routes names from the newest cuda.h; a driver older than them lacks some (driver 580 lacks
    cuMemcpyWithAttributesAsync, cuMemcpy3DWithAttributesAsync and their _ptsz). Through the shim such a name
    must answer as the driver does for an unknown entry point: cuGetProcAddress gives the driver's own answer
    (on driver 580: CUDA_SUCCESS with CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, no pointer), dlsym finds nothing, a program
    linked against a newer libcuda that calls it (reaching the shim's export) gets CUDA_ERROR_NOT_SUPPORTED,
    and nothing crashes."""
    lib = real_libcuda()
    names = elf_exports(lib)
    routed = re.findall(r"^HOOK_ENTRY\((cu\w+)\)", HOOKS.read_text(), re.M)
    missing = [n for n in routed if n not in names]
    probe = missing or ["cuMemcpyWithAttributesAsync", "cuMemcpy3DWithAttributesAsync"]
    plain = last_json(plain_run(NEWER_THAN_DRIVER, *probe, timeout=120))
    shim = last_json(memslice_run(tmp_path / "region", NEWER_THAN_DRIVER, *probe))
    report("names newer than the driver", driver=lib, missing=missing,
           through_shim={n: shim[n] for n in probe}, without_shim={n: plain[n] for n in probe})
    for n in missing:
        assert (shim[n]["gpa_rc"], shim[n]["gpa_status"]) == (plain[n]["gpa_rc"], plain[n]["gpa_status"]), n
        # driver 580 answers CUDA_SUCCESS with CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND and no pointer (H100 run)
        assert shim[n]["gpa_status"] != 0 and not shim[n]["gpa_found"], n
        assert not shim[n]["dlsym_found"] and not plain[n]["dlsym_found"], n
        assert shim[n]["call_rc"] in (500, 801), f"{n}: {shim[n]}"  # NOT_FOUND, NOT_SUPPORTED


def test_no_versioned_variant_of_a_routed_function_bypasses_the_shim():
    lib = real_libcuda()
    names = elf_exports(lib)
    routed = re.findall(r"^HOOK_ENTRY\((cu\w+)\)", HOOKS.read_text(), re.M)
    bases = {re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", n) for n in routed}
    variants = {n for n in names if re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", n) in bases}
    unrouted = sorted(variants - set(routed))
    report("real libcuda", path=lib, exports=len(names), routed=len(routed), unrouted_variants=unrouted)
    assert names, f"no dynamic symbols read from {lib}"
    assert not unrouted, f"versioned variants of routed functions that bypass the shim: {unrouted}"


# cuMemAlloc/cuMemFree pairs and empty kernel launches through the driver API (ctypes: each call also pays
# ~1 us of Python, the same with and without the shim).
COSTS = r"""
import ctypes, json, time
cuda = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_uint64
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(P), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [P]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuInit(0); cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)

def pairs(size, n):
    p = P()
    t0 = time.perf_counter()
    for _ in range(n):
        assert cuda.cuMemAlloc_v2(ctypes.byref(p), size) == 0
        assert cuda.cuMemFree_v2(p) == 0
    return round((time.perf_counter() - t0) / n * 1e6, 2)

def free_bytes():
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)) == 0
    return f.value

pairs(2 << 20, 20)
before = free_bytes()
out = {"alloc_free_2mib_us": min(pairs(2 << 20, 300) for _ in range(3)),
       "alloc_free_64mib_us": min(pairs(64 << 20, 100) for _ in range(3))}
out["pairs"] = 3 * 300 + 3 * 100
out["leaked_mib"] = (before - free_bytes()) >> 20  # what 1,200 pairs left behind (under the shim: still charged)
PTX = b".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry empty()\n{\n\tret;\n}\n"
mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
rc = cuda.cuModuleLoadData(ctypes.byref(mod), PTX)
if rc == 0 and cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"empty") == 0:
    launch = cuda.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    def launches(n):
        t0 = time.perf_counter()
        for _ in range(n):
            launch(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)
        cuda.cuCtxSynchronize()
        return round((time.perf_counter() - t0) / n * 1e6, 2)
    launches(100)
    out["launch_us"] = min(launches(5000) for _ in range(3))
else:
    out["launch_error"] = rc
print(json.dumps(out))
"""


def test_allocation_and_launch_loops_leak_nothing_and_report_their_cost(tmp_path):
    """cuMemAlloc+cuMemFree pairs of 2 MiB and 64 MiB, and empty kernel launches back to back, with and without
    the shim. Asserted (nothing here is timing): every pair succeeds, the device's free memory (the quota's under
    the shim) is the same after 1,200 pairs as before, and launches run under the shim where they run without.
    The costs are printed only (H100, no shim, from C: 58-95 us / 127-159 us per pair, 3.2-4.5 us per launch;
    benchmarks/ holds the measured figures)."""
    plain = last_json(plain_run(COSTS, timeout=120))
    shim = last_json(memslice_run(tmp_path / "region", COSTS, quota_mib=4096))
    report("allocation and launch cost (us, through ctypes)", **{f"{k}_plain": v for k, v in plain.items()},
           **{f"{k}_shim": v for k, v in shim.items()})
    assert plain["pairs"] == shim["pairs"] == 1200
    assert shim["leaked_mib"] == 0, shim  # every free given back to the quota
    assert plain["leaked_mib"] <= 2, plain  # the driver's own free figure, within its 2 MiB granularity
    assert ("launch_us" in shim) == ("launch_us" in plain), (plain, shim)


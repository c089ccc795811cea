"""A tenant's lying NVML (issue 35 item 2). The shim measures what the driver takes outside allocation calls
(contexts, limits, modules) through NVML's per-process figure. It used to load whichever libnvidia-ml.so.1
the tenant's library path found first: a copy reporting 0 bytes for every process got its contexts charged
nothing (1,721 MiB on a 1 GiB quota). The node agent (and `memslice run`) now name the node's own driver
libraries in the limits file (nvml_path, cuda_path), the shim loads those, and where NVML's figure is below
the driver's free memory it charges the larger. Each test runs the real shim in real processes on the
simulated GPU, with a real lying library (tests/c/lying_nvml.c) built here, and reads the simulator's own
physical high-water mark."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest
from conftest import C_DIR, run

from memslice.limits import Limits
from memslice.limits import write as write_limits

QUOTA_MIB = 1024
CONTEXTS = 12  # 13 contexts of 64 MiB with the primary: 832 MiB the driver takes, then the quota is filled


@pytest.fixture(scope="module")
def liar(libs, tmp_path_factory) -> pathlib.Path:
    """A directory holding the lying libnvidia-ml.so.1."""
    d = tmp_path_factory.mktemp("liar")
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", f"-I{libs.include}",
                    "-Wl,-soname,libnvidia-ml.so.1", str(C_DIR / "lying_nvml.c"), "-o", str(d / "libnvidia-ml.so.1"),
                    "-ldl"], check=True)
    return d


def container(node, libs, tmp_path, liar: pathlib.Path, nvml: str, cuda: str, path_first: str = "") -> dict[str, str]:
    """A container whose limits file (memslice run's, in its region dir) names these driver libraries."""
    n = node(context_overhead="64MiB")
    region = tmp_path / "c"
    region.mkdir()
    write_limits(region / "memslice.limits", Limits(gpu_mem_bytes=QUOTA_MIB << 20, nvml_path=nvml, cuda_path=cuda))
    env = n.container(region, None, LYING_NVML_REAL=libs.sim_nvml)
    if path_first:
        env["LD_LIBRARY_PATH"] = f"{path_first}:{libs.sim_dir}"
    return env | {"_physical_state": n.state}


def physical_peak_mib(env: dict[str, str]) -> int:
    """The simulated GPU's own high-water mark of physical memory (its usage ledger), in MiB."""
    from memslice.interposer.region import read_region_file

    snap = read_region_file(env["_physical_state"] + ".usage")
    assert snap is not None
    (gpu,) = snap.devices
    return gpu.peak_bytes >> 20


def contexts_then_fill(cbin, env: dict[str, str]) -> str:
    out = run([cbin["unseen"], "ctx", str(CONTEXTS), "fill"], {k: v for k, v in env.items() if k != "_physical_state"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fill rc=2" in out.stdout, out.stdout  # filled until the quota refused
    return out.stdout


def test_a_lying_nvml_first_in_the_tenants_library_path_does_not_lower_the_charge(node, libs, cbin, liar,
                                                                                   tmp_path):
    env = container(node, libs, tmp_path, liar, libs.sim_nvml, str(pathlib.Path(libs.sim_dir) / "libcuda.so.1"),
                    path_first=str(liar))
    out = contexts_then_fill(cbin, env)
    assert out.count("ctx rc=0") == CONTEXTS, out
    peak = physical_peak_mib(env)
    assert QUOTA_MIB - 16 < peak <= QUOTA_MIB, f"the simulated GPU held {peak} MiB on a {QUOTA_MIB} MiB quota"


def test_an_nvml_that_under_reports_is_overruled_by_the_drivers_free_memory(node, libs, cbin, liar, tmp_path):
    # even the library the limits name may under-report (a broken driver): the larger figure is charged
    env = container(node, libs, tmp_path, liar, str(liar / "libnvidia-ml.so.1"),
                    str(pathlib.Path(libs.sim_dir) / "libcuda.so.1"))
    out = contexts_then_fill(cbin, env)
    assert "start rc=0 free_mib=960 " in out, out  # the primary context's 64 MiB charged, whatever NVML says
    peak = physical_peak_mib(env)
    assert QUOTA_MIB - 16 < peak <= QUOTA_MIB, f"the simulated GPU held {peak} MiB on a {QUOTA_MIB} MiB quota"


def test_a_tenants_own_libcuda_copy_is_refused(node, libs, cbin, liar, tmp_path):
    # a program bound to another libcuda.so.1 than the node's would be measured by one driver and run on another
    fake = tmp_path / "fakecuda"
    fake.mkdir()
    shutil.copy(pathlib.Path(libs.sim_dir) / "libcuda.so.1", fake / "libcuda.so.1")  # a copy: another file
    env = container(node, libs, tmp_path, liar, libs.sim_nvml, str(pathlib.Path(libs.sim_dir) / "libcuda.so.1"),
                    path_first=str(fake))
    out = run([cbin["alloc_direct"], "16"], {k: v for k, v in env.items() if k != "_physical_state"})
    assert out.returncode != 0
    assert "loaded a libcuda.so.1 other than the node's driver" in out.stderr, out.stderr
    assert physical_peak_mib(env) <= 64  # at most a context: nothing was allocated


@pytest.mark.parametrize(("value", "why"), [("libnvidia-ml.so.1", "not absolute"), ("/", "not a regular file"),
                                            ("/nonexistent/libnvidia-ml.so.1", "No such file"),
                                            ("/usr/../usr/lib/libnvidia-ml.so.1", "has a .. component")])
def test_a_bad_library_path_fails_closed_naming_it(node, libs, cbin, tmp_path, value, why):
    n = node(context_overhead="64MiB")
    region = tmp_path / "c"
    region.mkdir()
    (region / "memslice.limits").write_text(f"gpu_mem_limit={QUOTA_MIB}MiB\nnvml_path={value}\n")
    out = run([cbin["alloc_direct"], "16"], n.container(region, None))
    assert out.stdout.startswith("init 800"), out.stdout  # CUDA_ERROR_NOT_PERMITTED
    assert "nvml_path" in out.stderr and why in out.stderr, out.stderr

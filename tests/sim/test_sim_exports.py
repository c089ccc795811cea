"""Export coverage of the simulated driver: every function the public cuda.h and nvml.h declare (read from the
toolkit wheels of the test extra, with their versioned ABI names) is exported by the simulated libcuda.so.1 and
libnvidia-ml.so.1; what is not modelled answers NOT_SUPPORTED, directly and through cuGetProcAddress."""

from __future__ import annotations

import ctypes
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import proc_lookup

GEN = pathlib.Path(__file__).resolve().parents[2] / "interposer" / "sim" / "gen_exports.py"


def gen_module():
    spec = importlib.util.spec_from_file_location("gen_exports", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def include() -> pathlib.Path:
    try:
        return gen_module().find_include()
    except SystemExit as e:
        pytest.skip(f"toolkit headers not installed ({e}); they come with the test extra")


def stubs(text: str) -> set[str]:
    return set(re.findall(r"^SIM_STUB\((\w+)\)$", text, re.M))


def exported(lib: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    return {parts[2] for parts in (line.split() for line in out.splitlines()) if len(parts) == 3 and parts[1] in "TW"}


def test_every_cuda_h_function_is_exported(include, libs):
    want = stubs(gen_module().cuda_def(include))
    assert {"cuMemAlloc", "cuMemAlloc_v2", "cuCtxCreate_v4", "cuMemcpyHtoD_v2_ptds", "cuStreamGetCtx_v2_ptsz",
            "cuIpcOpenMemHandle_v2", "cuEventElapsedTime_v2"} <= want  # versioned and legacy ABI names
    assert len(want) > 600
    missing = sorted(want - exported(libs.sim_cuda))
    assert not missing, f"{len(missing)} cuda.h functions not exported: {missing[:20]}"


def test_every_nvml_h_function_is_exported(include, libs):
    want = stubs(gen_module().nvml_def(include))
    assert {"nvmlInit", "nvmlInit_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses"} <= want
    nvml = str(pathlib.Path(libs.sim_cuda).with_name("libnvidia-ml.so.1"))
    missing = sorted(want - exported(nvml))
    assert not missing, f"{len(missing)} nvml.h functions not exported: {missing[:20]}"


def test_committed_lists_match_the_headers(include):
    out = subprocess.run([sys.executable, str(GEN), "--check", "--include", str(include)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_unmodelled_functions_answer_not_supported(libs, node, monkeypatch):
    n = node()
    for k, v in n.env.items():
        monkeypatch.setenv(k, v)
    cuda = ctypes.CDLL(libs.sim_cuda)
    assert cuda.cuGraphCreate(None, 0) == 801  # CUDA_ERROR_NOT_SUPPORTED
    nvml = ctypes.CDLL(str(pathlib.Path(libs.sim_cuda).with_name("libnvidia-ml.so.1")))
    assert nvml.nvmlDeviceGetVgpuMetadata(None, None, None) == 3  # NVML_ERROR_NOT_SUPPORTED

    look, addr = proc_lookup(cuda)

    # names the hand-written table does not list come from the generated one, with the right ABI variant
    assert look(b"cuGraphCreate", 13000) == (0, addr("cuGraphCreate"), 0)
    assert look(b"cuStreamGetCtx", 12050) == (0, addr("cuStreamGetCtx_v2"), 0)
    assert look(b"cuStreamGetCtx", 12000) == (0, addr("cuStreamGetCtx"), 0)
    assert look(b"cuStreamGetCtx", 12050, 2) == (0, addr("cuStreamGetCtx_v2_ptsz"), 0)
    assert look(b"cuIpcOpenMemHandle", 11000) == (0, addr("cuIpcOpenMemHandle_v2"), 0)
    assert look(b"cuEventElapsedTime", 12080) == (0, addr("cuEventElapsedTime_v2"), 0)
    assert look(b"cuCtxGetStreamPriorityRange", 5050) == (0, addr("cuCtxGetStreamPriorityRange"), 0)
    assert look(b"cuStreamGetCtx", 9000) == (0, None, 2)  # introduced in 9.2

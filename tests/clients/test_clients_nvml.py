"""Real NVML clients on the simulated GPU under `memslice run`: nvidia-ml-py, `nvitop --once` and
`gpustat --json` each see the quota as the GPU's memory, the container's process with its usage, and the
monitoring values (clocks, temperature, power, fan, utilization, ECC, modes) without an error or traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from clients import QUOTA_MIB, holding, process_mib, read_until_held, run_cmd, top

HOLDER = """
import sys
from cuda.core import Device
d = Device(0)
d.set_current()
buf = d.memory_resource.allocate(256 << 20, stream=d.default_stream)
print("held", flush=True)
sys.stdin.read()
"""

PYNVML = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
out = {
    "total": n.nvmlDeviceGetMemoryInfo(h).total >> 20,
    "procs": {p.pid: p.usedGpuMemory >> 20 for p in n.nvmlDeviceGetComputeRunningProcesses(h)},
    "graphics": len(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
    "temp": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
    "power": n.nvmlDeviceGetPowerUsage(h),
    "limit": n.nvmlDeviceGetEnforcedPowerLimit(h),
    "fan": n.nvmlDeviceGetFanSpeed(h),
    "sm": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
    "sm_max": n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
    "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
    "ecc": list(n.nvmlDeviceGetEccMode(h)),
    "persistence": n.nvmlDeviceGetPersistenceMode(h),
    "compute_mode": n.nvmlDeviceGetComputeMode(h),
    "pstate": n.nvmlDeviceGetPerformanceState(h),
    "enc": list(n.nvmlDeviceGetEncoderUtilization(h)),
}
print(json.dumps(out))
"""


def second(region, env, *cmd: str) -> subprocess.CompletedProcess[str]:
    """Another process of the same container (same region) running cmd."""
    return subprocess.run(run_cmd(region, *cmd), env=env, capture_output=True, text=True, timeout=120)


def test_pynvml_sees_quota_process_and_monitoring(tmp_path):
    with holding(tmp_path, HOLDER) as (env, proc, region):
        read_until_held(proc)
        [(pid, mib)] = process_mib(top(region, env)).items()
        out = second(region, env, sys.executable, "-c", PYNVML)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["total"] == QUOTA_MIB
        assert got["procs"] == {str(pid): mib}
        assert got["graphics"] == 0
        assert 20 <= got["temp"] <= 90 and 0 < got["power"] < got["limit"] and 0 <= got["fan"] <= 100
        assert 0 < got["sm"] <= got["sm_max"]
        assert got["util"] == 0 and got["ecc"] == [1, 1] and got["persistence"] == 1 and got["compute_mode"] == 0
        assert got["pstate"] == 0  # a context is resident
        assert got["enc"][0] == 0 and got["enc"][1] > 0
        # stable: a second look gives the same values
        again = json.loads(second(region, env, sys.executable, "-c", PYNVML).stdout)
        assert {k: v for k, v in again.items()} == got


def test_nvitop_once_without_traceback(tmp_path):
    nvitop = shutil.which("nvitop", path=str(__import__("pathlib").Path(sys.executable).parent))
    if not nvitop:
        pytest.skip("nvitop is in the test extra: pip install -e '.[test]'")
    with holding(tmp_path, HOLDER) as (env, proc, region):
        read_until_held(proc)
        [pid] = process_mib(top(region, env))
        out = second(region, env, nvitop, "--once")
        text = out.stdout + out.stderr
        assert out.returncode == 0, text
        assert "Traceback" not in text and "ERROR" not in text.upper().replace("ERRORS", ""), text
        assert f"/ {QUOTA_MIB}MiB" in text
        assert str(pid) in text
        assert "Simulated GPU" in text or "(memslice)" in text


def test_gpustat_json(tmp_path):
    gpustat = shutil.which("gpustat", path=str(__import__("pathlib").Path(sys.executable).parent))
    if not gpustat:
        pytest.skip("gpustat is in the test extra: pip install -e '.[test]'")
    with holding(tmp_path, HOLDER) as (env, proc, region):
        read_until_held(proc)
        [(pid, mib)] = process_mib(top(region, env)).items()
        out = second(region, env, gpustat, "--json")
        assert out.returncode == 0, out.stderr
        [gpu] = json.loads(out.stdout)["gpus"]
        assert gpu["memory.total"] == QUOTA_MIB
        assert gpu["memory.used"] == mib
        assert [(p["pid"], p["gpu_memory_usage"]) for p in gpu["processes"]] == [(pid, mib)]
        assert gpu["temperature.gpu"] > 0 and gpu["power.draw"] > 0 and gpu["utilization.gpu"] == 0

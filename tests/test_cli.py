"""The memslice command as a person uses it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MEMSLICE = [sys.executable, "-m", "memslice"]


def cli(*args: str, env=None, timeout=60, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MEMSLICE, *args], capture_output=True, text=True, timeout=timeout, env=env, **kw)


def test_help_lists_every_command():
    out = cli("--help")
    for cmd in ("run", "top", "paths", "demo", "sim"):
        assert cmd in out.stdout
    assert cli("--version").stdout.startswith("memslice ")


def test_a_subcommand_imports_only_its_own_module():
    """`memslice extender` builds only its own parser: a restart of the extender does not import the node
    agent, the demo or `memslice run` (issue 15 bounds the restart). --help and a wrong command still see all."""
    probe = ("import sys; from memslice.cli import main\n"
             "try:\n    main(['extender', '--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('memslice.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert "--max-limit-ratio" in out.stdout
    loaded = out.stdout.strip().splitlines()[-1]
    for other in ("memslice.plugin.cli", "memslice.demo", "memslice.run", "memslice.top"):
        assert f"'{other}'" not in loaded
    wrong = cli("extendr")
    assert wrong.returncode == 2 and "invalid choice: 'extendr'" in wrong.stderr and "node-agent" in wrong.stderr


def test_paths_json(libs):
    out = cli("paths", "--json")
    assert json.loads(out.stdout)["shim"] == libs.shim


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-mem", "4GB", "--", "true"], "--gpu-mem='4GB' is not a valid size (decimal units are ambiguous"),
    (["--gpu-mem", "0", "--", "true"], "--gpu-mem='0' is zero"),
    (["--gpu-mem", "1GiB", "--simulate-gpu", "16GiB:x", "--", "true"], "'x' is neither a NUMA node"),
    (["--gpu-mem", "1GiB", "--oversubscribe=lots", "--", "true"], "--oversubscribe='lots'"),
    (["--gpu-mem", "1GiB"], "no command given"),
])
def test_run_rejects_bad_input(args, message):
    out = cli("run", *args)
    assert out.returncode == 2
    assert message in out.stderr


def test_run_missing_command():
    out = cli("run", "--gpu-mem", "1GiB", "--", "/no/such/program")
    assert out.returncode == 127 and "command not found" in out.stderr


def test_run_holds_the_command_to_its_quota(cbin, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "MEMSLICE_SIM_STATE": str(tmp_path / "n.state"),
           "MEMSLICE_SIM_CONTEXT_OVERHEAD": "0", "MEMSLICE_CONTEXT_RESERVE": "0"}
    region = tmp_path / "r"
    out = cli("run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB", "--region-dir", str(region), "--",
              cbin["alloc_direct"], "600", "600", env=env)
    assert out.returncode == 0, out.stderr
    assert "alloc 600 MiB -> 0" in out.stdout and "alloc 600 MiB -> 2" in out.stdout
    assert "info free=424 total=1024" in out.stdout
    top = cli("top", "--json", str(region))
    snap = json.loads(top.stdout)["regions"][0]
    assert snap["devices"][0]["refused"] == 1 and snap["devices"][0]["limit_bytes"] == 1 << 30
    assert snap["devices"][0]["peak_bytes"] == 600 << 20


def test_run_propagates_exit_status():
    out = cli("run", "--gpu-mem", "1GiB", "--", "sh", "-c", "exit 7")
    assert out.returncode == 7


def test_top_shows_live_processes_with_device_and_host_bytes(tmp_path, node):
    n = node()
    region = tmp_path / "r"
    env = n.container(region, "2GiB", MEMSLICE_CONTEXT_RESERVE="0")
    holder = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "700"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        holder.stdout.readline()
        snap = json.loads(cli("top", "--json", str(region)).stdout)["regions"][0]
        (proc,) = snap["processes"]
        assert proc["pid"] == holder.pid and proc["alive"] and proc["device_bytes"] == 700 << 20
        assert proc["host_bytes"] == 0 and proc["spill_ratio"] == 0
        text = cli("top", "--once", str(region)).stdout
        assert "700MiB" in text and "running" in text and "of 2GiB quota" in text
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_top_without_region_explains():
    out = cli("top", env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "give a REGION_DIR" in out.stderr


def test_demo_runs_and_explains():
    out = cli("demo", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REFUSED" in out.stdout and "cuMemAlloc_v2 of 3.0 GiB refused" in out.stdout
    assert out.stdout.count("running") == 3 and "What you just saw" in out.stdout


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "soon"])
def test_top_refuses_a_refresh_period_it_cannot_keep(tmp_path, interval):
    out = cli("top", "--once", "--interval", interval, str(tmp_path))
    assert out.returncode == 2 and "not a refresh period in seconds from 0.1 to 3600" in out.stderr

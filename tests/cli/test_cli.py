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
    assert wrong.returncode == 2 and "'extendr' is not a memslice command" in wrong.stderr
    assert "did you mean `memslice extender`?" in wrong.stderr and "node-agent" in wrong.stderr


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
    # spill (oversubscription) is part of the story, and each figure is explained and adds up
    assert "training-c: 4396 MiB on the GPU = 300 MiB context + 4096 MiB allocated; 2048 MiB in host memory" \
        in out.stdout
    assert "11140 MiB of 16384 MiB in use = the sum of the three (11140 MiB)" in out.stdout


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "soon"])
def test_top_refuses_a_refresh_period_it_cannot_keep(tmp_path, interval):
    out = cli("top", "--once", "--interval", interval, str(tmp_path))
    assert out.returncode == 2 and "not a refresh period in seconds from 0.1 to 3600" in out.stderr


# ------------------------------------------------------- the common mistakes (issue 27 item 6): value and fix

@pytest.mark.parametrize(("args", "message"), [
    # a negative size, which argparse would take for an option ("expected one argument")
    (["--gpu-mem", "-1GiB", "--", "true"], "--gpu-mem='-1GiB' is not a valid size (a size cannot be negative)"),
    # a size split in two: the unit is not a command
    (["--gpu-mem", "4", "GiB", "--", "true"], "--gpu-mem 4 GiB: a size is one word; write --gpu-mem 4GiB"),
    (["--gpu-mem", "4", "GiB", "true"], "write --gpu-mem 4GiB"),
    # a missing `--` (and size): the program read as the size
    (["--gpu-mem", "python3", "-c", "pass"], "'python3' looks like the command: give --gpu-mem its SIZE and put `--`"),
    (["--gpu-mem", "4GiB", "--oversubscribe", "python3", "-c", "pass"],
     "'python3' looks like the command: give --oversubscribe its SIZE and put `--` before the command"),
    # the simulated GPU's size, said once and plainly
    (["--gpu-mem", "4GiB", "--simulate-gpu", "16GB", "--", "true"],
     "simulated GPU '16GB' (in '16GB') is not a GPU size (decimal units are ambiguous; write 16GiB)"),
    # quotas no GPU can give
    (["--gpu-mem", "999999TiB", "--", "true"], "--gpu-mem 999999TiB is larger than any GPU (16TiB)"),
    (["--gpu-mem", "32GiB", "--simulate-gpu", "16GiB,24GiB", "--", "true"],
     "--gpu-mem 32GiB is larger than simulated GPU 0 (16GiB): the quota is per GPU, so give at most 16GiB, or larger "
     "GPUs in --simulate-gpu"),
    (["--gpu-mem", "1.5GiB", "--", "true"], "whole numbers only: write 1536MiB"),
])
def test_run_names_the_value_and_the_fix(args, message):
    out = cli("run", *args)
    assert out.returncode == 2, out
    assert message in out.stderr
    assert "Traceback" not in out.stderr and "command not found" not in out.stderr


def test_a_mistyped_option_gets_its_commands_usage_and_the_nearest_option():
    out = cli("demo", "--elastc")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: memslice demo ")
    assert "'--elastc' (did you mean --elastic?)" in out.stderr
    top = cli("top", "--onse", "/tmp")
    assert top.stderr.startswith("usage: memslice top ") and "did you mean --once?" in top.stderr


def test_run_keeps_the_region_dir_to_its_owner(cbin, tmp_path):
    """The usage file is writable by whoever reaches it (the shim makes it so for multi-user containers):
    memslice run creates --region-dir 0700 and refuses one other users can enter."""
    import os
    import stat

    env = {"PATH": "/usr/bin:/bin", "MEMSLICE_SIM_STATE": str(tmp_path / "n.state")}
    region = tmp_path / "r"  # created (its parent must exist: tests/cli/test_cli_mistakes.py)
    out = cli("run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB", "--region-dir", str(region), "--",
              cbin["alloc_direct"], "100", env=env)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(os.stat(region).st_mode) == 0o700
    assert (region / "memslice.region").exists()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    out = cli("run", "--gpu-mem", "1GiB", "--region-dir", str(shared), "--", "true", env=env)
    assert out.returncode == 2
    assert f"--region-dir {shared} is open to other users (mode 755)" in out.stderr
    assert f"chmod 700 {shared}" in out.stderr and not list(shared.iterdir())


# ------------------------------------------------------------------------------------- top (item 5)

def test_top_into_a_closed_pipe_ends_quietly(tmp_path):
    """`memslice top --once | head`: the reader gone is not an error of ours, and no traceback."""
    import os

    region = tmp_path / "r"
    region.mkdir()
    (region / "memslice.limits").write_text("gpu_mem_limit=1GiB\n")
    r, w = os.pipe()
    os.close(r)  # the reader has gone before top writes
    try:
        p = subprocess.run([*MEMSLICE, "top", "--once", str(region)], stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=60)
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == 141


def test_top_refuses_a_folder_that_is_no_region(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    out = cli("top", "--once", str(tmp_path))
    assert out.returncode == 2
    assert f"{tmp_path} is not a memslice region directory" in out.stderr
    empty = tmp_path / "fresh"  # the node agent makes a region directory before any process runs
    empty.mkdir()
    out = cli("top", "--once", str(empty))
    assert out.returncode == 0 and "no process has used the GPU yet" in out.stdout


def test_top_counts_spill_cap_refusals_on_the_region_line_as_on_the_process_line(cbin, tmp_path):
    """With --oversubscribe=0 the host spill cap refuses; the region line and the process line agree, and
    no elastic line appears where nothing is elastic."""
    import re

    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("0\n")
    region = tmp_path / "r"
    env = {"PATH": "/usr/bin:/bin", "MEMSLICE_SIM_STATE": str(tmp_path / "n.state"),
           "MEMSLICE_SIM_CONTEXT_OVERHEAD": "0", "MEMSLICE_CONTEXT_RESERVE": "0", "MEMSLICE_CGROUP_DIR": str(cgroup),
           "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    (tmp_path / "xdg" / "memslice" / "elastic").mkdir(parents=True)  # an elastic directory with no tenant
    run = subprocess.Popen([*MEMSLICE, "run", "--gpu-mem", "256MiB", "--simulate-gpu", "1GiB", "--oversubscribe=0",
                            "--region-dir", str(region), "--", cbin["spill"], "plain", "6", "64", "hold"], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert run.stdout is not None and run.stdin is not None
        while (line := run.stdout.readline()) and "ready" not in line:  # the process holds its memory now
            pass
        top = cli("top", "--once", str(region), env=env)
        run.stdin.write("\n")
        run.stdin.flush()
    finally:
        assert run.wait(60) == 0
    assert top.returncode == 0, top.stderr
    (dev,) = [line for line in top.stdout.splitlines() if line.strip().startswith("GPU-")]
    assert dev.endswith("refused 2 (2 by the host spill cap)"), top.stdout
    (proc,) = [line for line in top.stdout.splitlines() if re.match(r"\s+\d+\s+spill", line)]
    assert proc.split()[-2] == "2", top.stdout  # REFUSED, then STATE
    assert "elastic" not in top.stdout

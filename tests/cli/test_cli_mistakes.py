"""Mistakes a newcomer makes with the `memslice` command, and what each one is told.

Every case is a plausible slip (a typo, a wrong unit, a path that is no directory, a command in the wrong
mode) run as a person runs it: the installed command in a fresh process. Each answer must be one message
that names the bad value and the fix, with the exit status the command's --help promises (2 for a bad value,
1 when something outside the command failed), and never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MEMSLICE = [sys.executable, "-m", "memslice"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MEMSLICE, *args], capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without memslice's variables, with a private temporary directory (so that
    the simulated nodes other tests make are not this one's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "KUBECONFIG"}
    env.update(TMPDIR=str(tmp), HOME=str(tmp), **extra)
    return env


def outcome(out: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    said = out.stderr + out.stdout
    assert out.returncode == code, (out.returncode, said)
    assert "Traceback" not in said, said
    for w in words:
        assert w in said, (w, said)


# (id, argv, exit status, what the answer must say: the value and the fix)
MISTAKES = [
    # ---- memslice run: sizes
    ("underscore-option", ["run", "--gpu_mem", "4096", "--", "true"], 2,
     ["'--gpu_mem'", "did you mean --gpu-mem?"]),
    ("capital-option", ["run", "--GPU-MEM", "4096", "--", "true"], 2, ["'--GPU-MEM'", "did you mean --gpu-mem?"]),
    ("underscore-after-a-value", ["run", "--gpu-mem", "4096", "--simulate_gpu", "16GiB", "--", "true"], 2,
     ["'--simulate_gpu'", "did you mean --simulate-gpu?"]),
    ("decimal-unit", ["run", "--gpu-mem", "4GB", "--", "true"], 2, ["'4GB'", "write 4GiB"]),
    ("lowercase-g", ["run", "--gpu-mem", "4g", "--", "true"], 2, ["'4g'", "write 4GiB"]),
    ("megabytes", ["run", "--gpu-mem", "4096MB", "--", "true"], 2, ["'4096MB'", "write 4096MiB"]),
    ("fraction", ["run", "--gpu-mem", "1.5GiB", "--", "true"], 2, ["'1.5GiB'", "write 1536MiB"]),
    ("zero-quota", ["run", "--gpu-mem", "0", "--", "true"], 2, ["'0' is zero"]),
    ("negative-quota", ["run", "--gpu-mem", "-4GiB", "--", "true"], 2, ["'-4GiB'", "cannot be negative"]),
    ("size-in-two-words", ["run", "--gpu-mem", "4", "GiB", "--", "true"], 2, ["write --gpu-mem 4GiB"]),
    ("absurd-quota", ["run", "--gpu-mem", "999999TiB", "--", "true"], 2, ["999999TiB", "larger than any GPU"]),
    ("words-not-a-size", ["run", "--gpu-mem", "lots", "--", "true"], 2, ["'lots'", "4GiB"]),
    ("request-above-limit", ["run", "--gpu-mem", "4GiB", "--gpu-mem-request", "8GiB", "--", "true"], 2,
     ["--gpu-mem-request 8GiB is above --gpu-mem 4GiB"]),
    ("idle-after-negative", ["run", "--gpu-mem", "4GiB", "--gpu-mem-request", "1GiB", "--idle-after=-5", "--", "true"],
     2, ["--idle-after -5", "between 0 and 604800"]),
    ("idle-after-words", ["run", "--gpu-mem", "4GiB", "--idle-after", "soon", "--", "true"], 2,
     ["--idle-after", "'soon' is not a number of seconds"]),
    ("spill-negative", ["run", "--gpu-mem", "4GiB", "--oversubscribe=-1GiB", "--", "true"], 2,
     ["'-1GiB'", "cannot be negative"]),
    ("spill-words", ["run", "--gpu-mem", "4GiB", "--oversubscribe=lots", "--", "true"], 2,
     ["'lots'", "--oversubscribe=SIZE"]),
    # ---- memslice run: the simulated GPU
    ("sim-zero", ["run", "--gpu-mem", "1GiB", "--simulate-gpu", "0", "--", "true"], 2,
     ["simulated GPU '0'", "has no memory", "e.g. 16GiB"]),
    ("sim-zero-gib", ["run", "--gpu-mem", "1GiB", "--simulate-gpu", "0GiB", "--", "true"], 2, ["has no memory"]),
    ("sim-absurd", ["run", "--gpu-mem", "1GiB", "--simulate-gpu", "9999TiB", "--", "true"], 2,
     ["'9999TiB'", "larger than any GPU"]),
    ("sim-empty", ["run", "--gpu-mem", "1GiB", "--simulate-gpu=", "--", "true"], 2, ["empty", "--simulate-gpu 16GiB"]),
    ("sim-decimal", ["run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GB", "--", "true"], 2, ["'16GB'", "16GiB"]),
    ("sim-bad-numa", ["run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB:99", "--", "true"], 2,
     ["'99' is neither a NUMA node (0-63) nor 'mig'"]),
    ("sim-typo-mig", ["run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB:mog", "--", "true"], 2, ["'mog'"]),
    ("quota-above-smallest-sim-gpu", ["run", "--gpu-mem", "17GiB", "--simulate-gpu", "16GiB,24GiB", "--", "true"], 2,
     ["--gpu-mem 17GiB is larger than simulated GPU 0 (16GiB)", "per GPU"]),
    ("quota-above-sim-gpu", ["run", "--gpu-mem", "32GiB", "--simulate-gpu", "16GiB", "--", "true"], 2,
     ["larger than simulated GPU 0"]),
    # ---- memslice run: the command and the region directory
    ("no-separator", ["run", "--gpu-mem", "python3", "-c", "pass"], 2, ["'python3' looks like the command", "--"]),
    ("no-command", ["run", "--gpu-mem", "1GiB"], 2, ["no command given", "-- CMD"]),
    ("no-command-after-separator", ["run", "--gpu-mem", "1GiB", "--"], 2, ["no command given"]),
    ("no-quota", ["run", "--", "true"], 2, ["--gpu-mem"]),
    ("missing-program", ["run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB", "--", "/no/such/program"], 127,
     ["command not found: /no/such/program"]),
    ("region-dir-is-a-file", ["run", "--gpu-mem", "1GiB", "--region-dir", "/etc/passwd", "--", "true"], 2,
     ["--region-dir /etc/passwd is a file, not a directory"]),
    ("region-dir-empty", ["run", "--gpu-mem", "1GiB", "--region-dir", "", "--", "true"], 2,
     ["--region-dir '' is empty"]),
    ("region-dir-no-parent", ["run", "--gpu-mem", "1GiB", "--region-dir", "/nonexistent/dir/x", "--", "true"], 2,
     ["its parent /nonexistent/dir does not exist", "create it first"]),
    ("verbose-typo", ["run", "--verbsoe", "--gpu-mem", "1GiB", "--", "true"], 2, ["did you mean --verbose?"]),
    # ---- memslice sim
    ("sim-no-subcommand", ["sim"], 2, ["name a subcommand", "xid", "status"]),
    ("sim-unknown-subcommand", ["sim", "fault"], 2, ["'fault'", "xid", "status"]),
    ("xid-negative", ["sim", "xid", "--gpu", "0", "--xid=-3"], 2, ["--xid -3 is not an Xid", "e.g. 79"]),
    ("xid-zero", ["sim", "xid", "--gpu", "0", "--xid", "0"], 2, ["--xid 0 is not an Xid"]),
    ("xid-gpu-negative", ["sim", "xid", "--gpu=-1", "--xid", "79"], 2, ["--gpu -1", "start at 0"]),
    ("xid-no-node-yet", ["sim", "xid", "--gpu", "0", "--xid", "79"], 2,
     ["no simulated GPU has run yet", "memslice run", "--simulate-gpu", "--state PATH"]),
    ("xid-state-empty", ["sim", "xid", "--gpu", "0", "--xid", "79", "--state", ""], 2, ["path is empty", "--state"]),
    ("xid-state-missing", ["sim", "xid", "--gpu", "0", "--xid", "79", "--state", "/nonexistent.state"], 2,
     ["/nonexistent.state does not exist"]),
    ("xid-state-is-a-dir", ["sim", "xid", "--gpu", "0", "--xid", "79", "--state", "/tmp"], 2,
     ["--state /tmp is a directory"]),
    ("status-no-node", ["sim", "status", "--state", "/nonexistent.state"], 2, ["/nonexistent.state does not exist"]),
    # ---- memslice top
    ("top-missing-dir", ["top", "--once", "/nonexistent/region"], 2, ["/nonexistent/region"]),
    ("top-interval-zero", ["top", "--once", "--interval", "0", "/tmp"], 2, ["refresh period"]),
    ("top-typo", ["top", "--onse", "/tmp"], 2, ["did you mean --once?"]),
    # ---- the command itself
    ("unknown-command", ["runn", "--gpu-mem", "1GiB"], 2, ["'runn' is not a memslice command", "memslice run"]),
    ("unknown-command-far", ["launch"], 2, ["'launch' is not a memslice command", "run, top"]),
    ("demo-typo", ["demo", "--elastc"], 2, ["did you mean --elastic?"]),
    ("paths-typo", ["paths", "--jsn"], 2, ["did you mean --json?"]),
    # ---- the node agent: each refused before it starts (exit 2, as its --help says)
    ("agent-sim-decimal", ["node-agent", "--simulate", "16GB"], 2, ["--simulate='16GB' is not valid", "16GiB"]),
    ("agent-sim-zero", ["node-agent", "--simulate=0"], 2, ["--simulate='0' is not valid", "has no memory"]),
    ("agent-unit-zero", ["node-agent", "--simulate", "16GiB", "--unit-mib", "0"], 2, ["unit", "'0'"]),
    ("agent-port", ["node-agent", "--simulate", "16GiB", "--metrics-port", "70000"], 2, ["70000", "TCP port"]),
    ("agent-log-level", ["node-agent", "--simulate", "16GiB", "--log-level", "loud"], 2,
     ["'loud'", "debug, info, warning or error"]),
    ("agent-kubelet-api", ["node-agent", "--simulate", "16GiB", "--kubelet-api", "cri"], 2, ["'cri'"]),
    ("agent-underscore", ["node-agent", "--unit_mib", "4"], 2, ["did you mean --unit-mib?"]),
    # ---- the extender's certificates
    ("certs-unwritable", ["extender-certs", "--out-dir", "/proc/nope"], 2,
     ["cannot write the certificates in --out-dir /proc/nope", "name a directory you can write"]),
    ("certs-empty-dir", ["extender-certs", "--out-dir", ""], 2, ["--out-dir '' is empty"]),
    ("certs-days", ["extender-certs", "--days", "0", "--out-dir", "/tmp/x"], 2, ["--days=0", "1..36500"]),
    ("certs-no-kubeconfig", ["extender-certs", "--kubeconfig", "/nonexistent/kubeconfig"], 2,
     ["/nonexistent/kubeconfig"]),
]


def test_at_least_fifty_mistakes_are_tried():
    assert len(MISTAKES) >= 50 and len({m[0] for m in MISTAKES}) == len(MISTAKES)


@pytest.mark.parametrize(("argv", "code", "words"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_each_mistake_gets_the_value_and_the_fix(tmp_path, argv, code, words):
    outcome(cli(*argv, env=clean_env(tmp_path)), code, *words)


def test_run_without_a_driver_says_so_and_names_the_simulated_gpu(tmp_path):
    """No libcuda.so.1 anywhere on the library path (this machine has no NVIDIA driver): the command still
    runs, but the user is told why it will find no GPU and how to try memslice without one."""
    env = clean_env(tmp_path)
    env.pop("LD_LIBRARY_PATH", None)
    out = cli("run", "--gpu-mem", "1GiB", "--", "true", env=env)
    outcome(out, 0, "no NVIDIA driver found", "--simulate-gpu 16GiB")
    sim = cli("run", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB", "--", "true", env=env)
    outcome(sim, 0)
    assert "no NVIDIA driver" not in sim.stderr


def test_sim_finds_the_node_memslice_run_made_and_says_where_it_is(tmp_path):
    """The tour's order: `memslice run --simulate-gpu` and then `memslice sim xid` with no --state. run -v
    prints the state file; sim finds the same one by default; a second GPU list makes sim ask which."""
    env = clean_env(tmp_path)
    run = cli("run", "-v", "--gpu-mem", "1GiB", "--simulate-gpu", "16GiB", "--", sys.executable, "-c",
              "import ctypes; assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0", env=env)
    outcome(run, 0, "simulated GPU state ")
    state = run.stderr.split("simulated GPU state ", 1)[1].split()[0]
    assert Path(state).parent == tmp_path and Path(state).is_file()
    outcome(cli("sim", "xid", "--gpu", "0", "--xid", "79", env=env), 0)
    outcome(cli("sim", "xid", "--gpu", "5", "--xid", "79", env=env), 2, "no such GPU")
    cli("run", "--gpu-mem", "1GiB", "--simulate-gpu", "24GiB", "--", sys.executable, "-c",
        "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)", env=env)
    outcome(cli("sim", "xid", "--gpu", "0", "--xid", "79", env=env), 2, "several simulated nodes", state)


def test_the_installed_command_does_not_load_kubernetes_validate(tmp_path):
    """The console script (`memslice`, not `python -m memslice`) keeps kubernetes_validate out too: it costs
    2.5 s of CPU in every process that talks to the API server."""
    probe = ("import sys\nfrom memslice.cli import main\nimport kubernetes.dynamic  # noqa\n"
             "print('kubernetes_validate' in sys.modules and sys.modules['kubernetes_validate'] is not None)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"

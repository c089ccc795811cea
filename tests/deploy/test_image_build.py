"""The container image recipe, without a Docker engine.

Every build step of the Dockerfile is `deploy/image/build.sh`; this runs the same script into a temporary
prefix (as `docker build` runs it into /opt/memslice) and checks the result the image would contain, and
checks that the Dockerfile runs nothing but that script to build.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import build_cache
import pytest

import memslice

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "image" / "build.sh"
DOCKERFILE = ROOT / "Dockerfile"
PREFIX = "/opt/memslice"


# The fixture builds the whole image (minutes): every test of this module on one xdist worker, so it runs once.
pytestmark = [pytest.mark.xdist_group("image"), pytest.mark.timeout(900)]


def image_inputs_digest() -> str:
    """The hash of what build.sh reads: the source paths it stages (less what it drops as generated, and the
    checkout's build outputs), the script itself, the Python it installs for and the C compiler."""
    m = re.search(r"for p in ([^;]+); do", BUILD.read_text())
    assert m, "build.sh's list of staged paths"

    def generated(rel: str) -> bool:
        name = Path(rel).name
        return (rel.startswith("interposer/build") or name.endswith((".pyc", "_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))
                or (rel.startswith("scheduler_extender/") and name.endswith(".so")) or ".egg-info" in rel)

    cc = subprocess.run(["cc", "--version"], capture_output=True, text=True, timeout=30).stdout
    return build_cache.tree_digest(ROOT, [*m.group(1).split(), "deploy/image/build.sh"], generated,
                                   extra=[sys.version, sys.executable, cc])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """deploy/image/build.sh all DEST: native libraries and the app, as a developer build does. The prefix is
    cached by the hash of its inputs (tests/support/build_cache.py): rebuilt when a source changes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    env["PYTHON"] = sys.executable

    def build(entry: Path) -> None:
        dest = entry / "opt-memslice"
        out = subprocess.run(["bash", str(BUILD), "all", str(dest)], env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, f"build.sh failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"

    fresh = tmp_path_factory.mktemp("image")
    with build_cache.cached_build("image", image_inputs_digest(), build, fresh) as (entry, _):
        yield entry / "opt-memslice"


def image_env(dest: Path) -> dict[str, str]:
    """The runtime environment the Dockerfile sets, with /opt/memslice at `dest`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    env["PATH"] = f"{dest}/venv/bin:{env.get('PATH', '/usr/bin:/bin')}"
    env["MEMSLICE_LIB_DIR"] = str(dest / "lib")
    return env


def test_memslice_version_runs_from_the_built_prefix(built: Path) -> None:
    out = subprocess.run([str(built / "venv" / "bin" / "memslice"), "--version"], env=image_env(built),
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"memslice {memslice.__version__}"


def test_every_subcommand_is_installed(built: Path) -> None:
    """The image serves the node agent and the extender: their modules and the gRPC stubs are packaged."""
    out = subprocess.run([str(built / "venv" / "bin" / "memslice"), "--help"], env=image_env(built),
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    from memslice.cli import SUBCOMMANDS

    commands = {name for name, module in SUBCOMMANDS.items() if importlib.util.find_spec(module)}
    assert {"node-agent", "extender"} <= commands
    for cmd in commands:  # every subcommand of this checkout, in the image too
        assert re.search(rf"^\s+{re.escape(cmd)}\s", out.stdout, re.M), f"no `memslice {cmd}`:\n{out.stdout}"
    code = ("import memslice, memslice.proto.api_pb2, memslice.plugin.cli, memslice.scheduler_extender.cli;"
            "print(memslice.__file__)")
    out = subprocess.run([str(built / "venv" / "bin" / "python"), "-c", code], env=image_env(built),
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(built / "venv"), "installed into the prefix, not editable"


def test_native_libraries_are_in_place_and_load(built: Path) -> None:
    lib = built / "lib"
    for name in ("libmemslice.so", "libmemslice-region.so", "sim/libcuda.so.1", "sim/libnvidia-ml.so.1"):
        assert (lib / name).read_bytes()[:4] == b"\x7fELF", name
    # the shim loads into an ordinary process (what the kubelet's mount + ld.so.preload do to a container)
    out = subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(lib / "libmemslice.so"), "LD_BIND_NOW": "1"},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "cannot be preloaded" not in out.stderr, out.stderr


def test_the_extenders_extension_module_is_built_into_the_prefix(built: Path) -> None:
    """The node-name index is compiled for the venv's Python (not copied from an editable build in the
    checkout), and the extender's memo uses it rather than falling back to Python."""
    code = ("from memslice.scheduler_extender.index import _nameids, nameids; print(_nameids.__file__); "
            "print(type(nameids.name_ids()).__name__)")
    out = subprocess.run([str(built / "venv" / "bin" / "python"), "-c", code], env=image_env(built),
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    path, kind = out.stdout.split()
    assert Path(path).is_relative_to(built / "venv") and kind == "NativeNameIds", out.stdout + out.stderr


def test_the_cli_finds_the_prefix_libraries(built: Path) -> None:
    """MEMSLICE_LIB_DIR (set in the image) makes the node agent install the shim from /opt/memslice/lib."""
    code = "from memslice.paths import lib_paths; p = lib_paths(); print(p.shim); print(p.sim_nvml)"
    out = subprocess.run([str(built / "venv" / "bin" / "python"), "-c", code], env=image_env(built),
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(built / "lib" / "libmemslice.so"),
                                  str(built / "lib" / "sim" / "libnvidia-ml.so.1")]


def test_build_leaves_no_staging_tree_and_no_pip(built: Path) -> None:
    assert not (built / ".build-src").exists()
    assert not list((built / "venv").glob("lib/python3*/site-packages/pip"))


# ---------------------------------------------------------------------------------------- Dockerfile


def dockerfile_stages() -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """[(base image, stage name, [(INSTRUCTION, arguments)])], continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[tuple[str, str | None, list[tuple[str, str]]]] = []
    args: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif instr == "FROM":
            words = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest).split()
            stages.append((words[0], words[2] if len(words) > 2 and words[1].upper() == "AS" else None, []))
        else:
            stages[-1][2].append((instr, rest.strip()))
    return stages


def test_dockerfile_builds_only_with_build_sh() -> None:
    stages = dockerfile_stages()
    assert [name for _, name, _ in stages] == ["native", "app", None]
    # the app step compiles the extender's extension module: a base with gcc and Python's headers, whose
    # Python is the runtime stage's (python:3.11-slim copies the venv it builds)
    assert stages[1][0] == "python:3.11"
    for (_, name, instrs), step in zip(stages[:2], ("native", "app"), strict=True):
        runs = [shlex.split(rest) for instr, rest in instrs if instr == "RUN"]
        assert runs, f"stage {name} builds nothing"
        for argv in runs:
            cmd = [w for w in argv if "=" not in w or w.startswith("/")]  # drop VAR=value prefixes
            assert cmd[:3] == ["deploy/image/build.sh", step, PREFIX], f"stage {name} runs {argv}"


def test_final_image_is_slim_non_root_and_runs_memslice() -> None:
    base, _, instrs = dockerfile_stages()[-1]
    assert base == "python:3.11-slim"
    assert ("COPY", f"--from=app {PREFIX} {PREFIX}") in instrs
    (user,) = [rest for instr, rest in instrs if instr == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    (entry,) = [rest for instr, rest in instrs if instr == "ENTRYPOINT"]
    assert entry == '["memslice"]'
    env = " ".join(rest for instr, rest in instrs if instr == "ENV")
    assert f"MEMSLICE_LIB_DIR={PREFIX}/lib" in env
    assert f"PATH={PREFIX}/venv/bin:" in env
    runs = [rest for instr, rest in instrs if instr == "RUN"]
    assert all(r.startswith("useradd ") for r in runs), "the final stage installs nothing"


def test_dockerignore_keeps_what_build_sh_copies() -> None:
    """The build context must hold every source path build.sh stages (a .dockerignore slip breaks
    `docker build`, which no test here can run)."""
    m = re.search(r"for p in ([^;]+); do", BUILD.read_text())
    assert m
    needed = m.group(1).split() + ["deploy/image/build.sh"]
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    for path in needed:
        assert (ROOT / path).exists(), f"build.sh copies {path}, which does not exist"
        for pat in patterns:
            assert not fnmatch.fnmatch(path, pat.rstrip("/")), f".dockerignore pattern {pat} drops {path}"

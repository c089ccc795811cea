"""Build hooks: compile the C libraries and generate the gRPC stubs before packaging, and build the one C
extension module (the extender's node-name index, scheduler_extender/index/_nameids.c).

Why a setup.py at all: setuptools has no declarative way to run `make` or `grpc_tools.protoc`
as part of `pip install .`; this file only adds that step and leaves all metadata in pyproject.toml.
"""

from __future__ import annotations

import os
import pathlib
import runpy
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent


def build_native() -> None:
    """Compile libmemslice.so and the simulated libcuda/libnvidia-ml into interposer/build/."""
    if os.environ.get("MEMSLICE_SKIP_NATIVE") == "1":  # developer escape hatch: Python-only reinstall
        return
    subprocess.run(["make", "-C", str(ROOT / "interposer"), "-j2"], check=True)


def build_protos() -> None:
    """Generate the gRPC stubs (proto/generate.py; grpcio-tools is a build requirement)."""
    runpy.run_path(str(ROOT / "proto" / "generate.py"), run_name="memslice_proto_generate")["generate"](
        ROOT / "proto")


class BuildPy(build_py):
    def run(self) -> None:
        build_native()
        build_protos()
        super().run()


# pyproject lists interposer/build and build/sim as (data) packages, and setuptools checks that a package's
# folder exists before any build step runs (egg_info): on a fresh clone they exist only once make has run.
(ROOT / "interposer" / "build" / "sim").mkdir(parents=True, exist_ok=True)

# Compiled like the C libraries (warnings are errors). Not optional: without it the extender still answers
# the same (scheduler_extender/index/nameids.py falls back to Python, and logs so), only slower at thousands of
# names per filter, and a silent fallback in an image would be a performance bug nobody sees.
NAMEIDS = Extension("memslice.scheduler_extender.index._nameids", ["scheduler_extender/index/_nameids.c"],
                    extra_compile_args=["-Wall", "-Wextra", "-Werror", "-Wmissing-prototypes", "-O2"])

setup(cmdclass={"build_py": BuildPy}, ext_modules=[NAMEIDS])

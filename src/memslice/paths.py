"""Where the built C libraries live (the shim and the simulated driver)."""

from __future__ import annotations

import os
import pathlib
from dataclasses import asdict, dataclass

from . import errors


@dataclass(frozen=True)
class LibPaths:
    shim: str        # libmemslice.so, the LD_PRELOAD interposer
    sim_dir: str     # directory holding the simulated libcuda.so.1 and libnvidia-ml.so.1
    sim_cuda: str
    sim_nvml: str
    include: str     # headers, memslice_region.h among them (read by cffi)

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class LibraryMissing(errors.UnavailableError):
    pass


def lib_dir() -> pathlib.Path:
    """The build directory: MEMSLICE_LIB_DIR if set, else the one inside the installed package."""
    override = os.environ.get("MEMSLICE_LIB_DIR")
    if override:
        return pathlib.Path(override)
    import memslice.interposer as pkg

    return pathlib.Path(pkg.__file__).resolve().parent / "build"


def lib_paths() -> LibPaths:
    d = lib_dir()
    shim = d / "libmemslice.so"
    if not shim.exists():
        raise LibraryMissing(
            f"{shim} is missing: build it with `make -C interposer` or reinstall memslice (`pip install .`)")
    sim = d / "sim"
    include = pathlib.Path(__file__).resolve().parent
    import memslice.interposer as pkg

    include = pathlib.Path(pkg.__file__).resolve().parent / "include"
    return LibPaths(shim=str(shim), sim_dir=str(sim), sim_cuda=str(sim / "libcuda.so.1"),
                    sim_nvml=str(sim / "libnvidia-ml.so.1"), include=str(include))

#!/usr/bin/env python3
"""Generate the simulated driver's export lists from the public headers of a CUDA toolkit.

    python interposer/sim/gen_exports.py [--include DIR] [--check]

Reads cuda.h, cudaTypedefs.h and nvml.h (by default from the `nvidia-cuda-runtime` and `nvidia-nvml-dev`
wheels of the test extra) through the C preprocessor, so every `#define cuFoo cuFoo_v2` is applied exactly as a
compiler applies it, and writes two X-macro files that the build compiles without needing the headers:

  cuda_exports.def  SIM_STUB(name) for every function cuda.h declares in its three modes (default, per-thread
                    default stream, and __CUDA_API_VERSION_INTERNAL, which declares the legacy ABI names the
                    driver keeps exporting: cuMemAlloc next to cuMemAlloc_v2), then SIM_PROC(base, version,
                    ptds, symbol) for cuGetProcAddress: which ABI symbol serves which PFN_<base>_v<version>.
  nvml_exports.def  SIM_STUB(name) for every function nvml.h declares, versioned and legacy.

The simulator defines each stub weakly (returning CUDA_ERROR_NOT_SUPPORTED / NVML_ERROR_NOT_SUPPORTED); what it
models is a strong definition that replaces the stub at link time. `--check` regenerates into memory and exits 1
if the committed files differ (tests/sim/test_sim_exports.py runs it).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
import sysconfig

HERE = pathlib.Path(__file__).resolve().parent
CUDA_DEF = HERE / "cuda_exports.def"
NVML_DEF = HERE / "nvml_exports.def"

CUDA_DECL = re.compile(r"(?<![\w*])CUresult\s+(cu\w+)\s*\(")
NVML_DECL = re.compile(r"(?<![\w*])(?:nvmlReturn_t|const\s+char\s*\*)\s*(nvml\w+)\s*\(")
PFN = re.compile(r"typedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(\w+?)_v(\d+)(_ptds|_ptsz)?\s*\)")
SUFFIX = re.compile(r"^(\w+?)(?:_v(\d+))?(_ptds|_ptsz)?$")


def find_include() -> pathlib.Path:
    """The wheel's include directory (nvidia/cu13/include, or an older nvidia/<pkg>/include layout)."""
    site = pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    for cand in sorted(site.glob("*/include"), reverse=True):
        if (cand / "cuda.h").is_file() and (cand / "nvml.h").is_file():
            return cand
    cuda = next(iter(sorted(site.glob("*/include/cuda.h"), reverse=True)), None)
    if cuda and (cuda.parent / "nvml.h").is_file():
        return cuda.parent
    raise SystemExit(f"no cuda.h + nvml.h under {site}: pip install nvidia-cuda-runtime nvidia-nvml-dev "
                     "(the test extra), or pass --include DIR")


def preprocess(include: pathlib.Path, source: str, *defines: str) -> str:
    """cc -E of `source` with the toolkit's include directory first on the path."""
    cmd = ["cc", "-E", "-P", f"-I{include}", *(f"-D{d}" for d in defines), "-x", "c", "-"]
    out = subprocess.run(cmd, input=source, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def declared(text: str, pattern: re.Pattern[str]) -> set[str]:
    """Names of functions declared (not defined static inline) in preprocessed text."""
    names = set()
    for m in pattern.finditer(text):
        head = text[max(0, m.start() - 40):m.start()]
        if "static" in head.split(";")[-1].split("}")[-1]:
            continue
        names.add(m.group(1))
    return names


def expand(include: pathlib.Path, bases: list[str], *defines: str) -> dict[str, str]:
    """What each base name becomes after cuda.h's macros, in one mode."""
    body = "#include <cuda.h>\n" + "".join(f"@@ {i} @@ {b}\n" for i, b in enumerate(bases))
    out = preprocess(include, body, *defines)
    got = {}
    for line in out.splitlines():
        m = re.match(r"@@ (\d+) @@\s+(\w+)", line.strip())
        if m:
            got[bases[int(m.group(1))]] = m.group(2)
    return got


def ladder(symbol: str, versions: list[int], exports: set[str]) -> list[tuple[int, str]]:
    """Match versions (oldest first) to ABI names: the newest is `symbol` (base_vK[_ptsz]), older ones step
    down one ABI suffix each (base_v{K-1}, ..., base). Names the headers do not declare are dropped."""
    m = SUFFIX.match(symbol)
    assert m
    base, k, tail = m.group(1), int(m.group(2) or 1), m.group(3) or ""
    while f"{base}_v{k + 1}{tail}" in exports:  # a newer ABI the header names explicitly (cuStreamGetCtx_v2)
        k += 1
    rows = []
    for i, ver in enumerate(reversed(versions)):
        level = k - i
        if level < 1:
            break
        name = f"{base}{'' if level == 1 else f'_v{level}'}{tail}"
        if name in exports:
            rows.append((ver, name))
    return sorted(rows)


def cuda_def(include: pathlib.Path) -> str:
    src = "#include <cuda.h>\n"
    exports = set()
    for defines in ((), ("CUDA_API_PER_THREAD_DEFAULT_STREAM",), ("__CUDA_API_VERSION_INTERNAL",)):
        exports |= declared(preprocess(include, src, *defines), CUDA_DECL)
    typedefs = (include / "cudaTypedefs.h").read_text()
    pfn: dict[tuple[str, bool], list[int]] = {}
    for m in PFN.finditer(typedefs):
        pfn.setdefault((m.group(1), bool(m.group(3))), []).append(int(m.group(2)))
    bases = sorted({b for b, _ in pfn})
    plain = expand(include, bases)
    ptds = expand(include, bases, "CUDA_API_PER_THREAD_DEFAULT_STREAM")
    procs = []
    for (base, is_ptds), versions in sorted(pfn.items()):
        symbol = (ptds if is_ptds else plain).get(base, base)
        for ver, name in ladder(symbol, sorted(set(versions)), exports):
            procs.append(f'SIM_PROC("{base}", {ver}, {int(is_ptds)}, {name})')
    head = ("/* Generated by interposer/sim/gen_exports.py from cuda.h and cudaTypedefs.h: do not edit. */\n"
            "#ifndef SIM_PROC\n#define SIM_PROC(base, ver, ptds, sym)\n#endif\n"
            "#ifndef SIM_STUB\n#define SIM_STUB(sym)\n#endif\n")
    return head + "".join(f"SIM_STUB({n})\n" for n in sorted(exports)) + "".join(p + "\n" for p in procs)


def nvml_def(include: pathlib.Path) -> str:
    src = "#include <nvml.h>\n"
    exports = set()
    for defines in ((), ("NVML_NO_UNVERSIONED_FUNC_DEFS",)):
        exports |= declared(preprocess(include, src, *defines), NVML_DECL)
    head = ("/* Generated by interposer/sim/gen_exports.py from nvml.h: do not edit. */\n"
            "#ifndef SIM_STUB\n#define SIM_STUB(sym)\n#endif\n")
    return head + "".join(f"SIM_STUB({n})\n" for n in sorted(exports))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--include", type=pathlib.Path, help="directory holding cuda.h, cudaTypedefs.h and nvml.h")
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = ap.parse_args()
    include = args.include or find_include()
    wanted = {CUDA_DEF: cuda_def(include), NVML_DEF: nvml_def(include)}
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p} is out of date with {include}; run {sys.argv[0]} and commit", file=sys.stderr)
        return 1 if stale else 0
    for p, text in wanted.items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

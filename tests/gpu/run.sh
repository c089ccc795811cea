#!/bin/sh
# The real-GPU check kit, offline (docs/operations.md, "Checking a real GPU"): builds the shim with this
# machine's compiler (make -C interposer), imports memslice from the source tree without installing it (a
# temporary tree of links with the installed package layout on PYTHONPATH, as pyproject's package-dir maps
# it), and runs `pytest -rA -s tests/gpu` with this machine's own Python (PYTHON, default python3), which
# brings the frameworks (PyTorch, JAX, CuPy), pytest and nvidia-ml-py. No pip, no network.
#
#   tests/gpu/run.sh [pytest args]          e.g. tests/gpu/run.sh -k spill
#
# Every figure is printed ("[gpu-check] ...") and appended as a JSON line to MEMSLICE_GPU_FIGURES (default
# build/gpu-figures.jsonl). Every check bounds its children; the whole run is cut at MEMSLICE_GPU_KIT_TIMEOUT
# seconds (default 480) so that it can never hang. Without an NVIDIA driver and a GPU every check skips,
# saying why.
set -eu
ROOT=$(CDPATH='' cd -- "$(dirname -- "$0")/../.." && pwd)
PY=${PYTHON:-python3}
LIMIT=${MEMSLICE_GPU_KIT_TIMEOUT:-480}

if ! "$PY" -c 'import pytest' 2>/dev/null; then
    echo "gpu kit: $PY cannot import pytest; run with PYTHON=<a python that has pytest> $0" >&2
    exit 2
fi
make -s -C "$ROOT/interposer" ${CC:+CC="$CC"}

PP=$(mktemp -d "${TMPDIR:-/tmp}/memslice-gpukit.XXXXXX")
trap 'rm -rf "$PP"' EXIT INT TERM
mkdir "$PP/memslice"
for f in "$ROOT"/src/memslice/*.py "$ROOT/src/memslice/kube"; do ln -s "$f" "$PP/memslice/"; done
for d in plugin scheduler_extender interposer proto; do ln -s "$ROOT/$d" "$PP/memslice/$d"; done
PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}"
MEMSLICE_GPU_FIGURES=${MEMSLICE_GPU_FIGURES:-$ROOT/build/gpu-figures.jsonl}
export PYTHONPATH MEMSLICE_GPU_FIGURES
mkdir -p "$(dirname -- "$MEMSLICE_GPU_FIGURES")"
echo "gpu kit: $("$PY" --version 2>&1) ($(command -v "$PY")), memslice from $ROOT, figures to $MEMSLICE_GPU_FIGURES"

cd "$ROOT"
set -- -rA -s -p no:cacheprovider --confcutdir=tests/gpu -W ignore::pytest.PytestConfigWarning tests/gpu "$@"
rc=0
if command -v timeout >/dev/null 2>&1; then
    timeout -k 30 -s INT "$LIMIT" "$PY" -m pytest "$@" || rc=$?
else
    "$PY" -m pytest "$@" || rc=$?
fi
[ "$rc" -ne 124 ] || echo "gpu kit: stopped after $LIMIT s (MEMSLICE_GPU_KIT_TIMEOUT)" >&2
exit "$rc"

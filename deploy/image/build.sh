#!/usr/bin/env bash
# Build memslice into a self-contained prefix. The Dockerfile runs exactly this script, and so does
# tests/deploy/test_image_build.py, so the image recipe is tested without a Docker engine.
#
#   deploy/image/build.sh native DEST   compile the C libraries (make -C interposer) into DEST/lib
#   deploy/image/build.sh app DEST      install the Python app into the virtualenv DEST/venv, packaging
#                                       the libraries from DEST/lib when a native step ran before
#   deploy/image/build.sh all DEST      both, with the same compiler and C library (a developer build)
#
# Result:
#   DEST/lib/libmemslice.so, DEST/lib/libmemslice-region.so     the shim and the region library
#   DEST/lib/sim/libcuda.so.1, DEST/lib/sim/libnvidia-ml.so.1   the simulated GPU
#   DEST/venv/bin/memslice                                       the CLI (run with MEMSLICE_LIB_DIR=DEST/lib)
#
# Why two steps: libmemslice.so is loaded into *workload* containers, whose C library may be older than
# ours. The image compiles it on the oldest glibc we support (2.28, manylinux_2_28) and only then installs
# the app on python:3.11 (for the runtime's python:3.11-slim); a library linked against a newer glibc would
# need symbol versions (e.g. dlsym@GLIBC_2.34) that an Ubuntu 20.04 or UBI 8 container does not have. The
# app step compiles the extender's extension module (scheduler_extender/index/_nameids.c) for the Python it
# installs into, so it needs a C compiler and Python's headers too.
#
# Environment: SRC (default: the repository this script is in), PYTHON (default: python3),
# PIP_* variables are honoured by pip as usual (PIP_INDEX_URL, PIP_FIND_LINKS, ...).
set -euo pipefail

usage() { echo "usage: $0 native|app|all DEST" >&2; exit 2; }
[ $# -eq 2 ] || usage
step=$1
DEST=$(mkdir -p "$2" && cd "$2" && pwd)
SRC=${SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PYTHON=${PYTHON:-python3}
STAGE="$DEST/.build-src"

# Copy the sources into a private staging tree (never build in the caller's checkout) and drop
# anything generated, so every build starts from sources only.
stage_sources() {
    rm -rf "$STAGE"
    mkdir -p "$STAGE"
    local p
    for p in pyproject.toml setup.py README.md src plugin scheduler_extender interposer proto; do
        if [ -e "$SRC/$p" ]; then cp -R "$SRC/$p" "$STAGE/$p"; fi
    done
    rm -rf "$STAGE/interposer/build"
    find "$STAGE/scheduler_extender" -name "*.so" -delete  # extension modules built in place by editable installs
    find "$STAGE" \( -name __pycache__ -o -name '*_pb2.py' -o -name '*_pb2_grpc.py' -o -name '*_pb2.pyi' \) \
        -prune -exec rm -rf {} +
}

build_native() {
    stage_sources
    make -C "$STAGE/interposer" -j"$(nproc 2>/dev/null || echo 2)"
    rm -rf "$DEST/lib"
    mkdir -p "$DEST/lib/sim"
    cp "$STAGE/interposer/build/libmemslice.so" "$STAGE/interposer/build/libmemslice-region.so" "$DEST/lib/"
    cp "$STAGE/interposer/build/sim/libcuda.so.1" "$STAGE/interposer/build/sim/libnvidia-ml.so.1" \
        "$DEST/lib/sim/"
    ln -sf libcuda.so.1 "$DEST/lib/sim/libcuda.so"
    ln -sf libnvidia-ml.so.1 "$DEST/lib/sim/libnvidia-ml.so"
    rm -rf "$STAGE"
}

build_app() {
    stage_sources
    if [ -f "$DEST/lib/libmemslice.so" ]; then
        # Package the libraries of the native step instead of compiling again with this (newer) toolchain.
        mkdir -p "$STAGE/interposer/build/sim"
        cp -P "$DEST/lib/"*.so "$STAGE/interposer/build/"
        cp -P "$DEST/lib/sim/"* "$STAGE/interposer/build/sim/"
        export MEMSLICE_SKIP_NATIVE=1
    fi
    rm -rf "$DEST/venv"
    "$PYTHON" -m venv "$DEST/venv"
    "$DEST/venv/bin/python" -m pip install --no-cache-dir --disable-pip-version-check -q "$STAGE"
    # The runtime image needs neither pip nor the build tools.
    "$DEST/venv/bin/python" -m pip uninstall --disable-pip-version-check -q -y pip setuptools 2>/dev/null || true
    rm -rf "$STAGE"
    "$DEST/venv/bin/memslice" --version
}

case "$step" in
    native) build_native ;;
    app) build_app ;;
    all) build_native; build_app ;;
    *) usage ;;
esac

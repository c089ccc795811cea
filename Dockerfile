# syntax=docker/dockerfile:1
# memslice: one image for the node agent, the scheduler extender and the CLI.
#
#   docker build -t memslice:0.1.0 .
#   docker run --rm memslice:0.1.0 --version
#
# Every build step is deploy/image/build.sh, the script tests/deploy/test_image_build.py runs, so the recipe
# is tested without a Docker engine.

# For arm64 nodes: --build-arg NATIVE_BASE=quay.io/pypa/manylinux_2_28_aarch64 (and --platform linux/arm64).
ARG NATIVE_BASE=quay.io/pypa/manylinux_2_28_x86_64

# --- 1. native: the shim and the simulated GPU, compiled against glibc 2.28 -------------------------
# libmemslice.so is not used in this image: the node agent copies it onto the host and the kubelet mounts
# it into workload containers, whose C library can be older than Debian 12's (Ubuntu 20.04 has 2.31,
# UBI 8 has 2.28); a library linked on glibc >= 2.34 needs dlsym@GLIBC_2.34 and would not even load
# there. manylinux_2_28 is the standard "old glibc, current gcc" build environment.
FROM ${NATIVE_BASE} AS native
WORKDIR /src
COPY interposer/ interposer/
COPY deploy/image/build.sh deploy/image/build.sh
RUN CC=gcc SRC=/src deploy/image/build.sh native /opt/memslice

# --- 2. app: the Python package in a virtualenv, packaging the libraries from stage 1 --------------
# python:3.11, not -slim: the package builds one C extension module (the extender's node-name index,
# scheduler_extender/index/_nameids.c) and needs gcc and Python's headers. Same Debian release and the same
# /usr/local/bin/python3.11 as the -slim runtime below, which only copies /opt/memslice.
FROM python:3.11 AS app
WORKDIR /src
COPY . .
COPY --from=native /opt/memslice/lib /opt/memslice/lib
RUN SRC=/src deploy/image/build.sh app /opt/memslice

# --- 3. runtime: python:3.11-slim + /opt/memslice, nothing else -----------------------------------
FROM python:3.11-slim
LABEL org.opencontainers.image.title="memslice" \
      org.opencontainers.image.description="GPU memory slicing for Kubernetes: node agent, scheduler extender, CLI" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=app /opt/memslice /opt/memslice
# MEMSLICE_LIB_DIR: use the glibc-2.28 libraries from stage 1 (the node agent copies the shim from here).
ENV PATH=/opt/memslice/venv/bin:$PATH \
    MEMSLICE_LIB_DIR=/opt/memslice/lib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (the extender and the CLI need nothing more). The node agent's DaemonSet sets
# runAsUser: 0 because it writes into root-owned host directories; see deploy/core/node-agent/daemonset.yaml.
RUN useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin memslice
USER 65532:65532
ENTRYPOINT ["memslice"]
CMD ["--help"]

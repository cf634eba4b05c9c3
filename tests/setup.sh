#!/usr/bin/env bash
# Makes sure the build dependencies are present: installs the missing Debian
# packages when run as root, otherwise says what to run.
#   setup.sh          what make test needs (the build, Criterion, python3)
#   setup.sh build    what make and make demo need (compiler, uthash)
#   setup.sh aarch64  make test plus the cross compiler and qemu-user of
#                     make test-aarch64
#   setup.sh soak     what make needs, and matplotlib for make soak's plots
#                     (optional: without root, a note and the plots are skipped)
set -euo pipefail

cuda_home=${CUDA_HOME:-/usr/local/cuda}
missing=()
[ -f /usr/include/uthash.h ] || missing+=(uthash-dev)
command -v cc >/dev/null 2>&1 && command -v make >/dev/null 2>&1 || missing+=(build-essential)
if [ "${1:-}" != build ] && [ "${1:-}" != soak ]; then
    [ -f /usr/include/criterion/criterion.h ] || missing+=(libcriterion-dev)
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    # The wheel test: make wheel (pip), a fresh virtual environment (venv);
    # the examples test reads the pod fragment (yaml).
    python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
    python3 -c 'import yaml' >/dev/null 2>&1 || missing+=(python3-yaml)
fi
if [ "${1:-}" = aarch64 ]; then
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
    [ -f /usr/aarch64-linux-gnu/include/stdio.h ] || missing+=(libc6-dev-arm64-cross)
    command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-user)
fi

# Debian's matplotlib is its own python3's (another python3 may come first on PATH).
if [ "${1:-}" = soak ] && ! python3 -c 'import matplotlib' >/dev/null 2>&1 &&
    ! /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        missing+=(python3-matplotlib)
    else
        echo "setup: make soak's plots need matplotlib: sudo apt-get install -y python3-matplotlib" >&2
    fi
fi

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "setup: missing packages; run: sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

if [ ! -f "$cuda_home/include/cuda.h" ]; then
    # Debian has no package with cuda.h; PyPI's CUDA runtime wheel has one.
    echo "setup: no CUDA headers at $cuda_home/include/cuda.h (only the headers are needed:" \
         "no GPU, no driver). Install the CUDA toolkit, or: pip install nvidia-cuda-runtime," \
         "then set CUDA_HOME to the folder that holds its include/cuda.h" \
         "(docs/testing.md, Prerequisites, prints it)" >&2
    exit 1
fi

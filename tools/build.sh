#!/usr/bin/env bash
# Configures and builds hisparse into build/ (executables in build/bin). CUDA kernels build for
# sm_90 when nvcc is found (/usr/local/cuda), and are skipped otherwise.
#   tools/build.sh [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${HISPARSE_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DHISPARSE_WERROR=ON >/dev/null
cmake --build build -j"$jobs" ${1:+--target "$@"}

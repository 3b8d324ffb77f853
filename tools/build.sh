#!/usr/bin/env bash
# Configures and builds hisparse into build/ (executables in build/bin). CUDA kernels build for
# sm_90 when nvcc is found (/usr/local/cuda), and are skipped otherwise.
#   tools/build.sh [TARGET...]
# HISPARSE_DEBUG_INFO=0 builds the same optimised code without debug info (-O2 -DNDEBUG, no -g):
# CI sets it, since debug info is about a third of the compile time and no CI step reads it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${HISPARSE_JOBS:-$(nproc)}
opt="-O2 -g -DNDEBUG"  # CMake's RelWithDebInfo, set each time so that the cache follows the variable
[[ ${HISPARSE_DEBUG_INFO:-1} == 0 ]] && opt="-O2 -DNDEBUG"
flags=()
for lang in C CXX CUDA; do flags+=("-DCMAKE_${lang}_FLAGS_RELWITHDEBINFO=$opt"); done
cmake -S . -B build -G Ninja -DHISPARSE_WERROR=ON "${flags[@]}" >/dev/null
cmake --build build -j"$jobs" ${1:+--target "$@"}

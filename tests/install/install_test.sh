#!/usr/bin/env bash
# cmake --install into a temporary prefix, then configure, build and run a consumer project that
# uses find_package(hisparse). Arguments: BUILD_DIR SOURCE_DIR.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/hisparse/hisparse.h"
cmake -S "$src/tests/install/consumer" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib:$tmp/prefix/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/build/consumer"

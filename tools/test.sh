#!/usr/bin/env bash
# Every test on a fresh Debian/Ubuntu machine: installs what is missing, builds everything, checks
# formatting and lint, then runs the whole test suite with ctest (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
tools/format.sh --check
tools/lint.sh
ctest --test-dir build -j"${HISPARSE_JOBS:-$(nproc)}" --output-on-failure --timeout 600

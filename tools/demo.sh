#!/usr/bin/env bash
# The whole demo on a fresh Debian/Ubuntu machine: installs what is missing, builds, and runs
# hisparse-demo on the embedded default (it starts its own hisparsed on a temporary socket).
#   tools/demo.sh [hisparse-demo flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh hisparsed hisparse-demo hisparse-ctl
exec build/bin/hisparse-demo "$@"

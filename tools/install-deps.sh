#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages hisparse builds with, when any is missing. Idempotent:
# prints nothing and changes nothing when everything is there. Needs root (or sudo).
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev libcli11-dev zlib1g-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev
  libucx-dev  # imports from a prefill node over UCX (daemon/ucx_import.cc); the build works without it
  clang clang-format clang-tidy
  python3 python3-pytest python3-numpy python3-pyflakes
  python3-yaml  # reads the alert rules in the monitoring check (deploy/validate/check_metric_names.py)
  python3-venv  # the wheel test installs the built wheel into a fresh venv (tests/install/wheel_test.sh)
  dpkg-dev  # dpkg-source, for tools/fetch-pic-sources.sh
  python3-torch  # CPU torch: the engine benchmarks' smoke runs (decode_bench, serve_bench) in ctest
  prometheus  # promtool, which lints the /metrics exposition in the admin test
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# Debian's sources of six files of abseil, protobuf and re2, which the self-contained libhisparse
# (the wheel's) recompiles -fPIC (tools/fetch-pic-sources.sh says why). Quiet when present.
"$(dirname "$0")/fetch-pic-sources.sh" ||
  echo "install-deps: could not fetch them: the self-contained libhisparse and its test will not build" >&2

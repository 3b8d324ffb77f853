#!/usr/bin/env bash
# Issue 40 on the GPU host (Ubuntu 24.04, no gRPC, no Debian libraries): the wheel, installed with
# pip --no-index into a fresh venv, runs the Python tests (GPU cases included) and the example
# engine from the installed package, with nothing on the engine's LD_LIBRARY_PATH and no
# HISPARSE_LIB. Built here, run there:
#   tools/gpu/make-bundle.sh .bundle-gpu && tools/build-wheel.sh build dist    # here (CUDA build)
#   tools/gpu/wheel-plan.sh .bundle-gpu dist                                   # there, repo root
# Only hisparsed (from the bundle) gets the bundle's libraries, through a wrapper. The venv sees
# the host's site-packages (torch, pytest) but not hisparse, which only the wheel provides.
# Writes under $OUT: summary.txt, wheel.log, pytest.log, engine.log. About 5 minutes.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
W=$(cd "${2:?wheel dir}" && pwd)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
REPO=$PWD
PY=${PY:-python3}
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } > "$S" 2>&1
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"  # step LIMIT_S NAME CMD...
V=$(mktemp -d)/venv
D=$(dirname "$V")/hisparsed
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/hisparsed "$@"\n' "$B" "$B" > "$D"
chmod +x "$D"
# Ubuntu's python3 lacks ensurepip without python3-venv: then a venv without pip, filled by the
# host's pip (--python, pip 22.3+).
step 120 venv sh -c "{ $PY -m venv --system-site-packages $V && $V/bin/python -m pip install --no-index \
  --disable-pip-version-check $W/hisparse-*.whl; } || { rm -rf $V && $PY -m venv --system-site-packages \
  --without-pip $V && $PY -m pip --python $V/bin/python install --no-index --disable-pip-version-check \
  $W/hisparse-*.whl; }" > "$OUT/wheel.log" 2>&1
ENGINE_ENV=(env -u LD_LIBRARY_PATH -u HISPARSE_LIB -u PYTHONPATH HISPARSE_INSTALLED=1 HISPARSE_DAEMON_BIN="$D"
  PYTHONUNBUFFERED=1)
"${ENGINE_ENV[@]}" "$V/bin/python" -c 'import hisparse; print(hisparse.__version__, hisparse.version(),
  hisparse.library_path())' 2>&1 | tee -a "$OUT/wheel.log" "$S"
ls "$(dirname "$("${ENGINE_ENV[@]}" "$V/bin/python" -c 'import hisparse; print(hisparse.__file__)')")" >> "$OUT/wheel.log"
step 300 pytest "${ENGINE_ENV[@]}" "$V/bin/python" -m pytest -q -p no:cacheprovider tests/python \
  > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log" | tee -a "$S"
step 200 engine "${ENGINE_ENV[@]}" "$V/bin/python" examples/engine/run_engine.py --configs 4x32768 --k 2048 \
  --steps 40 > "$OUT/engine.log" 2>&1
grep -E '^link|^exactness|^engine|MISMATCH' "$OUT/engine.log" | tee -a "$S"
echo "repo $REPO" >> "$S"

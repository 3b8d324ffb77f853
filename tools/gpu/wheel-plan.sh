#!/usr/bin/env bash
# Issue 40 on the GPU host (Ubuntu 24.04, no gRPC, no Debian libraries): the wheel, installed with
# pip --no-index into a fresh venv, runs the Python tests (GPU cases included) and the example
# engine from the installed package, with nothing on the engine's LD_LIBRARY_PATH, no
# HISPARSE_LIB and no PYTHONPATH. Built here, run there:
#   tools/gpu/make-bundle.sh .bundle-gpu && tools/build-wheel.sh build dist    # here (CUDA build)
#   tools/gpu/wheel-plan.sh .bundle-gpu dist                                   # there, repo root
# Only hisparsed and hisparse-bench (the tests' transfer agent, found beside hisparsed) get the
# bundle's libraries, through wrappers.
#
# Where torch and pytest come from: the host keeps them in a venv of their own, TORCH_VENV
# (default /opt/torch/.venv), not in the system Python's site-packages. A venv made with
# --system-site-packages sees its base interpreter's site-packages only, never those of the venv
# whose python made it (checked: the new venv's pyvenv.cfg names the base as home). So, when PY
# (default: TORCH_VENV's python, else python3) is a venv's python, the fresh venv is made from it
# (same Python version as torch's extensions) and gets a .pth that adds that venv's site folders
# (site.addsitedir, so their own .pth files apply) after the fresh venv's own site-packages: the
# wheel's hisparse wins, torch and pytest are found, and the source tree is never on the path. The
# plan then checks that hisparse, its library and hisparse-ctl are the wheel's, in the venv.
# Writes under $OUT: summary.txt, wheel.log, pytest.log, engine.log. About 5 minutes.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
W=$(cd "${2:?wheel dir}" && pwd)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
REPO=$PWD
TORCH_VENV=${TORCH_VENV:-/opt/torch/.venv}
if [[ -z ${PY:-} ]]; then
  PY=python3
  [[ -x $TORCH_VENV/bin/python ]] && PY=$TORCH_VENV/bin/python
fi
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } > "$S" 2>&1
echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0], "a venv" if sys.prefix != sys.base_prefix else "not a venv")'))" |
  tee -a "$S"
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"  # step LIMIT_S NAME CMD...
V=$(mktemp -d)/venv
D=$(dirname "$V")/hisparsed
for exe in hisparsed hisparse-bench; do
  [[ -x $B/bin/$exe ]] || continue
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/%s "$@"\n' "$B" "$B" "$exe" > "$(dirname "$V")/$exe"
  chmod +x "$(dirname "$V")/$exe"
done
WHEELS=("$W"/hisparse-*.whl)
PIP=(install --no-index --disable-pip-version-check "${WHEELS[@]}")

# The fresh venv, with pip from wherever there is one: the venv's own (ensurepip), PY's, the system
# python3's (pip 22.3+ installs into another environment with --python), or uv's. Ubuntu's python3
# lacks ensurepip without python3-venv, and a venv made by uv has no pip.
make_venv() {
  { "$PY" -m venv --system-site-packages "$V" && "$V/bin/python" -m pip "${PIP[@]}"; } && return 0
  rm -rf "$V"
  "$PY" -m venv --system-site-packages --without-pip "$V" || return 1
  "$PY" -m pip --python "$V/bin/python" "${PIP[@]}" && return 0
  python3 -m pip --python "$V/bin/python" "${PIP[@]}" && return 0
  command -v uv >/dev/null && uv pip install --python "$V/bin/python" --no-index "${WHEELS[@]}"
}

# PY a venv's python: its site folders (never the source tree) through a .pth in the fresh venv.
link_base_venv() {
  "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' || return 0
  local dirs site
  dirs=$("$PY" -c 'import os, site; print("\n".join(p for p in site.getsitepackages() if os.path.isdir(p)))')
  site=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  local d
  while IFS= read -r d; do
    [[ -n $d ]] || continue
    case "$(realpath "$d")/" in "$(realpath "$REPO")/"*) echo "wheel-plan: $d is in the source tree" >&2; return 1 ;; esac
    printf 'import site; site.addsitedir(%s)\n' "$("$PY" -c 'import sys; print(repr(sys.argv[1]))' "$d")"
  done <<< "$dirs" > "$site/zz-hisparse-plan-base-venv.pth"
  echo "base venv's site folders, after the venv's own: $(tr '\n' ' ' <<< "$dirs")"
}

step 120 venv bash -c "$(declare -f make_venv); $(declare -p PY V PIP WHEELS); make_venv" > "$OUT/wheel.log" 2>&1
link_base_venv 2>&1 | tee -a "$OUT/wheel.log" "$S"
ENGINE_ENV=(env -u LD_LIBRARY_PATH -u HISPARSE_LIB -u PYTHONPATH HISPARSE_INSTALLED=1 HISPARSE_DAEMON_BIN="$D"
  PYTHONUNBUFFERED=1)
# The proof that what runs is the wheel: hisparse, its library and hisparse-ctl from the venv
# (conftest.py checks the package again, and that no test puts the source tree on the path).
"${ENGINE_ENV[@]}" "$V/bin/python" - "$V" <<'PY' 2>&1 | tee -a "$OUT/wheel.log" "$S"
import os, subprocess, sys
venv = os.path.realpath(sys.argv[1]) + "/"
import hisparse
where = {"package": hisparse.__file__, "library": hisparse.library_path(), "hisparse-ctl": venv + "bin/hisparse-ctl"}
for what, path in where.items():
    print(f"{what}: {path}" + ("" if os.path.realpath(path).startswith(venv) else "  NOT FROM THE WHEEL'S VENV"))
ctl = subprocess.run([where["hisparse-ctl"], "--version"], capture_output=True, text=True).stdout.strip()
print(f"hisparse {hisparse.__version__} (library {hisparse.version()}), {ctl}")
for mod in ("torch", "pytest"):
    try:
        m = __import__(mod)
        print(f"{mod} {m.__version__} from {os.path.dirname(m.__file__)}")
    except ImportError as e:
        print(f"{mod}: NOT FOUND ({e})")
PY
ls "$(dirname "$("${ENGINE_ENV[@]}" "$V/bin/python" -c 'import hisparse; print(hisparse.__file__)')")" >> "$OUT/wheel.log"
step 300 pytest "${ENGINE_ENV[@]}" "$V/bin/python" -m pytest -q -p no:cacheprovider tests/python \
  > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log" | tee -a "$S"
step 200 engine "${ENGINE_ENV[@]}" "$V/bin/python" examples/engine/run_engine.py --configs 4x32768 --k 2048 \
  --steps 40 > "$OUT/engine.log" 2>&1
grep -E '^link|^exactness|^engine|MISMATCH' "$OUT/engine.log" | tee -a "$S"
echo "repo $REPO" >> "$S"

#!/usr/bin/env bash
# One version everywhere (issue 40): every executable's --version, the Python package's
# __version__ and the library's hs_version() all say CMakeLists.txt's project(VERSION).
# Arguments: BUILD_DIR SOURCE_DIR VERSION.
set -euo pipefail
build=$1 src=$2 want=$3
bad=0
for exe in hisparsed hisparse-ctl hisparse-demo hisparse-bench; do
  [[ -x $build/bin/$exe ]] || continue
  got=$("$build/bin/$exe" --version)
  echo "$got"
  [[ $got == "$exe $want" ]] || { echo "versions_test: $exe --version says '$got', not '$exe $want'" >&2; bad=1; }
done
py=$(HISPARSE_LIB="$build/lib/libhisparse.so" PYTHONPATH="$src/client/python" python3 -c \
  'import hisparse; print(hisparse.__version__, hisparse.version())')
echo "hisparse (Python) $py"
[[ $py == "$want $want" ]] || { echo "versions_test: hisparse.__version__ and hs_version() say '$py', not '$want'" >&2; bad=1; }
exit $bad

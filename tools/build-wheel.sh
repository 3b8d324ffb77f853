#!/usr/bin/env bash
# Builds the Python wheel that engines install: client/python plus the self-contained
# libhisparse (build/portable/libhisparse.so, cmake/portable_client.cmake) and hisparse-ctl
# (build/portable/hisparse-ctl, installed by pip into the environment's bin/), both stripped,
# tagged manylinux_2_NN_x86_64 where 2.NN is the newest glibc symbol version either needs (PEP 600).
#   tools/build-wheel.sh [BUILD_DIR [OUT_DIR]]      (defaults: build, dist)
# Needs the hisparse_portable and hisparse_portable_ctl targets built (tools/build.sh
# hisparse_portable hisparse_portable_ctl); offline, stdlib Python only. Prints the wheel's path.
# Both need nothing but glibc and, the library on the CUDA backend, the driver (libcuda.so.1,
# loaded at run time); tests/install/wheel_test.sh checks it.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
mkdir -p "${2:-$src/dist}"
out=$(cd "${2:-$src/dist}" && pwd)
lib=$build/portable/libhisparse.so
ctl=$build/portable/hisparse-ctl
for f in "$lib" "$ctl"; do
  [[ -f $f ]] || { echo "build-wheel: no $f (tools/build.sh hisparse_portable hisparse_portable_ctl)" >&2; exit 1; }
done
glibc=$(objdump -T "$lib" "$ctl" | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n | tail -1)
[[ -n $glibc ]] || { echo "build-wheel: no GLIBC_ symbol versions in $lib" >&2; exit 1; }
plat=manylinux_2_${glibc#GLIBC_2.}_x86_64
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
tar -C "$src/client/python" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.so*' -cf - . | tar -C "$stage" -xf -
cp "$src/LICENSE" "$stage/hisparse/LICENSE" 2>/dev/null || true
strip --strip-unneeded -o "$stage/hisparse/libhisparse.so" "$lib"
mkdir "$stage/scripts"
strip -o "$stage/scripts/hisparse-ctl" "$ctl"
# A CUDA build needs the CUDA runtime (cmake/portable_client.cmake says why it is not static):
# it rides beside the library, which finds it through RUNPATH $ORIGIN.
for cudart in $(objdump -p "$lib" | awk '$1 == "NEEDED" && $2 ~ /^libcudart\.so/ {print $2}'); do
  cp -L "${CUDA_HOME:-/usr/local/cuda}/lib64/$cudart" "$stage/hisparse/$cudart"
done
python3 - "$stage" "$out" "$plat" <<'PY'
import sys
stage, out, plat = sys.argv[1:]
sys.path.insert(0, stage + "/build_backend")
import hisparse_build
print(out + "/" + hisparse_build.build_wheel(out, {"platform-tag": plat}))
PY

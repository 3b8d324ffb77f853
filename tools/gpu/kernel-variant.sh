#!/usr/bin/env bash
# Builds a hisparse-bench whose RESOLVE kernels come from another source: a previous revision's
# kernel (the "before" of a before/after measurement) or a scratch variant of it, without a second
# build tree. The kernel file is compiled with the build's own nvcc command, its object replaces
# the build's in a copy of the kernels library, and hisparse-bench is relinked against that copy
# and stripped (small enough to carry several to the GPU host).
#   tools/gpu/kernel-variant.sh [-b BUILD_DIR] KERNEL SOURCE OUT_EXE
#     KERNEL   the kernel's file under kernels/: resolve.cu, resolve_multi.cu or store_append.cu
#     SOURCE   a file, or REV:kernels/KERNEL to take it from git (e.g. HEAD~2:kernels/resolve_multi.cu)
#     OUT_EXE  where the bench goes, e.g. .bundle-gpu/bin/hisparse-bench-before (resolve-plan.sh
#              times that one against the build's own)
# NVCC_EXTRA adds nvcc flags to the kernel's compile, e.g. NVCC_EXTRA=-lineinfo for a binary whose
# ncu source view maps SASS to the kernel's lines.
# The build must be configured with CUDA (tools/build.sh) and built. The other kernel files and the
# headers are the working tree's: a variant of one file must still compile against them.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=build
if [[ ${1:-} == -b ]]; then
  build=${2:?build dir}
  shift 2
fi
kernel=${1:?kernel file under kernels/}
source=${2:?source file or REV:path}
out=${3:?output executable}
[[ -f kernels/$kernel ]] || { echo "kernel-variant: no kernels/$kernel" >&2; exit 2; }
build=$(cd "$build" && pwd)
obj=kernels/CMakeFiles/hisparse_kernels_cuda.dir/$kernel.o
lib=lib/libhisparse_kernels_cuda.a
[[ -f $build/$lib ]] || { echo "kernel-variant: $build has no $lib (a CUDA build is needed)" >&2; exit 1; }
tmp=$(mktemp -d)
# The variant sits under kernels/ while it compiles, so that its own includes resolve as the
# original's do; it is removed on every path.
src="$root/kernels/.variant-$$-$kernel"
trap 'rm -rf "$tmp" "$src"' EXIT
if [[ -f $source ]]; then
  cp "$source" "$src"
else
  git show "$source" > "$src"
fi
compile=$(cd "$build" && ninja -t commands "$obj" | tail -1)
[[ $compile == *"$root/kernels/$kernel "* ]] || { echo "kernel-variant: no nvcc command for $obj" >&2; exit 1; }
compile=${compile//"$root/kernels/$kernel "/"$src "}
compile=${compile//"-o $obj"/"-o $tmp/$kernel.o"}
compile=${compile//"-MF $obj.d"/"-MF $tmp/$kernel.o.d"}
compile+=" ${NVCC_EXTRA:-}"
(cd "$build" && eval "$compile")
cp "$build/$lib" "$tmp/kernels.a"
# The archive's member is named after the object file.
(cd "$tmp" && ar r kernels.a "$kernel.o")
link=$(cd "$build" && ninja -t commands bin/hisparse-bench | tail -1)
link=${link//"$lib"/"$tmp/kernels.a"}
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
link=${link//"-o bin/hisparse-bench"/"-o $out"}
(cd "$build" && eval "$link")
strip --strip-debug "$out"
echo "kernel-variant: $out (kernels/$kernel from $source)"

#!/usr/bin/env bash
# check-thread-safety.sh: clang's thread-safety analysis (-Wthread-safety -Werror=thread-safety)
# over the project's own C++ sources, without a second build: each translation unit of
# build/compile_commands.json (run tools/build.sh first; its generated protobuf headers are used)
# is parsed again by clang++ with -fsyntax-only, so nothing is compiled or linked. It also covers
# the host files that only a CUDA build compiles (daemon/gpu_arena.cc, common/cuda_vmm.cc), which
# the clang builds of tools/ci-sanitizers.sh (HISPARSE_CUDA=OFF) never see.
#   tools/check-thread-safety.sh [FILE...]   (default: every .cc of build/compile_commands.json
#                                             outside build/; a FILE is a path from the repo root)
# Measured on the shared 2-core VM: the whole tree (95 files) in 68 s with HISPARSE_JOBS=2.
# Exit status: 0 clean, 1 a violation (the diagnostics are printed), 2 no build/ to read.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/compile_commands.json ]] || { echo "check-thread-safety: run tools/build.sh first"; exit 2; }
CLANGXX=${CLANGXX:-clang++}
export CLANGXX
python3 - "${HISPARSE_JOBS:-$(nproc)}" "$@" <<'EOF'
import json, os, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

jobs, wanted = int(sys.argv[1]), {os.path.abspath(f) for f in sys.argv[2:]}
root = os.getcwd()
units = []
for entry in json.load(open("build/compile_commands.json")):
    src = os.path.abspath(os.path.join(entry["directory"], entry["file"]))
    if not src.endswith(".cc") or not src.startswith(root + "/") or src.startswith(root + "/build"):
        continue
    if wanted and src not in wanted:
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    out, skip = [os.environ["CLANGXX"]], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c", "-MF", "-MT", "-MQ"):
            skip = a != "-c"
        elif a.startswith("-W") or a in ("-MD", "-MMD") or a == entry["file"] or a == src:
            pass  # g++'s warnings stay g++'s: only the analysis decides here
        else:
            out.append(a)
    units.append((src, entry["directory"], out + ["-fsyntax-only", "-Wno-unknown-warning-option",
                                                  "-Wthread-safety", "-Werror=thread-safety", src]))

def check(unit):
    src, cwd, cmd = unit
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return src, r.returncode, r.stderr

failed = 0
with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
    for src, rc, err in pool.map(check, units):
        if rc != 0:
            failed += 1
            print(err, end="")
print(f"check-thread-safety: {len(units)} files, {failed} with violations")
sys.exit(1 if failed else 0)
EOF

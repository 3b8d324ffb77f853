# shellcheck shell=bash
# Sourced by the GPU plans (tools/gpu/*-plan.sh), which set S, their summary file, first (or call
# plan_begin, which does).
# step LIMIT_S NAME CMD...: runs CMD under a time limit and notes its exit status and time in $S.
step() {
  local limit=$1 name=$2 t=$SECONDS
  shift 2
  timeout -k 10 "$limit" "$@"
  local rc=$?
  # To the summary and to stderr: a step's stdout is often its JSON lines' file.
  echo "$name: rc=$rc in $((SECONDS - t)) s" | tee -a "$S" >&2
}

# plan_begin BUNDLE: what a Python-driven plan sets up first. B is the bundle's absolute path, OUT
# the folder the files go to ($OUT, else ./out), the library, daemon and hisparse-ctl those of the
# bundle, PY the Python (${PY:-python3}); S, the summary, starts with the GPU, the time and the
# torch and Triton versions.
plan_begin() {
  B=$(cd "${1:?bundle dir}" && pwd) || exit 2
  OUT=${OUT:-$PWD/out}
  mkdir -p "$OUT"
  export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export HISPARSE_DAEMON_BIN="$B/bin/hisparsed" HISPARSE_LIB="$B/bin/libhisparse.so" HISPARSE_CTL_BIN="$B/bin/hisparse-ctl"
  export PYTHONUNBUFFERED=1
  PY=${PY:-python3}
  S="$OUT/summary.txt"
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$S" 2>&1
}

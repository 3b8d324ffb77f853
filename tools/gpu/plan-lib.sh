# Sourced by the GPU plans (tools/gpu/*-plan.sh), which set S, their summary file, first.
# step LIMIT_S NAME CMD...: runs CMD under a time limit and notes its exit status and time in $S.
step() {
  local limit=$1 name=$2 t=$SECONDS
  shift 2
  timeout -k 10 "$limit" "$@"
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - t)) s" | tee -a "$S"
}

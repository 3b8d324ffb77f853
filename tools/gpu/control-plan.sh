#!/usr/bin/env bash
# Control-plane plan: `hisparse-bench control` with its lifecycle calls over gRPC and over the
# sessions' control lanes (HISPARSE_CONTROL_LANE=0 / 1, the same binaries), on the host and the
# CUDA backend, alternated, beside the floor of a trivial gRPC service in the same run. Built here,
# run there:
#   tools/gpu/make-bundle.sh .bundle-gpu      # here
#   tools/gpu/control-plan.sh .bundle-gpu     # there, from the repo root ($OUT collects logs)
# With BASE=1 a base build's hisparsed and hisparse-bench in .bundle-gpu/base/ (the bench links the
# client statically) run too, as "base": what the code did before, over the transport it had. Writes $OUT/summary.txt and $OUT/control.log (every run's JSON, labelled).
# About 2 minutes.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$PWD/out}
SECS=${SECS:-3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
S="$OUT/summary.txt" L="$OUT/control.log"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; nproc; uptime; } > "$S" 2>&1
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"
step 60 link "$B/bin/hisparse-bench" resolve --batch 1 --slots 4096 --k 2048 --record-bytes 1152 --miss 0.2 \
  --smoke > "$OUT/link.log" 2>&1
grep '"kind":"link"' "$OUT/link.log" | tee -a "$S"
summarize() {  # label, JSON file
  python3 - "$1" "$2" <<'PY' | tee -a "$S"
import json, sys
label, path = sys.argv[1], sys.argv[2]
try:
    j = json.load(open(path))
except Exception as e:
    print(f"{label}: no result ({e})"); sys.exit()
lat = j["latency"]
end = j.get("end", {})
print(f"{label}: admit p50 {lat['admit']['p50_us']:.0f} us, release p50 {lat['release']['p50_us']:.0f} us, "
      f"admit+release p50 {lat['admit_release']['p50_us']:.0f} us p99 {lat['admit_release']['p99_us']:.0f} us, "
      f"{j['calls_per_s']} calls/s, errors {j.get('errors', {})}, pool empty {end.get('empty')}, "
      f"sessions on a lane {j.get('control_lane_sessions')}")
PY
}
daemons=(new)
[[ ${BASE:-0} == 1 ]] && daemons=(base new)
for round in 1 2; do
  for daemon in "${daemons[@]}"; do
    bin="$B/bin/hisparsed" bench="$B/bin/hisparse-bench" transports=(grpc lane)
    [[ $daemon == base ]] && bin="$B/base/hisparsed" bench="$B/base/hisparse-bench" transports=(grpc)
    for backend in host cuda; do
      for transport in "${transports[@]}"; do
        lane=0; [[ $transport == lane ]] && lane=1
        for s in 1 8 64; do
          f="$OUT/run.json"
          HISPARSE_CONTROL_LANE=$lane HISPARSE_DAEMON_BIN=$bin timeout 120 "$bench" control \
            --sessions "$s" --seconds "$SECS" --backend "$backend" > "$f" 2>> "$L"
          { echo "# round $round $daemon $backend $transport sessions $s"; cat "$f"; } >> "$L"
          summarize "r$round $daemon $backend $transport s=$s" "$f"
        done
      done
    done
  done
done
# The floor in the same run: a trivial unary call of the same service on the same transport
# (hisparse-bench grpc-floor), gRPC's synchronous server (hisparsed's) and its callback one.
for server in sync callback; do
  for n in 1 8 64; do
    echo "grpc floor $server, $n clients: $(timeout 120 "$B/bin/hisparse-bench" grpc-floor --clients "$n" --calls 3000 \
      --server "$server")" | tee -a "$S"
  done
done

#!/usr/bin/env bash
# Where 64 sessions' admission throughput is bounded: one hisparsed, and its 64 sessions driven by
# one `hisparse-bench control` process (64 threads) or split over P processes (64/P each), at the
# same moment. If P processes together get more calls per second than one, the bound is in the
# single client process, not in the daemon. Host backend, control lanes (the default).
# PROCS="1 2 4 8" (the layouts), TOTAL=64 (sessions in all), SECS=3, PORT=19464 (metrics).
#   tools/gpu/make-bundle.sh .bundle-gpu      # here
#   tools/gpu/control-procs-plan.sh .bundle-gpu   # there, from the repo root ($OUT collects logs)
# Prints one line per layout: processes, sessions each, the sum of calls/s, each process's p50, and
# the daemon's own mean time per Admit and Release over the layout (hisparse_rpc_duration_seconds,
# scraped before and after: the call as the daemon's lane thread runs it, its lock waits included).
# The benches share the daemon, so each one's end-of-run "pool empty" check may see another's
# requests: only the rates are read here. About 1 minute.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$PWD/out}
SECS=${SECS:-3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
dir=$(mktemp -d)
PORT=${PORT:-19464}
"$B/bin/hisparsed" --host-pool-size 4GiB --listen "unix:$dir/h.sock" --metrics-listen "127.0.0.1:$PORT" \
  --log-level warning > "$OUT/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [[ -S $dir/h.sock ]] && break; sleep 0.05; done
for round in 1 2; do
  for procs in ${PROCS:-1 2 4 8}; do
    each=$((${TOTAL:-64} / procs))
    curl_metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())"; }
    curl_metrics > "$OUT/m-before" 2>/dev/null
    pids=()
    for p in $(seq "$procs"); do
      timeout 60 "$B/bin/hisparse-bench" control --daemon "unix:$dir/h.sock" --sessions "$each" --seconds "$SECS" \
        > "$OUT/r$round-p$procs-$p.json" 2>/dev/null &
      pids+=($!)
    done
    wait "${pids[@]}"
    curl_metrics > "$OUT/m-after" 2>/dev/null
    python3 - "$round" "$procs" "$each" "$OUT" <<'PY'
import json, sys, glob, re
rnd, procs, each, out = sys.argv[1:]
def rpc(path):
    got = {}
    for line in open(path):
        m = re.match(r'hisparse_rpc_duration_seconds_(sum|count)\{method="(Admit|Release)"\} (\S+)', line)
        if m:
            got[(m.group(2), m.group(1))] = float(m.group(3))
    return got
before, after = rpc(f"{out}/m-before"), rpc(f"{out}/m-after")
def mean_us(method):
    n = after.get((method, "count"), 0) - before.get((method, "count"), 0)
    t = after.get((method, "sum"), 0) - before.get((method, "sum"), 0)
    return f"{1e6 * t / n:.1f}" if n else "-"
runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r{rnd}-p{procs}-*.json"))]
total = sum(r["calls_per_s"] for r in runs)
p50 = [round(r["latency"]["admit_release"]["p50_us"]) for r in runs]
lanes = sum(r.get("control_lane_sessions", 0) for r in runs)
print(f"round {rnd}: {procs} processes x {each} sessions: {total:,.0f} calls/s, admit+release p50 us {p50}, "
      f"sessions on a lane {lanes}; in the daemon: Admit {mean_us('Admit')} us, Release {mean_us('Release')} us")
PY
  done
done
kill "$daemon"; wait "$daemon" 2>/dev/null
rm -rf "$dir"

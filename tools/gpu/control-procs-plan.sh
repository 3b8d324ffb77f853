#!/usr/bin/env bash
# Where 64 sessions' admission throughput is bounded: one hisparsed, and its 64 sessions driven by
# one `hisparse-bench control` process (64 threads) or split over P processes (64/P each), at the
# same moment. If P processes together get more calls per second than one, the bound is in the
# single client process, not in the daemon. Host backend, control lanes (the default).
# PROCS="1 2 4 8" (the layouts), TOTAL=64 (sessions in all), SECS=3, PORT=19464 (metrics), POOL=4GiB
# (the daemon's host pool: 64 slabs of 64 MiB, one a session at 64 sessions), DAEMON_CPUS and
# CLIENT_CPUS (taskset lists: the daemon and the clients on cores of their own).
#   tools/gpu/make-bundle.sh .bundle-gpu      # here
#   tools/gpu/control-procs-plan.sh .bundle-gpu   # there, from the repo root ($OUT collects logs)
# Prints one line per layout: processes, sessions each, the sum of calls/s, each process's p50, and
# the daemon's own mean time per Admit and Release over the layout (hisparse_rpc_duration_seconds,
# scraped before and after: the call as the daemon's lane thread runs it, its lock waits included).
# And where the CPU went: the daemon's and the clients' CPU seconds over the layout (/proc and
# getrusage), as microseconds per call and as the cores kept busy (both together / the wall time);
# with the host's cores all busy, the bound is CPU, not a lock. TOTAL may list several counts.
# The benches share the daemon, so each one's end-of-run "pool empty" check may see another's
# requests: only the rates are read here. About 1 minute a daemon.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$PWD/out}
SECS=${SECS:-3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PORT=${PORT:-19464}
cpu_of() {  # the daemon's CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$daemon/stat"
}
for round in ${ROUNDS:-1 2}; do
 # DAEMONS="new base": the same layouts against .bundle-gpu/base/hisparsed too (a base build's),
 # alternated, with this bundle's bench as the client.
 for label in ${DAEMONS:-new}; do
  bin=$B/bin/hisparsed
  [[ $label == base ]] && bin=$B/base/hisparsed
  dir=$(mktemp -d)
  ${DAEMON_CPUS:+taskset -c "$DAEMON_CPUS"} "$bin" --host-pool-size "${POOL:-4GiB}" --listen "unix:$dir/h.sock" --metrics-listen "127.0.0.1:$PORT" \
    --log-level warning > "$OUT/daemon-$label.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [[ -S $dir/h.sock ]] && break; sleep 0.05; done
 for total in ${TOTAL:-64}; do
  for procs in ${PROCS:-1 2 4 8}; do
    each=$((total / procs))
    [[ $each -ge 1 ]] || continue
    curl_metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())"; }
    curl_metrics > "$OUT/m-before" 2>/dev/null
    rm -f "$OUT"/r"$round"-p"$procs"-*.json "$OUT"/cpu-"$round"-p"$procs"-*
    daemon_cpu0=$(cpu_of)
    wall0=$(date +%s.%N)
    pids=()
    for p in $(seq "$procs"); do
      # Each client under a wrapper that reports its CPU seconds (getrusage of its child).
      ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[2:], stdout=open(sys.argv[1] + ".json", "w"), stderr=subprocess.DEVNULL, timeout=60)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1] + ".cpu", "w").write(f"{u.ru_utime + u.ru_stime} {u.ru_nvcsw} {u.ru_nivcsw}")' \
        "$OUT/r$round-p$procs-$p" "$B/bin/hisparse-bench" control --daemon "unix:$dir/h.sock" --sessions "$each" \
        --seconds "$SECS" &
      pids+=($!)
    done
    wait "${pids[@]}"
    wall=$(python3 -c "import time; print(time.time() - $wall0)")
    daemon_cpu=$(python3 -c "print($(cpu_of) - $daemon_cpu0)")
    curl_metrics > "$OUT/m-after" 2>/dev/null
    python3 - "$round $label" "$procs" "$each" "$OUT" "$wall" "$daemon_cpu" "$round" <<'PY'
import json, sys, glob, re
label, procs, each, out, wall, daemon_cpu, rnd = sys.argv[1:]
wall, daemon_cpu = float(wall), float(daemon_cpu)
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
cpus = [open(f).read().split() for f in sorted(glob.glob(f"{out}/r{rnd}-p{procs}-*.cpu"))]
client_cpu = sum(float(c[0]) for c in cpus)
calls = sum(r["calls"] for r in runs) if all("calls" in r for r in runs) else None
total = sum(r["calls_per_s"] for r in runs)
p50 = [round(r["latency"]["admit_release"]["p50_us"]) for r in runs]
lanes = sum(r.get("control_lane_sessions", 0) for r in runs)
print(f"round {label}: {procs} processes x {each} sessions: {total:,.0f} calls/s, admit+release p50 us {p50}, "
      f"sessions on a lane {lanes}; in the daemon: Admit {mean_us('Admit')} us, Release {mean_us('Release')} us")
per_call = (lambda cpu: f"{1e6 * cpu / calls:.1f}") if calls else (lambda cpu: "-")
print(f"  cpu over {wall:.2f} s: daemon {daemon_cpu:.2f} s ({per_call(daemon_cpu)} us/call), clients "
      f"{client_cpu:.2f} s ({per_call(client_cpu)} us/call), cores busy {(daemon_cpu + client_cpu) / wall:.1f} "
      f"of {__import__('os').cpu_count()}")
PY
  done
 done
 kill "$daemon"; wait "$daemon" 2>/dev/null
 rm -rf "$dir"
 done
done

#!/usr/bin/env bash
# Issue 42 on the GPU host: a daemon's restart against pool size (hisparse-bench restart at 16 and
# 64 GiB, a new engine adopting), engines riding through it (--ride-through at 1, 16 and 64 GiB on
# the host backend, 16 and 64 GiB on the CUDA backend), durable admit latency with the journal on
# and off, the restart tests (engines on the host and the CUDA backend, riding through included),
# and the GPU tests that run over the daemon and its pool. Built here, run there:
#   tools/gpu/make-bundle.sh .bundle-gpu        # here
#   tools/gpu/restart-plan.sh .bundle-gpu       # there, from the repo root (about 3 minutes)
B=$(cd "${1:?bundle dir}" && pwd)
R=$B/run
export HISPARSE_DAEMON_BIN=$B/bin/hisparsed
nvidia-smi -L; nproc; free -g | head -2; uname -r
echo "== link"
$R hisparse-bench resolve --batch 1 --slots 4096 --k 2048 --record-bytes 1152 --miss 0.2 --smoke 2>/dev/null | grep '"kind":"link"'
echo "== session_journal_test"; $R session_journal_test 2>&1 | tail -3
echo "== daemon_restart_test (host backend engines)"; $R daemon_restart_test 2>&1 | grep -E "^\[ *(OK|FAILED|PASSED)|Failure" | head
echo "== daemon_restart_test (CUDA backend engines, GPU arenas)"
HISPARSE_RESTART_BACKEND=cuda $R daemon_restart_test > /tmp/restart_cuda.log 2>&1
grep -E "^\[ *(OK|FAILED|PASSED)|Failure" /tmp/restart_cuda.log | head
grep -m2 -E "opened by .*durable-engine" /tmp/restart_cuda.log | sed 's/.*opened by/opened by/' 
for pool in 16GiB 64GiB; do
  echo "== restart --pool $pool"
  $R hisparse-bench restart --pool $pool --latency-calls 500 2>/tmp/restart_$pool.err | tail -1
  tail -3 /tmp/restart_$pool.err | grep -v "^hisparse-keeper" | head -3
done
for pool in 1GiB 16GiB 64GiB; do
  echo "== restart --ride-through --pool $pool (host backend)"
  $R hisparse-bench restart --ride-through --pool $pool --latency-calls 0 2>/tmp/ride_$pool.err | tail -1
  tail -3 /tmp/ride_$pool.err | grep -v "^hisparse-keeper" | head -3
done
for pool in 16GiB 64GiB; do
  echo "== restart --ride-through --backend cuda --pool $pool"
  $R hisparse-bench restart --ride-through --backend cuda --pool $pool --latency-calls 0 2>/tmp/ride_cuda_$pool.err | tail -1
  tail -3 /tmp/ride_cuda_$pool.err | grep -v "^hisparse-keeper" | head -3
done
echo "== gpu tests over the daemon"
for t in gpu_arena_session_test gpu_two_process_test gpu_store_test gpu_park_share_test gpu_tp_group_test; do
  echo "-- $t"; $R $t 2>&1 | grep -E "^\[  (PASSED|FAILED)|tests ran|Failure" | head -4
done

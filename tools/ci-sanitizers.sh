#!/usr/bin/env bash
# ci-sanitizers.sh: the sanitizer and fuzzing pass of CI. Two clang builds, each in its own
# folder beside the normal build:
#   build-asan  ASan + UBSan with libFuzzer's coverage instrumentation: every unit, integration and
#               fault test (ctest), then each fuzz target of tests/fuzz for FUZZ_SECONDS (the fuzz
#               stage reuses this build: one ASan build, not two)
#   build-tsan  TSan: the daemon's concurrency tests (integration and fault: a TSan-built hisparsed
#               serving several client threads and processes; the hostile tenants of
#               hardening_conn_test), the daemon unit tests (the Session stream gate's watchdog)
#               and session_journal_test (the restart journal's ordered commits beside the pool's
#               worker and an fd store served by another thread); page_pool_test (owners' page
#               calls under the pool's shared lock and their shard's, beside its own); client_install_test and
#               daemon_restart_test (the client's watcher against its callers, and engines riding
#               through a SIGKILLed and an upgraded daemon, every process TSan-built);
#               control_lane_test (lanes opened, replaced, dropped and ended under the daemon's
#               threads)
# Both build at -O1 (what the sanitizers' own docs advise: usable stacks, a faster compile) with
# line tables only (-gline-tables-only): reports keep file:line and inlined frames, and the
# builds take about a third less time than -O2 with full debug info. Both are unity builds
# (HISPARSE_UNITY_BUILD: each target's sources compiled in batches, so gRPC's, protobuf's and
# GoogleTest's headers are parsed once a batch, not once a file): on the 2-core VM the TSan
# build's compile went from 444 to 172 CPU-seconds (2026-12-02). CI's normal build is batched the
# same way (.ci/run sets HISPARSE_UNITY_BUILD for tools/build.sh).
# Being clang builds, all three also enforce the thread-safety annotations (HISPARSE_THREAD_SAFETY,
# on with clang: -Wthread-safety -Werror=thread-safety), and ctest's ThreadSafetyAnalysisEnforced
# checks that the flags refuse a violation.
# Every stage runs even when an earlier one fails; the summary at the end lists each stage's
# result and time, and the exit status is non-zero when any stage failed.
#
# Measured 2026-11-29 on the 2-core Debian 12 VM, from empty build folders: 10 min 9 s wall,
# of which about 2 min was one hung test; asan 158 s, tsan about 200 s, fuzz 122 s. Rebuilds are
# incremental (the TSan stage alone, rebuilt: 32 s). Environment:
#   JOBS=2               parallel compile jobs, and parallel tests (ctest -j; the tests are written
#                        for it, as the README's ctest -j runs them; the fd-exhausting test
#                        still runs alone)
#   FUZZ_SECONDS=30      time per fuzz target
#   KILL_CYCLES=100      kill cycles of the fault test under the sanitizers (ctest's default: 200)
#   STAGES="asan tsan fuzz"  a subset to run
#
# Debian's gRPC, protobuf and Abseil are not built with TSan. The TSan build links
# tools/tsan_absl_shim.cc first into everything, so that TSan sees absl::Mutex (without it every
# Mutex-guarded field is reported); tools/tsan.supp says what else is silenced in those libraries.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${JOBS:-2}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
KILL_CYCLES=${KILL_CYCLES:-100}
STAGES=${STAGES:-"asan tsan fuzz"}

COMMON=(-G Ninja -DHISPARSE_CUDA=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
        -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG"
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" -DHISPARSE_UNITY_BUILD=ON)
# The ASan build: ASan + UBSan, and the fuzz targets beside the tests (coverage instrumentation
# everywhere, which the tests do not notice).
ASAN_ARGS=(-DHISPARSE_SANITIZE=address -DHISPARSE_FUZZ=ON)
FUZZ_TARGETS=(session_manager fd_channel fd_channel_codec control_lane config trace_reader import_message)
SUMMARY=()
FAILED=0

now() { date +%s; }

# record STAGE START STATUS [NOTE]
record() {
  local took=$(( $(now) - $2 ))
  local verdict=ok
  if [[ $3 -ne 0 ]]; then verdict=FAILED; FAILED=1; fi
  SUMMARY+=("$(printf '%-6s %-7s %4ds  %s' "$1" "$verdict" "$took" "${4:-}")")
  echo "== $1: $verdict in ${took}s ${4:-}"
}

configure_and_build() {  # DIR TARGETS... (after --) CMAKE_ARGS...
  local dir=$1; shift
  local targets=()
  while [[ $1 != -- ]]; do targets+=("$1"); shift; done
  shift
  mkdir -p "$dir"
  cmake -S "$ROOT" -B "$dir" "${COMMON[@]}" "$@" > "$dir/configure.log" 2>&1 \
    || { cat "$dir/configure.log"; return 1; }
  local t=()
  for target in "${targets[@]}"; do t+=(--target "$target"); done
  # -k 0: build everything that can be built, so one broken target does not hide the tests of
  # the others; the stage still fails.
  cmake --build "$dir" -j"$JOBS" "${t[@]}" -- -k 0
}

stage_asan() {
  local start; start=$(now)
  echo "== asan: ASan + UBSan build, unit + integration + fault tests"
  mkdir -p build-asan
  local built=0
  configure_and_build build-asan all -- "${ASAN_ARGS[@]}" || built=1
  [[ -f build-asan/CTestTestfile.cmake ]] || { record asan "$start" 1 "configure failed"; return; }
  # LSan stays on: a leak in our code is a finding. InstallAndFindPackage is left out: it builds
  # an uninstrumented consumer against the installed (instrumented) library, which cannot link.
  local asan=detect_leaks=1:abort_on_error=0:strict_string_checks=1 ubsan=print_stacktrace=1:halt_on_error=1
  # Tests that take every descriptor number away from their own process run apart, with UBSan's
  # vptr check suppressed (tools/ubsan-no-fds.supp): that check probes memory through a pipe(2),
  # which then fails, so it reports every virtual call as on an "invalid vptr". ASan and the rest
  # of UBSan stay on for them.
  local no_fds='^(BatchAdmissionTest[.]MappingFailureAfterTheDaemonAdmittedReleasesTheBatch|Admit2Test[.]ASingleAdmitWhoseMappingFailsIsReleasedInTheDaemon)$'
  # The Python-labelled tests run a python that would load this build's instrumented libhisparse
  # (ASan's runtime must come first in a process): they run in the plain build's ctest.
  ASAN_OPTIONS=$asan UBSAN_OPTIONS=$ubsan HISPARSE_KILL_CYCLES=$KILL_CYCLES \
    ctest --test-dir build-asan --output-on-failure -j"$JOBS" -LE 'gpu|python' -E "^Install|^python\$|$no_fds"
  local tested=$?
  ASAN_OPTIONS=$asan UBSAN_OPTIONS=$ubsan:suppressions=$ROOT/tools/ubsan-no-fds.supp \
    ctest --test-dir build-asan --output-on-failure -j1 -R "$no_fds" || tested=1
  record asan "$start" $(( built | tested )) "(ctest: unit, integration, fault, fuzz corpus replay$( ((built)) && echo '; some targets failed to build'))"
}

# The import path under TSan: the daemon's side of the import worker (its reader and tick threads,
# callers waiting on answers) and the worker's own threads, driven by import_test with
# hisparse-bench as the writer. Only where UCX is installed (the targets exist).
tsan_import_targets() {
  pkg-config --exists ucx 2>/dev/null && echo import_test hisparse-bench hisparse-import-worker
}

stage_tsan() {
  local start; start=$(now)
  echo "== tsan: TSan build, daemon concurrency tests (and the client's riding through a restart)"
  mkdir -p build-tsan
  local built=0
  configure_and_build build-tsan integration_test fault_test daemon_core_test daemon_access_test hardening_conn_test \
    session_journal_test session_concurrency_test page_pool_test client_install_test daemon_restart_test \
    control_lane_test \
    control_lane_codec_test \
    hisparse-keeper hisparse-durable-engine \
    hisparsed hisparse-test-client hisparse-ctl $(tsan_import_targets) -- -DHISPARSE_SANITIZE=thread || built=1
  [[ -f build-tsan/CTestTestfile.cmake ]] || { record tsan "$start" 1 "configure failed"; return; }
  # The benchmarks' smoke runs need hisparse-bench, which this stage does not build (^bench_).
  # halt_on_error: a race in the daemon child kills it, which fails the test that drives it.
  # ignore_noninstrumented_modules: memcpy & co. called from inside Debian's uninstrumented
  # libraries (Abseil's deadlock graph, gRPC) are not checked; see tools/tsan.supp.
  TSAN_OPTIONS="suppressions=$ROOT/tools/tsan.supp:halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:ignore_noninstrumented_modules=1" \
  HISPARSE_KILL_CYCLES=$KILL_CYCLES \
    ctest --test-dir build-tsan --output-on-failure -j"$JOBS" -L 'integration|fault|unit' -E '_NOT_BUILT|^fuzz_|^Install|^python$|^bench_'
  local tested=$?
  record tsan "$start" $(( built | tested )) "(ctest: integration, fault, daemon unit$( ((built)) && echo '; some targets failed to build'))"
}

stage_fuzz() {
  local start; start=$(now)
  echo "== fuzz: libFuzzer targets, ${FUZZ_SECONDS}s each"
  mkdir -p build-asan
  # Every target of tests/fuzz (HS_FUZZ_TARGETS there), built in the ASan build (already there
  # after the asan stage: then this only checks that they are up to date).
  local targets=("${FUZZ_TARGETS[@]}")
  configure_and_build build-asan "${targets[@]/#/fuzz_}" -- "${ASAN_ARGS[@]}" \
    || { record fuzz "$start" 1 "build failed"; return; }
  local status=0 note=""
  for target in "${targets[@]}"; do
    # The working corpus grows run over run in the build folder; the committed seeds stay small.
    local corpus=build-asan/fuzz/corpus/$target artifacts=build-asan/fuzz/artifacts/$target/
    mkdir -p "$corpus" "$artifacts"
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      build-asan/bin/fuzz_$target -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -rss_limit_mb=2048 \
        -artifact_prefix="$artifacts" "$corpus" "tests/fuzz/corpus/$target" > "build-asan/fuzz/fuzz_$target.log" 2>&1
    local rc=$?
    local execs; execs=$(awk '/stat::number_of_executed_units/ {print $2}' "build-asan/fuzz/fuzz_$target.log")
    echo "fuzz_$target: ${execs:-?} executions in ${FUZZ_SECONDS}s, exit $rc"
    note+=" $target=${execs:-?}"
    if [[ $rc -ne 0 ]]; then
      status=1
      grep -E '^(==|SUMMARY|[a-z_]+_fuzzer:)' "build-asan/fuzz/fuzz_$target.log" | head -20
      echo "reproducer: $(ls "$artifacts" | head -1) in $artifacts (run: build-asan/bin/fuzz_$target FILE)"
    fi
  done
  record fuzz "$start" $status "(executions:$note)"
}

total_start=$(now)
for stage in $STAGES; do "stage_$stage"; done
echo
echo "== summary (total $(( $(now) - total_start ))s)"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED

#!/usr/bin/env bash
# check-deploy.sh: checks everything under deploy/ offline, without a cluster, a Docker engine or a
# running systemd, and exits non-zero when any check fails. CI runs it; so can anyone, as root on
# Debian 12 (it apt-get installs systemd when systemd-analyze is missing).
#
#   tools/check-deploy.sh             # every check
#   HISPARSE_BIN_DIR=build/bin tools/check-deploy.sh   # where built binaries are (default build/bin)
#
# What it checks (docs/DEPLOY.md, "Checking the deploy files", says more):
#   systemd     `systemd-analyze verify` of the unit (no warnings allowed), the sysusers entry
#               applied to an empty root, and the unit's hisparse-specific settings.
#   kubernetes  `kubectl kustomize` renders the base and every overlay; each rendered document is
#               validated against the Kubernetes / prometheus-operator schemas, strictly (unknown
#               fields fail), and against hisparse's own rules (deploy/validate/validate-k8s.mjs).
#   docker      the Dockerfile is linted (dockerfile-utils, dockerfilelint, hisparse rules), its
#               apt packages exist in Debian 12, and its runtime packages provide every shared
#               library the built binaries link (when they are built).
#   grafana     the dashboard is valid JSON with the expected panels; every query parses as PromQL.
#   daemon      when hisparsed and hisparse-ctl are built: each config under deploy/ starts the real
#               daemon (pool shrunk, socket moved to a temporary folder); the probe command exits 0
#               while it serves and 2 once it has stopped.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPLOY="$ROOT/deploy"
VALIDATE="$DEPLOY/validate"
BIN_DIR="${HISPARSE_BIN_DIR:-$ROOT/build/bin}"
case "$BIN_DIR" in /*) ;; *) BIN_DIR="$ROOT/$BIN_DIR" ;; esac
WORK="$(mktemp -d /tmp/check-deploy.XXXXXX)"
DAEMON_PID=""
cleanup() {
  if [[ -n "$DAEMON_PID" ]]; then kill "$DAEMON_PID" 2>/dev/null; wait "$DAEMON_PID" 2>/dev/null; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

PASSED=0
FAILED=0
SKIPPED=0
pass() { echo "  PASS $*"; PASSED=$((PASSED + 1)); }
fail() { echo "  FAIL $*"; FAILED=$((FAILED + 1)); }
skip() { echo "  SKIP $*"; SKIPPED=$((SKIPPED + 1)); }
section() { echo; echo "== $* == (${SECONDS}s)"; }
# Runs a command quietly; on failure shows its output, on success its last line.
run_check() {
  local what="$1"; shift
  if "$@" >"$WORK/out" 2>&1; then
    pass "$what"
    # A checker's last line says what it covered.
    [[ -s "$WORK/out" ]] && tail -1 "$WORK/out" | sed 's/^/       /'
  else
    fail "$what"; sed 's/^/       /' "$WORK/out"
  fi
  return 0
}

# ---------------------------------------------------------------------------------------------
section "tools"
if ! command -v systemd-analyze >/dev/null; then
  echo "  installing systemd (for systemd-analyze and systemd-sysusers)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd) >"$WORK/apt.log" 2>&1 ||
    { cat "$WORK/apt.log"; echo "check-deploy: cannot install systemd"; exit 1; }
fi
for tool in node npm kubectl systemd-analyze systemd-sysusers apt-cache; do
  command -v "$tool" >/dev/null || { echo "check-deploy: $tool is missing"; exit 1; }
done
# kubectl's built-in kustomize must know components and replacements (kustomize >= 4.5).
if ! kubectl kustomize --help >/dev/null 2>&1; then echo "check-deploy: kubectl has no kustomize"; exit 1; fi
echo "  node $(node --version), $(kubectl version --client 2>/dev/null | tr '\n' ' ')"
echo "  $(systemd-analyze --version | head -1)"
# The validators' npm packages, exactly as package-lock.json pins them.
if ! (cd "$VALIDATE" && npm ci --no-audit --no-fund --loglevel=error) >"$WORK/npm.log" 2>&1; then
  cat "$WORK/npm.log"; echo "check-deploy: npm ci failed in deploy/validate"; exit 1
fi
echo "  npm ci in deploy/validate: done"

# ---------------------------------------------------------------------------------------------
section "systemd"
UNIT="$DEPLOY/systemd/hisparsed.service"
# `systemd-analyze verify` fails a unit whose ExecStart binary is missing, and parse errors
# (unknown keys, bad values) are warnings that leave its exit status 0. So it runs against a
# throw-away root holding the system's own units, the unit under test and stubs of the programs
# it runs (--root=), and any output at all counts as a failure. Nothing outside the
# temporary folder is touched, whether or not the host has a real hisparsed installed.
SDROOT="$WORK/sdroot"
mkdir -p "$SDROOT/usr/bin" "$SDROOT/usr/lib/systemd" "$SDROOT/etc/systemd/system"
cp -a /usr/lib/systemd/system "$SDROOT/usr/lib/systemd/"
# A stub for every absolute path an Exec*= line runs (/usr/bin/hisparsed, /bin/kill).
for exe in $(grep -E '^Exec[A-Za-z]*=' "$UNIT" | cut -d= -f2- | awk '{ print $1 }' | sed 's/^[-@:+!]*//' | sort -u); do
  mkdir -p "$SDROOT$(dirname "$exe")"
  printf '#!/bin/sh\nexit 0\n' >"$SDROOT$exe"
  chmod 0755 "$SDROOT$exe"
done
cp "$UNIT" "$SDROOT/etc/systemd/system/hisparsed.service"
verify_out="$(systemd-analyze verify --root="$SDROOT" hisparsed.service 2>&1)"
verify_rc=$?
if [[ $verify_rc -eq 0 && -z "$verify_out" ]]; then
  pass "systemd-analyze verify hisparsed.service: no errors, no warnings"
else
  fail "systemd-analyze verify hisparsed.service (exit $verify_rc)"; echo "$verify_out" | sed 's/^/       /'
fi
# The unit's own rules: what verify cannot know.
unit_rules() {
  local bad=0 key
  # Effective value of a key: the last assignment wins in systemd.
  value() { grep -E "^$1=" "$UNIT" | tail -1 | cut -d= -f2-; }
  [[ "$(value Type)" == exec ]] || { echo "Type=$(value Type): hisparsed does not sd_notify, use Type=exec"; bad=1; }
  [[ "$(value ExecStart)" == "/usr/bin/hisparsed --config /etc/hisparse/hisparsed.yaml" ]] ||
    { echo "ExecStart=$(value ExecStart)"; bad=1; }
  [[ "$(value User)" == hisparse && "$(value Group)" == hisparse ]] || { echo "User/Group are not hisparse"; bad=1; }
  [[ "$(value RuntimeDirectory)" == hisparse && "$(value RuntimeDirectoryMode)" == 0750 ]] ||
    { echo "RuntimeDirectory=hisparse with mode 0750 is missing"; bad=1; }
  [[ "$(value Restart)" == on-failure && -n "$(value RestartSec)" ]] || { echo "Restart=on-failure with RestartSec is missing"; bad=1; }
  # hisparsed exits 75 after `hisparse-ctl drain` (kDrainedExitCode, daemon.h): the unit restarts it.
  [[ " $(value RestartForceExitStatus) " == *" 75 "* ]] ||
    { echo "RestartForceExitStatus=75 is missing: a drained daemon would stay down"; bad=1; }
  [[ "$(value ExecReload)" == *"-HUP \$MAINPID"* ]] || { echo "ExecReload does not send SIGHUP (config reload)"; bad=1; }
  # A reload checks the file ExecStart reads before it signals: a refused file fails the reload.
  local first_reload start_config
  first_reload="$(grep -E '^ExecReload=' "$UNIT" | head -1 | cut -d= -f2-)"
  start_config="$(value ExecStart | sed -n 's/.*--config \([^ ]*\).*/\1/p')"
  [[ -n "$start_config" && "$first_reload" == "/usr/bin/hisparsed --check-config $start_config" ]] ||
    { echo "the first ExecReload is \"$first_reload\", not hisparsed --check-config of ExecStart's file"; bad=1; }
  [[ "$(value LimitMEMLOCK)" == infinity ]] || { echo "LimitMEMLOCK is not infinity"; bad=1; }
  # Descriptors in flight count against it: the daemon's bounds must answer before the kernel
  # (the unit's comment has the arithmetic, for 65536).
  [[ "$(value LimitNOFILE)" =~ ^[0-9]+$ && "$(value LimitNOFILE)" -ge 65536 ]] ||
    { echo "LimitNOFILE=$(value LimitNOFILE): below 65536"; bad=1; }
  [[ "$(value RestrictAddressFamilies)" == "AF_UNIX AF_INET AF_INET6" ]] || { echo "RestrictAddressFamilies"; bad=1; }
  for key in ProtectSystem=strict ProtectHome=yes NoNewPrivileges=yes PrivateTmp=yes ProtectKernelTunables=yes \
             ProtectKernelModules=yes ProtectKernelLogs=yes DevicePolicy=closed; do
    [[ "$(value "${key%%=*}")" == "${key#*=}" ]] || { echo "$key is missing"; bad=1; }
  done
  # PrivateDevices would hide /dev/nvidia*.
  [[ "$(value PrivateDevices)" != yes ]] || { echo "PrivateDevices=yes hides the GPUs"; bad=1; }
  return $bad
}
run_check "unit settings: Type=exec, ExecStart, ExecReload checks first, user, RuntimeDirectory 0750, restart, memlock, sandboxing" unit_rules
sysusers_check() {
  local r="$WORK/sysroot"
  mkdir -p "$r/etc"
  systemd-sysusers --root="$r" "$DEPLOY/systemd/hisparse.sysusers" || return 1
  grep -q '^hisparse:x:[0-9]*:[0-9]*:.*:/usr/sbin/nologin$' "$r/etc/passwd" || { echo "no hisparse user"; cat "$r/etc/passwd"; return 1; }
  grep -q '^hisparse:x:[0-9]*:' "$r/etc/group" || { echo "no hisparse group"; return 1; }
}
run_check "systemd-sysusers creates the hisparse user and group (in an empty root)" sysusers_check

# ---------------------------------------------------------------------------------------------
section "kubernetes"
rendered=()
for dir in "$DEPLOY/kubernetes/base" "$DEPLOY"/kubernetes/overlays/*/; do
  dir="${dir%/}"
  name="${dir#"$DEPLOY/kubernetes/"}"
  out="$WORK/rendered-${name//\//-}.yaml"
  if kubectl kustomize "$dir" >"$out" 2>"$WORK/kustomize.err"; then
    pass "kubectl kustomize $name ($(grep -c '^kind:' "$out") objects)"
    rendered+=("$out")
  else
    fail "kubectl kustomize $name"; sed 's/^/       /' "$WORK/kustomize.err"
  fi
done
if ((${#rendered[@]})); then
  run_check "schemas (kubernetes-models, prometheus-operator), strict fields, hisparse rules: ${#rendered[@]} renderings" \
    node "$VALIDATE/validate-k8s.mjs" --reference "$DEPLOY/hisparsed.yaml" "${rendered[@]}"
fi

# ---------------------------------------------------------------------------------------------
section "docker"
DOCKERFILE="$DEPLOY/docker/Dockerfile"
run_check "Dockerfile lint: dockerfile-utils, dockerfilelint, hisparse rules" node "$VALIDATE/lint-dockerfile.mjs" "$DOCKERFILE"
[[ -f "$DEPLOY/docker/Dockerfile.dockerignore" ]] && pass "Dockerfile.dockerignore present" || fail "Dockerfile.dockerignore missing"
# The packages of a stage's `apt-get install` line, by the stage's name (FROM ... AS NAME): the
# CUDA stage that the build copies the toolkit from installs none.
stage_packages() {
  awk -v want="$1" '
    /^FROM / { stage = tolower($NF) }
    { line = $0; sub(/\\$/, "", line); buf = buf " " line; if ($0 ~ /\\$/) next }
    { if (stage == want && buf ~ /apt-get install/) {
        sub(/.*apt-get install/, "", buf); sub(/&&.*/, "", buf); print buf }
      buf = "" }' "$DOCKERFILE" | tr ' ' '\n' | grep -v '^-' | grep -v '^$' | sort -u
}
build_pkgs="$(stage_packages build)"
runtime_pkgs="$(stage_packages runtime)"
# Debian package lists are needed to look packages up; fetch them once if this machine has none.
if ! apt-cache show libc6 >/dev/null 2>&1 || [[ -z "$(apt-cache policy libgrpc++1.51 2>/dev/null | grep Candidate | grep -v none)" ]]; then
  apt-get update -qq >/dev/null 2>&1 || true
fi
apt_exists() {
  local found missing=0 p
  [[ -n "$build_pkgs" && -n "$runtime_pkgs" ]] || { echo "no apt-get install line found in a stage"; return 1; }
  # One apt-cache call for all of them (each call reads the whole package cache).
  found="$(apt-cache show --no-all-versions $build_pkgs $runtime_pkgs 2>/dev/null | sed -n 's/^Package: //p' | sort -u)"
  for p in $build_pkgs $runtime_pkgs; do
    grep -qx -- "$p" <<<"$found" || { echo "not a Debian 12 package: $p"; missing=1; }
  done
  return $missing
}
run_check "every apt package the Dockerfile installs exists in Debian 12 ($(echo $build_pkgs | wc -w) build, $(echo $runtime_pkgs | wc -w) runtime)" apt_exists
# The runtime stage must provide each shared library hisparsed and hisparse-ctl link: the owning
# package of every library that ldd finds must be a runtime package, one of their dependencies, or
# in debian:12-slim already (apt and what it depends on). Needs the binaries built on Debian 12.
runtime_closure_check() {
  local have lib real pkg bad=0 bin
  have="$( { echo "$runtime_pkgs"; apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
              --no-breaks --no-replaces --no-enhances $runtime_pkgs apt libc6 2>/dev/null; } |
           sed 's/^ *\(Pre\)\{0,1\}Depends: //; s/^ *//; s/:any$//; s/[<>]//g' | grep -v '^|' | sort -u)"
  # lib -> owning package, with one dpkg -S for all libraries (paths resolved: merged /usr).
  for bin in hisparsed hisparse-ctl; do
    ldd "$BIN_DIR/$bin" | awk -v b="$bin" '/=> \// { print b, $3 }'
  done | sort -u >"$WORK/libs"
  while read -r bin lib; do
    real="$(readlink -f "$lib")"
    echo "$bin $lib $real"
  done <"$WORK/libs" >"$WORK/libs.real"
  # dpkg records some libraries under /lib, others under /usr/lib: ask for both, answer as /usr.
  dpkg -S $(awk '{ print $3; sub(/^\/usr/, "", $3); print $3 }' "$WORK/libs.real" | sort -u) 2>/dev/null |
    sed 's/^\([^:]*\)[^ ]* /\1 /; s# /lib/# /usr/lib/#' >"$WORK/owners"
  while read -r bin lib real; do
    pkg="$(awk -v f="$real" '$2 == f { print $1; exit }' "$WORK/owners")"
    if [[ -z "$pkg" ]]; then echo "$bin: $lib belongs to no Debian package (built by hand?)"; bad=1; continue; fi
    grep -qx "$pkg" <<<"$have" || { echo "$bin: $lib comes from $pkg, which the runtime stage does not install"; bad=1; }
  done <"$WORK/libs.real"
  return $bad
}
if [[ -x "$BIN_DIR/hisparsed" && -x "$BIN_DIR/hisparse-ctl" ]]; then
  run_check "runtime packages provide every library of $BIN_DIR/{hisparsed,hisparse-ctl}" runtime_closure_check
else
  skip "runtime libraries vs. binaries: no hisparsed/hisparse-ctl in $BIN_DIR (build first, or set HISPARSE_BIN_DIR)"
fi
echo "  NOTE no Docker engine here: the image is linted, not built or run"

# ---------------------------------------------------------------------------------------------
section "grafana"
run_check "dashboard JSON, panels, PromQL, metric catalog" node "$VALIDATE/check-grafana.mjs" "$DEPLOY/grafana/hisparse-dashboard.json"

# ---------------------------------------------------------------------------------------------
section "daemon (configs against the real hisparsed)"
# Starts hisparsed on one config with a small pool and a private socket; checks the probe
# command's exit codes while it serves (0) and after SIGTERM (2), and that it removed its sockets.
smoke_config() {
  local cfg="$1" sock="$WORK/s/hisparsed.sock" ctl="$BIN_DIR/hisparse-ctl" i rc metrics=()
  rm -rf "$WORK/s"; mkdir -p "$WORK/s"
  # Metrics on a loopback port, when this hisparsed serves them (--metrics-listen).
  local port=$((20000 + RANDOM % 20000))
  if "$BIN_DIR/hisparsed" --help 2>&1 | grep -q -- --metrics-listen; then metrics=(--metrics-listen "127.0.0.1:$port"); fi
  # Flags override the file: a 64 MiB pool in slabs of at most 16 MiB, not mlocked, on host memory.
  "$BIN_DIR/hisparsed" --config "$cfg" --listen "unix:$sock" --host-pool-size 64MiB \
    --host-pool-slab-size 16MiB --set host_pool.mlock=false --set host_pool.hugepages=off \
    --set gpu_memory_budget=0 --device host "${metrics[@]}" >"$WORK/daemon.log" 2>&1 &
  DAEMON_PID=$!
  for i in $(seq 1 100); do
    "$ctl" --daemon "unix:$sock" --timeout-ms 1000 stats >/dev/null 2>&1 && break
    kill -0 "$DAEMON_PID" 2>/dev/null || break
    sleep 0.1
  done
  "$ctl" --daemon "unix:$sock" --timeout-ms 2000 stats --json >"$WORK/stats.json" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "probe exit $rc while the daemon should serve"; cat "$WORK/daemon.log" "$WORK/stats.json"
    kill "$DAEMON_PID" 2>/dev/null; wait "$DAEMON_PID" 2>/dev/null; DAEMON_PID=""
    return 1
  fi
  if ((${#metrics[@]})); then
    node -e '
      fetch(process.argv[1]).then((r) => r.text()).then((t) => {
        const want = ["hisparse_host_pool_bytes", "hisparse_sessions", "hisparse_requests"];
        const missing = want.filter((m) => !new RegExp("^" + m + "[{ ]", "m").test(t));
        if (missing.length) { console.log("/metrics lacks " + missing.join(", ")); process.exit(1); }
      }).catch((e) => { console.log("/metrics: " + e.message); process.exit(1); });' \
      "http://127.0.0.1:$port/metrics" || { kill "$DAEMON_PID"; wait "$DAEMON_PID"; DAEMON_PID=""; return 1; }
  fi
  kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID"; rc=$?; DAEMON_PID=""
  [[ $rc -eq 0 ]] || { echo "hisparsed exited $rc on SIGTERM"; cat "$WORK/daemon.log"; return 1; }
  [[ ! -e "$sock" && ! -e "$sock.fd" ]] || { echo "sockets left behind after SIGTERM"; return 1; }
  "$ctl" --daemon "unix:$sock" --timeout-ms 500 stats >/dev/null 2>&1; rc=$?
  [[ $rc -eq 2 ]] || { echo "probe exit $rc with no daemon, want 2 (unreachable)"; return 1; }
}
if [[ -x "$BIN_DIR/hisparsed" && -x "$BIN_DIR/hisparse-ctl" ]]; then
  metrics_note=", /metrics scraped"
  "$BIN_DIR/hisparsed" --help 2>&1 | grep -q -- --metrics-listen || metrics_note=" (no --metrics-listen in this build: /metrics not scraped)"
  for cfg in "$DEPLOY/hisparsed.yaml" "$DEPLOY/kubernetes/base/hisparsed.yaml" "$DEPLOY"/kubernetes/overlays/*/hisparsed.yaml; do
    run_check "hisparsed --config ${cfg#"$ROOT/"}: starts, probe 0 while serving$metrics_note, 2 after SIGTERM" smoke_config "$cfg"
    # What ExecReload runs before SIGHUP accepts the file the daemon just started with.
    if "$BIN_DIR/hisparsed" --help 2>&1 | grep -q -- --check-config; then
      run_check "hisparsed --check-config ${cfg#"$ROOT/"}: ok" "$BIN_DIR/hisparsed" --check-config "$cfg"
    fi
  done
  # The flags the unit and the DaemonSet pass must be flags of this hisparsed.
  help="$("$BIN_DIR/hisparsed" --help 2>&1)"
  for flag in $( { grep -E '^Exec(Start|Reload)=' "$DEPLOY/systemd/hisparsed.service"; grep -E '^ *- --' "$DEPLOY/kubernetes/base/daemonset.yaml"; } |
                grep -oE -- '--[a-z][a-z-]+' | sort -u); do
    if grep -q -- "$flag" <<<"$help"; then pass "hisparsed knows $flag (used by deploy/)"
    else fail "hisparsed has no flag $flag (used by deploy/): the unit or the DaemonSet would not start"; fi
  done
else
  skip "daemon smoke test: no hisparsed/hisparse-ctl in $BIN_DIR"
fi

# ---------------------------------------------------------------------------------------------
echo
echo "check-deploy: $PASSED passed, $FAILED failed, $SKIPPED skipped"
[[ $FAILED -eq 0 ]]

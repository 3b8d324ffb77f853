#!/usr/bin/env bash
# The man pages say what the binaries do: every flag of `hisparsed --help` and every exit status
# hisparsed_main.cc and daemon.h define are in docs/man/hisparsed.8; every exit status of ctl.h is
# in the page `hisparse-ctl man` prints; both pages render without warnings where man is installed.
#   man_pages_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src="$1"
bin="$2"
page="$src/docs/man/hisparsed.8"
bad=0
# Flags: roff writes "--x" as "\-\-x".
for flag in $("$bin/hisparsed" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
  grep -qF -- "\\-\\-${flag#--}" "$page" || { echo "hisparsed.8 lacks $flag (hisparsed --help has it)"; bad=1; }
done
# Exit statuses: each constant's value as a ".B N" entry of EXIT STATUS.
exit_section="$(sed -n '/^\.SH EXIT STATUS/,/^\.SH /p' "$page")"
codes="0 $(grep -hoE 'k(Exit[A-Za-z]+|DrainedExitCode) = [0-9]+' "$src/daemon/hisparsed_main.cc" \
  "$src/daemon/include/hisparse/daemon/daemon.h" | grep -oE '[0-9]+$' | sort -un | tr '\n' ' ')"
for code in $codes; do
  grep -qx "\.B $code" <<<"$exit_section" || { echo "hisparsed.8: EXIT STATUS lacks $code"; bad=1; }
done
ctl_page="$("$bin/hisparse-ctl" man)"
while read -r code; do
  grep -A2 '^\.SH EXIT STATUS' <<<"$ctl_page" | grep -qE "(^|[ ;])${code}[ ;(]" ||
    { echo "hisparse-ctl man: EXIT STATUS lacks $code"; bad=1; }
done < <(grep -oE 'kExit[A-Za-z]+ = [0-9]+' "$src/client/ctl/ctl.h" | grep -oE '[0-9]+$')
if command -v man >/dev/null; then
  ctl_file="$(mktemp /tmp/hisparse-ctl.8.XXXXXX)"
  trap 'rm -f "$ctl_file"' EXIT
  printf '%s\n' "$ctl_page" >"$ctl_file"
  for p in "$page" "$ctl_file"; do
    warnings="$(MANWIDTH=80 LC_ALL=C.UTF-8 man --warnings -l "$p" 2>&1 >/dev/null || true)"
    [[ -z "$warnings" ]] || { echo "man warns on $p:"; echo "$warnings"; bad=1; }
  done
else
  echo "man not installed: rendering not checked"
fi
[[ $bad -eq 0 ]] && echo "man pages: hisparsed.8 has every flag and exit status ($codes), hisparse-ctl's every exit status"
exit $bad

#!/usr/bin/env bash
# check_analysis.sh CXX INCLUDE_DIRS FLAGS...: the build's thread-safety flags accept violation.cc
# with its accesses locked and reject it, naming -Wthread-safety, with them unlocked. Fails when
# the analysis is off (flags missing, a compiler that ignores them, annotations that expand to
# nothing), which would leave every ABSL_GUARDED_BY in the tree unchecked.
set -uo pipefail
cxx=$1 includes=$2
shift 2
src="$(dirname "$0")/violation.cc"
inc=()
IFS=';' read -ra dirs <<< "$includes"
for d in "${dirs[@]}"; do  # the compiler's own system folders stay its own (include_next)
  [[ -n $d && $d != /usr/include && $d != /usr/local/include ]] && inc+=(-isystem "$d")
done

if ! out=$("$cxx" -std=c++17 -fsyntax-only "${inc[@]}" "$@" -DHISPARSE_TSA_CORRECT "$src" 2>&1); then
  echo "FAIL: the correctly locked version does not compile:"; echo "$out"; exit 1
fi
if out=$("$cxx" -std=c++17 -fsyntax-only "${inc[@]}" "$@" "$src" 2>&1); then
  echo "FAIL: unlocked accesses to ABSL_GUARDED_BY members compiled: the analysis is not enforced"; exit 1
fi
for want in "requires holding mutex 'mu_'" "reading variable 'value_' requires holding mutex 'mu_'" \
            "-Werror,-Wthread-safety"; do
  if [[ $out != *"$want"* ]]; then
    echo "FAIL: the compiler refused the unlocked version, but not with \"$want\":"; echo "$out"; exit 1
  fi
done
echo "ok: the thread-safety analysis is enforced (2 violations refused)"

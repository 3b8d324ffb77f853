#!/usr/bin/env bash
# The wheel an engine's image installs (issue 40): built from the self-contained libhisparse, it
# (1) exports only the C ABI and needs nothing but glibc (libc, libm, libpthread, libdl, librt,
#     the loader) and, at run time, the CUDA driver, which it dlopens (never a NEEDED entry); a
#     CUDA build also needs libcudart.so.13, which the wheel must carry beside it;
# (2) is tagged manylinux_2_NN_x86_64 with NN the newest GLIBC_ version it needs, at most 35
#     (Ubuntu 22.04, the oldest base of the engines' images);
# (3) installs with `pip install --no-index` into a fresh venv and, with nothing on
#     LD_LIBRARY_PATH and no HISPARSE_LIB, loads its own library and drives a real hisparsed on
#     the host backend: open a session, admit, store, resolve, release;
# (4) carries hisparse-ctl, which pip puts in the venv's bin/: it needs nothing but glibc
#     (libstdc++ and libgcc linked in), runs from there with nothing on LD_LIBRARY_PATH, reads the
#     same daemon's status, and its --version, hisparsed's and hisparse.__version__ agree.
# Arguments: BUILD_DIR SOURCE_DIR.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "wheel_test: FAIL: $*" >&2; exit 1; }

wheel=$("$src/tools/build-wheel.sh" "$build" "$tmp/dist" | tail -1)
echo "wheel: $(basename "$wheel")"
python3 -m zipfile -e "$wheel" "$tmp/unpacked"
lib=$tmp/unpacked/hisparse/libhisparse.so
[[ -f $lib ]] || fail "the wheel carries no hisparse/libhisparse.so"

# (1) What the library needs from the system.
allowed_needed='^(libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2)$'
needed=$(objdump -p "$lib" | awk '$1 == "NEEDED" {print $2}')
echo "NEEDED: ${needed//$'\n'/ }"
# A CUDA build also needs the CUDA runtime, which must then ride in the wheel beside it.
for cudart in $(echo "$needed" | grep '^libcudart\.so\.[0-9]*$' || true); do
  [[ -f $tmp/unpacked/hisparse/$cudart ]] || fail "needs $cudart but the wheel does not carry it"
  allowed_needed="${allowed_needed%)\$}|${cudart//./\\.})\$"
done
bad=$(echo "$needed" | grep -Ev "$allowed_needed" || true)
[[ -z $bad ]] || fail "needs libraries beyond glibc: $bad"
dynsym=$(objdump -T "$lib" | awk '/^[0-9a-f]+ /')
# Undefined: glibc's versioned symbols; unversioned ones only weak and only these (toolchain
# hooks, and thread_local init functions of variables without dynamic initialization).
bad=$(echo "$dynsym" | awk '$0 ~ /\*UND\*/' | grep -v '(GLIBC_2\.[0-9.]*)' | grep -v '(libcudart\.so\.[0-9]*)' |
  grep -Ev '^[0-9a-f]+ +w +D +\*UND\*.* (__gmon_start__|_ITM_(de)?registerTMCloneTable|__cxa_pure_virtual|_ZTH[A-Za-z0-9_]+)$' || true)
[[ -z $bad ]] || fail "undefined symbols beyond glibc: $(echo "$bad" | awk '{print $NF}' | head -5)"
echo "$dynsym" | grep -q 'GLIBCXX\|CXXABI\|GCC_' && fail "needs the system's libstdc++ or libgcc_s"
exported=$(echo "$dynsym" | awk '$0 !~ /\*UND\*/ {print $NF}')
bad=$(echo "$exported" | grep -v '^hs_' || true)
[[ -z $bad ]] || fail "exports more than the C ABI (hs_*): $(echo "$bad" | head -5)"
echo "$exported" | grep -qx hs_session_open || fail "hs_session_open is not exported"

# (4, statically) hisparse-ctl: glibc only, and no GLIBC_ version newer than the library's tag.
ctl=$tmp/unpacked/$(basename "$wheel" | cut -d- -f1-2).data/scripts/hisparse-ctl
[[ -f $ctl ]] || fail "the wheel carries no <dist>.data/scripts/hisparse-ctl"
ctl_needed=$(objdump -p "$ctl" | awk '$1 == "NEEDED" {print $2}')
echo "hisparse-ctl NEEDED: ${ctl_needed//$'\n'/ }"
bad=$(echo "$ctl_needed" | grep -Ev '^(libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2)$' || true)
[[ -z $bad ]] || fail "hisparse-ctl needs libraries beyond glibc: $bad"
ctl_dynsym=$(objdump -T "$ctl" | awk '/^[0-9a-f]+ /')
bad=$(echo "$ctl_dynsym" | awk '$0 ~ /\*UND\*/' | grep -v '(GLIBC_2\.[0-9.]*)' |
  grep -Ev '^[0-9a-f]+ +w +D +\*UND\*.* (__gmon_start__|_ITM_(de)?registerTMCloneTable|_ZTH[A-Za-z0-9_]+)$' || true)
[[ -z $bad ]] || fail "hisparse-ctl: undefined symbols beyond glibc: $(echo "$bad" | awk '{print $NF}' | head -5)"

# (2) The tag follows the newest glibc version needed.
newest=$(printf '%s\n%s\n' "$dynsym" "$ctl_dynsym" | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n | tail -1)
minor=${newest#GLIBC_2.}
echo "newest glibc symbol version: $newest"
[[ $wheel == *"-py3-none-manylinux_2_${minor}_x86_64.whl" ]] || fail "$(basename "$wheel") is not tagged manylinux_2_${minor}"
((minor <= 35)) || fail "needs $newest, newer than Ubuntu 22.04's glibc 2.35"

# (3) A fresh venv, offline; run from $tmp so that the source tree is not on the path.
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --disable-pip-version-check "$wheel"
cd "$tmp"
env -u LD_LIBRARY_PATH -u HISPARSE_LIB -u PYTHONPATH "$tmp/venv/bin/python" - "$build/bin/hisparsed" "$tmp/venv" <<'PY' ||
import array, ctypes, ctypes.util, json, os, subprocess, sys
daemon_binary, venv = sys.argv[1:]
# An engine's process holds its own gRPC and protobuf: load this machine's, globally, first. The
# wheel's library must keep to its own copies (they are hidden in it) and still work.
others = [ctypes.util.find_library(n) for n in ("protobuf", "grpc++", "absl_base")]
for other in filter(None, others):
    ctypes.CDLL(other, mode=ctypes.RTLD_GLOBAL)
import hisparse
lib = os.path.realpath(hisparse.library_path())
assert lib.startswith(os.path.realpath(venv) + "/"), f"loaded {lib}, not the wheel's own library"
assert hisparse.__version__ == hisparse.version(), (hisparse.__version__, hisparse.version())
LAYERS, RECORD, K, B = 2, 32, 4, 8
with hisparse.Daemon(binary=daemon_binary, host_pool_size="64MiB", metrics_listen="") as d, \
        hisparse.Session(d, num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=2,
                         backend="host") as s:
    info = s.admit(7, 6, 16)
    prompt = bytearray(os.urandom(LAYERS * 6 * RECORD))
    s.store(7, prompt, num_tokens=6)
    rows = array.array("i", [info.row])
    seq = array.array("i", [6])
    positions = array.array("i", [0, 3, 5, -1])
    out = array.array("i", [0] * K)
    s.resolve(1, rows, seq, positions, out)
    assert list(out) == [0, 3, B, -1], list(out)  # resident after prefill (rule 5); newest -> slot B
    s.release(7)
    # (4) The wheel's hisparse-ctl, from the venv's bin/, reads the same daemon (LD_LIBRARY_PATH
    # is unset for this whole process).
    ctl = os.path.join(venv, "bin", "hisparse-ctl")
    st = json.loads(subprocess.run([ctl, "--daemon", d.address, "--json", "status"], check=True,
                                   capture_output=True, text=True).stdout)
    assert st["health"] == "SERVING" and st["sessions"] == 1 and st["version"] == hisparse.__version__, st
# (4) One version: the wheel's package, its hisparse-ctl and the daemon it drove.
versions = {"hisparse.__version__": hisparse.__version__,
            "hisparse-ctl --version": subprocess.run([ctl, "--version"], check=True, capture_output=True,
                                                     text=True).stdout.split()[-1],
            "hisparsed --version": subprocess.run([daemon_binary, "--version"], check=True, capture_output=True,
                                                  text=True).stdout.split()[-1]}
assert len(set(versions.values())) == 1, f"versions disagree: {versions}"
print(f"wheel_test: hisparse {hisparse.__version__} from {lib}, beside {len(list(filter(None, others)))} other "
      "gRPC/protobuf/Abseil libraries: open, admit, store, resolve, release OK; the venv's hisparse-ctl read the "
      f"daemon's status; {versions}")
PY
  fail "the installed package could not drive the daemon"

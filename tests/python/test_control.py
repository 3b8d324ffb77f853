"""Control path against a real hisparsed: sessions, admission, stats, errors and cleanup."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess

import pytest

import hisparse
from hisparse import _lib
from conftest import REPO, wait_for


def test_library_loads_once_with_every_signature_declared():
    lib = _lib.load()
    assert _lib.load() is lib
    assert hisparse.abi_version() == hisparse.ABI_VERSION
    assert hisparse.abi_version_full() == (hisparse.ABI_VERSION, hisparse.ABI_VERSION_MINOR)
    for name, (restype, argtypes) in _lib._SIGNATURES.items():
        assert getattr(lib, name).argtypes == argtypes and getattr(lib, name).restype == restype, name
    assert os.path.exists(hisparse.library_path())


# The C types of hisparse.h's parameters, as ctypes declares them. Enums are ints.
_C_SCALARS = {"uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32,
              "int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t, "int": ctypes.c_int, "double": ctypes.c_double,
              "hs_result": ctypes.c_int, "hs_batch_mode": ctypes.c_int, "hs_backend": ctypes.c_int,
              "hs_session_state": ctypes.c_int}


def _header_functions():
    """name -> (return type, [parameter types]) of every function hisparse.h declares, each type
    as written without const and spaces ("uint64_t*", "hs_session*")."""
    text = (REPO / "client" / "include" / "hisparse" / "hisparse.h").read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#.*$", " ", text.replace("\\\n", " "), flags=re.M)  # preprocessor lines, continued ones too
    out = {}
    for chunk in text.split(";"):
        m = re.match(r"\s*(?:extern\s+\"C\"\s*\{)?\s*([\w\s\*]+?)\s*\b(hs_\w+)\s*\(([^()]*)\)\s*$", chunk, re.S)
        if m is None:
            continue
        ret, name, params = m.groups()
        types = []
        for p in params.split(","):
            p = re.sub(r"\bconst\b", " ", p).strip()
            if p in ("", "void"):
                continue
            p = re.sub(r"\s+\w+$", "", p)  # the parameter's name
            types.append(re.sub(r"\s+", "", p))
        out[name] = (re.sub(r"\s+", "", re.sub(r"\bconst\b", " ", ret)), types)
    return out


def _ctypes_for(c_type):
    """What ctypes declarations may stand for C type c_type (a set: a data array may be passed as
    an address, c_void_p)."""
    base, stars = c_type.rstrip("*"), len(c_type) - len(c_type.rstrip("*"))
    structs = {c: getattr(_lib, py) for py, c in _C_STRUCTS.items()}
    if stars == 0:
        return {None} if base == "void" else {_C_SCALARS[base]}
    if base == "hs_session":
        return {_lib.SessionPtr} if stars == 1 else {ctypes.POINTER(_lib.SessionPtr)}
    if base == "void":
        return {ctypes.c_void_p} if stars == 1 else {ctypes.POINTER(ctypes.c_void_p)}
    if base == "char":
        return {ctypes.c_char_p}
    if base in structs:
        return {ctypes.POINTER(structs[base])}
    return {ctypes.POINTER(_C_SCALARS[base]), ctypes.c_void_p}


def test_ctypes_signatures_match_the_header():
    """Every function hisparse.h declares is declared in _lib._SIGNATURES, and nothing else, with
    the header's return type and one ctypes type per parameter that stands for the header's (a
    missing function, a parameter too many or too few, or a uint32_t declared as a uint64_t fails)."""
    header = _header_functions()
    raw = (REPO / "client" / "include" / "hisparse" / "hisparse.h").read_text()
    declared = re.findall(r"^(?:hs_result|void|int|const char\*) (hs_\w+)\(", raw, re.M)
    assert sorted(header) == sorted(declared), "the parser missed a declaration"
    assert set(header) == set(_lib._SIGNATURES), (set(header) ^ set(_lib._SIGNATURES))
    for name, (ret, params) in header.items():
        restype, argtypes = _lib._SIGNATURES[name]
        assert restype in _ctypes_for(ret), f"{name} returns {ret}, declared {restype}"
        assert len(argtypes) == len(params), f"{name} takes {len(params)} parameters, declared {len(argtypes)}"
        for i, (c_type, declared) in enumerate(zip(params, argtypes)):
            assert declared in _ctypes_for(c_type), f"{name} parameter {i} is {c_type}, declared {declared}"


def test_version_is_the_projects():
    """One release string: CMakeLists.txt's project(VERSION), the library's hs_version() (generated
    from it) and the package's __version__ (which pip reads) agree."""
    cmake = (REPO / "CMakeLists.txt").read_text()
    project = re.search(r"project\(hisparse VERSION ([0-9.]+)", cmake).group(1)
    assert hisparse.version() == project
    assert hisparse.__version__ == project


# The C name of each ctypes mirror in _lib.
_C_STRUCTS = {"SessionOptions": "hs_session_options", "RequestInfo": "hs_request_info",
              "SessionInfo": "hs_session_info", "Stats": "hs_stats", "ResolveArgs": "hs_resolve_args",
              "StoreIndexedArgs": "hs_store_indexed_args", "AdmitArgs": "hs_admit_args",
              "Recovery": "hs_recovery", "RecoveredRequest": "hs_recovered_request",
              "SessionTimings": "hs_session_timings", "TopkArgs": "hs_topk_args",
              "PrewarmArgs": "hs_prewarm_args"}


def test_ctypes_structs_match_the_header(tmp_path):
    """Every ctypes mirror has the header's size and every field its offset, as a C compiler lays
    them out (a field declared in the wrong place or with the wrong type fails here)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = []
    for py, c in _C_STRUCTS.items():
        lines.append(f'printf("{py} size %zu\\n", sizeof({c}));')
        for name, *_ in getattr(_lib, py)._fields_:
            lines.append(f'printf("{py} {name} %zu\\n", offsetof({c}, {name}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"hisparse/hisparse.h\"\nint main(void) {\n"
                   + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", str(REPO / "client" / "include"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    c_layout = {tuple(line.split()[:2]): int(line.split()[2]) for line in out.splitlines()}
    assert set(_C_STRUCTS) <= {k[0] for k in c_layout}
    for py in _C_STRUCTS:
        cls = getattr(_lib, py)
        assert ctypes.sizeof(cls) == c_layout[(py, "size")], py
        for name, *_ in cls._fields_:
            assert getattr(cls, name).offset == c_layout[(py, name)], f"{py}.{name}"


def test_open_reports_geometry_and_host_backend(open_session):
    s = open_session(num_layers=3, record_bytes=80, k=4, slots=6, max_requests=2)
    info = s.info()
    assert info.backend == "host" and s.backend == "host"
    assert info.slots == 6
    assert info.record_stride >= 80
    assert info.slot_base != 0
    assert info.arena_bytes >= 2 * 3 * 7 * 80
    assert info.arena_kind == "host"  # a host-emulated daemon shares a memfd arena
    assert s.slot_view().shape == (2, 3, 7, info.record_stride)


def test_timings_say_where_the_open_and_the_slabs_went(open_session):
    s = open_session()
    before = s.timings()
    assert before["open_total_s"] > 0 and before["open_rpc_s"] > 0
    assert before["open_rpc_s"] <= before["open_total_s"]
    s.admit(1, context_tokens=10, token_budget=64)
    after = s.timings()
    assert after["slabs_mapped"] >= 1 and after["slab_bytes_mapped"] > 0
    assert after["open_total_s"] == before["open_total_s"]
    s.release(1)


def test_admit_extend_release_and_stats(open_session):
    s = open_session(record_bytes=64, max_requests=2)
    base = s.stats()
    assert base.session_requests == 0 and base.session_host_bytes == 0
    r = s.admit(7, context_tokens=100, token_budget=128)
    assert 0 <= r.row < 2 and r.capacity_tokens >= 128
    st = s.stats()
    assert st.session_requests == 1
    assert st.session_host_bytes >= 2 * 128 * 64
    assert st.pool_used_bytes >= base.pool_used_bytes + 2 * 128 * 64
    grown = s.extend(7, token_budget=4096)
    assert grown.row == r.row and grown.capacity_tokens >= 4096
    assert s.record_ptr(7, 1, 4095) != 0
    s.release(7)
    end = s.stats()
    assert end.session_requests == 0 and end.session_host_bytes == 0
    assert end.pool_used_bytes == base.pool_used_bytes


@pytest.mark.parametrize("lane", [True, False])
def test_lifecycle_calls_answer_the_same_over_the_lane_and_grpc(open_session, monkeypatch, lane):
    # The library reads HISPARSE_CONTROL_LANE when a session opens (client/client_lane.cc).
    if not lane:
        monkeypatch.setenv("HISPARSE_CONTROL_LANE", "0")
    s = open_session(max_requests=2)
    assert s.info().control_lane is lane
    s.admit(1, context_tokens=10, token_budget=64)
    with pytest.raises(hisparse.AlreadyExists, match="admit: request 1"):
        s.admit(1, context_tokens=10, token_budget=64)
    s.park(1)
    s.resume(1)
    assert s.extend(1, token_budget=1024).capacity_tokens >= 1024
    s.release(1)
    with pytest.raises(hisparse.NotFound, match="release: "):
        s.release(1)
    assert s.stats().session_requests == 0


def test_errors_carry_the_daemons_message(open_session):
    s = open_session()
    s.admit(1, 10, 16)
    with pytest.raises(hisparse.AlreadyExists, match="already admitted"):
        s.admit(1, 10, 16)
    with pytest.raises(hisparse.NotFound, match="request 99") as e:
        s.release(99)
    assert isinstance(e.value, LookupError) and e.value.code == _lib.HS_ERR_NOT_FOUND
    with pytest.raises(hisparse.NotFound):
        s.extend(99, 32)
    with pytest.raises(hisparse.InvalidArgument, match="position 16") as e:
        s.record_ptr(1, 0, 16)
    assert isinstance(e.value, ValueError)
    with pytest.raises(hisparse.InvalidArgument, match="layer 5"):
        s.record_ptr(1, 5, 0)
    with pytest.raises(hisparse.InvalidArgument, match="token_budget"):
        s.admit(2, 10, 0)


def test_bad_geometry_is_invalid_argument(daemon):
    with pytest.raises(hisparse.InvalidArgument) as e:
        hisparse.Session(daemon, num_layers=2, record_bytes=64, k=16, slots=8, max_requests=1, backend="host")
    assert str(e.value).startswith("open session: ") and len(str(e.value)) > len("open session: ")
    with pytest.raises(hisparse.InvalidArgument):
        hisparse.Session(daemon, num_layers=2, record_bytes=65, k=4, slots=8, max_requests=1, backend="host")
    with pytest.raises(hisparse.InvalidArgument, match="backend"):
        hisparse.Session(daemon, num_layers=2, record_bytes=64, k=4, slots=8, max_requests=1, backend="tpu")


def test_full_pool_is_resource_exhausted(open_session):
    s = open_session(num_layers=4, record_bytes=4096, max_requests=4)
    # 4 layers x 4096 tokens x 4 KiB = 64 MiB a request: the 256 MiB pool holds at most four.
    with pytest.raises(hisparse.ResourceExhausted):
        for rid in range(1, 6):
            s.admit(rid, 4096, 4096)
    for rid in range(1, 6):
        try:
            s.release(rid)
        except hisparse.NotFound:
            pass
    assert s.stats().session_host_bytes == 0


def test_poll_evicted_names_what_pool_pressure_took():
    """evict_lru_idle: a full pool evicts the oldest idle request of the tenant; its session hears
    the id through poll_evicted (once), the request is gone, and the newcomer is admitted."""
    import time
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB",
                                     "--set", "admission.on_pool_full=evict_lru_idle"]) as d:
        with hisparse.Session(d, num_layers=4, record_bytes=64, k=4, slots=8, max_requests=32) as old, \
                hisparse.Session(d, num_layers=4, record_bytes=64, k=4, slots=8, max_requests=32) as new:
            assert old.poll_evicted() == []
            with pytest.raises(hisparse.InvalidArgument):
                old.poll_evicted(0)
            for rid in range(1, 17):  # 16 x 4 layers x 250 pages of 4 KiB fill the 64 MiB pool
                old.admit(rid, 10, 16000)
            new.admit(100, 10, 16000)
            evicted, deadline = [], time.monotonic() + 10
            while not evicted and time.monotonic() < deadline:
                evicted = old.poll_evicted()
                time.sleep(0.01)
            assert evicted == [1]
            assert old.poll_evicted() == []  # told once
            with pytest.raises(hisparse.NotFound):
                old.release(1)
            for rid in range(2, 17):
                old.release(rid)
            new.release(100)


def test_unreachable_daemon_is_unavailable(tmp_path):
    with pytest.raises(hisparse.Unavailable, match="cannot reach"):
        hisparse.Session(f"unix:{tmp_path}/nobody.sock", num_layers=1, record_bytes=16, k=1, slots=1,
                         max_requests=1, backend="host", timeout_ms=200)


def test_closed_session_raises_unavailable(open_session):
    s = open_session()
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(hisparse.Unavailable, match="closed"):
        s.admit(1, 1, 1)


def test_context_manager_returns_everything(daemon, open_session):
    observer = open_session()
    before = observer.stats()
    with hisparse.Session(daemon, num_layers=2, record_bytes=64, k=4, slots=8, max_requests=4,
                          backend="host") as s:
        for rid in range(1, 4):
            s.admit(rid, 100, 200)
        during = observer.stats()
        assert during.requests == before.requests + 3
        assert during.sessions == before.sessions + 1
        assert during.pool_used_bytes > before.pool_used_bytes
    assert s.closed

    def back_to_zero():
        st = observer.stats()
        return st.requests == before.requests and st.sessions == before.sessions and \
            st.pool_used_bytes == before.pool_used_bytes

    wait_for(back_to_zero, what="the daemon to release the closed session")


def test_daemon_context_manager_stops_and_cleans_up():
    d = hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="16MiB")
    with d:
        address = d.address
        path = address[len("unix:"):]
        assert os.path.exists(path) and d.running()
        with hisparse.Session(address, num_layers=1, record_bytes=16, k=1, slots=1, max_requests=1,
                              backend="host") as s:
            assert s.stats().pool_capacity_bytes == 64 << 20
    assert not d.running() and not os.path.exists(os.path.dirname(path))
    with pytest.raises(hisparse.Unavailable):
        d.address


def test_session_after_daemon_stop_is_unavailable():
    d = hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="16MiB").start()
    s = hisparse.Session(d, num_layers=1, record_bytes=16, k=1, slots=1, max_requests=1, backend="host",
                         timeout_ms=500)
    d.stop()
    try:
        with pytest.raises(hisparse.Unavailable):
            wait_for(lambda: _admit_fails(s), what="the session to notice the daemon stopped")
            s.admit(1, 1, 1)
    finally:
        s.close()


def _admit_fails(s) -> bool:
    try:
        s.admit(1, 1, 1)
        s.release(1)
        return False
    except hisparse.Unavailable:
        return True

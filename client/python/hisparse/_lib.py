"""Loading libhisparse and declaring its C ABI (client/include/hisparse/hisparse.h) with ctypes.

The library is loaded once per process, on first use, and every function's argtypes and restype
are declared here, so a mismatch between this file and the header shows up as a clear error
rather than as a corrupted call. The ctypes.Structure classes mirror the header's structs field
for field; callers build them with the ``new_*`` helpers, which set ``struct_size`` the way the
header's ``*_INIT`` macros do.

Search order for the library (the first that exists wins):
  1. $HISPARSE_LIB (a file path; an error if it is set but cannot be loaded);
  2. beside the package: hisparse/libhisparse.so*, hisparse/lib/libhisparse.so*;
  3. the source tree's build: <repo>/build/lib/libhisparse.so (client/python/../../build/lib);
  4. the system: ctypes.util.find_library("hisparse") (ldconfig's cache, LD_LIBRARY_PATH).

Thread-safety: loading is guarded by a lock; the declared functions may be called from any
thread (hs_last_error is per calling thread, and ctypes releases the GIL during each call).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import threading
from typing import List, Optional

# The C ABI this package speaks (hisparse.h): HS_ABI_VERSION_MAJOR, and the least
# HS_ABI_VERSION_MINOR whose functions it declares. ABI_VERSION is the major, as it always was.
ABI_VERSION = 1
ABI_VERSION_MINOR = 19

# hs_result
HS_OK = 0
HS_ERR_INVALID_ARGUMENT = 1
HS_ERR_NOT_FOUND = 2
HS_ERR_ALREADY_EXISTS = 3
HS_ERR_RESOURCE_EXHAUSTED = 4
HS_ERR_PERMISSION_DENIED = 5
HS_ERR_FAILED_PRECONDITION = 6
HS_ERR_UNAVAILABLE = 7
HS_ERR_UNIMPLEMENTED = 8
HS_ERR_INTERNAL = 9
HS_ERR_ABORTED = 10  # ABI 1.6: a batch item not done because another item failed the batch

# hs_batch_mode (ABI 1.6)
HS_BATCH_ALL_OR_NOTHING = 1
HS_BATCH_PER_ITEM = 2
HS_BATCH_MAX_ITEMS = 1024

# hs_backend
HS_BACKEND_AUTO = 0
HS_BACKEND_HOST = 1
HS_BACKEND_CUDA = 2


class SessionOptions(ctypes.Structure):
    """hs_session_options."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("daemon_address", ctypes.c_char_p),
        ("engine_name", ctypes.c_char_p),
        ("gpu", ctypes.c_int32),
        ("num_layers", ctypes.c_uint32),
        ("record_bytes", ctypes.c_uint32),
        ("k", ctypes.c_uint32),
        ("slots", ctypes.c_uint32),
        ("max_requests", ctypes.c_uint32),
        ("backend", ctypes.c_int),  # enum hs_backend
        ("timeout_ms", ctypes.c_uint32),
        ("layer_anchor", ctypes.POINTER(ctypes.c_int32)),  # ABI 1.1
        ("draft_tokens", ctypes.c_uint32),  # ABI 1.4
        ("max_context_tokens", ctypes.c_uint32),  # ABI 1.6
        ("group", ctypes.c_char_p),  # ABI 1.7
        ("group_rank", ctypes.c_uint32),  # ABI 1.7
        ("group_size", ctypes.c_uint32),  # ABI 1.7
    ]


class RequestInfo(ctypes.Structure):
    """hs_request_info."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("row", ctypes.c_uint32),
        ("capacity_tokens", ctypes.c_uint32),
        ("moved", ctypes.c_uint32),
    ]


class SessionInfo(ctypes.Structure):
    """hs_session_info."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("session_id", ctypes.c_uint64),
        ("backend", ctypes.c_int),
        ("slot_base", ctypes.c_void_p),
        ("record_stride", ctypes.c_uint64),
        ("slots", ctypes.c_uint32),
        ("max_tokens_per_request", ctypes.c_uint32),
        ("arena_bytes", ctypes.c_uint64),
        ("arena_kind", ctypes.c_int),
        ("draft_tokens", ctypes.c_uint32),  # ABI 1.4
        ("control_lane", ctypes.c_uint32),  # ABI 1.12
    ]


class Stats(ctypes.Structure):
    """hs_stats."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("pool_capacity_bytes", ctypes.c_uint64),
        ("pool_used_bytes", ctypes.c_uint64),
        ("pool_free_bytes", ctypes.c_uint64),
        ("pool_fragmentation", ctypes.c_double),
        ("sessions", ctypes.c_uint32),
        ("requests", ctypes.c_uint32),
        ("session_requests", ctypes.c_uint32),
        ("session_host_bytes", ctypes.c_uint64),
        ("hits", ctypes.c_uint64),
        ("misses", ctypes.c_uint64),
        ("bytes_fetched", ctypes.c_uint64),
    ]


class SessionTimings(ctypes.Structure):
    """hs_session_timings (ABI 1.12)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("open_rpc_s", ctypes.c_double),
        ("daemon_create_s", ctypes.c_double),
        ("backend_init_s", ctypes.c_double),
        ("fetch_arena_s", ctypes.c_double),
        ("import_s", ctypes.c_double),
        ("map_s", ctypes.c_double),
        ("attach_s", ctypes.c_double),
        ("open_total_s", ctypes.c_double),
        ("slabs_mapped", ctypes.c_uint32),
        ("slab_bytes_mapped", ctypes.c_uint64),
        ("slab_fetch_s", ctypes.c_double),
        ("slab_mmap_s", ctypes.c_double),
        ("slab_register_s", ctypes.c_double),
    ]


class Recovery(ctypes.Structure):
    """hs_recovery (ABI 1.11)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("attempts", ctypes.c_uint32),
        ("old_session_id", ctypes.c_uint64),
        ("new_session_id", ctypes.c_uint64),
        ("kept", ctypes.c_size_t),
        ("lost", ctypes.c_size_t),
        ("seconds", ctypes.c_double),
        ("arena_moved", ctypes.c_uint32),
        ("reopen_seconds", ctypes.c_double),
    ]


class RecoveredRequest(ctypes.Structure):
    """hs_recovered_request (ABI 1.11)."""

    _fields_ = [
        ("request_id", ctypes.c_uint64),
        ("row", ctypes.c_int32),
        ("capacity_tokens", ctypes.c_uint32),
    ]


# hs_session_state (ABI 1.11)
HS_SESSION_LIVE = 0
HS_SESSION_ENDED = 1

# hs_resolve_args.launch_flags (ABI 1.9)
HS_RESOLVE_LAUNCH_PROGRAMMATIC = 0x1
HS_RESOLVE_LAUNCH_BESIDE = 0x2  # ABI 1.14
HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS = 0x4  # ABI 1.15


class ResolveArgs(ctypes.Structure):
    """hs_resolve_args."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("layer", ctypes.c_uint32),
        ("max_batch", ctypes.c_int32),
        ("batch_size", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("seq_lens", ctypes.c_void_p),
        ("positions", ctypes.c_void_p),
        ("out_slots", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
        ("page_table", ctypes.c_void_p),  # ABI 1.3
        ("page_records", ctypes.c_int32),
        ("page_offset", ctypes.c_int32),
        ("query_counts", ctypes.c_void_p),  # ABI 1.4
        ("launch_flags", ctypes.c_uint32),  # ABI 1.9
        ("max_blocks", ctypes.c_int32),  # ABI 1.13
        ("consumer_warps", ctypes.c_int32),  # ABI 1.15
    ]


class StoreIndexedArgs(ctypes.Structure):
    """hs_store_indexed_args (ABI 1.3)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("request_id", ctypes.c_uint64),
        ("first_layer", ctypes.c_uint32),
        ("num_layers", ctypes.c_uint32),
        ("start_pos", ctypes.c_int32),
        ("num_tokens", ctypes.c_int32),
        ("seq_len_after", ctypes.c_int32),
        ("src_base", ctypes.c_void_p),
        ("src_index", ctypes.c_void_p),
        ("src_tokens", ctypes.c_int64),
        ("src_layer_stride", ctypes.c_int64),
        ("src_token_stride", ctypes.c_int64),
        ("stream", ctypes.c_void_p),
    ]


# hs_admit_args.flags (ABI 1.10)
HS_ADMIT_GROUP = 0x1
HS_ADMIT_IMPORT = 0x2


class AdmitArgs(ctypes.Structure):
    """hs_admit_args (ABI 1.10): one admission with every option."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("request_id", ctypes.c_uint64),
        ("context_tokens", ctypes.c_uint32),
        ("token_budget", ctypes.c_uint32),
        ("parent_request_id", ctypes.c_uint64),
        ("prefix_tokens", ctypes.c_uint32),
        ("lease_seconds", ctypes.c_uint32),
    ]


def _new(cls):
    value = cls()
    value.struct_size = ctypes.sizeof(cls)
    return value


def new_session_options() -> SessionOptions:
    """HS_SESSION_OPTIONS_INIT: gpu -1, backend AUTO, everything else zero."""
    o = _new(SessionOptions)
    o.gpu = -1
    o.backend = HS_BACKEND_AUTO
    return o


def new_request_info() -> RequestInfo:
    return _new(RequestInfo)


def new_session_info() -> SessionInfo:
    return _new(SessionInfo)


def new_session_timings() -> SessionTimings:
    return _new(SessionTimings)


def new_stats() -> Stats:
    return _new(Stats)


def new_recovery() -> Recovery:
    return _new(Recovery)


def new_resolve_args() -> ResolveArgs:
    return _new(ResolveArgs)


def new_store_indexed_args() -> StoreIndexedArgs:
    return _new(StoreIndexedArgs)


def new_admit_args() -> AdmitArgs:
    return _new(AdmitArgs)


class TopkArgs(ctypes.Structure):
    """hs_topk_args (ABI 1.16; after_count and after_target since 1.17)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device", ctypes.c_int32),
        ("max_batch", ctypes.c_int32),
        ("k", ctypes.c_int32),
        ("cols", ctypes.c_int32),
        ("ld", ctypes.c_int64),
        ("scores", ctypes.c_void_p),
        ("batch_size", ctypes.c_void_p),
        ("seq_lens", ctypes.c_void_p),
        ("positions", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
        ("after_count", ctypes.c_void_p),
        ("after_target", ctypes.c_int32),
    ]


def new_topk_args() -> TopkArgs:
    return _new(TopkArgs)


class PrewarmArgs(ctypes.Structure):
    """hs_prewarm_args (ABI 1.19)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("layer", ctypes.c_uint32),
        ("max_batch", ctypes.c_int32),
        ("batch_size", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("seq_lens", ctypes.c_void_p),
        ("max_blocks", ctypes.c_int32),
        ("granule_bytes", ctypes.c_uint32),
        ("stream", ctypes.c_void_p),
        ("granule_stride", ctypes.c_uint32),
        ("granule_phase", ctypes.c_uint32),
        ("launch_flags", ctypes.c_uint32),
    ]


def new_prewarm_args() -> PrewarmArgs:
    return _new(PrewarmArgs)


class _SessionHandle(ctypes.Structure):
    """The opaque hs_session (only pointers to it are used)."""


SessionPtr = ctypes.POINTER(_SessionHandle)

# name -> (restype, argtypes): the whole ABI, in the header's order.
_SIGNATURES = {
    "hs_result_string": (ctypes.c_char_p, [ctypes.c_int]),
    "hs_last_error": (ctypes.c_char_p, []),
    "hs_abi_version": (ctypes.c_int, []),
    "hs_abi_version_get": (None, [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "hs_version": (ctypes.c_char_p, []),
    "hs_session_open": (ctypes.c_int, [ctypes.POINTER(SessionOptions), ctypes.POINTER(SessionPtr)]),
    "hs_session_close": (None, [SessionPtr]),
    "hs_admit": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
                                ctypes.POINTER(RequestInfo)]),
    "hs_extend": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(RequestInfo)]),
    "hs_release": (ctypes.c_int, [SessionPtr, ctypes.c_uint64]),
    "hs_poll_evicted": (ctypes.c_int, [SessionPtr, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "hs_session_get_state": (ctypes.c_int, [SessionPtr, ctypes.POINTER(ctypes.c_int)]),  # ABI 1.11
    "hs_session_recover": (ctypes.c_int, [SessionPtr, ctypes.c_uint32, ctypes.POINTER(Recovery)]),  # ABI 1.11
    "hs_recovery_kept": (ctypes.c_int, [SessionPtr, ctypes.POINTER(RecoveredRequest), ctypes.c_size_t,  # ABI 1.11
                                        ctypes.POINTER(ctypes.c_size_t)]),
    "hs_recovery_lost": (ctypes.c_int, [SessionPtr, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,  # ABI 1.11
                                        ctypes.POINTER(ctypes.c_size_t)]),
    "hs_record_ptr": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
                                     ctypes.POINTER(ctypes.c_void_p)]),
    "hs_admit_import": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32]),  # ABI 1.6
    "hs_import_grant": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,  # ABI 1.6
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "hs_await_import": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32,  # ABI 1.6
                                       ctypes.POINTER(RequestInfo)]),
    "hs_session_get_info": (ctypes.c_int, [SessionPtr, ctypes.POINTER(SessionInfo)]),
    "hs_stats_get": (ctypes.c_int, [SessionPtr, ctypes.POINTER(Stats)]),
    "hs_session_get_timings": (ctypes.c_int, [SessionPtr, ctypes.POINTER(SessionTimings)]),  # ABI 1.12
    "hs_resolve": (ctypes.c_int, [SessionPtr, ctypes.POINTER(ResolveArgs)]),
    "hs_topk": (ctypes.c_int, [ctypes.POINTER(TopkArgs)]),  # ABI 1.16
    "hs_store": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]),
    "hs_store_indexed": (ctypes.c_int, [SessionPtr, ctypes.POINTER(StoreIndexedArgs)]),  # ABI 1.3
    "hs_append": (ctypes.c_int, [SessionPtr, ctypes.c_uint32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]),
    "hs_append_tokens": (ctypes.c_int, [SessionPtr, ctypes.c_uint32, ctypes.c_int32, ctypes.c_void_p,  # ABI 1.4
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_void_p]),
    "hs_prefetch": (ctypes.c_int, [SessionPtr, ctypes.c_uint32, ctypes.c_void_p]),
    "hs_prewarm": (ctypes.c_int, [SessionPtr, ctypes.POINTER(PrewarmArgs)]),  # ABI 1.19
    "hs_check_errors": (ctypes.c_int, [SessionPtr]),
    "hs_admit_batch": (ctypes.c_int, [SessionPtr, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64),  # ABI 1.6
                                      ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32), ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint32),
                                      ctypes.POINTER(ctypes.c_uint32)]),
    "hs_release_batch": (ctypes.c_int, [SessionPtr, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64),  # ABI 1.6
                                        ctypes.POINTER(ctypes.c_int)]),
    "hs_park_batch": (ctypes.c_int, [SessionPtr, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64),  # ABI 1.8
                                     ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
    "hs_resume_batch": (ctypes.c_int, [SessionPtr, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64),  # ABI 1.8
                                       ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint32),
                                       ctypes.POINTER(ctypes.c_uint32)]),
    "hs_admit_import_batch": (ctypes.c_int, [SessionPtr, ctypes.c_size_t,  # ABI 1.8
                                             ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
                                             ctypes.POINTER(ctypes.c_uint32), ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_int)]),
    "hs_park": (ctypes.c_int, [SessionPtr, ctypes.c_uint64]),  # ABI 1.6
    "hs_resume": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.POINTER(RequestInfo)]),  # ABI 1.6
    "hs_admit_shared": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,  # ABI 1.6
                                       ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(RequestInfo)]),
    "hs_admit_durable": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,  # ABI 1.7
                                        ctypes.c_uint32, ctypes.POINTER(RequestInfo)]),
    "hs_set_lease": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32]),  # ABI 1.7
    "hs_list_adoptable": (ctypes.c_int, [SessionPtr, ctypes.POINTER(ctypes.c_uint64),  # ABI 1.7
                                         ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_double),
                                         ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "hs_adopt": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,  # 1.7
                                ctypes.POINTER(ctypes.c_size_t)]),
    "hs_admit_group": (ctypes.c_int, [SessionPtr, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,  # ABI 1.7
                                      ctypes.POINTER(RequestInfo)]),
    "hs_admit2": (ctypes.c_int, [SessionPtr, ctypes.POINTER(AdmitArgs), ctypes.POINTER(RequestInfo)]),  # ABI 1.10
    "hs_admit_batch2": (ctypes.c_int, [SessionPtr, ctypes.c_size_t, ctypes.POINTER(AdmitArgs), ctypes.c_int,  # 1.10
                                       ctypes.POINTER(ctypes.c_int), ctypes.POINTER(RequestInfo)]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _package_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent


def candidate_paths() -> List[str]:
    """Where the library is looked for, in order ($HISPARSE_LIB is handled by load())."""
    pkg = _package_dir()
    out: List[str] = []
    for folder in (pkg, pkg / "lib"):
        for name in ("libhisparse.so", "libhisparse.so.1"):
            out.append(str(folder / name))
    # client/python/hisparse -> repo root is three levels up: <repo>/build/lib.
    repo = pkg.parent.parent.parent
    out.append(str(repo / "build" / "lib" / "libhisparse.so"))
    return out


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)  # AttributeError names a symbol the library lacks
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> ctypes.CDLL:
    """Returns the process's one libhisparse handle, loading and declaring it on first use.

    Raises OSError (with every path tried) when no library can be found or loaded, and
    RuntimeError when the library's ABI version differs from this package's.
    """
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried: List[str] = []
        env = os.environ.get("HISPARSE_LIB")
        if env:
            candidates = [env]
        else:
            candidates = [p for p in candidate_paths() if os.path.exists(p)]
            system = ctypes.util.find_library("hisparse")
            if system:
                candidates.append(system)
        lib = None
        for path in candidates:
            try:
                lib = ctypes.CDLL(path)
                _lib_path = path
                break
            except OSError as e:
                tried.append(f"{path}: {e}")
        if lib is None:
            where = "; ".join(tried) if tried else ", ".join(candidate_paths() + ["ldconfig"])
            raise OSError(
                "cannot load libhisparse (set HISPARSE_LIB to build/lib/libhisparse.so, or build it with "
                f"`cmake --build build --target hisparse`); tried: {where}")
        # hs_abi_version (the major) is in every library: check it before declaring what a
        # library of another version may lack.
        major = lib.hs_abi_version()
        if major != ABI_VERSION:
            raise RuntimeError(f"{_lib_path} has ABI version {major}; this package speaks {ABI_VERSION}")
        if not hasattr(lib, "hs_abi_version_get"):
            raise RuntimeError(f"{_lib_path} has ABI version {major}.0 or {major}.1; this package needs "
                               f"{ABI_VERSION}.{ABI_VERSION_MINOR} or later")
        _declare(lib)
        minor = ctypes.c_int(0)
        lib.hs_abi_version_get(None, ctypes.byref(minor))
        if minor.value < ABI_VERSION_MINOR:
            raise RuntimeError(f"{_lib_path} has ABI version {major}.{minor.value}; this package needs "
                               f"{ABI_VERSION}.{ABI_VERSION_MINOR} or later")
        _lib = lib
        return lib


def library_path() -> str:
    """Path of the loaded library (loads it if needed)."""
    load()
    assert _lib_path is not None
    return _lib_path

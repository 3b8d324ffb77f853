"""hisparse: Python client of hisparsed, the per-node KV memory daemon for top-k sparse attention.

A thin ctypes layer over libhisparse's C ABI (client/include/hisparse/hisparse.h):

    import hisparse
    with hisparse.Daemon() as d, hisparse.Session(d, num_layers=4, record_bytes=1152, k=2048,
                                                  slots=4096, max_requests=32, gpu=0) as s:
        info = s.admit(request_id=1, context_tokens=8192, token_budget=8192 + 512)
        s.store(1, prompt_kv)                     # [num_layers, tokens, record] torch tensor
        s.append(layer, rows, seq_lens, newest)   # every decode step, per layer
        s.resolve(layer, rows, seq_lens, positions, out_slots)
        arena = s.slot_view()                     # [rows, layers, B + 1, record_stride] uint8

Control calls work without torch; the data path takes torch tensors (CUDA backend: device
tensors and the current stream) or numpy arrays / buffers (host backend). Errors are
HisparseError subclasses named after hs_result codes, carrying the daemon's message; a failed
admission raises an AdmissionError, which is also its code's class.
See docs/INTEGRATION.md for how an engine plugs in, and examples/engine for a runnable one.
"""

from ._lib import ABI_VERSION, ABI_VERSION_MINOR, library_path
from .daemon import Daemon, find_daemon_binary
from .errors import (Aborted, AdmissionError, AlreadyExists, FailedPrecondition, HisparseError, Internal,
                     InvalidArgument, NotFound, PermissionDenied, ResourceExhausted, Unavailable, Unimplemented)
from .session import Recovery, RequestInfo, Session, SessionInfo, Stats
from .topk import topk

# The release. The one source is CMakeLists.txt's project(VERSION); this copy (which pip reads
# when it builds the package without CMake, see pyproject.toml) is held equal to it, and to the
# loaded library's version(), by tests/python/test_control.py.
__version__ = "0.1.0"


def abi_version() -> int:
    """HS_ABI_VERSION (the major) of the libhisparse actually loaded."""
    from . import _lib
    return int(_lib.load().hs_abi_version())


def abi_version_full() -> tuple:
    """(HS_ABI_VERSION_MAJOR, HS_ABI_VERSION_MINOR) of the libhisparse actually loaded."""
    import ctypes

    from . import _lib
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    _lib.load().hs_abi_version_get(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def version() -> str:
    """The release of the libhisparse actually loaded (hs_version: the build's project version)."""
    from . import _lib
    return _lib.load().hs_version().decode()


__all__ = [
    "ABI_VERSION", "ABI_VERSION_MINOR", "Aborted", "AdmissionError", "AlreadyExists", "Daemon", "FailedPrecondition", "HisparseError",
    "Internal", "InvalidArgument", "NotFound", "PermissionDenied", "Recovery", "RequestInfo", "ResourceExhausted", "Session", "SessionInfo", "Stats",
    "Unavailable", "Unimplemented", "abi_version", "abi_version_full", "find_daemon_binary", "library_path",
    "topk", "version",
]

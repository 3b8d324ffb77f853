"""HisparseError and its subclasses: one per hs_result code, carrying the library's message.

Every failed C call raises the subclass of its code with ``hs_last_error()`` as the message, so
``except hisparse.NotFound`` reads like the daemon's gRPC status. Argument checks made in Python
before a call raise the same classes (InvalidArgument for a wrong dtype, device or size).
InvalidArgument is also a ValueError and NotFound a LookupError, so generic handlers work.
"""

from __future__ import annotations

from typing import Dict, Type

from . import _lib


class HisparseError(Exception):
    """A failed hisparse call. ``code`` is the hs_result value, ``message`` the library's text."""

    code: int = _lib.HS_ERR_INTERNAL

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class InvalidArgument(HisparseError, ValueError):
    code = _lib.HS_ERR_INVALID_ARGUMENT


class NotFound(HisparseError, LookupError):
    code = _lib.HS_ERR_NOT_FOUND


class AlreadyExists(HisparseError):
    code = _lib.HS_ERR_ALREADY_EXISTS


class ResourceExhausted(HisparseError):
    code = _lib.HS_ERR_RESOURCE_EXHAUSTED


class PermissionDenied(HisparseError):
    code = _lib.HS_ERR_PERMISSION_DENIED


class FailedPrecondition(HisparseError):
    code = _lib.HS_ERR_FAILED_PRECONDITION


class Unavailable(HisparseError):
    """The daemon cannot be reached, or the session ended (open a new one)."""

    code = _lib.HS_ERR_UNAVAILABLE


class Unimplemented(HisparseError):
    code = _lib.HS_ERR_UNIMPLEMENTED


class Internal(HisparseError):
    code = _lib.HS_ERR_INTERNAL


class Aborted(HisparseError):
    """A batch item not done because another item of its all-or-nothing batch failed (ABI 1.6)."""

    code = _lib.HS_ERR_ABORTED


_BY_CODE: Dict[int, Type[HisparseError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, AlreadyExists, ResourceExhausted, PermissionDenied,
                FailedPrecondition, Unavailable, Unimplemented, Internal, Aborted)
}


def error_for(code: int, message: str) -> HisparseError:
    """The exception for an hs_result code (Internal for a code this package does not know)."""
    cls = _BY_CODE.get(code, Internal)
    return cls(message, code)


def check(code: int, what: str) -> None:
    """Raises the matching HisparseError when ``code`` is not HS_OK, with hs_last_error()."""
    if code == _lib.HS_OK:
        return
    lib = _lib.load()
    raw = lib.hs_last_error()
    detail = raw.decode("utf-8", "replace") if raw else ""
    if not detail:
        name = lib.hs_result_string(code)
        detail = name.decode() if name else f"hs_result {code}"
    raise error_for(code, f"{what}: {detail}")

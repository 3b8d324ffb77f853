"""HisparseError and its subclasses: one per hs_result code, carrying the library's message.

Every failed C call raises the subclass of its code with ``hs_last_error()`` as the message, so
``except hisparse.NotFound`` reads like the daemon's gRPC status. Argument checks made in Python
before a call raise the same classes (InvalidArgument for a wrong dtype, device or size).
InvalidArgument is also a ValueError and NotFound a LookupError, so generic handlers work.
A failed admission raises an AdmissionError, which is also its code's class.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

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


class AdmissionError(HisparseError):
    """The one error type of a failed admission (Session.admit, admit_batch, admit_import, ABI 1.10):
    ``except hisparse.AdmissionError`` catches every refusal, whatever its code. Each is also
    the class of its code (an AdmissionError that is a ResourceExhausted when the pool is full),
    so handlers written for those keep working. ``request_id`` names the request (None when the
    whole batch call failed)."""

    request_id: Optional[int] = None


_BY_CODE: Dict[int, Type[HisparseError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, AlreadyExists, ResourceExhausted, PermissionDenied,
                FailedPrecondition, Unavailable, Unimplemented, Internal, Aborted)
}

# AdmissionError joined with each code's class: "AdmissionResourceExhausted" and so on.
_ADMISSION_BY_CODE: Dict[int, Type[HisparseError]] = {
    code: type(f"Admission{cls.__name__}", (AdmissionError, cls), {"__module__": __name__})
    for code, cls in _BY_CODE.items()
}


def error_for(code: int, message: str) -> HisparseError:
    """The exception for an hs_result code (Internal for a code this package does not know)."""
    cls = _BY_CODE.get(code, Internal)
    return cls(message, code)


def admission_error_for(code: int, message: str, request_id: Optional[int] = None) -> AdmissionError:
    """The AdmissionError for an hs_result code, also of that code's class."""
    err = _ADMISSION_BY_CODE.get(code, _ADMISSION_BY_CODE[_lib.HS_ERR_INTERNAL])(message, code)
    err.request_id = request_id
    return err  # type: ignore[return-value]


def last_error(code: int) -> str:
    """hs_last_error() of this thread, or the code's name when it is empty."""
    lib = _lib.load()
    raw = lib.hs_last_error()
    detail = raw.decode("utf-8", "replace") if raw else ""
    if not detail:
        name = lib.hs_result_string(code)
        detail = name.decode() if name else f"hs_result {code}"
    return detail


def check(code: int, what: str) -> None:
    """Raises the matching HisparseError when ``code`` is not HS_OK, with hs_last_error()."""
    if code == _lib.HS_OK:
        return
    raise error_for(code, f"{what}: {last_error(code)}")


def check_admission(code: int, what: str, request_id: Optional[int] = None) -> None:
    """check() for an admission: raises an AdmissionError (of the code's class too)."""
    if code == _lib.HS_OK:
        return
    raise admission_error_for(code, f"{what}: {last_error(code)}", request_id)

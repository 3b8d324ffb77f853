"""Turning Python buffers into the raw pointers the data path takes, with checks.

Accepted, for int32 index arrays and for byte sources:
  - torch.Tensor (CPU or CUDA); contiguous; int32 where an index array is wanted;
  - objects with __cuda_array_interface__ (CuPy, Numba): device memory;
  - numpy.ndarray, ctypes arrays, bytearray / memoryview / anything with the buffer protocol:
    host memory.
Nothing here synchronizes a stream or copies device memory, so these helpers are safe inside
CUDA-graph capture. torch is imported only if the caller's object is a torch tensor.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, NamedTuple, Optional

from .errors import InvalidArgument


class Pointer(NamedTuple):
    """A validated buffer: address, size in bytes, 'cpu' or 'cuda', device index, and what keeps it alive."""

    ptr: int
    nbytes: int
    device: str
    device_index: int
    keepalive: Any


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _is_numpy_array(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


def buffer_pointer(obj: Any, name: str, *, int32: bool, writable: bool = False,
                   min_items: Optional[int] = None) -> Pointer:
    """Validates ``obj`` and returns its address. ``int32`` demands 4-byte signed integers;
    ``min_items`` (int32 items, or bytes when not int32) is the least size the call reads."""
    if obj is None:
        raise InvalidArgument(f"{name} must not be None")
    unit = 4 if int32 else 1
    if _is_torch_tensor(obj):
        import torch
        if int32 and obj.dtype != torch.int32:
            raise InvalidArgument(f"{name} must be a torch.int32 tensor, got {obj.dtype}")
        if not obj.is_contiguous():
            raise InvalidArgument(f"{name} must be contiguous (call .contiguous())")
        if obj.device.type not in ("cpu", "cuda"):
            raise InvalidArgument(f"{name} is on {obj.device}; only CPU and CUDA tensors are supported")
        nbytes = obj.numel() * obj.element_size()
        p = Pointer(obj.data_ptr(), nbytes, obj.device.type,
                    obj.device.index if obj.device.type == "cuda" else -1, obj)
    elif hasattr(obj, "__cuda_array_interface__"):
        cai = obj.__cuda_array_interface__
        typestr = cai["typestr"]
        if int32 and typestr not in ("<i4", "|i4", "=i4"):
            raise InvalidArgument(f"{name} must hold int32 (typestr <i4), got {typestr}")
        shape = tuple(cai["shape"])
        itemsize = int(typestr[2:])
        strides = cai.get("strides")
        if strides is not None:
            expect, s = [], itemsize
            for dim in reversed(shape):
                expect.append(s)
                s *= dim
            if tuple(reversed(expect)) != tuple(strides):
                raise InvalidArgument(f"{name} must be C-contiguous")
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise InvalidArgument(f"{name} is read-only but the call writes it")
        count = 1
        for dim in shape:
            count *= dim
        p = Pointer(int(ptr or 0), count * itemsize, "cuda", -1, obj)
    elif _is_numpy_array(obj):
        import numpy as np
        if int32 and obj.dtype != np.dtype(np.int32):
            raise InvalidArgument(f"{name} must be a numpy int32 array, got {obj.dtype}")
        if not obj.flags["C_CONTIGUOUS"]:
            raise InvalidArgument(f"{name} must be C-contiguous (numpy.ascontiguousarray)")
        if writable and not obj.flags["WRITEABLE"]:
            raise InvalidArgument(f"{name} is read-only but the call writes it")
        p = Pointer(int(obj.ctypes.data), int(obj.nbytes), "cpu", -1, obj)
    elif isinstance(obj, ctypes.Array):
        if int32 and obj._type_ is not ctypes.c_int32:
            raise InvalidArgument(f"{name} must be a ctypes.c_int32 array")
        p = Pointer(ctypes.addressof(obj), ctypes.sizeof(obj), "cpu", -1, obj)
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise InvalidArgument(
                f"{name}: expected a torch tensor, numpy array, ctypes array or buffer, got {type(obj).__name__}"
            ) from None
        if not mv.c_contiguous:
            raise InvalidArgument(f"{name} must be C-contiguous")
        if int32 and (mv.itemsize != 4 or mv.format.lstrip("@=<") not in ("i", "l")):
            raise InvalidArgument(f"{name} must hold int32 items (format 'i'), got format {mv.format!r}")
        if writable and mv.readonly:
            raise InvalidArgument(f"{name} is read-only but the call writes it")
        if mv.nbytes == 0:
            p = Pointer(0, 0, "cpu", -1, mv)
        elif mv.readonly:
            # ctypes cannot take the address of a read-only buffer: pass a private copy (inputs only).
            copy = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv)
            p = Pointer(ctypes.addressof(copy), mv.nbytes, "cpu", -1, copy)
        else:
            arr = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
            p = Pointer(ctypes.addressof(arr), mv.nbytes, "cpu", -1, (mv, arr))
    if min_items is not None and p.nbytes < min_items * unit:
        what = "int32 items" if int32 else "bytes"
        raise InvalidArgument(f"{name} holds {p.nbytes // unit} {what}; the call reads {min_items}")
    return p


def stream_handle(stream: Any) -> int:
    """A cudaStream_t as an int from a torch.cuda.Stream, a CuPy stream (.ptr), an int or None (0)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise InvalidArgument(f"stream: expected a torch.cuda.Stream, a CuPy stream or an int, got {type(stream).__name__}")


class CudaArray:
    """A device array described by __cuda_array_interface__ (v3) over memory someone else owns.

    ``torch.as_tensor(view, device="cuda")`` and ``cupy.asarray(view)`` view it without a copy.
    ``owner`` is kept alive with the view (the session whose arena it is)."""

    def __init__(self, ptr: int, shape: tuple, typestr: str = "|u1", owner: Any = None) -> None:
        self.ptr = ptr
        self.shape = tuple(int(d) for d in shape)
        self.typestr = typestr
        self.owner = owner

    @property
    def __cuda_array_interface__(self) -> dict:
        # No "stream" key: the consumer does not synchronize (the data path orders itself).
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False),
                "strides": None, "version": 3}


def host_array(ptr: int, nbytes: int, shape: tuple, owner: Any = None) -> Any:
    """A uint8 view of host memory: numpy when importable, else a shaped memoryview."""
    raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
    try:
        import numpy as np
    except ImportError:
        mv = memoryview(raw).cast("B")
        return mv.cast("B", shape) if len(shape) > 1 else mv
    arr = np.ctypeslib.as_array(raw).reshape(shape)
    if owner is not None:
        # numpy keeps `raw` alive through arr.base; pin the owner (the session) beside it.
        raw._hisparse_owner = owner  # type: ignore[attr-defined]
    return arr

"""TOP-K (ABI 1.16, hs_topk; after_count since 1.17): the top-k of rows of scores, as RESOLVE's positions.
No session."""

from __future__ import annotations

import ctypes
from typing import Any

from . import _lib
from ._buffers import _is_numpy_array, _is_torch_tensor, buffer_pointer, stream_handle
from .errors import InvalidArgument, check


def _scores(scores: Any):
    """(address, rows, cols, ld, device index or -1, keepalive) of a float32 [rows, cols] torch tensor
    or numpy array whose rows may be strided (ld >= cols elements apart) but whose elements are not."""
    if _is_torch_tensor(scores):
        import torch
        if scores.dtype != torch.float32 or scores.dim() != 2:
            raise InvalidArgument(f"scores must be a 2-D torch.float32 tensor, got {scores.dtype} {tuple(scores.shape)}")
        rows, cols = scores.shape
        if cols > 1 and scores.stride(1) != 1 or rows > 1 and scores.stride(0) < cols:
            raise InvalidArgument("scores' rows must be contiguous (stride 1) and not overlap")
        device = scores.device.index if scores.device.type == "cuda" else -1
        if scores.device.type == "cuda" and device is None:
            device = torch.cuda.current_device()
        return scores.data_ptr(), rows, cols, max(cols, scores.stride(0)) if rows > 1 else cols, device, scores
    if _is_numpy_array(scores):
        import numpy as np
        if scores.dtype != np.dtype(np.float32) or scores.ndim != 2:
            raise InvalidArgument(f"scores must be a 2-D numpy float32 array, got {scores.dtype} {scores.shape}")
        rows, cols = scores.shape
        ld = scores.strides[0] // 4
        if cols > 1 and scores.strides[1] != 4 or rows > 1 and (scores.strides[0] % 4 or ld < cols):
            raise InvalidArgument("scores' rows must be contiguous (stride 4 bytes) and not overlap")
        return int(scores.ctypes.data), rows, cols, max(cols, ld) if rows > 1 else cols, -1, scores
    raise InvalidArgument(f"scores: expected a torch tensor or numpy array, got {type(scores).__name__}")


def topk(scores: Any, positions: Any, *, seq_lens: Any = None, batch_size: Any = None, stream: Any = None,
         after_count: Any = None, after_target: int = 0) -> None:
    """positions[i] = the positions of row i's k largest scores (k = positions.shape[1]), ascending, then -1.

    scores: float32 [rows, cols] (rows may be strided, e.g. a slice of a wider buffer); positions:
    int32 [rows, k], written; seq_lens: None or int32 [rows]: row i considers its first
    min(seq_lens[i], cols) scores; batch_size: None or int32 [1], read at run time (one CUDA graph
    serves every batch): rows past it get -1 in every column. -inf and NaN are never selected; of
    scores equal to the k-th largest the lowest positions are taken; a row's list depends on its
    scores alone, and the GPU and the host write the same bits (hisparse.h, hs_topk). CUDA tensors
    run one kernel on `stream` (None: torch's current stream); host ones the CPU reference.

    after_count (CUDA only): an int32 [1] that the programs of the kernels writing the scores raise as
    each finishes (a release); the kernel is then launched as the programmatic dependent of the
    stream's previous kernel and reads nothing until the count reaches after_target, instead of
    waiting for every kernel before it (hs_topk_args.after_count says what the caller guarantees).
    """
    addr, rows, cols, ld, device, keep = _scores(scores)
    if rows == 0:
        return
    want = "cuda" if device >= 0 else "cpu"
    shape = getattr(positions, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != rows:
        raise InvalidArgument(f"positions must be [rows, k] with rows {rows}, got {shape}")
    k = int(shape[1])
    ptrs = {}
    if after_count is not None and device < 0:
        raise InvalidArgument("after_count is for CUDA tensors (a kernel's count)")
    for name, obj, n, writable in (("positions", positions, rows * k, True), ("seq_lens", seq_lens, rows, False),
                                   ("batch_size", batch_size, 1, False), ("after_count", after_count, 1, False)):
        if obj is None:
            ptrs[name] = None
            continue
        p = buffer_pointer(obj, name, int32=True, writable=writable, min_items=n)
        if p.device != want or (want == "cuda" and p.device_index not in (-1, device)):
            raise InvalidArgument(f"{name} is in {p.device} memory; scores are in {want}"
                                  f"{':' + str(device) if device >= 0 else ''} memory")
        ptrs[name] = p
    args = _lib.new_topk_args()
    args.device = device
    args.max_batch = rows
    args.k = k
    args.cols = cols
    args.ld = ld
    args.scores = addr or None
    args.positions = ptrs["positions"].ptr or None
    args.seq_lens = ptrs["seq_lens"].ptr if ptrs["seq_lens"] else None
    args.batch_size = ptrs["batch_size"].ptr if ptrs["batch_size"] else None
    args.after_count = ptrs["after_count"].ptr if ptrs["after_count"] else None
    args.after_target = int(after_target)
    if device >= 0:
        if stream is None:
            import torch
            stream = torch.cuda.current_stream(device)
        args.stream = stream_handle(stream) or None
    check(_lib.load().hs_topk(ctypes.byref(args)), "topk")
    del keep

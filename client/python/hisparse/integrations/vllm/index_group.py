"""The index group vLLM's sparse MLA backends read hisparse's arena through.

vLLM's sparse MLA backends (FlashMLA, FlashInfer, FlashAttention and Triton sparse) take their
HiSparse branch only when ``impl.index_group`` is a ``HiSparseMLAIndexGroup``
(``vllm/v1/attention/backends/mla/index_group.py``, read at ``vllm-project/vllm @ 7a240b6f``).
In that branch, per layer ``i = impl.index_group_index``, they call:

- decode tokens: ``convert_decode_logical_to_physical_topk(i, topk[:num_decode_tokens], md,
  return_valid_counts=...)`` (or ``convert_logical_to_physical_topk(i, ..., block_stride_rows=None,
  ...)`` in older copies), then run the kernel over ``physical_kv_cache(i).view(kv dtype)`` viewed
  with ``flat_kv_row_view(cache, md.block_size)`` (``sparse_utils.py``): physical index j is row
  ``j // block_size * block_stride_rows + j % block_size`` of a ``[num_blocks, block_size, head]``
  cache. FlashAttention's and FlashInfer's kernels read only the first valid-count entries of a
  row, so the valid indices come first (the order within a row does not matter to attention);
- prefill tokens: ``cache(i).all_context_pages_resident``; when False, ``stage_prefill_rows(i,
  kv_cache, md)`` -> ``(staged_cache, block_table, req_ids)``, converted with
  ``triton_convert_req_index_to_global_index(req_ids, block_table, topk[num_decode_tokens:],
  BLOCK_SIZE=md.block_size)`` (rows ``block * block_size + offset``) and read through
  ``flat_kv_row_view(staged_cache, md.block_size)``.

``HisparsedIndexGroup`` answers those calls from the connector's handles: the decode top-k is
RESOLVE's page table (rule 9) into the session's slot arena, and ``physical_kv_cache`` is that
arena as ``[records // block_size, block_size, record_bytes]`` uint8 (the connector opens the
session with B rounded up so that each (row, layer) run of B + 1 + drafts slots is whole kernel
blocks; see ``HisparsedConnectorWorker.register_kv_caches``). A prefill reads vLLM's own paged
cache, which holds every position because vLLM still allocates every block of a request: the
cache itself when its blocks are ``block_size`` rows apart, else a compact copy of the prefill
requests' blocks with the block table renumbered (a cache whose blocks interleave other layers'
would otherwise be misaddressed: the prefill conversion assumes block stride = block size).

The class subclasses upstream's ``HiSparseMLAIndexGroup`` where vLLM is importable (so the
backends' ``isinstance`` check takes the HiSparse branch) and a local stand-in of that interface
elsewhere; ``HisparsedConnectorWorker.attach_index_groups`` puts one in place of each sparse
layer's ``impl.index_group``. Thread-safety: none; the worker's forward thread calls it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ...errors import FailedPrecondition, InvalidArgument


class SparseMLAIndexGroup:
    """Where vLLM is not installed: the names of upstream's plain group (index_group.py @ 7a240b6f)."""


class HiSparseMLAIndexGroup(SparseMLAIndexGroup):
    """Where vLLM is not installed: the class the backends' isinstance check names."""


def upstream_hisparse_group_class() -> type:
    """vLLM's HiSparseMLAIndexGroup where importable, else this module's stand-in."""
    try:
        from vllm.v1.attention.backends.mla.index_group import HiSparseMLAIndexGroup as upstream
    except ImportError:
        return HiSparseMLAIndexGroup
    return upstream


class _HisparsedIndexGroupMixin:
    """The calls the backends make (module docstring), served by hisparse handles."""

    def __init__(self, handles: Sequence[Any], *, block_size: int, like: Any = None) -> None:
        if like is not None:  # keep upstream's fields (logical top-k buffer, streams, events)
            if dataclasses.is_dataclass(like):
                for f in dataclasses.fields(like):
                    setattr(self, f.name, getattr(like, f.name))
            else:
                self.__dict__.update(getattr(like, "__dict__", {}))
        if not handles:
            raise InvalidArgument("an index group needs at least one hisparse layer")
        self.caches = list(handles)
        self.num_layers = len(self.caches)
        self.hisparse_group = None
        self.prefill_stream = None
        self.prefill_ready_events = []
        self.has_indexer = bool(getattr(like, "has_indexer", True))
        self.kernel_block_size = int(block_size)
        rt = self.caches[0].shared
        self._runtime = rt
        dev = rt.device
        # Batch entry of each decode request (decodes come first in vLLM's batch), and the MTP
        # path's outputs: one set per runtime, shared by its groups (a model with an indexer in
        # every layer has a group per layer; the layers run one after another).
        shared = getattr(rt, "_index_group_buffers", None)
        if shared is None:
            shared = (torch.arange(rt.max_num_seqs, dtype=torch.int32, device=dev),
                      torch.full((rt.decode_tokens, rt.top_k), -1, dtype=torch.int32, device=dev),
                      torch.zeros((rt.decode_tokens,), dtype=torch.int32, device=dev))
            rt._index_group_buffers = shared
        self.request_ids, self._physical, self._valid = shared
        records = rt.session.max_requests * rt.session.num_layers * rt.session.record_slots
        if records % self.kernel_block_size:
            raise InvalidArgument(f"the arena's {records} records are not whole kernel blocks of "
                                  f"{self.kernel_block_size}: open the session with B + 1 + drafts a multiple of it")

    # ---- upstream's interface ----

    def register_layer(self, *args: Any, **kwargs: Any) -> int:
        raise FailedPrecondition("HisparsedIndexGroup's layers are attached by the connector, not registered")

    def cache(self, layer_index: int) -> Any:
        return self.caches[layer_index]

    def physical_kv_cache(self, layer_index: int) -> torch.Tensor:
        """The slot arena as uint8 [records // block_size, block_size, record_bytes]: physical index
        j (a RESOLVE page-table entry) is record j, i.e. row j of flat_kv_row_view."""
        return self.cache(layer_index).physical_kv_cache(self.kernel_block_size)

    def set_logical_topk_ready(self, layer_index: int) -> None:
        pass  # the conversion runs on the compute stream, after the indexer: no event to record

    def prepare_for_batch(self, layer_index: int, attn_metadata: Any) -> None:
        cache = self.cache(layer_index)
        if cache.runtime.is_group_leader:
            cache.prepare_group_for_batch(attn_metadata)

    def convert_logical_to_physical_topk(self, layer_index: int, logical_topk_indices: torch.Tensor,
                                         attn_metadata: Any, *, block_stride_rows: Optional[int] = None,
                                         return_valid_counts: bool = False,
                                         req_id_per_token: Optional[torch.Tensor] = None) -> Any:
        """Decode tokens' request-relative top-k -> record indices into physical_kv_cache (RESOLVE)."""
        n = int(logical_topk_indices.shape[0])
        if req_id_per_token is None:
            req_id_per_token = attn_metadata.req_id_per_token[:n]
        if n > self._runtime.decode_tokens:
            raise InvalidArgument(f"{n} tokens to convert; the arena serves at most {self._runtime.decode_tokens} "
                                  f"decode tokens (prefills take stage_prefill_rows: all_context_pages_resident "
                                  f"is False)")
        result = self.cache(layer_index).swap_in(req_id_per_token, None, logical_topk_indices,
                                                 return_valid_counts=return_valid_counts)
        _valid_first(result[0] if return_valid_counts else result)
        return result

    def convert_decode_logical_to_physical_topk(self, layer_index: int, logical_topk_indices: torch.Tensor,
                                                attn_metadata: Any, *, return_valid_counts: bool = False,
                                                num_decodes: Optional[int] = None,
                                                decode_query_len: Optional[int] = None) -> Any:
        """The decode tokens (num_decodes x decode_query_len, request-major): one swap_in, or one
        per verify step over a strided view with MTP, each writing its own column of the result."""
        nd = int(attn_metadata.num_decodes if num_decodes is None else num_decodes)
        q = decode_query_len
        if q is None:
            q = getattr(attn_metadata, "decode_max_query_len", None) or 1
        q = int(q)
        if q == 1:
            return self.convert_logical_to_physical_topk(layer_index, logical_topk_indices, attn_metadata,
                                                         return_valid_counts=return_valid_counts,
                                                         req_id_per_token=self.request_ids[:nd])
        n = nd * q
        if int(logical_topk_indices.shape[0]) != n or n > self._physical.shape[0]:
            raise InvalidArgument(f"{logical_topk_indices.shape[0]} decode tokens; expected {nd} x {q} <= "
                                  f"{self._physical.shape[0]}")
        w = int(logical_topk_indices.shape[1])
        logical = logical_topk_indices.view(nd, q, w)
        out = self._physical[:n, :w].view(nd, q, w) if w == self._physical.shape[1] else None
        if out is None:
            raise InvalidArgument(f"top-k width {w}; the session's k is {self._physical.shape[1]}")
        valid = self._valid[:n].view(nd, q)
        ids = self.request_ids[:nd]
        for step in range(q):
            self.cache(layer_index).swap_in(ids, None, logical[:, step], return_valid_counts=return_valid_counts,
                                            attention_indices_out=out[:, step],
                                            valid_counts_out=valid[:, step] if return_valid_counts else None)
        _valid_first(out.view(n, w))
        if return_valid_counts:
            return out.view(n, w), valid.view(n)
        return out.view(n, w)

    def stage_prefill_rows(self, layer_index: int, kv_cache: torch.Tensor,
                           attn_metadata: Any) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cache, block table, request of each prefill token) for the prefill tokens: vLLM's own
        paged cache (module docstring), request numbers counted from the first prefill."""
        md = attn_metadata
        nd, ndt = int(md.num_decodes), int(md.num_decode_tokens)
        n = int(md.num_actual_tokens)
        req_ids = md.req_id_per_token[ndt:n]
        if nd:
            req_ids = req_ids - nd
        table = md.block_table[nd:]
        bs = int(md.block_size)
        if kv_cache.dim() != 3 or kv_cache.shape[1] != bs:
            raise InvalidArgument(f"a prefill needs the layer's cache as [num_blocks, {bs}, row]; got "
                                  f"{tuple(kv_cache.shape)}")
        if kv_cache.stride(0) == bs * kv_cache.stride(1):
            return kv_cache, table, req_ids
        # Blocks interleaved with other layers': the prefill conversion addresses block * bs + offset.
        used, renumbered = torch.unique(table.to(torch.int64).clamp(min=0), return_inverse=True)
        staged = kv_cache.index_select(0, used)
        return staged, renumbered.to(torch.int32).view(table.shape), req_ids

    def gather_fp8_prefill(self, layer_index: int, source_cache: torch.Tensor, dst: torch.Tensor,
                           block_table: torch.Tensor, workspace_starts: torch.Tensor, batch_size: int,
                           attn_metadata: Any, request_start: int) -> Any:
        """vLLM's paged cache holds every prefill position: the plain group's gather (untested here:
        it needs vLLM's CUDA op)."""
        for klass in type(self).__mro__:
            if klass.__name__ == "SparseMLAIndexGroup" and "gather_fp8_prefill" in vars(klass):
                return klass.gather_fp8_prefill(self, layer_index, source_cache, dst, block_table, workspace_starts,
                                                batch_size, attn_metadata, request_start)
        raise FailedPrecondition("no plain SparseMLAIndexGroup.gather_fp8_prefill to delegate to")


def _valid_first(physical: torch.Tensor) -> None:
    """Moves each row's valid indices to its front, in order, -1 after them (in place, device
    ops only). FlashAttention's and FlashInfer's sparse kernels read the first valid-count entries
    of a row (seqused_k / seq_lens), so a -1 among them would hide a selection; RESOLVE answers -1
    in place, wherever the indexer's list had one."""
    order = torch.argsort((physical < 0).to(torch.int32), dim=1, stable=True)
    physical.copy_(physical.gather(1, order))


_CLASSES: Dict[type, type] = {}


def index_group_class(base: Optional[type] = None) -> type:
    """HisparsedIndexGroup over base (default: upstream's HiSparseMLAIndexGroup where importable)."""
    base = base or upstream_hisparse_group_class()
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type("HisparsedIndexGroup", (_HisparsedIndexGroupMixin, base),
                   {"__doc__": _HisparsedIndexGroupMixin.__doc__, "__module__": __name__,
                    "__eq__": object.__eq__, "__hash__": object.__hash__})
        _CLASSES[base] = cls
    return cls


def make_index_group(handles: List[Any], *, block_size: int, like: Any = None) -> Any:
    """A HisparsedIndexGroup over handles (handle i answers index_group_index i), copying like's
    fields (the upstream group it replaces)."""
    return index_group_class()(handles, block_size=block_size, like=like)

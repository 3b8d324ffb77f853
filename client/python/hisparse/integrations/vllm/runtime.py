"""The per-step runtime vLLM's hybrid HiSparse path calls, backed by a hisparse Session.

vLLM's merged HiSparse (``vllm-project/vllm @ 023979d6``, ``vllm/v1/hisparse/runtime.py``) gives
every sparse-MLA layer a ``HiSparseCacheHandle`` (``layer.hisparse_cache``) over one shared
``HiSparseRuntime``. ``HisparsedRuntime`` and ``HisparsedCacheHandle`` answer the same per-step
calls with one Session for every layer of the worker:

- state indices: ``set_request_state_indices(idx_mapping)`` (batch entry -> persistent request
  state, -1 for a padding entry), as ``HiSparseConnectorWorker.set_request_state_indices``;
- the step: ``prepare_step(rows, seq_lens, query_counts)`` (host lists from the connector worker:
  the Session row, sequence length and query tokens of each batch entry, row -1 for an entry that
  does not decode through hisparse this step). It moves the real entries to the front on the
  device (a stable sort: per-row padding anywhere in the batch becomes tail padding, which
  RESOLVE's ``batch_size`` skips without touching any state) and fills ``num_real_reqs``;
- newest-row write: ``HisparsedCacheHandle.finish_kv_update()`` after the layer wrote its new KV
  rows into vLLM's paged cache (``bind_cache``): the rows at ``slot_mapping`` go to the host pool
  and the arena's tail slots in one ``append`` (upstream mirrors them to the host after the write);
- swap-in / resolve: ``HisparsedCacheHandle.swap_in(req_id_per_token, block_table,
  logical_topk_indices, ...)`` -> int32 [num_tokens, top_k] record indices into
  ``physical_kv_cache()`` (the slot arena), -1 for padding selections and for every token of a
  padding entry (upstream: "publishes -1 and touches no long-lived state").

CUDA graphs: ``finish_kv_update`` and ``swap_in`` use only fixed-shape torch ops on buffers
allocated here and the Session's kernels, with no host synchronization, so vLLM can capture them
(FULL_DECODE_ONLY, or inside the pieces). ``set_request_state_indices`` and ``prepare_step`` run
outside capture, before each forward (the connector's ``start_load_kv``): ``prepare_step`` copies
its host lists to the device with one blocking copy. Everything is device-agnostic torch: on the
host backend the same code runs on CPU tensors and RESOLVE runs at once.

Tokens are laid out as vLLM lays them out (``query_start_loc``): entry i's ``query_counts[i]``
tokens follow entry i - 1's. ``req_id_per_token`` and ``block_table`` are accepted for
``swap_in``'s signature; the runtime derives the token -> entry map from the step's query counts,
and positions are request-relative, so no host block table is needed.

Ownership: the runtime does not own the Session (the connector worker does) and holds no request
state: admission, release, park and import happen in the connector. Thread-safety: none; the
worker's forward thread calls it.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from ...errors import FailedPrecondition, InvalidArgument
from ...session import Session


class HisparsedRuntime:
    """Shared per-step state of every hisparse layer of one worker (see the module docstring).

    Args:
      session: the worker's open Session (num_layers = the hisparse layers, k = the model's top-k,
        slots = vLLM's device_buffer_size, max_requests >= max_num_seqs, draft_tokens = the
        speculative tokens per step).
      max_num_seqs: batch entries of a step (vLLM's scheduler_config.max_num_seqs).
      max_num_tokens: tokens swap_in may be handed in a step (default max_num_seqs * (draft_tokens
        + 1), a decode-only batch; vLLM's max_num_batched_tokens when prefill tokens come along,
        which get -1). The decoding entries' tokens must lie in the first max_num_seqs *
        (draft_tokens + 1) (vLLM puts decode entries first).
    """

    def __init__(self, session: Session, max_num_seqs: int, max_num_tokens: Optional[int] = None) -> None:
        self.session = session
        self.top_k = session.k
        self.queries = session.draft_tokens + 1  # Q: query tokens a batch entry may have
        self.max_num_seqs = int(max_num_seqs)
        if not 1 <= self.max_num_seqs <= session.max_requests:
            raise InvalidArgument(f"max_num_seqs {max_num_seqs} must be in [1, the session's max_requests "
                                  f"{session.max_requests}]")
        self.decode_tokens = self.max_num_seqs * self.queries  # where decoding entries' tokens lie
        self.max_num_tokens = max(int(max_num_tokens or 0), self.decode_tokens)
        if session.backend == "cuda":
            self.device = torch.device("cuda", session.gpu)
        else:
            self.device = torch.device("cpu")
        m, q, k, d = self.max_num_seqs, self.queries, self.top_k, self.device

        def i32(*shape, fill=0):
            return torch.full(shape, fill, dtype=torch.int32, device=d)

        # Inputs of the step (outside capture).
        self.request_state_indices = i32(m, fill=-1)  # batch entry -> request state, -1 padding
        self._host = torch.zeros((3, m), dtype=torch.int32)  # rows, seq_lens, query_counts
        self._step = i32(3, m)  # the same on the device
        # Derived by prepare_step, read inside the graph.
        self.num_real_reqs = i32(1)  # RESOLVE's and append's batch_size
        self._rows, self._seq_lens, self._query_counts = i32(m), i32(m), i32(m, fill=1)
        # Token t of the step -> its (compacted entry, query row) in the [M + 1, Q] lists; entry M
        # is a scratch entry for padding tokens, never read by the kernels (max_batch = M).
        self._token_list = torch.full((self.max_num_tokens,), m * q, dtype=torch.int64, device=d)
        self._positions = i32((m + 1) * q, k, fill=-1)
        self._page_table = i32((m + 1) * q, k, fill=-1)
        self._newest = torch.zeros(((m + 1) * q, session.record_bytes), dtype=torch.uint8, device=d)
        self._out = i32(self.max_num_tokens, k, fill=-1)
        self._valid = i32(self.max_num_tokens)
        self._arange_m = torch.arange(m, dtype=torch.int64, device=d)
        self._arange_t = torch.arange(self.max_num_tokens, dtype=torch.int64, device=d)
        # Per step: batch entry -> compacted index, and whether it decodes through hisparse.
        self._where = torch.zeros((m,), dtype=torch.int64, device=d)
        self._real = torch.zeros((m,), dtype=torch.bool, device=d)
        # Per forward and layer: query rows each entry has had resolved by earlier swap_in calls
        # (MTP resolves one verify step per call), the calls made and the output rows they used.
        self._seen = torch.zeros((session.num_layers, m), dtype=torch.int64, device=d)
        self._calls = [0] * session.num_layers
        self._out_rows = [0] * session.num_layers
        self.prepared = False  # prepare_step ran for the step now being forwarded

    # ---- outside capture, before each forward ----

    def set_request_state_indices(self, indices: Any) -> None:
        """The model runner's batch entry -> request state map (idx_mapping); entries past it and
        entries holding -1 are padding. A device tensor (or list) of at most max_num_seqs ints."""
        indices = torch.as_tensor(indices, dtype=torch.int32)
        n = int(indices.shape[0])
        if n > self.max_num_seqs:
            raise InvalidArgument(f"{n} request state indices; the runtime holds {self.max_num_seqs}")
        self.request_state_indices.fill_(-1)
        self.request_state_indices[:n].copy_(indices.to(self.device))

    def prepare_step(self, rows: Sequence[int], seq_lens: Sequence[int],
                     query_counts: Optional[Sequence[int]] = None) -> None:
        """The step's batch entries in vLLM's order: Session row (-1: not decoding through
        hisparse this step), sequence length (counting this step's tokens) and token count (a
        decoding entry's 1 + drafts, a prefill chunk's length, a padding entry's share of the
        padded batch; None: 1 each), which places every later entry's tokens. Compacts the real
        entries to the front and maps every token, on the device."""
        n = len(rows)
        if n > self.max_num_seqs or len(seq_lens) != n or (query_counts is not None and len(query_counts) != n):
            raise InvalidArgument(f"prepare_step: {n} rows, {len(seq_lens)} seq_lens, "
                                  f"{'-' if query_counts is None else len(query_counts)} query counts; "
                                  f"need equal lengths <= {self.max_num_seqs}")
        counts = [int(c) for c in query_counts] if query_counts is not None else [1] * n
        end = 0
        for i, c in enumerate(counts):
            end += c
            if c < 0 or (rows[i] >= 0 and (c < 1 or c > self.queries or end > self.decode_tokens)):
                raise InvalidArgument(f"batch entry {i}: {c} query tokens ending at token {end}; a decoding entry "
                                      f"has 1..{self.queries} within the first {self.decode_tokens} tokens")
        h = self._host
        h.zero_()
        h[0].fill_(-1)
        if n:
            h[0, :n] = torch.tensor(list(rows), dtype=torch.int32)
            h[1, :n] = torch.tensor(list(seq_lens), dtype=torch.int32)
            h[2, :n] = torch.tensor(counts, dtype=torch.int32)
        self._step.copy_(h)  # blocking: the host buffer is reused next step
        self._compact()
        self.begin_forward()
        self.prepared = True

    def begin_forward(self) -> None:
        """A forward starts: swap_in calls count from zero again (upstream
        HiSparseRuntime.begin_forward, vllm/v1/hisparse/runtime.py @ 023979d6)."""
        self._seen.zero_()
        self._calls = [0] * len(self._calls)
        self._out_rows = [0] * len(self._out_rows)

    def _compact(self) -> None:
        """Device-only: real entries (row >= 0 and state index >= 0) first, in batch order."""
        rows, seqs, counts = self._step[0], self._step[1], self._step[2]
        real = (rows >= 0) & (self.request_state_indices >= 0)
        order = torch.argsort((~real).to(torch.int32), stable=True)
        where = torch.empty_like(order).scatter_(0, order, self._arange_m)  # entry -> compacted index
        self._where.copy_(where)
        self._real.copy_(real)
        self.num_real_reqs.copy_(real.sum().to(torch.int32).reshape(1))
        self._rows.copy_(torch.where(real, rows, torch.zeros_like(rows))[order])
        self._seq_lens.copy_(torch.where(real, seqs, torch.ones_like(seqs))[order])
        self._query_counts.copy_(counts.clamp(1, self.queries)[order])
        ends = torch.cumsum(counts.to(torch.int64), 0)
        starts = ends - counts
        entry = torch.searchsorted(ends, self._arange_t, right=True).clamp(max=self.max_num_seqs - 1)
        query = self._arange_t - starts[entry]
        ok = (self._arange_t < ends[-1]) & real[entry] & (query < counts[entry])
        scratch = torch.full_like(query, self.max_num_seqs * self.queries)
        self._token_list.copy_(torch.where(ok, where[entry] * self.queries + query, scratch))

    # ---- inside the forward (capturable) ----

    def append(self, layer: int, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
               block_size: int = 0, stride_rows: int = 0) -> None:
        """Newest-row write of one layer: the step's rows at slot_mapping (int, -1 padding) of the
        layer's paged cache go to the host pool and the arena's tail slots. kv_cache is the cache's
        rows (uint8 [rows, row bytes] or [num_blocks, block_size, ...]); with block_size and
        stride_rows, slot s is row s // block_size * stride_rows + s % block_size (a cache whose
        blocks are interleaved with another's, vLLM's bind_cache block_stride)."""
        flat = kv_cache if kv_cache.dim() == 2 and kv_cache.dtype == torch.uint8 else paged_rows(kv_cache)
        if flat.shape[1] < self.session.record_bytes:
            raise InvalidArgument(f"kv_cache rows are {flat.shape[1]} bytes; records are {self.session.record_bytes}")
        t = min(int(slot_mapping.shape[0]), self.decode_tokens)  # decode rows only: no prefill gather
        slots = slot_mapping[:t].to(torch.int64).clamp(min=0)
        if block_size and stride_rows != block_size:
            slots = torch.div(slots, block_size, rounding_mode="floor") * stride_rows + slots % block_size
        rec = flat.index_select(0, slots)[:, :self.session.record_bytes]
        self._newest.index_copy_(0, self._token_list[:t], rec)
        m, q = self.max_num_seqs, self.queries
        counts = self._query_counts if q > 1 else None
        self.session.append(layer, self._rows, self._seq_lens, self._newest[:m * q], batch_size=self.num_real_reqs,
                            max_batch=m, token_counts=counts)

    def resolve(self, layer: int, logical_topk_indices: torch.Tensor, req_id_per_token: Optional[torch.Tensor] = None,
                *, attention_indices_out: Optional[torch.Tensor] = None,
                valid_counts_out: Optional[torch.Tensor] = None, return_valid_counts: bool = False) -> Any:
        """RESOLVE of one layer for some of the step's tokens: [num_tokens, <= top_k] request-relative
        positions (-1 padding; any strides) -> int32 [num_tokens, top_k] record indices into the arena.

        A layer may be called several times in one forward: vLLM's MTP resolves one verify step per
        call, each over a strided view holding one query token per request (upstream
        HiSparseRuntime._step_rows, vllm/v1/hisparse/runtime.py @ 023979d6). req_id_per_token (the
        batch entry of each row, as vLLM's attention metadata has it) places each row: its query
        token is the number of that entry's rows resolved before it in this forward. Each call's
        indices stay valid for the rest of the forward: its output rows are its own, and with B >=
        calls x k the slots a later call fills are never ones an earlier call returned (RESOLVE rule
        2 takes the least recently used first). Without req_id_per_token the rows are the step's
        tokens in order (one call)."""
        if logical_topk_indices.dim() != 2 or logical_topk_indices.shape[1] > self.top_k or \
                logical_topk_indices.shape[0] > self.max_num_tokens:
            raise InvalidArgument(f"logical_topk_indices has shape {tuple(logical_topk_indices.shape)}; need "
                                  f"[<= {self.max_num_tokens}, <= {self.top_k}]")
        t, w = int(logical_topk_indices.shape[0]), int(logical_topk_indices.shape[1])
        m, q = self.max_num_seqs, self.queries
        calls = self._calls[layer] + 1
        if calls > 1 and self.session.slots < calls * self.top_k:
            raise InvalidArgument(f"layer {layer}: swap_in call {calls} of one forward needs {calls} x top_k "
                                  f"{self.top_k} slots; the session has {self.session.slots}")
        first = self._out_rows[layer]
        if first + t > self.max_num_tokens:
            raise InvalidArgument(f"layer {layer}: swap_in rows of one forward exceed {self.max_num_tokens}")
        self._calls[layer], self._out_rows[layer] = calls, first + t
        if req_id_per_token is None:
            tokens = self._token_list[:t]
        else:
            tokens = self._place(layer, req_id_per_token[:t])
        self._positions.fill_(-1)
        self._positions[:, :w].index_copy_(0, tokens, logical_topk_indices.to(torch.int32))
        self.session.resolve(layer, self._rows, self._seq_lens, self._positions[:m * q], None,
                             batch_size=self.num_real_reqs, max_batch=m, page_table=self._page_table[:m * q],
                             query_counts=self._query_counts if q > 1 else None, programmatic=True)
        found = self._page_table.index_select(0, tokens)
        out = self._out[first:first + t] if attention_indices_out is None else attention_indices_out
        out.copy_(found)
        if not (return_valid_counts or valid_counts_out is not None):
            return out
        valid = self._valid[first:first + t] if valid_counts_out is None else valid_counts_out
        valid.copy_(torch.sum(found >= 0, dim=1, dtype=torch.int32))
        return out, valid

    def _place(self, layer: int, req_id_per_token: torch.Tensor) -> torch.Tensor:
        """Each row's list in the [M + 1, Q] lists (device-only): compacted entry x Q + its query
        token, the scratch list M x Q for rows of padding or non-decoding entries."""
        m, q = self.max_num_seqs, self.queries
        entry = req_id_per_token.to(torch.int64)
        inside = (entry >= 0) & (entry < m)
        entry = entry.clamp(0, m - 1)
        onehot = torch.nn.functional.one_hot(entry, m) * inside.unsqueeze(1)
        rank = torch.cumsum(onehot, 0).gather(1, entry.unsqueeze(1)).squeeze(1) - 1  # earlier rows of its entry
        query = self._seen[layer].index_select(0, entry) + rank
        self._seen[layer].add_(onehot.sum(0))
        counts = self._step[2].to(torch.int64).index_select(0, entry)
        ok = inside & self._real.index_select(0, entry) & (query < counts) & (query < q)
        scratch = torch.full_like(query, m * q)
        return torch.where(ok, self._where.index_select(0, entry) * q + query, scratch)

    def attention_cache(self, block_size: int = 1) -> torch.Tensor:
        """What the sparse attention kernel reads with swap_in's indices: the slot arena's records
        (every row, layer and slot) as uint8 [records // block_size, block_size, record_bytes];
        index i is record i (page i // block_size, offset i % block_size)."""
        arena = torch.as_tensor(self.session.slot_view(), device=self.device)
        records = arena.reshape(-1, arena.shape[-1])
        if block_size < 1 or records.shape[0] % block_size:
            raise InvalidArgument(f"the arena's {records.shape[0]} records do not split into pages of {block_size}")
        return records.view(records.shape[0] // block_size, block_size, records.shape[1])


def paged_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """A layer's paged cache [num_blocks, block_size, ...] as uint8 [num_blocks * block_size, row
    bytes] without a copy (raises if its rows are not contiguous)."""
    flat = kv_cache.reshape(kv_cache.shape[0] * kv_cache.shape[1], -1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


FORWARD_CONTEXT: Any = None  # a stand-in for vLLM's forward context, where vLLM is not installed (tests)


def forward_slot_mapping(layer_name: str) -> Optional[torch.Tensor]:
    """The slot mapping vLLM's model runner set for this forward and layer
    (``get_forward_context().slot_mapping[layer_name]``, what MLAAttention.forward reads), or
    None outside a forward."""
    ctx = FORWARD_CONTEXT
    if ctx is None:
        try:
            from vllm.forward_context import get_forward_context, is_forward_context_available
        except ImportError:
            return None
        if not is_forward_context_available():
            return None
        ctx = get_forward_context()
    mapping = getattr(ctx, "slot_mapping", None)
    return mapping.get(layer_name) if isinstance(mapping, dict) else None


class LayerRuntime:
    """What a layer reads as ``layer.hisparse_cache.runtime`` (upstream: one HiSparseRuntime per
    layer): whether it leads its index group, plus the shared runtime's attributes."""

    def __init__(self, shared: HisparsedRuntime, is_group_leader: bool) -> None:
        self.shared = shared
        self.is_group_leader = is_group_leader
        self.max_num_reqs = shared.max_num_seqs
        self.eager_host_mirror = True

    def begin_forward(self) -> None:
        if self.is_group_leader:
            self.shared.begin_forward()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


class HisparsedCacheHandle:
    """One layer's handle, the object vLLM's ``MLAAttention`` holds as ``layer.hisparse_cache``,
    with upstream ``HiSparseCacheHandle``'s attention-facing API (vllm/v1/hisparse/runtime.py @
    023979d6): per forward the leader's ``prepare_group_for_batch(attn_metadata)``, then per layer
    ``write_target`` (where the layer writes its new KV: vLLM's own paged cache), ``mirror_write_target``
    (None: the host copy is made by ``finish_kv_update``'s append for decode rows and by the
    connector's ``wait_for_save`` for prefill rows), ``finish_kv_update()`` and, from the sparse
    backend, ``swap_in`` (RESOLVE into the daemon's arena, ``physical_kv_cache()``).
    ``bind_cache(raw, byte_offset=..., ...)`` names the layer's slice of vLLM's KV tensor."""

    def __init__(self, runtime: HisparsedRuntime, layer: int) -> None:
        if not 0 <= layer < runtime.session.num_layers:
            raise InvalidArgument(f"layer {layer} outside the session's {runtime.session.num_layers} layers")
        self.shared = runtime
        self.runtime = LayerRuntime(runtime, layer == 0)
        self.layer = layer
        self.layer_name = ""  # vLLM's name of the layer, once attached to it
        self.index_group_caches: List["HisparsedCacheHandle"] = [self]
        self.kv_cache: Optional[torch.Tensor] = None  # the cache as [num_blocks, block_size, row bytes]
        self.rows: Optional[torch.Tensor] = None  # uint8 [rows, row bytes] over the same memory
        self.block_size = 0
        self.stride_rows = 0  # rows from one block's first row to the next block's
        self.block_table: Optional[torch.Tensor] = None
        self.slot_mapping: Optional[torch.Tensor] = None
        self.dummy_batch = False
        # What the sparse backends' HiSparse branch reads from cache(i) (index_group.py): the arena
        # holds B slots, not a request's whole context, so a prefill is staged (stage_prefill_rows).
        self.all_context_pages_resident = False
        self.source_block_table: Optional[torch.Tensor] = None
        self.decode_batch = False
        self.num_actual_tokens = 0
        self.num_decode_tokens = 0

    # ---- binding (once, after vLLM allocated its KV cache) ----

    def bind_cache(self, raw_tensor: torch.Tensor, *, byte_offset: int = 0, block_stride: Optional[int] = None,
                   num_blocks: Optional[int] = None, block_size: Optional[int] = None,
                   block_table: Optional[torch.Tensor] = None, slot_mapping: Optional[torch.Tensor] = None) -> None:
        """Upstream's signature: the layer's cache is num_blocks blocks of block_size rows of the
        runtime's record bytes, block i at byte byte_offset + i * block_stride of raw_tensor. With
        only raw_tensor, it is a [num_blocks, block_size, ...] cache of its own."""
        if block_stride is None:
            rows = paged_rows(raw_tensor)
            self.kv_cache, self.rows = raw_tensor, rows
            self.block_size = self.stride_rows = int(raw_tensor.shape[1])
        else:
            row = self.shared.session.record_bytes
            if block_size is None or num_blocks is None or block_stride % row or byte_offset % row:
                raise InvalidArgument(f"layer {self.layer}: bind_cache needs block_size and num_blocks, and "
                                      f"block_stride {block_stride} and byte_offset {byte_offset} in whole "
                                      f"{row}-byte rows")
            flat = raw_tensor.reshape(-1).view(torch.uint8)[byte_offset:]
            stride_rows = block_stride // row
            need = (num_blocks - 1) * stride_rows + block_size
            if flat.numel() < need * row:
                raise InvalidArgument(f"layer {self.layer}: {num_blocks} blocks of stride {block_stride} B need "
                                      f"{need * row} B past byte {byte_offset}; the tensor has {flat.numel()}")
            self.rows = flat[:flat.numel() // row * row].view(-1, row)
            self.kv_cache = torch.as_strided(flat, (num_blocks, block_size, row), (block_stride, row, 1))
            self.block_size, self.stride_rows = int(block_size), int(stride_rows)
        self.block_table = block_table
        if slot_mapping is not None:
            self.slot_mapping = slot_mapping

    # ---- per forward (MLAAttention.prepare_kv_cache_update / update_kv_cache / forward) ----

    def prepare_group_for_batch(self, attn_metadata: Any) -> None:
        """The group leader, first in each forward: every layer of the group learns the batch.
        A real batch (attn_metadata not None) with decode tokens needs the connector to have
        prepared this step (its start_load_kv before the forward, which the scheduler role asks
        for with has_sync_kv_loads): raised otherwise, outside graph capture, rather than
        resolving against the previous step's rows. Several forwards of one step (a drafter's)
        share the step's preparation; the next step's metadata withdraws it."""
        if not self.runtime.is_group_leader:
            raise FailedPrecondition(f"layer {self.layer}: prepare_group_for_batch on a layer that does not lead")
        decode = int(getattr(attn_metadata, "num_decode_tokens", 0) or 0) if attn_metadata is not None else 0
        capturing = self.shared.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if decode and not self.shared.prepared and not capturing:
            raise FailedPrecondition("a decode forward began before the connector prepared its step: vLLM ran "
                                     "start_load_kv after the forward (SchedulerOutput.has_sync_kv_loads unset)")
        for cache in self.index_group_caches:
            cache._prepare_for_batch(attn_metadata)

    def _prepare_for_batch(self, attn_metadata: Any) -> None:
        mapping = forward_slot_mapping(self.layer_name) if self.layer_name else None
        if mapping is not None:  # what MLAAttention.forward reads: forward_context.slot_mapping[name]
            self.slot_mapping = mapping
        self.dummy_batch = attn_metadata is None
        self.runtime.begin_forward()
        md = attn_metadata
        self.num_actual_tokens = int(md.num_actual_tokens) if md is not None else 0
        self.num_decode_tokens = int(getattr(md, "num_decode_tokens", 0) or 0) if md is not None else 0
        self.decode_batch = md is not None and self.num_decode_tokens == self.num_actual_tokens

    def write_target(self, num_input_rows: int, num_slot_rows: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """Where the layer writes this forward's KV: vLLM's own paged cache at its slot_mapping."""
        if self.kv_cache is None or self.slot_mapping is None:
            raise FailedPrecondition(f"layer {self.layer}: bind_cache(..., slot_mapping=...) first")
        n = min(int(num_input_rows), int(num_slot_rows), self.num_actual_tokens)
        return self.kv_cache, self.slot_mapping[:n], n

    def mirror_write_target(self, num_rows: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        return None  # no second write: the host copy is taken from the paged cache (class docstring)

    def finish_kv_update(self, slot_mapping: Optional[torch.Tensor] = None) -> None:
        """After the layer wrote this forward's KV into its paged cache: append the decode rows to
        the host pool and the arena's tail slots. Nothing for a dummy batch."""
        if self.dummy_batch:
            return
        mapping = self.slot_mapping if slot_mapping is None else slot_mapping
        if self.rows is None or mapping is None:
            raise FailedPrecondition(f"layer {self.layer}: bind_cache(..., slot_mapping=...) first")
        self.shared.append(self.layer, self.rows, mapping, block_size=self.block_size, stride_rows=self.stride_rows)

    def swap_in(self, req_id_per_token: Any, block_table: Any, logical_topk_indices: torch.Tensor, *,
                block_size: int = 1, return_valid_counts: bool = False,
                attention_indices_out: Optional[torch.Tensor] = None,
                valid_counts_out: Optional[torch.Tensor] = None, **_: Any) -> Any:
        """Upstream's swap_in: physical indices into physical_kv_cache() (+ valid counts); may be
        called once per MTP verify step in a forward (HisparsedRuntime.resolve)."""
        rid = req_id_per_token if isinstance(req_id_per_token, torch.Tensor) else None
        return self.shared.resolve(self.layer, logical_topk_indices, rid, attention_indices_out=attention_indices_out,
                                   valid_counts_out=valid_counts_out, return_valid_counts=return_valid_counts)

    def physical_kv_cache(self, block_size: int = 1) -> torch.Tensor:
        return self.shared.attention_cache(block_size)

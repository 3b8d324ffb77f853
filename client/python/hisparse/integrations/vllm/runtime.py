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

from typing import Any, Optional, Sequence

import torch

from ...errors import InvalidArgument
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

    def _compact(self) -> None:
        """Device-only: real entries (row >= 0 and state index >= 0) first, in batch order."""
        rows, seqs, counts = self._step[0], self._step[1], self._step[2]
        real = (rows >= 0) & (self.request_state_indices >= 0)
        order = torch.argsort((~real).to(torch.int32), stable=True)
        where = torch.empty_like(order).scatter_(0, order, self._arange_m)  # entry -> compacted index
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

    def append(self, layer: int, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Newest-row write of one layer: the step's rows at slot_mapping (int, -1 padding) of the
        layer's paged cache go to the host pool and the arena's tail slots."""
        flat = paged_rows(kv_cache)
        if flat.shape[1] < self.session.record_bytes:
            raise InvalidArgument(f"kv_cache rows are {flat.shape[1]} bytes; records are {self.session.record_bytes}")
        t = min(int(slot_mapping.shape[0]), self.decode_tokens)  # decode rows only: no prefill gather
        slots = slot_mapping[:t].to(torch.int64).clamp(min=0)
        rec = flat.index_select(0, slots)[:, :self.session.record_bytes]
        self._newest.index_copy_(0, self._token_list[:t], rec)
        m, q = self.max_num_seqs, self.queries
        counts = self._query_counts if q > 1 else None
        self.session.append(layer, self._rows, self._seq_lens, self._newest[:m * q], batch_size=self.num_real_reqs,
                            max_batch=m, token_counts=counts)

    def resolve(self, layer: int, logical_topk_indices: torch.Tensor, *,
                attention_indices_out: Optional[torch.Tensor] = None,
                valid_counts_out: Optional[torch.Tensor] = None, return_valid_counts: bool = False) -> Any:
        """RESOLVE of one layer for the step's tokens: [num_tokens, <= top_k] request-relative
        positions (-1 padding) -> int32 [num_tokens, top_k] record indices into the arena."""
        if logical_topk_indices.dim() != 2 or logical_topk_indices.shape[1] > self.top_k or \
                logical_topk_indices.shape[0] > self.max_num_tokens:
            raise InvalidArgument(f"logical_topk_indices has shape {tuple(logical_topk_indices.shape)}; need "
                                  f"[<= {self.max_num_tokens}, <= {self.top_k}]")
        t, w = int(logical_topk_indices.shape[0]), int(logical_topk_indices.shape[1])
        m, q = self.max_num_seqs, self.queries
        self._positions.fill_(-1)
        self._positions[:, :w].index_copy_(0, self._token_list[:t], logical_topk_indices.to(torch.int32))
        self.session.resolve(layer, self._rows, self._seq_lens, self._positions[:m * q], None,
                             batch_size=self.num_real_reqs, max_batch=m, page_table=self._page_table[:m * q],
                             query_counts=self._query_counts if q > 1 else None, programmatic=True)
        out = self._out[:t] if attention_indices_out is None else attention_indices_out
        torch.index_select(self._page_table, 0, self._token_list[:t], out=out)
        if not (return_valid_counts or valid_counts_out is not None):
            return out
        valid = self._valid[:t] if valid_counts_out is None else valid_counts_out
        torch.sum(out >= 0, dim=1, dtype=torch.int32, out=valid)
        return out, valid

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


class HisparsedCacheHandle:
    """One layer's view of the runtime, the object vLLM's layer holds as ``layer.hisparse_cache``
    (upstream ``HiSparseCacheHandle``). bind_cache names the layer's paged cache and the model
    runner's slot_mapping (both persistent buffers, so a captured graph keeps reading them)."""

    def __init__(self, runtime: HisparsedRuntime, layer: int) -> None:
        if not 0 <= layer < runtime.session.num_layers:
            raise InvalidArgument(f"layer {layer} outside the session's {runtime.session.num_layers} layers")
        self.runtime = runtime
        self.layer = layer
        self.kv_cache: Optional[torch.Tensor] = None
        self.slot_mapping: Optional[torch.Tensor] = None

    def bind_cache(self, kv_cache: torch.Tensor, slot_mapping: Optional[torch.Tensor] = None) -> None:
        paged_rows(kv_cache)  # checks that it can be read as rows
        self.kv_cache = kv_cache
        if slot_mapping is not None:
            self.slot_mapping = slot_mapping

    def finish_kv_update(self, slot_mapping: Optional[torch.Tensor] = None) -> None:
        """After the layer wrote this step's KV into its paged cache: append the decode rows."""
        mapping = self.slot_mapping if slot_mapping is None else slot_mapping
        if self.kv_cache is None or mapping is None:
            raise InvalidArgument(f"layer {self.layer}: bind_cache(kv_cache, slot_mapping) first")
        self.runtime.append(self.layer, self.kv_cache, mapping)

    def swap_in(self, req_id_per_token: Any, block_table: Any, logical_topk_indices: torch.Tensor, *,
                block_size: int = 1, return_valid_counts: bool = False,
                attention_indices_out: Optional[torch.Tensor] = None,
                valid_counts_out: Optional[torch.Tensor] = None, **_: Any) -> Any:
        """Upstream's swap_in: physical indices into physical_kv_cache() (+ valid counts)."""
        return self.runtime.resolve(self.layer, logical_topk_indices, attention_indices_out=attention_indices_out,
                                    valid_counts_out=valid_counts_out, return_valid_counts=return_valid_counts)

    def physical_kv_cache(self, block_size: int = 1) -> torch.Tensor:
        return self.runtime.attention_cache(block_size)

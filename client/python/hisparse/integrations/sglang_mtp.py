"""SGLang adapter, speculative decoding: ``HisparsedMTPCoordinator``, SGLang's MTP coordinator.

It answers the calls of ``HiSparseMTPCoordinator`` (sgl-project/sglang PR #37771, open, over the
merged multi-step kernel of PR #32162; docs/INTEGRATION.md, "SGLang adapter: speculative
decoding"): ``swap_in_verify_pages`` for EAGLE/MTP target verification, ``register_token_positions``,
``assign_spec_ring_slots[_batch]``, ``backup_committed_tokens`` and
``wait_admission_staging_before_verify``, on a Session opened with
``draft_tokens = num_draft_tokens - 1``. Upstream keys its device buffer by logical KV id, gives
draft tokens physical slots from a per-request staging ring, backs accepted tokens up to its host
pool after verification, and resolves the N lists of a request with a multi-step kernel. hisparse
has each of these in the Session:

- the N verify tokens of a request (positions seq_len .. seq_len + N - 1: the token verified last
  round and its drafts) get their physical slots as upstream's do: assign_spec_ring_slots_batch
  points their logical locations at slots of the request's ring (kept by alloc_device_buffer
  beside its decode page), so the verify forward's KV writes land there; per layer they are then
  appended with ``append(..., token_counts=N)`` into the row's tail slots B..B+N-1 and the host
  pool at once. So there is no committed-token backup: an accepted token is in the host pool
  from its verify on, and a rejected one is rewritten by the next round's append at the same
  position (resolve.h, rule 8, "Rejected drafts");
- RESOLVE's multi-query form (``query_counts = N``, positions [bs, N, k]; rule 8) makes the union
  of the N lists resident at once in LRU order and writes one page table [bs, N, k], returned as
  upstream's [bs * N, top_k] indices into ``attention_kv_buffer()``;
- the fused top-k's logical KV ids become request positions through ``token_position`` (int32 over
  the token pool, -1 for none), upstream's ``full_to_token_position``: admission registers the
  prompt, and every verify registers its own N tokens on the device (graph-safe), so
  ``assign_spec_ring_slots`` only has to register what the caller asks.

``swap_in_verify_pages`` is graph-safe like the plain swap-in (fixed shapes, static buffers, no
host sync on CUDA). The position-based ``swap_in_selected_pages`` raises, as upstream's does in
MTP mode. Thread-safety: none, as HisparsedCoordinator.
"""

from __future__ import annotations

from typing import Any, List

import torch

from ..errors import FailedPrecondition, InvalidArgument
from .sglang import HisparsedCoordinator

MAX_VERIFY_TOKENS = 8  # the Session's draft_tokens is 0..7


class HisparsedMTPCoordinator(HisparsedCoordinator):
    """SGLang's HiSparseMTPCoordinator over a hisparse Session (see the module docstring).

    The arguments are upstream's; num_draft_tokens is N, the verify tokens per request (1..8);
    spec_ring_capacity sizes the per-request ring of physical slots the verify tokens' KV is
    written to (at least 2 N, whole pages). B must hold the
    union of a request's N selections (N * top_k never fails; rule 8c refuses a larger union)."""

    def __init__(self, req_to_token_pool: Any, token_to_kv_pool_allocator: Any, top_k: int,
                 device_buffer_size: int, device: str, tp_group: Any = None, host_to_device_ratio: int = 2,
                 swap_in_block_size: int = 960, num_draft_tokens: int = 1, spec_ring_capacity: int = 0, *,
                 daemon: Any = None, backend: str = "auto", tp_group_name: Any = None) -> None:
        if not 1 <= num_draft_tokens <= MAX_VERIFY_TOKENS:
            raise InvalidArgument(f"num_draft_tokens is {num_draft_tokens}; hisparse verifies 1..{MAX_VERIFY_TOKENS}")
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, top_k, device_buffer_size, device, tp_group,
                         host_to_device_ratio, swap_in_block_size, daemon=daemon, backend=backend,
                         draft_tokens=num_draft_tokens - 1, tp_group_name=tp_group_name)
        self.num_draft_tokens = num_draft_tokens
        self.spec_ring_capacity = spec_ring_capacity
        # Physical slots of a request's speculative ring: at least two rounds, whole pages.
        ring = max(int(spec_ring_capacity), 2 * num_draft_tokens)
        self.ring_slots = -(-ring // self.page_size) * self.page_size
        R, Q, k, dev = self.num_reqs, num_draft_tokens, top_k, self._data_dev
        r2t = req_to_token_pool.req_to_token
        mapping = getattr(self.allocator, "full_to_hisparse_device_index_mapping", None)
        ids = int(mapping.numel()) if mapping is not None else int(self._kv[0].shape[0])
        # One entry past the pool: padded batch entries register into it, so they change nothing.
        self.token_position = torch.full((ids + 1,), -1, dtype=torch.int32, device=dev)
        self._v_positions = torch.full((R, Q, k), -1, dtype=torch.int32, device=dev)
        self._v_table = torch.full((R, Q, k), -1, dtype=torch.int32, device=dev)
        self._v_seqs = torch.ones(R, dtype=torch.int32, device=dev)
        self._v_counts = torch.ones(R, dtype=torch.int32, device=dev)
        self._v_records = torch.zeros(R * Q, self.item_size_bytes, dtype=torch.uint8, device=dev)
        self._v_locs = torch.zeros(R, Q, dtype=torch.int64, device=r2t.device)
        self._v_tq = torch.arange(Q, dtype=torch.int64, device=r2t.device)
        self._v_entry = torch.arange(R, dtype=torch.int64, device=dev)

    # ---- logical KV id -> position ----

    def register_token_positions(self, req: Any, start: int, end: int) -> None:
        """Positions [start, end) of req: token_position[req_to_token[req_pool_idx, p]] = p."""
        if end <= start:
            return
        locs = self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].to(self._data_dev, torch.int64)
        self.token_position[locs] = torch.arange(start, end, dtype=torch.int32, device=self._data_dev)

    def _buffer_slots(self) -> int:
        """A ready request keeps its decode page and its speculative ring."""
        return super()._buffer_slots() + self.ring_slots

    def assign_spec_ring_slots(self, req: Any, start: int, end: int) -> None:
        """assign_spec_ring_slots_batch of one request."""
        self.assign_spec_ring_slots_batch([req], [start], [end])

    def assign_spec_ring_slots_batch(self, reqs: List[Any], starts: List[int], ends: List[int]) -> None:
        """Upstream's side effect (hisparse_coordinator.py, HiSparseMTPCoordinator): the logical
        location of each speculative position p in [start, end) is pointed at ring slot
        p % ring_slots of its request, so the verify forward's KV writes (through the mapping) land
        there, where swap_in_verify_pages appends them from. Also registers their positions. Waits
        for the producer stream first: its queued verify may still read the previous round's slots."""
        idx, pos, ring = [], [], []
        for req, start, end in zip(reqs, starts, ends):
            if end - start > self.ring_slots:
                raise InvalidArgument(f"request {req.rid!r}: {end - start} speculative positions; the ring holds "
                                      f"{self.ring_slots}")
            buf = self._entry(req).buffer
            if buf is None:
                raise FailedPrecondition(f"request {req.rid!r} has no device buffer (not ready)")
            base = self.page_size
            for p in range(start, end):
                idx.append(req.req_pool_idx)
                pos.append(p)
                ring.append(buf[base + p % self.ring_slots])
        if not pos:
            return
        self._wait_for_producer()
        r2t = self.req_to_token_pool.req_to_token
        rows = torch.tensor(idx, dtype=torch.int64, device=r2t.device)
        cols = torch.tensor(pos, dtype=torch.int64, device=r2t.device)
        locs = r2t[rows, cols].to(torch.int64)
        mapping = self._mapping
        mapping[locs.to(mapping.device)] = torch.stack(ring).to(mapping.device, torch.int64)
        self.token_position[locs.to(self._data_dev)] = cols.to(self._data_dev, torch.int32)

    def _clear_positions(self, req: Any) -> None:
        if req.req_pool_idx is None:
            return
        end = min(self._kv_len(req) + self.num_draft_tokens, self.req_to_token_pool.req_to_token.shape[1])
        locs = self.req_to_token_pool.req_to_token[req.req_pool_idx, :end].to(self._data_dev, torch.int64)
        self.token_position[locs] = -1

    # ---- lifecycle: the plain coordinator's, plus the position map ----

    def _budget(self, req: Any, kv_len: int) -> int:
        """A verify round may reach N tokens past max_new_tokens (SGLang reserves as much)."""
        cap = self.req_to_token_pool.req_to_token.shape[1]
        return min(cap, super()._budget(req, kv_len) + self.num_draft_tokens)

    def admit_request_into_staging(self, req: Any) -> None:
        super().admit_request_into_staging(req)
        self.register_token_positions(req, 0, self._kv_len(req))

    def admit_request_direct(self, req: Any, timeout_ms: int = 10000) -> None:
        super().admit_request_direct(req, timeout_ms)
        self.register_token_positions(req, 0, self._kv_len(req))

    def retract_req(self, req: Any) -> None:
        self._entry(req)  # NotFound before anything changes
        self._clear_positions(req)
        super().retract_req(req)

    def retract_reqs(self, reqs: Any) -> None:
        reqs = list(reqs)
        for req in reqs:
            self._entry(req)  # NotFound before anything changes
        for req in reqs:
            self._clear_positions(req)
        super().retract_reqs(reqs)

    def request_finished(self, req: Any) -> None:
        if req.rid in self._entries:
            self._clear_positions(req)
        super().request_finished(req)

    def backup_committed_tokens(self, reqs: List[Any]) -> None:
        """Nothing to copy: the verify's append wrote every verify token's record to the host pool,
        and the next round's append rewrites the rejected ones. Notes the committed length."""
        for req in reqs:
            e = self._entries.get(req.rid)
            if e is not None:
                e.kv_len = max(e.kv_len, int(getattr(req, "kv_committed_len", self._kv_len(req))))

    def wait_admission_staging_before_verify(self, reqs: List[Any]) -> None:
        """Orders the current stream after the stores of those requests still staging (CUDA)."""
        if self.session.backend != "cuda":
            return
        rids = {r.rid for r in reqs}
        stream = torch.cuda.current_stream()
        for req, event in self._staging:
            if req.rid in rids and event is not None:
                stream.wait_event(event)

    # ---- verify data path (graph-safe) ----

    def _reads_arena(self, caller: Any) -> bool:
        """Also target verify's forward_extend, which attends at swap_in_verify_pages' indices
        (assumed from the coordinator's API, PR #37771; its call site was not read). Keyed on the
        caller's forward_batch.forward_mode; draft extend and prefill read the pool."""
        if super()._reads_arena(caller):
            return True
        if caller.f_code.co_name != "forward_extend":
            return False
        fb = caller.f_locals.get("forward_batch")
        mode = getattr(fb, "forward_mode", None)
        return bool(mode is not None and mode.is_target_verify())

    def swap_in_selected_pages(self, req_pool_indices, compressed_seq_lens, top_k_result, layer_id):
        raise FailedPrecondition("position-based swap-in cannot run in MTP mode: call swap_in_verify_pages")

    def swap_in_verify_pages(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                             logical_top_k: torch.Tensor, layer_id: int, num_positions: int) -> torch.Tensor:
        """One layer of a verify batch: append the N = num_positions verify tokens of every request,
        then RESOLVE their N selections at once. seq_lens: the committed length of each request (the
        verify tokens are positions seq_len .. seq_len + N - 1); logical_top_k: int32 [bs * N, <=
        top_k], row i * N + t the logical KV ids verify token t of request i attends (-1 padding).
        Returns int32 [bs * N, top_k]: each id's record index in attention_kv_buffer(), -1 for
        padding and for the rows of entries >= num_real_reqs."""
        bs, n = int(req_pool_indices.shape[0]), int(num_positions)
        if not 1 <= n <= self.num_draft_tokens:
            raise InvalidArgument(f"num_positions is {n}; the coordinator verifies 1..{self.num_draft_tokens}")
        self._check_batch(bs, logical_top_k, bs * n)
        rows, seqs, counts = self._rows[:bs], self._v_seqs[:bs], self._v_counts[:bs]
        torch.index_select(self.row_of_pool_idx, 0, req_pool_indices.to(self._data_dev, torch.int64), out=rows)
        seqs.copy_(seq_lens)
        seqs.add_(n)  # hisparse's seq_len counts every query token of the step
        counts.fill_(n)
        if self._data_dev.type == "cpu":
            self._check_rows(rows, min(int(self.num_real_reqs[0]), bs))
        self._register_verify_tokens(req_pool_indices, seq_lens, bs, n)
        self._append_verify_tokens(layer_id, rows, seqs, counts, bs)
        positions = self._v_positions[:bs]
        ids = logical_top_k.view(bs, n, -1).to(self._data_dev, torch.int64)
        width = ids.shape[2]
        found = self.token_position[ids.clamp(min=0)]
        positions[:, :n, :width].copy_(torch.where(ids >= 0, found, torch.full_like(found, -1)))
        positions[:, :n, width:].fill_(-1)
        positions[:, n:].fill_(-1)
        table = self._v_table[:bs]
        self.session.resolve(layer_id, rows, seqs, positions, None, batch_size=self.num_real_reqs, max_batch=bs,
                             page_table=table, query_counts=counts, programmatic=True)
        return table[:, :n].reshape(bs * n, self.top_k)

    def _register_verify_tokens(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, bs: int, n: int) -> None:
        """_v_locs[:bs, :n] = the logical ids of the verify tokens; their positions into
        token_position (padded entries write into its spare last entry)."""
        r2t = self.req_to_token_pool.req_to_token
        rpi = req_pool_indices.to(r2t.device, torch.int64).unsqueeze(1)
        cols = (seq_lens.to(r2t.device, torch.int64).unsqueeze(1) + self._v_tq[:n]).clamp(max=r2t.shape[1] - 1)
        locs = self._v_locs[:bs, :n]
        locs.copy_(r2t[rpi, cols])
        real = (self._v_entry[:bs] < self.num_real_reqs).unsqueeze(1)
        spare = self.token_position.shape[0] - 1
        target = torch.where(real, locs.to(self._data_dev), torch.full_like(locs, spare, device=self._data_dev))
        self.token_position.index_put_((target.reshape(-1),), cols.to(self._data_dev, torch.int32).reshape(-1))

    def _append_verify_tokens(self, layer_id: int, rows, seqs, counts, bs: int) -> None:
        """Record i * N_max + t of _v_records is verify token t of entry i (append's layout)."""
        locs = self._v_locs[:bs].reshape(-1)
        mapping = getattr(self.allocator, "full_to_hisparse_device_index_mapping", None)
        if mapping is not None:
            locs = mapping[locs.to(mapping.device)]
        kv, records = self._kv[layer_id], self._v_records[:bs * self.num_draft_tokens]
        if kv.device == records.device:
            torch.index_select(kv, 0, locs.to(kv.device), out=records)
        else:  # a CUDA pool under the host backend (tests only): a copy, not graph-safe
            records.copy_(kv.index_select(0, locs.to(kv.device)))
        self.session.append(layer_id, rows, seqs, records, batch_size=self.num_real_reqs, max_batch=bs,
                            token_counts=counts)

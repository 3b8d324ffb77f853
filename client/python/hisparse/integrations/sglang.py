"""SGLang adapter: ``HisparsedCoordinator``, SGLang's ``HiSparseCoordinator`` backed by hisparsed.

It answers the calls SGLang's scheduler, batch-result processor, ``ScheduleBatch`` and DSA attention
backend make on ``python/sglang/srt/managers/hisparse_coordinator.py``'s ``HiSparseCoordinator``
(main-line ``009e640a``; docs/INTEGRATION.md, "SGLang adapter"), with one hisparse ``Session``
in place of SGLang's host pool, device buffers, LRU tables and copy streams:

- a request is a hisparse request (ids assigned here, 1, 2, ...); its ``req_pool_idx`` maps to the
  session row the daemon gave it (``row_of_pool_idx``, int32 [R], -1 for none);
- staging (``admit_request_into_staging``) admits it and stores its prefill KV from SGLang's
  device pool, layer by layer, with the indexed store; ``collect_ready_reqs`` hands it back;
- each decode step ``map_last_loc_to_buffer`` remembers where the newest token's KV lands in
  SGLang's pool; ``swap_in_selected_pages`` appends that record (host pool + newest slot) and
  RESOLVEs, returning indices into the slot arena (``attention_kv_buffer``), -1 for padding;
- ``retract_req`` parks (the host copy stays; re-admission resumes and stores only what is new);
  ``retract_reqs`` (hisparse's batched form) parks a whole retraction in one round trip;
- ``admit_request_direct`` (PD) completes an import granted by ``prealloc_direct``.

Engine objects touched: ``req.rid``, ``req.origin_input_ids``, ``req.output_ids``,
``req.req_pool_idx``, ``req.sampling_params.max_new_tokens`` (optional), ``req.hisparse_staging``
(set here); ``req_to_token_pool.req_to_token`` (int [R, max_context]);
``token_to_kv_pool_allocator.get_kvcache()`` (``layer_num``, ``kv_buffer``: one [tokens, ...]
tensor per layer) and its optional ``full_to_hisparse_device_index_mapping``.

Thread-safety: none, as upstream: SGLang calls its coordinator from the scheduler thread and the
forward of the same rank, never concurrently. The coordinator owns its Session (``destroy``).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Dict, List, NamedTuple, Optional

import torch

from ..errors import FailedPrecondition, InvalidArgument, NotFound
from ..session import Session


class HiSparseTokenStats(NamedTuple):
    """What ``get_token_stats`` returns, as upstream's NamedTuple of the same name."""

    device_tokens: int
    device_token_usage: float
    host_tokens: int
    host_token_usage: float


@dataclasses.dataclass
class _Entry:
    """One SGLang request as hisparse knows it."""

    request_id: int  # the hisparse request id
    pool_idx: int  # SGLang's req_pool_idx while it holds a row, else -1
    kv_len: int = 0  # positions whose records the host pool holds
    state: str = "staging"  # staging | import | ready | parked


class HisparsedCoordinator:
    """SGLang's HiSparseCoordinator over a hisparse Session (see the module docstring).

    The first eight arguments are upstream's constructor's; host_to_device_ratio and
    swap_in_block_size are accepted and unused (the daemon sizes the host pool; RESOLVE picks its
    own launch). daemon: the hisparsed address or Daemon (None: $HISPARSE_DAEMON, else the node's
    socket); backend: the Session's ("auto", "host", "cuda").

    With a tp_group of more than one rank the ranks' sessions join one daemon TP group (docs/
    DESIGN.md, "TP groups"), named tp_group_name or by rank 0 (a broadcast over tp_group at
    construction, which returns once every rank's session is open: a group admits nothing
    before). Every request is then admitted for the whole group at once, all or nothing, and its
    host pages are held once for the group, not once per rank. SGLang's ranks make the same
    calls in the same order, so the request ids agree. PD direct admission is refused then (the
    daemon imports no group request).
    """

    def __init__(self, req_to_token_pool: Any, token_to_kv_pool_allocator: Any, top_k: int,
                 device_buffer_size: int, device: str, tp_group: Any = None, host_to_device_ratio: int = 2,
                 swap_in_block_size: int = 960, *, daemon: Any = None, backend: str = "auto",
                 draft_tokens: int = 0, tp_group_name: Optional[str] = None) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = token_to_kv_pool_allocator
        self.mem_pool_device = token_to_kv_pool_allocator.get_kvcache()
        self.device = torch.device(device)
        self.top_k = top_k
        self.tp_group = tp_group
        self.tp_world_size = torch.distributed.get_world_size(tp_group) if tp_group is not None else 1
        self.tp_rank = torch.distributed.get_rank(tp_group) if tp_group is not None else 0
        group: Dict[str, Any] = {}
        if self.tp_world_size > 1:
            group = dict(group=tp_group_name or self._agree_on_group_name(tp_group), rank=self.tp_rank,
                         group_size=self.tp_world_size)
        self._grouped = bool(group)
        self._kv = [self._records(buf) for buf in self.mem_pool_device.kv_buffer]
        self.item_size_bytes = self._kv[0].shape[1]
        self.num_reqs = req_to_token_pool.req_to_token.shape[0]
        gpu = self.device.index if self.device.type == "cuda" else -1
        if gpu is None:
            gpu = torch.cuda.current_device()
        self.session = Session(daemon, num_layers=self.mem_pool_device.layer_num, record_bytes=self.item_size_bytes,
                               k=top_k, slots=device_buffer_size, max_requests=self.num_reqs, gpu=gpu,
                               backend=backend, engine_name="sglang", draft_tokens=draft_tokens, **group)
        if self._grouped:  # a group admits only once every rank's session is open
            torch.distributed.barrier(group=tp_group)
        self.device_buffer_size = device_buffer_size
        data_dev = torch.device("cuda", gpu) if self.session.backend == "cuda" else torch.device("cpu")
        self._data_dev = data_dev
        self.row_of_pool_idx = torch.full((self.num_reqs,), -1, dtype=torch.int32, device=data_dev)
        self.num_real_reqs = torch.zeros(1, dtype=torch.int32, device=data_dev)  # filled by the model runner
        self.top_k_device_locs_buffer = torch.full((self.num_reqs, top_k), -1, dtype=torch.int32, device=data_dev)
        self._entries: Dict[Any, _Entry] = {}  # by req.rid
        self._next_id = 1
        self._staging: List[Any] = []  # (req, event) FIFO
        self.decode_producer_stream = None
        self._init_step_buffers()

    def _init_step_buffers(self) -> None:
        """The decode path's static buffers (graph-safe: every call reuses them, so a captured
        swap_in_selected_pages reads what the next map_last_loc_to_buffer writes).

        map_last_loc_to_buffer fills _step_rows / _step_seqs / _step_locs for its batch and sets
        _append_count to its size; lifecycle changes set it to 0, so no append of a stale step
        can run. swap_in_selected_pages gathers the newest records into _newest and builds its
        RESOLVE input in _rows / _seqs / _positions / _past_end."""
        R, k, dev = self.num_reqs, self.top_k, self._data_dev
        self._step_rows = torch.zeros(R, dtype=torch.int32, device=dev)
        self._step_seqs = torch.ones(R, dtype=torch.int32, device=dev)
        self._step_locs = torch.zeros(R, dtype=torch.int64, device=self._kv[0].device)
        self._append_count = torch.zeros(1, dtype=torch.int32, device=dev)
        self._newest = torch.zeros(R, self.item_size_bytes, dtype=torch.uint8, device=dev)
        self._rows = torch.zeros(R, dtype=torch.int32, device=dev)
        self._seqs = torch.ones(R, dtype=torch.int32, device=dev)
        self._positions = torch.full((R, k), -1, dtype=torch.int32, device=dev)
        self._past_end = torch.zeros(R, k, dtype=torch.bool, device=dev)
        self._cols = torch.arange(k, dtype=torch.int32, device=dev)

    @staticmethod
    def _agree_on_group_name(tp_group: Any) -> str:
        """The daemon group's name for this TP group: rank 0 draws one and broadcasts it."""
        name = [f"sglang-{uuid.uuid4().hex}" if torch.distributed.get_rank(tp_group) == 0 else None]
        torch.distributed.broadcast_object_list(name, src=torch.distributed.get_global_rank(tp_group, 0), group=tp_group)
        return name[0]

    @staticmethod
    def _records(buf: torch.Tensor) -> torch.Tensor:
        """A device-pool layer as uint8 [tokens, record_bytes]: a view (raises if it cannot be one)."""
        flat = buf.view(buf.shape[0], -1)
        return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat

    # ---- lifecycle ----

    def set_decode_producer_stream(self, stream: Any) -> None:
        self.decode_producer_stream = stream

    def destroy(self) -> None:
        """Releases every request still known and closes the session."""
        if self.session.closed:
            return
        self._quiesce()
        ids = [e.request_id for e in self._entries.values()]
        self._entries.clear()
        self._staging.clear()
        for i in range(0, len(ids), 1024):  # hs_release_batch's most items
            self.session.release_batch(ids[i:i + 1024])
        self.session.close()

    def _quiesce(self) -> None:
        """CUDA backend: waits for the forward that may still read a row or store a request's
        records (upstream waits on decode_producer_stream), before the row or pages go back."""
        if self.session.backend != "cuda":
            return
        stream = self.decode_producer_stream or torch.cuda.current_stream()
        stream.synchronize()

    def get_token_stats(self) -> HiSparseTokenStats:
        """Device tokens: rows in use x (B + 1) slots; host tokens: this session's host bytes in records."""
        st = self.session.stats()
        rows = sum(1 for e in self._entries.values() if e.pool_idx >= 0)
        per_row = self.device_buffer_size + 1
        host_tokens = st.session_host_bytes // (self.item_size_bytes * self.session.num_layers)
        return HiSparseTokenStats(rows * per_row, rows / self.num_reqs,
                                  host_tokens, st.pool_used_bytes / max(1, st.pool_capacity_bytes))

    def has_ongoing_staging(self) -> bool:
        return bool(self._staging)

    def _entry(self, req: Any) -> _Entry:
        e = self._entries.get(req.rid)
        if e is None:
            raise NotFound(f"request {req.rid!r} is not known to the hisparse coordinator")
        return e

    @staticmethod
    def _kv_len(req: Any) -> int:
        """Positions with KV in SGLang's pool: the prompt and every output token but the last
        (the next decode step writes that one)."""
        return len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)

    def _budget(self, req: Any, kv_len: int) -> int:
        sp = getattr(req, "sampling_params", None)
        max_new = getattr(sp, "max_new_tokens", None) if sp is not None else None
        cap = self.req_to_token_pool.req_to_token.shape[1]
        return min(cap, kv_len + max_new + 1) if max_new is not None else cap

    def _bind(self, req: Any, e: _Entry, row: int) -> None:
        e.pool_idx = int(req.req_pool_idx)
        self.row_of_pool_idx[e.pool_idx] = row

    def _unbind(self, e: _Entry) -> None:
        if e.pool_idx >= 0:
            self.row_of_pool_idx[e.pool_idx] = -1
            e.pool_idx = -1

    def _store(self, req: Any, e: _Entry, start: int, end: int) -> None:
        """Indexed store of positions [start, end) of every layer from SGLang's device pool."""
        if end <= start:
            return
        locs = self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].to(torch.int64)
        mapping = getattr(self.allocator, "full_to_hisparse_device_index_mapping", None)
        if mapping is not None:
            locs = mapping[locs]
        index = locs.to(device=self._data_dev, dtype=torch.int32).contiguous()
        for layer, kv in enumerate(self._kv):
            self.session.store_indexed(e.request_id, kv.unsqueeze(0), index, start_pos=start,
                                       first_layer=layer, num_layers=1, seq_len_after=end)
        e.kv_len = end

    def admit_request_into_staging(self, req: Any) -> None:
        """After the last prefill chunk: admit (or resume a parked request) and store its KV."""
        kv_len = self._kv_len(req)
        e = self._entries.get(req.rid)
        if e is not None and e.state != "parked":
            raise FailedPrecondition(f"request {req.rid!r} is already admitted ({e.state})")
        if e is None:
            e = _Entry(self._next_id, -1)
            info = self.session.admit(e.request_id, kv_len, self._budget(req, kv_len), group=self._grouped)
            self._next_id += 1
            self._entries[req.rid] = e
            start = 0
        else:  # re-admission after retraction: the host pool still holds [0, e.kv_len)
            info = self.session.resume(e.request_id)
            if kv_len + 1 > info.capacity_tokens:
                self.session.extend(e.request_id, self._budget(req, kv_len))
            start = min(e.kv_len, kv_len)
        e.state = "staging"
        self._append_count.zero_()  # lifecycle changes happen between decode steps
        self._bind(req, e, info.row)
        self._store(req, e, start, kv_len)
        event = None
        if self.session.backend == "cuda":
            event = torch.cuda.Event()
            event.record()
        req.hisparse_staging = True
        self._staging.append((req, event))

    def collect_ready_reqs(self) -> List[Any]:
        """The staged requests whose store has completed, FIFO; with TP > 1 every rank hands back
        the same number (MIN all-reduce over tp_group), as upstream."""
        ready = 0
        for _, event in self._staging:
            if event is not None and not event.query():
                break
            ready += 1
        if self.tp_world_size > 1:
            count = torch.tensor([ready], dtype=torch.int64)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN, group=self.tp_group)
            ready = int(count.item())
        out = [req for req, _ in self._staging[:ready]]
        del self._staging[:ready]
        for req in out:
            self._entries[req.rid].state = "ready"
            req.hisparse_staging = False
        return out

    def prealloc_direct(self, req: Any) -> bytes:
        """PD decode side (upstream ``DecodePreallocQueue._pre_alloc``): admits the request as an
        import and returns the serialized transfer grant for the prefill node's transfer agent.
        FailedPrecondition when the daemon serves no imports."""
        if req.rid in self._entries:
            raise FailedPrecondition(f"request {req.rid!r} is already admitted")
        if self._grouped:
            raise FailedPrecondition("PD direct admission under a TP group: the daemon imports no group request")
        kv_len = self._kv_len(req)
        e = _Entry(self._next_id, -1, kv_len, "import")
        try:
            grant = self.session.admit_import(e.request_id, kv_len, self._budget(req, kv_len))
        except FailedPrecondition as err:
            raise FailedPrecondition(f"PD direct admission needs a daemon that serves imports: {err}") from err
        self._next_id += 1
        self._entries[req.rid] = e
        return grant

    def admit_request_direct(self, req: Any, timeout_ms: int = 10000) -> None:
        """PD: the transfer agent committed the import granted by prealloc_direct; bind the row.
        The row starts empty: the first RESOLVE fetches what it selects."""
        e = self._entries.get(req.rid)
        if e is None or e.state != "import":
            raise FailedPrecondition(f"request {req.rid!r} has no import in flight: call prealloc_direct first")
        info = self.session.await_import(e.request_id, timeout_ms)
        e.state = "ready"
        self._bind(req, e, info.row)
        req.hisparse_staging = False

    def abort_staging_request(self, req: Any) -> None:
        """Drops a staged request: its store is abandoned and its memory freed."""
        e = self._entry(req)
        if e.state != "staging":
            raise FailedPrecondition(f"request {req.rid!r} is not staging ({e.state})")
        self._staging = [(r, ev) for r, ev in self._staging if r.rid != req.rid]
        req.hisparse_staging = False
        self._forget(req, e)

    def retract_req(self, req: Any) -> None:
        """Staging: abort it. Otherwise park: the row is given back, the host copy stays, and the
        next admit_request_into_staging of this request resumes it."""
        e = self._entry(req)
        if e.state == "staging":
            self.abort_staging_request(req)
            return
        if e.state != "ready":
            raise FailedPrecondition(f"request {req.rid!r} cannot be retracted ({e.state})")
        self._quiesce()
        self.session.park(e.request_id)
        self._append_count.zero_()
        self._unbind(e)
        # The host pool holds every position with KV in SGLang's pool: the last decode step
        # appended position seq_len - 1 = _kv_len(req) - 1 (its output was recorded since).
        e.kv_len = max(e.kv_len, self._kv_len(req))
        e.state = "parked"

    def retract_reqs(self, reqs: Any) -> None:
        """retract_req for every request SGLang's retract path retracts in one step (upstream calls
        retract_req in a loop): staging ones are aborted, and every ready one is parked with ONE
        park_batch round trip per 1024 (all or nothing: any refusal parks none and raises it)."""
        reqs = list(reqs)
        entries = [(req, self._entry(req)) for req in reqs]
        for req, e in entries:
            if e.state not in ("staging", "ready"):
                raise FailedPrecondition(f"request {req.rid!r} cannot be retracted ({e.state})")
        if len({req.rid for req in reqs}) != len(reqs):
            raise InvalidArgument("retract_reqs: a request is named twice")
        for req, e in entries:
            if e.state == "staging":
                self.abort_staging_request(req)
        ready = [(req, e) for req, e in entries if e.state == "ready"]
        if not ready:
            return
        self._quiesce()
        for i in range(0, len(ready), 1024):  # hs_park_batch's most items
            chunk = ready[i:i + 1024]
            self.session.park_batch([e.request_id for _, e in chunk], all_or_nothing=True)
            for req, e in chunk:
                self._unbind(e)
                e.kv_len = max(e.kv_len, self._kv_len(req))  # as retract_req
                e.state = "parked"
        self._append_count.zero_()

    def request_finished(self, req: Any) -> None:
        """Frees the request's host pages and row. A request this coordinator never saw is
        ignored, as upstream's frees nothing for it (a failed PD transfer calls it that way)."""
        e = self._entries.get(req.rid)
        if e is None:
            return
        if e.state == "staging":
            self._staging = [(r, ev) for r, ev in self._staging if r.rid != req.rid]
        self._forget(req, e)

    def _forget(self, req: Any, e: _Entry) -> None:
        self._append_count.zero_()  # lifecycle changes happen between decode steps
        self._quiesce()
        self._unbind(e)
        del self._entries[req.rid]
        self.session.release(e.request_id)

    # ---- decode data path (graph-safe: fixed shapes, static buffers, no host sync on CUDA) ----

    def map_last_loc_to_buffer(self, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                               req_pool_indices: torch.Tensor, seq_lens_cpu: Any = None,
                               req_pool_indices_cpu: Any = None) -> None:
        """Before the decode forward (after seq_lens += 1), outside the captured graph as upstream
        (ScheduleBatch.prepare_for_decode): the newest token of each row is written at
        out_cache_loc of SGLang's pool; every swap_in_selected_pages of the step appends it. Fills
        the static step buffers in place (device copies; no host sync on CUDA). The CPU arguments
        are accepted for upstream's signature and not needed."""
        n = int(req_pool_indices.shape[0])
        if n > self.num_reqs or out_cache_loc.shape[0] != n or seq_lens.shape[0] != n:
            raise InvalidArgument(f"map_last_loc_to_buffer: {n} requests, {out_cache_loc.shape[0]} locations and "
                                  f"{seq_lens.shape[0]} lengths; the request pool has {self.num_reqs} slots")
        locs = out_cache_loc
        mapping = getattr(self.allocator, "full_to_hisparse_device_index_mapping", None)
        if mapping is not None:
            locs = mapping[locs.to(mapping.device, torch.int64)]
        rows = self._step_rows[:n]
        torch.index_select(self.row_of_pool_idx, 0, req_pool_indices.to(self._data_dev, torch.int64), out=rows)
        self._check_rows(rows, n)
        self._step_seqs[:n].copy_(seq_lens)
        self._step_locs[:n].copy_(locs)
        self._append_count.fill_(n)

    def _check_rows(self, rows: torch.Tensor, real: int) -> None:
        """Host backend: a real entry whose req_pool_idx holds no request is refused at once. On
        CUDA it is not checked here (that would sync): RESOLVE and append flag its row -1 as a bad
        row (check_errors()), write -1 for it, and touch no other row."""
        if rows.device.type == "cpu" and bool((rows[:real] < 0).any()):
            bad = int(torch.nonzero(rows[:real] < 0)[0, 0])
            raise FailedPrecondition(f"batch entry {bad}: its req_pool_idx holds no admitted request")

    def attention_kv_buffer(self, layer_id: int = 0) -> Any:
        """What the attention kernel reads with swap_in_selected_pages' indices: the slot arena as
        uint8 [records, record_stride] (every layer's slots; the indices are global)."""
        arena = self.session.slot_view()
        return arena.reshape(-1, arena.shape[-1])

    def _check_batch(self, bs: int, top_k_result: torch.Tensor, lists: int) -> None:
        if bs > self.num_reqs:
            raise InvalidArgument(f"batch of {bs} rows; the request pool has {self.num_reqs}")
        if top_k_result.dim() != 2 or top_k_result.shape[0] != lists or top_k_result.shape[1] > self.top_k:
            raise InvalidArgument(f"top_k_result has shape {tuple(top_k_result.shape)}; "
                                  f"need [{lists}, <= {self.top_k}]")

    def _append_newest(self, layer_id: int, bs: int) -> None:
        """Appends the step's newest records of layer_id (host pool + newest slot) for the entries
        map_last_loc_to_buffer covered (_append_count; 0 after a lifecycle change)."""
        kv, newest, locs = self._kv[layer_id], self._newest[:bs], self._step_locs[:bs]
        if kv.device == newest.device:
            torch.index_select(kv, 0, locs, out=newest)
        else:  # a CUDA pool under the host backend (tests only): a copy, not graph-safe
            newest.copy_(kv.index_select(0, locs))
        self.session.append(layer_id, self._step_rows[:bs], self._step_seqs[:bs], newest,
                            batch_size=self._append_count, max_batch=bs)

    def swap_in_selected_pages(self, req_pool_indices: torch.Tensor, compressed_seq_lens: torch.Tensor,
                               top_k_result: torch.Tensor, layer_id: int) -> torch.Tensor:
        """One layer: append this step's newest token (after map_last_loc_to_buffer), then RESOLVE
        the selection. Returns int32 [bs, top_k]: the record index of each selected position in
        attention_kv_buffer(), -1 for padding, for columns >= seq_len and for rows >= num_real_reqs.

        Graph-safe: every tensor it hands the kernels is a slice of a buffer built at construction,
        filled by fixed-shape device ops (index_select, copy_, ge, masked_fill_); nothing reads a
        device value on the host and nothing depends on the batch's contents, so the call can sit
        in a captured CUDA graph replayed for any num_real_reqs <= bs. On the host backend it also
        refuses real entries without a request (that check reads num_real_reqs)."""
        bs = int(req_pool_indices.shape[0])
        self._check_batch(bs, top_k_result, bs)
        rows, seqs, positions = self._rows[:bs], self._seqs[:bs], self._positions[:bs]
        torch.index_select(self.row_of_pool_idx, 0, req_pool_indices.to(self._data_dev, torch.int64), out=rows)
        seqs.copy_(compressed_seq_lens)
        width = int(top_k_result.shape[1])
        positions[:, :width].copy_(top_k_result)
        positions[:, width:].fill_(-1)
        # Only the first min(seq_len, top_k) columns are meaningful (upstream's contract).
        past_end = self._past_end[:bs]
        torch.ge(self._cols.unsqueeze(0), seqs.unsqueeze(1), out=past_end)
        positions.masked_fill_(past_end, -1)
        if self._data_dev.type == "cpu":
            self._check_rows(rows, min(int(self.num_real_reqs[0]), bs))
        self._append_newest(layer_id, bs)
        out = self.top_k_device_locs_buffer[:bs]
        self.session.resolve(layer_id, rows, seqs, positions, None, batch_size=self.num_real_reqs,
                             max_batch=bs, page_table=out, programmatic=True)
        return out

"""SGLang adapter: ``HisparsedCoordinator``, SGLang's ``HiSparseCoordinator`` backed by hisparsed.

It answers the calls SGLang makes on ``python/sglang/srt/managers/hisparse_coordinator.py``'s
``HiSparseCoordinator`` (sgl-project/sglang 009e640a75037e6d603ceb9eb1a4a41d64d049f6;
docs/INTEGRATION.md, "SGLang") and has the same side effects on SGLang's allocator, pools and
index spaces, with one hisparse ``Session`` in place of SGLang's host pool, device buffers, LRU
tables and copy streams. What SGLang relies on, and where it happens here:

- two index spaces: ``req_to_token`` holds logical locations; the allocator's
  ``full_to_hisparse_device_index_mapping`` maps them to physical slots of the device pool, and
  every KV write goes through it (``set_mla_kv_buffer``). A prefill has both; a decode token has a
  logical location only until ``map_last_loc_to_buffer`` points it at the request's reserved
  physical slot, where the forward then writes it and ``swap_in_selected_pages`` appends it
  (host pool + newest slot) before RESOLVE;
- staging (``admit_request_into_staging``) admits the request and stores its prompt from the
  physical slots; once the store is done ``collect_ready_reqs`` calls the allocator's
  ``alloc_device_buffer``, which unmaps the prompt, keeps one page for the decode token and gives
  every other physical slot back: the capacity gain hisparse exists for;
- the DSA backend's ``forward_decode`` reads ``token_to_kv_pool.get_key_buffer(layer)`` with the
  swap-in's indices, so the device pool's ``get_key_buffer`` (an attribute of that instance, set
  here) returns the session's slot arena, uint8 [records, 1, record_stride], to that caller, and
  the pool's own buffer to every other (forward_extend and get_mla_kv_buffer read physical slots
  through the mapping); ``flashmla_kv_view()`` is the [num_pages, 64, 1, 656] view FlashMLA's fp8
  path wants;
- the overlap scheduler: ``map_last_loc_to_buffer`` and every lifecycle change wait for the
  decode producer stream before rewriting what its queued forward reads;
- ``retract_req`` releases the request as upstream's does (``request_finished``): a retracted
  request is prefilled again if it returns, and one aborted while retracted holds nothing;
- PD decode: ``mem_pool_host`` is a host landing pool the transfer writes into
  (``get_contiguous_buf_infos``, ``alloc_paged_token_slots`` into ``req_to_host_pool``);
  ``admit_request_direct`` admits the request and stores what landed. ``prealloc_direct`` is the
  alternative where the daemon imports the KV itself.

Thread-safety: none, as upstream: SGLang calls its coordinator from the scheduler thread and the
forward of the same rank, never concurrently. The coordinator owns its Session (``destroy``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

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
    state: str = "staging"  # staging | import | ready | lost (a restart of hisparsed took its KV)
    buffer: Any = None  # the physical slots alloc_device_buffer kept (ready requests)
    was_staging: bool = False  # lost while staging: its prompt's physical slots are still mapped


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
                 draft_tokens: int = 0, tp_group_name: Optional[str] = None,
                 lease_seconds: Optional[int] = None) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        for need in ("alloc_device_buffer", "free_hisparse_indices", "full_to_hisparse_device_index_mapping"):
            if not hasattr(token_to_kv_pool_allocator, need):
                raise InvalidArgument(f"the allocator has no {need}: the coordinator needs SGLang's "
                                      "HiSparseTokenToKVPoolAllocator (--enable-hisparse)")
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
        # Durable admissions (a restart of hisparsed keeps them: ride_through); $HISPARSE_LEASE_SECONDS
        # when SGLang builds the coordinator. A TP group's requests are never durable.
        if lease_seconds is None:
            lease_seconds = int(os.environ.get("HISPARSE_LEASE_SECONDS", "0") or 0)
        self.lease_seconds = 0 if self._grouped else int(lease_seconds)
        self._kv = [self._records(buf) for buf in self.mem_pool_device.kv_buffer]
        self.item_size_bytes = self._kv[0].shape[1]
        self.page_size = int(getattr(self.mem_pool_device, "page_size", 1) or 1)
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
        mapping = self._mapping
        # The physical slot each request's decode token is written to (alloc_device_buffer's first).
        self._reserved = torch.zeros(self.num_reqs, dtype=torch.int64, device=mapping.device)
        self._entries: Dict[Any, _Entry] = {}  # by req.rid
        self._next_id = 1
        self._staging: List[Any] = []  # (req, event) FIFO
        self.decode_producer_stream = None
        self._pd_host: Optional[_LandingPool] = None
        self._req_to_host_pool: Optional[torch.Tensor] = None
        self._req_to_host_pool_allocated_len: Optional[torch.Tensor] = None
        self._arena: Optional[torch.Tensor] = None
        self.lost_staging: List[Any] = []  # ride_through: requests lost while staging, to retract
        self._init_step_buffers()
        # The DSA backend's decode reads this instance's get_key_buffer with the swap-in's indices;
        # every other reader with physical slots of the pool (see _pool_get_key_buffer).
        self._own_get_key_buffer = self.mem_pool_device.get_key_buffer
        self.mem_pool_device.get_key_buffer = self._pool_get_key_buffer

    @property
    def _mapping(self) -> torch.Tensor:
        return self.allocator.full_to_hisparse_device_index_mapping

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

    # ---- what the attention backend reads ----

    # The callers of the device pool's get_key_buffer that index it with the swap-in's output
    # (upstream dsa_backend.py DeepseekSparseAttnBackend.forward_decode, which AttentionBackend.forward
    # runs when forward_batch.forward_mode.is_decode()).
    ARENA_READERS = ("forward_decode",)

    def _reads_arena(self, caller: Any) -> bool:
        """Whether the frame that called the pool's get_key_buffer reads it at swap-in indices."""
        return caller.f_code.co_name in self.ARENA_READERS

    def _pool_get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The device pool's get_key_buffer while this coordinator serves it. Upstream has one
        buffer for two index spaces: its swap-in returns physical slots of the same pool that
        forward_extend (prefill, chunked prefill, draft extend, target verify) reads at
        translate_loc_to_hisparse_device's physical slots and get_mla_kv_buffer reads through
        the mapping. Here the swap-in's indices are records of the daemon's arena, so the arena is
        returned only to the reader that indexes it with them (ARENA_READERS: the backend's
        forward_decode); every other caller gets the pool's own buffer. Keyed on the caller, not on
        a flag: the same holds while a CUDA graph is captured (nothing calls into the coordinator
        before forward_decode's read then) and after a replay."""
        if self._reads_arena(sys._getframe(1)):
            return self.get_key_buffer(layer_id)
        return self._own_get_key_buffer(layer_id)

    def get_key_buffer(self, layer_id: int = 0) -> torch.Tensor:
        """What the decode's swap-in indices index (the device pool's get_key_buffer returns it to
        forward_decode): the session's slot arena as uint8 [records, 1, record_stride], every
        layer's slots (the swap-in's indices are global, so the same tensor serves every layer). A
        view, no copy."""
        if self._arena is None:
            arena = self.session.slot_view()
            if not isinstance(arena, torch.Tensor):  # host backend: a numpy array over the arena
                arena = torch.from_numpy(arena)
            self._arena = arena.reshape(-1, 1, arena.shape[-1])
        return self._arena

    def attention_kv_buffer(self, layer_id: int = 0) -> Any:
        """get_key_buffer as [records, record_stride]."""
        kv = self.get_key_buffer(layer_id)
        return kv.view(kv.shape[0], kv.shape[2])

    def flashmla_kv_view(self, page_size: int = 64, record_bytes: int = 656) -> torch.Tensor:
        """The arena as FlashMLA's fp8 path reads a KV cache: uint8 [num_pages, page_size, 1,
        record_bytes]. Needs a record stride of exactly record_bytes and a record count that
        page_size divides (max_requests x layers x record slots)."""
        kv = self.get_key_buffer()
        records, stride = kv.shape[0], kv.shape[2]
        if stride != record_bytes:
            raise FailedPrecondition(f"the arena's record stride is {stride} bytes; FlashMLA's fp8 view needs "
                                     f"{record_bytes} (records of {self.item_size_bytes} bytes)")
        if records % page_size:
            raise FailedPrecondition(f"the arena holds {records} records, not a multiple of {page_size}: choose "
                                     "max_requests, layers and device_buffer_size so that it is")
        return kv.view(records // page_size, page_size, 1, record_bytes)

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
        if self.mem_pool_device.__dict__.get("get_key_buffer") == self._pool_get_key_buffer:
            del self.mem_pool_device.get_key_buffer
        self._arena = None
        self.session.close()

    def _wait_for_producer(self) -> None:
        """Orders what follows after the work queued on the decode producer stream (the overlap
        scheduler's forward): a device-side wait on CUDA, a synchronize otherwise."""
        p = self.decode_producer_stream
        if p is None:
            return
        if self.session.backend == "cuda" and isinstance(p, torch.cuda.Stream):
            torch.cuda.current_stream(p.device).wait_stream(p)
        else:
            p.synchronize()

    def _stop_appends(self) -> None:
        """A lifecycle change between decode steps: no swap-in appends the last mapped step again
        (_append_count = 0), but only after the forward queued on the producer stream has read
        the count, or that forward would skip its own step's appends (the overlap scheduler runs
        admissions while it is queued)."""
        self._wait_for_producer()
        self._append_count.zero_()

    def _quiesce(self) -> None:
        """Before a row or pages go back to the daemon, or physical slots to the allocator: waits
        (on the host) for the forward that may still read or write them."""
        if self.decode_producer_stream is not None:
            self.decode_producer_stream.synchronize()
        if self.session.backend == "cuda":
            torch.cuda.current_stream().synchronize()

    def wait_for_pending_backup(self) -> None:
        """ModelRunner calls this before every decode forward. Upstream orders the forward after its
        device-to-host backup of the previous decode token; here that record is appended inside the
        forward itself (swap_in_selected_pages), in stream order, and a staged request's store has
        completed before collect_ready_reqs hands it to a batch. Nothing is pending: a no-op."""

    def get_token_stats(self) -> HiSparseTokenStats:
        """Device tokens: the physical slots in use (the allocator's); host tokens: this session's
        host bytes in records."""
        phys = getattr(self.allocator, "hisparse_attn_allocator", None)
        if phys is not None:
            cap = phys.size
            dev_tokens = cap - phys.available_size()
        else:
            cap = self.num_reqs * (self.device_buffer_size + 1)
            dev_tokens = sum(1 for e in self._entries.values() if e.pool_idx >= 0) * (self.device_buffer_size + 1)
        st = self.session.stats()
        host_tokens = st.session_host_bytes // (self.item_size_bytes * self.session.num_layers)
        return HiSparseTokenStats(dev_tokens, dev_tokens / max(1, cap),
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

    def _allocated_len(self, req: Any) -> int:
        """Positions of req_to_token[req_pool_idx] holding a location SGLang allocated."""
        kv = getattr(req, "kv", None)
        n = getattr(kv, "kv_allocated_len", None) if kv is not None else None
        if n is None:
            n = self._kv_len(req) + 1
        return min(int(n), self.req_to_token_pool.req_to_token.shape[1])

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

    def _logical(self, req: Any, start: int, end: int) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].to(self._mapping.device, torch.int64)

    def _store(self, req: Any, e: _Entry, start: int, end: int) -> None:
        """Indexed store of positions [start, end) of every layer from the physical slots the
        mapping gives their logical locations."""
        if end <= start:
            return
        index = self._mapping[self._logical(req, start, end)].to(device=self._data_dev, dtype=torch.int32)
        index = index.contiguous()
        for layer, kv in enumerate(self._kv):
            self.session.store_indexed(e.request_id, kv.unsqueeze(0), index, start_pos=start,
                                       first_layer=layer, num_layers=1, seq_len_after=end)
        e.kv_len = end

    def _buffer_slots(self) -> int:
        """Physical slots a ready request keeps: one page, whose first slot takes its decode token."""
        return self.page_size

    def _alloc_device_buffer(self, req: Any, e: _Entry) -> None:
        """The allocator's alloc_device_buffer over the request's allocated locations: the prompt
        is unmapped, _buffer_slots() physical slots are kept (or allocated, after a PD import) and
        every other one is freed."""
        buf = self.allocator.alloc_device_buffer(self._logical(req, 0, self._allocated_len(req)), self._buffer_slots())
        if buf is None:
            raise FailedPrecondition(f"request {req.rid!r}: alloc_device_buffer found no free physical slot")
        e.buffer = buf
        self._reserved[e.pool_idx] = buf[0]

    def _free_device_buffer(self, req: Any, e: _Entry) -> None:
        """The dual of _alloc_device_buffer (upstream request_finished): the kept slots freed, and
        every allocated location unmapped, so that SGLang's allocator.free frees none twice."""
        if e.buffer is not None:
            self.allocator.free_hisparse_indices(e.buffer)
            e.buffer = None
            self._mapping[self._logical(req, 0, self._allocated_len(req))] = 0
        if e.pool_idx >= 0:
            self._reserved[e.pool_idx] = 0

    def admit_request_into_staging(self, req: Any) -> None:
        """After the last prefill chunk: admit the request and store its KV."""
        kv_len = self._kv_len(req)
        if req.rid in self._entries:
            raise FailedPrecondition(f"request {req.rid!r} is already admitted ({self._entries[req.rid].state})")
        e = _Entry(self._next_id, -1)
        info = self.session.admit(e.request_id, kv_len, self._budget(req, kv_len), group=self._grouped,
                                  lease_seconds=self.lease_seconds)
        self._next_id += 1
        self._entries[req.rid] = e
        self._stop_appends()
        self._bind(req, e, info.row)
        self._store(req, e, 0, kv_len)
        event = None
        if self.session.backend == "cuda":
            event = torch.cuda.Event()
            event.record()
        req.hisparse_staging = True
        self._staging.append((req, event))

    def collect_ready_reqs(self) -> List[Any]:
        """The staged requests whose store has completed, FIFO, each given its device buffer
        (alloc_device_buffer: the prompt's other physical slots go back to the allocator); with
        TP > 1 every rank hands back the same number (MIN all-reduce over tp_group), as upstream."""
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
            e = self._entries[req.rid]
            self._alloc_device_buffer(req, e)
            e.state = "ready"
            req.hisparse_staging = False
        return out

    # ---- PD decode ----

    @property
    def mem_pool_host(self) -> "_LandingPool":
        """The host pool PD decode's transfer writes into (disaggregation/decode.py reads it in
        _init_kv_manager and _pre_alloc): one pinned [tokens, record] buffer a layer, allocated on
        first use. It only holds transfers in flight (admit_request_direct empties a request's
        slots), so it has as many tokens as SGLang's physical pool, or
        $HISPARSE_SGLANG_PD_LANDING_TOKENS."""
        if self._pd_host is None:
            phys = getattr(self.allocator, "hisparse_attn_allocator", None)
            tokens = int(os.environ.get("HISPARSE_SGLANG_PD_LANDING_TOKENS", "0") or 0) or \
                int(getattr(phys, "size", 0) or self.req_to_token_pool.req_to_token.numel())
            self._pd_host = _LandingPool(self.session.num_layers, self.item_size_bytes, tokens,
                                         pin=self.session.backend == "cuda")
        return self._pd_host

    @property
    def req_to_host_pool(self) -> torch.Tensor:
        if self._req_to_host_pool is None:
            self._req_to_host_pool = torch.full(tuple(self.req_to_token_pool.req_to_token.shape), -1, dtype=torch.int64)
        return self._req_to_host_pool

    @property
    def req_to_host_pool_allocated_len(self) -> torch.Tensor:
        if self._req_to_host_pool_allocated_len is None:
            self._req_to_host_pool_allocated_len = torch.zeros(self.num_reqs, dtype=torch.int64)
        return self._req_to_host_pool_allocated_len

    @staticmethod
    def host_token_len(kv_allocated_len: int) -> int:
        return int(kv_allocated_len)

    def _free_landing(self, req: Any) -> None:
        if self._req_to_host_pool is None or req.req_pool_idx is None:
            return
        idx = int(req.req_pool_idx)
        n = int(self.req_to_host_pool_allocated_len[idx])
        if n:
            slots = self._req_to_host_pool[idx, :n]
            self.mem_pool_host.free(slots[slots >= 0])
        self._req_to_host_pool[idx, :] = -1
        self.req_to_host_pool_allocated_len[idx] = 0

    def prealloc_direct(self, req: Any) -> bytes:
        """PD decode side, the daemon's own import: admits the request as an import and returns
        the serialized transfer grant for the prefill node's transfer agent (instead of SGLang's
        transfer into mem_pool_host). FailedPrecondition when the daemon serves no imports."""
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
        """PD decode's transfer queue, once the KV has landed. After SGLang's own transfer (into
        mem_pool_host at req_to_host_pool's slots): admits the request, stores what landed and
        frees the landing slots. After prealloc_direct: completes the daemon's import. Either way
        the request then gets its device buffer (a fresh page: its locations are logical only)."""
        e = self._entries.get(req.rid)
        if e is not None and e.state == "import":
            info = self.session.await_import(e.request_id, timeout_ms)
            self._bind(req, e, info.row)
        elif e is None:
            n = self.host_token_len(self._allocated_len(req))
            slots = self.req_to_host_pool[int(req.req_pool_idx), :n]
            if n == 0 or bool((slots < 0).any()):
                raise FailedPrecondition(f"request {req.rid!r}: no landed KV for {n} positions in req_to_host_pool")
            e = _Entry(self._next_id, -1)
            info = self.session.admit(e.request_id, n, self._budget(req, n), group=self._grouped,
                                      lease_seconds=self.lease_seconds)
            self._next_id += 1
            self._entries[req.rid] = e
            self._bind(req, e, info.row)
            index = torch.arange(n, dtype=torch.int32, device=self._data_dev)
            for layer in range(self.session.num_layers):
                landed = self.mem_pool_host.kv_buffer[layer][slots].to(self._data_dev)
                self.session.store_indexed(e.request_id, landed.unsqueeze(0), index, first_layer=layer,
                                           num_layers=1, seq_len_after=n)
            e.kv_len = n
            if self.session.backend == "cuda":
                torch.cuda.current_stream().synchronize()  # the landing slots are reused once freed
            self._free_landing(req)
        else:
            raise FailedPrecondition(f"request {req.rid!r} is already admitted ({e.state})")
        self._stop_appends()
        self._alloc_device_buffer(req, e)
        e.state = "ready"
        req.hisparse_staging = False

    # ---- release ----

    def abort_staging_request(self, req: Any) -> None:
        """Drops a staged request: its store is abandoned, its host memory freed, and its prompt's
        physical slots freed and unmapped (upstream's free_hisparse)."""
        e = self._entry(req)
        if e.state != "staging":
            raise FailedPrecondition(f"request {req.rid!r} is not staging ({e.state})")
        self._staging = [(r, ev) for r, ev in self._staging if r.rid != req.rid]
        req.hisparse_staging = False
        self._quiesce()
        self.allocator.free_hisparse(self._logical(req, 0, self._kv_len(req)))
        self._forget(req, e)

    def retract_req(self, req: Any) -> None:
        """As upstream: a staging request is aborted, any other released (request_finished). The
        request is prefilled again if it comes back; if it is aborted instead, nothing is held. A
        request lost while staging (ride_through) gives its prompt's physical slots back too."""
        e = self._entry(req)
        if e.state == "lost" and e.was_staging:
            self._quiesce()
            self.allocator.free_hisparse(self._logical(req, 0, self._kv_len(req)))
            self.lost_staging = [r for r in self.lost_staging if r.rid != req.rid]
            req.hisparse_staging = False
            self._forget(req, e)
            return
        if e.state == "staging":
            self.abort_staging_request(req)
        else:
            self.request_finished(req)

    def retract_reqs(self, reqs: Any) -> None:
        """retract_req for every request of one retraction (upstream calls retract_req in a loop),
        with ONE release_batch round trip per 1024 ready requests."""
        reqs = list(reqs)
        if len({req.rid for req in reqs}) != len(reqs):
            raise InvalidArgument("retract_reqs: a request is named twice")
        entries = [(req, self._entry(req)) for req in reqs]
        for req, e in entries:
            if e.state == "staging" or (e.state == "lost" and e.was_staging):
                self.retract_req(req)
        done = [(req, e) for req, e in entries if req.rid in self._entries and e.state != "staging"]
        if not done:
            return
        self._quiesce()
        self._append_count.zero_()
        for req, e in done:
            self._free_device_buffer(req, e)
            self._free_landing(req)
            self._unbind(e)
            del self._entries[req.rid]
        ids = [e.request_id for _, e in done if e.state != "lost"]  # a lost one's daemon side is gone
        for i in range(0, len(ids), 1024):  # hs_release_batch's most items
            self.session.release_batch(ids[i:i + 1024])

    def request_finished(self, req: Any) -> None:
        """Frees the request's host pages, row and physical slots. A request this coordinator never
        saw frees only landing slots it may hold (a PD transfer that failed)."""
        e = self._entries.get(req.rid)
        if e is None:
            self._free_landing(req)
            return
        if e.state == "staging":
            self._staging = [(r, ev) for r, ev in self._staging if r.rid != req.rid]
            req.hisparse_staging = False
        self._forget(req, e)

    def _forget(self, req: Any, e: _Entry) -> None:
        self._quiesce()
        self._append_count.zero_()  # after the queued forward has appended its step
        self._free_device_buffer(req, e)
        self._free_landing(req)
        self._unbind(e)
        del self._entries[req.rid]
        if e.state != "lost":  # a lost request's daemon side is gone already
            self.session.release(e.request_id)

    # ---- riding through a restart of hisparsed ----

    def ride_through(self) -> List[Any]:
        """Once per scheduler iteration, before the decode batch is prepared (the plugin's hook):
        when hisparsed went away (restarted, upgraded, crashed) the session has ended; this waits
        for the forwards that read it, recovers it (Session.recover) and returns the rids whose KV
        was lost, for the scheduler to retract (retract_req frees what SGLang holds for them; their
        rows stay -1 meanwhile, so RESOLVE refuses them, never reading old memory). A request the
        daemon kept (admitted with lease_seconds) continues in its new row with the same host pages
        and the arena at its address (captured graphs replay as they are). [] while the session is
        live: one atomic load. With TP > 1 the ranks agree first (a MAX all-reduce over tp_group every
        iteration): one rank's session may end a moment before another's sees it, and every rank
        must retract the same requests in the same step."""
        ended = not self.session.alive
        if self.tp_world_size > 1:
            flag = torch.tensor([1 if ended else 0], dtype=torch.int64)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.tp_group)
            ended = bool(flag.item())
        if not ended:
            return []
        deadline = time.monotonic() + 30
        while self.session.alive:  # another rank saw the daemon go first: this one's stream ends too
            if time.monotonic() > deadline:
                raise FailedPrecondition("another TP rank's hisparse session ended, this one's did not within 30 s")
            time.sleep(0.005)
        self._quiesce()
        rec = self.session.recover()
        if rec.arena_moved:
            raise FailedPrecondition("hisparsed came back with another slot arena (kind or page geometry): the "
                                     "captured decode cannot follow it; restart the engine")
        self._append_count.zero_()
        lost = []
        for rid, e in self._entries.items():
            row = rec.kept.get(e.request_id)  # None: lost, or kept parked (no row)
            if row is None:  # not durable, or a lease that ran out: its KV is gone
                if e.request_id in rec.kept:
                    self.session.release(e.request_id)  # kept parked without a row: of no use here
                self._unbind_row(e)
                e.was_staging = e.state == "staging"
                e.state = "lost"
                lost.append(rid)
            elif e.pool_idx >= 0:
                self.row_of_pool_idx[e.pool_idx] = row  # its slots are EMPTY: the next RESOLVE fetches
        # A lost staging request is never handed out as ready: the scheduler retracts it (retract_req).
        self.lost_staging = [r for r, _ in self._staging if self._entries[r.rid].state == "lost"]
        self._staging = [(r, ev) for r, ev in self._staging if self._entries[r.rid].state != "lost"]
        if self.tp_world_size > 1:  # the same requests on every rank (they admit alike), or stop here
            ids = [self._entries[rid].request_id for rid in lost]
            got = torch.tensor([len(ids), sum(ids), -len(ids), -sum(ids)], dtype=torch.int64)
            torch.distributed.all_reduce(got, op=torch.distributed.ReduceOp.MAX, group=self.tp_group)
            if int(got[0]) != -int(got[2]) or int(got[1]) != -int(got[3]):
                raise FailedPrecondition("the TP ranks lost different requests in a restart of hisparsed")
        return lost

    def _unbind_row(self, e: _Entry) -> None:
        """The request keeps its req_pool_idx (SGLang's until it retracts it) but no row."""
        if e.pool_idx >= 0:
            self.row_of_pool_idx[e.pool_idx] = -1

    # ---- decode data path (graph-safe: fixed shapes, static buffers, no host sync on CUDA) ----

    def map_last_loc_to_buffer(self, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                               req_pool_indices: torch.Tensor, seq_lens_cpu: Any = None,
                               req_pool_indices_cpu: Any = None) -> None:
        """ScheduleBatch.prepare_for_decode, after seq_lens += 1, outside any captured graph: points
        each decode token's logical location (out_cache_loc) at its request's reserved physical
        slot, where the forward's set_mla_kv_buffer then writes it, and fills the step buffers
        every swap_in_selected_pages of the step appends from. Waits first for the producer
        stream, whose queued forward still reads the previous step's buffers. The CPU arguments are
        accepted for upstream's signature and not needed."""
        n = int(req_pool_indices.shape[0])
        if n > self.num_reqs or out_cache_loc.shape[0] != n or seq_lens.shape[0] != n:
            raise InvalidArgument(f"map_last_loc_to_buffer: {n} requests, {out_cache_loc.shape[0]} locations and "
                                  f"{seq_lens.shape[0]} lengths; the request pool has {self.num_reqs} slots")
        self._wait_for_producer()
        mapping = self._mapping
        reserved = self._reserved[req_pool_indices.to(mapping.device, torch.int64)]
        if mapping.device.type == "cpu" and bool((reserved <= 0).any()):
            bad = int(torch.nonzero(reserved <= 0)[0, 0])
            raise FailedPrecondition(f"batch entry {bad}: its req_pool_idx holds no ready request")
        mapping[out_cache_loc.to(mapping.device, torch.int64)] = reserved
        rows = self._step_rows[:n]
        torch.index_select(self.row_of_pool_idx, 0, req_pool_indices.to(self._data_dev, torch.int64), out=rows)
        self._check_rows(rows, n)
        self._step_seqs[:n].copy_(seq_lens)
        self._step_locs[:n].copy_(reserved)
        self._append_count.fill_(n)

    def _check_rows(self, rows: torch.Tensor, real: int) -> None:
        """Host backend: a real entry whose req_pool_idx holds no request is refused at once. On
        CUDA it is not checked here (that would sync): RESOLVE and append flag its row -1 as a bad
        row (check_errors()), write -1 for it, and touch no other row."""
        if rows.device.type == "cpu" and bool((rows[:real] < 0).any()):
            bad = int(torch.nonzero(rows[:real] < 0)[0, 0])
            raise FailedPrecondition(f"batch entry {bad}: its req_pool_idx holds no admitted request")

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


class _LandingPool:
    """What SGLang's PD decode writes a request's KV into (the role of upstream's
    MLATokenToKVPoolHost there): kv_buffer, one host [tokens, record] uint8 tensor a layer
    (pinned when the session is on CUDA); get_contiguous_buf_infos for the transfer engine's
    registration; alloc_paged_token_slots / free over token slots (0.. tokens - 1)."""

    def __init__(self, layer_num: int, record_bytes: int, tokens: int, pin: bool) -> None:
        self.layer_num = layer_num
        self.item_size = record_bytes
        self.size = tokens
        self.kv_buffer = [torch.zeros(tokens, record_bytes, dtype=torch.uint8, pin_memory=pin)
                          for _ in range(layer_num)]
        self._free = torch.arange(tokens, dtype=torch.int64)
        self._free_count = tokens

    def get_contiguous_buf_infos(self) -> Tuple[List[int], List[int], List[int]]:
        ptrs = [b.data_ptr() for b in self.kv_buffer]
        lens = [b.numel() for b in self.kv_buffer]
        return ptrs, lens, [self.item_size] * self.layer_num

    def available_size(self) -> int:
        return self._free_count

    def alloc_paged_token_slots(self, req_to_host_pool: torch.Tensor, allocated_len: torch.Tensor, req_idx: int,
                                start: int, count: int) -> torch.Tensor:
        """Slots for positions [start, start + count) of req_idx, written into req_to_host_pool."""
        if count > self._free_count:
            raise FailedPrecondition(f"the PD landing pool has {self._free_count} free slots; {count} asked")
        out = self._free[self._free_count - count:self._free_count].clone()
        self._free_count -= count
        req_to_host_pool[req_idx, start:start + count] = out
        allocated_len[req_idx] = max(int(allocated_len[req_idx]), start + count)
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = int(slots.numel())
        self._free[self._free_count:self._free_count + n] = slots.to(torch.int64)
        self._free_count += n

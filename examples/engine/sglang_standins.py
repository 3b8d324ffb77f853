"""SGLang's HiSparse mechanisms, reproduced for driving hisparse's SGLang adapter without SGLang.

Each class below reproduces the side effects of the upstream code it names (read at
sgl-project/sglang commit UPSTREAM, 009e640a75037e6d603ceb9eb1a4a41d64d049f6, unless a docstring
names another source); none is a copy. What they keep, because that is where an adapter breaks:

- two index spaces (HiSparseAllocator): logical KV locations (req_to_token holds them, the
  indexer's keys are indexed by them) and physical slots of the device pool; a prefill allocates
  both and writes full_to_hisparse_device_index_mapping[logical] = physical, a decode token gets
  a logical location only, and every KV write translates through the mapping
  (HiSparseDSAPool.set_mla_kv_buffer): a decode token whose mapping nobody wrote lands in slot 0;
- alloc_device_buffer, which gives a prompt's physical slots back (the capacity hisparse is for);
- a producer stream whose work runs later than the scheduler's (DeferredStream): the overlap
  scheduler prepares batch N+1 while batch N's forward is still queued;
- the model runner's forwards (Engine.extend, Engine.decode) through the DSA backend's readers of
  the device pool (DSABackend): a decode forward (wait_for_pending_backup first) reads
  get_key_buffer at the swap-in's indices; an extend forward (prefill, chunked prefill) reads
  get_key_buffer at physical slots through the mapping; get_mla_kv_buffer translates too; the
  indexer reads its own key cache by logical location in both;
- PD decode's pre-allocation and transfer (PDDecode): _init_kv_manager reads
  coordinator.mem_pool_host.get_contiguous_buf_infos(), _pre_alloc allocates logical locations
  only plus host slots through mem_pool_host.alloc_paged_token_slots, the transfer writes records
  at those host slots, and the transfer queue calls admit_request_direct.

The KV of (request seed, layer, position) is a fixed byte pattern (kv_record), so the full-HBM
answer of every attention read is known without a second engine.

Thread-safety: none (SGLang's scheduler is one thread per rank).
"""

from __future__ import annotations

import ctypes
from typing import Callable, List, Optional

import torch

UPSTREAM = "009e640a75037e6d603ceb9eb1a4a41d64d049f6"
# hisparse_coordinator.py with HiSparseMTPCoordinator (assign_spec_ring_slots_batch): a later copy
# of the same file in the search index; its commit id was not shown there.
UPSTREAM_MTP = "later main-line hisparse_coordinator.py (HiSparseMTPCoordinator)"


def kv_record(seed: int, layer: int, position: int, nbytes: int) -> torch.Tensor:
    """The record a model would write for (request seed, layer, position): uint8 [nbytes]."""
    return ((seed * 5 + layer * 11 + position * 31 + torch.arange(nbytes)) % 251).to(torch.uint8)


class FreeList:
    """sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator at page_size 1: locations
    1..size (0 is the padding location, never handed out). A double free raises (upstream's would
    corrupt its free list silently)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = list(range(1, size + 1))
        self._is_free = [False] + [True] * size

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        if n > len(self._free):
            return None
        out, self._free = self._free[:n], self._free[n:]
        for i in out:
            self._is_free[i] = False
        return torch.tensor(out, dtype=torch.int64)

    def free(self, idx: torch.Tensor) -> None:
        for i in idx.reshape(-1).tolist():
            if self._is_free[i]:
                raise AssertionError(f"location {i} freed twice")
            self._is_free[i] = True
            self._free.append(i)


class HiSparseDSAPool:
    """mem_cache/hisparse_memory_pool.py HiSparseDSATokenToKVPool (read at 08a72bac, the newest
    stored copy): layer_num, page_size, kv_buffer (one [physical slots + 1, 1, record] tensor a
    layer), register_mapping; the writes and reads that translate logical locations to physical
    slots through the mapping (set_mla_kv_buffer, get_mla_kv_buffer, which reads through
    get_key_buffer as memory_pool.py MLATokenToKVPool.get_mla_kv_buffer does;
    translate_loc_to_hisparse_device); the DSA backend's read (get_key_buffer); and the indexer's
    key cache, which is NOT mapped: DSATokenToKVPool's index_k buffer of index_buf_size = size *
    host_to_device_ratio rows, indexed by logical location (set_index_k_buffer,
    get_index_k_with_scale_buffer)."""

    def __init__(self, layer_num: int, physical: int, record_bytes: int, device="cpu", dtype=torch.uint8,
                 host_to_device_ratio: int = 4, index_bytes: int = 8) -> None:
        self.layer_num = layer_num
        self.page_size = 1
        self.record_bytes = record_bytes
        self.index_bytes = index_bytes
        width = record_bytes // torch.empty(0, dtype=dtype).element_size()
        self.kv_buffer = [torch.zeros(physical + 1, 1, width, dtype=dtype, device=device) for _ in range(layer_num)]
        self.index_k_buffer = [torch.zeros(physical * host_to_device_ratio + 3, index_bytes, dtype=torch.uint8,
                                           device=device) for _ in range(layer_num)]
        self.full_to_hisparse_device_index_mapping = None

    def register_mapping(self, mapping: torch.Tensor) -> None:
        self.full_to_hisparse_device_index_mapping = mapping

    def translate_loc_to_hisparse_device(self, logical: torch.Tensor) -> torch.Tensor:
        """Same shape, -1 padding kept -1 (the mapping's last entry is -1)."""
        return self.full_to_hisparse_device_index_mapping[logical.to(torch.int64)]

    def translate_loc_from_full_to_hisparse_device(self, logical: torch.Tensor) -> torch.Tensor:
        return self.full_to_hisparse_device_index_mapping[logical]

    def records(self, layer: int) -> torch.Tensor:
        return self.kv_buffer[layer].view(self.kv_buffer[layer].shape[0], -1).view(torch.uint8)

    def set_mla_kv_buffer(self, layer: int, loc: torch.Tensor, records: torch.Tensor) -> None:
        """The forward's KV write: logical locations, translated to physical slots here."""
        phys = self.full_to_hisparse_device_index_mapping[loc.to(torch.int64)]
        self.records(layer)[phys] = records.to(self.kv_buffer[layer].device)

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self.kv_buffer[layer]

    def get_mla_kv_buffer(self, layer: int, loc: torch.Tensor) -> torch.Tensor:
        """The records at logical locations loc: translated, then gathered from get_key_buffer
        (looked up on the instance, as upstream's self.get_key_buffer is)."""
        return records_of(self.get_key_buffer(layer))[self.translate_loc_to_hisparse_device(loc)]

    def set_index_k_buffer(self, layer: int, loc: torch.Tensor, keys: torch.Tensor) -> None:
        self.index_k_buffer[layer][loc.to(torch.int64)] = keys.to(self.index_k_buffer[layer].device)

    def get_index_k_with_scale_buffer(self, layer: int) -> torch.Tensor:
        return self.index_k_buffer[layer]


def records_of(kv: torch.Tensor) -> torch.Tensor:
    """A key buffer (the pool's [slots, 1, width] or the arena's [records, 1, stride]) as uint8
    [rows, bytes]."""
    flat = kv.reshape(kv.shape[0], -1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def index_key(seed: int, layer: int, position: int, nbytes: int) -> torch.Tensor:
    """The indexer's key of (request seed, layer, position): a pattern unlike kv_record's."""
    return kv_record(seed + 100003, layer, position, nbytes)


class ForwardMode:
    """model_executor/forward_batch_info.py ForwardMode: the three modes the readers differ in."""
    EXTEND, DECODE, TARGET_VERIFY = "extend", "decode", "target_verify"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def is_decode(self) -> bool:
        return self.mode == self.DECODE

    def is_target_verify(self) -> bool:
        return self.mode == self.TARGET_VERIFY


class ForwardBatch:
    """model_executor/forward_batch_info.py ForwardBatch: what the DSA backend reads."""

    def __init__(self, mode: str, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 out_cache_loc: torch.Tensor) -> None:
        self.forward_mode = ForwardMode(mode)
        self.req_pool_indices = req_pool_indices
        self.seq_lens = seq_lens
        self.out_cache_loc = out_cache_loc


class DSABackend:
    """layers/attention/dsa_backend.py DeepseekSparseAttnBackend (nsa_backend.py before the rename;
    read at 614c1581, the newest stored copy) with HiSparse, its readers of the device pool in the
    order upstream makes them:

    - forward (AttentionBackend.forward): forward_decode when forward_batch.forward_mode.is_decode(),
      else forward_extend;
    - forward_decode: set_mla_kv_buffer(out_cache_loc), kv_cache = get_key_buffer(layer), then
      page_table_1 = hisparse_coordinator.swap_in_selected_pages(...): attention reads kv_cache at
      the swap-in's indices;
    - forward_extend (prefill, chunked prefill's later chunks, draft extend, target verify):
      set_mla_kv_buffer, kv_cache = get_key_buffer(layer), the top-k's logical locations from
      req_to_token (transform_index_page_table_prefill), then
      token_to_kv_pool.translate_loc_to_hisparse_device(page_table_1): attention reads kv_cache
      at PHYSICAL slots of the pool. With an MTP coordinator (swap_in_verify_pages) target verify
      reads kv_cache at that swap-in's indices instead: that call site is assumed from the
      coordinator's API (sgl-project/sglang PR #37771), not read;
    - the indexer (layers/attention/dsa/dsa_indexer.py): get_index_k_with_scale_buffer(layer)
      at logical locations (real_page_table from req_to_token), both modes.

    Each forward returns the records attention read, uint8 [rows, top_k, record_bytes] (zeros for
    -1), and the indexer keys it read, uint8 [rows, seq_len max, index_bytes]."""

    def __init__(self, coord, pool: HiSparseDSAPool, req_to_token_pool: "ReqToTokenPool") -> None:
        self.hisparse_coordinator = coord
        self.token_to_kv_pool = pool
        self.req_to_token = req_to_token_pool.req_to_token

    def forward(self, layer: int, forward_batch: ForwardBatch, k: torch.Tensor, topk: torch.Tensor, **kw):
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(layer, forward_batch, k, topk)
        return self.forward_extend(layer, forward_batch, k, topk, **kw)

    def indexer_keys(self, layer: int, forward_batch: ForwardBatch) -> torch.Tensor:
        """The indexer's read: every key of each request's seq_len positions, by logical location."""
        index_k = self.token_to_kv_pool.get_index_k_with_scale_buffer(layer)
        n = int(forward_batch.seq_lens.max())
        locs = self.req_to_token[forward_batch.req_pool_indices.to(torch.int64), :n].to(torch.int64)
        return index_k[locs.to(index_k.device)].cpu()

    @staticmethod
    def _read(kv_cache: torch.Tensor, page_table_1: torch.Tensor, record_bytes: int) -> torch.Tensor:
        table = page_table_1.to(torch.int64).cpu()
        records = records_of(kv_cache)
        got = records[table.clamp(min=0).to(records.device)].cpu()[..., :record_bytes].clone()
        got[table < 0] = 0
        return got

    def forward_decode(self, layer: int, forward_batch: ForwardBatch, k: torch.Tensor, topk: torch.Tensor):
        pool = self.token_to_kv_pool
        pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k)
        kv_cache = pool.get_key_buffer(layer)
        page_table_1 = self.hisparse_coordinator.swap_in_selected_pages(
            forward_batch.req_pool_indices, forward_batch.seq_lens.to(torch.int32), topk, layer)
        return self._read(kv_cache, page_table_1, pool.record_bytes), page_table_1

    def forward_extend(self, layer: int, forward_batch: ForwardBatch, k: torch.Tensor, topk: torch.Tensor,
                       num_positions: int = 1):
        """topk: request positions [rows, <= top_k] (-1 padding), rows = requests x num_positions;
        in target verify, the logical KV ids instead (the MTP swap-in's input)."""
        pool = self.token_to_kv_pool
        pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k)
        kv_cache = pool.get_key_buffer(layer)
        coord = self.hisparse_coordinator
        if forward_batch.forward_mode.is_target_verify() and hasattr(coord, "swap_in_verify_pages"):
            page_table_1 = coord.swap_in_verify_pages(forward_batch.req_pool_indices,
                                                      forward_batch.seq_lens.to(torch.int32), topk, layer,
                                                      num_positions)
            return self._read(kv_cache, page_table_1, pool.record_bytes), page_table_1
        rpi = forward_batch.req_pool_indices.to(torch.int64).repeat_interleave(num_positions)
        pos = topk.to(torch.int64)
        logical = self.req_to_token[rpi.unsqueeze(1).to(self.req_to_token.device),
                                    pos.clamp(min=0).to(self.req_to_token.device)].to(torch.int64)
        logical[pos.to(logical.device) < 0] = -1
        page_table_1 = pool.translate_loc_to_hisparse_device(logical)
        return self._read(kv_cache, page_table_1, pool.record_bytes), page_table_1


class HiSparseAllocator:
    """mem_cache/allocator/hisparse.py HiSparseTokenToKVPoolAllocator: a logical allocator of
    size * host_to_device_ratio locations and a physical one (hisparse_attn_allocator) of size
    slots; the mapping (size_full + 1 zeros, then -1) registered with the pool."""

    def __init__(self, pool: HiSparseDSAPool, size: int, host_to_device_ratio: int = 4) -> None:
        self._kvcache = pool
        self.page_size = 1
        self.compress_ratio = 1
        self.device = pool.kv_buffer[0].device
        self.size_full = size * host_to_device_ratio
        self.logical_attn_allocator = FreeList(self.size_full)
        self.hisparse_attn_allocator = FreeList(size)
        self.full_to_hisparse_device_index_mapping = torch.cat(
            [torch.zeros(self.size_full + 2, dtype=torch.int64), torch.tensor([-1])]).to(self.device)
        pool.register_mapping(self.full_to_hisparse_device_index_mapping)

    def get_kvcache(self) -> HiSparseDSAPool:
        return self._kvcache

    def available_size(self) -> int:
        return min(self.logical_attn_allocator.available_size(), self.hisparse_attn_allocator.available_size())

    def alloc_extend(self, n: int) -> Optional[torch.Tensor]:
        """A prefill's n tokens: both spaces, the mapping written."""
        if n > self.available_size():
            return None
        logical = self.logical_attn_allocator.alloc(n)
        self.full_to_hisparse_device_index_mapping[logical] = self.hisparse_attn_allocator.alloc(n).to(self.device)
        return logical

    def alloc_logical_only(self, n: int) -> Optional[torch.Tensor]:
        return self.logical_attn_allocator.alloc(n)

    def alloc_decode(self, n: int) -> Optional[torch.Tensor]:
        """A decode step's tokens: logical locations only (upstream's alloc_decode)."""
        return self.logical_attn_allocator.alloc(n)

    def alloc_device_buffer(self, allocated: torch.Tensor, need_size: int) -> torch.Tensor:
        """Unmaps `allocated`, keeps need_size of their physical slots (allocating more if they had
        fewer) and frees the rest."""
        phys = self.full_to_hisparse_device_index_mapping[allocated]
        self.full_to_hisparse_device_index_mapping[allocated] = 0
        phys = phys[phys > 0].cpu()
        if len(phys) >= need_size:
            self.free_hisparse_indices(phys[need_size:])
            return phys[:need_size].to(self.device)
        extra = self.hisparse_attn_allocator.alloc(need_size - len(phys))
        assert extra is not None, "alloc_device_buffer: the physical pool is full"
        return torch.cat([phys, extra]).to(self.device)

    def free_hisparse_indices(self, phys: torch.Tensor) -> None:
        phys = phys.cpu()
        self.hisparse_attn_allocator.free(phys[phys > 0])

    def free_hisparse(self, logical: torch.Tensor) -> None:
        self.free_hisparse_indices(self.full_to_hisparse_device_index_mapping[logical])
        self.full_to_hisparse_device_index_mapping[logical] = 0

    def free(self, logical: torch.Tensor) -> None:
        if logical.numel() == 0:
            return
        self.logical_attn_allocator.free(logical.cpu())
        self.free_hisparse(logical.to(self.device))


class ReqToTokenPool:
    """mem_cache/memory_pool.py ReqToTokenPool: req_to_token int32 [size + 1, max_context_len] on the
    device (the KV location of each request slot and position; 0 where none) and a free list of
    slots 1 .. size. Row 0 is the pad row: a CUDA-graph batch padded past its real requests carries
    req_pool_idx 0 in those entries, so their reads and writes land there, never on a request's
    row, and admission never hands it out (ReqToTokenPool.__init__'s "+1 padding row at index 0",
    sgl-project/sglang 4a55fdba, the newest copy read on 2026-12-05; the example engine pads its
    batches with req_pool_idx 0 the same way). alloc and free take one slot, as at 009e640a. The
    example engine's SGLang mode (sglang_mode.py) uses it too."""

    def __init__(self, size: int, max_context_len: int, device="cpu") -> None:
        self.size = size
        self.req_to_token = torch.zeros(size + 1, max_context_len, dtype=torch.int32, device=device)
        self.max_context_len = max_context_len
        self.free_slots = list(range(1, size + 1))

    def alloc(self) -> int:
        return self.free_slots.pop(0)

    def free(self, idx: int) -> None:
        self.req_to_token[idx].zero_()
        self.free_slots.append(idx)


class Req:
    """managers/schedule_batch.py Req: what the coordinator reads (rid, origin_input_ids,
    output_ids, req_pool_idx, sampling_params.max_new_tokens, kv.kv_allocated_len,
    kv_committed_len, finished()) and the flag it sets (hisparse_staging). seed names its KV
    (kv_record)."""

    class SamplingParams:
        def __init__(self, max_new_tokens: int) -> None:
            self.max_new_tokens = max_new_tokens

    class KvInfo:
        def __init__(self, kv_allocated_len: int) -> None:
            self.kv_allocated_len = kv_allocated_len

    def __init__(self, rid: str, seed: int, prompt_len: int, max_new_tokens: int = 64) -> None:
        self.rid, self.seed = rid, seed
        self.origin_input_ids = list(range(prompt_len))
        self.output_ids = [0]  # the prefill's token
        self.req_pool_idx: Optional[int] = None
        self.sampling_params = Req.SamplingParams(max_new_tokens)
        self.hisparse_staging = False
        self.kv: Optional[Req.KvInfo] = None
        self.kv_committed_len = 0

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        """Req.finished(): a finish reason is set. These requests finish only through finish()."""
        return False


class DeferredStream:
    """The overlap scheduler's forward stream, on a CPU: work submitted runs only when the stream
    is synchronized (or waited on), so the scheduler's own code runs ahead of it, as it does
    ahead of a CUDA stream. set_decode_producer_stream receives it."""

    def __init__(self) -> None:
        self._queue: List[Callable[[], None]] = []

    def submit(self, fn: Callable[[], None]) -> None:
        self._queue.append(fn)

    def synchronize(self) -> None:
        while self._queue:
            self._queue.pop(0)()

    def run_next(self) -> None:
        """Runs the oldest queued work only (an event recorded after it, waited on)."""
        self._queue.pop(0)()

    def query(self) -> bool:
        return not self._queue


class Engine:
    """The scheduler, ScheduleBatch, model runner and DSA backend (DSABackend) around a
    coordinator, with the KV of kv_record and the indexer keys of index_key. Every attention read
    and every indexer read is checked against the full-HBM answer and counted in self.checked; a
    wrong byte raises AssertionError.

    select(req, seq_len, layer) -> the positions the indexer picks (list, <= top_k)."""

    def __init__(self, coord, allocator: HiSparseAllocator, req_to_token_pool: ReqToTokenPool, top_k: int,
                 select: Callable, producer: Optional[DeferredStream] = None) -> None:
        self.coord, self.alloc, self.r2t = coord, allocator, req_to_token_pool
        self.pool = allocator.get_kvcache()
        self.backend = DSABackend(coord, self.pool, req_to_token_pool)
        self.top_k, self.select, self.producer = top_k, select, producer
        self.checked = 0
        if producer is not None:
            coord.set_decode_producer_stream(producer)

    # ---- prefill and lifecycle (scheduler, batch-result processor) ----

    def prefill(self, req: Req, chunk: int = 0) -> None:
        """Every position before the last output token, both spaces, then staging. chunk > 0:
        chunked prefill, each chunk an EXTEND forward whose attention reads the request's earlier
        positions (the prefix) through forward_extend, checked."""
        req.req_pool_idx = self.r2t.alloc()
        n = req.seqlen - 1
        step = chunk or n
        for start in range(0, n, step):
            self.extend(req, start, min(n, start + step))
        req.kv = Req.KvInfo(n)
        req.kv_committed_len = n
        self.coord.admit_request_into_staging(req)

    def extend(self, req: Req, start: int, end: int) -> None:
        """One EXTEND forward over positions [start, end) of req: the KV and indexer writes at
        fresh locations of both spaces, then per layer the indexer's read and attention's read of
        the chunk's last token (select over positions < end), both checked."""
        logical = self.alloc.alloc_extend(end - start)
        assert logical is not None, "prefill: the pool is full"
        dev = self.r2t.req_to_token.device
        self.r2t.req_to_token[req.req_pool_idx, start:end] = logical.to(dev, torch.int32)
        rpi = torch.tensor([req.req_pool_idx], dtype=torch.int64)
        fb = ForwardBatch(ForwardMode.EXTEND, rpi.to(dev), torch.tensor([end], device=dev), logical.to(dev))
        for layer in range(self.pool.layer_num):
            keys = torch.stack([index_key(req.seed, layer, p, self.pool.index_bytes) for p in range(start, end)])
            self.pool.set_index_k_buffer(layer, logical, keys)
            self._check_keys(layer, fb, [req.seed], [end])
            recs = torch.stack([kv_record(req.seed, layer, p, self.pool.record_bytes) for p in range(start, end)])
            sel = self.select(req, end, layer)
            top = torch.full((1, self.top_k), -1, dtype=torch.int32)
            top[0, :len(sel)] = torch.tensor(sel, dtype=torch.int32)
            got, _ = self.backend.forward(layer, fb, recs, top)
            self._check(layer, got, [req.seed], [sel])

    def collect(self) -> List[Req]:
        return self.coord.collect_ready_reqs()

    def release_kv_cache(self, req: Req) -> None:
        n = req.kv.kv_allocated_len
        self.alloc.free(self.r2t.req_to_token[req.req_pool_idx, :n].to(torch.int64))
        self.r2t.free(req.req_pool_idx)
        req.req_pool_idx = None

    def finish(self, req: Req) -> None:
        self.coord.request_finished(req)
        self.release_kv_cache(req)

    def retract(self, req: Req) -> None:
        """ScheduleBatch.retract_decode -> release_req: the coordinator's retract_req, then the KV
        freed; the request goes back to the waiting queue (it is prefilled again if it returns)."""
        self.coord.retract_req(req)
        self.release_kv_cache(req)
        req.output_ids = req.output_ids[:1]

    # ---- one decode step ----

    def decode(self, batch: List[Req], selections: Optional[List[list]] = None) -> List[torch.Tensor]:
        """prepare_for_decode (logical locations, map_last_loc_to_buffer) on the scheduler, then
        the forward: on the producer stream when there is one (it runs later), else at once.
        selections: per request, per layer, the positions the indexer picks (default: select).
        Returns the per-layer page tables the swap-ins returned (filled once the forward ran)."""
        n = len(batch)
        seq = torch.tensor([r.seqlen for r in batch], dtype=torch.int64)
        rpi = torch.tensor([r.req_pool_idx for r in batch], dtype=torch.int64)
        locs = self.alloc.alloc_decode(n)
        dev = self.r2t.req_to_token.device
        self.r2t.req_to_token[rpi.to(dev), (seq - 1).to(dev)] = locs.to(dev, torch.int32)
        for r in batch:
            r.kv.kv_allocated_len = r.seqlen
        self.coord.map_last_loc_to_buffer(seq.to(dev), locs.to(dev), rpi.to(dev), seq, rpi)
        seeds = [r.seed for r in batch]
        if selections is None:
            selections = [[self.select(r, int(s), layer) for layer in range(self.pool.layer_num)]
                          for r, s in zip(batch, seq.tolist())]
        fb = ForwardBatch(ForwardMode.DECODE, rpi.to(dev), seq.to(dev), locs.to(dev))
        tables: List[torch.Tensor] = []

        def forward() -> None:  # ModelRunner.forward with forward_mode DECODE
            self.coord.wait_for_pending_backup()
            self.coord.num_real_reqs.fill_(n)
            for layer in range(self.pool.layer_num):
                keys = torch.stack([index_key(sd, layer, int(s) - 1, self.pool.index_bytes)
                                    for sd, s in zip(seeds, seq.tolist())])
                self.pool.set_index_k_buffer(layer, locs.to(dev), keys)
                self._check_keys(layer, fb, seeds, seq.tolist())
                newest = torch.stack([kv_record(sd, layer, int(s) - 1, self.pool.record_bytes)
                                      for sd, s in zip(seeds, seq.tolist())])
                top = torch.full((n, self.top_k), -1, dtype=torch.int32)
                for i, sel in enumerate(selections):
                    top[i, :len(sel[layer])] = torch.tensor(sel[layer], dtype=torch.int32)
                got, table = self.backend.forward(layer, fb, newest, top.to(dev))
                tables.append(table.clone())
                self._check(layer, got, seeds, [sel[layer] for sel in selections])

        if self.producer is not None:
            self.producer.submit(forward)
        else:
            forward()
        for r in batch:
            r.output_ids.append(len(r.output_ids))
        return tables

    def expected(self, seed: int, layer: int, position: int) -> torch.Tensor:
        """The full-HBM answer for (request seed, layer, position): kv_record, unless a test
        knows other bytes (a daemon import's pattern)."""
        return kv_record(seed, layer, position, self.pool.record_bytes)

    def _check(self, layer: int, got: torch.Tensor, seeds: List[int], selections: List[list]) -> None:
        """Attention's read (what the backend gathered from get_key_buffer at the page table's
        indices) must be each selected position's record: the full-HBM answer."""
        for i, (seed, sel) in enumerate(zip(seeds, selections)):
            for j, pos in enumerate(sel):
                want = self.expected(seed, layer, pos)
                assert torch.equal(got[i, j], want), f"seed {seed} layer {layer} position {pos}: attention read wrong KV"
                self.checked += 1

    def _check_keys(self, layer: int, fb: ForwardBatch, seeds: List[int], seq_lens: List[int]) -> None:
        """The indexer's read of every position's key, by logical location."""
        got = self.backend.indexer_keys(layer, fb)
        for i, (seed, n) in enumerate(zip(seeds, seq_lens)):
            for p in range(int(n)):
                assert torch.equal(got[i, p], index_key(seed, layer, p, self.pool.index_bytes)), \
                    f"seed {seed} layer {layer} position {p}: the indexer read a wrong key"


class PDDecode:
    """disaggregation/decode.py on the decode node, with HiSparse on: DecodePreallocQueue
    (_init_kv_manager's transfer buffers from coordinator.mem_pool_host, _pre_alloc's logical-only
    allocation and host slots) and DecodeTransferQueue (the transfer, then admit_request_direct).
    The prefill node's transfer is modelled as writes of each record at ptrs[layer] +
    host_index * item_len, which is what the RDMA write does to DRAM."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        coord = engine.coord
        self.ptrs, self.lens, self.item_lens = coord.mem_pool_host.get_contiguous_buf_infos()  # _init_kv_manager
        self.queue: List[tuple] = []

    def pre_alloc(self, req: Req) -> torch.Tensor:
        e, coord = self.engine, self.engine.coord
        req.req_pool_idx = e.r2t.alloc()
        fill = req.seqlen - 1
        req.kv = Req.KvInfo(fill)
        req.kv_committed_len = fill
        logical = e.alloc.alloc_logical_only(fill)
        e.r2t.req_to_token[req.req_pool_idx, :fill] = logical.to(e.r2t.req_to_token.device, torch.int32)
        host = coord.mem_pool_host.alloc_paged_token_slots(coord.req_to_host_pool, coord.req_to_host_pool_allocated_len,
                                                           req.req_pool_idx, 0, coord.host_token_len(fill))
        self.queue.append((req, host))
        return host

    def transfer_and_admit(self) -> List[Req]:
        """The prefill node's transfer lands; the transfer queue admits each request directly."""
        out = []
        for req, host in self.queue:
            for layer, (ptr, item) in enumerate(zip(self.ptrs, self.item_lens)):
                for pos, idx in enumerate(host.tolist()):
                    rec = bytes(kv_record(req.seed, layer, pos, self.engine.pool.record_bytes).tolist())
                    ctypes.memmove(ptr + idx * item, rec, len(rec))
                # The indexer's keys travel too, into the device pool at the logical locations.
                logical = self.engine.r2t.req_to_token[req.req_pool_idx, :len(host)].to(torch.int64)
                keys = torch.stack([index_key(req.seed, layer, p, self.engine.pool.index_bytes)
                                    for p in range(len(host))])
                self.engine.pool.set_index_k_buffer(layer, logical, keys)
            self.engine.coord.admit_request_direct(req)
            out.append(req)
        self.queue.clear()
        return out

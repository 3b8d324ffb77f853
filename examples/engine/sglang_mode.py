"""The example engine served the way SGLang serves it: run_engine.py --adapter sglang.

A small continuous-batching scheduler and model runner that drive
hisparse.integrations.sglang.HisparsedCoordinator through SGLang's own HiSparse mechanisms
(sgl-project/sglang 009e640a; examples/engine/sglang_standins.py reproduces them): two index
spaces (req_to_token and the DSA indexer's keys hold logical locations, the KV pool physical
slots, full_to_hisparse_device_index_mapping between them, every KV write through it); a prefill
allocates both, a decode token a logical location only, which map_last_loc_to_buffer points at
the request's reserved slot; collect_ready_reqs' alloc_device_buffer gives the prompt's slots
back; the model runner calls wait_for_pending_backup before each forward, which runs on a second
(producer) stream on a GPU, and the DSA backend's page table indexes get_key_buffer(layer), the
daemon's arena; release_req's retract_req releases, and a retracted request is prefilled again
when it returns (one is aborted while retracted, never to return); some requests arrive as PD
decode imports (logical locations only, host slots from mem_pool_host, the transfer's writes
there, admit_request_direct). The baseline is the same scheduler on SGLang's plain pool (one
index space, the full KV in HBM), with the same schedule.

The workload mixes long prompts (the context of --configs) and short ones (half of B, so their
every position stays resident), staggers arrivals, finishes requests at different steps and
retracts a third of them for two steps in the middle of the run. Both modes run the same
schedule with the same padded batch shapes, so every real row's logits must be equal bit for bit
at every decode step (torch.equal), as must every generated token; every size (both index
spaces, request slots, the daemon session) must be restored at the end, and the smallest free
physical capacity seen is reported for both modes (hisparse's is larger by the prompts' slots).

On a GPU the decode forward is one CUDA graph per padded batch size (SGLang's CudaGraphRunner),
with the coordinator's swap-in inside it; --no-graph runs it eagerly, as on a CPU. With
--draft-tokens, sglang_mtp_mode.py replaces the decode step by an EAGLE/MTP verify round.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from engine import RecordFormat, SparseDecoder, _rms, _rope
from sglang_standins import DeferredStream, HiSparseAllocator, HiSparseDSAPool, ReqToTokenPool

LOGICAL_RATIO = 4  # HiSparseTokenToKVPoolAllocator's host_to_device_ratio: logical locations per slot


class Req:
    """sglang.srt.managers.schedule_batch.Req (@ 009e640a): rid, origin_input_ids, output_ids,
    req_pool_idx, sampling_params.max_new_tokens, kv.kv_allocated_len, kv_committed_len, the
    hisparse_staging flag the coordinator sets, seqlen."""

    class SamplingParams:
        def __init__(self, max_new_tokens: int) -> None:
            self.max_new_tokens = max_new_tokens

    class KvInfo:
        def __init__(self, kv_allocated_len: int) -> None:
            self.kv_allocated_len = kv_allocated_len

    def __init__(self, rid: str, prompt: List[int], first_token: int, max_new_tokens: int) -> None:
        self.rid = rid
        self.origin_input_ids = list(prompt)
        self.output_ids = [first_token]  # the prefill's token (engine.py draws it at random)
        self.req_pool_idx: Optional[int] = None
        self.sampling_params = Req.SamplingParams(max_new_tokens)
        self.hisparse_staging = False
        self.kv: Optional[Req.KvInfo] = None
        self.kv_committed_len = 0

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return len(self.output_ids) >= self.sampling_params.max_new_tokens


class TokenToKVPool:
    """SGLang's plain DSA pool and allocator in one (the baseline: the whole KV in HBM, one index
    space): layer_num, kv_buffer (one [size, 1, record] tensor a layer: bf16 [.., 576] for bf16
    records, uint8 [.., 656] for FlashMLA's fp8 layout), the DSA indexer's key buffer index_k
    (by location), alloc_extend / alloc_decode / free / available_size over locations (0 is the
    padding location, never handed out), write_kv (set_mla_kv_buffer) and get_key_buffer."""

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, size: int, device) -> None:
        cfg = model.cfg
        self.layer_num = cfg.n_layers
        self.record_bytes = fmt.record_bytes
        dtype = torch.bfloat16 if fmt.name == "bf16" else torch.uint8
        self.kv_buffer = [torch.zeros(size, 1, fmt.record_bytes // torch.empty(0, dtype=dtype).element_size(), dtype=dtype, device=device)
                          for _ in range(cfg.n_layers)]
        self.index_k = [torch.zeros(size, cfg.idx_dim, dtype=torch.bfloat16, device=device)
                        if cfg.anchor(l) == l else None for l in range(cfg.n_layers)]
        self.size = size
        self.device = device
        self.free_locs = list(range(1, size))

    def records(self, layer: int) -> torch.Tensor:
        """Layer `layer` as uint8 [size, record_bytes] (a view)."""
        return self.kv_buffer[layer].view(self.size, -1).view(torch.uint8)

    def alloc_extend(self, n: int) -> torch.Tensor:
        if n > len(self.free_locs):
            raise RuntimeError(f"KV pool out of memory: {n} tokens asked, {len(self.free_locs)} free")
        out, self.free_locs = self.free_locs[:n], self.free_locs[n:]
        return torch.tensor(out, dtype=torch.int64, device=self.device)

    alloc_decode = alloc_extend

    def free(self, locs: torch.Tensor) -> None:
        self.free_locs.extend(locs.tolist())

    def physical_free(self) -> int:
        return len(self.free_locs)

    def sizes(self) -> tuple:
        return (len(self.free_locs),)

    def write_kv(self, layer: int, locs: torch.Tensor, records: torch.Tensor) -> None:
        self.records(layer).index_copy_(0, locs, records)

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self.kv_buffer[layer]


class HiSparsePool:
    """SGLang's pool under --enable-hisparse: HiSparseDSATokenToKVPool (dsa: `size` physical
    slots) and HiSparseTokenToKVPoolAllocator (allocator: LOGICAL_RATIO x size logical locations,
    the mapping), from sglang_standins.py, and the indexer's keys by logical location. The
    coordinator is handed the allocator, as SGLang hands it."""

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, size: int, device) -> None:
        cfg = model.cfg
        self.layer_num = cfg.n_layers
        self.record_bytes = fmt.record_bytes
        dtype = torch.bfloat16 if fmt.name == "bf16" else torch.uint8
        self.dsa = HiSparseDSAPool(cfg.n_layers, size, fmt.record_bytes, device, dtype)
        self.allocator = HiSparseAllocator(self.dsa, size, LOGICAL_RATIO)
        logical = self.allocator.size_full + 2
        self.index_k = [torch.zeros(logical, cfg.idx_dim, dtype=torch.bfloat16, device=device)
                        if cfg.anchor(l) == l else None for l in range(cfg.n_layers)]
        self.device = device

    def _out(self, locs: Optional[torch.Tensor], n: int) -> torch.Tensor:
        if locs is None:
            raise RuntimeError(f"KV pool out of memory: {n} tokens asked")
        return locs.to(self.device)

    def alloc_extend(self, n: int) -> torch.Tensor:
        return self._out(self.allocator.alloc_extend(n), n)

    def alloc_decode(self, n: int) -> torch.Tensor:
        return self._out(self.allocator.alloc_decode(n), n)

    def alloc_logical_only(self, n: int) -> torch.Tensor:
        return self._out(self.allocator.alloc_logical_only(n), n)

    def free(self, locs: torch.Tensor) -> None:
        self.allocator.free(locs.to(self.device))

    def free_rejected(self, locs: torch.Tensor) -> None:
        """Rejected drafts' logical locations: unmapped (their ring slots stay the request's) and freed."""
        self.allocator.full_to_hisparse_device_index_mapping[locs.to(self.device)] = 0
        self.allocator.free(locs.to(self.device))

    def physical_free(self) -> int:
        return self.allocator.hisparse_attn_allocator.available_size()

    def sizes(self) -> tuple:
        return (self.allocator.logical_attn_allocator.available_size(), self.physical_free())

    def write_kv(self, layer: int, locs: torch.Tensor, records: torch.Tensor) -> None:
        self.dsa.set_mla_kv_buffer(layer, locs, records)

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self.dsa.get_key_buffer(layer)


@dataclasses.dataclass
class Workload:
    """Every request of a run (rid, prompt, first token, max_new_tokens), its arrival step and,
    for some, the decode step at which it is retracted (re-admitted two steps later). Seeded: both
    modes replay the same one, each on fresh Req objects."""

    specs: List[tuple]
    arrival: Dict[str, int]
    retract: Dict[str, int]
    abort: set = dataclasses.field(default_factory=set)  # retracted, then aborted: never back
    pd: set = dataclasses.field(default_factory=set)  # arrive as PD decode imports (hisparse mode)

    def fresh(self) -> List[Req]:
        return [Req(rid, prompt, first, max_new) for rid, prompt, first, max_new in self.specs]


def make_workload(vocab: int, *, batch: int, context: int, short: int, steps: int, seed: int) -> Workload:
    """batch requests: even ones long (context - 7 i tokens), odd ones short (`short` tokens);
    the first half arrive at step 0, the rest one every two steps; request i wants
    steps - arrival - (i % 3) tokens; every third (from the second) is retracted at steps // 3, the
    first of them aborted while retracted; every fourth (from the fourth) arrives as a PD import."""
    gen = torch.Generator().manual_seed(seed)
    specs, arrival, retract = [], {}, {}
    first_half = (batch + 1) // 2
    for i in range(batch):
        n = max(2, context - 7 * i) if i % 2 == 0 else short
        prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
        first = int(torch.randint(0, vocab, (1,), generator=gen))
        at = 0 if i < first_half else 1 + 2 * (i - first_half)
        rid = f"r{i}"
        specs.append((rid, prompt, first, max(2, steps - at - i % 3)))
        arrival[rid] = at
        if i % 3 == 1 and at < steps // 3 and steps // 3 + 2 < steps:
            retract[rid] = steps // 3
    abort = set(sorted(retract)[:1])
    pd = {f"r{i}" for i in range(3, batch, 4)}
    return Workload(specs, arrival, retract, abort, pd)


def padded_bs(n: int, max_bs: int) -> int:
    """The captured batch size serving n requests (SGLang's graph runner pads to a captured bs)."""
    bs = 1
    while bs < n:
        bs *= 2
    return min(bs, max_bs)


@dataclasses.dataclass
class SGLangRun:
    mode: str
    logits: Dict[str, List[torch.Tensor]]  # rid -> float32 [vocab] ([q, vocab] with drafts) per decode step
    tokens: Dict[str, List[int]]  # rid -> output_ids at the end
    steps: int
    step_ms: List[float]
    retracted: int
    aborted: int = 0
    imported: int = 0
    free_physical_min: int = 0  # the fewest free physical KV slots seen after a step's admissions
    hits: int = 0
    misses: int = 0
    used_graph: bool = False


class DecodeBuffers:
    """The model runner's static decode inputs and output, max_bs rows (the buffers SGLang's
    CudaGraphRunner copies a batch into): a captured graph for batch size bs reads [:bs]."""

    def __init__(self, model: SparseDecoder, max_bs: int, k: int, max_ctx: int) -> None:
        dev = model.device
        self.k = k
        self.tokens = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.full((max_bs, k), -1, dtype=torch.int32, device=dev)
        self.tpos = torch.arange(max_ctx, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(max_bs, model.cfg.vocab, dtype=torch.float32, device=dev)


@torch.no_grad()
def forward_decode(model: SparseDecoder, fmt: RecordFormat, pool, req_to_token: torch.Tensor,
                   buf: DecodeBuffers, bs: int, attend, write=None) -> None:
    """One decode step of the first bs rows of buf (graph-capturable): per layer, the newest
    token's record and index key into the pool at out_cache_loc (write_kv: set_mla_kv_buffer, through
    the mapping under hisparse), the DSA
    indexer over the request's keys through req_to_token (top-k positions, -1 past seq_len), then
    attend(layer, positions, bs) -> (page table [bs, k], records uint8 [N, stride]) and sparse MLA
    over the records the table names. Logits into buf.logits[:bs]. write(layer, loc, records), if
    given, replaces the record write (vllm_serve_mode.py: MLAAttention's calls around it)."""
    c = model.cfg
    tokens, seq = buf.tokens[:bs], buf.seq_lens[:bs]
    rpi, loc, positions = buf.req_pool_indices[:bs], buf.out_cache_loc[:bs], buf.positions[:bs]
    pos = (seq - 1).long()
    h = model.embed[tokens]
    for l, W in enumerate(model.layers):
        x = _rms(h)
        rec = fmt.encode(_rope(x @ W["wkv"], pos, c.rope_dim))
        if write is None:
            pool.write_kv(l, loc, rec)  # set_mla_kv_buffer
        else:
            write(l, loc, rec)
        if c.anchor(l) == l:
            pool.index_k[l].index_copy_(0, loc, model._index_key(W, x))
            keys = pool.index_k[l][req_to_token[rpi].long()]  # [bs, max_ctx, idx_dim]
            iq = (x @ W["iq"]).view(bs, c.idx_heads, c.idx_dim) + (c.locality * W["u"])
            iw = torch.sigmoid((x @ W["iw"]).float())
            score = (F.relu(torch.bmm(iq, keys.transpose(1, 2)).float()) * iw.unsqueeze(-1)).sum(1)
            score = score.masked_fill(buf.tpos.unsqueeze(0) >= seq.unsqueeze(1), float("-inf"))
            top_v, top_i = score.topk(buf.k, dim=1)
            positions.copy_(top_i.masked_fill(torch.isinf(top_v), -1))
        table, records = attend(l, positions, bs)
        lat = fmt.decode(records[table.clamp(min=0).long()][..., :fmt.record_bytes])  # [bs, k, 576]
        q = _rope((x @ W["wq"]).view(bs, c.n_heads, c.latent), pos.unsqueeze(1), c.rope_dim)
        att = torch.bmm(q, lat.transpose(1, 2)).float() * model.scale
        att = att.masked_fill((positions < 0).unsqueeze(1), float("-inf"))
        p = torch.softmax(att, dim=-1).to(torch.bfloat16)
        o = torch.bmm(p, lat[..., :c.kv_lora])
        h = h + o.reshape(bs, c.n_heads * c.kv_lora) @ W["wo"]
        h = model._mlp(W, h)
    buf.logits[:bs].copy_((_rms(h) @ model.lm_head).float())


PENDING = -1  # an output token whose forward is still queued (overlap: committed a step later)


class Scheduler:
    """SGLang's scheduler, batch-result processor, ScheduleBatch and model runner around one model,
    with the hisparse coordinator (coord, over HiSparsePool) or without (the full-pool baseline).

    overlap (SGLang's overlap scheduler): launch(batch) prepares and queues step N+1 while step
    N's forward is still queued on the forward stream (a CUDA stream, or on a CPU a DeferredStream
    that runs its work only when synchronized), and step N's result is committed only after that:
    map_last_loc_to_buffer, admissions, collect_ready_reqs, retractions and finishes all run with
    a forward queued. Each step's input tokens come from the previous forward on the stream
    (next_token, by request slot), as SGLang's future token ids do; the output token is PENDING
    on the host until its commit. Freed KV locations are reused only after the stream drains
    (release_kv_cache), as SGLang delays frees in overlap mode."""

    overlap_supported = True

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, work: Workload, *, k: int, make_coordinator,
                 use_graph: bool, overlap: bool = True) -> None:
        self.model, self.fmt, self.work = model, fmt, work
        self.reqs = work.fresh()
        dev = model.device
        self.max_bs = padded_bs(len(self.reqs), 1 << 30)
        q = 1 + getattr(self, "draft_tokens", 0)  # a verify round may run q - 1 tokens past max_new_tokens
        max_ctx = max(len(r.origin_input_ids) + r.sampling_params.max_new_tokens for r in self.reqs) + q + 2
        tokens = sum(len(r.origin_input_ids) + r.sampling_params.max_new_tokens + q + 1 for r in self.reqs) + 8
        self.req_to_token_pool = ReqToTokenPool(self.max_bs, max_ctx, dev)
        if make_coordinator is None:
            self.pool = TokenToKVPool(model, fmt, tokens, dev)
            self.coord = None
        else:
            self.pool = HiSparsePool(model, fmt, tokens, dev)
            self.coord = make_coordinator(self.req_to_token_pool, self.pool.allocator)
        self.buf = DecodeBuffers(model, self.max_bs, k, max_ctx)
        self.use_graph = use_graph and dev.type == "cuda"
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        # The model runner's forward stream (SGLang's overlap scheduler runs the forward on its own
        # stream and hands it to the coordinator as the decode producer stream).
        self.overlap = overlap and self.overlap_supported
        self.fwd_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else DeferredStream() if self.overlap else None
        if self.coord is not None and self.fwd_stream is not None:
            self.coord.set_decode_producer_stream(self.fwd_stream)
        self.next_token = torch.zeros(self.max_bs, dtype=torch.long, device=dev)
        self.sizes = (self.pool.sizes(), len(self.req_to_token_pool.free_slots))
        self.imported = 0

    # ---- the attention backends' page tables ----

    def attend(self, layer: int, positions: torch.Tensor, bs: int):
        if self.coord is None:  # SGLang's DSA decode over the full pool: locations from req_to_token
            rpi = self.buf.req_pool_indices[:bs]
            table = self.req_to_token_pool.req_to_token[rpi.unsqueeze(1), positions.clamp(min=0).long()]
            return table, self.pool.records(layer)
        return self.forward_decode(layer, positions, bs)

    def forward_decode(self, layer: int, positions: torch.Tensor, bs: int):
        """The DSA backend's forward_decode in upstream's order (dsa_backend.py 614c1581): the
        device pool's get_key_buffer, which the adapter serves as the daemon's arena to this
        caller only, then the swap-in whose indices index it."""
        kv = self.pool.dsa.get_key_buffer(layer)
        table = self.coord.swap_in_selected_pages(self.buf.req_pool_indices[:bs], self.buf.seq_lens[:bs], positions,
                                                  layer)
        return table, kv.view(kv.shape[0], -1)

    # ---- lifecycle ----

    def _prefill_chunks(self, req: Req, locs: torch.Tensor, write) -> None:
        """The model's prefill of every position before the last output token: write(layer, chunk
        positions, records) for the KV, the index keys at the logical locations."""
        n = req.seqlen - 1
        toks = torch.tensor(req.origin_input_ids + req.output_ids[:-1], device=self.model.device)
        for start in range(0, n, 4096):
            recs, keys = self.model.prefill_chunk(toks[start:start + 4096], start, self.fmt)
            chunk = locs[start:start + 4096]
            for l in range(self.pool.layer_num):
                write(l, start, chunk, recs[l])
                if self.pool.index_k[l] is not None:
                    self.pool.index_k[l][chunk] = keys[l]

    def _alloc_req(self, req: Req, alloc) -> torch.Tensor:
        req.req_pool_idx = self.req_to_token_pool.alloc()
        n = req.seqlen - 1
        locs = alloc(n)
        self.req_to_token_pool.req_to_token[req.req_pool_idx, :n] = locs.to(torch.int32)
        req.kv = Req.KvInfo(n)
        req.kv_committed_len = n
        return locs

    def admit(self, req: Req) -> bool:
        """A prefill (first arrival, or again after a retraction) and the batch-result processor's
        staging call; or, for a PD import under hisparse, the decode node's pre-allocation, the
        transfer into mem_pool_host and admit_request_direct. True when the request may decode now."""
        if self.coord is not None and req.rid in self.work.pd and req.kv_committed_len == 0:
            return self._admit_pd(req)
        locs = self._alloc_req(req, self.pool.alloc_extend)
        self._prefill_chunks(req, locs, lambda l, start, chunk, recs: self.pool.write_kv(l, chunk, recs))
        if self.coord is None:
            return True
        self.coord.admit_request_into_staging(req)
        return False

    def _admit_pd(self, req: Req) -> bool:
        """disaggregation/decode.py with HiSparse: logical locations only, host slots for the
        transfer, the transfer's writes (the prefill node's KV, computed here) at those slots."""
        c = self.coord
        locs = self._alloc_req(req, self.pool.alloc_logical_only)
        n = req.seqlen - 1
        host = c.mem_pool_host.alloc_paged_token_slots(c.req_to_host_pool, c.req_to_host_pool_allocated_len,
                                                       req.req_pool_idx, 0, c.host_token_len(n))
        landing = c.mem_pool_host.kv_buffer

        def transfer(l, start, chunk, recs):
            landing[l][host[start:start + len(chunk)]] = recs.view(torch.uint8).reshape(len(chunk), -1).cpu()

        self._prefill_chunks(req, locs, transfer)
        c.admit_request_direct(req)
        self.imported += 1
        return True

    def collect(self) -> List[Req]:
        """Staged requests ready to decode. Both modes must batch the same requests, so the run
        waits for the stores (SGLang would merge a request whose store is still running a step later)."""
        if self.coord is None:
            return []
        if self.model.device.type == "cuda":
            torch.cuda.current_stream(self.model.device).synchronize()
        ready = self.coord.collect_ready_reqs()
        assert not self.coord.has_ongoing_staging()
        return ready

    def drain(self) -> None:
        """Waits (on the host) for every forward queued on the forward stream."""
        if self.fwd_stream is not None:
            self.fwd_stream.synchronize()

    def release_kv_cache(self, req: Req) -> None:
        if self.overlap:  # a queued forward may still read these locations; SGLang frees after it
            self.drain()
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx, :req.kv.kv_allocated_len]
        self.pool.free(row.long())
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    def retract(self, req: Req) -> None:
        """release_req of a retracted decode request: the coordinator's retract_req, the KV freed;
        the request is prefilled again when it returns."""
        if self.coord is not None:
            self.coord.retract_req(req)
        self.release_kv_cache(req)

    def finish(self, req: Req) -> None:
        if self.coord is not None:
            self.coord.request_finished(req)
        self.release_kv_cache(req)

    # ---- one decode step ----

    def decode(self, batch: List[Req]) -> torch.Tensor:
        """prepare_for_decode + the model runner's forward (a CUDA graph per padded bs); returns the
        real rows' logits on the CPU."""
        n, b, dev = len(batch), self.buf, self.model.device
        bs = padded_bs(n, self.max_bs)
        locs = self.pool.alloc_decode(n)  # logical locations only, under hisparse
        rpi = torch.tensor([r.req_pool_idx for r in batch], dtype=torch.int64)
        seq = torch.tensor([r.seqlen for r in batch], dtype=torch.int32)  # after seq_lens += 1
        self.req_to_token_pool.req_to_token[rpi.to(dev), (seq - 1).long().to(dev)] = locs.to(torch.int32)
        for r in batch:
            r.kv.kv_allocated_len = r.seqlen
        b.tokens[:n] = torch.tensor([r.output_ids[-1] for r in batch], device=dev)
        b.seq_lens[:n], b.req_pool_indices[:n], b.out_cache_loc[:n] = seq.to(dev), rpi.to(dev), locs
        b.tokens[n:bs], b.seq_lens[n:bs], b.req_pool_indices[n:bs], b.out_cache_loc[n:bs] = 0, 1, 0, 0
        if self.coord is not None:
            self.coord.map_last_loc_to_buffer(b.seq_lens[:n], locs, b.req_pool_indices[:n], seq, rpi)
            self.coord.num_real_reqs.fill_(n)  # the model runner's forward_batch.batch_size
        self._run_forward(bs)
        return b.logits[:n].to("cpu", copy=True)

    def commit(self, batch: List[Req], out: torch.Tensor, logits: Dict[str, List[torch.Tensor]], step: int) -> None:
        """The batch-result processor: each request's logits row kept, its greedy token appended
        (overlap: written over the oldest PENDING one)."""
        for i, r in enumerate(batch):
            logits[r.rid].append(out[i])
            tok = int(out[i].argmax())
            if self.overlap:
                r.output_ids[r.output_ids.index(PENDING)] = tok
            else:
                r.output_ids.append(tok)
                r.kv_committed_len = r.seqlen - 1

    def launch(self, batch: List[Req]):
        """Overlap: prepare_for_decode on the scheduler (logical locations, map_last_loc_to_buffer)
        while the previous step's forward may still be queued, then the forward queued on the
        forward stream: the step's inputs into the static buffers (input tokens from next_token),
        wait_for_pending_backup, the forward, its logits kept and its tokens into next_token. Each
        request's output token is PENDING until result() and commit. Returns the handle for result()."""
        n, b, dev = len(batch), self.buf, self.model.device
        bs = padded_bs(n, self.max_bs)
        locs = self.pool.alloc_decode(n)
        rpi = torch.tensor([r.req_pool_idx for r in batch], dtype=torch.int64)
        seq = torch.tensor([r.seqlen for r in batch], dtype=torch.int32)  # after seq_lens += 1
        known = [(r.req_pool_idx, r.output_ids[-1]) for r in batch if r.output_ids[-1] != PENDING]
        for r in batch:
            r.kv.kv_allocated_len = r.seqlen
            r.output_ids.append(PENDING)
        rpi_d, seq_d = rpi.to(dev), seq.to(dev)
        if self.coord is not None:  # on the scheduler, with the previous forward still queued
            self.coord.map_last_loc_to_buffer(seq_d, locs, rpi_d, seq, rpi)
        out: List[torch.Tensor] = []

        def step() -> None:  # queued on the forward stream
            self.req_to_token_pool.req_to_token[rpi_d, (seq_d - 1).long()] = locs.to(torch.int32)
            if known:
                idx, tok = zip(*known)
                self.next_token[torch.tensor(idx, device=dev)] = torch.tensor(tok, device=dev)
            b.tokens[:n] = self.next_token[rpi_d]
            b.seq_lens[:n], b.req_pool_indices[:n], b.out_cache_loc[:n] = seq_d, rpi_d, locs
            b.tokens[n:bs], b.seq_lens[n:bs], b.req_pool_indices[n:bs], b.out_cache_loc[n:bs] = 0, 1, 0, 0
            if self.coord is not None:  # ModelRunner.forward, decode mode
                self.coord.wait_for_pending_backup()
                self.coord.num_real_reqs.fill_(n)
            self._forward(bs)
            logits = b.logits[:n].clone()
            self.next_token[rpi_d] = logits.argmax(dim=1)
            out.append(logits)

        if dev.type == "cuda":
            main = torch.cuda.current_stream(dev)
            self.fwd_stream.wait_stream(main)  # the scheduler's preparation, not the other way round
            with torch.cuda.stream(self.fwd_stream):
                step()
            done = torch.cuda.Event()
            done.record(self.fwd_stream)
            # locs, rpi_d and seq_d came from the scheduler's stream and are read by the queued
            # forward: the handle keeps them allocated until result() has waited for it.
            return out, done, (locs, rpi_d, seq_d)
        self.fwd_stream.submit(step)
        return out, None, ()

    def result(self, handle) -> torch.Tensor:
        """A launched step's logits on the CPU, once its forward has run."""
        out, done, _ = handle
        if done is not None:
            done.synchronize()
        while not out:  # a DeferredStream: run up to this step's forward, not the next one's
            self.fwd_stream.run_next()
        return out[0].to("cpu", copy=True)

    def forward(self, bs: int) -> None:
        forward_decode(self.model, self.fmt, self.pool, self.req_to_token_pool.req_to_token, self.buf, bs,
                       self.attend)

    def _run_forward(self, bs: int) -> None:
        """ModelRunner: wait_for_pending_backup, then the forward on the forward stream; the scheduler's
        stream waits for it before reading the logits."""
        if self.coord is not None:
            self.coord.wait_for_pending_backup()
        if self.fwd_stream is None:
            self._forward(bs)
            return
        main = torch.cuda.current_stream(self.model.device)
        self.fwd_stream.wait_stream(main)
        with torch.cuda.stream(self.fwd_stream):
            self._forward(bs)
        main.wait_stream(self.fwd_stream)

    def _forward(self, bs: int) -> None:
        if not self.use_graph:
            self.forward(bs)
            return
        dev = self.model.device
        if bs not in self.graphs:  # capture on first use: warm up, then record
            here = torch.cuda.current_stream(dev)
            side = torch.cuda.Stream(dev)
            side.wait_stream(here)
            with torch.cuda.stream(side):
                self.forward(bs)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    self.forward(bs)
            here.wait_stream(side)
            self.graphs[bs] = graph
        self.graphs[bs].replay()


@torch.no_grad()
def run_sglang(model: SparseDecoder, fmt: RecordFormat, work: Workload, *, k: int, steps: int,
               make_coordinator=None, use_graph: bool = True, scheduler=Scheduler, overlap: bool = True) -> SGLangRun:
    """Runs the workload for `steps` decode steps with (make_coordinator(req_to_token_pool, allocator)
    -> HisparsedCoordinator) or without hisparse; every request left at the end is finished. Checks
    that every size is restored: both index spaces, request slots and, with hisparse, the session.
    scheduler: Scheduler, or sglang_mtp_mode.MtpScheduler for speculative decoding."""
    s = scheduler(model, fmt, work, k=k, make_coordinator=make_coordinator, use_graph=use_graph, overlap=overlap)
    mode = "hisparse" if s.coord is not None else "baseline"
    before = s.coord.session.stats() if s.coord is not None else None
    logits: Dict[str, List[torch.Tensor]] = {r.rid: [] for r in s.reqs}
    running: List[Req] = []
    readmit: Dict[int, List[Req]] = {}
    step_ms: List[float] = []
    retracted = aborted = 0
    pending = None  # overlap: (batch, handle) of the step launched last, not yet committed
    free_min = s.pool.physical_free()
    for step in range(steps):
        for r in [r for r in s.reqs if work.arrival[r.rid] == step] + readmit.pop(step, []):
            if s.admit(r):
                running.append(r)
        running += s.collect()
        free_min = min(free_min, s.pool.physical_free())
        for r in [r for r in running if work.retract.get(r.rid) == step]:
            s.retract(r)
            running.remove(r)
            retracted += 1
            if r.rid in work.abort:  # aborted while retracted: the coordinator hears nothing more of it
                aborted += 1
            else:
                readmit.setdefault(step + 2, []).append(r)
        if not running:
            if pending is not None:  # a returning request's prefill needs its committed tokens
                s.commit(pending[0], s.result(pending[1]), logits, step - 1)
                pending = None
            continue
        t = time.perf_counter()
        if s.overlap:  # step N+1 prepared and queued before step N's result is read
            handle = s.launch(running)
            if pending is not None:
                s.commit(pending[0], s.result(pending[1]), logits, step - 1)
            pending = (list(running), handle)
        else:
            out = s.decode(running)
            s.commit(running, out, logits, step)
        step_ms.append(1e3 * (time.perf_counter() - t))
        for r in [r for r in running if r.finished()]:
            s.finish(r)
            running.remove(r)
    if pending is not None:
        s.commit(pending[0], s.result(pending[1]), logits, steps)
    for r in running:
        s.finish(r)
    assert not readmit, "a retracted request was never re-admitted"
    result = SGLangRun(mode, logits, {r.rid: list(r.output_ids) for r in s.reqs}, steps, step_ms, retracted,
                       aborted=aborted, imported=s.imported, free_physical_min=free_min, used_graph=s.use_graph)
    if s.fwd_stream is not None:
        s.fwd_stream.synchronize()
    assert (s.pool.sizes(), len(s.req_to_token_pool.free_slots)) == s.sizes, "KV locations or slots leaked"
    if s.coord is not None:
        s.coord.session.check_errors()
        after = s.coord.session.stats()
        assert after.session_requests == 0 and after.session_host_bytes == 0, "the coordinator leaked requests"
        result.hits, result.misses = after.hits - before.hits, after.misses - before.misses
        s.graphs.clear()
        s.coord.destroy()
    return result


def compare(base: SGLangRun, hs: SGLangRun) -> tuple:
    """(decode rows bit-identical, decode rows in all, tokens identical, first difference or None)."""
    same = total = 0
    first = None
    for rid, rows in base.logits.items():
        other = hs.logits[rid]
        if len(rows) != len(other) and first is None:
            first = f"{rid}: {len(rows)} decode steps vs {len(other)}"
        for i, (a, b) in enumerate(zip(rows, other)):
            total += 1
            if torch.equal(a, b):
                same += 1
            elif first is None:
                first = f"{rid}, its decode step {i}"
    return same, total, base.tokens == hs.tokens, first

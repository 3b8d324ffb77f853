"""The example engine served the way SGLang serves it: run_engine.py --adapter sglang.

A small continuous-batching scheduler and model runner that drive
hisparse.integrations.sglang.HisparsedCoordinator through the calls SGLang makes on its
HiSparseCoordinator (sgl-project/sglang main-line @ 009e640a): the batch-result processor's
admit_request_into_staging after a prefill and the scheduler's collect_ready_reqs before merging
into the running batch; ScheduleBatch.prepare_for_decode's map_last_loc_to_buffer and the model
runner's num_real_reqs; the DSA backend's swap_in_selected_pages per layer of every decode step
(its page table indexes attention_kv_buffer()); release_req's retract_req, with the request
re-queued and re-admitted later; request_finished when a request has its tokens. The baseline
is the same scheduler without a coordinator: SGLang's DSA decode over its full KV pool, the page
table taken from req_to_token.

The workload mixes long prompts (the context of --configs) and short ones (half of B, so their
every position stays resident), staggers arrivals, finishes requests at different steps and
retracts a third of them for two steps in the middle of the run. Both modes run the same
schedule with the same padded batch shapes, so every real row's logits must be equal bit for bit
at every decode step (torch.equal), as must every generated token.

The engine objects are small stand-ins, each naming the upstream class it mirrors. The model's
prefill is token-local and samples nothing (engine.py), so a prefill here writes the KV of every
position before the request's last output token and the request continues from that token; a
retraction therefore models SGLang's PD-decode retraction, which keeps the KV
(Req.offload_kv_cache / load_kv_cache): the baseline offloads and reloads its KV and index keys;
with hisparse the coordinator parks the request (the host copy stays in the daemon) and the
engine keeps only the index keys, which hisparse does not hold. The KV locations a re-admitted
request gets are filled with a poison pattern, so a coordinator that stored them again or read
SGLang's pool instead of its own would change the logits.

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

POISON = 0x3C  # a finite byte pattern in every record format (bf16 0x3C3C ~ 0.0115)


class Req:
    """sglang.srt.managers.schedule_batch.Req (@ 009e640a): rid, origin_input_ids, output_ids,
    req_pool_idx, sampling_params.max_new_tokens, the hisparse_staging flag the coordinator sets,
    seqlen, and offload_kv_cache / load_kv_cache (PD decode's retraction keeps the KV on the CPU)."""

    class SamplingParams:
        def __init__(self, max_new_tokens: int) -> None:
            self.max_new_tokens = max_new_tokens

    def __init__(self, rid: str, prompt: List[int], first_token: int, max_new_tokens: int) -> None:
        self.rid = rid
        self.origin_input_ids = list(prompt)
        self.output_ids = [first_token]  # the prefill's token (engine.py draws it at random)
        self.req_pool_idx: Optional[int] = None
        self.sampling_params = Req.SamplingParams(max_new_tokens)
        self.hisparse_staging = False
        self.kv_cache_cpu = None

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return len(self.output_ids) >= self.sampling_params.max_new_tokens

    def offload_kv_cache(self, req_to_token_pool, allocator) -> None:
        locs = req_to_token_pool.req_to_token[self.req_pool_idx, :self.seqlen - 1].long()
        self.kv_cache_cpu = allocator.get_cpu_copy(locs)

    def load_kv_cache(self, req_to_token_pool, allocator) -> None:
        locs = req_to_token_pool.req_to_token[self.req_pool_idx, :self.seqlen - 1].long()
        allocator.load_cpu_copy(self.kv_cache_cpu, locs)
        self.kv_cache_cpu = None


class ReqToTokenPool:
    """sglang.srt.mem_cache.memory_pool.ReqToTokenPool (@ 009e640a): req_to_token int32
    [size, max_context_len] on the device (the KV location of each request slot and position;
    0 where none) and a free list of slots."""

    def __init__(self, size: int, max_context_len: int, device) -> None:
        self.req_to_token = torch.zeros(size, max_context_len, dtype=torch.int32, device=device)
        self.max_context_len = max_context_len
        self.free_slots = list(range(size))

    def alloc(self) -> int:
        return self.free_slots.pop(0)

    def free(self, idx: int) -> None:
        self.req_to_token[idx].zero_()
        self.free_slots.append(idx)


class TokenToKVPool:
    """sglang.srt.mem_cache.hisparse_memory_pool.HiSparseDSATokenToKVPool and its allocator
    sglang.srt.mem_cache.allocator.hisparse.HiSparseTokenToKVPoolAllocator (@ 009e640a), in one:
    layer_num, kv_buffer (one [size, 1, record] tensor a layer: bf16 [.., 576] for bf16 records,
    uint8 [.., 656] for FlashMLA's fp8 layout), the DSA indexer's key buffer, get_kvcache(),
    alloc / free / available_size over token locations (location 0 is the padding slot, never
    handed out), and get_cpu_copy / load_cpu_copy for retraction. keep_kv=False is the pool under
    a hisparse coordinator: the KV of a retracted request is the coordinator's (parked in the
    daemon), so only the index keys are copied, and a reload poisons the KV locations."""

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, size: int, device, keep_kv: bool) -> None:
        cfg = model.cfg
        self.layer_num = cfg.n_layers
        self.record_bytes = fmt.record_bytes
        if fmt.name == "bf16":
            self.kv_buffer = [torch.zeros(size, 1, cfg.latent, dtype=torch.bfloat16, device=device)
                              for _ in range(cfg.n_layers)]
        else:
            self.kv_buffer = [torch.zeros(size, 1, fmt.record_bytes, dtype=torch.uint8, device=device)
                              for _ in range(cfg.n_layers)]
        self.index_k = [torch.zeros(size, cfg.idx_dim, dtype=torch.bfloat16, device=device)
                        if cfg.anchor(l) == l else None for l in range(cfg.n_layers)]
        self.keep_kv = keep_kv
        self.size = size
        self.device = device
        self.free_locs = list(range(1, size))

    def get_kvcache(self) -> "TokenToKVPool":
        return self

    def records(self, layer: int) -> torch.Tensor:
        """Layer `layer` as uint8 [size, record_bytes] (a view)."""
        return self.kv_buffer[layer].view(self.size, -1).view(torch.uint8)

    def alloc(self, n: int) -> torch.Tensor:
        if n > len(self.free_locs):
            raise RuntimeError(f"KV pool out of memory: {n} tokens asked, {len(self.free_locs)} free")
        out, self.free_locs = self.free_locs[:n], self.free_locs[n:]
        return torch.tensor(out, dtype=torch.int64, device=self.device)

    def free(self, locs: torch.Tensor) -> None:
        self.free_locs.extend(locs.tolist())

    def available_size(self) -> int:
        return len(self.free_locs)

    def get_cpu_copy(self, locs: torch.Tensor) -> Dict[str, list]:
        keys = [k[locs].cpu() if k is not None else None for k in self.index_k]
        kv = [self.records(l)[locs].cpu() for l in range(self.layer_num)] if self.keep_kv else None
        return {"index_k": keys, "kv": kv}

    def load_cpu_copy(self, copy: Dict[str, list], locs: torch.Tensor) -> None:
        for k, saved in zip(self.index_k, copy["index_k"]):
            if k is not None:
                k[locs] = saved.to(self.device)
        for l in range(self.layer_num):
            if copy["kv"] is not None:
                self.records(l)[locs] = copy["kv"][l].to(self.device)
            else:
                self.records(l)[locs] = POISON


@dataclasses.dataclass
class Workload:
    """Every request of a run (rid, prompt, first token, max_new_tokens), its arrival step and,
    for some, the decode step at which it is retracted (re-admitted two steps later). Seeded: both
    modes replay the same one, each on fresh Req objects."""

    specs: List[tuple]
    arrival: Dict[str, int]
    retract: Dict[str, int]

    def fresh(self) -> List[Req]:
        return [Req(rid, prompt, first, max_new) for rid, prompt, first, max_new in self.specs]


def make_workload(vocab: int, *, batch: int, context: int, short: int, steps: int, seed: int) -> Workload:
    """batch requests: even ones long (context - 7 i tokens), odd ones short (`short` tokens);
    the first half arrive at step 0, the rest one every two steps; request i wants
    steps - arrival - (i % 3) tokens; every third (from the second) is retracted at steps // 3."""
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
    return Workload(specs, arrival, retract)


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
def forward_decode(model: SparseDecoder, fmt: RecordFormat, pool: TokenToKVPool, req_to_token: torch.Tensor,
                   buf: DecodeBuffers, bs: int, attend) -> None:
    """One decode step of the first bs rows of buf (graph-capturable): per layer, the newest
    token's record and index key into the pool at out_cache_loc (set_mla_kv_buffer), the DSA
    indexer over the request's keys through req_to_token (top-k positions, -1 past seq_len), then
    attend(layer, positions, bs) -> (page table [bs, k], records uint8 [N, stride]) and sparse MLA
    over the records the table names. Logits into buf.logits[:bs]."""
    c = model.cfg
    tokens, seq = buf.tokens[:bs], buf.seq_lens[:bs]
    rpi, loc, positions = buf.req_pool_indices[:bs], buf.out_cache_loc[:bs], buf.positions[:bs]
    pos = (seq - 1).long()
    h = model.embed[tokens]
    for l, W in enumerate(model.layers):
        x = _rms(h)
        pool.records(l).index_copy_(0, loc, fmt.encode(_rope(x @ W["wkv"], pos, c.rope_dim)))
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


class Scheduler:
    """SGLang's scheduler, batch-result processor, ScheduleBatch and model runner around one model,
    with the hisparse coordinator (coord) or without (the full-pool baseline)."""

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, work: Workload, *, k: int, make_coordinator,
                 use_graph: bool) -> None:
        self.model, self.fmt, self.work = model, fmt, work
        self.reqs = work.fresh()
        dev = model.device
        self.max_bs = padded_bs(len(self.reqs), 1 << 30)
        q = 1 + getattr(self, "draft_tokens", 0)  # a verify round may run q - 1 tokens past max_new_tokens
        max_ctx = max(len(r.origin_input_ids) + r.sampling_params.max_new_tokens for r in self.reqs) + q + 2
        tokens = sum(len(r.origin_input_ids) + r.sampling_params.max_new_tokens + q + 1 for r in self.reqs) + 8
        self.req_to_token_pool = ReqToTokenPool(self.max_bs, max_ctx, dev)
        self.pool = TokenToKVPool(model, fmt, tokens, dev, keep_kv=make_coordinator is None)
        self.coord = make_coordinator(self.req_to_token_pool, self.pool) if make_coordinator else None
        self.buf = DecodeBuffers(model, self.max_bs, k, max_ctx)
        self.use_graph = use_graph and dev.type == "cuda"
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.records = None  # the coordinator's arena as a torch tensor (attention_kv_buffer)
        self.sizes = (self.pool.available_size(), len(self.req_to_token_pool.free_slots))

    # ---- the attention backends' page tables ----

    def attend(self, layer: int, positions: torch.Tensor, bs: int):
        if self.coord is None:  # SGLang's DSA decode over the full pool: locations from req_to_token
            rpi = self.buf.req_pool_indices[:bs]
            table = self.req_to_token_pool.req_to_token[rpi.unsqueeze(1), positions.clamp(min=0).long()]
            return table, self.pool.records(layer)
        table = self.coord.swap_in_selected_pages(self.buf.req_pool_indices[:bs], self.buf.seq_lens[:bs], positions,
                                                  layer)
        if self.records is None:
            self.records = torch.as_tensor(self.coord.attention_kv_buffer(layer))
        return table, self.records

    # ---- lifecycle ----

    def _write_prefill(self, req: Req) -> None:
        """A prefill of every position before the last output token into fresh locations."""
        req.req_pool_idx = self.req_to_token_pool.alloc()
        n = req.seqlen - 1
        locs = self.pool.alloc(n)
        self.req_to_token_pool.req_to_token[req.req_pool_idx, :n] = locs.to(torch.int32)
        toks = torch.tensor(req.origin_input_ids + req.output_ids[:-1], device=self.model.device)
        for start in range(0, n, 4096):
            recs, keys = self.model.prefill_chunk(toks[start:start + 4096], start, self.fmt)
            chunk = locs[start:start + 4096]
            for l in range(self.pool.layer_num):
                self.pool.records(l)[chunk] = recs[l]
                if self.pool.index_k[l] is not None:
                    self.pool.index_k[l][chunk] = keys[l]

    def admit(self, req: Req, readmit: bool) -> None:
        if readmit:  # the retracted request's KV comes back (baseline) or stays parked (hisparse)
            req.req_pool_idx = self.req_to_token_pool.alloc()
            n = req.seqlen - 1
            self.req_to_token_pool.req_to_token[req.req_pool_idx, :n] = self.pool.alloc(n).to(torch.int32)
            req.load_kv_cache(self.req_to_token_pool, self.pool)
        else:
            self._write_prefill(req)
        if self.coord is not None:
            self.coord.admit_request_into_staging(req)  # batch-result processor, after the prefill

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

    def release_kv_cache(self, req: Req) -> None:
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx, :req.seqlen - 1]
        self.pool.free(row.long().cpu())
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    def retract(self, req: Req) -> None:
        """release_req of a retracted decode request (PD decode: the KV is offloaded, not dropped)."""
        if self.coord is not None:
            self.coord.retract_req(req)
        req.offload_kv_cache(self.req_to_token_pool, self.pool)
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
        locs = self.pool.alloc(n)
        rpi = torch.tensor([r.req_pool_idx for r in batch], dtype=torch.int64)
        seq = torch.tensor([r.seqlen for r in batch], dtype=torch.int32)  # after seq_lens += 1
        self.req_to_token_pool.req_to_token[rpi.to(dev), (seq - 1).long().to(dev)] = locs.to(torch.int32)
        b.tokens[:n] = torch.tensor([r.output_ids[-1] for r in batch], device=dev)
        b.seq_lens[:n], b.req_pool_indices[:n], b.out_cache_loc[:n] = seq.to(dev), rpi.to(dev), locs
        b.tokens[n:bs], b.seq_lens[n:bs], b.req_pool_indices[n:bs], b.out_cache_loc[n:bs] = 0, 1, 0, 0
        if self.coord is not None:
            self.coord.map_last_loc_to_buffer(b.seq_lens[:n], locs, b.req_pool_indices[:n], seq, rpi)
            self.coord.num_real_reqs.fill_(n)  # the model runner's forward_batch.batch_size
        self._forward(bs)
        return b.logits[:n].to("cpu", copy=True)

    def commit(self, batch: List[Req], out: torch.Tensor, logits: Dict[str, List[torch.Tensor]], step: int) -> None:
        """The batch-result processor: each request's logits row kept, its greedy token appended."""
        for i, r in enumerate(batch):
            logits[r.rid].append(out[i])
            r.output_ids.append(int(out[i].argmax()))

    def forward(self, bs: int) -> None:
        forward_decode(self.model, self.fmt, self.pool, self.req_to_token_pool.req_to_token, self.buf, bs,
                       self.attend)

    def _forward(self, bs: int) -> None:
        if not self.use_graph:
            self.forward(bs)
            return
        dev = self.model.device
        if bs not in self.graphs:  # capture on first use: warm up, then record
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                self.forward(bs)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    self.forward(bs)
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graphs[bs] = graph
        self.graphs[bs].replay()


@torch.no_grad()
def run_sglang(model: SparseDecoder, fmt: RecordFormat, work: Workload, *, k: int, steps: int,
               make_coordinator=None, use_graph: bool = True, scheduler=Scheduler) -> SGLangRun:
    """Runs the workload for `steps` decode steps with (make_coordinator(req_to_token_pool, pool) ->
    HisparsedCoordinator) or without hisparse; every request left at the end is finished. Checks
    that every size is restored: KV locations, request slots and, with hisparse, the session.
    scheduler: Scheduler, or sglang_mtp_mode.MtpScheduler for speculative decoding."""
    s = scheduler(model, fmt, work, k=k, make_coordinator=make_coordinator, use_graph=use_graph)
    mode = "hisparse" if s.coord is not None else "baseline"
    before = s.coord.session.stats() if s.coord is not None else None
    logits: Dict[str, List[torch.Tensor]] = {r.rid: [] for r in s.reqs}
    running: List[Req] = []
    readmit: Dict[int, List[Req]] = {}
    step_ms: List[float] = []
    retracted = 0
    for step in range(steps):
        for r in [r for r in s.reqs if work.arrival[r.rid] == step] + readmit.pop(step, []):
            s.admit(r, readmit=r.kv_cache_cpu is not None)
            if s.coord is None:
                running.append(r)
        running += s.collect()
        for r in [r for r in running if work.retract.get(r.rid) == step]:
            s.retract(r)
            running.remove(r)
            readmit.setdefault(step + 2, []).append(r)
            retracted += 1
        if not running:
            continue
        t = time.perf_counter()
        out = s.decode(running)
        step_ms.append(1e3 * (time.perf_counter() - t))
        s.commit(running, out, logits, step)
        for r in [r for r in running if r.finished()]:
            s.finish(r)
            running.remove(r)
    for r in running:
        s.finish(r)
    assert not readmit, "a retracted request was never re-admitted"
    result = SGLangRun(mode, logits, {r.rid: list(r.output_ids) for r in s.reqs}, steps, step_ms, retracted,
                       used_graph=s.use_graph)
    assert (s.pool.available_size(), len(s.req_to_token_pool.free_slots)) == s.sizes, "KV locations or slots leaked"
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

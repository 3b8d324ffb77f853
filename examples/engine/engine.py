"""A small sparse-attention decoder served two ways: every layer's KV in HBM, or through hisparse.

The model (random weights from a seed; nothing is downloaded) has what matters to a top-k sparse
attention engine and nothing more:

  - MLA-style latent KV: one 576-element vector a token and layer (512 "nope" + 64 rotary), which
    every head attends over (the absorbed form of DeepSeek's MLA);
  - a DSA-style indexer: a few index heads score every earlier position,
    score_t = sum_h w_h * ReLU(q_h . k_t), against index keys that stay on the GPU in full
    (128 bf16 a token: small), and pick the top k positions (-1 pads when fewer exist);
  - sparse attention over the k selected latent records: gather [batch, k, 576], softmax.

KV records, the unit hisparse stores (RecordFormat):
  - "bf16": the latent as 576 bf16 = 1152 B;
  - "fp8":  DeepSeek-V3.2's FlashMLA layout, 656 B: 512 B fp8 e4m3 of the nope part (4 tiles of
    128, one scale each), 4 float32 scales (16 B), the 64 rotary elements in bf16 (128 B).

Two KV backends implement append (the newest token's record), store (prefill) and gather (the
selected records): FullKV keeps [batch, max_len, record] per layer in HBM and gathers by
position; HisparseKV keeps the records in the daemon's host pool (hs_store at prefill, hs_append
per step), runs RESOLVE per layer and gathers from the slot arena by its page table. Everything after
the gather is the same code on the same shapes, so the logits of the two must be bit-for-bit
equal: that is the exactness check run_engine.py makes.

The prefill is token-local (each layer's KV and index key come from that token's own hidden state;
attention over the prompt is skipped) so that 64k-token prompts cost seconds: it stages the
records hisparse stores, and the decode step, where hisparse works, is the full computation.
The decode step is one CUDA graph in both modes (engine.Runner), replayed every token; on a CPU
(host backend) it runs eagerly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class ModelConfig:
    vocab: int = 4096
    d_model: int = 1024
    n_layers: int = 4
    n_heads: int = 16
    kv_lora: int = 512
    rope_dim: int = 64
    idx_heads: int = 4
    idx_dim: int = 128
    mlp_hidden: int = 2048
    # Strength of the index keys' per-token salience (0: selections are query noise). Real
    # models' selections overlap 35-90% from step to step; 6.0 gives LRU hit rates of about 0.6-0.8 at B = k.
    locality: float = 6.0
    seed: int = 0
    # Shared indexers (GLM-5-style): layers [a, a + index_share) reuse anchor a's top-k selection,
    # only anchors run the indexer. 1: every layer selects on its own.
    index_share: int = 1
    # "indexer": the DSA indexer selects. "sweep": a benchmark selection with a set miss rate at
    # B = k: every row selects a window of k - 1 prompt positions that slides by sweep_shift
    # positions a step (so about sweep_shift of the k are new each step), plus the newest token.
    selection: str = "indexer"
    sweep_shift: int = 0

    def anchor(self, layer: int) -> int:
        return layer - layer % max(1, self.index_share)

    @property
    def latent(self) -> int:
        return self.kv_lora + self.rope_dim


SMALL = dict(vocab=512, d_model=128, n_layers=2, n_heads=2, mlp_hidden=256, idx_heads=2)


# ---- KV records ----

class RecordFormat:
    """How one token's latent KV (bf16 [576]) is laid out as record_bytes bytes."""

    name: str
    record_bytes: int

    def encode(self, latent: torch.Tensor) -> torch.Tensor:  # [..., 576] -> uint8 [..., record_bytes]
        raise NotImplementedError

    def decode(self, records: torch.Tensor) -> torch.Tensor:  # uint8 [..., record_bytes] -> bf16 [..., 576]
        raise NotImplementedError


class Bf16Records(RecordFormat):
    def __init__(self, cfg: ModelConfig) -> None:
        self.name = "bf16"
        self.record_bytes = cfg.latent * 2

    def encode(self, latent):
        return latent.to(torch.bfloat16).contiguous().view(torch.uint8)

    def decode(self, records):
        return records.contiguous().view(torch.bfloat16)


class Fp8Records(RecordFormat):
    """512 B fp8 e4m3 (tiles of 128, one float32 scale each) + 16 B scales + 128 B bf16 rotary = 656 B."""

    TILE = 128

    def __init__(self, cfg: ModelConfig) -> None:
        if not hasattr(torch, "float8_e4m3fn"):
            raise RuntimeError("fp8 records need torch >= 2.1 (torch.float8_e4m3fn)")
        self.name = "fp8"
        self.nope = cfg.kv_lora
        self.tiles = cfg.kv_lora // self.TILE
        self.rope = cfg.rope_dim
        self.record_bytes = self.nope + 4 * self.tiles + 2 * self.rope
        assert self.record_bytes % 16 == 0

    def encode(self, latent):
        lead = latent.shape[:-1]
        nope = latent[..., :self.nope].float().reshape(*lead, self.tiles, self.TILE)
        scale = nope.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
        q = (nope / scale).to(torch.float8_e4m3fn).view(torch.uint8).reshape(*lead, self.nope)
        s = scale.reshape(*lead, self.tiles).contiguous().view(torch.uint8)
        r = latent[..., self.nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
        return torch.cat([q, s, r], dim=-1)

    def decode(self, records):
        records = records.contiguous()
        lead = records.shape[:-1]
        q = records[..., :self.nope].view(torch.float8_e4m3fn).float().reshape(*lead, self.tiles, self.TILE)
        s = records[..., self.nope:self.nope + 4 * self.tiles].view(torch.float32)
        nope = (q * s.unsqueeze(-1)).reshape(*lead, self.nope).to(torch.bfloat16)
        rope = records[..., self.nope + 4 * self.tiles:].view(torch.bfloat16)
        return torch.cat([nope, rope], dim=-1)


def record_format(name: str, cfg: ModelConfig) -> RecordFormat:
    if name == "bf16":
        return Bf16Records(cfg)
    if name == "fp8":
        return Fp8Records(cfg)
    raise ValueError(f"record format must be bf16 or fp8, got {name!r}")


# ---- the model ----

def _rms(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)


def _rope(x: torch.Tensor, pos: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Rotates the last rope_dim elements of x [..., D] by position pos (broadcast over x's leading dims)."""
    half = rope_dim // 2
    inv = 1.0 / (10000.0 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = pos.float().unsqueeze(-1) * inv  # [..., half]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    body, r = x[..., :-rope_dim], x[..., -rope_dim:].float()
    r1, r2 = r[..., :half], r[..., half:]
    rot = torch.cat([r1 * cos - r2 * sin, r1 * sin + r2 * cos], dim=-1).to(x.dtype)
    return torch.cat([body, rot], dim=-1)


class SparseDecoder:
    """Weights and the two forward paths (token-local prefill, one decode step)."""

    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape, std=None):
            std = std if std is not None else 1.0 / math.sqrt(shape[0])
            return (torch.randn(*shape, generator=g) * std).to(device=device, dtype=torch.bfloat16)

        c = cfg
        self.embed = w(c.vocab, c.d_model, std=1.0)
        self.lm_head = w(c.d_model, c.vocab)
        self.layers = []
        for _ in range(c.n_layers):
            u = torch.randn(c.idx_dim, generator=g)
            self.layers.append(dict(
                wq=w(c.d_model, c.n_heads * c.latent), wkv=w(c.d_model, c.latent),
                wo=w(c.n_heads * c.kv_lora, c.d_model), w1=w(c.d_model, c.mlp_hidden), w2=w(c.mlp_hidden, c.d_model),
                iq=w(c.d_model, c.idx_heads * c.idx_dim), ik=w(c.d_model, c.idx_dim), iw=w(c.d_model, c.idx_heads),
                sal=w(c.d_model, 1), u=(u / u.norm()).to(device=device, dtype=torch.bfloat16)))
        self.scale = 1.0 / math.sqrt(c.latent)

    def _mlp(self, W, h):
        return h + F.gelu(_rms(h) @ W["w1"]) @ W["w2"]

    def _index_key(self, W, x):
        sal = F.softplus((x @ W["sal"]).float()) * self.cfg.locality  # [n, 1]
        return ((x @ W["ik"]).float() + sal * W["u"].float()).to(torch.bfloat16)

    @torch.no_grad()
    def prefill_chunk(self, tokens: torch.Tensor, start: int, fmt: RecordFormat):
        """Token-local prefill of tokens [n] at positions start.. : records uint8 [layers, n, R]
        and index keys bf16 [layers, n, idx_dim]."""
        c = self.cfg
        pos = torch.arange(start, start + tokens.numel(), device=self.device)
        h = self.embed[tokens]
        recs = torch.empty(c.n_layers, tokens.numel(), fmt.record_bytes, dtype=torch.uint8, device=self.device)
        keys = torch.empty(c.n_layers, tokens.numel(), c.idx_dim, dtype=torch.bfloat16, device=self.device)
        for l, W in enumerate(self.layers):
            x = _rms(h)
            recs[l] = fmt.encode(_rope(x @ W["wkv"], pos, c.rope_dim))
            keys[l] = self._index_key(W, x)
            h = self._mlp(W, h)
        return recs, keys

    @torch.no_grad()
    def decode_logits(self, kv, st: "DecodeState") -> torch.Tensor:
        """One decode step for every row: float32 logits [batch, vocab]. Graph-capturable."""
        c, b = self.cfg, st.batch
        pos = (st.seq_lens - 1).long()  # the newest token's position
        h = self.embed[st.tokens]
        for l, W in enumerate(self.layers):
            x = _rms(h)
            # Followers of a shared indexer wait for their prefetched records here (hisparse).
            kv.before_layer(l, st)
            # The newest token's KV record: into the KV backend before this layer's selection.
            kv.append(l, kv.fmt.encode(_rope(x @ W["wkv"], pos, c.rope_dim)), st)
            if c.anchor(l) == l:
                if c.selection == "sweep":
                    # Window start per row and step; positions stay inside the prompt (< seq_len - 1).
                    span = st.prompt_len - st.k
                    start = (st.step * c.sweep_shift + st.ar * 7919) % max(1, span)
                    st.positions[:, :-1].copy_(start.unsqueeze(1) + st.kpos[:-1].unsqueeze(0))
                    st.positions[:, -1].copy_(st.seq_lens - 1)
                else:
                    st.idx_cache[l].index_put_((st.ar, pos), self._index_key(W, x))
                    # DSA indexer: top-k positions among [0, seq_len).
                    iq = (x @ W["iq"]).view(b, c.idx_heads, c.idx_dim) + (c.locality * W["u"])
                    iw = torch.sigmoid((x @ W["iw"]).float())
                    sc = torch.bmm(iq, st.idx_cache[l].transpose(1, 2))  # [b, idx_heads, max_len]
                    score = (F.relu(sc.float()) * iw.unsqueeze(-1)).sum(1)
                    score = score.masked_fill(st.tpos.unsqueeze(0) >= st.seq_lens.unsqueeze(1), float("-inf"))
                    top_v, top_i = score.topk(st.k, dim=1)
                    st.positions.copy_(top_i.masked_fill(torch.isinf(top_v), -1))
            # (A follower reuses st.positions: its anchor's selection of this step.)
            # Sparse MLA attention over the k selected latent records.
            lat = kv.fmt.decode(kv.gather(l, st))  # [b, k, 576] bf16
            q = _rope((x @ W["wq"]).view(b, c.n_heads, c.latent), pos.unsqueeze(1), c.rope_dim)
            att = torch.bmm(q, lat.transpose(1, 2)).float() * self.scale  # [b, heads, k]
            att = att.masked_fill((st.positions < 0).unsqueeze(1), float("-inf"))
            p = torch.softmax(att, dim=-1).to(torch.bfloat16)
            o = torch.bmm(p, lat[..., :c.kv_lora])  # [b, heads, kv_lora]
            h = h + o.reshape(b, c.n_heads * c.kv_lora) @ W["wo"]
            h = self._mlp(W, h)
        return (_rms(h) @ self.lm_head).float()


# ---- decode state and the two KV backends ----

class DecodeState:
    """The decode step's static inputs (updated in place, so one captured graph serves every step)."""

    def __init__(self, cfg: ModelConfig, batch: int, k: int, max_len: int, prompt_len: int,
                 first_tokens: torch.Tensor, device: torch.device) -> None:
        self.batch, self.k, self.max_len = batch, k, max_len
        self.ar = torch.arange(batch, device=device)
        self.tokens = first_tokens.to(device=device, dtype=torch.long).clone()
        self.seq_lens = torch.full((batch,), prompt_len + 1, dtype=torch.int32, device=device)
        self.positions = torch.full((batch, k), -1, dtype=torch.int32, device=device)
        self.tpos = torch.arange(max_len, dtype=torch.int32, device=device)
        self.prompt_len = prompt_len
        self.step = torch.zeros((), dtype=torch.int64, device=device)  # decode steps so far (sweep)
        self.kpos = torch.arange(k, dtype=torch.int64, device=device)
        # Index keys of the layers that run the indexer (anchors); the sweep selection needs none.
        self.idx_cache = [torch.zeros(batch, max_len, cfg.idx_dim, dtype=torch.bfloat16, device=device)
                          if cfg.anchor(l) == l and cfg.selection != "sweep" else None
                          for l in range(cfg.n_layers)]


class FullKV:
    """Baseline: every layer's records in HBM, [batch, max_len, R]; gather by position."""

    mode = "baseline"

    def __init__(self, cfg: ModelConfig, fmt: RecordFormat, batch: int, max_len: int, device) -> None:
        self.fmt = fmt
        self.cache = [torch.zeros(batch, max_len, fmt.record_bytes, dtype=torch.uint8, device=device)
                      for _ in range(cfg.n_layers)]

    def kv_bytes(self) -> int:
        return sum(t.numel() for t in self.cache)

    def store(self, i: int, start: int, recs: torch.Tensor) -> None:
        for l, cache in enumerate(self.cache):
            cache[i, start:start + recs.shape[1]] = recs[l]

    def before_layer(self, layer: int, st: DecodeState) -> None:
        pass

    def append(self, layer: int, rec: torch.Tensor, st: DecodeState) -> None:
        self.cache[layer].index_put_((st.ar, (st.seq_lens - 1).long()), rec)

    def gather(self, layer: int, st: DecodeState) -> torch.Tensor:
        return self.cache[layer][st.ar.unsqueeze(1), st.positions.clamp(min=0).long()]

    def close(self) -> None:
        self.cache = []


class HisparseKV:
    """hisparse: records in the daemon's host pool; RESOLVE per layer; gather from the slot arena.

    Hooks exercised (docs/INTEGRATION.md): admission (hs_admit, one request a row), prefill staging
    (hs_store), newest-token backup (hs_append), swap-in of the selected records (hs_resolve),
    CUDA-graph buffers (rows / seq_lens / positions / page_table / batch_size are static device
    tensors; batch_size is read by the kernels at run time), release (hs_release).

    Attention reads the arena through RESOLVE's page table (resolve.h, rule 9): each selection's
    record index in the arena viewed as [records, record_stride], so the gather indexes that view
    directly, as a FlashMLA-style sparse kernel would take `indices`; no out_slots. A prefetched
    follower reads its anchor's table from the view advanced by (layer - anchor) * (B + 1)
    records, where its own layer's records lie."""

    mode = "hisparse"
    # RESOLVE launches as the programmatic dependent of the kernel before it (hs_resolve_args
    # launch_flags, ABI 1.9): same results, its launch off the layer's critical path on sm_90+.
    # run_engine.py --no-programmatic turns it off, for a comparison.
    programmatic = True

    def __init__(self, session, cfg: ModelConfig, fmt: RecordFormat, batch: int, prompt_len: int,
                 token_budget: int, device, first_request_id: int = 1, prefetch: bool = False) -> None:
        self.session, self.fmt, self.device = session, fmt, device
        self.cfg = cfg
        # Exact layer-wise prefetch (hs_prefetch): followers of a shared indexer get their anchor's
        # miss plan replayed on a side stream right after the anchor's RESOLVE; each follower
        # waits only for its own copies. Without it, followers run RESOLVE like any layer.
        self.followers = {a: [l for l in range(cfg.n_layers) if l != a and cfg.anchor(l) == a]
                          for a in range(cfg.n_layers) if cfg.anchor(a) == a}
        self.prefetch = prefetch and any(self.followers.values())
        if self.prefetch and list(getattr(session, "layer_anchor", [])) != [cfg.anchor(l) for l in range(cfg.n_layers)]:
            raise ValueError("prefetch needs a session opened with layer_anchor = the model's shared indexers")
        # On a GPU the copies run on their own stream, one event per follower; on the host backend
        # they run in order (nothing to overlap).
        on_gpu = self.prefetch and torch.device(device).type == "cuda"
        self.prefetch_stream = torch.cuda.Stream(device) if on_gpu else None
        self.prefetch_done = {l: torch.cuda.Event() for l in range(cfg.n_layers)} if on_gpu else {}
        self.request_ids = [first_request_id + i for i in range(batch)]
        rows = [session.admit(rid, prompt_len, token_budget).row for rid in self.request_ids]
        self.rows = torch.tensor(rows, dtype=torch.int32, device=device)
        self.batch_size = torch.tensor([batch], dtype=torch.int32, device=device)
        self.page_table = torch.full((batch, session.k), -1, dtype=torch.int32, device=device)
        arena = session.slot_view()
        arena = arena if isinstance(arena, torch.Tensor) else torch.from_numpy(arena)
        self.records = arena.view(-1, arena.shape[-1])  # [rows * layers * (B + 1), record_stride], no copy
        self.slots_per_layer = arena.shape[2]  # B + 1
        self.resolve_events: Optional[List] = None  # [(start, end)] per layer, recorded around RESOLVE

    def kv_bytes(self) -> int:
        return self.session.info().arena_bytes

    def store(self, i: int, start: int, recs: torch.Tensor) -> None:
        n = recs.shape[1]
        self.session.store(self.request_ids[i], recs, start_pos=start, seq_len_after=start + n)

    def before_layer(self, layer: int, st: DecodeState) -> None:
        # A prefetched follower's append and attention wait for its own copies, nothing else.
        if self.prefetch_stream is not None and self.cfg.anchor(layer) != layer:
            torch.cuda.current_stream(self.device).wait_event(self.prefetch_done[layer])

    def append(self, layer: int, rec: torch.Tensor, st: DecodeState) -> None:
        self.session.append(layer, self.rows, st.seq_lens, rec, batch_size=self.batch_size)

    def gather(self, layer: int, st: DecodeState) -> torch.Tensor:
        ev = self.resolve_events[layer] if self.resolve_events else None
        if ev:
            ev[0].record()
        follower = self.cfg.anchor(layer) != layer
        if not (self.prefetch and follower):
            # An anchor, or a follower without prefetch (same selection, its own layer's table).
            self.session.resolve(layer, self.rows, st.seq_lens, st.positions, None, batch_size=self.batch_size,
                                 page_table=self.page_table, programmatic=self.programmatic)
        if self.prefetch and not follower and self.followers.get(layer):
            if self.prefetch_stream is None:
                for f in self.followers[layer]:
                    self.session.prefetch(f)
            else:
                fork = torch.cuda.Event()
                fork.record()
                self.prefetch_stream.wait_event(fork)
                with torch.cuda.stream(self.prefetch_stream):
                    for f in self.followers[layer]:
                        self.session.prefetch(f)
                        self.prefetch_done[f].record(self.prefetch_stream)
        if ev:
            ev[1].record()
        # The table indexes the records of the layer that last ran RESOLVE: this one, or (a
        # prefetched follower) its anchor, whose records lie (layer - anchor) * (B + 1) before.
        shift = (layer - self.cfg.anchor(layer)) * self.slots_per_layer if self.prefetch and follower else 0
        return self.records[shift:][self.page_table.clamp(min=0).long()][..., :self.fmt.record_bytes]

    def close(self) -> None:
        for rid in self.request_ids:
            self.session.release(rid)
        self.request_ids = []
        self.records = None


def measure_link_gbps(device, tries: int = 3, nbytes: int = 1 << 30) -> float:
    """GB/s of one pinned host-to-device copy of nbytes, best of `tries`: the link the misses
    cross, measured in the same run as the figures reported against it (the machines are shared)."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    devbuf = torch.empty_like(host, device=device)
    best = float("inf")
    for _ in range(tries):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        devbuf.copy_(host, non_blocking=True)
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b))
    return nbytes / best / 1e6


# ---- running one mode: prefill, then decode steps (one CUDA graph, replayed) ----

@dataclasses.dataclass
class RunResult:
    mode: str
    logits: torch.Tensor  # [steps, batch, vocab] float32, every step
    tokens: torch.Tensor  # [steps, batch] the token each step generated
    step_ms: List[float]  # per timed step: CUDA events around the graph replay (CPU: wall time)
    graph_ms: List[float]  # probe steps: in-graph events at the step's start and end
    resolve_ms: List[float]  # probe steps: in-graph events around each layer's RESOLVE, summed
    kv_hbm_bytes: int  # KV in HBM: the full caches, or the slot arena (index keys not counted)
    index_hbm_bytes: int
    prefill_s: float
    used_graph: bool
    hits: int = 0
    misses: int = 0


def _timing_event(external: bool):
    try:
        return torch.cuda.Event(enable_timing=True, external=external)
    except TypeError:  # torch without external events (< 2.5)
        return None if external else torch.cuda.Event(enable_timing=True)


@torch.no_grad()
def prefill(model: SparseDecoder, fmt: RecordFormat, prompts: torch.Tensor, idx_cache: List, store,
            chunk: int = 4096) -> float:
    """Token-local prefill of prompts [batch, prompt_len] in chunks: the index keys into idx_cache
    (per layer [batch, max_len, idx_dim], None where the layer runs no indexer) and the records
    through store(row, start, records [layers, n, R]). Returns the seconds it took."""
    import time

    dev = model.device
    t0 = time.perf_counter()
    for i in range(prompts.shape[0]):
        toks = prompts[i].to(dev)
        for start in range(0, prompts.shape[1], chunk):
            recs, keys = model.prefill_chunk(toks[start:start + chunk], start, fmt)
            for l, cache in enumerate(idx_cache):
                if cache is not None:
                    cache[i, start:start + keys.shape[1]] = keys[l]
            store(i, start, recs)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t0


@torch.no_grad()
def run_mode(model: SparseDecoder, fmt: RecordFormat, *, batch: int, prompt_len: int, k: int, steps: int,
             session=None, seed: int = 1, chunk: int = 4096, use_graph: bool = True, probe_steps: int = 16,
             first_request_id: int = 1, prefetch: bool = False) -> RunResult:
    """Prefills `batch` random prompts of prompt_len tokens and decodes `steps` tokens greedily, with
    the KV in HBM (session None) or in hisparse (an open Session whose geometry matches)."""
    import time

    cfg, dev = model.cfg, model.device
    cuda = dev.type == "cuda"
    use_graph = use_graph and cuda
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=gen)
    first = torch.randint(0, cfg.vocab, (batch,), generator=gen)
    max_len = prompt_len + steps + 1
    st = DecodeState(cfg, batch, k, max_len, prompt_len, first, dev)
    if session is None:
        kv = FullKV(cfg, fmt, batch, max_len, dev)
    else:
        kv = HisparseKV(session, cfg, fmt, batch, prompt_len, max_len, dev, first_request_id, prefetch=prefetch)

    # FullKV: into the cache; hisparse: hs_store into the host pool.
    prefill_s = prefill(model, fmt, prompts, st.idx_cache, kv.store, chunk)
    before = session.stats() if session is not None else None

    out_logits = torch.zeros(batch, cfg.vocab, dtype=torch.float32, device=dev)
    logits_hist = torch.empty(steps, batch, cfg.vocab, dtype=torch.float32, device=dev)
    tok_hist = torch.empty(steps, batch, dtype=torch.long, device=dev)
    ev_step = None
    if use_graph and probe_steps > 0:
        ev_step = (_timing_event(True), _timing_event(True))
        if ev_step[0] is None:
            ev_step = None
        elif session is not None:
            kv.resolve_events = [(_timing_event(True), _timing_event(True)) for _ in range(cfg.n_layers)]

    def step():
        if ev_step:
            ev_step[0].record()
        logits = model.decode_logits(kv, st)
        out_logits.copy_(logits)
        st.tokens.copy_(logits.argmax(-1))
        st.seq_lens.add_(1)
        st.step.add_(1)
        if ev_step:
            ev_step[1].record()

    def keep(i):
        logits_hist[i].copy_(out_logits)
        tok_hist[i].copy_(st.tokens)

    step_ms: List[float] = []
    graph_ms: List[float] = []
    resolve_ms: List[float] = []
    if not use_graph:
        for i in range(steps):
            t = time.perf_counter()
            step()
            keep(i)
            if cuda:
                torch.cuda.synchronize(dev)
            step_ms.append(1e3 * (time.perf_counter() - t))
    else:
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            step()  # step 0, eager: warms up cuBLAS and the hisparse kernels on the capture stream
            keep(0)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=side):
                    step()  # recorded, not run
            except RuntimeError:
                if not ev_step:
                    raise
                # Timing events inside the graph were refused: capture again without them.
                ev_step = None
                if session is not None:
                    kv.resolve_events = None
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    step()
        torch.cuda.current_stream(dev).wait_stream(side)
        probes = min(probe_steps, steps - 1) if ev_step else 0
        timed = steps - 1 - probes
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(timed)]
        for i in range(1, 1 + timed):
            evs[i - 1][0].record()
            graph.replay()
            evs[i - 1][1].record()
            keep(i)
        for i in range(1 + timed, steps):
            graph.replay()
            keep(i)
            torch.cuda.synchronize(dev)
            try:
                graph_ms.append(ev_step[0].elapsed_time(ev_step[1]))
                if kv.mode == "hisparse":
                    resolve_ms.append(sum(a.elapsed_time(b) for a, b in kv.resolve_events))
            except RuntimeError:
                pass  # timing events inside graphs unsupported here: no in-graph figures
        torch.cuda.synchronize(dev)
        step_ms = [a.elapsed_time(b) for a, b in evs]
        del graph
    if session is not None:
        session.check_errors()  # data-path errors the kernels flagged, if any (synchronizes)
        after = session.stats()
    result = RunResult(kv.mode, logits_hist, tok_hist, step_ms, graph_ms, resolve_ms, kv.kv_bytes(),
                       sum(t.numel() * t.element_size() for t in st.idx_cache if t is not None), prefill_s,
                       use_graph)
    if session is not None:
        result.hits, result.misses = after.hits - before.hits, after.misses - before.misses
    kv.close()
    return result

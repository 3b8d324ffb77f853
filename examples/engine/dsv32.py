"""One GPU's share of a DeepSeek-V3.2-class model (random weights), for the serving benchmark.

The deployment modelled is SGLang's recommended HiSparse setup for DeepSeek-V3.2 / GLM-5 on an
8-GPU node: data-parallel attention (each GPU decodes its own batch with all attention weights)
and expert parallelism 8 (each GPU holds 32 of the 256 routed experts of every MoE layer). From
the public DeepSeek-V3.2 config: hidden 7168; MLA with q_lora 1536, kv_lora 512, rope 64, 128
heads of 128 + 64 (value 128); the DSA indexer with 64 heads of 128 over fp8 keys with one float32
scale (132 B a token and layer, in HBM in both modes) and top-k 2048; MoE with 256 routed experts
of intermediate 2048 (8 active) and one shared expert; the first 3 of 61 layers dense (MLP
18432); vocabulary 129280. Weights are fp8 e4m3 with one scale per tensor (the absorbed MLA
up-projections W_UK / W_UV, the router and the indexer's head weights are bf16, as in SGLang).

What one decode step does per layer, for a batch of b rows (`Model.step`):
  proj      two fp8 GEMMs (_scaled_mm), fused as SGLang fuses them: x -> [q_a | kv_a | indexer k] and
            q_a -> [q_b | indexer q]; norms, rotary, the index key's fp8 quantization
  indexer   scores of every earlier position: sum_h w_h ReLU(q_h . k_t) * scale_t (one Triton
            kernel reading the 132-B keys once), then top-2048 (torch.topk, unsorted; Model.topk
            "hisparse": hisparse.topk, a cluster of thread blocks a row)
  resolve   hisparse only: RESOLVE makes the k selected records resident in the slot arena
  attention sparse MLA over the k records, absorbed form: one Triton kernel that reads each
            selected 656-B record by index (FlashMLA's fp8 layout, dequantized in registers),
            softmax over k, then W_UV (bf16 bmm)
  moe       router + top-8, the shared expert on the b own tokens, and this GPU's expert share: the
            tokens of all 8 DP ranks routed to its 32 experts, 8b (token, expert) rows at b per
            rank, in a fixed balanced layout (as EPLB aims for); two grouped fp8 GEMMs. The
            all-to-all that would carry those rows between GPUs is NOT simulated: the 8b rows are
            this GPU's own tokens, each repeated for its 8 picks
  dense MLP for the dense layers.
Then the final norm and the LM head. Models of fewer layers (--layers L) are exact slices: L
layers of the real shapes, the dense ones in proportion (round(3L/61)), and the vocabulary scaled
by L/61 so that the LM head keeps its share of the weight bytes; weights, KV and per-step time then
all scale with L (the HBM budget is scaled the same way by the benchmark).

On a CPU (the smoke mode) the same code runs with bf16 weights, torch reference kernels in place
of the Triton ones, and tiny dimensions (SMOKE). The indexer and attention kernels live in
sparse_kernels.py, the KV backends (full HBM, hisparse, hybrid) in kv_backends.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
from typing import Dict, List, Optional

import hisparse
import torch
import torch.nn.functional as F

import expert_gemm
from engine import Bf16Records, Fp8Records, RecordFormat  # one definition of the record layouts
from sparse_kernels import Kernels


@dataclasses.dataclass
class V32Config:
    layers: int = 61
    full_layers: int = 61  # the real model's depth: sizes that scale with depth scale by layers / full_layers
    full_dense_layers: int = 3
    hidden: int = 7168
    q_lora: int = 1536
    kv_lora: int = 512
    rope: int = 64
    heads: int = 128
    nope_head: int = 128
    v_head: int = 128
    idx_heads: int = 64
    idx_dim: int = 128
    topk: int = 2048
    experts: int = 256
    active: int = 8
    ep: int = 8
    moe_inter: int = 2048
    shared_experts: int = 1
    dense_inter: int = 18432
    full_vocab: int = 129280
    # How strongly each token's index key carries a salience that every query favours; sets how much
    # consecutive selections overlap (0: pure query noise, the selection changes every step).
    locality: float = 2.0
    seed: int = 0

    @property
    def latent(self) -> int:
        return self.kv_lora + self.rope

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep

    @property
    def dense_layers(self) -> int:
        return int(round(self.full_dense_layers * self.layers / self.full_layers))

    @property
    def vocab(self) -> int:
        v = int(math.ceil(self.full_vocab * self.layers / self.full_layers))
        return (v + 127) // 128 * 128

    @property
    def index_key_bytes(self) -> int:  # fp8 key + one float32 scale
        return self.idx_dim + 4


@dataclasses.dataclass
class Overlap:
    """Hiding RESOLVE's misses under attention, or under the indexer (hisparse mode; bench/RESULTS.md,
    issue 44).

    A layer's RESOLVE needs its selections and attention needs RESOLVE's records, so for one batch
    the fetch sits on the critical path. Cut into row chunks it need not: chunk c's RESOLVE runs on
    a side stream (or beside, on one stream) while chunk c-1's sparse attention runs, and only the
    first chunk's fetch stays exposed, unless it runs beside the indexer of later rows
    (indexer_chain). The indexer and top-k run on the whole batch unless indexer_chain cuts them
    too; then each row's scores and selection are the same bits as in one launch (one tile function;
    the top-k per row independent of the rows beside it, held by test_serve_bench). Every attention
    chunk uses the whole batch's split count. So each row's logits stay bit-identical to full
    HBM's. max_blocks is RESOLVE's budget of thread blocks (hs_resolve_args.max_blocks; 0: the whole
    GPU), so that attention keeps the other SMs."""

    chunks: int = 4
    min_rows: int = 4  # rows a chunk at least: fewer chunks at small batches (batch < 2 * min_rows: none)
    max_blocks: int = 0
    helpers: int = -1  # >= 0: each chunk's budget is its rows + this many (one planner a row), not max_blocks
    priority: int = -1  # the side stream's (torch: lower is higher; -1 ahead of attention's blocks)
    growth: float = 1.0  # each chunk this many times the one before: a small first chunk, whose fetch is exposed
    side_stream: bool = True  # False: the chunks in order on the main stream (what the chunking alone costs)
    waves: bool = False  # chunks of whole waves of attention's grid (the remainder first): no tail wave per chunk
    single: bool = False  # one range, on the side stream all the same (what the fork and join alone cost)
    # One stream, no fork: range c+1's RESOLVE launched beside range c's attention kernel
    # (hs_resolve_args.launch_flags = HS_RESOLVE_LAUNCH_BESIDE, ABI 1.14), which lets it start at once
    # (griddepcontrol.launch_dependents); the captured graph stays one chain.
    beside: bool = False
    # With beside, j > 0: the first j ranges' RESOLVE run beside the indexer of the rows after them,
    # not beside attention (the first range's would otherwise run alone). The indexer and top-k run
    # in j + 1 segments: ranges 0 .. j-1 one by one, then every row after them. Segment c + 1's
    # indexer runs on a grid resident at once (indexer_ctas programs an SM that RESOLVE's budget
    # leaves), which asks for its dependents at its start, and range c's RESOLVE is launched beside
    # it; segment c + 1's top-k then waits for both. Attention starts with the rows of those j ranges
    # in one launch, range j's RESOLVE beside it, and goes on range by range as plain beside does.
    # j = 1 covers the one RESOLVE that nothing hid; j = chunks - 1 ("chained") hides all but the
    # last under indexers, which stay large under a FlashMLA-class attention (bench/serve_model.py).
    # Per row the indexer's arithmetic is the same in every segment, and the top-k's output for a row
    # does not depend on the rows beside it in the call (hisparse.topk's contract; for torch.topk,
    # measured: test_serve_bench holds both).
    indexer_chain: int = 0
    # With indexer_chain: range c's RESOLVE goes first, on the budget, letting its dependents start at
    # once (HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS), and segment c + 1's indexer is the grid kernel launched
    # as its programmatic dependent: it runs at its full rate on the SMs the budget leaves, where the
    # resident grid that RESOLVE otherwise runs beside took 2-3 times as long (bench/RESULTS.md).
    resolve_first: bool = False
    indexer_ctas: int = 1
    indexer_unroll: int = 1  # tiles each of that indexer's programs takes at a time (their loads in flight together)
    ascending: bool = False  # the ranges' sizes in ascending order: the largest last, with nothing beside it
    # The warps of each of a budgeted RESOLVE's blocks that fetch (hs_resolve_args.consumer_warps,
    # 1-16; 0: the library's choice, which on a budget gives the grid the whole GPU's consumers).
    consumer_warps: int = 0
    # With beside: range c+1's RESOLVE runs under all of range c's attention, not only beside its
    # split kernel. RESOLVE is launched first, an ordinary launch that lets its dependents start at
    # once (HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS), and range c's attention follows as a chain of
    # programmatic dependents (Kernels.sparse_mla's chained): its first kernel never waits for that
    # RESOLVE (it reads range c's records, resolved before), each later one waits for the programs of
    # the one before through counters, since griddepcontrol.wait would wait for RESOLVE too. What
    # follows (range c+1's RESOLVE or attention) is an ordinary launch, which starts only after every
    # grid before it, that RESOLVE included (both measured on the H100: bench/RESULTS.md). The
    # attention query is made before the indexer, so that nothing but RESOLVE sits between the last
    # top-k and attention.
    under: bool = False
    # The step's append (hs_append: its records into the host pool and the newest-token slots) is ~11
    # us a layer on the path of every hisparse schedule (bench/RESULTS.md, "Where the `under` step's
    # time went"), though only RESOLVE reads what it writes. With append_early it is launched last
    # before the indexer (after the index keys' writes and, with under, the attention query), and the
    # indexer (its grid kernel over range 0, or over the batch) as its programmatic dependent: the
    # append lets its dependents start at once (AppendKernel), so the indexer, which reads nothing it
    # writes, runs beside it; its last program waits for it, so the top-k after finds both done.
    # (The append on a side stream, forked and joined before the top-k, lost 0.5-0.6 ms a step
    # instead: bench/RESULTS.md, "The top-k's guess, and the append beside the indexer".)
    append_early: bool = False

    # pwN: after each layer's attention, the next layer's host records of the rows of ranges N and
    # after are read ahead (hs_prewarm: one read a 64 KiB granule, the GPU's translations made before
    # that layer's RESOLVE needs them), on a side stream beside the MoE, where the GPU translates no
    # host memory; joined back at the step's end, since it writes nothing. -1: none. pbB: its thread
    # blocks (0: an eighth of the SMs), pgK its granule in KiB. bench/RESULTS.md, "Translations made
    # ahead, in the step".
    prewarm: int = -1
    prewarm_blocks: int = 0
    prewarm_granule_kib: int = 0  # pgK: one read a K KiB (0: hs_prewarm's 64)
    # pa: the read ahead runs beside the last range's split attention on the one stream instead (a
    # programmatic dependent of that kernel, HS_RESOLVE_LAUNCH_BESIDE; the combine waits for both),
    # reading one granule in psS (prewarm_stride), so that it fits beside that kernel.
    prewarm_attention: bool = False
    prewarm_stride: int = 1

    @staticmethod
    def parse(spec: str, min_rows: int = 4) -> "Overlap":
        """"4", "4/b32", "4/b32/p0/g1.8", "4/h16", "4/w", "4/main", "4/b16/beside", "4/b16/beside/ix2/asc":
        chunks, then b (max_blocks), h (helpers), p (priority), g (growth), w (whole waves), main (no side
        stream), one (a single range, forked), beside (one stream: each RESOLVE beside the attention before
        it), ixJ (with beside: the first J ranges' RESOLVE beside the indexer of the rows after them; ix:
        1), icN (that indexer's programs an SM; 1), iuN (the tiles each of its programs takes at a time; 1),
        asc (the ranges' sizes ascending), cwN (consumer_warps of each budgeted RESOLVE block, 0-16; 0), rf
        (with ix: each RESOLVE first, the next segment's grid indexer beside it), under (with beside: each
        RESOLVE under all of the attention of the range before it), ae (the append last before the
        indexer, which runs beside it), pwN (the next layer's records of ranges N.. read ahead beside
        the MoE), pbB (that read's thread blocks), pgK (its granule, KiB), pa (with pw: beside the last
        range's attention instead, on the one stream), psS (one granule in S read)."""
        words = spec.split("/")
        o = Overlap(chunks=int(words[0]), min_rows=min_rows)
        for w in words[1:]:
            if w == "main":
                o.side_stream = False
            elif w == "beside":
                o.beside, o.side_stream = True, False
            elif w == "w":
                o.waves = True
            elif w == "one":
                o.single = True
            elif w == "asc":
                o.ascending = True
            elif w == "rf":
                o.resolve_first = True
            elif w == "under":
                o.under = True
            elif w == "ae":
                o.append_early = True
            elif w == "pa":
                o.prewarm_attention = True
            elif w[:2] in ("pw", "pb", "pg", "ps") and w[2:].isdigit() and (w[:2] != "ps" or int(w[2:]) >= 1):
                setattr(o, {"pw": "prewarm", "pb": "prewarm_blocks", "pg": "prewarm_granule_kib",
                            "ps": "prewarm_stride"}[w[:2]], int(w[2:]))
            elif w[:2] == "cw" and w[2:].isdigit() and int(w[2:]) <= 16:
                o.consumer_warps = int(w[2:])
            elif w[:2] in ("ix", "ic", "iu") and (w[2:] == "" or w[2:].isdigit()) and int(w[2:] or 1) >= 1:
                setattr(o, {"ix": "indexer_chain", "ic": "indexer_ctas", "iu": "indexer_unroll"}[w[:2]], int(w[2:] or 1))
            elif w[:1] in ("b", "p", "h") and w[1:].lstrip("-").isdigit():
                setattr(o, {"b": "max_blocks", "p": "priority", "h": "helpers"}[w[0]], int(w[1:]))
            elif w[:1] == "g":
                o.growth = float(w[1:])
            else:
                raise ValueError(f"overlap spec {spec!r}: unknown part {w!r}")
        if o.indexer_chain and not o.beside:
            raise ValueError(f"overlap spec {spec!r}: ix needs beside (a RESOLVE launched beside the indexer)")
        if o.under and not o.beside:
            raise ValueError(f"overlap spec {spec!r}: under needs beside (one stream)")
        if o.resolve_first and not o.indexer_chain:
            raise ValueError(f"overlap spec {spec!r}: rf needs ix (the indexer that runs beside RESOLVE)")
        if (o.prewarm_attention or o.prewarm_stride != 1) and o.prewarm < 0:
            raise ValueError(f"overlap spec {spec!r}: pa and ps need pw (which rows to read ahead)")
        if o.prewarm_attention and not o.beside:
            raise ValueError(f"overlap spec {spec!r}: pa needs beside (one stream)")
        if o.indexer_chain and o.max_blocks <= 0 and o.helpers < 0:
            # A RESOLVE block takes a whole SM (docs/INTEGRATION.md, "The budget"): the indexer leaves
            # the budget's SMs idle, so there must be one.
            raise ValueError(f"overlap spec {spec!r}: ix needs a budget of blocks (bN or hN)")
        return o

    def budget(self, rows: int) -> int:
        """RESOLVE's blocks for a range of `rows` rows beside other work: rows + helpers, else
        max_blocks (0: the whole GPU)."""
        return rows + self.helpers if self.helpers >= 0 else self.max_blocks

    @property
    def tag(self) -> str:
        parts = [str(self.chunks)] + ([f"b{self.max_blocks}"] if self.max_blocks else []) + \
            ([f"h{self.helpers}"] if self.helpers >= 0 else []) + \
            ([f"p{self.priority}"] if self.priority != -1 else []) + ([f"g{self.growth:g}"] if self.growth != 1 else []) + \
            (["w"] if self.waves else []) + (["one"] if self.single else []) + \
            (["beside"] if self.beside else [] if self.side_stream else ["main"]) + \
            ([f"ix{self.indexer_chain}"] if self.indexer_chain else []) + (["rf"] if self.resolve_first else []) + \
            ([f"ic{self.indexer_ctas}"] if self.indexer_ctas != 1 else []) + \
            ([f"iu{self.indexer_unroll}"] if self.indexer_unroll != 1 else []) + (["asc"] if self.ascending else []) + \
            ([f"cw{self.consumer_warps}"] if self.consumer_warps else []) + (["under"] if self.under else []) + \
            (["ae"] if self.append_early else []) + ([f"pw{self.prewarm}"] if self.prewarm >= 0 else []) + \
            ([f"pb{self.prewarm_blocks}"] if self.prewarm_blocks else []) + \
            ([f"pg{self.prewarm_granule_kib}"] if self.prewarm_granule_kib else []) + \
            (["pa"] if self.prewarm_attention else []) + \
            ([f"ps{self.prewarm_stride}"] if self.prewarm_stride != 1 else [])
        return "_".join(parts)

    def ranges(self, M: int, wave_rows: int = 1) -> List[tuple]:
        """Row ranges [a, b) of an M-row batch (sizes growing by `growth`, each of at least min_rows),
        one range when chunking would not pay. With waves, every range but the first is a whole number
        of wave_rows (the rows whose attention fills the GPU once) and the first takes the remainder,
        so attention in ranges runs no more waves than over the whole batch. With ascending, the same
        sizes smallest first."""
        cut = self._cut(M, wave_rows)
        if not self.ascending:
            return cut
        edges = [0]
        for s in sorted(b - a for a, b in cut):
            edges.append(edges[-1] + s)
        return list(zip(edges, edges[1:]))

    def _cut(self, M: int, wave_rows: int) -> List[tuple]:
        if self.single:
            return [(0, M)]
        if self.waves and M >= 2 * max(1, self.min_rows):
            q = max(1, wave_rows)
            first = M % q or min(q, M)
            waves = (M - first) // q
            rest = max(1, min(self.chunks - 1, waves))
            sizes = [first] + [q * (waves * (i + 1) // rest - waves * i // rest) for i in range(rest)]
            edges = [0]
            for s in sizes:
                if s > 0:
                    edges.append(edges[-1] + s)
            return list(zip(edges, edges[1:]))
        n = max(1, min(self.chunks, M // max(1, self.min_rows)))
        weights = [self.growth ** i for i in range(n)]
        edges = [0] + [round(M * sum(weights[:i + 1]) / sum(weights)) for i in range(n)]
        for i in range(1, n):  # every chunk at least min_rows (and one row)
            edges[i] = max(edges[i], edges[i - 1] + max(1, min(self.min_rows, M // n)))
        edges = [min(e, M) for e in edges]
        return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


@dataclasses.dataclass
class ChunkPlan:
    """One step's overlap schedule (Model._chunk_plan): (first row, end row, device batch size) triples.
    chunks: the overlap's ranges, one RESOLVE each; segments: the indexer's and top-k's parts when
    Overlap.indexer_chain = j > 0 (ranges 0 .. j-1, then every row after them), else none (one
    launch each); attend: attention's launches in order (with a chain, the rows of ranges 0 .. j-1
    first, then ranges j ..), each one's successor's RESOLVE beside it when Overlap.beside."""

    chunks: List[tuple]
    segments: List[tuple]
    attend: List[tuple]


SMOKE = dict(hidden=256, q_lora=128, heads=4, nope_head=32, v_head=32, idx_heads=4, idx_dim=32, topk=16,
             experts=16, ep=8, moe_inter=64, dense_inter=128, full_vocab=512, full_layers=2, full_dense_layers=1,
             layers=2)


# ---- KV records: the example engine's layouts (FlashMLA's fp8, 656 B, or plain bf16, 1152 B) ----

def record_format(name: str, cfg: V32Config) -> RecordFormat:
    """engine.py's record format for this model's latent (512 + 64); .fp8 tells the kernels which."""
    if name not in ("fp8", "bf16"):
        raise ValueError(f"records must be fp8 or bf16, got {name!r}")
    dims = types.SimpleNamespace(latent=cfg.latent, kv_lora=cfg.kv_lora, rope_dim=cfg.rope)
    fmt = (Fp8Records if name == "fp8" else Bf16Records)(dims)
    fmt.fp8 = name == "fp8"
    return fmt


# ---- weights ----

class Linear:
    """y = x W^T. fp8 e4m3 W [out, in] with one float32 scale (torch._scaled_mm, activations cast to
    fp8 with scale 1: they are normalised), or bf16 on a CPU."""

    def __init__(self, out_f: int, in_f: int, gen: torch.Generator, device, fp8: bool) -> None:
        self.fp8 = fp8
        self.scale = 1.0 / math.sqrt(in_f)
        w = torch.randn(out_f, in_f, generator=gen, device=device, dtype=torch.float32)
        if fp8:
            self.w = w.clamp(-448, 448).to(torch.float8_e4m3fn)
            self.sa = torch.ones((), device=device, dtype=torch.float32)
            self.sb = torch.full((), self.scale, device=device, dtype=torch.float32)
        else:
            self.w = (w * self.scale).to(torch.bfloat16)
        del w

    @property
    def nbytes(self) -> int:
        return self.w.numel() * self.w.element_size()

    PAD_M = 1  # rows of an fp8 GEMM are padded to a multiple of this (probe_fp8_rows sets it)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8:
            return _mm(x.clamp(-448, 448).to(torch.float8_e4m3fn), self)
        return x @ self.w.t()


def _mm(xq: torch.Tensor, lin: "Linear") -> torch.Tensor:
    """fp8 rows xq [m, in] times lin's weights (rows padded as Linear.PAD_M asks)."""
    m = xq.shape[0]
    if m % Linear.PAD_M:
        xq = torch.cat([xq, xq.new_zeros(Linear.PAD_M - m % Linear.PAD_M, xq.shape[1])])
    y = torch._scaled_mm(xq, lin.w.t(), scale_a=lin.sa, scale_b=lin.sb, out_dtype=torch.bfloat16)
    return y[:m] if y.shape[0] != m else y


def probe_fp8_rows(device) -> int:
    """Whether torch._scaled_mm takes any row count here (else rows are padded to 16)."""
    w = torch.zeros(32, 32, device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    try:
        torch._scaled_mm(w[:1], w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        Linear.PAD_M = 1
    except RuntimeError:
        Linear.PAD_M = 16
    return Linear.PAD_M


class Experts:
    """This GPU's routed experts: w13 [E, 2I, H] and w2 [E, H, I], applied to x [E, cap, H] (expert e
    takes x[e]). fp8 on a GPU by one of three GEMMs (gemm): "loop" (one torch._scaled_mm an expert),
    "grouped" (torch._scaled_grouped_mm) or "triton" (expert_gemm.grouped_fp8 at triton_config);
    choose_gemm keeps the fastest that agrees with the loop. bf16 bmm on a CPU."""

    def __init__(self, E: int, inter: int, hidden: int, gen, device, fp8: bool) -> None:
        self.E, self.inter, self.hidden, self.fp8 = E, inter, hidden, fp8
        self.w13 = [Linear(2 * inter, hidden, gen, device, fp8) for _ in range(E)]
        self.w2 = [Linear(hidden, inter, gen, device, fp8) for _ in range(E)]
        if fp8:
            self.w13_all = torch.stack([x.w for x in self.w13])
            self.w2_all = torch.stack([x.w for x in self.w2])
            for i in range(E):  # one copy of each weight, in the stacked tensors
                self.w13[i].w, self.w2[i].w = self.w13_all[i], self.w2_all[i]
        self.gemm = "loop"  # set by choose_gemm
        self.triton_config = expert_gemm.CONFIGS[0]

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in self.w13 + self.w2)

    GEMMS = ("loop", "grouped", "triton")

    def choose_gemm(self, cap: int, ways=GEMMS) -> Dict[str, object]:
        """Times one expert pass at cap rows an expert each of `ways` (the loop, always; _scaled_grouped_mm
        where it runs here; the Triton kernel at each of expert_gemm.CONFIGS), drops a way whose result
        does not agree with the loop's, and keeps the fastest. Returns the times (ms) and the choice."""
        out: Dict[str, object] = dict(loop_ms=None, grouped_ms=None, triton_ms=None)
        if not self.fp8:
            return out
        x = torch.randn(self.E, cap, self.hidden, device=self.w13_all.device).to(torch.bfloat16)

        def timed():
            for _ in range(2):
                self(x)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(10):
                self(x)
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 10

        def tried(gemm: str, config=None) -> Optional[float]:
            """The pass's time the given way, None where it fails or disagrees with the loop's. Two GEMMs
            with an fp8 requantization between them: another summation order flips a few fp8 roundings
            of the activation, so elementwise closeness is too strict; the relative error of the whole
            pass is what says it computes the same thing (recorded in out["rel_err"])."""
            self.gemm = gemm
            if config is not None:
                self.triton_config = config
            try:
                y = self(x).float()
                err = float((y - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))
                out.setdefault("rel_err", {})[f"{gemm} {expert_gemm.config_tag(config) if config else ''}"] = \
                    round(err, 6)
                if not err <= 1e-2:
                    print(f"expert GEMM {gemm} {config or ''} disagrees with the loop: relative error {err:.3g}")
                    return None
                return round(timed(), 4)
            except Exception as e:  # noqa: BLE001 - any failure means: not this way
                print(f"expert GEMM {gemm} {config or ''} unusable here ({type(e).__name__}: {str(e)[:120]})")
                return None

        self.gemm = "loop"
        ref = self(x)
        times = {("loop", None): round(timed(), 4)}
        if "grouped" in ways and hasattr(torch, "_scaled_grouped_mm"):
            times[("grouped", None)] = tried("grouped")
        if "triton" in ways and expert_gemm.available():
            for config in expert_gemm.CONFIGS:
                times[("triton", config)] = tried("triton", config)
            out["triton_configs_ms"] = {expert_gemm.config_tag(c): t for (g, c), t in times.items() if g == "triton"}
        for (g, _), t in times.items():
            if t is not None and (out[f"{g}_ms"] is None or t < out[f"{g}_ms"]):
                out[f"{g}_ms"] = t
        (self.gemm, config), _ = min(((k, t) for k, t in times.items() if t is not None), key=lambda kt: kt[1])
        if config is not None:
            self.triton_config = config
        out["gemm"] = self.gemm
        out["grouped"] = self.gemm == "grouped"  # the field earlier runs recorded
        return out

    def _gemm_all(self, xq: torch.Tensor, ws: torch.Tensor, scale: float, cap: int) -> torch.Tensor:
        if self.gemm == "triton":
            return expert_gemm.grouped_fp8(xq, ws, scale, cap, self.triton_config)
        E = ws.shape[0]
        offs = torch.arange(1, E + 1, device=xq.device, dtype=torch.int32) * cap
        sa = torch.ones(xq.shape[0], device=xq.device, dtype=torch.float32)
        sb = torch.full((E, ws.shape[1]), scale, device=xq.device, dtype=torch.float32)
        return torch._scaled_grouped_mm(xq, ws.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        E, cap, H = x.shape
        if not self.fp8:
            gu = torch.bmm(x, torch.stack([w.w for w in self.w13]).transpose(1, 2))
            a = F.silu(gu[..., :self.inter].float()) * gu[..., self.inter:].float()
            return torch.bmm(a.to(torch.bfloat16), torch.stack([w.w for w in self.w2]).transpose(1, 2))
        xq = x.reshape(E * cap, H).clamp(-448, 448).to(torch.float8_e4m3fn)
        if self.gemm != "loop":
            gu = self._gemm_all(xq, self.w13_all, self.w13[0].scale, cap).view(E, cap, 2 * self.inter)
        else:
            gu = torch.stack([_mm(xq[e * cap:(e + 1) * cap], self.w13[e]) for e in range(E)])
        a = (F.silu(gu[..., :self.inter].float()) * gu[..., self.inter:].float()).to(torch.bfloat16)
        aq = a.reshape(E * cap, self.inter).clamp(-448, 448).to(torch.float8_e4m3fn)
        if self.gemm != "loop":
            return self._gemm_all(aq, self.w2_all, self.w2[0].scale, cap).view(E, cap, H)
        return torch.stack([_mm(aq[e * cap:(e + 1) * cap], self.w2[e]) for e in range(E)])


def _rms(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotates x [M, ..., 64] by position pos [M]."""
    half = x.shape[-1] // 2
    inv = 1.0 / (10000.0 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = pos.float().view(-1, *([1] * (x.dim() - 2)), 1) * inv
    cos, sin = torch.cos(ang), torch.sin(ang)
    r1, r2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([r1 * cos - r2 * sin, r1 * sin + r2 * cos], dim=-1).to(torch.bfloat16)


class Layer:
    def __init__(self, cfg: V32Config, dense: bool, gen, device, fp8: bool) -> None:
        c = cfg
        self.cfg, self.dense = cfg, dense
        # Fused as SGLang fuses them: everything that reads x (q_a, kv_a, the indexer's k) is one GEMM,
        # everything that reads q_a (q_b, the indexer's q) another.
        self.w_x = Linear(c.q_lora + c.latent + c.idx_dim, c.hidden, gen, device, fp8)
        self.w_qa = Linear(c.heads * (c.nope_head + c.rope) + c.idx_heads * c.idx_dim, c.q_lora, gen, device, fp8)
        bf = dict(device=device, dtype=torch.float32)
        self.w_uk = (torch.randn(c.heads, c.nope_head, c.kv_lora, generator=gen, **bf) / math.sqrt(c.nope_head)).to(torch.bfloat16)
        self.w_uv = (torch.randn(c.heads, c.kv_lora, c.v_head, generator=gen, **bf) / math.sqrt(c.kv_lora)).to(torch.bfloat16)
        self.wo = Linear(c.hidden, c.heads * c.v_head, gen, device, fp8)
        self.w_idx_heads = (torch.randn(c.idx_heads, c.hidden, generator=gen, **bf) / math.sqrt(c.hidden)).to(torch.bfloat16)
        u = torch.randn(c.idx_dim, generator=gen, **bf)
        self.u = (u / u.norm()).to(torch.bfloat16)
        if dense:
            self.w13 = Linear(2 * c.dense_inter, c.hidden, gen, device, fp8)
            self.w2 = Linear(c.hidden, c.dense_inter, gen, device, fp8)
        else:
            self.router = (torch.randn(c.experts, c.hidden, generator=gen, **bf) / math.sqrt(c.hidden)).to(torch.bfloat16)
            self.shared13 = Linear(2 * c.moe_inter * c.shared_experts, c.hidden, gen, device, fp8)
            self.shared2 = Linear(c.hidden, c.moe_inter * c.shared_experts, gen, device, fp8)
            self.experts = Experts(c.local_experts, c.moe_inter, c.hidden, gen, device, fp8)

    def nbytes(self) -> Dict[str, int]:
        t = lambda x: x.numel() * x.element_size()  # noqa: E731
        c = self.cfg
        per_x, per_qa = self.w_x.nbytes // self.w_x.w.shape[0], self.w_qa.nbytes // self.w_qa.w.shape[0]
        idx = c.idx_dim * per_x + c.idx_heads * c.idx_dim * per_qa
        out = dict(attention=self.w_x.nbytes + self.w_qa.nbytes - idx + self.wo.nbytes + t(self.w_uk) + t(self.w_uv),
                   indexer=idx + t(self.w_idx_heads))
        if self.dense:
            out["mlp"] = self.w13.nbytes + self.w2.nbytes
        else:
            out["mlp"] = t(self.router) + self.shared13.nbytes + self.shared2.nbytes + self.experts.nbytes
        return out


class Model:
    """The weights and one decode step (graph-capturable; `kv` supplies the KV backend)."""

    def __init__(self, cfg: V32Config, device, fp8_weights: bool, kernels: Kernels) -> None:
        self.cfg, self.device, self.kernels = cfg, torch.device(device), kernels
        if fp8_weights:
            probe_fp8_rows(self.device)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.layers = [Layer(cfg, l < cfg.dense_layers, gen, self.device, fp8_weights) for l in range(cfg.layers)]
        bf = dict(device=self.device, dtype=torch.float32)
        self.embed = torch.randn(cfg.vocab, cfg.hidden, generator=gen, **bf).to(torch.bfloat16)
        self.lm_head = (torch.randn(cfg.vocab, cfg.hidden, generator=gen, **bf) / math.sqrt(cfg.hidden)).to(torch.bfloat16)
        self.sm_scale = 1.0 / math.sqrt(cfg.nope_head + cfg.rope)
        self.idx_fp8 = fp8_weights  # index keys and queries in fp8 on the GPU, bf16 on a CPU
        self.events: Optional[List] = None  # probe mode: [(part, start, end)] recorded inside the step
        self.overlap: Optional[Overlap] = None  # hisparse mode: RESOLVE in row chunks beside attention
        self._side = None  # the overlap's side stream (CUDA), made once, before any capture
        self._pw_side = None  # the prewarm's side stream (Overlap.prewarm), made the same way
        self._idx_count = None  # Overlap.under: the chained indexer's count of finished programs (int32 [1])
        self._chunk_consts: Dict[tuple, tuple] = {}  # row ranges -> (starts, sizes) on the device
        # The top-k: "torch" (torch.topk) or "hisparse" (hs_topk: a cluster of thread blocks a row,
        # ascending positions, a row's list a function of its scores alone; 1.6-2x faster a call
        # than torch.topk up to 29 rows of 128k on an H100, bench/RESULTS.md, "A top-k of a cluster
        # a row"). Both modes of a run use the same one, so their logits stay bit-identical.
        self.topk = "torch"

    def weight_bytes(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for layer in self.layers:
            for key, v in layer.nbytes().items():
                out[key] = out.get(key, 0) + v
        out["lm_head"] = self.lm_head.numel() * 2
        return out

    def _part(self, name: str):
        """Context for one part of the step: timing events around it in probe mode."""
        model = self

        class _P:
            def __enter__(self):
                if model.events is not None:
                    self.ev = (torch.cuda.Event(enable_timing=True, external=True),
                               torch.cuda.Event(enable_timing=True, external=True))
                    self.ev[0].record()

            def __exit__(self, *exc):
                if model.events is not None:
                    self.ev[1].record()
                    model.events.append((name, self.ev[0], self.ev[1]))

        return _P()

    def _index_key(self, L: Layer, kx: torch.Tensor, sal: torch.Tensor):
        """Index key of the newest tokens (kx: their key projection) + salience along u, fp8 with a per-token scale."""
        k = _rms(kx).float() + (self.cfg.locality * sal).unsqueeze(-1) * L.u.float()
        return quantize_keys(k, self.idx_fp8)

    def _moe(self, L: Layer, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        M = x.shape[0]
        if L.dense:
            gu = L.w13(x)
            return L.w2((F.silu(gu[:, :c.dense_inter].float()) * gu[:, c.dense_inter:].float()).to(torch.bfloat16))
        logits = (x @ L.router.t()).float()
        top_w, _ = torch.sigmoid(logits).topk(c.active, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True) * 2.5
        gu = L.shared13(x)
        shared = L.shared2((F.silu(gu[:, :c.moe_inter].float()) * gu[:, c.moe_inter:].float()).to(torch.bfloat16))
        # This GPU's expert share: 8 DP ranks x M tokens x 8 picks / 8 EP ranks = 8M (token, expert) rows;
        # row a = 8 i + j (own token i's pick j) goes to local expert a mod E: cap rows per expert.
        E = c.local_experts
        n = M * c.active
        cap = (n + E - 1) // E
        rows = x.repeat_interleave(c.active, dim=0)
        if cap * E != n:
            rows = torch.cat([rows, rows.new_zeros(cap * E - n, c.hidden)])
        y = L.experts(rows.view(cap, E, c.hidden).transpose(0, 1).contiguous())  # [E, cap, H]
        y = y.transpose(0, 1).reshape(cap * E, c.hidden)[:n].view(M, c.active, c.hidden)
        return shared + (y.float() * top_w.unsqueeze(-1)).sum(1).to(torch.bfloat16)

    def overlap_ranges(self, overlap: Overlap, M: int) -> List[tuple]:
        """overlap's row ranges of an M-row batch on this model's attention (its wave: the rows whose
        sparse MLA grid, at the whole batch's split count, fills the GPU once; beside, the SMs that
        RESOLVE's budget leaves it)."""
        c = self.cfg
        splits = self.kernels.mla_splits(M, c.heads, c.topk)
        blocks = (c.heads // min(self.kernels.mla_block_h, c.heads)) * splits
        sms = self.kernels.sms - (overlap.max_blocks if overlap.beside and overlap.helpers < 0 else 0)
        return overlap.ranges(M, wave_rows=max(1, sms // blocks))

    def _chunk_plan(self, kv, st, M: int):
        """The overlap's schedule of this step (ChunkPlan), or None: no overlap. Every range of rows
        gets its batch size on the device (rows of the range below *st.batch_size, read at run time
        like the whole batch's)."""
        if self.overlap is None or not hasattr(kv, "resolve_rows"):
            return None
        ranges = self.overlap_ranges(self.overlap, M)
        if len(ranges) < 2 and not self.overlap.single:
            return None
        if self.device.type == "cuda" and self.overlap.side_stream and \
                (self._side is None or self._side.priority != self.overlap.priority):
            self._side = torch.cuda.Stream(device=self.device, priority=self.overlap.priority)
        j = min(self.overlap.indexer_chain, len(ranges) - 1)
        # With a chain: the indexer's last segment (the rows after range j - 1) and attention's first
        # launch (the rows of ranges 0 .. j-1).
        extra = [(ranges[j][0], M), (0, ranges[j][0])] if j > 0 else []
        key = tuple(ranges + extra)
        if key not in self._chunk_consts:  # made by the eager step 0, before a capture (no copy in one)
            self._chunk_consts[key] = (torch.tensor([a for a, _ in key], dtype=torch.int32, device=self.device),
                                       torch.tensor([b - a for a, b in key], dtype=torch.int32, device=self.device))
        lo, size = self._chunk_consts[key]
        bs = torch.minimum(torch.clamp(st.batch_size - lo, min=0), size).to(torch.int32)
        with_bs = [(a, b, bs[i:i + 1]) for i, (a, b) in enumerate(key)]
        chunks = with_bs[:len(ranges)]
        if j == 0:
            return ChunkPlan(chunks=chunks, segments=[], attend=chunks)
        rest, head = with_bs[len(ranges):]
        return ChunkPlan(chunks=chunks, segments=chunks[:j] + [rest], attend=[head] + chunks[j:])

    def _prewarm_next(self, kv, l: int, st, plan: "ChunkPlan") -> bool:
        """Overlap.prewarm: layer l + 1's host records of the rows of ranges prewarm.. (plan.attend)
        read ahead on the prewarm's side stream, forked here (after layer l's RESOLVE and attention),
        so that it runs beside the MoE. Nothing waits for it but the step's end (it writes nothing).
        False when there is nothing to read ahead (no such layer or range, or no GPU)."""
        o = self.overlap
        if o.prewarm < 0 or o.prewarm_attention or l + 1 >= len(self.layers) or o.prewarm >= len(plan.attend) or \
                self.device.type != "cuda":
            return False
        if self._pw_side is None:
            self._pw_side = torch.cuda.Stream(device=self.device)
        self._pw_side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._pw_side):
            for a, b, bs in plan.attend[o.prewarm:]:
                kv.prewarm_rows(l + 1, st, a, b, bs, max_blocks=o.prewarm_blocks,
                                granule_bytes=o.prewarm_granule_kib << 10, granule_stride=o.prewarm_stride)
        return True

    def _prewarm_beside(self, kv, l: int, st, chunks):
        """Overlap.prewarm_attention: a launcher of layer l + 1's read ahead (the rows of ranges
        prewarm..) beside the kernel launched before it (the last range's split attention), or None."""
        o = self.overlap
        if o.prewarm < 0 or not o.prewarm_attention or l + 1 >= len(self.layers) or o.prewarm >= len(chunks):
            return None

        # One launch for the rows of ranges prewarm.. (contiguous, to the batch's end): a second one
        # would run beside the first, not beside that kernel. Its count is made here, before it.
        a, b = chunks[o.prewarm][0], chunks[-1][1]
        bs = chunks[-1][2] if o.prewarm == len(chunks) - 1 else torch.clamp(st.batch_size - a, min=0).to(torch.int32)

        def launch():
            kv.prewarm_rows(l + 1, st, a, b, bs, max_blocks=o.prewarm_blocks, granule_bytes=o.prewarm_granule_kib << 10,
                            granule_stride=o.prewarm_stride, granule_phase=(l + 1) % o.prewarm_stride, beside=True)
        return launch

    def _resolve_range(self, kv, l: int, st, chunk, beside: bool = False, alone: bool = False,
                       first: bool = False, early: bool = False):
        """RESOLVE of one row range on the current stream, on the overlap's budget of blocks; alone (the
        first range of a beside schedule, which nothing runs beside): on the whole GPU, as the
        programmatic dependent of the kernel before it; first (Overlap.resolve_first): as that
        dependent too, letting the kernel after it start at once; early (Overlap.under): an ordinary
        launch that lets the kernel after it start at once."""
        a, b, bs = chunk
        budget = 0 if alone else self.overlap.budget(b - a)
        return kv.resolve_rows(l, st, a, b, bs, max_blocks=budget, beside=beside, programmatic=alone or first,
                               consumer_warps=self.overlap.consumer_warps, early_dependents=first or early)

    def _select(self, st, iq, iw, l: int, a: int, b: int, bs, ctas: int = 0, unroll: int = 1,
                after_resolve: bool = False, count=None) -> None:
        """The indexer's scores of rows [a, b) (bs: how many of them are in the batch, on the device)."""
        self.kernels.index_scores(iq[a:b], iw[a:b], st.idx_keys[l], st.idx_scale[l], st.seq_lens[a:b], bs,
                                  st.scores[a:b], st.row_base[a:b], ctas=ctas, unroll=unroll,
                                  after_resolve=after_resolve, count=count)

    def _topk(self, st, a: int, b: int, bs=None, after=None) -> None:
        """Rows [a, b)'s selections: the top-k of their first seq_len scores, -inf ones never, -1 as
        padding (bs: how many of the rows are in the batch, on the device; None: the whole batch's).
        after: (count, target) of the indexer that wrote the scores (hisparse.topk's after_count)."""
        if self.topk == "torch":
            top_v, top_i = st.scores[a:b].topk(self.cfg.topk, dim=1, sorted=False)
            st.positions[a:b].copy_(top_i.masked_fill(torch.isinf(top_v), -1))
            return
        hisparse.topk(st.scores[a:b], st.positions[a:b], seq_lens=st.seq_lens[a:b],
                      batch_size=st.batch_size if bs is None else bs,
                      **({} if after is None else dict(after_count=after[0], after_target=after[1])))

    def _select_chained(self, kv, l: int, st, iq, iw, plan: "ChunkPlan", after_append: bool = False):
        """Overlap.indexer_chain: the indexer and top-k segment by segment, range c's RESOLVE launched
        beside segment c + 1's indexer, on the overlap's budget (that indexer on a grid resident at
        once: it asks for its dependents first), or, with resolve_first, RESOLVE first and the grid
        indexer as its programmatic dependent. after_append (Overlap.append_early): the first
        segment's indexer is the programmatic dependent of the append just launched. Returns the
        last such RESOLVE's (records base, page table, stride)."""
        o, K = self.overlap, self.kernels
        segs = plan.segments
        with self._part("indexer"):
            self._select(st, iq, iw, l, *segs[0], after_resolve=after_append)
        with self._part("topk"):
            self._topk(st, *segs[0])
        # Overlap.under with resolve_first: the segment's top-k runs under RESOLVE too, waiting for the
        # indexer's count (hs_topk_args.after_count) instead of for every grid before it.
        count = None
        if o.under and o.resolve_first and self.topk == "hisparse" and self.device.type == "cuda" and K.triton:
            if self._idx_count is None:  # made by the eager step 0, before a capture
                self._idx_count = torch.zeros(1, dtype=torch.int32, device=self.device)
            count = self._idx_count
        resolved = None
        for c, (a, b, bs) in enumerate(segs[1:]):
            ra, rb, _ = plan.chunks[c]
            with self._part("indexer"):  # one part: a timing event between the two would order them
                if o.resolve_first:
                    resolved = self._resolve_range(kv, l, st, plan.chunks[c], first=True)
                    self._select(st, iq, iw, l, a, b, bs, after_resolve=True, count=count)
                    if count is not None:  # no event between: the top-k's part is the indexer's here
                        self._topk(st, a, b, bs, after=(count, K.index_programs(st.scores.shape[1], b - a)))
                        count.zero_()  # an ordinary launch: after RESOLVE, the indexer and the top-k
                else:
                    self._select(st, iq, iw, l, a, b, bs, ctas=o.indexer_ctas * max(1, K.sms - o.budget(rb - ra)),
                                 unroll=o.indexer_unroll)
                    resolved = self._resolve_range(kv, l, st, plan.chunks[c], beside=True)
            if count is None:
                with self._part("topk"):
                    self._topk(st, a, b, bs)
        return resolved

    def _resolve_chunks(self, kv, l: int, st, chunks, resolved=None):
        """RESOLVE of each row range on the side stream, after the main stream's selections; returns
        the records base, the page table, the stride and one event per range (None on a CPU). Beside
        (Overlap.beside): only the first range's, on the main stream, unless the ranges before
        attention's second launch ran beside the indexer (resolved: the last one's result,
        _select_chained); _attend_chunks launches the rest."""
        if self.overlap.beside:
            if resolved is None:
                with self._part("resolve"):
                    resolved = self._resolve_range(kv, l, st, chunks[0], alone=True)
            records, rec_idx, stride = resolved
            return records, rec_idx, stride, [None] * len(chunks)
        cuda = self.device.type == "cuda" and self.overlap.side_stream
        side = self._side
        if cuda:
            side.wait_stream(torch.cuda.current_stream())  # the selections and the append are written
        ready = []
        with (torch.cuda.stream(side) if cuda else contextlib.nullcontext()), self._part("resolve"):
            for chunk in chunks:
                records, rec_idx, stride = self._resolve_range(kv, l, st, chunk)
                if cuda:
                    ev = torch.cuda.Event()
                    ev.record(side)
                    ready.append(ev)
                else:
                    ready.append(None)
        return records, rec_idx, stride, ready

    def _attend_chunks(self, kv, l, qf, records, rec_idx, stride, fmt, st, chunks, ready) -> None:
        """Sparse attention of each row range once its RESOLVE is done, with the whole batch's split
        count (the per-row arithmetic of one full-batch launch); then the side stream rejoins. Beside
        (Overlap.beside): range c+1's RESOLVE is launched right after range c's attention kernel,
        beside it, and range c's combine kernel, an ordinary launch, waits for both."""
        M, heads, _ = qf.shape
        splits = self.kernels.mla_splits(M, heads, rec_idx.shape[1])
        main = torch.cuda.current_stream() if self.device.type == "cuda" and self.overlap.side_stream else None
        for c, ((a, b, bs), ev) in enumerate(zip(chunks, ready)):
            if ev is not None:
                main.wait_event(ev)
            nxt, more = None, c + 1 < len(chunks)
            if self.overlap.under and more:  # range c+1's RESOLVE first, range c's attention under it
                self._resolve_range(kv, l, st, chunks[c + 1], early=True)
            elif self.overlap.beside and more:
                nxt = lambda n=chunks[c + 1]: self._resolve_range(kv, l, st, n, beside=True)  # noqa: E731
            elif not more and self.device.type == "cuda":
                nxt = self._prewarm_beside(kv, l, st, chunks)  # the next layer's translations, made ahead
            self.kernels.sparse_mla(qf[a:b], records, rec_idx[a:b], stride, fmt, bs, st.att_out[a:b], self.sm_scale,
                                    splits=splits, after_split=nxt, chained=self.overlap.under and more)
        if main is not None:
            main.wait_stream(self._side)  # joins the side stream's last work (a capture needs it)

    def _query(self, L: "Layer", q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The absorbed attention query [M, heads, 576]: q's no-RoPE part through w_uk, then its RoPE part."""
        c = self.cfg
        q_lat = torch.bmm(q[..., :c.nope_head].transpose(0, 1), L.w_uk).transpose(0, 1)  # [M, heads, 512]
        return torch.cat([q_lat, _rope(q[..., c.nope_head:], pos)], dim=-1).contiguous()

    @torch.no_grad()
    def step(self, kv, st) -> torch.Tensor:
        """One decode step of every row of st (DecodeState): float32 logits [M, vocab]."""
        c, K = self.cfg, self.kernels
        M = st.tokens.shape[0]
        pos = (st.seq_lens - 1).long()
        plan = self._chunk_plan(kv, st, M)
        h = self.embed[st.tokens]
        prewarmed = False
        for l, L in enumerate(self.layers):
            with self._part("proj"):
                x = _rms(h)
                xa = L.w_x(x)  # [M, q_lora | latent | idx_dim]
                qa = _rms(xa[:, :c.q_lora])
                kvx = xa[:, c.q_lora:c.q_lora + c.latent]
                qb = L.w_qa(qa)  # [M, heads * 192 | idx_heads * idx_dim]
                nq = c.heads * (c.nope_head + c.rope)
                q = qb[:, :nq].reshape(M, c.heads, c.nope_head + c.rope)
                latent = torch.cat([_rms(kvx[:, :c.kv_lora]), _rope(kvx[:, c.kv_lora:], pos)], dim=-1)
                iq = qb[:, nq:].reshape(M, c.idx_heads, c.idx_dim).float() + c.locality * L.u.float()
                iq = iq.to(torch.float8_e4m3fn) if self.idx_fp8 else iq.to(torch.bfloat16)
                # Head weights kept positive so that every head's preference for salient tokens adds up.
                iw = torch.sigmoid((x @ L.w_idx_heads.t()).float()) * (1.0 / c.idx_heads)
                sal = F.softplus((x.float() * L.u.float().repeat(c.hidden // c.idx_dim)).sum(-1) / math.sqrt(c.hidden // c.idx_dim))
                key, kscale = self._index_key(L, xa[:, c.q_lora + c.latent:], sal)
            early = plan is not None and self.overlap.append_early
            with self._part("append"):
                rec = kv.fmt.encode(latent)
                if not early:
                    kv.append(l, rec, st)
                at = st.row_base + pos
                st.idx_keys[l].view(torch.uint8).index_put_((at,), key.view(torch.uint8))
                st.idx_scale[l].index_put_((at,), kscale)
            qf = None
            if plan is not None and self.overlap.under:  # nothing but RESOLVE between the last top-k and attention
                with self._part("attention"):
                    qf = self._query(L, q, pos)
            if early:  # the last launch before the indexer, which is its programmatic dependent
                kv.append(l, rec, st)
            resolved = None
            if plan is not None and plan.segments:
                resolved = self._select_chained(kv, l, st, iq, iw, plan, after_append=early)
            else:
                with self._part("indexer"):
                    self._select(st, iq, iw, l, 0, M, st.batch_size, after_resolve=early)
                with self._part("topk"):
                    self._topk(st, 0, M)
            if plan is None:
                with self._part("resolve"):
                    records, rec_idx, stride = kv.resolve(l, st)
            else:
                records, rec_idx, stride, ready = self._resolve_chunks(kv, l, st, plan.attend, resolved=resolved)
            with self._part("attention"):
                if qf is None:
                    qf = self._query(L, q, pos)
                if plan is None:
                    K.sparse_mla(qf, records, rec_idx, stride, kv.fmt, st.batch_size, st.att_out, self.sm_scale)
                else:
                    self._attend_chunks(kv, l, qf, records, rec_idx, stride, kv.fmt, st, plan.attend, ready)
                o = torch.bmm(st.att_out.transpose(0, 1), L.w_uv).transpose(0, 1).reshape(M, c.heads * c.v_head)
                h = h + L.wo(o)
            if plan is not None:
                prewarmed = self._prewarm_next(kv, l, st, plan) or prewarmed
            with self._part("moe"):
                h = h + self._moe(L, _rms(h))
        if prewarmed:
            torch.cuda.current_stream().wait_stream(self._pw_side)  # joins it (a capture needs it)
        with self._part("lm_head"):
            return (_rms(h) @ self.lm_head.t()).float()


def quantize_keys(k: torch.Tensor, fp8: bool):
    """float32 [..., D] -> (fp8 (or bf16 on a CPU) keys, float32 per-token scale)."""
    if not fp8:
        return k.to(torch.bfloat16), torch.ones(k.shape[:-1], dtype=torch.float32, device=k.device)
    s = k.abs().amax(-1).clamp(min=1e-4) / 448.0
    return (k / s.unsqueeze(-1)).to(torch.float8_e4m3fn), s

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
            kernel reading the 132-B keys once), then top-2048 (torch.topk, unsorted)
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
of the Triton ones, and tiny dimensions (SMOKE).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

try:  # Triton kernels on the GPU; the torch references below serve the CPU and the cross-check
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU smoke run
    triton = None
    tl = None


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


SMOKE = dict(hidden=256, q_lora=128, heads=4, nope_head=32, v_head=32, idx_heads=4, idx_dim=32, topk=16,
             experts=16, ep=8, moe_inter=64, dense_inter=128, full_vocab=512, full_layers=2, full_dense_layers=1,
             layers=2)


# ---- KV records (FlashMLA's fp8 layout, or plain bf16) ----

class RecordFormat:
    name = "?"
    record_bytes = 0

    def encode(self, latent: torch.Tensor) -> torch.Tensor:  # bf16 [..., 576] -> uint8 [..., R]
        raise NotImplementedError

    def decode(self, rec: torch.Tensor) -> torch.Tensor:  # uint8 [..., R] -> bf16 [..., 576]
        raise NotImplementedError


class Bf16Records(RecordFormat):
    def __init__(self, cfg: V32Config) -> None:
        self.name, self.record_bytes, self.fp8 = "bf16", cfg.latent * 2, False

    def encode(self, latent):
        return latent.to(torch.bfloat16).contiguous().view(torch.uint8)

    def decode(self, rec):
        return rec.contiguous().view(torch.bfloat16)


class Fp8Records(RecordFormat):
    """512 B fp8 e4m3 of the latent (4 tiles of 128, one float32 scale each), 16 B of scales, the 64
    rotary elements in bf16: 656 B (FlashMLA's sparse fp8 KV layout)."""

    TILE = 128

    def __init__(self, cfg: V32Config) -> None:
        if not hasattr(torch, "float8_e4m3fn"):
            raise RuntimeError("fp8 records need torch >= 2.1")
        assert cfg.kv_lora == 512 and cfg.rope == 64, "the fp8 layout is FlashMLA's: 512 + 64"
        self.name, self.fp8 = "fp8", True
        self.record_bytes = 512 + 16 + 128

    def encode(self, latent):
        lead = latent.shape[:-1]
        nope = latent[..., :512].float().reshape(*lead, 4, self.TILE)
        scale = nope.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0
        q = (nope / scale).to(torch.float8_e4m3fn).view(torch.uint8).reshape(*lead, 512)
        s = scale.reshape(*lead, 4).contiguous().view(torch.uint8)
        r = latent[..., 512:].to(torch.bfloat16).contiguous().view(torch.uint8)
        return torch.cat([q, s, r], dim=-1)

    def decode(self, rec):
        rec = rec.contiguous()
        lead = rec.shape[:-1]
        q = rec[..., :512].view(torch.float8_e4m3fn).float().reshape(*lead, 4, self.TILE)
        s = rec[..., 512:528].view(torch.float32)
        nope = (q * s.unsqueeze(-1)).reshape(*lead, 512).to(torch.bfloat16)
        return torch.cat([nope, rec[..., 528:].view(torch.bfloat16)], dim=-1)


def record_format(name: str, cfg: V32Config) -> RecordFormat:
    if name == "fp8":
        return Fp8Records(cfg)
    if name == "bf16":
        return Bf16Records(cfg)
    raise ValueError(f"records must be fp8 or bf16, got {name!r}")


# ---- Triton kernels (GPU) ----

if triton is not None:

    @triton.jit
    def _index_scores_kernel(q_ptr, w_ptr, k_ptr, ks_ptr, seq_ptr, bs_ptr, base_ptr, out_ptr, max_len,
                             H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
        """score[b, t] = scale[b, t] * sum_h w[b, h] * relu(q[b, h] . k[b, t]) for t < seq_len[b], else
        -inf; row b's keys are the pool's entries base[b] + t. q, k fp8 e4m3; rows at and past *bs do
        nothing. Reads each key once (132 B a token)."""
        tb = tl.program_id(0)
        b = tl.program_id(1)
        if b < tl.load(bs_ptr):
            seq = tl.load(seq_ptr + b)
            t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
            out = out_ptr + b.to(tl.int64) * max_len + t
            if tb * BLOCK_T >= seq:
                tl.store(out, tl.full([BLOCK_T], float("-inf"), tl.float32), mask=t < max_len)
            else:
                h = tl.arange(0, H)
                d = tl.arange(0, D)
                q = tl.load(q_ptr + b.to(tl.int64) * (H * D) + h[:, None] * D + d[None, :])
                tc = tl.load(base_ptr + b) + tl.minimum(t, seq - 1).to(tl.int64)
                kk = tl.load(k_ptr + tc[:, None] * D + d[None, :])
                s = tl.dot(q, tl.trans(kk))  # [H, BLOCK_T] fp32
                s = tl.maximum(s, 0.0)
                w = tl.load(w_ptr + b * H + h)
                sc = tl.sum(s * w[:, None], axis=0)
                ks = tl.load(ks_ptr + tc)
                sc = tl.where(t < seq, sc * ks, float("-inf"))
                tl.store(out, sc, mask=t < max_len)

    @triton.jit
    def _sparse_mla_kernel(q_ptr, rec_ptr, idx_ptr, bs_ptr, acc_ptr, ml_ptr, rec_stride, sm_scale, K_SEL, SPLIT_LEN,
                           HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr):
        """Sparse MLA decode, absorbed form, one split of the selection: for (row b, heads hb, split sp),
        the unnormalised softmax(q . K_j) V_j over selections [sp * SPLIT_LEN, +SPLIT_LEN) of the
        records rec_ptr + idx[b, j] * rec_stride (idx == -1: padding; other negative values are
        legal offsets, so one base can address two allocations); K_j is the 576-element latent,
        V_j its first 512. fp8 records are dequantized in registers (4 tiles of 128, float32 scales
        at byte 512, bf16 rotary at 528); bf16 records are 576 bf16. Writes acc [b, sp, h, 512] and
        (max, sum) [b, sp, h, 2] for _mla_combine_kernel. Rows at and past *bs do nothing."""
        b = tl.program_id(0)
        hb = tl.program_id(1)
        sp = tl.program_id(2)
        if b < tl.load(bs_ptr):
            nsplit = tl.num_programs(2)
            h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
            dn = tl.arange(0, 512)
            dr = tl.arange(0, 64)
            qrow = q_ptr + (b.to(tl.int64) * HEADS + h[:, None]) * 576
            qn = tl.load(qrow + dn[None, :])
            qr = tl.load(qrow + 512 + dr[None, :])
            m = tl.full([BLOCK_H], float("-inf"), tl.float32)
            l_sum = tl.zeros([BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_H, 512], tl.float32)
            lo = sp * SPLIT_LEN
            for n0 in range(lo, lo + SPLIT_LEN, BLOCK_N):
                j = n0 + tl.arange(0, BLOCK_N)
                idx = tl.load(idx_ptr + b.to(tl.int64) * K_SEL + j, mask=j < K_SEL, other=-1).to(tl.int64)
                valid = idx != -1
                base = rec_ptr + tl.where(valid, idx, 0) * rec_stride
                if FP8:
                    raw = tl.load(base[:, None] + dn[None, :])
                    kf = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
                    scp = (base + 512).to(tl.pointer_type(tl.float32))
                    sc = tl.load(scp[:, None] + (dn // 128)[None, :])
                    kn = (kf * sc).to(tl.bfloat16)
                    kr = tl.load((base + 528).to(tl.pointer_type(tl.bfloat16))[:, None] + dr[None, :])
                else:
                    kn = tl.load(base.to(tl.pointer_type(tl.bfloat16))[:, None] + dn[None, :])
                    kr = tl.load((base + 1024).to(tl.pointer_type(tl.bfloat16))[:, None] + dr[None, :])
                s = tl.dot(qn, tl.trans(kn)) + tl.dot(qr, tl.trans(kr))
                s = tl.where(valid[None, :], s * sm_scale, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m - m_safe)
                p = tl.exp(s - m_safe[:, None])
                l_sum = l_sum * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), kn)
                m = m_new
            part = (b.to(tl.int64) * nsplit + sp) * HEADS + h
            tl.store(acc_ptr + part[:, None] * 512 + dn[None, :], acc)
            tl.store(ml_ptr + part * 2, m)
            tl.store(ml_ptr + part * 2 + 1, l_sum)

    @triton.jit
    def _mla_combine_kernel(acc_ptr, ml_ptr, bs_ptr, out_ptr, NSPLIT, HEADS: tl.constexpr, BLOCK_H: tl.constexpr):
        """out[b, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits of row b."""
        b = tl.program_id(0)
        hb = tl.program_id(1)
        if b < tl.load(bs_ptr):
            h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
            dn = tl.arange(0, 512)
            mx = tl.full([BLOCK_H], float("-inf"), tl.float32)
            den = tl.zeros([BLOCK_H], tl.float32)
            o = tl.zeros([BLOCK_H, 512], tl.float32)
            for sp in range(0, NSPLIT):
                part = (b.to(tl.int64) * NSPLIT + sp) * HEADS + h
                m_s = tl.load(ml_ptr + part * 2)
                l_s = tl.load(ml_ptr + part * 2 + 1)
                a_s = tl.load(acc_ptr + part[:, None] * 512 + dn[None, :])
                m_new = tl.maximum(mx, m_s)
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                f_old = tl.exp(mx - m_safe)
                f_new = tl.exp(m_s - m_safe)
                o = o * f_old[:, None] + a_s * f_new[:, None]
                den = den * f_old + l_s * f_new
                mx = m_new
            o = o / tl.maximum(den, 1e-30)[:, None]
            tl.store(out_ptr + (b.to(tl.int64) * HEADS + h[:, None]) * 512 + dn[None, :], o.to(tl.bfloat16))


class Kernels:
    """The indexer's scores and the sparse attention: Triton on a GPU (triton=True), torch elsewhere.
    Both modes of the benchmark call the same implementation on the same records in the same order,
    so their logits are bit-identical whichever is used."""

    MLA_CONFIGS = [(16, 32, 4), (32, 32, 4), (32, 32, 8), (64, 32, 8), (32, 64, 8), (64, 16, 8), (16, 64, 4)]

    def __init__(self, use_triton: bool, mla_block_h: int = 32, mla_warps: int = 8, sms: int = 132) -> None:
        self.triton = use_triton and triton is not None
        self.mla_block_h, self.mla_warps, self.sms = mla_block_h, mla_warps, sms
        self.mla_block_n = 32
        self._parts: Dict[tuple, tuple] = {}  # (M, heads, splits) -> split workspaces

    def tune_mla(self, fmt: RecordFormat, M: int, heads: int = 128, k: int = 2048) -> Dict[str, float]:
        """Times the sparse MLA kernel's tile shapes (heads a block, records a step, warps) at M rows on
        random records and keeps the fastest. Both modes then run the same kernel."""
        dev = torch.device("cuda")
        n = 200000
        recs = torch.zeros(n, fmt.record_bytes, dtype=torch.uint8, device=dev)
        recs[:] = fmt.encode(torch.randn(n, 576, device=dev).to(torch.bfloat16))
        q = torch.randn(M, heads, 576, device=dev).to(torch.bfloat16)
        idx = torch.randint(0, n, (M, k), device=dev)
        bs = torch.tensor([M], dtype=torch.int32, device=dev)
        out = torch.empty(M, heads, 512, dtype=torch.bfloat16, device=dev)
        times: Dict[str, float] = {}
        best = None
        for bh, bn, warps in self.MLA_CONFIGS:
            self.mla_block_h, self.mla_block_n, self.mla_warps = bh, bn, warps
            try:
                for _ in range(2):
                    self.sparse_mla(q, recs, idx, fmt.record_bytes, fmt, bs, out, 0.05)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(10):
                    self.sparse_mla(q, recs, idx, fmt.record_bytes, fmt, bs, out, 0.05)
                b.record()
                b.synchronize()
            except Exception as e:  # noqa: BLE001 - a shape that does not compile here is skipped
                print(f"mla tile {bh}x{bn}/{warps}w: {type(e).__name__}")
                continue
            t = a.elapsed_time(b) / 10
            times[f"{bh}x{bn}/{warps}w"] = round(t * 1e3, 1)  # µs
            if best is None or t < best[0]:
                best = (t, bh, bn, warps)
        _, self.mla_block_h, self.mla_block_n, self.mla_warps = best
        self._parts.clear()
        return times

    def mla_splits(self, M: int, heads: int, k: int) -> int:
        """Splits of the selection per (row, head block): enough CTAs for two waves of the GPU."""
        ctas = M * max(1, heads // self.mla_block_h)
        s = 1
        while ctas * s < 2 * self.sms and k // (2 * s) >= 64:
            s *= 2
        return s

    def index_scores(self, q, w, keys, kscale, seq_lens, batch_size, out, row_base):
        """q [M, H, D], w float32 [M, H], keys [P, D] and kscale float32 [P]: a pool in which row b's
        token t is entry row_base[b] + t (int64 [M]); out float32 [M, T]."""
        M, H, D = q.shape
        T = out.shape[1]
        if self.triton:
            BT = 128
            _index_scores_kernel[(triton.cdiv(T, BT), M)](q, w, keys, kscale, seq_lens, batch_size, row_base, out, T,
                                                          H=H, D=D, BLOCK_T=BT, num_warps=4)
            return out
        at = (row_base.unsqueeze(1) + torch.arange(T, device=keys.device)).clamp(max=keys.shape[0] - 1)
        s = torch.einsum("bhd,btd->bht", q.float(), keys[at].float()).clamp(min=0)
        sc = (s * w.unsqueeze(-1)).sum(1) * kscale[at]
        t = torch.arange(T, device=keys.device)
        out.copy_(sc.masked_fill(t.unsqueeze(0) >= seq_lens.unsqueeze(1), float("-inf")))
        return out

    def sparse_mla(self, q, records, idx, rec_stride, fmt: RecordFormat, batch_size, out, sm_scale):
        """q bf16 [M, heads, 576]; records: uint8 tensor whose record i starts at byte i * rec_stride;
        idx int32/int64 [M, k] (-1: padding); out bf16 [M, heads, 512]."""
        M, heads, _ = q.shape
        k = idx.shape[1]
        if self.triton and not isinstance(records, list):
            bh = min(self.mla_block_h, heads)
            ns = self.mla_splits(M, heads, k)
            key = (M, heads, ns, bh, q.device)
            if key not in self._parts:  # allocated once per shape, before graph capture reuses it
                self._parts[key] = (torch.empty(M, ns, heads, 512, dtype=torch.float32, device=q.device),
                                    torch.empty(M, ns, heads, 2, dtype=torch.float32, device=q.device))
            acc, ml = self._parts[key]
            split_len = (k + ns - 1) // ns
            bn = self.mla_block_n
            split_len = (split_len + bn - 1) // bn * bn
            _sparse_mla_kernel[(M, heads // bh, ns)](q, records, idx, batch_size, acc, ml, rec_stride, sm_scale, k,
                                                     split_len, HEADS=heads, BLOCK_H=bh, BLOCK_N=bn, FP8=fmt.fp8,
                                                     num_warps=self.mla_warps)
            _mla_combine_kernel[(M, heads // 16)](acc, ml, batch_size, out, ns, HEADS=heads, BLOCK_H=16, num_warps=4)
            return out
        if isinstance(records, list):  # HybridKV on a CPU: [(tensor, idx, stride)] gathered and concatenated
            lat = fmt.decode(torch.cat([t.reshape(-1)[i.clamp(min=0).long().unsqueeze(-1) * st +
                                                      torch.arange(fmt.record_bytes, device=i.device)]
                                        for t, i, st in records]))
        else:
            flat = records.reshape(-1)
            offs = idx.clamp(min=0).long().unsqueeze(-1) * rec_stride + torch.arange(fmt.record_bytes, device=idx.device)
            lat = fmt.decode(flat[offs])  # [M, k, 576] bf16
        att = torch.bmm(q.float(), lat.float().transpose(1, 2)) * sm_scale
        att = att.masked_fill((idx == -1).unsqueeze(1), float("-inf"))
        p = torch.softmax(att, dim=-1)
        out.copy_(torch.bmm(p, lat[..., :512].float()).to(torch.bfloat16))
        return out


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
    takes x[e]). fp8 grouped GEMMs (torch._scaled_grouped_mm when it works here, else one _scaled_mm a
    expert), bf16 bmm on a CPU."""

    def __init__(self, E: int, inter: int, hidden: int, gen, device, fp8: bool) -> None:
        self.E, self.inter, self.hidden, self.fp8 = E, inter, hidden, fp8
        self.w13 = [Linear(2 * inter, hidden, gen, device, fp8) for _ in range(E)]
        self.w2 = [Linear(hidden, inter, gen, device, fp8) for _ in range(E)]
        if fp8:
            self.w13_all = torch.stack([x.w for x in self.w13])
            self.w2_all = torch.stack([x.w for x in self.w2])
            for i in range(E):  # one copy of each weight, in the stacked tensors
                self.w13[i].w, self.w2[i].w = self.w13_all[i], self.w2_all[i]
        self.grouped = False  # set by probe_grouped()

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in self.w13 + self.w2)

    def choose_gemm(self, cap: int) -> Dict[str, Optional[float]]:
        """Times one expert pass at cap rows an expert both ways (one _scaled_mm an expert, and
        _scaled_grouped_mm where it runs here and agrees) and keeps the faster."""
        out: Dict[str, Optional[float]] = dict(loop_ms=None, grouped_ms=None)
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

        self.grouped = False
        ref = self(x)
        out["loop_ms"] = round(timed(), 4)
        if hasattr(torch, "_scaled_grouped_mm"):
            try:
                self.grouped = True
                same = bool(torch.allclose(self(x).float(), ref.float(), rtol=2e-2, atol=2e-2))
                out["grouped_ms"] = round(timed(), 4) if same else None
            except Exception as e:  # noqa: BLE001 - any failure means: use the loop
                print(f"_scaled_grouped_mm unusable here ({type(e).__name__}: {str(e)[:120]})")
        self.grouped = out["grouped_ms"] is not None and out["grouped_ms"] < out["loop_ms"]
        out["grouped"] = self.grouped
        return out

    def _gemm_all(self, xq: torch.Tensor, ws: torch.Tensor, scale: float, cap: int) -> torch.Tensor:
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
        if self.grouped:
            gu = self._gemm_all(xq, self.w13_all, self.w13[0].scale, cap).view(E, cap, 2 * self.inter)
        else:
            gu = torch.stack([_mm(xq[e * cap:(e + 1) * cap], self.w13[e]) for e in range(E)])
        a = (F.silu(gu[..., :self.inter].float()) * gu[..., self.inter:].float()).to(torch.bfloat16)
        aq = a.reshape(E * cap, self.inter).clamp(-448, 448).to(torch.float8_e4m3fn)
        if self.grouped:
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

    @torch.no_grad()
    def step(self, kv, st) -> torch.Tensor:
        """One decode step of every row of st (DecodeState): float32 logits [M, vocab]."""
        c, K = self.cfg, self.kernels
        M = st.tokens.shape[0]
        pos = (st.seq_lens - 1).long()
        h = self.embed[st.tokens]
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
            with self._part("append"):
                kv.append(l, kv.fmt.encode(latent), st)
                at = st.row_base + pos
                st.idx_keys[l].view(torch.uint8).index_put_((at,), key.view(torch.uint8))
                st.idx_scale[l].index_put_((at,), kscale)
            with self._part("indexer"):
                K.index_scores(iq, iw, st.idx_keys[l], st.idx_scale[l], st.seq_lens, st.batch_size, st.scores,
                               st.row_base)
            with self._part("topk"):
                top_v, top_i = st.scores.topk(c.topk, dim=1, sorted=False)
                st.positions.copy_(top_i.masked_fill(torch.isinf(top_v), -1))
            with self._part("resolve"):
                records, rec_idx, stride = kv.resolve(l, st)
            with self._part("attention"):
                q_lat = torch.bmm(q[..., :c.nope_head].transpose(0, 1), L.w_uk).transpose(0, 1)  # [M, heads, 512]
                qf = torch.cat([q_lat, _rope(q[..., c.nope_head:], pos)], dim=-1).contiguous()
                K.sparse_mla(qf, records, rec_idx, stride, kv.fmt, st.batch_size, st.att_out, self.sm_scale)
                o = torch.bmm(st.att_out.transpose(0, 1), L.w_uv).transpose(0, 1).reshape(M, c.heads * c.v_head)
                h = h + L.wo(o)
            with self._part("moe"):
                h = h + self._moe(L, _rms(h))
        with self._part("lm_head"):
            return (_rms(h) @ self.lm_head.t()).float()


def quantize_keys(k: torch.Tensor, fp8: bool):
    """float32 [..., D] -> (fp8 (or bf16 on a CPU) keys, float32 per-token scale)."""
    if not fp8:
        return k.to(torch.bfloat16), torch.ones(k.shape[:-1], dtype=torch.float32, device=k.device)
    s = k.abs().amax(-1).clamp(min=1e-4) / 448.0
    return (k / s.unsqueeze(-1)).to(torch.float8_e4m3fn), s


def row_bases(lens: List[int]) -> List[int]:
    """Start of each batch slot's extent in a token pool: slot i holds lens[i] tokens."""
    out, at = [], 0
    for n in lens:
        out.append(at)
        at += n
    return out


class DecodeState:
    """Static decode inputs of one batch bucket of M rows (updated in place: one graph serves every step).
    Slot i may hold lens[i] tokens (its own context + output): the index keys live in one pool per
    layer, slot i's at entries row_base[i] + t, so a length mix costs what its tokens cost."""

    def __init__(self, cfg: V32Config, M: int, lens: List[int], device, idx_fp8: bool) -> None:
        self.M, self.lens, self.max_len = M, list(lens), max(lens)
        self.bases = row_bases(self.lens)
        self.row_base = torch.tensor(self.bases, dtype=torch.int64, device=device)
        max_len, total = self.max_len, sum(self.lens)
        self.ar = torch.arange(M, device=device)
        self.tokens = torch.zeros(M, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(M, dtype=torch.int32, device=device)
        self.batch_size = torch.tensor([M], dtype=torch.int32, device=device)
        self.positions = torch.full((M, cfg.topk), -1, dtype=torch.int32, device=device)
        self.scores = torch.empty(M, max_len, dtype=torch.float32, device=device)
        self.att_out = torch.empty(M, cfg.heads, cfg.kv_lora, dtype=torch.bfloat16, device=device)
        kdt = torch.float8_e4m3fn if idx_fp8 else torch.bfloat16
        self.idx_keys = [torch.zeros(total, cfg.idx_dim, dtype=kdt, device=device) for _ in range(cfg.layers)]
        self.idx_scale = [torch.zeros(total, dtype=torch.float32, device=device) for _ in range(cfg.layers)]

    def index_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.idx_keys + self.idx_scale)


class FullKV:
    """Baseline: every layer's records in HBM, one token pool uint8 [sum(lens), R] a layer in which slot i
    holds lens[i] tokens from row_base[i]; record index = row_base[i] + pos."""

    mode = "baseline"

    def __init__(self, cfg: V32Config, fmt: RecordFormat, lens: List[int], device) -> None:
        self.fmt = fmt
        self.bases = row_bases(lens)
        self.cache = [torch.zeros(sum(lens), fmt.record_bytes, dtype=torch.uint8, device=device) for _ in range(cfg.layers)]
        self.rec_idx = torch.zeros(len(lens), cfg.topk, dtype=torch.int64, device=device)
        self.row_base = torch.tensor(self.bases, dtype=torch.int64, device=device)

    def kv_bytes(self) -> int:
        return sum(t.numel() for t in self.cache)

    def store(self, i: int, rid: int, recs: torch.Tensor, start: int) -> None:  # recs [layers, n, R]
        at = self.bases[i] + start
        for l, cache in enumerate(self.cache):
            cache[at:at + recs.shape[1]] = recs[l]

    def append(self, layer: int, rec: torch.Tensor, st: DecodeState) -> None:
        self.cache[layer].index_put_((self.row_base + (st.seq_lens - 1).long(),), rec)

    def resolve(self, layer: int, st: DecodeState):
        torch.add(self.row_base.unsqueeze(1), st.positions.long(), out=self.rec_idx)
        self.rec_idx.masked_fill_(st.positions < 0, -1)
        return self.cache[layer], self.rec_idx, self.fmt.record_bytes

    def release(self, i: int, rid: int) -> None:
        pass

    def admit(self, i: int, rid: int, ctx: int, max_len: int) -> None:
        pass


class HisparseKV:
    """hisparse: records in the daemon's host pool (hs_store at admission, hs_append per step), RESOLVE
    per layer, attention reading the slot arena by the record index RESOLVE writes,
    (row * layers + layer) * (B + 1) + slot (its page-table output)."""

    mode = "hisparse"

    def __init__(self, session, cfg: V32Config, fmt: RecordFormat, M: int, device) -> None:
        self.session, self.cfg, self.fmt = session, cfg, fmt
        arena = session.slot_view()
        self.arena = arena if isinstance(arena, torch.Tensor) else torch.from_numpy(arena)
        self.stride = session.info().record_stride
        self.rows = torch.zeros(M, dtype=torch.int32, device=device)
        self.out_slots = torch.full((M, cfg.topk), -1, dtype=torch.int32, device=device)
        self.page_table = torch.full((M, cfg.topk), -1, dtype=torch.int32, device=device)
        self.B1 = session.slots + 1
        self.rows_of: Dict[int, int] = {}

    def kv_bytes(self) -> int:
        return self.session.info().arena_bytes

    def admit(self, i: int, rid: int, ctx: int, max_len: int) -> None:
        row = self.session.admit(rid, ctx, max_len).row
        self.rows[i] = row
        self.rows_of[rid] = row

    def store(self, i: int, rid: int, recs: torch.Tensor, start: int) -> None:
        self.session.store(rid, recs, start_pos=start, seq_len_after=start + recs.shape[1])

    def release(self, i: int, rid: int) -> None:
        self.session.release(rid)
        self.rows_of.pop(rid, None)

    def append(self, layer: int, rec: torch.Tensor, st: DecodeState) -> None:
        self.session.append(layer, self.rows, st.seq_lens, rec, batch_size=st.batch_size)

    def resolve(self, layer: int, st: DecodeState):
        # RESOLVE writes each selection's record index in the arena (resolve.h rule 8, the page-table
        # output): attention reads it as is, with no index kernel in between.
        self.session.resolve(layer, self.rows, st.seq_lens, st.positions, None, page_table=self.page_table,
                             batch_size=st.batch_size)
        return self.arena, self.page_table, self.stride

    def close(self) -> None:
        for rid in list(self.rows_of):
            self.release(0, rid)
        self.arena = None


class HybridKV:
    """Resident while HBM allows, hisparse for the rest: batch slots [0, n_res) keep their whole KV in
    HBM (as FullKV: no RESOLVE, no misses), slots [n_res, M) are served by hisparse. The engine
    picks n_res from its HBM budget (serve_bench.resident_rows), so at low concurrency every request
    is resident and the step is the full-HBM step. Attention reads both kinds of rows through one
    base: offsets in 16-byte units from the slot arena (an offset into the resident cache is negative
    or beyond the arena; -1 stays padding). The sparse rows are the batch's tail, so their positions and
    seq_lens are contiguous views of the step's tensors, and RESOLVE runs on them alone."""

    mode = "hybrid"

    def __init__(self, session, cfg: V32Config, fmt: RecordFormat, lens: List[int], n_res: int, device) -> None:
        M = len(lens)
        self.cfg, self.fmt, self.M, self.n_res = cfg, fmt, M, n_res
        self.full = FullKV(cfg, fmt, lens[:n_res], device) if n_res > 0 else None
        self.sparse = HisparseKV(session, cfg, fmt, M - n_res, device) if M > n_res else None
        self.session = session
        if self.sparse is not None:
            self.bs_sparse = torch.tensor([M - n_res], dtype=torch.int32, device=device)
        self.off = torch.zeros(M, cfg.topk, dtype=torch.int64, device=device)
        self.cpu = torch.device(device).type != "cuda"

    def kv_bytes(self) -> int:
        return (self.full.kv_bytes() if self.full else 0) + (self.sparse.kv_bytes() if self.sparse else 0)

    def admit(self, i: int, rid: int, ctx: int, max_len: int) -> None:
        if i >= self.n_res:
            self.sparse.admit(i - self.n_res, rid, ctx, max_len)

    def store(self, i: int, rid: int, recs: torch.Tensor, start: int) -> None:
        if i < self.n_res:
            self.full.store(i, rid, recs, start)
        else:
            self.sparse.store(i - self.n_res, rid, recs, start)

    def release(self, i: int, rid: int) -> None:
        if i >= self.n_res:
            self.sparse.release(i - self.n_res, rid)

    def append(self, layer: int, rec: torch.Tensor, st: DecodeState) -> None:
        r = self.n_res
        if self.full is not None:
            self.full.cache[layer].index_put_((self.full.row_base + (st.seq_lens[:r] - 1).long(),), rec[:r])
        if self.sparse is not None:
            self.session.append(layer, self.sparse.rows, st.seq_lens[r:], rec[r:], batch_size=self.bs_sparse)

    def resolve(self, layer: int, st: DecodeState):
        r, sp = self.n_res, self.sparse
        R = self.fmt.record_bytes
        if sp is not None:
            self.session.resolve(layer, sp.rows, st.seq_lens[r:], st.positions[r:], sp.out_slots,
                                 batch_size=self.bs_sparse)
        if self.cpu:  # the torch reference gathers from each source itself
            parts = []
            if self.full is not None:
                pos = st.positions[:r].long()
                idx = self.full.row_base.unsqueeze(1) + pos
                parts.append((self.full.cache[layer], idx.masked_fill(pos < 0, -1), R))
            if sp is not None:
                base = (sp.rows.long() * self.cfg.layers + layer) * sp.B1
                idx = base.unsqueeze(1) + sp.out_slots.long()
                parts.append((sp.arena, idx.masked_fill(sp.out_slots < 0, -1), sp.stride))
            return parts, self.off, 1
        # Offsets in units of 16 bytes (every record starts 16-aligned): a stride the kernel knows to
        # be a multiple of 16 keeps its loads vectorized (byte offsets with stride 1 cost ~100 µs a layer).
        U = 16
        arena = sp.arena if sp is not None else self.full.cache[layer]
        if self.full is not None:
            shift = self.full.cache[layer].data_ptr() - arena.data_ptr()
            assert shift % U == 0 and R % U == 0
            pos = st.positions[:r].long()
            o = (self.full.row_base.unsqueeze(1) + pos) * (R // U) + shift // U
            self.off[:r] = o.masked_fill(pos < 0, -1)
        if sp is not None:
            assert sp.stride % U == 0
            base = (sp.rows.long() * self.cfg.layers + layer) * sp.B1
            o = (base.unsqueeze(1) + sp.out_slots.long()) * (sp.stride // U)
            self.off[r:] = o.masked_fill(sp.out_slots < 0, -1)
        return arena, self.off, U

    def close(self) -> None:
        if self.sparse is not None:
            self.sparse.close()

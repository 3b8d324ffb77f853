"""The two attention-side kernels of the DeepSeek-V3.2-class model (dsv32.py), each with a torch
reference beside it: the DSA indexer's scores (one fused Triton kernel that reads every 132-B fp8
key once) and sparse MLA decode over k selected records read by index (a split-K Triton kernel
that dequantizes FlashMLA's fp8 records in registers, and a combine kernel). Kernels picks Triton on
a GPU and the references elsewhere; tests/python/test_serve_bench.py holds the one to the other.
"""

from __future__ import annotations

from typing import Dict

import torch

from engine import RecordFormat

try:  # Triton kernels on the GPU; the torch references below serve the CPU and the cross-check
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU smoke run
    triton = None
    tl = None

if triton is not None:
    try:  # griddepcontrol.launch_dependents (Triton 3.6 has it): lets a RESOLVE launched beside a kernel start
        from triton.language.extra.cuda import gdc_launch_dependents
    except ImportError:  # pragma: no cover - an older Triton: a beside launch then starts at the kernel's end
        @triton.jit
        def gdc_launch_dependents():
            pass

# ---- Triton kernels (GPU) ----

if triton is not None:

    @triton.jit
    def _index_tile(q_ptr, w_ptr, k_ptr, ks_ptr, seq_ptr, base_ptr, out_ptr, max_len, tb, b, live,
                    H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
        """Tile tb of row b: score[b, t] = scale[b, t] * sum_h w[b, h] * relu(q[b, h] . k[b, t]) for t <
        seq_len[b], else -inf, over t in [tb * BLOCK_T, +BLOCK_T); row b's keys are the pool's entries
        base[b] + t. q, k fp8 e4m3. Stored only where live. No branch: a key past seq_len is read at
        seq_len - 1 and its score masked, so that a caller can have several tiles' loads in flight at
        once. Both indexer kernels run it, so their scores are the same bits."""
        seq = tl.load(seq_ptr + b)
        t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        h = tl.arange(0, H)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b.to(tl.int64) * (H * D) + h[:, None] * D + d[None, :])
        tc = tl.load(base_ptr + b) + tl.minimum(t, tl.maximum(seq - 1, 0)).to(tl.int64)
        kk = tl.load(k_ptr + tc[:, None] * D + d[None, :])
        s = tl.dot(q, tl.trans(kk))  # [H, BLOCK_T] fp32
        s = tl.maximum(s, 0.0)
        w = tl.load(w_ptr + b * H + h)
        sc = tl.sum(s * w[:, None], axis=0)
        ks = tl.load(ks_ptr + tc)
        sc = tl.where(t < seq, sc * ks, float("-inf"))
        tl.store(out_ptr + b.to(tl.int64) * max_len + t, sc, mask=(t < max_len) & live)

    @triton.jit
    def _index_scores_kernel(q_ptr, w_ptr, k_ptr, ks_ptr, seq_ptr, bs_ptr, base_ptr, out_ptr, max_len,
                             H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
        """The indexer's scores (_index_tile), one program a tile: grid (tiles a row, rows). Rows at and
        past *bs do nothing; a tile wholly past its row's seq_len stores -inf without reading a key.
        Reads each key once (132 B a token)."""
        tb = tl.program_id(0)
        b = tl.program_id(1)
        if b < tl.load(bs_ptr):
            if tb * BLOCK_T >= tl.load(seq_ptr + b):
                t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
                tl.store(out_ptr + b.to(tl.int64) * max_len + t, tl.full([BLOCK_T], float("-inf"), tl.float32),
                         mask=t < max_len)
            else:
                _index_tile(q_ptr, w_ptr, k_ptr, ks_ptr, seq_ptr, base_ptr, out_ptr, max_len, tb, b, b >= 0, H, D,
                            BLOCK_T)

    @triton.jit
    def _index_scores_persistent_kernel(q_ptr, w_ptr, k_ptr, ks_ptr, seq_ptr, bs_ptr, base_ptr, out_ptr, max_len,
                                        n_tb, n_tiles, H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
                                        UNROLL: tl.constexpr):
        """The same scores from a grid that is resident at once: program p takes tiles p, p + grid, ...
        (tile = row * n_tb + tb), UNROLL of them at a time with no branch between, so that their loads
        can be in flight together (one program an SM has few otherwise). It asks for its dependents
        first thing, so a RESOLVE launched beside it (an earlier range's, dsv32.Overlap.indexer_chain)
        starts at once on the SMs this grid leaves; the grid kernel's thousands of programs would let
        it start only at their last wave."""
        gdc_launch_dependents()
        bs = tl.load(bs_ptr)
        step = tl.num_programs(0)
        for first in range(tl.program_id(0), n_tiles, step * UNROLL):
            for u in tl.static_range(UNROLL):
                tile = first + u * step
                live = tile < n_tiles
                tile = tl.minimum(tile, n_tiles - 1)
                b = tile // n_tb
                _index_tile(q_ptr, w_ptr, k_ptr, ks_ptr, seq_ptr, base_ptr, out_ptr, max_len, tile % n_tb,
                            tl.maximum(tl.minimum(b, bs - 1), 0), live & (b < bs), H, D, BLOCK_T)

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
        # A RESOLVE launched beside this kernel (the overlap's next range) may start once every block
        # has started: it touches none of this kernel's rows.
        gdc_launch_dependents()
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

    def index_scores(self, q, w, keys, kscale, seq_lens, batch_size, out, row_base, ctas: int = 0, unroll: int = 1):
        """q [M, H, D], w float32 [M, H], keys [P, D] and kscale float32 [P]: a pool in which row b's
        token t is entry row_base[b] + t (int64 [M]); out float32 [M, T] (rows T floats apart: a
        slice of rows of a larger buffer will do). ctas > 0: a grid of at most that many programs,
        resident at once, that asks for its dependents at its start (what a RESOLVE launched beside
        it needs), each taking `unroll` tiles at a time; the scores are the same bits either way."""
        M, H, D = q.shape
        T = out.shape[1]
        if self.triton:
            BT = 128
            n_tb = triton.cdiv(T, BT)
            if ctas > 0:
                grid = max(1, min(ctas, n_tb * M))
                _index_scores_persistent_kernel[(grid,)](q, w, keys, kscale, seq_lens, batch_size, row_base, out, T,
                                                         n_tb, n_tb * M, H=H, D=D, BLOCK_T=BT, UNROLL=unroll,
                                                         num_warps=4)
            else:
                _index_scores_kernel[(n_tb, M)](q, w, keys, kscale, seq_lens, batch_size, row_base, out, T,
                                                H=H, D=D, BLOCK_T=BT, num_warps=4)
            return out
        at = (row_base.unsqueeze(1) + torch.arange(T, device=keys.device)).clamp(max=keys.shape[0] - 1)
        s = torch.einsum("bhd,btd->bht", q.float(), keys[at].float()).clamp(min=0)
        sc = (s * w.unsqueeze(-1)).sum(1) * kscale[at]
        t = torch.arange(T, device=keys.device)
        out.copy_(sc.masked_fill(t.unsqueeze(0) >= seq_lens.unsqueeze(1), float("-inf")))
        return out

    def sparse_mla(self, q, records, idx, rec_stride, fmt: RecordFormat, batch_size, out, sm_scale, splits=None,
                   after_split=None):
        """q bf16 [M, heads, 576]; records: uint8 tensor whose record i starts at byte i * rec_stride;
        idx int32/int64 [M, k] (-1: padding); out bf16 [M, heads, 512]. splits: the selection's splits
        (None: mla_splits(M)); a row's result depends on it, not on M, so rows attended in chunks
        with the whole batch's count equal the whole batch's. after_split: called right after the
        split kernel's launch, before the combine's (what launches beside that kernel); on a CPU
        first."""
        if after_split is not None and not (self.triton and not isinstance(records, list)):
            after_split()
        M, heads, _ = q.shape
        k = idx.shape[1]
        if self.triton and not isinstance(records, list):
            bh = min(self.mla_block_h, heads)
            ns = splits if splits is not None else self.mla_splits(M, heads, k)
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
            if after_split is not None:
                after_split()
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

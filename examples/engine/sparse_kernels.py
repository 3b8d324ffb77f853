"""The two attention-side kernels of the DeepSeek-V3.2-class model (dsv32.py), each with a torch
reference beside it: the DSA indexer's scores (one fused Triton kernel that reads every 132-B fp8
key once) and sparse MLA decode over k selected records read by index (a split-K Triton kernel
and a combine kernel; FlashMLA's fp8 records dequantized either in the split's loop or once, into
bf16 latents the split then reads contiguously: Kernels.MLA_CONFIGS). Kernels picks Triton on
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
    try:  # griddepcontrol.wait: a kernel launched as a programmatic dependent waits for the one before
        from triton.language.extra.cuda import gdc_wait
    except ImportError:  # pragma: no cover - an older Triton launches no programmatic dependents either
        @triton.jit
        def gdc_wait():
            pass

# ---- Triton kernels (GPU) ----

if triton is not None:

    @triton.jit
    def _chain_wait(sync_ptr, target):
        """Spins until *sync_ptr reaches target (an acquire: what the signalling programs wrote before
        their release is visible after it). sparse_mla's chain: griddepcontrol.wait would also wait for
        the RESOLVE launched before the chain, since it waits for every grid still in flight before this
        one (measured on the H100: bench/RESULTS.md), so the chain's kernels wait for each other this way.
        No deadlock: a kernel of the chain starts only once every program of the one before has started
        (they ask for their dependents first), so the programs it waits for hold their SMs already."""
        n = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        while n < target:
            n = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")

    @triton.jit
    def _chain_signal(sync_ptr):
        """This program's writes are done: one more on *sync_ptr (a release, after every thread's stores)."""
        tl.debug_barrier()
        tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")

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
                             H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, WAIT_LAST: tl.constexpr,
                             sync_ptr=None, SIGNAL: tl.constexpr = False):
        """The indexer's scores (_index_tile), one program a tile: grid (tiles a row, rows). Rows at and
        past *bs do nothing; a tile wholly past its row's seq_len stores -inf without reading a key.
        Reads each key once (132 B a token). WAIT_LAST (launched as the programmatic dependent of a
        RESOLVE that lets it start at once): it reads nothing that RESOLVE writes, and its last
        program waits for RESOLVE before it exits, so that the grid completes only after RESOLVE
        and what follows in the stream finds both complete; the others never wait. SIGNAL (instead of
        WAIT_LAST): every program adds 1 to *sync_ptr when its scores are written (a release), for a
        top-k that waits for that count rather than for RESOLVE (hs_topk_args.after_count)."""
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
        if WAIT_LAST:
            if (tb == tl.num_programs(0) - 1) & (b == tl.num_programs(1) - 1):
                gdc_wait()
        if SIGNAL:
            _chain_signal(sync_ptr)

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
    def _latent(base, valid, FP8: tl.constexpr):
        """The 576-element latents of the records at base [N] (pointers to uint8) where valid, zeros
        elsewhere, as bf16 (its first 512, its rotary 64). fp8 records are dequantized (4 tiles of 128,
        float32 scales at byte 512, bf16 rotary at 528); bf16 records are 576 bf16."""
        dn = tl.arange(0, 512)
        dr = tl.arange(0, 64)
        m = valid[:, None]
        if FP8:
            kf = tl.load(base[:, None] + dn[None, :], mask=m, other=0).to(tl.float8e4nv, bitcast=True).to(tl.float32)
            sc = tl.load((base + 512).to(tl.pointer_type(tl.float32))[:, None] + (dn // 128)[None, :], mask=m, other=0.0)
            kn = (kf * sc).to(tl.bfloat16)
            kr = tl.load((base + 528).to(tl.pointer_type(tl.bfloat16))[:, None] + dr[None, :], mask=m, other=0.0)
        else:
            kn = tl.load(base.to(tl.pointer_type(tl.bfloat16))[:, None] + dn[None, :], mask=m, other=0.0)
            kr = tl.load((base + 1024).to(tl.pointer_type(tl.bfloat16))[:, None] + dr[None, :], mask=m, other=0.0)
        return kn, kr

    @triton.jit
    def _attend_tile(qn, qr, kn, kr, valid, sm_scale, m, l_sum, acc):
        """One tile of the online softmax: the latents kn | kr (rows where valid) against the heads' qn |
        qr; returns the running (max, sum, unnormalised output)."""
        s = tl.dot(qn, tl.trans(kn)) + tl.dot(qr, tl.trans(kr))
        s = tl.where(valid[None, :], s * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), kn)
        return m_new, l_sum, acc

    @triton.jit
    def _mla_split(q_ptr, src_ptr, idx_ptr, bs_ptr, acc_ptr, ml_ptr, src_stride, sm_scale, K_SEL, SPLIT_LEN,
                   HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
                   GATHERED: tl.constexpr, sync_ptr=None, wait_for=0, CHAINED: tl.constexpr = False):
        """Sparse MLA decode, absorbed form, one split of the selection: for (row b, heads hb, split sp),
        the unnormalised softmax(q . K_j) V_j over selections [sp * SPLIT_LEN, +SPLIT_LEN); K_j is the
        576-element latent, V_j its first 512. Not GATHERED: the records src_ptr + idx[b, j] *
        src_stride, dequantized in the loop (idx == -1: padding; other negative values are legal
        offsets, so one base can address two allocations). GATHERED: the bf16 latents
        _mla_gather_kernel wrote, row b's at src_ptr + (b * K_SEL + j) * 1152 B, read straight into
        the dots. Writes acc [b, sp, h, 512] and (max, sum) [b, sp, h, 2] for _mla_combine_kernel.
        Rows at and past *bs do nothing. CHAINED (sparse_mla's chain): waits until sync_ptr[0] counts
        wait_for programs of the gather kernel (0: none, the chain's first kernel) and counts itself on
        sync_ptr[1] when done."""
        # A RESOLVE launched beside this kernel (the overlap's next range) may start once every block
        # has started: it touches none of this kernel's rows.
        gdc_launch_dependents()
        if CHAINED:
            _chain_wait(sync_ptr, wait_for)
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
                if GATHERED:  # padding is zeros there; a tile past K_SEL reads the row's last latent
                    t = src_ptr.to(tl.pointer_type(tl.bfloat16)) + \
                        (b.to(tl.int64) * K_SEL + tl.minimum(j, K_SEL - 1))[:, None] * 576
                    kn = tl.load(t + dn[None, :])
                    kr = tl.load(t + 512 + dr[None, :])
                else:
                    kn, kr = _latent(src_ptr + tl.where(valid, idx, 0) * src_stride, valid, FP8)
                m, l_sum, acc = _attend_tile(qn, qr, kn, kr, valid, sm_scale, m, l_sum, acc)
            part = (b.to(tl.int64) * nsplit + sp) * HEADS + h
            tl.store(acc_ptr + part[:, None] * 512 + dn[None, :], acc)
            tl.store(ml_ptr + part * 2, m)
            tl.store(ml_ptr + part * 2 + 1, l_sum)
        if CHAINED:
            _chain_signal(sync_ptr + 1)

    @triton.jit
    def _mla_gather_kernel(rec_ptr, idx_ptr, bs_ptr, lat_ptr, rec_stride, K_SEL, BLOCK_J: tl.constexpr,
                           FP8: tl.constexpr, sync_ptr=None, CHAINED: tl.constexpr = False):
        """The selected records of row b as bf16 latents, once: lat[b, j] = _latent of record idx[b, j]
        (rec_ptr + idx * rec_stride), zeros for padding (idx == -1). Grid (rows, selections /
        BLOCK_J); rows at and past *bs do nothing. _mla_split (GATHERED) then reads them
        contiguously, with no conversion in its loop, however many head blocks read the same row.
        CHAINED (sparse_mla's chain): lets the split kernel after it start at once, and counts itself on
        sync_ptr[0] when done."""
        if CHAINED:
            gdc_launch_dependents()
        b = tl.program_id(0)
        if b < tl.load(bs_ptr):
            j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
            live = j < K_SEL
            idx = tl.load(idx_ptr + b.to(tl.int64) * K_SEL + j, mask=live, other=-1).to(tl.int64)
            valid = idx != -1
            kn, kr = _latent(rec_ptr + tl.where(valid, idx, 0) * rec_stride, valid, FP8)
            dst = lat_ptr + (b.to(tl.int64) * K_SEL + j)[:, None] * 576
            tl.store(dst + tl.arange(0, 512)[None, :], kn, mask=live[:, None])
            tl.store(dst + 512 + tl.arange(0, 64)[None, :], kr, mask=live[:, None])
        if CHAINED:
            _chain_signal(sync_ptr)

    @triton.jit
    def _mla_combine_kernel(acc_ptr, ml_ptr, bs_ptr, out_ptr, NSPLIT, HEADS: tl.constexpr, BLOCK_H: tl.constexpr,
                            sync_ptr=None, wait_for=0, CHAINED: tl.constexpr = False):
        """out[b, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits of row b.
        CHAINED (sparse_mla's chain): waits until sync_ptr[1] counts the wait_for programs of the split
        kernel; the last of its own programs to finish sets sync_ptr[0..2] back to 0 for the next chain
        (every program of the chain has passed its wait by then)."""
        if CHAINED:
            _chain_wait(sync_ptr + 1, wait_for)
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
        if CHAINED:
            tl.debug_barrier()
            done = tl.atomic_add(sync_ptr + 2, 1, sem="acq_rel", scope="gpu")
            if done == tl.num_programs(0) * tl.num_programs(1) - 1:
                tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(sync_ptr + 2, 0, sem="relaxed", scope="gpu")


class Kernels:
    """The indexer's scores and the sparse attention: Triton on a GPU (triton=True), torch elsewhere.
    Both modes of the benchmark call the same implementation on the same records in the same order,
    so their logits are bit-identical whichever is used."""

    # (way, heads a block, records a step, warps, stages): "fused" dequantizes each tile of records in
    # the loop of every head block (_mla_split); "gathered" writes the selected latents once
    # (_mla_gather_kernel) and _mla_split attends over them. stages 0: Triton's default.
    MLA_CONFIGS = [("fused", 32, 32, 4, 0), ("fused", 32, 64, 8, 0),
                   ("gathered", 32, 64, 4, 3), ("gathered", 32, 64, 8, 3), ("gathered", 64, 64, 8, 2),
                   ("gathered", 64, 32, 8, 3), ("gathered", 16, 64, 4, 3)]

    def __init__(self, use_triton: bool, sms: int = 132) -> None:
        self.triton = use_triton and triton is not None
        self.sms = sms
        # The H200's pick at 32 rows (tune_mla; bench/RESULTS.md, "Sparse MLA over gathered latents").
        self.mla_way, self.mla_block_h, self.mla_block_n, self.mla_warps, self.mla_stages = "gathered", 32, 64, 4, 3
        self._parts: Dict[tuple, tuple] = {}  # a launch shape -> its split partials (and gathered latents)
        self._chain_sync = None  # sparse_mla's chain: its kernels' counters (int32 [3]), made at the first chain

    @property
    def mla_config(self) -> tuple:
        return (self.mla_way, self.mla_block_h, self.mla_block_n, self.mla_warps, self.mla_stages)

    @mla_config.setter
    def mla_config(self, c: tuple) -> None:
        self.mla_way, self.mla_block_h, self.mla_block_n, self.mla_warps, self.mla_stages = c
        self._parts.clear()

    @staticmethod
    def mla_tag(c: tuple) -> str:
        way, bh, bn, warps, stages = c
        return f"{way} {bh}x{bn}/{warps}w" + (f"/{stages}s" if stages else "")

    def tune_mla(self, fmt: RecordFormat, M: int, heads: int = 128, k: int = 2048) -> Dict[str, float]:
        """Times the sparse MLA kernels' ways and tile shapes (MLA_CONFIGS) at M rows on random records
        and keeps the fastest. Both modes then run the same kernels."""
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
        for config in self.MLA_CONFIGS:
            self.mla_config = config
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
                print(f"mla {self.mla_tag(config)}: {type(e).__name__}")
                continue
            t = a.elapsed_time(b) / 10
            times[self.mla_tag(config)] = round(t * 1e3, 1)  # µs
            if best is None or t < best[0]:
                best = (t, config)
        self.mla_config = best[1]
        return times

    def mla_splits(self, M: int, heads: int, k: int) -> int:
        """Splits of the selection per (row, head block): enough CTAs for two waves of the GPU."""
        ctas = M * max(1, heads // self.mla_block_h)
        s = 1
        while ctas * s < 2 * self.sms and k // (2 * s) >= 64:
            s *= 2
        return s

    @staticmethod
    def index_programs(T: int, M: int) -> int:
        """Programs of the grid indexer over M rows of T scores (what its count reaches, index_scores)."""
        return -(-T // 128) * M

    def index_scores(self, q, w, keys, kscale, seq_lens, batch_size, out, row_base, ctas: int = 0, unroll: int = 1,
                     after_resolve: bool = False, count=None):
        """q [M, H, D], w float32 [M, H], keys [P, D] and kscale float32 [P]: a pool in which row b's
        token t is entry row_base[b] + t (int64 [M]); out float32 [M, T] (rows T floats apart: a
        slice of rows of a larger buffer will do). ctas > 0: a grid of at most that many programs,
        resident at once, that asks for its dependents at its start (what a RESOLVE launched beside
        it needs), each taking `unroll` tiles at a time; the scores are the same bits either way.
        after_resolve (the grid kernel): launched as the programmatic dependent of the kernel just
        before it, a RESOLVE that let its dependents start early (HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS)
        or an append (hs_append always does): it runs beside that kernel, and completes after it;
        with count (an int32 [1] tensor) it does not wait for that RESOLVE but adds its programs
        (index_programs) to count as they finish, for a top-k launched after it with after_count
        (hisparse.topk), which then need not wait for RESOLVE either."""
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
                signal = dict(sync_ptr=count, SIGNAL=True) if count is not None and after_resolve else {}
                _index_scores_kernel[(n_tb, M)](q, w, keys, kscale, seq_lens, batch_size, row_base, out, T,
                                                H=H, D=D, BLOCK_T=BT, WAIT_LAST=after_resolve and not signal,
                                                num_warps=4, **signal,
                                                **({"launch_pdl": True} if after_resolve else {}))
            return out
        at = (row_base.unsqueeze(1) + torch.arange(T, device=keys.device)).clamp(max=keys.shape[0] - 1)
        s = torch.einsum("bhd,btd->bht", q.float(), keys[at].float()).clamp(min=0)
        sc = (s * w.unsqueeze(-1)).sum(1) * kscale[at]
        t = torch.arange(T, device=keys.device)
        out.copy_(sc.masked_fill(t.unsqueeze(0) >= seq_lens.unsqueeze(1), float("-inf")))
        return out

    def sparse_mla(self, q, records, idx, rec_stride, fmt: RecordFormat, batch_size, out, sm_scale, splits=None,
                   after_split=None, chained: bool = False):
        """q bf16 [M, heads, 576]; records: uint8 tensor whose record i starts at byte i * rec_stride;
        idx int32/int64 [M, k] (-1: padding); out bf16 [M, heads, 512]. splits: the selection's splits
        (None: mla_splits(M)); a row's result depends on it, not on M, so rows attended in chunks
        with the whole batch's count equal the whole batch's. after_split: called right after the
        split kernel's launch, before the combine's (what launches beside that kernel); on a CPU
        first. chained: every kernel is launched as the programmatic dependent of the one before it;
        the first starts as soon as the kernel before it in the stream lets it (a RESOLVE launched
        with HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS) and never waits for that kernel, so it must read
        nothing that kernel writes; each later one waits for the programs of the one before through a
        counter (_chain_wait), not griddepcontrol.wait, which would wait for that kernel too. The
        kernel before the chain must be an ordinary launch (it then starts after everything before
        it, so the chain's buffers, shared by launches of the same size, are free), and whatever reads
        that kernel's results must come after an ordinary launch, which waits for every grid before
        it (dsv32.Overlap.under). The first chain is eager: it makes the counters."""
        if after_split is not None and not (self.triton and not isinstance(records, list)):
            after_split()
        M, heads, _ = q.shape
        k = idx.shape[1]
        if self.triton and not isinstance(records, list):
            bh = min(self.mla_block_h, heads)
            ns = splits if splits is not None else self.mla_splits(M, heads, k)
            gathered = self.mla_way == "gathered"
            key = (M, heads, ns, bh, k if gathered else 0, q.device)
            if key not in self._parts:  # allocated once per shape, before graph capture reuses it
                self._parts[key] = (torch.empty(M, ns, heads, 512, dtype=torch.float32, device=q.device),
                                    torch.empty(M, ns, heads, 2, dtype=torch.float32, device=q.device),
                                    torch.empty(M, k, 576, dtype=torch.bfloat16, device=q.device) if gathered else None)
            acc, ml, lat = self._parts[key]
            split_len = (k + ns - 1) // ns
            bn = self.mla_block_n
            split_len = (split_len + bn - 1) // bn * bn
            opts = dict(num_warps=self.mla_warps, **({"num_stages": self.mla_stages} if self.mla_stages else {}))
            chain = {}
            if chained:  # three counters, zero between chains (the combine kernel leaves them so)
                if self._chain_sync is None or self._chain_sync.device != q.device:
                    self._chain_sync = torch.zeros(3, dtype=torch.int32, device=q.device)
                chain = dict(sync_ptr=self._chain_sync, CHAINED=True, launch_pdl=True)
            g_grid = (M, triton.cdiv(k, 32))
            if gathered:
                _mla_gather_kernel[g_grid](records, idx, batch_size, lat, rec_stride, k, BLOCK_J=32, FP8=fmt.fp8,
                                           num_warps=4, **chain)
            s_grid = (M, heads // bh, ns)
            _mla_split[s_grid](q, lat if gathered else records, idx, batch_size, acc, ml, rec_stride, sm_scale, k,
                               split_len, HEADS=heads, BLOCK_H=bh, BLOCK_N=bn, FP8=fmt.fp8, GATHERED=gathered,
                               **opts, **chain, **({"wait_for": g_grid[0] * g_grid[1]} if chained and gathered else {}))
            if after_split is not None:
                after_split()
            _mla_combine_kernel[(M, heads // 16)](acc, ml, batch_size, out, ns, HEADS=heads, BLOCK_H=16, num_warps=4,
                                                  **chain, **({"wait_for": s_grid[0] * s_grid[1] * s_grid[2]}
                                                              if chained else {}))
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

"""KV backends of the serving benchmark (serve_bench.py) for dsv32.Model: the decode state of a batch
bucket, full HBM (FullKV), hisparse (HisparseKV) and the hybrid of the two (HybridKV). Each gives
the attention kernel a records base, per-selection record indices and a stride, so that all three
feed the same kernel on the same bytes in the same order: their logits are bit-identical.
"""

from __future__ import annotations

from typing import Dict, List

import torch

from dsv32 import V32Config
from engine import RecordFormat


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
        # RESOLVE writes each selection's record index in the arena (resolve.h rule 9, the page-table
        # output): attention reads it as is, with no index kernel in between.
        return self.resolve_rows(layer, st, 0, self.rows.shape[0], st.batch_size)

    def resolve_rows(self, layer: int, st: DecodeState, a: int, b: int, batch_size, max_blocks: int = 0,
                     beside: bool = False, programmatic: bool = False, consumer_warps: int = 0,
                     early_dependents: bool = False):
        """RESOLVE of rows [a, b) alone (the overlap's chunks, dsv32.Overlap): views of the step's
        tensors, batch_size the range's own device count; the page table's rows [a, b) are written.
        beside: launched beside the kernel before it (HS_RESOLVE_LAUNCH_BESIDE); programmatic: as
        its programmatic dependent (HS_RESOLVE_LAUNCH_PROGRAMMATIC); consumer_warps: the warps of
        each block that fetch (hs_resolve_args.consumer_warps; 0: the library's choice);
        early_dependents: the next kernel, launched as its programmatic dependent, may start at
        once (HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS)."""
        self.session.resolve(layer, self.rows[a:b], st.seq_lens[a:b], st.positions[a:b], None,
                             page_table=self.page_table[a:b], batch_size=batch_size, max_blocks=max_blocks,
                             beside=beside, programmatic=programmatic, consumer_warps=consumer_warps,
                             early_dependents=early_dependents)
        return self.arena, self.page_table, self.stride

    def prewarm_rows(self, layer: int, st: DecodeState, a: int, b: int, batch_size, max_blocks: int = 0,
                     granule_bytes: int = 0, granule_stride: int = 1, granule_phase: int = 0,
                     beside: bool = False) -> None:
        """The GPU's translations of rows [a, b)'s host records of `layer`, made ahead of their
        RESOLVE (hs_prewarm) on the current stream; batch_size the range's device count. It writes
        nothing, so it may run beside other work (dsv32.Overlap.prewarm): beside, launched beside the
        kernel before it (HS_RESOLVE_LAUNCH_BESIDE); one granule in granule_stride read."""
        self.session.prewarm(layer, self.rows[a:b], st.seq_lens[a:b], batch_size=batch_size, max_blocks=max_blocks,
                             granule_bytes=granule_bytes, granule_stride=granule_stride, granule_phase=granule_phase,
                             beside=beside)

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

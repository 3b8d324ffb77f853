"""Speculative decoding in the SGLang-adapter mode: run_engine.py --adapter sglang --draft-tokens n.

sglang_mode.py's scheduler with SGLang's EAGLE/MTP round in place of the plain decode step, driving
hisparse.integrations.sglang_mtp.HisparsedMTPCoordinator as SGLang's EAGLE worker drives
HiSparseMTPCoordinator (sgl-project/sglang PR #37771): each round a request verifies q = n + 1
tokens (its last output and n drafts from mtp.py's draft head), whose KV locations the scheduler
allocates (logical locations only) at positions seq_len .. seq_len + n and points at ring slots
(assign_spec_ring_slots_batch); the target-verify forward writes their KV through the mapping, runs the DSA indexer once per query token (top-k positions over
[0, P_t + 1), given to the backend as the fused top-k's logical KV ids) and calls
swap_in_verify_pages per layer; then a seeded random count a in [1, q] is accepted (the same in
both modes), the rejected drafts' locations are freed and backup_committed_tokens runs. The
baseline is the same round on SGLang's full pool, whose page table is the logical ids themselves.
Every (request, round) row's q x vocab logits must be bit-identical.
"""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn.functional as F

from engine import RecordFormat, SparseDecoder, _rms, _rope
from mtp import DraftHead
from sglang_mode import Req, Scheduler, Workload, padded_bs
from sglang_standins import ForwardBatch, ForwardMode


class VerifyBuffers:
    """The EAGLE worker's static verify inputs and output (one captured graph per padded bs)."""

    def __init__(self, model: SparseDecoder, max_bs: int, q: int, k: int, max_ctx: int) -> None:
        dev = model.device
        self.q, self.k = q, k
        self.tokens = torch.zeros(max_bs, q, dtype=torch.long, device=dev)  # [:, 0] verified, then drafts
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)  # committed lengths
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(max_bs * q, dtype=torch.int64, device=dev)
        self.positions = torch.full((max_bs, q, k), -1, dtype=torch.int32, device=dev)
        self.ids = torch.full((max_bs, q, k), -1, dtype=torch.int32, device=dev)
        self.tq = torch.arange(q, dtype=torch.int64, device=dev)
        self.tpos = torch.arange(max_ctx, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(max_bs, q, model.cfg.vocab, dtype=torch.float32, device=dev)


@torch.no_grad()
def forward_verify(model: SparseDecoder, fmt: RecordFormat, pool, req_to_token: torch.Tensor, buf: VerifyBuffers,
                   draft: DraftHead, bs: int, attend, write=None) -> None:
    """One target-verify forward of the first bs rows (graph-capturable): drafts proposed from the
    verified token, then per layer the q tokens' records and index keys into the pool at
    out_cache_loc, the indexer per query token, attend(layer, ids [bs * q, k], bs) -> (page table
    [bs * q, k], records), sparse MLA. Logits into buf.logits[:bs]. write(layer, loc, records), if
    given, replaces the record write (vllm_serve_mode.py)."""
    c, q, k = model.cfg, buf.q, buf.k
    tokens = buf.tokens[:bs]
    for t in range(1, q):
        tokens[:, t] = draft.propose(tokens[:, t - 1])
    rpi, loc = buf.req_pool_indices[:bs], buf.out_cache_loc[:bs * q]
    pos = (buf.seq_lens[:bs].long().unsqueeze(1) + buf.tq).reshape(-1)  # [bs * q]
    positions, ids = buf.positions[:bs], buf.ids[:bs]
    row_locs = req_to_token[rpi].long()  # [bs, max_ctx]
    h = model.embed[tokens.reshape(-1)]
    for l, W in enumerate(model.layers):
        x = _rms(h)
        rec = fmt.encode(_rope(x @ W["wkv"], pos, c.rope_dim))
        if write is None:
            pool.write_kv(l, loc, rec)  # through the mapping
        else:
            write(l, loc, rec)
        if c.anchor(l) == l:
            pool.index_k[l].index_copy_(0, loc, model._index_key(W, x))
            keys = pool.index_k[l][row_locs]  # [bs, max_ctx, idx_dim]
            iq = (x @ W["iq"]).view(bs, q * c.idx_heads, c.idx_dim) + (c.locality * W["u"])
            iw = torch.sigmoid((x @ W["iw"]).float()).view(bs, q, c.idx_heads, 1)
            sc = torch.bmm(iq, keys.transpose(1, 2)).view(bs, q, c.idx_heads, -1)
            score = (F.relu(sc.float()) * iw).sum(2)  # [bs, q, max_ctx]
            score = score.masked_fill(buf.tpos.view(1, 1, -1) > pos.view(bs, q, 1), float("-inf"))
            top_v, top_i = score.topk(k, dim=-1)
            positions.copy_(top_i.masked_fill(torch.isinf(top_v), -1))
            # The fused top-k's output: the logical KV id (pool location) of each selected position.
            found = torch.gather(row_locs, 1, positions.clamp(min=0).view(bs, q * k).long()).view(bs, q, k)
            ids.copy_(torch.where(positions >= 0, found, torch.full_like(found, -1)))
        table, records = attend(l, ids.view(bs * q, k), bs)
        lat = fmt.decode(records[table.clamp(min=0).long()][..., :fmt.record_bytes])  # [bs * q, k, 576]
        qv = _rope((x @ W["wq"]).view(bs * q, c.n_heads, c.latent), pos.unsqueeze(1), c.rope_dim)
        att = torch.bmm(qv, lat.transpose(1, 2)).float() * model.scale
        att = att.masked_fill((positions < 0).view(bs * q, 1, k), float("-inf"))
        p = torch.softmax(att, dim=-1).to(torch.bfloat16)
        o = torch.bmm(p, lat[..., :c.kv_lora])
        h = h + o.reshape(bs * q, c.n_heads * c.kv_lora) @ W["wo"]
        h = model._mlp(W, h)
    buf.logits[:bs].copy_((_rms(h) @ model.lm_head).float().view(bs, q, -1))


class MtpScheduler(Scheduler):
    """Scheduler with EAGLE rounds of q = draft_tokens + 1 verify tokens (see the module docstring)."""

    draft_tokens = 1  # set by make_mtp_scheduler
    overlap_supported = False  # a verify round's accepted count decides the next round's inputs

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, work: Workload, *, k: int, make_coordinator,
                 use_graph: bool, overlap: bool = False) -> None:
        super().__init__(model, fmt, work, k=k, make_coordinator=make_coordinator, use_graph=use_graph,
                         overlap=False)
        self.q = q = self.draft_tokens + 1
        max_ctx = self.req_to_token_pool.max_context_len
        self.vbuf = VerifyBuffers(model, self.max_bs, q, k, max_ctx)
        self.draft = DraftHead(model, 1000 + len(work.specs))
        gen = torch.Generator().manual_seed(7 + len(work.specs))
        self.accept = {r.rid: torch.randint(1, q + 1, (4 * max_ctx,), generator=gen).tolist() for r in self.reqs}
        self.rounds = {r.rid: 0 for r in self.reqs}

    def attend(self, layer: int, ids: torch.Tensor, bs: int):
        if self.coord is None:  # the full pool: the logical ids are the locations
            return ids, self.pool.records(layer)
        forward_batch = ForwardBatch(ForwardMode.TARGET_VERIFY, self.vbuf.req_pool_indices[:bs],
                                     self.vbuf.seq_lens[:bs], None)
        return self.forward_extend(layer, ids, forward_batch)

    def forward_extend(self, layer: int, ids: torch.Tensor, forward_batch: ForwardBatch):
        """The DSA backend's forward_extend in TARGET_VERIFY mode (the MTP coordinator serves the
        arena to it; the verify swap-in's call site is assumed from PR #37771): the device pool's
        get_key_buffer, then the verify swap-in whose indices index it."""
        kv = self.pool.dsa.get_key_buffer(layer)
        table = self.coord.swap_in_verify_pages(forward_batch.req_pool_indices, forward_batch.seq_lens, ids, layer,
                                                self.q)
        return table, kv.view(kv.shape[0], -1)

    def decode(self, batch: List[Req]) -> tuple:
        """prepare_for_verify + the verify forward; returns (logits [n, q, vocab], tokens [n, q]) on the CPU."""
        n, q, b, dev = len(batch), self.q, self.vbuf, self.model.device
        bs = padded_bs(n, self.max_bs)
        starts = [r.seqlen - 1 for r in batch]  # committed KV; the verify tokens follow
        locs = self.pool.alloc_decode(n * q)  # logical locations only, under hisparse
        rpi = torch.tensor([r.req_pool_idx for r in batch], dtype=torch.int64)
        cols = torch.tensor(starts, dtype=torch.int64).unsqueeze(1) + torch.arange(q)
        self.req_to_token_pool.req_to_token[rpi.to(dev).unsqueeze(1), cols.to(dev)] = locs.view(n, q).to(torch.int32)
        b.tokens[:n, 0] = torch.tensor([r.output_ids[-1] for r in batch], device=dev)
        b.seq_lens[:n] = torch.tensor(starts, dtype=torch.int32, device=dev)
        b.req_pool_indices[:n], b.out_cache_loc[:n * q] = rpi.to(dev), locs
        for r, start in zip(batch, starts):
            r.kv.kv_allocated_len = start + q
        b.tokens[n:bs], b.seq_lens[n:bs], b.req_pool_indices[n:bs], b.out_cache_loc[n * q:bs * q] = 0, 1, 0, 0
        if self.coord is not None:
            self.coord.assign_spec_ring_slots_batch(batch, starts, [s + q for s in starts])
            self.coord.wait_admission_staging_before_verify(batch)
            self.coord.num_real_reqs.fill_(n)
        self._run_forward(bs)
        return b.logits[:n].to("cpu", copy=True), b.tokens[:n].to("cpu", copy=True)

    def forward(self, bs: int) -> None:
        forward_verify(self.model, self.fmt, self.pool, self.req_to_token_pool.req_to_token, self.vbuf, self.draft,
                       bs, self.attend)

    def commit(self, batch: List[Req], out: tuple, logits: Dict[str, List[torch.Tensor]], step: int) -> None:
        """Verification: a of the q tokens accepted; the outputs gain the a - 1 accepted drafts and
        the token after them; the rejected drafts' KV locations are freed."""
        rows, tokens = out
        r2t = self.req_to_token_pool.req_to_token
        for i, r in enumerate(batch):
            logits[r.rid].append(rows[i])
            a = self.accept[r.rid][self.rounds[r.rid]]
            self.rounds[r.rid] += 1
            start = r.seqlen - 1
            rejected = r2t[r.req_pool_idx, start + a:start + self.q]
            if self.coord is None:
                self.pool.free(rejected.long())
            else:
                self.pool.free_rejected(rejected.long())
            r.kv.kv_allocated_len = start + a
            rejected.zero_()
            r.output_ids += tokens[i, 1:a].tolist() + [int(rows[i, a - 1].argmax())]
            r.kv_committed_len = start + a
        if self.coord is not None:
            self.coord.backup_committed_tokens(batch)


def make_mtp_scheduler(draft_tokens: int):
    """An MtpScheduler class for n = draft_tokens drafts a round (run_sglang's scheduler=)."""
    return type(f"MtpScheduler{draft_tokens}", (MtpScheduler,), {"draft_tokens": draft_tokens})

"""Speculative (MTP-style) decoding in the example engine: n + 1 query tokens per row and step.

Each step a row runs the model on q = n + 1 query tokens at once: the token verified last step and
n drafts that a cheap draft head proposes from it (draft t + 1 = argmax of a bigram head applied to
draft t). Every query token gets its own hidden state, its own KV record (appended at its
position), its own DSA-indexer top-k over the positions before and at it, and its own sparse
attention; the tokens of one step see each other only through the records they select, as in
DeepSeek's MTP verification pass. Verification is replaced by a seeded random acceptance: the row
keeps a in [1, q] of its query tokens (the same draws in both modes), advances its length by a and
continues from the argmax of query a - 1's logits. The next step's query tokens start at the first
rejected position, so their appends rewrite the rejected drafts' records.

The two KV backends of engine.py gain the multi-query data path:
  - FullKV: q records a row appended by position, [batch, q, k] selections gathered by position;
  - HisparseKV on a session with draft_tokens = n: hs_append_tokens (q tokens into tail slots
    B..B+n and the host pool), one multi-query RESOLVE per layer (resolve.h rule 8: the union of
    the q lists made resident at once) and the gather through its page table (rule 9).
Everything after the gather is the same code, so the logits of all q query tokens must be bit-for-
bit equal at every step: run_engine.py --draft-tokens checks that.
"""

from __future__ import annotations

import time
from typing import List, Optional

import torch
import torch.nn.functional as F

from engine import FullKV, HisparseKV, RecordFormat, RunResult, SparseDecoder, _rms, _rope, prefill


class MtpState:
    """The speculative step's static inputs, updated in place (one captured graph serves every step)."""

    def __init__(self, model: SparseDecoder, batch: int, k: int, n: int, max_len: int, prompt_len: int,
                 first_tokens: torch.Tensor, accept: torch.Tensor) -> None:
        cfg, dev = model.cfg, model.device
        self.batch, self.k, self.n, self.q, self.max_len = batch, k, n, n + 1, max_len
        self.ar = torch.arange(batch, device=dev)
        self.ar_q = self.ar.repeat_interleave(self.q)  # the row of every query token, [batch * q]
        self.tq = torch.arange(self.q, device=dev)
        self.tokens = torch.zeros(batch, self.q, dtype=torch.long, device=dev)  # [:, 0] verified, then drafts
        self.tokens[:, 0] = first_tokens.to(dev)
        # seq_len counts every query token of the step: the q newest positions are the queries.
        self.seq_lens = torch.full((batch,), prompt_len + self.q, dtype=torch.int32, device=dev)
        self.query_counts = torch.full((batch,), self.q, dtype=torch.int32, device=dev)
        self.positions = torch.full((batch, self.q, k), -1, dtype=torch.int32, device=dev)
        self.tpos = torch.arange(max_len, dtype=torch.int32, device=dev)
        self.accept = accept.to(device=dev, dtype=torch.int32)  # [steps, batch], values in [1, q]
        self.step = torch.zeros(1, dtype=torch.long, device=dev)
        self.prompt_len = prompt_len
        self.idx_cache = [torch.zeros(batch, max_len, cfg.idx_dim, dtype=torch.bfloat16, device=dev)
                          if cfg.anchor(l) == l else None for l in range(cfg.n_layers)]

    def query_positions(self) -> torch.Tensor:
        """[batch, q] int64: position seq_len - q + t of query token t."""
        return (self.seq_lens - self.q).long().unsqueeze(1) + self.tq


class DraftHead:
    """A cheap draft model: next token = argmax(lm_head(rms(embed[token] @ W))), a random bigram head."""

    def __init__(self, model: SparseDecoder, seed: int) -> None:
        d = model.cfg.d_model
        g = torch.Generator().manual_seed(seed)
        self.w = (torch.randn(d, d, generator=g) / d ** 0.5).to(device=model.device, dtype=torch.bfloat16)
        self.model = model

    def propose(self, tokens: torch.Tensor) -> torch.Tensor:
        m = self.model
        return (_rms(m.embed[tokens] @ self.w) @ m.lm_head).float().argmax(-1)


class FullKVMulti:
    """FullKV's caches with the multi-query append and gather."""

    def __init__(self, kv: FullKV) -> None:
        self.kv, self.fmt, self.mode = kv, kv.fmt, kv.mode

    def append(self, layer: int, recs: torch.Tensor, st: MtpState) -> None:  # recs [batch * q, R]
        self.kv.cache[layer].index_put_((st.ar_q, st.query_positions().reshape(-1)), recs)

    def gather(self, layer: int, st: MtpState) -> torch.Tensor:  # [batch, q, k, R]
        return self.kv.cache[layer][st.ar.view(-1, 1, 1), st.positions.clamp(min=0).long()]


class HisparseKVMulti:
    """HisparseKV on a draft_tokens = n session: q appends into the tail slots, one multi-query
    RESOLVE per layer, and the gather of each selection's record from the slot arena by RESOLVE's
    page table (rule 9: the record's index in the arena viewed as [records, record_stride], its
    tail slots included), as a FlashMLA-style sparse kernel would take `indices`."""

    def __init__(self, kv: HisparseKV, st: MtpState) -> None:
        s = kv.session
        if s.draft_tokens != st.n:
            raise ValueError(f"the session has draft_tokens {s.draft_tokens}; the run drafts {st.n}")
        self.kv, self.fmt, self.mode, self.session = kv, kv.fmt, kv.mode, s
        self.page_table = torch.full_like(st.positions, -1)

    def append(self, layer: int, recs: torch.Tensor, st: MtpState) -> None:
        self.session.append(layer, self.kv.rows, st.seq_lens, recs, batch_size=self.kv.batch_size,
                            token_counts=st.query_counts)

    def gather(self, layer: int, st: MtpState) -> torch.Tensor:
        self.session.resolve(layer, self.kv.rows, st.seq_lens, st.positions, None, batch_size=self.kv.batch_size,
                             query_counts=st.query_counts, page_table=self.page_table,
                             programmatic=self.kv.programmatic)
        return self.kv.records[self.page_table.clamp(min=0).long()][..., :self.fmt.record_bytes]


@torch.no_grad()
def mtp_logits(model: SparseDecoder, kv, st: MtpState) -> torch.Tensor:
    """One speculative step for every row: float32 logits [batch, q, vocab]. Graph-capturable."""
    c, b, q = model.cfg, st.batch, st.q
    pos = st.query_positions().reshape(-1)  # [b * q]
    h = model.embed[st.tokens.reshape(-1)]
    for l, W in enumerate(model.layers):
        x = _rms(h)
        kv.append(l, kv.fmt.encode(_rope(x @ W["wkv"], pos, c.rope_dim)), st)
        if c.anchor(l) == l:
            st.idx_cache[l].index_put_((st.ar_q, pos), model._index_key(W, x))
            # The DSA indexer once per query token: top-k among [0, P_t + 1).
            iq = (x @ W["iq"]).view(b, q * c.idx_heads, c.idx_dim) + (c.locality * W["u"])
            iw = torch.sigmoid((x @ W["iw"]).float()).view(b, q, c.idx_heads, 1)
            sc = torch.bmm(iq, st.idx_cache[l].transpose(1, 2)).view(b, q, c.idx_heads, -1)
            score = (F.relu(sc.float()) * iw).sum(2)  # [b, q, max_len]
            score = score.masked_fill(st.tpos.view(1, 1, -1) > pos.view(b, q, 1), float("-inf"))
            top_v, top_i = score.topk(st.k, dim=-1)
            st.positions.copy_(top_i.masked_fill(torch.isinf(top_v), -1))
        lat = kv.fmt.decode(kv.gather(l, st)).view(b * q, st.k, -1)  # [b * q, k, 576]
        qv = _rope((x @ W["wq"]).view(b * q, c.n_heads, c.latent), pos.unsqueeze(1), c.rope_dim)
        att = torch.bmm(qv, lat.transpose(1, 2)).float() * model.scale
        att = att.masked_fill((st.positions < 0).view(b * q, 1, st.k), float("-inf"))
        p = torch.softmax(att, dim=-1).to(torch.bfloat16)
        o = torch.bmm(p, lat[..., :c.kv_lora])
        h = h + o.reshape(b * q, c.n_heads * c.kv_lora) @ W["wo"]
        h = model._mlp(W, h)
    return (_rms(h) @ model.lm_head).float().view(b, q, -1)


@torch.no_grad()
def run_mtp(model: SparseDecoder, fmt: RecordFormat, *, batch: int, prompt_len: int, k: int, steps: int,
            draft_tokens: int, session=None, seed: int = 1, chunk: int = 4096, use_graph: bool = True,
            first_request_id: int = 1) -> RunResult:
    """Prefills `batch` random prompts and decodes `steps` speculative steps of draft_tokens + 1 query
    tokens with random acceptance, the KV in HBM (session None) or in hisparse (a session opened with
    draft_tokens). RunResult.logits is [steps, batch, q, vocab]; .tokens [steps, batch] the token
    each step continues from; .accepted [steps, batch]."""
    cfg, dev = model.cfg, model.device
    if cfg.selection != "indexer":
        raise ValueError("speculative decoding runs the DSA indexer selection")
    cuda = dev.type == "cuda"
    use_graph = use_graph and cuda
    q = draft_tokens + 1
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=gen)
    first = torch.randint(0, cfg.vocab, (batch,), generator=gen)
    accept = torch.randint(1, q + 1, (steps, batch), generator=gen)
    max_len = prompt_len + (steps + 1) * q
    st = MtpState(model, batch, k, draft_tokens, max_len, prompt_len, first, accept)
    draft = DraftHead(model, seed + 1000)
    if session is None:
        kv = FullKVMulti(FullKV(cfg, fmt, batch, max_len, dev))
    else:
        kv = HisparseKVMulti(HisparseKV(session, cfg, fmt, batch, prompt_len, max_len, dev, first_request_id), st)

    prefill_s = prefill(model, fmt, prompts, st.idx_cache, kv.kv.store, chunk)
    before = session.stats() if session is not None else None

    out_logits = torch.zeros(batch, q, cfg.vocab, dtype=torch.float32, device=dev)
    out_accept = torch.zeros(batch, dtype=torch.int32, device=dev)
    logits_hist = torch.empty(steps, batch, q, cfg.vocab, dtype=torch.float32, device=dev)
    tok_hist = torch.empty(steps, batch, dtype=torch.long, device=dev)
    acc_hist = torch.empty(steps, batch, dtype=torch.int32, device=dev)

    def step():
        for t in range(1, q):
            st.tokens[:, t] = draft.propose(st.tokens[:, t - 1])
        logits = mtp_logits(model, kv, st)
        out_logits.copy_(logits)
        a = st.accept.index_select(0, st.step).view(-1)  # this step's accepted counts, on the device
        out_accept.copy_(a)
        st.tokens[:, 0] = logits[st.ar, (a - 1).long()].argmax(-1)
        st.seq_lens.add_(a)
        st.step.add_(1)

    def keep(i):
        logits_hist[i].copy_(out_logits)
        tok_hist[i].copy_(st.tokens[:, 0])
        acc_hist[i].copy_(out_accept)

    step_ms: List[float] = []
    graph: Optional[torch.cuda.CUDAGraph] = None
    if use_graph:
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            step()  # step 0 eager: warms up the kernels on the capture stream
            keep(0)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                step()
        torch.cuda.current_stream(dev).wait_stream(side)
    for i in range(1 if use_graph else 0, steps):
        t = time.perf_counter()
        if graph is not None:
            graph.replay()
        else:
            step()
        keep(i)
        if cuda:
            torch.cuda.synchronize(dev)
        step_ms.append(1e3 * (time.perf_counter() - t))
    del graph
    if session is not None:
        session.check_errors()
    result = RunResult(kv.mode, logits_hist, tok_hist, step_ms, [], [], kv.kv.kv_bytes(),
                       sum(t.numel() * t.element_size() for t in st.idx_cache if t is not None), prefill_s,
                       use_graph)
    result.accepted = acc_hist
    if session is not None:
        after = session.stats()
        result.hits, result.misses = after.hits - before.hits, after.misses - before.misses
    kv.kv.close()
    return result

#!/usr/bin/env python3
"""Selection traces from a model whose attention has real structure (issue 8, part 2).

On one GPU (default budget: 4 minutes of training, an estimated 5-6 minutes in all on an H200):

 1. Train a byte-level decoder (vocab 256; default 6 layers, d_model 512, 8 heads of 64, RoPE,
    GELU MLP, RMSNorm, tied embeddings) on the training split of the Debian text corpus that
    build_corpus.py wrote (.corpus/train.bin.gz): bf16 autocast, F.scaled_dot_product_attention
    (is_causal), AdamW, linear warm-up then cosine decay over the *time* budget, random windows
    of --train-len bytes.
 2. Freeze the model and train one DSA-style "lightning indexer" per layer (DeepSeek-V3.2):
    index key k_t = RoPE(LayerNorm(W_k x_t)) (one per token), index queries q_{s,h} = RoPE(W_q x_s)
    for a few index heads h, per-query head weights w_{s,h} = W_w x_s, and
    score_{s,t} = sum_h w_{s,h} * ReLU(q_{s,h} . k_t / sqrt(d_i)), x = the layer's normed input.
    Loss: KL(p_s || softmax_t(score_{s,.})), p_s the layer's attention distribution of query s
    averaged over heads (the "head-summed, L1-normalised" target of DSA's warm-up stage), for
    --idx-queries random query rows of each training window, causal.
 3. Teacher-force long held-out documents (.corpus/heldout.jsonl.gz; one request per document,
    distinct source packages) and record, for the last --steps positions s (step i: the decode of
    position s = L - steps + i, seq_len = s + 1) and every layer:
      dsa:    the top k positions t <= s by the indexer's score;
      quest:  Quest page selection: pages of 16 positions, per page and channel the min and max of
              the (RoPE'd) attention keys over the page's positions <= s (the last page partial);
              per head the upper bound sum_c max(q_c min_c, q_c max_c) / sqrt(d), softmax over the
              pages per head, summed over the heads; the top k // 16 pages, all their positions
              <= s (the newest page included when chosen, cut at s);
      oracle: the top k positions by the true attention probability averaged over heads.
    Writes ../shared/TRACE_FORMAT.md traces (header `hisparse-trace 1`, k, layers, model, source,
    method ...): full-size ones to $OUT/traces/ and small ones (for bench/traces/) to $OUT/small/,
    and JSON summary lines (consecutive-step overlap per layer, adjacent-layer overlap, recall of
    dsa and quest against the oracle top k, attention mass covered) to stdout and $OUT/log.jsonl.

Everything goes under $OUT (default ./out). Nothing is downloaded. `--smoke` runs tiny sizes on the
CPU in seconds (and checks the vectorised Quest scores against tracefmt.quest_page_scores).

  python3 examples/traces/train_and_extract.py [--corpus .corpus] [--train-seconds 200] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tracefmt  # noqa: E402

T0 = time.time()
_LOG = None


def log(event: str, **kw) -> None:
    line = json.dumps({"event": event, "t": round(time.time() - T0, 2), **kw})
    print(line, flush=True)
    if _LOG is not None:
        _LOG.write(line + "\n")
        _LOG.flush()


@dataclasses.dataclass
class Cfg:
    vocab: int = 256
    d: int = 512
    layers: int = 6
    heads: int = 8
    mlp: int = 2048
    idx_heads: int = 4
    idx_dim: int = 64
    rope_base: float = 10000.0


# ---- model ----

def rope_tables(n: int, dim: int, base: float, device):
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    f = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)  # [n, dim/2]
    return f.cos(), f.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, dim]; cos/sin [T, dim/2] (rotate-half form), computed in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # torch >= 2.4
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0 (flash attention on the GPU)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]  # the CPU smoke test on an old torch
    lg = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    lg = lg.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return lg.softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, c: Cfg) -> None:
        super().__init__()
        self.H, self.hd = c.heads, c.d // c.heads
        self.n1 = RMSNorm(c.d)
        self.qkv = nn.Linear(c.d, 3 * c.d, bias=False)
        self.o = nn.Linear(c.d, c.d, bias=False)
        self.n2 = RMSNorm(c.d)
        self.fc = nn.Linear(c.d, c.mlp, bias=False)
        self.proj = nn.Linear(c.mlp, c.d, bias=False)

    def forward(self, x, cos, sin, cap=None):
        B, T, D = x.shape
        h = self.n1(x)
        q, k, v = self.qkv(h).view(B, T, 3, self.H, self.hd).permute(2, 0, 3, 1, 4)  # [B, H, T, hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = causal_attention(q, k, v)
        if cap is not None:
            cap.append((h.detach(), q.detach(), k.detach()))
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        return x + self.proj(F.gelu(self.fc(self.n2(x)), approximate="tanh"))


class LM(nn.Module):
    def __init__(self, c: Cfg) -> None:
        super().__init__()
        self.c = c
        self.emb = nn.Embedding(c.vocab, c.d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.nf = RMSNorm(c.d)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.layers) if n.endswith(("o.weight", "proj.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, x, cos, sin, cap=None):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h, cos, sin, cap)
        return F.linear(self.nf(h), self.emb.weight)  # tied output head


class Indexer(nn.Module):
    """DSA-style lightning indexer of one layer (see the module docstring)."""

    def __init__(self, c: Cfg) -> None:
        super().__init__()
        self.Hi, self.di = c.idx_heads, c.idx_dim
        self.wq = nn.Linear(c.d, c.idx_heads * c.idx_dim, bias=False)
        self.wk = nn.Linear(c.d, c.idx_dim, bias=False)
        self.kn = nn.LayerNorm(c.idx_dim)
        self.ww = nn.Linear(c.d, c.idx_heads, bias=False)

    def keys(self, h, cos, sin):  # h [B, T, d] -> [B, T, di]
        return apply_rope(self.kn(self.wk(h).float()), cos, sin)

    def queries(self, h, cos, sin):  # h [B, Q, d], cos/sin at the query positions -> [B, Hi, Q, di], [B, Q, Hi]
        B, Q, _ = h.shape
        q = self.wq(h).float().view(B, Q, self.Hi, self.di).transpose(1, 2)
        return apply_rope(q, cos, sin), self.ww(h).float() * self.Hi ** -0.5

    def scores(self, q, w, k):  # -> [B, Q, T]
        s = torch.einsum("bhqd,btd->bqht", q, k) * self.di ** -0.5
        return torch.einsum("bqht,bqh->bqt", F.relu(s), w)


# ---- data ----

def load_corpus(path: str, smoke: bool):
    train_p, held_p = os.path.join(path, "train.bin.gz"), os.path.join(path, "heldout.jsonl.gz")
    if os.path.exists(train_p) and os.path.exists(held_p):
        train = gzip.open(train_p).read()
        held = [json.loads(line) for line in gzip.open(held_p, "rt", encoding="utf-8")]
        manifest = {}
        mp = os.path.join(path, "manifest.json")
        if os.path.exists(mp):
            manifest = json.load(open(mp))
        return train, held, manifest
    if not smoke:
        sys.exit(f"train_and_extract: no corpus in {path} (run python3 examples/traces/build_corpus.py first)")
    # Smoke without a corpus: this folder's own sources stand in.
    here = os.path.dirname(os.path.abspath(__file__))
    texts = [open(os.path.join(here, f), "rb").read() for f in sorted(os.listdir(here)) if f.endswith(".py")]
    blob = b"\x00".join(texts) * 4
    held = [{"id": i, "package": f"smoke{i}", "files": ["(smoke)"], "kinds": ["python"],
             "text": (blob[i * 997:] + blob)[:20000].decode("utf-8", "ignore")} for i in range(3)]
    return blob, held, {"smoke": True}


def doc_tokens(doc) -> torch.Tensor:
    return torch.frombuffer(bytearray(doc["text"].encode("utf-8")), dtype=torch.uint8).long()


# ---- training ----

def lr_at(step, elapsed, budget, base, warmup):
    w = min(1.0, (step + 1) / warmup)
    frac = min(1.0, elapsed / max(budget, 1e-9))
    return base * w * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def train_lm(model, data, args, dev, cos, sin, amp):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if dev.type == "cuda" else {}))
    T, B = args.train_len, args.batch
    ar = torch.arange(T + 1, device=dev)
    step, t_start, tokens = 0, time.time(), 0
    model.train()
    while True:
        if step % 10 == 0:
            sync(dev)
        elapsed = time.time() - t_start
        if elapsed >= args.train_seconds or (args.max_steps and step >= args.max_steps):
            break
        lr = lr_at(step, elapsed, args.train_seconds, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        ix = torch.randint(0, data.numel() - T - 1, (B,), device=dev)
        xy = data[ix[:, None] + ar].long()
        with amp():
            logits = model(xy[:, :-1], cos[:T], sin[:T])
        loss = F.cross_entropy(logits.float().view(-1, 256), xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += B * T
        if step % args.log_every == 0 or step == 1:
            lv = loss.item()
            log("train", step=step, loss=round(lv, 4), bpb=round(lv / math.log(2), 4), lr=round(lr, 6),
                grad_norm=round(float(gn), 3), tokens=tokens, elapsed=round(time.time() - t_start, 1))
    sync(dev)
    return {"steps": step, "tokens": tokens, "seconds": round(time.time() - t_start, 1),
            "epochs": round(tokens / data.numel(), 2)}


def attn_target(q, k, qpos):
    """Head-averaged attention probabilities of the query rows qpos. q, k [B, H, T, hd] -> [B, Q, T]."""
    hd = q.shape[-1]
    lg = torch.matmul(q[:, :, qpos].float(), k.float().transpose(-1, -2)) * hd ** -0.5  # [B, H, Q, T]
    mask = torch.arange(k.shape[2], device=k.device)[None, :] > qpos[:, None]
    lg.masked_fill_(mask, float("-inf"))
    return lg.softmax(-1).mean(1), mask


def train_indexers(model, idx, data, args, dev, cos, sin, icos, isin, amp):
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(idx.parameters(), lr=args.idx_lr, betas=(0.9, 0.95), weight_decay=0.0)
    T, B = args.train_len, args.batch
    ar = torch.arange(T + 1, device=dev)
    step, t_start = 0, time.time()
    while True:
        if step % 10 == 0:
            sync(dev)
        elapsed = time.time() - t_start
        if elapsed >= args.idx_seconds or (args.max_steps and step >= args.max_steps):
            break
        lr = lr_at(step, elapsed, args.idx_seconds, args.idx_lr, 20)
        for g in opt.param_groups:
            g["lr"] = lr
        ix = torch.randint(0, data.numel() - T - 1, (B,), device=dev)
        x = data[ix[:, None] + ar[:-1]].long()
        cap = []
        with torch.no_grad(), amp():
            model(x, cos[:T], sin[:T], cap)
        lo = min(T - 1, args.idx_min_query)
        qpos = torch.randint(lo, T, (args.idx_queries,), device=dev).sort().values
        total, kls = 0.0, []
        for l, (h, q, k) in enumerate(cap):
            with torch.no_grad():
                p, mask = attn_target(q, k, qpos)
            with amp():
                kk = idx[l].keys(h, icos[:T], isin[:T])
                qi, w = idx[l].queries(h[:, qpos], icos[qpos], isin[qpos])
            s = idx[l].scores(qi.float(), w.float(), kk.float()).masked_fill(mask, -1e9)
            logq = s.log_softmax(-1)
            ce = -(p * logq).sum(-1).mean()
            ent = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
            total = total + ce
            kls.append(float(ce - ent) if step % args.log_every == 0 else None)
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        if step % args.log_every == 0:
            log("indexer", step=step, kl_per_layer=[round(v, 4) for v in kls], lr=round(lr, 6),
                elapsed=round(time.time() - t_start, 1))
        step += 1
    sync(dev)
    return {"steps": step, "seconds": round(time.time() - t_start, 1)}


# ---- extraction ----

def quest_scores(qs, k, qpos, page):
    """Vectorised Quest page scores (see tracefmt.quest_page_scores). qs [H, S, hd] (queries of the
    steps), k [H, L, hd] (keys), qpos [S] -> [S, P] page scores, -inf beyond the step's last page."""
    H, L, hd = k.shape
    P = (L + page - 1) // page
    kp = F.pad(k.float(), (0, 0, 0, P * page - L)).view(H, P, page, hd)
    cmx, cmn = kp.cummax(dim=2).values, kp.cummin(dim=2).values  # prefix max/min within each page
    qp, qm = qs.float().clamp(min=0), qs.float().clamp(max=0)
    ub = qp @ cmx[:, :, page - 1].transpose(1, 2) + qm @ cmn[:, :, page - 1].transpose(1, 2)  # [H, S, P]
    cur, off = qpos // page, qpos % page
    part = (qp * cmx[:, cur, off]).sum(-1) + (qm * cmn[:, cur, off]).sum(-1)  # [H, S]: the step's own page, cut at s
    ub.scatter_(2, cur[None, :, None].expand(H, -1, 1), part[:, :, None])
    ub = ub * hd ** -0.5
    beyond = torch.arange(P, device=k.device)[None, :] > cur[:, None]  # [S, P]
    ub.masked_fill_(beyond[None], float("-inf"))
    return ub.softmax(-1).sum(0).masked_fill(beyond, float("-inf"))


def selections(model, idx, doc, ctx, steps, kmax, page, dev, cos, sin, icos, isin, amp, self_check=False, hmax=0):
    """One request: returns dict method -> int64 [layers, S, kmax + hmax] (score order, best first;
    -1 = none): the first kmax columns are the selection, the next hmax the retention hints (the
    positions ranked kmax+1 .. kmax+hmax by the same score; for quest the next-best pages'
    positions), the oracle probabilities needed for recall/mass, seq_lens, per-position losses."""
    toks = doc_tokens(doc)[:ctx]
    L = toks.numel()
    x = toks[None].to(dev)
    cap = []
    with torch.no_grad(), amp():
        logits = model(x, cos[:L], sin[:L], cap)
    nll = F.cross_entropy(logits[0, :-1].float(), x[0, 1:], reduction="none")
    qpos = torch.arange(L - steps, L, device=dev)
    ar = torch.arange(L, device=dev)
    out = {"dsa": [], "quest": [], "oracle": [], "probs": []}
    with torch.no_grad():
        for l, (h, q, k) in enumerate(cap):
            hd = q.shape[-1]
            qs, kk = q[0, :, qpos].float(), k[0].float()  # [H, S, hd], [H, L, hd]
            mask = ar[None, :] > qpos[:, None]  # [S, L]
            lg = (qs @ kk.transpose(1, 2)) * hd ** -0.5
            lg.masked_fill_(mask[None], float("-inf"))
            p = lg.softmax(-1).mean(0)  # [S, L]
            del lg
            ik = idx[l].keys(h.float(), icos[:L], isin[:L])
            iq, w = idx[l].queries(h[:, qpos].float(), icos[qpos], isin[qpos])
            sc = idx[l].scores(iq, w, ik)[0].masked_fill(mask, float("-inf"))  # [S, L]
            kq = min(kmax + hmax, L)
            res = {}
            for name, score in (("oracle", p.masked_fill(mask, -1.0)), ("dsa", sc)):
                v, i = score.topk(kq, dim=-1)  # sorted, best first
                i = torch.where(i <= qpos[:, None], i, torch.full_like(i, -1))
                res[name] = i
            ps = quest_scores(qs, kk, qpos, page)  # [S, P]
            npg = min((kmax + hmax) // page, ps.shape[1])
            _, tp = ps.topk(npg, dim=-1)  # best first: the selected pages, then the hinted ones
            pos = (tp[:, :, None] * page + torch.arange(page, device=dev)).reshape(steps, npg * page)
            res["quest"] = torch.where(pos <= qpos[:, None], pos, torch.full_like(pos, -1))
            if self_check and l == 0:
                check_quest(qs, kk, qpos, page, ps, n=3 if dev.type == "cpu" else 1)
            for name in ("dsa", "quest", "oracle"):
                r = res[name]
                if r.shape[1] < kmax + hmax:
                    r = F.pad(r, (0, kmax + hmax - r.shape[1]), value=-1)
                out[name].append(r)
            out["probs"].append(p)
    return {"sel": {m: torch.stack(out[m]) for m in ("dsa", "quest", "oracle")},
            "probs": out["probs"], "qpos": qpos, "L": L, "nll": nll}


def check_quest(qs, kk, qpos, page, ps, n=3):
    """The vectorised Quest scores against the pure-Python reference, a few steps (smoke mode)."""
    H = qs.shape[0]
    for i in sorted({0, qs.shape[1] // 2, qs.shape[1] - 1})[-n:]:
        s = int(qpos[i])
        ref = tracefmt.quest_page_scores([qs[h, i].tolist() for h in range(H)],
                                         [kk[h, :s + 1].tolist() for h in range(H)], s + 1, page)
        got = ps[i, :len(ref)].tolist()
        assert all(abs(a - b) <= 1e-3 * max(1.0, abs(b)) for a, b in zip(got, ref)), (s, got[:4], ref[:4])
        assert all(v == float("-inf") for v in ps[i, len(ref):].tolist())
    log("self_check", quest_scores="match tracefmt.quest_page_scores", steps_checked=n)


def as_masks(sel, L):
    """sel [..., n] with -1 padding -> bool [..., L]."""
    m = torch.zeros(*sel.shape[:-1], L + 1, dtype=torch.bool, device=sel.device)
    m.scatter_(-1, torch.where(sel < 0, L, sel), True)
    return m[..., :L]


class Stats:
    """Sums over requests of per-layer overlap, recall vs oracle and covered attention mass."""

    def __init__(self):
        self.acc = {}

    def add(self, key, layer, value, n=1):
        a = self.acc.setdefault(key, {})
        s, c = a.get(layer, (0.0, 0))
        a[layer] = (s + float(value), c + n)

    def mean(self, key):
        a = self.acc.get(key, {})
        return [round(a[l][0] / max(1, a[l][1]), 4) for l in sorted(a)]


def accumulate(stats, r, ks, page):
    L = r["L"]
    for k in ks:
        masks = {}
        for m, sel in r["sel"].items():
            s = sel[:, :, :k] if m != "quest" else sel[:, :, :(k // page) * page]
            masks[m] = as_masks(s, L)  # [layers, S, L]
        for l in range(masks["dsa"].shape[0]):
            p = r["probs"][l]
            for m, mk in masks.items():
                a, b = mk[l, 1:], mk[l, :-1]
                ov = ((a & b).sum(-1).float() / a.sum(-1).clamp_min(1).float()).mean()
                stats.add(f"{m}/k{k}/consecutive", l, ov)
                stats.add(f"{m}/k{k}/mass", l, (p * mk[l]).sum(-1).mean())
                stats.add(f"{m}/k{k}/size", l, mk[l].sum(-1).float().mean())
                if m != "oracle":
                    o = masks["oracle"][l]
                    stats.add(f"{m}/k{k}/recall_vs_oracle", l,
                              ((mk[l] & o).sum(-1).float() / o.sum(-1).clamp_min(1).float()).mean())
                if l + 1 < mk.shape[0]:
                    c = mk[l + 1]
                    stats.add(f"{m}/k{k}/adjacent", l,
                              ((mk[l] & c).sum(-1).float() / mk[l].sum(-1).clamp_min(1).float()).mean())


def write_traces(results, method, k, page, path, layers, header, max_bytes, check, hints=0):
    """results: list of (request id, result); one trace file of `method` at k. hints = h > 0 writes
    a version-2 trace whose records carry the h positions ranked just below the selection (best
    first; fewer where fewer exist, e.g. early in a short sequence); its first h / 2 are the h = k/2
    hints. For quest both counts are whole pages: n = (k // page) * page, h rounded down likewise."""
    n = k if method != "quest" else (k // page) * page
    h = hints if method != "quest" else (hints // page) * page
    per_req = []
    for rid, r in results:
        full = r["sel"][method]
        sel = full[:, :, :n].sort(dim=-1).values.to(torch.int32).cpu()  # -1 first, then increasing positions
        hint = full[:, :, n:n + h].to(torch.int32).cpu()  # rank order, -1 where none
        per_req.append((rid, sel.tolist(), (r["qpos"] + 1).tolist(), hint.tolist()))
    S = min(len(x[2]) for x in per_req)
    with tracefmt.TraceWriter(path, k, layers, header, compresslevel=6, max_bytes=max_bytes, check=check,
                              hints=h) as w:
        for i in range(S):
            recs = []
            for rid, sel, seqlens, hint in per_req:
                for l in range(layers):
                    row = sel[l][i]
                    j = 0
                    while j < len(row) and row[j] < 0:
                        j += 1
                    recs.append((l, rid, seqlens[i], row[j:], [p for p in hint[l][i] if p >= 0]))
            if not w.write_step(i, recs):
                break
    info = {"path": path, "method": method, "k": k, "hints": h, "steps": w.steps_written, "requests": len(per_req),
            "records": w.records, "truncated": w.truncated, "bytes": os.path.getsize(path)}
    log("trace_written", **info)
    return info


def main():
    global _LOG
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, seconds")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=16384, help="training window (bytes = tokens)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--train-seconds", type=float, default=200.0, help="time budget of LM training")
    ap.add_argument("--idx-seconds", type=float, default=40.0, help="time budget of indexer distillation")
    ap.add_argument("--idx-lr", type=float, default=2e-3)
    ap.add_argument("--idx-queries", type=int, default=256, help="query rows per window in distillation")
    ap.add_argument("--idx-min-query", type=int, default=1024, help="distil on query positions >= this")
    ap.add_argument("--max-steps", type=int, default=0, help="cap on optimiser steps per phase (0: time only)")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--ctx", type=int, default=32768, help="full traces: request length cap (bytes)")
    ap.add_argument("--steps", type=int, default=256, help="full traces: decode steps per request")
    ap.add_argument("--requests", type=int, default=3, help="full traces: requests (documents)")
    ap.add_argument("--ks", default="2048,512", help="full traces: k values (stats for all; files for the first)")
    ap.add_argument("--small-ctx", type=int, default=4096)
    ap.add_argument("--small-steps", type=int, default=64)
    ap.add_argument("--small-requests", type=int, default=2)
    ap.add_argument("--small-k", type=int, default=256)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--eval-docs", type=int, default=24, help="held-out documents for bits per byte")
    ap.add_argument("--max-trace-mib", type=float, default=15.0, help="stop a full trace at a step boundary past this")
    ap.add_argument("--full-methods", default="dsa,quest,oracle")
    ap.add_argument("--hints", type=float, default=1.0,
                    help="retention hints per record as a multiple of k (h = k by default; the first h/2 of "
                         "each record's hints, best first, are its h = k/2 hints); 0 writes version-1 traces")
    ap.add_argument("--ckpt", choices=("auto", "out", "none"), default="auto",
                    help="the checkpoint (bf16): 'out' $OUT/ckpt/model.pt; 'auto' there only when <= 15 MiB "
                         "(the device runner returns no larger file), else ./.ckpt-traces/model.pt; 'none'")
    ap.add_argument("--deadline", type=float, default=420.0,
                    help="seconds from start after which no further request is extracted")
    args = ap.parse_args()

    cfg = Cfg(d=args.d_model, layers=args.layers, heads=args.heads, mlp=4 * args.d_model)
    if args.smoke:
        cfg = Cfg(d=64, layers=2, heads=2, mlp=128, idx_heads=2, idx_dim=16)
        args.train_len, args.batch, args.train_seconds, args.idx_seconds = 128, 2, 4.0, 3.0
        args.max_steps, args.log_every, args.warmup, args.idx_queries, args.idx_min_query = 30, 10, 5, 16, 16
        args.ctx, args.steps, args.requests, args.ks = 600, 12, 2, "64,32"
        args.small_ctx, args.small_steps, args.small_requests, args.small_k = 300, 8, 2, 32
        args.eval_docs, args.max_trace_mib = 2, 1.0
        args.device = args.device or "cpu"
    out = os.environ.get("OUT") or "./out"
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    os.makedirs(os.path.join(out, "small"), exist_ok=True)
    _LOG = open(os.path.join(out, "log.jsonl"), "w")
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    # No TF32: the fp32 matmuls (attention targets, oracle, Quest bounds) stay exact fp32.
    torch.backends.cuda.matmul.allow_tf32 = False

    def amp():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")

    ks = [int(x) for x in args.ks.split(",")]
    kmax = max(ks)
    train_bytes, held, manifest = load_corpus(args.corpus, args.smoke)
    data = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8).to(dev)
    log("start", device=str(dev), gpu=torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
        torch=torch.__version__, cfg=dataclasses.asdict(cfg), args=vars(args), train_bytes=data.numel(),
        heldout_contexts=len(held), corpus_manifest_train=manifest.get("train", {}).get("bytes_by_kind"))

    model = LM(cfg).to(dev)
    idx = nn.ModuleList(Indexer(cfg) for _ in range(cfg.layers)).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    max_len = max(args.train_len, args.ctx, args.small_ctx) + 1
    cos, sin = rope_tables(max_len, cfg.d // cfg.heads, cfg.rope_base, dev)
    icos, isin = rope_tables(max_len, cfg.idx_dim, cfg.rope_base, dev)
    log("model", params=n_params, indexer_params=sum(p.numel() for p in idx.parameters()))

    tr = train_lm(model, data, args, dev, cos, sin, amp)
    log("train_done", **tr)
    ti = train_indexers(model, idx, data, args, dev, cos, sin, icos, isin, amp)
    log("indexer_done", **ti)
    if args.ckpt != "none":
        n_bytes = 2 * (n_params + sum(p.numel() for p in idx.parameters()))
        where = os.path.join(out, "ckpt") if args.ckpt == "out" or n_bytes <= 15 * (1 << 20) else ".ckpt-traces"
        os.makedirs(where, exist_ok=True)
        torch.save({"cfg": dataclasses.asdict(cfg), "args": vars(args),
                    "model": {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()},
                    "indexer": {k: v.to(torch.bfloat16) for k, v in idx.state_dict().items()}},
                   os.path.join(where, "model.pt"))
        log("checkpoint", path=os.path.join(where, "model.pt"), bytes=os.path.getsize(os.path.join(where, "model.pt")))

    # Requests: held-out documents of distinct source packages, longest-first within the hash order
    # build_corpus gave them, each long enough for the configuration's context.
    def pick(n, ctx, skip=()):
        chosen, pkgs = [], set()
        for d in held:
            nb = len(d["text"].encode("utf-8"))
            if nb >= ctx and d["package"] not in pkgs and d["id"] not in skip:
                chosen.append(d)
                pkgs.add(d["package"])
            if len(chosen) == n:
                break
        if len(chosen) < n:
            log("warning", what=f"only {len(chosen)} held-out documents of >= {ctx} bytes from distinct packages")
        return chosen

    # Held-out bits per byte, within and beyond the training length.
    model.eval()
    ev = pick(args.eval_docs, min(args.ctx, max(len(d["text"]) for d in held)))
    sums = {"in": [0.0, 0], "beyond": [0.0, 0]}
    with torch.no_grad():
        for d in ev:
            toks = doc_tokens(d)[:args.ctx].to(dev)
            with amp():
                lg = model(toks[None, :-1], cos[:toks.numel() - 1], sin[:toks.numel() - 1])
            nll = F.cross_entropy(lg[0].float(), toks[1:], reduction="none")
            n_in = min(nll.numel(), args.train_len)
            sums["in"][0] += float(nll[:n_in].sum()); sums["in"][1] += n_in
            sums["beyond"][0] += float(nll[n_in:].sum()); sums["beyond"][1] += nll.numel() - n_in
    log("heldout", docs=len(ev), bpb_within_train_len=round(sums["in"][0] / max(1, sums["in"][1]) / math.log(2), 4),
        bytes_within=sums["in"][1],
        bpb_beyond_train_len=round(sums["beyond"][0] / max(1, sums["beyond"][1]) / math.log(2), 4)
        if sums["beyond"][1] else None, bytes_beyond=sums["beyond"][1])

    model_desc = (f"hisparse-examples-traces byte-level decoder {cfg.layers}L d{cfg.d} h{cfg.heads} "
                  f"rope{cfg.rope_base:g} train_len {args.train_len} trained {tr['seconds']}s "
                  f"({tr['tokens']} tokens) + DSA indexer {cfg.idx_heads}x{cfg.idx_dim} distilled {ti['seconds']}s")
    configs = [("small", args.small_ctx, args.small_steps, args.small_requests, [args.small_k]),
               ("full", args.ctx, args.steps, args.requests, ks)]
    for name, ctx, steps, nreq, kk in configs:
        docs = pick(nreq, ctx)
        results, stats = [], Stats()
        for rid, d in enumerate(docs):
            if name == "full" and results and time.time() - T0 > args.deadline:
                log("warning", what=f"deadline: {len(results)} of {len(docs)} requests extracted")
                break
            r = selections(model, idx, d, ctx, steps, max(kk), args.page, dev, cos, sin, icos, isin, amp,
                           self_check=rid == 0 and (args.smoke or name == "small"),
                           hmax=int(args.hints * max(kk)))
            accumulate(stats, r, kk, args.page)
            log("request", config=name, request=rid, package=d["package"], doc_id=d["id"], seq_len_end=r["L"],
                files=d["files"][:6], bpb=round(float(r["nll"].mean()) / math.log(2), 4),
                bpb_last_steps=round(float(r["nll"][-steps:].mean()) / math.log(2), 4))
            r.pop("nll")
            r["probs"] = None  # [S, L] per layer: not kept across requests
            results.append((rid, r))
        for key in sorted(stats.acc):
            log("summary", config=name, metric=key, per_layer=stats.mean(key),
                mean=round(sum(stats.mean(key)) / max(1, len(stats.mean(key))), 4))
        mid = list(range(1, cfg.layers - 1)) or list(range(cfg.layers))
        cal = {}
        for m in ("dsa", "quest", "oracle"):
            for k in kk:
                c, a = stats.mean(f"{m}/k{k}/consecutive"), stats.mean(f"{m}/k{k}/adjacent")
                cal[f"{m}/k{k}"] = {"consecutive_middle_layers": round(sum(c[l] for l in mid) / len(mid), 4),
                                    "adjacent_mean": round(sum(a) / max(1, len(a)), 4)}
                if m != "oracle":
                    r = stats.mean(f"{m}/k{k}/recall_vs_oracle")
                    cal[f"{m}/k{k}"]["recall_vs_oracle_mean"] = round(sum(r) / len(r), 4)
        log("calibration", config=name, middle_layers=mid, results=cal,
            published={"consecutive_middle_layers": 0.44, "adjacent": "0.7-1.0",
                       "what": "DeepSeek-V3.2, k = 2048 (the gen-trace dsv32 preset's targets)"})
        # Trace files.
        for m in args.full_methods.split(","):
            hdr = {"model": model_desc, "method": m, "page_size": args.page,
                   "source": f"teacher-forced held-out Debian text ({', '.join(sorted({d['package'] for d in docs}))}); "
                             f"last {steps} positions of requests of {ctx} bytes; step i: seq_len = L - {steps} + i + 1",
                   "generator": "examples/traces/train_and_extract.py"}
            if name == "small":
                path = os.path.join(out, "small", f"debian-{m}-small.trace.gz")
                write_traces(results, m, kk[0], args.page, path, cfg.layers, hdr, None, "full",
                             hints=int(args.hints * kk[0]))
            else:
                path = os.path.join(out, "traces", f"debian-{m}-k{kk[0]}.trace.gz")
                write_traces(results, m, kk[0], args.page, path, cfg.layers, hdr,
                             int(args.max_trace_mib * (1 << 20)), "sorted", hints=int(args.hints * kk[0]))
        del results
    log("done", seconds=round(time.time() - T0, 1), out=out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""hisparse-bench serve: a decode node of a DeepSeek-V3.2-class model, full-HBM against hisparse.

The model is dsv32.Model: one GPU's share of the real deployment (DP-attention, EP 8, fp8
weights, the DSA indexer, sparse MLA over 2048 selected 656-B records), random weights, optionally
fewer layers (--layers; everything that scales with depth scales together, see dsv32.py).

The serving loop is the decode side of a prefill/decode split, a closed loop of N clients:
  - a request arrives with its prompt's KV (records and index keys, generated from its seed on the
    GPU: that is what the prefill node would send; the transfer itself is not simulated), is
    admitted (hisparse: hs_admit + hs_store into the daemon's host pool; baseline: into its HBM
    rows) and decodes its output length (uniform in --out-len) under continuous batching: when a
    request finishes it is released and the next request takes its batch slot between two steps;
  - every step is one CUDA graph replay for the batch bucket (one graph a bucket, the batch size a
    device tensor the kernels read), timed with CUDA events; admission work happens between
    replays and is reported separately (admit_ms), not in the step times;
  - both modes run the same request schedule, so their logits must be bit-identical: they are
    compared at every --sample-every-th step (exactness), for each concurrency both modes ran;
  - per concurrency point the run reports throughput (tokens/s = generated tokens / summed step
    time), TPOT p50/p99 (step times), the daemon's counters (hits, misses, bytes fetched: hit
    rate, misses per step, link utilisation) and, from timing events captured inside a probe
    graph, the time of each part of the step (proj, append, indexer, topk, resolve, attention,
    moe, lm_head).

HBM budget: both modes get the same HBM for KV and per-request state: (--gpu-hbm - the full
model's weights - --reserve) scaled by layers/61. full HBM keeps layers x max_len x (656 + 132) B
per request; hisparse keeps layers x ((B + 1) x 656 + max_len x 132) B (slot arena + the
indexer's keys, which stay in HBM in both modes) and needs layers x max_len x 656 B of host pool.
A curve stops at the first concurrency past the mode's capacity, and says which limit it hit.

    # GPU (HISPARSE_LIB / HISPARSE_DAEMON_BIN or the source tree's build/):
    python3 examples/engine/serve_bench.py --layers 8 --contexts 131072,32768 --json serve.jsonl --plot serve.png
    # CPU smoke run (tiny model, host backend, a few steps; tests/python/test_serve_bench.py):
    python3 examples/engine/serve_bench.py --smoke
"""

from __future__ import annotations

import argparse
import array
import json
import os
import pathlib
import random
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if os.environ.get("HISPARSE_INSTALLED") != "1":  # 1: the installed package (a wheel's), not the tree's
    sys.path.insert(0, str(HERE.parent.parent / "client" / "python"))

import torch  # noqa: E402

import dsv32  # noqa: E402
import kv_backends  # noqa: E402
import sparse_kernels  # noqa: E402

GIB = 1 << 30
PARTS = ["proj", "append", "indexer", "topk", "resolve", "attention", "moe", "lm_head"]
LEVELS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512]
SMOKE = dict(layers=2, contexts="96,mix:48:160", slots="24", hybrid_slots="24", curve_slots=24, calibrate_steps=6, steps=6, sample_every=2, out_len="3:6", gpu_hbm="4MiB",
             reserve="0", host_pool_size="64MiB", host_pool_segment_size="8MiB", records="bf16", levels="1,2,4",
             probe_steps=0, max_concurrency=8)


def parse_size(text: str) -> int:
    import re
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()])


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def slot_contexts(spec, N):
    """Prompt length of each of the N clients: a fixed context, or "mix": log-uniform over 8k-128k,
    client i at 8k * 16^frac(i * 0.618...) (a low-discrepancy spread), rounded to 1k. Each client
    keeps its length, so the batch's footprint is the same at every step and in both modes."""
    if not str(spec).startswith("mix"):
        return [int(spec)] * N
    lo, hi = (int(x) for x in spec.split(":")[1:]) if ":" in spec else (8192, 131072)
    q = 1024 if lo >= 4096 else 1
    return [int(round(lo * (hi / lo) ** ((i * 0.6180339887) % 1.0) / q)) * q for i in range(N)]


def per_request(cfg, fmt, ctx, max_out, B):
    """HBM bytes a request of this context keeps in each mode, and its host-pool bytes."""
    L, n, R, I = cfg.layers, ctx + max_out + 1, fmt.record_bytes, cfg.index_key_bytes
    state = cfg.topk * 4 * 3 + n * 4  # positions, out_slots, record indices; the score row
    return dict(baseline=L * n * (R + I) + state, hisparse=L * ((B + 1) * R + n * I) + state, host=L * n * R)


def capacity(cfg, fmt, spec, max_out, B, budget, pool, limit=1024):
    """Largest concurrency per mode whose clients' requests fit the HBM budget (hisparse: and the host
    pool), what limits it, and the mean bytes a request. Client i's length does not depend on N
    (slot_contexts), so the footprint of N clients is a prefix sum."""
    reqs = [per_request(cfg, fmt, c, max_out, B) for c in slot_contexts(spec, limit)]
    out = {}
    for mode in ("baseline", "hisparse"):
        n, why, hbm, host = 0, "HBM", 0, 0
        while n < limit:
            hbm, host = hbm + reqs[n][mode], host + reqs[n]["host"]
            if hbm > budget:
                break
            if mode == "hisparse" and host > pool:
                why = "host pool"
                break
            n += 1
        first = reqs[:max(1, n)]
        out[mode] = dict(per_request_hbm=sum(r[mode] for r in first) // len(first), capacity=n, limit=why)
        if mode == "hisparse":
            out[mode]["host_per_request"] = sum(r["host"] for r in first) // len(first)
    return out


def resident_rows(cfg, fmt, spec, N, max_out, B, budget):
    """Hybrid mode: how many of the N clients (the first r) keep their whole KV in HBM, the rest being
    served by hisparse: the most r with sum(full of the first r) + sum(sparse of the others) <= budget."""
    reqs = [per_request(cfg, fmt, c, max_out, B) for c in slot_contexts(spec, N)]
    need = sum(x["hisparse"] for x in reqs)  # r = 0
    r = 0
    while r < N and need + reqs[r]["baseline"] - reqs[r]["hisparse"] <= budget:
        need += reqs[r]["baseline"] - reqs[r]["hisparse"]
        r += 1
    return r


class Schedule:
    """The closed loop's requests, identical in both modes: request n has its own seed, the context,
    and an output length; the first N start part-way through their outputs (a loop in steady state)."""

    def __init__(self, seed: int, out_lo: int, out_hi: int) -> None:
        self.seed, self.lo, self.hi = seed, out_lo, out_hi
        self.next_id = 1  # hisparse request ids are non-zero

    def take(self, first: bool):
        rid = self.next_id
        self.next_id += 1
        rng = random.Random(self.seed * 1000003 + rid)
        out = rng.randint(self.lo, self.hi)
        return rid, (rng.randint(1, out) if first else out), rng.randrange(1 << 30)


def prompt_kv(cfg, fmt, ctx, seed, device):
    """What the prefill node sends for one request: records uint8 [L, ctx, R] (a random latent per
    token and layer), a generator for its index keys, and each token's salience (softplus of a normal:
    the part of the key that every query favours, dsv32.V32Config.locality)."""
    g = torch.Generator(device=device).manual_seed(seed)
    recs = torch.empty(cfg.layers, ctx, fmt.record_bytes, dtype=torch.uint8, device=device)
    for l in range(cfg.layers):
        recs[l] = fmt.encode(torch.randn(ctx, cfg.latent, generator=g, device=device).to(torch.bfloat16))
    sal = torch.nn.functional.softplus(torch.randn(ctx, generator=g, device=device))
    return recs, g, sal


class Point:
    """One (mode, context, concurrency) run of the closed loop."""

    def __init__(self, args, model, fmt, mode, ctx, N, session, n_res=0) -> None:
        self.args, self.model, self.fmt, self.mode, self.ctx, self.N = args, model, fmt, mode, ctx, N
        self.session = session
        cfg, dev = model.cfg, model.device
        self.max_out = int(args.out_len.split(":")[1])
        self.ctxs = slot_contexts(ctx, N)
        # The probe's and the trace's replays run past the end.
        self.lens = [c + self.max_out + 2 + args.probe_steps + (TRACE_REPLAYS if args.trace else 0) for c in self.ctxs]
        self.st = kv_backends.DecodeState(cfg, N, self.lens, dev, model.idx_fp8)
        if mode == "baseline":
            self.kv = kv_backends.FullKV(cfg, fmt, self.lens, dev)
        elif mode == "hybrid":
            self.kv = kv_backends.HybridKV(session, cfg, fmt, self.lens, n_res, dev)
        else:
            self.kv = kv_backends.HisparseKV(session, cfg, fmt, N, dev)
        self.n_res = n_res
        lo, hi = (int(x) for x in args.out_len.split(":"))
        self.sched = Schedule(args.seed, lo, hi)
        self.remaining = [0] * N
        self.rid = [None] * N
        self.admit_ms = []
        self.logits = torch.zeros(N, cfg.vocab, dtype=torch.float32, device=dev)

    def admit(self, i: int, first: bool) -> None:
        t = time.perf_counter()
        cfg, st, L = self.model.cfg, self.st, self.model.layers
        if self.rid[i] is not None:
            self.kv.release(i, self.rid[i])
        rid, out_len, seed = self.sched.take(first)
        ctx, at = self.ctxs[i], st.bases[i]
        recs, g, sal = prompt_kv(cfg, self.fmt, ctx, seed, self.model.device)
        for l in range(cfg.layers):  # index keys: noise + the salience along the layer's u (selections overlap)
            k = torch.randn(ctx, cfg.idx_dim, generator=g, device=self.model.device)
            k += (cfg.locality * sal).unsqueeze(-1) * L[l].u.float()
            key, scale = dsv32.quantize_keys(k, self.model.idx_fp8)
            st.idx_keys[l].view(torch.uint8)[at:at + ctx] = key.view(torch.uint8)
            st.idx_scale[l][at:at + ctx] = scale
        self.kv.admit(i, rid, ctx, self.lens[i])
        self.kv.store(i, rid, recs, 0)
        st.tokens[i] = seed % cfg.vocab
        st.seq_lens[i] = ctx + 1
        self.rid[i], self.remaining[i] = rid, out_len
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        self.admit_ms.append(1e3 * (time.perf_counter() - t))

    def _step(self):
        logits = self.model.step(self.kv, self.st)
        self.logits.copy_(logits)
        self.st.tokens.copy_(logits.argmax(-1))
        self.st.seq_lens.add_(1)

    def _capture(self, pool):
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(g, pool=pool, stream=side):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        return g

    def run(self, pool=None):
        """Decodes args.steps steps; returns the point's record and the sampled logits {step: cpu tensor}."""
        args, cuda = self.args, self.model.device.type == "cuda"
        for i in range(self.N):
            self.admit(i, first=True)
        samples, step_ms, finished = {}, [], 0
        # Step 0 runs eagerly, so that graph capture finds every kernel compiled; untimed, uncounted.
        self._step()
        self._book(samples, 0)
        self.admit_ms.clear()  # the initial fill is not steady-state admission
        before = self.session.stats() if self.session is not None else None
        graph = self._capture(pool) if cuda else None
        evs = []
        for s in range(1, args.steps):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                evs.append((a, b))
            else:
                t = time.perf_counter()
                self._step()
                step_ms.append(1e3 * (time.perf_counter() - t))
            finished += self._book(samples, s)
        if cuda:
            torch.cuda.synchronize()
            step_ms = [a.elapsed_time(b) for a, b in evs]
        rec = dict(kind="point", mode=self.mode, context=self.ctx, concurrency=self.N, steps=len(step_ms),
                   mean_context=round(sum(self.ctxs) / self.N),
                   tokens_per_s=round(self.N * 1e3 * len(step_ms) / sum(step_ms), 1),
                   step_ms_mean=round(sum(step_ms) / len(step_ms), 4),
                   tpot_ms_p50=round(pct(step_ms, 0.5), 3), tpot_ms_p99=round(pct(step_ms, 0.99), 3),
                   finished=finished, admit_ms_p50=round(pct(self.admit_ms, 0.5), 2) if self.admit_ms else None,
                   kv_hbm_bytes=self.kv.kv_bytes(), index_hbm_bytes=self.st.index_bytes())
        if self.mode == "hybrid":
            rec["resident_rows"] = self.n_res
        if self.session is not None:
            after = self.session.stats()
            hits, misses = after.hits - before.hits, after.misses - before.misses
            fetched = after.bytes_fetched - before.bytes_fetched
            rec.update(hit_rate=round(hits / max(1, hits + misses), 4),
                       misses_per_step=round(misses / len(step_ms), 1),
                       fetched_gb_per_s=round(fetched / (sum(step_ms) * 1e-3) / 1e9, 2))
            self.session.check_errors()
        if cuda and args.probe_steps > 0:
            rec["parts_ms"] = self._probe_parts(pool)
        if args.dump_scores and self.mode == "hisparse" and self.model.overlap is None:
            self._dump_scores(args.dump_scores)
        if cuda and args.trace:
            with open(args.trace, "a") as f:
                ov = self.model.overlap
                f.write(json.dumps(dict(kind="trace", mode=self.mode, overlap=ov.tag if ov is not None else None,
                                        context=self.ctx, concurrency=self.N, kernels=trace_graph(graph))) + "\n")
        del graph
        return rec, samples

    def _dump_scores(self, prefix: str) -> None:
        """The last step's last-layer indexer scores of every row, raw float32 [N, max_len] (-inf past a
        row's length) in PREFIX-CONTEXT-NxCOLS-locL.f32: what `hisparse-bench topk --scores` reads, to
        time the top-k on a serving run's own scores. Every mode computes the same scores."""
        scores = self.st.scores[:self.N].float().cpu().contiguous()
        path = f"{prefix}-{self.ctx}-{self.N}x{scores.shape[1]}-loc{self.model.cfg.locality:g}.f32"
        with open(path, "wb") as f:
            array.array("f", scores.flatten().tolist()).tofile(f)

    def _book(self, samples, s) -> int:
        """After step s: keep sampled logits, retire finished requests and admit the next ones."""
        if s % self.args.sample_every == 0:
            samples[s] = self.logits.cpu()
        done = 0
        for i in range(self.N):
            self.remaining[i] -= 1
            if self.remaining[i] <= 0:
                done += 1
                self.admit(i, first=False)
        return done

    def _probe_parts(self, pool):
        """Median time of each part per step, from timing events captured inside a probe graph."""
        self.model.events = []
        try:
            g = self._capture(pool)
        finally:
            events, self.model.events = self.model.events, None
        per = {p: [] for p in PARTS}
        for _ in range(self.args.probe_steps):
            g.replay()
            torch.cuda.synchronize()
            tot = {p: 0.0 for p in PARTS}
            for name, a, b in events:
                tot[name] += a.elapsed_time(b)
            for p in PARTS:
                per[p].append(tot[p])
        del g
        return {p: round(pct(v, 0.5), 4) for p, v in per.items()}

    def close(self):
        if self.mode != "baseline":
            self.kv.close()


TRACE_REPLAYS = 2


def trace_graph(graph) -> list:
    """The kernels of one replay of graph, as the GPU ran them (torch.profiler's CUPTI activity records):
    [name (80 chars at most), start µs from the replay's first kernel, duration µs, stream, grid], in start
    order. One untraced replay first, so that the traced one finds the link and the caches as a step does."""
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as g:
            data = json.load(g)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    ks = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not ks:
        return []
    t0 = ks[0]["ts"]
    return [[e["name"][:80], round(e["ts"] - t0, 2), round(e.get("dur", 0), 2), e.get("args", {}).get("stream"),
             e.get("args", {}).get("grid")] for e in ks]


def overlaps_of(args):
    """Every overlap variant of --overlap (chunk counts <= 1 left out)."""
    specs = [dsv32.Overlap.parse(x, args.overlap_min_rows) for x in str(args.overlap).split(",") if x]
    return [o for o in specs if o.chunks > 1]


def overlap_tag(ov):
    return f"_overlap{ov.tag}"


def time_topk(dev, k: int, cols: int = 131136, rows=(1, 5, 7, 22, 29, 32), calls: int = 10, reps: int = 5,
              zeros: float = 0.0):
    """µs a call of each top-k at `rows` rows of `cols` scores (the 128k shape), replayed from a graph of
    `calls` calls (as the step runs them): {rows: {"torch": us, "hisparse": us}}, the median of reps.
    Scores are normal; zeros > 0 clamps that fraction of them to 0, as an indexer's ReLU leaves them."""
    import hisparse
    out = {}
    for m in rows:
        scores = torch.randn(m, cols, device=dev)
        if zeros > 0:
            scores = torch.clamp(scores - torch.quantile(scores[0, :65536], zeros), min=0)
        positions = torch.empty(m, k, dtype=torch.int32, device=dev)
        seq = torch.full((m,), cols, dtype=torch.int32, device=dev)
        bs = torch.tensor([m], dtype=torch.int32, device=dev)
        ways = {"torch": lambda: positions.copy_(scores.topk(k, dim=1, sorted=False)[1]),
                "hisparse": lambda: hisparse.topk(scores, positions, seq_lens=seq, batch_size=bs)}
        out[m] = {}
        for name, fn in ways.items():
            s = torch.cuda.Stream(device=dev)
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()  # warm (allocations, module load) outside the capture
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(calls):
                    fn()
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1000 / calls)
            out[m][name] = round(sorted(times)[reps // 2], 1)
    return out


def overlap_of(args):
    """The overlap of the sweep's hisparse points (the first variant), or None."""
    return next(iter(overlaps_of(args)), None)


def run_point(args, model, fmt, address, mode, name, ctx, N, B, n_res=0, overlap=None):
    """One point of the closed loop in its own session (hisparse rows) and graph; its record and samples.
    overlap applies to hisparse mode only (dsv32.Overlap)."""
    import hisparse
    cuda = model.device.type == "cuda"
    session = None
    if mode != "baseline" and N > n_res:
        session = hisparse.Session(address, num_layers=model.cfg.layers, record_bytes=fmt.record_bytes,
                                   k=model.cfg.topk, slots=B, max_requests=N - n_res, gpu=0 if cuda else -1,
                                   backend="cuda" if cuda else "host", engine_name="serve_bench")
    model.overlap = overlap if mode == "hisparse" else None
    t0 = time.monotonic()
    p = Point(args, model, fmt, mode, ctx, N, session, n_res)
    try:
        rec, samp = p.run(None)  # each graph its own pool: a handle outliving its graphs trips torch's allocator
    finally:
        model.overlap = None
        p.close()
        if session is not None:
            session.close()
    del p
    if cuda:
        rec["peak_hbm_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    rec["wall_s"] = round(time.monotonic() - t0, 1)
    rec["mode"], rec["slots"], rec["locality"] = name, B, model.cfg.locality
    if overlap is not None and mode == "hisparse":
        rec["overlap"] = dict(spec=overlap.tag, ranges=[b - a for a, b in model.overlap_ranges(overlap, N)])
    return rec, samp


def locality_for(cal, target):
    """The locality whose hit rate the calibration puts at target: linear between the two measured
    points around it (hit rates made non-decreasing in locality first: the measurements are noisy),
    the nearest end outside the measured range."""
    pts = sorted(cal)
    best, mono = 0.0, []
    for loc, hit in pts:
        best = max(best, hit)
        mono.append((loc, best))
    if target <= mono[0][1]:
        return mono[0][0]
    for (l0, h0), (l1, h1) in zip(mono, mono[1:]):
        if h0 <= target <= h1:
            return l0 if h1 == h0 else l0 + (l1 - l0) * (target - h0) / (h1 - h0)
    return mono[-1][0]


def calibrate(args, model, fmt, address, ctx, B, emit):
    """Hit rate against locality at this context and B: short hisparse points of --calibrate-rows
    requests (the hit rate is a request's, whatever the batch), one per --calibrate-localities."""
    sub = argparse.Namespace(**vars(args))
    sub.steps, sub.probe_steps, sub.sample_every, sub.trace = args.calibrate_steps, 0, 1 << 30, None
    sub.dump_scores = None
    cal = []
    for loc in (float(x) for x in args.calibrate_localities.split(",")):
        model.cfg.locality = loc
        rec, _ = run_point(sub, model, fmt, address, "hisparse", f"hisparse_B{B}", ctx, args.calibrate_rows, B)
        cal.append((loc, rec["hit_rate"]))
        emit(dict(kind="calibration", context=ctx, slots=B, locality=loc, hit_rate=rec["hit_rate"],
                  rows=args.calibrate_rows, steps=rec["steps"]))
    return cal


def exact(ref, samp):
    return sum(bool(torch.equal(ref[s], samp[s])) for s in ref), len(ref)


def curve(args, model, fmt, address, contexts, budget, pool, emit, t_start):
    """Peak throughput at equal HBM against the hit rate (issue 44): per context, the full-HBM peak
    (the baseline at its capacity), a calibration of hit rate against locality, then per target hit
    rate, at hisparse's capacity N: full HBM at N (the budget ignored: the step with nothing to fetch,
    for RESOLVE's exposed time and the exactness check), hisparse, hisparse with each overlap variant,
    and full HBM at N again; then the full-HBM peak once more. The GPU's pace drifts over a sweep (a
    first point up to ~0.6 ms a step faster than later ones, bench/RESULTS.md), so exposed times are
    taken against the mean of the two full-HBM runs that bracket the hisparse ones, and both are
    recorded. A graph can also launch its kernels more slowly before the process's first hisparse
    session than after it ("Full HBM's launch gaps"), so the ratios divide by the faster of the two
    full-HBM peaks, and both are recorded."""
    cfg, B = model.cfg, args.curve_slots
    max_out = int(args.out_len.split(":")[1])
    overlaps = overlaps_of(args) or [dsv32.Overlap(min_rows=args.overlap_min_rows)]
    targets = [float(x) for x in args.hit_rates.split(",")]
    for ctx in contexts:
        caps = capacity(cfg, fmt, ctx, max_out, B, budget, pool)
        nb = min(caps["baseline"]["capacity"], args.max_concurrency)
        nh = min(caps["hisparse"]["capacity"], args.max_concurrency)
        emit(dict(kind="capacity", context=ctx, mode="baseline", slots=None, **caps["baseline"]))
        emit(dict(kind="capacity", context=ctx, mode=f"hisparse_B{B}", slots=B, **caps["hisparse"]))
        cfg.locality = args.locality
        base, _ = run_point(args, model, fmt, address, "baseline", "baseline", ctx, nb, None)
        emit(base)
        cal = calibrate(args, model, fmt, address, ctx, B, emit)
        curves = []  # emitted once the second full-HBM peak is known
        for target in targets:
            if time.monotonic() - t_start > args.time_budget_s:
                emit(dict(kind="skipped", mode="curve", context=ctx, target_hit_rate=target, reason="time budget"))
                continue
            cfg.locality = round(locality_for(cal, target), 4)
            full, ref = run_point(args, model, fmt, address, "baseline", "full_at_N", ctx, nh, None)
            off, s_off = run_point(args, model, fmt, address, "hisparse", f"hisparse_B{B}", ctx, nh, B)
            for r in (full, off):
                r["target_hit_rate"] = target
                emit(r)
            same_off, n = exact(ref, s_off)
            ons = []
            for ov in overlaps:  # one curve record per overlap variant, beside the same full and plain points
                on, s_on = run_point(args, model, fmt, address, "hisparse", f"hisparse_B{B}{overlap_tag(ov)}", ctx, nh, B,
                                     overlap=ov)
                on["target_hit_rate"] = target
                emit(on)
                ons.append((on, exact(ref, s_on)[0]))
            after, _ = run_point(args, model, fmt, address, "baseline", "full_at_N_after", ctx, nh, None)
            after["target_hit_rate"] = target
            emit(after)
            full_ms = round((full["step_ms_mean"] + after["step_ms_mean"]) / 2, 4)
            exp_off = off["step_ms_mean"] - full_ms
            for on, same_on in ons:
                exp_on = on["step_ms_mean"] - full_ms
                curves.append(dict(kind="curve", context=ctx, slots=B, target_hit_rate=target, locality=cfg.locality,
                                   concurrency=nh, hit_rate=off["hit_rate"], hit_rate_overlap=on["hit_rate"],
                                   misses_per_step=off["misses_per_step"], baseline_peak_concurrency=nb,
                                   tokens_per_s=off["tokens_per_s"], tokens_per_s_overlap=on["tokens_per_s"],
                                   step_ms_full=full_ms, step_ms_full_before=full["step_ms_mean"],
                                   step_ms_full_after=after["step_ms_mean"], step_ms=off["step_ms_mean"],
                                   step_ms_overlap=on["step_ms_mean"], exposed_ms=round(exp_off, 3),
                                   exposed_ms_overlap=round(exp_on, 3),
                                   exposed_cut=round(1 - exp_on / exp_off, 3) if exp_off > 0 else None,
                                   overlap=on["overlap"],
                                   sampled_steps=n, identical=same_off, identical_overlap=same_on,
                                   exact=same_off == n and same_on == n))
        if not curves:
            continue
        base_after, _ = run_point(args, model, fmt, address, "baseline", "baseline_after", ctx, nb, None)
        emit(base_after)
        peak = max(base["tokens_per_s"], base_after["tokens_per_s"])
        for c in curves:
            emit(dict(c, baseline_peak_tokens_per_s=peak, baseline_peak_tokens_per_s_before=base["tokens_per_s"],
                      baseline_peak_tokens_per_s_after=base_after["tokens_per_s"],
                      ratio=round(c["tokens_per_s"] / peak, 3), ratio_overlap=round(c["tokens_per_s_overlap"] / peak, 3)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8, help="layers of the 61-layer model to run (all sizes scale)")
    ap.add_argument("--contexts", default="131072,32768,mix",
                    help="prompt lengths, one sweep each; mix (or mix:LO:HI): each client's length log-uniform in 8k-128k")
    ap.add_argument("--records", default="fp8", choices=["fp8", "bf16"])
    ap.add_argument("--slots", default="2048,4096", help="B values (slots per request and layer), one hisparse curve each")
    ap.add_argument("--hybrid-slots", default="4096",
                    help="B values of the hybrid mode (requests resident in HBM while the budget allows, hisparse for the rest)")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels to try (and each capacity)")
    ap.add_argument("--max-concurrency", type=int, default=512)
    ap.add_argument("--modes", default="baseline,hisparse", help="the modes of the concurrency sweep, run in this order")
    ap.add_argument("--steps", type=int, default=48, help="decode steps per point (the first eager)")
    ap.add_argument("--sample-every", type=int, default=8, help="logits kept for the exactness check every n steps")
    ap.add_argument("--probe-steps", type=int, default=3, help="replays of the probe graph (part times)")
    ap.add_argument("--out-len", default="256:2048", help="output tokens per request, uniform in LO:HI")
    ap.add_argument("--gpu-hbm", default="139GiB", help="the GPU's memory (the real deployment's)")
    ap.add_argument("--reserve", default="8GiB", help="activations, graphs, CUDA context of the real deployment")
    ap.add_argument("--host-pool-size", default="48GiB")
    ap.add_argument("--host-pool-segment-size", default="1GiB")
    ap.add_argument("--locality", type=float, default=2.8)
    ap.add_argument("--overlap", default="",
                    help="hisparse points: RESOLVE in row chunks on a side stream, under the previous chunk's attention "
                         "(dsv32.Overlap.parse: CHUNKS[/bBLOCKS|/hHELPERS][/pPRIORITY][/gGROWTH][/w][/one][/main|/beside]"
                         "[/ixJ][/icN][/iuN][/asc], e.g. 4/b16, 4/w/h8, 4/b16/beside/asc or 4/b16/beside/ix3 (ranges 0-2 "
                         "beside the indexer of later rows); empty or 1: off); the curve runs every spec of a comma list (default 4), the "
                         "sweep the first")
    ap.add_argument("--overlap-min-rows", type=int, default=4, help="rows a chunk at least (fewer chunks at small batches)")
    ap.add_argument("--hit-rates", default=None,
                    help="the hit-rate curve instead of the concurrency sweep: target hit rates (e.g. "
                         "0.4,0.5,0.6,0.7,0.78,0.87,0.95), each reached by a calibrated locality, at hisparse's capacity")
    ap.add_argument("--curve-slots", type=int, default=4096, help="B of the hit-rate curve")
    ap.add_argument("--calibrate-localities", default="0,0.5,1,1.5,2,2.5,3,3.5",
                    help="localities the calibration measures the hit rate at")
    ap.add_argument("--calibrate-rows", type=int, default=2)
    ap.add_argument("--calibrate-steps", type=int, default=12)
    ap.add_argument("--tune-mla", type=int, default=32, help="tune the sparse MLA tiles at this batch (0: defaults)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-budget-s", type=float, default=1e9, help="skip the remaining points after this long")
    ap.add_argument("--ctl-watch", default=None, help="run `hisparse-ctl --json watch` on the daemon into this file")
    ap.add_argument("--json", default=None)
    ap.add_argument("--trace", default=None,
                    help="append each point's kernel timeline (one replay of its graph, torch.profiler) to this file")
    ap.add_argument("--dump-scores", default=None,
                    help="write each no-overlap hisparse point's last indexer scores to PREFIX-CONTEXT-NxCOLS-locL.f32 "
                         "(for hisparse-bench topk --scores)")
    ap.add_argument("--plot", default=None, help="PNG of throughput and TPOT against concurrency (matplotlib)")
    ap.add_argument("--expert-gemm", choices=("auto", "torch"), default="auto",
                    help="the routed experts' fp8 GEMM: the fastest of torch's and the Triton one (expert_gemm.py, "
                         "issue 44's leaner floor), or of torch's only (the floor of runs before 2026-12-05)")
    ap.add_argument("--topk", choices=("torch", "hisparse"), default="hisparse",
                    help="the selection's top-k: hisparse.topk (hs_topk, a cluster of thread blocks a row; 1.6-2x "
                         "faster a call than torch.topk up to 29 rows of 128k on an H100: bench/RESULTS.md, \"A top-k "
                         "of a cluster a row\"; the CPU reference on a CPU), or torch.topk (the floor of runs before "
                         "2026-12-05 14:00 UTC). Both are timed on the GPU first")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny model, host backend, a few steps")
    args = ap.parse_args(argv)
    asked = args.modes.split(",")
    unknown = [m for m in asked if m not in ("baseline", "hisparse")]
    if unknown:
        ap.error(f"--modes: unknown mode(s) {','.join(unknown)} (baseline, hisparse)")
    if asked.count("baseline") > 2 or asked.count("hisparse") > 1:
        ap.error("--modes: baseline at most twice (before and after hisparse), hisparse at most once")
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    t_start = time.monotonic()
    cuda = not args.smoke
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    dims = {k: v for k, v in dsv32.SMOKE.items() if k != "layers"} if args.smoke else {}
    cfg = dsv32.V32Config(layers=args.layers, locality=args.locality, seed=args.seed, **dims)
    fmt = dsv32.record_format(args.records, cfg)
    lines = []

    def emit(obj):
        lines.append(obj)
        print(json.dumps(obj), flush=True)

    if cuda:
        from engine import measure_link_gbps
        emit(dict(kind="link", h2d_gbps=round(measure_link_gbps(dev, tries=3), 1), note="1 GiB pinned H2D, best of 3"))
    t = time.monotonic()
    model = dsv32.Model(cfg, dev, fp8_weights=cuda, kernels=sparse_kernels.Kernels(cuda))
    wb = model.weight_bytes()
    full_weights = sum(wb.values()) * cfg.full_layers / cfg.layers
    budget = int(max(0, parse_size(args.gpu_hbm) - full_weights - parse_size(args.reserve)) * cfg.layers / cfg.full_layers)
    pool = parse_size(args.host_pool_size)
    gemm = {}
    if cuda:  # the fastest expert GEMM of --expert-gemm here, at 8 rows an expert (N = 32)
        moe = next((L for L in model.layers if not L.dense), None)
        ways = ("loop", "grouped") if args.expert_gemm == "torch" else dsv32.Experts.GEMMS
        gemm = moe.experts.choose_gemm(8, ways) if moe else {}
        for L in model.layers:
            if not L.dense:
                L.experts.gemm, L.experts.triton_config = moe.experts.gemm, moe.experts.triton_config
    mla = model.kernels.tune_mla(fmt, args.tune_mla) if cuda and args.tune_mla > 0 else {}
    model.topk = args.topk
    topk_us = time_topk(dev, cfg.topk) if cuda else {}
    emit(dict(kind="model", layers=cfg.layers, dense_layers=cfg.dense_layers, vocab=cfg.vocab,
              weight_bytes=wb, full_model_weight_bytes=int(full_weights), kv_budget_bytes=budget,
              records=fmt.name, record_bytes=fmt.record_bytes, index_key_bytes=cfg.index_key_bytes, k=cfg.topk,
              slots=args.slots, locality=cfg.locality, grouped_expert_gemm=gemm, mla_tiles_us=mla,
              mla_tile=model.kernels.mla_tag(model.kernels.mla_config), topk=model.topk, topk_us=topk_us,
              device=torch.cuda.get_device_name(dev) if cuda else "cpu", build_s=round(time.monotonic() - t, 1)))

    import hisparse
    daemon = hisparse.Daemon(host_pool_size=args.host_pool_size, host_pool_segment_size=args.host_pool_segment_size,
                             start_timeout_s=300.0).start()
    watch = None
    if args.ctl_watch:  # the daemon's own view during the run (its counters per session)
        ctl = os.environ.get("HISPARSE_CTL_BIN") or str(pathlib.Path(hisparse.find_daemon_binary()).with_name("hisparse-ctl"))
        watch = subprocess.Popen([ctl, "--daemon", daemon.address, "--json", "watch", "--interval", "2"],
                                 stdout=open(args.ctl_watch, "w"), stderr=subprocess.STDOUT)
    contexts = [c if c.startswith("mix") else int(c) for c in args.contexts.split(",")]
    slots = [int(x) for x in args.slots.split(",")]
    # In --modes' order, a second "baseline" named baseline_after: the same graph can launch its
    # kernels more slowly early in a process than after a hisparse session has opened (bench/RESULTS.md,
    # "Full HBM's launch gaps"), so full HBM may be timed before and after hisparse's points.
    modes, seen = [], set()
    for m in args.modes.split(","):
        if m == "baseline":
            modes.append(("baseline", None, "baseline_after" if m in seen else "baseline"))
        else:
            modes += [("hisparse", B, None) for B in slots]
        seen.add(m)
    modes += [("hybrid", int(B), None) for B in args.hybrid_slots.split(",") if B]
    levels = [int(x) for x in args.levels.split(",")]
    max_out = int(args.out_len.split(":")[1])
    overlap = overlap_of(args)
    samples = {}
    try:
        if args.hit_rates:
            curve(args, model, fmt, daemon.address, contexts, budget, pool, emit, t_start)
            contexts = []  # the curve replaces the concurrency sweep
        for ctx in contexts:
            for mode, B, name in modes:
                caps = capacity(cfg, fmt, ctx, max_out, B or slots[0], budget, pool)
                cap = caps["baseline" if mode == "baseline" else "hisparse"]
                name = name or f"{mode}_B{B}" + (overlap_tag(overlap) if overlap and mode == "hisparse" else "")
                emit(dict(kind="capacity", context=ctx, mode=name, slots=B, **cap))
                c = min(cap["capacity"], args.max_concurrency)
                todo = sorted({n for n in levels if n <= c} | ({c} if c > 0 else set()))
                for N in todo:
                    if time.monotonic() - t_start > args.time_budget_s:
                        emit(dict(kind="skipped", mode=name, context=ctx, concurrency=N, reason="time budget"))
                        continue
                    n_res = resident_rows(cfg, fmt, ctx, N, max_out, B, budget) if mode == "hybrid" else 0
                    rec, samp = run_point(args, model, fmt, daemon.address, mode, name, ctx, N, B, n_res, overlap)
                    emit(rec)
                    samples[(name, ctx, N)] = samp
                emit(dict(kind="stop", mode=name, context=ctx, last=c, limit=cap["limit"] if c == cap["capacity"]
                          else "--max-concurrency"))
        for (name, ctx, N), samp in samples.items():
            # Against the full-HBM run of the same schedule, else (a hybrid point past the baseline's
            # capacity: resident and hisparse rows in one batch) against the all-hisparse run.
            ref_name = "baseline" if ("baseline", ctx, N) in samples else name.replace("hybrid", "hisparse").split("_overlap")[0]
            ref = samples.get((ref_name, ctx, N))
            if name in ("baseline", ref_name) or ref is None:  # baseline_after: full HBM again, held to its first run
                continue
            same = sum(bool(torch.equal(ref[s], samp[s])) for s in ref)
            emit(dict(kind="exactness", mode=name, against=ref_name, context=ctx, concurrency=N, records=fmt.name,
                      sampled_steps=len(ref), identical=same, exact=same == len(ref)))
    finally:
        if watch is not None:
            watch.terminate()
            watch.wait(timeout=10)
        daemon.stop()
    if args.json:
        pathlib.Path(args.json).write_text("".join(json.dumps(x) + "\n" for x in lines))
    report(lines)
    if args.plot:
        plot(lines, args.plot)
    bad = [x for x in lines if x["kind"] in ("exactness", "curve") and not x["exact"]]
    print(f"device-side wall time {time.monotonic() - t_start:.0f} s")
    return 1 if bad else 0


def report(lines):
    pts = [x for x in lines if x["kind"] == "point"]
    print("\n| mode | context | N | tokens/s | TPOT p50 ms | p99 | hit rate | misses/step | fetched GB/s | admit ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in pts:
        print(f"| {r['mode']} | {r['context']} | {r['concurrency']} | {r['tokens_per_s']:.0f} | {r['tpot_ms_p50']:.3f} | "
              f"{r['tpot_ms_p99']:.3f} | {r.get('hit_rate', '-')} | {r.get('misses_per_step', '-')} | "
              f"{r.get('fetched_gb_per_s', '-')} | {r['admit_ms_p50']} |")
    for ctx in sorted({r["context"] for r in pts}, key=str):
        names = sorted({r["mode"] for r in pts if r["context"] == ctx and not r["mode"].startswith("full_at_N")})
        best = {m: max(r["tokens_per_s"] for r in pts if r["context"] == ctx and r["mode"] == m) for m in names}
        full = max(best.get("baseline", 0), best.get("baseline_after", 0))  # the faster full-HBM run
        for m in names:
            if not m.startswith("baseline") and full:
                print(f"context {ctx}: peak tokens/s baseline {full:.0f}, {m} {best[m]:.0f}: x{best[m] / full:.2f}")
    cur = [x for x in lines if x["kind"] == "curve"]
    if cur:
        print("\n| context | target | hit rate (overlap) | N | misses/step | ratio | ratio, overlap | step ms full / "
              "hisparse / overlap | RESOLVE exposed ms | exposed, overlap | cut | exact |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in cur:
            mark = {0.78: " (real text)", 0.87: " (paper)"}.get(c["target_hit_rate"], "")
            print(f"| {c['context']} | {c['target_hit_rate']}{mark} | {c['hit_rate']} ({c['hit_rate_overlap']}) | "
                  f"{c['concurrency']} | {c['misses_per_step']} | {c['ratio']} | {c['ratio_overlap']} | "
                  f"{c['step_ms_full']} / {c['step_ms']} / {c['step_ms_overlap']} | {c['exposed_ms']} | "
                  f"{c['exposed_ms_overlap']} | {c['exposed_cut']} | {c['identical']}+{c['identical_overlap']}/"
                  f"{2 * c['sampled_steps']} |")


def plot(lines, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return
    pts = [x for x in lines if x["kind"] == "point"]
    stops = {(x["mode"], x["context"]): x for x in lines if x["kind"] == "stop"}
    ctxs = sorted({r["context"] for r in pts}, key=lambda c: 1 if isinstance(c, str) else -c)
    fig, axes = plt.subplots(2, len(ctxs), figsize=(6 * len(ctxs), 8), squeeze=False)
    for j, ctx in enumerate(ctxs):
        names = sorted({r["mode"] for r in pts if r["context"] == ctx})
        colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
        for mode, color in [(m, "tab:gray" if m == "baseline" else colors[i % 4]) for i, m in enumerate(names)]:
            rs = sorted((r for r in pts if r["context"] == ctx and r["mode"] == mode), key=lambda r: r["concurrency"])
            if not rs:
                continue
            xs = [r["concurrency"] for r in rs]
            stop = stops.get((mode, ctx), {}).get("limit", "?")
            axes[0][j].plot(xs, [r["tokens_per_s"] for r in rs], "o-", color=color, label=f"{mode} (stops: {stop})")
            axes[1][j].plot(xs, [r["tpot_ms_p50"] for r in rs], "o-", color=color, label=f"{mode} p50")
            axes[1][j].plot(xs, [r["tpot_ms_p99"] for r in rs], "x--", color=color, label=f"{mode} p99")
        title = f"length {ctx} (log-uniform)" if isinstance(ctx, str) else f"context {ctx // 1024}k"
        axes[0][j].set_title(f"{title}: throughput")
        axes[0][j].set_ylabel("tokens/s (this GPU)")
        axes[1][j].set_ylabel("TPOT ms")
        for ax in axes[:, j]:
            ax.set_xlabel("concurrent requests")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())

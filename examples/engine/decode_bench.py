#!/usr/bin/env python3
"""hisparse-bench decode: capacity and decode throughput at a fixed HBM budget, full-HBM vs hisparse.

This script *is* `hisparse-bench decode` (the engine is Python, so the subcommand lives here rather
than in bench/main.cc). For each context length it

  1. computes the largest batch whose per-request HBM fits --hbm-budget:
       full-HBM (baseline): layers x max_len x (record_bytes + index_key_bytes) + decode state
       hisparse at B slots: layers x (B + 1) x record_bytes (slot arena)
                            + layers x max_len x index_key_bytes + decode state
     where max_len = context + steps + 1 (what the engine allocates), index_key_bytes = 256 (the
     DSA-style indexer's 128 bf16 keys a token and layer, which the engine keeps in HBM in both
     modes), and the decode state is the per-request positions/page_table (2 x k x 4 B). hisparse is
     also limited by the host pool: batch x layers x max_len x record_bytes <= --host-pool-size.
     Not counted: the weights, the per-layer score workspace of the indexer (reused across layers),
     the benchmark's own logits history; the measured peak (torch + slot arena) is printed too;
  2. runs the baseline at its largest batch, hisparse at the same batch (matched: per-token
     latency, and a bit-exactness check of every step's logits), and hisparse at its largest batch
     per B; every run decodes --steps tokens, one CUDA graph replayed per step (engine.run_mode);
  3. prints JSON lines (one per run and one summary per context, prefixed by nothing) and a table:
     batch, tokens/s = batch / per-step time, per-token latency (p50/p90 step time), hit rate, and
     the ratios hisparse / baseline.

    # GPU (HISPARSE_LIB / HISPARSE_DAEMON_BIN, or the source tree's build/):
    python3 examples/engine/decode_bench.py --hbm-budget 16GiB --host-pool-size 80GiB \
        --contexts 131072,32768 --k 2048 --slots 2048,4096 --layers 4 --steps 40
    # the capacity plan only (no GPU needed):
    python3 examples/engine/decode_bench.py --plan-only
    # a CPU smoke run: the whole script on a tiny model, the host backend, a few steps (torch, no
    # GPU; tests/python/test_decode_bench.py runs it so the GPU path's code cannot rot unseen):
    python3 examples/engine/decode_bench.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if os.environ.get("HISPARSE_INSTALLED") != "1":  # 1: the installed package (a wheel's), not the tree's
    sys.path.insert(0, str(HERE.parent.parent / "client" / "python"))

try:
    import torch  # noqa: E402

    from engine import SMALL, ModelConfig, SparseDecoder, measure_link_gbps, record_format, run_mode  # noqa: E402
except ImportError:  # --plan-only works without torch
    torch = None

    class ModelConfig:  # the engine's defaults that the plan reads
        def __init__(self, seed=0, n_layers=4):
            self.seed, self.n_layers, self.idx_dim, self.locality = seed, n_layers, 128, 6.0

    def record_format(name, cfg):
        return type("Fmt", (), dict(name=name, record_bytes={"bf16": 1152, "fp8": 656}[name]))()

GIB = 1 << 30

# --smoke: sizes small enough for a CPU in seconds, and a model of engine.SMALL's dimensions.
SMOKE = dict(hbm_budget="2MiB", host_pool_size="256MiB", host_pool_segment_size="16MiB", contexts="300", k=16,
             slots="16,32", matched_slots="16", layers=2, steps=4, probe_steps=0, max_batch=3)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(f"bad size {text!r}")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def plan(cfg: ModelConfig, record_bytes: int, ctx: int, k: int, slots, steps: int, budget: int, pool: int,
         segment: int):
    """Per-request HBM bytes and the largest batch per mode (see the module docstring)."""
    L, max_len = cfg.n_layers, ctx + steps + 1
    idx = L * max_len * cfg.idx_dim * 2
    state = 2 * k * 4
    host = L * max_len * record_bytes
    out = {"baseline": dict(per_request_hbm=host + idx + state, kv=host, index_keys=idx, state=state)}
    out["baseline"]["batch"] = budget // out["baseline"]["per_request_hbm"]
    out["baseline"]["limit"] = "hbm"
    for B in slots:
        arena = L * (B + 1) * record_bytes
        per = arena + idx + state
        # The pool holds each (request, layer) as one run inside a segment: whole runs per segment.
        by_hbm, by_pool = budget // per, (pool // segment) * (segment // (max_len * record_bytes)) // L
        out[f"hisparse_B{B}"] = dict(per_request_hbm=per, kv=arena, index_keys=idx, state=state,
                                     host_per_request=host, batch_by_hbm=by_hbm, batch_by_pool=by_pool,
                                     batch=min(by_hbm, by_pool), limit="hbm" if by_hbm <= by_pool else "host pool",
                                     batch_if_index_keys_offloaded=min(budget // (arena + state), by_pool))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hbm-budget", default="16GiB", help="HBM for KV and everything kept per request")
    ap.add_argument("--host-pool-size", default="80GiB", help="hisparsed's host pool (started here)")
    ap.add_argument("--host-pool-segment-size", default="1GiB",
                    help="pool segment; one (request, layer) run must fit in one (256MiB wastes 44%% at 128k)")
    ap.add_argument("--contexts", default="131072,32768", help="context lengths (prompt tokens), in run order")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--slots", default="2048,4096", help="B values (slots per request and layer)")
    ap.add_argument("--matched-slots", default="2048,4096", help="B values also run at the baseline's batch")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--records", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--locality", type=float, default=None, help="indexer salience (engine default 6.0)")
    ap.add_argument("--steps", type=int, default=40, help="decode steps per run (step 0 eager, then graph replays)")
    ap.add_argument("--probe-steps", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=4096, help="cap on any batch")
    ap.add_argument("--time-budget-s", type=float, default=1e9, help="skip the remaining runs after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the JSON lines here")
    ap.add_argument("--plan-only", action="store_true", help="print the capacity plan and exit")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU smoke run: tiny model and sizes (overriding the above), host backend, a few steps")
    args = ap.parse_args(argv)
    if args.smoke:
        if torch is None:
            ap.error("--smoke needs torch")
        for key, value in SMOKE.items():
            setattr(args, key, value)

    t_start = time.monotonic()
    dims = {key: v for key, v in SMALL.items() if key != "n_layers"} if args.smoke else {}
    cfg = ModelConfig(seed=args.seed, n_layers=args.layers, **dims)
    if args.locality is not None:
        cfg.locality = args.locality
    fmt = record_format(args.records, cfg)
    budget, pool = parse_size(args.hbm_budget), parse_size(args.host_pool_size)
    contexts = [int(c) for c in args.contexts.split(",")]
    slots = [int(s) for s in args.slots.split(",")]
    matched = [int(s) for s in args.matched_slots.split(",") if s]
    lines = []

    def emit(obj):
        lines.append(obj)
        print(json.dumps(obj), flush=True)

    plans = {}
    for ctx in contexts:
        plans[ctx] = plan(cfg, fmt.record_bytes, ctx, args.k, slots, args.steps, budget, pool,
                            parse_size(args.host_pool_segment_size))
        for mode, p in plans[ctx].items():
            p["batch"] = min(p["batch"], args.max_batch)
            emit(dict(kind="capacity", context=ctx, mode=mode, record_bytes=fmt.record_bytes, layers=cfg.n_layers,
                      hbm_budget=budget, host_pool=pool, **p))
    if args.plan_only:
        return 0

    import hisparse

    cuda = not args.smoke
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    model = SparseDecoder(cfg, dev)
    print(f"model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, latent {cfg.latent}, "
          f"indexer {cfg.idx_heads}x{cfg.idx_dim} (keys in HBM), locality {cfg.locality}, {fmt.name} records "
          f"({fmt.record_bytes} B); {torch.cuda.get_device_name(dev) if cuda else 'CPU smoke run, host backend'}",
          flush=True)
    link = measure_link_gbps(dev, tries=3) if cuda else float("nan")
    if cuda:
        emit(dict(kind="link", h2d_gbps=round(link, 1), note="1 GiB pinned H2D, best of 3"))

    t = time.monotonic()
    daemon = hisparse.Daemon(host_pool_size=args.host_pool_size, host_pool_segment_size=args.host_pool_segment_size,
                             start_timeout_s=300.0).start()
    print(f"hisparsed pid {daemon.pid}, {args.host_pool_size} host pool, started (pre-touched) in "
          f"{time.monotonic() - t:.1f} s", flush=True)
    weights_bytes = torch.cuda.memory_allocated(dev) if cuda else 0

    def run(ctx, mode, batch, B=None, keep_logits=False):
        if time.monotonic() - t_start > args.time_budget_s:
            emit(dict(kind="skipped", context=ctx, mode=mode, batch=batch, reason="time budget"))
            return None
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.monotonic()
        arena = 0
        if B is None:
            res = run_mode(model, fmt, batch=batch, prompt_len=ctx, k=args.k, steps=args.steps, seed=args.seed + 1,
                           chunk=16384, probe_steps=args.probe_steps)
        else:
            with hisparse.Session(daemon.address, num_layers=cfg.n_layers, record_bytes=fmt.record_bytes, k=args.k,
                                  slots=B, max_requests=batch, gpu=(dev.index or 0) if cuda else -1,
                                  backend="cuda" if cuda else "host", engine_name="decode_bench") as session:
                arena = session.info().arena_bytes
                res = run_mode(model, fmt, batch=batch, prompt_len=ctx, k=args.k, steps=args.steps, session=session,
                               seed=args.seed + 1, chunk=16384, probe_steps=args.probe_steps)
                if cuda:
                    torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - weights_bytes + arena if cuda else None
        p50, p90 = pct(res.step_ms, 0.5), pct(res.step_ms, 0.9)
        sel = res.hits + res.misses
        rec = dict(kind="run", context=ctx, mode=mode, slots=B, batch=batch, steps=args.steps,
                   timed_steps=len(res.step_ms), step_ms_p50=round(p50, 3), step_ms_p90=round(p90, 3),
                   tokens_per_s=round(batch * 1e3 / p50, 1), per_token_latency_ms=round(p50, 3),
                   resolve_ms_p50=round(pct(res.resolve_ms, 0.5), 3) if res.resolve_ms else None,
                   graph_ms_p50=round(pct(res.graph_ms, 0.5), 3) if res.graph_ms else None,
                   hit_rate=round(res.hits / sel, 4) if sel else None,
                   misses_per_row_layer_step=round(res.misses / (args.steps * batch * cfg.n_layers), 1),
                   kv_hbm_bytes=res.kv_hbm_bytes, index_hbm_bytes=res.index_hbm_bytes,
                   measured_peak_hbm_bytes=peak, prefill_s=round(res.prefill_s, 1),
                   wall_s=round(time.monotonic() - t0, 1))
        emit(rec)
        out = (rec, res.logits if keep_logits else None)
        del res
        return out

    summaries = []
    try:
        for ctx in contexts:
            p = plans[ctx]
            nb = p["baseline"]["batch"]
            base = run(ctx, "baseline", nb, keep_logits=True)
            if base is None:
                continue
            s = dict(kind="summary", context=ctx, baseline_batch=nb, baseline_tokens_per_s=base[0]["tokens_per_s"],
                     baseline_step_ms=base[0]["step_ms_p50"], matched={}, peak={})
            for B in matched:
                r = run(ctx, f"hisparse_B{B}@matched", nb, B, keep_logits=True)
                if r is None:
                    continue
                same = sum(bool(torch.equal(base[1][i], r[1][i])) for i in range(args.steps))
                s["matched"][B] = dict(batch=nb, step_ms=r[0]["step_ms_p50"], hit_rate=r[0]["hit_rate"],
                                       latency_ratio=round(r[0]["step_ms_p50"] / base[0]["step_ms_p50"], 3),
                                       identical_steps=same, exact=same == args.steps)
                print(f"exactness: context {ctx}, batch {nb}, B {B}: logits bit-identical at {same}/{args.steps} "
                      f"steps -> {'EXACT' if same == args.steps else 'MISMATCH'}", flush=True)
                del r
            base = base[0]
            if cuda:
                torch.cuda.empty_cache()
            for B in slots:
                nh = p[f"hisparse_B{B}"]["batch"]
                r = run(ctx, f"hisparse_B{B}", nh, B)
                if r is None:
                    continue
                s["peak"][B] = dict(batch=nh, limit=p[f"hisparse_B{B}"]["limit"], tokens_per_s=r[0]["tokens_per_s"],
                                    step_ms=r[0]["step_ms_p50"], hit_rate=r[0]["hit_rate"],
                                    capacity_ratio=round(nh / nb, 2),
                                    throughput_ratio=round(r[0]["tokens_per_s"] / base["tokens_per_s"], 2),
                                    latency_ratio=round(r[0]["step_ms_p50"] / base["step_ms_p50"], 2))
            emit(s)
            summaries.append(s)
    finally:
        daemon.stop()

    if args.json:
        pathlib.Path(args.json).write_text("".join(json.dumps(x) + "\n" for x in lines))
    runs = [x for x in lines if x["kind"] == "run"]
    print(f"\nhisparse-bench decode: HBM budget {budget / GIB:.0f} GiB, host pool {pool / GIB:.0f} GiB, "
          f"{cfg.n_layers} layers, {fmt.name} records ({fmt.record_bytes} B) + index keys "
          f"({cfg.idx_dim * 2} B) per token and layer, k {args.k}, {args.steps} steps, link {link:.1f} GB/s"
          + (" (CPU smoke run: no link, no HBM)" if not cuda else ""))
    print("| context | mode | B | batch | step ms p50 | p90 | tokens/s | hit rate | misses/(req,layer,step) | "
          "RESOLVE ms | peak HBM GiB | prefill s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        hit = "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f}%"
        peak = "-" if r["measured_peak_hbm_bytes"] is None else f"{r['measured_peak_hbm_bytes'] / GIB:.2f}"
        print(f"| {r['context']} | {r['mode']} | {r['slots'] or '-'} | {r['batch']} | {r['step_ms_p50']:.3f} | "
              f"{r['step_ms_p90']:.3f} | {r['tokens_per_s']:.0f} | "
              f"{hit} | "
              f"{r['misses_per_row_layer_step']:.0f} | {r['resolve_ms_p50'] if r['resolve_ms_p50'] is not None else '-'} | "
              f"{peak} | {r['prefill_s']} |")
    print("\n| context | B | batch base -> hisparse (limit) | capacity x | tokens/s base -> hisparse | "
          "throughput x | matched-batch latency x (hit rate) | exact |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in summaries:
        for B in slots:
            pk, mt = s["peak"].get(B), s["matched"].get(B)
            if pk is None:
                continue
            m = f"{mt['latency_ratio']:.2f} ({100 * mt['hit_rate']:.1f}%)" if mt else "-"
            ex = ("yes" if mt["exact"] else "NO") + f" ({mt['identical_steps']}/{args.steps})" if mt else "-"
            print(f"| {s['context']} | {B} | {s['baseline_batch']} -> {pk['batch']} ({pk['limit']}) | "
                  f"{pk['capacity_ratio']:.2f} | {s['baseline_tokens_per_s']:.0f} -> {pk['tokens_per_s']:.0f} | "
                  f"{pk['throughput_ratio']:.2f} | {m} | {ex} |")
    bad = sum(1 for s in summaries for m in s["matched"].values() if not m["exact"])
    print(f"device-side wall time {time.monotonic() - t_start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs the example engine in both modes and checks that hisparse changes nothing.

For every (batch x context) point and record format, the baseline (every layer's KV in HBM) runs
once, then hisparse runs once per B (slots = factor x k); each hisparse run's logits must equal
the baseline's at every decode step (torch.equal, bit for bit) and the generated tokens must be
identical. Prints one `exactness:` and one `latency:` line per hisparse run, optionally a markdown
table (--markdown) and JSON (--json); exits 1 on any mismatch.

    # on a GPU (CUDA backend, decode step in a CUDA graph):
    python3 examples/engine/run_engine.py --configs 1x65536,8x16384,32x8192 --k 2048 --steps 300
    # anywhere (host backend, eager, tiny model):
    python3 examples/engine/run_engine.py --device cpu --model small --configs 2x600 --k 32 --steps 24
    # speculative decoding (mtp.py): n drafts a step, B = (n + 2) k, random acceptance:
    python3 examples/engine/run_engine.py --draft-tokens 1,3 --slots-factor 0 --configs 8x16384 --k 2048
    # served as SGLang serves it (sglang_mode.py: HisparsedCoordinator, continuous batching,
    # mixed lengths, retraction); BATCH requests, the long ones CONTEXT tokens:
    python3 examples/engine/run_engine.py --adapter sglang --configs 8x16384 --k 2048 --steps 100

Needs libhisparse and hisparsed (HISPARSE_LIB / HISPARSE_DAEMON_BIN, or the source tree's build/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
from typing import List, Tuple

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if os.environ.get("HISPARSE_INSTALLED") != "1":  # 1: the installed package (a wheel's), not the tree's
    sys.path.insert(0, str(HERE.parent.parent / "client" / "python"))

import torch  # noqa: E402

import hisparse  # noqa: E402
from engine import (SMALL, HisparseKV, ModelConfig, SparseDecoder, measure_link_gbps, record_format,  # noqa: E402
                    run_mode)
from mtp import run_mtp  # noqa: E402
from sglang_mode import Scheduler, compare, make_workload, run_sglang  # noqa: E402
from sglang_mtp_mode import make_mtp_scheduler  # noqa: E402


def parse_configs(text: str) -> List[Tuple[int, int]]:
    out = []
    for item in text.split(","):
        b, ctx = item.lower().split("x")
        out.append((int(b), int(ctx)))
    return out


def pct(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="1x8192", help="comma-separated BATCHxCONTEXT points")
    ap.add_argument("--k", type=int, default=2048, help="positions selected per (request, layer, step)")
    ap.add_argument("--slots-factor", default="1,2",
                    help="B = factor x k, comma-separated; 0: (n + 2) x k, the sizing for n draft tokens")
    ap.add_argument("--draft-tokens", default="0",
                    help="speculative decoding: n draft tokens a step (n + 1 queries a row), comma-separated")
    ap.add_argument("--steps", type=int, default=300, help="decode steps per run")
    ap.add_argument("--records", default="bf16", help="record formats: bf16 (1152 B), fp8 (656 B), or both")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", choices=["default", "small"], default="default")
    ap.add_argument("--layers", type=int, default=None, help="override the model's layer count")
    ap.add_argument("--locality", type=float, default=None, help="override the indexer's salience strength")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-graph", action="store_true", help="decode eagerly instead of replaying a CUDA graph")
    ap.add_argument("--no-programmatic", action="store_true",
                    help="launch RESOLVE after the previous kernel completes, not as its programmatic dependent")
    ap.add_argument("--probe-steps", type=int, default=16,
                    help="last steps of each run synchronized to read in-graph RESOLVE events")
    ap.add_argument("--daemon", default=None, help="unix:PATH of a running hisparsed (default: start one)")
    ap.add_argument("--host-pool-size", default=None, help="pool of the daemon started here (default: sized to fit)")
    ap.add_argument("--markdown", default=None, help="append a results table to this file")
    ap.add_argument("--json", default=None, help="write every run's figures to this file")
    ap.add_argument("--adapter", choices=["none", "sglang", "vllm"], default="none",
                    help="sglang: drive hisparse.integrations.sglang.HisparsedCoordinator as SGLang's scheduler "
                         "and model runner would (sglang_mode.py), against SGLang's full-pool decode; vllm: drive "
                         "hisparse.integrations.vllm.HisparsedConnector as vLLM's scheduler, ActiveKVConnector and "
                         "MLAAttention would over a served workload with preemption, abort and --draft-tokens "
                         "(vllm_serve_mode.py, eager), against vLLM's plain sparse decode over its full paged cache")
    ap.add_argument("--pd-import", action="store_true",
                    help="with --adapter vllm: a long request arrives as a P/D import (hisparse-bench import "
                         "--records is its prefill node); the daemon started here serves imports")
    ap.add_argument("--vllm-fixed-batch", action="store_true",
                    help="with --adapter vllm: one fixed batch, no drafts (vllm_mode.py), against run_mode's baseline")
    args = ap.parse_args(argv)

    dev = torch.device(args.device)
    HisparseKV.programmatic = not args.no_programmatic
    cfg = ModelConfig(seed=args.seed, **(SMALL if args.model == "small" else {}))
    if args.layers is not None:
        cfg.n_layers = args.layers
    if args.locality is not None:
        cfg.locality = args.locality
    configs = parse_configs(args.configs)
    factors = [float(f) for f in args.slots_factor.split(",")]
    drafts = [int(n) for n in args.draft_tokens.split(",")]
    formats = [record_format(name, cfg) for name in args.records.split(",")]
    model = SparseDecoder(cfg, dev)
    gpu = dev.index if dev.index is not None else 0
    backend = "cuda" if dev.type == "cuda" else "host"
    print(f"model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, latent {cfg.latent}, "
          f"indexer {cfg.idx_heads}x{cfg.idx_dim}, vocab {cfg.vocab}, locality {cfg.locality}; device {dev}, "
          f"hisparse backend {backend}, decode step in a CUDA graph: {dev.type == 'cuda' and not args.no_graph}",
          flush=True)

    if dev.type == "cuda":
        # The link the misses cross, measured in this run (the machines are shared).
        print(f"link: H2D copy of 1 GiB pinned, best of 3: {measure_link_gbps(dev, tries=3):.1f} GB/s; "
              f"{torch.cuda.get_device_name(dev)}", flush=True)

    daemon = None
    address = args.daemon
    if address is None:
        need = max(b * (ctx + (args.steps + 1) * (max(drafts) + 1)) * cfg.n_layers * max(f.record_bytes for f in formats)
                   for b, ctx in configs)
        pool = args.host_pool_size or f"{max(1, math.ceil(need * 1.3 / 2**30))}GiB"
        extra_args = ["--set", "import.enabled=true"] if args.pd_import else []
        daemon = hisparse.Daemon(host_pool_size=pool, host_pool_segment_size="256MiB", extra_args=extra_args).start()
        address = daemon.address
        print(f"started hisparsed (pid {daemon.pid}) with a {pool} host pool", flush=True)

    rows = []
    failures = 0
    try:
        for fmt in formats:
            for batch, ctx in configs:
                if args.adapter == "sglang":
                    failures += run_sglang_point(model, fmt, batch, ctx, drafts, factors, args, address, backend, rows)
                    continue
                if args.adapter == "vllm":
                    if args.vllm_fixed_batch:
                        failures += run_vllm_point(model, fmt, batch, ctx, factors, args, address, gpu, backend, rows)
                    else:
                        failures += run_vllm_serve_point(model, fmt, batch, ctx, drafts, factors, args, address, gpu,
                                                         backend, rows)
                    continue
                for n in drafts:
                    failures += run_point(model, fmt, batch, ctx, n, factors, args, address, gpu, backend, rows)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        if daemon is not None:
            daemon.stop()

    if args.markdown:
        write_markdown(args.markdown, rows, args, cfg, dev)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"engine: {len(rows) - failures} of {len(rows)} hisparse runs bit-identical to the baseline")
    return 1 if failures else 0


def run_vllm_point(model, fmt, batch, ctx, factors, args, address, gpu, backend, rows) -> int:
    """The eager baseline once, then the vLLM-driven adapter once per B (vllm_mode.py)."""
    from vllm_mode import run_vllm

    base = run_mode(model, fmt, batch=batch, prompt_len=ctx, k=args.k, steps=args.steps, seed=args.seed + 1,
                    use_graph=False)
    failures = 0
    for factor in factors:
        slots = int(round(factor * args.k))
        hs = run_vllm(model, fmt, batch=batch, prompt_len=ctx, k=args.k, steps=args.steps, address=address,
                      backend=backend, gpu=gpu, slots=slots, seed=args.seed + 1)
        row = report(fmt.name, batch, ctx, args.k, slots, model.cfg.n_layers, base, hs)
        row["adapter"] = "vllm"
        failures += 0 if row["exact"] else 1
        rows.append(row)
    return failures


def run_vllm_serve_point(model, fmt, batch, ctx, drafts, factors, args, address, gpu, backend, rows) -> int:
    """The vLLM-adapter mode over sglang_mode's workload (vllm_serve_mode.py): per draft count the
    connector-less baseline once, then HisparsedConnector once per B; appends a report row each."""
    from vllm_serve_mode import run_vllm_serve

    failures = 0
    for n in drafts:
        for factor in factors:
            slots = int(round((factor or n + 2) * args.k))
            short = max(2, min(slots // 2, slots - args.steps * (n + 1) - 1))
            work = make_workload(model.cfg.vocab, batch=batch, context=ctx, short=short, steps=args.steps,
                                 seed=args.seed + 1)
            # The P/D request: the last long one that is not preempted.
            pd = [rid for rid, prompt, _, _ in work.specs[::2] if rid not in work.retract][-1] if args.pd_import else None
            base = run_vllm_serve(model, fmt, work, k=args.k, steps=args.steps, draft_tokens=n, pd_import=pd)
            extra = dict(daemon=address, backend=backend, device_buffer_size=slots)
            if backend == "cuda":
                extra["gpu"] = gpu
            hs = run_vllm_serve(model, fmt, work, k=args.k, steps=args.steps, draft_tokens=n, hisparse=extra,
                                pd_import=pd)
            same, total, tokens_same, first = compare(base, hs)
            exact = same == total and tokens_same and first is None and base.retracted == hs.retracted
            spec = f", {n} draft tokens (a swap_in per verify step)" if n else ""
            where = (f"vLLM adapter{spec}, {batch} requests (long {ctx}, short {short} tokens, {hs.retracted} "
                     f"preempted, {hs.aborted} of them aborted while preempted"
                     f"{f', {pd} a P/D import' if pd else ''}), k {args.k}, B {slots}, "
                     f"{fmt.name} records")
            print(f"exactness: {where}: logits bit-identical in {same}/{total} (request, decode step) rows "
                  f"(torch.equal){'' if first is None else f', first difference at {first}'}; generated tokens "
                  f"identical: {'yes' if tokens_same else 'NO'} -> {'EXACT' if exact else 'MISMATCH'}", flush=True)
            sel = hs.hits + hs.misses
            print(f"latency: {where}: baseline {pct(base.step_ms, 0.5):.3f} ms/step, hisparse "
                  f"{pct(hs.step_ms, 0.5):.3f} ms/step (p50, host-timed, eager); hit rate "
                  f"{100 * hs.hits / sel if sel else 0:.1f}%, {hs.misses} misses", flush=True)
            failures += 0 if exact else 1
            rows.append(dict(adapter="vllm", draft_tokens=n, records=fmt.name, batch=batch, context=ctx, short=short,
                             k=args.k, slots=slots, steps=args.steps, exact=exact, identical_rows=same, rows=total,
                             tokens_identical=tokens_same, preempted=hs.retracted, aborted=hs.aborted,
                             connector_ops=hs.ops, pd_import=pd, hits=hs.hits,
                             misses=hs.misses, graph=False, baseline_ms_p50=pct(base.step_ms, 0.5),
                             hisparse_ms_p50=pct(hs.step_ms, 0.5)))
    return failures


def run_point(model, fmt, batch, ctx, n, factors, args, address, gpu, backend, rows) -> int:
    """The baseline once, then hisparse once per B; appends a report row each; returns the mismatches."""
    cfg = model.cfg

    def run(session=None):
        if n == 0:
            return run_mode(model, fmt, batch=batch, prompt_len=ctx, k=args.k, steps=args.steps, session=session,
                            seed=args.seed + 1, use_graph=not args.no_graph, probe_steps=args.probe_steps)
        return run_mtp(model, fmt, batch=batch, prompt_len=ctx, k=args.k, steps=args.steps, draft_tokens=n,
                       session=session, seed=args.seed + 1, use_graph=not args.no_graph)

    base = run()
    failures = 0
    for factor in factors:
        slots = int(round((factor or n + 2) * args.k))
        with hisparse.Session(address, num_layers=cfg.n_layers, record_bytes=fmt.record_bytes, k=args.k,
                              slots=slots, max_requests=batch, gpu=gpu if backend == "cuda" else -1,
                              backend=backend, engine_name="examples/engine", draft_tokens=n) as session:
            hs = run(session)
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
        row = report(fmt.name, batch, ctx, args.k, slots, cfg.n_layers, base, hs)
        row["draft_tokens"] = n
        if n:
            same_accept = bool(torch.equal(base.accepted, hs.accepted))
            row["exact"] = row["exact"] and same_accept
            mean = base.accepted.float().mean().item()
            print(f"speculative: {n} draft tokens, {n + 1} queries a row and step, mean accepted {mean:.2f}; "
                  f"acceptance identical: {'yes' if same_accept else 'NO'}", flush=True)
        failures += 0 if row["exact"] else 1
        rows.append(row)
    return failures


def run_sglang_point(model, fmt, batch, ctx, drafts, factors, args, address, backend, rows) -> int:
    """The SGLang-adapter mode at one point: per draft count (0: plain decode; n: EAGLE rounds of
    n + 1 verify tokens through HisparsedMTPCoordinator) the full-pool baseline once, then the
    coordinator once per B; appends a report row each; returns the mismatches."""
    from hisparse.integrations.sglang import HisparsedCoordinator
    from hisparse.integrations.sglang_mtp import HisparsedMTPCoordinator

    failures = 0
    use_graph = not args.no_graph
    device = str(model.device) if model.device.type == "cpu" else f"cuda:{model.device.index or 0}"
    for n in drafts:
        scheduler = make_mtp_scheduler(n) if n else Scheduler
        for factor in factors:
            slots = int(round((factor or n + 2) * args.k))
            short = max(2, min(slots // 2, slots - args.steps * (n + 1) - 1))
            work = make_workload(model.cfg.vocab, batch=batch, context=ctx, short=short, steps=args.steps,
                                 seed=args.seed + 1)
            base = run_sglang(model, fmt, work, k=args.k, steps=args.steps, use_graph=use_graph, scheduler=scheduler)

            def coordinator(req_to_token_pool, pool, slots=slots, n=n):
                if n:
                    return HisparsedMTPCoordinator(req_to_token_pool, pool, args.k, slots, device, None,
                                                   num_draft_tokens=n + 1, daemon=address, backend=backend)
                return HisparsedCoordinator(req_to_token_pool, pool, args.k, slots, device, None, daemon=address,
                                            backend=backend)

            hs = run_sglang(model, fmt, work, k=args.k, steps=args.steps, make_coordinator=coordinator,
                            use_graph=use_graph, scheduler=scheduler)
            same, total, tokens_same, first = compare(base, hs)
            gained = hs.free_physical_min > base.free_physical_min
            exact = same == total and tokens_same and first is None
            spec = f", {n} draft tokens (EAGLE verify)" if n else ""
            where = (f"SGLang adapter{spec}, {batch} requests (long {ctx}, short {short} tokens, "
                     f"{hs.retracted} retracted, {hs.aborted} of them aborted, {hs.imported} PD imports), "
                     f"k {args.k}, B {slots}, {fmt.name} records")
            print(f"exactness: {where}: logits bit-identical in {same}/{total} (request, decode step) rows "
                  f"(torch.equal){'' if first is None else f', first difference at {first}'}; generated tokens "
                  f"identical: {'yes' if tokens_same else 'NO'} -> {'EXACT' if exact else 'MISMATCH'}", flush=True)
            sel = hs.hits + hs.misses
            timing = f"p50, host-timed, {'CUDA graph' if hs.used_graph else 'eager'}"
            print(f"latency: {where}: baseline {pct(base.step_ms, 0.5):.3f} ms/step, hisparse "
                  f"{pct(hs.step_ms, 0.5):.3f} ms/step ({timing}); hit rate {100 * hs.hits / sel if sel else 0:.1f}%, "
                  f"{hs.misses} misses", flush=True)
            print(f"capacity: {where}: fewest free physical KV slots baseline {base.free_physical_min}, hisparse "
                  f"{hs.free_physical_min} -> {'GAINED' if gained else 'NO GAIN'}", flush=True)
            failures += 0 if exact and gained else 1
            rows.append(dict(adapter="sglang", draft_tokens=n, capacity_gained=gained,
                             free_physical_min_baseline=base.free_physical_min,
                             free_physical_min_hisparse=hs.free_physical_min, aborted=hs.aborted,
                             imported=hs.imported, records=fmt.name, batch=batch, context=ctx, short=short,
                             k=args.k, slots=slots, steps=args.steps, exact=exact, identical_rows=same, rows=total,
                             tokens_identical=tokens_same, retracted=hs.retracted, hits=hs.hits, misses=hs.misses,
                             graph=hs.used_graph, baseline_ms_p50=pct(base.step_ms, 0.5),
                             hisparse_ms_p50=pct(hs.step_ms, 0.5)))
    return failures


def report(fmt_name, batch, ctx, k, slots, n_layers, base, hs) -> dict:
    steps = base.logits.shape[0]
    same = [bool(torch.equal(base.logits[i], hs.logits[i])) for i in range(steps)]
    first_bad = same.index(False) if not all(same) else None
    tokens_same = bool(torch.equal(base.tokens, hs.tokens))
    exact = all(same) and tokens_same
    where = f"batch {batch}, context {ctx}, k {k}, B {slots}, {fmt_name} records"
    print(f"exactness: {where}: logits bit-identical at {sum(same)}/{steps} decode steps (torch.equal)"
          f"{'' if first_bad is None else f', first difference at step {first_bad}'}; generated tokens "
          f"identical: {'yes' if tokens_same else 'NO'} -> {'EXACT' if exact else 'MISMATCH'}", flush=True)
    b50, h50 = pct(base.step_ms, 0.5), pct(hs.step_ms, 0.5)
    sel = hs.hits + hs.misses
    share = (statistics.median(r / g for r, g in zip(hs.resolve_ms, hs.graph_ms))
             if hs.resolve_ms and hs.graph_ms else float("nan"))
    resolve = statistics.median(hs.resolve_ms) if hs.resolve_ms else float("nan")
    misses_per = hs.misses / (steps * batch * n_layers)
    print(f"latency: {where}: baseline {b50:.3f} ms/step (p90 {pct(base.step_ms, 0.9):.3f}), hisparse {h50:.3f} "
          f"ms/step (p90 {pct(hs.step_ms, 0.9):.3f}), x{h50 / b50 if b50 else float('nan'):.2f}; RESOLVE "
          f"{resolve:.3f} ms/step = {100 * share:.1f}% of the in-graph step; hit rate "
          f"{100 * hs.hits / sel if sel else 0:.1f}%, {misses_per:.0f} misses per (request, layer, step); KV in HBM "
          f"{fmt_bytes(base.kv_hbm_bytes)} -> {fmt_bytes(hs.kv_hbm_bytes)} (index keys {fmt_bytes(base.index_hbm_bytes)} "
          f"in both); timed steps {len(hs.step_ms)}, {'CUDA graph' if hs.used_graph else 'eager'}", flush=True)
    return dict(records=fmt_name, batch=batch, context=ctx, k=k, slots=slots, steps=steps, exact=exact,
                identical_steps=sum(same), tokens_identical=tokens_same, baseline_ms_p50=b50,
                baseline_ms_p90=pct(base.step_ms, 0.9), hisparse_ms_p50=h50, hisparse_ms_p90=pct(hs.step_ms, 0.9),
                resolve_ms_p50=resolve, resolve_share=share, hits=hs.hits, misses=hs.misses,
                misses_per_row_layer_step=misses_per, baseline_kv_hbm=base.kv_hbm_bytes,
                hisparse_kv_hbm=hs.kv_hbm_bytes, index_hbm=base.index_hbm_bytes, graph=hs.used_graph,
                prefill_s_baseline=base.prefill_s, prefill_s_hisparse=hs.prefill_s)


def write_markdown(path, rows, args, cfg, dev) -> None:
    lines = [
        "",
        f"Command: `python3 examples/engine/run_engine.py --configs {args.configs} --k {args.k} "
        f"--slots-factor {args.slots_factor} --steps {args.steps} --records {args.records}`; model "
        f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, locality {cfg.locality}; {dev}.",
        "",
        "| records | batch | context | k | B | exact (steps) | baseline ms/step p50 | hisparse ms/step p50 | x | "
        "RESOLVE ms/step | RESOLVE share | hit rate | misses/(req,layer,step) | KV HBM baseline -> hisparse |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        sel = r["hits"] + r["misses"]
        lines.append(
            f"| {r['records']} | {r['batch']} | {r['context']} | {r['k']} | {r['slots']} | "
            f"{'yes' if r['exact'] else 'NO'} ({r['identical_steps']}/{r['steps']}) | {r['baseline_ms_p50']:.3f} | "
            f"{r['hisparse_ms_p50']:.3f} | {r['hisparse_ms_p50'] / r['baseline_ms_p50']:.2f} | "
            f"{r['resolve_ms_p50']:.3f} | {100 * r['resolve_share']:.0f}% | {100 * r['hits'] / sel if sel else 0:.1f}% | "
            f"{r['misses_per_row_layer_step']:.0f} | {fmt_bytes(r['baseline_kv_hbm'])} -> {fmt_bytes(r['hisparse_kv_hbm'])} |")
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())

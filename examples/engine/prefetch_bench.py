#!/usr/bin/env python3
"""hisparse-bench prefetch: exposed IO per decode step with and without exact layer-wise prefetch.

The engine in shared-index mode (ModelConfig.index_share = G: layers [a, a + G) reuse anchor a's
top-k selection, GLM-5-style) decodes with the "sweep" selection, whose miss rate at B = k is set by
how far each row's window of k - 1 prompt positions slides per step (--miss-rates; the measured
rate is printed). For every (miss rate, batch) it runs, one CUDA graph replayed per step each:

  baseline   every layer's KV in HBM (no IO at all);
  plain      hisparse, RESOLVE on every layer (followers included) in the decode stream;
  prefetch   hisparse, RESOLVE on anchors only; each follower's copies are replayed from the
             anchor's miss plan on a side stream right after the anchor's RESOLVE (hs_prefetch),
             and the follower waits only for its own copies.

Per-token latency is the median graph-replay time (CUDA events around each replay). The exposed
IO of a step is plain - baseline (what hisparse adds); the part prefetch hides is
(plain - prefetch) / (plain - baseline). Every step's logits of the three runs are compared bit for
bit. The link bandwidth is measured in the same run (1 GiB pinned H2D cudaMemcpy, best of 5).
JSON lines on stdout (one per run, one summary per point, one for the link).

    python3 examples/engine/prefetch_bench.py --miss-rates 0.05,0.13,0.3 --batches 32,64,128
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if os.environ.get("HISPARSE_INSTALLED") != "1":  # 1: the installed package (a wheel's), not the tree's
    sys.path.insert(0, str(HERE.parent.parent / "client" / "python"))

import torch  # noqa: E402

import hisparse  # noqa: E402
from engine import ModelConfig, SparseDecoder, measure_link_gbps, record_format, run_mode  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--miss-rates", default="0.05,0.13,0.3")
    ap.add_argument("--batches", default="32,64,128")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--context", type=int, default=8192, help="prompt tokens (the sweep stays inside the prompt)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--share", type=int, default=4, help="layers per shared indexer (anchor + followers)")
    ap.add_argument("--heads", type=int, default=None, help="override the model's attention heads")
    ap.add_argument("--mlp-hidden", type=int, default=None, help="override the MLP width")
    ap.add_argument("--records", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--host-pool-size", default="24GiB")
    ap.add_argument("--json", default=None, help="also append the JSON lines to this file")
    args = ap.parse_args(argv)

    dev = torch.device("cuda", 0)
    out = open(args.json, "a") if args.json else None

    def emit(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")

    emit({"kind": "link", "h2d_gbps": round(measure_link_gbps(dev, tries=5), 2),
          "device": torch.cuda.get_device_name(dev)})
    kw = dict(n_layers=args.layers, index_share=args.share, selection="sweep")
    if args.heads:
        kw["n_heads"] = args.heads
    if args.mlp_hidden:
        kw["mlp_hidden"] = args.mlp_hidden
    daemon = hisparse.Daemon(host_pool_size=args.host_pool_size, host_pool_segment_size="1GiB",
                             start_timeout_s=300.0).start()
    try:
        for rate in [float(x) for x in args.miss_rates.split(",")]:
            shift = max(1, round(rate * args.k))
            cfg = ModelConfig(sweep_shift=shift, **kw)
            model = SparseDecoder(cfg, dev)
            fmt = record_format(args.records, cfg)
            anchors = [cfg.anchor(l) for l in range(cfg.n_layers)]
            for batch in [int(x) for x in args.batches.split(",")]:
                common = dict(batch=batch, prompt_len=args.context, k=args.k, steps=args.steps, seed=3,
                              probe_steps=0)
                runs = {"baseline": run_mode(model, fmt, **common)}
                torch.cuda.empty_cache()
                for mode in ("plain", "prefetch"):
                    with hisparse.Session(daemon, num_layers=cfg.n_layers, record_bytes=fmt.record_bytes, k=args.k,
                                          slots=args.k, max_requests=batch, gpu=0, backend="cuda",
                                          layer_anchor=anchors, engine_name=f"prefetch-bench-{mode}") as s:
                        runs[mode] = run_mode(model, fmt, session=s, prefetch=(mode == "prefetch"), **common)
                    torch.cuda.empty_cache()
                exact = all(torch.equal(runs["baseline"].logits, r.logits) for r in runs.values())
                med = {m: statistics.median(r.step_ms) for m, r in runs.items()}
                for m, r in runs.items():
                    sel = r.hits + r.misses
                    emit({"kind": "run", "mode": m, "miss_rate_set": rate, "batch": batch,
                          "step_ms_p50": round(med[m], 4), "steps_timed": len(r.step_ms),
                          "measured_miss_rate": round(r.misses / sel, 4) if sel else None,
                          "misses_per_step": round(r.misses / args.steps, 1) if sel else None})
                exposed = med["plain"] - med["baseline"]
                hidden = (med["plain"] - med["prefetch"]) / exposed if exposed > 0 else None
                r = runs["plain"]
                emit({"kind": "point", "miss_rate_set": rate, "batch": batch, "k": args.k, "B": args.k,
                      "layers": cfg.n_layers, "share": cfg.index_share, "context": args.context,
                      "measured_miss_rate": round(r.misses / (r.hits + r.misses), 4),
                      "baseline_ms": round(med["baseline"], 4), "plain_ms": round(med["plain"], 4),
                      "prefetch_ms": round(med["prefetch"], 4), "exposed_io_ms": round(exposed, 4),
                      "exposed_io_prefetch_ms": round(med["prefetch"] - med["baseline"], 4),
                      "hidden_fraction": round(hidden, 3) if hidden is not None else None,
                      "latency_prefetch_vs_plain": round(med["prefetch"] / med["plain"], 4),
                      "bit_exact": exact})
                del runs
                torch.cuda.empty_cache()
            del model
    finally:
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

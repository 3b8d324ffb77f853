#!/usr/bin/env python3
"""The cost model of bench/MODEL.md ("Production-proportioned decode node") applied to a
hisparse-bench serve run: predicts every hisparse point's step time and throughput from the
full-HBM points only, and prints predicted against measured.

    T_base(b, C) = sum over the step's parts p of  a_p + w_p * b + c_p * b * C
                   (each part's time from the probe graph's timing events, least squares over the
                   run's full-HBM points; the indexer and top-k scale with b * C (c_p, w_p = 0),
                   every other part with b (w_p, c_p = 0))
    T_hs(b, C)   = T_base(b, C) + L * t_plan + M * R / (eta * link)

M is the point's misses per step (the daemon's counter: the selection stream sets it, not the
timing), R the record bytes, link the H2D rate the run measured, t_plan = 15 µs a RESOLVE launch and
eta = 0.53 (random 656-B misses gather at 29.4 of 55.5 GB/s: FACTS.md), both from other
runs. Nothing is fitted to a hisparse point.

    python3 bench/serve_model.py serve.jsonl

On a hit-rate curve (serve_bench.py --hit-rates, issue 44) it projects instead what a FlashMLA-class
sparse attention would make of each curve point (--flashmla-tflops, default 410: DeepSeek's figure
for FlashMLA's fp8 sparse decode on an H800, whose tensor rate the H200 shares):

    a_row      = (attention(N) - attention(n)) / (N - n)     per row and step, this engine's, from
                 the full-HBM points at the baseline's capacity n and hisparse's N (probe events)
    f_row      = L * 2 * heads * k * (576 + 512) / flashmla_flops
                 (QK over the 576-wide latent, PV over its 512; the 656-B records read in ~0.5 us
                 a row and layer at HBM speed, below this compute time)
    T'(b)      = T(b) - b * (a_row - f_row)                  every measured step, either mode
    exposed    = T_hisparse(N) - T_full(N)                   RESOLVE's, measured: it does not depend
                                                             on attention's speed
    hideable   = N * f_row * (r - 1) / r                     at most what r row ranges of the overlap
                                                             can hide under attention

and, with the leaner floor of issue 44's item 4 (--moe-lean, default 2.1/3.3: the grouped expert
GEMM streaming 3.3 TB/s as a plain fp8 GEMM does, not 2.1), what each schedule of r even ranges
could hide at most, E = exposed, A = N * f_row, I = the indexer's time at N (both per step):

    T''(b)     = T'(b) - moe(b) * (1 - moe_lean)             every step, either mode
    attention  = (r - 1) * min(E, A) / r                     range c + 1's RESOLVE beside range c's
                                                             attention (Overlap.beside)
    cover      = min(E / r, I * (r - 1) / r) + attention     and the first range's beside the other
                                                             rows' indexer (Overlap.indexer_chain = 1)
    chained    = (r - 1) * min(E, I) / r                     range c's beside range c + 1's indexer,
                 + min(E / r, A * (r - 1) / r)               the last beside the others' attention

(the same three bounds are printed with this engine's own attention for A, what a measured run of
these schedules can show at most);

and the option issue 44 named first, two micro-batches a step (one's RESOLVE under the other's
layer), whose cost is what a step spends whatever its batch, paid twice: the weights every part
streams and its launches (W = the sum over the parts that scale with b of their intercept
a_p = p(n) - n * (p(N) - p(n)) / (N - n), the MoE's at the lean rate):

    micro      = min(E, (T''(N) + W) / 2) - W                net: what it hides less what it costs

    python3 bench/serve_model.py bench/results/hide-misses-2026-12-04-curve.jsonl
"""

from __future__ import annotations

import json
import sys

T_PLAN_MS = 0.015
ETA = 0.53
FLASHMLA_TFLOPS = 410.0  # FlashMLA's README: fp8 sparse decoding "up to 410 TFlops" (H800)
MOE_LEAN = 2.1 / 3.3  # issue 44, item 4: the grouped expert GEMM at 2.1 TB/s where a plain fp8 GEMM streams 3.3


def fit(rows, cols):
    """Least squares of y over the columns named in cols (of 1, b, b*C) for rows (b, b*C, y)."""
    import numpy as np
    X = np.array([[{"1": 1.0, "b": r[0], "bC": r[1]}[c] for c in cols] for r in rows])
    y = np.array([r[2] for r in rows])
    coef = dict(zip(cols, np.linalg.lstsq(X, y, rcond=None)[0]))
    return [coef.get("1", 0.0), coef.get("b", 0.0), coef.get("bC", 0.0)]


# What each part's time can depend on: the indexer and top-k read every row's whole context (b * C);
# every other part streams weights (a constant) and does per-row work (b), whatever the context.
CONTEXT_PARTS = {"indexer", "topk"}


def flashmla_row_ms(model, tflops: float, heads: int = 128, latent: int = 576, v: int = 512) -> float:
    """One row's sparse attention over the k selections, every layer of a step, at tflops."""
    return model["layers"] * 2.0 * heads * model["k"] * (latent + v) / (tflops * 1e12) * 1e3


def hideable(exposed: float, ranges: int, attention: float, indexer: float):
    """At most what each schedule of `ranges` even row ranges hides of `exposed` ms a step, with
    `attention` and `indexer` ms a step of cover (the formulas atop this file)."""
    r = max(1, ranges)
    att = (r - 1) * min(exposed, attention) / r
    return dict(attention=att, cover=min(exposed / r, indexer * (r - 1) / r) + att,
                chained=(r - 1) * min(exposed, indexer) / r + min(exposed / r, attention * (r - 1) / r))


def fixed_ms(base: dict, full: dict, n: int, N: int, moe_lean: float = 1.0) -> float:
    """What a step spends whatever its batch (the weights it streams, its launches), from two
    full-HBM points (n and N rows): the sum of the intercepts of the parts that scale with the batch
    (the indexer and top-k scale with its context, RESOLVE is what is hidden), the MoE's at
    moe_lean of its measured time. A second micro-batch in the step pays this once more."""
    total = 0.0
    for part, at_n in base["parts_ms"].items():
        if part in CONTEXT_PARTS or part == "resolve":
            continue
        slope = (full["parts_ms"][part] - at_n) / (N - n)
        total += max(0.0, at_n - n * slope) * (moe_lean if part == "moe" else 1.0)
    return total


def two_microbatches(exposed: float, step: float, fixed: float) -> float:
    """Net ms a step that two micro-batches gain at most (negative: what they cost): each half's
    RESOLVE hidden under the other half's layer (at most half the step), the fixed cost paid twice."""
    return min(exposed, (step + fixed) / 2) - fixed


def project_curve(lines, tflops: float, moe_lean: float = MOE_LEAN):
    """The hit-rate curve with this engine's attention replaced by a FlashMLA-class one: rows of
    (context, hit rate, measured and projected full-HBM peak ratio without and with hiding, what
    the overlap could hide at most, and what it hid); then with the leaner MoE too (lean_*), the
    peak ratio each schedule of hideable() would reach at most."""
    model = next(x for x in lines if x["kind"] == "model")
    pts = [x for x in lines if x["kind"] == "point"]
    f_row = flashmla_row_ms(model, tflops)
    out = []
    for c in (x for x in lines if x["kind"] == "curve"):
        ctx, N, n = c["context"], c["concurrency"], c["baseline_peak_concurrency"]
        base = next(p for p in pts if p["context"] == ctx and p["mode"] == "baseline" and p["concurrency"] == n)
        full = next(p for p in pts if p["context"] == ctx and p["mode"] == "full_at_N" and p.get("target_hit_rate")
                    == c["target_hit_rate"])
        a_row = (full["parts_ms"]["attention"] - base["parts_ms"]["attention"]) / (N - n)
        cut = a_row - f_row
        t_base = base["step_ms_mean"] - n * cut
        t_full = c["step_ms_full"] - N * cut
        exposed = c["step_ms"] - c["step_ms_full"]
        ranges = len(c["overlap"]["ranges"])
        peak = n / t_base
        row = dict(context=ctx, hit_rate=c["hit_rate"], overlap=c["overlap"]["spec"], a_row_us=a_row * 1e3,
                   f_row_us=f_row * 1e3, ratio=c["ratio"], ratio_overlap=c["ratio_overlap"],
                   projected_ratio=N / (t_full + exposed) / peak,
                   projected_ratio_all_hidden=N / t_full / peak,
                   hideable_ms=N * f_row * (ranges - 1) / ranges,
                   hidden_ms=c["exposed_ms"] - c["exposed_ms_overlap"], exposed_ms=exposed)
        lean_base = t_base - base["parts_ms"].get("moe", 0.0) * (1 - moe_lean)
        lean_full = t_full - full["parts_ms"].get("moe", 0.0) * (1 - moe_lean)
        lean_peak = n / lean_base
        row["lean_ratio"] = N / (lean_full + exposed) / lean_peak
        row["lean_ratio_all_hidden"] = N / lean_full / lean_peak
        for k, v in hideable(exposed, ranges, N * f_row, full["parts_ms"].get("indexer", 0.0)).items():
            row[f"lean_ratio_{k}"] = N / (lean_full + exposed - v) / lean_peak
            row[f"hideable_{k}_ms"] = v
        # The same bounds with this engine's own attention (what the measured curve can show).
        for k, v in hideable(exposed, ranges, full["parts_ms"].get("attention", 0.0),
                             full["parts_ms"].get("indexer", 0.0)).items():
            row[f"hideable_here_{k}_ms"] = v
        row["fixed_ms"] = fixed_ms(base, full, n, N, moe_lean)
        row["net_micro_ms"] = two_microbatches(exposed, lean_full, row["fixed_ms"])
        row["lean_ratio_micro"] = N / (lean_full + exposed - row["net_micro_ms"]) / lean_peak
        out.append(row)
    return out


def one_a_point(rows):
    """The rows of project_curve, one a (context, hit rate): the schedules' bounds depend on the
    range count only, not on which overlap variant ran."""
    seen = set()
    for r in rows:
        if (r["context"], r["hit_rate"]) not in seen:
            seen.add((r["context"], r["hit_rate"]))
            yield r


def main_curve(lines, tflops: float, moe_lean: float = MOE_LEAN) -> int:
    rows = project_curve(lines, tflops, moe_lean)
    ours = ", ".join(sorted({"%.0f" % r["a_row_us"] for r in rows}))
    print(f"FlashMLA-class attention at {tflops:g} TFLOP/s: {rows[0]['f_row_us']:.1f} us a row and step "
          f"(this engine's: {ours} us)\n")
    print("| context | hit rate | overlap | ratio measured: hisparse / overlap | projected: hisparse / all hidden | "
          "exposed ms | overlap hid (measured) | could hide under a FlashMLA-class attention |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['context']} | {r['hit_rate']} | {r['overlap']} | {r['ratio']:.2f}x / {r['ratio_overlap']:.2f}x | "
              f"{r['projected_ratio']:.2f}x / {r['projected_ratio_all_hidden']:.2f}x | {r['exposed_ms']:.2f} | "
              f"{r['hidden_ms']:.2f} | {r['hideable_ms']:.2f} |")
    if moe_lean == 1.0:
        print("\nOn this run's floor (its MoE as measured): peak ratio at most, by what is hidden\n")
    else:
        print(f"\nWith the MoE {1 / moe_lean:.2f}x faster too (the leaner floor): peak ratio at most, by what is hidden\n")
    print("| context | hit rate | ranges | nothing | beside attention | + first range beside the indexer | "
          "chained under the indexer | everything | hideable ms: attention / cover / chained of | "
          "two micro-batches: ratio, net ms (fixed cost paid twice) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in one_a_point(rows):
        print(f"| {r['context']} | {r['hit_rate']} | {r['overlap']} | {r['lean_ratio']:.2f}x | "
              f"{r['lean_ratio_attention']:.2f}x | {r['lean_ratio_cover']:.2f}x | {r['lean_ratio_chained']:.2f}x | "
              f"{r['lean_ratio_all_hidden']:.2f}x | {r['hideable_attention_ms']:.2f} / {r['hideable_cover_ms']:.2f} / "
              f"{r['hideable_chained_ms']:.2f} of {r['exposed_ms']:.2f} | {r['lean_ratio_micro']:.2f}x, "
              f"{r['net_micro_ms']:+.2f} ({r['fixed_ms']:.2f}) |")
    print("\nWith this engine's attention (the measured steps): exposed ms a step each schedule could hide at "
          "most, and the cut\n")
    print("| context | hit rate | ranges | exposed ms | beside attention | + first range beside the indexer | "
          "chained under the indexer |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in one_a_point(rows):
        e = r["exposed_ms"]
        cells = " | ".join(f"{r[f'hideable_here_{k}_ms']:.2f} ({r[f'hideable_here_{k}_ms'] / e:.0%})" if e > 0 else "-"
                           for k in ("attention", "cover", "chained"))
        print(f"| {r['context']} | {r['hit_rate']} | {r['overlap']} | {e:.2f} | {cells} |")
    return 0


def run_moe_lean(lines, moe_lean) -> float:
    """The MoE factor to project with: as given, else 1 for a run whose floor is lean already (its
    experts on the Triton grouped GEMM, serve_bench --expert-gemm auto on a GPU where it won), else
    MOE_LEAN."""
    if moe_lean is not None:
        return moe_lean
    model = next((x for x in lines if x["kind"] == "model"), {})
    return 1.0 if (model.get("grouped_expert_gemm") or {}).get("gemm") == "triton" else MOE_LEAN


def main(path: str, tflops: float = FLASHMLA_TFLOPS, moe_lean=None) -> int:
    lines = [json.loads(x) for x in open(path)]
    if any(x["kind"] == "curve" for x in lines):
        lean = run_moe_lean(lines, moe_lean)
        if lean == 1.0 and moe_lean is None:
            print("This run's MoE is the lean one (the Triton grouped GEMM): its floor is taken as measured.\n")
        return main_curve(lines, tflops, lean)
    model = next(x for x in lines if x["kind"] == "model")
    link = next(x["h2d_gbps"] for x in lines if x["kind"] == "link")
    L, R = model["layers"], model["record_bytes"]
    pts = [x for x in lines if x["kind"] == "point"]
    bpts = [p for p in pts if p["mode"] == "baseline"]
    fits = {}
    for part in bpts[0]["parts_ms"]:
        rows = [(p["concurrency"], p["concurrency"] * p.get("mean_context", p["context"]) / 1e6, p["parts_ms"][part]) for p in bpts]
        fits[part] = fit(rows, ["1", "bC"] if part in CONTEXT_PARTS else ["1", "b"])
        print(f"  {part:9s} = {fits[part][0]:.4f} + {fits[part][1]:.5f} b + {fits[part][2]:.5f} b C/1M  ms")
    a, w, c = (sum(f[i] for f in fits.values()) for i in range(3))
    print(f"T_base(b, C) = {a:.3f} + {w:.4f} b + {c:.4f} b C/1M  ms   (per-part fits over {len(bpts)} full-HBM points)")
    print(f"link {link} GB/s, eta {ETA}, t_plan {T_PLAN_MS * 1e3:.0f} us, {L} layers, {R}-B records\n")
    print("| mode | context | N | predicted ms | measured ms | pred/meas | predicted tok/s | measured tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    peaks = {}
    for p in pts:
        b, C = p["concurrency"], p.get("mean_context", p["context"])
        tb = a + w * b + c * b * C / 1e6
        if p["mode"] == "baseline":
            peaks.setdefault((p["context"], "baseline"), []).append((p["tokens_per_s"], b * 1e3 / tb))
            continue
        # A hybrid point whose rows are all resident runs no RESOLVE (no counters): the full-HBM step.
        t = tb + (L * T_PLAN_MS + p["misses_per_step"] * R / (ETA * link * 1e9) * 1e3 if "misses_per_step" in p else 0)
        peaks.setdefault((p["context"], p["mode"]), []).append((p["tokens_per_s"], b * 1e3 / t))
        print(f"| {p['mode']} | {p['context']} | {b} | {t:.2f} | {p['tpot_ms_p50']:.2f} | {t / p['tpot_ms_p50']:.2f} | "
              f"{b * 1e3 / t:.0f} | {p['tokens_per_s']:.0f} |")
    print("\n| context | mode | peak ratio measured | peak ratio predicted |")
    print("| --- | --- | --- | --- |")
    for (C, mode), v in sorted(peaks.items(), key=str):
        if mode == "baseline":
            continue
        bm = max(x[0] for x in peaks[(C, "baseline")])
        bp = max(x[1] for x in peaks[(C, "baseline")])
        print(f"| {C} | {mode} | {max(x[0] for x in v) / bm:.2f} | {max(x[1] for x in v) / bp:.2f} |")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    opts = {"--flashmla-tflops": FLASHMLA_TFLOPS, "--moe-lean": None}
    for flag in opts:
        if flag in args:
            i = args.index(flag)
            opts[flag] = float(args[i + 1])
            del args[i:i + 2]
    sys.exit(main(args[0], opts["--flashmla-tflops"], opts["--moe-lean"]))

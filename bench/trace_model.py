#!/usr/bin/env python3
"""What a faster miss fetch would leave exposed: one serving run's kernel timelines (serve_bench.py
--trace) projected to other fetch rates (issue 44, item 3 against the two-thirds cut).

Every RESOLVE launch in a timeline is a window. Its cover is the indexer and sparse-MLA kernels that
started inside it (the top-k and other RESOLVEs are not cover: they wait for what came before). A
window lasts from its first start to its last end; the rest of the step is left as it ran.

A cover whose recorded end lies within PINNED_US of RESOLVE's end is *pinned*: the covers that
`Overlap.under` launches as RESOLVE's programmatic dependents are recorded as ending when RESOLVE
ends, in every window of the H100 runs (to 0.0-0.5 µs), whatever their work. Such a cover finished
at or before that end, and when is not in the timeline, except for an indexer followed by a top-k
launched with after_count (hs_topk_args, ABI 1.17): that top-k starts once every indexer program
has exited, so its start is the indexer's end. A cover that ends later is *visible*. A
cover launched *beside* RESOLVE starts within BESIDE_US of it; one that starts later inside the
window waited for something else (a kernel of the range before).

At a fetch rate eta' (fraction of the link) against the launch's own eta (the run's misses over
the fetch time of all its RESOLVEs, t_plan = 15 µs a launch of planning, as bench/serve_model.py):

    R'        = t_plan + (R - t_plan) * eta / eta'          the launch, shorter
    W         = sum over the cover's kernels of rows * u     the cover alone: u, µs a row of each
                                                             kernel shape (family and grid but the
                                                             rows: MLA's gather, split and combine
                                                             apart) where it overlapped no RESOLVE
                                                             (the same graph, else the run's
                                                             no-overlap point)
    s_f       = sum(ran) / sum(W) over family f's visible    how much RESOLVE beside it (and, for
                windows launched beside RESOLVE in the       the MLA, its chain) slowed it
                call's timelines
    cover'    = alone:   W
                slowed:  the recorded cover if visible, else min(W * s_f, the recorded one)
    window'   = max(R', cover')
    exposed'  = exposed - sum over windows (window - window')   for the overlap variant's step
    serial'   = exposed - sum over launches (R - R')             for the no-overlap step

both from the exposed times the run timed (its curve records). A faster fetch shortens the step
without overlap too, so two cuts are printed: against serial' (what the overlap hides at that rate)
and against the run's own serial exposed time (what the issue's work would cut altogether).

A point whose launches are mostly planning (at 96% hits a launch fetches a few µs' worth) gives an
eta at or above the link: t_plan is a constant and there is no fetch left to scale, so such a point
is named and not projected.

    python3 bench/trace_model.py RUN.jsonl TRACES.jsonl[.xz] [--call N] [--eta 0.65,0.75,0.85] [--path]

RUN.jsonl is the serve_bench run (its link, model, curve records); TRACES.jsonl holds that run's
"trace" records: as serve_bench.py --trace writes them (every kernel of a step, named as the
profiler names them; `mode` and `overlap` say which point), or reduced to the four kernel families
here with a `point` name (bench/results/hide-misses-2026-12-05-traces-h100.jsonl, whose `call` tags
--call picks). A curve record is paired with the n-th timeline of its variant, and of the
no-overlap point, at its context and row count, where it is the n-th target of that context.

--path adds where each step's time went, measured rather than projected: the timeline's kernels in
order of start, each charged with how far it moved the step's frontier (the latest end so far) and
the idle time before a start charged to gaps, so that the charges add up to the step. A kernel
that ran wholly under another (a cover under RESOLVE) is charged nothing; RESOLVE is charged its
windows less what started before it. µs a layer by group, for the variant, the no-overlap point and
full HBM's timeline at the same rows (the last one before them). On a reduced timeline only the four
families are there, and the rest of the step is charged to gaps.
"""

from __future__ import annotations

import collections
import json
import lzma
import sys

T_PLAN_US = 15.0  # bench/serve_model.py's T_PLAN_MS: RESOLVE's planning a launch, no IO
PINNED_US = 1.0
BESIDE_US = 5.0
RESOLVE = "ResolveKernel"
TOPK = "TopkKernel"
COVER_FAMILIES = {"index_scores": 1, "mla": 0}  # kernel name -> which grid dimension counts its rows


# The kernels of a raw timeline that this model reads, by a piece of the profiler's name: the C ABI's
# RESOLVE and top-k, and examples/engine's grid indexer and sparse MLA (gather, split, combine).
# The persistent indexer's grid does not say its rows, so it is left out.
FAMILY_OF = (("ResolveKernel", RESOLVE), ("TopkKernel", TOPK), ("_index_scores_kernel", "index_scores"),
             ("_mla_", "mla"))


# --path's groups, by a piece of the profiler's name or of a reduced timeline's family name (first
# match); the rest is "other" (torch's small kernels, mostly).
PATH_GROUPS = (("ResolveKernel", "RESOLVE"), ("TopkKernel", "top-k"), ("index_scores", "indexer"),
               ("mla", "sparse MLA"), ("AppendKernel", "append"), ("_expert_gemm", "MoE experts"),
               ("nvjet", "GEMMs"), ("cublasLt", "GEMMs"))
PATH_COLUMNS = ("indexer", "top-k", "RESOLVE", "sparse MLA", "append", "GEMMs", "MoE experts", "other", "gaps")


def family(name: str):
    return next((f for piece, f in FAMILY_OF if piece in name), None)


def normalize(trace: dict) -> dict:
    """A trace record with a `point` name and only the kernels of the four families, named by family;
    a reduced record as it is."""
    if "point" in trace:
        return trace
    point = trace.get("overlap") or trace.get("mode")
    kernels = [[family(k[0])] + list(k[1:]) for k in trace["kernels"] if family(k[0])]
    return dict(trace, point=point, kernels=kernels, all_kernels=trace["kernels"])


def on_path(kernels) -> collections.Counter:
    """µs of the step charged to each group (PATH_GROUPS): in order of start, a kernel is charged how far
    it moved the frontier (the latest end so far), and the idle time before a start is charged to gaps.
    The charges add up to the step's span."""
    out = collections.Counter()
    ks = sorted(kernels, key=lambda k: k[1])
    frontier = ks[0][1] if ks else 0.0
    for k in ks:
        start, end = k[1], k[1] + k[2]
        if start > frontier:
            out["gaps"] += start - frontier
            frontier = start
        if end > frontier:
            out[next((g for piece, g in PATH_GROUPS if piece in k[0]), "other")] += end - frontier
            frontier = end
    return out


def rows_of(kernel) -> int:
    name, _, _, _, grid = kernel
    return int(grid[COVER_FAMILIES[name]])


def shape(kernel) -> tuple:
    """A cover kernel's family and its grid less the rows' dimension: the sparse MLA's gather, split and
    combine (grids [rows, 64, 1], [rows, 4, splits], [rows, 8, 1]) take different µs a row."""
    name, _, _, _, grid = kernel
    return (name, *(int(g) for i, g in enumerate(grid) if i != COVER_FAMILIES[name]))


def per_row_us(kernels) -> dict:
    """µs a row over these kernels (summed over their launches): of each shape, keyed by shape(), and of
    each family, keyed by its name (what a shape seen nowhere alone falls back to)."""
    out = {}
    ks = [k for k in kernels if k[0] in COVER_FAMILIES]
    for key in {shape(k) for k in ks} | {k[0] for k in ks}:
        of = [k for k in ks if key in (k[0], shape(k))]
        rows = sum(rows_of(k) for k in of)
        if rows:
            out[key] = sum(k[2] for k in of) / rows
    return out


def unit_of(unit: dict, kernel) -> float:
    """µs a row of this kernel alone: its shape's, else its family's."""
    return unit.get(shape(kernel), unit.get(kernel[0], 0.0))


def alone_us(trace, fallback: dict) -> dict:
    """µs a row of each cover family when nothing ran beside it: from the timeline's own kernels that
    overlapped no RESOLVE (the ranges that ran alone, in the same graph), else from fallback (the
    no-overlap point's)."""
    spans = [(k[1], k[1] + k[2]) for k in trace["kernels"] if k[0] == RESOLVE]
    free = [k for k in trace["kernels"] if k[0] in COVER_FAMILIES
            and not any(k[1] < e and k[1] + k[2] > s for s, e in spans)]
    return {**fallback, **per_row_us(free)}


class Window:
    """One RESOLVE launch and its cover, times relative to the window's start."""

    def __init__(self, resolve, cover, unit: dict, topk_starts=()):
        self.resolve_us = resolve[2]
        self.family = cover[0][0] if cover else None
        start = min([resolve[1]] + [k[1] for k in cover])
        r_end = resolve[1] + resolve[2]
        self.resolve_off = resolve[1] - start
        self.cover_us = max(k[1] + k[2] for k in cover) - start if cover else 0.0
        self.alone_us = sum(rows_of(k) * unit_of(unit, k) for k in cover)
        self.beside = bool(cover) and cover[0][1] - resolve[1] < BESIDE_US
        self.pinned = bool(cover) and abs(start + self.cover_us - r_end) < PINNED_US
        self.seen_by_topk = False
        if self.pinned and self.family == "index_scores":
            # A top-k launched after the indexer with after_count starts once every indexer program has
            # exited: its start, before RESOLVE's end, is where the indexer's work ended (at most).
            later = [t for t in topk_starts if cover[-1][1] < t < r_end - PINNED_US]
            if later:
                self.cover_us, self.pinned, self.seen_by_topk = min(later) - start, False, True

    @property
    def length(self) -> float:
        return max(self.resolve_off + self.resolve_us, self.cover_us)


def windows(trace, fallback: dict):
    """Each RESOLVE launch with the cover kernels that started inside it."""
    ks = trace["kernels"]
    unit = alone_us(trace, fallback)
    out = []
    topk = [k[1] for k in ks if k[0] == TOPK]
    for r in (k for k in ks if k[0] == RESOLVE):
        start, end = r[1], r[1] + r[2]
        out.append(Window(r, [k for k in ks if k[0] in COVER_FAMILIES and start <= k[1] < end], unit, topk))
    return out


def slowdowns(traces, fallback: dict) -> dict:
    """Per cover family, over the windows whose cover was launched beside RESOLVE: {visible windows,
    pinned windows, s (ran / alone over the visible ones)}."""
    out = {f: dict(visible=0, pinned=0, ran=0.0, alone=0.0) for f in COVER_FAMILIES}
    for t in traces:
        for w in windows(t, fallback):
            if not w.beside:
                continue
            d = out[w.family]
            if w.pinned:
                d["pinned"] += 1
            else:
                d["visible"] += 1
                d["ran"] += w.cover_us
                d["alone"] += w.alone_us
    return {f: dict(visible=d["visible"], pinned=d["pinned"], s=d["ran"] / d["alone"] if d["alone"] else None)
            for f, d in out.items()}


def fetch_eta(trace, misses_per_step: float, record_bytes: int, link_gbps: float) -> float:
    """The fraction of the link the run's RESOLVEs fetched at: bytes over their time less planning."""
    fetch_us = sum(k[2] - T_PLAN_US for k in trace["kernels"] if k[0] == RESOLVE)
    if fetch_us <= 0:
        return float("inf")
    return misses_per_step * record_bytes / (fetch_us * 1e-6) / (link_gbps * 1e9)


def shorter(r_us: float, eta: float, eta_new: float) -> float:
    return T_PLAN_US + max(0.0, r_us - T_PLAN_US) * eta / eta_new


def project(trace, eta: float, eta_new: float, fallback: dict, slow: dict) -> dict:
    """µs a step that a fetch at eta_new saves in this timeline: serial (every launch on the path)
    and windowed, with each cover alone and slowed (the header's cover')."""
    saved = dict(serial=0.0, slowed=0.0, alone=0.0)
    for w in windows(trace, fallback):
        r_new = shorter(w.resolve_us, eta, eta_new)
        saved["serial"] += w.resolve_us - r_new
        if w.family is None:
            saved["slowed"] += w.resolve_us - r_new
            saved["alone"] += w.resolve_us - r_new
            continue
        s = slow.get(w.family, {}).get("s") or 1.0
        slowed = min(w.alone_us * s, w.cover_us) if w.pinned else w.cover_us
        for key, cover in (("slowed", slowed), ("alone", min(w.alone_us, w.cover_us))):
            saved[key] += w.length - max(w.resolve_off + r_new, cover)
    return saved


def load(run_path: str, traces_path: str, call=None):
    with open(run_path) as f:
        run = [json.loads(x) for x in f]
    with (lzma.open if traces_path.endswith(".xz") else open)(traces_path, "rt") as f:
        traces = [dict(normalize(t), order=i) for i, t in enumerate(json.loads(x) for x in f)
                  if t.get("kind") == "trace" and (call is None or t.get("call") == call)]
    return run, traces


def full_hbm_before(traces, serial):
    """Full HBM's timeline at the no-overlap timeline's context and rows: the last one before it."""
    before = [t for t in traces if t["point"] == "baseline" and t.get("order", 0) < serial.get("order", 0)
              and t.get("context") == serial.get("context") and t.get("concurrency") == serial.get("concurrency")]
    return before[-1] if before else None


def print_path(pairs, traces, layers: int) -> None:
    print(f"\nWhere each step's time went (µs a layer on the path, {layers} layers; --path in the header)\n")
    print("| context | hit rate | point | " + " | ".join(PATH_COLUMNS) + " | layer |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in PATH_COLUMNS) + " | --- |")
    shown = set()
    for c, t, serial in pairs:
        full = full_hbm_before(traces, serial)
        for name, tl in (("full HBM", full), ("hisparse", serial), (t["point"], t)):
            if tl is None or id(tl) in shown:  # a no-overlap timeline serves every variant of its target
                continue
            shown.add(id(tl))
            p = on_path(tl.get("all_kernels", tl["kernels"]))
            print(f"| {c['context']} | {c['hit_rate']} | {name} | " + " | ".join(
                f"{p[g] / layers:.1f}" for g in PATH_COLUMNS) + f" | {sum(p.values()) / layers:.1f} |")


def pair(run, traces):
    """(curve record, its variant's timeline, the no-overlap point's timeline) for every curve record
    whose timelines are there: the n-th timeline of each at the record's context and row count,
    where the record's target is the n-th of its context (a timeline without a context or row count,
    a reduced one, matches any)."""
    targets = {}
    out = []
    for c in (x for x in run if x["kind"] == "curve"):
        seen = targets.setdefault(c["context"], [])
        if c.get("target_hit_rate") not in seen:
            seen.append(c.get("target_hit_rate"))
        n = seen.index(c.get("target_hit_rate"))

        def nth(point):
            ts = [t for t in traces if t["point"] == point and t.get("context", c["context"]) == c["context"]
                  and t.get("concurrency", c["concurrency"]) == c["concurrency"]]
            return ts[n] if n < len(ts) else None
        spec = (c.get("overlap") or {}).get("spec")
        t, serial = (nth(spec), nth("hisparse")) if spec else (None, None)
        if t is not None and serial is not None and any(k[0] == RESOLVE for k in t["kernels"]):
            out.append((c, t, serial))
    return out


def main(run_path: str, traces_path: str, call=None, etas=(0.65, 0.75, 0.85), path=False) -> int:
    run, traces = load(run_path, traces_path, call)
    link = next(x["h2d_gbps"] for x in run if x["kind"] == "link")
    model = next(x for x in run if x["kind"] == "model")
    pairs = pair(run, traces)
    if not pairs:
        print(f"no curve record of {run_path} has its variant's and the no-overlap ('hisparse') timeline in "
              f"{traces_path}", file=sys.stderr)
        return 1
    slow = slowdowns(traces, per_row_us(pairs[0][2]["kernels"]))
    print(f"link {link} GB/s, {model['record_bytes']}-B records, t_plan {T_PLAN_US:.0f} us")
    print("covers launched beside RESOLVE, over these timelines: " + "; ".join(
        f"{f} {d['visible']} visible windows (ran {d['s']:.2f}x alone), {d['pinned']} pinned" if d["s"] else
        f"{f} {d['visible']} visible, {d['pinned']} pinned" for f, d in slow.items()) + "\n")
    print("| context | variant | hit rate | eta now (serial / variant) | eta' | serial exposed ms | variant exposed "
          "ms: slowed / alone | cut at eta' | cut against today's serial |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c, t, serial in pairs:
        unit = per_row_us(serial["kernels"])
        e_serial = fetch_eta(serial, c["misses_per_step"], model["record_bytes"], link)
        e_var = fetch_eta(t, c["misses_per_step"], model["record_bytes"], link)
        if max(e_serial, e_var) >= 1:
            print(f"| {c['context']} | {t['point']} | {c['hit_rate']} | {e_serial:.2f} / {e_var:.2f} | not projected: "
                  f"its launches are mostly planning | {c['exposed_ms']:.2f} | {c['exposed_ms_overlap']:.2f} | | |")
            continue
        for eta_new in (e_var, *etas):
            s_ser = 0.0 if eta_new == e_var else project(serial, e_serial, max(eta_new, e_serial), unit, slow)["serial"]
            saved = project(t, e_var, eta_new, unit, slow)
            ser = c["exposed_ms"] - s_ser / 1e3
            var = [c["exposed_ms_overlap"] - saved[k] / 1e3 for k in ("slowed", "alone")]
            cuts = " / ".join(f"{1 - v / ser:.0%}" for v in var)
            today = " / ".join(f"{1 - v / c['exposed_ms']:.0%}" for v in var)
            label = f"{eta_new:.2f} (now)" if eta_new == e_var else f"{eta_new:.2f}"
            print(f"| {c['context']} | {t['point']} | {c['hit_rate']} | {e_serial:.2f} / {e_var:.2f} | {label} | "
                  f"{ser:.2f} | " + " / ".join(f"{v:.2f}" for v in var) + f" | {cuts} | {today} |")
    print("\nEach variant's windows (µs, mean a window): RESOLVE, the cover as recorded, alone\n")
    print("| context | variant | hit rate | cover | windows (pinned) | RESOLVE | cover recorded | cover alone |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for c, t, serial in pairs:
        ws = [w for w in windows(t, per_row_us(serial["kernels"])) if w.family]
        for fam in COVER_FAMILIES:
            f = [w for w in ws if w.family == fam]
            if f:
                n = len(f)
                print(f"| {c['context']} | {t['point']} | {c['hit_rate']} | {fam} | {n} ({sum(w.pinned for w in f)}) | "
                      f"{sum(w.resolve_us for w in f) / n:.1f} | {sum(w.cover_us for w in f) / n:.1f} | "
                      f"{sum(w.alone_us for w in f) / n:.1f} |")
    if path:
        print_path(pairs, traces, model["layers"])
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    path = "--path" in args
    if path:
        args.remove("--path")
    opts = {"--call": None, "--eta": "0.65,0.75,0.85"}
    for flag in opts:
        if flag in args:
            i = args.index(flag)
            opts[flag] = args[i + 1]
            del args[i:i + 2]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    call = int(opts["--call"]) if opts["--call"] is not None else None
    sys.exit(main(args[0], args[1], call, tuple(float(x) for x in opts["--eta"].split(",")), path))

#!/usr/bin/env python3
"""Draws a hit-rate curve (serve_bench.py --hit-rates) as an SVG, with no plotting library: per
context, the peak ratio at equal HBM (top) and RESOLVE's exposed time per step (bottom) against
the measured hit rate, for hisparse and each overlap variant, with the real-text 78% and the
paper's 87% marked.

    python3 bench/plot_curve.py bench/results/hide-misses-2026-12-04-curve.jsonl bench/plots/hide-misses.svg
"""

from __future__ import annotations

import json
import sys
from typing import Dict, List, Tuple

W, H = 440, 260  # one panel
PAD_L, PAD_R, PAD_T, PAD_B = 56, 12, 28, 40
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
MARKS = {0.78: "real text 78%", 0.87: "paper 87%"}


def series(curves: List[dict]) -> Dict[str, List[Tuple[float, float, float]]]:
    """name -> [(hit rate, peak ratio, exposed ms)], sorted by hit rate; hisparse once, then each
    overlap variant."""
    out: Dict[str, List[Tuple[float, float, float]]] = {}
    for c in curves:
        out.setdefault("hisparse", {})[c["target_hit_rate"]] = (c["hit_rate"], c["ratio"], c["exposed_ms"])
        name = "overlap " + c["overlap"]["spec"].replace("_", "/")
        out.setdefault(name, {})[c["target_hit_rate"]] = (c["hit_rate_overlap"], c["ratio_overlap"],
                                                         c["exposed_ms_overlap"])
    return {k: sorted(v.values()) for k, v in out.items()}


def panel(x0: float, y0: float, title: str, data: Dict[str, list], col: int, ylabel: str, legend_top: bool) -> List[str]:
    """One panel; the legend at its right, top or bottom: where a curve rising (the ratio) or
    falling (the exposed time) with the hit rate leaves room."""
    xs = [p[0] for v in data.values() for p in v]
    ys = [p[col] for v in data.values() for p in v]
    xlo, xhi = min(0.35, min(xs)), 1.0
    ylo, yhi = min(0.0, min(ys)), max(ys) * 1.1
    sx = lambda x: x0 + PAD_L + (x - xlo) / (xhi - xlo) * (W - PAD_L - PAD_R)  # noqa: E731
    sy = lambda y: y0 + H - PAD_B - (y - ylo) / (yhi - ylo) * (H - PAD_T - PAD_B)  # noqa: E731
    out = [f'<text x="{x0 + W / 2}" y="{y0 + 16}" text-anchor="middle" font-size="13">{title}</text>',
           f'<rect x="{x0 + PAD_L}" y="{y0 + PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
           'fill="none" stroke="#888"/>']
    for i in range(5):  # y ticks
        y = ylo + (yhi - ylo) * i / 4
        out.append(f'<text x="{x0 + PAD_L - 4}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="10">{y:.1f}</text>')
    for x in (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        out.append(f'<text x="{sx(x):.1f}" y="{y0 + H - PAD_B + 14}" text-anchor="middle" font-size="10">{x:.1f}</text>')
    out.append(f'<text x="{x0 + W / 2}" y="{y0 + H - 8}" text-anchor="middle" font-size="11">hit rate (measured)</text>')
    out.append(f'<text x="{x0 + 14}" y="{y0 + H / 2}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 {x0 + 14} {y0 + H / 2})">{ylabel}</text>')
    for m, (x, label) in enumerate(MARKS.items()):
        out.append(f'<line x1="{sx(x):.1f}" y1="{y0 + PAD_T}" x2="{sx(x):.1f}" y2="{y0 + H - PAD_B}" '
                   'stroke="#aaa" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{sx(x) + 3:.1f}" y="{y0 + PAD_T + 12 + 11 * m}" font-size="9" fill="#666">{label}</text>')
    for i, (name, pts) in enumerate(data.items()):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(p[0]):.1f},{sy(p[col]):.1f}" for p in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(p[0]):.1f}" cy="{sy(p[col]):.1f}" r="3" fill="{color}"/>' for p in pts]
        ly = y0 + PAD_T + 40 + 13 * i if legend_top else y0 + H - PAD_B - 8 - 13 * (len(data) - 1 - i)
        out.append(f'<text x="{x0 + W - PAD_R - 6}" y="{ly}" text-anchor="end" font-size="10" fill="{color}">{name}</text>')
    return out


def render(lines: List[dict]) -> str:
    curves = [x for x in lines if x["kind"] == "curve"]
    contexts = sorted({c["context"] for c in curves}, key=lambda c: -c if isinstance(c, int) else 0)
    body: List[str] = []
    for j, ctx in enumerate(contexts):
        data = series([c for c in curves if c["context"] == ctx])
        name = f"{ctx // 1024}k" if isinstance(ctx, int) else str(ctx)
        body += panel(j * W, 0, f"context {name}: peak ratio at equal HBM", data, 1, "x full HBM's peak", False)
        body += panel(j * W, H, f"context {name}: RESOLVE's exposed time", data, 2, "ms per step", True)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(contexts)}" height="{2 * H}" '
            f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")


def main(argv: List[str]) -> int:
    lines = [json.loads(x) for x in open(argv[0])]
    if not any(x["kind"] == "curve" for x in lines):
        print(f"{argv[0]}: no curve records (serve_bench.py --hit-rates)", file=sys.stderr)
        return 1
    with open(argv[1], "w") as f:
        f.write(render(lines))
    print(f"plot: {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

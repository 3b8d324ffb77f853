#!/usr/bin/env bash
# The locality study of bench/RESULTS.md, from scratch: writes the small committed traces
# (bench/traces/), generates the larger ones into a scratch folder (not committed: ~35 MB each),
# runs `hisparse-bench trace` over both, and writes the tables (Markdown + JSON) and the plot
# bench/plots/locality.png.
#
#   bench/locality.sh [HISPARSE_BENCH]
#   REAL_TRACES=DIR bench/locality.sh [HISPARSE_BENCH]
#
# HISPARSE_BENCH: the hisparse-bench binary (argument, env var, or build/bin/hisparse-bench).
# OUT: where the JSON and tables go (default: a fresh temporary folder, printed at the end).
# Real traces (examples/traces/train_and_extract.py) join the study without further steps: every
# committed bench/traces/debian-*-small.trace.gz joins the small set, and every *.trace.gz in
# REAL_TRACES (e.g. the extractor's $OUT/traces, not committed) joins the large set.
# Needs python3 (tables) and gnuplot (apt-get install -y gnuplot-nox). Takes ~5 minutes on two
# cores, most of it replaying the large traces through belady.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="${1:-${HISPARSE_BENCH:-$ROOT/build/bin/hisparse-bench}}"
OUT="${OUT:-$(mktemp -d /tmp/hisparse-locality-XXXXXX)}"
RATIOS=1,1.5,2,4
HINTS=1,0.5  # hint depths h / k of the hint policy (issue 21): h = k and h = k/2
PRESETS=(dsv32 stress local)
[[ -x "$BENCH" ]] || { echo "locality.sh: no hisparse-bench at $BENCH" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "locality.sh: needs gnuplot (apt-get install -y gnuplot-nox)" >&2; exit 2; }
mkdir -p "$OUT" "$ROOT/bench/traces" "$ROOT/bench/plots"

# Small traces, committed: k = 256 at the presets' calibration point k / context = 1/16. dsv32 needs
# layers beyond its first two (the random ones) to show its middle layers, so it gets four.
small=()
for p in "${PRESETS[@]}"; do
  layers=2; [[ $p == dsv32 ]] && layers=4
  f="$ROOT/bench/traces/$p-small.trace.gz"
  "$BENCH" gen-trace --preset "$p" --seed 1 --requests 2 --layers $layers --steps 64 \
    --context 4096 --k 256 --out "$f"
  small+=(--trace "$f")
done
for f in "$ROOT"/bench/traces/debian-*-small.trace.gz; do
  [[ -e $f ]] && small+=(--trace "$f")
done

# Large traces, generated on the fly: 8 layers x 4 requests x 256 steps, k = 2048, 32k context,
# with 2048 retention hints a record (version 2; the selections are those of --hints 0).
large=()
for p in "${PRESETS[@]}"; do
  f="$OUT/$p-large.trace.gz"
  "$BENCH" gen-trace --preset "$p" --seed 1 --requests 4 --layers 8 --steps 256 \
    --context 32768 --k 2048 --hints 2048 --out "$f"
  large+=(--trace "$f")
done
if [[ -n ${REAL_TRACES:-} ]]; then
  found=0
  for f in "$REAL_TRACES"/*.trace.gz; do
    [[ -e $f ]] && { large+=(--trace "$f"); found=1; }
  done
  [[ $found == 1 ]] || { echo "locality.sh: no *.trace.gz in REAL_TRACES=$REAL_TRACES" >&2; exit 2; }
fi
# Plot blocks per panel: one per (trace, policy), counted from 0.
LAST_SMALL=$(( ${#small[@]} / 2 * 3 - 1 ))
LAST_LARGE=$(( ${#large[@]} / 2 * 3 - 1 ))

"$BENCH" trace "${small[@]}" --policy all --ratios $RATIOS --hints $HINTS --json > "$OUT/small.json"
"$BENCH" trace "${large[@]}" --policy all --ratios $RATIOS --hints $HINTS --json > "$OUT/large.json"

# Tables (Markdown) and the plot's data: one block per (trace, policy), lines "ratio hit_rate".
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
md = []
for name in ("small", "large"):
    doc = json.load(open(os.path.join(out, name + ".json")))
    md.append(f"### {name} traces\n")
    md.append("| trace | overlap: consecutive steps per layer | adjacent layers |")
    md.append("| --- | --- | --- |")
    for t in doc["traces"]:
        ov = t["overlap"]
        md.append(f"| {os.path.basename(t['trace'])} | {' '.join(f'{x:.2f}' for x in ov['consecutive'])}"
                  f" | {' '.join(f'{x:.2f}' for x in ov['adjacent'])} |")
    md.append("")
    md.append("| trace | reuse distance (steps): share of selections |")
    md.append("| --- | --- |")
    for t in doc["traces"]:
        rd = t["reuse_distance"]
        tot = sum(rd["total"]["counts"]) + rd["total"]["never"]
        cells = [f"{b}: {c / tot:.3f}" for b, c in zip(rd["buckets"], rd["total"]["counts"])]
        cells.append(f"never: {rd['total']['never'] / tot:.3f}")
        md.append(f"| {os.path.basename(t['trace'])} | {', '.join(cells)} |")
    md.append("")
    md.append("| trace | policy | B/k | B | hit rate | hit rate, layers >= 2 | misses/record p50 | p99 |")
    md.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with open(os.path.join(out, name + ".dat"), "w") as dat:
        for t in doc["traces"]:
            trace = os.path.basename(t["trace"]).split(".")[0]
            labels = list(dict.fromkeys(r.get("label", r["policy"]) for r in t["replays"]))
            for policy in labels:
                plotted = policy in ("lru", "belady", "staging")
                if plotted:
                    dat.write(f"{trace.replace('-small', '').replace('-large', '')}/{policy} rate\n")
                for r in (r for r in t["replays"] if r.get("label", r["policy"]) == policy):
                    deep = r["per_layer"][2:] or r["per_layer"]
                    deep_rate = sum(c["hits"] for c in deep) / max(1, sum(c["selections"] for c in deep))
                    tot = r["total"]
                    md.append(f"| {trace} | {policy} | {r['ratio']:g} | {r['slots']} | {tot['hit_rate']:.3f}"
                              f" | {deep_rate:.3f} | {tot['misses_p50']} | {tot['misses_p99']} |")
                    if plotted:
                        dat.write(f"{r['ratio']:g} {tot['hit_rate']:.5f}\n")
                if plotted:
                    dat.write("\n\n")
    md.append("")
    # Issue 21: hit rate per layer, every policy, B/k in RATIOS.
    md.append("| trace | policy | B/k | total | per layer |")
    md.append("| --- | --- | --- | --- | --- |")
    for t in doc["traces"]:
        trace = os.path.basename(t["trace"]).split(".")[0]
        for r in t["replays"]:
            md.append(f"| {trace} | {r.get('label', r['policy'])} | {r['ratio']:g} | {r['total']['hit_rate']:.4f} | "
                      + " ".join(f"{c['hit_rate']:.3f}" for c in r["per_layer"]) + " |")
    md.append("")
open(os.path.join(out, "tables.md"), "w").write("\n".join(md))
# Reference points: FACTS.md's small trained model (LRU) and the HiSparse paper's one LRU figure.
open(os.path.join(out, "ref.dat"), "w").write(
    "# facts\n1 0.73\n1.5 0.82\n2 0.87\n4 0.94\n\n\n# paper\n2 0.866\n")
EOF

# Plot: two panels (large, small), colour = trace, dash = policy; the reference points are the
# published / measured figures the presets are compared with in RESULTS.md.
gnuplot <<EOF
set terminal pngcairo size 1400,600 font ",11"
set output "$ROOT/bench/plots/locality.png"
set multiplot layout 1,2 title "Hit rate vs B/k (hisparse-bench trace; synthetic presets, debian-* from a small model on real text; policy: solid lru, dashed belady, dotted staging)"
set xlabel "B / k (slots per (request, layer) over selections per step)"
set ylabel "hit rate (all layers)"
set yrange [0:1]
set xrange [0.9:4.1]
set xtics ("1" 1, "1.5" 1.5, "2" 2, "3" 3, "4" 4)
set grid
set key bottom right font ",9"
do for [panel in "large small"] {
  file = "$OUT/".panel.".dat"
  if (panel eq "large") { set title "k = 2048, context 32768 (presets: 8 layers x 4 requests x 256 steps)"; last = $LAST_LARGE } \
  else { set title "committed bench/traces/*-small (k = 256, context 4096)"; last = $LAST_SMALL }
  plot for [i=0:last] file index i using 1:2 with linespoints \
         lc i/3+1 dt i%3+1 pt i/3+5 lw 2 title columnheader(1), \
       "$OUT/ref.dat" index 0 using 1:2 with points pt 2 ps 2 lc rgb "black" \
         title "FACTS.md small model, LRU", \
       "$OUT/ref.dat" index 1 using 1:2 with points pt 8 ps 2.5 lw 2 lc rgb "red" \
         title "HiSparse paper, LRU at B = 2k"
}
unset multiplot
EOF

echo "locality.sh: tables in $OUT/tables.md, JSON in $OUT/{small,large}.json, plot in bench/plots/locality.png"

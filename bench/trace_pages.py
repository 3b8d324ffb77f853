"""How many host pages a step's misses touch, by host layout, from selection traces (no GPU).

Why: on the lent H100s a miss's fetch is bound by the GPU's translations of host memory, not by
the link (bench/RESULTS.md, "Scattered reads go cold"): the GPU translates host memory 64 KiB at a
time and a serving RESOLVE finds none of its pages' translations cached, so each distinct 64 KiB
page a launch's misses touch costs one translation. The host pool lays a (request, layer)'s
records out by position, so a layer's misses share a page only with that layer's neighbouring
misses. Laying a request's layers side by side (token-major: a token's records of every layer
together) would let a layer reuse the pages the layer before it just translated, if their misses
are near each other. This counts, for a trace (bench/traces, ../shared/TRACE_FORMAT.md), the
translations each layout needs.

Replay: LRU with --slots-per-k * k slots per (request, layer), the newest token always a hit
(RESOLVE's rule); a step's layers in order. Counted per (step, layer) launch over all requests:
  layer_major  distinct (request, layer, page) of the launch's misses, a page --page bytes of one
               layer's records (page / record_bytes tokens);
  token_major  distinct (request, page) of the misses not already translated by the launch before
               (the previous layer of the step; a cache that holds one launch's pages), a page
               page / (record_bytes * layers) tokens of every layer;
  token_major_step  distinct (request, page) over the whole step (a cache that holds a step).
Also: the share of a layer's misses whose token the layer before also missed.

Predictions of a launch's pages (layer-major), for translations made ahead of it: the pages of the
layer before's misses in the same step (layer_before), and the pages of the tokens LRU evicted
from this (request, layer) in its last --evicted-steps launches (evicted). For each: recall (the
share of the launch's pages predicted), chance (what as many pages drawn at random from the row's
would recall) and reads_a_page (pages predicted per page needed).

--neighbours N: a miss also loads the N positions either side of it that lie in its page of the
layer-major layout (the same translation), as the least recently used of the fetch. Whether
spending the link on a translation's neighbours turns later misses into hits; "fetched" counts
the records moved, "misses" and "layer_major" what was left to fetch.

Usage: python3 bench/trace_pages.py TRACE.gz... [--slots-per-k 2] [--record-bytes 656] [--page 64K]
       [--neighbours 0] [--evicted-steps 4]
Prints one JSON line a trace and a sentence.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import OrderedDict, defaultdict, deque


def read_trace(path: str):
    """(k, layers, {(step, request): {layer: (seq_len, positions)}}) of a version 1 or 2 trace."""
    k = layers = None
    steps = defaultdict(dict)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for n, line in enumerate(f, 1):
            p = line.split()
            if not p or p[0].startswith("#"):
                continue
            if p[0] == "k":
                k = int(p[1])
            elif p[0] == "layers":
                layers = int(p[1])
            elif p[0] == "S":
                if len(p) < 5:
                    raise ValueError(f"{path}:{n}: an S line needs step, layer, request and seq_len")
                step, layer, req, seq = map(int, p[1:5])
                steps[(step, req)][layer] = (seq, [int(x) for x in p[5:]])
    if k is None or layers is None:
        raise ValueError(f"{path}: no k or layers in the header")
    return k, layers, steps


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


class Prediction:
    """Sums of one predictor's pages against the pages each launch needed."""

    def __init__(self) -> None:
        self.needed = self.hit = self.predicted = 0
        self.chance = 0.0

    def add(self, needed: set, predicted: set, row_pages: int) -> None:
        self.needed += len(needed)
        self.hit += len(needed & predicted)
        self.predicted += len(predicted)
        self.chance += len(needed) * min(1.0, len(predicted) / max(1, row_pages))

    def summary(self) -> dict:
        n = max(1, self.needed)
        return dict(recall=round(self.hit / n, 4), chance=round(self.chance / n, 4),
                    reads_a_page=round(self.predicted / n, 4))


def count(path: str, slots_per_k: int = 2, record_bytes: int = 656, page: int = 64 << 10, neighbours: int = 0,
          evicted_steps: int = 4) -> dict:
    k, layers, steps = read_trace(path)
    slots = slots_per_k * k
    lru = {}
    evicted_by = {}  # (request, layer): the tokens evicted in each of its last evicted_steps launches
    by_layer, by_evicted = Prediction(), Prediction()
    per_lm = max(1, page // record_bytes)              # tokens a page, one layer's records
    per_tm = max(1, page // (record_bytes * layers))   # tokens a page, every layer's records
    misses = same_token = layer_major = token_major = token_major_step = fetched = 0
    for step, req in sorted(steps):
        launch = steps[(step, req)]
        prev_tokens, prev_pages, step_pages = set(), set(), set()
        prev_lm = None  # the layer before's pages (layer-major), this step
        for layer in sorted(launch):
            seq, sel = launch[layer]
            cache = lru.setdefault((req, layer), OrderedDict())
            history = evicted_by.setdefault((req, layer), deque(maxlen=evicted_steps))
            foretold = {p // per_lm for gone in history for p in gone}
            evicted = set()
            missed = []
            for pos in sel:
                if pos == seq - 1:
                    continue  # the newest token: always a hit
                if pos in cache:
                    cache.move_to_end(pos)
                    continue
                missed.append(pos)
                near = [q for d in range(1, neighbours + 1) for q in (pos - d, pos + d)
                        if 0 <= q < seq - 1 and q // per_lm == pos // per_lm and q not in cache]
                for q in near + [pos]:  # the neighbours least recent, the miss most
                    cache[q] = True
                    fetched += 1
                    if len(cache) > slots:
                        evicted.add(cache.popitem(last=False)[0])
            pages = {p // per_tm for p in missed}
            lm = {p // per_lm for p in missed}
            row_pages = (seq + per_lm - 1) // per_lm
            if prev_lm is not None:
                by_layer.add(lm, prev_lm, row_pages)
            if len(history) == evicted_steps:
                by_evicted.add(lm, foretold, row_pages)
            history.append(evicted)
            prev_lm = lm
            misses += len(missed)
            same_token += sum(p in prev_tokens for p in missed)
            layer_major += len(lm)
            token_major += len(pages - prev_pages)
            step_pages |= pages
            prev_tokens, prev_pages = set(missed), pages
        token_major_step += len(step_pages)
    return dict(kind="trace_pages", trace=path.rsplit("/", 1)[-1], k=k, layers=layers, slots=slots,
                record_bytes=record_bytes, page=page, neighbours=neighbours, misses=misses, fetched=fetched,
                missed_by_the_layer_before=round(same_token / max(1, misses), 4),
                layer_major=layer_major, token_major=token_major, token_major_step=token_major_step,
                tokens_a_page_layer_major=per_lm, tokens_a_page_token_major=per_tm, evicted_steps=evicted_steps,
                predict=dict(layer_before=by_layer.summary(), evicted=by_evicted.summary()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--slots-per-k", type=int, default=2, help="B / k (4096 / 2048 in the serving runs)")
    ap.add_argument("--record-bytes", type=int, default=656)
    ap.add_argument("--page", default="64K", help="the GPU's translation page of host memory")
    ap.add_argument("--neighbours", type=int, default=0, help="positions either side a miss also loads, in its page")
    ap.add_argument("--evicted-steps", type=int, default=4, help="launches whose evictions predict")
    args = ap.parse_args(argv)
    page = parse_bytes(args.page)
    if page < args.record_bytes or args.slots_per_k < 1 or args.neighbours < 0 or args.evicted_steps < 1:
        ap.error("--page must hold a record, --slots-per-k and --evicted-steps must be at least 1, "
                 "--neighbours at least 0")
    for path in args.traces:
        r = count(path, args.slots_per_k, args.record_bytes, page, args.neighbours, args.evicted_steps)
        print(json.dumps(r))
        lm = max(1, r["layer_major"])
        print(f"# {r['trace']} (neighbours {r['neighbours']}): {r['misses']} misses, {r['fetched']} records fetched; "
              f"layer-major {r['layer_major']} translations, token-major "
              f"{r['token_major']} ({r['token_major'] / lm:.2f}x; {r['token_major_step'] / lm:.2f}x with a step "
              f"cached); {r['missed_by_the_layer_before']:.1%} of a layer's misses the layer before missed too")
        for name, pr in r["predict"].items():
            print(f"#   pages predicted by {name}: recall {pr['recall']:.1%} (chance {pr['chance']:.1%}), "
                  f"{pr['reads_a_page']:.2f} read a page needed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

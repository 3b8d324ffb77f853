#!/usr/bin/env python3
"""How much of a version-2 trace's hints an eviction policy can use (issue 21), stdlib only.

Replays every (request, layer) stream of TRACE under RESOLVE's LRU with B = RATIO * k slots
(resolve.h rules 1-3: the newest token is free, misses take the least recently used slots holding
no hit, new order = untouched, misses, hits) and prints, over all records but each stream's first:
  - the share of the misses whose position was among the previous record's hints;
  - P(a hinted position is selected at the next step) against P(any unselected one is);
  - the share of the hints resident after their step: the only ones eviction can protect.

  python3 examples/traces/hint_reach.py TRACE [RATIO]     (RATIO default 2)
"""

import sys

import tracefmt


def main() -> None:
    path = sys.argv[1]
    ratio = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    header, recs = tracefmt.read_trace(path, with_hints=True)
    k = int(header["k"])
    slots = int(ratio * k + 0.5)
    streams = {}
    for _step, layer, req, seq_len, pos, hints in recs:
        streams.setdefault((req, layer), []).append((seq_len, pos, hints))
    misses = misses_hinted = hinted = hinted_next = unselected = unselected_next = hints_resident = 0
    for rs in streams.values():
        order, resident, prev_hints = [], set(), set()  # order: least recently used first
        for i, (seq_len, pos, hints) in enumerate(rs):
            sel = [p for p in pos if p != seq_len - 1]
            chosen = set(sel)
            hits = [p for p in order if p in chosen]
            miss = [p for p in sel if p not in resident]
            if i > 0:
                misses += len(miss)
                misses_hinted += sum(1 for p in miss if p in prev_hints)
            need = max(0, len(resident) + len(miss) - slots)
            victims = set([p for p in order if p not in chosen][:need])
            order = [p for p in order if p not in chosen and p not in victims] + miss + hits
            resident = set(order)
            if i + 1 < len(rs):
                nxt = set(rs[i + 1][1])
                hinted += len(hints)
                hinted_next += sum(1 for p in hints if p in nxt)
                hints_resident += sum(1 for p in hints if p in resident)
                unselected += seq_len - len(pos)
                unselected_next += len(nxt - chosen)
            prev_hints = set(hints)
    print(f"{path}: k = {k}, B = {slots}: {misses} misses after each stream's first record, "
          f"{misses_hinted / max(1, misses):.3f} of them hinted the step before; "
          f"P(hinted selected next) {hinted_next / max(1, hinted):.3f} vs "
          f"P(unselected selected next) {unselected_next / max(1, unselected):.4f}; "
          f"hints resident after their step {hints_resident / max(1, hinted):.3f}")


if __name__ == "__main__":
    main()

"""Pure-Python helpers of examples/traces (no numpy, no torch), shared by train_and_extract.py and
its tests: a writer of ../../shared/TRACE_FORMAT.md files and a reference Quest page selection.

TraceWriter writes `hisparse-trace 1` files (gzip when the name ends in .gz), or version 2 when
constructed with hints = h > 0: the header then says `hints h`, and a record may carry up to h
retention hints (the positions its indexer ranked k+1 .. k+h, best first, none of them selected),
written as an `H` line right after its `S` line. Steps must come in non-decreasing order; within a
step a (layer, request) pair at most once; positions unique, in [0, seq_len), at most k of them.
With max_bytes it stops at the first step boundary after which the compressed file has grown past
max_bytes, and says so (truncated, steps_written).
"""

from __future__ import annotations

import gzip
import math


class TraceWriter:
    def __init__(self, path: str, k: int, layers: int, extra: dict | None = None,
                 compresslevel: int = 6, max_bytes: int | None = None, check: str = "full",
                 hints: int = 0) -> None:
        assert k >= 1 and layers >= 1 and hints >= 0
        self.path, self.k, self.layers, self.check, self.hints = path, k, layers, check, hints
        self.max_bytes = max_bytes
        self._raw = open(path, "wb")
        self._f = (gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0, compresslevel=compresslevel)
                   if path.endswith(".gz") else self._raw)
        head = [f"hisparse-trace {2 if hints else 1}", f"k {k}", f"layers {layers}"]
        if hints:
            head.append(f"hints {hints}")
        for key, value in (extra or {}).items():
            value = " ".join(str(value).split())  # one line
            assert key and " " not in key and key not in ("k", "layers", "hints", "S", "H") and not key.startswith("#")
            head.append(f"{key} {value}")
        self._f.write(("\n".join(head) + "\n").encode())
        self.step = -1
        self._pairs: set = set()
        self.steps_written = 0
        self.records = 0
        self.truncated = False
        self.closed = False

    def write_step(self, step: int, records) -> bool:
        """records: iterable of (layer, request, seq_len, positions) or (layer, request, seq_len,
        positions, hints); hints need a writer made with hints > 0. Returns False (and writes
        nothing) once the size limit was reached at an earlier step boundary."""
        if self.truncated:
            return False
        if self.max_bytes is not None and self._raw.tell() > self.max_bytes:
            self.truncated = True
            return False
        if step < self.step:
            raise ValueError(f"step {step} after step {self.step}: steps must not decrease")
        if step != self.step:
            self.step, self._pairs = step, set()
            self.steps_written += 1
        out = []
        for rec in records:
            layer, request, seq_len, positions = rec[:4]
            hints = rec[4] if len(rec) > 4 else ()
            self.validate(layer, request, seq_len, positions)
            self.validate_hints(seq_len, positions, hints)
            if (layer, request) in self._pairs:
                raise ValueError(f"step {step}: (layer {layer}, request {request}) given twice")
            self._pairs.add((layer, request))
            out.append(f"S {step} {layer} {request} {seq_len} " + " ".join(map(str, positions)))
            if hints:
                out.append(f"H {step} {layer} {request} " + " ".join(map(str, hints)))
            self.records += 1
        if out:
            self._f.write(("\n".join(out) + "\n").encode())
        return True

    def validate(self, layer, request, seq_len, positions) -> None:
        if not (0 <= layer < self.layers):
            raise ValueError(f"layer {layer} outside [0, {self.layers})")
        if request < 0 or seq_len < 1:
            raise ValueError(f"bad request {request} or seq_len {seq_len}")
        if len(positions) > self.k:
            raise ValueError(f"{len(positions)} positions > k = {self.k}")
        if not positions:
            return
        if self.check == "full":
            if min(positions) < 0 or max(positions) >= seq_len:
                raise ValueError(f"a position outside [0, {seq_len})")
            if len(set(positions)) != len(positions):
                raise ValueError("duplicate positions")
        else:  # "sorted": the caller promises strictly increasing positions; check the ends
            if positions[0] < 0 or positions[-1] >= seq_len:
                raise ValueError(f"a position outside [0, {seq_len})")

    def validate_hints(self, seq_len, positions, hints) -> None:
        if not hints:
            return
        if len(hints) > self.hints:
            raise ValueError(f"{len(hints)} hints > hints = {self.hints} (a writer made with hints=0 takes none)")
        if min(hints) < 0 or max(hints) >= seq_len:
            raise ValueError(f"a hint outside [0, {seq_len})")
        h = set(hints)
        if len(h) != len(hints):
            raise ValueError("duplicate hints")
        if not h.isdisjoint(positions):
            raise ValueError("a hint is also selected")

    def close(self) -> None:
        if self.closed:
            return
        if self.truncated:
            self._f.write(f"# truncated: size limit ({self.max_bytes} bytes) reached after step {self.step}\n".encode())
        if self._f is not self._raw:
            self._f.close()
        self._raw.close()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_trace(path: str, with_hints: bool = False):
    """Minimal reader for tests, of version 1 and 2: (header dict, list of (step, layer, request,
    seq_len, positions)), or with with_hints (step, layer, request, seq_len, positions, hints),
    hints [] where a record has none. An H line must follow the S line of its record."""
    opener = gzip.open if path.endswith(".gz") else open
    header, recs = {}, []
    with opener(path, "rt") as f:
        first = f.readline().rstrip("\n")
        assert first in ("hisparse-trace 1", "hisparse-trace 2"), first
        version = int(first.split()[1])
        for line in f:
            tok = line.split()
            if not tok or tok[0].startswith("#"):
                continue
            if tok[0] == "S":
                v = list(map(int, tok[1:]))
                recs.append((v[0], v[1], v[2], v[3], v[4:], []))
            elif tok[0] == "H":
                v = list(map(int, tok[1:]))
                assert version == 2, "H line in a version-1 trace"
                assert recs and tuple(recs[-1][:3]) == tuple(v[:3]) and not recs[-1][5], line
                recs[-1][5].extend(v[3:])
            else:
                header[tok[0]] = " ".join(tok[1:])
    return header, [r if with_hints else r[:5] for r in recs]


def quest_page_scores(q, keys, seq_len: int, page: int):
    """Reference Quest scores for one query step, pure Python.

    q: per head, the query vector (list of H lists of d floats); keys: per head, the keys of
    positions 0 .. >= seq_len-1 (H lists of lists of d floats). Pages are page positions long; the
    last one holds positions up to seq_len-1 only (partial). Per head and page the upper bound of
    q.k over the page is sum_c max(q_c * min_c, q_c * max_c) (min/max over the page's keys, per
    channel); scaled by 1/sqrt(d), softmax over the pages per head, then summed over the heads: an
    upper-bound estimate of the head-summed attention mass of each page. Returns a list of floats,
    one per page (ceil(seq_len / page) pages)."""
    n_pages = (seq_len + page - 1) // page
    total = [0.0] * n_pages
    for qh, kh in zip(q, keys):
        d = len(qh)
        ubs = []
        for p in range(n_pages):
            rows = kh[p * page:min((p + 1) * page, seq_len)]
            ub = 0.0
            for c in range(d):
                lo = min(r[c] for r in rows)
                hi = max(r[c] for r in rows)
                ub += max(qh[c] * lo, qh[c] * hi)
            ubs.append(ub / math.sqrt(d))
        m = max(ubs)
        e = [math.exp(u - m) for u in ubs]
        s = sum(e)
        for p in range(n_pages):
            total[p] += e[p] / s
    return total


def quest_select(page_scores, seq_len: int, page: int, k: int):
    """The positions of the top pages by score (ties: lower page first), as many whole pages as fit
    in k positions (k // page pages; all pages when fewer exist), the last partial page cut at
    seq_len-1. Sorted, unique, all < seq_len, at most k."""
    n = min(len(page_scores), k // page)
    top = sorted(range(len(page_scores)), key=lambda p: (-page_scores[p], p))[:n]
    out = []
    for p in sorted(top):
        out.extend(range(p * page, min((p + 1) * page, seq_len)))
    return out

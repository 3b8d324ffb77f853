"""bench/trace_pages.py: the host pages a step's misses touch, by layout, from selection traces."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import REPO, bench_module


def _write(tmp_path, body: str, layers: int = 2, k: int = 2):
    p = tmp_path / "t.trace.gz"
    with gzip.open(p, "wt") as f:
        f.write(f"hisparse-trace 1\nk {k}\nlayers {layers}\n{body}")
    return str(p)


def test_counts_by_hand(tmp_path):
    tp = bench_module("trace_pages")
    # Two layers, k 2, 2 slots a (request, layer); records of 16 B, pages of 64 B: 4 tokens a page
    # layer-major, 2 token-major. Step 0 misses 0 and 5 in both layers; step 1 selects 0 and 9 in
    # layer 0 (0 hits, 9 misses) and 1 and 9 in layer 1 (both miss, evicting 0 and 5 there).
    path = _write(tmp_path, "S 0 0 0 20 0 5\nS 0 1 0 20 0 5\nS 1 0 0 21 0 9\nS 1 1 0 21 1 9\n")
    r = tp.count(path, slots_per_k=1, record_bytes=16, page=64)
    assert r["misses"] == 2 + 2 + 1 + 2
    assert r["layer_major"] == 2 + 2 + 1 + 2  # every miss on its own page of its layer
    # token-major: step 0 layer 0 pages {0, 2}, layer 1 the same (cached): 2; step 1 layer 0 {4},
    # layer 1 {0, 4}: page 0 is new after layer 0's launch, 4 is cached: 1 + 1.
    assert r["token_major"] == 2 + 0 + 1 + 1
    assert r["token_major_step"] == 2 + 2
    assert r["missed_by_the_layer_before"] == pytest.approx((2 + 1) / 7, abs=1e-4)


def test_the_newest_token_is_a_hit_and_lru_evicts(tmp_path):
    tp = bench_module("trace_pages")
    path = _write(tmp_path, "S 0 0 0 4 3 0\nS 1 0 0 5 4 1\nS 2 0 0 6 0 5\n", layers=1)
    r = tp.count(path, slots_per_k=1, record_bytes=16, page=64)
    # 3, 4 and 5 are each the newest token; 0 misses, 1 misses (0 stays: 2 slots), 0 hits.
    assert r["misses"] == 2


def test_the_real_text_trace_and_the_command_line(capsys):
    tp = bench_module("trace_pages")
    trace = str(REPO / "bench" / "traces" / "debian-dsa-small.trace.gz")
    assert tp.main([trace]) == 0
    r = json.loads(capsys.readouterr().out.splitlines()[0])
    assert r["layers"] == 6 and r["k"] == 256 and r["misses"] > 0
    assert 0 < r["layer_major"] <= r["misses"] and r["token_major_step"] <= r["token_major"]
    with pytest.raises(SystemExit):
        tp.main([trace, "--page", "512"])


def test_neighbours_in_the_page_come_with_a_miss(tmp_path):
    tp = bench_module("trace_pages")
    # Pages of 4 tokens (64 B / 16 B). Step 0 misses 5 (page 4-7); step 1 selects 4 and 6, step 2
    # selects 3 and 8, which lie in the pages either side.
    path = _write(tmp_path, "S 0 0 0 20 5\nS 1 0 0 21 4 6\nS 2 0 0 22 3 8\n", layers=1)
    plain = tp.count(path, slots_per_k=4, record_bytes=16, page=64)
    near = tp.count(path, slots_per_k=4, record_bytes=16, page=64, neighbours=1)
    assert (plain["misses"], plain["fetched"]) == (5, 5)
    # 5 brings 4 and 6 (not 3 or 8: other pages); 3 then brings 2 (page 0-3), and 8 brings 9.
    assert (near["misses"], near["fetched"], near["layer_major"]) == (3, 3 + 2 + 2, 3)


def test_predictions_of_a_launchs_pages_by_hand(tmp_path):
    tp = bench_module("trace_pages")
    # Two layers, 2 slots each, pages of 4 tokens (64 B / 16 B). Layer 0 then 1 each step:
    #   step 0: misses {0, 5} (pages 0, 1) and {0, 9} (pages 0, 2); nothing evicted;
    #   step 1: layer 0 misses {12, 16} (pages 3, 4), evicting 0 and 5; layer 1 misses 1 (page 0),
    #           evicting 0, and hits 9;
    #   step 2: layer 0 misses {0, 1} (page 0), evicting 12 and 16; layer 1 misses 0 (page 0),
    #           evicting 1, and hits 9.
    path = _write(tmp_path, "S 0 0 0 20 0 5\nS 0 1 0 20 0 9\nS 1 0 0 21 12 16\nS 1 1 0 21 1 9\n"
                            "S 2 0 0 22 0 1\nS 2 1 0 22 0 9\n")
    r = tp.count(path, slots_per_k=1, record_bytes=16, page=64, evicted_steps=1)
    # The layer before, in each step's layer 1: {0,1} for {0,2} (a row of 5 pages), {3,4} for {0},
    # {0} for {0} (rows of 6): 2 of 4 pages, 5 predicted, chance 2*2/5 + 1*2/6 + 1*1/6.
    assert r["predict"]["layer_before"] == dict(recall=0.5, chance=round((0.8 + 2 / 6 + 1 / 6) / 4, 4),
                                                reads_a_page=1.25)
    # Evicted the launch before (from step 1 on): nothing for {3,4} and {0}; 0 and 5 (pages {0,1})
    # for {0}; 0 (page 0) for {0}: 2 of 5 pages, 3 predicted, chance 1*2/6 + 1*1/6.
    assert r["predict"]["evicted"] == dict(recall=0.4, chance=round((2 / 6 + 1 / 6) / 5, 4), reads_a_page=0.6)
    with pytest.raises(SystemExit):
        tp.main([path, "--evicted-steps", "0"])

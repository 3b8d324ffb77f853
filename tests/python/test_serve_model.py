"""bench/serve_model.py's projection of a hit-rate curve (serve_bench.py --hit-rates) onto a
FlashMLA-class attention: its arithmetic on a hand-made curve, and that it reads the committed H200
curve. No GPU and no torch: it runs wherever the Python tests run."""

from __future__ import annotations

import pytest
from conftest import REPO, bench_module


def _serve_model():
    return bench_module("serve_model")


def test_projection_arithmetic_on_a_hand_made_curve():
    sm = _serve_model()
    model = dict(kind="model", layers=2, k=1000)
    f_row = sm.flashmla_row_ms(model, 100.0)  # 2 layers * 2 * 128 heads * 1000 * 1088 FLOP at 100 TFLOP/s
    assert f_row == pytest.approx(2 * 2 * 128 * 1000 * 1088 / 100e12 * 1e3)
    lines = [model,
             dict(kind="point", context=64, mode="baseline", concurrency=2, step_ms_mean=10.0,
                  parts_ms=dict(attention=1.0)),
             dict(kind="point", context=64, mode="full_at_N", concurrency=10, step_ms_mean=14.0, target_hit_rate=0.8,
                  parts_ms=dict(attention=5.0)),
             dict(kind="curve", context=64, concurrency=10, baseline_peak_concurrency=2, target_hit_rate=0.8,
                  hit_rate=0.81, step_ms_full=14.0, step_ms=16.0, ratio=1.0, ratio_overlap=1.1, exposed_ms=2.0,
                  exposed_ms_overlap=1.0, overlap=dict(spec="4", ranges=[3, 3, 2, 2]))]
    (r,) = sm.project_curve(lines, 100.0)
    a_row = (5.0 - 1.0) / (10 - 2)  # this engine's attention a row and step
    cut = a_row - f_row
    t_base, t_full = 10.0 - 2 * cut, 14.0 - 10 * cut
    assert r["a_row_us"] == pytest.approx(a_row * 1e3)
    assert r["projected_ratio"] == pytest.approx(10 / (t_full + 2.0) / (2 / t_base))
    assert r["projected_ratio_all_hidden"] == pytest.approx(10 / t_full / (2 / t_base))
    assert r["hideable_ms"] == pytest.approx(10 * f_row * 3 / 4)
    assert r["hidden_ms"] == pytest.approx(1.0)
    # Without MoE or indexer parts the leaner floor changes nothing and only attention can hide.
    assert r["lean_ratio"] == pytest.approx(r["projected_ratio"])
    assert r["hideable_cover_ms"] == pytest.approx(r["hideable_attention_ms"])


def test_the_leaner_floor_and_what_each_schedule_hides():
    sm = _serve_model()
    # E = 2 ms exposed, 4 ranges, attention A = 0.4 ms, indexer I = 1.2 ms a step.
    h = sm.hideable(2.0, 4, 0.4, 1.2)
    assert h["attention"] == pytest.approx(3 * 0.4 / 4)  # each later range's RESOLVE under an attention range
    assert h["cover"] == pytest.approx(min(0.5, 1.2 * 3 / 4) + 3 * 0.4 / 4)
    assert h["chained"] == pytest.approx(3 * 1.2 / 4 + min(0.5, 0.4 * 3 / 4))
    assert sm.hideable(0.2, 4, 5.0, 5.0) == pytest.approx(dict(attention=0.15, cover=0.2, chained=0.2)), \
        "never more than there is"
    model = dict(kind="model", layers=2, k=1000)
    lines = [model,
             dict(kind="point", context=64, mode="baseline", concurrency=2, step_ms_mean=10.0,
                  parts_ms=dict(attention=1.0, moe=3.3, indexer=0.1)),
             dict(kind="point", context=64, mode="full_at_N", concurrency=10, step_ms_mean=14.0, target_hit_rate=0.8,
                  parts_ms=dict(attention=5.0, moe=3.3, indexer=1.2)),
             dict(kind="curve", context=64, concurrency=10, baseline_peak_concurrency=2, target_hit_rate=0.8,
                  hit_rate=0.81, step_ms_full=14.0, step_ms=16.0, ratio=1.0, ratio_overlap=1.1, exposed_ms=2.0,
                  exposed_ms_overlap=1.0, overlap=dict(spec="4", ranges=[3, 3, 2, 2]))]
    (r,) = sm.project_curve(lines, 100.0, moe_lean=2.1 / 3.3)
    f_row = sm.flashmla_row_ms(model, 100.0)
    cut = (5.0 - 1.0) / 8 - f_row
    lean_base = 10.0 - 2 * cut - 3.3 * (1 - 2.1 / 3.3)  # the MoE at 3.3 TB/s instead of 2.1: 1.2 ms less
    lean_full = 14.0 - 10 * cut - 3.3 * (1 - 2.1 / 3.3)
    peak = 2 / lean_base
    assert r["lean_ratio"] == pytest.approx(10 / (lean_full + 2.0) / peak)
    assert r["lean_ratio_all_hidden"] == pytest.approx(10 / lean_full / peak)
    hid = sm.hideable(2.0, 4, 10 * f_row, 1.2)
    for k in ("attention", "cover", "chained"):
        assert r[f"lean_ratio_{k}"] == pytest.approx(10 / (lean_full + 2.0 - hid[k]) / peak)
    assert r["lean_ratio"] < r["lean_ratio_attention"] < r["lean_ratio_cover"] < r["lean_ratio_chained"] \
        <= r["lean_ratio_all_hidden"]


def test_two_microbatches_pay_the_fixed_cost_twice():
    sm = _serve_model()
    # Parts at n = 2 and N = 10 rows: proj 1.0 + 0.1 b, moe 3.0 + 0.05 b, attention 0.5 + 0.2 b; the
    # indexer and top-k scale with the context and RESOLVE is what is hidden: neither is fixed.
    base = dict(parts_ms=dict(proj=1.2, moe=3.1, attention=0.9, indexer=0.3, topk=0.2, resolve=0.1))
    full = dict(parts_ms=dict(proj=2.0, moe=3.5, attention=2.5, indexer=1.5, topk=1.0, resolve=0.1))
    assert sm.fixed_ms(base, full, 2, 10) == pytest.approx(1.0 + 3.0 + 0.5)
    assert sm.fixed_ms(base, full, 2, 10, moe_lean=0.5) == pytest.approx(1.0 + 1.5 + 0.5)
    # Each half hides its RESOLVE under the other's layer, never more than half the step.
    assert sm.two_microbatches(2.0, 12.0, 4.5) == pytest.approx(2.0 - 4.5)
    assert sm.two_microbatches(20.0, 12.0, 4.5) == pytest.approx((12.0 + 4.5) / 2 - 4.5)


def test_a_run_on_the_lean_floor_is_not_made_leaner_again():
    sm = _serve_model()
    lean = [dict(kind="model", grouped_expert_gemm=dict(gemm="triton"))]
    old = [dict(kind="model", grouped_expert_gemm=dict(gemm="grouped", grouped=True))]
    assert sm.run_moe_lean(lean, None) == 1.0
    assert sm.run_moe_lean(old, None) == sm.MOE_LEAN
    assert sm.run_moe_lean(lean, 0.5) == 0.5  # what is asked for wins


def test_the_committed_h200_curve_projects():
    sm = _serve_model()
    import json
    path = REPO / "bench" / "results" / "hide-misses-2026-12-04-curve.jsonl"
    rows = sm.project_curve([json.loads(x) for x in path.open()], sm.FLASHMLA_TFLOPS)
    assert len(rows) == 24  # 2 contexts x 6 targets x 2 overlap variants
    for r in rows:
        # A faster attention leaves the full-HBM step shorter in both modes, and hiding every miss
        # can only help; what an overlap under it could hide shrinks with it.
        assert r["projected_ratio_all_hidden"] >= r["projected_ratio"] > 0
        assert r["f_row_us"] < r["a_row_us"]
        assert r["lean_ratio"] <= r["lean_ratio_attention"] <= r["lean_ratio_cover"] <= r["lean_ratio_all_hidden"]
        assert r["lean_ratio_chained"] <= r["lean_ratio_all_hidden"] + 1e-9
        for k in ("attention", "cover", "chained"):  # with this engine's attention: never more than exposed
            assert 0 <= r[f"hideable_here_{k}_ms"] <= max(0.0, r["exposed_ms"]) + 1e-9
        # This MoE streams its experts whatever the batch: a second micro-batch pays ~6 ms a step
        # again, more than the misses to hide at 128k at every hit rate measured.
        assert 5.0 < r["fixed_ms"] < 7.5
        if r["context"] == 131072:
            assert r["lean_ratio_micro"] < r["lean_ratio"]


def test_the_curve_plot_draws_every_series(tmp_path):
    # bench/plot_curve.py (no plotting library): per context, the ratio and the exposed time, one
    # line each for hisparse and every overlap variant.
    mod = bench_module("plot_curve")
    out = tmp_path / "curve.svg"
    src = REPO / "bench" / "results" / "hide-misses-2026-12-04-curve.jsonl"
    assert mod.main([str(src), str(out)]) == 0
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert svg.count("<polyline") == 2 * 2 * 3  # 2 contexts x (ratio, exposed) x (hisparse + 2 variants)
    assert "overlap 4/b16" in svg and "overlap 4/h8/w" in svg and "real text 78%" in svg
    bad = tmp_path / "sweep.jsonl"
    bad.write_text('{"kind": "point"}\n')
    assert mod.main([str(bad), str(out)]) == 1

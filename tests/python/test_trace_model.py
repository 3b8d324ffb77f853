"""bench/trace_model.py: a serving run's kernel timelines (serve_bench.py --trace) projected to other
fetch rates. Its arithmetic on hand-made timelines, and that it reads the committed H100 traces. No
GPU and no torch: it runs wherever the Python tests run."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, bench_module


def _trace_model():
    return bench_module("trace_model")


def _files(tmp_path, curves, traces):
    """A run (a 50 GB/s link, 656-B records, these curve records) and its timelines, as files: their paths."""
    run, tl = tmp_path / "run.jsonl", tmp_path / "traces.jsonl"
    run.write_text("".join(json.dumps(x) + "\n" for x in [dict(kind="link", h2d_gbps=50),
                                                          dict(kind="model", record_bytes=656, layers=1)]
                           + [dict(c, kind="curve") for c in curves]))
    tl.write_text("".join(json.dumps(dict(t, kind="trace")) + "\n" for t in traces))
    return str(run), str(tl)


def k(name, start, dur, rows):
    """A kernel record as serve_bench writes it: the indexer's rows are its grid's y, MLA's its x."""
    grid = [1041, rows, 1] if name == "index_scores" else [rows, 64, 1] if name == "mla" else [16, 1, 1]
    return [name, start, dur, 7, grid]


def test_a_window_at_twice_the_fetch_rate():
    tm = _trace_model()
    # One layer: 2 rows' indexer alone (80 µs: 40 a row), then RESOLVE (15 planning + 100 fetch) with the
    # other 2 rows' indexer launched beside it, recorded as ending with RESOLVE (pinned); the top-k
    # after is not cover.
    trace = dict(kernels=[k("index_scores", 0, 80, 2), k("ResolveKernel", 100, 115, 0),
                          k("index_scores", 101, 114, 2), k("TopkKernel", 215, 20, 0)])
    (w,) = tm.windows(trace, {})
    assert w.family == "index_scores" and w.beside and w.pinned
    assert (w.resolve_off, w.resolve_us, w.cover_us, w.alone_us, w.length) == (0, 115, 115, 80, 115)
    assert tm.alone_us(trace, {"index_scores": 99.0, "mla": 3.0}) == {
        "index_scores": 40.0, ("index_scores", 1041, 1): 40.0, "mla": 3.0}
    slow = {"index_scores": dict(s=1.25)}
    saved = tm.project(trace, 0.5, 1.0, {}, slow)
    r_new = 15 + 100 / 2  # 65 µs
    assert saved["serial"] == pytest.approx(115 - r_new)
    assert saved["alone"] == pytest.approx(115 - 80)  # the cover at its own speed is now the longer side
    assert saved["slowed"] == pytest.approx(115 - 80 * 1.25)  # slowed as where it was seen
    # At the rate it ran at, nothing changes, whatever the cover.
    assert tm.project(trace, 0.5, 0.5, {}, slow) == pytest.approx(dict(serial=0, slowed=0, alone=0))
    # A top-k that starts before RESOLVE's end (after_count) shows where the pinned indexer ended.
    seen = dict(kernels=trace["kernels"][:3] + [k("TopkKernel", 196, 20, 0)])
    (w,) = tm.windows(seen, {})
    assert w.seen_by_topk and not w.pinned and w.cover_us == 96
    # A cover seen to end after RESOLVE is taken as it ran when slowed.
    visible = dict(kernels=trace["kernels"][:2] + [k("index_scores", 101, 129, 2)])
    (w,) = tm.windows(visible, {})
    assert not w.pinned and w.length == 130
    saved = tm.project(visible, 0.5, 1.0, {}, slow)
    assert saved["slowed"] == pytest.approx(0.0) and saved["alone"] == pytest.approx(130 - 80)


def test_a_launch_with_no_cover_saves_all_it_shortens():
    tm = _trace_model()
    trace = dict(kernels=[k("index_scores", 0, 80, 2), k("ResolveKernel", 90, 215, 0), k("mla", 310, 30, 2)])
    saved = tm.project(trace, 0.4, 0.8, {"index_scores": 40.0, "mla": 15.0}, {})
    assert saved == pytest.approx(dict(serial=100.0, slowed=100.0, alone=100.0))
    # The fetch rate: bytes over the launches' time less planning, against the link.
    assert tm.fetch_eta(trace, 1000, 656, 50.0) == pytest.approx(1000 * 656 / 200e-6 / 50e9)


def test_the_slowdown_counts_only_visible_covers_launched_beside():
    tm = _trace_model()
    trace = dict(kernels=[k("mla", 0, 30, 2),  # alone: 15 µs a row
                          k("ResolveKernel", 40, 100, 0), k("mla", 41, 60, 2), k("mla", 101, 45, 2),  # visible
                          k("ResolveKernel", 200, 100, 0), k("mla", 201, 99, 2),  # pinned
                          k("ResolveKernel", 400, 100, 0), k("mla", 450, 90, 2)])  # started late: not beside
    ws = tm.windows(trace, {})
    assert [(w.beside, w.pinned) for w in ws] == [(True, False), (True, True), (False, False)]
    d = tm.slowdowns([trace], {})["mla"]
    assert (d["visible"], d["pinned"]) == (1, 1)
    assert d["s"] == pytest.approx(106 / (2 * 2 * 15.0))  # two MLA kernels of 2 rows, ran 106 µs
    assert tm.slowdowns([trace], {})["index_scores"]["s"] is None


def test_a_cover_holding_part_of_the_mla_chain_is_taken_at_its_kernels_own_cost():
    tm = _trace_model()

    def mla(start, dur, rows, y, z=1):
        return ["mla", start, dur, 7, [rows, y, z]]
    # Alone, 4 rows: gather 10 µs (2.5 a row), split 40 (10 a row), combine 6 (1.5 a row). The family's
    # average, 56 µs over 12 kernel-rows, would put a window holding only the split at 4.7 a row (and a
    # split slowed beside RESOLVE at twice its cost); it must cost 10 a row, one holding only the combine
    # 1.5.
    alone = [mla(0, 10, 4, 64), mla(10, 40, 4, 4, 16), mla(50, 6, 4, 8)]
    unit = tm.per_row_us(alone)
    assert unit["mla"] == pytest.approx(56 / 12)
    assert unit[("mla", 4, 16)] == pytest.approx(10.0) and unit[("mla", 8, 1)] == pytest.approx(1.5)
    trace = dict(kernels=[k("ResolveKernel", 100, 200, 0), mla(101, 60, 5, 4, 16),
                          k("ResolveKernel", 400, 50, 0), mla(401, 8, 5, 8)])
    split, combine = tm.windows(trace, unit)
    assert split.alone_us == pytest.approx(50.0) and combine.alone_us == pytest.approx(7.5)
    # A shape never seen alone falls back to its family's average.
    odd = dict(kernels=[k("ResolveKernel", 0, 100, 0), mla(1, 30, 2, 32)])
    (w,) = tm.windows(odd, unit)
    assert w.alone_us == pytest.approx(2 * 56 / 12)


def test_a_point_whose_launches_are_mostly_planning_is_not_projected(tmp_path, capsys):
    tm = _trace_model()
    # 1,000 misses of 656 B a step at 50 GB/s take 13 µs at the link; two launches of 20 µs leave 10 µs
    # of fetch past planning: an eta above 1, which says the planning constant, not the fetch, is what
    # these launches are made of.
    kernels = [["ResolveKernel", 0, 20, 7, [8, 1, 1]], ["ResolveKernel", 50, 20, 7, [8, 1, 1]]]
    run, traces = _files(tmp_path, [dict(context=64, concurrency=4, hit_rate=0.96, misses_per_step=1000, exposed_ms=0.1,
                                          exposed_ms_overlap=0.05, overlap=dict(spec="v"))],
                         [dict(point="v", kernels=kernels), dict(point="hisparse", kernels=kernels)])
    assert tm.fetch_eta(dict(kernels=[["ResolveKernel", 0, 15, 7, [8]]]), 1000, 656, 50) == float("inf")
    assert tm.main(run, traces) == 0
    rows = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| 64 | v |")]
    assert len(rows) == 1 and "not projected" in rows[0]


def test_the_committed_h100_traces_project(capsys):
    tm = _trace_model()
    res = REPO / "bench" / "results"
    run, traces = tm.load(str(res / "hide-misses-2026-12-05-under-h100-2.jsonl"),
                          str(res / "hide-misses-2026-12-05-traces-h100.jsonl"), 8)
    assert tm.main(str(res / "hide-misses-2026-12-05-under-h100-2.jsonl"),
                   str(res / "hide-misses-2026-12-05-traces-h100.jsonl"), call=8, etas=(0.75,)) == 0
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if x.startswith("| 131072 | 2_b8_beside_ix1_rf_under |")]
    assert len(rows) == 2 + 2  # now and 0.75; then its two covers (indexer, MLA)
    t = next(x for x in traces if x["point"] == "2_b16_beside_ix1_rf_under")
    serial = next(x for x in traces if x["point"] == "hisparse")
    unit = tm.per_row_us(serial["kernels"])
    # The under schedule's covers are recorded as ending with RESOLVE, the chained MLA's own end is not
    # seen; the indexer's is, through the top-k launched after it with after_count (call 3).
    ws = tm.windows(t, unit)
    ix = [w for w in ws if w.family == "index_scores"]
    mla = [w for w in ws if w.family == "mla"]
    assert len(ix) == len(mla) == 8
    assert all(w.seen_by_topk and not w.pinned and w.alone_us < w.cover_us < w.resolve_us for w in ix)
    assert sum(w.pinned for w in mla) >= 7
    slow = tm.slowdowns(traces, unit)
    assert 1.0 < slow["index_scores"]["s"] < 1.25  # RESOLVE's 8 or 16 SMs of 132 beside it
    assert slow["mla"]["s"] > 1.1  # the chained MLA is slower than alone
    eta = tm.fetch_eta(t, 94322.0, 656, 55.1)
    assert 0.45 < eta < 0.6  # item 3's half of the link
    saved = tm.project(t, eta, 0.75, unit, slow)
    assert 0 < saved["slowed"] <= saved["alone"] < saved["serial"]


def test_a_run_without_its_no_overlap_timeline_is_refused(tmp_path, capsys):
    tm = _trace_model()
    run, traces = _files(tmp_path, [dict(context=64, concurrency=4, exposed_ms=1.0),
                                    dict(context=64, concurrency=4, overlap=dict(spec="2_b8_beside_ix1_rf_under"))],
                         [dict(point="2_b8_beside_ix1_rf_under", kernels=[["ResolveKernel", 0, 10, 7, [8, 1, 1]]])])
    assert tm.main(run, traces) == 1
    assert "'hisparse'" in capsys.readouterr().err


def test_serve_bench_timelines_are_read_as_written_and_paired_by_target():
    tm = _trace_model()
    # serve_bench --trace writes every kernel of a step under the profiler's names, and says which point
    # by mode and overlap; two targets at one context give two timelines of each point, in order.
    def raw(mode, overlap, resolve_us, ctx=131072, n=29):
        return dict(kind="trace", mode=mode, overlap=overlap, context=ctx, concurrency=n, kernels=[
            ["_index_scores_kernel", 0.0, 100.0, 7, [1041, 14, 1]],
            ["void at::native::elementwise_kernel<128, 4>(...)", 100.0, 2.0, 7, [1, 1, 1]],
            ["void hisparse::(anonymous namespace)::TopkKernel<(bool)0>(hisparse::TopkDesc)", 102.0, 40.0, 7,
             [112, 1, 1]],
            ["void hisparse::(anonymous namespace)::ResolveKernel<656, (hisparse::internal::LaunchOrd",
             142.0, resolve_us, 7, [8, 1, 1]],
            ["_index_scores_kernel", 143.0, resolve_us - 1.0, 7, [1041, 15, 1]],
            ["_index_scores_persistent_kernel", 400.0, 5.0, 7, [132, 1, 1]],
            ["_mla_split", 500.0, 30.0, 7, [14, 4, 4]]])
    traces = [tm.normalize(t) for t in (
        raw("baseline", None, 0.0), raw("hisparse", None, 200.0), raw("hisparse", "2_b8_beside_ix1_rf_under", 150.0),
        raw("hisparse", None, 120.0), raw("hisparse", "2_b8_beside_ix1_rf_under", 90.0),
        raw("hisparse", None, 50.0, n=2))]  # a calibration run's few rows: never paired
    t = traces[2]
    assert t["point"] == "2_b8_beside_ix1_rf_under" and traces[1]["point"] == "hisparse"
    assert [k[0] for k in t["kernels"]] == ["index_scores", "TopkKernel", "ResolveKernel", "index_scores", "mla"]
    assert tm.normalize(t) is t  # a reduced record is kept as it is
    curve = dict(kind="curve", context=131072, concurrency=29, overlap=dict(spec="2_b8_beside_ix1_rf_under"))
    run = [dict(curve, target_hit_rate=0.78), dict(curve, target_hit_rate=0.95)]
    (c0, t0, s0), (c1, t1, s1) = tm.pair(run, traces)
    assert (c0["target_hit_rate"], t0["kernels"][2][2], s0["kernels"][2][2]) == (0.78, 150.0, 200.0)
    assert (c1["target_hit_rate"], t1["kernels"][2][2], s1["kernels"][2][2]) == (0.95, 90.0, 120.0)
    assert tm.pair([dict(curve, target_hit_rate=0.78, context=32768)], traces) == []


def test_the_path_charges_each_kernel_how_far_it_moved_the_step():
    tm = _trace_model()
    # RESOLVE from 10 to 110 with an indexer under it (12-100) and a top-k that outlasts it (100-120); a
    # gap of 5; a torch kernel; an append. The charges add up to the span, 0 to 140.
    kernels = [["_index_scores_kernel", 0.0, 10.0, 7, [1041, 2, 1]],
               ["void hisparse::(anonymous namespace)::ResolveKernel<656>", 10.0, 100.0, 7, [8, 1, 1]],
               ["_index_scores_kernel", 12.0, 88.0, 7, [1041, 2, 1]],
               ["hisparse::(anonymous namespace)::TopkKernel(hisparse::TopkDesc)", 100.0, 20.0, 7, [16, 1, 1]],
               ["void at::native::vectorized_elementwise_kernel<4>", 125.0, 5.0, 7, [1, 1, 1]],
               ["hisparse::(anonymous namespace)::AppendKernel(hisparse::AppendDesc)", 130.0, 10.0, 7, [1, 1, 1]]]
    p = tm.on_path(kernels)
    assert p == {"indexer": 10.0, "RESOLVE": 100.0, "top-k": 10.0, "gaps": 5.0, "other": 5.0, "append": 10.0}
    assert sum(p.values()) == 140.0
    # A reduced timeline's family names group the same way.
    assert tm.on_path([["index_scores", 0, 4, 7, [1, 1, 1]], ["mla", 4, 6, 7, [1, 64, 1]]]) == {
        "indexer": 4, "sparse MLA": 6}


def test_the_raw_h100_timelines_say_where_the_under_step_went(capsys):
    tm = _trace_model()
    res = REPO / "bench" / "results"
    run_path, raw = str(res / "hide-misses-2026-12-05-next-h100.jsonl"), str(
        res / "hide-misses-2026-12-05-next-traces-raw-h100.jsonl.xz")
    run, traces = tm.load(run_path, raw)
    pairs = tm.pair(run, traces)
    c, t, serial = pairs[0]
    assert (c["hit_rate"], t["point"]) == (0.8015, "2_b8_beside_ix1_rf_under")
    full = tm.full_hbm_before(traces, serial)
    assert full["order"] < serial["order"] and full["concurrency"] == 29
    timelines = dict(full=full, serial=serial, under=t)
    layer = {name: tm.on_path(x["all_kernels"]) for name, x in timelines.items()}
    for name, p in layer.items():  # the charges are the step
        ks = timelines[name]["all_kernels"]
        assert sum(p.values()) == pytest.approx(max(k[1] + k[2] for k in ks) - min(k[1] for k in ks))
    # Without overlap, RESOLVE is on the path whole; under it, range 1's indexer and range 0's attention
    # ran beneath it, so the path holds half the indexer and half the attention, and RESOLVE longer.
    assert layer["serial"]["RESOLVE"] > 0.9 * sum(k[2] for k in serial["kernels"] if k[0] == tm.RESOLVE)
    assert layer["under"]["indexer"] < 0.6 * layer["full"]["indexer"]
    assert layer["under"]["sparse MLA"] < 0.6 * layer["full"]["sparse MLA"]
    assert layer["under"]["RESOLVE"] > layer["serial"]["RESOLVE"]
    assert tm.main(run_path, raw, etas=(0.65,), path=True) == 0
    out = capsys.readouterr().out
    assert "| 131072 | 0.8015 | full HBM |" in out and "| 131072 | 0.8015 | 2_b8_beside_ix1_rf_under |" in out

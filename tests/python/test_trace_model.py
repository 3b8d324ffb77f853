"""bench/trace_model.py: a serving run's kernel timelines (serve_bench.py --trace) projected to other
fetch rates. Its arithmetic on hand-made timelines, and that it reads the committed H100 traces. No
GPU and no torch: it runs wherever the Python tests run."""

from __future__ import annotations

import pytest
from conftest import REPO, bench_module


def _trace_model():
    return bench_module("trace_model")


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
    assert tm.alone_us(trace, {"index_scores": 99.0, "mla": 3.0}) == {"index_scores": 40.0, "mla": 3.0}
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
    run = tmp_path / "run.jsonl"
    run.write_text('{"kind": "link", "h2d_gbps": 50}\n{"kind": "model", "record_bytes": 656}\n'
                   '{"kind": "curve", "context": 64, "concurrency": 4, "exposed_ms": 1.0}\n'
                   '{"kind": "curve", "context": 64, "concurrency": 4, "overlap": {"spec": "2_b8_beside_ix1_rf_under"}}\n')
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"kind": "trace", "point": "2_b8_beside_ix1_rf_under", "kernels": '
                      '[["ResolveKernel", 0, 10, 7, [8, 1, 1]]]}\n')
    assert tm.main(str(run), str(traces)) == 1
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

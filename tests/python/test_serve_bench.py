"""hisparse-bench serve (examples/engine/serve_bench.py, the DeepSeek-V3.2-class decode node).

The CPU smoke run drives the whole benchmark (daemon, closed loop with admissions and releases,
both modes, the exactness check, the tables) on a tiny model with the host backend, so the GPU
path's code cannot rot unseen. The GPU cases hold the Triton kernels (the fused indexer and the
sparse MLA over records read by index) to the torch references beside them (skipped without a GPU).
"""

from __future__ import annotations

import array
import json
import math

import pytest

torch = pytest.importorskip("torch")
hisparse = pytest.importorskip("hisparse")
serve_bench = pytest.importorskip("serve_bench")  # examples/engine, put on sys.path by conftest
dsv32 = pytest.importorskip("dsv32")
sparse_kernels = pytest.importorskip("sparse_kernels")
expert_gemm = pytest.importorskip("expert_gemm")


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_smoke_run_on_the_cpu(capsys):
    assert serve_bench.main(["--smoke"]) == 0
    lines = json_lines(capsys.readouterr().out)
    points = [x for x in lines if x["kind"] == "point"]
    modes = {x["mode"] for x in points}
    assert modes == {"baseline", "hisparse_B24", "hybrid_B24"}
    cap = {x["mode"]: x["capacity"] for x in lines if x["kind"] == "capacity"}
    assert cap["hisparse_B24"] > cap["baseline"], "the slot arena must fit more requests"
    for p in points:
        assert p["steps"] == serve_bench.SMOKE["steps"] - 1
        assert p["tokens_per_s"] > 0
        if p["mode"].startswith("hisparse"):
            assert 0 < p["hit_rate"] < 1, "the run must both hit and fetch"
    # Requests finished and were replaced inside the loop (outputs of 3-6 tokens, 5 timed steps).
    assert sum(p["finished"] for p in points) > 0
    ex = [x for x in lines if x["kind"] == "exactness"]
    assert ex and all(x["exact"] for x in ex)
    # The hybrid mode: all rows resident while the budget allows (the full-HBM step), then resident
    # and hisparse rows in one batch, exact against the all-hisparse run of the same schedule.
    hybrid = {p["concurrency"]: p for p in points if p["mode"] == "hybrid_B24" and p["context"] == 96}
    assert hybrid[1]["resident_rows"] == 1 and "hit_rate" not in hybrid[1]
    mixed = [n for n, p in hybrid.items() if 0 < p["resident_rows"] < n]
    assert mixed, "some point must mix resident and hisparse rows"
    assert any(x["mode"] == "hybrid_B24" and x["against"] == "hisparse_B24" and x["concurrency"] in mixed
               for x in ex)
    stops = {x["mode"]: x["limit"] for x in lines if x["kind"] == "stop"}
    assert stops["baseline"] == "HBM"
    # The length mix: clients of different lengths, every mode, exact where both ran.
    mix = [p for p in points if str(p["context"]).startswith("mix")]
    assert {p["mode"] for p in mix} == modes
    assert any(x["context"] == mix[0]["context"] for x in ex)
    assert all(48 <= p["mean_context"] <= 160 for p in mix)


def test_hit_rate_curve_and_the_overlap_on_the_cpu(capsys, monkeypatch):
    # The curve (issue 44): calibration, full HBM at hisparse's capacity, hisparse without and with
    # RESOLVE in row chunks (two), each exact against full HBM; one variant launches the second range's
    # RESOLVE beside the first range's attention (HS_RESOLVE_LAUNCH_BESIDE: in order on the host backend),
    # one also the first range's RESOLVE beside the other rows' indexer, with the indexer and top-k in
    # two parts (ix), and one chains three ranges' RESOLVE under the indexer's three parts, each RESOLVE
    # first and the grid indexer as its programmatic dependent (3/.../ix2/rf: in order on the host).
    argv = ["--smoke", "--hit-rates", "0.3,0.8", "--overlap",
            "2,2/b1/g2,2/main,2/b1/beside,2/b1/beside/ix2/asc,3/b1/beside/ix2/rf",
            "--overlap-min-rows", "2", "--calibrate-localities", "0,2,6"]
    chained = []
    plain = dsv32.Model._select_chained

    def counted(self, kv, l, st, iq, iw, plan, **kw):
        chained.append([seg[:2] for seg in plan.segments])
        return plain(self, kv, l, st, iq, iw, plan, **kw)

    monkeypatch.setattr(dsv32.Model, "_select_chained", counted)
    assert serve_bench.main(argv) == 0
    assert {len(s) for s in chained} == {2, 3}, "both ix variants took their path"
    assert all(s[0][0] == 0 and all(x[1] == y[0] < y[1] for x, y in zip(s, s[1:])) for s in chained)
    lines = json_lines(capsys.readouterr().out)
    cal = [x for x in lines if x["kind"] == "calibration"]
    assert len(cal) == 2 * 3 and all(0 <= x["hit_rate"] <= 1 for x in cal)
    cur = [x for x in lines if x["kind"] == "curve"]
    assert len(cur) == 2 * 2 * 6, "two contexts, two targets, six overlap variants"
    for c in cur:
        assert c["exact"] and c["identical"] == c["identical_overlap"] == c["sampled_steps"] > 0
        assert c["concurrency"] >= 6 and len(c["overlap"]["ranges"]) == int(c["overlap"]["spec"][0])
        assert 0 < c["hit_rate"] < 1 and c["ratio"] > 0 and c["ratio_overlap"] > 0
        assert c["step_ms_full"] == pytest.approx((c["step_ms_full_before"] + c["step_ms_full_after"]) / 2, abs=1e-3)
        # The ratios divide by the faster of the two full-HBM peaks, run first and last in the context.
        peaks = (c["baseline_peak_tokens_per_s_before"], c["baseline_peak_tokens_per_s_after"])
        assert c["baseline_peak_tokens_per_s"] == max(peaks)
        assert c["ratio_overlap"] == round(c["tokens_per_s_overlap"] / max(peaks), 3)
    points = [x for x in lines if x["kind"] == "point"]
    for ctx in {x["context"] for x in points}:
        order = [x["mode"] for x in points if x["context"] == ctx]
        assert order[0] == "baseline" and order[-1] == "baseline_after", order
    modes = {x["mode"] for x in points}
    assert modes == {"baseline", "baseline_after", "full_at_N", "full_at_N_after", "hisparse_B24", "hisparse_B24_overlap2", "hisparse_B24_overlap2_b1_g2",
                     "hisparse_B24_overlap2_main", "hisparse_B24_overlap2_b1_beside", "hisparse_B24_overlap2_b1_beside_ix2_asc",
                     "hisparse_B24_overlap3_b1_beside_ix2_rf"}
    # The ix variant fetched what plain beside fetched: the same selections, another launch order.
    by_spec = {(c["context"], c["target_hit_rate"], c["overlap"]["spec"]): c for c in cur}
    for (ctx, t, spec), c in by_spec.items():
        if spec == "2_b1_beside_ix2_asc":
            assert c["hit_rate_overlap"] == by_spec[(ctx, t, "2_b1_beside")]["hit_rate_overlap"]
    # A higher target asks for more locality, and more locality gives more hits (on these sizes).
    by = {(c["context"], c["target_hit_rate"]): c for c in cur}
    assert by[(96, 0.8)]["locality"] >= by[(96, 0.3)]["locality"]


def test_the_scores_are_dumped_for_the_topk_bench(capsys, tmp_path):
    # --dump-scores: each no-overlap hisparse point's last indexer scores, raw float32 rows of the score
    # buffer's width, -inf past a row's length: what hisparse-bench topk --scores reads.
    argv = ["--smoke", "--hit-rates", "0.8", "--overlap", "2/b1/beside", "--overlap-min-rows", "2",
            "--calibrate-localities", "0,6", "--dump-scores", str(tmp_path / "s")]
    assert serve_bench.main(argv) == 0
    lines = json_lines(capsys.readouterr().out)
    cur = [x for x in lines if x["kind"] == "curve"]
    files = sorted(tmp_path.glob("s-*.f32"))
    assert len(files) == len(cur) > 0, "one no-overlap hisparse point a curve point, calibrations excluded"
    for f in files:
        ctx, shape, loc = f.stem.split("-")[1:]
        rows, cols = (int(x) for x in shape.split("x"))
        assert ctx in {str(x["context"]) for x in cur} and loc.startswith("loc")
        data = array.array("f")
        data.frombytes(f.read_bytes())
        assert len(data) == rows * cols and rows >= 2
        for r in range(rows):
            row = data[r * cols:(r + 1) * cols]
            finite = [x for x in row if math.isfinite(x)]
            assert len(finite) >= 1 and all(x == -math.inf for x in row if not math.isfinite(x))
            n = len(finite)
            assert all(math.isfinite(x) for x in row[:n]), "a row's scores, then -inf past its length"


def test_the_hisparse_topk_through_the_chain_on_the_cpu(capsys, monkeypatch):
    # --topk hisparse: every selection through hs_topk (the CPU reference on the host), the chained
    # ranges' calls with their own batch sizes, every point exact against full HBM.
    calls = []
    plain = hisparse.topk

    def counted(scores, positions, **kw):
        calls.append(scores.shape[0])
        return plain(scores, positions, **kw)

    monkeypatch.setattr(hisparse, "topk", counted)
    argv = ["--smoke", "--topk", "hisparse", "--hit-rates", "0.8", "--overlap", "3/b1/beside/ix2/rf",
            "--overlap-min-rows", "2", "--calibrate-localities", "0,6"]
    assert serve_bench.main(argv) == 0
    lines = json_lines(capsys.readouterr().out)
    assert [x["topk"] for x in lines if x["kind"] == "model"] == ["hisparse"]
    cur = [x for x in lines if x["kind"] == "curve"]
    assert cur and all(c["exact"] and c["identical"] == c["identical_overlap"] == c["sampled_steps"] > 0 for c in cur)
    assert len(set(calls)) > 1, "the chain called it on ranges as well as on whole batches"


def test_under_launches_each_resolve_before_the_attention_it_hides_under(capsys, monkeypatch):
    # Overlap.under (issue 44): range c+1's RESOLVE is an ordinary launch that lets its dependents start
    # at once (early_dependents, not programmatic), and right after it comes range c's attention as a
    # chain of programmatic dependents; the last range's attention is an ordinary launch. On the host
    # backend the flags change nothing, so every point is exact; the order is what this holds.
    kv_backends = pytest.importorskip("kv_backends")
    events = []
    plain_mla = sparse_kernels.Kernels.sparse_mla
    plain_rows = kv_backends.HisparseKV.resolve_rows

    def mla(self, q, *a, chained=False, **kw):
        events.append(("attend", q.shape[0], chained))
        return plain_mla(self, q, *a, chained=chained, **kw)

    def rows(self, layer, st, a, b, bs, **kw):
        events.append(("resolve", b - a, kw.get("early_dependents", False), kw.get("programmatic", False)))
        return plain_rows(self, layer, st, a, b, bs, **kw)

    monkeypatch.setattr(sparse_kernels.Kernels, "sparse_mla", mla)
    monkeypatch.setattr(kv_backends.HisparseKV, "resolve_rows", rows)
    argv = ["--smoke", "--hit-rates", "0.8", "--overlap", "3/b1/beside/ix1/rf/under",
            "--overlap-min-rows", "2", "--calibrate-localities", "0,6"]
    assert serve_bench.main(argv) == 0
    cur = [x for x in json_lines(capsys.readouterr().out) if x["kind"] == "curve"]
    assert cur and all(c["exact"] and c["identical"] == c["identical_overlap"] == c["sampled_steps"] > 0 for c in cur)
    assert {c["overlap"]["spec"] for c in cur} == {"3_b1_beside_ix1_rf_under"}
    chained = [i for i, e in enumerate(events) if e[0] == "attend" and e[2]]
    assert chained, "the under schedule ran"
    for i in chained:  # each chained attention right after the RESOLVE it hides, an early ordinary launch
        assert events[i - 1][0] == "resolve" and events[i - 1][2:] == (True, False)
        assert events[i + 1][0] == "resolve" or events[i + 1] == ("attend", events[i + 1][1], False)
    early = [i for i, e in enumerate(events) if e[0] == "resolve" and e[2:] == (True, False)]
    assert all(events[i + 1][0] == "attend" and events[i + 1][2] for i in early)
    assert any(e[0] == "resolve" and e[2:] == (True, True) for e in events), "range 0's RESOLVE first, beside the indexer"


def test_the_append_goes_last_before_an_indexer_that_runs_beside_it(capsys, monkeypatch):
    # Overlap.append_early (ae): each layer's append is the last launch before its first indexer,
    # which is launched as the append's programmatic dependent (after_resolve: launch_pdl, its last
    # program waiting for the append), so that it runs beside the append; the step's logits stay
    # exact. Without ae the append comes before the index keys' writes and the indexer is ordinary.
    kv_backends = pytest.importorskip("kv_backends")
    events = []
    plain_append = kv_backends.HisparseKV.append
    plain_index = sparse_kernels.Kernels.index_scores

    def append(self, layer, rec, st):
        events.append(("append", layer))
        return plain_append(self, layer, rec, st)

    def index(self, q, *a, after_resolve=False, **kw):
        events.append(("indexer", q.shape[0], after_resolve))
        return plain_index(self, q, *a, after_resolve=after_resolve, **kw)

    monkeypatch.setattr(kv_backends.HisparseKV, "append", append)
    monkeypatch.setattr(sparse_kernels.Kernels, "index_scores", index)
    for spec in ("2/b1/beside/ix1/rf/under/ae", "2/b1/beside/ae", "2/b1/beside/ix1/rf/under"):
        events.clear()
        argv = ["--smoke", "--hit-rates", "0.8", "--overlap", spec, "--overlap-min-rows", "2",
                "--calibrate-localities", "0,6"]
        assert serve_bench.main(argv) == 0
        cur = [x for x in json_lines(capsys.readouterr().out) if x["kind"] == "curve"]
        assert cur and all(c["exact"] and c["identical"] == c["identical_overlap"] == c["sampled_steps"] > 0
                           for c in cur), spec
        assert cur[0]["overlap"]["spec"] == spec.replace("/", "_")
        after = [events[i + 1] for i, e in enumerate(events) if e[0] == "append"]
        assert after and all(e[0] == "indexer" for e in after), spec  # every mode: the indexer follows
        programmatic = {e[2] for e in after}
        # With ae, every append of an overlapped step is followed by a programmatic indexer (the
        # curve's no-overlap points and the calibration run their steps without a plan: ordinary).
        assert programmatic == ({False, True} if spec.endswith("ae") else {False}), spec


def test_overlap_cuts_a_batch_into_row_ranges():
    o = dsv32.Overlap(chunks=4, min_rows=4)
    assert o.ranges(29) == [(0, 7), (7, 14), (14, 22), (22, 29)]
    g = dsv32.Overlap.parse("4/b32/p0/g2/main")
    assert (g.chunks, g.max_blocks, g.priority, g.growth, g.side_stream) == (4, 32, 0, 2.0, False)
    assert g.tag == "4_b32_p0_g2_main"
    s = dsv32.Overlap.parse("4/b16/beside")
    assert (s.beside, s.side_stream, s.max_blocks, s.tag) == (True, False, 16, "4_b16_beside")
    x = dsv32.Overlap.parse("4/b16/beside/ix/asc")
    assert (x.indexer_chain, x.indexer_ctas, x.ascending, x.tag) == (1, 1, True, "4_b16_beside_ix1_asc")
    y = dsv32.Overlap.parse("4/b16/beside/ix3/ic2")
    assert (y.indexer_chain, y.indexer_ctas, y.tag) == (3, 2, "4_b16_beside_ix3_ic2")
    z = dsv32.Overlap.parse("4/b16/beside/ix1/iu4/asc")
    assert (z.indexer_chain, z.indexer_unroll, z.tag) == (1, 4, "4_b16_beside_ix1_iu4_asc")
    f = dsv32.Overlap.parse("4/b16/beside/ix3/rf")
    assert (f.indexer_chain, f.resolve_first, f.tag) == (3, True, "4_b16_beside_ix3_rf")
    u = dsv32.Overlap.parse("2/b16/beside/ix1/rf/under")
    assert (u.under, u.tag) == (True, "2_b16_beside_ix1_rf_under") and not f.under
    e = dsv32.Overlap.parse("2/b8/beside/ix1/rf/under/ae")
    assert (e.append_early, e.tag) == (True, "2_b8_beside_ix1_rf_under_ae") and not u.append_early
    w = dsv32.Overlap.parse("4/b16/beside/asc/cw8")
    assert (w.consumer_warps, w.tag) == (8, "4_b16_beside_asc_cw8")
    assert x.consumer_warps == 0, "the library's choice unless asked"
    r = dsv32.Overlap.parse("2/b8/beside/ix1/rf/under/ae/pw1/pb16/pg2048")
    assert (r.prewarm, r.prewarm_blocks, r.prewarm_granule_kib) == (1, 16, 2048)
    assert r.tag == "2_b8_beside_ix1_rf_under_ae_pw1_pb16_pg2048"
    assert (e.prewarm, e.prewarm_blocks) == (-1, 0), "nothing read ahead unless asked"
    q = dsv32.Overlap.parse("2/b8/beside/ix1/rf/under/ae/pw1/pa/ps4")
    assert (q.prewarm_attention, q.prewarm_stride, q.tag) == (True, 4, "2_b8_beside_ix1_rf_under_ae_pw1_pa_ps4")
    assert x.ranges(29) == [(0, 7), (7, 14), (14, 21), (21, 29)], "the 8-row range last"
    for bad in ("4/b16/ix", "4/b16/beside/ix0", "4/b16/beside/ixa", "4/b16/beside/ic0", "4/beside/ix",
                "4/b16/beside/cw17", "4/b16/beside/cw", "4/b16/beside/cw-1", "4/b16/beside/rf", "4/b16/under",
                "4/b16/beside/pw", "4/b16/beside/pw-1", "4/b16/beside/pbx", "4/b16/beside/pa", "4/b16/pw1/pa",
                "4/b16/beside/pw1/ps0", "4/b16/beside/pm"):
        with pytest.raises(ValueError):
            dsv32.Overlap.parse(bad)

    assert [b - a for a, b in g.ranges(30)] == [4, 4, 6, 16], "a small first chunk, then growing"
    assert o.ranges(8) == [(0, 4), (4, 8)]
    assert o.ranges(7) == [(0, 7)], "a batch below two chunks of min_rows is not cut"
    assert o.ranges(1) == [(0, 1)]
    assert serve_bench.locality_for([(0, 0.1), (1, 0.5), (2, 0.4), (3, 0.9)], 0.7) == pytest.approx(2.5)
    assert serve_bench.locality_for([(0, 0.1), (1, 0.5)], 0.05) == 0
    assert serve_bench.locality_for([(0, 0.1), (1, 0.5)], 0.95) == 1


def test_an_indexer_chain_plans_segments_and_attention_launches():
    """Overlap.indexer_chain's schedule (Model._chunk_plan): with 4 ranges of a 29-row batch, j = 1
    takes the indexer in [range 0 | the rest] and attention in [range 0 | 1 | 2 | 3]; j = 3 (chained)
    takes the indexer in [0 | 1 | 2 | 3] and attention in [ranges 0-2 | 3]. Each part's batch size is
    its rows below the step's, on the device."""
    cfg = dsv32.V32Config(**{**dsv32.SMOKE, "layers": 1})
    model = dsv32.Model(cfg, "cpu", fp8_weights=False, kernels=sparse_kernels.Kernels(False))
    kv = type("KV", (), {"resolve_rows": None})()
    st = type("St", (), {"batch_size": torch.tensor([20], dtype=torch.int32)})()

    def spans(parts):
        return [(a, b, int(bs)) for a, b, bs in parts]

    model.overlap = dsv32.Overlap.parse("4/b16/beside/ix")
    p = model._chunk_plan(kv, st, 29)
    assert spans(p.chunks) == [(0, 7, 7), (7, 14, 7), (14, 22, 6), (22, 29, 0)]
    assert spans(p.segments) == [(0, 7, 7), (7, 29, 13)]
    assert spans(p.attend) == [(0, 7, 7), (7, 14, 7), (14, 22, 6), (22, 29, 0)]
    model.overlap = dsv32.Overlap.parse("4/b16/beside/ix3")
    p = model._chunk_plan(kv, st, 29)
    assert spans(p.segments) == [(0, 7, 7), (7, 14, 7), (14, 22, 6), (22, 29, 0)]
    assert spans(p.attend) == [(0, 22, 20), (22, 29, 0)]
    model.overlap = dsv32.Overlap.parse("4/b16/beside/ix9")  # more than the ranges allow: chained
    assert spans(model._chunk_plan(kv, st, 29).attend) == [(0, 22, 20), (22, 29, 0)]
    model.overlap = dsv32.Overlap.parse("4/b16/beside")
    p = model._chunk_plan(kv, st, 29)
    assert p.segments == [] and spans(p.attend) == spans(p.chunks)


def test_length_mix_is_log_uniform_and_fixed_per_client():
    lens = serve_bench.slot_contexts("mix", 200)
    assert lens[:10] == serve_bench.slot_contexts("mix", 10), "a client's length does not depend on N"
    assert min(lens) >= 8192 and max(lens) <= 131072
    assert sum(x < 32768 for x in lens) / 200 == pytest.approx(0.5, abs=0.05)  # log-uniform: half below 32k


def test_modes_run_in_the_order_given_and_unknown_ones_are_refused(capsys):
    # A graph can launch its kernels more slowly in a process that has not yet run hisparse's, so
    # the baseline may be asked to run last (bench/RESULTS.md, "Full HBM's launch gaps").
    assert serve_bench.main(["--smoke", "--modes", "hisparse,baseline"]) == 0
    lines = json_lines(capsys.readouterr().out)
    points = [x for x in lines if x["kind"] == "point"]
    for ctx in {x["context"] for x in points}:
        order = [x["mode"] for x in points if x["context"] == ctx]
        assert order[0] == "hisparse_B24", order
        assert order.index("baseline") > max(i for i, m in enumerate(order) if m == "hisparse_B24"), order
    ex = [x for x in lines if x["kind"] == "exactness"]
    assert ex and all(x["exact"] for x in ex)
    assert {x["against"] for x in ex if x["mode"] == "hisparse_B24"} == {"baseline"}
    # A second baseline runs after hisparse as baseline_after; the ratio takes the faster of the two.
    assert serve_bench.main(["--smoke", "--modes", "baseline,hisparse,baseline"]) == 0
    out = capsys.readouterr().out
    points = [x for x in json_lines(out) if x["kind"] == "point" and x["context"] == 96]
    runs = [x["mode"] for x in points if not x["mode"].startswith("hybrid")]
    assert [m for i, m in enumerate(runs) if i == 0 or runs[i - 1] != m] == ["baseline", "hisparse_B24", "baseline_after"]
    assert runs.count("baseline") == runs.count("baseline_after")
    ex = [x for x in json_lines(out) if x["kind"] == "exactness" and x["mode"] == "baseline_after"]
    assert ex and all(x["exact"] and x["against"] == "baseline" for x in ex), "full HBM again, bit for bit"
    best = max(x["tokens_per_s"] for x in points if x["mode"].startswith("baseline"))
    assert f"context 96: peak tokens/s baseline {best:.0f}," in out
    with pytest.raises(SystemExit):
        serve_bench.main(["--smoke", "--modes", "baseline,hisprase"])
    assert "unknown mode(s) hisprase" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_bench.main(["--smoke", "--modes", "baseline,baseline,baseline"])
    assert "baseline at most twice" in capsys.readouterr().err


def test_capacity_counts_the_index_keys_in_both_modes():
    cfg = dsv32.V32Config(layers=8)
    fmt = dsv32.record_format("bf16", cfg)
    cap = serve_bench.capacity(cfg, fmt, 131072, 2048, 2048, budget=6 << 30, pool=1 << 40)
    per_token = 8 * (131072 + 2049)
    assert cap["baseline"]["per_request_hbm"] > per_token * (1152 + 132)
    assert cap["hisparse"]["per_request_hbm"] > per_token * 132  # the keys stay in HBM
    assert cap["hisparse"]["capacity"] > 4 * cap["baseline"]["capacity"]
    small_pool = serve_bench.capacity(cfg, fmt, 131072, 2048, 2048, budget=6 << 30, pool=4 << 30)
    assert small_pool["hisparse"]["limit"] == "host pool"


def _gpu_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if sparse_kernels.triton is None:
        pytest.skip("no triton")


_MLA_CASES = [("bf16", next(c for c in sparse_kernels.Kernels.MLA_CONFIGS if c[0] == way)) for way in
              ("fused", "gathered")] + [("fp8", c) for c in sparse_kernels.Kernels.MLA_CONFIGS]


@pytest.mark.parametrize("records,config", _MLA_CASES, ids=lambda v: v if isinstance(v, str) else
                         sparse_kernels.Kernels.mla_tag(v).replace(" ", "-"))
def test_triton_sparse_mla_matches_the_reference(records, config):
    _gpu_or_skip()
    dev = torch.device("cuda")
    cfg = dsv32.V32Config(layers=1)
    fmt = dsv32.record_format(records, cfg)
    g = torch.Generator(device=dev).manual_seed(3)
    M, k, n, stride = 5, 2048, 9000, fmt.record_bytes + 48  # a padded stride, as the slot arena has
    recs = torch.zeros(n, stride, dtype=torch.uint8, device=dev)
    recs[:, :fmt.record_bytes] = fmt.encode(torch.randn(n, 576, generator=g, device=dev).to(torch.bfloat16))
    q = torch.randn(M, cfg.heads, 576, generator=g, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(n, generator=g, device=dev)[:k] for _ in range(M)])
    idx[1, 100:] = -1  # padding in one row
    bs = torch.tensor([4], dtype=torch.int32, device=dev)  # row 4 is past the batch: untouched
    out_t = torch.full((M, cfg.heads, 512), 7.0, dtype=torch.bfloat16, device=dev)
    out_r = torch.empty_like(out_t)
    scale = 1.0 / 24.0
    K = sparse_kernels.Kernels(True)
    K.mla_config = config
    K.sparse_mla(q, recs, idx, stride, fmt, bs, out_t, scale)
    sparse_kernels.Kernels(False).sparse_mla(q, recs, idx, stride, fmt, bs, out_r, scale)
    assert torch.all(out_t[4] == 7.0), "a row past *batch_size was written"
    torch.testing.assert_close(out_t[:4].float(), out_r[:4].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("way", ["fused", "gathered"])
def test_triton_sparse_mla_in_row_chunks_equals_one_launch(way):
    # The overlap attends row ranges as their RESOLVE finishes, with the whole batch's split count:
    # every row's output must equal one launch over the batch bit for bit (the exactness it keeps).
    _gpu_or_skip()
    dev = torch.device("cuda")
    cfg = dsv32.V32Config(layers=1)
    fmt = dsv32.record_format("fp8", cfg)
    g = torch.Generator(device=dev).manual_seed(5)
    M, k, n = 29, 2048, 20000
    recs = fmt.encode(torch.randn(n, 576, generator=g, device=dev).to(torch.bfloat16))
    q = torch.randn(M, cfg.heads, 576, generator=g, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(n, generator=g, device=dev)[:k] for _ in range(M)]).to(torch.int32)
    idx[3, 1000:] = -1
    K = sparse_kernels.Kernels(True)
    K.mla_config = next(c for c in K.MLA_CONFIGS if c[0] == way)
    whole = torch.empty(M, cfg.heads, 512, dtype=torch.bfloat16, device=dev)
    K.sparse_mla(q, recs, idx, fmt.record_bytes, fmt, torch.tensor([M], dtype=torch.int32, device=dev), whole, 0.05)
    splits = K.mla_splits(M, cfg.heads, k)
    for chained in (False, True):  # chained: each kernel a programmatic dependent (Overlap.under)
        parts = torch.empty_like(whole)
        for a, b in dsv32.Overlap(chunks=4).ranges(M):
            bs = torch.tensor([b - a], dtype=torch.int32, device=dev)
            K.sparse_mla(q[a:b], recs, idx[a:b], fmt.record_bytes, fmt, bs, parts[a:b], 0.05, splits=splits,
                         chained=chained)
        assert torch.equal(parts, whole), f"chained={chained}"



def test_triton_index_scores_match_the_reference():
    _gpu_or_skip()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(4)
    M, H, D, T = 3, 64, 128, 5000
    keys, ks = dsv32.quantize_keys(torch.randn(M, T, D, generator=g, device=dev), True)
    q = (torch.randn(M, H, D, generator=g, device=dev)).to(torch.float8_e4m3fn)
    w = torch.rand(M, H, generator=g, device=dev)
    seq = torch.tensor([5000, 1234, 77], dtype=torch.int32, device=dev)
    bs = torch.tensor([2], dtype=torch.int32, device=dev)
    out_t = torch.full((M, T), 5.0, device=dev)
    out_r = torch.empty_like(out_t)
    # The keys as a pool: row b's tokens from entry base[b] (rows in reverse order, a gap between).
    pool_k = torch.zeros(M * T + 1000, D, dtype=keys.dtype, device=dev)
    pool_s = torch.zeros(M * T + 1000, device=dev)
    base = torch.tensor([(M - 1 - b) * T + 500 for b in range(M)], dtype=torch.int64, device=dev)
    for b_ in range(M):
        pool_k.view(torch.uint8)[base[b_]:base[b_] + T] = keys[b_].view(torch.uint8)
        pool_s[base[b_]:base[b_] + T] = ks[b_]
    sparse_kernels.Kernels(True).index_scores(q, w, pool_k, pool_s, seq, bs, out_t, base)
    sparse_kernels.Kernels(False).index_scores(q, w, pool_k, pool_s, seq, bs, out_r, base)
    # And the same scores as plain torch, from the unpooled keys.
    direct = ((torch.einsum("bhd,btd->bht", q.float(), keys.float()).clamp(min=0) * w.unsqueeze(-1)).sum(1) * ks)
    torch.testing.assert_close(out_t[0], direct[0], rtol=1e-3, atol=1e-3)
    assert torch.all(out_t[2] == 5.0), "a row past *batch_size was written"
    assert torch.all(torch.isinf(out_t[1, 1234:])) and not torch.isinf(out_t[1, :1234]).any()
    torch.testing.assert_close(out_t[:2], out_r[:2], rtol=1e-3, atol=1e-3)
    # The selection the engine makes from them: the same top-k sets.
    a = set(out_t[0].topk(256).indices.tolist())
    b = set(out_r[0].topk(256).indices.tolist())
    assert len(a & b) >= 250
    # Launched as the programmatic dependent of the kernel before it, its last program waiting for
    # that kernel (after_resolve, Overlap.resolve_first): the same bits.
    out_p = torch.full((M, T), 5.0, device=dev)
    sparse_kernels.Kernels(True).index_scores(q, w, pool_k, pool_s, seq, bs, out_p, base, after_resolve=True)
    torch.cuda.synchronize()
    assert torch.equal(out_p, out_t)


def _serving_score_rows(device, seed):
    """Score rows at the serving shapes, as the overlap's top-k sees them: (M, T, edges, ranges,
    scores) for 128k (29 rows in ranges of 7-8 rows, and 7 + 22) and 32k (82 rows in ranges of
    24-29, and 24 + 58), with the -inf tail of a shorter row as the indexer writes it and one row
    of fewer than k finite scores."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    for M, T, edges in ((29, 131072, [0, 7, 14, 22, 29]), (82, 32768, [0, 24, 53, 82])):
        scores = torch.randn(M, T, generator=g, device=dev)
        scores[3, T // 2:] = float("-inf")
        scores[edges[1] + 1, 1000:] = float("-inf")  # fewer than k finite scores: padding selected
        yield M, T, edges, list(zip(edges, edges[1:])) + [(edges[1], M)], scores


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_topk_of_row_ranges_equals_one_call(device):
    """Overlap.indexer_chain takes the top-k of a batch in parts (ranges, then the rest). The selections
    are exact only if torch.topk's output for a row (its values and their order, unsorted) does not
    depend on the rows beside it in the call: held here at the serving shapes (128k: 29 rows in
    ranges of 7-8 rows and 7 + 22; 32k: 82 rows in ranges of 24-29 and 24 + 58), with -inf tails of
    shorter rows as the indexer writes them."""
    for M, T, edges, ranges, scores in _serving_score_rows(device, 11):
        whole_v, whole_i = scores.topk(2048, dim=1, sorted=False)
        for a, b in ranges:
            v, i = scores[a:b].topk(2048, dim=1, sorted=False)
            assert torch.equal(i, whole_i[a:b]) and torch.equal(v, whole_v[a:b]), (M, a, b)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_hisparse_topk_of_row_ranges_equals_one_call_and_torch(device):
    """The engine's default top-k (Model.topk "hisparse": hs_topk, the CUDA kernel on a GPU, the CPU
    reference on a CPU) at the same serving shapes: a range's lists equal the whole call's, rows past
    the batch size get -1, and each row selects the set torch.topk selects (random scores: no ties),
    ascending, padded with -1 where a row holds fewer than k finite scores."""
    for M, T, edges, ranges, scores in _serving_score_rows(device, 12):
        dev = scores.device
        seq = torch.full((M,), T, dtype=torch.int32, device=dev)
        seq[5] = 3000  # a row cut by its length: what lies past it is never read
        scores[5, 3000:] = float("inf")
        bs = torch.tensor([M - 2], dtype=torch.int32, device=dev)
        whole = torch.full((M, 2048), 7, dtype=torch.int32, device=dev)
        hisparse.topk(scores, whole, seq_lens=seq, batch_size=bs)
        assert torch.equal(whole[M - 2:].cpu(), torch.full((2, 2048), -1, dtype=torch.int32))
        for a, b in ranges:
            part = torch.full((b - a, 2048), 9, dtype=torch.int32, device=dev)
            n = torch.clamp(bs - a, min=0, max=b - a).to(torch.int32)
            hisparse.topk(scores[a:b], part, seq_lens=seq[a:b], batch_size=n)
            assert torch.equal(part, whole[a:b]), (M, a, b)
        for i in (0, 3, 5, edges[1] + 1, M - 3):
            row = scores[i, :int(seq[i])]
            v, idx = row.topk(min(2048, row.numel()), sorted=False)
            want = torch.sort(idx[torch.isfinite(v)].to(torch.int32)).values
            got = whole[i]
            assert torch.equal(got[:want.numel()], want), (M, i)
            assert bool((got[want.numel():] == -1).all()), (M, i)


def test_triton_persistent_index_scores_equal_the_grid_kernel():
    """The indexer on a grid resident at once (Overlap.indexer_chain's) writes the same bits as the
    grid kernel, for rows taken as a slice of a larger buffer, any grid size, and rows past *bs left
    alone."""
    _gpu_or_skip()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(6)
    M, H, D, T = 6, 64, 128, 9000
    keys, ks = dsv32.quantize_keys(torch.randn(M * T, D, generator=g, device=dev), True)
    q = torch.randn(M, H, D, generator=g, device=dev).to(torch.float8_e4m3fn)
    w = torch.rand(M, H, generator=g, device=dev)
    seq = torch.tensor([9000, 4321, 77, 9000, 128, 8999], dtype=torch.int32, device=dev)
    base = torch.arange(M, dtype=torch.int64, device=dev) * T
    K = sparse_kernels.Kernels(True)
    whole = torch.full((M, T), 5.0, device=dev)
    K.index_scores(q, w, keys, ks, seq, torch.tensor([M], dtype=torch.int32, device=dev), whole, base)
    a = 2  # rows [2, 6) of the buffer, of which the first 3 are in the batch
    for ctas, unroll in ((1, 1), (7, 1), (264, 1), (1, 4), (7, 4), (264, 4), (5, 3)):
        part = torch.full((M, T), 5.0, device=dev)
        K.index_scores(q[a:], w[a:], keys, ks, seq[a:], torch.tensor([3], dtype=torch.int32, device=dev), part[a:],
                       base[a:], ctas=ctas, unroll=unroll)
        assert torch.equal(part[a:a + 3], whole[a:a + 3]), (ctas, unroll)
        assert torch.all(part[:a] == 5.0) and torch.all(part[a + 3:] == 5.0), "a row outside the slice's batch"
    none = torch.full((M, T), 5.0, device=dev)  # a batch of none: nothing written, whatever the unroll
    K.index_scores(q[a:], w[a:], keys, ks, seq[a:], torch.tensor([0], dtype=torch.int32, device=dev), none[a:],
                   base[a:], ctas=7, unroll=4)
    assert torch.all(none == 5.0)


def test_expert_gemm_tiles_follow_the_rows_and_refuse_odd_shapes():
    assert [expert_gemm.block_m(c) for c in (1, 2, 16, 17, 21, 33, 64, 200)] == [16, 16, 16, 32, 32, 64, 64, 64]
    x = torch.zeros(4 * 3, 100)
    with pytest.raises(ValueError):  # K = 100 is no multiple of a 128 tile
        expert_gemm.grouped_fp8(x, torch.zeros(4, 64, 100), 1.0, 3)
    with pytest.raises(ValueError):  # x holds 2 rows an expert, not 3
        expert_gemm.grouped_fp8(torch.zeros(8, 128), torch.zeros(4, 64, 128), 1.0, 3)


@pytest.mark.parametrize("cap", [1, 8, 21])
def test_triton_expert_gemm_matches_fp32(cap):
    """expert_gemm.grouped_fp8, every config choose_gemm tries, against the fp32 product of the same
    fp8 operands; each expert reads its own rows and writes only them."""
    _gpu_or_skip()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    E, N, K = 4, 256, 512
    w = torch.randn(E, N, K, generator=g, device=dev).to(torch.float8_e4m3fn)
    x = torch.randn(E * cap, K, generator=g, device=dev).to(torch.float8_e4m3fn)
    scale = K ** -0.5
    ref = torch.bmm(x.float().view(E, cap, K), w.float().transpose(1, 2)).reshape(E * cap, N) * scale
    for config in expert_gemm.CONFIGS:
        y = expert_gemm.grouped_fp8(x, w, scale, cap, config)
        assert y.dtype == torch.bfloat16 and y.shape == (E * cap, N)
        torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2, msg=lambda m: f"{config}: {m}")


@pytest.mark.parametrize("way", ["fused", "gathered"])
def test_triton_sparse_mla_reads_two_allocations_through_one_base(way):
    """The hybrid mode's rows: resident rows read the HBM cache, hisparse rows the slot arena, both as
    offsets in 16-byte units from the arena (negative ones included); -1 stays padding."""
    _gpu_or_skip()
    dev = torch.device("cuda")
    cfg = dsv32.V32Config(layers=1)
    fmt = dsv32.record_format("fp8", cfg)
    g = torch.Generator(device=dev).manual_seed(5)
    R, k = fmt.record_bytes, 2048
    cache = fmt.encode(torch.randn(6000, 576, generator=g, device=dev).to(torch.bfloat16)).contiguous()
    arena = fmt.encode(torch.randn(5000, 576, generator=g, device=dev).to(torch.bfloat16)).contiguous()
    ia = torch.randperm(6000, generator=g, device=dev)[:k].unsqueeze(0)
    ib = torch.randperm(5000, generator=g, device=dev)[:k].unsqueeze(0)
    ib[0, 7] = -1
    shift = cache.data_ptr() - arena.data_ptr()  # 16-byte units, as HybridKV passes them
    off = torch.cat([ia * (R // 16) + shift // 16, (ib * (R // 16)).masked_fill(ib == -1, -1)])
    q = torch.randn(2, cfg.heads, 576, generator=g, device=dev).to(torch.bfloat16)
    bs = torch.tensor([2], dtype=torch.int32, device=dev)
    out_t = torch.empty(2, cfg.heads, 512, dtype=torch.bfloat16, device=dev)
    out_r = torch.empty_like(out_t)
    K = sparse_kernels.Kernels(True)
    K.mla_config = next(c for c in K.MLA_CONFIGS if c[0] == way)
    K.sparse_mla(q, arena, off, 16, fmt, bs, out_t, 0.05)
    sparse_kernels.Kernels(False).sparse_mla(q, [(cache, ia, R), (arena, ib, R)], off, 16, fmt, bs, out_r, 0.05)
    torch.testing.assert_close(out_t.float(), out_r.float(), rtol=2e-2, atol=2e-2)

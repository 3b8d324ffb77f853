"""The example engine (examples/engine): hisparse's logits equal the all-in-HBM baseline's bit for
bit at every decode step. The CPU case runs the host backend eagerly; the GPU cases replay the
decode step as a CUDA graph with the CUDA backend (skipped without a GPU)."""

from __future__ import annotations

import pathlib

import pytest

import hisparse

torch = pytest.importorskip("torch")
engine = pytest.importorskip("engine")  # examples/engine, put on sys.path by conftest


def run_both(daemon, device, fmt_name, *, batch, context, k, slots, steps, graph=True, share=1, prefetch=False,
             layers=None):
    small = dict(engine.SMALL)
    if layers is not None:
        small["n_layers"] = layers
    cfg = engine.ModelConfig(seed=11, index_share=share, **small)
    model = engine.SparseDecoder(cfg, device)
    fmt = engine.record_format(fmt_name, cfg)
    base = engine.run_mode(model, fmt, batch=batch, prompt_len=context, k=k, steps=steps, seed=5,
                           use_graph=graph, probe_steps=4)
    cuda = device.type == "cuda"
    anchors = [cfg.anchor(l) for l in range(cfg.n_layers)] if share > 1 else None
    with hisparse.Session(daemon, num_layers=cfg.n_layers, record_bytes=fmt.record_bytes, k=k, slots=slots,
                          max_requests=batch, gpu=0 if cuda else -1, backend="cuda" if cuda else "host",
                          layer_anchor=anchors) as s:
        hs = engine.run_mode(model, fmt, batch=batch, prompt_len=context, k=k, steps=steps, seed=5, session=s,
                             use_graph=graph, probe_steps=4, prefetch=prefetch)
        stats = s.stats()
    for i in range(steps):
        assert torch.equal(base.logits[i], hs.logits[i]), f"logits differ at decode step {i}"
    assert torch.equal(base.tokens, hs.tokens)
    assert hs.misses > 0 and hs.hits > 0, "the run must exercise both hits and fetches"
    assert stats.session_requests == 0, "run_mode releases its requests"
    assert base.logits.std() > 0
    return base, hs


def test_engine_exact_on_the_host_backend(daemon):
    run_both(daemon, torch.device("cpu"), "bf16", batch=2, context=300, k=16, slots=16, steps=6)


@pytest.fixture
def gpu(daemon):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        with hisparse.Session(daemon, num_layers=1, record_bytes=16, k=1, slots=1, max_requests=1, gpu=0,
                              backend="cuda"):
            pass
    except hisparse.Unimplemented as e:
        pytest.skip(f"libhisparse built without CUDA: {e}")
    return torch.device("cuda", 0)


@pytest.mark.parametrize("fmt_name,factor", [("bf16", 1), ("bf16", 2), ("fp8", 1)])
def test_engine_exact_in_a_cuda_graph(daemon, gpu, fmt_name, factor):
    base, hs = run_both(daemon, gpu, fmt_name, batch=3, context=2500, k=64, slots=64 * factor, steps=40)
    assert hs.used_graph and base.used_graph


@pytest.mark.parametrize("graph", [False, True])
def test_shared_indexer_prefetch_exact(daemon, gpu, graph):
    """Shared-index mode (layers 1-2 reuse layer 0's selection, 4-5 reuse 3's): with exact prefetch on
    a side stream the logits still equal the baseline's bit for bit, eager and as a CUDA graph."""
    base, hs = run_both(daemon, gpu, "bf16", batch=3, context=2500, k=64, slots=64, steps=30, graph=graph,
                        share=3, prefetch=True, layers=6)
    assert hs.used_graph == graph


def test_shared_indexer_prefetch_on_the_host_backend(daemon):
    run_both(daemon, torch.device("cpu"), "bf16", batch=2, context=300, k=16, slots=16, steps=5, share=2,
             prefetch=True, layers=4)


def run_speculative(daemon, device, fmt_name, *, n, batch, context, k, steps, graph=True):
    """MTP-style decoding (examples/engine/mtp.py): n drafts a step, random acceptance; hisparse's
    logits of all n + 1 query tokens equal the baseline's at every step, and so do the tokens."""
    mtp = pytest.importorskip("mtp")
    cfg = engine.ModelConfig(seed=13, **engine.SMALL)
    model = engine.SparseDecoder(cfg, device)
    fmt = engine.record_format(fmt_name, cfg)
    base = mtp.run_mtp(model, fmt, batch=batch, prompt_len=context, k=k, steps=steps, draft_tokens=n, seed=7,
                       use_graph=graph)
    cuda = device.type == "cuda"
    with hisparse.Session(daemon, num_layers=cfg.n_layers, record_bytes=fmt.record_bytes, k=k, slots=(n + 2) * k,
                          max_requests=batch, gpu=0 if cuda else -1, backend="cuda" if cuda else "host",
                          draft_tokens=n) as s:
        hs = mtp.run_mtp(model, fmt, batch=batch, prompt_len=context, k=k, steps=steps, draft_tokens=n, seed=7,
                         session=s, use_graph=graph)
        stats = s.stats()
    assert base.logits.shape == (steps, batch, n + 1, cfg.vocab)
    for i in range(steps):
        assert torch.equal(base.logits[i], hs.logits[i]), f"logits differ at speculative step {i}"
    assert torch.equal(base.tokens, hs.tokens) and torch.equal(base.accepted, hs.accepted)
    # Random acceptance both keeps and rejects drafts, so rejected records get rewritten.
    assert (base.accepted < n + 1).any() and (base.accepted > 1).any()
    assert hs.misses > 0 and hs.hits > 0 and stats.session_requests == 0
    return base, hs


@pytest.mark.parametrize("n", [1, 3])
def test_speculative_decoding_exact_on_the_host_backend(daemon, n):
    run_speculative(daemon, torch.device("cpu"), "bf16", n=n, batch=2, context=300, k=16, steps=8)


@pytest.mark.parametrize("fmt_name,n", [("bf16", 1), ("bf16", 3), ("fp8", 3)])
def test_speculative_decoding_exact_in_a_cuda_graph(daemon, gpu, fmt_name, n):
    base, hs = run_speculative(daemon, gpu, fmt_name, n=n, batch=3, context=2500, k=64, steps=30)
    assert hs.used_graph and base.used_graph


def test_run_engine_smoke(daemon, tmp_path):
    """examples/engine/run_engine.py end to end on the host backend (its GPU runs use the same code),
    plain and speculative: every run exact, the JSON rows say so."""
    run_engine = pytest.importorskip("run_engine")
    out = tmp_path / "rows.json"
    rc = run_engine.main(["--device", "cpu", "--model", "small", "--configs", "2x200", "--k", "16", "--steps", "5",
                          "--draft-tokens", "0,2", "--slots-factor", "0", "--daemon", daemon.address, "--json", str(out)])
    import json
    rows = json.loads(out.read_text())
    assert rc == 0 and [r["draft_tokens"] for r in rows] == [0, 2] and all(r["exact"] for r in rows)
    assert [r["slots"] for r in rows] == [32, 64]


def run_sglang_mode(daemon, tmp_path, extra, min_retracted=2):
    """run_engine.py --adapter sglang: HisparsedCoordinator driven as SGLang's scheduler and model
    runner drive HiSparseCoordinator (examples/engine/sglang_mode.py) over a mix of long and short
    requests with staggered arrivals, early finishes, retractions (one re-admitted by a fresh
    prefill, one aborted while retracted) and a PD import, through SGLang's two index spaces
    (examples/engine/sglang_standins.py); every (request, decode step) row's logits equal SGLang's
    full-pool decode bit for bit, and the fewest free physical KV slots is larger with hisparse."""
    run_engine = pytest.importorskip("run_engine")
    out = tmp_path / "rows.json"
    rc = run_engine.main(["--adapter", "sglang", "--model", "small", "--daemon", daemon.address, "--json", str(out)]
                         + extra)
    import json
    rows = json.loads(out.read_text())
    assert rows and all(r["adapter"] == "sglang" and r["exact"] for r in rows), rows
    assert rc == 0
    for r in rows:
        assert r["rows"] > r["steps"] and r["retracted"] >= min_retracted and r["hits"] > 0 and r["misses"] > 0, r
        assert r["aborted"] == 1 and r["imported"] >= 1 and r["capacity_gained"], r
    return rows


def test_sglang_adapter_mode_exact_on_the_host_backend(daemon, tmp_path):
    rows = run_sglang_mode(daemon, tmp_path, ["--device", "cpu", "--configs", "5x300", "--k", "16", "--steps", "14",
                                              "--slots-factor", "1,2"])
    assert [r["slots"] for r in rows] == [16, 32]


@pytest.mark.parametrize("graph", [True, False])
def test_sglang_adapter_mode_exact_on_a_gpu(daemon, gpu, tmp_path, graph):
    rows = run_sglang_mode(daemon, tmp_path, ["--device", "cuda", "--configs", "6x2500", "--k", "64", "--steps", "40",
                                              "--slots-factor", "1,2", "--records", "bf16,fp8"]
                           + ([] if graph else ["--no-graph"]))
    assert all(r["graph"] == graph for r in rows)


def test_sglang_adapter_mode_speculative_exact_on_the_host_backend(daemon, tmp_path):
    """--adapter sglang --draft-tokens: EAGLE rounds of n + 1 verify tokens through
    HisparsedMTPCoordinator.swap_in_verify_pages (examples/engine/sglang_mtp_mode.py), random
    acceptance, the same retraction; every (request, round) row of n + 1 logits bit-identical."""
    rows = run_sglang_mode(daemon, tmp_path, ["--device", "cpu", "--configs", "5x300", "--k", "16", "--steps", "12",
                                              "--slots-factor", "0", "--draft-tokens", "1,3"])
    assert [(r["draft_tokens"], r["slots"]) for r in rows] == [(1, 48), (3, 80)]


@pytest.mark.parametrize("graph", [True, False])
def test_sglang_adapter_mode_speculative_exact_on_a_gpu(daemon, gpu, tmp_path, graph):
    # With 3 drafts a round accepts up to 4 tokens, so the workload's second retraction (request 4,
    # at round 10) can find it finished: on the H200 one retraction happened (2026-12-03). The
    # re-admission after a retraction is held by the host-backend test above.
    rows = run_sglang_mode(daemon, tmp_path, ["--device", "cuda", "--configs", "6x2500", "--k", "64", "--steps", "30",
                                              "--slots-factor", "0", "--draft-tokens", "1,3", "--records", "bf16,fp8"]
                           + ([] if graph else ["--no-graph"]), min_retracted=1)
    assert all(r["graph"] == graph for r in rows)


def pd_agent_missing():
    """Why the P/D import's transfer agent cannot run here (hisparse-bench not built, or built
    without UCX: its import subcommand exits 77 and the daemon serves no imports), or None."""
    import subprocess
    agent = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-bench"
    if not agent.exists():
        return f"{agent} is not built (the P/D import's transfer agent)"
    if subprocess.run([str(agent), "import"], capture_output=True, timeout=60).returncode == 77:
        return f"{agent} was built without UCX: no P/D import"
    return None


def run_vllm_serve_mode(daemon, tmp_path, extra, min_preempted=2):
    """run_engine.py --adapter vllm: HisparsedConnector driven as vLLM's scheduler, ActiveKVConnector
    and MLAAttention drive it (examples/engine/vllm_serve_mode.py) over long and short requests with
    staggered arrivals, early finishes, two preemptions (blocks freed, recomputed two steps later) and
    an abort while preempted, and a long request arriving as a P/D import (hisparse-bench import
    --records as its prefill node); every (request, decode step) row's logits equal vLLM's plain
    sparse decode over its full paged cache bit for bit. The connector parks each preempted request,
    resumes the one rescheduled, releases the aborted one and imports the P/D one."""
    run_engine = pytest.importorskip("run_engine")
    pd = pd_agent_missing() is None  # without UCX the rest still runs, with no P/D request
    out = tmp_path / "rows.json"
    rc = run_engine.main(["--adapter", "vllm", "--model", "small", "--daemon", daemon.address, "--json", str(out)]
                         + (["--pd-import"] if pd else []) + extra)
    import json
    rows = json.loads(out.read_text())
    assert rows and all(r["adapter"] == "vllm" and r["exact"] for r in rows), rows
    assert rc == 0
    for r in rows:
        assert r["rows"] > r["steps"] and r["hits"] > 0 and r["misses"] > 0, r
        assert r["preempted"] >= min_preempted and r["aborted"] == 1 and r["pd_import"] == ("r2" if pd else None), r
        ops = r["connector_ops"]
        assert ops["parks"] == r["preempted"] and ops["resumes"] == r["preempted"] - r["aborted"], r
        assert ops["releases"] == r["batch"], r
    return rows


def test_vllm_adapter_mode_exact_on_the_host_backend(daemon, tmp_path):
    rows = run_vllm_serve_mode(daemon, tmp_path, ["--device", "cpu", "--configs", "5x300", "--k", "16", "--steps",
                                                  "14", "--slots-factor", "1,2"])
    assert [r["slots"] for r in rows] == [16, 32]


def test_vllm_adapter_mode_speculative_exact_on_the_host_backend(daemon, tmp_path):
    """--draft-tokens: verify steps of n + 1 tokens, the index group's swap_in once per verify step
    over a strided view, random acceptance; every (request, step) row of n + 1 logits bit-identical."""
    rows = run_vllm_serve_mode(daemon, tmp_path, ["--device", "cpu", "--configs", "5x300", "--k", "16", "--steps",
                                                  "12", "--slots-factor", "0", "--draft-tokens", "1,3"])
    assert [(r["draft_tokens"], r["slots"]) for r in rows] == [(1, 48), (3, 80)]


def test_vllm_adapter_mode_catches_a_connector_that_stores_the_recompute(daemon, tmp_path, monkeypatch):
    """The check can fail: a scheduler role that forgets what the host pool holds when a preempted
    request comes back stores vLLM's recompute (poisoned in the hisparse run) over the parked copy,
    and the logits differ from the first decode step after the resume."""
    from hisparse.integrations.vllm import scheduler as vllm_scheduler
    run_engine = pytest.importorskip("run_engine")
    original = vllm_scheduler.HisparsedConnectorScheduler.update_state_after_alloc

    def forgetful(self, request, blocks, num_external_tokens):
        if self._state.get(request.request_id) == "parked":
            self._stored[request.request_id] = 0
        return original(self, request, blocks, num_external_tokens)

    monkeypatch.setattr(vllm_scheduler.HisparsedConnectorScheduler, "update_state_after_alloc", forgetful)
    out = tmp_path / "rows.json"
    rc = run_engine.main(["--adapter", "vllm", "--model", "small", "--daemon", daemon.address, "--json", str(out),
                          "--device", "cpu", "--configs", "5x300", "--k", "16", "--steps", "14", "--slots-factor", "1"])
    import json
    rows = json.loads(out.read_text())
    assert rc == 1 and len(rows) == 1 and not rows[0]["exact"] and rows[0]["identical_rows"] < rows[0]["rows"]


def test_vllm_adapter_mode_catches_a_wrong_pd_import(daemon, tmp_path, monkeypatch):
    """The check can fail: a prefill node that sends each position's record one place off makes
    the imported request's logits differ from its first decode step."""
    run_engine = pytest.importorskip("run_engine")
    serve = pytest.importorskip("vllm_serve_mode")
    missing = pd_agent_missing()
    if missing:
        pytest.skip(missing)
    original = serve.VllmServeEngine._import_through_connector
    monkeypatch.setattr(serve.VllmServeEngine, "_import_through_connector",
                        lambda self, r, n, rec: original(self, r, n, rec.roll(1, dims=1)))
    out = tmp_path / "rows.json"
    rc = run_engine.main(["--adapter", "vllm", "--model", "small", "--daemon", daemon.address, "--json", str(out),
                          "--device", "cpu", "--configs", "5x300", "--k", "16", "--steps", "14", "--slots-factor", "1",
                          "--pd-import"])
    import json
    rows = json.loads(out.read_text())
    assert rc == 1 and len(rows) == 1 and not rows[0]["exact"] and rows[0]["identical_rows"] < rows[0]["rows"]


@pytest.mark.parametrize("drafts", ["0", "1,3"])
def test_vllm_adapter_mode_exact_on_a_gpu(daemon, gpu, tmp_path, drafts):
    # With 3 drafts a step accepts up to 4 tokens, so the second preemption can find its request
    # finished: on the H200 one was preempted (and aborted) there (2026-12-03); the host-backend
    # tests hold the resume after a preemption with drafts.
    run_vllm_serve_mode(daemon, tmp_path, ["--device", "cuda", "--configs", "6x2500", "--k", "64", "--steps", "30",
                                           "--slots-factor", "0" if drafts != "0" else "1,2", "--draft-tokens", drafts,
                                           "--records", "bf16,fp8"], min_preempted=1 if drafts != "0" else 2)

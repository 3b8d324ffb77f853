"""The example engine (examples/engine): hisparse's logits equal the all-in-HBM baseline's bit for
bit at every decode step. The CPU case runs the host backend eagerly; the GPU cases replay the
decode step as a CUDA graph with the CUDA backend (skipped without a GPU)."""

from __future__ import annotations

import pytest

import hisparse

torch = pytest.importorskip("torch")
engine = pytest.importorskip("engine")  # examples/engine, put on sys.path by conftest


def run_both(daemon, device, fmt_name, *, batch, context, k, slots, steps, graph=True):
    cfg = engine.ModelConfig(seed=11, **engine.SMALL)
    model = engine.SparseDecoder(cfg, device)
    fmt = engine.record_format(fmt_name, cfg)
    base = engine.run_mode(model, fmt, batch=batch, prompt_len=context, k=k, steps=steps, seed=5,
                           use_graph=graph, probe_steps=4)
    cuda = device.type == "cuda"
    with hisparse.Session(daemon, num_layers=cfg.n_layers, record_bytes=fmt.record_bytes, k=k, slots=slots,
                          max_requests=batch, gpu=0 if cuda else -1, backend="cuda" if cuda else "host") as s:
        hs = engine.run_mode(model, fmt, batch=batch, prompt_len=context, k=k, steps=steps, seed=5, session=s,
                             use_graph=graph, probe_steps=4)
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

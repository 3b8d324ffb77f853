"""The coverage test_sglang_adapter.py and test_sglang_mtp.py had before issue 38's stand-ins
replaced them, on those stand-ins (examples/engine/sglang_standins.py: two index spaces, the DSA
backend's forward_decode / forward_extend, the indexer's keys): the LRU across consecutive decode
steps, bad calls refused with a clear error and nothing lost, and PD decode where the daemon
imports the KV itself (prealloc_direct, a transfer agent, admit_request_direct, then decode).
Host backend, a real hisparsed. Every scenario ends with every size restored.
"""

from __future__ import annotations

import pathlib
import struct
import subprocess

import pytest

import hisparse

torch = pytest.importorskip("torch")

from hisparse.integrations.sglang_mtp import HisparsedMTPCoordinator  # noqa: E402
from sglang_rig import B, K, LAYERS, PHYSICAL, RECORD, engine_factory  # noqa: E402
from sglang_standins import Engine, Req, index_key  # noqa: E402

IMPORT_SEED = 7



@pytest.fixture
def sglang(import_daemon):
    yield from engine_factory(import_daemon)


def assert_sizes_restored(engine: Engine) -> None:
    st = engine.coord.session.stats()
    assert st.session_requests == 0 and st.session_host_bytes == 0
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL
    assert engine.alloc.logical_attn_allocator.available_size() == engine.alloc.size_full
    assert (engine.coord.row_of_pool_idx == -1).all()
    assert not engine.coord.has_ongoing_staging()


def test_lru_hits_across_consecutive_decode_steps(sglang):
    """A selection repeated on the next step is a hit and keeps its record; misses evict the least
    recently used of the request's B records, per layer."""
    engine = sglang()
    req = Req("lru", 9, 60)
    engine.prefill(req)
    assert engine.collect() == [req]

    def step(sel):
        return engine.decode([req], [[sel] * LAYERS])

    first = step([0, 1, 2, 3])
    s0 = engine.coord.session.stats()
    second = step([0, 1, 10, 11])  # two hits, two misses a layer
    s1 = engine.coord.session.stats()
    assert s1.misses - s0.misses == 2 * LAYERS
    assert s1.hits - s0.hits == 2 * LAYERS
    for layer in range(LAYERS):
        assert second[layer][0, :2].tolist() == first[layer][0, :2].tolist()  # hits stay put
    # B = 8: four misses take the two empty records, then the least recent: those of 2 and 3.
    third = step([20, 21, 22, 23])
    # Then the least recent are 10's and 11's (0 and 1 were hits after them): 30 and 31 take them.
    fourth = step([0, 1, 30, 31])
    for layer in range(LAYERS):
        assert set(first[layer][0, 2:].tolist()) < set(third[layer][0].tolist())
        assert not set(second[layer][0, 2:].tolist()) & set(third[layer][0].tolist())
        assert set(fourth[layer][0, 2:].tolist()) == set(second[layer][0, 2:].tolist())
        assert fourth[layer][0, :2].tolist() == first[layer][0, :2].tolist()
    assert engine.checked >= 4 * 4 * LAYERS
    engine.finish(req)
    assert_sizes_restored(engine)


def test_bad_calls_are_refused_with_a_clear_error_and_lose_nothing(sglang):
    engine = sglang()
    coord = engine.coord
    ok = Req("ok", 1, 30)
    engine.prefill(ok)
    engine.collect()
    engine.decode([ok])

    stray = Req("x", 3, 10)  # PD: a slot, logical locations, no landed KV and no import granted
    stray.req_pool_idx = engine.r2t.alloc()
    stray.kv = Req.KvInfo(stray.seqlen - 1)
    with pytest.raises(hisparse.FailedPrecondition, match="no landed KV"):
        coord.admit_request_direct(stray)
    engine.r2t.free(stray.req_pool_idx)
    stray.req_pool_idx = None
    with pytest.raises(hisparse.NotFound, match="not known"):
        coord.retract_req(stray)
    engine.prefill(stray)
    with pytest.raises(hisparse.FailedPrecondition, match="already admitted"):
        coord.admit_request_into_staging(stray)
    with pytest.raises(hisparse.FailedPrecondition, match="not staging"):
        coord.abort_staging_request(ok)
    with pytest.raises(hisparse.InvalidArgument, match="named twice"):
        coord.retract_reqs([ok, ok])
    idx = torch.tensor([ok.req_pool_idx, stray.req_pool_idx])
    seq = torch.tensor([ok.seqlen, stray.seqlen])
    with pytest.raises(hisparse.InvalidArgument, match="map_last_loc_to_buffer"):
        coord.map_last_loc_to_buffer(seq, torch.tensor([1]), idx)
    with pytest.raises(hisparse.FailedPrecondition, match="holds no ready request"):
        coord.map_last_loc_to_buffer(seq, torch.tensor([1, 2]), idx)  # stray is still staging
    with pytest.raises(hisparse.InvalidArgument, match="top_k_result"):
        coord.swap_in_selected_pages(idx[:1], seq[:1].to(torch.int32), torch.zeros(1, K + 1, dtype=torch.int32), 0)
    # Nothing lost: ok decodes on from the same host pages, stray is collected and decodes too.
    assert engine.collect() == [stray]
    for _ in range(2):
        engine.decode([ok, stray])
    coord.session.check_errors()
    for r in (ok, stray):
        engine.finish(r)
    assert_sizes_restored(engine)


def test_mtp_bad_verify_calls_are_refused(sglang):
    q = 3
    engine = sglang(cls=HisparsedMTPCoordinator, num_draft_tokens=q)
    coord = engine.coord
    r = Req("x", 4, 10)
    engine.prefill(r)
    engine.collect()
    idx, seq = torch.tensor([r.req_pool_idx]), torch.tensor([r.seqlen - 1], dtype=torch.int32)
    with pytest.raises(hisparse.FailedPrecondition, match="swap_in_verify_pages"):
        coord.swap_in_selected_pages(idx, seq, torch.full((1, K), -1, dtype=torch.int32), 0)
    with pytest.raises(hisparse.InvalidArgument):
        coord.swap_in_verify_pages(idx, seq, torch.full((q + 1, K), -1, dtype=torch.int32), 0, q + 1)
    with pytest.raises(hisparse.InvalidArgument):
        coord.swap_in_verify_pages(idx, seq, torch.full((q, K + 1), -1, dtype=torch.int32), 0, q)
    with pytest.raises(hisparse.InvalidArgument, match="num_draft_tokens"):
        HisparsedMTPCoordinator(engine.r2t, engine.alloc, K, B, "cpu", None, num_draft_tokens=9, backend="host")
    ghost = Req("ghost", 5, 10)  # a stale Req naming x's slot: refused, x's position map intact
    ghost.req_pool_idx = r.req_pool_idx
    before = coord.token_position.clone()
    with pytest.raises(hisparse.NotFound):
        coord.retract_req(ghost)
    with pytest.raises(hisparse.NotFound):
        coord.retract_reqs([r, ghost])  # nothing retracted
    assert torch.equal(coord.token_position, before)
    engine.finish(r)
    assert_sizes_restored(engine)


def _import_word(request: int, layer: int, position: int, word: int) -> int:
    """hisparse/common/import_pattern.h's ImportPatternWord (as tests/python/test_import.py)."""
    m = (1 << 64) - 1
    z = IMPORT_SEED ^ ((request * 0x9E3779B97F4A7C15) & m) ^ (layer << 48) ^ (position << 16) ^ word
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_pd_decode_with_the_daemon_importing_the_kv(sglang, import_daemon, tmp_path):
    """PD decode, the daemon's own import: prealloc_direct grants the import (twice is refused),
    the prefill side's transfer agent (hisparse-bench import) writes the prompt's KV, SGLang's
    _pre_alloc gives the request logical locations only, admit_request_direct completes the
    import and takes a fresh device page; then decode steps read imported positions and the
    decode tokens' own KV through forward_decode, and release restores every size."""
    bench = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-bench"
    if not bench.exists():
        pytest.skip(f"{bench} is not built (it is the transfer agent here)")
    engine = sglang()
    coord = engine.coord
    req = Req("pd", 0, 40)
    fill = req.seqlen - 1  # 40: the prompt; the first output token is the first decode step's
    try:
        grant = coord.prealloc_direct(req)
    except hisparse.FailedPrecondition as err:
        pytest.skip(f"the daemon serves no imports: {err}")
    with pytest.raises(hisparse.FailedPrecondition, match="already admitted"):
        coord.prealloc_direct(req)
    (tmp_path / "grant").write_bytes(grant)
    subprocess.run([str(bench), "import", "--daemon", import_daemon.address, "--grant", str(tmp_path / "grant"),
                    "--seed", str(IMPORT_SEED)], check=True, capture_output=True, timeout=120)
    physical_before = engine.alloc.hisparse_attn_allocator.available_size()
    req.req_pool_idx = engine.r2t.alloc()  # _pre_alloc: logical locations only
    req.kv = Req.KvInfo(fill)
    req.kv_committed_len = fill
    logical = engine.alloc.alloc_logical_only(fill)
    engine.r2t.req_to_token[req.req_pool_idx, :fill] = logical.to(torch.int32)
    for layer in range(LAYERS):  # the indexer's keys still come with SGLang's own transfer
        engine.pool.set_index_k_buffer(layer, logical, torch.stack([index_key(req.seed, layer, p, 8)
                                                                    for p in range(fill)]))
    coord.admit_request_direct(req)
    assert engine.alloc.hisparse_attn_allocator.available_size() == physical_before - 1  # one fresh page
    rid = coord._entries[req.rid].request_id

    def expected(seed, layer, pos):
        if pos < fill:
            return torch.tensor(list(b"".join(struct.pack("<Q", _import_word(rid, layer, pos, w))
                                               for w in range(RECORD // 8))), dtype=torch.uint8)
        return Engine.expected(engine, seed, layer, pos)

    engine.expected = expected
    for sel in ([0, 39, 40, 17], [40, 41, 5, 0], [42, 3, 39, 41]):
        engine.decode([req], [[sel] * LAYERS])
    assert engine.checked == 3 * 4 * LAYERS
    engine.finish(req)
    assert_sizes_restored(engine)

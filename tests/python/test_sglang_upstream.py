"""hisparse's SGLang adapter driven through SGLang's own HiSparse mechanisms (issue 38, findings
1-5), reproduced by examples/engine/sglang_standins.py at sgl-project/sglang 009e640a: two index
spaces and the mapping writes, the allocator's alloc_device_buffer, the model runner's forward, the
overlap scheduler's second stream, retraction then abort, PD decode's pre-allocation and
transfer, MTP's verify tokens. Host backend, a real hisparsed.

Every attention read is checked against the full-HBM answer (the record of each selected
position); each test names the finding it holds and fails on the adapter that had it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hisparse.integrations.sglang import HisparsedCoordinator  # noqa: E402
from hisparse.integrations.sglang_mtp import HisparsedMTPCoordinator  # noqa: E402
from sglang_rig import K, LAYERS, PHYSICAL, RECORD, engine_factory  # noqa: E402
from sglang_standins import (DeferredStream, Engine, ForwardBatch, ForwardMode, HiSparseAllocator,  # noqa: E402
                             HiSparseDSAPool, PDDecode, ReqToTokenPool, Req, kv_record)


@pytest.fixture
def sglang(daemon):
    """(engine factory, allocator, pool): build(coordinator_class=..., producer=...) -> Engine."""
    yield from engine_factory(daemon)


def _run(engine: Engine, reqs, steps: int) -> None:
    for r in reqs:
        engine.prefill(r)
    running = engine.collect()
    assert len(running) == len(reqs)
    for _ in range(steps):
        engine.decode(running)
    if engine.producer is not None:
        engine.producer.synchronize()


def test_finding1_the_model_runner_waits_for_pending_backup(sglang):
    """ModelRunner calls wait_for_pending_backup() before every decode forward."""
    engine = sglang()
    _run(engine, [Req("a", 1, 20)], 1)
    assert engine.checked > 0


def test_finding2_decode_tokens_kv_goes_through_the_mapping(sglang):
    """Decode tokens get a logical location only; map_last_loc_to_buffer must point the mapping at
    a physical slot, or every row's newest KV lands in slot 0. Batch of 3, the newest token
    selected every step, its host copy read back afterwards."""
    engine = sglang()
    reqs = [Req("a", 1, 20), Req("b", 2, 33), Req("c", 3, 12)]
    _run(engine, reqs, 5)
    assert engine.checked >= 3 * 5 * LAYERS
    coord = engine.coord
    for r in reqs:  # the host copy of every decoded position
        e = coord._entries[r.rid]
        for layer in range(LAYERS):
            for pos in range(len(r.origin_input_ids), r.seqlen - 1):
                got = bytes(coord.session.record_view(e.request_id, layer, pos))[:RECORD]
                assert got == bytes(kv_record(r.seed, layer, pos, RECORD).tolist()), (r.rid, layer, pos)


def test_finding3_staging_gives_the_prompt_pages_back(sglang):
    """alloc_device_buffer after staging: the physical pool keeps only the decode buffer per
    request, so its free capacity grows back by the prompt's pages; release returns the rest."""
    engine = sglang()
    phys = engine.alloc.hisparse_attn_allocator
    before = phys.available_size()
    reqs = [Req("a", 1, 100), Req("b", 2, 90)]
    for r in reqs:
        engine.prefill(r)
    assert phys.available_size() == before - 100 - 90  # the prefill took a slot per token
    running = engine.collect()
    held = before - phys.available_size()
    assert held <= 2 * 1, f"{held} physical slots still held for 2 requests after staging"
    engine.decode(running)
    for r in running:
        engine.finish(r)
    assert phys.available_size() == before
    assert engine.alloc.logical_attn_allocator.available_size() == engine.alloc.size_full


def test_finding4_the_backend_reads_the_daemons_arena(sglang):
    """token_to_kv_pool.get_key_buffer(layer) is what the DSA backend's forward_decode reads with
    the swap-in's indices: there it must be the session's slot arena (the pool's own buffer
    elsewhere: test_sglang_readers.py)."""
    engine = sglang()
    arena = engine.coord.session.slot_view()

    def forward_decode():  # the caller the adapter serves the arena to
        return engine.pool.get_key_buffer(0)

    kv = forward_decode()
    assert kv.dtype == torch.uint8 and kv.numel() == arena.size
    assert kv.data_ptr() == arena.ctypes.data
    _run(engine, [Req("a", 1, 30), Req("b", 2, 40)], 3)


def test_finding4_flashmla_fp8_view_of_the_arena(daemon):
    """FlashMLA's fp8 path reads the KV as [num_pages, 64, 1, 656]."""
    pool = HiSparseDSAPool(1, 64, 656)
    alloc = HiSparseAllocator(pool, 64)
    r2t = ReqToTokenPool(2, 64)
    coord = HisparsedCoordinator(r2t, alloc, 4, 63, "cpu", None, daemon=daemon, backend="host")
    try:
        view = coord.flashmla_kv_view()
        records = coord.session.max_requests * coord.session.num_layers * coord.session.record_slots
        assert tuple(view.shape) == (records // 64, 64, 1, 656)
        assert view.data_ptr() == coord.session.slot_view().ctypes.data
    finally:
        coord.destroy()


def test_finding5_overlap_waits_for_the_producer_stream(sglang):
    """The overlap scheduler prepares step N+1 (map_last_loc_to_buffer) while step N's forward is
    still queued on the producer stream: the step buffers must not change under it."""
    engine = sglang(producer=DeferredStream())
    _run(engine, [Req("a", 1, 20), Req("b", 2, 27)], 6)
    assert engine.checked >= 2 * 6 * LAYERS


def test_finding5_admission_and_finish_while_a_forward_is_queued(sglang):
    """The overlap scheduler also admits (staging, PD direct) and finishes requests while a
    decode forward is queued: that forward must still append its own step's newest tokens, so
    the step after it attends them from the host pool."""
    producer = DeferredStream()
    engine = sglang(producer=producer)
    a, b, c = Req("a", 1, 20), Req("b", 2, 27), Req("c", 3, 15)
    for r in (a, b, c):
        engine.prefill(r)
    running = engine.collect()
    engine.decode(running)  # queued
    d = Req("d", 4, 18)
    engine.prefill(d)  # admit_request_into_staging with the forward queued
    engine.decode(running)  # queued behind it; attends the previous step's newest tokens
    engine.finish(c)  # request_finished with a forward queued
    running.remove(c)
    running += engine.collect()
    engine.decode(running)
    producer.synchronize()
    assert engine.checked > 0
    for r in running:
        engine.finish(r)
    assert engine.coord.session.stats().session_requests == 0


def test_finding5_retract_then_abort_releases_the_host_pages(sglang):
    """release_req calls retract_req; a retracted request that is then aborted is never heard of
    again: its host pages must be gone at retraction, not parked."""
    engine = sglang()
    a, b = Req("a", 1, 40), Req("b", 2, 50)
    _run(engine, [a, b], 2)
    engine.retract(a)
    engine.retract(b)
    st = engine.coord.session.stats()
    assert st.session_requests == 0 and st.session_host_bytes == 0
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL
    # and one comes back: prefilled again from scratch, decoded exactly
    _run(engine, [b], 2)


def test_finding5_pd_decode_preallocates_and_admits_directly(sglang):
    """PD decode: _init_kv_manager reads mem_pool_host's buffers, _pre_alloc its host slots, the
    transfer writes there and admit_request_direct admits without any prealloc_direct."""
    engine = sglang()
    pd = PDDecode(engine)
    reqs = [Req("p", 5, 37), Req("q", 6, 21)]
    for r in reqs:
        pd.pre_alloc(r)
    running = pd.transfer_and_admit()
    for _ in range(3):
        engine.decode(running)
    assert engine.checked >= 2 * 3 * LAYERS
    for r in running:
        engine.finish(r)
    st = engine.coord.session.stats()
    assert st.session_requests == 0
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL


def test_finding5_mtp_verify_tokens_land_in_ring_slots(sglang):
    """MTP: assign_spec_ring_slots_batch points the verify tokens' logical locations at ring
    slots, so the verify forward's KV writes (through the mapping) do not all land on slot 0."""
    q = 3
    engine = sglang(cls=HisparsedMTPCoordinator, num_draft_tokens=q)
    coord, r2t = engine.coord, engine.r2t
    reqs = [Req("a", 1, 20), Req("b", 2, 26)]
    for r in reqs:
        engine.prefill(r)
    running = engine.collect()
    for _ in range(3):
        starts = [r.seqlen - 1 for r in running]
        n = len(running)
        locs = engine.alloc.alloc_decode(n * q).view(n, q)
        for i, r in enumerate(running):
            r2t.req_to_token[r.req_pool_idx, starts[i]:starts[i] + q] = locs[i].to(torch.int32)
            r.kv.kv_allocated_len = starts[i] + q
        coord.assign_spec_ring_slots_batch(running, starts, [s + q for s in starts])
        coord.num_real_reqs.fill_(n)
        coord.wait_for_pending_backup()
        rpi = torch.tensor([r.req_pool_idx for r in running])
        fb = ForwardBatch(ForwardMode.TARGET_VERIFY, rpi, torch.tensor(starts), locs.reshape(-1))
        for layer in range(LAYERS):
            recs = torch.stack([kv_record(r.seed, layer, s + t, RECORD) for r, s in zip(running, starts)
                                for t in range(q)])
            ids = torch.full((n * q, K), -1, dtype=torch.int32)
            want = []
            for i, (r, s) in enumerate(zip(running, starts)):
                for t in range(q):
                    sel = [s + t, 0, (s + t) // 2]  # each verify token attends itself, 0 and a middle one
                    ids[i * q + t, :3] = r2t.req_to_token[r.req_pool_idx, sel]
                    want.append((r.seed, sel))
            got, _ = engine.backend.forward(layer, fb, recs, ids, num_positions=q)
            for row, (seed, sel) in enumerate(want):
                for j, pos in enumerate(sel):
                    assert torch.equal(got[row, j], kv_record(seed, layer, pos, RECORD)), (row, pos, layer)
        for r, s in zip(running, starts):  # all q accepted: the next round starts after them
            r.output_ids += [0] * q
            r.kv_committed_len = s + q
        coord.backup_committed_tokens(running)
    for r in running:
        engine.finish(r)
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL


def test_batched_retraction_releases_staging_and_ready_requests(sglang):
    """retract_reqs (hisparse's batched retract_req): a staging request is aborted (its prompt's
    physical slots freed), the ready ones released in one round trip; once SGLang frees their
    logical locations every slot of both spaces is back."""
    engine = sglang()
    ready = [Req("a", 1, 30), Req("b", 2, 25)]
    _run(engine, ready, 2)
    staging = Req("c", 3, 40)
    engine.prefill(staging)  # not collected: still staging
    reqs = ready + [staging]
    engine.coord.retract_reqs(reqs)
    for r in reqs:
        engine.release_kv_cache(r)
    st = engine.coord.session.stats()
    assert st.session_requests == 0 and st.session_host_bytes == 0
    assert engine.alloc.hisparse_attn_allocator.available_size() == PHYSICAL
    assert engine.alloc.logical_attn_allocator.available_size() == engine.alloc.size_full
    assert not engine.coord.has_ongoing_staging()

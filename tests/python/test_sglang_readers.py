"""Every reader of SGLang's device pool under HiSparse, and the index space each reads in
(docs/INTEGRATION.md, "Who reads the device pool"): the adapter replaces the pool instance's
get_key_buffer, so each reader must still get the buffer its indices index.

Read at sgl-project/sglang: dsa_backend.py 614c1581 (DeepseekSparseAttnBackend.forward_decode /
forward_extend), hisparse_memory_pool.py 08a72bac (HiSparseDSATokenToKVPool), memory_pool.py
(MLATokenToKVPool.get_mla_kv_buffer reads self.get_key_buffer), model_runner.py (decode-only
wait_for_pending_backup). Stand-ins: examples/engine/sglang_standins.py (DSABackend). Host
backend, a real hisparsed. The extend and get_mla_kv_buffer cases fail on the adapter that
served the arena to every caller (the arena at physical slots is other bytes).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hisparse.integrations.sglang_mtp import HisparsedMTPCoordinator  # noqa: E402
from sglang_rig import LAYERS, RECORD, engine_factory  # noqa: E402
from sglang_standins import Engine, ForwardBatch, ForwardMode, Req, kv_record  # noqa: E402


@pytest.fixture
def sglang(daemon):
    yield from engine_factory(daemon)


def _decoding(engine: Engine, reqs, steps: int):
    for r in reqs:
        engine.prefill(r)
    running = engine.collect()
    for _ in range(steps):
        engine.decode(running)
    return running


def test_prefill_attention_reads_physical_slots_of_the_pool(sglang):
    """forward_extend reads get_key_buffer at translate_loc_to_hisparse_device's physical slots:
    a prefill beside requests that are decoding (so the arena holds their records)."""
    engine = sglang()
    _decoding(engine, [Req("a", 1, 30), Req("b", 2, 22)], 2)
    before = engine.checked
    engine.prefill(Req("c", 3, 40))
    assert engine.checked > before


def test_chunked_prefill_reads_its_prefix_from_the_pool(sglang):
    """Chunked prefill: each later chunk is an EXTEND forward whose top-k reaches back into the
    earlier chunks' KV, read at their physical slots; then the request decodes from the arena."""
    engine = sglang()
    _decoding(engine, [Req("a", 1, 30)], 2)
    r = Req("c", 3, 50)
    engine.prefill(r, chunk=8)
    running = engine.collect()
    assert [x.rid for x in running] == ["c"]
    for _ in range(3):
        engine.decode(running)
    assert engine.checked > 0


def test_get_mla_kv_buffer_translates_and_reads_the_pool(sglang):
    """HiSparseDSATokenToKVPool.get_mla_kv_buffer translates logical locations, then reads
    self.get_key_buffer: the pool's buffer, never the arena."""
    engine = sglang()
    _decoding(engine, [Req("a", 1, 30)], 2)
    r = Req("c", 3, 20)
    engine.prefill(r)  # staging: its physical slots are still mapped
    logical = engine.r2t.req_to_token[r.req_pool_idx, :r.seqlen - 1].to(torch.int64)
    for layer in range(LAYERS):
        got = engine.pool.get_mla_kv_buffer(layer, logical)[:, :RECORD]
        want = torch.stack([kv_record(r.seed, layer, p, RECORD) for p in range(r.seqlen - 1)])
        assert torch.equal(got, want), layer


def test_decode_reads_the_arena_and_only_decode(sglang):
    """The arena goes to forward_decode alone; forward_extend and any other caller get the pool's
    own buffer, in the same process at the same time."""
    engine = sglang()
    _decoding(engine, [Req("a", 1, 30)], 1)
    pool, arena = engine.pool, engine.coord.attention_kv_buffer()

    def forward_decode():
        return pool.get_key_buffer(0)

    def forward_extend(forward_batch):
        return pool.get_key_buffer(0)

    assert forward_decode().data_ptr() == arena.data_ptr()
    fb = ForwardBatch(ForwardMode.EXTEND, torch.tensor([0]), torch.tensor([1]), torch.tensor([1]))
    assert forward_extend(fb).data_ptr() == pool.kv_buffer[0].data_ptr()
    assert pool.get_key_buffer(0).data_ptr() == pool.kv_buffer[0].data_ptr()


def test_indexer_reads_its_own_keys_by_logical_location(sglang):
    """The indexer's key cache (get_index_k_with_scale_buffer) is not mapped and not replaced:
    every prefill and decode step reads every position's key by logical location, also after
    alloc_device_buffer unmapped the prompt. (Not a risk on any adapter: a regression guard.)"""
    engine = sglang()
    running = _decoding(engine, [Req("a", 1, 30), Req("b", 2, 17)], 3)
    assert engine.pool.index_k_buffer[0].data_ptr() == engine.pool.get_index_k_with_scale_buffer(0).data_ptr()
    assert len(running) == 2 and engine.checked > 0


def test_mtp_target_verify_reads_the_arena_and_draft_extend_the_pool(sglang):
    """MTP coordinator: forward_extend in TARGET_VERIFY attends at swap_in_verify_pages' indices
    (the arena); in EXTEND (prefill, draft extend) at physical slots (the pool)."""
    engine = sglang(cls=HisparsedMTPCoordinator, num_draft_tokens=2)
    pool = engine.pool

    def forward_extend(forward_batch):
        return pool.get_key_buffer(0)

    engine.prefill(Req("a", 1, 25))  # EXTEND through forward_extend, checked
    engine.collect()
    verify = ForwardBatch(ForwardMode.TARGET_VERIFY, torch.tensor([0]), torch.tensor([1]), torch.tensor([1]))
    extend = ForwardBatch(ForwardMode.EXTEND, torch.tensor([0]), torch.tensor([1]), torch.tensor([1]))
    assert forward_extend(verify).data_ptr() == engine.coord.attention_kv_buffer().data_ptr()
    assert forward_extend(extend).data_ptr() == pool.kv_buffer[0].data_ptr()

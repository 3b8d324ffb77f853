"""hisparse.integrations.sglang.HisparsedCoordinator driven as SGLang's scheduler, ScheduleBatch and
DSA backend drive HiSparseCoordinator, replaying the scenarios of SGLang's own unit test
(test/registered/unit/managers/test_hisparse_unit.py @ e9aab586 / 01b59cdd): host backend, a real
hisparsed with 4 KiB pages (64 records of 64 bytes a page), imports on. Each scenario ends with
every size restored: no request and no used bytes in the daemon, the engine's pools as before.

The KV of (request seed, layer, position) is a fixed byte pattern, so a re-prefill writes the same
bytes as a real model would, and every location swap_in_selected_pages returns is checked byte for
byte against the engine's own pool and the daemon's host pool.
"""

from __future__ import annotations

import pathlib
import struct
import subprocess

import pytest

import hisparse
from conftest import _daemon_or_skip, _library_or_skip

torch = pytest.importorskip("torch")
from hisparse.integrations.sglang import HisparsedCoordinator  # noqa: E402

LAYERS, RECORD, K, B = 2, 64, 4, 8
POOL_TOKENS, MAX_CTX = 1024, 128
IMPORT_SEED = 7


def kv_bytes(seed: int, layer: int, position: int) -> torch.Tensor:
    """The record a model would write for (request seed, layer, position)."""
    return ((seed * 5 + layer * 11 + position * 31 + torch.arange(RECORD)) % 256).to(torch.uint8)


class Req:
    """Stand-in for sglang.srt.managers.schedule_batch.Req (sgl-project/sglang @ 009e640a): the
    fields HiSparseCoordinator reads (rid, origin_input_ids, output_ids, req_pool_idx,
    sampling_params.max_new_tokens) and the flag it sets (hisparse_staging)."""

    class SamplingParams:
        def __init__(self, max_new_tokens):
            self.max_new_tokens = max_new_tokens

    def __init__(self, rid: str, seed: int, prompt_len: int, max_new_tokens: int = 16):
        self.rid = rid
        self.seed = seed
        self.origin_input_ids = list(range(prompt_len))
        self.output_ids = []
        self.req_pool_idx = None
        self.sampling_params = Req.SamplingParams(max_new_tokens)
        self.hisparse_staging = False

    def kv_len(self) -> int:
        return len(self.origin_input_ids) + max(len(self.output_ids) - 1, 0)


class ReqToTokenPool:
    """Stand-in for sglang.srt.mem_cache.memory_pool.ReqToTokenPool (@ 009e640a): req_to_token
    int32 [size, max_context_len], the logical KV location of each (request slot, position)."""

    def __init__(self, size: int, max_context_len: int):
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32)
        self.free_slots = list(range(size))

    def alloc(self) -> int:
        return self.free_slots.pop(0)

    def free(self, idx: int) -> None:
        self.free_slots.append(idx)


class DevicePool:
    """Stand-in for sglang.srt.mem_cache.hisparse_memory_pool.HiSparseDSATokenToKVPool (@ 009e640a):
    layer_num and kv_buffer, one bf16 [tokens, 1, kv_cache_dim] tensor per layer."""

    def __init__(self):
        self.layer_num = LAYERS
        self.kv_buffer = [torch.zeros((POOL_TOKENS, 1, RECORD // 2), dtype=torch.bfloat16) for _ in range(LAYERS)]

    def records(self, layer: int) -> torch.Tensor:
        return self.kv_buffer[layer].reshape(POOL_TOKENS, -1).view(torch.uint8)


class Allocator:
    """Stand-in for sglang.srt.mem_cache.allocator.hisparse.HiSparseTokenToKVPoolAllocator
    (@ 009e640a): get_kvcache(), alloc(n), free(locs), available_size(). Logical locations index
    the device pool directly here (no full_to_hisparse_device_index_mapping)."""

    def __init__(self):
        self.pool = DevicePool()
        self.free_locs = list(range(1, POOL_TOKENS))  # loc 0 is SGLang's padding slot

    def get_kvcache(self) -> DevicePool:
        return self.pool

    def alloc(self, n: int) -> torch.Tensor:
        out, self.free_locs = self.free_locs[:n], self.free_locs[n:]
        return torch.tensor(out, dtype=torch.int64)

    def free(self, locs) -> None:
        self.free_locs.extend(int(x) for x in locs)

    def available_size(self) -> int:
        return len(self.free_locs)


class Engine:
    """What SGLang's scheduler and model runner do around the coordinator, for these tests."""

    def __init__(self, daemon, max_reqs: int = 6, tp_group=None):
        self.req_pool = ReqToTokenPool(max_reqs, MAX_CTX)
        self.alloc = Allocator()
        self.coord = HisparsedCoordinator(self.req_pool, self.alloc, K, B, "cpu", tp_group, daemon=daemon,
                                          backend="host")
        self.sizes = (self.alloc.available_size(), len(self.req_pool.free_slots))

    def write_kv(self, req: Req, start: int, end: int) -> None:
        """The forward writes the KV of positions [start, end) at freshly allocated locations."""
        locs = self.alloc.alloc(end - start)
        self.req_pool.req_to_token[req.req_pool_idx, start:end] = locs.to(torch.int32)
        for layer in range(LAYERS):
            for loc, pos in zip(locs.tolist(), range(start, end)):
                self.alloc.pool.records(layer)[loc] = kv_bytes(req.seed, layer, pos)

    def prefill(self, req: Req) -> None:
        """A prefill of every token without KV (prompt, or prompt + outputs after a retraction),
        sampling one token, then the batch-result processor's staging call."""
        req.req_pool_idx = self.req_pool.alloc()
        self.write_kv(req, 0, len(req.origin_input_ids) + len(req.output_ids))
        req.output_ids.append(1000 + len(req.output_ids))
        self.coord.admit_request_into_staging(req)

    def free_req(self, req: Req) -> None:
        """release_kv_cache: the engine frees the request's slot and its KV locations."""
        row = self.req_pool.req_to_token[req.req_pool_idx]
        self.alloc.free(row[row != 0].tolist())  # loc 0 is never allocated
        row.zero_()
        self.req_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    def decode(self, reqs, selections, pad_rows: int = 0):
        """One decode step (prepare_for_decode, then every layer's swap-in) with selections[i] the
        top-k positions of reqs[i] (padded with -1); pad_rows graph-padding rows follow. Returns
        the swap-in result of each layer, checked byte for byte."""
        c = self.coord
        seq = [r.kv_len() + 1 for r in reqs]
        for r in reqs:
            self.write_kv(r, r.kv_len(), r.kv_len() + 1)
        idx = torch.tensor([r.req_pool_idx for r in reqs] + [0] * pad_rows, dtype=torch.int64)
        seq_lens = torch.tensor(seq + [1] * pad_rows, dtype=torch.int64)
        out_loc = torch.tensor([int(self.req_pool.req_to_token[r.req_pool_idx, s - 1]) for r, s in zip(reqs, seq)])
        c.map_last_loc_to_buffer(seq_lens[:len(reqs)], out_loc, idx[:len(reqs)], seq_lens[:len(reqs)], idx[:len(reqs)])
        c.num_real_reqs[0] = len(reqs)  # in production the model runner does
        topk = torch.full((len(idx), K), -1, dtype=torch.int32)
        for i, s in enumerate(selections):
            topk[i, :len(s)] = torch.tensor(s, dtype=torch.int32)
        outs = []
        for layer in range(LAYERS):
            out = c.swap_in_selected_pages(idx, seq_lens, topk, layer).clone()
            self.check(reqs, seq, topk, out, layer, pad_rows)
            outs.append(out)
        for r in reqs:
            r.output_ids.append(1000 + len(r.output_ids))
        return outs

    def check(self, reqs, seq, topk, out, layer, pad_rows) -> None:
        arena = self.coord.attention_kv_buffer(layer)
        for i, r in enumerate(reqs):
            for j in range(K):
                pos = int(topk[i, j])
                if pos < 0 or j >= seq[i]:
                    assert int(out[i, j]) == -1, (r.rid, j)
                    continue
                got = arena[int(out[i, j]), :RECORD]
                assert torch.equal(torch.as_tensor(got), kv_bytes(r.seed, layer, pos)), (r.rid, layer, pos)
                host = self.coord.session.record_view(self.coord._entries[r.rid].request_id, layer, pos)[0]
                assert bytes(host) == bytes(kv_bytes(r.seed, layer, pos).numpy()), (r.rid, layer, pos)
        for i in range(len(reqs), len(reqs) + pad_rows):
            assert (out[i] == -1).all()

    def finish(self, req: Req) -> None:
        self.coord.request_finished(req)
        self.free_req(req)

    def assert_sizes_restored(self) -> None:
        st = self.coord.session.stats()
        assert (st.session_requests, st.requests, st.session_host_bytes, st.pool_used_bytes) == (0, 0, 0, 0)
        assert (self.alloc.available_size(), len(self.req_pool.free_slots)) == self.sizes
        assert (self.coord.row_of_pool_idx == -1).all()
        assert not self.coord.has_ongoing_staging()


@pytest.fixture(scope="module")
def small_page_daemon():
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB", "--set", "import.enabled=true"]) as d:
        yield d


@pytest.fixture
def engine(small_page_daemon):
    e = Engine(small_page_daemon)
    yield e
    e.coord.destroy()


def test_staging_lifecycle(engine):
    e = engine
    req = Req("a", seed=1, prompt_len=40)
    e.prefill(req)
    assert req.hisparse_staging and e.coord.has_ongoing_staging()
    assert e.coord.collect_ready_reqs() == [req]
    assert not req.hisparse_staging and e.coord.collect_ready_reqs() == []
    e.decode([req], [[0, 17, 39, 40]])  # 40: the token this step appends
    e.decode([req], [[3, 17, 38, 41]])
    e.decode([req], [[42, 1, 2, 30]])
    stats = e.coord.get_token_stats()
    assert stats.device_tokens == B + 1 and stats.host_tokens >= 43
    e.finish(req)
    e.assert_sizes_restored()


def test_mixed_short_and_long_requests_in_one_batch(engine):
    e = engine
    reqs = [Req("short2", 2, 2), Req("short8", 3, 7), Req("long30", 4, 30), Req("long50", 5, 50)]
    for r in reqs:
        e.prefill(r)
    assert e.coord.collect_ready_reqs() == reqs
    # short2 (seq_len 3): column 3 holds a valid-looking number but is past seq_len, so it is -1.
    sels = [[2, 0, 1, 1], [7, 6, 0, 3], [5, 29, 30, -1], [49, 50, 0, 25]]
    e.decode(reqs, sels, pad_rows=1)
    e.decode(reqs[2:], [[31, 30, 5, 6], [12, 49, 51, 50]], pad_rows=2)
    for r in reqs:
        e.finish(r)
    e.assert_sizes_restored()


def test_lru_replacement_across_steps(engine):
    e = engine
    req = Req("lru", seed=9, prompt_len=60)
    e.prefill(req)
    e.coord.collect_ready_reqs()
    first = e.decode([req], [[0, 1, 2, 3]])
    s0 = e.coord.session.stats()
    second = e.decode([req], [[0, 1, 10, 11]])  # two hits, two misses
    s1 = e.coord.session.stats()
    assert s1.misses - s0.misses == 2 * LAYERS
    for layer in range(LAYERS):
        assert second[layer][0, :2].tolist() == first[layer][0, :2].tolist()  # hits stay put
    # B = 8: four misses take the two empty slots, then the least recent: those of 2 and 3.
    third = e.decode([req], [[20, 21, 22, 23]])
    # Then the least recent are 10's and 11's (0 and 1 were hits after them): 30 and 31 take them.
    fourth = e.decode([req], [[0, 1, 30, 31]])
    for layer in range(LAYERS):
        assert set(first[layer][0, 2:].tolist()) < set(third[layer][0].tolist())
        assert not set(second[layer][0, 2:].tolist()) & set(third[layer][0].tolist())
        assert set(fourth[layer][0, 2:].tolist()) == set(second[layer][0, 2:].tolist())
        assert fourth[layer][0, :2].tolist() == first[layer][0, :2].tolist()
    e.finish(req)
    e.assert_sizes_restored()


def test_retraction_parks_and_readmission_resumes(engine):
    e = engine
    a, b = Req("a", 11, 30), Req("b", 12, 20)
    for r in (a, b):
        e.prefill(r)
    e.coord.collect_ready_reqs()
    e.decode([a, b], [[0, 29, 30, 5], [19, 20, 1, 2]])
    host_bytes = e.coord.session.stats().session_host_bytes
    row_a = int(e.coord.row_of_pool_idx[a.req_pool_idx])
    e.coord.retract_req(a)  # SGLang then frees the request's slot and KV and re-queues it
    e.free_req(a)
    assert e.coord.session.stats().session_host_bytes == host_bytes  # the host copy stays
    assert row_a not in e.coord.row_of_pool_idx.tolist()
    with pytest.raises(hisparse.FailedPrecondition):
        e.coord.retract_req(a)  # parked already
    e.decode([b], [[21, 3, 4, 5]])
    e.prefill(a)  # re-prefill of prompt + outputs: the coordinator resumes the parked request
    assert e.coord.collect_ready_reqs() == [a]
    e.decode([a, b], [[0, 30, 31, 32], [22, 1, 2, 3]])
    e.decode([a], [[33, 1, 2, 29]])
    for r in (a, b):
        e.finish(r)
    e.assert_sizes_restored()


def test_batched_retraction_parks_every_request_in_one_call(engine):
    """retract_reqs: a staging request is aborted, every ready one parked with one park_batch; each
    then resumes on re-admission and decodes exactly; an all-or-nothing refusal parks none."""
    e = engine
    reqs = [Req("r1", 21, 30), Req("r2", 22, 25), Req("r3", 23, 12)]
    for r in reqs:
        e.prefill(r)
    e.coord.collect_ready_reqs()
    e.decode(reqs, [[0, 29, 30, 5], [24, 25, 1, 2], [11, 12, 3, 4]])
    staging = Req("s", 24, 10)
    e.prefill(staging)  # still staging: retraction aborts it
    host_bytes = e.coord.session.stats().session_host_bytes
    parks = e.coord.session.park_batch
    calls = []
    e.coord.session.park_batch = lambda ids, **kw: calls.append(list(ids)) or parks(ids, **kw)
    try:
        e.coord.retract_reqs(reqs[:2] + [staging])
    finally:
        del e.coord.session.park_batch
    assert len(calls) == 1 and len(calls[0]) == 2  # one round trip for both ready requests
    for r in reqs[:2] + [staging]:
        e.free_req(r)
    assert e.coord.session.stats().session_host_bytes < host_bytes  # the staging one's pages went
    ids = [e.coord._entries[r.rid].request_id for r in reqs[:2]]
    assert [type(x) for x in e.coord.session.park_batch(ids, all_or_nothing=False)] == \
        [hisparse.FailedPrecondition] * 2  # both parked in the daemon
    with pytest.raises(hisparse.FailedPrecondition):
        e.coord.retract_reqs([reqs[2], reqs[0]])  # r1 is parked already: nothing is parked
    for r in reqs[:2]:
        e.prefill(r)  # re-admission resumes each
    assert e.coord.collect_ready_reqs() == reqs[:2]
    e.decode(reqs, [[0, 30, 31, 7], [25, 26, 1, 3], [13, 12, 5, 6]])
    for r in reqs:
        e.finish(r)
    e.assert_sizes_restored()


def _import_word(request: int, layer: int, position: int, word: int) -> int:
    """hisparse/common/import_pattern.h's ImportPatternWord (as tests/python/test_import.py)."""
    m = (1 << 64) - 1
    z = IMPORT_SEED ^ ((request * 0x9E3779B97F4A7C15) & m) ^ (layer << 48) ^ (position << 16) ^ word
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_direct_pd_lifecycle(engine, small_page_daemon, tmp_path):
    e = engine
    bench = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-bench"
    if not bench.exists():
        pytest.skip(f"{bench} is not built (it is the transfer agent here)")
    req = Req("pd", seed=0, prompt_len=40)
    req.output_ids.append(1000)  # the prefill node sampled the first token
    try:
        grant = e.coord.prealloc_direct(req)
    except hisparse.FailedPrecondition as err:
        pytest.skip(f"the daemon serves no imports: {err}")
    with pytest.raises(hisparse.FailedPrecondition):
        e.coord.prealloc_direct(req)
    (tmp_path / "grant").write_bytes(grant)
    subprocess.run([str(bench), "import", "--daemon", small_page_daemon.address, "--grant", str(tmp_path / "grant"),
                    "--seed", str(IMPORT_SEED)], check=True, capture_output=True, timeout=120)
    req.req_pool_idx = e.req_pool.alloc()
    e.coord.admit_request_direct(req)
    rid = e.coord._entries[req.rid].request_id
    # The decode step appends token 40 from the engine's pool; the imported 0..39 come from the agent.
    e.write_kv(req, 40, 41)
    c = e.coord
    idx = torch.tensor([req.req_pool_idx])
    seq = torch.tensor([41])
    c.map_last_loc_to_buffer(seq, e.req_pool.req_to_token[req.req_pool_idx, 40:41].long(), idx, seq, idx)
    c.num_real_reqs[0] = 1
    arena = c.attention_kv_buffer()
    for layer in range(LAYERS):
        out = c.swap_in_selected_pages(idx, seq, torch.tensor([[0, 39, 40, 17]], dtype=torch.int32), layer)
        for j, pos in enumerate([0, 39, 17]):
            col = [0, 1, 3][j]
            want = b"".join(struct.pack("<Q", _import_word(rid, layer, pos, w)) for w in range(RECORD // 8))
            assert bytes(torch.as_tensor(arena[int(out[0, col]), :RECORD]).numpy()) == want, (layer, pos)
        assert torch.equal(torch.as_tensor(arena[int(out[0, 2]), :RECORD]), kv_bytes(0, layer, 40))
    e.finish(req)
    e.assert_sizes_restored()


def test_bad_calls_are_refused_and_lose_nothing(engine):
    e = engine
    req = Req("x", 3, 10)
    with pytest.raises(hisparse.FailedPrecondition):
        e.coord.admit_request_direct(req)  # no import granted
    with pytest.raises(hisparse.NotFound):
        e.coord.retract_req(req)
    e.prefill(req)
    with pytest.raises(hisparse.FailedPrecondition):
        e.coord.admit_request_into_staging(req)  # twice
    e.coord.abort_staging_request(req)
    assert not e.coord.has_ongoing_staging()
    e.free_req(req)
    e.assert_sizes_restored()

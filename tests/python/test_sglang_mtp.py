"""hisparse.integrations.sglang_mtp.HisparsedMTPCoordinator driven as SGLang's EAGLE/MTP worker
drives HiSparseMTPCoordinator (sgl-project/sglang PR #37771): per round, each request's N verify
tokens (the last verified token and N - 1 drafts) get KV locations (assign_spec_ring_slots_batch),
the verify forward writes their KV, every layer calls swap_in_verify_pages with the fused top-k's
logical ids [bs * N, k], a random count of them is accepted, the rejected drafts' locations are
freed and backup_committed_tokens runs. Host backend, a real hisparsed, the stand-ins of
test_sglang_adapter.py. Every index returned is checked byte for byte against the KV the
position holds now (a rejected draft's position holds the next round's token), the host pool
too; one request is retracted (parked) and re-admitted in the middle; every size is restored.
"""

from __future__ import annotations

import pytest

import hisparse
from conftest import _daemon_or_skip, _library_or_skip

torch = pytest.importorskip("torch")
import test_sglang_adapter as sa  # noqa: E402
from hisparse.integrations.sglang_mtp import HisparsedMTPCoordinator  # noqa: E402

N, K, B = 3, sa.K, 12  # 3 verify tokens a request, B = N * k: no union can be refused


@pytest.fixture(scope="module")
def small_page_daemon():
    """test_sglang_adapter.py's daemon: 4 KiB pages (64 records of 64 bytes)."""
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB"]) as d:
        yield d


class MtpEngine:
    """SGLang's scheduler + EAGLE worker around the MTP coordinator, for these tests; expected[(rid,
    layer, position)] is the record the position holds now."""

    def __init__(self, daemon):
        self.req_pool = sa.ReqToTokenPool(4, sa.MAX_CTX)
        self.alloc = sa.Allocator()
        self.coord = HisparsedMTPCoordinator(self.req_pool, self.alloc, K, B, "cpu", None, num_draft_tokens=N,
                                             spec_ring_capacity=64, daemon=daemon, backend="host")
        self.sizes = (self.alloc.available_size(), len(self.req_pool.free_slots))
        self.expected = {}
        self.gen = torch.Generator().manual_seed(5)

    def write(self, req, start, end, salt=0):
        locs = self.alloc.alloc(end - start)
        self.req_pool.req_to_token[req.req_pool_idx, start:end] = locs.to(torch.int32)
        for layer in range(sa.LAYERS):
            for loc, pos in zip(locs.tolist(), range(start, end)):
                rec = sa.kv_bytes(req.seed + salt, layer, pos)
                self.alloc.pool.records(layer)[loc] = rec
                self.expected[(req.rid, layer, pos)] = rec

    def prefill(self, req, readmit=False):
        """Prefill of every position before the last output token, then staging. A re-admission's
        prefill writes the prompt pattern everywhere; the parked host copy must win."""
        req.req_pool_idx = self.req_pool.alloc()
        n = req.kv_len()
        if readmit:
            keep = dict(self.expected)
            self.write(req, 0, n, salt=77)
            self.expected = keep
        else:
            self.write(req, 0, n)
        self.coord.admit_request_into_staging(req)

    def free_req(self, req):
        row = self.req_pool.req_to_token[req.req_pool_idx]
        self.alloc.free(row[row != 0].tolist())
        row.zero_()
        self.req_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    def verify_round(self, reqs, rnd, pad_rows=1):
        """One EAGLE round over reqs; returns the accepted counts."""
        c = self.coord
        starts = [r.kv_len() for r in reqs]
        for r, s in zip(reqs, starts):
            self.write(r, s, s + N, salt=1000 * (rnd + 1))  # the verify forward's KV of its N tokens
        c.assign_spec_ring_slots_batch(reqs, starts, [s + N for s in starts])
        c.wait_admission_staging_before_verify(reqs)
        bs = len(reqs) + pad_rows
        idx = torch.tensor([r.req_pool_idx for r in reqs] + [0] * pad_rows, dtype=torch.int64)
        seq = torch.tensor(starts + [1] * pad_rows, dtype=torch.int64)
        pos = torch.full((bs, N, K), -1, dtype=torch.int64)
        for i, s in enumerate(starts):
            for t in range(N):
                pick = torch.randperm(s + t + 1, generator=self.gen)[:K]
                if t == 0 and len(pick) == K:
                    pick[-1] = -1  # a padded column
                pos[i, t, :len(pick)] = pick
        ids = torch.full((bs, N, K), -1, dtype=torch.int32)
        for i, r in enumerate(reqs):
            row = self.req_pool.req_to_token[r.req_pool_idx]
            ids[i] = torch.where(pos[i] >= 0, row[pos[i].clamp(min=0)], torch.full_like(ids[i], -1))
        c.num_real_reqs[0] = len(reqs)
        arena = c.attention_kv_buffer()
        for layer in range(sa.LAYERS):
            out = c.swap_in_verify_pages(idx, seq, ids.view(bs * N, K), layer, N).view(bs, N, K)
            for i, r in enumerate(reqs):
                for t in range(N):
                    for j in range(K):
                        p = int(pos[i, t, j])
                        if p < 0:
                            assert int(out[i, t, j]) == -1
                            continue
                        got = torch.as_tensor(arena[int(out[i, t, j]), :sa.RECORD])
                        assert torch.equal(got, self.expected[(r.rid, layer, p)]), (rnd, r.rid, layer, t, p)
            assert (out[len(reqs):] == -1).all()
        accepted = []
        for r, s in zip(reqs, starts):
            a = int(torch.randint(1, N + 1, (1,), generator=self.gen))
            accepted.append(a)
            row = self.req_pool.req_to_token[r.req_pool_idx]
            self.alloc.free(row[s + a:s + N].tolist())  # SGLang frees the rejected drafts' KV
            row[s + a:s + N] = 0
            for layer in range(sa.LAYERS):
                for p in range(s + a, s + N):
                    del self.expected[(r.rid, layer, p)]
            r.output_ids += [2000 + rnd] * a
            r.kv_committed_len = s + a
        c.backup_committed_tokens(reqs)
        return accepted

    def check_host(self, req):
        rid = self.coord._entries[req.rid].request_id
        for layer in range(sa.LAYERS):
            for p in range(req.kv_len()):
                host = bytes(self.coord.session.record_view(rid, layer, p)[0])
                assert host == bytes(self.expected[(req.rid, layer, p)].numpy()), (req.rid, layer, p)


@pytest.fixture
def mtp(small_page_daemon):
    e = MtpEngine(small_page_daemon)
    yield e
    e.coord.destroy()


@pytest.mark.parametrize("batched", [False, True], ids=["retract_req", "retract_reqs"])
def test_verify_rounds_with_rejections_retraction_and_short_requests(mtp, batched):
    e = mtp
    a, b, c = sa.Req("a", 1, 30), sa.Req("b", 2, 3), sa.Req("c", 3, 14)
    for r in (a, b, c):
        r.output_ids.append(1000)  # the prefill's token
        e.prefill(r)
    assert e.coord.collect_ready_reqs() == [a, b, c]
    accepted = []
    for rnd in range(3):
        accepted += e.verify_round([a, b, c], rnd)
    if batched:
        locs = e.req_pool.req_to_token[b.req_pool_idx, :b.kv_len()].long()
        assert (e.coord.token_position[locs] >= 0).all()
        e.coord.retract_reqs([b])  # the batched form: one park_batch, the position map cleared too
        assert (e.coord.token_position[locs] == -1).all()
    else:
        e.coord.retract_req(b)  # parked; SGLang frees its slot and KV and re-queues it
    e.free_req(b)
    for rnd in range(3, 5):
        accepted += e.verify_round([a, c], rnd, pad_rows=2)
    e.prefill(b, readmit=True)
    assert e.coord.collect_ready_reqs() == [b]
    for rnd in range(5, 8):
        accepted += e.verify_round([a, b, c], rnd)
    assert 1 in accepted and N in accepted, "rounds must both reject and accept every draft"
    for r in (a, b, c):
        e.check_host(r)
    st = e.coord.session.stats()
    assert st.misses > 0 and st.hits > 0
    for r in (a, b, c):
        e.coord.request_finished(r)
        e.free_req(r)
    st = e.coord.session.stats()
    assert (st.session_requests, st.session_host_bytes, st.pool_used_bytes) == (0, 0, 0)
    assert (e.alloc.available_size(), len(e.req_pool.free_slots)) == e.sizes
    assert (e.coord.row_of_pool_idx == -1).all()


def test_bad_verify_calls_are_refused(mtp):
    e = mtp
    r = sa.Req("x", 4, 10)
    r.output_ids.append(1000)
    e.prefill(r)
    e.coord.collect_ready_reqs()
    idx, seq = torch.tensor([r.req_pool_idx]), torch.tensor([r.kv_len()])
    with pytest.raises(hisparse.FailedPrecondition):
        e.coord.swap_in_selected_pages(idx, seq, torch.full((1, K), -1, dtype=torch.int32), 0)
    with pytest.raises(hisparse.InvalidArgument):
        e.coord.swap_in_verify_pages(idx, seq, torch.full((N + 1, K), -1, dtype=torch.int32), 0, N + 1)
    with pytest.raises(hisparse.InvalidArgument):
        e.coord.swap_in_verify_pages(idx, seq, torch.full((N, K + 1), -1, dtype=torch.int32), 0, N)
    with pytest.raises(hisparse.InvalidArgument):
        HisparsedMTPCoordinator(e.req_pool, e.alloc, K, B, "cpu", None, num_draft_tokens=9, backend="host")
    ghost = sa.Req("ghost", 5, 10)  # a stale Req naming x's slot: refused, x's position map intact
    ghost.req_pool_idx = r.req_pool_idx
    before = e.coord.token_position.clone()
    with pytest.raises(hisparse.NotFound):
        e.coord.retract_req(ghost)
    assert torch.equal(e.coord.token_position, before)
    with pytest.raises(hisparse.NotFound):
        e.coord.retract_reqs([r, ghost])  # nothing retracted, x's position map intact
    assert torch.equal(e.coord.token_position, before)
    e.coord.request_finished(r)
    e.free_req(r)
    assert e.coord.session.stats().session_requests == 0

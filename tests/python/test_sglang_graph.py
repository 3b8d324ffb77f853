"""HisparsedCoordinator's decode path inside a CUDA graph, as SGLang's CudaGraphRunner runs it:
the forward (the KV write through the mapping, then swap_in_selected_pages, per layer) captured
once for a padded batch of 4 and replayed every step, after map_last_loc_to_buffer (outside the
graph) has pointed the step's logical locations at the requests' reserved slots. The batch
shrinks from 3 requests to 2; every index the replay returns is checked in the arena
(get_key_buffer) against the selected position's record. Stand-ins: examples/engine/
sglang_standins.py. cuda: the CUDA backend and a real graph; cpu: the same steps eagerly.
"""

from __future__ import annotations

import pytest

import hisparse

torch = pytest.importorskip("torch")
from hisparse.integrations.sglang import HisparsedCoordinator  # noqa: E402
from sglang_standins import HiSparseAllocator, HiSparseDSAPool, ReqToTokenPool, Req, kv_record  # noqa: E402

LAYERS, RECORD, K, B, PHYSICAL = 2, 64, 4, 8, 256


@pytest.fixture(params=["cuda", "cpu"])
def where(request, daemon):
    if request.param == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        with hisparse.Session(daemon, num_layers=1, record_bytes=16, k=1, slots=1, max_requests=1, gpu=0,
                              backend="cuda"):
            pass
    except hisparse.Unimplemented as err:
        pytest.skip(f"libhisparse built without CUDA: {err}")
    return "cuda"


class Replayer:
    """forward() captured in a CUDA graph on first use (after a warm-up, as SGLang's graph runner)
    and replayed after; on the CPU called each time."""

    def __init__(self, forward, where):
        self.forward, self.cuda, self.graph = forward, where == "cuda", None

    def __call__(self):
        if not self.cuda:
            self.forward()
            return
        if self.graph is None:
            dev = torch.device("cuda", 0)
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                self.forward()
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph, stream=side):
                    self.forward()
            torch.cuda.current_stream(dev).wait_stream(side)
        self.graph.replay()
        torch.cuda.synchronize()


def test_decode_replays_in_a_cuda_graph_through_the_mapping(daemon, where):
    dev = torch.device("cuda", 0) if where == "cuda" else torch.device("cpu")
    pool = HiSparseDSAPool(LAYERS, PHYSICAL, RECORD, dev)
    alloc = HiSparseAllocator(pool, PHYSICAL)
    r2t = ReqToTokenPool(4, 64, dev)
    coord = HisparsedCoordinator(r2t, alloc, K, B, str(dev), None, daemon=daemon,
                                 backend="cuda" if where == "cuda" else "host")
    try:
        reqs = [Req(f"g{i}", 20 + i, n) for i, n in enumerate([30, 12, 5])]
        for r in reqs:  # prefill: both spaces, then staging
            r.req_pool_idx = r2t.alloc()
            n = r.seqlen - 1
            logical = alloc.alloc_extend(n)
            r2t.req_to_token[r.req_pool_idx, :n] = logical.to(dev, torch.int32)
            for layer in range(LAYERS):
                pool.set_mla_kv_buffer(layer, logical.to(dev),
                                       torch.stack([kv_record(r.seed, layer, p, RECORD) for p in range(n)]))
            r.kv = Req.KvInfo(n)
            coord.admit_request_into_staging(r)
        if where == "cuda":
            torch.cuda.synchronize()
        assert coord.collect_ready_reqs() == reqs
        bs = 4
        idx = torch.tensor([r.req_pool_idx for r in reqs] + [0], dtype=torch.int64, device=dev)
        seq_lens = torch.ones(bs, dtype=torch.int32, device=dev)
        topk = torch.full((bs, K), -1, dtype=torch.int32, device=dev)
        out_loc = torch.zeros(bs, dtype=torch.int64, device=dev)
        newest = torch.zeros(LAYERS, bs, RECORD, dtype=torch.uint8, device=dev)
        out = torch.full((LAYERS, bs, K), -1, dtype=torch.int32, device=dev)

        def forward():
            for layer in range(LAYERS):
                pool.set_mla_kv_buffer(layer, out_loc, newest[layer])
                out[layer].copy_(coord.swap_in_selected_pages(idx, seq_lens, topk, layer))

        coord.num_real_reqs.fill_(3)
        replay = Replayer(forward, where)
        replay()  # the capture, before any map_last_loc_to_buffer (writes land in padding slot 0)
        gen = torch.Generator().manual_seed(3)
        for step in range(6):
            live = reqs[:3] if step < 3 else reqs[:2]
            n = len(live)
            seq = [r.seqlen for r in live]
            locs = alloc.alloc_decode(n).to(dev)
            for r, s, loc in zip(live, seq, locs.tolist()):
                r2t.req_to_token[r.req_pool_idx, s - 1] = loc
                r.kv.kv_allocated_len = s
            coord.map_last_loc_to_buffer(torch.tensor(seq, device=dev), locs, idx[:n].clone())
            sel = torch.full((bs, K), -1, dtype=torch.int32)
            for i, s in enumerate(seq):
                pick = torch.cat([torch.tensor([s - 1]), torch.randperm(s - 1, generator=gen)[:K - 1]])
                sel[i, :len(pick)] = pick.to(torch.int32)
            out_loc.zero_()
            out_loc[:n] = locs
            newest.zero_()
            for layer in range(LAYERS):
                for i, (r, s) in enumerate(zip(live, seq)):
                    newest[layer, i] = kv_record(r.seed, layer, s - 1, RECORD).to(dev)
            seq_lens.copy_(torch.tensor(seq + [1] * (bs - n), dtype=torch.int32))
            topk.copy_(sel)
            coord.num_real_reqs.fill_(n)
            replay()
            table = out.cpu()
            for layer in range(LAYERS):
                kv = coord.get_key_buffer(layer)  # what forward_decode's get_key_buffer returns
                arena = kv.reshape(kv.shape[0], -1).cpu()
                for i, r in enumerate(live):
                    for j in range(K):
                        pos = int(sel[i, j])
                        if pos < 0:
                            assert int(table[layer, i, j]) == -1
                            continue
                        got = arena[int(table[layer, i, j]), :RECORD]
                        assert torch.equal(got, kv_record(r.seed, layer, pos, RECORD)), (step, layer, r.rid, pos)
                assert (table[layer, n:] == -1).all()
            for r in live:
                r.output_ids.append(len(r.output_ids))
        coord.session.check_errors()
        del replay
        for r in reqs:
            coord.request_finished(r)
            alloc.free(r2t.req_to_token[r.req_pool_idx, :r.kv.kv_allocated_len].to(torch.int64))
        assert coord.session.stats().session_requests == 0
        assert alloc.hisparse_attn_allocator.available_size() == PHYSICAL
    finally:
        coord.destroy()

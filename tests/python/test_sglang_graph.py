"""The SGLang adapter's decode path is graph-safe (hisparse.integrations.sglang): what
swap_in_selected_pages hands the kernels must not change between decode steps, because a CUDA
graph captured once (SGLang's CudaGraphRunner, per padded batch size) replays the same launches
on the same addresses every step, including the first capture before any map_last_loc_to_buffer.

On the host backend the test records every Session data-path call (method, layer, the address and
size of every buffer, every scalar) and holds each step's sequence equal to the capture's; the
GPU test captures the swap-in of every layer in a real torch.cuda.CUDAGraph and replays it over
steps whose batch shrinks, checking the bytes attention would read (skipped without CUDA).
"""

from __future__ import annotations

import pytest

import hisparse
from conftest import _daemon_or_skip, _library_or_skip

torch = pytest.importorskip("torch")
import test_sglang_adapter as sa  # noqa: E402
from test_sglang_adapter import K, LAYERS, Engine, Req  # noqa: E402


@pytest.fixture(scope="module")
def small_page_daemon():
    """test_sglang_adapter.py's daemon: 4 KiB pages (64 records of 64 bytes), imports on."""
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB", "--set", "import.enabled=true"]) as d:
        yield d


class CallRecorder:
    """Wraps a Session: append / resolve calls are recorded as (method, layer, buffers, scalars)."""

    def __init__(self, session):
        self.session, self.calls = session, []

    @staticmethod
    def _key(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", value.data_ptr(), tuple(value.shape), value.dtype)
        return value

    def wrap(self, name):
        real = getattr(self.session, name)

        def call(*args, **kwargs):
            self.calls.append((name,) + tuple(self._key(a) for a in args) +
                              tuple((k, self._key(v)) for k, v in sorted(kwargs.items())))
            return real(*args, **kwargs)
        setattr(self.session, name, call)


def swap_in_all_layers(e, idx, seq_lens, topk):
    return [e.coord.swap_in_selected_pages(idx, seq_lens, topk, layer).clone() for layer in range(LAYERS)]


def test_swap_in_issues_the_same_launches_every_step(small_page_daemon):
    e = Engine(small_page_daemon)
    try:
        reqs = [Req("a", 1, 30), Req("b", 2, 12), Req("c", 3, 5)]
        for r in reqs:
            e.prefill(r)
        assert e.coord.collect_ready_reqs() == reqs
        rec = CallRecorder(e.coord.session)
        rec.wrap("append")
        rec.wrap("resolve")
        bs = 4  # the captured batch: three requests and a padding row
        idx = torch.tensor([r.req_pool_idx for r in reqs] + [0], dtype=torch.int64)
        # "Capture": the graph runner runs the forward once with dummy inputs, before any
        # map_last_loc_to_buffer; the launches it records are the ones every replay makes.
        e.coord.num_real_reqs[0] = 3
        swap_in_all_layers(e, idx, torch.tensor([r.kv_len() for r in reqs] + [1]),
                           torch.full((bs, K), -1, dtype=torch.int32))
        captured, rec.calls = rec.calls, []
        assert [c[0] for c in captured] == ["append", "resolve"] * LAYERS, "the capture must contain the appends"
        sels = [[[0, 29, 30, 4], [11, 12, 0, 1], [5, 0, 1, 2]],
                [[31, 1, 2, 3], [13, 10, 9, 8], [0, 6, 3, 4]],
                [[32, 7, 8, 9], [14, 13, 2, 3], [7, 6, 5, 4]]]
        for step, sel in enumerate(sels):
            live = reqs[:3 - step // 2]  # the third step runs with one request fewer
            e.decode(live, sel[:len(live)], pad_rows=bs - len(live))  # checks every byte
            assert rec.calls == captured, f"decode step {step} launched differently from the capture"
            rec.calls = []
        for r in reqs:
            e.finish(r)
        e.assert_sizes_restored()
    finally:
        e.coord.destroy()


@pytest.fixture
def cuda_ok(small_page_daemon):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        with hisparse.Session(small_page_daemon, num_layers=1, record_bytes=16, k=1, slots=1, max_requests=1, gpu=0,
                              backend="cuda"):
            pass
    except hisparse.Unimplemented as err:
        pytest.skip(f"libhisparse built without CUDA: {err}")


class _CudaPool:
    """HiSparseDSATokenToKVPool + HiSparseTokenToKVPoolAllocator + ReqToTokenPool (sgl-project/sglang
    @ 009e640a) on cuda:0, as test_sglang_adapter.py's CPU stand-ins."""

    def __init__(self, tokens: int, max_reqs: int, max_ctx: int):
        dev = torch.device("cuda", 0)
        self.layer_num = LAYERS
        self.kv_buffer = [torch.zeros(tokens, 1, sa.RECORD // 2, dtype=torch.bfloat16, device=dev)
                          for _ in range(LAYERS)]
        self.req_to_token = torch.zeros(max_reqs, max_ctx, dtype=torch.int32, device=dev)
        self.next_loc = 1

    def get_kvcache(self):
        return self

    def write(self, seed: int, pool_idx: int, start: int, end: int) -> torch.Tensor:
        locs = torch.arange(self.next_loc, self.next_loc + end - start, dtype=torch.int64)
        self.next_loc += end - start
        self.req_to_token[pool_idx, start:end] = locs.to(self.req_to_token)
        for layer in range(LAYERS):
            recs = torch.stack([sa.kv_bytes(seed, layer, p) for p in range(start, end)])
            self.kv_buffer[layer].view(torch.uint8).view(-1, sa.RECORD)[locs.cuda()] = recs.cuda()
        return locs


def test_swap_in_replays_in_a_cuda_graph(small_page_daemon, cuda_ok):
    """Every layer's swap-in captured once (bs 4) and replayed over 6 steps, the batch shrinking
    from 3 requests to 2: the bytes at every returned index are the selected position's."""
    from hisparse.integrations.sglang import HisparsedCoordinator

    pool = _CudaPool(1024, 4, sa.MAX_CTX)
    coord = HisparsedCoordinator(pool, pool, K, sa.B, "cuda:0", None, daemon=small_page_daemon, backend="cuda")
    try:
        lens = [30, 12, 5]
        reqs = [Req(f"g{i}", 20 + i, n) for i, n in enumerate(lens)]
        for i, r in enumerate(reqs):
            r.req_pool_idx = i
            pool.write(r.seed, i, 0, lens[i])
            r.output_ids.append(1000)
            coord.admit_request_into_staging(r)
        torch.cuda.synchronize()
        assert coord.collect_ready_reqs() == reqs
        bs, dev = 4, torch.device("cuda", 0)
        idx = torch.tensor([0, 1, 2, 0], dtype=torch.int64, device=dev)
        seq_lens = torch.ones(bs, dtype=torch.int64, device=dev)
        topk = torch.full((bs, K), -1, dtype=torch.int32, device=dev)
        out = torch.full((LAYERS, bs, K), -1, dtype=torch.int32, device=dev)

        def forward():
            for layer in range(LAYERS):
                out[layer].copy_(coord.swap_in_selected_pages(idx, seq_lens, topk, layer))

        coord.num_real_reqs.fill_(3)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            forward()  # warm-up, as SGLang's graph runner
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                forward()
        torch.cuda.current_stream(dev).wait_stream(side)
        gen = torch.Generator().manual_seed(3)
        for step in range(6):
            live = reqs[:3] if step < 3 else reqs[:2]
            seq = [r.kv_len() + 1 for r in live]
            locs = torch.cat([pool.write(r.seed, r.req_pool_idx, s - 1, s) for r, s in zip(live, seq)])
            n = len(live)
            sel = torch.full((bs, K), -1, dtype=torch.int32)
            for i, s in enumerate(seq):
                pick = torch.randperm(s, generator=gen)[:K]
                sel[i, :len(pick)] = pick.to(torch.int32)
            coord.map_last_loc_to_buffer(torch.tensor(seq, device=dev), locs.to(dev), idx[:n].clone())
            seq_lens.copy_(torch.tensor(seq + [1] * (bs - n)))
            topk.copy_(sel)
            coord.num_real_reqs.fill_(n)
            graph.replay()
            torch.cuda.synchronize()
            arena = coord.attention_kv_buffer().cpu()
            table = out.cpu()
            for layer in range(LAYERS):
                for i, r in enumerate(live):
                    for j in range(K):
                        pos = int(sel[i, j])
                        if pos < 0:
                            assert int(table[layer, i, j]) == -1
                            continue
                        got = arena[int(table[layer, i, j]), :sa.RECORD]
                        assert torch.equal(got, sa.kv_bytes(r.seed, layer, pos)), (step, layer, r.rid, pos)
                assert (table[layer, n:] == -1).all()
            for r in live:
                r.output_ids.append(1000 + len(r.output_ids))
        coord.session.check_errors()
        del graph
        for r in reqs:
            coord.request_finished(r)
        assert coord.session.stats().session_requests == 0
    finally:
        coord.destroy()

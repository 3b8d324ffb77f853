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


@pytest.fixture(params=["cuda", "cpu"])
def where(request, small_page_daemon):
    """cuda: the CUDA backend, the swap-ins captured in a CUDA graph and replayed; cpu: the same
    steps on the host backend, eager (the graph's launches run as calls)."""
    if request.param == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        with hisparse.Session(small_page_daemon, num_layers=1, record_bytes=16, k=1, slots=1, max_requests=1, gpu=0,
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


class _Pool:
    """HiSparseDSATokenToKVPool + HiSparseTokenToKVPoolAllocator + ReqToTokenPool (sgl-project/sglang
    @ 009e640a) on one device, as test_sglang_adapter.py's CPU stand-ins."""

    def __init__(self, tokens: int, max_reqs: int, max_ctx: int, where: str):
        dev = torch.device("cuda", 0) if where == "cuda" else torch.device("cpu")
        self.device = dev
        self.layer_num = LAYERS
        self.kv_buffer = [torch.zeros(tokens, 1, sa.RECORD // 2, dtype=torch.bfloat16, device=dev)
                          for _ in range(LAYERS)]
        self.req_to_token = torch.zeros(max_reqs, max_ctx, dtype=torch.int32, device=dev)
        self.next_loc = 1
        self.expected = {}  # (seed, layer, position) -> the record the position holds now

    def get_kvcache(self):
        return self

    def write(self, seed: int, pool_idx: int, start: int, end: int, salt: int = 0) -> torch.Tensor:
        locs = torch.arange(self.next_loc, self.next_loc + end - start, dtype=torch.int64)
        self.next_loc += end - start
        self.req_to_token[pool_idx, start:end] = locs.to(self.req_to_token)
        for layer in range(LAYERS):
            recs = torch.stack([sa.kv_bytes(seed + salt, layer, p) for p in range(start, end)])
            for p, rec in zip(range(start, end), recs):
                self.expected[(seed, layer, p)] = rec
            self.kv_buffer[layer].view(torch.uint8).view(-1, sa.RECORD)[locs.to(self.device)] = recs.to(self.device)
        return locs.to(self.device)


def test_swap_in_replays_in_a_cuda_graph(small_page_daemon, where):
    """Every layer's swap-in captured once (bs 4) and replayed over 6 steps, the batch shrinking
    from 3 requests to 2: the bytes at every returned index are the selected position's."""
    from hisparse.integrations.sglang import HisparsedCoordinator

    pool = _Pool(1024, 4, sa.MAX_CTX, where)
    coord = HisparsedCoordinator(pool, pool, K, sa.B, str(pool.device), None, daemon=small_page_daemon,
                                 backend="cuda" if where == "cuda" else "host")
    try:
        lens = [30, 12, 5]
        reqs = [Req(f"g{i}", 20 + i, n) for i, n in enumerate(lens)]
        for i, r in enumerate(reqs):
            r.req_pool_idx = i
            pool.write(r.seed, i, 0, lens[i])
            r.output_ids.append(1000)
            coord.admit_request_into_staging(r)
        if where == "cuda":
            torch.cuda.synchronize()
        assert coord.collect_ready_reqs() == reqs
        bs, dev = 4, pool.device
        idx = torch.tensor([0, 1, 2, 0], dtype=torch.int64, device=dev)
        seq_lens = torch.ones(bs, dtype=torch.int64, device=dev)
        topk = torch.full((bs, K), -1, dtype=torch.int32, device=dev)
        out = torch.full((LAYERS, bs, K), -1, dtype=torch.int32, device=dev)

        def forward():
            for layer in range(LAYERS):
                out[layer].copy_(coord.swap_in_selected_pages(idx, seq_lens, topk, layer))

        coord.num_real_reqs.fill_(3)
        replay = Replayer(forward, where)
        replay()  # the capture, before any map_last_loc_to_buffer
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
            replay()
            arena = torch.as_tensor(coord.attention_kv_buffer()).cpu()
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
        del replay
        for r in reqs:
            coord.request_finished(r)
        assert coord.session.stats().session_requests == 0
    finally:
        coord.destroy()


def test_verify_replays_in_a_cuda_graph(small_page_daemon, where):
    """HisparsedMTPCoordinator.swap_in_verify_pages of every layer captured once (bs 4, N = 3
    verify tokens a request) and replayed over 6 rounds with random acceptance, the batch
    shrinking from 3 requests to 2: every returned index holds the selected position's current
    record (a rejected draft's position holds the next round's token)."""
    from hisparse.integrations.sglang_mtp import HisparsedMTPCoordinator

    pool = _Pool(1024, 4, sa.MAX_CTX, where)
    n, bs, dev = 3, 4, pool.device
    coord = HisparsedMTPCoordinator(pool, pool, K, n * K, str(dev), None, num_draft_tokens=n,
                                    daemon=small_page_daemon, backend="cuda" if where == "cuda" else "host")
    try:
        lens = [30, 12, 5]
        reqs = [Req(f"v{i}", 40 + i, m) for i, m in enumerate(lens)]
        for i, r in enumerate(reqs):
            r.req_pool_idx = i
            pool.write(r.seed, i, 0, lens[i])
            r.output_ids.append(1000)
            coord.admit_request_into_staging(r)
        if where == "cuda":
            torch.cuda.synchronize()
        assert coord.collect_ready_reqs() == reqs
        idx = torch.tensor([0, 1, 2, 0], dtype=torch.int64, device=dev)
        seq = torch.ones(bs, dtype=torch.int64, device=dev)
        ids = torch.full((bs * n, K), -1, dtype=torch.int32, device=dev)
        out = torch.full((LAYERS, bs * n, K), -1, dtype=torch.int32, device=dev)

        def forward():
            for layer in range(LAYERS):
                out[layer].copy_(coord.swap_in_verify_pages(idx, seq, ids, layer, n))

        gen = torch.Generator().manual_seed(9)
        replay = Replayer(forward, where)
        for rnd in range(6):
            live = reqs if rnd < 3 else reqs[:2]
            starts = [r.kv_len() for r in live]
            for r, st in zip(live, starts):
                pool.write(r.seed, r.req_pool_idx, st, st + n, salt=1000 * (rnd + 1))
            pos = torch.full((bs, n, K), -1, dtype=torch.int64)
            for i, st in enumerate(starts):
                for t in range(n):
                    pick = torch.randperm(st + t + 1, generator=gen)[:K]
                    pos[i, t, :len(pick)] = pick
            r2t = pool.req_to_token.cpu()
            sel = torch.full((bs, n, K), -1, dtype=torch.int32)
            for i, r in enumerate(live):
                sel[i] = torch.where(pos[i] >= 0, r2t[r.req_pool_idx][pos[i].clamp(min=0)], torch.full_like(sel[i], -1))
            seq.copy_(torch.tensor(starts + [1] * (bs - len(live))))
            ids.copy_(sel.view(bs * n, K))
            coord.num_real_reqs.fill_(len(live))
            replay()  # round 0 captures (after a warm-up run of the same round)
            arena = torch.as_tensor(coord.attention_kv_buffer()).cpu()
            table = out.cpu().view(LAYERS, bs, n, K)
            for layer in range(LAYERS):
                for i, r in enumerate(live):
                    for t in range(n):
                        for j in range(K):
                            p = int(pos[i, t, j])
                            if p < 0:
                                assert int(table[layer, i, t, j]) == -1
                                continue
                            got = arena[int(table[layer, i, t, j]), :sa.RECORD]
                            assert torch.equal(got, pool.expected[(r.seed, layer, p)]), (rnd, layer, r.rid, t, p)
                assert (table[layer, len(live):] == -1).all()
            for r, st in zip(live, starts):
                a = int(torch.randint(1, n + 1, (1,), generator=gen))
                pool.req_to_token[r.req_pool_idx, st + a:st + n] = 0  # the rejected drafts' KV is freed
                r.output_ids += [2000] * a
                r.kv_committed_len = st + a
            coord.backup_committed_tokens(live)
        coord.session.check_errors()
        del replay
        for r in reqs:
            coord.request_finished(r)
        assert coord.session.stats().session_requests == 0
    finally:
        coord.destroy()

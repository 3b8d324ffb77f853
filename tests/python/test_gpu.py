"""CUDA backend data path from torch: store / append / resolve on device tensors in the current
stream, the arena viewed through __cuda_array_interface__, and CUDA-graph capture + replay with a
device-resident batch size. Skipped without torch, a GPU, or a CUDA build of libhisparse."""

from __future__ import annotations

import pytest

import hisparse

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

LAYERS, RECORD, K, B, ROWS = 2, 656, 64, 128, 4
DEV = torch.device("cuda", 0)


@pytest.fixture
def cuda_session(open_session):
    try:
        return open_session(num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=ROWS, gpu=0,
                            backend="cuda")
    except hisparse.Unimplemented as e:
        pytest.skip(f"libhisparse built without CUDA: {e}")


def admit_and_prefill(s, context, budget, gen):
    rows, prompts = [], []
    for i in range(ROWS):
        rows.append(s.admit(i + 1, context, budget).row)
        p = torch.randint(0, 256, (LAYERS, context, RECORD), dtype=torch.uint8, generator=gen).to(DEV)
        s.store(i + 1, p)
        prompts.append(p)
    return torch.tensor(rows, dtype=torch.int32, device=DEV), prompts


def random_selection(gen, seq_lens):
    """Per row: K/2 positions from a recurring hot set, K/2 - 2 others, the newest token, one pad."""
    pos = torch.full((ROWS, K), -1, dtype=torch.int32)
    for i, n in enumerate(seq_lens.tolist()):
        hot = torch.randperm(min(n - 1, 2 * K), generator=gen)[: K // 2]
        free = torch.ones(n - 1, dtype=torch.bool)
        free[hot] = False
        rest = torch.nonzero(free).flatten()
        cold = rest[torch.randperm(rest.numel(), generator=gen)[: K // 2 - 2]]
        sel = torch.cat([hot, cold, torch.tensor([n - 1])])
        pos[i, : sel.numel()] = sel[torch.randperm(sel.numel(), generator=gen)].to(torch.int32)
    return pos.to(DEV)


def host_records(s, rid, layer, n):
    """Records [0, n) of (rid, layer) from the host pool, one at a time: they span host pages."""
    return torch.from_numpy(np.concatenate([np.array(s.record_view(rid, layer, p, 1)) for p in range(n)]))


def check_exact(s, rows, seq_lens, positions, out_slots, layer):
    """Every output slot holds the host record of its position, byte for byte."""
    torch.cuda.synchronize()
    arena = s.slot_view()
    assert arena.is_cuda and arena.dtype == torch.uint8 and arena.shape == (ROWS, LAYERS, B + 1, RECORD)
    for i in range(ROWS):
        rid, n = i + 1, int(seq_lens[i])
        host = host_records(s, rid, layer, n)
        pos, out = positions[i].cpu(), out_slots[i].cpu()
        valid = pos >= 0
        assert (out[~valid] == -1).all()
        assert (out[pos == n - 1] == B).all()
        got = arena[int(rows[i]), layer][out[valid].long().to(DEV)].cpu()
        assert torch.equal(got, host[pos[valid].long()])


def test_store_append_resolve_on_the_current_stream(cuda_session):
    s, gen = cuda_session, torch.Generator().manual_seed(3)
    context, steps = 700, 6
    assert s.backend == "cuda"
    rows, _ = admit_and_prefill(s, context, context + steps, gen)
    seq_lens = torch.full((ROWS,), context, dtype=torch.int32, device=DEV)
    out = torch.empty(ROWS, K, dtype=torch.int32, device=DEV)
    scratch = torch.ones(1 << 20, device=DEV)  # what a beside launch runs next to
    stream = torch.cuda.Stream()
    before, selections = s.stats(), 0
    with torch.cuda.stream(stream):  # the data path follows torch's current stream
        for step in range(steps):
            seq_lens += 1
            for layer in range(LAYERS):
                newest = torch.randint(0, 256, (ROWS, RECORD), dtype=torch.uint8, generator=gen).to(DEV)
                s.append(layer, rows, seq_lens, newest)
                pos = random_selection(gen, seq_lens.cpu())
                selections += int((pos >= 0).sum())
                # Odd layers launch as the append kernel's programmatic dependent (ABI 1.9): they
                # must still see the record it wrote. Odd steps run on a budget of one or two
                # blocks (ABI 1.13): fewer row blocks than rows, each planning several. Even layers
                # of every third step launch beside a kernel that touches none of RESOLVE's data
                # (ABI 1.14).
                beside = layer % 2 == 0 and step % 3 == 1
                if beside:
                    scratch.mul_(1.0001)
                s.resolve(layer, rows, seq_lens, pos, out, programmatic=layer % 2 == 1,
                          max_blocks=1 + layer if step % 2 else 0, beside=beside)
                check_exact(s, rows, seq_lens.cpu(), pos, out, layer)
    s.check_errors()
    after = s.stats()
    assert (after.hits - before.hits) + (after.misses - before.misses) == selections
    assert after.misses > before.misses


def test_cuda_graph_replay_with_device_batch_size(cuda_session):
    s, gen = cuda_session, torch.Generator().manual_seed(4)
    context, steps = 900, 5
    rows, _ = admit_and_prefill(s, context, context + steps + 1, gen)
    seq_lens = torch.full((ROWS,), context, dtype=torch.int32, device=DEV)
    batch = torch.tensor([ROWS], dtype=torch.int32, device=DEV)
    positions = torch.full((LAYERS, ROWS, K), -1, dtype=torch.int32, device=DEV)
    newest = torch.zeros(LAYERS, ROWS, RECORD, dtype=torch.uint8, device=DEV)
    out = torch.full((LAYERS, ROWS, K), -7, dtype=torch.int32, device=DEV)

    def step():
        for layer in range(LAYERS):
            s.append(layer, rows, seq_lens, newest[layer], batch_size=batch)
            s.resolve(layer, rows, seq_lens, positions[layer], out[layer], batch_size=batch)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    seq_lens += 1
    with torch.cuda.stream(side):
        for layer in range(LAYERS):
            positions[layer].copy_(random_selection(gen, seq_lens.cpu()))
        newest.random_(0, 256)
        step()  # warm-up, a real step
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for layer in range(LAYERS):
        check_exact(s, rows, seq_lens.cpu(), positions[layer], out[layer], layer)
    for step_i in range(steps - 1):
        seq_lens += 1
        for layer in range(LAYERS):
            positions[layer].copy_(random_selection(gen, seq_lens.cpu()))
        newest.random_(0, 256)
        if step_i == steps - 2:
            batch.fill_(ROWS - 1)  # the same graph, one row fewer: the last row is padding (-1)
            out[:, ROWS - 1].fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        if step_i < steps - 2:
            for layer in range(LAYERS):
                check_exact(s, rows, seq_lens.cpu(), positions[layer], out[layer], layer)
    assert (out[:, ROWS - 1] == -1).all()
    assert (out[:, : ROWS - 1] >= -1).all()
    s.check_errors()


def test_page_table_indexes_the_arena_on_the_gpu(cuda_session):
    """resolve(page_table=...) on the CUDA backend: entry (i, j) indexes the arena viewed as
    [records, record] at the record out_slots names; padding and padded rows are -1."""
    s, gen = cuda_session, torch.Generator().manual_seed(12)
    context = 500
    rows, _ = admit_and_prefill(s, context, context + 2, gen)
    seq_lens = torch.full((ROWS,), context, dtype=torch.int32, device=DEV)
    batch = torch.tensor([ROWS - 1], dtype=torch.int32, device=DEV)
    out = torch.full((ROWS, K), -7, dtype=torch.int32, device=DEV)
    table = torch.full((ROWS, K), -7, dtype=torch.int32, device=DEV)
    pos = random_selection(gen, seq_lens.cpu())
    s.resolve(1, rows, seq_lens, pos, out, batch_size=batch, page_table=table, page_records=64, page_offset=2)
    torch.cuda.synchronize()
    s.check_errors()
    arena = s.slot_view()
    flat = arena.view(-1, arena.shape[-1])
    live = out[: ROWS - 1] >= 0
    want = (rows[: ROWS - 1].long().unsqueeze(1) * LAYERS + 1) * (B + 1) + out[: ROWS - 1].long() + 128
    assert torch.equal(table[: ROWS - 1][live].long(), want[live])
    assert (table[: ROWS - 1][~live] == -1).all() and (table[ROWS - 1] == -1).all() and (out[ROWS - 1] == -1).all()
    got = flat[table[: ROWS - 1][live].long() - 128]
    assert torch.equal(got, arena[rows[: ROWS - 1].long().unsqueeze(1).expand_as(out[: ROWS - 1])[live], 1,
                                  out[: ROWS - 1][live].long()])


def test_store_indexed_from_a_paged_device_pool(cuda_session):
    """hs_store_indexed from a torch pool [layers, pool tokens, record] on the GPU (scattered slots,
    two chunks) equals the plain store of the same records; a bad index writes nothing and
    surfaces at check_errors."""
    s, gen = cuda_session, torch.Generator().manual_seed(9)
    context, pool_tokens = 300, 1000
    prompt = torch.randint(0, 256, (LAYERS, context, RECORD), dtype=torch.uint8, generator=gen)
    slot = torch.randperm(pool_tokens, generator=gen)[:context].to(torch.int32)
    pool = torch.zeros(LAYERS, pool_tokens, RECORD + 48, dtype=torch.uint8)
    pool[:, slot.long(), :RECORD] = prompt
    pool, slot = pool.to(DEV), slot.to(DEV)
    a, b = s.admit(1, context, context + 4).row, s.admit(2, context, context + 4).row
    s.store_indexed(1, pool[..., :RECORD], slot[:100], seq_len_after=100)
    s.store_indexed(1, pool[..., :RECORD], slot[100:], start_pos=100)
    s.store(2, prompt[:, :100].to(DEV), seq_len_after=100)  # the same chunks, the plain way
    s.store(2, prompt[:, 100:].to(DEV), start_pos=100)
    torch.cuda.synchronize()
    s.check_errors()
    for layer in range(LAYERS):
        assert torch.equal(host_records(s, 1, layer, context), prompt[layer])
    arena = s.slot_view()
    assert torch.equal(arena[a], arena[b])
    bad = slot.clone()
    bad[-1] = pool_tokens
    s.store_indexed(1, torch.zeros_like(pool)[..., :RECORD], bad)
    with pytest.raises(hisparse.InvalidArgument, match="source index"):
        s.check_errors()
    for layer in range(LAYERS):
        assert torch.equal(host_records(s, 1, layer, context), prompt[layer])


def test_cuda_session_wants_device_memory(cuda_session):
    s = cuda_session
    row = s.admit(1, 100, 120).row
    host = np.array([row], np.int32)
    with pytest.raises(hisparse.InvalidArgument, match="device memory"):
        s.resolve(0, host, np.array([100], np.int32), np.zeros((1, K), np.int32), np.zeros((1, K), np.int32))
    with pytest.raises(hisparse.InvalidArgument, match="torch.int32"):
        d = torch.tensor([row], device=DEV)
        s.resolve(0, d, d, torch.zeros(1, K, device=DEV, dtype=torch.long), torch.zeros(1, K, device=DEV))
    cai = s.slot_array_interface().__cuda_array_interface__
    assert cai["shape"] == (ROWS, LAYERS, B + 1, RECORD) and cai["typestr"] == "|u1"
    assert cai["data"][0] == s.info().slot_base


def test_bad_positions_surface_at_check_errors(cuda_session):
    s = cuda_session
    row = s.admit(1, 200, 220).row
    s.store(1, torch.zeros(LAYERS, 200, RECORD, dtype=torch.uint8, device=DEV))
    rows = torch.tensor([row], dtype=torch.int32, device=DEV)
    seq = torch.tensor([200], dtype=torch.int32, device=DEV)
    pos = torch.arange(K, dtype=torch.int32, device=DEV).reshape(1, K)
    pos[0, 5] = 500  # beyond seq_len
    out = torch.zeros(1, K, dtype=torch.int32, device=DEV)
    s.resolve(0, rows, seq, pos, out)  # enqueued; the kernel flags the row
    with pytest.raises(hisparse.InvalidArgument, match="position"):
        s.check_errors()
    assert (out == -1).all()
    s.check_errors()  # cleared


def test_auto_daemon_puts_cuda_sessions_in_gpu_arenas(cuda_session):
    """device: auto (the default, the module's daemon) on a GPU node: the daemon owns the session's
    arena in GPU memory and reads its RESOLVE counters (issue 15: auto used to serve host arenas)."""
    assert cuda_session.info().arena_kind in ("cuda-vmm", "cuda-ipc")


def test_private_gpu_arena_only_when_asked(monkeypatch):
    """device: host serves host arenas; the CUDA backend keeps a private GPU arena only when the
    engine asks with HISPARSE_PRIVATE_GPU_ARENA=1, and says so in its session info."""
    geometry = dict(num_layers=1, record_bytes=64, k=4, slots=8, max_requests=1, gpu=0, backend="cuda")
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="16MiB", extra_args=["--device", "host"]) as d:
        monkeypatch.delenv("HISPARSE_PRIVATE_GPU_ARENA", raising=False)
        try:
            with pytest.raises(hisparse.FailedPrecondition, match="HISPARSE_PRIVATE_GPU_ARENA=1"):
                hisparse.Session(d, **geometry)
        except hisparse.Unimplemented as e:
            pytest.skip(f"libhisparse built without CUDA: {e}")
        monkeypatch.setenv("HISPARSE_PRIVATE_GPU_ARENA", "1")
        with hisparse.Session(d, **geometry) as s:
            assert s.info().arena_kind == "private-gpu"


def test_draft_tokens_multi_query_steps_on_the_gpu(open_session):
    """Speculative decoding on the CUDA backend: q = 1..3 tokens appended and q lists resolved per
    row and step (device token/query counts), random acceptance; every output slot holds the host
    pool's record of its position, tail tokens their tail slot, lists past q all -1; the page table
    (rule 9) is the record index of each output slot over B + 1 + n record slots per (row, layer)."""
    n, q_max, slots = 2, 3, 3 * K
    try:
        s = open_session(num_layers=LAYERS, record_bytes=RECORD, k=K, slots=slots, max_requests=ROWS, gpu=0,
                         backend="cuda", draft_tokens=n)
    except hisparse.Unimplemented as e:
        pytest.skip(f"libhisparse built without CUDA: {e}")
    gen = torch.Generator().manual_seed(8)
    context, steps = 500, 6
    rows, _ = admit_and_prefill(s, context, context + steps * q_max + q_max, gen)
    assert s.slot_view().shape == (ROWS, LAYERS, slots + 1 + n, RECORD)
    committed = torch.full((ROWS,), context, dtype=torch.int32)
    for _ in range(steps):
        q = torch.randint(1, q_max + 1, (ROWS,), dtype=torch.int32, generator=gen)
        seq_lens = committed + q
        for layer in range(LAYERS):
            src = torch.randint(0, 256, (ROWS * q_max, RECORD), dtype=torch.uint8, generator=gen).to(DEV)
            s.append(layer, rows, seq_lens.to(DEV), src, token_counts=q.to(DEV))
            pos = torch.full((ROWS, q_max, K), -1, dtype=torch.int32)
            for i in range(ROWS):
                for t in range(int(q[i])):
                    length = int(committed[i]) + t + 1
                    pos[i, t, : K - 1] = torch.randperm(length, generator=gen)[: K - 1].to(torch.int32)
            out = torch.full((ROWS, q_max, K), -7, dtype=torch.int32, device=DEV)
            table = torch.full((ROWS, q_max, K), -7, dtype=torch.int32, device=DEV)
            s.resolve(layer, rows, seq_lens.to(DEV), pos.to(DEV), out, query_counts=q.to(DEV), page_table=table,
                      page_records=16, page_offset=2)
            torch.cuda.synchronize()
            arena, got = s.slot_view(), out.cpu()
            base = (rows.cpu().to(torch.int64)[:, None, None] * LAYERS + layer) * (slots + 1 + n) + 32
            assert torch.equal(table.cpu().to(torch.int64), torch.where(got < 0, -1, base + got))
            for i in range(ROWS):
                host = host_records(s, i + 1, layer, int(seq_lens[i]))
                for t in range(q_max):
                    p, o = pos[i, t], got[i, t]
                    if t >= int(q[i]):
                        assert (o == -1).all()
                        continue
                    valid = p >= 0
                    assert (o[~valid] == -1).all()
                    tail = p >= int(committed[i])
                    assert torch.equal(o[tail], slots + p[tail] - int(committed[i]))
                    rec = arena[int(rows[i]), layer][o[valid].long().to(DEV)].cpu()
                    assert torch.equal(rec, host[p[valid].long()])
        committed += torch.tensor([int(torch.randint(1, int(q[i]) + 1, (1,), generator=gen)) for i in range(ROWS)],
                                  dtype=torch.int32)
    s.check_errors()

"""Host-backend data path with numpy int32 arrays: store, append, resolve, and every slot's bytes
checked against the host pool's records (the exactness contract of ARCHITECTURE.md)."""

from __future__ import annotations

import ctypes

import pytest

import hisparse

np = pytest.importorskip("numpy")

LAYERS, RECORD, K, B, ROWS = 3, 64, 8, 16, 3


def record_bytes(rid: int, layer: int, pos: int) -> np.ndarray:
    """A record whose bytes name (request, layer, position), so any mix-up shows."""
    rng = np.random.default_rng(rid * 1_000_003 + layer * 7919 + pos)
    return rng.integers(0, 256, RECORD, dtype=np.uint8)


def prompt(rid: int, tokens: int) -> np.ndarray:
    return np.stack([np.stack([record_bytes(rid, l, p) for p in range(tokens)]) for l in range(LAYERS)])


def check_slots(s, rid, row, layer, positions, out_slots, seq_len):
    arena = s.slot_view()
    for j, p in enumerate(positions):
        slot = int(out_slots[j])
        if p < 0:
            assert slot == -1
            continue
        if p == seq_len - 1:
            assert slot == B, "the newest token maps to the extra slot B"
        assert 0 <= slot <= B
        host = s.record_view(rid, layer, int(p))[0]
        np.testing.assert_array_equal(arena[row, layer, slot, :RECORD], host)
        np.testing.assert_array_equal(host, record_bytes(rid, layer, int(p)))


@pytest.fixture
def session(open_session):
    return open_session(num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=ROWS)


def test_store_reads_back_and_short_prompts_are_resident(session):
    s = session
    info = s.admit(1, 12, 64)
    data = prompt(1, 12)
    s.store(1, data, num_tokens=12)
    for l in range(LAYERS):
        np.testing.assert_array_equal(s.record_view(1, l, 0, 12), data[l])
    # seq_len <= B: every position p sits in slot p after prefill (rule 5).
    arena = s.slot_view()
    for l in range(LAYERS):
        np.testing.assert_array_equal(arena[info.row, l, :12, :RECORD], data[l])


def test_store_indexed_gathers_a_paged_pool(session):
    """hs_store_indexed from a paged pool (numpy [layers, pool tokens, record], scattered slots),
    in a chunk and two layer ranges, reads back as the records it gathered; a bad index raises
    and writes nothing."""
    s = session
    info = s.admit(1, 30, 40)
    data = prompt(1, 30)
    pool_tokens = 64
    rng = np.random.default_rng(3)
    slot = rng.permutation(pool_tokens).astype(np.int32)
    pool = np.zeros((LAYERS, pool_tokens, RECORD), np.uint8)
    pool[:, slot[:30]] = data
    stride = pool_tokens * RECORD
    s.store_indexed(1, pool, slot[:10], src_tokens=pool_tokens, layer_stride=stride)
    s.store_indexed(1, pool, slot[10:30], start_pos=10, num_layers=1, src_tokens=pool_tokens)
    s.store_indexed(1, pool[1:], slot[10:30], start_pos=10, first_layer=1, src_tokens=pool_tokens,
                    layer_stride=stride)
    for l in range(LAYERS):
        np.testing.assert_array_equal(s.record_view(1, l, 0, 30), data[l])
    arena = s.slot_view()
    for l in range(LAYERS):  # the first chunk (seq 10 <= B) is resident, position p in slot p
        np.testing.assert_array_equal(arena[info.row, l, :10, :RECORD], data[l, :10])
    bad = slot[:30].copy()
    bad[-1] = pool_tokens
    with pytest.raises(hisparse.InvalidArgument, match="source index"):
        s.store_indexed(1, np.zeros_like(pool), bad, src_tokens=pool_tokens, layer_stride=stride)
    with pytest.raises(hisparse.InvalidArgument, match="layers"):
        s.store_indexed(1, pool, slot[:4], first_layer=LAYERS - 1, num_layers=2, src_tokens=pool_tokens,
                        layer_stride=stride)
    for l in range(LAYERS):
        np.testing.assert_array_equal(s.record_view(1, l, 0, 30), data[l])


def test_record_view_writes_through_to_the_pool(session):
    s = session
    s.admit(1, 4, 8)
    view = s.record_view(1, 0, 2)
    view[0, :] = 0xAB
    assert bytes(s.record_view(1, 0, 2)[0]) == b"\xab" * RECORD
    with pytest.raises(hisparse.InvalidArgument):
        s.record_view(1, 0, 4, count=5)  # beyond the capacity of 8


def test_decode_steps_keep_every_slot_exact(session):
    s = session
    context, steps = 40, 12
    ids = [1, 2, 3]
    rows = np.zeros(ROWS, np.int32)
    for i, rid in enumerate(ids):
        rows[i] = s.admit(rid, context, context + steps).row
        s.store(rid, prompt(rid, context), num_tokens=context)
    seq_lens = np.full(ROWS, context, np.int32)
    positions = np.full((ROWS, K), -1, np.int32)
    out = np.zeros((ROWS, K), np.int32)
    rng = np.random.default_rng(5)
    before = s.stats()
    selections = 0
    for step in range(steps):
        seq_lens += 1
        for l in range(LAYERS):
            newest = np.stack([record_bytes(rid, l, int(seq_lens[i]) - 1) for i, rid in enumerate(ids)])
            s.append(l, rows, seq_lens, newest)
            for i in range(ROWS):
                # Locality: half from a small hot set, half anywhere; the newest token, some padding.
                hot = rng.choice(12, 3, replace=False)
                cold = rng.choice(np.arange(12, seq_lens[i] - 1), 3, replace=False)
                sel = np.concatenate([hot, cold, [seq_lens[i] - 1], [-1]]).astype(np.int32)
                positions[i] = rng.permutation(sel)
            selections += int((positions >= 0).sum())
            s.resolve(l, rows, seq_lens, positions, out)
            for i, rid in enumerate(ids):
                check_slots(s, rid, int(rows[i]), l, positions[i], out[i], int(seq_lens[i]))
    after = s.stats()
    assert (after.hits - before.hits) + (after.misses - before.misses) == selections
    assert after.hits > before.hits and after.misses > before.misses
    assert after.bytes_fetched - before.bytes_fetched == (after.misses - before.misses) * RECORD


def test_batch_size_limits_the_rows_resolved(session):
    s = session
    rows = np.array([s.admit(1, 20, 24).row, s.admit(2, 20, 24).row, 0], np.int32)
    s.store(1, prompt(1, 20), num_tokens=20)
    s.store(2, prompt(2, 20), num_tokens=20)
    seq_lens = np.array([20, 20, 20], np.int32)
    positions = np.tile(np.arange(K, dtype=np.int32), (ROWS, 1))
    out = np.full((ROWS, K), 77, np.int32)
    before = s.stats()
    # programmatic (ABI 1.9) orders a CUDA launch; the host backend runs in order either way.
    s.resolve(0, rows, seq_lens, positions, out, batch_size=np.array([1], np.int32), programmatic=True)
    # Entries past batch_size are padding: -1 in every column, and they resolve nothing.
    assert (out[0] >= 0).all() and (out[1:] == -1).all()
    after = s.stats()
    assert (after.hits - before.hits) + (after.misses - before.misses) == K
    # max_blocks (ABI 1.13) bounds a CUDA launch's grid; the host backend takes it and runs alike,
    # and a negative budget is refused before anything runs.
    again = np.full((ROWS, K), 77, np.int32)
    s.resolve(0, rows, seq_lens, positions, again, batch_size=np.array([1], np.int32), max_blocks=1)
    assert (again == out).all()
    with pytest.raises(hisparse.InvalidArgument, match="max_blocks"):
        s.resolve(0, rows, seq_lens, positions, again, max_blocks=-1)
    # consumer_warps (ABI 1.15) is a CUDA launch's tuning too: taken in [0, 16], refused outside.
    again[:] = 77
    s.resolve(0, rows, seq_lens, positions, again, batch_size=np.array([1], np.int32), consumer_warps=16)
    assert (again == out).all()
    for bad in (-1, 17):
        with pytest.raises(hisparse.InvalidArgument, match="consumer_warps"):
            s.resolve(0, rows, seq_lens, positions, again, consumer_warps=bad)
    # early_dependents (ABI 1.15) schedules a CUDA launch's successor; the host backend runs alike.
    again[:] = 77
    s.resolve(0, rows, seq_lens, positions, again, batch_size=np.array([1], np.int32), early_dependents=True)
    assert (again == out).all()
    # beside (ABI 1.14) too; with programmatic it is refused before anything runs.
    again[:] = 77
    s.resolve(0, rows, seq_lens, positions, again, batch_size=np.array([1], np.int32), beside=True)
    assert (again == out).all()
    with pytest.raises(hisparse.InvalidArgument, match="exclude each other"):
        s.resolve(0, rows, seq_lens, positions, again, programmatic=True, beside=True)


def test_page_table_names_each_selections_record(session):
    """resolve(page_table=...): each entry indexes the arena viewed as [records, record_bytes]
    (pages of 32 records from page 2 shift it by 64); without out_slots the same table."""
    s = session
    rows = np.array([s.admit(1, 40, 44).row, s.admit(2, 40, 44).row, 0], np.int32)
    s.store(1, prompt(1, 40), num_tokens=40)
    s.store(2, prompt(2, 40), num_tokens=40)
    seq_lens = np.array([40, 40, 1], np.int32)
    positions = np.full((ROWS, K), -1, np.int32)
    positions[0, :7] = [39, 1, 20, 33, 5, 17, 28]
    positions[1, :6] = [0, 39, 38, 12, 25, 6]
    batch = np.array([2], np.int32)
    out = np.zeros((ROWS, K), np.int32)
    table = np.zeros((ROWS, K), np.int32)
    s.resolve(1, rows, seq_lens, positions, out, batch_size=batch, page_table=table)
    flat = s.slot_view().reshape(-1, s.slot_view().shape[-1])
    for i, rid in enumerate((1, 2)):
        for j in range(K):
            p = int(positions[i, j])
            if p < 0:
                assert table[i, j] == -1
                continue
            assert table[i, j] == (rows[i] * LAYERS + 1) * (B + 1) + out[i, j]
            np.testing.assert_array_equal(flat[table[i, j], :RECORD], record_bytes(rid, 1, p))
    assert (table[2] == -1).all()
    paged = np.zeros((ROWS, K), np.int32)
    s.resolve(1, rows, seq_lens, positions, None, batch_size=batch, page_table=paged, page_records=32,
              page_offset=2)
    np.testing.assert_array_equal(paged, np.where(table < 0, -1, table + 64))
    with pytest.raises(hisparse.InvalidArgument, match="page_records"):
        s.resolve(1, rows, seq_lens, positions, out, page_table=paged, page_records=0)


def test_other_buffer_kinds(session):
    s = session
    row = s.admit(1, 20, 24).row
    s.store(1, bytearray(prompt(1, 20).tobytes()), num_tokens=20)
    Arr = ctypes.c_int32 * 1
    rows, seq = Arr(row), memoryview(np.array([20], np.int32))
    pos = (ctypes.c_int32 * K)(*range(K))
    out = (ctypes.c_int32 * K)()
    s.resolve(1, rows, seq, pos, out)
    check_slots(s, 1, row, 1, list(pos), list(out), 20)
    s.append(0, rows, seq, prompt(1, 20)[0, 19].tobytes())  # read-only bytes are fine as a source


def test_data_path_argument_errors(session):
    s = session
    row = s.admit(1, 20, 24).row
    s.store(1, prompt(1, 20), num_tokens=20)
    rows, seq = np.array([row], np.int32), np.array([20], np.int32)
    pos, out = np.arange(K, dtype=np.int32).reshape(1, K), np.zeros((1, K), np.int32)
    with pytest.raises(hisparse.InvalidArgument, match="int32"):
        s.resolve(0, rows.astype(np.int64), seq, pos, out)
    with pytest.raises(hisparse.InvalidArgument, match="contiguous"):
        s.resolve(0, rows, seq, np.zeros((K, 2), np.int32).T[:1], out)
    with pytest.raises(hisparse.InvalidArgument, match="read-only"):
        ro = out.copy()
        ro.flags.writeable = False
        s.resolve(0, rows, seq, pos, ro)
    with pytest.raises(hisparse.InvalidArgument, match="reads 8"):
        s.resolve(0, rows, seq, pos[:, :4].copy(), out)
    bad = pos.copy()
    bad[0, 3] = 20  # == seq_len: out of range
    with pytest.raises(hisparse.InvalidArgument, match="position"):
        s.resolve(0, rows, seq, bad, out)
    assert (out == -1).all(), "an invalid row's outputs are padding"
    dup = pos.copy()
    dup[0, 1] = dup[0, 0]
    with pytest.raises(hisparse.InvalidArgument, match="twice"):
        s.resolve(0, rows, seq, dup, out)
    with pytest.raises(hisparse.InvalidArgument, match="capacity"):
        s.store(1, prompt(1, 20), start_pos=10, num_tokens=20)
    with pytest.raises(hisparse.NotFound):
        s.store(42, prompt(1, 20), num_tokens=20)
    with pytest.raises(hisparse.InvalidArgument, match="src holds"):
        s.store(1, prompt(1, 20)[:1], num_tokens=20)


def test_torch_cpu_tensors_on_the_host_backend(session):
    torch = pytest.importorskip("torch")
    s = session
    row = s.admit(1, 20, 24).row
    s.store(1, torch.from_numpy(prompt(1, 20)), num_tokens=20)
    rows = torch.tensor([row], dtype=torch.int32)
    seq = torch.tensor([20], dtype=torch.int32)
    pos = torch.arange(K, dtype=torch.int32).reshape(1, K)
    out = torch.zeros(1, K, dtype=torch.int32)
    s.resolve(2, rows, seq, pos, out)
    check_slots(s, 1, row, 2, pos[0].tolist(), out[0].numpy(), 20)
    with pytest.raises(hisparse.InvalidArgument, match="torch.int32"):
        s.resolve(2, rows.long(), seq, pos, out)


def test_prewarm_reads_and_changes_nothing(session):
    """hs_prewarm (ABI 1.19) on the host backend: the reference reads the rows' records, and nothing a
    caller can see changes (a RESOLVE after it equals one without); bad entries are named at once."""
    s = session
    row = s.admit(1, 20, 24).row
    s.store(1, prompt(1, 20), num_tokens=20)
    rows = np.array([row, -1], np.int32)
    seq = np.array([20, 0], np.int32)
    def state():
        return ([s.record_view(1, 2, p)[0].copy() for p in range(20)], np.array(s.slot_view()),
                (s.stats().hits, s.stats().misses))
    before = state()
    s.prewarm(2, rows, seq)
    s.prewarm(2, rows, seq, granule_bytes=4096, max_blocks=3, batch_size=np.array([1], np.int32))
    s.prewarm(2, rows, seq, granule_bytes=16, granule_stride=3, granule_phase=2, beside=True)
    after = state()
    for x, y in zip(before[0], after[0]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2] == after[2]
    pos = np.arange(K, dtype=np.int32).reshape(1, K)
    out = np.zeros((1, K), np.int32)
    s.resolve(2, rows[:1], seq[:1], pos, out)
    check_slots(s, 1, row, 2, pos[0].tolist(), out[0], 20)
    with pytest.raises(hisparse.InvalidArgument, match="seq_len"):
        s.prewarm(2, rows, np.array([25, 0], np.int32))
    with pytest.raises(hisparse.InvalidArgument, match="granule"):
        s.prewarm(2, rows, seq, granule_bytes=100)
    with pytest.raises(hisparse.InvalidArgument, match="layer"):
        s.prewarm(LAYERS, rows, seq)
    with pytest.raises(hisparse.InvalidArgument, match="granule_phase"):
        s.prewarm(2, rows, seq, granule_stride=2, granule_phase=2)
    with pytest.raises(hisparse.InvalidArgument, match="launch_flags"):
        s.prewarm(2, rows, seq, beside=True, programmatic=True)


def test_shared_indexer_prefetch_equals_resolve(open_session):
    """Layers 1 and 2 reuse layer 0's selection: one session prefetches them from layer 0's miss
    plan, another resolves every layer. Slot tables, LRU orders, slot bytes and counters agree."""
    anchors = [0, 0, 0]
    pref = open_session(num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=ROWS,
                        layer_anchor=anchors)
    plain = open_session(num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=ROWS)
    assert pref.layer_anchor == anchors and plain.layer_anchor == [0, 1, 2]
    with pytest.raises(hisparse.FailedPrecondition, match="not been resolved"):
        pref.prefetch(1)
    with pytest.raises(hisparse.FailedPrecondition, match="selects on its own"):
        pref.prefetch(0)
    context, steps, ids = 30, 15, [7, 8]
    rows = {}
    for s in (pref, plain):
        rows[id(s)] = np.array([s.admit(rid, context, context + steps).row for rid in ids] + [0], np.int32)
        for rid in ids:
            s.store(rid, prompt(rid, context), num_tokens=context)
    seq_lens = np.array([context, context, 1], np.int32)
    batch = np.array([2], np.int32)
    rng = np.random.default_rng(11)
    out_pref = np.zeros((ROWS, K), np.int32)
    out_plain = np.zeros((ROWS, K), np.int32)
    for step in range(steps):
        seq_lens[:2] += 1
        positions = np.full((ROWS, K), -1, np.int32)
        for i in range(2):
            sel = rng.choice(int(seq_lens[i]) - 1, K - 1, replace=False)
            positions[i] = rng.permutation(np.concatenate([sel, [seq_lens[i] - 1]])).astype(np.int32)
        for l in range(LAYERS):
            newest = np.stack([record_bytes(rid, l, int(seq_lens[i]) - 1) for i, rid in enumerate(ids)]
                              + [np.zeros(RECORD, np.uint8)])
            for s in (pref, plain):
                s.append(l, rows[id(s)], seq_lens, newest, batch_size=batch)
            if l == 0:
                pref.resolve(0, rows[id(pref)], seq_lens, positions, out_pref, batch_size=batch)
            else:
                pref.prefetch(l)
            plain.resolve(l, rows[id(plain)], seq_lens, positions, out_plain, batch_size=batch)
            np.testing.assert_array_equal(out_pref[:2], out_plain[:2])
            for i, rid in enumerate(ids):
                check_slots(pref, rid, int(rows[id(pref)][i]), l, positions[i], out_pref[i], int(seq_lens[i]))
    a, b = pref.slot_view(), plain.slot_view()
    for i in range(2):
        np.testing.assert_array_equal(a[rows[id(pref)][i]], b[rows[id(plain)][i]])
    sa, sb = pref.stats(), plain.stats()
    assert (sa.hits, sa.misses, sa.bytes_fetched) == (sb.hits, sb.misses, sb.bytes_fetched)
    assert sa.misses > 0


def test_bad_layer_anchor_is_invalid_argument(open_session):
    for anchors, why in (([0, 2, 2], "earlier"), ([0, 0], "entries"), ([1, 1, 1], "earlier")):
        with pytest.raises(hisparse.InvalidArgument, match=why):
            open_session(num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=ROWS,
                         layer_anchor=anchors)


def test_draft_tokens_resolve_every_query_and_rewrite_rejected_drafts(open_session):
    """Speculative decoding (draft_tokens = 2): q = 1..3 tokens appended per row and step, q lists
    resolved at once, a random number accepted; rejected positions get new bytes next step. The
    page table (rule 9), shaped like out_slots, names each selection's record in the arena viewed
    as [records, record_bytes] over B + 1 + n record slots per (row, layer), tail slots included."""
    n, q_max = 2, 3
    b_slots = (n + 1) * K  # every union fits
    s = open_session(num_layers=LAYERS, record_bytes=RECORD, k=K, slots=b_slots, max_requests=ROWS, draft_tokens=n)
    assert s.info().draft_tokens == n and s.record_slots == b_slots + 1 + n
    assert s.slot_view().shape[2] == b_slots + 1 + n
    context, steps = 30, 10
    ids = [1, 2, 3]
    rows = np.array([s.admit(rid, context, context + steps * q_max + q_max).row for rid in ids], np.int32)
    for rid in ids:
        s.store(rid, prompt(rid, context), num_tokens=context)
    committed = np.full(ROWS, context, np.int32)
    written = {}  # (rid, layer, pos) -> bytes last appended (prompt records otherwise)
    rng = np.random.default_rng(3)
    for step in range(steps):
        q = rng.integers(1, q_max + 1, ROWS).astype(np.int32)
        seq_lens = committed + q
        for l in range(LAYERS):
            src = np.zeros((ROWS * q_max, RECORD), np.uint8)
            for i, rid in enumerate(ids):
                for t in range(q[i]):
                    rec = rng.integers(0, 256, RECORD, dtype=np.uint8)
                    written[(rid, l, int(committed[i]) + t)] = rec
                    src[i * q_max + t] = rec
            s.append(l, rows, seq_lens, src, token_counts=q)
            positions = np.full((ROWS, q_max, K), -1, np.int32)
            for i in range(ROWS):
                for t in range(q[i]):
                    length = int(committed[i]) + t + 1
                    positions[i, t, :K - 1] = rng.choice(length, K - 1, replace=False)
            out = np.zeros((ROWS, q_max, K), np.int32)
            table = np.zeros((ROWS, q_max, K), np.int32)
            pages, first = (8, 1) if l % 2 else (1, 0)  # odd layers: pages of 8 records from page 1
            s.resolve(l, rows, seq_lens, positions, out, query_counts=q, page_table=table, page_records=pages,
                      page_offset=first)
            arena = s.slot_view()
            flat = arena.reshape(-1, arena.shape[-1])
            base = (rows[:, None, None] * LAYERS + l) * (b_slots + 1 + n) + pages * first
            np.testing.assert_array_equal(table, np.where(out < 0, -1, base + out))
            for i, rid in enumerate(ids):
                for t in range(q_max):
                    for j in range(K):
                        p, slot = int(positions[i, t, j]), int(out[i, t, j])
                        if t >= q[i] or p < 0:
                            assert slot == -1
                            continue
                        if p >= committed[i]:
                            assert slot == b_slots + p - committed[i], "query token t lives in tail slot B + t"
                        want = written.get((rid, l, p), record_bytes(rid, l, p))
                        np.testing.assert_array_equal(arena[rows[i], l, slot, :RECORD], want)
                        np.testing.assert_array_equal(flat[table[i, t, j] - pages * first, :RECORD], want)
        committed += np.array([rng.integers(1, q[i] + 1) for i in range(ROWS)], np.int32)  # accepted
    # More query tokens than draft_tokens + 1: the row is refused with its reason.
    bad = np.full(ROWS, q_max + 1, np.int32)
    with pytest.raises(hisparse.InvalidArgument, match="query or token count"):
        s.resolve(0, rows, committed + 1, np.full((ROWS, q_max, K), -1, np.int32),
                  np.zeros((ROWS, q_max, K), np.int32), query_counts=bad)

"""Park/resume and shared prefixes through the Python package (host backend, a real hisparsed
with 4 KiB pages: 64 records of 64 bytes a page)."""

from __future__ import annotations

import pytest

import hisparse

np = pytest.importorskip("numpy")

LAYERS, RECORD, K, B = 2, 64, 4, 8
PER_PAGE = 4096 // RECORD


def records(seed: int, start: int, end: int) -> np.ndarray:
    """[LAYERS, end - start, RECORD]: bytes that name (seed, layer, position)."""
    out = np.zeros((LAYERS, end - start, RECORD), np.uint8)
    for layer in range(LAYERS):
        for i, pos in enumerate(range(start, end)):
            out[layer, i] = (seed * 5 + layer * 11 + pos * 31 + np.arange(RECORD)) % 256
    return out


@pytest.fixture
def session(small_page_daemon):
    s = hisparse.Session(small_page_daemon, num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=2,
                         backend="host")
    yield s
    s.close()


def host(s, rid, layer, start, count):
    """Records [start, start + count) of (rid, layer), one record at a time (they span pages)."""
    return np.stack([np.asarray(s.record_view(rid, layer, p)[0]) for p in range(start, start + count)])


def check_resolved(s, row, rid, seq_len, positions):
    """Resolves positions of the request in `row` and checks each slot against its host record."""
    rows = np.array([row], np.int32)
    seqs = np.array([seq_len], np.int32)
    pos = np.array([positions], np.int32)
    out = np.zeros((1, K), np.int32)
    arena = s.slot_view()
    for layer in range(LAYERS):
        s.resolve(layer, rows, seqs, pos, out)
        for j, p in enumerate(positions):
            np.testing.assert_array_equal(arena[row, layer, int(out[0, j]), :RECORD], s.record_view(rid, layer, p)[0])


def test_park_gives_the_row_away_and_resume_refetches(session):
    s = session
    a = s.admit(1, 40, 64)
    s.store(1, records(1, 0, 40), num_tokens=40)
    b = s.admit(2, 40, 64)
    s.store(2, records(2, 0, 40), num_tokens=40)
    check_resolved(s, b.row, 2, 40, [3, 20, 33, 39])
    s.park(1)
    with pytest.raises(hisparse.FailedPrecondition):
        s.park(1)
    c = s.admit(3, 8, 8)
    assert c.row == a.row
    with pytest.raises(hisparse.ResourceExhausted):
        s.resume(1)
    s.release(2)
    r = s.resume(1)
    assert r.row == b.row and r.capacity_tokens == 64
    # As after admit, the row's slots are EMPTY and the newest token's slot is the next append's:
    # the decode step appends token 40, then resolves; every selected record is request 1's own.
    rows = np.array([r.row], np.int32)
    for layer in range(LAYERS):
        s.append(layer, rows, np.array([41], np.int32), records(1, 40, 41)[layer])
    check_resolved(s, r.row, 1, 41, [3, 20, 33, 40])
    np.testing.assert_array_equal(host(s, 1, 1, 0, 40), records(1, 0, 40)[1])
    with pytest.raises(hisparse.FailedPrecondition):
        s.resume(1)
    with pytest.raises(hisparse.NotFound):
        s.park(99)


def test_child_shares_the_parents_prefix(session):
    s = session
    s.admit(1, 100, 128)
    s.store(1, records(1, 0, 100), num_tokens=100)
    prefix = PER_PAGE + 10
    child = s.admit(2, 100, 128, parent=1, prefix_tokens=prefix)
    for layer in range(LAYERS):
        np.testing.assert_array_equal(host(s, 2, layer, 0, prefix), records(1, 0, prefix)[layer])
    s.store(2, records(2, prefix, 100), start_pos=prefix, num_tokens=100 - prefix)
    with pytest.raises(hisparse.InvalidArgument):
        s.store(2, records(2, 0, 1), start_pos=0, num_tokens=1, seq_len_after=100)  # a shared page
    s.release(1)
    check_resolved(s, child.row, 2, 100, [0, 63, 70, 99])
    for layer in range(LAYERS):
        np.testing.assert_array_equal(host(s, 2, layer, 0, prefix), records(1, 0, prefix)[layer])
        np.testing.assert_array_equal(host(s, 2, layer, prefix, 100 - prefix),
                                      records(2, prefix, 100)[layer])
    with pytest.raises(hisparse.NotFound):
        s.admit(3, 1, 8, parent=1, prefix_tokens=1)  # released
    with pytest.raises(hisparse.InvalidArgument):
        s.admit(3, 1, 8, parent=2, prefix_tokens=129)  # longer than the parent


def test_batch_release_of_a_parked_request_leaves_its_old_row_alone(session):
    # A parked request's old row may be another request's now: releasing the parked one in a batch
    # must not unpublish that row (client_batch.cc, UninstallLocked), as release() does not.
    s = session
    a = s.admit(1, 40, 64)
    s.store(1, records(1, 0, 40), num_tokens=40)
    s.park(1)
    c = s.admit(3, 40, 64)
    assert c.row == a.row
    s.store(3, records(3, 0, 40), num_tokens=40)
    assert s.release_batch([1]) == [None]
    check_resolved(s, c.row, 3, 40, [0, 17, 30, 39])
    s.release_batch([3])

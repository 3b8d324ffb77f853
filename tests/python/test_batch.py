"""Batched admission from Python (Session.admit_batch / release_batch, ABI 1.6) against a real
hisparsed: one call admits many requests, mapped as admit maps them; all-or-nothing raises the
failing item's error with nothing admitted; per-item returns each item's outcome."""

from __future__ import annotations

import ctypes

import pytest

import hisparse


def test_admit_batch_maps_every_request_and_release_batch_frees_them(open_session):
    s = open_session(num_layers=2, record_bytes=64, max_requests=64)
    base = s.stats()
    infos = s.admit_batch([(rid, 10, 100) for rid in range(1, 65)])
    assert sorted(i.row for i in infos) == list(range(64))
    assert all(i.capacity_tokens == 100 for i in infos)
    st = s.stats()
    assert st.session_requests == 64
    assert st.session_host_bytes >= 64 * 2 * 100 * 64
    # Every request's records are reachable through this process's mapping, as after admit.
    for rid in (1, 33, 64):
        ptr = s.record_ptr(rid, 1, 99)
        ctypes.memset(ptr, rid, 64)
        assert ctypes.string_at(s.record_ptr(rid, 1, 99), 64) == bytes([rid]) * 64
    outcome = s.release_batch(list(range(1, 65)) + [500])
    assert outcome[:64] == [None] * 64
    assert isinstance(outcome[64], hisparse.NotFound)
    end = s.stats()
    assert end.session_requests == 0 and end.session_host_bytes == 0
    assert end.pool_used_bytes == base.pool_used_bytes


def test_all_or_nothing_raises_the_failing_item_and_admits_nothing(open_session):
    s = open_session(max_requests=4)
    with pytest.raises(hisparse.InvalidArgument) as e:
        s.admit_batch([(1, 0, 16), (2, 0, 16), (1, 0, 16)])
    assert e.value.item == 2
    expected = [hisparse.Aborted, hisparse.Aborted, hisparse.InvalidArgument]
    assert all(isinstance(r, cls) and isinstance(r, hisparse.AdmissionError) for r, cls in zip(e.value.results, expected))
    assert len(e.value.results) == 3
    assert "items[2]" in str(e.value)
    with pytest.raises(hisparse.ResourceExhausted) as e:
        s.admit_batch([(rid, 0, 16) for rid in range(1, 6)])  # five requests, four rows
    assert e.value.item == 4
    assert s.stats().session_requests == 0
    with pytest.raises(hisparse.NotFound):
        s.release(1)


def test_per_item_returns_each_outcome(open_session):
    s = open_session(max_requests=4)
    s.admit(9, 0, 16)
    got = s.admit_batch([(1, 0, 16), (9, 0, 16), (2, 20, 16), (3, 0, 16)], all_or_nothing=False)
    assert isinstance(got[0], hisparse.RequestInfo) and isinstance(got[3], hisparse.RequestInfo)
    assert isinstance(got[1], hisparse.AlreadyExists)
    assert isinstance(got[2], hisparse.InvalidArgument)  # context above the budget
    assert s.stats().session_requests == 3
    assert s.release_batch([1, 3, 9]) == [None, None, None]
    with pytest.raises(hisparse.InvalidArgument):
        s.admit_batch([])
    with pytest.raises(hisparse.InvalidArgument):
        s.release_batch([0] * 1025)


def test_park_batch_and_resume_batch_in_one_call_each(open_session):
    """ABI 1.8: park_batch / resume_batch, per item and all or nothing."""
    s = open_session(num_layers=2, record_bytes=64, max_requests=4)
    s.admit_batch([(rid, 0, 100) for rid in range(1, 5)])
    for rid in range(1, 5):
        ctypes.memset(s.record_ptr(rid, 1, 7), rid, 64)
    assert s.park_batch([1, 2, 3]) == [None, None, None]
    out = s.park_batch([4, 9, 4, 1], all_or_nothing=False)
    assert out[0] is None
    assert [type(r) for r in out[1:]] == [hisparse.NotFound, hisparse.InvalidArgument, hisparse.FailedPrecondition]
    s.admit(10, 0, 16)  # three rows free for four parked requests
    with pytest.raises(hisparse.ResourceExhausted) as e:
        s.resume_batch([1, 2, 3, 4])
    assert e.value.item == 3
    assert [type(r) for r in e.value.results[:3]] == [hisparse.Aborted] * 3
    per_item = s.resume_batch([1, 2, 3, 4], all_or_nothing=False)
    assert sorted(r.row for r in per_item[:3]) == sorted({r.row for r in per_item[:3]})
    assert all(r.capacity_tokens == 100 for r in per_item[:3])
    assert isinstance(per_item[3], hisparse.ResourceExhausted)  # the batch above resumed nothing
    for rid in (1, 2, 3):
        assert ctypes.string_at(s.record_ptr(rid, 1, 7), 64) == bytes([rid]) * 64  # the pages stayed
    with pytest.raises(hisparse.InvalidArgument):
        s.park_batch([])
    with pytest.raises(hisparse.InvalidArgument):
        s.resume_batch(list(range(1, 1026)))

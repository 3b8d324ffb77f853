"""Durable requests through the Python package (ABI 1.7): a leased request outlives its session,
a new session of the same engine name lists and adopts it, resumes it and reads the same records;
another engine name cannot (host backend, a real hisparsed with 4 KiB pages)."""

from __future__ import annotations

import pytest

import hisparse
from conftest import _daemon_or_skip, _library_or_skip, wait_for

np = pytest.importorskip("numpy")

LAYERS, RECORD, K, B = 2, 64, 4, 8


@pytest.fixture(scope="module")
def daemon_4k():
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB"]) as d:
        yield d


def open_engine(d, name="durable-py"):
    return hisparse.Session(d, num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=2,
                            backend="host", engine_name=name)


def test_a_leased_request_is_adopted_with_its_records(daemon_4k):
    first = open_engine(daemon_4k)
    first.admit(1, 100, 200, lease_seconds=60)
    first.admit(2, 100, 200)
    first.set_lease(2, 0)  # cleared: released with the session
    prompt = (np.arange(LAYERS * 100 * RECORD, dtype=np.uint32) % 251).astype(np.uint8).reshape(LAYERS, 100, RECORD)
    first.store(1, prompt, num_tokens=100)
    dead = first.session_id
    with pytest.raises(hisparse.InvalidArgument):
        first.set_lease(1, 10 ** 6)  # above durability.max_lease_seconds
    first.close()

    second = open_engine(daemon_4k)
    wait_for(lambda: second.list_adoptable(), what="the ended session's durable request")  # it ends async
    listed = second.list_adoptable()
    assert [(d, r) for (d, r, _) in listed] == [(dead, 1)]
    assert 0 < listed[0][2] <= 60

    other = open_engine(daemon_4k, name="another-engine")
    assert other.list_adoptable() == []
    with pytest.raises(hisparse.PermissionDenied):
        other.adopt(dead)
    other.close()

    assert second.adopt(dead) == [1]
    with pytest.raises(hisparse.NotFound):
        second.adopt(dead)
    info = second.resume(1)
    for layer in range(LAYERS):
        np.testing.assert_array_equal(np.asarray(second.record_view(1, layer, 0, 64)), prompt[layer, :64])
    rows = np.array([info.row], np.int32)
    seqs = np.array([100], np.int32)
    pos = np.array([[98, 3, 50, 77]], np.int32)  # not the newest (99): its slot is the next append's
    out = np.zeros((1, K), np.int32)
    arena = second.slot_view()
    second.resolve(0, rows, seqs, pos, out)
    for j, p in enumerate(pos[0]):
        np.testing.assert_array_equal(arena[info.row, 0, int(out[0, j]), :RECORD], prompt[0, p])
    second.release(1)
    second.close()

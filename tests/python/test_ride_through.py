"""Riding through a daemon's restart from Python (ABI 1.11; issue 42, part 2): a real hisparsed
under hisparse-keeper (the fd store a service manager keeps across restarts) is SIGKILLed while a
session holds a durable request and a plain one. The session sees its end (alive), refuses the
data path, and recover() gives it a new session on the restarted daemon: the durable request kept
on the same pages (its records read back, RESOLVE gathers them) in a new row, at the same arena
address; the plain one reported lost. A recover with no daemon answering times out and leaves the
session ended, and a later one against a daemon that kept nothing reports everything lost."""

from __future__ import annotations

import pytest

import hisparse
from conftest import Keeper, wait_for

np = pytest.importorskip("numpy")

LAYERS, RECORD, K, B, PROMPT = 2, 64, 4, 8, 100


def open_engine(address: str) -> hisparse.Session:
    return hisparse.Session(address, num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=4,
                            backend="host", engine_name="ride-py")


def prompt_of(seed: int):
    return ((np.arange(LAYERS * PROMPT * RECORD, dtype=np.uint32) * 7 + seed) % 251).astype(np.uint8).reshape(
        LAYERS, PROMPT, RECORD)


def gather(s: hisparse.Session, row: int, positions) -> np.ndarray:
    """RESOLVE of layer 0 for `row` (seq_len PROMPT): the records the slots it returns hold."""
    out = np.zeros((1, K), np.int32)
    s.resolve(0, np.array([row], np.int32), np.array([PROMPT], np.int32), np.array([positions], np.int32), out)
    arena = s.slot_view()
    return np.stack([arena[row, 0, int(out[0, j]), :RECORD] for j in range(K)])


def test_a_session_rides_through_a_sigkilled_daemon(keeper):
    s = open_engine(keeper.address)
    durable, plain = prompt_of(1), prompt_of(2)
    s.admit(1, PROMPT, PROMPT + 16, lease_seconds=60)
    s.store(1, durable, num_tokens=PROMPT)
    info = s.admit(2, PROMPT, PROMPT + 16)
    s.store(2, plain, num_tokens=PROMPT)
    positions = [98, 3, 50, 77]
    np.testing.assert_array_equal(gather(s, 0, positions), durable[0, positions])
    assert s.alive
    with pytest.raises(hisparse.FailedPrecondition):
        s.recover()  # nothing to recover from while the session is live
    slot_base, old_id = s.info().slot_base, s.session_id

    old = keeper.sigkill_daemon()
    wait_for(lambda: not s.alive, timeout_s=20, what="the session to see its daemon go")
    with pytest.raises(hisparse.Unavailable):  # a row's state is unknown now: refused
        gather(s, info.row, positions)
    with pytest.raises(hisparse.Unavailable):
        s.store(1, durable, num_tokens=PROMPT)

    rec = s.recover(timeout_ms=20000)
    assert keeper.daemon_pid() != old
    assert rec.old_session_id == old_id and rec.new_session_id == s.session_id != old_id
    assert list(rec.kept) == [1] and rec.kept[1] is not None and rec.capacity_tokens[1] == PROMPT + 16
    assert rec.lost == [2]
    assert not rec.arena_moved and s.info().slot_base == slot_base
    assert s.alive
    for layer in range(LAYERS):  # the same pages: nothing prefilled again
        np.testing.assert_array_equal(np.asarray(s.record_view(1, layer, 0, PROMPT)), durable[layer])
    np.testing.assert_array_equal(gather(s, rec.kept[1], positions), durable[0, positions])
    with pytest.raises(hisparse.NotFound):
        s.store(2, plain, num_tokens=PROMPT)  # lost: never served
    s.admit(2, PROMPT, PROMPT + 16)  # the engine prefills it again
    s.release(2)
    s.release(1)
    s.close()


def test_a_recovery_that_finds_no_daemon_can_be_retried(keeper):
    s = open_engine(keeper.address)
    s.admit(5, PROMPT, PROMPT, lease_seconds=60)
    s.admit(6, PROMPT, PROMPT)
    keeper.stop()  # the keeper takes the daemon (and its fd store) down with it
    wait_for(lambda: not s.alive, timeout_s=20, what="the session to see its daemon go")
    with pytest.raises(hisparse.Unavailable):
        s.recover(timeout_ms=300)
    assert not s.alive  # still the ended session: recover may be called again

    again = Keeper(keeper.folder)  # a new keeper: an empty store, so nothing was kept
    try:
        rec = s.recover(timeout_ms=20000)
        assert rec.kept == {} and rec.lost == [5, 6]
        s.admit(5, PROMPT, PROMPT)
        s.close()
    finally:
        again.stop()

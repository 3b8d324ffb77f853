"""Imports from a prefill node through the Python client (Session.admit_import / await_import):
the request stays unusable until the agent (hisparse-bench import, a second process) commits,
then every record reads back as the agent wrote it. Skipped where the daemon serves no imports
(built without UCX) or hisparse-bench is not built."""

from __future__ import annotations

import pathlib
import struct
import subprocess

import pytest

import hisparse

SEED = 7


def _pattern_word(request: int, layer: int, position: int, word: int) -> int:
    """hisparse/common/import_pattern.h's ImportPatternWord, for seed SEED."""
    m = (1 << 64) - 1
    z = SEED ^ ((request * 0x9E3779B97F4A7C15) & m) ^ (layer << 48) ^ (position << 16) ^ word
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_import_is_unusable_until_the_agent_commits(daemon, open_session, tmp_path):
    bench = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-bench"
    if not bench.exists():
        pytest.skip(f"{bench} is not built")
    s = open_session(num_layers=2, record_bytes=64)
    try:
        grant = s.admit_import(1, 300, 300)
    except hisparse.FailedPrecondition as e:
        pytest.skip(f"the daemon serves no imports: {e}")
    assert len(grant) > 0
    with pytest.raises(hisparse.Unavailable):  # still pending
        s.await_import(1, timeout_ms=0)
    with pytest.raises(hisparse.NotFound):  # not the engine's yet
        s.record_ptr(1, 0, 0)
    path = tmp_path / "grant"
    path.write_bytes(grant)
    subprocess.run([str(bench), "import", "--daemon", daemon.address, "--grant", str(path), "--seed", str(SEED)],
                   check=True, capture_output=True, timeout=120)
    info = s.await_import(1, timeout_ms=30000)
    assert info.capacity_tokens == 300
    for layer in range(2):
        for position in (0, 1, 63, 64, 299):
            got = bytes(s.record_view(1, layer, position)).ljust(64, b"\0")[:64]
            want = b"".join(struct.pack("<Q", _pattern_word(1, layer, position, w)) for w in range(8))
            assert got == want, (layer, position)
    s.release(1)


def test_releasing_an_import_aborts_it(open_session):
    s = open_session()
    try:
        s.admit_import(2, 10, 10)
    except hisparse.FailedPrecondition as e:
        pytest.skip(f"the daemon serves no imports: {e}")
    s.release(2)
    with pytest.raises(hisparse.NotFound):
        s.await_import(2, timeout_ms=0)


def test_batched_import_grants_each_item_and_all_or_nothing_leaves_none(daemon, open_session, tmp_path):
    """admit_batch(begin_import=True) (ABI 1.8): one call, one grant per item, each committed by the
    agent and installed by await_import; an all-or-nothing batch that fails leaves no import."""
    bench = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-bench"
    if not bench.exists():
        pytest.skip(f"{bench} is not built")
    s = open_session(num_layers=2, record_bytes=64)
    try:
        grants = s.admit_batch([(11, 100, 100), (12, 70, 70)], begin_import=True)
    except hisparse.FailedPrecondition as e:
        pytest.skip(f"the daemon serves no imports: {e}")
    assert all(isinstance(g, bytes) and g for g in grants) and grants[0] != grants[1]
    for rid, grant in zip((11, 12), grants):
        path = tmp_path / f"grant{rid}"
        path.write_bytes(grant)
        subprocess.run([str(bench), "import", "--daemon", daemon.address, "--grant", str(path), "--seed", str(SEED)],
                       check=True, capture_output=True, timeout=120)
    for rid, tokens in ((11, 100), (12, 70)):
        assert s.await_import(rid, timeout_ms=30000).capacity_tokens == tokens
        got = bytes(s.record_view(rid, 1, tokens - 1)).ljust(64, b"\0")[:64]
        assert got == b"".join(struct.pack("<Q", _pattern_word(rid, 1, tokens - 1, w)) for w in range(8))
    assert s.release_batch([11, 12]) == [None, None]
    with pytest.raises(hisparse.InvalidArgument) as e:
        s.admit_batch([(13, 0, 10), (14, 0, 10), (13, 0, 10)], begin_import=True)
    assert e.value.item == 2
    for rid in (13, 14):
        with pytest.raises(hisparse.NotFound):
            s.await_import(rid, timeout_ms=0)
    assert s.stats().session_requests == 0


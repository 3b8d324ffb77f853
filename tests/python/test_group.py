"""TP groups through the Python package (host backend, a real hisparsed with 4 KiB pages): the
ranks' sessions of one group, one rank stores, every rank resolves the same pages byte for byte,
and the node holds one copy."""

from __future__ import annotations

import pytest

import hisparse
from conftest import _daemon_or_skip, _library_or_skip, child_env

np = pytest.importorskip("numpy")

LAYERS, RECORD, K, B, RANKS = 2, 64, 4, 8, 2


def records(seed: int, start: int, end: int) -> np.ndarray:
    """[LAYERS, end - start, RECORD]: bytes that name (seed, layer, position)."""
    out = np.zeros((LAYERS, end - start, RECORD), np.uint8)
    for layer in range(LAYERS):
        for i, pos in enumerate(range(start, end)):
            out[layer, i] = (seed * 3 + layer * 17 + pos * 29 + np.arange(RECORD)) % 256
    return out


def open_rank(daemon, name, rank):
    return hisparse.Session(daemon, num_layers=LAYERS, record_bytes=RECORD, k=K, slots=B, max_requests=2,
                            backend="host", group=name, rank=rank, group_size=RANKS)


def test_ranks_share_one_copy(small_page_daemon):
    ranks = [open_rank(small_page_daemon, "py-tp", r) for r in range(RANKS)]
    try:
        with pytest.raises(hisparse.AlreadyExists):
            open_rank(small_page_daemon, "py-tp", 1)
        first = ranks[0].admit(1, 100, 128, group=True)
        ranks[0].store(1, records(4, 0, 100), num_tokens=100)
        second = ranks[1].admit(1, 100, 128, group=True)
        assert second.capacity_tokens == first.capacity_tokens == 128
        with pytest.raises(hisparse.AlreadyExists):
            ranks[1].admit(1, 100, 128, group=True)
        # A decode step on every rank: append the newest token (the same bytes on every rank) into
        # the rank's own tail slot and the one host page, then resolve; rank 1 fetches the prompt's
        # records from the pages rank 0 stored.
        positions = [0, 63, 99, 100]
        for s, info in zip(ranks, [first, second]):
            rows = np.array([info.row], np.int32)
            seqs = np.array([101], np.int32)
            for layer in range(LAYERS):
                s.append(layer, rows, seqs, records(4, 100, 101)[layer])
            out = np.zeros((1, K), np.int32)
            for layer in range(LAYERS):
                s.resolve(layer, rows, seqs, np.array([positions], np.int32), out)
                arena = s.slot_view()
                got = [np.array(arena[info.row, layer, int(out[0, j]), :RECORD]) for j in range(K)]
                del arena  # no view of the arena outlives the session (pytest may print locals)
                for j, p in enumerate(positions):
                    np.testing.assert_array_equal(got[j], records(4, p, p + 1)[layer, 0])
        # The node holds the pages once: 2 layers x 2 pages of 4 KiB.
        assert ranks[1].stats().pool_used_bytes == LAYERS * 2 * 4096
        ranks[0].release(1)
        assert ranks[1].stats().pool_used_bytes == LAYERS * 2 * 4096
        ranks[1].release(1)
        assert ranks[1].stats().pool_used_bytes == 0
    finally:
        for s in ranks:
            s.close()


def test_group_admission_before_every_rank_joined(small_page_daemon):
    with open_rank(small_page_daemon, "py-half", 0) as s:
        with pytest.raises(hisparse.FailedPrecondition):
            s.admit(1, 10, 64, group=True)


def test_tp_group_memory_bench_smoke():
    """bench/tp_group_memory.py --smoke: the benchmark behind bench/RESULTS.md's TP-group figures
    runs, and its own check (a group holds one copy, ungrouped ranks one each) holds."""
    import json
    import pathlib
    import subprocess
    import sys

    _library_or_skip()
    _daemon_or_skip()
    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "tp_group_memory.py"
    done = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["mode"] for r in rows] == ["ungrouped", "tp_group"]
    assert rows[0]["pool_used_bytes"] == 2 * rows[1]["pool_used_bytes"] > 0

"""bench/graph_gaps.py: a graph's kernel spacing against what the process ran before it.

Its smoke mode is what ctest runs: on a machine without CUDA it says so and exits 0; with a GPU it
replays a 20-kernel graph after each of its two steps. The GPU figures are in bench/RESULTS.md,
"Full HBM's launch gaps"."""

from __future__ import annotations

import json

import pytest
from conftest import bench_module


def test_smoke_mode_runs_or_says_why_not(capsys):
    gg = bench_module("graph_gaps")
    assert gg.main(["--smoke"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert lines
    if lines[0]["kind"] == "skipped":
        assert lines[0]["reason"] in ("no torch", "no CUDA device")
        return
    assert [(x["step"], x["graph"]) for x in lines] == [("fresh", "first"), ("fresh", "new"), ("idle", "first"),
                                                        ("idle", "new")]
    assert all(x["kernels"] == 20 and x["us_a_kernel"] > 0 for x in lines)


def test_unknown_steps_are_refused(capsys):
    gg = bench_module("graph_gaps")
    with pytest.raises(SystemExit):
        gg.main(["--steps", "fresh,nap"])
    assert "unknown step(s) nap" in capsys.readouterr().err

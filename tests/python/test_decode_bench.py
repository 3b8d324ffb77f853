"""hisparse-bench decode (examples/engine/decode_bench.py): its capacity plan runs anywhere, and its
CPU smoke mode runs the whole benchmark (link, daemon, baseline and hisparse runs, the exactness
check, the tables) on a tiny model with the host backend, so the GPU path's code is exercised on
every test run that has torch. Issue 15: a stray `del host, devbuf` made every GPU run fail."""

from __future__ import annotations

import json

import pytest

decode_bench = pytest.importorskip("decode_bench")  # examples/engine, put on sys.path by conftest


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_plan_only_needs_no_gpu(capsys):
    assert decode_bench.main(["--plan-only", "--contexts", "4096", "--slots", "256"]) == 0
    lines = json_lines(capsys.readouterr().out)
    assert {x["mode"] for x in lines if x["kind"] == "capacity"} == {"baseline", "hisparse_B256"}


def test_smoke_run_on_the_cpu(capsys):
    pytest.importorskip("torch")
    assert decode_bench.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    runs = {x["mode"]: x for x in json_lines(out) if x["kind"] == "run"}
    assert set(runs) == {"baseline", "hisparse_B16@matched", "hisparse_B16", "hisparse_B32"}
    for mode, r in runs.items():
        assert r["timed_steps"] == 4, mode
        if mode != "baseline":
            assert 0 < r["hit_rate"] < 1, f"{mode}: the run must both hit and fetch"
    assert "EXACT" in out and "MISMATCH" not in out

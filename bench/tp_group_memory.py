"""Host bytes of a request held by a TP group against the same request in one ungrouped session per
rank (host backend, a hisparsed started here): what plain tensor parallelism costs (world_size
copies of MLA's replicated records) and what a group costs (one), and the admissions' time.

    HISPARSE_LIB=build/lib/libhisparse.so HISPARSE_DAEMON_BIN=build/bin/hisparsed \\
        python3 bench/tp_group_memory.py [--ranks 8] [--tokens 16384] [--layers 4] [--record-bytes 656]
    ... --smoke     2 ranks, 512 tokens: what ctest runs (tests/python/test_group.py)

Prints one JSON object per mode (pool bytes used, the ratio to one copy of the records, whose
excess is page rounding, and the time of the ranks' admissions) and exits 1 unless the ungrouped
sessions hold exactly ranks times the group's bytes.
"""
import argparse
import json
import os
import pathlib
import sys
import time

if os.environ.get("HISPARSE_INSTALLED") != "1":  # 1: the installed package (a wheel's), not the tree's
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client" / "python"))
import hisparse  # noqa: E402


def measure(d, grouped: bool, a) -> dict:
    sessions = [hisparse.Session(d, num_layers=a.layers, record_bytes=a.record_bytes, k=64, slots=256, max_requests=2,
                                 backend="host", engine_name="tp-group-memory", group="tp" if grouped else None,
                                 rank=r, group_size=a.ranks if grouped else 0) for r in range(a.ranks)]
    try:
        t = time.perf_counter()
        for s in sessions:
            s.admit(1, a.tokens, a.tokens, group=grouped)
        admit_s = time.perf_counter() - t
        used = sessions[0].stats().pool_used_bytes
        for s in sessions:
            s.release(1)
    finally:
        for s in sessions:
            s.close()
    one_copy = a.layers * a.tokens * a.record_bytes
    return {"mode": "tp_group" if grouped else "ungrouped", "ranks": a.ranks, "tokens": a.tokens, "layers": a.layers,
            "record_bytes": a.record_bytes, "pool_used_bytes": used, "copies": round(used / one_copy, 3),
            "admits_ms": round(admit_s * 1e3, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--record-bytes", type=int, default=656)
    ap.add_argument("--smoke", action="store_true", help="2 ranks, 512 tokens (ctest)")
    a = ap.parse_args()
    if a.smoke:
        a.ranks, a.tokens = 2, 512
    with hisparse.Daemon(host_pool_size="1GiB") as d:
        rows = [measure(d, grouped, a) for grouped in (False, True)]
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0 if rows[0]["pool_used_bytes"] == a.ranks * rows[1]["pool_used_bytes"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

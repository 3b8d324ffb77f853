#!/usr/bin/env python3
"""Tests of examples/traces without torch or numpy (stdlib unittest; pytest collects them too):
the scripts compile (py_compile: the lint), tracefmt's writer writes what TRACE_FORMAT.md says and
refuses what it forbids (version 2's hints too), its size limit stops at a step boundary, the
reference Quest scores and selection follow their definition. With $HISPARSE_BENCH (or the source tree's build/bin/
hisparse-bench) a written trace is replayed by `hisparse-bench trace`; without it that case skips.

  python3 examples/traces/test_tracefmt.py        (ctest: trace_examples_python)
"""

import gzip
import math
import os
import py_compile
import random
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import tracefmt  # noqa: E402


class Lint(unittest.TestCase):
    def test_scripts_compile(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("build_corpus.py", "train_and_extract.py", "tracefmt.py", "test_tracefmt.py",
                         "hint_reach.py"):
                py_compile.compile(os.path.join(HERE, name), cfile=os.path.join(tmp, name + "c"), doraise=True)


class HintReach(unittest.TestCase):
    def test_runs_on_a_committed_hinted_trace(self):
        """hint_reach.py (RESULTS.md's "why so little") on the small committed v2 trace: it prints
        its three shares, each a fraction."""
        import re
        import subprocess
        trace = os.path.join(ROOT, "bench", "traces", "debian-quest-hints-small.trace.gz")
        out = subprocess.run([sys.executable, os.path.join(HERE, "hint_reach.py"), trace, "2"], check=True,
                             capture_output=True, text=True).stdout
        self.assertIn("k = 256, B = 512", out)
        shares = [float(x) for x in re.findall(r"(?:before|next\)|step) (0\.\d+)", out)]
        self.assertEqual(len(shares), 3, out)
        self.assertTrue(all(0 < x < 1 for x in shares), out)


class Writer(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "t.trace.gz")

    def tearDown(self):
        self.tmp.cleanup()

    def test_round_trip(self):
        with tracefmt.TraceWriter(self.path, 4, 2, {"model": "tiny  model\nx", "page_size": 16}) as w:
            self.assertTrue(w.write_step(0, [(0, 0, 5, [0, 4]), (1, 0, 5, [1, 2, 3, 4])]))
            self.assertTrue(w.write_step(0, [(0, 7, 1, [0])]))
            self.assertTrue(w.write_step(2, [(0, 0, 6, [])]))
        header, recs = tracefmt.read_trace(self.path)
        self.assertEqual(header, {"k": "4", "layers": "2", "model": "tiny model x", "page_size": "16"})
        self.assertEqual(recs, [(0, 0, 0, 5, [0, 4]), (0, 1, 0, 5, [1, 2, 3, 4]), (0, 0, 7, 1, [0]), (2, 0, 0, 6, [])])
        self.assertEqual(w.steps_written, 2)
        self.assertEqual(w.records, 4)

    def test_refuses(self):
        bad = [
            (0, [(2, 0, 5, [0])]),          # layer out of range
            (0, [(0, 0, 5, [5])]),          # position >= seq_len
            (0, [(0, 0, 5, [-1])]),         # negative position
            (0, [(0, 0, 5, [1, 1])]),       # duplicate
            (0, [(0, 0, 9, [0, 1, 2, 3, 4])]),  # more than k
            (0, [(0, 0, 5, [0]), (0, 0, 5, [1])]),  # (layer, request) twice in a step
        ]
        for step, recs in bad:
            with tracefmt.TraceWriter(self.path, 4, 2) as w:
                with self.assertRaises(ValueError, msg=str(recs)):
                    w.write_step(step, recs)
        with tracefmt.TraceWriter(self.path, 4, 2) as w:
            w.write_step(3, [(0, 0, 5, [0])])
            with self.assertRaises(ValueError):
                w.write_step(2, [(0, 0, 5, [0])])  # steps must not decrease

    def test_version2_hints(self):
        with tracefmt.TraceWriter(self.path, 2, 1, {"model": "m"}, hints=3) as w:
            self.assertTrue(w.write_step(0, [(0, 0, 9, [1, 8], [7, 2, 0])]))
            self.assertTrue(w.write_step(1, [(0, 0, 10, [1], [])]))  # no hints: no H line
        with gzip.open(self.path, "rt") as f:
            text = f.read()
        self.assertTrue(text.startswith("hisparse-trace 2\nk 2\nlayers 1\nhints 3\nmodel m\n"), text)
        self.assertIn("S 0 0 0 9 1 8\nH 0 0 0 7 2 0\nS 1 0 0 10 1\n", text)
        header, recs = tracefmt.read_trace(self.path, with_hints=True)
        self.assertEqual(header["hints"], "3")
        self.assertEqual(recs, [(0, 0, 0, 9, [1, 8], [7, 2, 0]), (1, 0, 0, 10, [1], [])])
        self.assertEqual(tracefmt.read_trace(self.path)[1], [(0, 0, 0, 9, [1, 8]), (1, 0, 0, 10, [1])])
        bad = [
            [(0, 0, 9, [1], [1])],           # hint selected
            [(0, 0, 9, [1], [2, 2])],        # duplicate hint
            [(0, 0, 9, [1], [9])],           # hint >= seq_len
            [(0, 0, 9, [1], [2, 3, 4, 5])],  # more than hints
        ]
        for recs in bad:
            with tracefmt.TraceWriter(self.path, 2, 1, hints=3) as w:
                with self.assertRaises(ValueError, msg=str(recs)):
                    w.write_step(0, recs)
        with tracefmt.TraceWriter(self.path, 2, 1) as w:  # a version-1 writer takes no hints
            with self.assertRaises(ValueError):
                w.write_step(0, [(0, 0, 9, [1], [2])])

    def test_size_limit_stops_at_a_step_boundary(self):
        rng = random.Random(1)
        with tracefmt.TraceWriter(self.path, 512, 2, max_bytes=100_000, check="sorted") as w:
            step = 0
            while w.write_step(step, [(l, 0, 20000, sorted(rng.sample(range(20000), 512))) for l in range(2)]):
                step += 1
        self.assertTrue(w.truncated)
        self.assertLess(os.path.getsize(self.path), 100_000 + 64_000)
        _, recs = tracefmt.read_trace(self.path)
        self.assertEqual(len(recs), 2 * w.steps_written)  # whole steps only

    def test_hisparse_bench_reads_it(self):
        bench = os.environ.get("HISPARSE_BENCH") or os.path.join(ROOT, "build", "bin", "hisparse-bench")
        if not os.access(bench, os.X_OK):
            self.skipTest(f"no hisparse-bench at {bench}")
        rng = random.Random(2)
        with tracefmt.TraceWriter(self.path, 32, 2, {"model": "test", "source": "random (a, b); c"}) as w:
            for step in range(10):
                w.write_step(step, [(l, r, 100 + step, sorted(rng.sample(range(100 + step), 32)))
                                    for r in range(2) for l in range(2)])
        out = subprocess.run([bench, "trace", "--trace", self.path, "--policy", "lru", "--slots", "32"],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        # Version 2: the hints reach the hint policy (a hinted position is never selected).
        with tracefmt.TraceWriter(self.path, 32, 2, hints=16) as w:
            for step in range(10):
                recs = []
                for r in range(2):
                    for l in range(2):
                        pos = rng.sample(range(100 + step), 48)
                        recs.append((l, r, 100 + step, sorted(pos[:32]), pos[32:]))
                w.write_step(step, recs)
        out = subprocess.run([bench, "trace", "--trace", self.path, "--policy", "hint", "--slots", "48",
                              "--hints", "0.5", "--json"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn('"hint_depth": 16', out.stdout)


class Quest(unittest.TestCase):
    def test_scores_by_definition(self):
        # One head, d = 2, page 2, seq_len 3: pages {0, 1} and the partial {2}.
        q = [[1.0, -2.0]]
        keys = [[[0.0, 1.0], [2.0, -1.0], [-1.0, 3.0], [9.0, 9.0]]]  # position 3 is beyond seq_len
        got = tracefmt.quest_page_scores(q, keys, 3, 2)
        ub = [(1.0 * 2.0 + -2.0 * -1.0) / math.sqrt(2), (1.0 * -1.0 + -2.0 * 3.0) / math.sqrt(2)]
        e = [math.exp(u) for u in ub]
        self.assertEqual(len(got), 2)
        for a, b in zip(got, [x / sum(e) for x in e]):
            self.assertAlmostEqual(a, b, places=12)
        # Two heads sum their page distributions.
        got2 = tracefmt.quest_page_scores(q * 2, keys * 2, 3, 2)
        self.assertAlmostEqual(sum(got2), 2.0, places=12)

    def test_select(self):
        self.assertEqual(tracefmt.quest_select([0.1, 0.5, 0.2, 0.9], 55, 16, 32), [16 + i for i in range(16)]
                         + list(range(48, 55)))  # the partial last page, cut at seq_len - 1
        self.assertEqual(tracefmt.quest_select([0.3, 0.3], 20, 16, 16), list(range(16)))  # tie: lower page
        sel = tracefmt.quest_select([1.0, 2.0], 20, 16, 64)  # fewer pages than k allows: all of them
        self.assertEqual(sel, list(range(20)))
        rng = random.Random(3)
        for _ in range(50):
            n = rng.randint(1, 300)
            sc = [rng.random() for _ in range((n + 15) // 16)]
            k = rng.choice([16, 32, 64, 256])
            s = tracefmt.quest_select(sc, n, 16, k)
            self.assertLessEqual(len(s), k)
            self.assertEqual(s, sorted(set(s)))
            self.assertTrue(all(0 <= p < n for p in s))


if __name__ == "__main__":
    unittest.main(verbosity=1)

"""How long a CUDA graph's kernels wait for each other, against what the process did before.

Why: on the lent H100s, serve_bench.py's full-HBM step ran ~6% slower when the baseline was the
first mode in the process than when hisparse's points had run before it (bench/RESULTS.md, "Full
HBM's launch gaps"): its timelines spaced kernels 0.42 µs apart, hisparse's 0.09. The curve's
ratio divides by a baseline run first, so what sets the spacing decides whether a figure is fair.

What it does: captures one graph of --kernels small kernels in a chain (an in-place add on 4,096
floats, ~1-2 µs each) at the start, then runs --steps in order. After each step it replays that
graph --replays times and a graph of the same chain captured anew, and prints one JSON line a graph:
the median replay in µs, and µs a kernel. Kernel bodies do not change between steps, so a change
in µs a kernel is a change in the spacing. Steps:
  fresh     nothing (the first measurement);
  idle      sleep 3 s;
  busy      2 s of bf16 matrix products;
  alloc     a 4 GiB device tensor allocated, filled, freed and returned to the driver;
  hostalloc 1 GiB of pinned host memory (cudaHostAlloc through torch), kept;
  register  4 GiB of anonymous memory, touched, then cudaHostRegister(mapped, portable), kept:
            what the client does to the daemon's host slabs;
  daemon    a hisparse daemon started (4 GiB host pool), kept;
  open      a CUDA-backend session opened on it (the daemon step's, else one started), kept;
  store     one request admitted and stored through that session;
  session   daemon, open and store at once;
  kernels   that session's append and RESOLVE, and hisparse.topk, eagerly (hisparse's kernels);
  close     the session and the daemon closed.
--smoke: 20 kernels, 3 replays, fresh and idle (0.1 s): what ctest runs; it exits 0 with a line
saying so when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import sys
import time

STEPS = ("fresh", "idle", "busy", "alloc", "hostalloc", "register", "daemon", "open", "store", "session", "kernels",
         "close")


def chain(n: int, x):
    """A graph of n in-place adds on x, captured on a side stream as serve_bench captures its steps."""
    import torch
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1.0)  # compiled before the capture
        with torch.cuda.graph(g, stream=side):
            for _ in range(n):
                x.add_(1.0)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return g


def replay_us(g, replays: int) -> float:
    import torch
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(1e3 * a.elapsed_time(b) for a, b in times)


class Steps:
    """What each step does; what it makes is kept until the end (or `close`)."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s, self.kept, self.hs_daemon, self.sess = idle_s, [], None, None

    def fresh(self) -> None:
        pass

    def idle(self) -> None:
        time.sleep(self.idle_s)

    def busy(self) -> None:
        import torch
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            for _ in range(10):
                a @ a
            torch.cuda.synchronize()

    def alloc(self) -> None:
        import torch
        t = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        t.fill_(1)
        torch.cuda.synchronize()
        del t
        torch.cuda.empty_cache()

    def hostalloc(self) -> None:
        import torch
        t = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        t.fill_(1)
        self.kept.append(t)

    def register(self) -> None:
        import torch
        size = 4 << 30
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ctypes.memset(ptr, 1, size)  # touched: registered pages are resident
        err = torch.cuda.cudart().cudaHostRegister(ptr, size, 3)  # portable | mapped
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {err}")
        self.kept.append((m, ptr))

    def daemon(self) -> None:
        import hisparse
        if self.hs_daemon is None:
            self.hs_daemon = hisparse.Daemon(host_pool_size="4GiB").start()

    def open(self) -> None:
        import hisparse
        self.daemon()
        if self.sess is None:
            self.sess = hisparse.Session(self.hs_daemon, num_layers=2, record_bytes=656, k=64, slots=128,
                                         max_requests=2, gpu=0, backend="cuda", engine_name="graph_gaps")

    def store(self) -> None:
        import torch
        self.open()
        self.sess.admit(1, 1024, 1100)
        recs = torch.randint(0, 256, (2, 1024, 656), dtype=torch.uint8, device="cuda")
        self.sess.store(1, recs, start_pos=0, seq_len_after=1024)
        torch.cuda.synchronize()

    def session(self) -> None:
        self.store()

    def kernels(self) -> None:
        import hisparse
        import torch
        s = self.sess
        if s is None:
            raise RuntimeError("the kernels step needs a session (the open, store or session step) before it")
        row = s.admit(2, 1024, 1100).row
        s.store(2, torch.zeros(2, 1024, 656, dtype=torch.uint8, device="cuda"), start_pos=0, seq_len_after=1024)
        rows = torch.tensor([row], dtype=torch.int32, device="cuda")
        seq = torch.tensor([1025], dtype=torch.int32, device="cuda")
        pos = torch.randperm(1025, device="cuda")[:64].to(torch.int32).sort().values.unsqueeze(0)
        out = torch.full((1, 64), -1, dtype=torch.int32, device="cuda")
        for layer in range(2):
            s.append(layer, rows, seq, torch.zeros(1, 656, dtype=torch.uint8, device="cuda"))
            s.resolve(layer, rows, seq, pos, out)
        scores = torch.randn(4, 131072, device="cuda")
        hisparse.topk(scores, torch.empty(4, 2048, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        s.check_errors()

    def close(self) -> None:
        if self.sess is not None:
            self.sess.close()
            self.sess = None
        if self.hs_daemon is not None:
            self.hs_daemon.stop()
            self.hs_daemon = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=1500)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--steps", default=",".join(STEPS), help="in order; each is then measured")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    steps = args.steps.split(",")
    bad = [s for s in steps if s not in STEPS]
    if bad:
        ap.error(f"--steps: unknown step(s) {','.join(bad)} ({', '.join(STEPS)})")
    idle_s = 3.0
    if args.smoke:
        args.kernels, args.replays, steps, idle_s = 20, 3, ["fresh", "idle"], 0.1
    try:
        import torch
    except ImportError:
        print(json.dumps(dict(kind="skipped", reason="no torch")))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps(dict(kind="skipped", reason="no CUDA device")))
        return 0
    x = torch.zeros(4096, device="cuda")
    first = chain(args.kernels, x)
    do = Steps(idle_s)
    try:
        for step in steps:
            getattr(do, step)()
            for which, g in (("first", first), ("new", chain(args.kernels, x))):
                us = replay_us(g, args.replays)
                print(json.dumps(dict(kind="gaps", step=step, graph=which, kernels=args.kernels,
                                      replay_us=round(us, 1), us_a_kernel=round(us / args.kernels, 3))), flush=True)
    finally:
        do.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

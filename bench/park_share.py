"""Park/resume and shared-prefix admission against storing the KV again, on the host backend.

    HISPARSE_LIB=build/lib/libhisparse.so HISPARSE_DAEMON_BIN=build/bin/hisparsed python3 bench/park_share.py

An 8-layer MLA-sized request (576-byte records) of 32k tokens: admit + store + release (what a
re-prefill costs hisparse, the model's own prefill compute not counted) against park + resume;
admit on a 30000-token shared prefix against admit + store of the same prefix; and the pool bytes
a parent and its child hold together. Best of a few runs each.
"""
import os
import pathlib
import sys
import time

if os.environ.get("HISPARSE_INSTALLED") != "1":  # 1: the installed package (a wheel's), not the tree's
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client" / "python"))
import numpy as np  # noqa: E402

import hisparse  # noqa: E402

LAYERS, RECORD, CTX = 8, 576, 32768
with hisparse.Daemon(host_pool_size="2GiB", host_pool_slab_size="64MiB") as d:
    s = hisparse.Session(d, num_layers=LAYERS, record_bytes=RECORD, k=64, slots=512, max_requests=4, backend="host")
    kv = np.random.default_rng(0).integers(0, 256, (LAYERS, CTX, RECORD), dtype=np.uint8)
    def best(fn, n=5):
        t = []
        for _ in range(n):
            t0 = time.perf_counter(); fn(); t.append(time.perf_counter() - t0)
        return min(t)
    def reprefill():
        s.admit(1, CTX, CTX + 1024); s.store(1, kv, num_tokens=CTX); s.release(1)
    t_re = best(reprefill)
    s.admit(1, CTX, CTX + 1024); s.store(1, kv, num_tokens=CTX)
    def park_resume():
        s.park(1); s.resume(1)
    t_pr = best(park_resume, 20)
    def shared():
        s.admit(2, CTX, CTX + 1024, parent=1, prefix_tokens=30000); s.release(2)
    t_sh = best(shared, 10)
    def plain_prefix():
        s.admit(2, CTX, CTX + 1024); s.store(2, kv, num_tokens=30000, layer_stride=CTX * RECORD); s.release(2)
    t_pp = best(plain_prefix)
    used1 = s.stats().pool_used_bytes
    s.admit(2, CTX, CTX + 1024, parent=1, prefix_tokens=30000)
    st = s.stats()
    print(f"re-prefill (admit + store {CTX} tok x {LAYERS} layers x {RECORD} B = {LAYERS*CTX*RECORD/2**20:.0f} MiB + release): {t_re*1e3:.1f} ms")
    print(f"park + resume: {t_pr*1e3:.2f} ms")
    print(f"admit on a 30000-token shared prefix + release: {t_sh*1e3:.2f} ms; admit + store of the same prefix + release: {t_pp*1e3:.1f} ms")
    print(f"pool used, parent alone: {used1/2**20:.0f} MiB; parent + child: {st.pool_used_bytes/2**20:.0f} MiB")
    s.close()

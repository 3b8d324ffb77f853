"""What the SGLang adapter's stand-in tests share (test_sglang_upstream, _readers, _lifecycle): a
small geometry, the indexer's pick, and an engine factory over examples/engine/sglang_standins.py
(SGLang's two index spaces, allocator and request pool) with HisparsedCoordinator (or a subclass)
on a given daemon. Import it after torch: the stand-ins need it."""

from sglang_standins import Engine, HiSparseAllocator, HiSparseDSAPool, ReqToTokenPool

LAYERS, RECORD, K, B = 2, 64, 4, 8
PHYSICAL, MAX_REQS, MAX_CTX = 512, 8, 128


def spread(req, seq_len: int, layer: int) -> list:
    """The indexer's pick: the newest position, the oldest, and two in between (distinct)."""
    want = [seq_len - 1, 0, seq_len // 2, (seq_len * 3) // 4 + layer]
    out = []
    for p in want:
        if 0 <= p < seq_len and p not in out:
            out.append(p)
    return out[:K]


def engine_factory(daemon):
    """A fixture's body: yields build(cls=HisparsedCoordinator, producer=None, select=spread, **kw)
    -> Engine, each over a fresh pool, allocator and request pool on `daemon`; destroys every
    coordinator it built when the test ends."""
    from hisparse.integrations.sglang import HisparsedCoordinator

    made = []

    def build(cls=HisparsedCoordinator, producer=None, select=spread, **kw):
        pool = HiSparseDSAPool(LAYERS, PHYSICAL, RECORD)
        alloc = HiSparseAllocator(pool, PHYSICAL)
        r2t = ReqToTokenPool(MAX_REQS, MAX_CTX)
        coord = cls(r2t, alloc, K, B, "cpu", None, daemon=daemon, backend="host", **kw)
        made.append(coord)
        return Engine(coord, alloc, r2t, K, select, producer)

    try:
        yield build
    finally:
        for c in made:
            c.destroy()

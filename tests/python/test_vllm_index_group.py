"""vLLM's sparse MLA backends reading hisparse's arena through the connector's index group.

Stand-ins of what decides, inside vLLM, whether attention reads hisparse's slot arena or vLLM's own
paged cache (vllm-project/vllm):

- ``SparseMLAIndexGroup`` / ``HiSparseMLAIndexGroup`` (vllm/v1/attention/backends/mla/index_group.py
  @ 7a240b6f): dataclasses with upstream's fields; the plain group converts through vLLM's block
  table, upstream's HiSparse group needs upstream's runtime (its methods raise here, so only an
  override can serve). ``SparseMLAIndexGroupBuilder.register_layer`` makes one plain group per
  indexer, shared by the layers after it, when ``attention_config.hisparse_config`` is unset, and
  gives each layer's impl ``index_group`` and ``index_group_index``.
- The sparse backend's ``forward_mqa`` (the same HiSparse branch in the stored copies of
  triton_mla_sparse.py, flashattn_mla_sparse.py and flashmla_sparse.py, whose commits the store does
  not give): ``isinstance(impl.index_group, HiSparseMLAIndexGroup)``; decode tokens through
  ``convert_decode_logical_to_physical_topk`` and the kernel over ``physical_kv_cache(i).view(kv
  dtype)`` addressed by ``flat_kv_row_view(cache, block_size)`` (sparse_utils.py); prefill tokens,
  unless ``cache(i).all_context_pages_resident``, through ``stage_prefill_rows`` and
  ``triton_convert_req_index_to_global_index(req_ids, block_table, topk, BLOCK_SIZE=block_size)``;
  without the HiSparse group, ``flat_kv_row_view`` of vLLM's paged cache and its block table.
  Both helpers are re-derived here from their documented contracts (row ``block *
  block_stride_rows + offset``; -1 for a negative or out-of-table position).

The "kernel" gathers the records at the physical indices; each is compared byte for byte with the
record the model wrote at the selected position. Host backend, a real hisparsed, batch >= 2.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types
from types import SimpleNamespace
from typing import Any, List

import pytest

import hisparse
from conftest import _daemon_or_skip, _library_or_skip
from test_vllm_adapter import Request, kv_bytes
from test_vllm_mechanisms import BLOCK, LAYERS, NAMES, RECORD, K, MLAAttention, Runner, runtime_module

torch = pytest.importorskip("torch")
from hisparse.errors import InvalidArgument  # noqa: E402

# ---- stand-ins of upstream's classes and helpers (module docstring) ----


@dataclasses.dataclass(eq=False)
class SparseMLAIndexGroup:
    logical_topk_indices: Any
    physical_topk_indices: Any
    valid_topk_counts: Any
    request_ids: Any
    side_stream: Any
    logical_topk_ready: Any
    physical_topk_ready: Any
    has_indexer: bool
    num_layers: int = 0

    def register_layer(self, vllm_config=None, *, head_size=None, kv_cache_dtype=None) -> int:
        self.num_layers += 1
        return self.num_layers - 1

    def prepare_for_batch(self, layer_index, attn_metadata) -> None:
        pass

    def set_logical_topk_ready(self, layer_index) -> None:
        pass


@dataclasses.dataclass(eq=False)
class HiSparseMLAIndexGroup(SparseMLAIndexGroup):
    caches: list = dataclasses.field(default_factory=list)
    hisparse_group: Any = None
    prefill_stream: Any = None
    prefill_ready_events: list = dataclasses.field(default_factory=list)

    def _upstream_runtime(self, *args, **kwargs):
        raise AssertionError("upstream's HiSparse group method ran: it needs vLLM's own runtime")

    cache = physical_kv_cache = convert_logical_to_physical_topk = _upstream_runtime
    convert_decode_logical_to_physical_topk = stage_prefill_rows = _upstream_runtime


class SparseMLAIndexGroupBuilder:
    """One group per index-producing layer (layer 0 here), plain unless hisparse_config is set."""

    def __init__(self, max_rows: int) -> None:
        self.logical = torch.full((max_rows, K), -1, dtype=torch.int32)
        self.group = None

    def register_layer(self, is_index_producing_layer: bool, vllm_config=None):
        if is_index_producing_layer or self.group is None:
            self.group = SparseMLAIndexGroup(self.logical, torch.empty_like(self.logical),
                                             torch.empty(self.logical.shape[0], dtype=torch.int32),
                                             torch.arange(self.logical.shape[0], dtype=torch.int32), None, None, None,
                                             is_index_producing_layer)
        return self.group, self.group.register_layer(vllm_config)


def flat_kv_row_view(kv_cache: torch.Tensor, block_size: int):
    """[num_blocks, block_size, head] -> ([rows, head] over the same memory, rows per block)."""
    num_blocks, _, head = kv_cache.shape
    assert kv_cache.stride(0) % head == 0
    stride_rows = kv_cache.stride(0) // head
    rows = kv_cache.as_strided(((num_blocks - 1) * stride_rows + block_size, head), (head, 1))
    return rows, stride_rows


def convert_req_index_to_global_index(req_id, block_table, topk, BLOCK_SIZE, BLOCK_STRIDE_ROWS=None):
    """-> (physical rows with the valid ones packed first, valid counts), as FlashInfer's backend
    describes the conversion it uses for prefills."""
    stride = BLOCK_SIZE if BLOCK_STRIDE_ROWS is None else BLOCK_STRIDE_ROWS
    tok = topk.to(torch.int64)
    block = torch.div(tok, BLOCK_SIZE, rounding_mode="floor")
    ok = (tok >= 0) & (block < block_table.shape[1])
    base = block_table[req_id.to(torch.int64)].gather(1, block.clamp(0, block_table.shape[1] - 1)).to(torch.int64)
    out = torch.where(ok, base * stride + tok % BLOCK_SIZE, torch.full_like(tok, -1)).to(torch.int32)
    out = out.gather(1, torch.argsort((out < 0).to(torch.int8), dim=1, stable=True))
    return out, (out >= 0).sum(1).to(torch.int32)


def gather(rows: torch.Tensor, phys: torch.Tensor, valid: torch.Tensor) -> List[List[bytes]]:
    """The kernel's reads, as FlashAttention (seqused_k) and FlashInfer (seq_lens) make them: the
    first valid[t] entries of row t, nothing past them; each record read, sorted (attention over
    a set of records does not depend on their order)."""
    out = []
    for t in range(phys.shape[0]):
        n = int(valid[t])
        assert n == int((phys[t] >= 0).sum()), "the valid count is not the number of valid indices"
        idx = phys[t, :n].to(torch.int64)
        assert bool((idx >= 0).all()), f"a -1 within the first {n} entries of row {t}: {phys[t].tolist()}"
        out.append(sorted(bytes(rows[i].tolist()) for i in idx))
    return out


class SparseImpl:
    """The sparse backend's impl (forward_mqa's top-k part)."""

    def __init__(self, group, index: int) -> None:
        self.index_group, self.index_group_index = group, index
        self.branches: List[str] = []

    def forward_mqa(self, kv_cache: torch.Tensor, md, topk: torch.Tensor) -> torch.Tensor:
        g, i, n = self.index_group, self.index_group_index, topk.shape[0]
        if isinstance(g, HiSparseMLAIndexGroup):
            self.branches.append("hisparse")
            ndt, out = md.num_decode_tokens, []
            if ndt:
                phys, valid = g.convert_decode_logical_to_physical_topk(i, topk[:ndt], md, return_valid_counts=True)
                arena = g.physical_kv_cache(i).view(kv_cache.dtype)
                out += gather(flat_kv_row_view(arena, md.block_size)[0], phys, valid)
            if ndt < n:
                assert not g.cache(i).all_context_pages_resident
                cache, table, req_ids = g.stage_prefill_rows(i, kv_cache, md)
                phys, valid = convert_req_index_to_global_index(req_ids, table, topk[ndt:], BLOCK_SIZE=md.block_size)
                out += gather(flat_kv_row_view(cache, md.block_size)[0], phys, valid)
            return out
        self.branches.append("paged")
        rows, stride = flat_kv_row_view(kv_cache, md.block_size)
        phys, valid = convert_req_index_to_global_index(md.req_id_per_token[:n], md.block_table, topk,
                                                        BLOCK_SIZE=md.block_size, BLOCK_STRIDE_ROWS=stride)
        return gather(rows, phys, valid)


class SparseMLALayer(MLAAttention):
    """MLAAttention with a sparse backend impl: the hisparse write calls, then forward_mqa over
    vLLM's own cache tensor for the layer."""

    def __init__(self, name: str, builder: SparseMLAIndexGroupBuilder, every_layer_indexes: bool = False) -> None:
        super().__init__(name)
        self.impl = SparseImpl(*builder.register_layer(every_layer_indexes or name == NAMES[0]))

    def attend(self, rows, md, ctx, topk) -> torch.Tensor:
        self.forward(rows, md, ctx, None, 1)  # prepare, write, mirror, finish_kv_update
        return self.impl.forward_mqa(self.kv_cache, md, topk)


@pytest.fixture(scope="module")
def vllm_daemon():
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB"]) as d:
        yield d


@pytest.fixture
def upstream_vllm(monkeypatch):
    """vllm.v1.attention.backends.mla.index_group as the stand-ins above (vLLM is not installed)."""
    names = ["vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends", "vllm.v1.attention.backends.mla"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    mod = types.ModuleType("vllm.v1.attention.backends.mla.index_group")
    mod.SparseMLAIndexGroup, mod.HiSparseMLAIndexGroup = SparseMLAIndexGroup, HiSparseMLAIndexGroup
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


class BackendRunner(Runner):
    """test_vllm_mechanisms.Runner whose layers have sparse backend impls; step() attends every
    token (decode and prefill) through them and checks the records read."""

    def __init__(self, daemon, every_layer_indexes: bool = False, **kw) -> None:
        builder = SparseMLAIndexGroupBuilder(64)
        super().__init__(daemon, layer_cls=lambda n: SparseMLALayer(n, builder, every_layer_indexes), **kw)
        self.poisoned = 0

    def _topk(self, r, pos: int, step: int) -> List[int]:
        """K entries over positions [0, pos] (the token's own included), -1 padding where fewer are
        distinct; every third token of a step has a -1 first (the indexer's -1 need not trail)."""
        n = pos + 1
        sel = sorted({(step * 5 + i * 3 + r.seed) % n for i in range(K - 1)} | {n - 1})
        sel += [-1] * (K - len(sel))
        if (pos + step) % 3 == 0:
            sel = [-1] + sel[:-1] if sel[-1] == -1 else [-1] + sel[1:]
        return sel

    def step_attend(self, step: int, poison: bool = False):
        so = self.schedule(self.queries - 1)
        meta = self.sched.build_connector_meta(so)
        so.kv_connector_metadata = pickle.loads(pickle.dumps(meta))  # shipped to the worker process
        decode = {w.req_id for w in so.kv_connector_metadata.windows if w.decode}
        order = sorted((self.running[rid] for rid in so.num_scheduled_tokens), key=lambda r: r.request_id not in decode)
        tokens = []
        for i, r in enumerate(order):
            tokens += [(r, i, r.num_computed_tokens + t) for t in range(so.num_scheduled_tokens[r.request_id])]
        n_dec = sum(1 for r, _, _ in tokens if r.request_id in decode)
        slots = torch.full((512,), -1, dtype=torch.int64)
        for t, (r, _, pos) in enumerate(tokens):
            self._grow(r, pos + 1)
            slots[t] = self._slot(r, pos)
        for n in NAMES:
            self.ctx.slot_mapping[n] = slots[:len(tokens)]
        if poison and n_dec == len(tokens):
            # A decode-only step: every record vLLM's paged cache holds for these requests, except
            # the ones this step writes, is overwritten. Attention must not need them.
            for r in order:
                for pos in range(r.num_computed_tokens):
                    self.raw[r.blocks[pos // BLOCK], :, pos % BLOCK] = 0xEE
                    self.poisoned += 1
        self.active.pre_forward(so, request_state_indices=torch.arange(len(order), dtype=torch.int32),
                                request_ids=[r.request_id for r in order])
        width = max(len(r.blocks) for r in order)
        table = torch.tensor([r.blocks + [0] * (width - len(r.blocks)) for r in order], dtype=torch.int32)
        md = SimpleNamespace(num_actual_tokens=len(tokens), num_decode_tokens=n_dec, num_decodes=len(decode),
                             num_reqs=len(order), decode_max_query_len=self.queries if n_dec else 0,
                             max_query_len=max(so.num_scheduled_tokens.values()),
                             req_id_per_token=torch.tensor([e for _, e, _ in tokens], dtype=torch.int32),
                             block_table=table, block_size=BLOCK)
        topk = torch.tensor([self._topk(r, pos, step) for r, _, pos in tokens], dtype=torch.int32)
        runtime_module.FORWARD_CONTEXT = self.ctx
        try:
            for li, n in enumerate(NAMES):
                rows = torch.stack([kv_bytes(r.seed, li, pos) for r, _, pos in tokens])
                got = self.layers[n].attend(rows, md, self.ctx, topk)
                for t, (r, _, pos) in enumerate(tokens):
                    want = sorted(bytes(kv_bytes(r.seed, li, int(p)).tolist()) for p in topk[t] if p >= 0)
                    assert got[t] == want, (r.request_id, li, pos, topk[t].tolist())
                    self.checked += 1
        finally:
            runtime_module.FORWARD_CONTEXT = None
        self.active.finish_forward()
        out = self.active.post_forward(so.finished_req_ids)
        self.sched.update_connector_output(pickle.loads(pickle.dumps(out)))
        for rid, k in so.num_scheduled_tokens.items():
            r = self.running[rid]
            r.num_computed_tokens += k
            while r.num_computed_tokens >= r.num_tokens:
                r.output_token_ids.append(1000 + len(r.output_token_ids))
        return n_dec, len(tokens)


@pytest.fixture
def backend_runner(vllm_daemon, upstream_vllm):
    r = BackendRunner(vllm_daemon)
    yield r
    r.close()


def test_each_sparse_layer_gets_an_index_group_the_backends_take_as_hisparse(backend_runner):
    r = backend_runner
    groups = {id(r.layers[n].impl.index_group) for n in NAMES}
    assert len(groups) == 1
    for i, n in enumerate(NAMES):
        impl = r.layers[n].impl
        g = impl.index_group
        assert isinstance(g, HiSparseMLAIndexGroup) and impl.index_group_index == i
        assert g.cache(i) is r.layers[n].hisparse_cache
        assert not g.cache(i).all_context_pages_resident
    g = r.layers[NAMES[0]].impl.index_group
    assert g.logical_topk_indices.shape == (64, K) and g.has_indexer  # upstream's fields kept


def test_decode_reads_the_arena_and_prefill_vllms_cache_batch_3(backend_runner):
    """Prefill of 3 requests, decode steps with vLLM's copy of their older positions poisoned, a
    new request's prefill in the same step as 3 decodes, then decode of all 4."""
    r = backend_runner
    reqs = [Request(f"p{i}", seed=61 + i, prompt_len=20 + 6 * i) for i in range(3)]
    for q in reqs:
        r.add(q)
    assert r.step_attend(0) == (0, sum(q.num_prompt_tokens for q in reqs))
    for step in range(1, 5):
        assert r.step_attend(step, poison=True) == (3, 3)
    late = Request("p3", seed=71, prompt_len=25)
    r.add(late)
    assert r.step_attend(5) == (3, 3 + 25)  # decodes first, then the prefill, in one forward
    for step in range(6, 9):
        assert r.step_attend(step, poison=True) == (4, 4)
    impl = r.layers[NAMES[1]].impl
    assert impl.branches == ["hisparse"] * 9 and r.poisoned > 0
    stats = r.session.stats()
    assert stats.misses > 0 and stats.hits > 0
    for q in reqs + [late]:
        r.finish(q)


def test_mtp_verify_tokens_through_the_index_group(vllm_daemon, upstream_vllm):
    r = BackendRunner(vllm_daemon, draft_tokens=1)
    try:
        reqs = [Request(f"m{i}", seed=81 + i, prompt_len=18 + 5 * i) for i in range(2)]
        for q in reqs:
            r.add(q)
        r.step_attend(0)
        for step in range(1, 5):
            assert r.step_attend(step, poison=True) == (2 * 2, 2 * 2)
        assert r.session.stats().misses > 0
    finally:
        r.close()


def test_a_group_per_layer_when_every_layer_has_an_indexer(vllm_daemon, upstream_vllm):
    """DeepSeek V3.2's layout: each layer produces its own top-k, so vLLM's builder makes one
    group per layer (index_group_index 0 in each); each gets its own HisparsedIndexGroup."""
    r = BackendRunner(vllm_daemon, every_layer_indexes=True)
    try:
        impls = [r.layers[n].impl for n in NAMES]
        assert len({id(impl.index_group) for impl in impls}) == LAYERS
        for n, impl in zip(NAMES, impls):
            assert isinstance(impl.index_group, HiSparseMLAIndexGroup) and impl.index_group_index == 0
            assert impl.index_group.cache(0) is r.layers[n].hisparse_cache
        reqs = [Request(f"g{i}", seed=91 + i, prompt_len=17 + 4 * i) for i in range(2)]
        for q in reqs:
            r.add(q)
        r.step_attend(0)
        for step in range(1, 4):
            assert r.step_attend(step, poison=True) == (2, 2)
    finally:
        r.close()


def test_the_arena_is_whole_kernel_blocks_in_flat_row_order(vllm_daemon, upstream_vllm):
    """B = 8, block 16, 3 rows, 2 layers: 3 x 2 x 9 records are not whole blocks; the connector
    rounds B up to 15 so each (row, layer) run is one block, and row j of flat_kv_row_view is
    record j of the arena."""
    r = BackendRunner(vllm_daemon, max_num_seqs=3)
    try:
        assert r.session.slots == 15 and r.session.record_slots == 16
        g = r.layers[NAMES[0]].impl.index_group
        cache = g.physical_kv_cache(1)
        assert cache.shape == (3 * LAYERS, BLOCK, RECORD)
        rows, stride = flat_kv_row_view(cache, BLOCK)
        arena = torch.as_tensor(r.session.slot_view())
        assert stride == BLOCK and rows.data_ptr() == arena.data_ptr()
        arena[2, 1, 5] = 0x5A
        assert int(rows[(2 * LAYERS + 1) * 16 + 5, 0]) == 0x5A
    finally:
        r.close()


def test_a_group_with_a_layer_hisparse_does_not_serve_is_refused(vllm_daemon, upstream_vllm):
    with pytest.raises(InvalidArgument, match="every layer of a group"):
        BackendRunner(vllm_daemon, layers=[NAMES[1]])


def test_stage_prefill_rows_without_a_copy_when_blocks_are_adjacent(backend_runner):
    g = backend_runner.layers[NAMES[0]].impl.index_group
    cache = torch.arange(6 * BLOCK * RECORD, dtype=torch.int32).to(torch.uint8).view(6, BLOCK, RECORD)
    md = SimpleNamespace(num_decodes=1, num_decode_tokens=1, num_actual_tokens=4, block_size=BLOCK,
                         req_id_per_token=torch.tensor([0, 1, 1, 2], dtype=torch.int32),
                         block_table=torch.tensor([[5, 0], [3, 4], [1, 0]], dtype=torch.int32))
    staged, table, req_ids = g.stage_prefill_rows(0, cache, md)
    assert staged is cache and torch.equal(table, md.block_table[1:]) and req_ids.tolist() == [0, 0, 1]
    strided = torch.zeros((6, 2, BLOCK, RECORD), dtype=torch.uint8)
    strided[:, 1] = cache
    staged, table, _ = g.stage_prefill_rows(0, strided[:, 1], md)
    for req in range(2):
        for b in range(2):
            assert torch.equal(staged[table[req, b]], cache[md.block_table[1 + req, b]])

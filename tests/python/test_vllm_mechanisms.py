"""hisparse.integrations.vllm driven through stand-ins of the vLLM mechanisms that decide whether
it runs inside vLLM unmodified (issue 38, findings 6-8). Each stand-in reproduces what the
upstream code does to the adapter, at the commit cited on it (vllm-project/vllm):

- ActiveKVConnector (vllm/v1/worker/gpu/kv_connector.py @ 00f4240e): __init__ registers the KV
  caches; pre_forward calls handle_preemptions and bind_connector_metadata, and start_load_kv only
  if SchedulerOutput.has_sync_kv_loads (else post_forward starts it, after the forward), then
  wait_for_save, get_transfer_results, build_connector_worker_meta, clear_connector_metadata.
- MLAAttention.forward (vllm/model_executor/layers/attention/mla_attention.py, as published at
  docs.vllm.ai/en/latest/api/vllm/model_executor/layers/attention/, lastmod 2026-09-24; the copies
  of the file stored for this project are older): prepare_kv_cache_update (the group leader's
  prepare_group_for_batch), update_kv_cache (returns on dummy_batch; write_target, the write into
  what it returns, mirror_write_target), finish_kv_update, then the sparse backend's swap_in.
- Connector attachment: vLLM builds no HiSparse handle of its own unless
  attention_config.hisparse_config is set (SparseMLAIndexGroupBuilder.register_layer,
  vllm/v1/attention/backends/mla/index_group.py @ 03328988), and MLAAttention registers itself in
  compilation_config.static_forward_context under its name; the layer reads
  ``self.hisparse_cache``.
- bind_cache(raw, byte_offset=, block_stride=, num_blocks=, block_size=, block_table=,
  slot_mapping=) over a KV tensor whose blocks interleave several layers' (HiSparseCacheHandle.
  bind_cache and PagedCacheView.bind, vllm/v1/hisparse/runtime.py @ 023979d6).
- MTP: several swap_in calls per forward, each taking the next rows (HiSparseRuntime._step_rows,
  runtime.py @ 023979d6), one verify step per call over strided views (issue 38, finding 8).

Every index swap_in returns is checked byte for byte against the plain full-KV reference, and
the attention over the records it names equal to the attention over that reference. Host
backend, a real hisparsed; batch >= 2 throughout.
"""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace
from typing import Dict, List, Optional

import pytest

import hisparse
from conftest import _daemon_or_skip, _library_or_skip
from test_vllm_adapter import (CachedRequestData, KVCacheBlocks, KVTransferConfig, NewRequestData, Request, Role,
                               attend, kv_bytes)

torch = pytest.importorskip("torch")
from hisparse.errors import FailedPrecondition, InvalidArgument  # noqa: E402
from hisparse.integrations.vllm import HisparsedConnector  # noqa: E402
from hisparse.integrations.vllm import runtime as runtime_module  # noqa: E402

LAYERS, RECORD, K, B = 2, 64, 4, 8
BLOCK, NUM_BLOCKS = 16, 64
MAX_SEQS = 8
NAMES = [f"model.layers.{i}.self_attn.mla_attn" for i in range(LAYERS)]


@dataclasses.dataclass
class SchedulerOutput:
    """vllm.v1.core.sched.output.SchedulerOutput: the fields the connectors and ActiveKVConnector
    read (@ 00f4240e: has_sync_kv_loads False unless a connector's build_connector_meta sets it)."""

    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    preempted_req_ids: set
    finished_req_ids: set
    has_sync_kv_loads: bool = False
    kv_connector_metadata: object = None


class ActiveKVConnector:
    """vllm/v1/worker/gpu/kv_connector.py ActiveKVConnector @ 00f4240e (the connector passed in,
    where upstream takes get_kv_transfer_group())."""

    def __init__(self, connector, kv_caches_dict):
        self.kv_connector = connector
        self.kv_connector.register_kv_caches(kv_caches_dict)
        self.kv_connector.set_host_xfer_buffer_ops(None)
        self._pending_load_kwargs = None
        self.load_started_before_forward = False

    def pre_forward(self, scheduler_output, **kwargs):
        meta = scheduler_output.kv_connector_metadata
        assert meta is not None
        self.kv_connector.handle_preemptions(meta)
        self.kv_connector.bind_connector_metadata(meta)
        self._pending_load_kwargs = kwargs
        self.load_started_before_forward = bool(scheduler_output.has_sync_kv_loads)
        if scheduler_output.has_sync_kv_loads:
            self._start_load_kv()

    def _start_load_kv(self):
        kwargs, self._pending_load_kwargs = self._pending_load_kwargs, None
        self.kv_connector.start_load_kv(None, **kwargs)

    def finish_forward(self):
        self.kv_connector.finish_forward()

    def post_forward(self, finished_req_ids):
        if self._pending_load_kwargs is not None:
            self._start_load_kv()  # the deferred load: after the forward
        self.kv_connector.wait_for_save()
        results = self.kv_connector.get_transfer_results(finished_req_ids)
        out = SimpleNamespace(finished_recving=results.finished_recving or None,
                              finished_sending=results.finished_sending or None,
                              kv_connector_worker_meta=self.kv_connector.build_connector_worker_meta())
        self.kv_connector.clear_connector_metadata()
        return out


class ForwardContext:
    """vllm.forward_context.ForwardContext's slot_mapping: layer name -> slot mapping tensor."""

    def __init__(self):
        self.slot_mapping: Dict[str, torch.Tensor] = {}


class MLAAttention:
    """MLAAttention.forward's hisparse path (module docstring), with the sparse backend's top-k
    attention: per layer, prepare -> write -> mirror -> finish_kv_update -> swap_in (one call, or
    one per verify step over strided views with MTP) -> attention over physical_kv_cache()."""

    def __init__(self, name: str):
        self.layer_name = name
        self.hisparse_cache = None  # vLLM sets none without hisparse_config (index_group.py @ 03328988)
        self.kv_cache = None

    def forward(self, rows: torch.Tensor, md, ctx: ForwardContext, topk: Optional[torch.Tensor], queries: int):
        cache = self.hisparse_cache
        if cache is not None and cache.runtime.is_group_leader:  # prepare_kv_cache_update
            cache.prepare_group_for_batch(md)
        slot_mapping = ctx.slot_mapping[self.layer_name]
        if cache is None or not cache.dummy_batch:  # update_kv_cache
            kv_cache = self.kv_cache
            if cache is not None:
                kv_cache, slot_mapping, n = cache.write_target(rows.shape[0], slot_mapping.numel())
                rows = rows[:n]
            _write(kv_cache, slot_mapping, rows)  # impl.do_kv_cache_update
            if cache is not None:
                mirror = cache.mirror_write_target(rows.shape[0])
                if mirror is not None:
                    _write(mirror[0], mirror[1], rows)
        if cache is not None:
            cache.finish_kv_update()
        if topk is None or cache is None:
            return []
        results = []
        rid = md.req_id_per_token
        if queries == 1:
            results.append((slice(0, topk.shape[0]), cache.swap_in(rid[:topk.shape[0]], None, topk, block_size=BLOCK,
                                                                    return_valid_counts=True)))
        else:  # one call per verify step, each over a strided view of the step's tokens
            for j in range(queries):
                results.append((slice(j, topk.shape[0], queries),
                                cache.swap_in(rid[j:topk.shape[0]:queries], None, topk[j::queries], block_size=BLOCK,
                                              return_valid_counts=True)))
        return results


def _write(kv_cache: torch.Tensor, slot_mapping: torch.Tensor, rows: torch.Tensor) -> None:
    """impl.do_kv_cache_update: row i to slot slot_mapping[i] of [num_blocks, block_size, row]."""
    for i, s in enumerate(slot_mapping.tolist()):
        if s >= 0:
            kv_cache[s // kv_cache.shape[1], s % kv_cache.shape[1]] = rows[i]


class Runner:
    """vLLM's scheduler, model runner and sparse MLA layers around the connector, for these tests:
    one raw KV tensor [num_blocks, layers, block_size, record] (each layer's cache a strided view
    of it), decode entries first in the batch, idx_mapping = batch position."""

    def __init__(self, daemon, draft_tokens: int = 0, hisparse_config=None, layer_cls=None, **extra):
        extra = {**dict(daemon=daemon.address, backend="host", top_k=K, device_buffer_size=B, max_num_seqs=MAX_SEQS),
                 **extra}
        if draft_tokens:
            extra["draft_tokens"] = draft_tokens
        self.queries = draft_tokens + 1
        self.layers = {n: (layer_cls or MLAAttention)(n) for n in NAMES}
        self.cfg = SimpleNamespace(
            kv_transfer_config=KVTransferConfig(extra),
            scheduler_config=SimpleNamespace(max_num_seqs=MAX_SEQS, max_num_batched_tokens=512),
            speculative_config=None,
            attention_config=SimpleNamespace(hisparse_config=hisparse_config),
            compilation_config=SimpleNamespace(static_forward_context=dict(self.layers)))
        self.raw = torch.zeros((NUM_BLOCKS, LAYERS, BLOCK, RECORD), dtype=torch.uint8)
        caches = {n: self.raw[:, i] for i, n in enumerate(NAMES)}
        for n, layer in self.layers.items():
            layer.kv_cache = caches[n]
        self.sched = HisparsedConnector(self.cfg, Role.SCHEDULER)
        self.worker_conn = HisparsedConnector(self.cfg, Role.WORKER)
        self.active = ActiveKVConnector(self.worker_conn, caches)
        self.worker = self.worker_conn.connector_worker
        self.session = self.worker.session
        self.ctx = ForwardContext()
        self.free = list(range(1, NUM_BLOCKS))
        self.running: Dict[str, Request] = {}
        self.new: List[Request] = []
        self.finished: set = set()
        self.truth: Dict[tuple, torch.Tensor] = {}
        self.checked = 0

    def add(self, req: Request) -> None:
        self.sched.get_num_new_matched_tokens(req, 0)
        self._grow(req, req.num_tokens + self.queries)
        self.sched.update_state_after_alloc(req, KVCacheBlocks(req.blocks), 0)
        self.new.append(req)

    def finish(self, req: Request) -> None:
        self.running.pop(req.request_id, None)
        self.sched.request_finished(req, [req.blocks])
        self.free += req.blocks
        req.blocks = []
        self.finished.add(req.request_id)

    def _grow(self, req: Request, tokens: int) -> None:
        while len(req.blocks) * BLOCK < tokens:
            req.blocks.append(self.free.pop(0))

    def _slot(self, req: Request, pos: int) -> int:
        return req.blocks[pos // BLOCK] * BLOCK + pos % BLOCK

    def schedule(self, drafts: int = 0) -> SchedulerOutput:
        n = {}
        for r in self.new + list(self.running.values()):
            left = r.num_tokens - r.num_computed_tokens
            n[r.request_id] = left + (drafts if left == 1 else 0)
        so = SchedulerOutput([NewRequestData(r.request_id, r.num_computed_tokens, (list(r.blocks),)) for r in self.new],
                             CachedRequestData([r.request_id for r in self.running.values()],
                                               [r.num_computed_tokens for r in self.running.values()]),
                             n, set(), set(self.finished))
        for r in self.new:
            self.running[r.request_id] = r
        self.new, self.finished = [], set()
        return so

    def step(self, selections: Optional[Dict[str, List[List[int]]]] = None, sync_loads: Optional[bool] = None,
             before_forward=None):
        """One engine step through ActiveKVConnector and the layers. All drafts are accepted
        (their KV is the real tokens'). sync_loads: force SchedulerOutput.has_sync_kv_loads after
        the connector built its metadata (None: leave what the connector set). before_forward:
        called between pre_forward and the first layer."""
        drafts = self.queries - 1
        so = self.schedule(drafts)
        meta = self.sched.build_connector_meta(so)
        if sync_loads is not None:
            so.has_sync_kv_loads = sync_loads
        so.kv_connector_metadata = pickle.loads(pickle.dumps(meta))  # shipped to the worker process
        decode = {w.req_id for w in so.kv_connector_metadata.windows if w.decode}
        order = sorted((self.running[rid] for rid in so.num_scheduled_tokens), key=lambda r: r.request_id not in decode)
        tokens = []  # (request, batch entry, position)
        for i, r in enumerate(order):
            tokens += [(r, i, r.num_computed_tokens + t) for t in range(so.num_scheduled_tokens[r.request_id])]
        n_dec = sum(1 for r, _, _ in tokens if r.request_id in decode)
        slots = torch.full((512,), -1, dtype=torch.int64)
        for t, (r, _, pos) in enumerate(tokens):
            self._grow(r, pos + 1)
            slots[t] = self._slot(r, pos)
        for n in NAMES:
            self.ctx.slot_mapping[n] = slots[:len(tokens)]
        self.active.pre_forward(so, request_state_indices=torch.arange(len(order), dtype=torch.int32),
                                request_ids=[r.request_id for r in order])
        if before_forward is not None:
            before_forward()
        md = SimpleNamespace(num_actual_tokens=len(tokens), num_decode_tokens=n_dec, num_decodes=len(decode),
                             num_reqs=len(order), max_query_len=max(so.num_scheduled_tokens.values(), default=0),
                             req_id_per_token=torch.tensor([e for _, e, _ in tokens], dtype=torch.int32),
                             block_size=BLOCK)
        topk = None
        if n_dec:
            topk = torch.full((n_dec, K), -1, dtype=torch.int32)
            for t, (r, _, pos) in enumerate(tokens[:n_dec]):
                sel = (selections or {}).get(r.request_id)
                if sel is not None:
                    sel = sel[pos - r.num_computed_tokens]
                    topk[t, :len(sel)] = torch.tensor(sel, dtype=torch.int32)
        runtime_module.FORWARD_CONTEXT = self.ctx
        try:
            for li, n in enumerate(NAMES):
                rows = torch.stack([kv_bytes(r.seed, li, pos) for r, _, pos in tokens]) if tokens else \
                    torch.zeros((0, RECORD), dtype=torch.uint8)
                for r, _, pos in tokens:
                    self.truth[(r.request_id, li, pos)] = kv_bytes(r.seed, li, pos)
                results = self.layers[n].forward(rows, md, self.ctx, topk, self.queries)
                for rows_of, (phys, valid) in results:  # each call's indices, once every call of the layer ran
                    self.check(li, tokens[:n_dec][rows_of], topk[rows_of], phys, valid)
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
        return so

    def check(self, layer: int, tokens, topk, phys, valid) -> None:
        arena = self.worker.cache_handle(NAMES[layer]).physical_kv_cache().reshape(-1, RECORD)
        for t, (r, _, pos) in enumerate(tokens):
            want = topk[t] >= 0
            assert torch.equal(phys[t] >= 0, want), (r.request_id, layer, pos, phys[t], topk[t])
            assert int(valid[t]) == int(want.sum())
            sel = topk[t][want].long()
            got = arena[phys[t][want].long()]
            ref = torch.stack([self.truth[(r.request_id, layer, int(p))] for p in sel])
            assert torch.equal(got, ref), (r.request_id, layer, pos, sel.tolist())
            q = torch.linspace(-1, 1, RECORD)
            assert torch.equal(attend(q, got), attend(q, ref))
            self.checked += 1

    def close(self) -> None:
        self.worker_conn.shutdown()


def _select(reqs, step: int, queries: int, spread: int = 3):
    """Per request and query token: K distinct positions before the token's own, spread out so that
    they outgrow B slots and RESOLVE misses and evicts."""
    out = {}
    for r in reqs:
        seq = r.num_computed_tokens
        lists = []
        for q in range(queries):
            n = seq + q + 1  # positions [0, n) exist for this query token (its own included)
            lists.append(sorted({(step * 7 + i * spread * (q + 1) + r.seed) % n for i in range(K - 1)} | {n - 1}))
        out[r.request_id] = lists
    return out


@pytest.fixture(scope="module")
def vllm_daemon():
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB"]) as d:
        yield d


@pytest.fixture
def runner(vllm_daemon):
    r = Runner(vllm_daemon)
    yield r
    r.close()


# ---- finding 6: vLLM's own handles switched off, ours attached with the whole attention-facing API ----

def test_the_connector_attaches_a_handle_to_every_sparse_layer(runner):
    for i, n in enumerate(NAMES):
        h = runner.layers[n].hisparse_cache
        assert h is runner.worker.cache_handle(n), n
        assert h.runtime.is_group_leader == (i == 0)
        assert h.index_group_caches == [runner.layers[m].hisparse_cache for m in NAMES]


def test_vllms_own_hisparse_is_refused_beside_ours(vllm_daemon):
    with pytest.raises(InvalidArgument, match="hisparse_config"):
        Runner(vllm_daemon, hisparse_config=SimpleNamespace(device_buffer_size=B))


def test_bind_cache_reads_a_layer_interleaved_with_others_in_one_tensor(runner):
    """Each layer's cache is raw[:, layer]: blocks LAYERS x BLOCK x RECORD bytes apart. Records
    stored and appended come from that layer's rows, not a copy and not its neighbour's."""
    reqs = [Request(f"r{i}", seed=11 + i, prompt_len=20 + 5 * i) for i in range(3)]
    for r in reqs:
        runner.add(r)
    runner.step()
    for step in range(6):
        runner.step(_select(reqs, step, 1))
    assert runner.checked == 6 * 3 * LAYERS
    for r in reqs:
        for layer in range(LAYERS):
            hid = runner.worker._live[r.request_id].hid
            for pos in (0, r.num_computed_tokens - 1):
                assert bytes(runner.session.record_view(hid, layer, pos)[0]) == bytes(kv_bytes(r.seed, layer, pos).numpy())
    for r in reqs:
        runner.finish(r)
    runner.step()
    assert runner.session.stats().session_requests == 0


def test_handle_api_as_mla_attention_calls_it(runner):
    h = runner.worker.cache_handle(NAMES[0])
    raw = torch.zeros(4096, dtype=torch.uint8)
    sm = torch.zeros(8, dtype=torch.int64)
    h2 = type(h)(runner.worker.runtime, 1)
    h2.bind_cache(raw, byte_offset=2 * RECORD, block_stride=4 * RECORD, num_blocks=8, block_size=2,
                  block_table=torch.zeros((1, 1), dtype=torch.int32), slot_mapping=sm)
    assert h2.kv_cache.shape == (8, 2, RECORD) and h2.kv_cache.stride() == (4 * RECORD, RECORD, 1)
    h2.kv_cache[1, 1] = 7  # block 1, row 1: byte 2*64 + 4*64 + 64
    assert int(raw[7 * RECORD]) == 7
    h.prepare_group_for_batch(None)  # the profile / dummy run
    assert h.dummy_batch and runner.layers[NAMES[1]].hisparse_cache.dummy_batch
    assert h.mirror_write_target(3) is None
    with pytest.raises(FailedPrecondition):
        runner.layers[NAMES[1]].hisparse_cache.prepare_group_for_batch(None)  # not the leader


# ---- finding 7: ActiveKVConnector starts the load after the forward unless told otherwise ----

def test_decode_is_prepared_before_the_forward_through_active_kv_connector(runner):
    reqs = [Request(f"d{i}", seed=21 + i, prompt_len=18 + 4 * i) for i in range(2)]
    for r in reqs:
        runner.add(r)
    so = runner.step()
    assert so.has_sync_kv_loads and runner.active.load_started_before_forward
    for step in range(4):
        runner.step(_select(reqs, step, 1))
    assert runner.checked == 4 * 2 * LAYERS


def test_lifecycle_runs_before_the_forward_even_when_the_load_is_deferred(runner):
    """With has_sync_kv_loads forced off (start_load_kv after the forward), admission and release
    still happen before the forward, and a decode forward refuses to run on last step's state."""
    reqs = [Request(f"l{i}", seed=31 + i, prompt_len=12) for i in range(2)]
    for r in reqs:
        runner.add(r)
    seen = []
    runner.step(sync_loads=False, before_forward=lambda: seen.append(runner.session.stats().session_requests))
    assert seen == [2]  # admitted before the forward, though start_load_kv came after it
    assert not runner.active.load_started_before_forward
    # A decode step whose load is deferred: the forward must not resolve with the prefill's rows.
    with pytest.raises(FailedPrecondition, match="has_sync_kv_loads"):
        runner.step(_select(reqs, 0, 1), sync_loads=False)
    runner.active.post_forward(set())  # the step that failed still ends (the load it deferred)
    for r in reqs:
        runner.finish(r)
    runner.step()
    assert runner.session.stats().session_requests == 0


def test_a_second_forward_of_the_step_keeps_its_preparation(runner):
    """A drafter's forward after the target's, in one step, finds the step still prepared; the
    next step's metadata withdraws the preparation until its start_load_kv."""
    reqs = [Request(f"s{i}", seed=51 + i, prompt_len=14) for i in range(2)]
    for r in reqs:
        runner.add(r)
    runner.step()
    so = runner.schedule()
    so.kv_connector_metadata = runner.sched.build_connector_meta(so)
    runner.active.pre_forward(so, request_state_indices=torch.arange(2, dtype=torch.int32),
                              request_ids=[r.request_id for r in reqs])
    md = SimpleNamespace(num_actual_tokens=2, num_decode_tokens=2, num_decodes=2, num_reqs=2, max_query_len=1,
                         req_id_per_token=torch.arange(2, dtype=torch.int32), block_size=BLOCK)
    leader = runner.layers[NAMES[0]].hisparse_cache
    leader.prepare_group_for_batch(md)
    leader.prepare_group_for_batch(md)  # the drafter's forward
    runner.active.post_forward(set())
    so = runner.schedule()
    so.kv_connector_metadata = runner.sched.build_connector_meta(so)
    runner.worker_conn.bind_connector_metadata(so.kv_connector_metadata)  # the next step, before its load
    with pytest.raises(FailedPrecondition):
        leader.prepare_group_for_batch(md)
    for r in reqs:
        runner.finish(r)


# ---- finding 8: MTP's per-verify-step swap_in over strided views ----

def test_mtp_swap_in_once_per_verify_step_over_strided_views(vllm_daemon):
    r = Runner(vllm_daemon, draft_tokens=1)
    try:
        reqs = [Request(f"m{i}", seed=41 + i, prompt_len=22 + 3 * i) for i in range(3)]
        for q in reqs:
            r.add(q)
        r.step()
        for step in range(5):
            r.step(_select(reqs, step, 2, spread=2))
        assert r.checked == 5 * 3 * 2 * LAYERS  # every query token of every request, every layer
        for q in reqs:
            r.finish(q)
        r.step()
        assert r.session.stats().session_requests == 0
    finally:
        r.close()


# ---- the example engine through the same mechanisms, against full HBM ----

def run_vllm_mode(daemon, tmp_path, extra):
    """run_engine.py --adapter vllm --vllm-fixed-batch (examples/engine/vllm_mode.py): the model's KV
    behind HisparsedConnector over one interleaved paged cache, driven through ActiveKVConnector's
    step and MLAAttention's calls; every decode step's logits equal the full-KV baseline's bit for
    bit. The served workload (preemption, abort, drafts) is tests/python/test_engine.py's."""
    run_engine = pytest.importorskip("run_engine")
    out = tmp_path / "rows.json"
    rc = run_engine.main(["--adapter", "vllm", "--vllm-fixed-batch", "--model", "small", "--daemon", daemon.address,
                          "--json", str(out)] + extra)
    import json
    rows = json.loads(out.read_text())
    assert rows and all(r["adapter"] == "vllm" and r["exact"] for r in rows), rows
    assert rc == 0
    for r in rows:
        assert r["batch"] >= 2 and r["hits"] > 0 and r["misses"] > 0, r
    return rows


def test_engine_through_the_vllm_adapter_exact_on_the_host_backend(vllm_daemon, tmp_path):
    rows = run_vllm_mode(vllm_daemon, tmp_path, ["--device", "cpu", "--configs", "3x150", "--k", "16", "--steps", "8",
                                                 "--slots-factor", "1,2"])
    assert [r["slots"] for r in rows] == [16, 32]


def test_engine_through_the_vllm_adapter_exact_on_a_gpu(vllm_daemon, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    run_vllm_mode(vllm_daemon, tmp_path, ["--device", "cuda", "--configs", "4x2500", "--k", "64", "--steps", "24",
                                          "--slots-factor", "1,2", "--records", "bf16,fp8"])

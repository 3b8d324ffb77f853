"""hisparse.integrations.vllm driven as vLLM's scheduler, model runner and sparse MLA layers drive
HiSparseConnector and HiSparseCacheHandle (vllm-project/vllm @ 023979d6), replaying the scenarios
of vLLM's own tests for this path: tests/kernels/attention/test_hisparse_kernels.py @ 23d03455
(cold start, warm replay fixed point, padding rows, many independent rows) and
tests/v1/kv_connector/unit/test_hisparse_connector.py @ 023979d6 (a FULL-graph decode step still
mirrors the rows it wrote to the host), plus the connector's own lifecycle: scheduler -> worker
metadata round trips (pickled, as vLLM ships them to worker processes), batched admission and
release, preemption as park/resume, P/D import, refusals. Host backend, a real hisparsed.

The KV of (request seed, layer, position) is a fixed byte pattern, so a recompute writes what a
real model would; every index swap_in returns is checked byte for byte, and an attention over the
records it names is checked equal to the same attention over a plain full-KV torch reference.
Every test ends with the daemon's pool empty (no request, no used byte).
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
import pickle
import subprocess
import struct
import sys
from typing import Dict, List, Optional, Sequence

import pytest

import hisparse
from conftest import child_env, wait_for

torch = pytest.importorskip("torch")
from hisparse.integrations.vllm import HisparsedConnector  # noqa: E402

LAYERS, RECORD, K, B = 2, 64, 4, 8
BLOCK, NUM_BLOCKS = 16, 96
MAX_SEQS = 20
IMPORT_SEED = 7
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def kv_bytes(seed: int, layer: int, position: int) -> torch.Tensor:
    """The record a model would write for (request seed, layer, position)."""
    return ((seed * 5 + layer * 11 + position * 31 + torch.arange(RECORD)) % 256).to(torch.uint8)


def full_kv(seed: int, layer: int, length: int) -> torch.Tensor:
    """The plain full-KV reference: every record of positions [0, length), uint8 [length, RECORD]."""
    return torch.stack([kv_bytes(seed, layer, p) for p in range(length)])


def attend(query: torch.Tensor, records: torch.Tensor) -> torch.Tensor:
    """A toy attention over records (uint8 [n, RECORD] read as float32 values)."""
    values = records.to(torch.float32)
    weights = torch.softmax(values @ query / RECORD, dim=0)
    return weights @ values


# ---- stand-ins for the vLLM objects the connector touches ----

class KVTransferConfig:
    """Stand-in for vllm.config.KVTransferConfig: kv_connector, kv_role and
    kv_connector_extra_config, the fields vLLM's connectors read (not pinned to a commit read here)."""

    def __init__(self, extra):
        self.kv_connector = "HisparsedConnector"
        self.kv_role = "kv_both"
        self.kv_connector_extra_config = extra
        self.is_kv_producer = False


class VllmConfig:
    """Stand-in for vllm.config.VllmConfig: kv_transfer_config, scheduler_config (max_num_seqs,
    max_num_batched_tokens) and speculative_config (num_speculative_tokens): the fields the
    connector reads (not pinned to a commit read here)."""

    class SchedulerConfig:
        def __init__(self, max_num_seqs):
            self.max_num_seqs = max_num_seqs
            self.max_num_batched_tokens = 1024

    def __init__(self, daemon, **extra):
        opts = {"daemon": daemon.address, "backend": "host", "top_k": K, "device_buffer_size": B}
        opts.update(extra)
        self.kv_transfer_config = KVTransferConfig(opts)
        self.scheduler_config = VllmConfig.SchedulerConfig(MAX_SEQS)
        self.speculative_config = None


class Role:
    """Stand-in for vllm.distributed.kv_transfer.kv_connector.v1.base.KVConnectorRole (@ 003df296)."""

    class _R:
        def __init__(self, name):
            self.name = name

    SCHEDULER = _R("SCHEDULER")
    WORKER = _R("WORKER")


class Request:
    """Stand-in for vllm.v1.request.Request (@ 000a0d5f): request_id, num_prompt_tokens,
    num_tokens (prompt + outputs), num_computed_tokens, max_tokens, kv_transfer_params, status
    (a RequestStatus name)."""

    def __init__(self, rid: str, seed: int, prompt_len: int, max_tokens: int = 32, kv_transfer_params=None):
        self.request_id = rid
        self.seed = seed
        self.num_prompt_tokens = prompt_len
        self.output_token_ids: List[int] = []
        self.num_computed_tokens = 0
        self.max_tokens = max_tokens
        self.kv_transfer_params = kv_transfer_params
        self.blocks: List[int] = []
        self.status = Status("WAITING")

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)


class KVCacheBlocks:
    """Stand-in for vllm.v1.core.kv_cache_manager.KVCacheBlocks: get_block_ids(), one list of
    block ids per KV-cache group (as NewRequestData.block_ids @ 00e8f1fd carries them)."""

    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (list(self.ids),)


@dataclasses.dataclass
class NewRequestData:
    """Stand-in for vllm.v1.core.sched.output.NewRequestData (@ 00e8f1fd): the fields read here."""

    req_id: str
    num_computed_tokens: int
    block_ids: tuple


@dataclasses.dataclass
class CachedRequestData:
    """Stand-in for vllm.v1.core.sched.output.CachedRequestData (@ 00e8f1fd): req_ids, num_computed_tokens."""

    req_ids: List[str]
    num_computed_tokens: List[int]


@dataclasses.dataclass
class SchedulerOutput:
    """Stand-in for vllm.v1.core.sched.output.SchedulerOutput (@ 00e8f1fd): scheduled_new_reqs,
    scheduled_cached_reqs, num_scheduled_tokens, preempted_req_ids (V2 model runner only),
    finished_req_ids."""

    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    preempted_req_ids: set
    finished_req_ids: set


@dataclasses.dataclass
class KVConnectorOutput:
    """Stand-in for vllm.v1.outputs.KVConnectorOutput: finished_recving and the aggregated
    kv_connector_worker_meta (what upstream's HiSparseConnector.update_connector_output reads @ 023979d6)."""

    finished_sending: Optional[set]
    finished_recving: Optional[set]
    kv_connector_worker_meta: object


@dataclasses.dataclass(frozen=True)
class Status:
    """Stand-in for a vllm.v1.request.RequestStatus member (@ 000a0d5f): its name."""

    name: str


PAD = None  # a padding entry of a padded decode batch (request state index -1)


class Engine:
    """What vLLM's scheduler (Scheduler.schedule / update_from_output), its block pool, the GPU
    model runner (paged caches, slot_mapping, idx_mapping) and the sparse MLA layers do around
    the connector, for these tests. Block 0 is the null block (padding slots write there)."""

    def __init__(self, daemon, max_tokens_per_step: int = 1024, device: str = "cpu", **extra):
        self.dev = torch.device(device)
        if self.dev.type == "cuda":
            extra.setdefault("backend", "cuda")
            extra.setdefault("gpu", self.dev.index or 0)
        cfg = VllmConfig(daemon, **extra)
        self.sched = HisparsedConnector(cfg, Role.SCHEDULER)
        self.conn = HisparsedConnector(cfg, Role.WORKER)
        self.caches = {n: torch.zeros((NUM_BLOCKS, BLOCK, RECORD), dtype=torch.uint8, device=self.dev)
                       for n in LAYER_NAMES}
        self.conn.register_kv_caches(self.caches)
        self.worker = self.conn.connector_worker
        self.session = self.worker.session
        self.slot_mapping = torch.full((max_tokens_per_step,), -1, dtype=torch.int64, device=self.dev)  # persistent
        self.worker.bind_slot_mapping(self.slot_mapping)
        self.free_blocks = list(range(1, NUM_BLOCKS))
        self.running: Dict[str, Request] = {}
        self.new: List[Request] = []
        self.preempted: set = set()
        self.finished: set = set()
        self.metas: List[object] = []
        self.truth: Dict[tuple, torch.Tensor] = {}
        self.base_pool = self.session.stats().pool_used_bytes

    # -- scheduler --

    def add(self, req: Request, computed_blocks: int = 0) -> None:
        """The request is scheduled from the waiting queue: blocks, then update_state_after_alloc.
        computed_blocks: a prefix-cache hit of that many full blocks (their KV is in the cache)."""
        matched, load = self.sched.get_num_new_matched_tokens(req, computed_blocks * BLOCK)
        req.num_computed_tokens = computed_blocks * BLOCK
        self.grow(req, req.num_tokens + 1)
        for p in range(req.num_computed_tokens):
            self.write(req, p)
        self.sched.update_state_after_alloc(req, KVCacheBlocks(req.blocks), matched)
        self.new.append(req)

    def grow(self, req: Request, tokens: int) -> None:
        while len(req.blocks) * BLOCK < tokens:
            req.blocks.append(self.free_blocks.pop(0))

    def slot(self, req: Request, pos: int) -> int:
        return req.blocks[pos // BLOCK] * BLOCK + pos % BLOCK

    def write(self, req: Request, pos: int, layers=None, seed: Optional[int] = None) -> None:
        """The forward writes the KV of (req, pos) into the paged cache; self.truth, the plain
        full-KV reference, keeps the latest record of every position."""
        for layer, name in enumerate(LAYER_NAMES):
            if layers is None or layer in layers:
                rec = kv_bytes(req.seed if seed is None else seed, layer, pos)
                self.caches[name].view(-1, RECORD)[self.slot(req, pos)] = rec.to(self.dev)
                self.truth[(req.request_id, layer, pos)] = rec

    def preempt(self, req: Request, v2_runner: bool = True) -> None:
        """Scheduler._preempt_request: blocks freed, status PREEMPTED, recompute from scratch
        later; preempted_req_ids names it only for the V2 model runner."""
        del self.running[req.request_id]
        self.free_blocks += req.blocks
        req.blocks, req.num_computed_tokens, req.status = [], 0, Status("PREEMPTED")
        if v2_runner:
            self.preempted.add(req.request_id)

    def finish(self, req: Request) -> None:
        self.running.pop(req.request_id, None)
        self.sched.request_finished(req, [req.blocks])
        self.free_blocks += req.blocks
        req.blocks = []
        self.finished.add(req.request_id)

    def schedule(self, chunk: int = 1 << 30, spec: Optional[Dict[str, int]] = None) -> SchedulerOutput:
        """spec: draft tokens scheduled with a request's decode token (scheduled_spec_decode_tokens)."""
        n_tokens = {}
        new = [NewRequestData(r.request_id, r.num_computed_tokens, (list(r.blocks),)) for r in self.new]
        for r in self.new + list(self.running.values()):
            drafts = (spec or {}).get(r.request_id, 0)
            n_tokens[r.request_id] = min(chunk, r.num_tokens - r.num_computed_tokens) + drafts
        cached = [r for r in self.running.values()]
        so = SchedulerOutput(new, CachedRequestData([r.request_id for r in cached],
                                                    [r.num_computed_tokens for r in cached]),
                             n_tokens, set(self.preempted), set(self.finished))
        for r in self.new:
            self.running[r.request_id] = r
            r.status = Status("RUNNING")
        self.new, self.preempted, self.finished = [], set(), set()
        return so

    # -- one engine step --

    def step(self, selections: Optional[Dict[str, list]] = None, pads: Sequence = (), chunk: int = 1 << 30,
             spec: Optional[Dict[str, int]] = None, accept: Sequence = ()) -> Dict[str, List[torch.Tensor]]:
        """schedule -> build_connector_meta (pickled) -> start_load_kv -> per layer: the forward
        writes its KV, finish_kv_update, swap_in (for a batch with decode tokens) -> wait_for_save
        -> get_finished / worker meta -> update_connector_output. pads: batch positions where a
        padding entry (state index -1) sits. selections[rid]: the request's top-k, or one list per
        query token with drafts. spec: drafts per request; their KV is a wrong token's unless the
        request is in accept (then all its drafts are accepted). Returns each request's swap_in
        rows per layer (one per query token)."""
        so = self.schedule(chunk, spec)
        meta = pickle.loads(pickle.dumps(self.sched.build_connector_meta(so)))
        self.metas.append(meta)
        decode = {w.req_id for w in meta.windows if w.decode}
        # The model runner puts decode entries first (reorder_batch_to_split_decodes_and_prefills);
        # the sparse backend resolves the decode tokens, the prefix of the batch.
        order: List[Optional[Request]] = sorted((self.running[rid] for rid in so.num_scheduled_tokens),
                                                key=lambda r: r.request_id not in decode)
        for i in sorted(pads):
            order.insert(i, PAD)
        n_dec = sum(1 if r is None else so.num_scheduled_tokens[r.request_id]
                    for r in itertools.takewhile(lambda r: r is None or r.request_id in decode, order))
        tokens, ids, states = [], [], []
        for i, r in enumerate(order):
            ids.append("" if r is None else r.request_id)
            states.append(-1 if r is None else i)
            n = 1 if r is None else so.num_scheduled_tokens[r.request_id]
            tokens += [(r, (0 if r is None else r.num_computed_tokens) + t) for t in range(n)]
        self.slot_mapping.fill_(-1)
        for t, (r, pos) in enumerate(tokens):
            if r is not None:
                self.grow(r, pos + 1)
                self.slot_mapping[t] = self.slot(r, pos)
        self.conn.bind_connector_metadata(meta)
        self.conn.start_load_kv(None, request_state_indices=torch.tensor(states, dtype=torch.int32, device=self.dev),
                                request_ids=ids)
        topk = torch.full((n_dec, K), -1, dtype=torch.int32)
        for t, (r, pos) in enumerate(tokens[:n_dec]):
            if r is None:
                topk[t] = torch.arange(K, dtype=torch.int32)  # garbage a padding row must ignore
            elif selections and r.request_id in selections and r.request_id in decode:
                sel = selections[r.request_id]
                if sel and isinstance(sel[0], (list, tuple)):
                    sel = sel[pos - r.num_computed_tokens]
                topk[t, :len(sel)] = torch.tensor(sel, dtype=torch.int32)
        out: Dict[str, List[torch.Tensor]] = {}
        entry_of = {id(r): i for i, r in enumerate(order) if r is not None}
        req_id_per_token = torch.tensor([entry_of.get(id(r), 0) for r, _ in tokens[:n_dec]], dtype=torch.int32)
        for layer, name in enumerate(LAYER_NAMES):
            for r, pos in tokens:
                if r is not None:
                    wrong = pos >= r.num_tokens and r.request_id not in accept  # a rejected draft's KV
                    self.write(r, pos, layers=[layer], seed=r.seed + 100 if wrong else None)
            handle = self.worker.cache_handle(name)
            if decode:
                handle.finish_kv_update()
                phys, valid = handle.swap_in(req_id_per_token.to(self.dev), None, topk.to(self.dev), block_size=BLOCK,
                                             return_valid_counts=True)
                phys, valid = self.sync(phys), self.sync(valid)
                self.check(layer, tokens[:n_dec], topk, phys, valid, decode)
                for t, (r, _) in enumerate(tokens[:n_dec]):
                    if r is not None:
                        out.setdefault(r.request_id, []).append(phys[t].clone())
        self.conn.wait_for_save()
        _, recving = self.conn.get_finished(set())
        wmeta = pickle.loads(pickle.dumps(self.conn.build_connector_worker_meta()))
        self.sched.update_connector_output(KVConnectorOutput(None, recving, wmeta))
        self.conn.clear_connector_metadata()
        for rid, n in so.num_scheduled_tokens.items():
            r, drafts = self.running[rid], (spec or {}).get(rid, 0)
            accepted = drafts if rid in accept else 0
            r.num_computed_tokens += n - drafts + accepted
            if r.num_computed_tokens == r.num_tokens + accepted:
                r.output_token_ids += [1000 + len(r.output_token_ids) + i for i in range(1 + accepted)]  # sampled
        return out

    def check(self, layer, tokens, topk, phys, valid, decode) -> None:
        arena = self.sync(self.worker.cache_handle(LAYER_NAMES[layer]).physical_kv_cache().reshape(-1, RECORD))
        for t, (r, pos) in enumerate(tokens):
            if r is None or r.request_id not in decode or r.request_id not in self.worker._live:
                assert (phys[t] == -1).all() and int(valid[t]) == 0, (t, "a padding or refused entry's token")
                continue
            want = topk[t] >= 0
            assert torch.equal(phys[t] >= 0, want), (r.request_id, layer, phys[t], topk[t])
            assert int(valid[t]) == int(want.sum())
            sel = topk[t][want].long()
            got = arena[phys[t][want].long()]
            if len(sel):
                ref = torch.stack([self.truth[(r.request_id, layer, int(p))] for p in sel])
                assert torch.equal(got, ref), (r.request_id, layer, pos)
                q = torch.linspace(-1, 1, RECORD)
                assert torch.equal(attend(q, got), attend(q, ref))
            host = self.session.record_view(self.hid(r), layer, pos)[0]
            assert bytes(host) == bytes(self.truth[(r.request_id, layer, pos)].numpy()), "written row mirrored to host"

    def sync(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU copy, once the device finished what it queued (no-op on the host backend)."""
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return t.cpu()

    def hid(self, req: Request) -> int:
        return self.worker._live[req.request_id].hid

    def row(self, req: Request) -> int:
        return self.worker._live[req.request_id].row

    def base(self, req: Request, layer: int) -> int:
        """Record index of slot 0 of the request's (row, layer) in the arena (resolve.h rule 9)."""
        return (self.row(req) * LAYERS + layer) * self.session.record_slots

    def assert_empty(self) -> None:
        st = self.session.stats()
        assert (st.session_requests, st.session_host_bytes) == (0, 0)
        assert st.pool_used_bytes == self.base_pool
        assert self.worker._live == {}


@pytest.fixture
def engine(import_daemon):
    e = Engine(import_daemon)
    yield e
    e.conn.shutdown()


def prefill(e: Engine, *reqs: Request) -> None:
    for r in reqs:
        e.add(r)
    e.step()


def finish_all(e: Engine, *reqs: Request) -> None:
    for r in reqs:
        e.finish(r)
    e.step()  # the releases travel with the next step's metadata
    e.assert_empty()


# ---- the kernel tests' scenarios (test_hisparse_kernels.py) ----

def test_cold_start_fills_slots_in_lru_order(engine):
    e = engine
    r = Request("cold", seed=1, prompt_len=40)
    prefill(e, r)
    s0 = e.session.stats()
    first = e.step({"cold": [3, 17, 29, 0]})  # every column misses: column j lands in LRU slot j
    s1 = e.session.stats()
    assert s1.misses - s0.misses == K * LAYERS and s1.hits == s0.hits
    for layer in range(LAYERS):
        assert first["cold"][layer].tolist() == [e.base(r, layer) + j for j in range(K)]
    # The LRU was rotated by top_k: the next K misses take slots K..2K-1, the K after them 0..K-1.
    second = e.step({"cold": [5, 6, 7, 8]})
    third = e.step({"cold": [9, 10, 11, 12]})
    for layer in range(LAYERS):
        assert second["cold"][layer].tolist() == [e.base(r, layer) + K + j for j in range(K)]
        assert third["cold"][layer].tolist() == [e.base(r, layer) + j for j in range(K)]
    finish_all(e, r)


def test_warm_replay_hits_without_touching_state(engine):
    e = engine
    r = Request("warm", seed=2, prompt_len=50)
    prefill(e, r)
    sel = {"warm": [40, 2, 33, 11]}
    cold = e.step(sel)
    s0 = e.session.stats()
    warm = e.step(sel)
    s1 = e.session.stats()
    assert (s1.misses - s0.misses, s1.hits - s0.hits) == (0, K * LAYERS)
    for layer in range(LAYERS):
        assert warm["warm"][layer].tolist() == cold["warm"][layer].tolist()
    # Fixed point: the LRU is as after the cold step, so new misses take slots K..2K-1.
    nxt = e.step({"warm": [20, 21, 22, 23]})
    for layer in range(LAYERS):
        assert nxt["warm"][layer].tolist() == [e.base(r, layer) + K + j for j in range(K)]
    finish_all(e, r)


def test_padding_rows_publish_minus_one(engine):
    e = engine
    a, c = Request("a", seed=3, prompt_len=30), Request("c", seed=4, prompt_len=45)
    prefill(e, a, c)
    s0 = e.session.stats()
    # Batch entries [a, pad, c, pad] with state indices [0, -1, 2, -1]; the pads select valid-looking
    # positions, and publish -1 (Engine.check) without touching any state or counter.
    out = e.step({"a": [1, 2, 3, 4], "c": [10, 20, 30, 40]}, pads=(1, 3))
    s1 = e.session.stats()
    assert s1.misses - s0.misses == 2 * K * LAYERS
    for layer in range(LAYERS):
        assert out["a"][layer].tolist() == [e.base(a, layer) + j for j in range(K)]
        assert out["c"][layer].tolist() == [e.base(c, layer) + j for j in range(K)]
    assert int(e.worker.runtime.num_real_reqs[0]) == 2  # the real-request count
    finish_all(e, a, c)


def test_many_rows_keep_per_row_state_independent(engine):
    e = engine
    reqs = [Request(f"r{i}", seed=10 + i, prompt_len=20 + i) for i in range(17)]
    prefill(e, *reqs)
    assert sorted(e.row(r) for r in reqs) == list(range(17))
    first = e.step({r.request_id: [i % 5, 7, 12 + i % 3, 19] for i, r in enumerate(reqs)})
    for r in reqs:
        for layer in range(LAYERS):
            assert first[r.request_id][layer].tolist() == [e.base(r, layer) + j for j in range(K)]
    # Each row then mixes hits and misses of its own; no row sees another's slots.
    second = e.step({r.request_id: [7, 19, 8 + i % 4, 16 + i % 2] for i, r in enumerate(reqs)})
    for r in reqs:
        for layer in range(LAYERS):
            got = second[r.request_id][layer].tolist()
            assert all(e.base(r, layer) <= g < e.base(r, layer) + B for g in got)
            assert got[:2] == first[r.request_id][layer][1::2].tolist()  # 7 and 19 stayed put
    finish_all(e, *reqs)


def test_full_graph_decode_mirrors_written_rows_to_host(engine):
    """The FULL-graph step: the forward (KV write, finish_kv_update, swap_in per layer) is one
    closure over persistent buffers, built once and replayed; per step only the buffers' contents
    change, outside it. After every replay the host pool holds exactly the rows the step wrote."""
    e = engine
    reqs = [Request("g0", 21, 33), Request("g1", 22, 18), Request("g2", 23, 60)]
    prefill(e, *reqs)
    m = len(reqs)
    new_kv = {n: torch.zeros((m, RECORD), dtype=torch.uint8) for n in LAYER_NAMES}  # the step's new rows
    topk = torch.full((m, K), -1, dtype=torch.int32)
    req_ids = torch.arange(m, dtype=torch.int32)
    outs = {n: torch.full((m, K), -1, dtype=torch.int32) for n in LAYER_NAMES}

    def graph():  # what vLLM captures: no Python decision depends on the step
        for name in LAYER_NAMES:
            slots = torch.where(e.slot_mapping[:m] >= 0, e.slot_mapping[:m], torch.zeros_like(e.slot_mapping[:m]))
            e.caches[name].view(-1, RECORD).index_copy_(0, slots, new_kv[name])
            h = e.worker.cache_handle(name)
            h.finish_kv_update()
            h.swap_in(req_ids, None, topk, attention_indices_out=outs[name])

    for step in range(4):
        so = e.schedule()
        meta = pickle.loads(pickle.dumps(e.sched.build_connector_meta(so)))
        assert all(w.decode for w in meta.windows)
        e.conn.bind_connector_metadata(meta)
        e.slot_mapping.fill_(-1)
        for i, r in enumerate(reqs):
            pos = r.num_computed_tokens
            e.grow(r, pos + 1)
            e.slot_mapping[i] = e.slot(r, pos)
            for layer, name in enumerate(LAYER_NAMES):
                new_kv[name][i] = kv_bytes(r.seed, layer, pos)
            sel = [(pos - 1 - 3 * step - j) % pos for j in range(K)]  # drifting window: hits and misses
            topk[i] = torch.tensor(sel, dtype=torch.int32)
        e.conn.start_load_kv(None, request_state_indices=torch.arange(m, dtype=torch.int32),
                             request_ids=[r.request_id for r in reqs])
        graph()  # the replay
        e.conn.wait_for_save()
        for layer, name in enumerate(LAYER_NAMES):
            arena = e.worker.cache_handle(name).physical_kv_cache().reshape(-1, RECORD)
            for i, r in enumerate(reqs):
                pos = r.num_computed_tokens
                host = e.session.record_view(e.hid(r), layer, pos)[0]
                assert bytes(host) == bytes(kv_bytes(r.seed, layer, pos).numpy()), (step, r.request_id, layer)
                ref = full_kv(r.seed, layer, pos + 1)
                assert torch.equal(arena[outs[name][i].long()], ref[topk[i].long()]), (step, r.request_id, layer)
        for r in reqs:
            r.num_computed_tokens += 1
            r.output_token_ids.append(7)
    finish_all(e, *reqs)


def test_speculative_rows_resolve_as_a_union_and_rejected_drafts_are_rewritten(import_daemon):
    """One draft token per step (a draft_tokens=1 session): both query rows of a request resolve in
    one RESOLVE (the union resident at once, as vLLM's resolver does); a rejected draft's KV is
    rewritten by the next step's append, in the host pool too."""
    e = Engine(import_daemon, draft_tokens=1)
    try:
        r = Request("mtp", seed=71, prompt_len=30)
        prefill(e, r)
        s0 = e.session.stats()
        # Positions 30 (the sampled token) and 31 (a draft, rejected): query row 1 sees its own draft.
        out = e.step({"mtp": [[0, 10, 29, 30], [0, 10, 29, 31]]}, spec={"mtp": 1})
        w = e.metas[-1].windows[0]
        assert (w.decode, w.start, w.num_tokens) == (True, 30, 2)
        assert e.session.stats().misses - s0.misses == 3 * LAYERS  # the union {0, 10, 29}, fetched once
        for layer in range(LAYERS):
            assert out["mtp"][2 * layer][:3].tolist() == out["mtp"][2 * layer + 1][:3].tolist()
        # Position 31 is now the real token's (rewritten); its draft 32 is accepted.
        e.step({"mtp": [[31, 5, 30, 12], [31, 32, 30, 6]]}, spec={"mtp": 1}, accept={"mtp"})
        e.step({"mtp": [[31, 32, 33, 0], [31, 32, 33, 34]]}, spec={"mtp": 1})
        for layer in range(LAYERS):
            assert bytes(e.session.record_view(e.hid(r), layer, 31)[0]) == bytes(kv_bytes(71, layer, 31).numpy())
        finish_all(e, r)
    finally:
        e.conn.shutdown()


# ---- the connector's lifecycle ----

def count_calls(session, *names):
    """Wraps the session's methods `names` so that each call is counted: {name: calls so far}."""
    calls = {name: 0 for name in names}
    for name in names:
        orig = getattr(session, name)

        def spy(*a, _orig=orig, _name=name, **kw):
            calls[_name] += 1
            return _orig(*a, **kw)
        setattr(session, name, spy)
    return calls


def test_metadata_round_trip_and_batched_admission(engine):
    e = engine
    calls = count_calls(e.session, "admit", "admit_batch", "release", "release_batch")
    reqs = [Request(f"b{i}", seed=30 + i, prompt_len=10 + 3 * i) for i in range(8)]
    for r in reqs:
        e.add(r)
    e.step(chunk=16)  # chunked prefill: the long prompts take two steps
    meta = e.metas[-1]
    assert [a.req_id for a in meta.admits] == [r.request_id for r in reqs]
    assert len({a.hid for a in meta.admits}) == 8
    assert all(a.token_budget == r.num_prompt_tokens + r.max_tokens + 1 for a, r in zip(meta.admits, reqs))
    assert [(w.req_id, w.start, w.num_tokens, w.decode) for w in meta.windows] == \
        [(r.request_id, 0, min(16, r.num_prompt_tokens), False) for r in reqs]
    assert (calls["admit_batch"], calls["admit"]) == (1, 0)  # one round trip for the step's admissions
    assert e.session.stats().session_requests == 8
    e.step(chunk=16, pads=(1,))  # the rest of the prompts, after decode entries and a padding entry
    e.step({r.request_id: [0, 1, 2, r.num_prompt_tokens - 1] for r in reqs})
    # Every prompt position came through the indexed stores, byte for byte.
    for r in reqs:
        for layer in range(LAYERS):
            got = e.session.record_view(e.hid(r), layer, 0, r.num_prompt_tokens)
            assert bytes(got) == bytes(full_kv(r.seed, layer, r.num_prompt_tokens).numpy().tobytes())
    for r in reqs:
        e.finish(r)
    e.step()
    assert e.metas[-1].releases == tuple(r.request_id for r in reqs)
    assert (calls["release_batch"], calls["release"]) == (1, 0)
    e.assert_empty()


@pytest.mark.parametrize("v2_runner", [True, False], ids=["preempted_req_ids", "request_status"])
def test_preemption_parks_and_resume_keeps_the_host_copy(engine, v2_runner):
    e = engine
    a, b = Request("pa", seed=41, prompt_len=36), Request("pb", seed=42, prompt_len=20)
    prefill(e, a, b)
    e.step({"pa": [0, 35, 20, 5], "pb": [19, 1, 2, 3]})
    host = e.session.stats().session_host_bytes
    hid = e.hid(a)
    e.preempt(a, v2_runner)
    e.step({"pb": [20, 4, 5, 6]})
    assert e.metas[-1].parks == ("pa",)
    assert e.worker._live["pa"].state == "parked" and e.worker._live["pa"].row == -1
    assert e.session.stats().session_host_bytes == host  # the host copy stays
    with pytest.raises(hisparse.FailedPrecondition):
        e.session.park(hid)  # parked already
    stored = []
    orig = e.session.store_indexed

    def spy(rid, *args, **kw):
        stored.append((rid, kw["start_pos"]))
        return orig(rid, *args, **kw)
    e.session.store_indexed = spy
    e.add(a)  # rescheduled: vLLM recomputes prompt + outputs, the connector resumes the parked request
    last = a.num_tokens - 1  # the sampled token whose KV the recompute writes first
    e.step()
    assert e.metas[-1].resumes == ("pa",) and e.metas[-1].admits == ()
    assert e.hid(a) == hid and e.row(a) >= 0
    # Only what the host pool lacks is stored again: that one position.
    assert [s for s in stored if s[0] == hid] == [(hid, last)] * LAYERS
    s0 = e.session.stats()
    e.step({"pa": [0, 35, 36, 10], "pb": [20, 4, 5, 6]})  # the resumed row starts empty: a's 4 miss, b hits
    assert e.session.stats().misses - s0.misses == 4 * LAYERS
    finish_all(e, a, b)


def test_preempting_several_in_one_step_parks_and_resumes_in_one_call_each(engine):
    """Three preemptions in one step: one park_batch, no single park; their rescheduling in one
    step: one resume_batch, no single resume; each resumed row reads its host copy again."""
    e = engine
    calls = count_calls(e.session, "park", "park_batch", "resume", "resume_batch")
    reqs = [Request(f"m{i}", seed=70 + i, prompt_len=12 + 4 * i) for i in range(4)]
    prefill(e, *reqs)
    e.step({r.request_id: [0, 1, 2, r.num_prompt_tokens - 1] for r in reqs})
    for r in reqs[:3]:
        e.preempt(r)
    e.step({"m3": [0, 3, 4, 5]})
    assert sorted(e.metas[-1].parks) == ["m0", "m1", "m2"]
    assert (calls["park_batch"], calls["park"]) == (1, 0)
    assert all(e.worker._live[r.request_id].state == "parked" for r in reqs[:3])
    for r in reqs[:3]:
        e.add(r)
    e.step()
    assert sorted(e.metas[-1].resumes) == ["m0", "m1", "m2"]
    assert (calls["resume_batch"], calls["resume"]) == (1, 0)
    rows = [e.row(r) for r in reqs]
    assert min(rows) >= 0 and len(set(rows)) == 4
    s0 = e.session.stats()
    e.step({r.request_id: [0, 1, 2, 3] for r in reqs})  # the resumed rows start empty: they miss
    assert e.session.stats().misses - s0.misses >= 3 * 3 * LAYERS
    for r in reqs[:3]:
        for layer in range(LAYERS):
            got = e.session.record_view(e.hid(r), layer, 0, r.num_prompt_tokens)
            assert bytes(got) == bytes(full_kv(r.seed, layer, r.num_prompt_tokens).numpy().tobytes())
    finish_all(e, *reqs)


def test_prefix_cache_hit_is_stored_from_its_blocks(engine):
    e = engine
    r = Request("hit", seed=51, prompt_len=40)
    e.add(r, computed_blocks=2)  # vLLM's prefix cache already holds positions [0, 32)
    e.step()
    w = e.metas[-1].windows[0]
    assert (w.pre_store, w.start, w.store_from) == ((0, 32), 32, 32)
    e.step({"hit": [0, 31, 32, 39]})
    for layer in range(LAYERS):
        assert bytes(e.session.record_view(e.hid(r), layer, 0, 40)) == bytes(full_kv(51, layer, 40).numpy().tobytes())
    finish_all(e, r)


def test_refused_admission_is_reported_and_loses_nothing(engine):
    e = engine
    ok, big = Request("ok", seed=61, prompt_len=12), Request("big", seed=62, prompt_len=12, max_tokens=1 << 30)
    prefill(e, ok, big)
    assert "big" in e.sched.connector_scheduler.refused
    assert "big" not in e.worker._live and "ok" in e.worker._live
    out = e.step({"ok": [0, 5, 11, 12], "big": [0, 1, 2, 3]})  # big's tokens publish -1 (Engine.check)
    assert all((o == -1).all() for o in out["big"])
    assert e.metas[-1].windows[1].hid == -1
    finish_all(e, ok, big)


# ---- riding through a restart of hisparsed (issue 42, part 2) ----

def test_a_restart_of_hisparsed_mid_decode_keeps_durable_requests(keeper):
    """lease_seconds makes every admission durable: hisparsed is SIGKILLed mid-decode (under
    hisparse-keeper, whose fd store keeps the pool), the next step's metadata finds the session
    ended and rides through (Session.recover), and the decode goes on in new rows, every index
    swap_in returns checked byte for byte against the full-KV reference (Engine.check), with no
    request refused and nothing prefilled again."""
    e = Engine(keeper, lease_seconds=60)
    a, b = Request("ra", seed=71, prompt_len=30), Request("rb", seed=72, prompt_len=18)
    prefill(e, a, b)
    e.step({"ra": [0, 29, 10, 5], "rb": [17, 1, 2, 3]})
    stored = e.session.stats().session_host_bytes
    keeper.kill_daemon()
    wait_for(lambda: not e.session.alive, timeout_s=20, what="the worker's session to end")
    e.step({"ra": [0, 30, 11, 6], "rb": [18, 2, 3, 4]})  # rides through, then decodes
    assert e.sched.connector_scheduler.refused == {}
    assert e.session.alive and {e.row(a), e.row(b)} <= set(range(MAX_SEQS))
    assert e.session.stats().session_host_bytes >= stored  # the same pages, kept
    e.step({"ra": [1, 31, 12, 7], "rb": [19, 3, 4, 5]})
    e.base_pool = 0  # the restarted daemon's pool held nothing else
    finish_all(e, a, b)
    e.conn.shutdown()


def test_a_restart_of_hisparsed_loses_plain_requests_and_says_so(keeper):
    """Without a lease a request does not outlive hisparsed: after the restart the worker reports
    it refused ("lost"), as an eviction is, so that vLLM computes it again; its entries publish
    -1, never the old memory."""
    e = Engine(keeper)
    a = Request("la", seed=81, prompt_len=20)
    prefill(e, a)
    e.step({"la": [0, 19, 7, 3]})
    keeper.kill_daemon()
    wait_for(lambda: not e.session.alive, timeout_s=20, what="the worker's session to end")
    out = e.step({"la": [0, 20, 8, 4]})
    assert all((o == -1).all() for o in out["la"])
    assert "lost in a restart" in e.sched.connector_scheduler.refused["la"]
    assert "la" not in e.worker._live
    e.base_pool = 0
    finish_all(e, a)
    e.conn.shutdown()


def _import_word(request: int, layer: int, position: int, word: int) -> int:
    """hisparse/common/import_pattern.h's ImportPatternWord (as tests/python/test_import.py)."""
    m = (1 << 64) - 1
    z = IMPORT_SEED ^ ((request * 0x9E3779B97F4A7C15) & m) ^ (layer << 48) ^ (position << 16) ^ word
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_pd_import_through_the_connector(engine, import_daemon, tmp_path):
    e = engine
    bench = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-bench"
    if not bench.exists():
        pytest.skip(f"{bench} is not built (it is the transfer agent here)")
    r = Request("pd", seed=0, prompt_len=40, kv_transfer_params={"hisparse_import": True})
    assert e.sched.get_num_new_matched_tokens(r, 0) == (39, True)
    e.grow(r, 41)  # blocks for the 39 external tokens; the request waits for them (WAITING_FOR_REMOTE_KVS)
    e.sched.update_state_after_alloc(r, KVCacheBlocks(r.blocks), 39)
    e.step()  # nothing scheduled: the metadata carries the import
    assert e.metas[-1].admits[0].import_ and e.metas[-1].admits[0].context_tokens == 39
    grant = e.sched.connector_scheduler.import_grants.get("pd")
    if grant is None:
        pytest.skip(f"the daemon serves no imports: {e.sched.connector_scheduler.refused.get('pd')}")
    (tmp_path / "grant").write_bytes(grant)
    assert e.conn.get_finished(set()) == (None, None)  # still pending
    subprocess.run([str(bench), "import", "--daemon", import_daemon.address, "--grant", str(tmp_path / "grant"),
                    "--seed", str(IMPORT_SEED)], check=True, capture_output=True, timeout=120)
    recving = wait_for(lambda: e.conn.get_finished(set())[1], timeout_s=30, what="the import's commit")
    assert recving == {"pd"}
    e.sched.update_connector_output(KVConnectorOutput(None, recving, e.conn.build_connector_worker_meta()))
    # Scheduled again: position 39 is computed by vLLM (a decode-like step), the rest was imported.
    r.num_computed_tokens = 39
    e.running["pd"] = r
    rid = e.hid(r)
    sel = [0, 38, 39, 17]
    so = e.schedule()
    meta = e.sched.build_connector_meta(so)
    assert meta.windows[0].decode
    e.conn.bind_connector_metadata(meta)
    e.slot_mapping.fill_(-1)
    e.slot_mapping[0] = e.slot(r, 39)
    e.conn.start_load_kv(None, request_state_indices=torch.tensor([0], dtype=torch.int32), request_ids=["pd"])
    for layer, name in enumerate(LAYER_NAMES):
        e.write(r, 39, layers=[layer])
        h = e.worker.cache_handle(name)
        h.finish_kv_update()
        out = h.swap_in(None, None, torch.tensor([sel], dtype=torch.int32))
        arena = h.physical_kv_cache().reshape(-1, RECORD)
        for j, pos in enumerate(sel):
            got = bytes(arena[int(out[0, j])].numpy())
            want = bytes(kv_bytes(0, layer, 39).numpy()) if pos == 39 else \
                b"".join(struct.pack("<Q", _import_word(rid, layer, pos, w)) for w in range(RECORD // 8))
            assert got == want, (layer, pos)
    e.conn.wait_for_save()
    finish_all(e, r)


# ---- the CUDA backend (skipped without a GPU; the lead's device runs it) ----

def test_cuda_graph_captured_decode_step(import_daemon):
    """The FULL-graph scenario on the CUDA backend with a real torch.cuda.graph: a warm-up step,
    capture, then replays whose inputs change only outside the graph (start_load_kv), with a
    padding entry inside the batch. Every replay is byte-exact and mirrors its rows to the host."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        e = Engine(import_daemon, device="cuda:0")
    except hisparse.Unimplemented as err:
        pytest.skip(f"libhisparse built without CUDA: {err}")
    try:
        reqs = [Request("c0", 81, 70), Request("c1", 82, 25), Request("c2", 83, 40)]
        prefill(e, *reqs)
        dev, m = e.dev, len(reqs) + 1  # entry 1 is padding (state index -1)
        new_kv = {n: torch.zeros((m, RECORD), dtype=torch.uint8, device=dev) for n in LAYER_NAMES}
        topk = torch.full((m, K), -1, dtype=torch.int32, device=dev)
        req_ids = torch.arange(m, dtype=torch.int32, device=dev)
        outs = {n: torch.full((m, K), -7, dtype=torch.int32, device=dev) for n in LAYER_NAMES}
        entries = [reqs[0], PAD, reqs[1], reqs[2]]

        def forward():
            for name in LAYER_NAMES:
                sm = e.slot_mapping[:m]
                e.caches[name].view(-1, RECORD).index_copy_(0, torch.where(sm >= 0, sm, torch.zeros_like(sm)),
                                                            new_kv[name])
                h = e.worker.cache_handle(name)
                h.finish_kv_update()
                h.swap_in(req_ids, None, topk, attention_indices_out=outs[name])

        side, graph = torch.cuda.Stream(dev), None
        for step in range(4):
            so = e.schedule()
            meta = e.sched.build_connector_meta(so)
            e.conn.bind_connector_metadata(meta)
            slots = torch.full((m,), -1, dtype=torch.int64)
            sel = torch.arange(K, dtype=torch.int32).repeat(m, 1)  # the padding entry's garbage
            rows = {n: torch.zeros((m, RECORD), dtype=torch.uint8) for n in LAYER_NAMES}
            for i, r in enumerate(entries):
                if r is None:
                    continue
                pos = r.num_computed_tokens
                e.grow(r, pos + 1)
                slots[i] = e.slot(r, pos)
                for layer, name in enumerate(LAYER_NAMES):
                    rows[name][i] = kv_bytes(r.seed, layer, pos)
                    e.truth[(r.request_id, layer, pos)] = rows[name][i].clone()
                sel[i] = torch.tensor([(pos - 1 - 5 * step - j) % pos for j in range(K)], dtype=torch.int32)
            e.slot_mapping[:m].copy_(slots.to(dev))
            topk.copy_(sel.to(dev))
            for name in LAYER_NAMES:
                new_kv[name].copy_(rows[name].to(dev))
            e.conn.start_load_kv(None, request_state_indices=torch.tensor([0, -1, 2, 3], dtype=torch.int32, device=dev),
                                 request_ids=[r.request_id if r else "" for r in entries])
            if graph is None:  # warm-up (a real step) and capture on a side stream
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    forward()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=side):
                        forward()
                torch.cuda.current_stream(dev).wait_stream(side)
            else:
                graph.replay()
            e.conn.wait_for_save()
            torch.cuda.synchronize(dev)
            e.session.check_errors()
            for layer, name in enumerate(LAYER_NAMES):
                arena = e.sync(e.worker.cache_handle(name).physical_kv_cache().reshape(-1, RECORD))
                got = outs[name].cpu()
                assert (got[1] == -1).all(), "the padding entry publishes -1"
                for i, r in enumerate(entries):
                    if r is None:
                        continue
                    pos = r.num_computed_tokens
                    ref = full_kv(r.seed, layer, pos + 1)
                    assert torch.equal(arena[got[i].long()], ref[sel[i].long()]), (step, r.request_id, layer)
                    host = e.session.record_view(e.hid(r), layer, pos)[0]
                    assert bytes(host) == bytes(kv_bytes(r.seed, layer, pos).numpy()), (step, r.request_id, layer)
            for r in reqs:
                r.num_computed_tokens += 1
                r.output_token_ids.append(7)
        finish_all(e, *reqs)
    finally:
        e.conn.shutdown()


FAKE_VLLM_BASE = '''
"""Stand-in for vllm/distributed/kv_transfer/kv_connector/v1/base.py (vllm-project/vllm @ 003df296):
the base classes and the abstract methods a connector must implement."""
import abc


class KVConnectorMetadata(abc.ABC):
    pass


class SupportsHMA(abc.ABC):
    @abc.abstractmethod
    def request_finished_all_groups(self, request, block_ids): ...


class KVConnectorWorkerMetadata(abc.ABC):
    @abc.abstractmethod
    def aggregate(self, other): ...


class KVConnectorBase_V1(abc.ABC):
    def __init__(self, vllm_config, role, kv_cache_config):
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    for _name in ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                  "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"):
        locals()[_name] = abc.abstractmethod(lambda self, *a, **k: None)
'''

PROBE = '''
import pickle, sys, types
sys.path.insert(0, sys.argv[1])
from vllm.distributed.kv_transfer.kv_connector.v1 import base
from hisparse.integrations.vllm import HisparsedConnector, HisparsedConnectorMetadata, HisparsedWorkerMetadata
assert issubclass(HisparsedConnector, base.KVConnectorBase_V1) and issubclass(HisparsedConnector, base.SupportsHMA)
assert issubclass(HisparsedConnectorMetadata, base.KVConnectorMetadata)
assert issubclass(HisparsedWorkerMetadata, base.KVConnectorWorkerMetadata)
cfg = types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config={}),
                            scheduler_config=types.SimpleNamespace(max_num_seqs=4), speculative_config=None)
role = types.SimpleNamespace(name="SCHEDULER")
c = HisparsedConnector(cfg, role, None)  # instantiable: every abstract method is implemented
meta = pickle.loads(pickle.dumps(c.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={}))))
assert isinstance(meta, base.KVConnectorMetadata) and c._vllm_config is cfg and not c.requires_kv_delivery
w = HisparsedConnector(cfg, types.SimpleNamespace(name="WORKER"), None)
assert isinstance(w.build_connector_worker_meta.__self__, HisparsedConnector)
print("ok")
'''


def test_subclasses_vllms_base_when_vllm_is_importable(tmp_path):
    """With vLLM importable (here a stand-in of its base module, in a fresh interpreter), the
    connector and its metadata are vLLM's subclasses and the connector is instantiable."""
    pkg = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1"
    pkg.mkdir(parents=True)
    for d in [tmp_path / "vllm", *list(pkg.parents)[:4][::-1], pkg]:
        (d / "__init__.py").touch()
    (pkg / "base.py").write_text(FAKE_VLLM_BASE)
    probe = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120,
                           env=child_env())
    assert probe.returncode == 0 and probe.stdout.strip() == "ok", probe.stderr


def test_bad_calls_are_refused_and_lose_nothing(engine, import_daemon):
    e = engine
    r = Request("bad", seed=91, prompt_len=20)
    prefill(e, r)
    rt, h = e.worker.runtime, e.worker.cache_handle(LAYER_NAMES[0])
    with pytest.raises(hisparse.InvalidArgument):
        rt.prepare_step([0, 1], [5], [1, 1])  # lengths differ
    with pytest.raises(hisparse.InvalidArgument):
        rt.prepare_step([e.row(r)], [21], [2])  # two query tokens on a session without drafts
    with pytest.raises(hisparse.InvalidArgument):
        rt.set_request_state_indices(list(range(MAX_SEQS + 1)))
    with pytest.raises(hisparse.InvalidArgument):
        h.swap_in(None, None, torch.zeros((1, K + 1), dtype=torch.int32))  # wider than top_k
    with pytest.raises(hisparse.InvalidArgument):
        h.physical_kv_cache(block_size=7)  # the arena's records do not split into pages of 7
    with pytest.raises(hisparse.FailedPrecondition):
        e.conn.start_load_kv(None)  # no metadata bound
    with pytest.raises(hisparse.FailedPrecondition):
        e.conn.build_connector_meta(None)  # a scheduler call on the worker role
    with pytest.raises(hisparse.FailedPrecondition):
        e.sched.wait_for_save()  # a worker call on the scheduler role
    with pytest.raises(hisparse.InvalidArgument):
        HisparsedConnector(VllmConfig(import_daemon), "producer")
    bare = HisparsedConnector(VllmConfig(import_daemon), Role.WORKER)
    del bare.connector_worker.extra["top_k"]
    with pytest.raises(hisparse.InvalidArgument):
        bare.register_kv_caches(e.caches)  # no top_k: no session is opened
    assert bare.connector_worker.session is None
    # Nothing was lost: the request still decodes byte-exactly, then frees everything.
    e.step({"bad": [0, 5, 19, 20]})
    finish_all(e, r)

"""The example engine served the way vLLM serves it: run_engine.py --adapter vllm.

The same model and decode step as run_mode (engine.py), with the KV behind
hisparse.integrations.vllm's HisparsedConnector, driven through the mechanisms vLLM uses
(vllm-project/vllm; the stand-ins here name what they mirror):

- the scheduler role builds each step's metadata (build_connector_meta), which sets
  SchedulerOutput.has_sync_kv_loads as upstream's HiSparseConnectorScheduler does (@ 023979d6);
- the worker role is driven as ActiveKVConnector drives it (vllm/v1/worker/gpu/kv_connector.py
  @ 00f4240e): register_kv_caches once (which attaches a handle to each layer registered in
  static_forward_context); per step pre_forward (handle_preemptions, bind_connector_metadata,
  start_load_kv before the forward only because the scheduler asked for sync loads) and
  post_forward (wait_for_save, get_transfer_results, build_connector_worker_meta);
- each layer's forward makes MLAAttention's hisparse calls (mla_attention.py, as published on
  docs.vllm.ai, lastmod 2026-09-24): the leader's prepare_group_for_batch, write_target and the
  write into what it returns (vLLM's paged cache: one uint8 tensor [blocks, layers, block, record]
  whose blocks interleave the layers, bound by bind_cache(raw, byte_offset=, block_stride=)),
  mirror_write_target, finish_kv_update;
- each layer's sparse backend (the HiSparse branch of vLLM's sparse MLA backends' forward_mqa, as
  in the stored copies of triton_mla_sparse.py / flashattn_mla_sparse.py / flashmla_sparse.py):
  its impl holds the index group vLLM's SparseMLAIndexGroupBuilder made (a plain one: no
  hisparse_config); the connector replaces it at register_kv_caches; the backend takes the
  HiSparse branch only if the group is a HiSparseMLAIndexGroup (isinstance, checked here), calls
  convert_decode_logical_to_physical_topk (index_group.py @ 7a240b6f) and reads
  physical_kv_cache(i) through flat_kv_row_view(cache, block_size) (sparse_utils.py): physical
  index j is row j // block_size * block_stride_rows + j % block_size.

The prefill is the engine's token-local one, written into the paged cache by a prefill forward
through the same calls (the connector stores it in wait_for_save). Decoding is eager (no CUDA
graph): vLLM would capture the layers' calls, not this driver's Python. The baseline is run_mode
without hisparse, eager too; every decode step's logits must be equal bit for bit.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import List

import torch

from engine import DecodeState, RecordFormat, RunResult, SparseDecoder, prefill

BLOCK = 16


def flat_kv_row_view(kv_cache: torch.Tensor, block_size: int):
    """What vLLM's sparse_utils.flat_kv_row_view gives the kernels (re-derived from its contract):
    a [num_blocks, block_size, head] cache as [rows, head] over the same memory, and its rows per
    block (block j's row r is row j * stride_rows + r)."""
    num_blocks, _, head = kv_cache.shape
    assert kv_cache.stride(0) % head == 0, "a block stride that is not whole rows"
    stride_rows = kv_cache.stride(0) // head
    return kv_cache.as_strided(((num_blocks - 1) * stride_rows + block_size, head), (head, 1)), stride_rows


def finish_connector_step(conn, sched, so) -> None:
    """A step's end on both sides of the connector, after its forward (and after the worker's
    start_load_kv), in ActiveKVConnector.post_forward's order (vllm/v1/worker/gpu/kv_connector.py @
    00f4240e; the newest copy read on 2026-12-05 calls the same, in the same order): wait_for_save,
    get_transfer_results, get_block_ids_with_load_errors, get_kv_connector_stats,
    get_kv_connector_kv_cache_events, build_connector_worker_meta, clear_connector_metadata; then the
    scheduler's update_connector_output of that KVConnectorOutput. RuntimeError when the scheduler's
    side has refused or evicted requests."""
    conn.wait_for_save()
    results = conn.get_transfer_results(so.finished_req_ids)
    out = SimpleNamespace(finished_sending=results.finished_sending or None,
                          finished_recving=results.finished_recving or None,
                          failed_recving=getattr(results, "failed_recving", set()),
                          invalid_block_ids=conn.get_block_ids_with_load_errors(),
                          kv_connector_stats=conn.get_kv_connector_stats(),
                          kv_cache_events=conn.get_kv_connector_kv_cache_events(),
                          kv_connector_worker_meta=conn.build_connector_worker_meta())
    conn.clear_connector_metadata()
    sched.update_connector_output(out)
    refused = sched.connector_scheduler.refused
    if refused:
        raise RuntimeError(f"the daemon refused or evicted requests: {refused}")


class Request:
    """vllm.v1.request.Request: the fields the connector's scheduler role reads."""

    def __init__(self, rid: str, prompt_len: int, max_tokens: int) -> None:
        self.request_id = rid
        self.num_prompt_tokens = prompt_len
        self.num_computed_tokens = 0
        self.output_token_ids: List[int] = []
        self.max_tokens = max_tokens
        self.kv_transfer_params = None
        self.status = SimpleNamespace(name="RUNNING")
        self.blocks: List[int] = []

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)


class VllmKV:
    """The engine's KV backend (fmt, store, before_layer, append, gather) as vLLM's layers and
    model runner around HisparsedConnector (module docstring)."""

    mode = "vllm"

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, *, batch: int, prompt_len: int, steps: int, k: int,
                 address: str, backend: str, gpu: int, slots: int) -> None:
        from hisparse.integrations.vllm import HisparsedConnector
        from hisparse.integrations.vllm import runtime as runtime_module
        from hisparse.integrations.vllm.index_group import upstream_hisparse_group_class

        cfg, dev = model.cfg, model.device
        self.fmt, self.dev, self.batch, self.k = fmt, dev, batch, k
        self.names = [f"model.layers.{i}.self_attn.mla_attn" for i in range(cfg.n_layers)]
        # vLLM's SparseMLAIndexGroupBuilder without hisparse_config: one plain group (layer 0 has
        # the indexer), each layer's impl at its index in it.
        plain = SimpleNamespace(num_layers=cfg.n_layers, has_indexer=True)
        self.layers = {n: SimpleNamespace(layer_name=n, hisparse_cache=None,
                                          impl=SimpleNamespace(index_group=plain, index_group_index=i))
                       for i, n in enumerate(self.names)}
        extra = dict(daemon=address, backend=backend, top_k=k, device_buffer_size=slots, max_num_seqs=batch,
                     max_num_tokens=batch)
        if backend == "cuda":
            extra["gpu"] = gpu
        vllm_config = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(kv_connector="HisparsedConnector", kv_role="kv_both",
                                               kv_connector_extra_config=extra),
            scheduler_config=SimpleNamespace(max_num_seqs=batch, max_num_batched_tokens=batch * prompt_len),
            speculative_config=None, attention_config=SimpleNamespace(hisparse_config=None),
            compilation_config=SimpleNamespace(static_forward_context=dict(self.layers)))
        blocks_per_req = -(-(prompt_len + steps + 2) // BLOCK)
        self.raw = torch.zeros((1 + batch * blocks_per_req, cfg.n_layers, BLOCK, fmt.record_bytes), dtype=torch.uint8,
                               device=dev)
        self.sched = HisparsedConnector(vllm_config, "SCHEDULER")
        self.conn = HisparsedConnector(vllm_config, "WORKER")
        self.conn.register_kv_caches({n: self.raw[:, i] for i, n in enumerate(self.names)})  # ActiveKVConnector.__init__
        self.conn.set_host_xfer_buffer_ops(None)
        self.handles = [self.layers[n].hisparse_cache for n in self.names]
        assert all(h is not None for h in self.handles), "the connector attached no handle"
        self.impls = [self.layers[n].impl for n in self.names]
        hisparse_group = upstream_hisparse_group_class()
        assert all(isinstance(impl.index_group, hisparse_group) for impl in self.impls), \
            "the sparse backend would not take its HiSparse branch"
        self.rt = runtime_module
        self.ctx = SimpleNamespace(slot_mapping={})
        self.reqs = [Request(f"r{i}", prompt_len, steps + 1) for i in range(batch)]
        for i, r in enumerate(self.reqs):
            r.blocks = list(range(1 + i * blocks_per_req, 1 + (i + 1) * blocks_per_req))
        self.new = list(self.reqs)
        self.finished: set = set()
        self.prompt_recs: List[List[torch.Tensor]] = [[] for _ in range(batch)]
        self.md = None
        self.req_ids = torch.arange(batch, dtype=torch.int32, device=dev)

    def slot(self, r: Request, pos: int) -> int:
        return r.blocks[pos // BLOCK] * BLOCK + pos % BLOCK

    def kv_bytes(self) -> int:
        return self.raw.numel()

    # ---- the engine step around the forward (scheduler + ActiveKVConnector) ----

    def _schedule(self, n_tokens):
        for r in self.new:
            self.sched.get_num_new_matched_tokens(r, 0)
            self.sched.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda r=r: (list(r.blocks),)), 0)
        new = [SimpleNamespace(req_id=r.request_id, num_computed_tokens=r.num_computed_tokens,
                               block_ids=(list(r.blocks),)) for r in self.new]
        cached = [r for r in self.reqs if r not in self.new and r.request_id not in self.finished]
        so = SimpleNamespace(scheduled_new_reqs=new,
                             scheduled_cached_reqs=SimpleNamespace(req_ids=[r.request_id for r in cached],
                                                                   num_computed_tokens=[r.num_computed_tokens
                                                                                        for r in cached]),
                             num_scheduled_tokens=dict(n_tokens), preempted_req_ids=set(),
                             finished_req_ids=set(self.finished), has_sync_kv_loads=False)
        self.new = []
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        return so

    def _pre_forward(self, so, order: List[Request], slots: List[int]) -> None:
        self.ctx.slot_mapping = {n: torch.tensor(slots, dtype=torch.int64, device=self.dev) for n in self.names}
        meta = so.kv_connector_metadata
        self.conn.handle_preemptions(meta)
        self.conn.bind_connector_metadata(meta)
        kwargs = dict(request_state_indices=torch.arange(len(order), dtype=torch.int32, device=self.dev),
                      request_ids=[r.request_id for r in order])
        self.pending = None
        if so.has_sync_kv_loads:
            self.conn.start_load_kv(None, **kwargs)
        else:
            self.pending = kwargs  # ActiveKVConnector starts it after the forward
        self.rt.FORWARD_CONTEXT = self.ctx

    def _post_forward(self, so) -> None:
        self.rt.FORWARD_CONTEXT = None
        if self.pending is not None:
            self.conn.start_load_kv(None, **self.pending)
        finish_connector_step(self.conn, self.sched, so)

    # ---- prefill: the engine's records, written by a prefill forward ----

    def store(self, i: int, start: int, recs: torch.Tensor) -> None:
        self.prompt_recs[i].append(recs)

    def prefill_step(self, first_tokens: torch.Tensor) -> None:
        so = self._schedule({r.request_id: r.num_prompt_tokens for r in self.reqs})
        tokens = [(r, p) for r in self.reqs for p in range(r.num_prompt_tokens)]
        self._pre_forward(so, self.reqs, [self.slot(r, p) for r, p in tokens])
        recs = torch.cat([torch.cat(parts, dim=1) for parts in self.prompt_recs], dim=1)  # [layers, tokens, R]
        md = SimpleNamespace(num_actual_tokens=len(tokens), num_decode_tokens=0, num_decodes=0,
                             num_reqs=len(self.reqs), max_query_len=max(r.num_prompt_tokens for r in self.reqs),
                             req_id_per_token=None, block_size=BLOCK)
        for layer, h in enumerate(self.handles):
            self._write(layer, h, md, recs[layer])
        self._post_forward(so)
        for r, t in zip(self.reqs, first_tokens.tolist()):
            r.num_computed_tokens = r.num_prompt_tokens
            r.output_token_ids.append(int(t))
        self.prompt_recs = []

    def _write(self, layer: int, h, md, rows: torch.Tensor) -> None:
        """MLAAttention.forward up to the attention: prepare (leader), write_target, the write
        (impl.do_kv_cache_update), mirror_write_target, finish_kv_update."""
        if h.runtime.is_group_leader:
            h.prepare_group_for_batch(md)
        if not h.dummy_batch:
            cache, slots, n = h.write_target(rows.shape[0], self.ctx.slot_mapping[self.names[layer]].numel())
            s = slots[:n].long()
            keep = s >= 0
            cache[(s // BLOCK)[keep], (s % BLOCK)[keep]] = rows[:n][keep]
            assert h.mirror_write_target(n) is None
        h.finish_kv_update()

    # ---- decode: the engine's KV backend calls ----

    def begin_decode(self) -> None:
        so = self._schedule({r.request_id: 1 for r in self.reqs})
        self.so = so
        self._pre_forward(so, self.reqs, [self.slot(r, r.num_computed_tokens) for r in self.reqs])
        self.md = SimpleNamespace(num_actual_tokens=self.batch, num_decode_tokens=self.batch, num_decodes=self.batch,
                                  num_reqs=self.batch, max_query_len=1, decode_max_query_len=1,
                                  req_id_per_token=self.req_ids, block_size=BLOCK)

    def end_decode(self, tokens: torch.Tensor) -> None:
        self._post_forward(self.so)
        for r, t in zip(self.reqs, tokens.tolist()):
            r.num_computed_tokens += 1
            r.output_token_ids.append(int(t))

    def before_layer(self, layer: int, st: DecodeState) -> None:
        pass

    def append(self, layer: int, rec: torch.Tensor, st: DecodeState) -> None:
        self._write(layer, self.handles[layer], self.md, rec)

    def gather(self, layer: int, st: DecodeState) -> torch.Tensor:
        """The sparse backend's decode reads: the index group's physical top-k, rows of
        flat_kv_row_view over physical_kv_cache (the daemon's arena)."""
        impl = self.impls[layer]
        group, i = impl.index_group, impl.index_group_index
        phys, valid = group.convert_decode_logical_to_physical_topk(i, st.positions, self.md, return_valid_counts=True)
        rows, _ = flat_kv_row_view(group.physical_kv_cache(i).view(torch.uint8), self.md.block_size)
        return rows[phys.clamp(min=0).long()]

    def close(self) -> None:
        for r in self.reqs:
            self.sched.request_finished(r, [r.blocks])
            self.finished.add(r.request_id)
        so = self._schedule({})
        self._pre_forward(so, [], [])
        self._post_forward(so)  # the releases travel with this step's metadata
        self.conn.shutdown()


@torch.no_grad()
def run_vllm(model: SparseDecoder, fmt: RecordFormat, *, batch: int, prompt_len: int, k: int, steps: int,
             address: str, backend: str, gpu: int, slots: int, seed: int = 1) -> RunResult:
    """run_mode's workload (same seed: same prompts and first tokens), eager, with the KV behind
    HisparsedConnector as vLLM drives it."""
    cfg, dev = model.cfg, model.device
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=gen)
    first = torch.randint(0, cfg.vocab, (batch,), generator=gen)
    max_len = prompt_len + steps + 1
    st = DecodeState(cfg, batch, k, max_len, prompt_len, first, dev)
    kv = VllmKV(model, fmt, batch=batch, prompt_len=prompt_len, steps=steps, k=k, address=address, backend=backend,
                gpu=gpu, slots=slots)
    t0 = time.perf_counter()
    prefill(model, fmt, prompts, st.idx_cache, kv.store)
    kv.prefill_step(first)
    prefill_s = time.perf_counter() - t0
    before = kv.conn.connector_worker.session.stats()
    logits_hist = torch.empty(steps, batch, cfg.vocab, dtype=torch.float32, device=dev)
    tok_hist = torch.empty(steps, batch, dtype=torch.long, device=dev)
    step_ms = []
    for i in range(steps):
        t = time.perf_counter()
        kv.begin_decode()
        logits = model.decode_logits(kv, st)
        st.tokens.copy_(logits.argmax(-1))
        kv.end_decode(st.tokens)
        st.seq_lens.add_(1)
        st.step.add_(1)
        logits_hist[i].copy_(logits)
        tok_hist[i].copy_(st.tokens)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        step_ms.append(1e3 * (time.perf_counter() - t))
    session = kv.conn.connector_worker.session
    session.check_errors()
    after = session.stats()
    result = RunResult("vllm", logits_hist, tok_hist, step_ms, [], [], kv.kv_bytes(),
                       sum(t.numel() * t.element_size() for t in st.idx_cache if t is not None), prefill_s, False)
    result.hits, result.misses = after.hits - before.hits, after.misses - before.misses
    kv.close()
    return result

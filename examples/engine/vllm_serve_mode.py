"""The vLLM-adapter mode over a served workload: run_engine.py --adapter vllm.

vllm_mode.py drives HisparsedConnector through one fixed batch. This module drives it through
what vLLM's scheduler does to requests over time, on sglang_mode.py's seeded workload (long and
short prompts, staggered arrivals, early finishes), eagerly, with and without drafts:

- scheduling (vllm/v1/core/sched/scheduler.py @ 00024d31, Scheduler.schedule): each step's
  SchedulerOutput (new and resumed requests in scheduled_new_reqs, as for the V2 model runner
  whose ActiveKVConnector drives the worker; running ones in scheduled_cached_reqs;
  num_scheduled_tokens, preempted_req_ids, finished_req_ids) goes through the connector's
  build_connector_meta; the worker role is driven as vllm_mode.VllmKV drives it (ActiveKVConnector's
  pre_forward / post_forward). Blocks of BLOCK slots come from a free list, as
  KVCacheManager.allocate_slots hands them out; a request leaving the waiting queue gets
  get_num_new_matched_tokens, then update_state_after_alloc with all its blocks; no waiting
  request is admitted in a step that preempted;
- preemption (Scheduler._preempt_request): the request's blocks are freed
  (kv_cache_manager.free), its status becomes PREEMPTED and num_computed_tokens 0, and its id is
  in that step's preempted_req_ids. Two steps later it leaves the waiting queue again: fresh
  blocks, then a recompute of every position before its last output token (schedule() gives it
  num_tokens - num_computed_tokens, here capped one short as long_prefill_token_threshold caps a
  chunk, so the next step decodes that token). The connector parks the request at the preemption
  and resumes it at the reschedule: its KV stays in the daemon;
- abort of a preempted request (Scheduler.finish_requests -> _free_request -> _connector_finished,
  which calls request_finished_all_groups on a SupportsHMA connector, then finished_req_ids and the
  blocks freed): with two or more preempted requests the last is aborted the step after its
  preemption, never resumed; the connector releases it;
- MTP (--draft-tokens n): each decode step verifies q = n + 1 tokens a request (the last output
  and n drafts from mtp.DraftHead) through sglang_mtp_mode.forward_verify; the sparse backend's
  decode conversion is convert_decode_logical_to_physical_topk with decode_query_len q, which calls
  swap_in once per verify step over a strided view (the adapter's per-step swap_in); a seeded
  random count a in [1, q] is accepted (num_computed_tokens += a; the rejected drafts' slots stay
  in the request's blocks and are rewritten by the next step).

The model's prefill is token-local (engine.py), so it cannot recompute the KV a decode step wrote.
The recompute therefore writes back what the request's KV and index keys were at the preemption
(a model whose recompute reproduces its decode KV bit for bit), in the baseline; with hisparse the
recompute writes a poison pattern into vLLM's blocks instead (the index keys, which hisparse does
not hold, are written back): the adapter must neither store nor read them, its parked host copy
is the KV. The baseline is the same scheduler without the connector: vLLM's plain sparse backend,
the indexer's positions converted through the block table into vLLM's paged cache. Every (request,
decode step) row's logits must be bit-identical, and every generated token.

- P/D import (pd_import): one request arrives from a prefill node with its prompt's KV but the
  last position's. Baseline: the KV lands in its blocks (a P/D connector's load) and it decodes
  from its last prompt token. hisparse: get_num_new_matched_tokens answers the prompt less one
  token, asynchronously; update_state_after_alloc plans the import, the next step's metadata
  admits it (a grant), the transfer agent (hisparse-bench import --records, the prefill node's
  records) writes and commits it, and empty steps run (the request WAITING_FOR_REMOTE_KVS) until
  the worker reports it in finished_recving; then it decodes. vLLM's blocks for the imported
  positions hold poison (nothing of vLLM's writes them); the index keys, vLLM's own cache, are
  written in both runs.

Not driven here: CUDA graphs (vLLM would capture the layers' calls, not this Python).
Streams: on a GPU every step runs on a non-blocking stream of the engine's, made current (the
connector and its handles launch on torch.cuda.current_stream(), as vLLM's forward does; a launch
on the legacy default stream would not be ordered with it). The adapter itself uses no other
stream (its index group's prefill_stream is None), so nothing else needs ordering.
"""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace
from typing import Dict, List, Optional

import torch

from engine import RecordFormat, SparseDecoder
from mtp import DraftHead
from sglang_mode import DecodeBuffers, ReqToTokenPool, SGLangRun, Workload, forward_decode
from sglang_mtp_mode import VerifyBuffers, forward_verify
from vllm_mode import BLOCK, finish_connector_step, flat_kv_row_view

POISON = 0x3C  # a finite byte pattern in every record format (bf16 0x3C3C ~ 0.0115)


class PagedKVCache:
    """vLLM's paged KV cache for the sparse MLA layers, by slot (block * BLOCK + offset): one
    [slots, 1, record] tensor a layer (bf16 [.., 576] for bf16 records, uint8 [.., 656] for
    FlashMLA's fp8 layout; register_kv_caches sees it as [blocks, BLOCK, record]) and the DSA
    indexer's key cache index_k (vLLM's own, by slot). Slot 0 lies in the null block. Blocks are
    VllmServeEngine's (KVCacheManager); this is only the memory. forward_decode / forward_verify
    read layer_num and index_k, and write_kv when no write hook is given.

    get_cpu_copy(locs) keeps what a preempted request's recompute will write back (module
    docstring): the index keys always, the KV only with keep_kv (the baseline); under the
    connector the KV of a preempted request is the connector's (parked in the daemon)."""

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, size: int, device, keep_kv: bool) -> None:
        cfg = model.cfg
        self.layer_num = cfg.n_layers
        self.size = size
        dtype = torch.bfloat16 if fmt.name == "bf16" else torch.uint8
        width = fmt.record_bytes // torch.empty(0, dtype=dtype).element_size()
        self.kv_buffer = [torch.zeros(size, 1, width, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.index_k = [torch.zeros(size, cfg.idx_dim, dtype=torch.bfloat16, device=device)
                        if cfg.anchor(l) == l else None for l in range(cfg.n_layers)]
        self.keep_kv = keep_kv

    def records(self, layer: int) -> torch.Tensor:
        """Layer `layer` as uint8 [size, record_bytes] (a view)."""
        return self.kv_buffer[layer].view(self.size, -1).view(torch.uint8)

    def write_kv(self, layer: int, locs: torch.Tensor, records: torch.Tensor) -> None:
        """vLLM's plain write at the slot mapping (no connector)."""
        self.records(layer).index_copy_(0, locs, records)

    def get_cpu_copy(self, locs: torch.Tensor) -> Dict[str, Optional[list]]:
        keys = [k[locs].cpu() if k is not None else None for k in self.index_k]
        kv = [self.records(l)[locs].cpu() for l in range(self.layer_num)] if self.keep_kv else None
        return {"index_k": keys, "kv": kv}


class VReq:
    """vllm.v1.request.Request: the fields the scheduler and the connector read, plus the block
    ids KVCacheManager holds for it and its row of the block table (req_to_token)."""

    def __init__(self, rid: str, prompt: List[int], first: int, max_new: int) -> None:
        self.request_id = rid
        self.prompt = list(prompt)
        self.output_token_ids = [first]  # the prefill's token (engine.py draws it at random)
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.max_tokens = max_new
        self.kv_transfer_params = None
        self.status = SimpleNamespace(name="WAITING")
        self.blocks: List[int] = []
        self.row: Optional[int] = None
        self.saved = None  # the recompute's source while preempted
        self.fresh = True  # not scheduled yet: the next step lists it in scheduled_new_reqs

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    def finished(self) -> bool:
        return len(self.output_token_ids) >= self.max_tokens


class VllmServeEngine:
    """vLLM's scheduler, KV cache manager and model runner around the model, with
    HisparsedConnector (hisparse: its kv_connector_extra_config) or without (the baseline)."""

    def __init__(self, model: SparseDecoder, fmt: RecordFormat, work: Workload, *, k: int, draft_tokens: int,
                 hisparse: Optional[dict], pd_import: Optional[str] = None) -> None:
        self.model, self.fmt, self.work, self.k = model, fmt, work, k
        self.q = q = draft_tokens + 1
        dev = model.device
        self.reqs = [VReq(*spec) for spec in work.specs]
        self.pd_import = pd_import
        for r in self.reqs:
            if r.request_id == pd_import:  # the decode side samples its first token itself
                r.output_token_ids = []
                r.kv_transfer_params = {"hisparse_import": True}
        self.max_bs = len(self.reqs)
        span = max(r.num_prompt_tokens + r.max_tokens for r in self.reqs) + q + 2
        max_ctx = -(-span // BLOCK) * BLOCK
        self.num_blocks = 1 + sum(-(-(r.num_prompt_tokens + r.max_tokens + q + 1) // BLOCK) for r in self.reqs)
        self.free_blocks = list(range(1, self.num_blocks))  # block 0: vLLM's null block
        self.pool = PagedKVCache(model, fmt, self.num_blocks * BLOCK, dev, keep_kv=hisparse is None)
        self.r2t = ReqToTokenPool(self.max_bs, max_ctx, dev)
        if q > 1:
            self.buf = VerifyBuffers(model, self.max_bs, q, k, max_ctx)
            self.draft = DraftHead(model, 1000 + len(work.specs))
            gen = torch.Generator().manual_seed(7 + len(work.specs))
            self.accept = {r.request_id: torch.randint(1, q + 1, (4 * max_ctx,), generator=gen).tolist()
                           for r in self.reqs}
        else:
            self.buf = DecodeBuffers(model, self.max_bs, k, max_ctx)
        self.preempted: set = set()  # ids for the next SchedulerOutput
        self.finished_ids: set = set()
        self.conn = None
        self.ops = dict(parks=0, resumes=0, releases=0)  # the connector's lifecycle operations planned
        if hisparse is not None:
            self._attach(hisparse, draft_tokens)

    # ---- the connector, as vLLM constructs and registers it ----

    def _attach(self, extra: dict, draft_tokens: int) -> None:
        from hisparse.integrations.vllm import HisparsedConnector
        from hisparse.integrations.vllm import runtime as runtime_module
        from hisparse.integrations.vllm.index_group import upstream_hisparse_group_class

        n_layers = self.model.cfg.n_layers
        self.names = [f"model.layers.{i}.self_attn.mla_attn" for i in range(n_layers)]
        plain = SimpleNamespace(num_layers=n_layers, has_indexer=True)  # SparseMLAIndexGroupBuilder's plain group
        layers = {n: SimpleNamespace(layer_name=n, hisparse_cache=None,
                                     impl=SimpleNamespace(index_group=plain, index_group_index=i))
                  for i, n in enumerate(self.names)}
        extra = dict(extra, top_k=self.k, max_num_seqs=self.max_bs, max_num_tokens=self.max_bs * self.q)
        self.hisparse_address = extra["daemon"]
        spec = SimpleNamespace(num_speculative_tokens=draft_tokens) if draft_tokens else None
        cfg = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(kv_connector="HisparsedConnector", kv_role="kv_both",
                                               kv_connector_extra_config=extra),
            scheduler_config=SimpleNamespace(max_num_seqs=self.max_bs, max_num_batched_tokens=self.max_bs * self.q),
            speculative_config=spec, attention_config=SimpleNamespace(hisparse_config=None),
            compilation_config=SimpleNamespace(static_forward_context=dict(layers)))
        self.sched = HisparsedConnector(cfg, "SCHEDULER")
        self.conn = HisparsedConnector(cfg, "WORKER")
        caches = {n: self.pool.records(i).view(self.num_blocks, BLOCK, -1) for i, n in enumerate(self.names)}
        self.conn.register_kv_caches(caches)  # ActiveKVConnector.__init__
        self.conn.set_host_xfer_buffer_ops(None)
        self.handles = [layers[n].hisparse_cache for n in self.names]
        self.impls = [layers[n].impl for n in self.names]
        assert all(isinstance(i.index_group, upstream_hisparse_group_class()) for i in self.impls), \
            "the sparse backend would not take its HiSparse branch"
        self.rt = runtime_module
        self.ctx = SimpleNamespace(slot_mapping={})
        self.session = self.conn.connector_worker.session

    # ---- KVCacheManager ----

    def _slots(self, r: VReq, lo: int, hi: int) -> torch.Tensor:
        """allocate_slots for positions [lo, hi) and their slots (block * BLOCK + offset), also
        written into the request's block-table row."""
        while len(r.blocks) * BLOCK < hi:
            if not self.free_blocks:
                raise RuntimeError("out of KV blocks")
            r.blocks.append(self.free_blocks.pop(0))
        pos = torch.arange(lo, hi)
        table = torch.tensor(r.blocks, dtype=torch.int64)
        slots = table[pos // BLOCK] * BLOCK + pos % BLOCK
        self.r2t.req_to_token[r.row, lo:hi] = slots.to(device=self.model.device, dtype=torch.int32)
        return slots.to(self.model.device)

    def _free(self, r: VReq) -> None:
        """kv_cache_manager.free: the blocks and the block-table row go back."""
        self.free_blocks.extend(r.blocks)
        r.blocks = []
        if r.row is not None:
            self.r2t.free(r.row)
            r.row = None

    # ---- one engine step around a forward ----

    def _step(self, entries: List[tuple], md, body) -> None:
        """entries: (request, first position, tokens, new?) in batch order; body(): the forward."""
        new = [SimpleNamespace(req_id=r.request_id, num_computed_tokens=s, block_ids=(list(r.blocks),))
               for r, s, _, fresh in entries if fresh]
        cached = [(r, s) for r, s, _, fresh in entries if not fresh]
        for r, _, _, _ in entries:
            r.fresh = False
        so = SimpleNamespace(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=SimpleNamespace(req_ids=[r.request_id for r, _ in cached],
                                                  num_computed_tokens=[s for _, s in cached]),
            num_scheduled_tokens={r.request_id: n for r, _, n, _ in entries},
            preempted_req_ids=set(self.preempted), finished_req_ids=set(self.finished_ids), has_sync_kv_loads=False)
        self.preempted, self.finished_ids = set(), set()
        if self.conn is None:
            body()
            return
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        for op in self.ops:
            self.ops[op] += len(getattr(so.kv_connector_metadata, op))
        slots = torch.cat([self._slots(r, s, s + n) for r, s, n, _ in entries]) if entries else \
            torch.zeros(0, dtype=torch.int64, device=self.model.device)
        self.ctx.slot_mapping = {name: slots for name in self.names}
        meta = so.kv_connector_metadata
        self.conn.handle_preemptions(meta)  # ActiveKVConnector.pre_forward
        self.conn.bind_connector_metadata(meta)
        kwargs = dict(request_state_indices=torch.arange(len(entries), dtype=torch.int32, device=self.model.device),
                      request_ids=[r.request_id for r, _, _, _ in entries])
        if so.has_sync_kv_loads:
            self.conn.start_load_kv(None, **kwargs)
        self.md = md
        self.rt.FORWARD_CONTEXT = self.ctx
        try:
            body()
        finally:
            self.rt.FORWARD_CONTEXT = None
        if not so.has_sync_kv_loads:
            self.conn.start_load_kv(None, **kwargs)  # ActiveKVConnector.post_forward
        finish_connector_step(self.conn, self.sched, so)

    def _write(self, layer: int, loc: torch.Tensor, rec: torch.Tensor) -> None:
        """MLAAttention.forward up to the attention: the leader's prepare_group_for_batch,
        write_target, the write (impl.do_kv_cache_update), mirror_write_target, finish_kv_update.
        Without the connector: vLLM's plain write at the slot mapping."""
        if self.conn is None:
            self.pool.write_kv(layer, loc, rec)
            return
        h = self.handles[layer]
        if h.runtime.is_group_leader:
            h.prepare_group_for_batch(self.md)
        cache, slots, n = h.write_target(rec.shape[0], self.ctx.slot_mapping[self.names[layer]].numel())
        assert n == rec.shape[0] and torch.equal(slots[:n].long(), loc.long()), "write_target is not the step's slots"
        s = slots[:n].long()
        cache[s // BLOCK, s % BLOCK] = rec[:n]
        assert h.mirror_write_target(n) is None
        h.finish_kv_update()

    def _attend(self, layer: int, ids: torch.Tensor, bs: int):
        """The sparse backend's decode read: (table [bs * q, k], records). Baseline: the indexer's
        positions through the block table into vLLM's paged cache; hisparse: the index group's
        physical top-k (one swap_in per verify step) over flat_kv_row_view of its arena."""
        positions = self.buf.positions[:bs].reshape(bs * self.q, self.k)
        if self.conn is None:
            if self.q > 1:
                return ids, self.pool.records(layer)
            rpi = self.buf.req_pool_indices[:bs]
            return self.r2t.req_to_token[rpi.unsqueeze(1), positions.clamp(min=0).long()], self.pool.records(layer)
        impl = self.impls[layer]
        group, i = impl.index_group, impl.index_group_index
        phys = group.convert_decode_logical_to_physical_topk(i, positions, self.md)
        rows, _ = flat_kv_row_view(group.physical_kv_cache(i).view(torch.uint8), BLOCK)
        return phys, rows

    # ---- lifecycle ----

    def admit(self, reqs: List[VReq]) -> None:
        """Schedules new and resumed requests in one prefill step: each writes every position
        before its last output token (a new request's prompt through the model's prefill; a
        resumed one's recompute, see the module docstring)."""
        entries, recs, keys = [], [], []
        for r in reqs:
            r.row = self.r2t.alloc()
            r.status.name = "RUNNING"
            n = r.num_tokens - 1
            self._slots(r, 0, n)
            if self.conn is not None:
                self.sched.get_num_new_matched_tokens(r, 0)
                self.sched.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda r=r: (list(r.blocks),)), 0)
            if r.saved is None:
                toks = torch.tensor(r.prompt + r.output_token_ids[:-1], device=self.model.device)
                parts = [self.model.prefill_chunk(toks[s:s + 4096], s, self.fmt) for s in range(0, n, 4096)]
                rec = torch.cat([p[0] for p in parts], dim=1)
                key = [torch.cat([p[1][l] for p in parts]) for l in range(self.pool.layer_num)]
            else:
                saved, r.saved = r.saved, None
                key = [k.to(self.model.device) if k is not None else None for k in saved["index_k"]]
                if saved["kv"] is not None:
                    rec = torch.stack([x.to(self.model.device) for x in saved["kv"]])
                else:
                    rec = torch.full((self.pool.layer_num, n, self.fmt.record_bytes), POISON, dtype=torch.uint8,
                                     device=self.model.device)
            entries.append((r, 0, n, True))
            recs.append(rec)
            keys.append(key)
        total = sum(n for _, _, n, _ in entries)
        md = SimpleNamespace(num_actual_tokens=total, num_decode_tokens=0, num_decodes=0, num_reqs=len(entries),
                             max_query_len=max(n for _, _, n, _ in entries), req_id_per_token=None, block_size=BLOCK)
        locs = torch.cat([self.r2t.req_to_token[r.row, :n].long() for r, _, n, _ in entries])
        all_recs = torch.cat(recs, dim=1)

        def body():
            for l in range(self.pool.layer_num):
                self._write(l, locs, all_recs[l])
                if self.pool.index_k[l] is not None:
                    self.pool.index_k[l][locs] = torch.cat([kk[l] for kk in keys])

        self._step(entries, md, body)
        for r, _, n, _ in entries:
            r.num_computed_tokens = n

    def import_(self, r: VReq) -> None:
        """A P/D import (module docstring): positions [0, prompt - 1) from the prefill node."""
        r.row = self.r2t.alloc()
        n = r.num_prompt_tokens - 1
        toks = torch.tensor(r.prompt[:n], device=self.model.device)
        parts = [self.model.prefill_chunk(toks[s:s + 4096], s, self.fmt) for s in range(0, n, 4096)]
        rec = torch.cat([p[0] for p in parts], dim=1)  # the prefill node's records [layers, n, R]
        locs = self._slots(r, 0, n + 1)[:n]
        for l in range(self.pool.layer_num):
            if self.pool.index_k[l] is not None:
                self.pool.index_k[l][locs] = torch.cat([p[1][l] for p in parts])
            self.pool.records(l)[locs] = rec[l] if self.conn is None else POISON
        if self.conn is not None:
            self._import_through_connector(r, n, rec)
        r.num_computed_tokens = n
        r.status.name = "RUNNING"

    def _import_through_connector(self, r: VReq, n: int, rec: torch.Tensor) -> None:
        import pathlib
        import subprocess
        import tempfile

        import hisparse

        matched, load_async = self.sched.get_num_new_matched_tokens(r, 0)
        assert (matched, load_async) == (n, True), (matched, load_async)
        self.sched.update_state_after_alloc(r, SimpleNamespace(get_block_ids=lambda: (list(r.blocks),)), n)
        r.status.name = "WAITING_FOR_REMOTE_KVS"
        self.flush()  # the import's admission travels with the next step's metadata
        grant = self.sched.connector_scheduler.import_grants.get(r.request_id)
        if grant is None:
            raise RuntimeError(f"no import grant: {self.sched.connector_scheduler.refused.get(r.request_id)}")
        agent = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-bench"
        with tempfile.TemporaryDirectory() as tmp:
            (pathlib.Path(tmp) / "grant").write_bytes(grant)
            (pathlib.Path(tmp) / "records").write_bytes(rec.contiguous().cpu().numpy().tobytes())
            subprocess.run([str(agent), "import", "--daemon", self.hisparse_address, "--grant", f"{tmp}/grant",
                            "--records", f"{tmp}/records"], check=True, capture_output=True, timeout=300)
        # vLLM keeps stepping while the request waits; each step's get_transfer_results polls the
        # worker (await_import), and finished_recving brings it back to the scheduler.
        for _ in range(3000):
            if self.sched.connector_scheduler._state.get(r.request_id) == "active":
                return
            time.sleep(0.01)
            self.flush()
        raise RuntimeError(f"the import of {r.request_id} was not reported committed")

    def preempt(self, r: VReq) -> None:
        """Scheduler._preempt_request: blocks freed, PREEMPTED, num_computed_tokens 0; what the
        recompute will write is kept (module docstring)."""
        locs = self.r2t.req_to_token[r.row, :r.num_computed_tokens].long()
        r.saved = self.pool.get_cpu_copy(locs)
        self._free(r)
        r.status.name = "PREEMPTED"
        r.num_computed_tokens = 0
        self.preempted.add(r.request_id)

    def finish(self, r: VReq) -> None:
        """A finished or aborted request: connector.request_finished, then its blocks freed."""
        if self.conn is not None:  # _connector_finished: a SupportsHMA connector gets every group's blocks
            self.sched.request_finished_all_groups(r, (list(r.blocks),))
        self._free(r)
        r.saved = None
        r.status.name = "FINISHED"
        self.finished_ids.add(r.request_id)

    # ---- one decode step ----

    def decode(self, batch: List[VReq]) -> tuple:
        """One decode (q = 1) or verify (q > 1) step of the batch: (logits [n, q, vocab], tokens [n, q])."""
        n, q, b, dev = len(batch), self.q, self.buf, self.model.device
        starts = [r.num_computed_tokens for r in batch]
        locs = torch.cat([self._slots(r, s, s + q) for r, s in zip(batch, starts)])
        rpi = torch.tensor([r.row for r in batch], dtype=torch.int64, device=dev)
        b.req_pool_indices[:n], b.out_cache_loc[:n * q] = rpi, locs
        last = torch.tensor([(r.prompt + r.output_token_ids)[-1] for r in batch], device=dev)
        md = SimpleNamespace(num_actual_tokens=n * q, num_decode_tokens=n * q, num_decodes=n, num_reqs=n,
                             max_query_len=q, decode_max_query_len=q, block_size=BLOCK,
                             req_id_per_token=torch.arange(n, dtype=torch.int32, device=dev).repeat_interleave(q))
        if q > 1:
            b.tokens[:n, 0] = last
            b.seq_lens[:n] = torch.tensor(starts, dtype=torch.int32, device=dev)  # committed lengths

            def body():
                forward_verify(self.model, self.fmt, self.pool, self.r2t.req_to_token, b, self.draft, n, self._attend,
                               write=self._write)
        else:
            b.tokens[:n] = last
            b.seq_lens[:n] = torch.tensor([s + 1 for s in starts], dtype=torch.int32, device=dev)

            def body():
                forward_decode(self.model, self.fmt, self.pool, self.r2t.req_to_token, b, n, self._attend,
                               write=self._write)

        self._step([(r, s, q, r.fresh) for r, s in zip(batch, starts)], md, body)
        logits = b.logits[:n].to("cpu", copy=True).view(n, q, -1)
        tokens = b.tokens[:n].to("cpu", copy=True).view(n, q) if q > 1 else None
        return logits, tokens

    def commit(self, batch: List[VReq], logits: torch.Tensor, tokens, out: Dict[str, List[torch.Tensor]]) -> None:
        """update_from_output: each request's row kept; q = 1: its greedy token; q > 1: a seeded
        count a of the q verify tokens accepted, num_computed_tokens += a."""
        for i, r in enumerate(batch):
            if self.q == 1:
                out[r.request_id].append(logits[i, 0])
                r.output_token_ids.append(int(logits[i, 0].argmax()))
                r.num_computed_tokens += 1
                continue
            out[r.request_id].append(logits[i])
            a = self.accept[r.request_id][len(out[r.request_id]) - 1]
            r.output_token_ids += tokens[i, 1:a].tolist() + [int(logits[i, a - 1].argmax())]
            r.num_computed_tokens += a

    def flush(self) -> None:
        """An empty step: the last releases travel with its metadata."""
        if self.conn is not None:
            md = SimpleNamespace(num_actual_tokens=0, num_decode_tokens=0, num_decodes=0, num_reqs=0, max_query_len=0,
                                 req_id_per_token=None, block_size=BLOCK)
            self._step([], md, lambda: None)


@torch.no_grad()
def run_vllm_serve(model: SparseDecoder, fmt: RecordFormat, work: Workload, *, k: int, steps: int,
                   draft_tokens: int = 0, hisparse: Optional[dict] = None,
                   pd_import: Optional[str] = None) -> SGLangRun:
    """Runs the workload for `steps` steps with (hisparse: HisparsedConnector's
    kv_connector_extra_config) or without the connector; preempts work.retract's requests, resumes
    them two steps later, aborts the last of two or more the step after; finishes every request
    left; pd_import: that request arrives as a P/D import. Checks that every block and row came
    back and, with hisparse, that the session holds nothing."""
    e = VllmServeEngine(model, fmt, work, k=k, draft_tokens=draft_tokens, hisparse=hisparse, pd_import=pd_import)
    before = e.session.stats() if e.conn is not None else None
    logits: Dict[str, List[torch.Tensor]] = {r.request_id: [] for r in e.reqs}
    step_ms: List[float] = []
    dev = model.device
    on_stream = contextlib.nullcontext()
    if dev.type == "cuda":  # the engine's stream, after everything before it (the model's weights)
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        on_stream = torch.cuda.stream(stream)
    with on_stream:
        preempted, aborted = _serve(e, work, steps, pd_import, logits, step_ms)
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)
    assert len(e.free_blocks) == e.num_blocks - 1 and len(e.r2t.free_slots) == e.max_bs, "blocks or rows leaked"
    result = SGLangRun("hisparse" if e.conn is not None else "baseline", logits,
                       {r.request_id: list(r.output_token_ids) for r in e.reqs}, steps, step_ms, preempted)
    result.aborted, result.ops = aborted, dict(e.ops)
    if e.conn is not None:
        e.session.check_errors()
        after = e.session.stats()
        assert after.session_requests == 0 and after.session_host_bytes == 0, "the connector leaked requests"
        result.hits, result.misses = after.hits - before.hits, after.misses - before.misses
        e.conn.shutdown()
    return result


def _serve(e: VllmServeEngine, work: Workload, steps: int, pd_import: Optional[str],
           logits: Dict[str, List[torch.Tensor]], step_ms: List[float]) -> tuple:
    """run_vllm_serve's steps on the current stream; returns (preempted, aborted)."""
    by_id = {r.request_id: r for r in e.reqs}
    preempt_order = sorted(work.retract, key=lambda rid: (work.retract[rid], rid))
    abort = {preempt_order[-1]: work.retract[preempt_order[-1]] + 1} if len(preempt_order) >= 2 else {}
    running: List[VReq] = []
    resume: Dict[int, List[VReq]] = {}
    waiting: List[VReq] = []
    preempted = aborted = 0
    for step in range(steps):
        for rid, at in abort.items():
            if at == step and by_id[rid].status.name == "PREEMPTED":  # finish_requests(FINISHED_ABORTED), waiting
                e.finish(by_id[rid])
                resume = {s: [r for r in rs if r.request_id != rid] for s, rs in resume.items()}
                waiting = [r for r in waiting if r.request_id != rid]
                aborted += 1
        preempting = [r for r in running if work.retract.get(r.request_id) == step]
        for r in preempting:
            e.preempt(r)
            running.remove(r)
            resume.setdefault(step + 2, []).append(r)
            preempted += 1
        waiting += [r for r in e.reqs if work.arrival[r.request_id] == step] + resume.pop(step, [])
        arriving, waiting = (waiting, []) if not preempting else ([], waiting)  # schedule(): "if not preempted_reqs"
        for r in [r for r in arriving if r.request_id == pd_import]:
            e.import_(r)
            arriving.remove(r)
            running.append(r)
        if arriving:
            e.admit(arriving)
            running += arriving
        if not running:
            continue
        t = time.perf_counter()
        rows, tokens = e.decode(running)
        step_ms.append(1e3 * (time.perf_counter() - t))
        e.commit(running, rows, tokens, logits)
        for r in [r for r in running if r.finished()]:
            e.finish(r)
            running.remove(r)
    for r in running + waiting + [r for rs in resume.values() for r in rs]:
        e.finish(r)
    e.flush()
    return preempted, aborted

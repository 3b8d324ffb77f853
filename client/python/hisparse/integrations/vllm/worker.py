"""``HisparsedConnectorWorker``: the worker role of ``HisparsedConnector`` (upstream
``HiSparseConnectorWorker``, ``kv_connector/v1/hisparse/worker.py @ 023979d6``).

It owns the worker's Session (opened by ``register_kv_caches`` over the hisparse layers' paged
caches, closed by ``shutdown``) and the ``HisparsedRuntime`` every layer's handle shares; it
applies the scheduler's metadata each step (lifecycle RPCs before the forward, prefill stores
after it) and reports back what the daemon refused, import grants and evictions. Thread-safety:
none; vLLM's worker calls it from its forward thread.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ... import _lib
from ...errors import FailedPrecondition, HisparseError, InvalidArgument, NotFound, Unavailable
from ...session import Session
from .metadata import HisparsedConnectorMetadata, HisparsedWorkerMetadata, Window, _draft_tokens, _extra
from .index_group import make_index_group
from .runtime import HisparsedCacheHandle, HisparsedRuntime


def _chunks(items: list) -> list:
    """items in runs of at most HS_BATCH_MAX_ITEMS (one batched call each)."""
    return [items[i:i + _lib.HS_BATCH_MAX_ITEMS] for i in range(0, len(items), _lib.HS_BATCH_MAX_ITEMS)]


def _bytes_from_first_row(t: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """A paged cache [num_blocks, block_size, ...] whose rows are contiguous, as a 1-D uint8 view of
    its memory from its first byte to its last row's end (no copy), and its block stride in bytes."""
    if t.dim() < 3 or not t[0, 0].is_contiguous():
        raise InvalidArgument(f"a paged KV cache needs [num_blocks, block_size, ...] with contiguous rows; got "
                              f"shape {tuple(t.shape)} strides {t.stride()}")
    row = int(t[0, 0].numel())
    if (t.shape[1] > 1 and t.stride(1) != row) or (t.shape[0] > 1 and t.stride(0) < t.shape[1] * row):
        raise InvalidArgument(f"a paged KV cache needs its block's rows adjacent and blocks apart; got "
                              f"shape {tuple(t.shape)} strides {t.stride()}")
    size = t.element_size()
    as_bytes = t if t.dtype == torch.uint8 else t.view(torch.uint8)  # last dim x size, same storage
    span = ((t.shape[0] - 1) * t.stride(0) + t.shape[1] * row) * size
    return torch.as_strided(as_bytes, (span,), (1,), as_bytes.storage_offset()), int(t.stride(0) * size)


@dataclasses.dataclass
class _Live:
    """A request the worker's Session holds."""

    hid: int
    row: int  # -1 while parked or importing
    state: str  # active | parked | importing


class HisparsedConnectorWorker:
    """The worker role: owns the Session, applies each step's metadata (module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.extra = _extra(vllm_config)
        sched = getattr(vllm_config, "scheduler_config", None)
        self.max_num_seqs = int(self.extra.get("max_num_seqs", getattr(sched, "max_num_seqs", 0) or 0))
        # Tokens a step may hand swap_in (the decode ones first): vLLM's batch token budget.
        self.max_num_tokens = self.extra.get("max_num_tokens", getattr(sched, "max_num_batched_tokens", None))
        self.draft_tokens = _draft_tokens(vllm_config, self.extra)
        # kv_connector_extra_config lease_seconds: every request is admitted durable with this lease
        # (an import once it committed), so that a restart of hisparsed keeps it (ride_through).
        self.lease_seconds = int(self.extra.get("lease_seconds", 0))
        self.session: Optional[Session] = None
        self.runtime: Optional[HisparsedRuntime] = None
        self.handles: Dict[str, HisparsedCacheHandle] = {}
        self.index_groups: List[Any] = []  # the HisparsedIndexGroups attached to the layers' impls
        self.kernel_block_size = 0
        self._live: Dict[str, _Live] = {}
        self._refused: Dict[str, str] = {}
        self._grants: Dict[str, bytes] = {}
        self._order: List[Tuple[Window, int]] = []  # this step's windows and first token, in batch order
        self._applied: Optional[HisparsedConnectorMetadata] = None  # the metadata whose lifecycle ran

    # ---- setup ----

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        """Opens the Session over the hisparse layers' paged caches ([num_blocks, block_size, row];
        blocks may be strided, as in vLLM's shared KV tensors) and attaches one handle to each
        sparse MLA layer vLLM registered (attach_handles)."""
        names = [n for n in kv_caches if n in set(self.extra.get("layers", kv_caches))]
        if not names:
            raise InvalidArgument("no KV cache of a hisparse layer was registered")
        record = int(kv_caches[names[0]].shape[2:].numel() * kv_caches[names[0]].element_size())
        x = self.extra
        if "top_k" not in x or "device_buffer_size" not in x or self.max_num_seqs < 1:
            raise InvalidArgument("kv_connector_extra_config needs top_k and device_buffer_size, and max_num_seqs "
                                  "(or scheduler_config.max_num_seqs)")
        backend = x.get("backend", "auto")
        gpu = int(x.get("gpu", torch.cuda.current_device() if backend != "host" and torch.cuda.is_available() else -1))
        # The sparse backends read the arena as whole kernel blocks (flat_kv_row_view): where they
        # will (a layer's impl has an index group), B is rounded up so that each (row, layer) run
        # of B + 1 + drafts slots is a multiple of the kernel block size.
        self.kernel_block_size = bs = int(x.get("kernel_block_size", kv_caches[names[0]].shape[1]))
        slots = int(x["device_buffer_size"])
        if self._sparse_backend_layers(names):
            slots = -(-(slots + 1 + self.draft_tokens) // bs) * bs - 1 - self.draft_tokens
        self.session = Session(x.get("daemon"), num_layers=len(names), record_bytes=int(x.get("record_bytes", record)),
                               k=int(x["top_k"]), slots=slots, max_requests=self.max_num_seqs,
                               gpu=gpu, backend=backend, engine_name="vllm", draft_tokens=self.draft_tokens,
                               max_context_tokens=int(x.get("max_model_len", 0)))
        self.runtime = HisparsedRuntime(self.session, self.max_num_seqs, self.max_num_tokens)
        for layer, name in enumerate(names):
            h = HisparsedCacheHandle(self.runtime, layer)
            t = kv_caches[name]
            raw, block_stride = _bytes_from_first_row(t)
            h.bind_cache(raw, byte_offset=0, block_stride=block_stride, num_blocks=int(t.shape[0]),
                         block_size=int(t.shape[1]))
            self.handles[name] = h
        group = list(self.handles.values())  # one index group: layer 0 leads (prepare_group_for_batch)
        for h in group:
            h.index_group_caches = group
        self.attach_handles()
        self.attach_index_groups()

    def attach_handles(self) -> None:
        """Hands each hisparse layer its handle the way vLLM's MLAAttention holds one: as
        ``layer.hisparse_cache`` of the layer object vLLM registered under its name in
        ``vllm_config.compilation_config.static_forward_context`` (MLAAttention.__init__). Layers
        vLLM did not register (a test driving the connector alone) are skipped."""
        ctx = getattr(getattr(self.vllm_config, "compilation_config", None), "static_forward_context", None) or {}
        for name, h in self.handles.items():
            h.layer_name = name
            layer = ctx.get(name)
            if layer is not None:
                layer.hisparse_cache = h

    def _forward_context(self) -> Dict[str, Any]:
        return getattr(getattr(self.vllm_config, "compilation_config", None), "static_forward_context", None) or {}

    def _sparse_backend_layers(self, names: Sequence[str]) -> List[str]:
        """The hisparse layers whose attention impl has an index group (a sparse MLA backend)."""
        ctx = self._forward_context()
        return [n for n in names if getattr(getattr(ctx.get(n), "impl", None), "index_group", None) is not None]

    def attach_index_groups(self) -> None:
        """Puts a HisparsedIndexGroup (index_group.py) in place of the index group vLLM gave each
        hisparse layer's attention impl (``layer.impl.index_group``, position
        ``impl.index_group_index``; with hisparse_config unset vLLM's SparseMLAIndexGroupBuilder made
        a plain SparseMLAIndexGroup, whose branch reads vLLM's paged cache). One per upstream group,
        keeping its fields and its layer numbering. A group holding a layer hisparse does not serve
        is refused. Layers without an impl index group (not a sparse backend; a test driving the
        connector alone) are left as they are."""
        ctx = getattr(getattr(self.vllm_config, "compilation_config", None), "static_forward_context", None) or {}
        groups: Dict[int, Tuple[Any, Dict[int, HisparsedCacheHandle], List[Any]]] = {}
        for name, h in self.handles.items():
            impl = getattr(ctx.get(name), "impl", None)
            upstream = getattr(impl, "index_group", None)
            if upstream is None:
                continue
            _, members, impls = groups.setdefault(id(upstream), (upstream, {}, []))
            index = int(getattr(impl, "index_group_index", 0))
            if index in members:
                raise InvalidArgument(f"layer {name}: index_group_index {index} taken twice in one index group")
            members[index] = h
            impls.append(impl)
        self.index_groups = []
        for upstream, members, impls in groups.values():
            n = max(int(getattr(upstream, "num_layers", 0) or 0), len(members))
            if sorted(members) != list(range(n)):
                raise InvalidArgument(f"an index group of {n} layers has hisparse handles for {sorted(members)} only: "
                                      f"every layer of a group must be served by hisparse (kv_connector_extra_config "
                                      f"layers)")
            group = make_index_group([members[i] for i in range(n)], block_size=self.kernel_block_size, like=upstream)
            for impl in impls:
                impl.index_group = group
            self.index_groups.append(group)

    def cache_handle(self, layer_name: str) -> HisparsedCacheHandle:
        return self.handles[layer_name]

    def bind_slot_mapping(self, slot_mapping: torch.Tensor) -> None:
        """The model runner's persistent slot_mapping (int64 [max tokens], -1 padding), shared by every layer."""
        for h in self.handles.values():
            h.slot_mapping = slot_mapping

    def _s(self) -> Session:
        if self.session is None:
            raise FailedPrecondition("register_kv_caches has not run: no hisparse session")
        return self.session

    # ---- per step ----

    def apply_metadata(self, meta: HisparsedConnectorMetadata) -> None:
        """Before the forward, every step (the connector's bind_connector_metadata, which vLLM's
        ActiveKVConnector.pre_forward calls before the forward whether or not start_load_kv is
        deferred: vllm/v1/worker/gpu/kv_connector.py @ 00f4240e): releases, parks, resumes,
        admissions, and prefix hits stored from vLLM's blocks. Once per metadata object."""
        if meta is self._applied:
            return
        self._applied = meta
        self.runtime.prepared = False  # until start_load_kv brings this step's batch order
        s = self._s()
        if not s.alive:
            self.ride_through()
        self._apply_lifecycle(s, meta)
        for w in meta.windows:
            live = self._live.get(w.req_id)
            if w.pre_store[1] > w.pre_store[0] and live is not None:
                self._store_from_blocks(w)

    def start_load_kv(self, meta: HisparsedConnectorMetadata, request_state_indices: Any = None,
                      request_ids: Optional[Sequence[str]] = None) -> None:
        """Prepares the runtime for the forward in vLLM's batch order (request_ids, idx_mapping);
        applies the metadata first if bind_connector_metadata did not."""
        self.apply_metadata(meta)
        by_id = {w.req_id: w for w in meta.windows}
        ids = list(request_ids) if request_ids is not None else [w.req_id for w in meta.windows]
        rows, seqs, counts = [], [], []
        self._order, first = [], 0
        for rid in ids:
            w, live = by_id.get(rid), self._live.get(rid)
            real = w is not None and w.decode and live is not None and live.state == "active"
            rows.append(live.row if real else -1)
            seqs.append(w.start + w.num_tokens if real else 1)
            counts.append(w.num_tokens if w is not None else self.runtime.queries)  # a padding entry
            if w is not None:
                self._order.append((w, first))
            first += counts[-1]
        self.runtime.set_request_state_indices(request_state_indices if request_state_indices is not None
                                               else list(range(len(ids))))
        self.runtime.prepare_step(rows, seqs, counts)

    def _apply_lifecycle(self, s: Session, meta: HisparsedConnectorMetadata) -> None:
        gone = [rid for rid in meta.releases if rid in self._live]
        if (gone or meta.parks) and s.backend == "cuda":
            # A row or pages go back: the last forward that read them (asynchronous scheduling may
            # still run it) must be done. A host sync, outside any captured graph.
            torch.cuda.current_stream(self.runtime.device).synchronize()
        for i in range(0, len(gone), _lib.HS_BATCH_MAX_ITEMS):
            chunk = gone[i:i + _lib.HS_BATCH_MAX_ITEMS]
            results = s.release_batch([self._live[rid].hid for rid in chunk])  # every id is tried
            for rid in chunk:
                del self._live[rid]
            failed = [e for e in results if e is not None and not isinstance(e, NotFound)]
            if failed:  # NotFound: the daemon dropped it already (evicted); anything else is a bug
                raise failed[0]
        # One ParkBatch and one ResumeBatch per step (per 1024), each item on its own: a step that
        # preempts or brings back 64 requests makes one round trip, not 64.
        parks = [rid for rid in meta.parks if rid in self._live and self._live[rid].state == "active"]
        for chunk in _chunks(parks):
            for rid, err in zip(chunk, s.park_batch([self._live[rid].hid for rid in chunk], all_or_nothing=False)):
                if err is not None:
                    raise err  # the scheduler parks only what it admitted: anything else is a bug
                self._live[rid].row, self._live[rid].state = -1, "parked"
        resumes = [rid for rid in meta.resumes if rid in self._live and self._live[rid].state == "parked"]
        for chunk in _chunks(resumes):
            for rid, r in zip(chunk, s.resume_batch([self._live[rid].hid for rid in chunk], all_or_nothing=False)):
                if isinstance(r, HisparseError):
                    self._refuse(rid, r)
                else:
                    self._live[rid].row, self._live[rid].state = r.row, "active"
        for import_ in (False, True):  # plain admissions, then the P/D imports: one batch each
            for chunk in _chunks([a for a in meta.admits if a.import_ == import_]):
                lease = 0 if import_ else self.lease_seconds  # an import takes its lease once committed
                results = s.admit_batch([{"request_id": a.hid, "context_tokens": a.context_tokens,
                                          "token_budget": a.token_budget, "lease_seconds": lease} for a in chunk],
                                        all_or_nothing=False, begin_import=import_)
                for a, r in zip(chunk, results):
                    if isinstance(r, HisparseError):
                        self._refuse(a.req_id, r)
                    elif import_:
                        self._grants[a.req_id] = r
                        self._live[a.req_id] = _Live(a.hid, -1, "importing")
                    else:
                        self._live[a.req_id] = _Live(a.hid, r.row, "active")

    def ride_through(self) -> None:
        """The daemon went away (restarted, upgraded, crashed), so the session ended: at this step
        boundary, once the forwards that read the old session are done, recover it
        (Session.recover). A request the daemon kept (durable: lease_seconds) continues with its
        pages in its new row; every other one is reported refused ("lost"), as an eviction is, and
        vLLM computes it again. The arena keeps its address, so captured CUDA graphs replay as they
        are; where it could not (Recovery.arena_moved) the engine must restart."""
        s = self._s()
        if s.backend == "cuda":
            torch.cuda.current_stream(self.runtime.device).synchronize()
        rec = s.recover()
        if rec.arena_moved:
            raise FailedPrecondition("hisparsed came back with another slot arena (kind or page geometry): the "
                                     "captured forward cannot follow it; restart the engine")
        for rid, live in list(self._live.items()):
            if live.hid not in rec.kept:  # plain, importing, or a lease that ran out
                del self._live[rid]
                self._refused[rid] = "lost in a restart of hisparsed (it was not durable): compute it again"
                continue
            row = rec.kept[live.hid]  # None: parked (a parked request stays parked until resumed)
            if live.state == "active" and row is not None:
                live.row = row  # its slots are EMPTY: the next RESOLVE fetches what it selects
            elif live.state == "active":  # kept, yet no row: free it rather than stall the batch
                s.release(live.hid)
                del self._live[rid]
                self._refused[rid] = "kept in a restart of hisparsed, but no row was free: compute it again"

    def _refuse(self, rid: str, err: HisparseError) -> None:
        self._refused[rid] = f"{type(err).__name__}: {err}"
        live = self._live.pop(rid, None)
        if live is not None and live.state == "parked":  # a parked request that cannot resume is freed
            self._s().release(live.hid)

    def _store_from_blocks(self, w: Window) -> None:
        lo, hi = w.pre_store
        for h in self.handles.values():
            pos = torch.arange(lo, hi, dtype=torch.int64)
            table = torch.tensor(w.block_ids, dtype=torch.int64)
            index = (table[pos // h.block_size] * h.stride_rows + pos % h.block_size).to(torch.int32)
            self._s().store_indexed(w.hid, h.rows.unsqueeze(0), index.to(self.runtime.device), start_pos=lo,
                                    first_layer=h.layer, num_layers=1, seq_len_after=hi)

    def wait_for_save(self) -> None:
        """After the forward: stores each prefill window's new positions from the paged caches."""
        for w, offset in self._order:
            live = self._live.get(w.req_id)
            end = w.start + w.num_tokens
            if not w.decode and live is not None and live.state == "active" and end > w.store_from:
                for h in self.handles.values():
                    if h.slot_mapping is None:
                        raise FailedPrecondition("bind_slot_mapping has not run: prefill rows cannot be stored")
                    first = offset + (w.store_from - w.start)
                    slots = h.slot_mapping[first:offset + w.num_tokens].to(torch.int64)
                    if h.stride_rows != h.block_size:
                        slots = slots // h.block_size * h.stride_rows + slots % h.block_size
                    index = slots.to(torch.int32).contiguous()
                    self._s().store_indexed(w.hid, h.rows.unsqueeze(0), index,
                                            start_pos=w.store_from, first_layer=h.layer, num_layers=1,
                                            seq_len_after=end)
        self._order = []

    def get_finished(self, finished_req_ids: Any = ()) -> Tuple[Optional[set], Optional[set]]:
        """(None, the imports whose transfer committed since the last call)."""
        done = set()
        for rid, live in list(self._live.items()):
            if live.state != "importing":
                continue
            try:
                live.row, live.state = self._s().await_import(live.hid, 0).row, "active"
                if self.lease_seconds:
                    self._s().set_lease(live.hid, self.lease_seconds)
                done.add(rid)
            except Unavailable:
                pass  # the transfer is still running
            except HisparseError as e:  # aborted or expired: the daemon freed it
                del self._live[rid]
                self._refused[rid] = f"{type(e).__name__}: {e}"
        return None, (done or None)

    def build_connector_worker_meta(self) -> HisparsedWorkerMetadata:
        evicted = set(self._s().poll_evicted())
        gone = tuple(rid for rid, live in self._live.items() if live.hid in evicted)
        for rid in gone:
            del self._live[rid]
        meta = HisparsedWorkerMetadata(self._refused, self._grants, gone)
        self._refused, self._grants = {}, {}
        return meta

    def shutdown(self) -> None:
        """Releases every request the session still holds and closes it."""
        if self.session is None or self.session.closed:
            return
        ids = [live.hid for live in self._live.values()]
        self._live.clear()
        for i in range(0, len(ids), _lib.HS_BATCH_MAX_ITEMS):
            self.session.release_batch(ids[i:i + _lib.HS_BATCH_MAX_ITEMS])
        self.session.close()

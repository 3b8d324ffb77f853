"""``HisparsedConnector``: a vLLM KV connector (``KVConnectorBase_V1``) whose metadata carries a
hisparse Session's request lifecycle from vLLM's scheduler to its workers.

Upstream counterpart: ``HiSparseConnector`` in
``vllm/distributed/kv_transfer/kv_connector/v1/hisparse/connector.py`` (``vllm-project/vllm @
023979d6``), with a scheduler role (``HiSparseConnectorScheduler``) and a worker role
(``HiSparseConnectorWorker``). The base class is vLLM's when vLLM is importable; otherwise this
module works standalone (the tests drive it with stand-ins of vLLM's objects).

Scheduler role (no Session: vLLM's scheduler may run in another process). It names each request
with a hisparse id and, per step, ``build_connector_meta`` emits ``HisparsedConnectorMetadata``:
releases (``request_finished``), parks (``scheduler_output.preempted_req_ids``), resumes (a parked
request allocated again), admits and imports (``update_state_after_alloc``), and each scheduled
request's token window with what the worker does with it: ``decode`` (the forward appends the
window's rows and resolves; only the request's last sampled token and its drafts lack KV) or
``prefill`` (the worker stores the window's new positions after the forward).

Worker role (owns the Session). ``register_kv_caches`` opens it over the hisparse layers' paged
caches and builds one ``HisparsedCacheHandle`` per layer (``cache_handle(name)``);
``start_load_kv`` applies the step's lifecycle ops (releases and admits as one batched RPC each,
``Session.release_batch`` / ``admit_batch`` per item) and prepares the runtime; ``wait_for_save``
stores the prefill windows; ``get_finished`` reports committed imports as ``finished_recving``;
``build_connector_worker_meta`` returns refused admissions, import grants and evictions.

Thread-safety: none, as upstream; vLLM calls each role from one thread.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ... import _lib
from ...errors import FailedPrecondition, HisparseError, InvalidArgument, Unavailable
from ...session import Session
from .runtime import HisparsedCacheHandle, HisparsedRuntime, paged_rows

try:  # vLLM's base classes when vLLM is installed; plain objects otherwise
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1 as _Base
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata as _MetaBase
except ImportError:  # pragma: no cover - vLLM is not installed in CI
    _Base, _MetaBase = object, object
try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata as _WorkerMetaBase
except ImportError:
    _WorkerMetaBase = object


@dataclasses.dataclass(frozen=True)
class AdmitOp:
    """Admit (or, with import_=True, admit as an import a prefill node writes) one request."""

    req_id: str
    hid: int  # the hisparse request id
    context_tokens: int
    token_budget: int
    import_: bool = False


@dataclasses.dataclass(frozen=True)
class Window:
    """A scheduled request's tokens this step: positions [start, start + num_tokens)."""

    req_id: str
    hid: int
    start: int
    num_tokens: int
    decode: bool  # appended and resolved in the forward; else stored after it
    store_from: int  # prefill: the first position the host pool does not hold yet
    pre_store: Tuple[int, int] = (0, 0)  # positions vLLM's cache holds and the host pool not (prefix hits)
    block_ids: Tuple[int, ...] = ()  # the request's blocks, sent only with a pre_store


@dataclasses.dataclass
class HisparsedConnectorMetadata(_MetaBase):
    """Scheduler -> worker, one step. Plain data: vLLM pickles it to the workers."""

    releases: Tuple[str, ...] = ()
    parks: Tuple[str, ...] = ()
    resumes: Tuple[str, ...] = ()
    admits: Tuple[AdmitOp, ...] = ()
    windows: Tuple[Window, ...] = ()  # in the scheduler output's order (new, then cached)


@dataclasses.dataclass
class HisparsedWorkerMetadata(_WorkerMetaBase):
    """Worker -> scheduler, one step: requests the daemon refused (with why), import grants to
    hand to the prefill node's transfer agent, requests the daemon evicted."""

    refused: Dict[str, str] = dataclasses.field(default_factory=dict)
    grants: Dict[str, bytes] = dataclasses.field(default_factory=dict)
    evicted: Tuple[str, ...] = ()

    def aggregate(self, other: "HisparsedWorkerMetadata") -> "HisparsedWorkerMetadata":
        return HisparsedWorkerMetadata({**self.refused, **other.refused}, {**self.grants, **other.grants},
                                       tuple(dict.fromkeys(self.evicted + other.evicted)))


def _role_name(role: Any) -> str:
    return str(getattr(role, "name", role)).upper()


def _extra(vllm_config: Any) -> Dict[str, Any]:
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    return dict(getattr(ktc, "kv_connector_extra_config", None) or {})


def _draft_tokens(vllm_config: Any, extra: Dict[str, Any]) -> int:
    if "draft_tokens" in extra:
        return int(extra["draft_tokens"])
    spec = getattr(vllm_config, "speculative_config", None)
    return int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0


class HisparsedConnectorScheduler:
    """The scheduler role: plans each step's hisparse operations (see the module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        extra = _extra(vllm_config)
        self.draft_tokens = _draft_tokens(vllm_config, extra)
        self.group = int(extra.get("kv_cache_group", 0))
        self._ids = itertools.count(1)
        self._reqs: Dict[str, Any] = {}  # req_id -> vLLM Request
        self._state: Dict[str, str] = {}  # req_id -> admitting | importing | active | parked | refused
        self._hid: Dict[str, int] = {}
        self._stored: Dict[str, int] = {}  # positions the host pool holds once the planned ops ran
        self._blocks: Dict[str, Tuple[int, ...]] = {}
        self._releases: List[str] = []
        self._resumes: List[str] = []
        self._admits: List[AdmitOp] = []
        self.refused: Dict[str, str] = {}  # filled from the workers' metadata
        self.import_grants: Dict[str, bytes] = {}

    def _budget(self, request: Any) -> int:
        max_tokens = getattr(request, "max_tokens", None)
        if max_tokens is None:
            max_tokens = getattr(getattr(request, "sampling_params", None), "max_tokens", 0) or 0
        return int(request.num_prompt_tokens) + int(max_tokens) + self.draft_tokens + 1

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        """0 (vLLM computes the KV itself), except for a P/D import (kv_transfer_params
        {"hisparse_import": true}): every prompt token but the last comes from the prefill node,
        asynchronously (the request waits until the worker reports the import committed)."""
        params = getattr(request, "kv_transfer_params", None) or {}
        if params.get("hisparse_import") and request.request_id not in self._state:
            n = max(0, int(request.num_prompt_tokens) - 1 - int(num_computed_tokens))
            return n, n > 0
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """A request got blocks: new -> admit (or import when external tokens come), parked -> resume."""
        rid = request.request_id
        state = self._state.get(rid)
        if state == "parked":
            self._resumes.append(rid)
            self._state[rid] = "active"
            return
        if state is not None:
            return  # the second call after an async load, or an admission already planned
        hid = next(self._ids)
        self._reqs[rid], self._hid[rid] = request, hid
        budget = self._budget(request)
        if num_external_tokens > 0:
            context = int(request.num_computed_tokens) + int(num_external_tokens)
            self._admits.append(AdmitOp(rid, hid, context, budget, import_=True))
            self._state[rid], self._stored[rid] = "importing", context
            return
        self._admits.append(AdmitOp(rid, hid, min(int(request.num_prompt_tokens), budget), budget))
        self._state[rid], self._stored[rid] = "admitting", 0
        ids = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else blocks
        if ids is not None and len(ids) > self.group:
            self._blocks[rid] = tuple(int(b) for b in ids[self.group])

    def build_connector_meta(self, scheduler_output: Any) -> HisparsedConnectorMetadata:
        parks = []
        for rid in sorted(getattr(scheduler_output, "preempted_req_ids", None) or ()):
            if self._state.get(rid) in ("admitting", "active"):
                parks.append(rid)
                self._state[rid] = "parked"
        for rid in [a.req_id for a in self._admits if not a.import_]:
            self._state[rid] = "active"
        windows = [self._window(rid, start, scheduler_output) for rid, start in self._scheduled(scheduler_output)]
        meta = HisparsedConnectorMetadata(tuple(self._releases), tuple(parks), tuple(self._resumes),
                                          tuple(self._admits), tuple(windows))
        self._releases, self._resumes, self._admits = [], [], []
        return meta

    @staticmethod
    def _scheduled(so: Any) -> List[Tuple[str, int]]:
        out = [(d.req_id, int(d.num_computed_tokens)) for d in getattr(so, "scheduled_new_reqs", ())]
        cached = getattr(so, "scheduled_cached_reqs", None)
        if cached is not None:
            out += [(rid, int(n)) for rid, n in zip(cached.req_ids, cached.num_computed_tokens)]
        return out

    def _window(self, rid: str, start: int, so: Any) -> Window:
        n = int(so.num_scheduled_tokens[rid])
        request = self._reqs.get(rid)
        decode = request is not None and start >= int(request.num_tokens) - 1 and n <= self.draft_tokens + 1
        if self._state.get(rid) != "active":  # unknown, importing or refused: its tokens publish -1
            return Window(rid, -1, start, n, decode, start + n)
        stored = self._stored[rid]
        pre, blocks = (0, 0), ()
        if stored < start:  # vLLM's prefix cache holds [stored, start): store it from its blocks first
            pre, blocks = (stored, start), self._blocks.get(rid, ())
            if len(blocks) == 0:
                raise FailedPrecondition(f"request {rid}: positions [{stored}, {start}) are in vLLM's cache "
                                         f"but not in hisparse, and its block ids are unknown")
            stored = start
        if decode:
            self._stored[rid] = start + n  # rejected drafts are rewritten by the next step's append
        else:
            self._stored[rid] = max(stored, start + n)
        self._blocks.pop(rid, None)
        return Window(rid, self._hid[rid], start, n, decode, max(stored, start), pre, blocks)

    def update_connector_output(self, connector_output: Any) -> None:
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if meta is not None:
            for rid, why in meta.refused.items():
                self.refused[rid] = why
                if rid in self._state:
                    self._state[rid] = "refused"
            self.import_grants.update(meta.grants)
        for rid in getattr(connector_output, "finished_recving", None) or ():
            if self._state.get(rid) == "importing":
                self._state[rid] = "active"

    def request_finished(self, request: Any, block_ids: Any = None) -> Tuple[bool, Optional[dict]]:
        """Plans the release (the worker frees the request's pages and row); vLLM frees its blocks now."""
        rid = request.request_id
        state = self._state.pop(rid, None)
        if state is not None and state != "refused":
            self._releases.append(rid)
        for d in (self._reqs, self._hid, self._stored, self._blocks, self.import_grants):
            d.pop(rid, None)
        self._admits = [a for a in self._admits if a.req_id != rid]
        self._resumes = [r for r in self._resumes if r != rid]
        return False, None


@dataclasses.dataclass
class _Live:
    """A request the worker's Session holds."""

    hid: int
    row: int  # -1 while parked or importing
    state: str  # active | parked | importing


class HisparsedConnectorWorker:
    """The worker role: owns the Session, applies each step's metadata (module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        self.extra = _extra(vllm_config)
        sched = getattr(vllm_config, "scheduler_config", None)
        self.max_num_seqs = int(self.extra.get("max_num_seqs", getattr(sched, "max_num_seqs", 0) or 0))
        # Tokens a step may hand swap_in (the decode ones first): vLLM's batch token budget.
        self.max_num_tokens = self.extra.get("max_num_tokens", getattr(sched, "max_num_batched_tokens", None))
        self.draft_tokens = _draft_tokens(vllm_config, self.extra)
        self.session: Optional[Session] = None
        self.runtime: Optional[HisparsedRuntime] = None
        self.handles: Dict[str, HisparsedCacheHandle] = {}
        self._live: Dict[str, _Live] = {}
        self._refused: Dict[str, str] = {}
        self._grants: Dict[str, bytes] = {}
        self._meta: Optional[HisparsedConnectorMetadata] = None
        self._order: List[Window] = []  # this step's windows in batch order

    # ---- setup ----

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        """Opens the Session over the hisparse layers' paged caches ([num_blocks, block_size, row])."""
        names = [n for n in kv_caches if n in set(self.extra.get("layers", kv_caches))]
        if not names:
            raise InvalidArgument("no KV cache of a hisparse layer was registered")
        record = paged_rows(kv_caches[names[0]]).shape[1]
        x = self.extra
        if "top_k" not in x or "device_buffer_size" not in x or self.max_num_seqs < 1:
            raise InvalidArgument("kv_connector_extra_config needs top_k and device_buffer_size, and max_num_seqs "
                                  "(or scheduler_config.max_num_seqs)")
        backend = x.get("backend", "auto")
        gpu = int(x.get("gpu", torch.cuda.current_device() if backend != "host" and torch.cuda.is_available() else -1))
        self.session = Session(x.get("daemon"), num_layers=len(names), record_bytes=int(x.get("record_bytes", record)),
                               k=int(x["top_k"]), slots=int(x["device_buffer_size"]), max_requests=self.max_num_seqs,
                               gpu=gpu, backend=backend, engine_name="vllm", draft_tokens=self.draft_tokens,
                               max_context_tokens=int(x.get("max_model_len", 0)))
        self.runtime = HisparsedRuntime(self.session, self.max_num_seqs, self.max_num_tokens)
        for layer, name in enumerate(names):
            self.handles[name] = HisparsedCacheHandle(self.runtime, layer)
            self.handles[name].bind_cache(kv_caches[name])

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

    def start_load_kv(self, meta: HisparsedConnectorMetadata, request_state_indices: Any = None,
                      request_ids: Optional[Sequence[str]] = None) -> None:
        """Applies the step's lifecycle ops, then prepares the runtime for the forward."""
        s = self._s()
        self._apply_lifecycle(s, meta)
        by_id = {w.req_id: w for w in meta.windows}
        ids = list(request_ids) if request_ids is not None else [w.req_id for w in meta.windows]
        self._order = [by_id[rid] for rid in ids if rid in by_id]
        for w in self._order:
            if w.pre_store[1] > w.pre_store[0] and w.req_id in self._live:
                self._store_from_blocks(w)
        rows, seqs, counts = [], [], []
        for rid in ids:
            w, live = by_id.get(rid), self._live.get(rid)
            real = w is not None and w.decode and live is not None and live.state == "active"
            rows.append(live.row if real else -1)
            seqs.append(w.start + w.num_tokens if real else 1)
            counts.append(w.num_tokens if w is not None else self.runtime.queries)  # a padding entry
        self.runtime.set_request_state_indices(request_state_indices if request_state_indices is not None
                                               else list(range(len(ids))))
        self.runtime.prepare_step(rows, seqs, counts)
        self._meta = meta

    def _apply_lifecycle(self, s: Session, meta: HisparsedConnectorMetadata) -> None:
        gone = [rid for rid in meta.releases if rid in self._live]
        for i in range(0, len(gone), _lib.HS_BATCH_MAX_ITEMS):
            chunk = gone[i:i + _lib.HS_BATCH_MAX_ITEMS]
            s.release_batch([self._live[rid].hid for rid in chunk])  # an unknown id is reported, others freed
            for rid in chunk:
                del self._live[rid]
        for rid in meta.parks:
            if rid in self._live and self._live[rid].state == "active":
                s.park(self._live[rid].hid)
                self._live[rid].row, self._live[rid].state = -1, "parked"
        for rid in meta.resumes:
            live = self._live.get(rid)
            if live is None or live.state != "parked":
                continue
            try:
                live.row, live.state = s.resume(live.hid).row, "active"
            except HisparseError as e:
                self._refuse(rid, e)
        plain = [a for a in meta.admits if not a.import_]
        for i in range(0, len(plain), _lib.HS_BATCH_MAX_ITEMS):
            chunk = plain[i:i + _lib.HS_BATCH_MAX_ITEMS]
            results = s.admit_batch([(a.hid, a.context_tokens, a.token_budget) for a in chunk], all_or_nothing=False)
            for a, r in zip(chunk, results):
                if isinstance(r, HisparseError):
                    self._refuse(a.req_id, r)
                else:
                    self._live[a.req_id] = _Live(a.hid, r.row, "active")
        for a in meta.admits:
            if a.import_:
                try:
                    self._grants[a.req_id] = s.admit_import(a.hid, a.context_tokens, a.token_budget)
                    self._live[a.req_id] = _Live(a.hid, -1, "importing")
                except HisparseError as e:
                    self._refuse(a.req_id, e)

    def _refuse(self, rid: str, err: HisparseError) -> None:
        self._refused[rid] = f"{type(err).__name__}: {err}"
        live = self._live.pop(rid, None)
        if live is not None and live.state == "parked":  # a parked request that cannot resume is freed
            self._s().release(live.hid)

    def _store_from_blocks(self, w: Window) -> None:
        lo, hi = w.pre_store
        for h in self.handles.values():
            block = h.kv_cache.shape[1]
            pos = torch.arange(lo, hi, dtype=torch.int64)
            table = torch.tensor(w.block_ids, dtype=torch.int64)
            index = (table[pos // block] * block + pos % block).to(torch.int32).to(self.runtime.device)
            self._s().store_indexed(w.hid, paged_rows(h.kv_cache).unsqueeze(0), index, start_pos=lo,
                                    first_layer=h.layer, num_layers=1, seq_len_after=hi)

    def wait_for_save(self) -> None:
        """After the forward: stores each prefill window's new positions from the paged caches."""
        offset = 0
        for w in self._order:
            live = self._live.get(w.req_id)
            end = w.start + w.num_tokens
            if not w.decode and live is not None and live.state == "active" and end > w.store_from:
                for h in self.handles.values():
                    if h.slot_mapping is None:
                        raise FailedPrecondition("bind_slot_mapping has not run: prefill rows cannot be stored")
                    first = offset + (w.store_from - w.start)
                    index = h.slot_mapping[first:offset + w.num_tokens].to(torch.int32).contiguous()
                    self._s().store_indexed(w.hid, paged_rows(h.kv_cache).unsqueeze(0), index,
                                            start_pos=w.store_from, first_layer=h.layer, num_layers=1,
                                            seq_len_after=end)
            offset += w.num_tokens
        self._order = []

    def get_finished(self, finished_req_ids: Any = ()) -> Tuple[Optional[set], Optional[set]]:
        """(None, the imports whose transfer committed since the last call)."""
        done = set()
        for rid, live in list(self._live.items()):
            if live.state != "importing":
                continue
            try:
                live.row, live.state = self._s().await_import(live.hid, 0).row, "active"
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


class HisparsedConnector(_Base):
    """vLLM's KVConnectorBase_V1 over hisparse: one role object per process (module docstring).

    Select it with --kv-transfer-config '{"kv_connector": "HisparsedConnector",
    "kv_connector_module_path": "hisparse.integrations.vllm", "kv_role": "kv_both",
    "kv_connector_extra_config": {"daemon": "unix:/run/hisparse/hisparsed.sock", "top_k": 2048,
    "device_buffer_size": 4096}}'."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        if _Base is not object:
            super().__init__(vllm_config, role, kv_cache_config)
        else:
            self._connector_metadata = None
            self._role = role
        name = _role_name(role)
        if name not in ("SCHEDULER", "WORKER"):
            raise InvalidArgument(f"role must be SCHEDULER or WORKER, got {role!r}")
        self.connector_scheduler = HisparsedConnectorScheduler(vllm_config) if name == "SCHEDULER" else None
        self.connector_worker = HisparsedConnectorWorker(vllm_config) if name == "WORKER" else None

    # ---- worker role ----

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        self._worker().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """kwargs as vLLM's model runner passes them to HiSparseConnector: request_state_indices
        (idx_mapping) and request_ids (batch order)."""
        meta = self._connector_metadata
        if not isinstance(meta, HisparsedConnectorMetadata):
            raise FailedPrecondition("start_load_kv without HisparsedConnectorMetadata bound")
        self._worker().start_load_kv(meta, kwargs.get("request_state_indices"), kwargs.get("request_ids"))

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # nothing loads per layer: RESOLVE fetches inside swap_in

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None  # decode rows are appended by the layer's finish_kv_update, prefill rows in wait_for_save

    def wait_for_save(self) -> None:
        self._worker().wait_for_save()

    def get_finished(self, finished_req_ids: Any) -> Tuple[Optional[set], Optional[set]]:
        return self._worker().get_finished(finished_req_ids)

    def build_connector_worker_meta(self) -> HisparsedWorkerMetadata:
        return self._worker().build_connector_worker_meta()

    def shutdown(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.shutdown()

    def _worker(self) -> HisparsedConnectorWorker:
        if self.connector_worker is None:
            raise FailedPrecondition("a worker-role call on the scheduler-role connector")
        return self.connector_worker

    # ---- scheduler role ----

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        return self._scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> HisparsedConnectorMetadata:
        return self._scheduler().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._scheduler().update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[dict]]:
        return self._scheduler().request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[dict]]:
        return self._scheduler().request_finished(request, block_ids)

    def _scheduler(self) -> HisparsedConnectorScheduler:
        if self.connector_scheduler is None:
            raise FailedPrecondition("a scheduler-role call on the worker-role connector")
        return self.connector_scheduler

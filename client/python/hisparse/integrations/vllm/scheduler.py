"""``HisparsedConnectorScheduler``: the scheduler role of ``HisparsedConnector`` (upstream
``HiSparseConnectorScheduler``, ``kv_connector/v1/hisparse/connector.py @ 023979d6``).

It holds no Session (vLLM's scheduler may run in another process than its workers): it names each
request with a hisparse id, tracks what the host pool will hold, and plans each step's operations
into ``HisparsedConnectorMetadata`` for the worker. Thread-safety: none; vLLM's scheduler thread
calls it.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Tuple

from ...errors import FailedPrecondition
from .metadata import AdmitOp, HisparsedConnectorMetadata, Window, _draft_tokens, _extra


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
        # SchedulerOutput.preempted_req_ids is filled for vLLM's V2 model runner only; a preempted
        # Request's status says it with either (RequestStatus.PREEMPTED).
        preempted = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        preempted |= {rid for rid, r in self._reqs.items()
                      if getattr(getattr(r, "status", None), "name", None) == "PREEMPTED"}
        for rid in sorted(preempted):
            if self._state.get(rid) in ("admitting", "active"):
                parks.append(rid)
                self._state[rid] = "parked"
        for rid in [a.req_id for a in self._admits if not a.import_]:
            self._state[rid] = "active"
        windows = [self._window(rid, start, scheduler_output) for rid, start in self._scheduled(scheduler_output)]
        meta = HisparsedConnectorMetadata(tuple(self._releases), tuple(parks), tuple(self._resumes),
                                          tuple(self._admits), tuple(windows))
        self._releases, self._resumes, self._admits = [], [], []
        # The worker must learn the step's batch order before the forward, and vLLM calls
        # start_load_kv (which carries it) after the forward unless the step has sync loads
        # (ActiveKVConnector.pre_forward, vllm/v1/worker/gpu/kv_connector.py @ 00f4240e); upstream's
        # HiSparseConnectorScheduler.build_connector_meta asks the same way (@ 023979d6).
        scheduler_output.has_sync_kv_loads = True
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
            for rid in meta.evicted:  # the daemon freed it under pool pressure: nothing left to release
                self.refused[rid] = "evicted by the daemon"
                if rid in self._state:
                    self._state[rid] = "refused"
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

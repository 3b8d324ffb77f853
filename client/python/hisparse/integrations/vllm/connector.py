"""``HisparsedConnector``: a vLLM KV connector (``KVConnectorBase_V1``) whose metadata carries a
hisparse Session's request lifecycle from vLLM's scheduler to its workers.

Upstream counterpart: ``HiSparseConnector`` in
``vllm/distributed/kv_transfer/kv_connector/v1/hisparse/connector.py`` (``vllm-project/vllm @
023979d6``), with a scheduler role (``HiSparseConnectorScheduler``) and a worker role
(``HiSparseConnectorWorker``). The base class is vLLM's when vLLM is importable; otherwise this
module works standalone (the tests drive it with stand-ins of vLLM's objects). This file is the
facade vLLM constructs; the roles live in ``scheduler.py`` and ``worker.py``, what they send each
other in ``metadata.py``.

Scheduler role (no Session: vLLM's scheduler may run in another process). It names each request
with a hisparse id and, per step, ``build_connector_meta`` emits ``HisparsedConnectorMetadata``:
releases (``request_finished``), parks (``preempted_req_ids``, or a ``PREEMPTED`` status), resumes (a parked
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

from typing import Any, Dict, Optional, Tuple

import torch

from ...errors import FailedPrecondition, InvalidArgument
from .version import check_supported_vllm
from .metadata import CONNECTOR_BASES, HisparsedConnectorMetadata, HisparsedWorkerMetadata, _Base, _role_name
from .scheduler import HisparsedConnectorScheduler
from .worker import HisparsedConnectorWorker


class _TransferResults:
    """What get_transfer_results returns without vLLM (KVConnectorTransferResults' fields)."""

    def __init__(self, finished_sending: set, finished_recving: set) -> None:
        self.finished_sending, self.finished_recving = finished_sending, finished_recving
        self.failed_recving: set = set()
        self.prefix_replay_checkpoints = None


class HisparsedConnector(*CONNECTOR_BASES):
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
        check_supported_vllm()
        hisparse_config = getattr(getattr(vllm_config, "attention_config", None), "hisparse_config", None)
        if hisparse_config is not None:
            # With it vLLM builds its own handles, host pool and HiSparseConnector at model
            # construction (SparseMLAIndexGroupBuilder.register_layer, index_group.py @ 03328988):
            # two owners of every sparse layer's KV. HisparsedConnector replaces all of them.
            raise InvalidArgument("HisparsedConnector replaces vLLM's own HiSparse: leave "
                                  "attention_config.hisparse_config unset (no --hisparse-config)")
        self.connector_scheduler = HisparsedConnectorScheduler(vllm_config) if name == "SCHEDULER" else None
        self.connector_worker = HisparsedConnectorWorker(vllm_config) if name == "WORKER" else None

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # nothing is handed off when a request completes (as upstream's HiSparseConnector)

    # ---- worker role ----

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        """Runs before every forward (ActiveKVConnector.pre_forward, vllm/v1/worker/gpu/kv_connector.py
        @ 00f4240e), unlike start_load_kv: the step's releases, parks, resumes and admissions are
        applied here."""
        self._connector_metadata = connector_metadata
        if self.connector_worker is not None and isinstance(connector_metadata, HisparsedConnectorMetadata):
            self.connector_worker.apply_metadata(connector_metadata)

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

    # What ActiveKVConnector (vllm/v1/worker/gpu/kv_connector.py @ 00f4240e) calls besides; vLLM's
    # KVConnectorBase_V1 answers them when it is the base, these only when vLLM is not installed.
    if _Base is object:
        def handle_preemptions(self, connector_metadata: Any) -> None:
            return None  # parks travel in the metadata, applied by bind_connector_metadata

        def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
            return None

        def finish_forward(self) -> None:
            return None

        def reset_capture_state(self) -> None:
            return None

        def get_transfer_results(self, finished_req_ids: Any) -> Any:
            sending, recving = self.get_finished(finished_req_ids)
            return _TransferResults(sending or set(), recving or set())

        def get_block_ids_with_load_errors(self) -> set:
            return set()

        def get_kv_connector_stats(self) -> Any:
            return None

        def get_kv_connector_kv_cache_events(self) -> Any:
            return None

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

"""What the vLLM connector's two roles send each other, as plain picklable data (vLLM ships the
scheduler's metadata to worker processes and the workers' metadata back), and the vLLM config
lookups both roles share. Counterparts: ``HiSparseConnectorMetadata`` and
``HiSparseConnectorWorkerMetadata`` in upstream's ``kv_connector/v1/hisparse/connector.py``
(``vllm-project/vllm @ 023979d6``). The base classes are vLLM's when it is importable.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

try:  # vLLM's base classes when vLLM is installed; plain objects otherwise
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1 as _Base
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata as _MetaBase
except ImportError:  # pragma: no cover - vLLM is not installed in CI
    _Base, _MetaBase = object, object
try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata as _WorkerMetaBase
except ImportError:
    _WorkerMetaBase = object
try:  # the hybrid KV-cache manager (which DSA models' indexer groups need) takes only SupportsHMA connectors
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA as _HMA
except ImportError:
    _HMA = object
CONNECTOR_BASES = tuple(b for b in (_Base, _HMA) if b is not object) or (object,)


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

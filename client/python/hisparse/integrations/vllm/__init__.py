"""vLLM adapter: hisparse behind vLLM's hybrid HiSparse hooks (``vllm-project/vllm @ 023979d6``).

- ``runtime``: ``HisparsedRuntime`` / ``HisparsedCacheHandle``, the per-step calls vLLM's sparse
  MLA layers make on ``layer.hisparse_cache`` (swap-in, newest-row write, state indices, the
  real-request count), over one hisparse Session per worker;
- ``connector``: ``HisparsedConnector`` (``KVConnectorBase_V1``: scheduler and worker roles), whose
  metadata (``metadata``) carries admission, release, import and park/resume from the scheduler
  role (``scheduler``) to the worker role that owns the Session (``worker``).

docs/INTEGRATION.md ("vLLM adapter") lists the edits a vLLM checkout needs to construct them.
vLLM is imported only by ``metadata`` for its base classes, and only when installed.
"""

from .connector import HisparsedConnector
from .metadata import AdmitOp, HisparsedConnectorMetadata, HisparsedWorkerMetadata, Window
from .scheduler import HisparsedConnectorScheduler
from .worker import HisparsedConnectorWorker
from .runtime import HisparsedCacheHandle, HisparsedRuntime, paged_rows

__all__ = [
    "AdmitOp", "HisparsedCacheHandle", "HisparsedConnector", "HisparsedConnectorMetadata",
    "HisparsedConnectorScheduler", "HisparsedConnectorWorker", "HisparsedRuntime", "HisparsedWorkerMetadata",
    "Window", "paged_rows",
]

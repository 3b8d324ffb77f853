"""vLLM adapter: hisparse behind vLLM's hybrid HiSparse hooks (``vllm-project/vllm @ 023979d6``).

- ``runtime``: ``HisparsedRuntime`` / ``HisparsedCacheHandle``, the per-step calls vLLM's sparse
  MLA layers make on ``layer.hisparse_cache`` (swap-in, newest-row write, state indices, the
  real-request count), over one hisparse Session per worker;
- ``connector``: ``HisparsedConnector`` (``KVConnectorBase_V1``: scheduler and worker roles), whose
  metadata carries admission, release, import and park/resume to the worker that owns the Session.

docs/INTEGRATION.md ("vLLM adapter") lists the edits a vLLM checkout needs to construct them.
vLLM is imported only by ``connector`` for its base classes, and only when installed.
"""

from .connector import (AdmitOp, HisparsedConnector, HisparsedConnectorMetadata, HisparsedConnectorScheduler,
                        HisparsedConnectorWorker, HisparsedWorkerMetadata, Window)
from .runtime import HisparsedCacheHandle, HisparsedRuntime, paged_rows

__all__ = [
    "AdmitOp", "HisparsedCacheHandle", "HisparsedConnector", "HisparsedConnectorMetadata",
    "HisparsedConnectorScheduler", "HisparsedConnectorWorker", "HisparsedRuntime", "HisparsedWorkerMetadata",
    "Window", "paged_rows",
]

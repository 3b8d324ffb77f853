"""vLLM adapter: hisparse in place of vLLM's own HiSparse (``vllm-project/vllm @ 023979d6``).

- ``runtime``: ``HisparsedRuntime`` / ``HisparsedCacheHandle``, the handle vLLM's sparse MLA
  layers hold as ``layer.hisparse_cache`` (MLAAttention's prepare / write / finish calls, swap-in,
  state indices, the real-request count), over one hisparse Session per worker;
- ``connector``: ``HisparsedConnector`` (``KVConnectorBase_V1``: scheduler and worker roles), whose
  metadata (``metadata``) carries admission, release, import and park/resume from the scheduler
  role (``scheduler``) to the worker role that owns the Session (``worker``).

- ``plugin`` / ``version``: the ``vllm.general_plugins`` entry point and the supported-version guard.

docs/INTEGRATION.md ("vLLM") is the step-by-step. vLLM is imported only for its base classes, its
forward context and its connector factory, and only when installed.
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

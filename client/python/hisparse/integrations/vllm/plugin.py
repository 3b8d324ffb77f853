"""The vLLM plugin: ``register`` is the ``vllm.general_plugins`` entry point the package declares
(client/python/pyproject.toml), which vLLM calls in every process (engine core and workers) before
it builds the model. It refuses an unsupported vLLM (version.check_supported_vllm) and registers
``HisparsedConnector`` with vLLM's KVConnectorFactory, so ``--kv-transfer-config
'{"kv_connector": "HisparsedConnector", ...}'`` finds it without ``kv_connector_module_path``
(which also works, with "hisparse.integrations.vllm"). Nothing in vLLM is patched.
"""

from __future__ import annotations

from typing import Any, Optional

from .version import check_supported_vllm

CONNECTOR_NAME = "HisparsedConnector"
CONNECTOR_MODULE = "hisparse.integrations.vllm.connector"


def register(factory: Optional[Any] = None) -> bool:
    """Checks the vLLM version, then registers the connector; True if it registered it now.
    factory: vLLM's KVConnectorFactory (default: imported from vLLM; a test passes a stand-in).
    Calling it twice registers once (vLLM may load plugins more than once in a process)."""
    version = check_supported_vllm()
    if factory is None:
        if version is None:
            return False  # no vLLM: nothing to register with
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory as factory
    if CONNECTOR_NAME in getattr(factory, "_registry", {}):
        return False
    factory.register_connector(CONNECTOR_NAME, CONNECTOR_MODULE, "HisparsedConnector")
    return True

"""Drop-in adapters that let an LLM engine's own sparse-attention hooks drive a hisparse Session.

- ``hisparse.integrations.sglang.HisparsedCoordinator``: SGLang's ``HiSparseCoordinator``
  (``python/sglang/srt/managers/hisparse_coordinator.py``), with its side effects on SGLang's
  allocator, pools and streams, backed by hisparsed; ``sglang_plugin`` installs it through SGLang's
  ``sglang.srt.plugins`` entry point, behind a version guard. docs/INTEGRATION.md ("SGLang").
- ``hisparse.integrations.vllm``: vLLM's HiSparse per-step runtime (``HisparsedRuntime``,
  ``HisparsedCacheHandle``) and a ``KVConnectorBase_V1`` connector (``HisparsedConnector``)
  carrying the request lifecycle. docs/INTEGRATION.md ("vLLM adapter") lists the edits.
- ``hisparse.integrations.sglang_mtp.HisparsedMTPCoordinator``: its speculative-decoding form,
  the calls of SGLang's ``HiSparseMTPCoordinator`` (``swap_in_verify_pages`` etc.) on a Session
  with draft tokens.

The adapters import no engine code: they touch only the engine objects they are handed (requests,
pools), through the attributes named in each adapter's docstring.
"""

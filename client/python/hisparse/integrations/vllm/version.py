"""Which vLLM releases this adapter is written against, and the guard that refuses the others.

The adapter replaces pieces of vLLM that change between releases (the sparse MLA layers'
``hisparse_cache`` API, ``ActiveKVConnector``'s step order, the connector base class). It was
read against ``vllm-project/vllm`` at these commits, cited where each mechanism is used:
  023979d6 vllm/v1/hisparse/runtime.py (HiSparseCacheHandle), kv_connector/v1/hisparse/connector.py
  00f4240e vllm/v1/worker/gpu/kv_connector.py (ActiveKVConnector: start_load_kv after the forward
           unless SchedulerOutput.has_sync_kv_loads)
  03328988 vllm/v1/attention/backends/mla/index_group.py (where vLLM builds its own handles)
HiSparse's hooks first shipped in vLLM 0.30, so the guard accepts 0.30.x (and its .dev and
post builds). No vLLM release has run this adapter here: the tests drive stand-ins of the
mechanisms above (tests/python/test_vllm_mechanisms.py).
"""

from __future__ import annotations

import os
import re
from typing import Optional, Tuple

from ...errors import FailedPrecondition

SUPPORTED_VLLM: Tuple[Tuple[int, int], ...] = ((0, 30),)  # (major, minor) series
OVERRIDE_ENV = "HISPARSE_VLLM_ALLOW_UNSUPPORTED"


class UnsupportedVllmVersion(FailedPrecondition):
    """The installed vLLM is not one this adapter supports."""


def supported_text() -> str:
    return ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED_VLLM)


def installed_vllm_version() -> Optional[str]:
    """The installed vLLM distribution's version, None when vLLM is not installed."""
    import importlib.metadata
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_supported_vllm(version: Optional[str] = None) -> Optional[str]:
    """Raises UnsupportedVllmVersion unless `version` (default: the installed vLLM's) is in a
    supported series; returns the version checked (None: vLLM is not installed, nothing to
    guard). Setting HISPARSE_VLLM_ALLOW_UNSUPPORTED=1 turns the refusal off."""
    if version is None:
        version = installed_vllm_version()
        if version is None:
            return None
    m = re.match(r"^\s*v?(\d+)\.(\d+)", version)
    if m and (int(m.group(1)), int(m.group(2))) in SUPPORTED_VLLM:
        return version
    if os.environ.get(OVERRIDE_ENV) == "1":
        return version
    raise UnsupportedVllmVersion(
        f"hisparse's vLLM adapter supports vLLM {supported_text()}; the installed vLLM is {version}. "
        f"Install a supported vLLM (pip install 'vllm>={SUPPORTED_VLLM[0][0]}.{SUPPORTED_VLLM[0][1]},"
        f"<{SUPPORTED_VLLM[-1][0]}.{SUPPORTED_VLLM[-1][1] + 1}'), or set {OVERRIDE_ENV}=1 to run it "
        f"untested on this one")

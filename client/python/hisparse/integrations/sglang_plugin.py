"""SGLang plugin: puts HisparsedCoordinator in place of SGLang's HiSparseCoordinator, unpatched.

SGLang's ``sglang.srt.plugins.load_plugins()`` (sgl-project/sglang, python/sglang/srt/plugins/
__init__.py) calls every ``sglang.srt.plugins`` entry point in every process it starts, then
``HookRegistry.apply_hooks()``. This package's entry point is ``register`` (pyproject.toml):
it checks the installed SGLang (``check_sglang``) and registers a class REPLACE hook on
``sglang.srt.managers.hisparse_coordinator.HiSparseCoordinator`` (and on
``HiSparseMTPCoordinator`` where that class exists), which HookRegistry applies to the module and
to every module that imported the name. SGLang then builds the hisparse coordinator wherever it
built its own (``--enable-hisparse``), with its own arguments; the daemon is $HISPARSE_DAEMON,
else the node's default socket.

An SGLang outside SUPPORTED_SGLANG, or one without the mechanisms the adapter reproduces
(REQUIRED), is refused: ``register`` raises UnsupportedSGLang naming the installed version, the
supported ones and what is missing, and registers nothing (SGLang logs the exception and runs
its own coordinator). HISPARSE_SGLANG_ALLOW_VERSION=<version> accepts one more version exactly,
for an operator who has run the checks of docs/INTEGRATION.md against it; the mechanism check
still applies.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from typing import List, Optional, Tuple

ENTRY_POINT_GROUP = "sglang.srt.plugins"
TARGET = "sglang.srt.managers.hisparse_coordinator.HiSparseCoordinator"
MTP_TARGET = "sglang.srt.managers.hisparse_coordinator.HiSparseMTPCoordinator"
# The adapter reproduces sgl-project/sglang at this commit (HiSparse shipped from v0.5.10 on).
UPSTREAM_COMMIT = "009e640a75037e6d603ceb9eb1a4a41d64d049f6"
SUPPORTED_SGLANG = ((0, 5, 10), (0, 6, 0))  # [low, high): the 0.5 line from 0.5.10
SUPPORTED_TEXT = ">= 0.5.10, < 0.6"
# (module, attribute path) the adapter's mechanisms depend on, at UPSTREAM_COMMIT.
REQUIRED: Tuple[Tuple[str, str], ...] = (
    ("sglang.srt.plugins.hook_registry", "HookRegistry.register"),
    ("sglang.srt.managers.hisparse_coordinator", "HiSparseCoordinator.wait_for_pending_backup"),
    ("sglang.srt.managers.hisparse_coordinator", "HiSparseCoordinator.map_last_loc_to_buffer"),
    ("sglang.srt.managers.hisparse_coordinator", "HiSparseCoordinator.admit_request_direct"),
    ("sglang.srt.managers.hisparse_coordinator", "HiSparseCoordinator.swap_in_selected_pages"),
    ("sglang.srt.mem_cache.allocator.hisparse", "HiSparseTokenToKVPoolAllocator.alloc_device_buffer"),
    ("sglang.srt.mem_cache.allocator.hisparse", "HiSparseTokenToKVPoolAllocator.free_hisparse_indices"),
)


class UnsupportedSGLang(RuntimeError):
    """The installed SGLang is not one the adapter was built against."""


def _release(version: str) -> Optional[Tuple[int, int, int]]:
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _missing() -> List[str]:
    missing = []
    for module, path in REQUIRED:
        try:
            obj = importlib.import_module(module)
        except Exception as e:  # an SGLang too old or too new to have the module, or broken
            missing.append(f"{module} ({type(e).__name__}: {e})")
            continue
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{module}.{path}")
                break
    return missing


def check_sglang(version: Optional[str] = None) -> str:
    """The installed SGLang's version, or UnsupportedSGLang saying why it is refused."""
    if version is None:
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError as e:
            raise UnsupportedSGLang("hisparse's SGLang plugin: no installed sglang distribution was found") from e
    allowed = os.environ.get("HISPARSE_SGLANG_ALLOW_VERSION", "").strip()
    release = _release(version)
    in_range = release is not None and SUPPORTED_SGLANG[0] <= release < SUPPORTED_SGLANG[1]
    if not in_range and version != allowed:
        raise UnsupportedSGLang(
            f"hisparse's SGLang plugin supports sglang {SUPPORTED_TEXT} (written against sgl-project/sglang "
            f"{UPSTREAM_COMMIT[:10]}); sglang {version} is installed, so the plugin registers nothing and "
            "SGLang keeps its own HiSparse coordinator. Set HISPARSE_SGLANG_ALLOW_VERSION="
            f"{version} only after running docs/INTEGRATION.md's checks against it.")
    missing = _missing()
    if missing:
        raise UnsupportedSGLang(
            f"hisparse's SGLang plugin: sglang {version} lacks what the adapter relies on: {', '.join(missing)}")
    return version


def register() -> None:
    """The ``sglang.srt.plugins`` entry point (SGLang's load_plugins calls it with no argument)."""
    check_sglang()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .sglang import HisparsedCoordinator

    HookRegistry.register(TARGET, HisparsedCoordinator, HookType.REPLACE)
    upstream = importlib.import_module(TARGET.rsplit(".", 1)[0])
    if hasattr(upstream, MTP_TARGET.rsplit(".", 1)[1]):
        from .sglang_mtp import HisparsedMTPCoordinator

        HookRegistry.register(MTP_TARGET, HisparsedMTPCoordinator, HookType.REPLACE)

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

Riding through a restart of hisparsed: an AROUND hook on ``Scheduler.get_next_batch_to_run``
(``ride_through_hook``) asks the coordinator, once per scheduler iteration and before the running
batch is extended or prepared, whether the daemon went away (``HisparsedCoordinator.ride_through``)
and retracts every request whose KV was lost the way SGLang's own retraction does
(``retract_lost``); kept requests decode on. Read against sgl-project/sglang 0003215cf146
(python/sglang/srt/managers/scheduler.py: get_next_batch_to_run(running_batch, last_batch),
update_running_batch's retract_decode then _add_request_to_queue(req, is_retracted=True);
schedule_batch.py: ScheduleBatch.release_req(idx, remaining, server_args), filter_batch(
keep_indices=...), the module's release_req for a request in no batch).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from typing import Any, List, Optional, Tuple

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
    ("sglang.srt.managers.scheduler", "Scheduler.get_next_batch_to_run"),
    ("sglang.srt.managers.scheduler", "Scheduler._add_request_to_queue"),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch.release_req"),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch.filter_batch"),
)
SCHEDULER_TARGET = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"


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


def _running_batch(scheduler: Any, args: tuple, kwargs: dict) -> Any:
    """get_next_batch_to_run's running batch: its argument (0003215c), else the scheduler's own."""
    if "running_batch" in kwargs:
        return kwargs["running_batch"]
    return args[0] if args else getattr(scheduler, "running_batch", None)


def retract_lost(scheduler: Any, coord: Any, batch: Any, lost: Any) -> List[Any]:
    """Retracts the requests named in `lost` (rids) as ScheduleBatch.retract_decode does for those
    it picks: release_req for each (the coordinator's retract_req, SGLang's KV freed, the request
    reset), filter_batch keeping the others, and each back to the waiting queue
    (_add_request_to_queue(req, is_retracted=True)), to be prefilled again. Requests lost while
    staging (in no batch) go through the module's release_req. Returns the requests retracted."""
    lost = set(lost)
    reqs = list(getattr(batch, "reqs", None) or [])
    gone = [i for i, r in enumerate(reqs) if r.rid in lost and not r.finished()]
    retracted = [reqs[i] for i in gone]
    if gone:
        for n, i in enumerate(gone):  # release_req reads batch.reqs[i]: before filter_batch
            batch.release_req(i, len(gone) - n - 1, scheduler.server_args)
        drop = set(gone)
        batch.filter_batch(keep_indices=[i for i in range(len(reqs)) if i not in drop])
        batch.batch_is_full = False
    staging = [r for r in getattr(coord, "lost_staging", []) if r.rid in lost]
    if staging:
        module = importlib.import_module("sglang.srt.managers.schedule_batch")
        release = getattr(module, "release_req", None)
        if release is None:
            raise UnsupportedSGLang("hisparse's SGLang plugin: a request lost while staging needs "
                                    "sglang.srt.managers.schedule_batch.release_req, which this sglang lacks")
        for req in staging:
            release(req=req, remaing_req_count=0, server_args=scheduler.server_args,
                    req_to_token_pool=scheduler.req_to_token_pool,
                    token_to_kv_pool_allocator=scheduler.token_to_kv_pool_allocator, tree_cache=scheduler.tree_cache,
                    hisparse_coordinator=coord)
        retracted += staging
    for req in retracted:
        scheduler._add_request_to_queue(req, is_retracted=True)
    return retracted


def ride_through_hook(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND Scheduler.get_next_batch_to_run: before SGLang builds the step's batch, a coordinator
    whose daemon went away recovers, and what it lost is retracted (retract_lost)."""
    coord = getattr(scheduler, "hisparse_coordinator", None)
    ride = getattr(coord, "ride_through", None)
    if ride is not None:
        lost = ride()
        if lost:
            retract_lost(scheduler, coord, _running_batch(scheduler, args, kwargs), lost)
    return original(scheduler, *args, **kwargs)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point (SGLang's load_plugins calls it with no argument)."""
    check_sglang()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .sglang import HisparsedCoordinator

    HookRegistry.register(TARGET, HisparsedCoordinator, HookType.REPLACE)
    HookRegistry.register(SCHEDULER_TARGET, ride_through_hook, HookType.AROUND)
    upstream = importlib.import_module(TARGET.rsplit(".", 1)[0])
    if hasattr(upstream, MTP_TARGET.rsplit(".", 1)[1]):
        from .sglang_mtp import HisparsedMTPCoordinator

        HookRegistry.register(MTP_TARGET, HisparsedMTPCoordinator, HookType.REPLACE)

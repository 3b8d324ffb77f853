"""hisparse's SGLang plugin loads from the installed package's entry points and refuses an SGLang
it does not support.

The package is built into a wheel by its own backend and installed into a temporary target; a
stand-in SGLang beside it has what the plugin touches, mirroring sgl-project/sglang's
python/sglang/srt/plugins/__init__.py (load_plugins: every ``sglang.srt.plugins`` entry point
loaded and called, an exception logged and skipped) and plugins/hook_registry.py
(HookRegistry.register(target, hook, hook_type), HookType.REPLACE), plus the classes whose
methods the guard checks. Each case runs in a fresh interpreter, as SGLang's scheduler process.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import pytest
from conftest import INSTALLED, PACKAGE_ROOT, child_env

CLIENT = pathlib.Path(__file__).resolve().parents[2] / "client" / "python"

FAKE_SGLANG = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/plugins/__init__.py": '''
        import logging
        from importlib.metadata import entry_points
        from sglang.srt.plugins.hook_registry import HookRegistry
        logger = logging.getLogger(__name__)
        FAILED = []
        def load_plugins():
            for ep in entry_points(group="sglang.srt.plugins"):
                try:
                    ep.load()()
                except Exception as e:  # upstream: logger.exception, and on to the next plugin
                    FAILED.append((ep.name, str(e)))
                    logger.exception("Failed to execute general plugin: %s", ep.name)
            HookRegistry.apply_hooks()
    ''',
    "sglang/srt/plugins/hook_registry.py": '''
        import enum
        class HookType(enum.Enum):
            BEFORE = "before"
            AFTER = "after"
            AROUND = "around"
            REPLACE = "replace"
        class HookRegistry:
            registered = []
            @classmethod
            def register(cls, target, hook, hook_type=HookType.AFTER, *, source=None):
                if isinstance(hook, type) and hook_type != HookType.REPLACE:
                    raise TypeError("a class hook must be REPLACE")
                cls.registered.append((target, hook, hook_type))
            @classmethod
            def apply_hooks(cls):
                import functools, pkgutil
                for target, hook, kind in cls.registered:
                    mod, name = target.rsplit(".", 1)
                    owner = pkgutil.resolve_name(mod)
                    if kind == HookType.AROUND:  # upstream: hook(original, *args, **kwargs)
                        original = getattr(owner, name)
                        hook = functools.wraps(original)(
                            lambda *a, _h=hook, _o=original, **kw: _h(_o, *a, **kw))
                    setattr(owner, name, hook)
    ''',
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/hisparse_coordinator.py": '''
        class HiSparseCoordinator:
            def wait_for_pending_backup(self): pass
            def map_last_loc_to_buffer(self, *a): pass
            def admit_request_direct(self, req): pass
            def swap_in_selected_pages(self, *a): pass
    ''',
    "sglang/srt/managers/scheduler.py": '''
        class Scheduler:
            def get_next_batch_to_run(self, running_batch=None, last_batch=None): return "ran"
            def _add_request_to_queue(self, req, is_retracted=False): pass
    ''',
    "sglang/srt/managers/schedule_batch.py": '''
        class ScheduleBatch:
            def release_req(self, idx, remaing_req_count, server_args): pass
            def filter_batch(self, chunked_req_to_exclude=None, keep_indices=None): pass
    ''',
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/mem_cache/allocator/__init__.py": "",
    "sglang/srt/mem_cache/allocator/hisparse.py": '''
        class HiSparseTokenToKVPoolAllocator:
            def alloc_device_buffer(self, allocated, need_size): pass
            def free_hisparse_indices(self, idx): pass
    ''',
}

PROBE = '''
import json, sys
from sglang.srt.plugins import load_plugins, FAILED
from sglang.srt.plugins.hook_registry import HookRegistry
import sglang.srt.managers.hisparse_coordinator as hc
import sglang.srt.managers.scheduler as sch
load_plugins()
print(json.dumps({"failed": FAILED, "registered": [t for t, _, _ in HookRegistry.registered],
                  "coordinator": hc.HiSparseCoordinator.__module__ + "." + hc.HiSparseCoordinator.__name__,
                  "next_batch": sch.Scheduler().get_next_batch_to_run(running_batch=None)}))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Where the hisparse distribution under test is installed: with HISPARSE_INSTALLED=1 the one
    this interpreter imports (the wheel's site-packages); else the package's wheel, built by its
    own backend from the source tree, installed into a temporary target."""
    if INSTALLED:
        return PACKAGE_ROOT
    tmp = tmp_path_factory.mktemp("wheel")
    spec = importlib.util.spec_from_file_location("hisparse_build_plugin_test", CLIENT / "build_backend" / "hisparse_build.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    name = backend.build_wheel(str(tmp))
    target = tmp / "target"
    zipfile.ZipFile(tmp / name).extractall(target)  # a pure wheel installs by unpacking
    return target


def _fake_sglang(root: pathlib.Path, version: str, drop: str = "") -> pathlib.Path:
    for rel, text in FAKE_SGLANG.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = textwrap.dedent(text)
        if drop:
            text = "\n".join(line for line in text.splitlines() if f"def {drop}(" not in line)
        path.write_text(text)
    info = root / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return root


def _probe(installed: pathlib.Path, fake: pathlib.Path, env_extra=None) -> dict:
    # The installed package ahead of the stand-in SGLang, and the rest of this process's path after
    # them (child_env: a torch that lives in another venv stays reachable). An installed wheel is
    # already on this interpreter's own path.
    env = child_env(*([] if INSTALLED else [installed]), fake, PYTHONDONTWRITEBYTECODE="1")
    env.pop("HISPARSE_SGLANG_ALLOW_VERSION", None)
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_installed_package_declares_the_sglang_plugin(installed):
    import importlib.metadata
    dist = [d for d in importlib.metadata.distributions(path=[str(installed)]) if d.metadata["Name"] == "hisparse"]
    eps = [(ep.group, ep.name, ep.value) for ep in dist[0].entry_points]
    assert ("sglang.srt.plugins", "hisparse", "hisparse.integrations.sglang_plugin:register") in eps


def test_a_supported_sglang_loads_the_plugin_and_swaps_the_coordinator(installed, tmp_path):
    pytest.importorskip("torch")
    got = _probe(installed, _fake_sglang(tmp_path, "0.5.10"))
    assert got["failed"] == []
    assert got["registered"] == ["sglang.srt.managers.hisparse_coordinator.HiSparseCoordinator",
                                 "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"]
    assert got["coordinator"] == "hisparse.integrations.sglang.HisparsedCoordinator"
    assert got["next_batch"] == "ran"  # the ride-through hook wraps the scheduler's step and calls it


def test_an_unsupported_sglang_is_refused_with_the_supported_versions_named(installed, tmp_path):
    got = _probe(installed, _fake_sglang(tmp_path, "0.4.6"))
    assert got["registered"] == []
    assert got["coordinator"] == "sglang.srt.managers.hisparse_coordinator.HiSparseCoordinator"
    [(name, message)] = got["failed"]
    assert name == "hisparse"
    assert "sglang 0.4.6 is installed" in message and ">= 0.5.10, < 0.6" in message


def test_a_supported_version_without_the_mechanisms_is_refused(installed, tmp_path):
    got = _probe(installed, _fake_sglang(tmp_path, "0.5.12", drop="wait_for_pending_backup"))
    assert got["registered"] == []
    [(_, message)] = got["failed"]
    assert "HiSparseCoordinator.wait_for_pending_backup" in message


def test_an_operator_may_allow_one_more_version_exactly(installed, tmp_path):
    pytest.importorskip("torch")
    fake = _fake_sglang(tmp_path, "0.6.1")
    got = _probe(installed, fake, {"HISPARSE_SGLANG_ALLOW_VERSION": "0.6.1"})
    assert got["failed"] == [] and len(got["registered"]) == 2
    got = _probe(installed, fake, {"HISPARSE_SGLANG_ALLOW_VERSION": "0.6.2"})
    assert got["registered"] == []

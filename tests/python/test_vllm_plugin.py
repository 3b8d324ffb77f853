"""The vLLM plugin loads from the installed package's entry points, as vLLM loads general plugins,
and refuses an unsupported vLLM with a message naming the supported versions.

The wheel is built from client/python by its in-tree backend and installed into a temporary
target. A stand-in ``vllm`` distribution beside it (a dist-info naming its version, and the one
module the plugin calls) plays the installed vLLM; a fresh interpreter with only those two on its
path then does what vLLM does at start: vllm/plugins/__init__.py @ 01425553,
load_plugins_by_group (importlib.metadata.entry_points(group="vllm.general_plugins"), each
plugin.load()) and load_general_plugins (each loaded function called with no argument, an
exception propagating), and the plugin registers with a KVConnectorFactory stand-in whose
register_connector(name, module_path, class_name) keeps a lazy loader as
vllm/distributed/kv_transfer/kv_connector/factory.py does (the copies read here all agree).
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import pytest
from conftest import INSTALLED, PACKAGE_ROOT, child_env

CLIENT = pathlib.Path(__file__).resolve().parents[2] / "client" / "python"

FACTORY = '''
import importlib


class KVConnectorFactory:
    _registry = {}

    @classmethod
    def register_connector(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")

        def loader():
            return getattr(importlib.import_module(module_path), class_name)
        cls._registry[name] = loader
'''

VLLM_START = '''
import importlib.metadata, json, sys
found = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins")]
funcs = {ep.name: ep.load() for ep in found}  # load_plugins_by_group
for f in funcs.values():  # load_general_plugins
    f()
for f in funcs.values():  # "plugins can be loaded for multiple times"
    f()
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
cls = KVConnectorFactory._registry["HisparsedConnector"]()
import hisparse
print(json.dumps({"plugins": [(ep.name, ep.value) for ep in found], "connector": cls.__module__ + "." + cls.__name__,
                  "hisparse_from": hisparse.__file__}))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Where the hisparse distribution under test is installed: with HISPARSE_INSTALLED=1 the one
    this interpreter imports (the wheel's site-packages); else the hisparse wheel, built from the
    source tree, installed into a target folder (unpacked, as pip does a pure wheel)."""
    if INSTALLED:
        return PACKAGE_ROOT
    tmp = tmp_path_factory.mktemp("wheel")
    spec = importlib.util.spec_from_file_location("hisparse_build_plugin_test", CLIENT / "build_backend" /
                                                  "hisparse_build.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    name = backend.build_wheel(str(tmp))
    target = tmp / "site"
    zipfile.ZipFile(tmp / name).extractall(target)
    return target


def _fake_vllm(root: pathlib.Path, version: str) -> pathlib.Path:
    pkg = root / "vllm" / "distributed" / "kv_transfer" / "kv_connector"
    pkg.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "distributed", root / "vllm" / "distributed" / "kv_transfer", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "factory.py").write_text(FACTORY)
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root


def _start_vllm(installed: pathlib.Path, vllm_root: pathlib.Path):
    # The installed package ahead of the stand-in vLLM, then the rest of this process's path
    # (child_env); an installed wheel is already on this interpreter's own path.
    env = child_env(*([] if INSTALLED else [installed]), vllm_root, PYTHONNOUSERSITE="1")
    env.pop("HISPARSE_VLLM_ALLOW_UNSUPPORTED", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(VLLM_START)], capture_output=True, text=True,
                          env=env, cwd=str(vllm_root))


def test_the_plugin_loads_from_the_installed_entry_points(installed, tmp_path):
    import json
    p = _start_vllm(installed, _fake_vllm(tmp_path, "0.30.0"))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert ["hisparse", "hisparse.integrations.vllm.plugin:register"] in got["plugins"]
    assert got["connector"] == "hisparse.integrations.vllm.connector.HisparsedConnector"
    assert pathlib.Path(got["hisparse_from"]).resolve().is_relative_to(installed.resolve())


def test_an_unsupported_vllm_is_refused_at_start(installed, tmp_path):
    p = _start_vllm(installed, _fake_vllm(tmp_path, "0.29.2"))
    assert p.returncode != 0
    assert "UnsupportedVllmVersion" in p.stderr
    assert "supports vLLM 0.30.x; the installed vLLM is 0.29.2" in p.stderr


@pytest.mark.parametrize("version", ["0.30.0", "0.30.2", "0.30.1.dev41+g023979d6", "v0.30.0rc1"])
def test_supported_versions_pass_the_guard(version):
    from hisparse.integrations.vllm.version import check_supported_vllm
    assert check_supported_vllm(version) == version


@pytest.mark.parametrize("version", ["0.29.9", "0.31.0", "1.30.0", "garbage"])
def test_other_versions_are_refused_with_the_supported_ones_named(version, monkeypatch):
    from hisparse.integrations.vllm.version import UnsupportedVllmVersion, check_supported_vllm
    monkeypatch.delenv("HISPARSE_VLLM_ALLOW_UNSUPPORTED", raising=False)
    with pytest.raises(UnsupportedVllmVersion, match=r"supports vLLM 0\.30\.x; the installed vLLM is "):
        check_supported_vllm(version)
    monkeypatch.setenv("HISPARSE_VLLM_ALLOW_UNSUPPORTED", "1")
    assert check_supported_vllm(version) == version


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The in-tree build backend (client/python/build_backend/hisparse_build.py) ships pyproject's
[project.entry-points] in the wheel, so an engine that looks plugins up with
importlib.metadata.entry_points(group=...) finds them in the installed package.

Each test builds from a copy of client/python whose pyproject.toml gains an entry-points table of
its own, so what is checked does not depend on which plugins the real pyproject declares. Needs
no daemon and no library.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

CLIENT = pathlib.Path(__file__).resolve().parents[2] / "client" / "python"

EXTRA = '''
[project.entry-points."hisparse.test_group"]
first = "hisparse.integrations:first"
second = "hisparse.integrations.sglang:second"

[project.entry-points.other_group]
only = "hisparse:only"
'''

WANT = {
    ("hisparse.test_group", "first", "hisparse.integrations:first"),
    ("hisparse.test_group", "second", "hisparse.integrations.sglang:second"),
    ("other_group", "only", "hisparse:only"),
}


def _backend_copy(tmp_path: pathlib.Path, parse_without_tomllib: bool = False):
    """A copy of client/python with EXTRA appended to pyproject.toml; its backend module, loaded
    from the copy (the backend finds the tree from its own __file__)."""
    tree = tmp_path / "src"
    shutil.copytree(CLIENT, tree, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    (tree / "pyproject.toml").write_text((tree / "pyproject.toml").read_text() + EXTRA)
    spec = importlib.util.spec_from_file_location(f"hisparse_build_{tmp_path.name}",
                                                  tree / "build_backend" / "hisparse_build.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    if parse_without_tomllib:
        original = backend._project

        def project_without_tomllib():
            p = original()
            p["entry-points"] = backend._entry_points_without_tomllib((tree / "pyproject.toml").read_text())
            return p
        backend._project = project_without_tomllib
    return backend


def _installed_entry_points(target: pathlib.Path):
    dists = [d for d in importlib.metadata.distributions(path=[str(target)]) if d.metadata["Name"] == "hisparse"]
    assert len(dists) == 1, [d.metadata["Name"] for d in dists]
    return {(ep.group, ep.name, ep.value) for ep in dists[0].entry_points}


def test_wheel_installed_into_a_target_lists_the_entry_points(tmp_path):
    backend = _backend_copy(tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name = backend.build_wheel(str(wheels))
    target = tmp_path / "target"
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if pip.returncode == 0:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                        "--target", str(target), str(wheels / name)], check=True)
    else:  # a pure wheel installs by unpacking (what pip does for Root-Is-Purelib)
        zipfile.ZipFile(wheels / name).extractall(target)
    assert _installed_entry_points(target) >= WANT  # and the real pyproject's own
    # And the group lookup an engine makes finds them, with the installed copy on the path.
    sys.path.insert(0, str(target))
    try:
        found = importlib.metadata.entry_points(group="hisparse.test_group")
        assert {(ep.name, ep.value) for ep in found} >= {("first", "hisparse.integrations:first"),
                                                         ("second", "hisparse.integrations.sglang:second")}
    finally:
        sys.path.remove(str(target))


def test_editable_wheel_lists_the_entry_points(tmp_path):
    backend = _backend_copy(tmp_path)
    name = backend.build_editable(str(tmp_path))
    target = tmp_path / "target"
    zipfile.ZipFile(tmp_path / name).extractall(target)
    assert _installed_entry_points(target) >= WANT  # and the real pyproject's own


def test_the_fallback_parser_for_pythons_without_tomllib_reads_the_same_table(tmp_path):
    backend = _backend_copy(tmp_path, parse_without_tomllib=True)
    name = backend.build_wheel(str(tmp_path))
    target = tmp_path / "target"
    zipfile.ZipFile(tmp_path / name).extractall(target)
    assert _installed_entry_points(target) >= WANT  # and the real pyproject's own


def test_the_sdist_carries_the_table_a_wheel_built_from_it_writes(tmp_path):
    import tarfile
    backend = _backend_copy(tmp_path)
    name = backend.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as tar:
        pyproject = next(m for m in tar.getmembers() if m.name.endswith("/pyproject.toml"))
        text = tar.extractfile(pyproject).read().decode()
    groups = backend._entry_points_without_tomllib(text)
    assert groups["hisparse.test_group"] == {"first": "hisparse.integrations:first",
                                             "second": "hisparse.integrations.sglang:second"}
    assert groups["other_group"] == {"only": "hisparse:only"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""A PEP 517 / PEP 660 build backend for the pure-Python `hisparse` package, stdlib only.

Why not setuptools: pip builds in an isolated environment and installs the backend's requirements
there from an index, even when setuptools is already installed, so `pip install client/python`
with setuptools as the backend fails on a machine without index access. With this backend the
build needs nothing but the standard library, so the plain command works offline, with or
without --no-build-isolation.

It writes a py3-none-any wheel with every file under hisparse/, an sdist, and an editable wheel
holding a .pth that points at this source tree. tools/build-wheel.sh places the self-contained
libhisparse.so under hisparse/ and asks for a platform tag (config setting platform-tag).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import pathlib
import tarfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "hisparse"


def _version() -> str:
    """hisparse/__init__.py's __version__ (pyproject.toml declares the version dynamic)."""
    for line in (ROOT / PACKAGE / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError("hisparse/__init__.py has no __version__ line")


def _project() -> dict:
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        tomllib = None
    if tomllib is not None:
        with open(ROOT / "pyproject.toml", "rb") as f:
            project = tomllib.load(f)["project"]
        project["version"] = _version()
        return project
    # Python < 3.11: name and version are all that must be exact.
    return {"name": PACKAGE, "version": _version(), "description": "", "requires-python": ">=3.9"}


def _metadata(p: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    if isinstance(p.get("license"), dict) and p["license"].get("text"):
        lines.append(f"License: {p['license']['text']}")
    for extra, reqs in (p.get("optional-dependencies") or {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines.extend(f"Requires-Dist: {r}; extra == \"{extra}\"" for r in reqs)
    readme = ROOT / "README.md"
    body = readme.read_text() if readme.exists() else ""
    if body:
        lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body


def _package_files():
    for path in sorted((ROOT / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path.relative_to(ROOT).as_posix(), path.read_bytes()


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _platform(config_settings, entries) -> str:
    """The wheel's platform tag: "any" for the pure package. A wheel that carries libhisparse.so
    must say which systems can load it: tools/build-wheel.sh passes
    --config-settings platform-tag=manylinux_2_NN_x86_64, NN from the library's newest GLIBC_
    symbol version (PEP 600)."""
    tag = (config_settings or {}).get("platform-tag", "any")
    if tag == "any" and any(path.endswith(".so") or ".so." in path for path, _ in entries):
        raise RuntimeError("hisparse/ holds a shared library: build with tools/build-wheel.sh, which tags the wheel "
                           "for the glibc the library needs")
    return tag


def _write_wheel(directory: str, files, config_settings=None) -> str:
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    entries = list(files)
    plat = _platform(config_settings, entries)
    name = f"{dist}-py3-none-{plat}.whl"
    info = f"{dist}.dist-info"
    entries.append((f"{info}/METADATA", _metadata(p).encode()))
    entries.append((f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: hisparse_build\n"
                                     f"Root-Is-Purelib: {'true' if plat == 'any' else 'false'}\n"
                                     f"Tag: py3-none-{plat}\n".encode()))
    entries.append((f"{info}/top_level.txt", f"{PACKAGE}\n".encode()))
    record = "".join(f"{path},{_digest(data)},{len(data)}\n" for path, data in entries)
    record += f"{info}/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries:
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", record)
    return name


# ---- PEP 517 ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files(), config_settings)


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    name = f"{dist}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "build_backend/hisparse_build.py"]:
            if (ROOT / rel).exists():
                tar.add(ROOT / rel, arcname=f"{dist}/{rel}")
        for rel, _ in _package_files():
            tar.add(ROOT / rel, arcname=f"{dist}/{rel}")
        data = _metadata(p).encode()
        ti = tarfile.TarInfo(f"{dist}/PKG-INFO")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    return name


# ---- PEP 660 (pip install -e) ----

def get_requires_for_build_editable(config_settings=None):
    return []


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth", f"{ROOT}\n".encode())])

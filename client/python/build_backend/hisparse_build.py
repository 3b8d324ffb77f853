"""A PEP 517 / PEP 660 build backend for the pure-Python `hisparse` package, stdlib only.

Why not setuptools: pip builds in an isolated environment and installs the backend's requirements
there from an index, even when setuptools is already installed, so `pip install client/python`
with setuptools as the backend fails on a machine without index access. With this backend the
build needs nothing but the standard library, so the plain command works offline, with or
without --no-build-isolation.

It writes a py3-none-any wheel with every file under hisparse/, an sdist, and an editable wheel
holding a .pth that points at this source tree. tools/build-wheel.sh places the self-contained
libhisparse.so under hisparse/ and the self-contained hisparse-ctl under scripts/ (the wheel's
<dist>.data/scripts/, which pip installs into the environment's bin/), and asks for a platform tag
(config setting platform-tag). Both
wheels carry pyproject's [project.entry-points] as dist-info/entry_points.txt, which is how the
engines find the plugins (importlib.metadata.entry_points(group=...)); the sdist carries
pyproject.toml itself, from which a wheel built out of it writes the same file.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import pathlib
import re
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
    # Python < 3.11: name, version and the entry points are all that must be exact.
    return {"name": PACKAGE, "version": _version(), "description": "", "requires-python": ">=3.9",
            "entry-points": _entry_points_without_tomllib((ROOT / "pyproject.toml").read_text())}


def _entry_points_without_tomllib(text: str) -> dict:
    """The [project.entry-points."group"] tables of pyproject.toml, for Pythons without tomllib:
    only the form this project writes (a quoted or bare group name, `name = "module:attr"` lines)."""
    groups: dict = {}
    current = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = re.fullmatch(r"\[project\.entry-points\.(?:\"([^\"]+)\"|([A-Za-z0-9_.-]+))\]", line)
        if header:
            current = groups.setdefault(header.group(1) or header.group(2), {})
        elif line.startswith("["):
            current = None
        elif current is not None and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            current[key.strip("\"'")] = value.strip("\"'")
    return groups


def _entry_points_txt(p: dict) -> str:
    """dist-info/entry_points.txt (the packaging spec's INI form) from [project.entry-points];
    empty when there are none. [project.scripts] would go under console_scripts: there are none."""
    out = []
    for group, entries in sorted((p.get("entry-points") or {}).items()):
        out.append(f"[{group}]")
        out.extend(f"{name} = {target}" for name, target in sorted(entries.items()))
        out.append("")
    return "\n".join(out)


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


def _script_files():
    """scripts/*: executables that pip installs into the environment's bin/ (tools/build-wheel.sh
    stages hisparse-ctl there; the source tree has none)."""
    scripts = ROOT / "scripts"
    if scripts.is_dir():
        for path in sorted(scripts.iterdir()):
            if path.is_file():
                yield path.name, path.read_bytes()


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _platform(config_settings, entries) -> str:
    """The wheel's platform tag: "any" for the pure package. A wheel that carries libhisparse.so
    must say which systems can load it: tools/build-wheel.sh passes
    --config-settings platform-tag=manylinux_2_NN_x86_64, NN from the library's newest GLIBC_
    symbol version (PEP 600)."""
    tag = (config_settings or {}).get("platform-tag", "any")
    if tag == "any" and any(path.endswith(".so") or ".so." in path or data[:4] == b"\x7fELF" for path, data in entries):
        raise RuntimeError("the wheel would carry a native library or executable: build with tools/build-wheel.sh, "
                           "which tags the wheel for the glibc they need")
    return tag


def _write_wheel(directory: str, files, config_settings=None, scripts=()) -> str:
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    entries = list(files)
    executable = {f"{dist}.data/scripts/{name}" for name, _ in scripts}
    entries.extend((f"{dist}.data/scripts/{name}", data) for name, data in scripts)
    plat = _platform(config_settings, entries)
    name = f"{dist}-py3-none-{plat}.whl"
    info = f"{dist}.dist-info"
    entries.append((f"{info}/METADATA", _metadata(p).encode()))
    entries.append((f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: hisparse_build\n"
                                     f"Root-Is-Purelib: {'true' if plat == 'any' else 'false'}\n"
                                     f"Tag: py3-none-{plat}\n".encode()))
    entries.append((f"{info}/top_level.txt", f"{PACKAGE}\n".encode()))
    entry_points = _entry_points_txt(p)
    if entry_points:
        entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    record = "".join(f"{path},{_digest(data)},{len(data)}\n" for path, data in entries)
    record += f"{info}/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in [*entries, (f"{info}/RECORD", record.encode())]:
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            # pip makes every script executable; the mode bits say so to any other unpacker.
            zi.external_attr = (0o100755 if path in executable else 0o100644) << 16
            z.writestr(zi, data)
    return name


# ---- PEP 517 ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files(), config_settings, list(_script_files()))


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

"""One release, and one package, whichever way the tests run (issue 40).

hisparse.__version__, the hisparsed these tests drive and hisparse-ctl say the same version: with
HISPARSE_INSTALLED=1 the hisparse-ctl is the wheel's, which pip put in this interpreter's scripts
folder (the venv's bin/); from the source tree it is the one built beside hisparsed. And a Python
child that a test starts (sys.executable with conftest.child_env(), or multiprocessing's spawn)
imports the same package and loads the same library as the test itself: from the wheel when
installed, never from the source tree.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pathlib
import subprocess
import sys
import sysconfig

import pytest
from conftest import INSTALLED, _daemon_or_skip, _library_or_skip, child_env

import hisparse


def _version_of(exe: str) -> str:
    return subprocess.run([exe, "--version"], check=True, capture_output=True, text=True, timeout=30).stdout.strip()


def _ctl() -> str:
    if INSTALLED:
        ctl = pathlib.Path(sysconfig.get_path("scripts")) / "hisparse-ctl"
        assert ctl.is_file(), f"the installed wheel put no hisparse-ctl in {ctl.parent}"
        return str(ctl)
    ctl = pathlib.Path(hisparse.find_daemon_binary()).parent / "hisparse-ctl"
    if not ctl.is_file():
        pytest.skip(f"hisparse-ctl not built beside hisparsed ({ctl})")
    return str(ctl)


def test_the_package_the_daemon_and_hisparse_ctl_say_one_version():
    _daemon_or_skip()
    assert _version_of(hisparse.find_daemon_binary()) == f"hisparsed {hisparse.__version__}"
    assert _version_of(_ctl()) == f"hisparse-ctl {hisparse.__version__}"


def test_the_installed_hisparse_ctl_reads_the_daemon(daemon):
    """The wheel's hisparse-ctl runs from the venv with nothing on LD_LIBRARY_PATH (it needs only
    glibc) and reads the daemon the tests drive."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    out = subprocess.run([_ctl(), "--daemon", daemon.address, "status"], capture_output=True, text=True, env=env,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert "SERVING" in out.stdout and hisparse.__version__ in out.stdout, out.stdout


def _where() -> tuple:
    import hisparse as h
    return os.path.realpath(h.__file__), os.path.realpath(h.library_path())


WHERE = "import os, hisparse; print(os.path.realpath(hisparse.__file__)); print(os.path.realpath(hisparse.library_path()))"


def test_a_child_process_imports_the_package_and_library_the_test_does(tmp_path):
    _library_or_skip()
    here = _where()
    out = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, env=child_env(),
                         cwd=str(tmp_path), timeout=60)
    assert out.returncode == 0, out.stderr
    assert tuple(out.stdout.split()) == here
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_where) == here
    if INSTALLED:
        assert not pathlib.Path(here[0]).is_relative_to(pathlib.Path(__file__).resolve().parents[2] / "client")

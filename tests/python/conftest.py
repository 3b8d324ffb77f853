"""Fixtures for the Python client tests: a real hisparsed per test module, sessions on it.

The package is imported from the source tree (client/python), ahead of any installed copy, unless
HISPARSE_INSTALLED=1 asks for the installed one (a wheel's, which finds its own library). The
library and daemon come from $HISPARSE_LIB / $HISPARSE_DAEMON_BIN (ctest sets both), else the
package's own search (the source tree's build/). When neither is found and no variable names
them, the tests are skipped with the reason; a variable that names a missing file fails them
instead. A Python child that a test starts runs sys.executable with child_env(): the same
package, found the same way, in either mode.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# HISPARSE_INSTALLED=1: test the installed package (a wheel in a venv, with its own library)
# instead of the source tree's.
INSTALLED = os.environ.get("HISPARSE_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(REPO / "examples" / "engine"))

import hisparse  # noqa: E402

if INSTALLED and pathlib.Path(hisparse.__file__).resolve().is_relative_to(REPO / "client"):
    raise ImportError(f"HISPARSE_INSTALLED=1 but hisparse comes from the source tree ({hisparse.__file__})")
SOURCE_PACKAGE_ROOT = REPO / "client" / "python"
# Where the package the tests import was found: the source tree's client/python, or (installed)
# the site-packages folder that holds the wheel's hisparse and its dist-info.
PACKAGE_ROOT = pathlib.Path(hisparse.__file__).resolve().parent.parent


def child_env(*prepend, **overrides) -> dict:
    """The environment of a Python child a test starts (with sys.executable, always): this
    process's environment, with PYTHONPATH = PREPEND, then (source-tree mode) the source tree's
    client/python, then the PYTHONPATH this process was given (a torch or pytest that lives
    elsewhere stays reachable). With HISPARSE_INSTALLED=1 the source tree is never added: the child
    finds the installed package the way this interpreter does, and HISPARSE_INSTALLED passes on so
    that the examples and benchmarks it runs do not add the tree either. OVERRIDES are set last."""
    paths = [str(p) for p in prepend]
    if not INSTALLED:
        paths.append(str(SOURCE_PACKAGE_ROOT))
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.update(overrides)
    return env


def bench_module(name: str):
    """bench/NAME.py (a script beside the benchmarks, not a package), loaded as module NAME."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _source_tree_on_path() -> list:
    src = os.path.realpath(SOURCE_PACKAGE_ROOT)
    return [p for p in sys.path if p and os.path.realpath(p) == src]


@pytest.fixture(autouse=True)
def _installed_mode_keeps_the_source_tree_off_the_path():
    """HISPARSE_INSTALLED=1: no test, and nothing a test imports (an example or benchmark that
    puts client/python on sys.path), leaves the source tree where a child process started with
    multiprocessing's spawn, which inherits sys.path, would import it instead of the wheel."""
    yield
    if INSTALLED:
        bad = _source_tree_on_path()
        assert not bad, f"HISPARSE_INSTALLED=1 but the source tree is on sys.path: {bad}"


def _library_or_skip() -> None:
    try:
        hisparse.library_path()
    except OSError as e:
        if os.environ.get("HISPARSE_LIB"):
            raise
        pytest.skip(f"libhisparse not built: {e}", allow_module_level=True)


def _daemon_or_skip() -> None:
    try:
        hisparse.find_daemon_binary()
    except hisparse.NotFound as e:
        if os.environ.get("HISPARSE_DAEMON_BIN"):
            raise
        pytest.skip(f"hisparsed not built: {e}", allow_module_level=True)


@pytest.fixture(scope="module")
def daemon():
    _library_or_skip()
    _daemon_or_skip()
    # Imports on (off by default, docs/DESIGN.md "Import"): test_import.py drives them.
    with hisparse.Daemon(host_pool_size="256MiB", host_pool_slab_size="16MiB",
                         extra_args=["--set", "import.enabled=true"]) as d:
        yield d


@pytest.fixture(scope="module")
def import_daemon():
    """A small pool of 4 KiB host pages (64 records of 64 bytes, as hisparse-bench import's
    records are) with imports on: the adapters' P/D import tests."""
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB", "--set", "import.enabled=true"]) as d:
        yield d


@pytest.fixture(scope="module")
def small_page_daemon():
    """A small pool of 4 KiB host pages (64 records of 64 bytes a page), imports off: the tests of
    what pages hold (TP groups, parking and shared prefixes)."""
    _library_or_skip()
    _daemon_or_skip()
    with hisparse.Daemon(host_pool_size="64MiB", host_pool_slab_size="4MiB",
                         extra_args=["--host-pool-page-size", "4KiB"]) as d:
        yield d


@pytest.fixture
def open_session(daemon):
    """open_session(**geometry) -> Session on the module's daemon (host backend unless told);
    every session it opened is closed at the end of the test."""
    opened = []

    def _open(**kw):
        kw.setdefault("num_layers", 2)
        kw.setdefault("record_bytes", 64)
        kw.setdefault("k", 4)
        kw.setdefault("slots", 8)
        kw.setdefault("max_requests", 4)
        kw.setdefault("backend", "host")
        s = hisparse.Session(daemon, **kw)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


def wait_for(predicate, timeout_s: float = 5.0, what: str = "condition"):
    """Polls predicate() until it returns a truthy value or timeout_s passes (the daemon ends a
    closed session asynchronously, within milliseconds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            assert value, f"timed out waiting for {what}"
            return value
        time.sleep(0.01)


class Keeper:
    """hisparse-keeper running hisparsed on a private socket (the fd store a service manager keeps,
    so the daemon's durable requests survive its restart); the daemon's pid from its pid file."""

    def __init__(self, folder: pathlib.Path) -> None:
        daemon = pathlib.Path(hisparse.find_daemon_binary())
        keeper = daemon.parent / "hisparse-keeper"
        if not os.access(keeper, os.X_OK):
            pytest.skip(f"hisparse-keeper is not built beside {daemon}")
        self.folder = folder
        self.address = f"unix:{folder}/d.sock"
        self.log = open(folder / "keeper.log", "w")
        self.proc = subprocess.Popen(
            [str(keeper), "--restart-delay-ms", "50", "--child-pid-file", str(folder / "pid"), "--", str(daemon),
             "--listen", self.address, "--metrics-listen", "", "--host-pool-size", "64MiB",
             "--host-pool-page-size", "4KiB", "--host-pool-slab-size", "1MiB"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.daemon_pid() > 0 and os.path.exists(f"{folder}/d.sock.fd"), timeout_s=20,
                 what="the daemon under the keeper")

    def daemon_pid(self) -> int:
        try:
            return int((self.folder / "pid").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def sigkill_daemon(self) -> int:
        """SIGKILLs the keeper's daemon of now; returns its pid. A pid file that names none fails the
        test: os.kill(0) would signal pytest's own process group."""
        old = self.daemon_pid()
        assert old > 0, f"{self.folder}/pid names no daemon"
        os.kill(old, signal.SIGKILL)
        return old

    def kill_daemon(self) -> None:
        """SIGKILLs the daemon and waits until the keeper started the next one."""
        old = self.sigkill_daemon()
        wait_for(lambda: self.daemon_pid() not in (0, old), timeout_s=20, what="the keeper to start the daemon again")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)
        self.log.close()


@pytest.fixture
def keeper():
    _library_or_skip()
    _daemon_or_skip()
    with tempfile.TemporaryDirectory(prefix="hs-ride-") as folder:
        k = Keeper(pathlib.Path(folder))
        try:
            yield k
        finally:
            k.stop()

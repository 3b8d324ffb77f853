"""Daemon: a hisparsed child process on a temporary unix socket, for tests and notebooks.

Production nodes run one hisparsed under systemd or a DaemonSet and sessions attach to its
socket; this class is for everywhere else. The binary is found via $HISPARSE_DAEMON_BIN, else
``hisparsed`` on PATH, else the source tree's build (client/python/../../build/bin/hisparsed).

    with hisparse.Daemon(host_pool_size="1GiB") as d:
        with hisparse.Session(d.address, num_layers=4, record_bytes=656, k=256, slots=512,
                              max_requests=8) as s:
            ...

The daemon is ready when both its gRPC socket and its fd-passing socket (PATH.fd) accept
connections. Its Prometheus endpoint is off unless metrics_listen names HOST:PORT (None: the
daemon's default). stop() sends SIGTERM, waits up to 5 s, then SIGKILLs. Not thread-safe.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import List, Optional, Sequence

from .errors import NotFound, Unavailable


def find_daemon_binary() -> str:
    """Path of hisparsed: $HISPARSE_DAEMON_BIN, PATH, or <repo>/build/bin/hisparsed."""
    env = os.environ.get("HISPARSE_DAEMON_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise NotFound(f"HISPARSE_DAEMON_BIN={env} is not an executable file")
        return env
    on_path = shutil.which("hisparsed")
    if on_path:
        return on_path
    repo = pathlib.Path(__file__).resolve().parent.parent.parent.parent
    built = repo / "build" / "bin" / "hisparsed"
    if os.access(built, os.X_OK):
        return str(built)
    raise NotFound("cannot find hisparsed: set HISPARSE_DAEMON_BIN, put it on PATH, or build it with "
                   f"`cmake --build build --target hisparsed` (looked for {built})")


def _can_connect(path: str, kind: int) -> bool:
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """A hisparsed child process listening on ``unix:<tmpdir>/hisparsed.sock``."""

    def __init__(self, host_pool_size: str = "1GiB", host_pool_slab_size: str = "64MiB",
                 log_level: str = "warning", metrics_listen: Optional[str] = "", extra_args: Sequence[str] = (),
                 binary: Optional[str] = None, start_timeout_s: float = 20.0,
                 host_pool_segment_size: Optional[str] = None) -> None:
        self.host_pool_size = host_pool_size
        # host_pool_segment_size: the segmented pool's name for what is now the largest slab.
        self.host_pool_slab_size = host_pool_segment_size or host_pool_slab_size
        self.log_level = log_level
        self.metrics_listen = metrics_listen
        self.extra_args: List[str] = list(extra_args)
        self.binary = binary
        self.start_timeout_s = start_timeout_s
        self._proc: Optional[subprocess.Popen] = None
        self._dir: Optional[str] = None
        self._socket: Optional[str] = None
        self._log = None

    @property
    def address(self) -> str:
        """``unix:PATH`` for Session(); valid while the daemon runs."""
        if self._socket is None:
            raise Unavailable("the daemon is not running: call start() or use it as a context manager")
        return "unix:" + self._socket

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "Daemon":
        """Starts hisparsed and waits until it accepts connections. Returns self."""
        if self._proc is not None:
            return self
        binary = self.binary or find_daemon_binary()
        self._dir = tempfile.mkdtemp(prefix="hisparse-py-")
        self._socket = os.path.join(self._dir, "hisparsed.sock")
        argv = [binary, "--listen", "unix:" + self._socket, "--host-pool-size", self.host_pool_size,
                "--host-pool-slab-size", self.host_pool_slab_size, "--log-level", self.log_level]
        if self.metrics_listen is not None:
            # "" turns the Prometheus endpoint off, so that several test daemons can share a node.
            argv.append(f"--set=metrics.listen={self.metrics_listen}")
        argv.extend(self.extra_args)
        # The daemon's log goes to a file beside the socket (a pipe nobody reads could fill up).
        self._log = open(os.path.join(self._dir, "hisparsed.log"), "w+b")
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self.log_text().strip()
                code = self._proc.returncode
                self._proc = None
                self._cleanup_dir()
                raise Unavailable(f"hisparsed exited during start (status {code}): {err or 'no message'}")
            if _can_connect(self._socket + ".fd", socket.SOCK_SEQPACKET) and \
                    _can_connect(self._socket, socket.SOCK_STREAM):
                return self
            time.sleep(0.005)
        self.stop()
        raise Unavailable(f"hisparsed did not start listening within {self.start_timeout_s} s")

    def stop(self, timeout_s: float = 5.0) -> Optional[int]:
        """Stops the daemon (SIGTERM, then SIGKILL after timeout_s). Returns its exit status."""
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            code = proc.returncode
        self._cleanup_dir()
        return code

    def log_text(self) -> str:
        """What the daemon has written to stdout/stderr so far ("" once stopped)."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def _cleanup_dir(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self._socket = None

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass

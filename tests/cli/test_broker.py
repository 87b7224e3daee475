"""``aioprod broker``: a foreground broker that Ctrl-C stops cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aioprod.embedded import free_port
from tests.cli.conftest import aioprod, hangups_delivered
from tests.cli.test_embedded import accepts

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def foreground_broker(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``aioprod broker ARGS`` as a child process, killed at the end if still running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aioprod.cli", "broker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serves_until_sigint_then_exits_0() -> None:
    port = free_port()
    with foreground_broker("--port", str(port)) as proc:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # printed once the broker accepts connections
        assert f"listening on 127.0.0.1:{port}" in banner, banner + (proc.stderr.read() if proc.stderr else "")
        result = aioprod("smoke", "-b", f"127.0.0.1:{port}", "-n", "10")
        assert result.exit_code == 0, result.output
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Broker stopped." in out
    assert "Traceback" not in err
    assert not accepts(port)  # the Tansu process went with it


def test_port_in_use_is_a_one_line_failure() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = aioprod("broker", "--port", str(port))
    assert result.exit_code == 1
    assert result.stderr == f"aioprod: error: port {port} on 127.0.0.1 is already in use\n"


def test_tls_and_sasl_broker_prints_the_client_options_but_not_the_password() -> None:
    port = free_port()
    with foreground_broker("--port", str(port), "--tls", "--sasl") as proc:
        assert proc.stdout is not None
        banner = proc.stdout.readline() + proc.stdout.readline()
        assert f"listening on 127.0.0.1:{port}" in banner, banner + (proc.stderr.read() if proc.stderr else "")
        hint = banner.splitlines()[1]
        password_file = hint.split("$(cat ")[1].split(")")[0]
        with open(password_file) as f:
            password = f.read()
        assert password not in banner
        overrides = hint.split(f"-b 127.0.0.1:{port} ")[1].split(" -X sasl.password=")[0].split()
        args = [*overrides, "-X", f"sasl.password={password}"]
        produced = aioprod("produce", "secured", "-b", f"127.0.0.1:{port}", *args, input="x\n")
        assert produced.exit_code == 0, produced.output
        result = aioprod("metadata", "-b", f"127.0.0.1:{port}", "-t", "secured", *args)
        assert result.exit_code == 0, result.output
        assert "secured" in result.stdout and password not in result.output
        wrong = aioprod("metadata", "-b", f"127.0.0.1:{port}", "-t", "secured", *overrides, "-X", "sasl.password=nope")
        assert wrong.exit_code == 1 and "AuthenticationError" in wrong.output and "SCRAM-SHA-512" in wrong.output
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert password not in out + err


def test_help_examples_name_the_port_they_start() -> None:
    """Point 8: each example's smoke command targets the port its broker command listens on."""
    result = aioprod("broker", "--help")
    assert result.exit_code == 0
    lines = [line.strip() for line in result.stdout.splitlines()]
    examples = [line for line in lines if line.startswith("aioprod broker") and "aioprod smoke" in line]
    assert len(examples) >= 2
    for line in examples:
        port = line.split("--port")[1].split()[0] if "--port" in line else "9092"
        assert f"aioprod smoke -b 127.0.0.1:{port}" in line, line


def test_a_secured_broker_that_fails_to_start_leaves_no_key_or_password(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "aioprod.cli", "broker", "--port", str(port), "--tls", "--sasl"],
            env={**os.environ, "TMPDIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode != 0 and "already in use" in run.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


def test_a_hangup_of_a_secured_broker_leaves_no_key_or_password(tmp_path: Path) -> None:
    # SIGHUP (the terminal closed) killed it with its key and SASL password left in the temp dir.
    proc = subprocess.Popen(
        [sys.executable, "-m", "aioprod.cli", "broker", "--port", str(free_port()), "--tls", "--sasl"],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=hangups_delivered,
    )
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        assert sorted(p.name for p in tmp_path.rglob("*")) != []  # its key and password meanwhile
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == []

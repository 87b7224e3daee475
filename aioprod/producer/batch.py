"""A batch of records for one partition, from first append to the broker's answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

from aioprod.errors import KafkaError
from aioprod.protocol.records import RecordBatchBuilder


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where the broker put a record. ``offset`` is -1 when acks=0 (nothing comes back)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


Headers = Sequence[tuple[str, bytes | None]]


class ProducerBatch:
    """Records bound for one partition; owned by the accumulator, then by the sender.

    The batch is built (and compressed) once; a retry re-sends the same bytes with the
    same base sequence, which is what lets the broker recognise a duplicate.
    """

    __slots__ = (
        "attempts",
        "base_sequence",
        "builder",
        "created",
        "deadline",
        "done",
        "futures",
        "in_flight",
        "payload",
        "producer_epoch",
        "producer_id",
        "reserved",
        "retry_at",
        "sent_once",
        "timestamps",
        "tp",
    )

    def __init__(self, tp: TopicPartition, builder: RecordBatchBuilder, now: float, delivery_timeout: float) -> None:
        self.tp = tp
        self.builder = builder
        self.futures: list[asyncio.Future[RecordMetadata]] = []
        #: Resolved once every record has its outcome; what flush() and close() wait on.
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.timestamps: list[int] = []
        self.created = now
        self.deadline = now + delivery_timeout
        self.attempts = 0
        self.retry_at = 0.0
        self.in_flight = False
        self.sent_once = False
        self.reserved = 0  # bytes of buffer_memory this batch holds
        self.payload: bytes | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1

    def __repr__(self) -> str:
        return f"<ProducerBatch {self.tp.topic}-{self.tp.partition} records={len(self.futures)}>"

    @property
    def record_count(self) -> int:
        return len(self.futures)

    def try_append(
        self,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        future: asyncio.Future[RecordMetadata],
    ) -> bool:
        if self.payload is not None or self.builder.append(timestamp, key, value, headers) is None:
            return False
        self.futures.append(future)
        self.timestamps.append(timestamp)
        return True

    def build(self, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool) -> bytes:
        """The wire bytes; rebuilt only if the producer identity changed (epoch bump)."""
        if self.payload is None or (producer_id, producer_epoch, base_sequence) != (
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
        ):
            self.producer_id, self.producer_epoch, self.base_sequence = producer_id, producer_epoch, base_sequence
            self.payload = self.builder.build(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
                is_transactional=transactional,
            )
        return self.payload

    @property
    def size(self) -> int:
        return len(self.payload) if self.payload is not None else self.builder.size_in_bytes

    def succeed(self, base_offset: int, log_append_time: int) -> None:
        tp = self.tp
        for index, (future, ts) in enumerate(zip(self.futures, self.timestamps, strict=True)):
            if not future.done():
                offset = base_offset + index if base_offset >= 0 else -1
                future.set_result(
                    RecordMetadata(tp.topic, tp.partition, offset, log_append_time if log_append_time >= 0 else ts)
                )
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, error: KafkaError) -> None:
        for future in self.futures:
            if not future.done():
                future.set_exception(error)
                # Retrieved here so an unawaited failure never logs "exception was never
                # retrieved"; the user still sees it when awaiting the future.
                future.exception()
        if not self.done.done():
            self.done.set_result(None)

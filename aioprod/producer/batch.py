"""A batch of records for one partition, from first append to the broker's answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any, NamedTuple

from aioprod._compiled import speedups
from aioprod.errors import DeliveryTimeoutError, KafkaError, SendManyError
from aioprod.producer.record_future import BatchFailure, BatchSettlement, RecordMetadata, _metadata
from aioprod.protocol.records import RecordBatchBuilder, read_batch


class TopicPartition(NamedTuple):
    topic: str
    partition: int


Headers = Sequence[tuple[str, bytes | None]]


def _py_metadata_range(
    cls: type[RecordMetadata], topic: str, partition: int, first_offset: int, count: int, timestamp: int
) -> list[RecordMetadata]:
    """One RecordMetadata per acknowledged record of a range (the bulk path's ack cost): made in
    C-level iteration here, or by the compiled twin (aioprod/_speedups.c)."""
    offsets = range(first_offset, first_offset + count) if first_offset >= 0 else repeat(-1, count)
    return list(
        map(
            _metadata,
            repeat(cls, count),
            zip(repeat(topic, count), repeat(partition, count), offsets, repeat(timestamp, count), strict=True),
        )
    )


_metadata_range = _py_metadata_range if speedups is None else speedups.metadata_range


class SendGroup:
    """The records of one ``send_many`` call: one future for all of them.

    Records of a group carry no future of their own; a batch keeps ranges of them and
    reports outcomes here in bulk, which is what makes the bulk path cheap per record.
    """

    __slots__ = ("_error", "_pending", "future", "results", "timestamp", "topic")

    def __init__(self, topic: str, count: int, timestamp: int) -> None:
        self.topic = topic
        self.timestamp = timestamp
        self.results: list[RecordMetadata | BaseException | None] = [None] * count
        self._pending = count
        self._error: BaseException | None = None
        self.future: asyncio.Future[list[RecordMetadata]] = asyncio.get_running_loop().create_future()
        if not count:
            self.future.set_result([])

    def succeeded(self, start: int, count: int, partition: int, first_offset: int, timestamp: int) -> None:
        self.results[start : start + count] = _metadata_range(
            RecordMetadata, self.topic, partition, first_offset, count, timestamp
        )
        self._settle(count)

    def failed(self, start: int, count: int, error: BaseException, errors: list[BaseException] | None = None) -> None:
        """``errors``: each record's own, when they differ (see :class:`BatchFailure`)."""
        self.results[start : start + count] = [error] * count if errors is None else errors
        if self._error is None:
            self._error = error
        self._settle(count)

    def truncate(self, count: int) -> None:
        """Only the first ``count`` records were queued (a later one was refused)."""
        self._pending -= len(self.results) - count
        del self.results[count:]
        self._settle(0)

    def _settle(self, count: int) -> None:
        self._pending -= count
        if self._pending or self.future.done():
            return
        if self._error is None:
            self.future.set_result(self.results)  # type: ignore[arg-type]
            return
        failed = sum(isinstance(r, BaseException) for r in self.results)
        self.future.set_exception(
            SendManyError(f"{failed} of {len(self.results)} records failed; first: {self._error}", self.results)
        )
        self.future.exception()  # retrieved: the caller sees it on await


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
        "groups",
        "in_flight",
        "last_refusal",
        "leader_epoch",
        "lost_attempt",
        "maybe_written",
        "needs_new_sequence",
        "payload",
        "producer_epoch",
        "producer_id",
        "reserved",
        "retry_at",
        "settlement",
        "split_unsure",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        builder: RecordBatchBuilder,
        now: float,
        delivery_timeout: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.tp = tp
        self.builder = builder
        #: Ranges of ``send_many`` records: [group, index in group, offset delta in batch, count];
        #: a shared empty tuple until the first (most batches never get one).
        self.groups: list[list[Any]] | tuple[()] = ()
        #: The outcome of every record: what each RecordFuture reads, and flush() waits on.
        #: Settled on the producer's loop, whichever loop appends the first record.
        self.settlement = BatchSettlement(loop, tp.partition)
        self.created = now
        self.deadline = now + delivery_timeout
        self.attempts = 0
        self.retry_at = 0.0
        self.in_flight = False
        #: The broker's error for the last attempt it refused (the batch was retried).
        self.last_refusal: KafkaError | None = None
        #: Some attempt may have been written: its answer never came, or said the write's
        #: outcome is unknown. Only a sequence check by the broker (idempotence) clears it.
        self.maybe_written = False
        #: Such an attempt may be in a log whose broker no longer knows the producer (a topic
        #: deleted and created again, producer state expired): its sequence check cannot say.
        #: Never cleared; it only tells the user the records may be in a log.
        self.lost_attempt = False
        #: The broker refused the batch's sequence and nothing of ours explains it: it is
        #: not in the log, and cannot be written under its stamp (see idempotence.py).
        self.needs_new_sequence = False
        #: A part of a split batch an attempt of which may be in the log: the broker checks the
        #: part's own sequence range, so its refusal does not say the records are not there.
        self.split_unsure = False
        #: The partition's leader epoch when the batch was last sent (KIP-951: a retry to
        #: a newer leader needs no backoff).
        self.leader_epoch = -1
        self.reserved = 0  # bytes of buffer_memory this batch holds
        self.payload: bytes | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1

    def __repr__(self) -> str:
        return f"<ProducerBatch {self.tp.topic}-{self.tp.partition} records={self.record_count}>"

    @property
    def record_count(self) -> int:
        return self.builder.record_count

    @property
    def done(self) -> bool:
        """Its records have their outcome (it may still be on the wire, e.g. expired there)."""
        return self.settlement.outcome is not None

    @property
    def failed(self) -> bool:
        """Its records failed (it is done, and not acknowledged)."""
        return type(self.settlement.outcome) is BatchFailure

    @property
    def stamped(self) -> bool:
        return self.base_sequence >= 0

    @property
    def stamp_maybe_written(self) -> bool:
        """Its stamped sequence may be in the log: an attempt under it may have been written (or is
        on the wire), and it is not to be renumbered."""
        return self.stamped and not self.needs_new_sequence and (self.maybe_written or self.in_flight)

    @property
    def possibly_persisted(self) -> bool:
        """What a failure of this batch must tell the user: may it be in the log?"""
        return self.in_flight or self.maybe_written or self.lost_attempt

    def expiry_error(
        self,
        now: float,
        delivery_timeout_ms: int,
        possibly_persisted: bool | None = None,
        unsent_because: KafkaError | None = None,
    ) -> DeliveryTimeoutError:
        """``unsent_because``: why a batch never sent could not be (its leader's connect error)."""
        age = (now - self.created) * 1000
        persisted = self.possibly_persisted if possibly_persisted is None else possibly_persisted
        if persisted:
            where = "possibly persisted: it was sent and its outcome is unknown"
        elif self.attempts:
            # Sent, and refused every time (never "not sent": that hid the broker's refusals).
            where = f"not written: sent {self.attempts} time(s), refused by the broker"
            if self.last_refusal is not None:
                where += f" (last: {type(self.last_refusal).__name__}: {self.last_refusal})"
        else:
            where = "not sent"
        if unsent_because is not None and not persisted:
            where += f": {type(unsent_because).__name__}: {unsent_because}"
        error = DeliveryTimeoutError(
            f"{self.record_count} record(s) for {self.tp.topic}-{self.tp.partition} expired after "
            f"{age:.0f} ms (delivery_timeout_ms={delivery_timeout_ms}); {where}",
            possibly_persisted=persisted,
        )
        if unsent_because is not None and not persisted:
            error.__cause__ = unsent_because
        return error

    def unstamp(self) -> None:
        """Forget the sequence: only for a batch the broker said is not in its log."""
        self.producer_id = self.producer_epoch = self.base_sequence = -1
        self.maybe_written = self.needs_new_sequence = False

    def split(self, max_bytes: int, new_builder: Callable[[int], RecordBatchBuilder]) -> list[ProducerBatch]:
        """Smaller batches holding this batch's records, in order, each up to ``max_bytes``
        (a record bigger than that gets a batch of its own). Their records' outcomes become
        this batch's records' outcomes; a stamped batch hands its sequence range on, so the
        batches behind it stay in sequence (Java's ``splitAndReenqueue``)."""
        assert self.payload is not None, "only a batch that was sent is split"
        # Our own bytes: the records section is at most the builder's uncompressed size, which
        # may exceed read_batch's default ceiling (batch_size above 64 MiB).
        records = read_batch(self.payload, max_decompressed_size=self.builder.size_in_bytes).records
        parts: list[ProducerBatch] = []
        starts: list[int] = []
        for delta, record in enumerate(records):
            part = parts[-1] if parts else None
            if part is None or part.builder.append(record.timestamp, record.key, record.value, record.headers) is None:
                part = ProducerBatch(self.tp, new_builder(max_bytes), self.created, 0.0, self.settlement.loop)
                part.deadline = self.deadline
                part.builder.append(record.timestamp, record.key, record.value, record.headers)
                parts.append(part)
                starts.append(delta)
        reserved_each, left = divmod(self.reserved, len(parts))
        sequence = self.base_sequence
        for index, (part, start) in enumerate(zip(parts, starts, strict=True)):
            part.builder.close()  # a later record joining a part would go past its sequences
            part.reserved = reserved_each + (left if index == 0 else 0)
            part.attempts = self.attempts
            part.maybe_written = self.maybe_written  # an earlier attempt of the whole may be in the log
            part.lost_attempt = self.lost_attempt
            part.split_unsure = self.split_unsure or (self.maybe_written and sequence >= 0)
            if sequence >= 0:
                part.producer_id, part.producer_epoch, part.base_sequence = (
                    self.producer_id,
                    self.producer_epoch,
                    (sequence + start) % (1 << 31),
                )
            stop = start + part.record_count
            for group, first, delta, count in self.groups:
                low, high = max(delta, start), min(delta + count, stop)
                if low < high:
                    part._add_group_range([group, first + low - delta, low - start, high - low])
        self.reserved = 0
        self.groups = ()
        self.settlement.split_into([(start, part.settlement) for part, start in zip(parts, starts, strict=True)])
        return parts

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

    def append_to_group(self, group: SendGroup, index: int) -> None:
        """Account the record just added to the builder as record ``index`` of ``group``."""
        delta = self.builder.record_count - 1
        groups = self.groups
        if groups:
            last = groups[-1]
            if last[0] is group and last[1] + last[3] == index and last[2] + last[3] == delta:
                last[3] += 1
                return
        self._add_group_range([group, index, delta, 1])

    def append_range_to_group(self, group: SendGroup, start: int, count: int) -> None:
        """Account ``count`` records just added to the builder as records ``start``.. of ``group``."""
        delta = self.builder.record_count - count
        groups = self.groups
        if groups:
            last = groups[-1]
            if last[0] is group and last[1] + last[3] == start and last[2] + last[3] == delta:
                last[3] += count
                return
        self._add_group_range([group, start, delta, count])

    def _add_group_range(self, entry: list[Any]) -> None:
        if self.groups:
            self.groups.append(entry)
        else:
            self.groups = [entry]

    def succeed(self, base_offset: int, log_append_time: int) -> None:
        if self.settlement.outcome is not None:
            return  # settled already: its send_many groups counted its records then
        tp = self.tp
        for group, start, delta, count in self.groups:
            first = base_offset + delta if base_offset >= 0 else -1
            group.succeeded(
                start, count, tp.partition, first, log_append_time if log_append_time >= 0 else group.timestamp
            )
        self.settlement.settle((tp.topic, tp.partition, base_offset, log_append_time))

    def fail(self, error: KafkaError, per_record: Mapping[int, KafkaError] | None = None) -> None:
        """``per_record``: each record's own error by offset delta (the broker named the
        invalid records of the batch)."""
        if self.settlement.outcome is not None:
            # Settled already (the sender's last resort after a bug fails what it had put back in
            # a queue, and the queue after it): counted twice, a send_many group never resolved.
            return
        for group, start, delta, count in self.groups:
            errors = None if per_record is None else [per_record[d] for d in range(delta, delta + count)]
            group.failed(start, count, error, errors)
        # A result, not an exception: the record futures raise it, and flush() (which only
        # waits) never leaves an unretrieved exception behind.
        self.settlement.settle(BatchFailure(error, error.__traceback__, per_record))

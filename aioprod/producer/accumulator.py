"""The record accumulator: per-partition queues of batches and the memory budget.

Appends happen in the caller's task; ``ready``/``drain``/``expire`` are called only by the
sender task. Time is passed in, so tests drive it without sleeping.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from aioprod.cluster.metadata import ClusterSnapshot
from aioprod.config import ProducerConfig
from aioprod.errors import DeliveryTimeoutError, KafkaError, KafkaTimeoutError, RecordTooLargeError
from aioprod.producer.batch import Headers, ProducerBatch, SendGroup, TopicPartition
from aioprod.producer.idempotence import sequence_before
from aioprod.producer.record_future import RecordFuture
from aioprod.protocol.records import RecordBatchBuilder

# Per-record bytes beyond key/value/headers: the record's framing on the wire (at most
# ~26 bytes) plus the Python objects that hold it while queued (future, list slots).
RECORD_OVERHEAD = 64


class BufferPool:
    """``buffer_memory`` as a byte budget with FIFO waiters."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        #: How many reservations had to wait for space (a statistic).
        self.waits = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def exhausted(self) -> bool:
        return bool(self._waiters)

    @property
    def available(self) -> bool:
        """Space may be taken without waiting (no one is queued ahead)."""
        return not self._waiters

    def try_reserve(self, size: int) -> bool:
        if not self._waiters and self.used + size <= self.total:
            self.used += size
            return True
        return False

    async def reserve(self, size: int, timeout: float) -> None:
        """Wait, behind earlier waiters, until ``size`` bytes are free."""
        if self.try_reserve(size):
            return
        self.waits += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            raise KafkaTimeoutError(
                f"buffer_memory ({self.total} bytes) stayed full for max_block_ms "
                f"({timeout * 1000:.0f} ms); {self.used} bytes are queued"
            ) from None
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(size)  # granted just as we were cancelled
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
                self._grant()

    def release(self, size: int) -> None:
        self.used -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            size, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if self.used + size > self.total:
                return
            self.used += size
            self._waiters.popleft()
            future.set_result(None)


class RecordAccumulator:
    def __init__(self, config: ProducerConfig, wakeup: Callable[[], None]) -> None:
        self._config = config
        self._wakeup = wakeup
        self._loop = asyncio.get_running_loop()
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        self.pool = BufferPool(config.buffer_memory)
        self._linger = config.linger_ms / 1000
        self._delivery_timeout = config.delivery_timeout_ms / 1000
        self._drain_index = 0
        self.incomplete: set[ProducerBatch] = set()
        self.flushing = 0
        self.closing = False
        #: Counts new batches; send() yields to the loop when it changes (see there).
        self.batches_created = 0

    @staticmethod
    def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
        """An upper bound of what the record costs on the wire and in memory."""
        size = RECORD_OVERHEAD + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        return size + RecordAccumulator.headers_size(headers) if headers else size

    @staticmethod
    def headers_size(headers: Headers) -> int:
        return sum(10 + len(name) * 4 + (len(value) if value is not None else 0) for name, value in headers)

    def check_size(self, size: int) -> None:
        if size > self._config.max_request_size:
            raise RecordTooLargeError(
                f"record of about {size} bytes is larger than max_request_size ({self._config.max_request_size})"
            )
        if size > self._config.buffer_memory:
            raise RecordTooLargeError(
                f"record of about {size} bytes is larger than buffer_memory ({self._config.buffer_memory})"
            )

    def append(
        self,
        tp: TopicPartition,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        now: float | None = None,
    ) -> RecordFuture:
        """Add a record whose ``size`` bytes are already reserved from the pool."""
        batch, index = self._add(tp, timestamp, key, value, headers, size, now)
        return RecordFuture(batch.settlement, index, timestamp)

    def append_to_group(
        self,
        tp: TopicPartition,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        group: SendGroup,
        index: int,
    ) -> None:
        """Add record ``index`` of a ``send_many`` group (its outcome goes to the group)."""
        self._add(tp, group.timestamp, key, value, headers, size, None)[0].append_to_group(group, index)

    def append_run(
        self,
        tp: TopicPartition,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        start: int,
        stop: int,
        group: SendGroup,
    ) -> int:
        """Append as many of ``values[start:stop]`` as fit the open batch and the free
        buffer memory, in one builder call; returns how many. Zero means the caller must
        take the per-record path for ``values[start]`` (full buffer, or not bytes)."""
        pool = self.pool
        budget = pool.total - pool.used if pool.available else 0
        if budget <= 0:
            return 0
        queue = self._batches.get(tp)
        if queue is None:
            queue = self._batches[tp] = deque()
        batch = queue[-1] if queue else None
        appended = 0
        if batch is not None and batch.payload is None:
            appended, cost = batch.builder.append_values(
                group.timestamp, values, keys, start, stop, budget, RECORD_OVERHEAD
            )
        if not appended:
            batch = ProducerBatch(tp, self._new_builder(), self._loop.time(), self._delivery_timeout)
            appended, cost = batch.builder.append_values(
                group.timestamp, values, keys, start, stop, budget, RECORD_OVERHEAD
            )
            if not appended:
                return 0
            queue.append(batch)
            self.incomplete.add(batch)
            self.batches_created += 1
            self._wakeup()
        assert batch is not None
        pool.used += cost
        batch.reserved += cost
        batch.append_range_to_group(group, start, appended)
        return appended

    def _add(
        self,
        tp: TopicPartition,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        now: float | None,
    ) -> tuple[ProducerBatch, int]:
        """Encode the record into the partition's open batch, or a new one; the batch and
        the record's offset delta in it. The per-record hot path, with one builder call in
        the common case."""
        queue = self._batches.get(tp)
        if queue is None:
            queue = self._batches[tp] = deque()
        elif queue:
            last = queue[-1]
            if last.payload is None:
                index = last.builder.append(timestamp, key, value, headers)
                if index is not None:
                    last.reserved += size
                    return last, index
        created = self._loop.time() if now is None else now
        batch = ProducerBatch(tp, self._new_builder(), created, self._delivery_timeout)
        if batch.builder.append(timestamp, key, value, headers) is None:
            raise RecordTooLargeError(f"record does not fit an empty batch for {tp.topic}-{tp.partition}")
        batch.reserved = size
        queue.append(batch)
        self.incomplete.add(batch)
        self.batches_created += 1
        # A new batch: the sender must start its linger clock, and the one before it (if
        # any) is now complete and sendable.
        self._wakeup()
        return batch, 0

    def _new_builder(self) -> RecordBatchBuilder:
        return RecordBatchBuilder(
            self._config.compression_type,
            self._config.batch_size,
            compression_level=self._config.compression_level,
        )

    def ready(self, cluster: ClusterSnapshot, now: float) -> tuple[set[int], float, bool]:
        """Nodes with a sendable batch, seconds until the next batch may become sendable,
        and whether some partition's leader is unknown."""
        ready: set[int] = set()
        next_check = 3600.0
        unknown_leader = False
        force = self._forced()
        for tp, queue in self._batches.items():
            if not queue:
                continue
            leader = cluster.leader_for(tp.topic, tp.partition)
            if leader is None:
                unknown_leader = True
                continue
            wait = self._wait(queue, now, force)
            if wait <= 0:
                ready.add(leader)
            else:
                next_check = min(next_check, wait)
        return ready, next_check, unknown_leader

    def _forced(self) -> bool:
        """Send without waiting for linger: a flush or close is waiting, or memory is short."""
        return self.flushing > 0 or self.closing or self.pool.exhausted

    def _wait(self, queue: deque[ProducerBatch], now: float, force: bool) -> float:
        """Seconds until the head batch of ``queue`` may be sent (<= 0: now).

        The one readiness rule for ``ready`` and ``drain``: were they to disagree (as two
        float comparisons of the linger deadline once did), the sender would see a ready
        batch it may not drain, and sleep with nothing to wake it.
        """
        batch = queue[0]
        if batch.retry_at > now:
            return batch.retry_at - now
        if force or len(queue) > 1 or batch.builder.is_full or batch.attempts > 0:
            return 0.0
        return batch.created + self._linger - now

    def drain(
        self,
        cluster: ClusterSnapshot,
        nodes: Iterable[int],
        max_request_size: int,
        now: float,
        can_send: Callable[[ProducerBatch], bool],
    ) -> dict[int, list[ProducerBatch]]:
        """Take at most one batch per partition for each node, up to ``max_request_size``.

        The start position rotates so that, over rounds, no partition starves.
        """
        node_set = set(nodes)
        if not node_set:
            return {}
        by_node: dict[int, list[TopicPartition]] = {}
        for tp, queue in self._batches.items():
            if queue:
                leader = cluster.leader_for(tp.topic, tp.partition)
                if leader in node_set:
                    by_node.setdefault(leader, []).append(tp)
        drained: dict[int, list[ProducerBatch]] = {}
        force = self._forced()
        self._drain_index += 1
        for node, tps in by_node.items():
            size = 0
            taken: list[ProducerBatch] = []
            start = self._drain_index % len(tps)
            for tp in tps[start:] + tps[:start]:
                queue = self._batches[tp]
                batch = queue[0]
                if self._wait(queue, now, force) > 0 or not can_send(batch):
                    continue
                if taken and size + batch.size > max_request_size:
                    break
                queue.popleft()
                size += batch.size
                taken.append(batch)
            if taken:
                drained[node] = taken
        return drained

    def reenqueue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put a batch back at the head of its partition, in sequence order."""
        batch.retry_at = retry_at
        batch.in_flight = False
        queue = self._batches.setdefault(batch.tp, deque())
        if batch.base_sequence >= 0:
            index = 0
            while (
                index < len(queue)
                and queue[index].base_sequence >= 0
                and sequence_before(queue[index].base_sequence, batch.base_sequence)
            ):
                index += 1
            queue.insert(index, batch)
        else:
            queue.appendleft(batch)
        self._wakeup()

    def queued_before(self, batch: ProducerBatch) -> bool:
        """A batch of the same partition and identity with an earlier sequence is queued."""
        return any(
            other.base_sequence >= 0
            and other.producer_id == batch.producer_id
            and sequence_before(other.base_sequence, batch.base_sequence)
            for other in self._batches.get(batch.tp, ())
        )

    def expire(self, now: float) -> list[ProducerBatch]:
        """Remove queued batches past their delivery deadline."""
        expired: list[ProducerBatch] = []
        for queue in self._batches.values():
            while queue and queue[0].deadline <= now:
                expired.append(queue.popleft())
        return expired

    def complete(self, batch: ProducerBatch) -> None:
        """The batch is finished (acked or failed): give back its memory."""
        if batch in self.incomplete:
            self.incomplete.discard(batch)
            self.pool.release(batch.reserved)
            batch.reserved = 0

    def fail_all(self, error: KafkaError) -> None:
        for queue in self._batches.values():
            while queue:
                batch = queue.popleft()
                batch.fail(error)
                self.complete(batch)

    def expiry_error(self, batch: ProducerBatch, now: float) -> DeliveryTimeoutError:
        age = (now - batch.created) * 1000
        where = "possibly persisted: it was sent" if batch.sent_once else "not sent"
        return DeliveryTimeoutError(
            f"{batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition} expired after "
            f"{age:.0f} ms (delivery_timeout_ms={self._config.delivery_timeout_ms}); {where}",
            possibly_persisted=batch.sent_once,
        )

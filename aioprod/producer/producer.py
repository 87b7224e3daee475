"""The public producer: validation, serialization, partitioning, and the lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import numbers
import os
import re
import select
import selectors
import sys
import time
import weakref
from asyncio import _get_running_loop
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from threading import get_ident as _get_ident
from types import BuiltinFunctionType, TracebackType
from typing import Any, NoReturn, TypeGuard, TypeVar

from aioprod._compiled import speedups
from aioprod.cluster.metadata import ClusterSnapshot, Metadata, TopicInfo
from aioprod.config import ProducerConfig
from aioprod.errors import (
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    PreparedTransactionError,
    ProducerClosedError,
    ProducerFatalError,
    TransactionAbortableError,
    TransactionStateError,
    error_for_code,
)
from aioprod.event_log import ClientLogger
from aioprod.metrics import MetricsSnapshot, ProducerMetrics
from aioprod.net.pool import CLOSE_GRACE, ConnectionPool
from aioprod.producer.accumulator import RECORD_OVERHEAD as _RECORD_OVERHEAD
from aioprod.producer.accumulator import RecordAccumulator
from aioprod.producer.batch import Headers, ProducerBatch, SendGroup, TopicPartition
from aioprod.producer.coordinators import Coordinators, committed_offsets
from aioprod.producer.partitioner import RECORD_FRAMING, Partitioner, partition_for_key
from aioprod.producer.record_future import RecordFuture, RecordMetadata
from aioprod.producer.sender import Sender
from aioprod.producer.transactions import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    PreparedTransaction,
    TransactionManager,
    as_group,
    as_offsets,
    end_prepared,
    fence_transactional_id,
)
from aioprod.protocol.messages import (
    ListOffsetsRequest,
    ListOffsetsRequestPartition,
    ListOffsetsRequestTopic,
    ListOffsetsResponse,
)
from aioprod.protocol.primitives import INT64_MAX
from aioprod.protocol.records import BATCH_HEADER_SIZE as _BATCH_HEADER_SIZE

log = logging.getLogger(__name__)

T = TypeVar("T")

_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_MAX_TOPIC_LENGTH = 249
_BYTES = (bytes, bytearray, memoryview)

_NEW, _STARTED, _CLOSING, _CLOSED = "new", "started", "closing", "closed"


#: A caller sending in a tight loop lets the loop run once the sender's round is due (a linger
#: ended), and at least this often (seconds), so that the connections' readers read the answers
#: that free a connection or a batch waiting for its partition's last answer. The loop's clock
#: is read once per _SENDS_PER_CLOCK_CHECK sends.
_MAX_UNYIELDED = 0.1
_SENDS_PER_CLOCK_CHECK = 64
#: send_many's per-record path lets the loop run at least once per this many records.
_MANY_UNYIELDED = 4096
#: How late (seconds) the sender's timer may be before a tight loop of sends lets the loop run
#: for it (see _clock_check).
_ROUND_OVERDUE = 0.001
#: The turns of the loop send() gives when the clock says a round is owed, for it to run: a
#: timer, then the sender's task; or an answer's bytes, the reader's task, then the sender's.
_TURNS_FOR_A_ROUND = 4


class _SendCount:
    """Sends since the producer last looked at the clock (see Producer._clock_check); the
    pure-Python twin of ``speedups.SendCount``, which the compiled lanes share with send()."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def _py_now_ms() -> int:
    return time.time_ns() // 1_000_000


#: A record's CreateTime, wall-clock milliseconds; the compiled clock costs 50 ns, this 130.
_now_ms: Callable[[], int] = _py_now_ms if speedups is None else speedups.now_ms


def _py_plain_payloads(values: Sequence[Any], keys: Sequence[Any] | None, room: int) -> bool:
    """Every value, and every key unless ``keys`` is None, is bytes or None, and no record's key
    and value together are longer than ``room``: a ``send_many`` call with nothing to convert,
    serialize or refuse, seen in one pass."""
    if keys is not None and len(keys) != len(values):
        return False
    for i, value in enumerate(values):
        key = None if keys is None else keys[i]
        if (value is not None and type(value) is not bytes) or (key is not None and type(key) is not bytes):
            return False
        if (0 if value is None else len(value)) + (0 if key is None else len(key)) > room:
            return False
    return True


#: Compiled, under 2 ns a record; in Python, 80 ns, where the two passes it spares
#: ``_check_many`` (for conversions, for sizes) took 90.
_plain_payloads: Callable[[Sequence[Any], Sequence[Any] | None, int], bool] = (
    _py_plain_payloads if speedups is None else speedups.plain_payloads
)


class _Begun:
    """What begin_transaction() returns: nothing to wait for, but awaitable, so that a port that
    awaits it (aiokafka's begin_transaction is a coroutine) does not fail after it has begun."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield

    def __repr__(self) -> str:
        return "<transaction begun>"


_BEGUN = _Begun()


class Producer:
    """An asyncio Kafka producer.

    ``await send(...)`` returns once the record is queued; the future it returns resolves
    with :class:`RecordMetadata` when the broker acknowledges the record, or fails with a
    :class:`~aioprod.errors.KafkaError`. Options: snake_case keywords or a mapping of
    Java/librdkafka names (see the configuration guide).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **options: Any) -> None:
        self.config = ProducerConfig.from_options(config, **options)
        self._state = _NEW
        self._fatal: BaseException | None = None
        self._partitioner = Partitioner(self.config.partitioner, self.config.batch_size)
        self._key_serializer = self.config.key_serializer
        self._value_serializer = self.config.value_serializer
        self._serializers = self._key_serializer is not None or self._value_serializer is not None
        #: Keyed records go by murmur2 of the key (every built-in partitioner but round_robin).
        self._hash_keys = self._partitioner.hashes_keys
        #: consistent_random (librdkafka's): an empty key is a keyless record, sticky and counted.
        self._empty_key_keyless = self.config.partitioner == "consistent_random"
        self._max_block = self.config.max_block_ms / 1000
        # Records up to this size need no size check against max_request_size/buffer_memory.
        # max_request_size counts the batch the record makes: its 61-byte header too (Java's
        # estimateSizeInBytesUpperBound); RECORD_OVERHEAD covers the record's own framing (and
        # more: a record past this limit is measured as Java measures it, by check_size).
        self._size_limit = min(self.config.max_request_size - _BATCH_HEADER_SIZE, self.config.buffer_memory)
        # topic -> its TopicPartition objects by partition id, made once instead of per record.
        self._tps: dict[str, list[TopicPartition]] = {}
        self._txn: TransactionManager | None = None
        #: Handles whose commit_prepared_transaction call wrote an EndTxn and ended without an
        #: answer saying what became of it (timed out, cancelled, in doubt, failed otherwise).
        self._commits_unanswered: set[PreparedTransaction] = set()
        # Sends since the last look at the clock (see _clock_check), counted by send()'s own
        # path and every compiled lane alike; and when send() last let the loop run.
        self._sends = _SendCount() if speedups is None else speedups.SendCount()
        self._last_yield = 0.0
        #: topic -> the compiled twin of send()'s common case for it (SendLane, in
        #: aioprod/_speedups.c); only without serializers or transactions.
        self._lanes: dict[str, Any] = {}
        self._lanes_on = speedups is not None and not self._serializers
        self._closing: asyncio.Task[None] | None = None
        self._metrics = ProducerMetrics(self.config)
        if self.config.telemetry is not None:
            from aioprod.tracing import SendTelemetry

            telemetry = SendTelemetry(self.config.telemetry, self.config, self.cluster)
            # Instance attributes in front of the methods: without telemetry, send() pays nothing for it.
            self.send = telemetry.traced_send(self.send)  # type: ignore[method-assign]
            self.send_many = telemetry.traced_send_many(self.send_many)  # type: ignore[method-assign]
            if self._value_serializer is not None:  # the record's value, not the one given, is a tombstone or not
                self._value_serializer = telemetry.watched_serializer(self._value_serializer)
        # Created in start(), inside the running loop.
        self._pool: ConnectionPool
        self._metadata: Metadata
        self._accumulator: RecordAccumulator
        self._sender: Sender

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Start the background tasks. Connecting happens lazily, on first need."""
        if self._state != _NEW:
            raise ProducerClosedError(f"start() called on a producer that is {self._state}")
        self._loop = asyncio.get_running_loop()
        # send() checks, per record, that it runs on this loop: _current() against
        # _runs_on._thread_id. From 3.12 on, the running loop itself (~30 ns). On 3.11, where asking
        # for it costs ~180 ns (a getpid() each call): compiled, the loop's current run (_RunOf);
        # in pure Python, asyncio's loops by the thread running them, their _thread_id (None
        # while stopped; ~35 ns), and a loop that does not say (uvloop) by asking (_RunningHere).
        # Each is exact, and follows the loop into another thread.
        if _EXACT:
            self._runs_on: Any = _LoopIs(self._loop)
        elif _running_loop_holder is not None:
            self._runs_on = _RunOf()
        elif hasattr(self._loop, "_thread_id"):
            self._runs_on = self._loop
        else:
            self._runs_on = _RunningHere(self._loop)
        _started.add(self)
        metrics = self._metrics
        self._pool = ConnectionPool(
            self.config,
            on_change=self._pool_changed,
            on_disconnect=lambda: self._metadata.request_update(),
            metrics=metrics,
        )
        self._metadata = Metadata(self.config, self._pool, metrics)
        self._coordinators = Coordinators(self.config, self._metadata, self._pool, name=self.config.client_id)
        self._accumulator = RecordAccumulator(self.config, self._wakeup, metrics)
        if self._accumulator.compressing:
            self._partitioner.batch_fill = self._accumulator.fill_size
        self._sender = Sender(self.config, self._metadata, self._pool, self._accumulator, self._set_fatal, metrics)
        metrics.start(self._loop, self._accumulator.pool, self._pool, self._metadata)
        self._metadata.add_listener(lambda _snapshot: self._wakeup())
        self._metadata.add_evict_listener(self._forget_topics)
        self._metadata.start()
        self._sender.start()
        self._state = _STARTED
        self._txn = self._sender.transactions
        if self._txn is not None:
            self._accumulator.on_new_batch = self._txn.add_partition
            # initTransactions: find the coordinator and take the producer id, which fences
            # any older producer with this transactional id.
            try:
                await self._txn.run("start", self._txn.initialize)
            except BaseException:
                await self.close(timeout=0)
                raise

    def _wakeup(self) -> None:
        self._sender.wakeup()

    def _forget_topics(self, topics: list[str]) -> None:
        """Topics unused for metadata_max_idle_ms: their per-topic state goes with their metadata."""
        for topic in topics:
            self._tps.pop(topic, None)
            self._lanes.pop(topic, None)
        self._partitioner.forget(topics)
        self._accumulator.forget_topics(topics)
        self._metrics.forget_topics(topics)
        self._sender.forget_topics(topics)

    def _pool_changed(self) -> None:
        self._sender.wakeup()
        self._metadata.pool_changed()

    def _set_fatal(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
            if self._txn is not None:
                self._txn.producer_failed(error)

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self, timeout: float | None = None) -> None:
        """Stop accepting records, deliver what is queued, then release everything.

        ``timeout`` (seconds) bounds the wait for delivery; records still pending then
        fail with :class:`ProducerClosedError` (its ``possibly_persisted`` says whether the
        record may have reached the broker). ``None`` waits for every record's own delivery
        timeout. Calling close again, or concurrently, waits for the first. If the caller
        cancels close(), delivery stops there: pending records fail and every connection
        and task is released at once.
        """
        timeout = check_timeout("close", timeout)
        if self._state == _NEW:
            self._state = _CLOSED
            return
        if self._state is _CLOSED:
            return  # from any loop: nothing is left to do (a fixture's teardown, an atexit hook)
        if self._forked_copy():
            return  # the parent's to close: closing its connections here would close the parent's
        self._check_loop()
        closing = self._closing
        if closing is None:
            self._state = _CLOSING
            self._sender.close_begun = True
            # A send() waiting for metadata or buffer memory could only be refused later: refuse it now.
            self._metadata.refuse_waits()
            self._accumulator.pool.close(
                lambda: ProducerClosedError("the producer closed while the record waited for buffer memory")
            )
            closing = self._closing = asyncio.get_running_loop().create_task(
                self._shutdown(timeout), name="aioprod-close"
            )
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            if not closing.done():
                self._release_now(timeout)  # the close task finishes the waiting
            raise

    async def _shutdown(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout  # one bound for every step
        try:
            txn = self._txn
            if txn is not None and not txn.failed:
                try:
                    async with asyncio.timeout_at(deadline):
                        await txn.end_on_close(self._fail_unsent, self._settle_transaction)
                except (TimeoutError, KafkaError) as exc:
                    # (A start() cancelled or timed out has no transaction to abort: not worth a warning.)
                    named = ClientLogger(log, self.config.client_id)  # whose transaction, as every line says
                    report = named.warning if txn.has_transaction else named.debug
                    report("could not abort transaction %r while closing: %r", txn.transactional_id, exc)
            if timeout is None or timeout > 0:  # close(0): nothing more is sent, even what lingers
                self._accumulator.closing = True
                self._sender.stop()
                await self._sender.wait_stopped(None if deadline is None else max(0.0, deadline - loop.time()))
                settling = self.config.request_timeout_ms / 1000  # acks=0 answers, of a broker that gives them
                if deadline is not None:
                    settling = min(settling, max(0.0, deadline - loop.time()))
                await self._pool.settle(settling)
            tasks = self._release_now(timeout)
            if tasks:
                await asyncio.wait(tasks)
            await self._metadata.close()
            await self._pool.close(
                CLOSE_GRACE if deadline is None else min(CLOSE_GRACE, max(0.0, deadline - loop.time()))
            )
        except asyncio.CancelledError:
            # This task itself was cancelled (not close()'s caller, which releases in close()): the
            # loop is shutting down under a close nobody awaited (one begun from a done-callback, say).
            # Nothing will deliver what is left: fail it and close the connections, now.
            self._release_now(timeout)
            raise
        finally:
            self._state = _CLOSED

    def _release_now(self, timeout: float | None) -> list[asyncio.Task[None]]:
        """Fail what is unfinished, stop refreshing, close every connection; no waiting."""
        reason = "producer closed before the record was acknowledged" + (
            f" (close timeout {timeout}s)" if timeout is not None else ""
        )
        unfinished = sum(batch.record_count for batch in self._accumulator.incomplete)
        if unfinished:
            # Said here too: a close nobody waits on (a SyncProducer closed at interpreter exit,
            # or dropped unclosed) has no caller to see the records' futures fail.
            self._metrics.events.warning(
                log,
                "producer closed with %d record(s) not acknowledged: they fail with ProducerClosedError",
                unfinished,
            )
        tasks = self._sender.abort_now(lambda persisted: ProducerClosedError(reason, possibly_persisted=persisted))
        self._metrics.stop()
        self._metadata.stop()
        self._pool.close_now()
        return tasks

    # -- sending -------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None,
    ) -> RecordFuture:
        """Queue a record; returns a future of its :class:`RecordMetadata` (a
        :class:`RecordFuture`: awaitable, and accepted by asyncio like an asyncio.Future).

        Suspends (never blocks the loop) while the topic's metadata is fetched or the
        buffer is full, for at most ``max_block_ms`` in all.

        ``topic`` is a ``str`` (a ``StrEnum`` member names its value); ``value`` and ``key``
        are bytes-like (``bytes`` or a subclass, ``bytearray``, ``memoryview``) or None, unless
        a serializer is configured for them. A ``partition`` the topic does not have raises
        :class:`~aioprod.errors.PartitionNotFoundError` (a ``ValueError``) once the cluster's
        answers have lacked it for ``retry_backoff_max_ms`` (a partition just added may be missing
        from a lagging broker's answer).
        """
        # The thread too (see start()): from another loop, a send of a known topic went into the
        # accumulator from the wrong thread, with no wake-up, and was lost.
        if self._state is not _STARTED or self._fatal is not None or _current() != self._runs_on._thread_id:
            self._refuse_off_its_loop()
        txn = self._txn
        txn_generation = 0 if txn is None else txn.check_send()
        acc = self._accumulator
        turns = acc.yield_wanted
        if turns:
            # The last send() started a batch while a round was due or a connection full, or
            # the clock said a round is owed (see _clock_check), and no round has run since:
            # let the loop run first, or a caller sending in a tight loop starves the sender and
            # the connections' readers until the buffer is full. A round the clock asked for
            # takes the loop more turns (_TURNS_FOR_A_ROUND); at most every 100 ms, or as a
            # linger ends with nothing in flight. Here, before anything is queued, a
            # cancellation loses nothing.
            acc.yield_wanted = 0
            for _ in range(turns):
                await asyncio.sleep(0)
            self._last_yield = self._loop.time()
            if self._state is not _STARTED or self._fatal is not None:
                self._raise_not_open()
        try:  # (no cost unless it raises)
            if partition is None and timestamp_ms is None and headers is None:
                lane = self._lanes.get(topic)
                if lane is not None:
                    queued: RecordFuture | None = lane.send(value, key)
                    if queued is not None:
                        return queued
            tps = self._tps.get(topic)
        except TypeError:
            if isinstance(topic, str):
                raise
            tps = None  # an unhashable topic (a list, say): check_topic_name says what is wrong
        if tps is None:
            topic = check_topic_name(topic)
        # Serialize and type-check; the common case (bytes, no serializer) costs two checks.
        if self._serializers:
            # None too, as Java, aiokafka and confluent-kafka call them: the serializer says
            # whether None is a tombstone (returning None) or a document (JSON's b"null").
            if self._key_serializer is not None:
                key = _serialized("key", self._key_serializer(key))
            if self._value_serializer is not None:
                value = _serialized("value", self._value_serializer(value))
        if type(key) is not bytes and key is not None:
            key = _as_bytes("key", key)
        if type(value) is not bytes and value is not None:
            value = _as_bytes("value", value)
        header_list = () if headers is None else _check_headers(headers)
        if timestamp_ms is None:
            timestamp_ms = _now_ms()
        elif type(timestamp_ms) is not int:
            raise TypeError(f"timestamp_ms must be an int (milliseconds), got {type(timestamp_ms).__name__}")
        elif timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be >= 0, got {timestamp_ms}")
        elif timestamp_ms > INT64_MAX:
            raise ValueError(f"timestamp_ms must be < 2**63 (milliseconds since the epoch), got {timestamp_ms}")
        if partition is not None and (type(partition) is not int or partition < 0):
            if type(partition) is not int:
                raise TypeError(f"partition must be an int or None, got {type(partition).__name__}")
            raise ValueError(f"partition must be >= 0, got {partition}")

        # RecordAccumulator.record_size, inlined: this is the per-record hot path.
        size = _RECORD_OVERHEAD + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        if header_list:
            size += acc.headers_size(header_list)
        if size > self._size_limit:
            try:
                acc.check_size(size, key, value, header_list)
            except KafkaError:
                self._metrics.record_send_error(1, self._loop.time())
                raise

        deadline: float | None = None
        info = self._metadata.snapshot.topics.get(topic)
        if info is None or not info.partitions or (partition is not None and partition not in info.partitions):
            self._check_loop()
            deadline = self._loop.time() + self._max_block
            info = await self._wait_for_topic(topic, partition, 1)
        if tps is None or len(tps) < len(info.all_partitions):
            tps = self._tps[topic] = [TopicPartition(topic, p) for p in range(max(info.all_partitions) + 1)]
        if partition is None:
            if key is None or (not key and self._empty_key_keyless):
                partition = self._partitioner.keyless(
                    topic, size - _RECORD_OVERHEAD + RECORD_FRAMING, info.all_partitions, info.available_partitions
                )
            elif self._hash_keys:
                partition = partition_for_key(key, len(info.all_partitions))  # Partitioner.partition's rule
            else:
                partition = self._partitioner.partition(topic, key, info.all_partitions, info.available_partitions)
        pool = acc.pool
        if not pool.try_reserve(size):
            if deadline is None:
                deadline = self._loop.time() + self._max_block
            try:
                await pool.reserve(size, max(0.0, deadline - self._loop.time()))
            except KafkaError:
                self._metrics.record_send_error(1, self._loop.time())
                raise
            if self._state is not _STARTED or self._fatal is not None:
                pool.release(size)
                self._raise_not_open()
        if txn is not None and not txn.accepts(txn_generation):
            pool.release(size)  # the transaction ended while we waited
            txn.check_send(txn_generation)
        created = acc.batches_created
        future = acc.append(tps[partition], timestamp_ms, key, value, header_list, size)
        if acc.batches_created != created:
            # The sender has a round due (the batch before this one is complete, or a
            # linger ran out), or a connection cannot take a request until its reader reads
            # the answers that free it: the next send() lets them run first.
            now = self._loop.time()
            if (acc.next_round <= now or acc.blocked) and not acc.yield_wanted:
                acc.yield_wanted = 1  # not fewer turns than the clock asked for (another task's send)
            self._metadata.touch(topic, now)
        else:
            # No batch completes while every partition's open batch has room (many
            # partitions, or a large batch_size): look at the clock every so often too.
            sends = self._sends
            sends.count += 1
            if sends.count >= _SENDS_PER_CLOCK_CHECK:
                self._clock_check()
        if self._lanes_on and txn is None:
            lane = self._lanes.get(topic)
            if lane is None or lane.snapshot is not self._metadata.snapshot:
                self._open_lane(topic)
        return future

    def _clock_check(self) -> None:
        """Every _SENDS_PER_CLOCK_CHECK sends (the compiled lanes count them too): have the
        next send() yield if the sender's timer is overdue with nothing in flight, or the loop
        has not run for _MAX_UNYIELDED. Without the first, a tight loop that fills no batch
        held every record until it ended: the linger's timer cannot fire while the loop does
        not run. With requests in flight, reading their answers every 100 ms at most, not at
        each linger, lets batches over 1,000 partitions gather more (see docs/benchmarks.md)."""
        self._sends.count = 0
        acc = self._accumulator
        now = self._loop.time()
        overdue = not (acc.on_wire or acc.blocked) and -math.inf < acc.next_round <= now - _ROUND_OVERDUE
        if overdue or now - self._last_yield >= _MAX_UNYIELDED:
            # The timer overdue, with nothing in flight (whose answers pace the rounds; -inf:
            # a round is pending already); or answers to read, and the round they wake.
            acc.yield_wanted = _TURNS_FOR_A_ROUND

    def _batch_filled(self, batch: ProducerBatch) -> None:
        """A compiled lane's record filled its batch (RecordAccumulator.filled)."""
        self._accumulator.filled(batch)

    def _open_lane(self, topic: str) -> None:
        """Give ``topic`` a compiled lane for the current metadata snapshot, once send()'s own
        path has seen the topic through it (its partitions known, its TopicPartitions made)."""
        assert speedups is not None
        snapshot = self._metadata.snapshot
        info = snapshot.topics.get(topic)
        tps = self._tps.get(topic)
        if info is None or not info.partitions or tps is None or len(tps) < len(info.all_partitions):
            return
        lanes = self._lanes
        if lanes and next(iter(lanes.values())).snapshot is not snapshot:
            lanes.clear()  # every lane is for one snapshot: none keeps an old one alive
        acc = self._accumulator
        lanes[topic] = speedups.SendLane(
            topic=topic,
            producer=self,
            sends=self._sends,
            metadata=self._metadata,
            snapshot=snapshot,
            tps=tps,
            batches=acc.open_batches,
            pool=acc.pool,
            sticky=self._partitioner.sticky_states,
            available=info.available_partitions,
            partitions=len(info.all_partitions) if self._hash_keys else 0,
            overhead=_RECORD_OVERHEAD,
            framing=RECORD_FRAMING,
            size_limit=self._size_limit,
            batch_size=self.config.batch_size,
            clock_every=_SENDS_PER_CLOCK_CHECK,
        )

    async def send_many(
        self,
        topic: str,
        values: Sequence[Any],
        *,
        keys: Sequence[Any] | None = None,
        headers: Sequence[Iterable[tuple[str, bytes | None]] | None] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[list[RecordMetadata]]:
        """Queue many records for one topic; one future for all their acknowledgements.

        The bulk path: records carry no future each, which makes it several times cheaper
        per record than ``send``. ``keys`` and ``headers``, when given, run parallel to
        ``values`` (each a sequence, or an iterator, made a list); all records get the same
        timestamp (``timestamp_ms``, or now). The future resolves with the metadata in input
        order once every record is acknowledged, or fails with
        :class:`~aioprod.errors.SendManyError` (whose
        ``results`` hold each record's metadata or error) once every record has an outcome
        and any failed.

        Every record is checked (and serialized) before any is queued, so a bad one raises
        with nothing sent. ``max_block_ms`` bounds the wait for metadata and each wait for
        buffer memory, not the whole call: one larger than the buffer goes on as the broker
        makes room. If queuing stops part-way (the buffer stayed full past ``max_block_ms``,
        or the producer closed), the records not queued fail in the returned future with
        that error, and the ones queued are delivered.
        """
        if self._state is not _STARTED or self._fatal is not None:
            self._raise_not_open()
        self._check_loop()
        txn = self._txn
        txn_generation = 0 if txn is None else txn.check_send()
        topic = check_topic_name(topic)
        values = _many_argument("values", values)
        count = len(values)
        if keys is not None:
            keys = _many_argument("keys", keys, count)
        if headers is not None:
            headers = _many_argument("headers", headers, count)
        if timestamp_ms is None:
            timestamp_ms = _now_ms()
        elif type(timestamp_ms) is not int or not 0 <= timestamp_ms <= INT64_MAX:
            raise (TypeError if type(timestamp_ms) is not int else ValueError)(
                f"timestamp_ms must be an int >= 0 and < 2**63, got {timestamp_ms!r}"
            )
        if partition is not None and (type(partition) is not int or partition < 0):
            raise (TypeError if type(partition) is not int else ValueError)(
                f"partition must be an int >= 0 or None, got {partition!r}"
            )
        # A snapshot of what is checked: the caller's list may change while this call waits (between
        # runs, for memory), and what is queued must be what was checked.
        if type(values) is not tuple:
            values = list(values)
        if keys is not None and type(keys) is not tuple:
            keys = list(keys)
        try:
            values, keys, header_lists = self._check_many(values, keys, headers)  # before any wait
        except KafkaError:  # a record too large: none of them is queued
            self._metrics.record_send_error(count, self._loop.time())
            raise
        loop = self._loop
        deadline: float | None = None  # set by a wait for metadata: the first wait for memory shares it
        info = self._metadata.snapshot.topics.get(topic)
        if info is None or not info.partitions or (partition is not None and partition not in info.partitions):
            deadline = loop.time() + self._max_block
            info = await self._wait_for_topic(topic, partition, count)
        self._metadata.touch(topic)
        tps = self._tps.get(topic)
        if tps is None or len(tps) < len(info.all_partitions):
            tps = self._tps[topic] = [TopicPartition(topic, p) for p in range(max(info.all_partitions) + 1)]

        acc, pool, partitioner = self._accumulator, self._accumulator.pool, self._partitioner
        group = SendGroup(topic, count, timestamp_ms)
        all_partitions, available = info.all_partitions, info.available_partitions
        # Without headers, runs of records go to one partition (explicit, or the sticky
        # one for keyless records) and are encoded in one builder call per run.
        bulk = header_lists is None
        if partition is None:
            bulk = bulk and keys is None and partitioner.is_sticky
        # A user partitioner may raise or answer a partition that is refused: ask it for every
        # record before any is queued, so that a refusal leaves nothing sent.
        chosen_for: list[int] | None = None
        if partition is None and partitioner.user_defined:
            chosen_for = [
                partitioner.partition(topic, None if keys is None else keys[i], all_partitions, available)
                for i in range(count)
            ]
        index = unyielded = 0
        if txn is not None:
            txn.queuing += 1  # a commit waits until this call has queued all it will
        try:
            while index < count:
                if txn is not None:
                    txn.check_send(txn_generation)  # still the transaction this call began in
                if bulk:
                    chosen = (
                        partition if partition is not None else partitioner.sticky(topic, all_partitions, available)
                    )
                    run, reserved = acc.append_run(tps[chosen], values, keys, index, count, group)
                    if run:
                        if partition is None:  # then keys is None: what the values take
                            partitioner.count_sticky(
                                topic, reserved - run * (_RECORD_OVERHEAD - RECORD_FRAMING), available
                            )
                        index += run
                        await asyncio.sleep(0)  # a batch was filled: let the sender drain it
                        if index < count and (self._state is not _STARTED or self._fatal is not None):
                            self._raise_not_open()  # closed meanwhile: the rest fail in the group
                        continue
                # One record at a time: headers, keys to hash, or a full buffer.
                value = values[index]
                key = None if keys is None else keys[index]
                header_list = () if header_lists is None else header_lists[index]
                size = acc.record_size(key, value, header_list)
                # The partition first, as send() does: a partitioner that raises then holds no memory.
                if partition is not None:
                    chosen = partition
                elif chosen_for is not None:
                    chosen = chosen_for[index]
                elif key is None or (not key and self._empty_key_keyless):
                    chosen = partitioner.keyless(
                        topic, size - _RECORD_OVERHEAD + RECORD_FRAMING, all_partitions, available
                    )
                else:
                    chosen = partitioner.partition(topic, key, all_partitions, available)
                if not pool.try_reserve(size):
                    # max_block_ms bounds each wait for memory, counted from its start: a call
                    # larger than the buffer, queuing as the broker takes its records, goes on.
                    await pool.reserve(size, self._max_block if deadline is None else max(0.0, deadline - loop.time()))
                    deadline = None
                    if self._state is not _STARTED or self._fatal is not None:
                        pool.release(size)
                        self._raise_not_open()
                    if txn is not None and not txn.accepts(txn_generation):
                        pool.release(size)
                        txn.check_send(txn_generation)
                created = acc.batches_created
                acc.append_to_group(tps[chosen], key, value, header_list, size, group, index)
                index += 1
                unyielded += 1
                if unyielded >= _MANY_UNYIELDED or (acc.batches_created != created and len(acc.queue(tps[chosen])) > 1):
                    # A batch is full, or many records went in: let the sender and the loop's other
                    # tasks run, as the bulk path does after each run. Otherwise a keyed call, or
                    # one with headers, was queued in one step of the loop until the buffer was
                    # full, with nothing sent meanwhile.
                    unyielded = 0
                    await asyncio.sleep(0)
                    if index < count and (self._state is not _STARTED or self._fatal is not None):
                        self._raise_not_open()  # closed meanwhile: the rest fail in the group
        except KafkaError as exc:
            # The rest could not be queued: they fail in the group, the queued ones deliver.
            group.failed(index, count - index, exc)
            self._metrics.record_send_error(count - index, loop.time())
            if txn is not None and (
                index or not isinstance(exc, TransactionStateError | ProducerFatalError | ProducerClosedError)
            ):
                # Part of the records are in the transaction: it must not commit without the rest
                # (as Java's doSend: a send that fails makes the transaction abortable).
                txn.partly_queued(txn_generation, exc)
        except BaseException as exc:
            group.truncate(index)
            if index:
                # The first ``index`` records are queued and go on: their outcome, for the telemetry.
                exc._aioprod_queued = (index, group.future)  # type: ignore[attr-defined]
                if txn is not None:  # nor when the call is cancelled part-way
                    txn.partly_queued(
                        txn_generation,
                        TransactionAbortableError(
                            f"send_many() stopped after queuing {index} of {count} records ({exc!r})"
                        ),
                    )
            raise
        finally:
            if txn is not None:
                txn.queued_done()
        return group.future

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None,
    ) -> RecordMetadata:
        """Queue a record and wait for its acknowledgement.

        Cancelling the wait does not withdraw the record: once queued it is delivered.
        """
        future = await self.send(topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers)
        return await asyncio.shield(future)

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now, without waiting for linger, and wait for every record's
        outcome (an acknowledgement or a failure: flush itself does not raise for them).

        ``timeout`` (seconds; None: as long as the records' ``delivery_timeout_ms``) bounds
        the wait; :class:`~aioprod.errors.KafkaTimeoutError` when it runs out, with the
        records still on their way.
        """
        timeout = check_timeout("flush", timeout)
        if self._state not in (_STARTED, _CLOSING):
            return
        self._check_loop()
        acc = self._accumulator
        pending = [batch.settlement.future for batch in acc.incomplete]
        if not pending:
            return
        acc.flushing += 1
        self._wakeup()
        started = self._loop.time()
        try:
            done, _ = await asyncio.wait(pending, timeout=timeout)
            if len(done) < len(pending):
                raise KafkaTimeoutError(f"flush did not complete within {timeout}s")
        finally:
            acc.flushing -= 1
            self._metrics.record_flush(self._loop.time() - started)

    async def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids, fetching metadata if needed (up to max_block_ms)."""
        if self._state != _STARTED:
            self._raise_not_open()
        self._check_loop()
        topic = check_topic_name(topic)
        info = await self._metadata.topic(topic, self._max_block)
        return list(info.all_partitions)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (the next offset to be written), from its leader.

        Useful to check what a run wrote: the end offset advances by one per record.
        """
        if self._state != _STARTED:
            self._raise_not_open()
        self._check_loop()
        topic = check_topic_name(topic)
        info = await self._metadata.topic(topic, self._max_block)
        by_leader: dict[int, list[int]] = {}
        for partition in info.all_partitions:
            leader = self._metadata.snapshot.leader_for(topic, partition)
            if leader is None:
                raise LeaderNotAvailableError(f"{topic}-{partition} has no leader")
            by_leader.setdefault(leader, []).append(partition)
        offsets: dict[int, int] = {}
        for leader, partitions in by_leader.items():
            conn = await self._pool.get(leader)
            request = ListOffsetsRequest(
                replica_id=-1,
                topics=[
                    ListOffsetsRequestTopic(
                        name=topic,
                        partitions=[ListOffsetsRequestPartition(partition_index=p, timestamp=-1) for p in partitions],
                    )
                ],
            )
            response: ListOffsetsResponse = await conn.send(request)
            for t in response.topics:
                for p in t.partitions:
                    if p.error_code:
                        raise error_for_code(p.error_code, f"ListOffsets {topic}-{p.partition_index}")
                    offsets[p.partition_index] = p.offset
        return dict(sorted(offsets.items()))

    def metrics(self) -> dict[str, float]:
        """The producer's metrics now, by the Java producer's names (``record-send-total``,
        ``request-latency-avg``, ``buffer-available-bytes``, ...; see docs/observability.md).

        Counts since the producer was created; rates, averages and maxima over the last
        ``metrics_num_samples`` x ``metrics_sample_window_ms`` (NaN: nothing in the window).
        Safe to call from any thread, and after close.
        """
        return self._metrics.snapshot().producer

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Every metric at one moment: producer-wide, per topic and per broker."""
        return self._metrics.snapshot()

    # -- transactions ------------------------------------------------------------------

    @property
    def in_transaction(self) -> bool:
        """A transaction is open (begun, not yet committed or aborted)."""
        return self._txn is not None and self._txn.in_transaction

    def begin_transaction(self) -> Awaitable[None]:
        """Start a transaction: records sent until it commits are written atomically, and
        only readers with ``isolation.level=read_committed`` see them, once committed.

        Begins at once; ``await producer.begin_transaction()`` (aiokafka's and confluent-kafka's
        AIOProducer's spelling) is taken too."""
        last = self._pool.last_opened
        self._transactions("begin_transaction").begin(self._pool.connections() or ([] if last is None else [last]))
        return _BEGUN

    async def commit_transaction(self) -> None:
        """Deliver every record of the transaction, then commit it.

        Raises :class:`~aioprod.errors.TransactionAbortableError` if a record failed or the
        broker refused the commit: abort, then the producer can go on. Bounded by
        ``max_block_ms``; a :class:`~aioprod.errors.KafkaTimeoutError` leaves the commit
        running, and calling ``commit_transaction()`` again waits for it.
        """
        txn = self._transactions("commit_transaction")
        await txn.run("commit_transaction", lambda: txn.commit(self._settle_transaction))

    async def abort_transaction(self) -> None:
        """Abort the transaction: records not sent yet fail with
        :class:`~aioprod.errors.TransactionAbortedError`, those written are never visible
        to ``read_committed`` readers."""
        txn = self._transactions("abort_transaction")
        await txn.run("abort_transaction", lambda: txn.abort(self._fail_unsent, self._settle_transaction))

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group: str | ConsumerGroupMetadata | Any,
    ) -> None:
        """Commit a consumer's offsets as part of the transaction (consume-transform-produce).

        ``offsets`` maps each input partition to the next offset to read (an ``int`` or an
        :class:`OffsetAndMetadata`); ``group`` is the consumer's group id or its group
        metadata (KIP-447: generation, member id, instance id), so that a consumer that was
        fenced out of its group cannot commit.
        """
        txn = self._transactions("send_offsets_to_transaction")
        checked, metadata = as_offsets(offsets), as_group(group)
        await txn.run(
            "send_offsets_to_transaction",
            lambda: txn.send_offsets(checked, metadata),
            key=(frozenset(checked.items()), metadata),
        )

    async def prepare_transaction(self) -> PreparedTransaction:
        """Deliver every record of the transaction and leave it open, for another process to
        commit or abort: the first phase of a two-phase commit.

        Returns the transaction's :class:`PreparedTransaction` (transactional id, producer id,
        epoch, and the cluster's id): plain data that crosses processes. Any producer ends it with
        :meth:`commit_prepared_transaction` or :meth:`abort_prepared_transaction`; until then
        ``read_committed`` readers see none of it, and the coordinator aborts it when
        ``transaction_timeout_ms`` passes. This producer can then only close, and ``close()``
        leaves the transaction open (it aborts it only if no call returned the handle: a
        :class:`~aioprod.errors.KafkaTimeoutError` that was not followed by another call). A
        newer producer with the same ``transactional_id`` fences it (aborts it). Raises as
        :meth:`commit_transaction` does when the transaction cannot commit, and
        :class:`~aioprod.errors.TransactionStateError` for an empty one.
        """
        txn = self._transactions("prepare_transaction")
        if txn.prepared is None:
            await txn.run("prepare_transaction", lambda: txn.prepare(self._settle_transaction))
        return txn.hand_over()

    async def commit_prepared_transaction(self, prepared: PreparedTransaction) -> None:
        """Commit a transaction another producer prepared (see :meth:`prepare_transaction`).

        Any producer can: it needs no ``transactional_id`` of its own. Committing again what is
        committed succeeds, so a commit whose outcome is unknown (it raised
        :class:`~aioprod.errors.KafkaTimeoutError`) can simply be repeated. Raises
        :class:`~aioprod.errors.PreparedTransactionError` when the transaction is no longer open
        under its epoch: fenced by a newer producer with its transactional id, aborted by the
        coordinator after its timeout, or aborted already; its records will never be visible.
        Raises it too, sending no EndTxn there, when this producer's brokers are another cluster
        than the handle's (asked before each EndTxn, a retry's included; after an unanswered
        EndTxn to the handle's cluster, a :class:`~aioprod.errors.KafkaError` saying the outcome
        is in doubt). Bounded by ``max_block_ms``.
        """
        await self._end_prepared("commit_prepared_transaction", prepared, commit=True)

    async def abort_prepared_transaction(self, prepared: PreparedTransaction) -> None:
        """Abort a transaction another producer prepared (see :meth:`prepare_transaction`).

        Raises :class:`~aioprod.errors.PreparedTransactionError` when it is no longer open under
        its epoch (fenced, timed out, committed already). Bounded by ``max_block_ms``.
        """
        await self._end_prepared("abort_prepared_transaction", prepared, commit=False)

    async def _end_prepared(self, name: str, prepared: PreparedTransaction, *, commit: bool) -> None:
        if not isinstance(prepared, PreparedTransaction):
            raise TypeError(f"{name}() takes a PreparedTransaction, got {type(prepared).__name__}")
        if self._txn is not None:
            self._txn.check_handle(prepared)
        # Only a commit can be in doubt (see end_prepared); only an EndTxn written makes it so.
        sent_before = commit and prepared in self._commits_unanswered
        written = False

        def on_wire() -> None:
            nonlocal written
            written = True

        try:
            await self._coordinator_call(
                f"{name}({prepared.transactional_id!r})",
                lambda: end_prepared(
                    self._coordinators,
                    prepared,
                    commit=commit,
                    cluster_named_by=self._metadata.cluster_named_by,
                    sent_before=sent_before,
                    on_wire=on_wire,
                ),
            )
        except PreparedTransactionError:
            self._commits_unanswered.discard(prepared)  # not open, never committed: nothing in doubt
            raise
        except BaseException:
            # A timeout, a cancellation, the outcome in doubt, any other failure: an EndTxn it wrote
            # may have committed, and a repeat refused PRODUCER_FENCED must not say "never visible".
            if commit and written:
                self._commits_unanswered.add(prepared)
            raise
        self._commits_unanswered.discard(prepared)

    async def _committed_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """The offsets committed for a consumer group (stable: waits out transactions ending).
        Not public API: aioprod.spark's exactly-once writes read their commit markers with it."""
        return await self._coordinator_call(
            f"OffsetFetch for group {group_id!r}", lambda: committed_offsets(self._coordinators, group_id)
        )

    async def _fence(self, transactional_id: str) -> None:
        """Abort what ``transactional_id`` has open and fence its producer, as a new producer of
        that id would. Not public API: aioprod.spark's exactly-once writes end with it the
        transactions of tasks they stopped, which never handed theirs back."""
        await self._coordinator_call(
            f"InitProducerId for {transactional_id!r}",
            lambda: fence_transactional_id(self._coordinators, transactional_id, self.config.transaction_timeout_ms),
        )

    async def _coordinator_call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run a request to a coordinator, retried as its answers allow, within ``max_block_ms``."""
        if self._state != _STARTED:
            self._raise_not_open()
        self._check_loop()  # its connections are the loop's (and, in a forked child, the parent's)
        try:
            async with asyncio.timeout(self._max_block) as deadline:
                return await call()
        except TimeoutError:
            if not deadline.expired():
                raise
            last = self._coordinators.last_error
            raise KafkaTimeoutError(
                f"{what} did not complete within max_block_ms ({self.config.max_block_ms} ms)"
                + (f"; the last answer: {last}" if last is not None else "")
            ) from None

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Producer]:
        """``async with producer.transaction():`` begins a transaction, commits it when the
        block ends, and aborts it (re-raising) when the block raises or the commit cannot
        happen (:class:`~aioprod.errors.TransactionAbortableError`, or
        :class:`~aioprod.errors.ProducerFatalError` when the producer itself failed: its abort
        is what is left, and read_committed readers would otherwise wait for the transaction's
        timeout)."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            await self._abort_if_open()
            raise
        try:
            await self.commit_transaction()
        except TransactionAbortableError:
            await self._abort_if_open()
            raise
        except ProducerFatalError as exc:
            try:
                await self._abort_if_open()
            except KafkaError as abort_failed:  # (fenced: the coordinator aborts it, or has)
                exc.add_note(f"its abort failed too: {abort_failed}")
            raise

    async def _abort_if_open(self) -> None:
        if self.in_transaction:
            await self.abort_transaction()

    def _transactions(self, name: str) -> TransactionManager:
        if self._state is _STARTED:
            self._check_loop()
        txn = self._txn if self._state is _STARTED else None
        if txn is None:
            if self._state is not _STARTED:
                self._raise_not_open()
            raise TransactionStateError(f"{name}() needs a transactional producer: set transactional_id")
        return txn

    def _fail_unsent(self, cause: KafkaError) -> None:
        self._sender.fail_aborted(cause)

    async def _settle_transaction(self) -> None:
        """Every record of the transaction has its outcome, and nothing is on the wire:
        an EndTxn must not overtake a produce request (it would leave that write outside)."""
        await self.flush()
        await self._sender.quiet()

    def cluster(self) -> ClusterSnapshot:
        """The producer's metadata cache: brokers, and the topics it has sent to (partitions,
        leaders). Empty until the first metadata answer, after ``start()``; not the cluster's
        topic list (``aioprod metadata`` gives that)."""
        if self._state == _NEW:
            self._raise_not_open()
        return self._metadata.snapshot

    # -- validation ------------------------------------------------------------------

    def _check_many(
        self,
        values: Sequence[Any],
        keys: Sequence[Any] | None,
        headers: Sequence[Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None] | None,
    ) -> tuple[Sequence[bytes | None], Sequence[bytes | None] | None, list[Headers] | None]:
        """Serialize and check every record of a ``send_many`` before any is queued."""
        room = self._size_limit - _RECORD_OVERHEAD
        if (
            headers is None
            and self._value_serializer is None
            and self._key_serializer is None
            and _plain_payloads(values, keys, room)
        ):
            return values, keys, None
        if self._value_serializer is not None:  # None too, as send() does
            values = [_serialized("value", self._value_serializer(v)) for v in values]
        elif any(v is not None and type(v) is not bytes for v in values):
            values = [v if v is None or type(v) is bytes else _as_bytes("value", v) for v in values]
        if self._key_serializer is not None:
            given = keys if keys is not None else [None] * len(values)
            keys = [_serialized("key", self._key_serializer(k)) for k in given]
        elif keys is not None and any(k is not None and type(k) is not bytes for k in keys):
            keys = [k if k is None or type(k) is bytes else _as_bytes("key", k) for k in keys]
        header_lists = None if headers is None else [() if h is None else _check_headers(h) for h in headers]
        acc = self._accumulator
        for i, value in enumerate(values):
            payload = (0 if value is None else len(value)) + (0 if keys is None or keys[i] is None else len(keys[i]))
            if payload > room or header_lists:
                key = None if keys is None else keys[i]
                header_list = header_lists[i] if header_lists else ()
                size = acc.record_size(key, value, header_list)
                if size > self._size_limit:
                    acc.check_size(size, key, value, header_list)
        return values, keys, header_lists

    def _check_loop(self) -> None:
        """Only on the loop it was started on: its tasks, connections and timers live there, and
        on another one a call waited out its timeout and failed for a reason it did not give.
        (Checked where a call may wait, not per record.)"""
        if self._forked_copy():
            self._refuse_in_forked_child()
        running: asyncio.AbstractEventLoop | None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            # begin_transaction() is synchronous: callable between the loop's runs, but not
            # from another thread while the loop runs there.
            if not self._loop.is_running():
                return
            running = None
        if running is not self._loop:
            raise RuntimeError(_OTHER_LOOP)

    async def _wait_for_topic(self, topic: str, partition: int | None, records: int) -> TopicInfo:
        """The topic's metadata, waited for (at most ``max_block_ms``): a failure counts the
        ``records`` it leaves unqueued as errors; a close begun meanwhile refuses them (as
        docs/delivery.md says)."""
        try:
            info = await self._metadata.topic(topic, self._max_block, partition)
        except KafkaError:
            self._metrics.record_send_error(records, self._loop.time())
            raise
        if self._state is not _STARTED or self._fatal is not None:
            self._raise_not_open()
        return info

    def _refuse_off_its_loop(self) -> None:
        """send()'s check failed: refused, unless this is the producer's loop after all (one whose
        _thread_id is not kept up to date, or a new run of it)."""
        running = _get_running_loop()
        if self._forked_copy() and self._state is not _CLOSED:
            # Even where the child runs its copy of the loop: the connections, producer id and
            # sequence numbers are the parent's (a parent's next record, acknowledged as a
            # duplicate of the child's, was never written).
            self._refuse_in_forked_child()
        if self._state is _STARTED and self._fatal is None and running is self._loop:
            if type(self._runs_on) is _RunOf:
                self._runs_on = _RunOf()
            return
        if running is None and self._state is _STARTED:
            raise RuntimeError(_OTHER_LOOP)  # trio's, say: not asyncio's "no running event loop"
        self._raise_not_open()

    def _forked_copy(self) -> bool:
        return type(getattr(self, "_runs_on", None)) is _Nobody

    def _refuse_in_forked_child(self) -> NoReturn:
        # Not _OTHER_LOOP: its advice (SyncProducer) fails in a forked child too.
        raise RuntimeError(
            f"this producer was started in process {self._runs_on.parent}, and this is a forked child "
            f"(process {os.getpid()}): a producer's connections, producer id and sequence numbers are "
            "its parent's; create a new Producer in the child after fork"
        )

    def _raise_not_open(self) -> NoReturn:
        if self._state is _STARTED:
            self._check_loop()  # a producer whose loop shut down, used from the next one (a closed one says closed)
        if self._fatal is not None and self._state is _STARTED:
            raise ProducerFatalError(f"the producer failed and accepts no more records: {self._fatal}") from self._fatal
        if self._state == _NEW:
            raise ProducerClosedError("the producer is not started: use 'async with' or await start() first")
        raise ProducerClosedError(f"the producer is {self._state}; no more records are accepted")


_OTHER_LOOP = (
    "this producer was started on another event loop: a Producer belongs to the loop it was "
    "started on (one producer per loop; from threads or several asyncio.run() calls, use SyncProducer)"
)

#: send()'s check compares _current() with its producer's ``_runs_on._thread_id`` (see start()).
_EXACT = sys.version_info >= (3, 12)
#: 3.11, compiled, with asyncio's own running-loop holders (its C accelerator): _RunOf.
_running_loop_holder: Callable[[], object] | None = (
    getattr(speedups, "running_loop_holder", None) if isinstance(_get_running_loop, BuiltinFunctionType) else None
)
_current: Callable[[], Any] = (
    _get_running_loop if _EXACT else _get_ident if _running_loop_holder is None else _running_loop_holder
)
#: A _thread_id that _current() never returns.
_NO_RUN = object()


class _LoopIs:
    """From 3.12 on: the loop itself, compared with the running loop."""

    __slots__ = ("_thread_id",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread_id = loop


class _RunOf:
    """3.11, compiled: the loop's current run, by the holder 3.11 keeps a thread's running loop
    in. The holder is a new object each time a loop starts or stops running in a thread, so it
    is ours only in the thread and the run it was taken in: exact, for a dict lookup (~40 ns)
    where asking for the running loop costs ~180 ns (a system call). Taken while the loop runs:
    in start(), and by the check that a new run of the loop fails once."""

    __slots__ = ("_thread_id",)

    def __init__(self) -> None:
        assert _running_loop_holder is not None
        holder = _running_loop_holder()
        self._thread_id = _NO_RUN if holder is None else holder


class _RunningHere:
    """3.11, pure Python, a loop that does not say which thread runs it (uvloop): this thread
    while the loop runs in it. Exact, at the ~180 ns 3.11 asks for the running loop: the thread
    of the last send found on the loop took, after the loop moved to another thread, a send from
    the thread that ran it before, whose future then raised on the caller's loop though the
    record was delivered (a retry wrote it twice)."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def _thread_id(self) -> int | None:
        return _get_ident() if _get_running_loop() is self._loop else None


class _Nobody:
    """A forked child's copy of a started producer: its loop runs in no thread of this process
    (on 3.11 the copied loop still named the forking thread, and a child's send was taken).
    ``parent``: the process that started it."""

    __slots__ = ("parent",)
    _thread_id = _NO_RUN

    def __init__(self, parent: int) -> None:
        self.parent = parent


_started: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for producer in list(_started):
        if not producer._forked_copy():  # (a grandchild: the producer is still its grandparent's)
            producer._runs_on = _Nobody(os.getppid())  # the process that forked: the one that started it
        sender = getattr(producer, "_sender", None)  # None: its start() failed early
        if sender is not None:
            sender.forked = True
        pool = getattr(producer, "_pool", None)
        if pool is not None:
            pool.forked()
        producer._metrics.forked()
    for loop in {id(producer._loop): producer._loop for producer in list(_started)}.values():
        _own_epoll(loop)


def _own_epoll(loop: asyncio.AbstractEventLoop) -> None:
    """Give a forked child's copy of ``loop`` an epoll instance of its own, watching what the copy
    watched. The copy shared its parent's: each descriptor it stopped watching (asyncio.run()'s
    exit closes the loop's self-pipe and cancels a connect under way) the parent's loop stopped
    watching too, and slept through its threads' wake-ups (a getaddrinfo) and that connect until a
    timer woke it. (uvloop's copy keeps libuv's shared instance: not reachable from here.)"""
    epoll_selector = getattr(selectors, "EpollSelector", None)  # Linux's
    selector = getattr(loop, "_selector", None)
    if epoll_selector is None or not isinstance(selector, epoll_selector) or selector._selector.closed:
        return
    shared = selector._selector
    with select.epoll() as private:
        for key in selector.get_map().values():
            mask = (select.EPOLLIN if key.events & selectors.EVENT_READ else 0) | (
                select.EPOLLOUT if key.events & selectors.EVENT_WRITE else 0
            )
            with contextlib.suppress(OSError):  # a descriptor closed since it was registered
                private.register(key.fd, mask)
        os.dup2(private.fileno(), shared.fileno(), inheritable=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_timeout(method: str, timeout: Any, name: str = "timeout") -> float | None:
    """A ``timeout`` argument (seconds, or None) as a float: refused by name before anything
    starts. Any real number is taken (numpy's, a Fraction), but not a bool."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{method}() {name} must be a number of seconds or None, got {type(timeout).__name__}")
    seconds = float(timeout)
    if math.isnan(seconds):
        raise ValueError(f"{method}() {name} must be a number of seconds or None, got nan")
    return seconds


def _as_bytes(field: str, data: Any) -> bytes:
    """Any bytes-like ``data`` as exact ``bytes`` (a subclass of bytes too: the encoders take only bytes)."""
    if isinstance(data, _BYTES):
        return bytes(data)
    raise TypeError(
        f"{field} must be bytes or None, got {type(data).__name__}; pass {field}_serializer= to send other types"
    )


def _serialized(field: str, data: Any) -> bytes | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, _BYTES):
        return bytes(data)
    raise TypeError(f"{field}_serializer returned {type(data).__name__}, expected bytes or None")


def _many_argument(name: str, given: Any, count: int | None = None) -> Sequence[Any]:
    """``send_many``'s ``name`` argument as a sequence (an iterator made a list), refused by
    name if it is none, or, given the ``count`` of values, if it does not run parallel to them."""
    given = send_many_values(given)
    if not is_many_argument(given):
        what = "of values" if count is None else "parallel to values"
        raise TypeError(f"{name} must be a sequence {what} (a list, say), got {type(given).__name__}")
    if count is not None and len(given) != count:
        raise ValueError(f"{name} has {len(given)} items but values has {count}")
    return given


def is_many_argument(given: Any) -> TypeGuard[Sequence[Any]]:
    """``given`` is a sequence send_many takes for its values, keys or headers (not str or bytes)."""
    return isinstance(given, Sequence) and not isinstance(given, str | bytes | bytearray)


def send_many_values(values: Any) -> Any:
    """``send_many``'s values, a generator (any iterable but a sequence, a mapping, str or
    bytes) made a list, as SyncProducer.send_many takes it; anything else as it is, for
    send_many to take or refuse. (The telemetry wrapper counts them first, through this.)"""
    if isinstance(values, Sequence | Mapping | str | bytes | bytearray) or not isinstance(values, Iterable):
        return values
    return list(values)


def check_topic_name(name: Any) -> str:
    """Kafka's rules for a topic name (TypeError or ValueError saying which one it breaks):
    checked before anything waits for metadata of a topic no broker can have. Returns the
    name as an exact ``str``: a ``StrEnum`` member names its value."""
    if not isinstance(name, str):
        raise TypeError(f"topic must be a str, got {type(name).__name__}")
    topic = name if type(name) is str else str.__str__(name)
    if not topic:
        raise ValueError("topic name is empty")
    if len(topic) > _MAX_TOPIC_LENGTH:
        raise ValueError(f"topic name is {len(topic)} characters long; the limit is {_MAX_TOPIC_LENGTH}")
    if topic in (".", "..") or not _LEGAL_TOPIC.fullmatch(topic):
        raise ValueError(f"illegal topic name {topic!r}: use only ASCII letters, digits, '.', '_' and '-'")
    return topic


def _check_headers(headers: Any) -> Headers:
    if headers is None:
        return ()
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    elif isinstance(headers, (str, bytes)) or not isinstance(headers, Iterable):
        raise TypeError(f"headers must be a list of (str, bytes | None) pairs, got {type(headers).__name__}")
    checked = []
    for item in headers:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"each header must be a (str, bytes | None) pair, got {item!r}")
        name, value = item
        if type(name) is not str:
            if not isinstance(name, str):
                raise TypeError(f"header name must be a str, got {type(name).__name__}")
            name = str.__str__(name)  # a StrEnum member: its value
        if not name.isascii():
            try:
                name.encode()
            except UnicodeEncodeError:
                raise ValueError(f"header name {name!r} is not valid Unicode (a lone surrogate)") from None
        if value is not None and not isinstance(value, _BYTES):
            raise TypeError(f"header {name!r} value must be bytes or None, got {type(value).__name__}")
        checked.append((name, value if value is None or type(value) is bytes else bytes(value)))
    return checked

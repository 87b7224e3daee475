"""One partition's unit of work: open a producer, send the partition's chunks through it, finish.

Both modes write through :class:`PartitionWrite`: the driver treats the whole DataFrame as
one partition, each executor task its own. The producer is a :class:`SyncProducer`: the
Spark side feeds it chunks from a plain thread, its event loop sends them with at most
``max_in_flight_rows`` unacknowledged, whose keys, values and headers take at most twice ``buffer_memory``
(beyond one chunk).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aioprod.config import ProducerConfig
from aioprod.errors import (
    AuthenticationError,
    InvalidProducerEpochError,
    InvalidTransactionTimeoutError,
    KafkaError,
    KafkaTimeoutError,
    PartitionNotFoundError,
    ProducerClosedError,
    ProducerFatalError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
    has_cause,
)
from aioprod.producer.batch import TopicPartition
from aioprod.producer.producer import Producer
from aioprod.producer.record_future import RecordFuture
from aioprod.producer.transactions import OffsetAndMetadata
from aioprod.spark.chunks import Chunk
from aioprod.spark.plan import Plan
from aioprod.spark.reachability import CONNECT_TIMEOUT, unreachable
from aioprod.spark.reports import RowError, Tally
from aioprod.sync import SyncProducer

log = logging.getLogger(__name__)

#: Called with ``(rows_written, rows_failed)`` so far; see ``write_dataframe(progress=)``.
ProgressCallback = Callable[[int, int], None]

_GRACE = 5.0


class _Stalled(Exception):
    """The watchdog's verdict (not a chunk's own ``TimeoutError``)."""


@dataclass
class _ChunkResult:
    written: int
    topics: Counter[str]
    failures: list[tuple[int, str | None, bytes | None, BaseException]]


class _LoopState:
    """Shared by the chunk coroutines of one writer, on the producer's loop."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.order = asyncio.Lock()  # queue chunks strictly one after another: keeps row order
        self.stopped = False
        self.fatal: BaseException | None = None
        #: Records queued or settled so far: the writer's watchdog reads it as the sign of life.
        self.progress = 0
        #: Topics of the topic column the cluster says do not exist, with the error their first row got.
        self.missing_topics: dict[str, KafkaTimeoutError] = {}
        #: Partitions of the partition column the cluster says their topic does not have, likewise:
        #: the producer proves each one missing over a few metadata refreshes (about 2 s a row).
        self.missing_partitions: dict[tuple[str, int], BaseException] = {}


async def _send_chunk(
    producer: Producer,
    chunk: Chunk,
    state: _LoopState,
    futures: list[RecordFuture | None],
    refused: list[tuple[int, str | None, bytes | None, BaseException]] | None = None,
) -> _ChunkResult:
    """Queue every row of the chunk in order, then wait for all their acknowledgements.

    ``futures`` gets one entry per row handled (None: refused before it was queued), which
    the writer reads after the producer closed if it gave up on the chunk.
    """
    plan = state.plan
    stop_at_first = plan.errors == "raise"
    # Rows refused before they were queued: the writer reads them too if it gave up on the chunk.
    failures: list[tuple[int, str | None, bytes | None, BaseException]] = [] if refused is None else refused
    n = len(chunk.values)
    topics = chunk.topics
    rows = zip(
        itertools.repeat(plan.topic, n) if topics is None else topics,
        chunk.values,
        itertools.repeat(None, n) if chunk.keys is None else chunk.keys,
        itertools.repeat(None, n) if chunk.partitions is None else chunk.partitions,
        itertools.repeat(None, n) if chunk.headers is None else chunk.headers,
        strict=True,
    )
    async with state.order:
        if state.stopped:
            return _ChunkResult(0, Counter(), [])
        send = producer.send
        add = futures.append
        missing = state.missing_topics
        missing_partitions = state.missing_partitions

        def fail_row(i: int, topic: str | None, key: bytes | None, exc: BaseException) -> bool:
            """The row failed (a settled row is a sign of life too); whether to stop here."""
            add(None)
            failures.append((i, topic, key, exc))
            state.progress += 1
            if stop_at_first:
                state.stopped = True
            return stop_at_first

        for i, (topic, value, key, partition, headers) in enumerate(rows):
            if missing and topic in missing:
                # Known missing: fail now, not after another max_block_ms. Not raised again: each
                # raise of the one error would add this chunk's frame to its traceback, for good.
                if fail_row(i, topic, key, missing[topic]):
                    break
                continue
            if missing_partitions and (topic, partition) in missing_partitions:
                if _lacks(producer, topic, partition):
                    if fail_row(i, topic, key, missing_partitions[topic, partition]):
                        break
                    continue
                # A partition added during the write: once the producer's metadata has it (at its
                # next refresh, metadata_max_age_ms at most), its rows are sent again.
                del missing_partitions[topic, partition]
            try:
                add(await send(topic, value, key, partition=partition, headers=headers))
                state.progress += 1
            except KafkaTimeoutError as exc:
                exc.__traceback__ = None  # kept: its frames (this one with the chunk) must not be
                if topics is not None and has_cause(exc, lambda e: isinstance(e, UnknownTopicOrPartitionError)):
                    # The topic column names a topic the cluster says does not exist: this row's fault.
                    missing[topic] = exc
                    if fail_row(i, topic, key, exc):
                        break
                    continue
                if partition is not None and _lacks(producer, topic, partition):
                    # The topic is known without this partition; max_block_ms ran out before the
                    # producer's refreshes proved it missing (they span retry_backoff_max_ms).
                    missing_partitions[topic, partition] = exc
                    if fail_row(i, topic, key, exc):
                        break
                    continue
                # Not this row's fault: the broker is unreachable or the buffer stays full.
                # Every further row would wait max_block_ms to fail too.
                state.fatal = exc
                state.stopped = True
                break
            except (ProducerClosedError, ProducerFatalError, AuthenticationError) as exc:
                # Not this row's fault either: refused credentials fail every row the same way (a
                # report of a million rows each naming the password is no report).
                state.fatal = exc
                state.stopped = True
                break
            except Exception as exc:
                exc.__traceback__ = None  # kept in the report: not with this chunk's frame
                if isinstance(exc, PartitionNotFoundError) and _lacks(producer, topic, exc.partition):
                    # The topic is known and this partition is not in it: its later rows fail at once.
                    # Only that verdict: a row's other ValueError (a header's name, a negative
                    # partition, refused at once) is no proof, and cached it failed the partition's
                    # later rows with that row's error (one entry per negative value).
                    missing_partitions[topic, exc.partition] = exc
                if fail_row(i, topic, key, exc):
                    break
    # Records are acknowledged a whole batch at a time, so awaiting them in order suspends
    # about once per batch (one asyncio.wait over all of them would add a callback to every
    # record's future). A record's failure is read below; our own cancellation propagates.
    for future in futures:
        if future is not None and not future.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(future)
            state.progress += 1
    written = 0
    counts: Counter[str] = Counter()
    keys = chunk.keys
    failures = list(failures)  # the delivery failures are not added to the shared list
    for i, future in enumerate(futures):
        if future is None:
            continue
        error = asyncio.CancelledError() if future.cancelled() else future.exception()
        if error is None:
            written += 1
            if topics is not None:
                counts[topics[i]] += 1
        else:
            topic = topics[i] if topics is not None else plan.topic
            failures.append((i, topic, None if keys is None else keys[i], error))
    if topics is None and plan.topic is not None and written:
        counts[plan.topic] = written
    if failures and stop_at_first:
        state.stopped = True
    failures.sort(key=lambda f: f[0])
    return _ChunkResult(written, counts, failures)


def _lacks(producer: Producer, topic: Any, partition: int) -> bool:
    """Does the producer's metadata know ``topic`` without ``partition``?"""
    info = producer.cluster().topics.get(topic)
    return info is not None and bool(info.partitions) and partition not in info.partitions


class PartitionWrite:
    """The unit of work of one partition: :meth:`open`, :meth:`write` each chunk, :meth:`finish`.

    :class:`TransactionalPartitionWrite` plugs into these steps (``_start``, ``_complete``).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        spark_partition: int | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.plan = plan
        self.spark_partition = spark_partition
        self.on_progress = on_progress
        self.tally = Tally()
        self._config = ProducerConfig.from_options(plan.options)
        self._producer: SyncProducer | None = None
        self._state = _LoopState(plan)
        self._pending: deque[
            tuple[Chunk, list[RecordFuture | None], list[Any], concurrent.futures.Future[_ChunkResult], int]
        ] = deque()
        self._pending_rows = 0
        #: Bytes of the keys, values and headers pending: rows of 1 MB each held 50 GB at 50,000 rows.
        self._pending_bytes = 0
        self._max_pending_bytes = 2 * self._config.buffer_memory
        #: Chunks the watchdog gave up on, with their records: what they delivered is counted once the producer closed.
        self._abandoned: list[tuple[Chunk, list[RecordFuture | None], list[Any]]] = []
        #: The watchdog tripped: chunks still unfinished are given up at once, not after a timeout each.
        self._stalled = False
        #: A row failed because another producer took the transactional id (see ``fenced``).
        self._row_fenced = False
        # While a chunk is written, a record is queued or settled at least once per buffer wait
        # (a second one stops the write) plus a record's delivery timeout: a chunk larger than
        # buffer_memory takes many of them, so only that long without either is a stall.
        self._chunk_timeout = (self._config.max_block_ms + self._config.delivery_timeout_ms) / 1000 + _GRACE

    def open(self) -> bool:
        """Start the producer, once a bootstrap server is known to answer; False if the write stopped.

        Called by the first non-empty :meth:`write`, or earlier to fail before reading input.
        """
        if self._producer is not None:
            return True
        if self._state.stopped:
            return False
        config = self._config
        reason = unreachable(config.bootstrap_servers, min(config.max_block_ms / 1000, CONNECT_TIMEOUT))
        if reason is not None:
            self._stop(reason)
            return False
        try:
            return self._start()
        except BaseException:
            try:
                self._close(0)  # a producer it opened (a transaction it began is aborted), not left to its finalizer
            except Exception as exc:  # (its loop stuck, as the start's wait was): the start's error is the one raised
                log.warning("could not close the producer of a write whose start failed: %r", exc)
            raise

    def _start(self) -> bool:
        """Open the producer; False if the write cannot go on."""
        self._producer = SyncProducer(self.plan.options)
        return True

    def _stop(self, reason: str | None) -> None:
        """Read no more input; ``reason`` (None: nothing went wrong) is why the write stopped."""
        self._state.stopped = True
        if reason is not None and self.tally.aborted is None:
            self.tally.aborted = reason

    def write(self, chunk: Chunk) -> bool:
        """Hand a chunk over; False once the write has stopped (read no more input)."""
        if self._state.stopped:
            return False
        if not chunk.values:
            return True
        if not self.open():
            return False
        # A chunk (one Arrow batch: 10,000 rows by default) was queued whole: max_in_flight_rows=100
        # left 10,000 rows unacknowledged. In slices of at most max_in_flight_rows, the bound holds.
        limit = self.plan.max_in_flight_rows
        for start in range(0, len(chunk.values), limit):
            if not self._write(chunk if len(chunk.values) <= limit else _slice(chunk, start, start + limit)):
                return False
        return True

    def _write(self, chunk: Chunk) -> bool:
        assert self._producer is not None
        size = _payload_bytes(chunk)
        while self._pending and (
            self._pending_rows + len(chunk.values) > self.plan.max_in_flight_rows
            or self._pending_bytes + size > self._max_pending_bytes
        ):
            self._collect_oldest()
        futures: list[RecordFuture | None] = []
        refused: list[Any] = []
        submitted = self._producer.submit(_send_chunk, chunk, self._state, futures, refused)
        self._pending.append((chunk, futures, refused, submitted, size))
        self._pending_rows += len(chunk.values)
        self._pending_bytes += size
        while self._pending and self._pending[0][3].done():
            self._collect_oldest()
        return not self._state.stopped

    def finish(self) -> Tally:
        """Wait for every chunk, close the producer, return the tally."""
        try:
            while self._pending:
                self._collect_oldest()
            self._complete()
        finally:
            self._close(self.plan.close_timeout)
        self._count_abandoned()
        if self._state.fatal is not None and self.tally.aborted is None:
            fatal = self._state.fatal
            self.tally.aborted = f"{type(fatal).__name__}: {fatal}"
        return self.tally

    def _complete(self) -> None:
        """Every chunk is settled: an at-least-once write has nothing more to do."""

    def abort(self, *, interrupted: bool) -> None:
        """The input failed, or the caller was interrupted: stop and close.

        Rows already queued are delivered (within ``close_timeout``), unless ``interrupted``
        (``KeyboardInterrupt`` and the like), which closes at once and fails what is pending.
        """
        self._state.stopped = True
        self._close(0 if interrupted else self.plan.close_timeout)
        self._count_abandoned()

    def _close(self, timeout: float | None) -> None:
        self._pending.clear()
        self._pending_rows = self._pending_bytes = 0
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(timeout)

    def _count_abandoned(self) -> None:
        """Count the delivered rows of the chunks the watchdog gave up on (the producer is closed:
        their records are settled, and no other thread touches them)."""
        if self.plan.exactly_once:
            return  # their transaction is not committed: nothing of them is visible
        tally, topic = self.tally, self.plan.topic
        for chunk, futures, refused in self._abandoned:
            failures = list(refused)
            for i, future in enumerate(futures):
                if future is None or not future.done():
                    continue
                name = chunk.topics[i] if chunk.topics is not None else topic
                error = asyncio.CancelledError() if future.cancelled() else future.exception()
                if error is None:
                    tally.written += 1
                    if name is not None:
                        tally.topics[name] += 1
                else:
                    failures.append((i, name, None if chunk.keys is None else chunk.keys[i], error))
            self._add_failures(chunk, sorted(failures, key=lambda f: f[0]))
        self._abandoned.clear()

    def _result(self, future: concurrent.futures.Future[_ChunkResult]) -> _ChunkResult:
        """The chunk's result; ``_Stalled`` once a whole ``_chunk_timeout`` passed in which no
        record of the write was queued or settled (at once, once the write stalled)."""
        if self._stalled:
            if not future.done():
                raise _Stalled
            return future.result()
        seen = self._state.progress
        while True:
            try:
                return future.result(self._chunk_timeout)
            except TimeoutError:
                if future.done():  # the chunk's own TimeoutError, or it ended as the wait did
                    return future.result()
            if self._state.progress == seen:
                raise _Stalled
            seen = self._state.progress

    def _collect_oldest(self) -> None:
        chunk, futures, refused, future, size = self._pending.popleft()
        self._pending_rows -= len(chunk.values)
        self._pending_bytes -= size
        try:
            result = self._result(future)
        except _Stalled:
            self._stalled = True
            self._state.stopped = True  # before the cancellation: the next chunk must not start
            future.cancel()
            self._abandoned.append((chunk, futures, refused))
            if self.tally.aborted is None:
                self.tally.aborted = (
                    f"no record was queued or acknowledged for {self._chunk_timeout:g}s (a chunk of"
                    f" {len(chunk.values)} rows unfinished)"
                )
            return
        tally = self.tally
        tally.written += result.written
        tally.topics.update(result.topics)
        self._add_failures(chunk, result.failures)
        if self.on_progress is not None:
            try:
                self.on_progress(tally.written, tally.failed)
            except Exception as exc:
                # It stops the write, and no report comes back: say what was done, as executors mode
                # does for a progress() that raises once the write is done.
                done = (
                    "its transaction is aborted: nothing of it is visible"
                    if self.plan.exactly_once
                    else f"{tally.written:,} rows were written and {tally.failed:,} failed so far, and the rows"
                    " queued meanwhile are delivered: they are in Kafka, and a rerun writes them again"
                )
                exc.add_note(f"raised by progress(): the write stopped there; {done}")
                raise

    def _add_failures(self, chunk: Chunk, failures: list[tuple[int, str | None, bytes | None, BaseException]]) -> None:
        tally = self.tally
        for index, topic, key, exc in failures:
            if not self._row_fenced and _fenced(exc):
                self._row_fenced = True  # kept apart from tally.errors, which max_errors may cap at none
            tally.add_error(
                RowError(
                    row=chunk.first_row + index,
                    topic=topic,
                    key=key,
                    error=f"{type(exc).__name__}: {exc}",
                    spark_partition=self.spark_partition,
                    exception=exc,
                ),
                self.plan.max_errors,
            )


class TransactionalPartitionWrite(PartitionWrite):
    """One unit of an exactly-once write: all its rows in one transaction.

    The transactional id comes from the write id and the unit (a Spark partition's index, or
    ``"driver"``), so starting the producer fences and aborts whatever an earlier attempt of
    the same unit left open. A commit marker — the offset of the consumer group named like the
    transaction, committed with it — tells a later run that the unit is committed: it then
    writes nothing (``tally.skipped``). When every row is delivered, the marker joins the
    transaction, which is then committed (``commit=True``: driver mode, where the input
    raises when Spark fails), or prepared and handed back in ``tally.prepared`` for the driver
    to commit once the whole job has succeeded (executors mode, where a task whose upstream
    failed sees its input end normally, and must not commit).
    """

    def __init__(
        self,
        plan: Plan,
        unit: str,
        *,
        commit: bool,
        spark_partition: int | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        super().__init__(plan, spark_partition=spark_partition, on_progress=on_progress)
        self.transactional_id = plan.transactional_id(unit)
        self._commit = commit
        self._call_timeout = self._config.max_block_ms / 1000 + _GRACE
        self._end_error: KafkaError | None = None

    @property
    def fenced(self) -> bool:
        """Did another producer take the transactional id while this one wrote? Its rows are
        then aborted, and the write can succeed only in another attempt."""
        return self._row_fenced or _fenced(self._state.fatal) or _fenced(self._end_error)

    def _start(self) -> bool:
        try:
            # Starting fences every earlier producer of this transactional id: its open transaction is aborted.
            producer = SyncProducer(
                self.plan.options, transactional_id=self.transactional_id, start_timeout=self._call_timeout
            )
        except KafkaError as exc:
            self._stop(f"the transactional producer {self.transactional_id!r} could not start: {_explain(exc)}")
            return False
        self._producer = producer
        try:
            committed = producer.submit(_committed, self.transactional_id).result(self._call_timeout)
        except KafkaError as exc:
            self._stop(f"could not read the commit marker of {self.transactional_id!r}: {_explain(exc)}")
            return False
        if committed:
            log.info("%s: committed by an earlier run with the same write_id; skipped", self.transactional_id)
            self.tally.skipped = True
            self._stop(None)
            return False
        producer.begin_transaction()
        return True

    def _close(self, timeout: float | None) -> None:
        """Abort a transaction still open (a failed row or input, Ctrl-C) before closing, within
        ``max_block_ms`` whatever ``timeout`` is, and say so when that fails.

        The close alone aborts it only within ``timeout``: ``close(0)`` (Ctrl-C, or
        ``close_timeout=0``) gave up while records were in flight, before the abort was sent,
        and the transaction stayed open, holding every read_committed reader of its partitions
        for ``transaction_timeout_ms``, while the report said it was aborted.
        """
        producer = self._producer
        try:
            if producer is not None and producer.in_transaction:
                try:
                    producer.abort_transaction()
                except KafkaError as exc:
                    self._abort_failed(exc)
        finally:
            super()._close(timeout)

    def _abort_failed(self, error: KafkaError) -> None:
        reason = (
            f"transaction {self.transactional_id!r} was not committed, and its abort could not be confirmed"
            f" ({_explain(error)}): nothing of it is visible, but if it is still open, read_committed readers of"
            f" its partitions wait at its first row until a run with write_id={self.plan.write_id!r} aborts it, or"
            " the coordinator does after transaction_timeout_ms"
        )
        self._state.stopped = True
        tally = self.tally
        tally.aborted = reason if tally.aborted is None else f"{tally.aborted}; {reason}"

    def _complete(self) -> None:
        producer, tally = self._producer, self.tally
        if producer is None or not tally.written or tally.failed or tally.aborted or self._state.fatal is not None:
            return  # nothing to commit, or it must not be: close() aborts the transaction
        marker = OffsetAndMetadata(
            1, f"aioprod exactly-once write {self.plan.write_id}: {self.transactional_id}, {tally.written} rows"
        )
        verb = "commit" if self._commit else "prepare"
        try:
            producer.send_offsets_to_transaction({TopicPartition(min(tally.topics), 0): marker}, self.transactional_id)
            if not self._commit:
                tally.prepared = producer.prepare_transaction()
                return
        except KafkaError as exc:
            self._end_error = exc
            self._stop(f"could not {verb} transaction {self.transactional_id!r}: {_explain(exc)}")
            return
        try:
            producer.commit_transaction()
        except KafkaTimeoutError as exc:
            # EndTxn may have reached the coordinator: the rows may be visible, or become so.
            self._stop(
                f"the commit of transaction {self.transactional_id!r} is in doubt ({_explain(exc)}): its rows may be"
                f" visible or not. Run the write again with write_id={self.plan.write_id!r} and the same DataFrame:"
                " it writes them only if they were not committed"
            )
        except KafkaError as exc:
            self._end_error = exc
            self._stop(f"could not commit transaction {self.transactional_id!r}: {_explain(exc)}")


async def _committed(producer: Producer, group_id: str) -> bool:
    """Did a transaction commit an offset for ``group_id`` (an exactly-once unit's marker)?"""
    return bool(await producer._committed_offsets(group_id))


def _fenced(error: BaseException | None) -> bool:
    return has_cause(error, lambda e: isinstance(e, (ProducerFencedError, InvalidProducerEpochError)))


def _explain(error: KafkaError) -> str:
    text = f"{type(error).__name__}: {error}"
    if has_cause(error, lambda e: isinstance(e, InvalidTransactionTimeoutError)):
        return text + (
            " (transaction_timeout_ms is above the broker's transaction.max.timeout.ms: lower it, or raise the"
            " broker's; it must outlast the whole write)"
        )
    return text


def write_partition(unit: PartitionWrite, chunks: Iterable[Chunk]) -> Tally:
    """Run ``unit`` over ``chunks`` until they end or the write stops; the input is closed either way."""
    iterator = iter(chunks)
    try:
        for chunk in iterator:
            if not unit.write(chunk):
                break
    except BaseException as exc:
        unit.abort(interrupted=not isinstance(exc, Exception))
        raise
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    return unit.finish()


def _slice(chunk: Chunk, start: int, stop: int) -> Chunk:
    """Rows ``start:stop`` of ``chunk``, numbered as in the whole."""

    def part(column: list[Any] | None) -> list[Any] | None:
        return None if column is None else column[start:stop]

    return Chunk(
        chunk.first_row + start,
        chunk.values[start:stop],
        part(chunk.keys),
        part(chunk.topics),
        part(chunk.partitions),
        part(chunk.headers),
    )


def _payload_bytes(chunk: Chunk) -> int:
    """The chunk's keys, values and headers, in bytes (a str counted by its length)."""
    size = sum(map(len, filter(None, chunk.values)))
    if chunk.keys is not None:
        size += sum(map(len, filter(None, chunk.keys)))
    if chunk.headers is not None:
        size += sum(len(name or "") + len(value or b"") for pairs in chunk.headers if pairs for name, value in pairs)
    return size

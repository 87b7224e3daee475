"""Write a Spark DataFrame to Kafka: from the driver, or from every executor in parallel.

    from aioprod.spark import write_dataframe

    report = write_dataframe(df, bootstrap_servers="broker:9092", topic="events")
    report = write_dataframe(df, bootstrap_servers="broker:9092", mode="executors")

The DataFrame has the shape of Spark's own Kafka sink: ``value`` (binary or string,
required), optional ``key`` (binary or string), ``topic`` (string; required unless the
``topic`` argument is given, which then wins), ``partition`` (int) and ``headers``
(``array<struct<key: string, value: binary>>``). Other columns are ignored.

pyspark and pyarrow are optional (``pip install aioprod[spark]``) and imported only when
a DataFrame is written. See ``docs/spark.md`` for delivery semantics.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import itertools
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from aioprod.config import ProducerConfig, _canonical_name
from aioprod.errors import (
    ConfigError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    ProducerFatalError,
)
from aioprod.producer.producer import Producer, _check_topic
from aioprod.producer.record_future import RecordFuture
from aioprod.sync import SyncProducer

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "DataFrameSchemaError",
    "PartitionReport",
    "RowError",
    "SparkEnvironmentError",
    "WriteError",
    "WriteReport",
    "write_dataframe",
]

log = logging.getLogger(__name__)

Mode = Literal["driver", "executors"]
ErrorPolicy = Literal["raise", "report"]
Transport = Literal["auto", "arrow", "rows"]
ProgressCallback = Callable[[int, int], None]

#: Producer settings tuned for bulk writes; every one can be overridden by the caller.
SPARK_PRODUCER_DEFAULTS: Mapping[str, Any] = {"linger_ms": 20, "batch_size": 256 * 1024}

_ROWS_PER_CHUNK = 10_000  # Row transport: rows handed to the event loop at once
_DEFAULT_MAX_IN_FLIGHT_ROWS = 50_000
_DEFAULT_MAX_ERRORS = 20
_GRACE = 5.0


# -- public results and errors ---------------------------------------------------------------


class DataFrameSchemaError(KafkaError, ValueError):
    """The DataFrame does not have the Kafka sink's shape; raised before anything is sent."""


class SparkEnvironmentError(KafkaError, RuntimeError):
    """Spark cannot run the write as asked: most often the executors cannot import aioprod
    (``PYSPARK_PYTHON`` is another interpreter), or a forced Arrow transport is unavailable."""


@dataclass(frozen=True)
class RowError:
    """One row that could not be written.

    ``row`` is the row's position in what its writer read: the whole DataFrame in driver
    mode, its Spark partition in executors mode (``spark_partition`` then says which).
    ``error`` is ``"ExceptionType: message"``; ``exception`` holds the exception object
    itself in driver mode (executors only send the text back).
    """

    row: int
    topic: str | None
    key: bytes | None
    error: str
    spark_partition: int | None = None
    exception: BaseException | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PartitionReport:
    """What one Spark partition's writer did (executors mode).

    ``attempt`` > 0 means Spark ran the task again after a failure: the earlier attempt
    may have written some of the partition's rows already.
    """

    spark_partition: int
    attempt: int
    rows_written: int
    rows_failed: int
    seconds: float


@dataclass(frozen=True)
class WriteReport:
    """The outcome of :func:`write_dataframe`."""

    mode: str
    transport: str
    rows_written: int
    rows_failed: int
    seconds: float
    #: Rows written per topic.
    topics: dict[str, int]
    #: The first failed rows (at most ``max_errors``), in the order they were found.
    errors: list[RowError]
    #: Per Spark partition, in executors mode; empty in driver mode.
    partitions: list[PartitionReport] = field(default_factory=list)
    #: Why the write stopped before the end, if it did.
    aborted: str | None = None

    @property
    def rows_per_second(self) -> float:
        return self.rows_written / self.seconds if self.seconds > 0 else 0.0

    @property
    def retried_partitions(self) -> list[int]:
        """Spark partitions whose task was retried (their rows may have been sent twice)."""
        return sorted(p.spark_partition for p in self.partitions if p.attempt > 0)

    def __str__(self) -> str:
        text = (
            f"{self.rows_written:,} rows written, {self.rows_failed:,} failed in {self.seconds:.2f}s "
            f"({self.rows_per_second:,.0f} rows/s, mode={self.mode}, transport={self.transport})"
        )
        if self.errors:
            text += f"; first error: row {self.errors[0].row}: {self.errors[0].error}"
        if self.aborted:
            text += f"; aborted: {self.aborted}"
        return text


class WriteError(KafkaError):
    """Rows failed with ``errors="raise"``, or the write had to stop. ``report`` says what was done."""

    def __init__(self, message: str, report: WriteReport) -> None:
        super().__init__(message)
        self.report = report


# -- the plan: everything an executor needs, as plain data --------------------------------------


@dataclass(frozen=True)
class _Plan:
    """Plain, picklable description of a write. The executor closure captures only this."""

    options: dict[str, Any]
    topic: str | None
    has_key: bool
    has_topic: bool
    has_partition: bool
    has_headers: bool
    errors: str
    max_errors: int
    max_in_flight_rows: int
    close_timeout: float | None

    @property
    def columns(self) -> list[str]:
        names = ["value"]
        names += ["key"] if self.has_key else []
        names += ["topic"] if self.has_topic else []
        names += ["partition"] if self.has_partition else []
        names += ["headers"] if self.has_headers else []
        return names


@dataclass
class _Chunk:
    """Rows as parallel Python lists, ready to be sent from the event loop."""

    first_row: int
    values: list[Any]
    keys: list[Any] | None = None
    topics: list[Any] | None = None
    partitions: list[Any] | None = None
    headers: list[Any] | None = None


# -- entry point -----------------------------------------------------------------------------


def write_dataframe(
    df: DataFrame,
    *,
    bootstrap_servers: str | list[str],
    topic: str | None = None,
    mode: Mode = "driver",
    errors: ErrorPolicy = "raise",
    progress: bool | ProgressCallback | None = None,
    transport: Transport = "auto",
    max_errors: int = _DEFAULT_MAX_ERRORS,
    max_in_flight_rows: int = _DEFAULT_MAX_IN_FLIGHT_ROWS,
    close_timeout: float | None = None,
    **producer_config: Any,
) -> WriteReport:
    """Write every row of ``df`` to Kafka and report what happened.

    ``mode="driver"`` streams the rows to the driver (one Spark partition at a time, the
    next one prefetched; never a ``collect()`` of the whole frame) and sends them through
    one producer on one event loop with at most ``max_in_flight_rows`` unacknowledged.
    ``mode="executors"`` runs one producer per Spark partition, on the executors, in
    parallel; only per-partition counts come back to the driver.

    ``errors="raise"`` stops queuing at the first failed row and raises
    :class:`WriteError` (with the report) once everything queued is settled;
    ``errors="report"`` writes every row it can and lists the failures in the report.
    Either way a write that cannot go on (broker unreachable, producer failed) raises
    ``WriteError``.

    ``progress`` (driver mode): ``True`` shows a progress bar on stderr, ``False`` nothing,
    a callable is called with ``(rows_written, rows_failed)`` as chunks complete; ``None``
    shows the bar when stderr is a terminal. ``transport``: ``"arrow"`` moves Arrow
    record batches, ``"rows"`` Spark ``Row`` objects, ``"auto"`` prefers Arrow.

    Other keyword arguments are producer options (``linger_ms=``, ``acks=``,
    ``compression_type=``, ... or ``**{"linger.ms": 5}``); :data:`SPARK_PRODUCER_DEFAULTS`
    apply where not given.
    """
    if mode not in ("driver", "executors"):
        raise ValueError(f"mode must be 'driver' or 'executors', got {mode!r}")
    if errors not in ("raise", "report"):
        raise ValueError(f"errors must be 'raise' or 'report', got {errors!r}")
    if transport not in ("auto", "arrow", "rows"):
        raise ValueError(f"transport must be 'auto', 'arrow' or 'rows', got {transport!r}")
    if max_errors < 0 or max_in_flight_rows < 1:
        raise ValueError("max_errors must be >= 0 and max_in_flight_rows >= 1")
    if topic is not None:
        _check_topic(topic)
    options = _producer_options(bootstrap_servers, producer_config)
    columns = _check_schema(df.schema, topic)
    plan = _Plan(
        options=options,
        topic=topic,
        has_key="key" in columns,
        has_topic=topic is None,
        has_partition="partition" in columns,
        has_headers="headers" in columns,
        errors=errors,
        max_errors=max_errors,
        max_in_flight_rows=max_in_flight_rows,
        close_timeout=close_timeout,
    )
    prepared = _prepare(df, plan, columns)
    if mode == "driver":
        report = _write_from_driver(prepared, plan, transport, progress)
    else:
        report = _write_from_executors(prepared, plan, transport)
    if report.aborted:
        raise WriteError(f"write stopped: {report.aborted} ({report})", report)
    if report.rows_failed and errors == "raise":
        raise WriteError(f"{report.rows_failed} row(s) could not be written: {report.errors[0].error}", report)
    return report


def _producer_options(bootstrap_servers: Any, producer_config: Mapping[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for raw, value in producer_config.items():
        name = _canonical_name(raw)
        if name in options:
            raise ConfigError(f"option {name!r} given twice (as {raw!r})")
        if name in ("key_serializer", "value_serializer"):
            raise ConfigError(f"{name} does not apply: the DataFrame's key and value columns are already bytes")
        options[name] = value
    if "bootstrap_servers" in options:
        raise ConfigError("give bootstrap_servers once, as the bootstrap_servers= argument")
    options["bootstrap_servers"] = bootstrap_servers
    for name, value in SPARK_PRODUCER_DEFAULTS.items():
        options.setdefault(name, value)
    ProducerConfig.from_options(options)  # every mistake raises on the driver, before any job
    return options


# -- schema ----------------------------------------------------------------------------------


def _check_schema(schema: StructType, topic: str | None) -> dict[str, DataType]:
    """The sink columns present, after checking each against the Kafka sink's types."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        ByteType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        StructType,
    )

    fields = {f.name: f.dataType for f in schema.fields}
    found: dict[str, DataType] = {}

    def expect(name: str, ok: bool, expected: str) -> None:
        if not ok:
            raise DataFrameSchemaError(f"column {name!r} has type {fields[name].simpleString()}; expected {expected}")
        found[name] = fields[name]

    if "value" not in fields:
        lower = {n.lower(): n for n in fields}
        hint = f" (found {lower['value']!r}; names are case-sensitive)" if "value" in lower else ""
        raise DataFrameSchemaError(f"the DataFrame has no 'value' column; expected binary or string{hint}")
    expect("value", isinstance(fields["value"], (BinaryType, StringType)), "binary or string")
    if "key" in fields:
        expect("key", isinstance(fields["key"], (BinaryType, StringType)), "binary or string")
    if "topic" in fields:
        expect("topic", isinstance(fields["topic"], StringType), "string")
    elif topic is None:
        raise DataFrameSchemaError("the DataFrame has no 'topic' column and no topic= argument was given")
    if "partition" in fields:
        expect(
            "partition",
            isinstance(fields["partition"], (IntegerType, ShortType, ByteType, LongType)),
            "int",
        )
    if "headers" in fields:
        dtype = fields["headers"]
        ok = False
        if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, StructType):
            inner = {f.name: f.dataType for f in dtype.elementType.fields}
            ok = (
                set(inner) == {"key", "value"}
                and isinstance(inner["key"], StringType)
                and isinstance(inner["value"], (BinaryType, StringType))
            )
        expect("headers", ok, "array<struct<key:string,value:binary>>")
    return found


def _prepare(df: DataFrame, plan: _Plan, columns: Mapping[str, DataType]) -> DataFrame:
    """Select only the sink's columns, in a fixed order, normalised to binary/string/int."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, IntegerType, StringType

    selected = [F.col("value").cast("binary").alias("value")]
    if plan.has_key:
        selected.append(F.col("key").cast("binary").alias("key"))
    if plan.has_topic:
        selected.append(F.col("topic"))
    if plan.has_partition:
        dtype = columns["partition"]
        selected.append(F.col("partition") if isinstance(dtype, IntegerType) else F.col("partition").cast("int"))
    if plan.has_headers:
        element = columns["headers"].elementType  # type: ignore[attr-defined]
        value_type = {f.name: f.dataType for f in element.fields}["value"]
        if isinstance(value_type, StringType) or not isinstance(value_type, BinaryType):
            selected.append(
                F.transform(
                    "headers",
                    lambda h: F.struct(h["key"].alias("key"), h["value"].cast("binary").alias("value")),
                ).alias("headers")
            )
        else:
            selected.append(F.col("headers"))
    return df.select(*selected)


# -- turning Spark data into chunks ------------------------------------------------------------


def _arrow_chunk(batch: pa.RecordBatch, plan: _Plan, first_row: int) -> _Chunk:
    names = batch.schema.names
    chunk = _Chunk(first_row, batch.column(names.index("value")).to_pylist())
    if plan.has_key:
        chunk.keys = batch.column(names.index("key")).to_pylist()
    if plan.has_topic:
        chunk.topics = batch.column(names.index("topic")).to_pylist()
    if plan.has_partition:
        chunk.partitions = batch.column(names.index("partition")).to_pylist()
    if plan.has_headers:
        chunk.headers = _arrow_headers(batch.column(names.index("headers")))
    return chunk


def _arrow_headers(column: Any) -> list[Any]:
    """list<struct<key, value>> → per row a list of (key, value) tuples, or None."""
    offsets = column.offsets.to_pylist()
    if offsets[-1] == offsets[0]:
        return [None] * len(column)
    values = column.values
    pairs = list(zip(values.field("key").to_pylist(), values.field("value").to_pylist(), strict=True))
    out: list[Any] = []
    append = out.append
    start = offsets[0]
    for end in offsets[1:]:
        append(pairs[start:end] if end > start else None)
        start = end
    return out


def _row_chunks(rows: Iterable[Any], plan: _Plan, first_row: int = 0) -> Iterator[_Chunk]:
    """Spark Rows (columns in plan order) → chunks of up to _ROWS_PER_CHUNK."""
    names = plan.columns
    index = {name: names.index(name) for name in names}
    buffer: list[Any] = []

    def make(batch: list[Any], start: int) -> _Chunk:
        columns = list(zip(*batch, strict=True))
        chunk = _Chunk(start, [None if v is None else bytes(v) for v in columns[index["value"]]])
        if plan.has_key:
            chunk.keys = [None if k is None else bytes(k) for k in columns[index["key"]]]
        if plan.has_topic:
            chunk.topics = list(columns[index["topic"]])
        if plan.has_partition:
            chunk.partitions = list(columns[index["partition"]])
        if plan.has_headers:
            chunk.headers = [
                None if hs is None else [(h[0], None if h[1] is None else bytes(h[1])) for h in hs]
                for hs in columns[index["headers"]]
            ]
        return chunk

    start = first_row
    for row in rows:
        buffer.append(row)
        if len(buffer) >= _ROWS_PER_CHUNK:
            yield make(buffer, start)
            start += len(buffer)
            buffer = []
    if buffer:
        yield make(buffer, start)


# -- sending chunks through one producer ---------------------------------------------------------


@dataclass
class _Tally:
    written: int = 0
    failed: int = 0
    topics: Counter[str] = field(default_factory=Counter)
    errors: list[RowError] = field(default_factory=list)
    aborted: str | None = None

    def add_error(self, error: RowError, limit: int) -> None:
        self.failed += 1
        if len(self.errors) < limit:
            self.errors.append(error)


@dataclass
class _ChunkResult:
    written: int
    topics: Counter[str]
    failures: list[tuple[int, str | None, bytes | None, BaseException]]


class _LoopState:
    """Shared by the chunk coroutines of one writer, on the producer's loop."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.order = asyncio.Lock()  # queue chunks strictly one after another: keeps row order
        self.stopped = False
        self.fatal: BaseException | None = None


async def _send_chunk(producer: Producer, chunk: _Chunk, state: _LoopState) -> _ChunkResult:
    """Queue every row of the chunk in order, then wait for all their acknowledgements."""
    plan = state.plan
    stop_at_first = plan.errors == "raise"
    failures: list[tuple[int, str | None, bytes | None, BaseException]] = []
    futures: list[RecordFuture | None] = []
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
        for i, (topic, value, key, partition, headers) in enumerate(rows):
            try:
                add(await send(topic, value, key, partition=partition, headers=headers))
            except (KafkaTimeoutError, ProducerClosedError, ProducerFatalError) as exc:
                # Not this row's fault: the broker is unreachable, the buffer stays full or
                # the producer failed. Every further row would wait max_block_ms to fail too.
                state.fatal = exc
                state.stopped = True
                break
            except Exception as exc:
                add(None)
                failures.append((i, topic, key, exc))
                if stop_at_first:
                    state.stopped = True
                    break
    # Records are acknowledged a whole batch at a time, so awaiting them in order suspends
    # about once per batch (one asyncio.wait over all of them would add a callback to every
    # record's future). A record's failure is read below; our own cancellation propagates.
    for future in futures:
        if future is not None and not future.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(future)
    written = 0
    counts: Counter[str] = Counter()
    keys = chunk.keys
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


class _ChunkWriter:
    """Feeds chunks to one SyncProducer's loop with bounded concurrency; tallies results.

    The producer is created on the first non-empty chunk, so empty partitions cost nothing.
    """

    def __init__(
        self,
        plan: _Plan,
        *,
        spark_partition: int | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.plan = plan
        self.spark_partition = spark_partition
        self.on_progress = on_progress
        self.tally = _Tally()
        self._producer: SyncProducer | None = None
        self._state = _LoopState(plan)
        self._pending: deque[tuple[_Chunk, concurrent.futures.Future[_ChunkResult]]] = deque()
        self._pending_rows = 0
        config = ProducerConfig.from_options(plan.options)
        # A chunk's coroutine finishes within one buffer wait (a second one stops the write)
        # plus the delivery timeout of its last record.
        self._chunk_timeout = (config.max_block_ms + config.delivery_timeout_ms) / 1000 + _GRACE

    def write(self, chunk: _Chunk) -> bool:
        """Hand a chunk over; False once the write has stopped (read no more input)."""
        if self._state.stopped:
            return False
        if not chunk.values:
            return True
        if self._producer is None:
            self._producer = SyncProducer(self.plan.options)
        while self._pending and self._pending_rows + len(chunk.values) > self.plan.max_in_flight_rows:
            self._collect_oldest()
        self._pending.append((chunk, self._producer.submit(_send_chunk, chunk, self._state)))
        self._pending_rows += len(chunk.values)
        while self._pending and self._pending[0][1].done():
            self._collect_oldest()
        return not self._state.stopped

    def finish(self) -> _Tally:
        """Wait for every chunk, close the producer, return the tally."""
        try:
            while self._pending:
                self._collect_oldest()
        finally:
            self._close()
        if self._state.fatal is not None and self.tally.aborted is None:
            fatal = self._state.fatal
            self.tally.aborted = f"{type(fatal).__name__}: {fatal}"
        return self.tally

    def abort(self, *, interrupted: bool) -> None:
        """The input failed, or the caller was interrupted: stop and close.

        Rows already queued are delivered (within ``close_timeout``), unless ``interrupted``
        (``KeyboardInterrupt`` and the like), which closes at once and fails what is pending.
        """
        self._state.stopped = True
        self._pending.clear()
        self._pending_rows = 0
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(0 if interrupted else self.plan.close_timeout)

    def _close(self) -> None:
        self._pending.clear()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(self.plan.close_timeout)

    def _collect_oldest(self) -> None:
        chunk, future = self._pending.popleft()
        self._pending_rows -= len(chunk.values)
        try:
            result = future.result(self._chunk_timeout)
        except TimeoutError:
            if future.done():
                raise
            future.cancel()
            self._state.stopped = True
            self.tally.aborted = f"a chunk of {len(chunk.values)} rows did not finish within {self._chunk_timeout:.0f}s"
            return
        tally = self.tally
        tally.written += result.written
        tally.topics.update(result.topics)
        for index, topic, key, exc in result.failures:
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
        if self.on_progress is not None:
            self.on_progress(tally.written, tally.failed)


def _write_chunks(
    chunks: Iterable[_Chunk],
    plan: _Plan,
    *,
    spark_partition: int | None = None,
    on_progress: ProgressCallback | None = None,
) -> _Tally:
    writer = _ChunkWriter(plan, spark_partition=spark_partition, on_progress=on_progress)
    iterator = iter(chunks)
    try:
        for chunk in iterator:
            if not writer.write(chunk):
                break
    except BaseException as exc:
        writer.abort(interrupted=not isinstance(exc, Exception))
        raise
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    return writer.finish()


# -- driver mode -------------------------------------------------------------------------------


def _write_from_driver(
    df: DataFrame, plan: _Plan, transport: Transport, progress: bool | ProgressCallback | None
) -> WriteReport:
    started = time.monotonic()
    chunks: Iterator[_Chunk] | None = None
    used = "rows"
    if transport in ("auto", "arrow"):
        try:
            chunks = _driver_arrow_chunks(df, plan)
        except _ArrowUnavailable as exc:
            if transport == "arrow":
                raise SparkEnvironmentError(f"transport='arrow' is not available on the driver: {exc}") from exc
            log.info("Arrow batches are not available on the driver (%s); streaming Rows instead", exc)
        else:
            used = "arrow"
    if chunks is None:
        chunks = _row_chunks(df.toLocalIterator(prefetchPartitions=True), plan)
    with _progress(progress) as on_progress:
        tally = _write_chunks(chunks, plan, on_progress=on_progress)
    return _report("driver", used, tally, time.monotonic() - started)


class _ArrowUnavailable(Exception):
    """This pyspark (or session) cannot stream Arrow batches to the driver."""


def _driver_arrow_chunks(df: DataFrame, plan: _Plan) -> Iterator[_Chunk]:
    """Arrow record batches streamed partition by partition (next one prefetched).

    Uses the JVM's ``Dataset.toArrowBatchRdd`` served through the same local-iterator
    protocol as ``DataFrame.toLocalIterator``: no Python ``Row`` per record, and at most
    two partitions in driver memory. Raises ``_ArrowUnavailable`` before anything is sent
    when the running pyspark does not offer it (e.g. under Spark Connect) or its batches do
    not decode; errors of the Spark job itself propagate as they are.
    """
    try:
        import pyarrow as pa
        from pyspark.serializers import NoOpSerializer
        from pyspark.util import _local_iterator_from_socket

        jdf = df._jdf  # AttributeError under Spark Connect
        session = df.sparkSession
        large = str(session.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")).lower() == "true"
        schema = _arrow_schema(plan, large)
        jvm: Any = session.sparkContext._jvm
        sock_info = jvm.PythonRDD.toLocalIteratorAndServe(jdf.toArrowBatchRdd(), True)
    except Exception as exc:
        raise _ArrowUnavailable(f"{type(exc).__name__}: {exc}") from exc
    frames = iter(_local_iterator_from_socket(sock_info, NoOpSerializer()))
    first = next(frames, None)  # runs the first partition's job
    batch = None
    if first is not None:
        try:
            batch = pa.ipc.read_record_batch(pa.py_buffer(first), schema)
        except pa.ArrowException as exc:
            raise _ArrowUnavailable(f"Spark's Arrow batches do not decode as expected: {exc}") from exc

    def generate() -> Iterator[_Chunk]:
        row = 0
        current = batch
        while current is not None:
            if current.num_rows:
                yield _arrow_chunk(current, plan, row)
                row += current.num_rows
            frame = next(frames, None)
            current = None if frame is None else pa.ipc.read_record_batch(pa.py_buffer(frame), schema)

    return generate()


def _arrow_schema(plan: _Plan, large: bool) -> pa.Schema:
    """The Arrow schema Spark uses for the prepared (normalised) columns."""
    import pyarrow as pa

    binary = pa.large_binary() if large else pa.binary()
    string = pa.large_string() if large else pa.string()
    fields = [pa.field("value", binary)]
    if plan.has_key:
        fields.append(pa.field("key", binary))
    if plan.has_topic:
        fields.append(pa.field("topic", string))
    if plan.has_partition:
        fields.append(pa.field("partition", pa.int32()))
    if plan.has_headers:
        element = pa.struct([pa.field("key", string), pa.field("value", binary)])
        fields.append(pa.field("headers", pa.large_list(element) if large else pa.list_(element)))
    return pa.schema(fields)


class _progress:
    """Context manager yielding the progress callback to use (or None)."""

    def __init__(self, progress: bool | ProgressCallback | None) -> None:
        self.setting = progress
        self.bar: Any = None

    def __enter__(self) -> ProgressCallback | None:
        setting = self.setting
        if callable(setting):
            return setting
        if setting is None:
            setting = sys.stderr.isatty()
        if not setting:
            return None
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        bar = Progress(
            SpinnerColumn(),
            TextColumn("Kafka"),
            TextColumn("{task.fields[written]:,} rows written"),
            TextColumn("{task.fields[failed]:,} failed"),
            TextColumn("{task.fields[rate]:,.0f} rows/s"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        started = time.monotonic()
        task = bar.add_task("write", total=None, written=0, failed=0, rate=0.0)
        bar.start()
        self.bar = bar

        def update(written: int, failed: int) -> None:
            elapsed = max(time.monotonic() - started, 1e-9)
            bar.update(task, written=written, failed=failed, rate=written / elapsed)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


# -- executors mode ----------------------------------------------------------------------------

_RESULT_DDL = (
    "spark_partition int, attempt int, written long, failed long, seconds double, "
    "topics string, errors string, aborted string"
)


def _write_from_executors(df: DataFrame, plan: _Plan, transport: Transport) -> WriteReport:
    started = time.monotonic()
    _check_executor_python(df)
    used = "rows"
    rows: list[Any] | None = None
    try:
        if transport in ("auto", "arrow"):
            try:
                result = _map_in_arrow(df, functools.partial(_executor_arrow_task, plan))
                used = "arrow"
            except Exception as exc:
                if transport == "arrow":
                    raise
                log.info("mapInArrow is not available (%s); writing from Rows instead", exc)
            else:
                rows = [r.asDict() for r in result.collect()]
        if rows is None:
            rows = df.rdd.mapPartitions(functools.partial(_executor_rows_task, plan)).collect()
    except Exception as exc:
        _explain_executor_failure(exc)
        raise
    partitions: list[PartitionReport] = []
    tally = _Tally()
    for r in sorted(rows, key=lambda r: r["spark_partition"]):
        partitions.append(PartitionReport(r["spark_partition"], r["attempt"], r["written"], r["failed"], r["seconds"]))
        tally.written += r["written"]
        tally.failed += r["failed"]
        tally.topics.update(json.loads(r["topics"]))
        for e in json.loads(r["errors"]):
            if len(tally.errors) < plan.max_errors:
                key = None if e["key"] is None else base64.b64decode(e["key"])
                tally.errors.append(RowError(e["row"], e["topic"], key, e["error"], r["spark_partition"]))
        if r["aborted"] and tally.aborted is None:
            tally.aborted = f"partition {r['spark_partition']}: {r['aborted']}"
    report = _report("executors", used, tally, time.monotonic() - started, partitions)
    if report.retried_partitions:
        log.warning(
            "Spark retried partition(s) %s: rows an earlier attempt sent may be in Kafka twice",
            report.retried_partitions,
        )
    return report


def _map_in_arrow(df: DataFrame, fn: Callable[[Iterator[Any]], Iterator[Any]]) -> DataFrame:
    """``df.mapInArrow(fn, ...)``; without pandas, build the same plan directly.

    pyspark's public ``mapInArrow`` goes through ``pandas_udf`` on the driver, which
    refuses to run without pandas although the Arrow path never touches it; when pandas
    is missing, create the identical map-in-Arrow UDF through the lower layer.
    """
    try:
        return df.mapInArrow(fn, _RESULT_DDL)
    except ImportError as exc:  # PySparkImportError: pandas is not installed
        if "pandas" not in str(exc).lower():
            raise
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql.pandas import functions as pandas_functions
    from pyspark.util import PythonEvalType

    create: Any = pandas_functions._create_vectorized_udf  # type: ignore[attr-defined]
    udf = create(fn, _RESULT_DDL, PythonEvalType.SQL_MAP_ARROW_ITER_UDF, "pandas")
    column = udf(*[df[name] for name in df.columns])
    return SparkDataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)


def _executor_arrow_task(plan: _Plan, batches: Iterator[Any]) -> Iterator[Any]:
    """Runs on an executor: send one partition's Arrow batches, yield one row of counts."""
    import pyarrow as pa

    def chunks() -> Iterator[_Chunk]:
        row = 0
        for batch in batches:
            if batch.num_rows:
                yield _arrow_chunk(batch, plan, row)
                row += batch.num_rows

    result = _run_partition(plan, chunks())
    yield pa.RecordBatch.from_pylist([result], schema=_result_arrow_schema())


def _executor_rows_task(plan: _Plan, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """Runs on an executor: send one partition's Rows, yield one dict of counts."""
    yield _run_partition(plan, _row_chunks(rows, plan))


def _run_partition(plan: _Plan, chunks: Iterator[_Chunk]) -> dict[str, Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else -1
    attempt = context.attemptNumber() if context is not None else 0
    started = time.monotonic()
    tally = _write_chunks(chunks, plan, spark_partition=partition)
    errors = [
        {
            "row": e.row,
            "topic": e.topic,
            "key": None if e.key is None else base64.b64encode(e.key).decode(),
            "error": e.error,
        }
        for e in tally.errors
    ]
    return {
        "spark_partition": partition,
        "attempt": attempt,
        "written": tally.written,
        "failed": tally.failed,
        "seconds": time.monotonic() - started,
        "topics": json.dumps(dict(tally.topics)),
        "errors": json.dumps(errors),
        "aborted": tally.aborted,
    }


@functools.cache
def _result_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("spark_partition", pa.int32()),
            ("attempt", pa.int32()),
            ("written", pa.int64()),
            ("failed", pa.int64()),
            ("seconds", pa.float64()),
            ("topics", pa.string()),
            ("errors", pa.string()),
            ("aborted", pa.string()),
        ]
    )


def _check_executor_python(df: DataFrame) -> None:
    """Warn when local executors will run another Python than the driver's."""
    try:
        sc = df.sparkSession.sparkContext
        master = str(sc.master)
        python_exec = str(sc.pythonExec)
    except Exception:  # Spark Connect: no SparkContext on the client
        return
    if not master.startswith("local"):
        return
    resolved = shutil.which(python_exec)
    if resolved is None or not _same_environment(resolved, sys.executable):
        warnings.warn(
            f"Spark executors will run {python_exec!r} ({resolved or 'not found'}), not this interpreter "
            f"({sys.executable}); aioprod must be importable there. Set PYSPARK_PYTHON={sys.executable} "
            "before the SparkSession is created.",
            RuntimeWarning,
            stacklevel=4,
        )


def _same_environment(candidate: str, current: str) -> bool:
    """Whether ``candidate`` runs in the same Python environment as ``current``.

    A virtualenv's interpreter is a symlink to the base one, so resolved paths would call a
    base ``python3`` (without aioprod) the same; the same ``bin`` directory is what counts.
    """
    if os.path.dirname(os.path.abspath(candidate)) == os.path.dirname(os.path.abspath(current)):
        return True
    in_venv = sys.prefix != sys.base_prefix
    return not in_venv and os.path.realpath(candidate) == os.path.realpath(current)


def _explain_executor_failure(exc: BaseException) -> None:
    text = str(exc)
    if "No module named 'aioprod'" in text or "No module named 'pyarrow'" in text:
        module = "aioprod" if "aioprod" in text else "pyarrow"
        raise SparkEnvironmentError(
            f"the executors' Python cannot import {module}: install aioprod[spark] in the executors' "
            "environment and point PYSPARK_PYTHON at that interpreter (on a cluster: "
            "spark.pyspark.python / spark.executorEnv.PYSPARK_PYTHON, or ship a packed environment "
            "with --archives)"
        ) from exc


# -- shared --------------------------------------------------------------------------------------


def _report(
    mode: str, transport: str, tally: _Tally, seconds: float, partitions: list[PartitionReport] | None = None
) -> WriteReport:
    return WriteReport(
        mode=mode,
        transport=transport,
        rows_written=tally.written,
        rows_failed=tally.failed,
        seconds=seconds,
        topics=dict(sorted(tally.topics.items())),
        errors=list(tally.errors),
        partitions=partitions or [],
        aborted=tally.aborted,
    )

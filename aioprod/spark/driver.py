"""Driver mode: stream the DataFrame to the driver, partition by partition, and send it from there."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aioprod.spark import _pyspark
from aioprod.spark.chunks import Chunk, arrow_chunks, row_chunks
from aioprod.spark.plan import Plan
from aioprod.spark.reports import SparkEnvironmentError, WriteReport
from aioprod.spark.schema import arrow_schema, as_sent
from aioprod.spark.writer import PartitionWrite, ProgressCallback, TransactionalPartitionWrite, write_partition

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class ArrowUnavailable(Exception):
    """This pyspark (or session) cannot stream Arrow batches to the driver."""


def write_from_driver(df: DataFrame, plan: Plan, transport: str, progress: ProgressCallback | None) -> WriteReport:
    """One producer on the driver; the producer opens (a broker must answer) before any Spark job runs.

    Exactly-once: the whole DataFrame in one transaction, committed once the last row is
    delivered (in driver mode a failing Spark job raises from the input, so nothing partial is
    committed); a write whose marker says it committed before reads nothing.
    """
    started = time.monotonic()
    unit = (
        TransactionalPartitionWrite(plan, "driver", commit=True, on_progress=progress)
        if plan.exactly_once
        else PartitionWrite(plan, on_progress=progress)
    )
    used = "arrow" if transport != "rows" else "rows"
    if unit.open():
        try:
            chunks, used = _chunks(df, plan, transport)
        except BaseException as exc:
            unit.abort(interrupted=not isinstance(exc, Exception))
            raise
        tally = write_partition(unit, chunks)
    else:
        tally = unit.finish()
    if plan.exactly_once and (tally.aborted is not None or tally.failed):
        tally.written, tally.topics = 0, Counter()  # its transaction was not committed (or not surely)
        if tally.aborted is None:
            tally.aborted = "the transaction was aborted: nothing is visible"
    skipped = [0] if tally.skipped else []
    return tally.report("driver", used, time.monotonic() - started, write_id=plan.write_id, partitions_skipped=skipped)


def _chunks(df: DataFrame, plan: Plan, transport: str) -> tuple[Iterator[Chunk], str]:
    if transport in ("auto", "arrow"):
        try:
            return driver_arrow_chunks(df, plan), "arrow"
        except ArrowUnavailable as exc:
            if transport == "arrow":
                raise SparkEnvironmentError(f"transport='arrow' is not available on the driver: {exc}") from exc
            log.info("Arrow batches are not available on the driver (%s); streaming Rows instead", exc)
    return row_chunks(df.toLocalIterator(prefetchPartitions=True), plan), "rows"


def driver_arrow_chunks(df: DataFrame, plan: Plan) -> Iterator[Chunk]:
    """Arrow record batches streamed partition by partition (next one prefetched).

    No Python ``Row`` per record, and at most two partitions in driver memory. Raises
    ``ArrowUnavailable`` before anything is sent when the running pyspark does not offer it
    (e.g. under Spark Connect) or its first batch does not decode, ``SparkEnvironmentError``
    when a later one does not; errors of the Spark job itself propagate as they are.
    """
    try:
        import pyarrow as pa

        schema = arrow_schema(plan)
        frames = _pyspark.arrow_frames_to_driver(df)
    except Exception as exc:
        raise ArrowUnavailable(f"{type(exc).__name__}: {exc}{_pyspark.untested_note()}") from exc
    first = next(frames, None)  # runs the first partition's job
    batch = None
    if first is not None:
        try:
            batch = _decode(first, schema)
        except (pa.ArrowException, ValueError) as exc:
            raise ArrowUnavailable(
                f"Spark's Arrow batches do not decode as expected: {exc}{_pyspark.untested_note()}"
            ) from exc

    def batches() -> Iterator[pa.RecordBatch]:
        if batch is None:
            return
        yield batch
        for frame in frames:
            try:
                yield _decode(frame, schema)
            except (pa.ArrowException, ValueError) as exc:
                raise SparkEnvironmentError(
                    f"Spark's Arrow batches do not decode as expected: {exc}{_pyspark.untested_note()}"
                ) from exc

    return arrow_chunks(batches(), plan)


def decode_frame(frame: bytes, plan: Plan) -> pa.RecordBatch:
    """One of Spark's record-batch messages of the prepared columns, read with the types it was written in."""
    return _decode(frame, arrow_schema(plan))


def _decode(frame: bytes, narrow: pa.Schema) -> pa.RecordBatch:
    import pyarrow as pa

    buffer = pa.py_buffer(frame)
    batch = pa.ipc.read_record_batch(buffer, narrow)
    sent = as_sent(narrow, batch)
    return batch if sent.equals(narrow) else pa.ipc.read_record_batch(buffer, sent)

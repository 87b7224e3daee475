"""Executors mode: one producer per Spark partition, on its executor; only counts come back."""

from __future__ import annotations

import base64
import functools
import json
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aioprod.spark import _pyspark
from aioprod.spark.chunks import Chunk, arrow_chunks, row_chunks
from aioprod.spark.environment import check_executors, executor_python, explain_job_failure, spark_context
from aioprod.spark.plan import Plan
from aioprod.spark.reports import PartitionReport, RowError, Tally, WriteReport
from aioprod.spark.writer import PartitionWrite, ProgressCallback, write_partition

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import SparkContext
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: One row per partition, in the Arrow transport's result schema and the Row transport's dicts.
_RESULT_DDL = (
    "spark_partition int, attempt int, written long, failed long, seconds double, "
    "topics string, errors string, aborted string"
)


def write_from_executors(df: DataFrame, plan: Plan, transport: str, progress: ProgressCallback | None) -> WriteReport:
    """Run the write as one Spark job; ``progress`` hears the totals once, when it ends."""
    started = time.monotonic()
    sc = spark_context(df)
    with executor_python(sc):
        arrow = check_executors(sc, need_arrow=transport == "arrow")
        used, rows = _run_job(df, sc, plan, transport if arrow else "rows")
    partitions: list[PartitionReport] = []
    tally = Tally()
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
    report = tally.report("executors", used, time.monotonic() - started, partitions)
    if report.retried_partitions:
        log.warning(
            "Spark retried partition(s) %s: rows an earlier attempt sent may be in Kafka twice",
            report.retried_partitions,
        )
    if progress is not None:
        progress(report.rows_written, report.rows_failed)
    return report


def _run_job(df: DataFrame, sc: SparkContext | None, plan: Plan, transport: str) -> tuple[str, list[dict[str, Any]]]:
    try:
        if transport in ("auto", "arrow"):
            try:
                result = _pyspark.map_in_arrow(df, functools.partial(executor_arrow_task, plan), _RESULT_DDL)
            except Exception as exc:
                if transport == "arrow":
                    raise
                log.info("mapInArrow is not available (%s%s); writing from Rows instead", exc, _pyspark.untested_note())
            else:
                return "arrow", [r.asDict() for r in result.collect()]
        return "rows", df.rdd.mapPartitions(functools.partial(executor_rows_task, plan)).collect()
    except Exception as exc:
        explain_job_failure(exc, sc)
        raise


def executor_arrow_task(plan: Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs on an executor: send one partition's Arrow batches, yield one row of counts."""
    import pyarrow as pa

    yield pa.RecordBatch.from_pylist([_run_partition(plan, arrow_chunks(batches, plan))], schema=_result_schema())


def executor_rows_task(plan: Plan, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """Runs on an executor: send one partition's Rows, yield one dict of counts."""
    yield _run_partition(plan, row_chunks(rows, plan))


def _run_partition(plan: Plan, chunks: Iterator[Chunk]) -> dict[str, Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else -1
    attempt = context.attemptNumber() if context is not None else 0
    started = time.monotonic()
    tally = write_partition(PartitionWrite(plan, spark_partition=partition), chunks)
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
def _result_schema() -> pa.Schema:
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

"""Executors mode: one producer per Spark partition, on its executor; only counts come back."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aioprod.config import ProducerConfig
from aioprod.errors import ConfigError, KafkaError
from aioprod.spark import _pyspark
from aioprod.spark.chunks import Chunk, arrow_chunks, row_chunks
from aioprod.spark.environment import check_executors, executor_python, explain_job_failure, spark_context
from aioprod.spark.jobs import WriteJob
from aioprod.spark.plan import Plan
from aioprod.spark.reports import PartitionReport, RowError, Tally, WriteReport
from aioprod.spark.transactions import abort_after_failed_job, encode, end_transactions, handle_accumulator
from aioprod.spark.writer import PartitionWrite, ProgressCallback, TransactionalPartitionWrite, write_partition

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import Accumulator, SparkContext
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: One row per partition, in the Arrow transport's result schema and the Row transport's dicts.
_RESULT_DDL = (
    "spark_partition int, attempt int, written long, failed long, seconds double, "
    "topics string, errors string, aborted string, prepared string, skipped boolean"
)


class FencedAttemptError(KafkaError):
    """Raised on an executor: another producer took this task attempt's transactional id while
    it wrote, so its rows are aborted. Failing the attempt makes Spark run it again.

    Spark does not stop the Python worker of a task that failed: when the task's upstream
    failed, the worker goes on reading what input reached it, and may start its producer only
    after the retry has started, fencing it. The next attempt fences that worker in turn.
    """


def write_from_executors(df: DataFrame, plan: Plan, transport: str, progress: ProgressCallback | None) -> WriteReport:
    """Run the write as one Spark job; ``progress`` hears the totals once, when it ends.

    Exactly-once: the tasks' transactions are committed once the job has succeeded and every
    partition wrote all its rows, and aborted otherwise (see :mod:`aioprod.spark.transactions`).
    """
    started = time.monotonic()
    sc = spark_context(df)
    accumulator = None
    if plan.exactly_once:
        accumulator = handle_accumulator(sc)
        if sc is not None and str(sc.getConf().get("spark.speculation", "false")).lower() == "true":
            log.warning(
                "spark.speculation is on: a speculative copy of a task fences the transaction of the attempt it "
                "copies, and if Spark keeps that attempt's result the write fails (rows are never lost or doubled)"
            )
        else:
            plan = dataclasses.replace(plan, retry_fenced=True)
    with executor_python(sc):
        arrow = check_executors(sc, need_arrow=transport == "arrow")
        job = WriteJob(sc)
        try:
            with job:
                used, rows = _run_job(df, sc, plan, transport if arrow else "rows", accumulator)
        except BaseException:
            # Ctrl-C (KeyboardInterrupt) left the job running (see aioprod.spark.jobs); a job that
            # failed may still be stopping tasks. A second Ctrl-C abandons the rest.
            timeout = ProducerConfig.from_options(plan.options).max_block_ms / 1000
            job.stop(timeout)
            if plan.exactly_once:
                # A prepared transaction left open pins its partitions' last stable offset, stalling
                # every read_committed reader for transaction_timeout_ms.
                abort_after_failed_job(plan, accumulator, job.wait_for_tasks(timeout))
            raise
    rows = sorted(rows, key=lambda r: r["spark_partition"])
    invisible: set[int] = set()
    outcome = None
    if plan.exactly_once:
        invisible, outcome = end_transactions(plan, rows, accumulator, time.monotonic() - started)
    partitions: list[PartitionReport] = []
    tally = Tally()
    for r in rows:
        partitions.append(
            PartitionReport(
                r["spark_partition"], r["attempt"], r["written"], r["failed"], r["seconds"], bool(r["skipped"])
            )
        )
        tally.failed += r["failed"]
        if r["spark_partition"] not in invisible:
            tally.written += r["written"]
            tally.topics.update(json.loads(r["topics"]))
        for e in json.loads(r["errors"]):
            if len(tally.errors) < plan.max_errors:
                key = None if e["key"] is None else base64.b64decode(e["key"])
                tally.errors.append(RowError(e["row"], e["topic"], key, e["error"], r["spark_partition"]))
        if r["aborted"] and tally.aborted is None:
            tally.aborted = f"partition {r['spark_partition']}: {r['aborted']}"
    if outcome is not None:
        tally.aborted = outcome if tally.aborted is None else f"{tally.aborted}; {outcome}"
    skipped = [r["spark_partition"] for r in rows if r["skipped"]]
    report = tally.report(
        "executors",
        used,
        time.monotonic() - started,
        partitions,
        write_id=plan.write_id,
        partitions_skipped=skipped,
    )
    if report.retried_partitions and not plan.exactly_once:
        log.warning(
            "Spark retried partition(s) %s: rows an earlier attempt sent may be in Kafka twice",
            report.retried_partitions,
        )
    if progress is not None:
        try:
            progress(report.rows_written, report.rows_failed)
        except Exception as exc:
            # The write is done (committed, if exactly-once): say so, or it looks undone.
            exc.add_note(f"raised by progress() after the write completed: {report}")
            raise
    return report


def _run_job(
    df: DataFrame, sc: SparkContext | None, plan: Plan, transport: str, prepared: Accumulator[list[str]] | None
) -> tuple[str, list[dict[str, Any]]]:
    try:
        if transport in ("auto", "arrow"):
            try:
                task = functools.partial(executor_arrow_task, plan, prepared=prepared)
                result = _pyspark.map_in_arrow(df, task, _RESULT_DDL)
            except Exception as exc:
                if transport == "arrow":
                    raise
                log.info("mapInArrow is not available (%s%s); writing from Rows instead", exc, _pyspark.untested_note())
            else:
                return "arrow", [r.asDict() for r in result.collect()]
        return "rows", df.rdd.mapPartitions(functools.partial(executor_rows_task, plan, prepared=prepared)).collect()
    except Exception as exc:
        explain_job_failure(exc, sc)
        raise


def executor_arrow_task(
    plan: Plan, batches: Iterator[pa.RecordBatch], *, prepared: Accumulator[list[str]] | None = None
) -> Iterator[pa.RecordBatch]:
    """Runs on an executor: send one partition's Arrow batches, yield one row of counts."""
    import pyarrow as pa

    row = _run_partition(plan, arrow_chunks(batches, plan), prepared)
    yield pa.RecordBatch.from_pylist([row], schema=_result_schema())


def executor_rows_task(
    plan: Plan, rows: Iterator[Any], *, prepared: Accumulator[list[str]] | None = None
) -> Iterator[dict[str, Any]]:
    """Runs on an executor: send one partition's Rows, yield one dict of counts."""
    yield _run_partition(plan, row_chunks(rows, plan), prepared)


def _run_partition(plan: Plan, chunks: Iterator[Chunk], prepared: Accumulator[list[str]] | None) -> dict[str, Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else -1
    attempt = context.attemptNumber() if context is not None else 0
    started = time.monotonic()
    try:
        unit = (
            TransactionalPartitionWrite(plan, str(partition), commit=False, spark_partition=partition)
            if plan.exactly_once
            else PartitionWrite(plan, spark_partition=partition)
        )
    except ConfigError as exc:
        # The driver accepted these options: what differs is this executor (a PEM file the
        # driver has and it does not). Raised, it failed every attempt of every task, the
        # error buried in Spark's traces; it would fail again, so the partition stops here.
        tally = Tally(aborted=f"the producer options fail on executor {socket.gethostname()}: ConfigError: {exc}")
        fenced = False
    else:
        tally = write_partition(unit, chunks)
        fenced = isinstance(unit, TransactionalPartitionWrite) and unit.fenced
    if plan.retry_fenced and fenced:
        raise FencedAttemptError(
            f"Spark partition {partition}, attempt {attempt}: another producer took transactional id "
            f"{plan.transactional_id(str(partition))!r} while this attempt wrote (an earlier attempt still "
            "running?); its rows are aborted, and the attempt fails so that Spark runs it again"
        )
    handle = None if tally.prepared is None else encode(tally.prepared)
    if handle is not None and prepared is not None:
        prepared.add([handle])
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
        "prepared": handle,
        "skipped": tally.skipped,
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
            ("prepared", pa.string()),
            ("skipped", pa.bool_()),
        ]
    )

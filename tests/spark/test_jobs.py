"""The Spark job of an executors-mode write (aioprod.spark.jobs.WriteJob)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aioprod.spark import _pyspark, write_dataframe
from aioprod.spark.jobs import WriteJob
from tests.brokers import TansuBroker
from tests.spark.test_exactly_once import logs, new_topic


class StoppedSparkContextFake:
    """A fake, to inject one fault: a SparkContext whose JVM side stopped (a fatal error, the
    cluster manager, another thread), which fails the running job and refuses most calls."""

    def __init__(self) -> None:
        # getJobIdsForTag still answers (the status store outlives the context).
        tracker = SimpleNamespace(getJobIdsForTag=lambda tag: [7])
        self._jsc = SimpleNamespace(sc=lambda: SimpleNamespace(statusTracker=lambda: tracker))

    def addJobTag(self, tag: str) -> None:
        pass

    def removeJobTag(self, tag: str) -> None:
        raise RuntimeError("the SparkContext was stopped (removeJobTag)")

    def cancelJobsWithTag(self, tag: str) -> None:
        raise RuntimeError("Cannot call methods on a stopped SparkContext (cancelJobsWithTag)")

    def statusTracker(self) -> SimpleNamespace:
        raise RuntimeError("Cannot call methods on a stopped SparkContext (statusTracker)")


def test_a_write_whose_spark_context_stopped_raises_the_jobs_error_not_its_cleanups() -> None:
    # executors.py's shape: the block runs the job; on its error the write cancels and waits.
    job = WriteJob(StoppedSparkContextFake())  # type: ignore[arg-type]
    error = ValueError("the job's error: SparkContext was shut down")
    with pytest.raises(ValueError) as raised:
        try:
            with job:
                raise error
        except BaseException:
            job.cancel()
            assert job.wait_for_tasks(1) is None  # unknown: nothing is fenced
            raise
    assert raised.value is error


class _SlowToPlanSource:
    """A Python data source (pyspark 4) whose planning, on the driver, waits for ``gate``."""

    @staticmethod
    def register(spark: Any, name: str, entered: Path, gate: Path) -> None:
        from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

        class Reader(DataSourceReader):
            def partitions(self) -> list[InputPartition]:
                entered.touch()
                while not gate.exists():
                    time.sleep(0.01)
                return [InputPartition(i) for i in range(2)]

            def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
                for n in range(100):
                    yield (f"{partition.value}-{n}",)

        class Source(DataSource):
            @classmethod
            def name(cls) -> str:
                return name

            def schema(self) -> str:
                return "value string"

            def reader(self, schema: Any) -> DataSourceReader:
                return Reader()

        spark.dataSource.register(Source)


@pytest.mark.integration
def test_ctrl_c_while_the_write_is_planned_cancels_the_job_spark_starts_after_it(
    spark: Any, tansu_broker: TansuBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C before the job exists: the interrupted call plans on in the JVM and starts the job
    # once the write has raised KeyboardInterrupt; its tasks wrote every row, and exactly-once
    # left their transactions open. (Not exactly-once, a job started late may write a few rows
    # before the write, which polls, cancels it.)
    pytest.importorskip("pyspark.sql.datasource")
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    entered, gate = tmp_path / "entered", tmp_path / "gate"
    name = f"slow_to_plan_{uuid.uuid4().hex[:8]}"
    _SlowToPlanSource.register(spark, name, entered, gate)
    cancel = WriteJob.cancel
    tags: list[str] = []

    def cancel_then_let_planning_end(job: WriteJob) -> Any:
        tags.append(job._tag)
        cancelled = cancel(job)
        gate.touch()  # the write has cancelled what ran: planning ends only now
        return cancelled

    monkeypatch.setattr(WriteJob, "cancel", cancel_then_let_planning_end)

    def ctrl_c_while_planning() -> None:
        while not entered.exists() and not gate.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=ctrl_c_while_planning)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            write_dataframe(
                spark.read.format(name).load(),
                bootstrap_servers=bootstrap,
                topic=topic,
                mode="executors",
                exactly_once=True,
            )
    finally:
        gate.touch()
        watcher.join(30)
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    while not (jobs := _pyspark.job_ids_with_tag(sc, tags[0])) or any(
        getattr(tracker.getJobInfo(job), "status", "RUNNING") == "RUNNING" for job in jobs
    ):
        time.sleep(0.05)  # the job the planned call starts: cancelled, or writing on until it ends
    log = logs(bootstrap, topic)
    assert (log.committed, log.open) == ([], [])

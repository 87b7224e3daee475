"""Exactly-once writes (``exactly_once=True``) on a real local SparkSession (``local[2,4]``: a
failed task is retried) against Tansu.

What a read_committed reader sees is worked out from the raw log and its commit/abort markers
(``read_transactional_log``: aiokafka's decoder, independent of aioprod), because Tansu does not
filter aborted records for read_committed fetches; Apache Kafka does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aioprod import SyncProducer
from aioprod.errors import ConfigError, InvalidTransactionTimeoutError, KafkaTimeoutError, ProducerFatalError
from aioprod.producer.transactions import PreparedTransaction
from aioprod.spark import Mode, WriteError, executors, write_dataframe, writer
from aioprod.spark import transactions as spark_transactions
from aioprod.spark.chunks import Chunk
from aioprod.spark.executors import FencedAttemptError
from aioprod.spark.plan import Plan, producer_options
from aioprod.spark.writer import TransactionalPartitionWrite, write_partition
from tests.brokers import TansuBroker
from tests.chaos.proxy import FaultProxy
from tests.readback import TransactionalLog, read_transactional_log
from tests.spark.test_write import MODES, UNREACHABLE, create_topic, tansu_behind_a_proxy

pytestmark = pytest.mark.integration

#: Kafka partitions of every topic here.
PARTITIONS = 2


def new_topic(bootstrap: str) -> str:
    topic = f"aioprod-eos-{uuid.uuid4().hex[:10]}"
    create_topic(bootstrap, topic, PARTITIONS)
    return topic


def logs(bootstrap: str, topic: str) -> TransactionalLog:
    """All partitions' logs as one."""
    merged = TransactionalLog([], [], [])
    for log in asyncio.run(read_transactional_log(bootstrap, topic, PARTITIONS)).values():
        merged.committed += log.committed
        merged.aborted += log.aborted
        merged.open += log.open
    return merged


def numbers(values: list[bytes | None]) -> Counter[int]:
    return Counter(int(v or b"") for v in values)


@pytest.fixture
def small_arrow_batches(spark: Any) -> Iterator[None]:
    """Arrow batches of 200 rows, so that a writer has read part of its partition when an upstream
    computation fails (with the default 10,000 the failure comes before the first batch)."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "200")
    try:
        yield
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def failing_frame(spark: Any, rows: int, fail_at: int, *, always: bool = False) -> Any:
    """``rows`` numbers in 2 Spark partitions; a Python UDF raises at ``fail_at`` on the task's first
    attempt (``always``: on every attempt). The writer's input then ends normally, after the rows that
    got through: a task must not commit what it was given."""
    from pyspark.sql import functions as F

    @F.udf("string", useArrow=False)
    def upstream(n: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if n == fail_at and (always or (context is not None and context.attemptNumber() == 0)):
            raise RuntimeError(f"upstream failure at row {n}")
        return str(n)

    return spark.range(rows, numPartitions=2).select(upstream("id").alias("value"))


@pytest.mark.filterwarnings("ignore:Cannot infer the eval type:UserWarning")
@pytest.mark.parametrize("mode", MODES)
def test_a_retried_task_writes_every_row_once_and_a_rerun_writes_nothing(
    spark: Any, tansu_broker: TansuBroker, small_arrow_batches: None, mode: Mode
) -> None:
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    # In executors mode the first attempt of Spark partition 1 writes part of its rows before its
    # input ends (about 6,000 of 7,500 here; with fewer rows its writer has not started yet).
    # In driver mode Spark hands the driver whole partitions only: a small frame does.
    rows = 20_000 if mode == "executors" else 6_000
    df = failing_frame(spark, rows, fail_at=rows * 7 // 8)  # in Spark partition 1
    write_id = f"eos-test-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {"mode": mode, "exactly_once": True, "write_id": write_id, "max_block_ms": 15_000}
    try:
        report = write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, **options)
    except WriteError as exc:
        # What docs/spark.md names (test_a_partition_fenced_after_it_prepared_fails_the_commit_...):
        # the first attempt's worker, seconds late on a loaded host, fenced the retry after it
        # prepared. Finished as the docs say, by a rerun.
        text = str(exc)
        fenced = re.search(r"partition 1: (commit in doubt|not committed).*(closed the connection|Fenced)", text, re.S)
        assert mode == "executors" and fenced, exc  # Tansu closes the connection where Kafka says PRODUCER_FENCED
        finish = write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, **options)
        assert (finish.partitions_skipped, finish.rows_failed, finish.aborted) == ([0], 0, None)
    else:
        assert (report.rows_written, report.rows_failed, report.aborted) == (rows, 0, None)
        assert (report.write_id, report.partitions_skipped) == (write_id, [])
        if mode == "executors":
            # Attempt 2 or later when the first attempt's worker started its producer after the
            # retry had: that fences the retry, which then fails and runs again.
            assert [(p.spark_partition, p.attempt > 0) for p in report.partitions] == [(0, False), (1, True)]
    log = logs(bootstrap, topic)
    assert numbers(log.committed) == Counter(range(rows))  # every row, once
    assert log.open == []  # what the first attempt wrote was aborted when the second one started
    assert set(numbers(log.aborted)) <= set(range(rows // 2, rows))

    again = write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, **options)
    assert (again.rows_written, again.rows_failed, again.aborted) == (0, 0, None)
    assert again.partitions_skipped == ([0, 1] if mode == "executors" else [0])
    # Nothing more was committed, and nothing is left open. Spark does not wait for the Python
    # worker of a failed attempt: in executors mode the first attempt of Spark partition 1 may
    # still be writing when the first write returns, and what it writes is aborted when its input
    # ends. So aborted rows may grow after the first read, only from that partition's rows.
    later = logs(bootstrap, topic)
    assert (later.committed, later.open) == (log.committed, [])
    assert set(numbers(later.aborted)) <= set(range(rows // 2, rows))


@pytest.mark.filterwarnings("ignore:Cannot infer the eval type:UserWarning")
@pytest.mark.parametrize("mode", MODES)
def test_a_failed_job_leaves_nothing_visible(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    df = failing_frame(spark, 2000, fail_at=1900, always=True)  # partition 0 succeeds, partition 1 never
    with pytest.raises(Exception, match="upstream failure at row 1900"):
        write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, mode=mode, exactly_once=True)
    log = logs(bootstrap, topic)
    assert log.committed == []
    if mode == "driver":  # the driver's one transaction was aborted when its input raised
        assert log.open == []
        assert set(numbers(log.aborted)) <= set(range(1000))  # what of partition 0 was sent


@pytest.mark.parametrize("mode", MODES)
def test_a_row_that_cannot_be_written_leaves_nothing_visible(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    rows = [(topic, str(i)) for i in range(40)]
    rows[30] = ("not a topic!", "30")  # refused before it is queued; the rows of the other partition are fine
    df = spark.createDataFrame(rows, "topic string, value string").repartition(2)
    with pytest.raises(WriteError, match="illegal topic name") as info:
        write_dataframe(df, bootstrap_servers=bootstrap, mode=mode, exactly_once=True)
    report = info.value.report
    assert (report.rows_written, report.rows_failed, report.topics) == (0, 1, {})
    assert "nothing is visible" in str(info.value)
    log = logs(bootstrap, topic)
    assert (log.committed, log.open) == ([], [])


def test_a_driver_that_dies_while_committing_is_finished_by_a_rerun(
    spark: Any, tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    class DriverDied(BaseException):
        """The driver process ends here: no cleanup runs."""

    real_end_all = spark_transactions.end_all

    def commit_the_first_then_die(plan: Plan, handles: Any, *, commit: bool) -> Any:
        real_end_all(plan, handles[:1], commit=commit)
        raise DriverDied

    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    # Spark partition i writes Kafka partition i: Tansu shows a transaction's committed offsets (the
    # marker) only once every transaction opened before its commit on the same partitions has ended,
    # so a shared partition would hide partition 0's marker until the rerun fences partition 1's
    # transaction (Kafka does not; see docs/spark.md).
    df = spark.range(2000, numPartitions=2).selectExpr(
        "cast(id as string) as value", "cast(id >= 1000 as int) as partition"
    )
    write_id = f"eos-test-{uuid.uuid4().hex[:8]}"
    with monkeypatch.context() as patched:
        patched.setattr(spark_transactions, "end_all", commit_the_first_then_die)
        with pytest.raises(DriverDied):
            write_dataframe(
                df, bootstrap_servers=bootstrap, topic=topic, mode="executors", exactly_once=True, write_id=write_id
            )
    log = logs(bootstrap, topic)
    assert numbers(log.committed) == Counter(range(1000))  # partition 0 committed
    assert numbers(log.open) == Counter(range(1000, 2000))  # partition 1 left open

    report = write_dataframe(
        df, bootstrap_servers=bootstrap, topic=topic, mode="executors", exactly_once=True, write_id=write_id
    )
    assert (report.rows_written, report.partitions_skipped, report.aborted) == (1000, [0], None)
    log = logs(bootstrap, topic)
    assert numbers(log.committed) == Counter(range(2000))  # every row, once
    assert numbers(log.aborted) == Counter(range(1000, 2000))  # the first run's partition 1, fenced
    assert log.open == []


# -- the two phases without Spark: a writer as a task runs it, the driver's commit ------------------


def exactly_once_plan(bootstrap: str, topic: str, **options: Any) -> Plan:
    return Plan(
        producer_options(bootstrap, options, exactly_once=True),
        topic,
        False,
        False,
        False,
        False,
        "raise",
        20,
        10_000,
        None,
        exactly_once=True,
        write_id=f"eos-test-{uuid.uuid4().hex[:8]}",
    )


def run_task(plan: Plan, partition: int, values: list[bytes]) -> PreparedTransaction | None:
    """What an executor task does for ``partition``: write ``values`` in a transaction, prepare it."""
    unit = TransactionalPartitionWrite(plan, str(partition), commit=False, spark_partition=partition)
    tally = write_partition(unit, [Chunk(0, list(values))])
    assert tally.aborted is None
    return tally.prepared


def result_row(partition: int, prepared: PreparedTransaction | None) -> dict[str, Any]:
    """The parts of a task's result row the driver's commit reads."""
    handle = None if prepared is None else spark_transactions.encode(prepared)
    return {"spark_partition": partition, "prepared": handle, "aborted": None, "failed": 0}


def test_a_failed_write_aborts_what_only_the_accumulator_reports(tansu_broker: TansuBroker) -> None:
    # Another attempt's transaction, whose result row never reached the driver, is known only
    # from the accumulator: left open, it would hold read_committed readers of its partition for
    # transaction_timeout_ms.
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    plan = exactly_once_plan(bootstrap, topic)
    kept = run_task(plan, 0, [b"kept"])
    other_attempt = run_task(plan, 1, [b"other attempt"])
    assert kept is not None and other_attempt is not None
    failed = {"spark_partition": 1, "prepared": None, "aborted": None, "failed": 1}
    accumulator = SimpleNamespace(value=[spark_transactions.encode(kept), spark_transactions.encode(other_attempt)])
    invisible, message = spark_transactions.end_transactions(plan, [result_row(0, kept), failed], accumulator, 1)  # type: ignore[arg-type]
    assert invisible == {0, 1} and message is not None
    log = logs(bootstrap, topic)
    assert (log.committed, sorted(log.aborted), log.open) == ([], [b"kept", b"other attempt"], [])


def test_a_partition_fenced_after_it_prepared_fails_the_commit_loudly_and_a_rerun_writes_it(
    tansu_broker: TansuBroker,
) -> None:
    # A speculative copy of a task (or a zombie attempt) starts after the attempt whose result
    # Spark keeps had prepared: its start fences that transaction, and the driver's commit fails.
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    plan = exactly_once_plan(bootstrap, topic, max_block_ms=1500)
    values = [b"%d" % i for i in range(100)]
    kept = run_task(plan, 0, values)
    other = run_task(plan, 1, [b"other"])
    run_task(plan, 0, values)  # the copy: fences `kept`; Spark ignores its result
    rows = [result_row(0, kept), result_row(1, other)]
    invisible, message = spark_transactions.end_transactions(plan, rows, None, seconds=1000)
    assert invisible == {0}
    assert message is not None
    assert message.startswith("1 of 2 partitions could not be committed (partition 0: ")
    # Kafka answers PRODUCER_FENCED (not committed); Tansu closes the connection, so the commit times out (in doubt).
    assert "not committed, its rows are not visible" in message or "commit in doubt" in message
    assert f"write_id={plan.write_id!r}" in message
    assert "The write took 1000s, longer than transaction_timeout_ms (900000 ms)" in message
    assert logs(bootstrap, topic).committed == [b"other"]

    rerun = run_task(plan, 0, values)  # skips nothing: partition 0 never committed
    assert spark_transactions.end_transactions(plan, [result_row(0, rerun)], None, 1) == (set(), None)
    assert run_task(plan, 1, [b"other"]) is None  # committed before: skipped
    log = logs(bootstrap, topic)
    assert numbers([v for v in log.committed if v != b"other"]) == Counter(range(100))
    assert log.open == []


@pytest.mark.parametrize(("speculation", "max_errors"), [(False, 20), (True, 20), (False, 0)])
def test_an_attempt_fenced_while_it_writes_fails_so_that_spark_runs_it_again(
    tansu_broker: TansuBroker, speculation: bool, max_errors: int
) -> None:
    # Spark does not stop the Python worker of a failed task. One whose upstream failed reads on
    # what input reached it, and may start its producer only after the retry started: that
    # fences the retry. The retry must then fail, so that Spark runs it again (fencing that
    # worker), rather than return a result that fails the whole write. Not under speculation,
    # where the fencing producer is a copy of the task that Spark may keep.
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    # max_errors=0 keeps no row errors, where the fencing was looked for: it went unnoticed.
    plan = dataclasses.replace(exactly_once_plan(bootstrap, topic), retry_fenced=not speculation, max_errors=max_errors)
    values = [b"%d" % i for i in range(100)]
    zombie = TransactionalPartitionWrite(plan, "-1", commit=False)  # outside Spark a task's partition is -1

    def input_with_a_late_starter() -> Iterator[Chunk]:
        yield Chunk(0, values[:50])
        assert zombie.open()  # the earlier attempt's producer starts: it fences this one
        yield Chunk(50, values[50:])

    try:
        if speculation:
            row = executors._run_partition(plan, input_with_a_late_starter(), None)
            assert (row["prepared"], row["failed"] > 0) == (None, True)  # the write fails; the copy may win
        else:
            taken = re.escape(f"took transactional id '{zombie.transactional_id}'")
            with pytest.raises(FencedAttemptError, match=taken):
                executors._run_partition(plan, input_with_a_late_starter(), None)
    finally:
        zombie.abort(interrupted=False)
    again = executors._run_partition(plan, iter([Chunk(0, values)]), None)  # Spark's next attempt
    assert spark_transactions.end_transactions(plan, [again], None, 1) == (set(), None)
    log = logs(bootstrap, topic)
    assert numbers(log.committed) == Counter(range(100))
    assert log.open == []


def test_a_driver_commit_in_doubt_says_so_and_how_to_finish_it(
    tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Driver mode commits itself. A newer producer with the same transactional id fences it just
    # before its EndTxn; Tansu then closes the connection instead of answering, so the commit
    # runs out of time without knowing whether it went through: the report must say so.
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    # Closing waits for the commit at most close_timeout: Tansu keeps closing the connection.
    plan = dataclasses.replace(exactly_once_plan(bootstrap, topic, max_block_ms=1500), close_timeout=2)
    unit = TransactionalPartitionWrite(plan, "driver", commit=True)
    commit = SyncProducer.commit_transaction

    def fenced_then_commit(self: SyncProducer, *args: Any, **kwargs: Any) -> None:
        with SyncProducer(plan.options, transactional_id=unit.transactional_id):  # fences self
            pass
        commit(self, *args, **kwargs)

    monkeypatch.setattr(SyncProducer, "commit_transaction", fenced_then_commit)
    tally = write_partition(unit, [Chunk(0, [b"%d" % i for i in range(10)])])
    assert tally.aborted is not None
    assert tally.aborted.startswith(f"the commit of transaction {unit.transactional_id!r} is in doubt (")
    assert f"write_id={plan.write_id!r}" in tally.aborted
    assert logs(bootstrap, topic).committed == []  # the fencing producer aborted it


def test_a_start_that_fails_otherwise_than_kafka_closes_its_producer(
    tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Driver mode opens its writer before reading input; a start that raised anything but a
    # KafkaError (its wait for the commit marker running out on a stuck loop: a bare TimeoutError)
    # once the producer existed left it open, for its finalizer to close at garbage collection.
    plan = exactly_once_plan(tansu_broker.bootstrap, new_topic(tansu_broker.bootstrap))
    unit = TransactionalPartitionWrite(plan, "driver", commit=True)

    async def stuck(producer: Any, group_id: str) -> bool:
        raise TimeoutError

    monkeypatch.setattr(writer, "_committed", stuck)
    opened: list[SyncProducer] = []
    monkeypatch.setattr(SyncProducer, "__init__", _recording(SyncProducer.__init__, opened))
    with pytest.raises(TimeoutError):
        unit.open()
    assert len(opened) == 1 and opened[0].closed


def test_a_start_that_fails_on_a_stuck_loop_raises_its_own_error_not_the_closes(
    tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a stuck loop the commit marker's wait ran out, and so did the close open() then made:
    # open() raised the close's KafkaTimeoutError ("the producer did not close within 5.0s", a
    # KafkaError), the start's own error only its __context__.
    plan = exactly_once_plan(tansu_broker.bootstrap, new_topic(tansu_broker.bootstrap))
    unit = TransactionalPartitionWrite(plan, "driver", commit=True)
    failure = TimeoutError("the commit marker's wait ran out")

    async def stuck(producer: Any, group_id: str) -> bool:
        raise failure

    close = SyncProducer.close

    def close_outlasting_its_grace(self: SyncProducer, timeout: float | None = None) -> None:  # a FAKE fault
        close(self, timeout)
        raise KafkaTimeoutError("the producer did not close within 5.0s")

    monkeypatch.setattr(writer, "_committed", stuck)
    monkeypatch.setattr(SyncProducer, "close", close_outlasting_its_grace)
    with pytest.raises(TimeoutError) as info:
        unit.open()
    assert type(info.value) is TimeoutError and info.value.args == failure.args  # (copied across the loop's thread)


def _recording(init: Any, opened: list[SyncProducer]) -> Any:
    def recorded(self: SyncProducer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        opened.append(self)

    return recorded


@pytest.fixture
def proxied_tansu() -> Iterator[tuple[str, FaultProxy, asyncio.AbstractEventLoop]]:
    """A Tansu broker behind the fault proxy: its bootstrap, the proxy, and the proxy's loop."""
    with tansu_behind_a_proxy("eos-fault-proxy") as proxied:
        yield proxied


def _delivered(unit: TransactionalPartitionWrite) -> None:
    """Wait for every chunk handed to ``unit`` to be acknowledged."""
    while unit._pending:
        unit._collect_oldest()


def test_ctrl_c_in_a_driver_write_aborts_its_transaction_with_records_in_flight(
    proxied_tansu: tuple[str, FaultProxy, asyncio.AbstractEventLoop],
) -> None:
    # Ctrl-C closed the driver's producer with close(0): its abort waited for the records in
    # flight, gave up at once, and never sent EndTxn. The transaction stayed open, holding every
    # read_committed reader of its partitions for transaction_timeout_ms (15 minutes by default).
    bootstrap, proxy, loop = proxied_tansu
    topic = new_topic(bootstrap)
    plan = exactly_once_plan(bootstrap, topic, request_timeout_ms=1000, max_block_ms=5000, linger_ms=0)
    unit = TransactionalPartitionWrite(plan, "driver", commit=True)
    assert unit.open()
    assert unit.write(Chunk(0, [b"%d" % i for i in range(50)], partitions=[0] * 50))
    _delivered(unit)  # in the transaction, on the broker
    proxy.mute_answers = True
    assert unit.write(Chunk(50, [b"%d" % i for i in range(50, 100)], partitions=[0] * 50))
    # The broker wrote the second chunk; its answer is dropped: the chunk is in flight for the producer.
    asyncio.run_coroutine_threadsafe(proxy.until(lambda: proxy.produce_answers_dropped > 0), loop).result(30)
    proxy.mute_answers = False
    unit.abort(interrupted=True)  # what write_partition does on KeyboardInterrupt
    log = logs(bootstrap, topic)
    assert (log.committed, log.open) == ([], [])
    assert set(range(51)) <= set(numbers(log.aborted)) <= set(range(100))  # the rest was not sent yet


def test_a_transaction_whose_abort_fails_is_not_reported_aborted(
    proxied_tansu: tuple[str, FaultProxy, asyncio.AbstractEventLoop],
) -> None:
    # A row failed, and the broker stopped answering: the abort on close failed (a warning in the
    # producer's log), and the driver reported "the transaction was aborted: nothing is visible"
    # while it stayed open, holding read_committed readers, with nothing saying how to end it.
    bootstrap, proxy, _ = proxied_tansu
    topic = new_topic(bootstrap)
    plan = dataclasses.replace(exactly_once_plan(bootstrap, topic, max_block_ms=1500), close_timeout=1)
    unit = TransactionalPartitionWrite(plan, "driver", commit=True)
    values = [b"%d" % i for i in range(50)]

    def chunks() -> Iterator[Chunk]:
        yield Chunk(0, values, partitions=[0] * 50)
        _delivered(unit)
        proxy.black_hole = True  # the broker stops answering
        yield Chunk(50, [b"x" * (2 << 20)])  # larger than max_request_size: refused before it is queued

    tally = write_partition(unit, chunks())
    proxy.black_hole = False
    assert tally.failed == 1
    assert tally.aborted is not None
    assert f"{unit.transactional_id!r} was not committed, and its abort could not be confirmed (" in tally.aborted
    assert f"write_id={plan.write_id!r}" in tally.aborted
    assert logs(bootstrap, topic).open == values  # as the report says


def test_ctrl_c_during_an_executors_write_aborts_what_its_tasks_prepared(
    spark: Any, tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Left open, they pinned the partitions' last stable offset: every read_committed reader
    # stalled for transaction_timeout_ms (15 minutes by default).
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    run_job = executors._run_job

    def interrupted(*args: Any) -> Any:
        run_job(*args)  # every task wrote and prepared its transaction
        raise KeyboardInterrupt  # pyspark's SIGINT handler cancels the job and raises this

    monkeypatch.setattr(executors, "_run_job", interrupted)
    df = spark.range(20, numPartitions=2).selectExpr("cast(id as string) as value")
    with pytest.raises(KeyboardInterrupt):
        write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, mode="executors", exactly_once=True)
    log = logs(bootstrap, topic)
    assert (log.committed, log.open) == ([], [])
    assert numbers(log.aborted) == Counter(range(20))


@pytest.mark.filterwarnings("ignore:Cannot infer the eval type:UserWarning")
def test_ctrl_c_during_an_executors_write_aborts_the_transactions_its_running_tasks_opened(
    spark: Any, tansu_broker: TansuBroker, tmp_path: Path
) -> None:
    # pyspark's SIGINT handler cannot cancel a job while the driver waits in collect() (its call
    # to the JVM re-enters the one interrupted): the tasks ran on, and their transactions, which
    # no task had handed back, stayed open and held every read_committed reader.
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from pyspark.sql import functions as F

    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    release = tmp_path / "release"

    @F.udf("string", useArrow=False)
    def upstream(n: int) -> str:
        if n == 1_500:  # Spark partition 3 of 6 waits for the test: the job cannot end before
            while not release.exists():
                time.sleep(0.01)
        return str(n)

    df = spark.range(3_000, numPartitions=6).select(upstream("id").alias("value"))
    writing = threading.Event()
    interrupted = threading.Event()

    def ctrl_c_once_records_are_written() -> None:
        ends = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends", "isolation.level": "read_uncommitted"})
        try:
            while writing.is_set():
                try:
                    written = sum(
                        ends.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(PARTITIONS)
                    )
                except KafkaException:
                    continue  # asked again
                if written:  # a task is writing its transaction
                    interrupted.set()
                    os.kill(os.getpid(), signal.SIGINT)
                    return
        finally:
            ends.close()

    writing.set()
    watcher = threading.Thread(target=ctrl_c_once_records_are_written)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, mode="executors", exactly_once=True)
    finally:
        writing.clear()
        watcher.join(30)
        release.touch()  # a job still running (not cancelled) can now end
    assert interrupted.is_set()
    tracker = spark.sparkContext.statusTracker()
    while tracker.getActiveJobsIds():
        time.sleep(0.05)  # the job still running, if any, writes on until it ends
    log = logs(bootstrap, topic)
    assert (log.committed, log.open) == ([], [])
    assert log.aborted


def test_a_failed_job_aborts_what_its_tasks_prepared_reported_or_not(tansu_broker: TansuBroker) -> None:
    bootstrap = tansu_broker.bootstrap
    topic = new_topic(bootstrap)
    plan = exactly_once_plan(bootstrap, topic)
    prepared = run_task(plan, 0, [b"finished"])
    assert prepared is not None
    accumulator = SimpleNamespace(value=[spark_transactions.encode(prepared)])  # what the tasks reported
    # Partition 1's task prepared too, and was stopped before its result reached the driver.
    assert run_task(plan, 1, [b"stopped"]) is not None
    spark_transactions.abort_after_failed_job(plan, accumulator, 2)  # type: ignore[arg-type]
    log = logs(bootstrap, topic)
    assert (log.committed, sorted(log.aborted), log.open) == ([], [b"finished", b"stopped"], [])


def test_exactly_once_arguments_are_checked_before_anything_runs(spark: Any) -> None:
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(ValueError, match="errors='report' does not apply"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", exactly_once=True, errors="report")
    with pytest.raises(ValueError, match="pass exactly_once=True"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", write_id="w")
    with pytest.raises(ValueError, match="write_id 'no spaces' must be"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", exactly_once=True, write_id="no spaces")
    with pytest.raises(ConfigError, match="names its transactions after write_id"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", exactly_once=True, transactional_id="x")
    with pytest.raises(ConfigError, match="exactly_once=True writes in transactions: transactional_id needs"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", exactly_once=True, acks=1)


def test_a_transaction_timeout_above_the_brokers_maximum_is_explained() -> None:
    # Tansu accepts any transaction timeout; Kafka refuses one above transaction.max.timeout.ms at
    # InitProducerId (INVALID_TRANSACTION_TIMEOUT), which fails the transactional producer's start.
    refused = ProducerFatalError("the transactional producer 'w-0' failed: INVALID_TRANSACTION_TIMEOUT")
    refused.__cause__ = InvalidTransactionTimeoutError()
    assert "lower it, or raise the broker's; it must outlast the whole write" in writer._explain(refused)

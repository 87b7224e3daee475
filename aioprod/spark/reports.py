"""What a write tells its caller: the report, the rows that failed, and the errors raised."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from aioprod.errors import KafkaError
from aioprod.producer.transactions import PreparedTransaction


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
    may have written some of the partition's rows already (exactly once: into a transaction
    that the retry aborted).
    """

    spark_partition: int
    attempt: int
    rows_written: int
    rows_failed: int
    seconds: float
    #: Exactly-once: an earlier run with the same ``write_id`` committed this partition; nothing was written.
    skipped: bool = False


@dataclass(frozen=True)
class WriteReport:
    """The outcome of :func:`aioprod.spark.write_dataframe`.

    In an exactly-once write, ``rows_written`` and ``topics`` count the rows this run committed,
    as far as it knows (a commit whose answer never came is not counted): what ``read_committed``
    readers see of it. ``PartitionReport.rows_written`` counts what each task delivered into its
    transaction.
    """

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
    #: Exactly-once writes: what names their transactions; a rerun with it skips what is committed.
    write_id: str | None = None
    #: Exactly-once writes: the Spark partitions an earlier run with the same ``write_id`` had
    #: committed, so this run wrote nothing of them. Driver mode writes the whole DataFrame as one
    #: unit: ``[0]`` when it was committed before.
    partitions_skipped: list[int] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        return self.rows_written / self.seconds if self.seconds > 0 else 0.0

    @property
    def retried_partitions(self) -> list[int]:
        """Spark partitions whose task was retried: at least once, their rows may have been sent
        twice; exactly once, what an earlier attempt wrote was aborted."""
        return sorted(p.spark_partition for p in self.partitions if p.attempt > 0)

    def __str__(self) -> str:
        text = (
            f"{self.rows_written:,} rows written, {self.rows_failed:,} failed in {self.seconds:.2f}s "
            f"({self.rows_per_second:,.0f} rows/s, mode={self.mode}, transport={self.transport})"
        )
        if self.errors:
            text += f"; first error: row {self.errors[0].row}: {self.errors[0].error}"
        if self.partitions_skipped:
            text += f"; {len(self.partitions_skipped)} partition(s) committed before, skipped"
        if self.aborted:
            text += f"; aborted: {self.aborted}"
        return text


class WriteError(KafkaError):
    """Rows failed with ``errors="raise"``, or the write had to stop. ``report`` says what was done."""

    def __init__(self, message: str, report: WriteReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class Tally:
    """Counts of one writer, or of a whole write once the partitions' tallies are added up."""

    written: int = 0
    failed: int = 0
    topics: Counter[str] = field(default_factory=Counter)
    errors: list[RowError] = field(default_factory=list)
    aborted: str | None = None
    #: Exactly-once: the writer's transaction, delivered and left open for the driver to commit.
    prepared: PreparedTransaction | None = None
    #: Exactly-once: an earlier run committed this unit; nothing was written.
    skipped: bool = False

    def add_error(self, error: RowError, limit: int) -> None:
        self.failed += 1
        if len(self.errors) < limit:
            self.errors.append(error)

    def report(
        self,
        mode: str,
        transport: str,
        seconds: float,
        partitions: list[PartitionReport] | None = None,
        *,
        write_id: str | None = None,
        partitions_skipped: list[int] | None = None,
    ) -> WriteReport:
        return WriteReport(
            mode=mode,
            transport=transport,
            rows_written=self.written,
            rows_failed=self.failed,
            seconds=seconds,
            topics=dict(sorted(self.topics.items())),
            errors=list(self.errors),
            partitions=partitions or [],
            aborted=self.aborted,
            write_id=write_id,
            partitions_skipped=partitions_skipped or [],
        )

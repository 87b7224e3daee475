"""``write_dataframe``: check the arguments and the schema on the driver, then run one of the two modes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from aioprod.producer.producer import _check_topic
from aioprod.spark.driver import write_from_driver
from aioprod.spark.executors import write_from_executors
from aioprod.spark.plan import Plan, producer_options
from aioprod.spark.reports import WriteError, WriteReport
from aioprod.spark.schema import check_schema, prepare
from aioprod.spark.writer import ProgressCallback

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Mode = Literal["driver", "executors"]
ErrorPolicy = Literal["raise", "report"]
Transport = Literal["auto", "arrow", "rows"]

_DEFAULT_MAX_IN_FLIGHT_ROWS = 50_000
_DEFAULT_MAX_ERRORS = 20


def write_dataframe(
    df: DataFrame,
    *,
    bootstrap_servers: str | list[str],
    topic: str | None = None,
    mode: Mode = "driver",
    errors: ErrorPolicy = "raise",
    progress: ProgressCallback | None = None,
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
    Either way a write that cannot go on (no broker reachable, producer failed) raises
    ``WriteError``.

    ``progress`` is called on the calling thread with ``(rows_written, rows_failed)`` so far:
    in driver mode each time a chunk of rows is settled, in executors mode once, when the job
    has finished. aioprod shows nothing itself. ``transport``: ``"arrow"`` moves Arrow
    record batches, ``"rows"`` Spark ``Row`` objects, ``"auto"`` prefers Arrow.

    Other keyword arguments are producer options (``linger_ms=``, ``acks=``,
    ``compression_type=``, ... or ``**{"linger.ms": 5}``); ``SPARK_PRODUCER_DEFAULTS``
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
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable(rows_written, rows_failed) or None, got {progress!r}")
    if topic is not None:
        _check_topic(topic)
    options = producer_options(bootstrap_servers, producer_config)
    columns = check_schema(df.schema, topic)
    plan = Plan(
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
    prepared = prepare(df, plan, columns)
    write = write_from_driver if mode == "driver" else write_from_executors
    report = write(prepared, plan, transport, progress)
    if report.aborted:
        raise WriteError(f"write stopped: {report.aborted} ({report})", report)
    if report.rows_failed and errors == "raise":
        raise WriteError(f"{report.rows_failed} row(s) could not be written: {report.errors[0].error}", report)
    return report

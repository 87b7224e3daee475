"""``write_dataframe``: check the arguments and the schema on the driver, then run one of the two modes."""

from __future__ import annotations

import logging
import re
import uuid
from typing import TYPE_CHECKING, Any, Literal

from aioprod.producer.producer import check_topic_name
from aioprod.spark.driver import write_from_driver
from aioprod.spark.executors import write_from_executors
from aioprod.spark.plan import Plan, check_options_travel, producer_options
from aioprod.spark.reports import WriteError, WriteReport
from aioprod.spark.schema import check_schema, prepare
from aioprod.spark.writer import ProgressCallback

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Mode = Literal["driver", "executors"]
ErrorPolicy = Literal["raise", "report"]
Transport = Literal["auto", "arrow", "rows"]

_DEFAULT_MAX_IN_FLIGHT_ROWS = 50_000
_DEFAULT_MAX_ERRORS = 20
_WRITE_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")


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
    exactly_once: bool = False,
    write_id: str | None = None,
    **producer_config: Any,
) -> WriteReport:
    """Write every row of ``df`` to Kafka and report what happened.

    ``mode="driver"`` streams the rows to the driver (one Spark partition at a time, the
    next one prefetched; never a ``collect()`` of the whole frame) and sends them through
    one producer on one event loop with at most ``max_in_flight_rows`` unacknowledged (and
    at most twice ``buffer_memory`` of their keys, values and headers).
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

    ``exactly_once=True`` writes every row exactly once for ``read_committed`` readers, even when
    Spark retries tasks: each Spark partition (in driver mode, the whole DataFrame) is written in
    one transaction, and the transactions are committed only once the whole write has succeeded;
    if it fails, nothing of it becomes visible. ``write_id`` names the write's transactions: run a
    write again with the same ``write_id`` (and the same DataFrame, partitioned the same way) and it
    skips what an earlier run committed and writes the rest. Without one, a new id is made (the
    report's ``write_id``). See ``docs/spark.md`` for the exact guarantee.

    Other keyword arguments are producer options (``linger_ms=``, ``acks=``,
    ``compression_type=``, ... or ``**{"linger.ms": 5}``); ``SPARK_PRODUCER_DEFAULTS``
    apply where not given.
    """
    if mode not in ("driver", "executors"):
        raise ValueError(f"mode must be 'driver' or 'executors', got {mode!r}")
    if getattr(df, "isStreaming", False):
        raise ValueError(
            "df is a streaming DataFrame: write each micro-batch instead, with"
            " df.writeStream.foreachBatch(lambda batch, batch_id: write_dataframe(batch, ...)).start()"
            " (exactly_once=True with write_id=f'<name>-{batch_id}' makes a replayed batch write nothing)"
        )
    if errors not in ("raise", "report"):
        raise ValueError(f"errors must be 'raise' or 'report', got {errors!r}")
    if transport not in ("auto", "arrow", "rows"):
        raise ValueError(f"transport must be 'auto', 'arrow' or 'rows', got {transport!r}")
    for name, number in (("max_errors", max_errors), ("max_in_flight_rows", max_in_flight_rows)):
        if isinstance(number, bool) or not isinstance(number, int):
            raise TypeError(f"{name} must be an int, got {number!r}")
    if max_errors < 0 or max_in_flight_rows < 1:
        raise ValueError("max_errors must be >= 0 and max_in_flight_rows >= 1")
    if type(exactly_once) is not bool:
        raise TypeError(f"exactly_once must be True or False, got {exactly_once!r}")
    if close_timeout is not None and (
        isinstance(close_timeout, bool) or not isinstance(close_timeout, int | float) or not close_timeout >= 0
    ):
        raise ValueError(f"close_timeout must be a number of seconds >= 0 or None, got {close_timeout!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable(rows_written, rows_failed) or None, got {progress!r}")
    if topic is not None:
        topic = check_topic_name(topic)
    if exactly_once:
        if errors != "raise":
            raise ValueError("exactly_once=True writes every row or none: errors='report' does not apply")
        if write_id is None:
            write_id = f"aioprod-{uuid.uuid4().hex}"
            # The one record of it if the write ends in an exception (after a commit, say): a
            # rerun under it finishes the write without repeating what committed.
            log.info("exactly-once write %s started (run again with write_id=%r to finish it)", write_id, write_id)
        else:
            write_id = _check_write_id(write_id)
    elif write_id is not None:
        raise ValueError("write_id names the transactions of an exactly-once write: pass exactly_once=True")
    options = producer_options(bootstrap_servers, producer_config, exactly_once=exactly_once)
    if mode == "executors":
        check_options_travel(options)
    case_sensitive = str(df.sparkSession.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
    columns = check_schema(df.schema, topic, case_sensitive=case_sensitive)
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
        exactly_once=exactly_once,
        write_id=write_id,
    )
    prepared = prepare(df, plan, columns)
    write = write_from_driver if mode == "driver" else write_from_executors
    report = write(prepared, plan, transport, progress)
    if report.aborted:
        raise WriteError(f"write stopped: {report.aborted} ({report})", report)
    if report.rows_failed and errors == "raise":
        first = f": {report.errors[0].error}" if report.errors else " (max_errors=0 kept none of their errors)"
        raise WriteError(f"{report.rows_failed} row(s) could not be written{first}", report)
    return report


def _check_write_id(write_id: Any) -> str:
    if not isinstance(write_id, str):
        raise TypeError(f"write_id must be a str, got {type(write_id).__name__}")
    if not _WRITE_ID.fullmatch(write_id):
        raise ValueError(
            f"write_id {write_id!r} must be 1-200 ASCII letters, digits, '.', '_' or '-' "
            "(it names transactional ids and consumer groups)"
        )
    return write_id

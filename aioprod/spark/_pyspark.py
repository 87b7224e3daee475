"""Every call into pyspark's private or undocumented API, in one place.

aioprod uses pyspark's public API everywhere else. The calls here reach below it for six
things the public API does not offer: Arrow batches streamed to the driver, ``mapInArrow``
without pandas, the Python interpreter a SparkContext gives its executors, the jobs of a
tag, the JVM thread that runs a call, and the listener bus the status tracker lags. Each caller
falls back or explains itself when one of them is missing (Spark Connect has no JVM on the
client, and another pyspark version may have moved a name); :func:`untested_note` says so
in those messages when the running pyspark is not one these calls were tested on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: pyspark versions (major.minor) that tests/spark passed on with this module: 4.3.0 (what CI
#: installs today) and 3.5.9 (run by hand; the oldest aioprod[spark] allows).
TESTED_PYSPARK_VERSIONS = ("3.5", "4.3")


def untested_note() -> str:
    """``""`` on a tested pyspark, else a sentence naming the running and the tested versions."""
    import pyspark

    running = ".".join(pyspark.__version__.split(".")[:2])
    if running in TESTED_PYSPARK_VERSIONS:
        return ""
    tested = ", ".join(TESTED_PYSPARK_VERSIONS)
    return f" (aioprod's Spark integration is tested on pyspark {tested}; this is {pyspark.__version__})"


def arrow_frames_to_driver(df: DataFrame) -> Iterator[bytes]:
    """The DataFrame as Arrow IPC record-batch messages, streamed one partition at a time.

    ``Dataset.toArrowBatchRdd`` (JVM) served through ``PythonRDD.toLocalIteratorAndServe``,
    the local-iterator protocol ``DataFrame.toLocalIterator`` uses, with the next partition
    prefetched. Raises before any job runs when the JVM side is out of reach (Spark Connect:
    no ``_jdf``); iterating runs the jobs.
    """
    from pyspark.serializers import NoOpSerializer

    try:
        from pyspark.util import _local_iterator_from_socket
    except ImportError:  # pyspark 3.5
        from pyspark.rdd import _local_iterator_from_socket  # type: ignore[no-redef]

    jdf = df._jdf  # AttributeError under Spark Connect
    jvm: Any = df.sparkSession.sparkContext._jvm
    sock_info = jvm.PythonRDD.toLocalIteratorAndServe(jdf.toArrowBatchRdd(), True)
    return iter(_local_iterator_from_socket(sock_info, NoOpSerializer()))


def map_in_arrow(df: DataFrame, fn: Callable[[Iterator[Any]], Iterator[Any]], ddl: str) -> DataFrame:
    """``df.mapInArrow(fn, ddl)``; without pandas, the same plan built one layer down.

    pyspark's public ``mapInArrow`` goes through ``pandas_udf`` on the driver, which refuses to
    run without pandas although the Arrow path never touches it; when pandas is missing, create
    the identical map-in-Arrow UDF through the lower layer.
    """
    try:
        return df.mapInArrow(fn, ddl)
    except ImportError as exc:  # PySparkImportError: pandas is not installed
        if "pandas" not in str(exc).lower():
            raise
    import pyspark
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql.udf import _create_udf

    try:
        from pyspark.util import PythonEvalType
    except ImportError:  # pyspark 3.5
        from pyspark.rdd import PythonEvalType  # type: ignore[no-redef]

    udf: Any = _create_udf(fn, ddl, PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[name] for name in df.columns])
    if int(pyspark.__version__.split(".")[0]) >= 4:
        jdf = df._jdf.mapInArrow(column._jc, False, None)  # (udf, barrier, resource profile)
    else:
        jdf = df._jdf.pythonMapInArrow(column._jc.expr(), False)  # (udf expression, barrier)
    return SparkDataFrame(jdf, df.sparkSession)


def python_exec(sc: SparkContext) -> str:
    """The interpreter the context's Python tasks run (``PYSPARK_PYTHON`` or ``python3``, read at start)."""
    return str(sc.pythonExec)


@contextlib.contextmanager
def python_exec_set_to(sc: SparkContext, executable: str) -> Iterator[None]:
    """Python functions created in this block run on ``executable``.

    pyspark copies ``sc.pythonExec`` into every Python function as the function is created
    (``SimplePythonFunction``); a ``PipelinedRDD`` creates it when its job is submitted, so the
    block must span the job. Other threads creating Python functions meanwhile get it too.
    """
    saved = sc.pythonExec
    sc.pythonExec = executable
    try:
        yield
    finally:
        sc.pythonExec = saved


def job_ids_with_tag(sc: SparkContext, tag: str) -> list[int] | None:
    """The ids of the jobs tagged ``tag``: ``SparkStatusTracker.getJobIdsForTag``, which neither
    pyspark's ``StatusTracker`` nor the Java API's tracker it wraps offers; None where the JVM's
    tracker lacks it."""
    try:
        return [int(job) for job in sc._jsc.sc().statusTracker().getJobIdsForTag(tag)]
    except Exception:
        return None


def jvm_thread(sc: SparkContext) -> Any | None:
    """The JVM thread that runs this Python thread's calls into the JVM, or None where it cannot
    be had. Only py4j's pinned-thread mode (pyspark's default: a ``ClientServer`` gateway) gives
    a Python thread a JVM thread of its own. Without it (``PYSPARK_PIN_THREAD=false``) connections
    are pooled: an interrupted call's connection stays open, its thread idle once the call ends;
    and pyspark's Ctrl-C handler, not re-entering a call, does cancel the jobs."""
    try:
        from py4j.clientserver import ClientServer  # type: ignore[import-untyped]

        if not isinstance(sc._gateway, ClientServer):
            return None
        jvm: Any = sc._jvm
        return jvm.java.lang.Thread.currentThread()
    except Exception:
        return None


def still_calling(sc: SparkContext, thread: Any) -> bool:
    """Whether ``thread`` (:func:`jvm_thread`) still runs a call this Python thread stopped
    waiting for: after Ctrl-C py4j drops the interrupted call's connection and calls on from a
    new thread, while the JVM finishes the old call (planning it, starting its jobs)."""
    try:
        jvm: Any = sc._jvm
        return bool(thread.isAlive()) and thread.getId() != jvm.java.lang.Thread.currentThread().getId()
    except Exception:
        return False


def drain_listener_bus(sc: SparkContext, timeout: float) -> None:
    """Wait (at most ``timeout`` seconds) until Spark's listener bus has delivered every event
    posted so far (``LiveListenerBus.waitUntilEmpty``, ``private[spark]``): the status tracker
    reads a store those events update, which lags the scheduler (a job just started and cancelled
    may not be in it yet). Best effort."""
    try:
        sc._jsc.sc().listenerBus().waitUntilEmpty(max(1, int(timeout * 1000)))
    except Exception as exc:
        log.debug("could not wait for Spark's listener bus: %r", exc)

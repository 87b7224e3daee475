"""The executors' Python: which interpreter runs the write's tasks, and whether aioprod imports there.

Both are settled on the driver before the write's job starts. A task that cannot import
aioprod fails while Spark unpickles it, and Spark logs a few hundred lines of traces per
failed attempt before any error reaches the caller; one small probe task that imports
aioprod itself (and so always succeeds) turns that into one :class:`SparkEnvironmentError`
saying what to set.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import aioprod
from aioprod.spark import _pyspark
from aioprod.spark.reports import SparkEnvironmentError

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame

#: pyspark's interpreter for Python tasks when ``PYSPARK_PYTHON`` is not set.
_SPARK_DEFAULT_PYTHON = "python3"

#: (application id, interpreter) → whether pyarrow imports there, for executors that imported aioprod.
_verified: dict[tuple[str, str], bool] = {}

ProbeResult = tuple[str, str, str, str | None, str | None, str | None]


def spark_context(df: DataFrame) -> SparkContext | None:
    """The DataFrame's SparkContext; None under Spark Connect, whose client has none."""
    try:
        return df.sparkSession.sparkContext
    except Exception:  # PySparkNotImplementedError / AttributeError under Spark Connect
        return None


def executor_python(sc: SparkContext | None) -> AbstractContextManager[None]:
    """Run the write's tasks on this interpreter in ``local`` mode, unless one was chosen.

    Local executors run ``PYSPARK_PYTHON``, else ``python3`` from the ``PATH``: rarely the
    environment aioprod is installed in (a virtualenv, a notebook's kernel). When the user set
    no ``PYSPARK_PYTHON``, this driver's interpreter is the one that certainly has aioprod.
    On a cluster the executors' environment is the user's to set.
    """
    if (
        sc is None
        or not str(sc.master).startswith("local")
        or "PYSPARK_PYTHON" in os.environ
        or _pyspark.python_exec(sc) != _SPARK_DEFAULT_PYTHON
    ):
        return contextlib.nullcontext()
    return _pyspark.python_exec_set_to(sc, sys.executable)


def check_executors(sc: SparkContext | None, *, need_arrow: bool) -> bool:
    """Raise :class:`SparkEnvironmentError` unless the executors can import aioprod; return whether
    they can import pyarrow too. Probes once per application and interpreter (one task)."""
    if sc is None:  # Spark Connect: the server's executors, out of our reach
        return True
    python = _pyspark.python_exec(sc)
    key = (str(sc.applicationId), python)
    arrow = _verified.get(key)
    if arrow is None:
        try:
            results = sc.parallelize([0], 1).mapPartitions(_probe_task()).collect()
        except Exception as exc:
            raise SparkEnvironmentError(
                f"Spark could not run a Python task with the executors' interpreter {python!r}: "
                f"{_failure_summary(exc)}. {_where_to_set(sc)}"
            ) from None
        arrow = _judge(sc, results[0])
        _verified[key] = arrow
    if need_arrow and not arrow:
        raise SparkEnvironmentError(
            f"transport='arrow' needs pyarrow on the executors, and {python!r} cannot import it. " + _where_to_set(sc)
        )
    return arrow


def _judge(sc: SparkContext, result: ProbeResult) -> bool:
    python, version, host, aioprod_error, executor_version, arrow_error = result
    where = f"the executors' Python ({python}, Python {version} on {host})"
    if aioprod_error is not None:
        raise SparkEnvironmentError(f"{where} cannot import aioprod: {aioprod_error}. {_where_to_set(sc)}")
    if executor_version != aioprod.__version__:
        raise SparkEnvironmentError(
            f"{where} has aioprod {executor_version}, this driver aioprod {aioprod.__version__}: "
            "install the same version on both"
        )
    return arrow_error is None


def _where_to_set(sc: SparkContext | None) -> str:
    if sc is not None and str(sc.master).startswith("local"):
        return (
            f"Leave PYSPARK_PYTHON unset to run the executors on this interpreter ({sys.executable}), "
            "or set it, before the SparkSession is created, to one that has aioprod[spark] installed."
        )
    return (
        "Install aioprod[spark] in the executors' environment and point spark.pyspark.python "
        "(or spark.executorEnv.PYSPARK_PYTHON) at that interpreter, or ship a packed environment "
        "with --archives."
    )


def _probe_task() -> Callable[[Iterable[Any]], Iterator[ProbeResult]]:
    """A task reporting its interpreter, and what fails when it imports aioprod and pyarrow.

    cloudpickle ships a nested function by value, and this one uses the standard library
    only: it runs where aioprod does not import, which is what it is there to find out.
    """

    def probe(_: Iterable[Any]) -> Iterator[ProbeResult]:
        import importlib
        import platform
        import socket
        import sys

        def import_error(name: str) -> str | None:
            try:
                importlib.import_module(name)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return None

        aioprod_error = import_error("aioprod.spark")
        version = None if aioprod_error else getattr(sys.modules["aioprod"], "__version__", None)
        host = socket.gethostname()
        yield sys.executable, platform.python_version(), host, aioprod_error, version, import_error("pyarrow")

    return probe


def _failure_summary(exc: BaseException) -> str:
    """The line that says why a Spark job failed, out of its Java and Python traces."""
    text = str(exc)
    match = re.search(r"most recent failure: Lost task [^\n]*?\): ([^\n]*)", text)
    if match is None:
        return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    line = match.group(1)
    if line.endswith("Traceback (most recent call last):"):
        # A Python traceback follows: its first unindented line names the exception.
        for following in text[match.end() :].splitlines():
            if following and not following[0].isspace() and not following.startswith("Traceback"):
                return following
    return line


def explain_job_failure(exc: BaseException, sc: SparkContext | None) -> None:
    """Raise :class:`SparkEnvironmentError` for a write job that failed importing aioprod or pyarrow.

    The probe makes this rare; it still happens where executors differ, or under Spark Connect.
    """
    text = str(exc)
    for module in ("aioprod", "pyarrow"):
        if f"No module named '{module}'" in text:
            raise SparkEnvironmentError(f"the executors' Python cannot import {module}. {_where_to_set(sc)}") from exc

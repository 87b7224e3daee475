"""One real local SparkSession (``local[2,4]``: a failed task is tried up to four times) for every Spark test."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """``local[2,4]`` (task retries on, as on a cluster), UI off, 2 shuffle partitions; executors
    run this very interpreter. The JVM compiles with C1 only: the tests are short, and the full
    JIT took half the suite's Spark CPU time."""
    saved = {name: os.environ.get(name) for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("aioprod-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        # Stop the JVM too: SparkSession.stop() leaves the py4j gateway process running.
        gateway = SparkContext._gateway
        if gateway is not None:
            gateway.shutdown()
            proc = getattr(gateway, "proc", None)
            if proc is not None:
                proc.terminate()
                proc.wait(30)
            SparkContext._gateway = None
            SparkContext._jvm = None
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def spark_default_python(spark: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session as a user gets it with no PYSPARK_PYTHON set: pyspark then runs ``python3``."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "python3")
    return spark


@pytest.fixture(autouse=True)
def no_leftover_producer_threads() -> Iterator[None]:
    """Every SyncProducer a test (or the writer) starts must be closed by its end."""
    yield
    deadline = time.monotonic() + 10
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("aioprod-sync-producer")]
        if not alive:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"producer threads still running: {alive}")
        time.sleep(0.05)

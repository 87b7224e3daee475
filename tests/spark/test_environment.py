"""The executors' Python: local mode runs this interpreter, and a wrong one is one clear error."""

from __future__ import annotations

import sys
import venv
from pathlib import Path
from typing import Any

import pytest

import aioprod
from aioprod.spark import SparkEnvironmentError, environment, write_dataframe
from aioprod.spark.environment import executor_python, explain_job_failure
from tests.brokers import TansuBroker, free_port, refused_port

pytestmark = pytest.mark.integration

UNREACHABLE = f"127.0.0.1:{refused_port()}"


def use_python(spark: Any, monkeypatch: pytest.MonkeyPatch, executable: str) -> None:
    """The session as if started with ``PYSPARK_PYTHON=executable``."""
    monkeypatch.setenv("PYSPARK_PYTHON", executable)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", executable)


def test_local_executors_run_this_interpreter_unless_told_otherwise(
    spark_default_python: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = spark_default_python.sparkContext
    with executor_python(sc):
        assert sc.pythonExec == sys.executable
    assert sc.pythonExec == "python3"  # only for the write's own tasks
    use_python(spark_default_python, monkeypatch, "/opt/other/python")
    with executor_python(sc):
        assert sc.pythonExec == "/opt/other/python"
    # tests/spark/test_docs.py runs the executors example in a session like this one.


@pytest.fixture(scope="session")
def python_without_aioprod(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A virtualenv of this Python version with nothing installed (pyspark reaches its workers by PYTHONPATH)."""
    path = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False).create(path)
    return str(Path(path) / "bin" / "python")


def test_executors_that_cannot_import_aioprod_get_one_clear_error(
    spark: Any, monkeypatch: pytest.MonkeyPatch, python_without_aioprod: str
) -> None:
    use_python(spark, monkeypatch, python_without_aioprod)
    df = spark.createDataFrame([("v",)], "value string")
    # An unreachable broker: the probe must stop the write before any task tries to connect.
    with pytest.raises(SparkEnvironmentError) as info:
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", mode="executors")
    message = str(info.value)
    assert f"the executors' Python ({python_without_aioprod}, Python {sys.version.split()[0]} on " in message
    assert "cannot import aioprod: ModuleNotFoundError: No module named " in message
    assert f"Leave PYSPARK_PYTHON unset to run the executors on this interpreter ({sys.executable})" in message
    # The probe task itself succeeded: no failed Spark job (and its traces) behind this error.
    assert info.value.__cause__ is None and info.value.__context__ is None


def test_an_interpreter_that_cannot_start_is_one_error(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = "/nonexistent/bin/python"
    use_python(spark, monkeypatch, missing)
    df = spark.createDataFrame([("v",)], "value string")
    spark.sparkContext.setLogLevel("OFF")  # Spark logs the failed probe task's Java trace
    try:
        with pytest.raises(SparkEnvironmentError) as info:
            write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", mode="executors")
    finally:
        spark.sparkContext.setLogLevel("ERROR")
    message = str(info.value)
    assert message.startswith(
        f"Spark could not run a Python task with the executors' interpreter {missing!r}: "
        f'java.io.IOException: Cannot run program "{missing}"'
    )
    assert "\n" not in message
    assert "Leave PYSPARK_PYTHON unset" in message


def test_executors_without_pyarrow_write_rows_unless_arrow_is_demanded(
    spark: Any, tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = spark.sparkContext
    # What the probe concludes on executors where aioprod imports and pyarrow does not.
    monkeypatch.setitem(environment._verified, (sc.applicationId, sc.pythonExec), False)
    df = spark.createDataFrame([("v",)], "value string")
    topic = f"aioprod-no-arrow-{free_port()}"
    report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode="executors")
    assert (report.transport, report.rows_written) == ("rows", 1)
    with pytest.raises(SparkEnvironmentError, match="transport='arrow' needs pyarrow on the executors"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", mode="executors", transport="arrow")


def test_another_aioprod_version_on_the_executors_is_refused(spark: Any) -> None:
    probed = ("/opt/py/bin/python", "3.11.7", "node-7", None, "0.0.1", None)
    with pytest.raises(SparkEnvironmentError, match=r"has aioprod 0\.0\.1, this driver aioprod "):
        environment._judge(spark.sparkContext, probed)
    assert environment._judge(spark.sparkContext, (*probed[:4], aioprod.__version__, "ImportError: x")) is False


def test_a_write_job_missing_aioprod_is_explained() -> None:
    """The safety net behind the probe (executors that differ from the probed one, Spark Connect)."""
    failure = RuntimeError("PythonException: ModuleNotFoundError: No module named 'aioprod'")
    with pytest.raises(SparkEnvironmentError, match=r"cannot import aioprod\. Install aioprod\[spark\] in") as info:
        explain_job_failure(failure, None)
    assert info.value.__cause__ is failure
    explain_job_failure(RuntimeError("something else"), None)  # other failures pass through

"""Write a Spark DataFrame to Kafka: from the driver, or from every executor in parallel.

    from aioprod.spark import write_dataframe

    report = write_dataframe(df, bootstrap_servers="broker:9092", topic="events")
    report = write_dataframe(df, bootstrap_servers="broker:9092", mode="executors")

The DataFrame has the shape of Spark's own Kafka sink: ``value`` (binary or string,
required), optional ``key`` (binary or string), ``topic`` (string; required unless the
``topic`` argument is given, which then wins), ``partition`` (int) and ``headers``
(``array<struct<key: string, value: binary>>``). Other columns are ignored.

pyspark and pyarrow are optional (``pip install aioprod[spark]``) and imported only when
a DataFrame is written. See ``docs/spark.md`` for delivery semantics, at least once or (with
``exactly_once=True``) exactly once.

The modules follow the write's steps: ``api`` (arguments) → ``schema`` (the sink's shape) →
``plan`` (what every writer gets) → ``driver`` or ``executors`` (the two modes;
``environment`` checks the executors' Python) → ``chunks`` (Arrow batches or Rows as lists)
→ ``writer`` (one partition's producer, or its transaction; ``reachability`` asks first whether
a broker answers) → ``transactions`` (exactly once from the executors: the driver commits or
aborts what the tasks prepared) → ``reports``. ``_pyspark`` holds every call into pyspark's
private API.
"""

from aioprod.spark.api import ErrorPolicy as ErrorPolicy
from aioprod.spark.api import Mode as Mode
from aioprod.spark.api import Transport as Transport
from aioprod.spark.api import write_dataframe
from aioprod.spark.plan import SPARK_PRODUCER_DEFAULTS as SPARK_PRODUCER_DEFAULTS
from aioprod.spark.reports import (
    DataFrameSchemaError,
    PartitionReport,
    RowError,
    SparkEnvironmentError,
    WriteError,
    WriteReport,
)
from aioprod.spark.writer import ProgressCallback as ProgressCallback

# Tracebacks, reprs and pickles name the public classes where they are imported from.
for _public in (DataFrameSchemaError, PartitionReport, RowError, SparkEnvironmentError, WriteError, WriteReport):
    _public.__module__ = __name__
del _public

__all__ = [
    "DataFrameSchemaError",
    "PartitionReport",
    "RowError",
    "SparkEnvironmentError",
    "WriteError",
    "WriteReport",
    "write_dataframe",
]

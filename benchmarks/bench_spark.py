"""Rows/s writing one Spark DataFrame to Kafka: aioprod's two modes beside what users do today.

One run, one local SparkSession, one Tansu broker, one cached DataFrame (key string,
value binary, one header), every method writing it to a fresh topic:

- ``confluent-executors``  baseline: ``df.foreachPartition`` with a ``confluent_kafka.Producer``
  per partition, producing Row by Row (``poll(0)`` as it goes, ``flush()`` at the end).
- ``aiokafka-driver``      baseline: ``AIOKafkaProducer`` on the driver over ``df.toLocalIterator()``,
  ``await send()`` per row, acknowledgements gathered every 10,000 rows.
- ``aioprod-executors``    ``write_dataframe(mode="executors")``: Arrow batches via ``mapInArrow``.
- ``aioprod-driver``       ``write_dataframe(mode="driver")``: Arrow batches streamed to the driver.
- ``aioprod-*-rows``       the same two with ``transport="rows"`` (Spark Rows), to show what Arrow buys.
- ``aioprod-*-eos``        the same two with ``exactly_once=True``: a transaction per Spark partition
  (executors) or for the whole frame (driver), committed once the write has succeeded.

Every method runs once untimed on a small frame first (Python workers, JIT, connections),
then the timed runs are interleaved round by round so that machine noise hits all alike.
Each timed run is checked afterwards (untimed): reading the topic back must give the row count.

    python benchmarks/bench_spark.py [--rows 100000] [--repeat 3] [--master local[2]] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from common import count_records, print_rates

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

Method = Callable[[Any, str, str], None]


# -- the baselines: what users write today --------------------------------------------------------


def confluent_executors(df: Any, bootstrap: str, topic: str) -> None:
    def write_partition(rows: Iterator[Any]) -> None:
        import confluent_kafka

        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        for n, row in enumerate(rows):
            headers = [(h.key, h.value) for h in row.headers or ()]
            while True:
                try:
                    producer.produce(topic, value=row.value, key=row.key, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
            if n % 1000 == 0:
                producer.poll(0)
        if producer.flush(60):
            raise RuntimeError("confluent_kafka.Producer.flush left records undelivered")

    df.foreachPartition(write_partition)


def aiokafka_driver(df: Any, bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            pending = []
            for row in df.toLocalIterator(prefetchPartitions=True):
                headers = [(h.key, bytes(h.value)) for h in row.headers or ()]
                pending.append(await producer.send(topic, bytes(row.value), key=row.key.encode(), headers=headers))
                if len(pending) >= 10_000:
                    await asyncio.gather(*pending)
                    pending.clear()
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    asyncio.run(run())


# -- aioprod -------------------------------------------------------------------------------------


def aioprod_method(mode: Any, transport: Any, exactly_once: bool = False) -> Method:
    def run(df: Any, bootstrap: str, topic: str) -> None:
        from aioprod.spark import write_dataframe

        report = write_dataframe(
            df, bootstrap_servers=bootstrap, topic=topic, mode=mode, transport=transport, exactly_once=exactly_once
        )
        if report.transport != transport:
            raise RuntimeError(f"asked for transport {transport}, got {report.transport}")

    return run


METHODS: dict[str, Method] = {
    "confluent-executors": confluent_executors,
    "aioprod-executors": aioprod_method("executors", "arrow"),
    "aioprod-executors-rows": aioprod_method("executors", "rows"),
    "aioprod-executors-eos": aioprod_method("executors", "arrow", exactly_once=True),
    "aiokafka-driver": aiokafka_driver,
    "aioprod-driver": aioprod_method("driver", "arrow"),
    "aioprod-driver-rows": aioprod_method("driver", "rows"),
    "aioprod-driver-eos": aioprod_method("driver", "arrow", exactly_once=True),
}
#: What users write today, without aioprod.
BASELINES = ("confluent-executors", "aiokafka-driver")
#: (ours, the counterpart it is measured against)
PAIRS = [
    ("aioprod-executors", "confluent-executors"),
    ("aioprod-driver", "aiokafka-driver"),
    ("aioprod-executors-eos", "aioprod-executors"),
    ("aioprod-driver-eos", "aioprod-driver"),
]


# -- harness -------------------------------------------------------------------------------------


def make_frame(spark: Any, rows: int, partitions: int, value_size: int) -> Any:
    from pyspark.sql import functions as F

    ident = F.col("id").cast("string")
    pad = max(0, value_size - 12)
    df = spark.range(rows, numPartitions=partitions).select(
        F.concat(F.lit("key-"), ident).alias("key"),
        F.concat(F.lit("value-"), F.lpad(ident, 6, "0"), F.lit("x" * pad)).cast("binary").alias("value"),
        F.array(F.struct(F.lit("trace").alias("key"), ident.cast("binary").alias("value"))).alias("headers"),
    )
    df = df.cache()
    if df.count() != rows:
        raise RuntimeError("the DataFrame did not materialise")
    return df


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)


def timed(method: Method, df: Any, rows: int, bootstrap: str, topic_partitions: int) -> float:
    topic = f"bench-spark-{uuid.uuid4().hex[:10]}"
    create_topic(bootstrap, topic, topic_partitions)
    started = time.perf_counter()
    method(df, bootstrap, topic)
    seconds = time.perf_counter() - started
    written = count_records(bootstrap, topic)
    if written != rows:
        raise RuntimeError(f"{topic}: expected {rows} records, found {written}")
    return seconds


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
    for name in ("aioprod", "pyspark", "pyarrow", "confluent-kafka", "aiokafka", "uvloop"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "-"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions of the DataFrame")
    parser.add_argument("--topic-partitions", type=int, default=3)
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--only", nargs="*", choices=list(METHODS), help="run only these methods")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    methods = {name: METHODS[name] for name in (args.only or METHODS)}

    from pyspark.sql import SparkSession

    from aioprod.embedded import EmbeddedBroker

    spark = (
        SparkSession.builder.master(args.master)
        .appName("aioprod-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        # The driver baseline's toLocalIterator holds whole partitions: at 1,000,000 rows the
        # default 1 GiB heap loses task results (TaskResultLost, OutOfMemoryError).
        .config("spark.driver.memory", args.driver_memory)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, list[float]] = {name: [] for name in methods}
    try:
        with EmbeddedBroker() as broker:
            bootstrap = broker.bootstrap
            df = make_frame(spark, args.rows, args.partitions, args.value_size)
            warm = make_frame(spark, 2_000, args.partitions, args.value_size)
            for method in methods.values():  # untimed: workers, JIT, imports
                timed(method, warm, 2_000, bootstrap, args.topic_partitions)
            for round_ in range(args.repeat):
                for name, method in methods.items():
                    seconds = timed(method, df, args.rows, bootstrap, args.topic_partitions)
                    results[name].append(args.rows / seconds)
                    print(f"round {round_ + 1}: {name:24} {args.rows / seconds:>10,.0f} rows/s", file=sys.stderr)
    finally:
        spark.stop()

    info = versions()
    print(
        f"\n{args.rows:,} rows (key, {args.value_size}-byte value, one header), {args.partitions} Spark partitions, "
        f"{args.master}, Tansu, topics of {args.topic_partitions} partitions; median (best) of {args.repeat}"
    )
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    print_rates(results, "rows/s")
    ratios = {}
    for ours, theirs in PAIRS:
        if ours in results and theirs in results:
            ratios[f"{ours} / {theirs}"] = statistics.median(results[ours]) / statistics.median(results[theirs])
    for label, ratio in ratios.items():
        print(f"{label}: {ratio:.2f}x")
    # Issue 14's target: each aioprod mode at >= 2x the best peer (the faster baseline).
    peers = {name: statistics.median(results[name]) for name in BASELINES if name in results}
    if peers:
        best_name, best = max(peers.items(), key=lambda item: item[1])
        for ours in ("aioprod-executors", "aioprod-driver"):
            if ours in results:
                ratio = statistics.median(results[ours]) / best
                ratios[f"{ours} / best peer ({best_name})"] = ratio
                verdict = "met" if ratio >= 2 else "not met"
                print(f"{ours} / best peer ({best_name}): {ratio:.2f}x (target >= 2x): {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "versions": info, "rows_per_second": results, "ratios": ratios}, f, indent=2)


if __name__ == "__main__":
    main()

"""write_dataframe on a real local SparkSession against a real broker, read back with confluent_kafka."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import pickle
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aioprod.config import ProducerConfig
from aioprod.embedded import BrokerSecurity, EmbeddedBroker
from aioprod.errors import ConfigError
from aioprod.spark import (
    DataFrameSchemaError,
    Mode,
    RowError,
    SparkEnvironmentError,
    Transport,
    WriteError,
    WriteReport,
    _pyspark,
    driver,
    write_dataframe,
    writer,
)
from aioprod.spark.chunks import Chunk, arrow_chunk
from aioprod.spark.driver import ArrowUnavailable
from aioprod.spark.executors import executor_arrow_task
from aioprod.spark.plan import SPARK_PRODUCER_DEFAULTS, Plan, producer_options
from aioprod.spark.schema import check_schema
from aioprod.spark.writer import PartitionWrite, write_partition
from tests.brokers import TansuBroker, free_port, refused_port
from tests.chaos.proxy import FaultProxy
from tests.readback import read_topic

pytestmark = pytest.mark.integration

MODES: list[Mode] = ["driver", "executors"]
#: Rows of the big write: past one Arrow batch (10,000 rows) in each of its four partitions.
N = 50_000


def new_topic(prefix: str = "spark") -> str:
    return f"aioprod-{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)


def big_frame(spark: Any, n: int) -> Any:
    """``n`` rows: string key, binary value (not UTF-8), one binary header; 4 Spark partitions."""
    from pyspark.sql import functions as F

    ident = F.col("id").cast("string")
    return spark.range(n, numPartitions=4).select(
        F.concat(F.lit("key-"), ident).alias("key"),
        F.concat(F.lit(b"\x00\xff-"), ident.cast("binary")).alias("value"),
        F.array(F.struct(F.lit("trace").alias("key"), F.concat(F.lit("t"), ident).cast("binary").alias("value"))).alias(
            "headers"
        ),
        F.col("id").alias("unrelated_column"),
    )


def big_expected(n: int) -> Counter[tuple[Any, ...]]:
    return Counter((b"key-%d" % i, b"\x00\xff-%d" % i, (("trace", b"t%d" % i),)) for i in range(n))


def consumed(bootstrap: str, topic: str) -> Counter[tuple[Any, ...]]:
    return Counter((c.key, c.value, c.headers) for c in read_topic(bootstrap, topic))


@pytest.mark.parametrize("mode", MODES)
def test_50k_rows_each_written_once(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    topic = new_topic(mode)
    df = big_frame(spark, N)
    report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode=mode)
    assert report.rows_written == N
    assert report.rows_failed == 0
    assert report.errors == []
    assert report.topics == {topic: N}
    assert report.mode == mode
    assert report.transport == "arrow"
    assert report.aborted is None
    assert report.seconds > 0
    if mode == "executors":
        assert sorted(p.spark_partition for p in report.partitions) == [0, 1, 2, 3]
        assert sum(p.rows_written for p in report.partitions) == N
        assert report.retried_partitions == []
    else:
        assert report.partitions == []
    got = consumed(tansu_broker.bootstrap, topic)
    assert sum(got.values()) == N  # nothing twice, nothing missing ...
    assert got == big_expected(N)  # ... and every key, value and header identical


def test_keys_partition_like_the_java_client(spark: Any, tansu_broker: TansuBroker) -> None:
    import confluent_kafka

    topic = new_topic("murmur")
    create_topic(tansu_broker.bootstrap, topic, 3)
    df = big_frame(spark, 300)
    write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode="executors")
    records = read_topic(tansu_broker.bootstrap, topic)
    assert len(records) == 300
    for record in records:
        assert record.key is not None
        assert record.partition == confluent_kafka.murmur2(record.key, 3)


@pytest.mark.parametrize("transport", ["arrow", "rows"])
@pytest.mark.parametrize("mode", MODES)
def test_string_and_binary_columns_nulls_and_headers(
    spark: Any, tansu_broker: TansuBroker, mode: Mode, transport: Transport
) -> None:
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", StringType()),
            StructField("headers", ArrayType(header)),
        ]
    )
    rows = [
        (b"\x00bin-key", "välue ✓", [("a", b"\x01"), ("b", None), ("a", b"")]),
        (None, "keyless", []),
        (b"tombstone", None, None),
        (None, None, [("only-header", b"x")]),
        (b"", "", [("e", b"")]),
    ]
    df = spark.createDataFrame(rows, schema).repartition(2)
    topic = new_topic("types")
    report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode=mode, transport=transport)
    assert (report.rows_written, report.rows_failed, report.transport) == (5, 0, transport)
    expected = Counter(
        (key, None if value is None else value.encode(), tuple(headers or ())) for key, value, headers in rows
    )
    assert consumed(tansu_broker.bootstrap, topic) == expected


@pytest.mark.parametrize("transport", ["arrow", "rows"])
@pytest.mark.parametrize("mode", MODES)
def test_headers_are_read_by_field_name_and_a_null_header_is_a_row_error(
    spark: Any, tansu_broker: TansuBroker, mode: Mode, transport: Transport
) -> None:
    # A struct<value, key> was read by position (key and value swapped, or a TypeError), and a
    # null element of the array raised out of the task in the rows transport.
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    header = StructType([StructField("value", BinaryType()), StructField("key", StringType())])
    schema = StructType([StructField("value", StringType()), StructField("headers", ArrayType(header))])
    df = spark.createDataFrame([("good", [(b"hval", "hkey")]), ("null header", [None])], schema).coalesce(1)
    topic = new_topic("hdr")
    report = write_dataframe(
        df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode=mode, transport=transport, errors="report"
    )
    assert (report.rows_written, report.rows_failed) == (1, 1)
    assert [(r.value, r.headers) for r in read_topic(tansu_broker.bootstrap, topic)] == [
        (b"good", (("hkey", b"hval"),))
    ]


def test_headers_keep_their_rows_with_large_var_types(spark: Any, tansu_broker: TansuBroker) -> None:
    # useLargeVarTypes widens Spark's strings and binaries, not its lists: decoded as a large
    # list, the headers went to other rows while the report said every row was written.
    from pyspark.sql import functions as F

    ident = F.col("id").cast("string")
    df = spark.range(50, numPartitions=2).select(
        ident.alias("value"),
        F.array(F.struct(F.lit("h").alias("key"), ident.cast("binary").alias("value"))).alias("headers"),
    )
    topic = new_topic("large")
    spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", "true")
    try:
        report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, transport="arrow")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.useLargeVarTypes")
    assert report.rows_written == 50
    assert consumed(tansu_broker.bootstrap, topic) == Counter((None, b"%d" % i, (("h", b"%d" % i),)) for i in range(50))


@pytest.mark.parametrize("large", [(), ("value", "key"), ("value", "key", "headers")])
def test_driver_arrow_frames_are_read_as_wide_as_they_were_written(large: tuple[str, ...]) -> None:
    # The frames carry no schema: a Spark that sends large lists (or not) is read right either way.
    import pyarrow as pa

    def binary(name: str) -> pa.DataType:
        return pa.large_binary() if name in large else pa.binary()

    def string(name: str) -> pa.DataType:
        return pa.large_string() if name in large else pa.string()

    element = pa.struct([("key", string("key")), ("value", binary("value"))])
    headers = pa.large_list(element) if "headers" in large else pa.list_(element)
    rows = {
        "value": [b"a", None, b"ccc"],
        "headers": [[{"key": "h1", "value": b"x"}], None, [{"key": "h2", "value": None}, {"key": "h3", "value": b""}]],
    }
    sent = pa.record_batch(
        [pa.array(rows["value"], binary("value")), pa.array(rows["headers"], headers)],
        pa.schema([("value", binary("value")), ("headers", headers)]),
    )
    plan = Plan({}, "t", False, False, False, True, "raise", 20, 1000, None)
    batch = driver.decode_frame(sent.serialize().to_pybytes(), plan)
    assert batch.schema == sent.schema
    chunk = arrow_chunk(batch, plan, 0)
    assert (chunk.values, chunk.headers) == ([b"a", None, b"ccc"], [[("h1", b"x")], None, [("h2", None), ("h3", b"")]])


def test_a_partition_beyond_int32_is_a_row_error_not_another_partition(spark: Any, tansu_broker: TansuBroker) -> None:
    # Cast to int, 4294967297 wrapped to partition 1 (Spark's ANSI mode off, pyspark 3.5's default).
    topic = new_topic("part")
    create_topic(tansu_broker.bootstrap, topic, 2)
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        df = spark.createDataFrame([("ok", 1), ("too far", 4294967297)], "value string, partition long").coalesce(1)
        report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, errors="report")
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    assert (report.rows_written, report.rows_failed) == (1, 1)
    assert "partition 4294967297 does not exist" in report.errors[0].error
    assert [(r.value, r.partition) for r in read_topic(tansu_broker.bootstrap, topic)] == [(b"ok", 1)]


def test_rows_for_missing_partitions_fail_at_once_after_the_first(tansu_broker: TansuBroker) -> None:
    # The producer proves a partition missing over metadata refreshes, and each refresh forgets
    # the partitions proven before: rows alternating between several missing partitions waited
    # about 2 s each. With errors="report", 3,000 rows of which 1,286 named partitions the topic
    # lacked had not finished after 15 minutes (each refusal is progress: no watchdog trips).
    topic = new_topic("nopart")
    create_topic(tansu_broker.bootstrap, topic, 1)
    options = producer_options(tansu_broker.bootstrap, {"retry_backoff_max_ms": 200})  # proofs take 0.2 s, not 1 s
    plan = Plan(options, topic, False, False, True, False, "report", 100, 1000, None)
    chunk = Chunk(0, [b"%d" % i for i in range(24)], partitions=[i % 4 for i in range(24)])
    tally = writer.write_partition(PartitionWrite(plan), [chunk])
    assert (tally.written, tally.failed, tally.aborted) == (6, 18, None)
    assert [e.row for e in tally.errors] == [i for i in range(24) if i % 4]
    # Only each partition's first row waited for the cluster's answer; the others got its error at once.
    first = {1: tally.errors[0], 2: tally.errors[1], 3: tally.errors[2]}
    for p, error in first.items():
        assert f"partition {p} does not exist" in error.error
    assert all(e.exception is first[e.row % 4].exception for e in tally.errors)
    assert Counter(r.partition for r in read_topic(tansu_broker.bootstrap, topic)) == {0: 6}


def test_refused_credentials_stop_a_reporting_write_instead_of_failing_every_row() -> None:
    # errors="report" with a wrong password: each row failed on its own, naming the refusal, and
    # the write returned a report of a million failed rows instead of saying it could not go on.
    with EmbeddedBroker(security=BrokerSecurity(sasl_users={"alice": "right"})) as broker:
        options = producer_options(
            broker.bootstrap,
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_username": "alice",
                "sasl_password": "wrong",
            },
        )
        plan = Plan(options, new_topic("auth"), False, False, True, False, "report", 20, 1000, None)
        tally = writer.write_partition(PartitionWrite(plan), [Chunk(0, [b"%d" % i for i in range(50)])])
    assert (tally.written, tally.failed) == (0, 0)
    assert tally.aborted is not None and tally.aborted.startswith("AuthenticationError: SASL SCRAM-SHA-256")


def test_a_missing_partition_is_a_row_error_when_max_block_ms_is_short(tansu_broker: TansuBroker) -> None:
    # Within max_block_ms = retry_backoff_max_ms (1 s) the producer cannot prove the partition
    # missing and times out: that was taken for an unreachable broker, and errors="report"
    # stopped the whole write at this row, the good rows after it unsent.
    topic = new_topic("nopart")
    create_topic(tansu_broker.bootstrap, topic, 1)
    options = producer_options(tansu_broker.bootstrap, {"max_block_ms": 1000})
    plan = Plan(options, topic, False, False, True, False, "report", 20, 1000, None)
    chunk = Chunk(0, [b"a", b"b", b"c", b"d", b"e"], partitions=[0, 5, 0, 5, 0])
    tally = writer.write_partition(PartitionWrite(plan), [chunk])
    assert (tally.written, tally.failed, tally.aborted) == (3, 2, None)
    assert [e.row for e in tally.errors] == [1, 3]
    assert "partition 5" in tally.errors[0].error
    assert tally.errors[1].exception is tally.errors[0].exception  # no second wait
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"a", b"c", b"e"]


def test_a_missing_partition_caches_only_its_own_error(tansu_broker: TansuBroker) -> None:
    # A row's other ValueError (a header's name) was cached for its partition when the topic lacked
    # it: the partition's later rows were reported with "header name ... is not valid Unicode". And
    # each distinct negative partition (refused at once: nothing to save) added a cache entry.
    topic = new_topic("nopart")
    create_topic(tansu_broker.bootstrap, topic, 1)
    options = producer_options(tansu_broker.bootstrap, {"retry_backoff_max_ms": 200})
    plan = Plan(options, topic, False, False, True, True, "report", 100, 1000, None)
    chunk = Chunk(
        0, [b"ok", b"bad", b"c", b"d"], partitions=[0, 3, 3, 3], headers=[None, [("\ud800", b"x")], None, None]
    )
    negatives = Chunk(4, [b"n"] * 50, partitions=[-(i + 1) for i in range(50)])
    unit = PartitionWrite(plan)
    tally = writer.write_partition(unit, [chunk, negatives])
    assert (tally.written, tally.failed) == (1, 53)
    assert "not valid Unicode" in tally.errors[0].error
    assert all("partition 3 does not exist" in e.error for e in tally.errors[1:3])
    assert "partition must be >= 0, got -1" in tally.errors[3].error
    assert list(unit._state.missing_partitions) == [(topic, 3)]


def test_a_partition_added_during_the_write_takes_its_rows_once_the_producer_knows_it() -> None:
    # FAKE cluster (scripted, over real TCP): Tansu refuses CreatePartitions; the fake adds a
    # partition at a precise moment. Once a partition was proven missing, every later row for it
    # failed with that first error ("topic 't' has 1 partition") for the rest of the write, even
    # after the partition was added and the producer's metadata had it.
    from tests.fakes.cluster import Partition

    with fake_cluster_on_a_thread(1, lambda cluster: cluster.create_topic("t", 1)) as (cluster, loop):
        options = producer_options(cluster.bootstrap, {"max_block_ms": 1000, "metadata_max_age_ms": 200})
        # At most 2 rows in flight: handing the second chunk over collects the first one's results.
        plan = Plan(options, "t", False, False, True, False, "report", 100, 2, None)
        unit = PartitionWrite(plan)

        def chunks() -> Iterator[Chunk]:
            yield Chunk(0, [b"a", b"b"], partitions=[0, 1])  # partition 1 does not exist yet
            yield Chunk(2, [b"c"], partitions=[0])
            partitions = cluster.topics["t"]
            loop.call_soon_threadsafe(partitions.append, Partition(1, partitions[0].topic_id))
            assert unit._producer is not None
            # Until the producer's next metadata refresh (metadata_max_age_ms) has the partition.
            deadline = time.monotonic() + 30
            while 1 not in unit._producer.cluster().topics["t"].partitions:
                assert time.monotonic() < deadline, "the producer's metadata never had the new partition"
                threading.Event().wait(0.05)
            yield Chunk(3, [b"d", b"e"], partitions=[1, 1])

        tally = writer.write_partition(unit, chunks())
        assert (tally.written, tally.failed) == (4, 1)
        assert [e.row for e in tally.errors] == [1]
        assert asyncio.run_coroutine_threadsafe(_values(cluster, "t", 1), loop).result(10) == [b"d", b"e"]


def test_a_broker_refusal_stops_the_write_within_max_in_flight_rows() -> None:
    # FAKE cluster (scripted, over real TCP): Tansu refuses no record on demand; the fake refuses
    # row 0's batch (INVALID_RECORD). errors="raise" stops queuing once the refused row's chunk is
    # settled, so at most max_in_flight_rows rows go with it. A chunk was queued whole: with
    # max_in_flight_rows=2 all four rows after the refused one were written.
    def refusing(cluster: Any) -> None:
        cluster.create_topic("t", [1, 2])  # partition 0 led by node 1, partition 1 by node 2
        cluster.nodes[1].script.append(87)  # INVALID_RECORD, not retried

    with fake_cluster_on_a_thread(2, refusing) as (cluster, loop):
        plan = Plan(producer_options(cluster.bootstrap, {}), "t", False, False, True, False, "raise", 20, 2, None)
        chunk = Chunk(0, [b"a", b"b", b"c", b"d", b"e"], partitions=[0, 1, 1, 1, 1])
        tally = writer.write_partition(PartitionWrite(plan), [chunk])
        assert (tally.written, tally.failed, [e.row for e in tally.errors]) == (1, 1, [0])
        assert asyncio.run_coroutine_threadsafe(_values(cluster, "t", 1), loop).result(10) == [b"b"]


@contextlib.contextmanager
def fake_cluster_on_a_thread(
    nodes: int, setup: Callable[[Any], None]
) -> Iterator[tuple[Any, asyncio.AbstractEventLoop]]:
    """A scripted fake cluster of ``nodes`` (over real TCP), serving from a loop on a thread of its
    own, as a Spark task's producer runs on its own; ``setup`` makes its topics and faults. The
    cluster, and its loop (for reading it)."""
    from tests.fakes.cluster import ScriptedCluster
    from tests.fakes.tcp import TcpNetwork

    loop = asyncio.new_event_loop()
    serving = threading.Thread(target=loop.run_forever, daemon=True)
    serving.start()

    async def start() -> tuple[ScriptedCluster, TcpNetwork]:
        network = TcpNetwork()
        cluster = ScriptedCluster(network, nodes=nodes, ports=lambda _node: free_port())
        cluster.accepts_unknown_producers = True
        setup(cluster)
        await network.ready()
        return cluster, network

    cluster, network = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield cluster, loop
    finally:
        asyncio.run_coroutine_threadsafe(network.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        serving.join(10)


async def _values(cluster: Any, topic: str, partition: int) -> list[bytes | None]:
    return list(cluster.topics[topic][partition].values)


def test_string_header_values_are_encoded(spark: Any, tansu_broker: TansuBroker) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([("v1",)], "value string").select(
        "value", F.array(F.struct(F.lit("h").alias("key"), F.lit("text").alias("value"))).alias("headers")
    )
    topic = new_topic("hstr")
    write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic)
    assert consumed(tansu_broker.bootstrap, topic) == Counter({(None, b"v1", (("h", b"text"),)): 1})


@pytest.mark.parametrize("mode", MODES)
def test_topic_per_row(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    from pyspark.sql import functions as F

    prefix = new_topic("route")
    topics = [f"{prefix}-{i}" for i in range(3)]
    df = spark.range(3000, numPartitions=3).select(
        F.concat(F.lit(f"{prefix}-"), (F.col("id") % 3).cast("string")).alias("topic"),
        F.col("id").cast("string").alias("value"),
    )
    report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, mode=mode)
    assert report.rows_written == 3000
    assert report.topics == {t: 1000 for t in topics}
    for i, t in enumerate(topics):
        values = sorted(int(c.value or b"") for c in read_topic(tansu_broker.bootstrap, t))
        assert values == list(range(i, 3000, 3))


def test_topic_argument_overrides_the_column(spark: Any, tansu_broker: TansuBroker) -> None:
    # Not read, so not checked either: an int column named topic no longer fails the write.
    df = spark.createDataFrame([(1, "a"), (2, "b")], "topic int, value string")
    topic = new_topic("override")
    report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode="executors")
    assert report.topics == {topic: 2}
    assert sorted(c.value or b"" for c in read_topic(tansu_broker.bootstrap, topic)) == [b"a", b"b"]


@pytest.mark.parametrize("mode", MODES)
def test_partition_column(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    from pyspark.sql import functions as F

    topic = new_topic("part")
    create_topic(tansu_broker.bootstrap, topic, 3)
    df = spark.range(90, numPartitions=2).select(
        F.col("id").cast("string").alias("value"),
        F.lit("same-key").alias("key"),
        (F.col("id") % 3).alias("partition"),  # a long column: cast to int like Spark's sink
    )
    write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode=mode)
    records = read_topic(tansu_broker.bootstrap, topic)
    assert len(records) == 90
    assert all(int(r.value or b"") % 3 == r.partition for r in records)
    # Within a Kafka partition, the rows of one Spark partition (ids 0-44, 45-89) keep their
    # order; in executors mode the two Spark partitions' writers interleave, on the driver not.
    for p in range(3):
        values = [int(r.value or b"") for r in sorted(records, key=lambda r: r.offset) if r.partition == p]
        for spark_partition in (range(0, 45), range(45, 90)):
            mine = [v for v in values if v in spark_partition]
            assert mine == sorted(mine)
        if mode == "driver":
            assert values == sorted(values)


# -- schema errors ---------------------------------------------------------------------------

UNREACHABLE = f"127.0.0.1:{refused_port()}"


@pytest.mark.parametrize(
    ("ddl", "topic", "message"),
    [
        ("key string", "t", "no 'value' column; expected binary or string"),
        ("Value string", "t", "found 'Value'"),
        ("value int", "t", "column 'value' has type int; expected binary or string"),
        ("value string, key double", "t", "column 'key' has type double; expected binary or string"),
        ("value string", None, "no 'topic' column and no topic= argument"),
        ("value string, topic binary", None, "column 'topic' has type binary; expected string"),
        ("value string, partition string", "t", "column 'partition' has type string; expected int"),
        ("value string, headers array<string>", "t", "column 'headers' has type array<string>; expected array<struct"),
        (
            "value string, headers array<struct<key:binary,value:binary>>",
            "t",
            "column 'headers' has type array<struct<key:binary,value:binary>>",
        ),
        ("value string, headers map<string,binary>", "t", "column 'headers' has type map<string,binary>"),
        # Only the last one's type was checked; then Spark's select raised AMBIGUOUS_REFERENCE.
        ("value int, value string", "t", "2 columns named 'value': 'value', 'value'; drop or rename all but one"),
        ("value string, Key string, key binary", "t", "named 'key': 'Key', 'key' (Spark ignores case unless"),
        ("value string, topic string, TOPIC string", None, "2 columns named 'topic'"),
        # Spark finds F.col("key") in "Key"; left unread, the rows went out keyless.
        ("value string, Key string", "t", "a column 'Key', not 'key': the sink's column names are case-sensitive"),
        ("value string, Partition int", "t", "a column 'Partition', not 'partition'"),
        ("value string, HEADERS array<struct<key:string,value:binary>>", "t", "a column 'HEADERS', not 'headers'"),
        ("value string, Topic string", None, "a column 'Topic', not 'topic'"),
    ],
)
def test_schema_errors_name_the_column_and_type(spark: Any, ddl: str, topic: str | None, message: str) -> None:
    df = spark.createDataFrame([], ddl)
    with socket.socket() as listener:  # a "broker" that only counts connections
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        bootstrap = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(DataFrameSchemaError) as info:
            write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, mode="executors", max_block_ms=60_000)
        with pytest.raises(BlockingIOError):
            listener.accept()  # refused before anything connected
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_a_header_field_twice_is_a_schema_error(spark: Any) -> None:
    # The nested case of a column twice: it passed the check, then pyspark raised
    # AMBIGUOUS_REFERENCE_TO_FIELDS.
    from pyspark.sql import functions as F

    element = F.struct(F.lit("a").alias("key"), F.lit("b").alias("key"), F.lit(b"x").alias("value"))
    df = spark.range(1).select(F.lit("v").alias("value"), F.array(element).alias("headers"))
    with pytest.raises(DataFrameSchemaError, match="headers"):
        write_dataframe(df, bootstrap_servers=f"127.0.0.1:{refused_port()}", topic="t")


def test_columns_differing_in_case_are_two_with_case_sensitive_names(spark: Any, tansu_broker: TansuBroker) -> None:
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        df = spark.createDataFrame([("v", "other")], "value string, VALUE string")
        topic = new_topic("case")
        report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic)
    finally:
        spark.conf.unset("spark.sql.caseSensitive")
    assert report.rows_written == 1
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"v"]


@pytest.mark.parametrize(
    "option", [{"api_version": "auto"}, {"api.version.request": "true"}, {"socket.nagle.disable": True}]
)
def test_the_writer_takes_what_a_producer_takes(option: dict[str, object]) -> None:
    # Options asking for what aioprod always does: a Producer took them, the writer refused them.
    assert producer_options("h:9092", option) == producer_options("h:9092", {})


def test_none_keeps_the_writers_own_default() -> None:
    assert (
        ProducerConfig.from_options(producer_options("h:9092", {"linger.ms": None})).linger_ms
        == (SPARK_PRODUCER_DEFAULTS["linger_ms"])
    )


def test_bad_options_fail_on_the_driver_before_any_job(spark: Any) -> None:
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(ConfigError, match="linger_ms must be >= 0"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", linger_ms=-1)
    with pytest.raises(ConfigError, match="unknown option"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", lingerms=5)
    with pytest.raises(ConfigError, match="already bytes"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", value_serializer=str.encode)
    with pytest.raises(ConfigError, match="bootstrap_servers once"):
        dotted: dict[str, Any] = {"bootstrap.servers": "x:1"}
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", **dotted)
    with pytest.raises(ValueError, match="illegal topic name"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="no spaces")
    with pytest.raises(ValueError, match="mode must be"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", mode="cluster")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="errors must be"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", errors="ignore")  # type: ignore[arg-type]
    # Found only by close(), after an exactly-once write had committed; "no" turned it on.
    with pytest.raises(ValueError, match="close_timeout must be a number of seconds"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", close_timeout="5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exactly_once must be True or False"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", exactly_once="no")  # type: ignore[arg-type]


def test_an_option_that_cannot_reach_the_executors_is_a_config_error(spark: Any) -> None:
    # It failed in Spark's pickling of the job (PicklingError), naming no option.
    import ssl
    import threading

    df = spark.createDataFrame([("v",)], "value string")
    sc = spark.sparkContext
    group = "unpicklable-option"
    sc.setJobGroup(group, "writes whose options cannot be pickled")
    lock = threading.Lock()
    try:
        with pytest.raises(ConfigError, match=r"option 'ssl_context' cannot travel .*\(ssl_ca_location="):
            write_dataframe(
                df,
                bootstrap_servers=UNREACHABLE,
                topic="t",
                mode="executors",
                security_protocol="SSL",
                ssl_context=ssl.create_default_context(),
            )
        with pytest.raises(ConfigError, match=r"option 'partitioner' cannot travel .*_thread.lock"):
            write_dataframe(
                df, bootstrap_servers=UNREACHABLE, topic="t", mode="executors", partitioner=lambda t, k, p: lock and 0
            )
        assert sc.statusTracker().getJobIdsForGroup(group) == []  # refused before any job
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


def test_a_pem_file_the_executors_lack_stops_the_write_naming_it(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A path only the driver has (a laptop's, a file not shipped with --files): the driver's check
    # passed, then every attempt of every task raised ConfigError, and the write failed with
    # pyspark's PythonException, the option named only inside pages of Spark traces.
    from aioprod.certs import CertificateAuthority

    CertificateAuthority().write(tmp_path)  # ca.pem
    # The executors' Python workers run in the JVM's directory, where no ca.pem is; the driver
    # now finds "ca.pem" in its own.
    spark.range(1).rdd.map(lambda x: x).collect()  # the workers' daemon has started there
    monkeypatch.chdir(tmp_path)
    df = spark.createDataFrame([("a",), ("b",)], "value string").coalesce(1)
    with pytest.raises(WriteError, match=r"the producer options fail on executor .*no such file 'ca.pem'") as info:
        write_dataframe(
            df,
            bootstrap_servers=UNREACHABLE,
            topic="t",
            mode="executors",
            security_protocol="SSL",
            ssl_ca_location="ca.pem",
        )
    report = info.value.report
    assert report.rows_written == 0
    assert [p.attempt for p in report.partitions] == [0]  # not retried: it would fail again


# -- rows that cannot be sent ---------------------------------------------------------------------


def bad_rows_frame(spark: Any, good_topic: str) -> Any:
    """20 good rows, then an illegal topic name, a record over max_request_size, a missing partition."""
    rows: list[tuple[str | None, str, bytes, int | None]] = [
        (good_topic, f"k{i}", b"ok-%d" % i, None) for i in range(20)
    ]
    rows[5] = ("not a legal topic!", "bad-topic", b"x", None)
    rows[10] = (good_topic, "too-big", b"x" * 200_000, None)
    rows[15] = (good_topic, "bad-partition", b"x", 7)
    return spark.createDataFrame(rows, "topic string, key string, value binary, partition int").coalesce(1)


@pytest.mark.parametrize("mode", MODES)
def test_errors_report_collects_rows_that_cannot_be_sent(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    topic = new_topic("report")
    create_topic(tansu_broker.bootstrap, topic, 2)
    df = bad_rows_frame(spark, topic)
    progress: list[tuple[int, int]] = []
    report = write_dataframe(
        df,
        bootstrap_servers=tansu_broker.bootstrap,
        mode=mode,
        errors="report",
        max_request_size=100_000,
        progress=lambda written, failed: progress.append((written, failed)),
    )
    assert (report.rows_written, report.rows_failed) == (17, 3)
    assert progress[-1] == (17, 3)  # in executors mode the only call: the totals, once the job is done
    if mode == "executors":
        assert progress == [(17, 3)]
    assert report.topics == {topic: 17}
    assert [e.row for e in report.errors] == [5, 10, 15]
    assert [e.key for e in report.errors] == [b"bad-topic", b"too-big", b"bad-partition"]
    assert [e.topic for e in report.errors] == ["not a legal topic!", topic, topic]
    assert "illegal topic name" in report.errors[0].error
    assert report.errors[1].error.startswith("RecordTooLargeError")
    assert "partition 7 does not exist" in report.errors[2].error
    if mode == "executors":
        assert {e.spark_partition for e in report.errors} == {0}
        assert report.errors[0].exception is None  # only the text crosses from executors
    else:
        assert isinstance(report.errors[0].exception, ValueError)
    got = sorted(c.key or b"" for c in read_topic(tansu_broker.bootstrap, topic))
    assert got == sorted(b"k%d" % i for i in range(20) if i not in (5, 10, 15))


@pytest.mark.parametrize("mode", MODES)
def test_a_topic_that_does_not_exist_is_a_row_error(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    # Its metadata wait timed out like an unreachable broker's, which stopped the whole write.
    good, missing = new_topic("exists"), new_topic("missing")
    create_topic(tansu_broker.bootstrap, good, 1)
    rows = [(good, "a"), (missing, "b"), (good, "c"), (missing, "d"), (good, "e")]
    df = spark.createDataFrame(rows, "topic string, value string").coalesce(1)
    report = write_dataframe(
        df,
        bootstrap_servers=tansu_broker.bootstrap,
        mode=mode,
        errors="report",
        allow_auto_create_topics=False,
        max_block_ms=1000,
    )
    assert (report.rows_written, report.rows_failed, report.aborted) == (3, 2, None)
    assert [(e.row, e.topic) for e in report.errors] == [(1, missing), (3, missing)]
    assert "UNKNOWN_TOPIC_OR_PARTITION" in report.errors[0].error
    assert report.errors[1].error == report.errors[0].error
    if mode == "driver":  # the second row failed at once, with the first one's error: no second wait
        assert report.errors[1].exception is report.errors[0].exception
    assert sorted(c.value or b"" for c in read_topic(tansu_broker.bootstrap, good)) == [b"a", b"c", b"e"]


def test_a_missing_topic_argument_still_stops_the_write(spark: Any, tansu_broker: TansuBroker) -> None:
    df = spark.createDataFrame([("a",), ("b",)], "value string").coalesce(1)
    with pytest.raises(WriteError, match=r"write stopped: KafkaTimeoutError: topic .* not present") as info:
        write_dataframe(
            df,
            bootstrap_servers=tansu_broker.bootstrap,
            topic=new_topic("missing"),
            errors="report",
            allow_auto_create_topics=False,
            max_block_ms=1000,
        )
    assert info.value.report.rows_written == 0


def test_max_errors_bounds_the_kept_errors(spark: Any, tansu_broker: TansuBroker) -> None:
    df = spark.createDataFrame([(str(i), "bad topic") for i in range(50)], "value string, topic string")
    report = write_dataframe(
        df, bootstrap_servers=tansu_broker.bootstrap, errors="report", max_errors=3, mode="executors"
    )
    assert report.rows_failed == 50
    assert len(report.errors) == 3


@pytest.mark.parametrize("mode", MODES)
def test_max_errors_zero_still_raises_write_error(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    # The message read the first kept error: with none kept, an IndexError escaped instead.
    df = spark.createDataFrame([("v", "not a topic!")], "value string, topic string").coalesce(1)
    with pytest.raises(WriteError, match=r"1 row\(s\) could not be written \(max_errors=0") as info:
        write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, mode=mode, max_errors=0)
    assert (info.value.report.rows_failed, info.value.report.errors) == (1, [])


@pytest.mark.parametrize("mode", MODES)
def test_errors_raise_stops_and_reports(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    topic = new_topic("raise")
    create_topic(tansu_broker.bootstrap, topic, 2)
    df = bad_rows_frame(spark, topic)
    with pytest.raises(WriteError, match="could not be written: ValueError: illegal topic name") as info:
        write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, mode=mode, max_request_size=100_000)
    report = info.value.report
    assert isinstance(report, WriteReport)
    assert report.rows_failed == 1
    assert report.rows_written == 5  # the rows before the bad one; nothing after it was queued
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 5


@pytest.mark.parametrize("mode", MODES)
def test_nothing_listening_fails_at_once_naming_each_address(spark: Any, mode: Mode) -> None:
    df = spark.createDataFrame([(str(i),) for i in range(100)], "value string").coalesce(1)
    other = f"127.0.0.1:{refused_port()}"
    sc = spark.sparkContext
    group = f"unreachable-{mode}"
    sc.setJobGroup(group, "a write to brokers that refuse connections")
    try:
        # max_block_ms stays at 60 s: waiting it out would end in a KafkaTimeoutError instead.
        with pytest.raises(WriteError, match=r"write stopped: .*no bootstrap server reachable from ") as info:
            write_dataframe(df, bootstrap_servers=f"{UNREACHABLE},{other}", topic="t", mode=mode)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    message = str(info.value)
    assert f"{UNREACHABLE} (connection refused); {other} (connection refused)" in message
    assert "KafkaTimeoutError" not in message
    assert info.value.report.rows_written == 0
    if mode == "driver":  # checked on the driver before the DataFrame was read at all
        assert sc.statusTracker().getJobIdsForGroup(group) == []
    else:  # each task checks before it opens its producer
        assert message.startswith("write stopped: partition 0: no bootstrap server reachable")


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A fake broker that accepts connections and never answers: the producer's own timeouts apply."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("mode", MODES)
def test_a_broker_that_never_answers_stops_the_write_after_max_block_ms(
    spark: Any, silent_broker: str, mode: Mode
) -> None:
    df = spark.createDataFrame([(str(i),) for i in range(100)], "value string").coalesce(1)
    with pytest.raises(WriteError, match=r"write stopped: .*KafkaTimeoutError") as info:
        write_dataframe(df, bootstrap_servers=silent_broker, topic="t", mode=mode, errors="report", max_block_ms=500)
    assert info.value.report.rows_written == 0


@contextlib.contextmanager
def tansu_behind_a_proxy(name: str) -> Iterator[tuple[str, FaultProxy, asyncio.AbstractEventLoop]]:
    """A Tansu broker reached through the fault proxy, which runs on a loop of its own thread
    (``name``): the proxy's bootstrap, the proxy, and that loop (to wait on the proxy)."""
    proxy_port = free_port()
    broker = TansuBroker(advertised_port=proxy_port).start()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
    thread.start()
    proxy = asyncio.run_coroutine_threadsafe(FaultProxy(broker.port, proxy_port).start(), loop).result(10)
    try:
        yield f"127.0.0.1:{proxy_port}", proxy, loop
    finally:
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        broker.stop()


@pytest.fixture
def slow_link() -> Iterator[tuple[str, FaultProxy]]:
    """A broker behind a proxy that forwards at most 64 KiB per 20 ms each way: slow, never idle."""
    with tansu_behind_a_proxy("slow-link-proxy") as (bootstrap, proxy, _):
        proxy.delay = 0.02
        yield bootstrap, proxy


# A small watchdog: max_block_ms + delivery_timeout_ms with no grace, one second.
QUICK_WATCHDOG: dict[str, Any] = {
    "max_block_ms": 500,
    "request_timeout_ms": 500,
    "delivery_timeout_ms": 500,
    "linger_ms": 0,
    "buffer_memory": 256 * 1024,
    "batch_size": 64 * 1024,
}


def test_a_chunk_slower_than_the_watchdog_but_moving_is_written(
    spark: Any, slow_link: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chunk larger than buffer_memory takes many buffer waits: the watchdog capped a whole
    # chunk at one timeout and stopped a healthy write (reporting 0 rows written). Here 4 MB take
    # well over the one-second timeout through a 256 KiB buffer, a batch acknowledged every ~20 ms.
    from pyspark.sql import functions as F

    monkeypatch.setattr(writer, "_GRACE", 0.0)
    df = spark.range(10_000, numPartitions=1).select(
        F.concat(F.col("id").cast("string"), F.lit("-"), F.repeat(F.lit("x"), 400)).alias("value")
    )
    topic = new_topic("slow")
    bootstrap, proxy = slow_link
    report = write_dataframe(df, bootstrap_servers=bootstrap, topic=topic, transport="rows", **QUICK_WATCHDOG)
    assert (report.rows_written, report.aborted) == (10_000, None)
    proxy.delay = 0.0  # read back at full speed
    assert len(read_topic(bootstrap, topic)) == 10_000


@pytest.fixture
def hanging_chunks(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every chunk's coroutine hangs once its records are delivered (what the watchdog is for);
    the options that make the watchdog's timeout 0.5 s."""
    send_chunk = writer._send_chunk

    async def hangs_after_sending(*args: Any) -> Any:
        await send_chunk(*args)
        await asyncio.Event().wait()

    monkeypatch.setattr(writer, "_GRACE", 0.0)
    monkeypatch.setattr(writer, "_send_chunk", hangs_after_sending)
    return {**QUICK_WATCHDOG, "max_block_ms": 250, "request_timeout_ms": 250, "delivery_timeout_ms": 250}


class _EndsAsTheWaitTimesOut(concurrent.futures.Future):  # type: ignore[type-arg]
    """Fake: a chunk's future that completes just as the writer's wait for it times out."""

    def result(self, timeout: float | None = None) -> Any:
        if timeout is not None and not self.done():
            self.set_result(writer._ChunkResult(7, Counter({"t": 7}), []))
            raise TimeoutError
        return super().result(timeout)


def test_a_chunk_that_ends_as_the_watchdog_wait_times_out_is_counted() -> None:
    # The wait's own TimeoutError was re-raised: the write failed with a bare TimeoutError (in
    # executors mode the task failed, and Spark's retry wrote the partition's rows again).
    unit = PartitionWrite(Plan(producer_options("h:9092", {}), "t", False, False, False, False, "raise", 20, 100, None))
    assert unit._result(_EndsAsTheWaitTimesOut()).written == 7


def test_a_stalled_chunk_stops_the_write_counting_what_it_delivered(
    spark: Any, tansu_broker: TansuBroker, hanging_chunks: dict[str, Any]
) -> None:
    # A chunk whose coroutine hangs once its records are delivered (what the watchdog is for): the
    # write stops after one timeout with nothing moving, and the delivered rows are counted (they were 0).
    topic = new_topic("stall")
    df = spark.createDataFrame([(str(i),) for i in range(100)], "value string").coalesce(1)
    with pytest.raises(WriteError, match=r"no record was queued or acknowledged for 0.5s") as info:
        write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, **hanging_chunks)
    assert (info.value.report.rows_written, info.value.report.topics) == (100, {topic: 100})
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 100


def test_an_abandoned_chunk_still_reports_the_rows_it_failed(
    spark: Any, tansu_broker: TansuBroker, hanging_chunks: dict[str, Any]
) -> None:
    # Given up by the watchdog, a chunk counted only its delivered rows: the row it had refused
    # was in neither rows_failed nor report.errors.
    topic = new_topic("stall")
    rows = [(topic, str(i)) for i in range(10)] + [("not a topic!", "x")] + [(topic, str(i)) for i in range(10, 20)]
    df = spark.createDataFrame(rows, "topic string, value string").coalesce(1)
    with pytest.raises(WriteError, match="no record was queued or acknowledged") as info:
        write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, errors="report", **hanging_chunks)
    report = info.value.report
    assert (report.rows_written, report.rows_failed, [e.row for e in report.errors]) == (20, 1, [10])


def test_rows_for_several_missing_topics_do_not_trip_the_watchdog(
    spark: Any, tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each new missing topic takes a max_block_ms to be known missing; a failed row was not
    # progress, so three of them in a row outlasted the watchdog and stopped a healthy write.
    monkeypatch.setattr(writer, "_GRACE", 0.0)  # the watchdog: max_block_ms + delivery_timeout_ms = 1.5 s
    good = new_topic("good")
    create_topic(tansu_broker.bootstrap, good, 1)
    rows = [(good, "a")] + [(new_topic("missing"), "x") for _ in range(3)] + [(good, "b")]
    df = spark.createDataFrame(rows, "topic string, value string").coalesce(1)
    # Each missing topic: max_block_ms, 1 s; refreshes at least every 0.1 s, so that each is
    # known missing by the cluster's answer (not by a wait no refresh answered).
    options = {**QUICK_WATCHDOG, "max_block_ms": 1000, "allow_auto_create_topics": False, "retry_backoff_max_ms": 100}
    report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, errors="report", **options)
    assert (report.rows_written, report.rows_failed) == (2, 3)
    assert sorted(r.value for r in read_topic(tansu_broker.bootstrap, good)) == [b"a", b"b"]


@pytest.mark.parametrize("in_headers", [False, True], ids=["values", "headers"])
def test_the_writer_holds_at_most_twice_buffer_memory_of_payload(tansu_broker: TansuBroker, in_headers: bool) -> None:
    # max_in_flight_rows bounded what a writer held by rows only: at 1 MB a row, 50,000 rows
    # were 50 GB on the driver or in each executor task's Python worker. Then only keys and
    # values counted: rows carrying their bytes in headers were held by rows only again.
    topic = new_topic("held")
    options = producer_options(tansu_broker.bootstrap, {"buffer_memory": 1_000_000})
    plan = Plan(options, topic, False, False, False, in_headers, "raise", 20, 50_000, None)
    unit = PartitionWrite(plan)
    held = []
    for c in range(30):
        numbers = [b"%05d" % (c * 50 + i) for i in range(50)]
        if in_headers:
            chunk = Chunk(c * 50, numbers, headers=[[("h", bytes(10_000))] for _ in numbers])  # 500 kB
        else:
            chunk = Chunk(c * 50, [n + bytes(10_000) for n in numbers])
        unit.write(chunk)
        held.append(
            sum(len(v) for chunk, *_ in unit._pending for v in chunk.values)
            + sum(len(h) for chunk, *_ in unit._pending for hs in chunk.headers or [] for _, h in hs)
        )
    tally = unit.finish()
    assert (tally.written, tally.aborted) == (1500, None)
    assert max(held) <= 2_000_000, f"{max(held) / 1e6:.1f} MB of rows held with buffer_memory=1 MB"
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 1500


def test_a_chunk_larger_than_max_in_flight_rows_is_sent_in_slices(tansu_broker: TansuBroker) -> None:
    # A chunk (one Arrow batch, 10,000 rows by default) was queued whole: with
    # max_in_flight_rows=100 all 1,000 rows of this one were handed over and unacknowledged at once.
    topic = new_topic("sliced")
    create_topic(tansu_broker.bootstrap, topic, 1)
    plan = Plan(producer_options(tansu_broker.bootstrap, {}), topic, False, False, True, False, "report", 20, 100, None)
    unit = PartitionWrite(plan)
    partitions: list[int | None] = [None] * 1000
    partitions[750] = -1  # refused before it is queued: a row error, numbered in the whole chunk
    assert unit.write(Chunk(0, [b"%d" % i for i in range(1000)], partitions=partitions))
    handed_over = sum(len(chunk.values) for chunk, *_ in unit._pending)  # each not yet acknowledged, or more
    tally = unit.finish()
    assert handed_over <= 100
    assert (tally.written, tally.failed, [e.row for e in tally.errors]) == (999, 1, [750])
    values = [r.value for r in read_topic(tansu_broker.bootstrap, topic)]
    assert values == [b"%d" % i for i in range(1000) if i != 750]  # one Kafka partition: in order


def test_a_streaming_dataframe_is_refused_naming_foreach_batch(spark: Any) -> None:
    # Driver mode opened its producer first, then blamed Arrow ("not available on the driver"),
    # or Spark raised its own AnalysisException.
    df = spark.readStream.format("rate").load().selectExpr("cast(value as string) as value")
    with pytest.raises(ValueError, match=r"streaming DataFrame: .*foreachBatch"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t")


@pytest.mark.parametrize(("name", "value"), [("max_errors", "10"), ("max_in_flight_rows", None)])
def test_counts_of_the_wrong_type_are_named(spark: Any, name: str, value: Any) -> None:
    # TypeError: '<' not supported between instances of 'str' and 'int', naming neither.
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(TypeError, match=f"{name} must be an int, got {value!r}"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", **{name: value})


# -- progress -------------------------------------------------------------------------------------


def test_driver_progress_callback_and_bounded_in_flight(spark: Any, tansu_broker: TansuBroker) -> None:
    calls: list[tuple[int, int]] = []
    df = big_frame(spark, 25_000)
    report = write_dataframe(
        df,
        bootstrap_servers=tansu_broker.bootstrap,
        topic=new_topic("progress"),
        progress=lambda written, failed: calls.append((written, failed)),
        max_in_flight_rows=5_000,
    )
    assert report.rows_written == 25_000
    assert len(calls) >= 3
    assert calls == sorted(calls)
    assert calls[-1] == (25_000, 0)


def test_a_progress_callback_that_raises_says_what_the_write_had_done(tansu_broker: TansuBroker) -> None:
    # It stops a driver-mode write, and no report comes back: the bare error left the caller to
    # guess that rows were in Kafka already (a rerun writes them twice). Executors mode said so.
    topic = new_topic("progress-raises")
    plan = Plan(producer_options(tansu_broker.bootstrap, {}), topic, False, False, False, False, "raise", 20, 50, None)

    def closed_bar(written: int, failed: int) -> None:
        raise RuntimeError("the progress bar is closed")

    unit = PartitionWrite(plan, on_progress=closed_bar)
    chunks = [Chunk(c * 50, [b"%d" % (c * 50 + i) for i in range(50)]) for c in range(3)]
    with pytest.raises(RuntimeError, match="the progress bar is closed") as info:
        write_partition(unit, chunks)
    assert info.value.__notes__ == [
        "raised by progress(): the write stopped there; 50 rows were written and 0 failed so far, and the rows"
        " queued meanwhile are delivered: they are in Kafka, and a rerun writes them again"
    ]
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 50  # max_in_flight_rows=50: nothing was queued meanwhile


def test_progress_is_shown_by_the_caller_only(
    spark: Any, tansu_broker: TansuBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    df = spark.createDataFrame([("v",)], "value string")
    write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=new_topic("quiet"))
    assert capsys.readouterr() == ("", "")
    with pytest.raises(TypeError, match="progress must be a callable"):
        write_dataframe(df, bootstrap_servers=UNREACHABLE, topic="t", progress=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_empty_frame(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    df = spark.createDataFrame([], "value string")
    report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic="t", mode=mode)
    assert (report.rows_written, report.rows_failed, report.topics) == (0, 0, {})


# -- executors: what crosses to them ---------------------------------------------------------------


def test_executor_closure_holds_only_plain_data(spark: Any) -> None:
    df = spark.createDataFrame([("v",)], "value string")
    options = producer_options("h:9092", {"linger_ms": 7})
    columns = check_schema(df.schema, "t")
    plan = Plan(options, "t", "key" in columns, False, False, False, "raise", 20, 1000, None)
    task = functools.partial(executor_arrow_task, plan)
    # The standard pickle (not cloudpickle) can carry it: module functions by reference
    # and a frozen dataclass of str/int/dict. No SparkSession, DataFrame or producer inside.
    data = pickle.dumps(task)
    assert len(data) < 1000
    assert pickle.loads(data).args[0] == plan
    assert plan.options == {"linger_ms": 7, "bootstrap_servers": "h:9092", "batch_size": 262144}


def test_report_str_is_a_summary() -> None:
    report = WriteReport("driver", "arrow", 10, 1, 2.0, {"t": 10}, [RowError(3, "t", None, "ValueError: x")])
    assert str(report).startswith("10 rows written, 1 failed in 2.00s (5 rows/s")
    assert "row 3: ValueError: x" in str(report)


@pytest.mark.filterwarnings("ignore:Cannot infer the eval type:UserWarning")
@pytest.mark.parametrize("mode", MODES)
def test_a_failing_upstream_computation_raises_its_error(spark: Any, tansu_broker: TansuBroker, mode: Mode) -> None:
    from pyspark.sql import functions as F

    @F.udf("string", useArrow=False)
    def explode_at_1500(n: int) -> str:
        if n == 1500:
            raise RuntimeError("upstream failure at row 1500")
        return str(n)

    df = spark.range(2000, numPartitions=1).select(explode_at_1500("id").alias("value"))
    topic = new_topic("upstream")
    with pytest.raises(Exception, match="upstream failure at row 1500") as info:
        write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode=mode)
    assert not isinstance(info.value, (WriteError, SparkEnvironmentError))
    # Rows read before the failure were delivered, none twice; the producer was closed
    # (the autouse fixture checks that no producer thread is left).
    values = [int(c.value or b"") for c in read_topic(tansu_broker.bootstrap, topic)] if mode == "driver" else []
    assert len(values) == len(set(values))
    assert all(v < 1500 for v in values)


def test_auto_transport_falls_back_to_rows(
    spark: Any, tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where pyspark offers no Arrow path (Spark Connect, old versions), Rows still work."""

    def no_arrow(*args: Any) -> Any:
        raise ArrowUnavailable("simulated")

    def no_map_in_arrow(*args: Any) -> Any:
        raise AttributeError("simulated: no mapInArrow")

    monkeypatch.setattr(driver, "driver_arrow_chunks", no_arrow)
    monkeypatch.setattr(_pyspark, "map_in_arrow", no_map_in_arrow)
    df = spark.createDataFrame([("a",), ("b",)], "value string")
    for mode in MODES:
        topic = new_topic("fallback")
        report = write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic=topic, mode=mode)
        assert (report.transport, report.rows_written) == ("rows", 2)
        assert sorted(c.value or b"" for c in read_topic(tansu_broker.bootstrap, topic)) == [b"a", b"b"]
    with pytest.raises(SparkEnvironmentError, match="transport='arrow' is not available"):
        write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic="t", transport="arrow")
    with pytest.raises(AttributeError, match="simulated"):
        write_dataframe(df, bootstrap_servers=tansu_broker.bootstrap, topic="t", transport="arrow", mode="executors")

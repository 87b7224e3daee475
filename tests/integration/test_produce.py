"""The producer against real brokers, verified by reading back with confluent_kafka."""

from __future__ import annotations

import asyncio
import json

import confluent_kafka
import pytest

from aioprod import Producer, RecordMetadata
from aioprod.errors import KafkaError, KafkaTimeoutError, ProducerClosedError
from tests.brokers import MockCluster, TansuBroker, tansu, time_out_on_the_wire, topic_across_leaders
from tests.readback import read_topic

pytestmark = pytest.mark.integration


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(30)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_every_acked_record_reads_back_identically(kafka_bootstrap: str, topic: str, codec: str) -> None:
    create_topic(kafka_bootstrap, topic, 3)
    sent: dict[tuple[int, int], tuple[bytes | None, bytes | None, tuple, int]] = {}
    records = [
        (b"key-%d" % i, b"value-%d-" % i + bytes(i % 50), [("h", b"%d" % i), ("h", None), ("t", b"")])
        for i in range(300)
    ]
    records += [(None, b"keyless"), (b"k-null-value", None), (None, None), (b"k-empty", b"")]  # type: ignore[list-item]
    async with Producer(bootstrap_servers=kafka_bootstrap, compression_type=codec, linger_ms=5) as producer:
        futures = []
        for i, rec in enumerate(records):
            key, value = rec[0], rec[1]
            headers = rec[2] if len(rec) > 2 else []  # type: ignore[misc]
            ts = 1_700_000_000_000 + i
            futures.append((await producer.send(topic, value, key=key, headers=headers, timestamp_ms=ts), rec, ts))
        for fut, rec, ts in futures:
            md: RecordMetadata = await fut
            assert md.topic == topic and md.timestamp == ts
            headers = tuple(rec[2]) if len(rec) > 2 else ()  # type: ignore[misc]
            sent[(md.partition, md.offset)] = (rec[0], rec[1], headers, ts)
            if rec[0] is not None:
                assert md.partition == confluent_kafka.murmur2(rec[0], 3)  # type: ignore[attr-defined]
    consumed = read_topic(kafka_bootstrap, topic)
    got = {(c.partition, c.offset): (c.key, c.value, c.headers, c.timestamp) for c in consumed}
    assert len(consumed) == len(records)
    assert got == sent


async def test_compressible_records_fill_batches_by_their_compressed_size_and_read_back(
    kafka_bootstrap: str, topic: str
) -> None:
    # As Java's producer, a batch of records zstd shrinks is full once its estimated compressed size
    # reaches batch_size: its records, many more than batch_size uncompressed, read back as sent.
    create_topic(kafka_bootstrap, topic, 1)
    values = [b'{"user": %d, "event": "page_view", "page": "/catalog/item/%d"}' % (i, i % 13) for i in range(20_000)]
    async with Producer(
        bootstrap_servers=kafka_bootstrap, compression_type="zstd", batch_size=1024, linger_ms=60_000
    ) as producer:
        futures = [await producer.send(topic, value) for value in values]
        await producer.flush()
        metrics = producer.metrics()
    assert [f.result().offset for f in futures] == list(range(len(values)))
    assert [c.value for c in read_topic(kafka_bootstrap, topic)] == values
    # Uncompressed, the batches held more than twice batch_size (the estimate improves by 0.005 a
    # batch, as Java's); none was larger than batch_size on the wire.
    assert metrics["batch-size-avg"] / metrics["compression-rate-avg"] > 2 * 1024
    assert metrics["batch-size-max"] <= 1024


async def test_explicit_partitions(kafka_bootstrap: str, topic: str) -> None:
    create_topic(kafka_bootstrap, topic, 4)
    async with Producer(bootstrap_servers=kafka_bootstrap) as producer:
        assert await producer.partitions_for(topic) == [0, 1, 2, 3]
        mds = [await producer.send_and_wait(topic, b"v%d" % i, key=b"same", partition=i % 4) for i in range(8)]
    assert [md.partition for md in mds] == [0, 1, 2, 3] * 2
    consumed = read_topic(kafka_bootstrap, topic)
    assert sorted((c.partition, c.value) for c in consumed) == sorted((i % 4, b"v%d" % i) for i in range(8))


async def test_three_brokers_each_partition_reaches_its_leader(mock3: MockCluster, topic: str) -> None:
    async with Producer(bootstrap_servers=mock3.bootstrap, linger_ms=2) as producer:
        topic = await topic_across_leaders(producer, topic)
        futures = [await producer.send(topic, b"v%d" % i, key=b"k%d" % i) for i in range(400)]
        results = await asyncio.gather(*futures)
        snapshot = producer.cluster()
        leaders = {p.leader for p in snapshot.topics[topic].partitions.values()}
        # Every leader got produce requests on its own connection, and no request needed
        # a retry (none went astray).
        brokers = producer.metrics_snapshot().brokers
        for node in leaders:
            assert brokers[node]["connection-count"] == 1
            assert brokers[node]["request-latency-max"] >= 0  # a produce response came from it
        assert producer.metrics()["record-retry-total"] == 0
    num = len(snapshot.topics[topic].partitions)
    consumed = read_topic(mock3.bootstrap, topic)
    assert len(consumed) == 400
    assert {(md.partition, md.offset) for md in results} == {(c.partition, c.offset) for c in consumed}
    for c in consumed:
        assert c.partition == confluent_kafka.murmur2(c.key, num)  # type: ignore[attr-defined]


async def test_full_buffer_suspends_send_then_succeeds(tansu_broker, topic: str) -> None:  # type: ignore[no-untyped-def]
    value = b"x" * 1000
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, buffer_memory=32 * 1024, batch_size=8192) as p:
        futures = [await p.send(topic, value) for _ in range(500)]  # ~500 KB through a 32 KiB buffer
        assert p.metrics()["bufferpool-wait-total"] > 0
        results = await asyncio.gather(*futures)
        assert p.metrics()["buffer-available-bytes"] == p.metrics()["buffer-total-bytes"]  # all given back
    assert len({(md.partition, md.offset) for md in results}) == 500
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 500


async def test_unknown_topic_without_auto_create_times_out_naming_it(mock3: MockCluster, topic: str) -> None:
    async with Producer(bootstrap_servers=mock3.bootstrap, allow_auto_create_topics=False, max_block_ms=500) as p:
        with pytest.raises(KafkaTimeoutError, match=topic):
            await p.send(topic, b"v")


async def test_close_delivers_ten_thousand_queued_records(tansu_broker, topic: str) -> None:  # type: ignore[no-untyped-def]
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=1000)
    await producer.start()
    futures = [await producer.send(topic, b"r%d" % i) for i in range(10_000)]
    await producer.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 10_000


async def test_close_with_zero_timeout_fails_unsent_records(tansu_broker, topic: str) -> None:  # type: ignore[no-untyped-def]
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=60_000, batch_size=1 << 20)
    await producer.start()
    first = await producer.send(topic, b"first")
    await producer.flush()  # metadata and connection are warm, without waiting out the linger
    assert (await first).topic == topic
    futures = [await producer.send(topic, b"r%d" % i) for i in range(100)]
    await producer.close(timeout=0)
    for f in futures:
        error = f.exception()
        assert isinstance(error, ProducerClosedError) and error.possibly_persisted is False
    with pytest.raises(ProducerClosedError):
        await producer.send(topic, b"late")
    # close(0) sends nothing more: what it reported as not sent is not in the log.
    assert [c.value for c in read_topic(tansu_broker.bootstrap, topic)] == [b"first"]


async def test_records_after_a_delivery_timeout_on_the_wire_are_written(topic: str) -> None:
    # A record that timed out on the wire leaves its partition's sequence in doubt; the producer
    # bumped its epoch itself (Java's bumpIdempotentProducerEpoch), which Tansu refuses with
    # PRODUCER_FENCED: every record after it failed so, for good, bumping again each time.
    with tansu() as broker:
        create_topic(broker.bootstrap, topic, 1)
        options = {"linger_ms": 0, "request_timeout_ms": 1000, "delivery_timeout_ms": 1500, "retry_backoff_ms": 50}
        async with Producer(bootstrap_servers=broker.bootstrap, **options) as producer:  # type: ignore[arg-type]
            await producer.send_and_wait(topic, b"first")
            await time_out_on_the_wire(broker, producer, topic)
            after = [(await producer.send_and_wait(topic, b"after-%d" % i)).offset for i in range(3)]
        values = [c.value for c in read_topic(broker.bootstrap, topic)]
    assert values in (
        [b"first", b"after-0", b"after-1", b"after-2"],
        [b"first", b"frozen", b"after-0", b"after-1", b"after-2"],
    )
    assert after == [len(values) - 3, len(values) - 2, len(values) - 1]


async def test_broker_restart_mid_stream(topic: str) -> None:
    with tansu() as broker:
        create_topic(broker.bootstrap, topic, 3)
        async with Producer(
            bootstrap_servers=broker.bootstrap, linger_ms=1, delivery_timeout_ms=20_000, request_timeout_ms=5000
        ) as producer:
            before = [await producer.send(topic, b"before-%d" % i) for i in range(200)]
            in_flight = [await producer.send(topic, b"in-flight-%d" % i) for i in range(200)]
            await asyncio.gather(*before)
            # Kill and restart on the same port while records are queued or in flight. The
            # event loop is blocked meanwhile, so the producer cannot send in between.
            # Memory storage forgets the topic, and Tansu acknowledges writes to a topic it
            # does not have (and drops them), so the test recreates it, as an operator would.
            broker.restart()
            create_topic(broker.bootstrap, topic, 3)
            outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
            for outcome in outcomes:
                assert isinstance(outcome, (RecordMetadata, KafkaError)), outcome
            after = [await producer.send(topic, b"after-%d" % i) for i in range(200)]
            acked_after = await asyncio.gather(*after)
        consumed = read_topic(broker.bootstrap, topic)
        values = [c.value for c in consumed]
        assert len(values) == len(set(values))
        assert {b"after-%d" % i for i in range(200)} <= set(values)
        assert {(md.partition, md.offset) for md in acked_after} <= {(c.partition, c.offset) for c in consumed}
        # In-flight records acknowledged before the restart went down with the broker's
        # memory: that loss is the broker's. Each had a clear outcome, checked above.


def test_runs_on_uvloop(tansu_broker: TansuBroker, topic: str) -> None:
    import uvloop

    async def main() -> list[RecordMetadata]:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        async with Producer(bootstrap_servers=tansu_broker.bootstrap, compression_type="lz4") as producer:
            futures = [await producer.send(topic, b"u%d" % i, key=b"k%d" % i) for i in range(300)]
            return list(await asyncio.gather(*futures))

    results = uvloop.run(main())
    consumed = {(c.partition, c.offset): c.value for c in read_topic(tansu_broker.bootstrap, topic)}
    assert {(md.partition, md.offset): b"u%d" % i for i, md in enumerate(results)} == consumed


async def test_send_writes_the_serialized_key_and_value(tansu_broker: TansuBroker, topic: str) -> None:
    async with Producer(
        bootstrap_servers=tansu_broker.bootstrap,
        key_serializer=str.encode,
        value_serializer=lambda v: json.dumps(v).encode(),
    ) as p:
        md = await p.send_and_wait(topic, {"n": 1}, key="key-1")
        # None goes to the serializer, as in Java, aiokafka and confluent-kafka: JSON's is a
        # document, b"null". (Skipped, it was a tombstone: a compacted topic dropped the key.)
        await p.send_and_wait(topic, None, key="key-2")
    async with Producer(
        bootstrap_servers=tansu_broker.bootstrap,
        key_serializer=str.encode,
        value_serializer=lambda v: None if v is None else json.dumps(v).encode(),
    ) as p:
        await p.send_and_wait(topic, None, key="tombstone")  # a serializer's None is a tombstone
    records = sorted(read_topic(tansu_broker.bootstrap, topic), key=lambda r: r.key)
    assert [(r.key, r.value) for r in records] == [
        (b"key-1", b'{"n": 1}'),
        (b"key-2", b"null"),
        (b"tombstone", None),
    ]
    assert (records[0].partition, records[0].offset) == (md.partition, md.offset)


async def test_send_many_writes_each_serialized_value_in_order(tansu_broker: TansuBroker, topic: str) -> None:
    create_topic(tansu_broker.bootstrap, topic, 2)
    async with Producer(
        bootstrap_servers=tansu_broker.bootstrap, key_serializer=str.encode, value_serializer=str.encode
    ) as p:
        mds = await (await p.send_many(topic, ["a", "b", "c"], keys=["ka", "kb", "kc"], partition=1))
    got = {(r.partition, r.offset): (r.key, r.value) for r in read_topic(tansu_broker.bootstrap, topic)}
    assert [got[(md.partition, md.offset)] for md in mds] == [(b"ka", b"a"), (b"kb", b"b"), (b"kc", b"c")]

"""The bulk path: many records behind one future, read back independently."""

from __future__ import annotations

import asyncio
import json

import confluent_kafka
import pytest

from aioprod import Producer, RecordMetadata
from aioprod.errors import KafkaError, ProducerClosedError, RecordTooLargeError, SendManyError
from tests.brokers import TansuBroker
from tests.integration.test_produce import create_topic
from tests.readback import read_topic

pytestmark = pytest.mark.integration


async def test_keyless_bulk_lands_in_order_with_offsets(tansu_broker: TansuBroker, topic: str) -> None:
    create_topic(tansu_broker.bootstrap, topic, 3)
    values = [b"v%05d" % i for i in range(20_000)] + [None, b""]
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, batch_size=4096) as producer:
        mds = await (await producer.send_many(topic, values, timestamp_ms=1_700_000_000_000))
    assert len(mds) == len(values)
    consumed = {(c.partition, c.offset): c for c in read_topic(tansu_broker.bootstrap, topic)}
    assert len(consumed) == len(values)
    for value, md in zip(values, mds, strict=True):
        record = consumed[(md.partition, md.offset)]
        assert record.value == value and record.key is None and record.timestamp == md.timestamp
    # The sticky partitioner spreads batches over partitions, in order within each.
    assert len({md.partition for md in mds}) > 1


async def test_keyed_bulk_with_headers_and_conversions(tansu_broker: TansuBroker, topic: str) -> None:
    create_topic(tansu_broker.bootstrap, topic, 4)
    keys = [b"k%d" % (i % 7) for i in range(500)]
    values = [bytearray(b"x%d" % i) for i in range(500)]  # converted to bytes
    headers = [[("i", b"%d" % i), ("i", None)] if i % 2 else None for i in range(500)]
    async with Producer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        mds = await (await producer.send_many(topic, values, keys=keys, headers=headers))
    consumed = {(c.partition, c.offset): c for c in read_topic(tansu_broker.bootstrap, topic)}
    for i, md in enumerate(mds):
        record = consumed[(md.partition, md.offset)]
        assert record.key == keys[i] and record.value == bytes(values[i])
        assert record.headers == (tuple(headers[i]) if headers[i] else ())
        assert md.partition == confluent_kafka.murmur2(keys[i], 4)  # type: ignore[attr-defined]


async def test_explicit_partition_and_serializer(tansu_broker: TansuBroker, topic: str) -> None:
    create_topic(tansu_broker.bootstrap, topic, 2)
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, value_serializer=str.encode) as producer:
        mds = await (await producer.send_many(topic, ["a", "b", "c"], partition=1))
    assert [(md.partition, md.offset) for md in mds] == [(1, 0), (1, 1), (1, 2)]


async def test_a_bad_record_raises_before_anything_is_queued(tansu_broker: TansuBroker, topic: str) -> None:
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, max_request_size=10_000) as producer:
        with pytest.raises(TypeError, match="value must be bytes or None, got str"):
            await producer.send_many(topic, [b"not-1", b"not-2", "bad", b"never"])
        with pytest.raises(RecordTooLargeError, match="max_request_size"):
            await producer.send_many(topic, [b"not-3", b"x" * 20_000])
        with pytest.raises(ValueError, match="keys has 1 items but values has 2"):
            await producer.send_many(topic, [b"a", b"b"], keys=[b"k"])
        assert await (await producer.send_many(topic, [])) == []
        await (await producer.send_many(topic, [b"ok"]))
    values = sorted(c.value for c in read_topic(tansu_broker.bootstrap, topic))
    assert values == [b"ok"]


async def test_failures_are_reported_per_record(tansu_broker: TansuBroker, topic: str) -> None:
    # One group is flushed and acknowledged; the next still lingers when close(0) stops the
    # producer. Its records fail one by one, as KafkaErrors that say they were never sent, and
    # the log (read back independently) holds exactly the acknowledged records.
    create_topic(tansu_broker.bootstrap, topic, 1)
    first, second = [b"acked-1", b"acked-2"], [b"a", b"b"]
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=10_000) as producer:
        delivered = await producer.send_many(topic, first)
        await producer.flush()
        acknowledged = list(zip(first, await delivered, strict=True))
        future = await producer.send_many(topic, second)
        await producer.close(timeout=0)
    with pytest.raises(SendManyError) as info:
        await future
    results = info.value.results
    assert len(results) == len(second)
    acknowledged += [(v, r) for v, r in zip(second, results, strict=True) if isinstance(r, RecordMetadata)]
    failed = [(v, r) for v, r in zip(second, results, strict=True) if not isinstance(r, RecordMetadata)]
    for _, error in failed:
        assert isinstance(error, KafkaError), f"a failed record's result is not a KafkaError: {error!r}"
    log = read_topic(tansu_broker.bootstrap, topic)
    not_sent = {v for v, e in failed if not getattr(e, "possibly_persisted", True)}
    assert not_sent.isdisjoint(c.value for c in log), "a record reported as never sent is in the log"
    assert [(c.partition, c.offset, c.value) for c in log] == [(md.partition, md.offset, v) for v, md in acknowledged]
    # The second group never left the client (a 10-second linger): each record failed with
    # the close, certainly not written.
    assert [type(e) for _, e in failed] == [ProducerClosedError] * len(second)
    assert [e.possibly_persisted for _, e in failed] == [False] * len(second)


async def test_serializers_see_none_as_send_does(tansu_broker: TansuBroker, topic: str) -> None:
    # As Java, aiokafka and confluent-kafka call them: a value serializer's JSON None is a
    # document, and without keys the key serializer sees None for every record.
    seen: list[object] = []

    def key_serializer(key: str | None) -> bytes | None:
        seen.append(key)
        return None if key is None else key.encode()

    async with Producer(
        bootstrap_servers=tansu_broker.bootstrap,
        key_serializer=key_serializer,
        value_serializer=lambda v: json.dumps(v).encode(),
    ) as producer:
        await (await producer.send_many(topic, [1, None], partition=0))
    assert seen == [None, None]
    assert [(r.key, r.value) for r in read_topic(tansu_broker.bootstrap, topic)] == [(None, b"1"), (None, b"null")]


async def test_acks_0_writes_every_record_though_tansu_answers(tansu_broker: TansuBroker, topic: str) -> None:
    # Kafka answers no acks=0 request; Tansu answers each. Those answers were taken for a
    # malformed response, and the connection dropped with what the broker had not read yet:
    # records counted as delivered were not in the log.
    values = [b"v%06d" % i + b"x" * 93 for i in range(30_000)]
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, acks=0) as producer:
        futures = [await producer.send(topic, value, key=b"key-%d" % (i % 3)) for i, value in enumerate(values)]
        await asyncio.gather(*futures)
    assert sorted(c.value for c in read_topic(tansu_broker.bootstrap, topic)) == values


async def test_acks_0_delivers_without_offsets(tansu_broker: TansuBroker, topic: str) -> None:
    # No answer is read with acks=0: every record's metadata says offset -1, and the records are
    # in the log all the same.
    create_topic(tansu_broker.bootstrap, topic, 2)
    values = [b"a0-%04d" % i for i in range(300)]
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, acks=0) as producer:
        group = await producer.send_many(topic, values[:200], timestamp_ms=1_700_000_000_000)
        singles = [await producer.send(topic, value) for value in values[200:]]
        await producer.flush()
        mds = await group + [await f for f in singles]
    assert [md.offset for md in mds] == [-1] * len(values)
    assert all(md.timestamp == 1_700_000_000_000 for md in mds[:200])
    assert sorted(c.value for c in read_topic(tansu_broker.bootstrap, topic)) == values

"""The producer's API keeps the promises its docstrings make: lifecycle, partition choice, argument
checks and the bounded waits (each test found missing by a mutation run of the API layer)."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from aioprod import Producer
from aioprod.errors import (
    ClusterAuthorizationFailedError,
    KafkaTimeoutError,
    ProducerClosedError,
    ProducerFatalError,
    RecordTooLargeError,
    TransactionalIdAuthorizationFailedError,
)
from aioprod.producer.partitioner import partition_for_key
from aioprod.protocol.messages import InitProducerIdRequest
from tests.brokers import refused_port
from tests.conftest import Scripted


def aioprod_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("aioprod")]


@pytest.mark.parametrize("started", [True, False])
async def test_a_closed_producer_cannot_be_started_again(started: bool) -> None:
    p = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")
    if started:
        await p.start()
    await p.close(0)
    with pytest.raises(ProducerClosedError, match=r"start\(\) called on a producer that is closed"):
        await p.start()
    with pytest.raises(ProducerClosedError):
        await p.send("t", b"v")
    assert not aioprod_tasks()


@pytest.mark.parametrize("path", ["send", "send_many"])
async def test_a_keyed_record_goes_by_the_partition_count_while_a_partition_has_no_leader(
    scripted: Scripted, path: str
) -> None:
    # Java's partitionForKey hashes over every partition of the topic, led or not: a key must
    # not move while a broker is down (its order and its consumers' state go with it).
    cluster = scripted.cluster
    cluster.create_topic("t", [1, -1, 1])  # partition 1 has no leader
    key = next(k for k in (b"key-%d" % i for i in range(1000)) if partition_for_key(k, 3) == 2)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        if path == "send":
            for _ in range(2):  # the second through the compiled lane, where there is one
                metadata = await p.send_and_wait("t", b"v", key=key)
                assert metadata.partition == 2
        else:
            results = await (await p.send_many("t", [b"v", b"v"], keys=[key, key]))
            assert [r.partition for r in results] == [2, 2]
    assert cluster.partition("t", 2).values == [b"v", b"v"]
    assert cluster.partition("t", 0).values == []


async def test_max_block_ms_bounds_a_sends_waits_for_metadata_and_memory_in_all(scripted: Scripted) -> None:
    # "Suspends ... while the topic's metadata is fetched or the buffer is full, for at most
    # max_block_ms in all": the wait for memory gets what the wait for metadata left.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("stuck", [2])
    loop = asyncio.get_running_loop()  # virtual time
    options = {"linger_ms": 0, "buffer_memory": 3000, "max_block_ms": 1000, "delivery_timeout_ms": 60_000}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        await p.partitions_for("stuck")
        cluster.stop(2)  # its records hold their memory until their delivery timeout
        stuck = await p.send("stuck", b"x" * 2500)
        loop.call_later(0.5, cluster.create_topic, "late", 1)  # seen half-way through max_block_ms
        started = loop.time()
        with pytest.raises(KafkaTimeoutError, match="buffer_memory"):
            await p.send("late", b"y" * 1000)
        waited = loop.time() - started
        assert "late" in p.cluster().topics  # the metadata came, then memory did not
        await p.close(0)
    assert waited <= 1.0, waited
    with pytest.raises(ProducerClosedError):
        await stuck


async def test_a_send_granted_memory_by_a_producer_that_failed_meanwhile_is_refused(scripted: Scripted) -> None:
    # The first record's batch fails with the producer (no producer id can be had), which frees
    # the memory the second send() waits for: that send must be refused, not queued in a
    # producer that sends nothing more, and must give the memory back.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.init_script = deque([ClusterAuthorizationFailedError.code])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, buffer_memory=3000) as p:
        await p.partitions_for("t")
        first = await p.send("t", b"x" * 2500)
        second = asyncio.ensure_future(p.send("t", b"y" * 1000))
        with pytest.raises(ProducerFatalError):
            await first
        with pytest.raises(ProducerFatalError, match="cannot obtain a producer id"):
            await second
        assert p._accumulator.pool.used == 0
        # And every later call says why, send_many's as send's.
        with pytest.raises(ProducerFatalError, match="cannot obtain a producer id"):
            await p.send("t", b"z")
        with pytest.raises(ProducerFatalError, match="cannot obtain a producer id"):
            await p.send_many("t", [b"z"])
    assert cluster.partition("t").values == []


async def test_a_transactional_start_that_fails_leaves_nothing_running(scripted: Scripted) -> None:
    # ``async with Producer(...)`` whose start() raised never reaches __aexit__: start() itself
    # must release the tasks and connections it made.
    cluster = scripted.cluster
    cluster.coordinator.script[InitProducerIdRequest.API_KEY] = deque([TransactionalIdAuthorizationFailedError.code])
    p = Producer(bootstrap_servers=cluster.bootstrap, transactional_id="tx")
    with pytest.raises(ProducerFatalError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        await p.start()
    assert not aioprod_tasks()
    assert cluster.nodes[1].open_connections == 0
    with pytest.raises(ProducerClosedError):
        await p.send("t", b"v")


@pytest.mark.parametrize(
    ("limit", "largest"),
    [
        # As Java counts a record's batch (estimateSizeInBytesUpperBound): its header (61), the
        # record's framing at its largest (21), a null key (1), the value's length (3), no headers
        # (1). It counted 64 bytes of framing: the 38 largest records it allows here were refused.
        ({"max_request_size": 10_000}, 10_000 - 61 - 21 - 1 - 3 - 1),
        ({"buffer_memory": 5_000}, 5_000 - 64),
    ],
)
async def test_the_largest_record_the_limits_allow_is_taken_and_one_byte_more_is_refused(
    scripted: Scripted, limit: dict[str, int], largest: int
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, max_block_ms=1000, **limit) as p:
        await p.send_and_wait("t", b"warm-up")  # the topic known (and its compiled lane open, where there is one)
        with pytest.raises(RecordTooLargeError, match="is larger than"):
            await p.send("t", bytes(largest + 1))
        with pytest.raises(RecordTooLargeError, match="is larger than"):
            await p.send_many("t", [bytes(largest + 1)])
        with pytest.raises(RecordTooLargeError, match="is larger than"):
            await p.send_many("t", [bytes(largest + 1 - 10)], keys=[bytes(10)])
        await p.send_and_wait("t", bytes(largest))
        await (await p.send_many("t", [bytes(largest)]))
    assert cluster.partition("t").values == [b"warm-up", bytes(largest), bytes(largest)]


async def test_send_many_larger_than_the_buffer_goes_on_after_waiting_for_its_topic(scripted: Scripted) -> None:
    # max_block_ms bounds each wait, for the topic's metadata, then for memory: the call went on
    # only until max_block_ms after it began when it had waited for the topic first.
    cluster = scripted.cluster
    cluster.nodes[1].delay = 0.05
    loop = asyncio.get_running_loop()  # virtual time
    loop.call_later(0.2, cluster.create_topic, "t", 1)
    options = {"buffer_memory": 20_000, "batch_size": 10_000, "max_block_ms": 1000, "linger_ms": 5}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        started = loop.time()
        results = await (await p.send_many("t", [b"x" * 100] * 20_000))
        assert loop.time() - started > 1.0  # (the case in question: longer than max_block_ms in all)
    assert [r.offset for r in results] == list(range(20_000))


async def test_flush_during_close_waits_for_what_the_close_delivers(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.partitions_for("t")
        cluster.nodes[1].holding = True
        record = await p.send("t", b"v")
        closing = asyncio.ensure_future(p.close())
        await asyncio.sleep(0)  # closing, delivering the record
        flushing = asyncio.ensure_future(p.flush())
        await asyncio.sleep(1)
        assert not flushing.done()  # the record is still on its way
        cluster.nodes[1].release()
        await flushing
        assert record.done() and record.exception() is None
        await closing


async def test_flush_timeout_raises_when_any_record_is_still_on_its_way(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.partitions_for("t")
        cluster.nodes[2].holding = True  # partition 1's answer is late; partition 0's is not
        answered, late = await p.send("t", b"a", partition=0), await p.send("t", b"b", partition=1)
        with pytest.raises(KafkaTimeoutError, match=r"flush did not complete within 0\.5s"):
            await asyncio.wait_for(p.flush(0.5), 10)  # (the 10 s guard only catches a wait without end)
        assert answered.done() and not late.done()  # "with the records still on their way"
        cluster.nodes[2].release()
        await p.flush()
        assert late.result().partition == 1


async def test_partitions_for_names_every_partition_led_or_not(scripted: Scripted) -> None:
    scripted.cluster.create_topic("t", [1, -1, 1])
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap) as p:
        assert await p.partitions_for("t") == [0, 1, 2]


async def test_a_transaction_block_that_aborted_itself_raises_its_own_error(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="tx", linger_ms=0) as p:
        with pytest.raises(LookupError, match="the application's own"):
            async with p.transaction():
                await p.send("t", b"v")
                await p.abort_transaction()
                raise LookupError("the application's own")
        assert not p.in_transaction
        async with p.transaction():
            await p.send("t", b"w")
    assert cluster.partition("t").committed == [b"w"]


async def test_send_many_counts_header_bytes_against_max_request_size(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, max_request_size=10_000) as p:
        await p.partitions_for("t")
        with pytest.raises(RecordTooLargeError, match="is larger than max_request_size"):
            await p.send_many("t", [b"v"], headers=[[("h", bytes(10_000))]])
        with pytest.raises(RecordTooLargeError, match="is larger than max_request_size"):
            await p.send("t", b"v", headers=[("h", bytes(10_000))])
    assert cluster.partition("t").values == []


@pytest.mark.parametrize(("name", "error"), [("a" * 249, None), ("t\u00f3pico", ValueError), ("t\u0661", ValueError)])
async def test_topic_names_at_the_edges_of_kafkas_rules(scripted: Scripted, name: str, error: type[Exception]) -> None:
    # Kafka's Topic.validate: at most 249 characters of [a-zA-Z0-9._-] (ASCII only: a "\w"
    # takes any script's letters and digits, which every broker refuses).
    cluster = scripted.cluster
    cluster.create_topic(name, 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        if error is None:
            assert (await p.send_and_wait(name, b"v")).topic == name
            assert (await (await p.send_many(name, [b"w"])))[0].topic == name
        else:
            for call in (p.send(name, b"v"), p.send_many(name, [b"v"]), p.partitions_for(name)):
                with pytest.raises(error, match="illegal topic name"):
                    await call
    assert cluster.partition(name).values == ([] if error else [b"v", b"w"])

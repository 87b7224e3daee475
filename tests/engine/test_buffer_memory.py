"""buffer_memory bounds what the producer holds, and no reservation leaks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import KafkaTimeoutError
from aioprod.producer.accumulator import BufferPool
from tests.conftest import Scripted


async def test_space_granted_as_max_block_expires_is_not_leaked(scripted: Scripted) -> None:
    # The release that grants the waiter and the max_block_ms timeout fall due at the same
    # instant (the release was scheduled first, so it runs first): the waiter is granted,
    # then timed out. Either outcome is fine, but the space must be the caller's or free.
    loop = asyncio.get_running_loop()
    pool = BufferPool(100)
    assert pool.try_reserve(100)
    loop.call_at(loop.time() + 0.5, pool.release, 100)
    try:
        await pool.reserve(60, 0.5)
    except KafkaTimeoutError:
        assert pool.used == 0
    else:
        assert pool.used == 60
        pool.release(60)
    assert pool.try_reserve(100), "buffer memory leaked"


async def test_acks_0_holds_no_more_than_buffer_memory_when_the_broker_stops_reading(scripted: Scripted) -> None:
    # With acks=0 nothing comes back, so a record is done when its request is written out.
    # A broker that stops reading must make send() wait (and fail after max_block_ms),
    # not fill the transport without bound while every future says "delivered".
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    value = b"x" * 1000
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        acks=0,
        linger_ms=0,
        buffer_memory=1_000_000,
        max_request_size=100_000,
        batch_size=50_000,
        max_block_ms=500,
    ) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].stop_reading()
        delivered = 0
        futures = []
        with pytest.raises(KafkaTimeoutError, match="buffer_memory"):
            for _ in range(20_000):  # 20 MB
                futures.append(await p.send("t", value))
        await asyncio.sleep(0)
        delivered = sum(f.done() and f.exception() is None for f in futures)
        buffered = cluster.nodes[1].connections[-1].side._transport.get_write_buffer_size()
        await p.close(timeout=0)
    assert delivered * len(value) <= 1_000_000 + 100_000
    assert buffered <= 1_000_000 + 100_000


async def test_a_full_buffer_sends_what_is_queued_without_waiting_for_linger(scripted: Scripted) -> None:
    # Memory short forces sending (nothing else frees it): a send() waiting for space must not
    # wait out a linger (here longer than max_block_ms) for the sender to take the batch.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=10_000,
        buffer_memory=10_000,
        batch_size=100_000,
        max_request_size=100_000,
        max_block_ms=2_000,
    ) as p:
        await p.partitions_for("t")
        futures = [await p.send("t", b"x" * 1000) for _ in range(20)]  # twice buffer_memory
        assert [(await future).offset for future in futures] == list(range(20))


@pytest.mark.parametrize(
    ("send_many", "kwargs", "message"),
    [
        (False, {"timestamp_ms": 2**63}, "timestamp_ms must be < 2**63"),
        (True, {"timestamp_ms": 2**63}, "timestamp_ms must be an int >= 0 and < 2**63"),
        (False, {"headers": [("bad-\ud800", b"x")]}, "header name 'bad-\\ud800' is not valid Unicode"),
        (True, {"headers": [[("bad-\ud800", b"x")]]}, "header name 'bad-\\ud800' is not valid Unicode"),
    ],
)
async def test_a_record_the_batch_cannot_encode_is_refused_before_taking_buffer_memory(
    scripted: Scripted, send_many: bool, kwargs: dict[str, Any], message: str
) -> None:
    # Refused by the batch encoder after the space was reserved, each such record kept its
    # space for good: a few hundred of them and every send() timed out on a full buffer.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, buffer_memory=10_000, max_block_ms=1_000) as p:
        await p.partitions_for("t")
        for _ in range(200):  # 200 records' worth of buffer memory, were any of it kept
            with pytest.raises(ValueError) as info:
                if send_many:
                    await p.send_many("t", [b"v"], keys=[b"k"], **kwargs)
                else:
                    await p.send("t", b"v", **kwargs)
            assert message in str(info.value)
        assert (await p.send_and_wait("t", b"still fine")).offset == 0


async def test_send_many_queues_the_values_it_checked_though_the_list_changes_meanwhile(scripted: Scripted) -> None:
    # It checked every value (type, max_request_size), then read the caller's list again
    # between its runs: a value replaced meanwhile went out unchecked (50 kB under a
    # max_request_size of 10 kB here), or a str failed half-way with an unclear TypeError.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, batch_size=1024, max_request_size=10_000) as p:
        await p.partitions_for("t")
        values = [bytes([i]) * 100 for i in range(40)]
        checked = list(values)

        async def application() -> None:
            while p._accumulator.pool.used == 0:  # send_many has checked them all and queued its first run
                await asyncio.sleep(0)
            values[20] = b"Y" * 50_000
            values[21] = "not bytes"  # type: ignore[call-overload]

        changing = asyncio.ensure_future(application())
        await (await p.send_many("t", values))
        await changing
    assert cluster.partition("t", 0).values == checked


async def test_send_many_reports_its_own_offsets_when_a_send_joins_its_batch_between_runs(scripted: Scripted) -> None:
    # send_many queues m0 and waits for memory; another task's send() takes the same open
    # batch; m1 and m2 follow it there. The group counted the other record as one of its own:
    # m1 was reported at the other record's offset, m2 at m1's.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    options: dict[str, Any] = {"batch_size": 1000, "buffer_memory": 1600, "max_in_flight_requests_per_connection": 1}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10, **options) as p:
        cluster.nodes[1].holding = True
        cluster.nodes[2].holding = True
        first = await p.send("t", b"f", partition=0)  # in flight and held: partition 0's next batch stays open
        big = await p.send("t", b"B" * 1200, partition=1)  # in flight and held: holds buffer memory
        while len(cluster.requests) < 2 or not cluster.partition("t", 1).log:
            await asyncio.sleep(0.001)
        values = [b"m%d" % i + b"." * 100 for i in range(3)]
        many = asyncio.ensure_future(p.send_many("t", values, partition=0))
        await asyncio.sleep(0)  # m0 is queued (all the memory left allows), and send_many waits
        other = await p.send("t", b"s", partition=0)  # small enough: the same open batch
        await asyncio.sleep(0.01)
        cluster.nodes[2].release()  # memory frees: m1 and m2 join that batch
        group = await many
        cluster.nodes[1].release()
        await p.flush()
        await asyncio.gather(big, first)
        reported = {value[:2]: metadata.offset for value, metadata in zip(values, await group, strict=True)}
        reported[b"s"] = (await other).offset
    in_log = {
        (value or b"")[:2]: batch.base_offset + j
        for batch in cluster.partition("t", 0).log
        for j, value in enumerate(batch.values)
    }
    del in_log[b"f"]
    assert reported == in_log

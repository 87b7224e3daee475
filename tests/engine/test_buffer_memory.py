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

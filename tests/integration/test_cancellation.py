"""Cancelling a wait never withdraws, drops or duplicates a queued record."""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings

import pytest

from aioprod import Producer
from tests.brokers import TansuBroker
from tests.readback import read_topic

pytestmark = pytest.mark.integration


def queued(producer: Producer) -> bool:
    """Some record holds buffer memory: it is in the accumulator (or on the wire)."""
    metrics = producer.metrics()
    return metrics["buffer-available-bytes"] < metrics["buffer-total-bytes"]


async def test_cancelled_waits_still_deliver_every_record_once(tansu_broker: TansuBroker, topic: str) -> None:
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=50) as producer:
        await producer.partitions_for(topic)
        # A send_and_wait task cancelled while its record waits in the accumulator.
        waiter = asyncio.ensure_future(producer.send_and_wait(topic, b"task-cancelled"))
        while not queued(producer):
            await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # A direct await of the record future, cancelled.
        fut = await producer.send(topic, b"await-cancelled")
        awaiting = asyncio.ensure_future(asyncio.wait_for(fut, 0))
        with pytest.raises(TimeoutError):
            await awaiting
        await producer.send_and_wait(topic, b"after")
        await producer.flush()
    values = sorted(c.value for c in read_topic(tansu_broker.bootstrap, topic))
    assert values == [b"after", b"await-cancelled", b"task-cancelled"]


async def test_cancelling_many_waiters_under_load(tansu_broker: TansuBroker, topic: str) -> None:
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=5) as producer:
        tasks = [asyncio.ensure_future(producer.send_and_wait(topic, b"%d" % i)) for i in range(500)]
        while not queued(producer):
            await asyncio.sleep(0)
        for task in tasks[::2]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await producer.flush()
    values = [c.value for c in read_topic(tansu_broker.bootstrap, topic)]
    assert len(values) == len(set(values))
    # Every task whose send had queued its record delivered it; none twice.
    delivered = set(values)
    for i, task in enumerate(tasks):
        if not task.cancelled():
            assert b"%d" % i in delivered


async def test_close_while_connecting_leaves_no_socket_unclosed(tansu_broker: TansuBroker) -> None:
    # close(0) cancels a connection being opened. With happy eyeballs on (asyncio's
    # staggered_race), CPython 3.11 drops a socket that had just connected when cancelled:
    # "ResourceWarning: unclosed <socket.socket ...>", in about 4 of 20 closes. An address
    # needs no racing, and a name resolving to several still does.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for attempt in range(20):
            topic = f"leak-{uuid.uuid4().hex[:10]}"
            producer = Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=0)
            await producer.start()
            await producer.partitions_for(topic)  # the bootstrap connection; the leader's opens on a send
            await producer.send(topic, b"x")
            for _ in range(attempt % 5):
                await asyncio.sleep(0)
            await producer.close(timeout=0)
            del producer
            gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []

"""Cancelling a wait never withdraws, drops or duplicates a queued record."""

from __future__ import annotations

import asyncio

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

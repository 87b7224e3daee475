"""Connections cut under load, through a fault-injecting proxy in front of a real broker.

Every acknowledged record must be in the log exactly once, in send order per partition;
nothing that failed as *not sent* may be there; every future resolves, none hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import defaultdict
from dataclasses import dataclass

import pytest

from aioprod import Producer, RecordMetadata
from aioprod.errors import DeliveryTimeoutError, KafkaError
from tests.brokers import TansuBroker
from tests.chaos.proxy import FaultProxy, cut_randomly
from tests.readback import read_topic

pytestmark = pytest.mark.integration

RECORDS = 6000
KEYS = 12


@dataclass
class Run:
    sent: list[tuple[bytes, bytes]]
    outcomes: list[RecordMetadata | BaseException]
    seconds: float
    cuts: int
    retries: int
    resets: int


async def produce_under_faults(proxy: FaultProxy, topic: str, fault: object, seed: int) -> Run:
    rng = random.Random(seed)
    sent: list[tuple[bytes, bytes]] = []
    futures: list[asyncio.Future[RecordMetadata]] = []
    started = time.monotonic()
    async with Producer(
        bootstrap_servers=f"127.0.0.1:{proxy.port}",
        linger_ms=2,
        batch_size=4096,
        request_timeout_ms=3000,
        delivery_timeout_ms=60_000,
        retry_backoff_ms=10,
        retry_backoff_max_ms=200,
        reconnect_backoff_ms=10,
        reconnect_backoff_max_ms=200,
    ) as producer:
        await producer.partitions_for(topic)
        stop = asyncio.Event()
        chaos = asyncio.ensure_future(fault(stop, rng))  # type: ignore[operator]
        for i in range(RECORDS):
            key = b"k%02d" % (i % KEYS)
            value = b"%s:%06d" % (key, i)
            futures.append(await producer.send(topic, value, key=key))
            sent.append((key, value))
            if i % 50 == 49:
                await asyncio.sleep(0.04)  # a steady pace (~5 s in all), so faults land mid-stream
        stop.set()
        await chaos
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 120)
        metrics = producer.metrics()
    retries, resets = int(metrics["record-retry-total"]), int(metrics["producer-id-reset-total"])
    return Run(sent, outcomes, time.monotonic() - started, proxy.connections_cut, retries, resets)


def check(run: Run, bootstrap: str, topic: str, *, broker_lost_data: bool = False) -> dict[str, int]:
    assert len(run.outcomes) == len(run.sent)
    assert all(f is not None for f in run.outcomes)
    acked = {run.sent[i][1] for i, o in enumerate(run.outcomes) if isinstance(o, RecordMetadata)}
    not_sent = {
        run.sent[i][1]
        for i, o in enumerate(run.outcomes)
        if isinstance(o, DeliveryTimeoutError) and not o.possibly_persisted
    }
    for o in run.outcomes:
        assert isinstance(o, (RecordMetadata, KafkaError)), f"unexpected outcome {o!r}"
    consumed = read_topic(bootstrap, topic)
    values = [c.value for c in consumed]
    duplicates = len(values) - len(set(values))
    lost = 0 if broker_lost_data else len(acked - set(values))
    assert duplicates == 0, f"{duplicates} duplicated records"
    assert lost == 0, f"{lost} acknowledged records missing"
    assert not (not_sent & set(values)), "a record reported as not sent is in the log"
    # Per partition, the log holds records in send order.
    index = {value: i for i, (_, value) in enumerate(run.sent)}
    by_partition: dict[int, list[int]] = defaultdict(list)
    for c in consumed:
        by_partition[c.partition].append(index[c.value])  # type: ignore[index]
    for partition, order in by_partition.items():
        assert order == sorted(order), f"partition {partition} is out of send order"
    return {"acked": len(acked), "consumed": len(values), "duplicates": duplicates, "lost": lost}


def report(fault: str, run: Run, stats: dict[str, int]) -> None:
    """One line per fault for the log (pytest -s): what the run went through."""
    print(
        f"\nchaos({fault}): records={RECORDS} acked={stats['acked']} in-log={stats['consumed']} cuts={run.cuts} "
        f"retries={run.retries} resets={run.resets} duplicates={stats['duplicates']} lost={stats['lost']} "
        f"seconds={run.seconds:.1f}"
    )


async def test_connections_cut_at_random_lifetimes(proxied_broker: tuple[TansuBroker, FaultProxy], topic: str) -> None:
    broker, proxy = proxied_broker

    async def fault(stop: asyncio.Event, rng: random.Random) -> None:
        # Every connection dies after a random fraction of a second, and now and then all at once.
        proxy.rng = rng
        proxy.lifetime = (0.05, 0.6)
        await cut_randomly(proxy, stop, 0.5, 1.5, rng)
        proxy.lifetime = None

    run = await produce_under_faults(proxy, topic, fault, seed=1)
    stats = await asyncio.to_thread(check, run, broker.bootstrap, topic)
    report("cuts", run, stats)
    assert run.cuts > 0, "the proxy never cut a connection: the test proved nothing"
    assert stats["acked"] == RECORDS  # the delivery timeout is generous: every record gets through


async def test_connections_cut_mid_request(proxied_broker: tuple[TansuBroker, FaultProxy], topic: str) -> None:
    broker, proxy = proxied_broker

    async def fault(stop: asyncio.Event, rng: random.Random) -> None:
        while not stop.is_set():
            proxy.cut_after_bytes = rng.randrange(200, 20_000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.uniform(0.05, 0.2))
        proxy.cut_after_bytes = None

    run = await produce_under_faults(proxy, topic, fault, seed=2)
    stats = await asyncio.to_thread(check, run, broker.bootstrap, topic)
    report("mid-request", run, stats)
    assert run.cuts > 0
    assert stats["acked"] == RECORDS


async def test_broker_restarted_mid_stream(proxied_broker: tuple[TansuBroker, FaultProxy], topic: str) -> None:
    broker, proxy = proxied_broker

    async def fault(stop: asyncio.Event, rng: random.Random) -> None:
        try:
            await asyncio.wait_for(stop.wait(), 2.0)
        except TimeoutError:
            proxy.cut_all()
            await asyncio.to_thread(broker.restart)  # memory storage: the broker forgets everything

    run = await produce_under_faults(proxy, topic, fault, seed=3)
    # What the broker lost by restarting is the broker's; every future resolved, and what
    # is in the log now is there once and in order.
    stats = await asyncio.to_thread(check, run, broker.bootstrap, topic, broker_lost_data=True)
    report("restart", run, stats)
    assert sum(isinstance(o, RecordMetadata) for o in run.outcomes) > 0
    # After the restart the producer looked at the cluster again (the broker came back
    # without the topic), so what it sent afterwards is in the new broker's log.
    assert stats["consumed"] > 0

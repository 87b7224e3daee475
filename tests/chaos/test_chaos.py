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
from dataclasses import dataclass, field

import pytest

from aioprod import Producer, RecordMetadata
from aioprod.errors import DeliveryTimeoutError, KafkaError
from tests.brokers import TansuBroker
from tests.chaos.proxy import FaultProxy, cut_randomly
from tests.readback import read_topic

pytestmark = pytest.mark.integration

RECORDS = 6000
KEYS = 12
#: Records are queued in bursts of PACE, with a pause after each.
PACE = 50
#: test_broker_restarted_mid_stream restarts the broker as this record is queued (a point in
#: the stream, not a time): the last of a burst, a third of the way in, so the whole burst is
#: unacknowledged when the restart begins.
MIDWAY = RECORDS // 3 // PACE * PACE + PACE - 1


@dataclass
class Run:
    sent: list[tuple[bytes, bytes]]
    outcomes: list[RecordMetadata | BaseException]
    seconds: float
    cuts: int
    retries: int
    resets: int


@dataclass
class Stream:
    """The stream as a fault sees it while it runs: the future of every record queued so far,
    and an event set as record ``MIDWAY`` is queued."""

    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    midway: asyncio.Event = field(default_factory=asyncio.Event)


async def produce_under_faults(
    proxy: FaultProxy, topic: str, fault: object, seed: int, stream: Stream | None = None
) -> Run:
    rng = random.Random(seed)
    sent: list[tuple[bytes, bytes]] = []
    stream = stream or Stream()
    futures = stream.futures
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
            if i == MIDWAY:
                stream.midway.set()
            if i % PACE == PACE - 1:
                await asyncio.sleep(0.02)  # a steady pace (~2.5 s in all), so faults land mid-stream
        stop.set()
        await chaos
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 120)
        metrics = producer.metrics()
    retries, resets = int(metrics["record-retry-total"]), int(metrics["producer-id-reset-total"])
    return Run(sent, outcomes, time.monotonic() - started, proxy.connections_cut, retries, resets)


def check(run: Run, bootstrap: str, topic: str, *, kept_from: int = 0) -> dict[str, int]:
    """``kept_from``: every record from this index on that was acknowledged must be in the log
    (one acknowledged before it may have been lost with a restarted broker's memory)."""
    assert len(run.outcomes) == len(run.sent)
    assert all(f is not None for f in run.outcomes)
    acked = {run.sent[i][1] for i, o in enumerate(run.outcomes) if isinstance(o, RecordMetadata)}
    kept = {run.sent[i][1] for i, o in enumerate(run.outcomes) if isinstance(o, RecordMetadata) and i >= kept_from}
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
    lost = len(kept - set(values))
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
    stream = Stream()
    restarts: list[tuple[int, list[int]]] = []  # per restart: connections cut, records unacknowledged

    async def fault(stop: asyncio.Event, rng: random.Random) -> None:
        # The stream's progress says when, not a clock: as record MIDWAY is queued. This task
        # was woken then, ahead of anything the loop reads from the network afterwards, so no
        # answer to MIDWAY can have come yet: it is unacknowledged when the restart begins.
        await stream.midway.wait()
        unacknowledged = [i for i, f in enumerate(stream.futures) if not f.done()]
        # From the cut until the new broker is up the proxy takes no connection: no record
        # unacknowledged now reaches the old broker, no answer of the old broker the producer.
        proxy.refuse = True
        cut = proxy.cut_all()
        await asyncio.to_thread(broker.restart)  # memory storage: the broker forgets everything
        proxy.refuse = False
        restarts.append((cut, unacknowledged))

    run = await produce_under_faults(proxy, topic, fault, seed=3, stream=stream)
    assert len(restarts) == 1, "the broker was not restarted: the test proved nothing"
    ((cut, unacknowledged),) = restarts
    assert cut > 0, "the producer had no connection to cut"
    assert MIDWAY in unacknowledged
    # What the broker lost by restarting is the broker's (records acknowledged before the cut);
    # every future resolved; what is in the log now is there once and in order; and a record
    # acknowledged from MIDWAY on can only have been written by the new broker: it is in the log.
    stats = await asyncio.to_thread(check, run, broker.bootstrap, topic, kept_from=MIDWAY)
    report("restart", run, stats)
    # After the restart the producer looked at the cluster again (the broker came back without
    # the topic); the record unacknowledged at the restart was acknowledged after it, so (see
    # check) it is in the new broker's log.
    assert stats["consumed"] > 0
    assert isinstance(run.outcomes[MIDWAY], RecordMetadata), run.outcomes[MIDWAY]
    # The producer saw it too: the new broker refused what it sent under its old identity (it
    # has no state for it), and the producer retried those records under a new one.
    assert run.retries > 0 and run.resets > 0, f"retries={run.retries} resets={run.resets}"

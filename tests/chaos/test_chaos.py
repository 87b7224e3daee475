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
from typing import Any

import pytest

from aioprod import Producer, RecordMetadata
from aioprod.errors import DeliveryTimeoutError, KafkaError
from tests.brokers import PersistentTansuBroker, TansuBroker
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
#: test_broker_restarted_with_its_data_mid_stream sends fewer: Tansu on S3 storage answers a
#: fetch with one batch, listing its storage many times over to do it, and reading 6,000 records
#: back took over a minute.
KEPT_RECORDS = 1200
KEPT_MIDWAY = KEPT_RECORDS // 3 // PACE * PACE + PACE - 1


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
    and an event set as record ``midway_at`` (``MIDWAY``) is queued."""

    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    midway: asyncio.Event = field(default_factory=asyncio.Event)
    midway_at: int = MIDWAY
    #: The stream waits for its first record's outcome before it queues record ``midway_at``:
    #: something has been answered before the fault begins, however slow the broker.
    answered_before_midway: bool = False


async def produce_under_faults(
    proxy: FaultProxy,
    topic: str,
    fault: object,
    seed: int,
    stream: Stream | None = None,
    records: int = RECORDS,
    **config: Any,
) -> Run:
    """``config``: producer settings in place of these defaults."""
    rng = random.Random(seed)
    sent: list[tuple[bytes, bytes]] = []
    stream = stream or Stream()
    futures = stream.futures
    started = time.monotonic()
    settings: dict[str, Any] = {
        "linger_ms": 2,
        "batch_size": 4096,
        "request_timeout_ms": 3000,
        "delivery_timeout_ms": 60_000,
        "retry_backoff_ms": 10,
        "retry_backoff_max_ms": 200,
        "reconnect_backoff_ms": 10,
        "reconnect_backoff_max_ms": 200,
    }
    async with Producer(bootstrap_servers=f"127.0.0.1:{proxy.port}", **{**settings, **config}) as producer:
        await producer.partitions_for(topic)
        stop = asyncio.Event()
        chaos = asyncio.ensure_future(fault(stop, rng))  # type: ignore[operator]
        for i in range(records):
            if i == stream.midway_at and stream.answered_before_midway:
                await asyncio.gather(futures[0], return_exceptions=True)
            key = b"k%02d" % (i % KEYS)
            value = b"%s:%06d" % (key, i)
            futures.append(await producer.send(topic, value, key=key))
            sent.append((key, value))
            if i == stream.midway_at:
                stream.midway.set()
            if i % PACE == PACE - 1:
                await asyncio.sleep(0.02)  # a steady pace (~2.5 s in all), so faults land mid-stream
        stop.set()
        await chaos
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 120)
        metrics = producer.metrics()
    retries, resets = int(metrics["record-retry-total"]), int(metrics["producer-id-reset-total"])
    return Run(sent, outcomes, time.monotonic() - started, proxy.connections_cut, retries, resets)


def check(run: Run, bootstrap: str, topic: str, *, kept_from: int = 0, offsets: bool = False) -> dict[str, int]:
    """``kept_from``: every record from this index on that was acknowledged must be in the log
    (one acknowledged before it may have been lost with a restarted broker's memory).
    ``offsets``: every record acknowledged with an offset is at that offset of its partition."""
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
    if offsets:
        where = {c.value: (c.partition, c.offset) for c in consumed}
        for (_, value), o in zip(run.sent, run.outcomes, strict=True):
            if isinstance(o, RecordMetadata) and o.offset >= 0:
                assert where[value] == (o.partition, o.offset), f"{value!r} acknowledged at {o}, is at {where[value]}"
    return {"acked": len(acked), "consumed": len(values), "duplicates": duplicates, "lost": lost}


def report(fault: str, run: Run, stats: dict[str, int]) -> None:
    """One line per fault for the log (pytest -s): what the run went through."""
    print(
        f"\nchaos({fault}): records={len(run.sent)} acked={stats['acked']} in-log={stats['consumed']} cuts={run.cuts} "
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


async def test_broker_restarted_with_its_data_mid_stream(
    persistent_proxied_broker: tuple[PersistentTansuBroker, FaultProxy], topic: str
) -> None:
    """The idempotence promise against a real broker that keeps its log and its producers'
    sequences across a restart (Tansu on S3 storage): batches the broker wrote but whose answers
    were lost are sent again under the same producer id and sequences, the broker recognises
    them, and every record is in the log once, in order."""
    broker, proxy = persistent_proxied_broker
    # Something acknowledged before the restart, to be found in the log after it: the first record's
    # answer is awaited (on a loaded host Tansu's first writes to S3 took longer than 449 sends).
    stream = Stream(midway_at=KEPT_MIDWAY, answered_before_midway=True)
    at_restart: dict[str, Any] = {}

    async def fault(stop: asyncio.Event, rng: random.Random) -> None:
        # As record KEPT_MIDWAY is queued (a point in the stream, not a time): from now on the
        # broker still handles what it is sent, but the producer hears no answer.
        await stream.midway.wait()
        proxy.mute_answers = True
        # Once the broker has written a batch whose answer was dropped, nothing more reaches it,
        # and once it has answered every request it was sent it is idle: killed then, it dies
        # with every batch it took written whole (its log and its sequence state in step).
        await proxy.until(lambda: proxy.produce_answers_dropped > 0)
        proxy.hold_requests = True
        await proxy.until(proxy.all_answered)
        at_restart["acknowledged"] = [
            i for i, f in enumerate(stream.futures) if f.done() and not f.cancelled() and f.exception() is None
        ]
        at_restart["unacknowledged"] = [i for i, f in enumerate(stream.futures) if not f.done()]
        at_restart["dropped"] = proxy.produce_answers_dropped
        proxy.refuse = True
        at_restart["cut"] = proxy.cut_all()
        pid = broker.pid
        await asyncio.to_thread(broker.restart)  # SIGKILL, then a new process on the same storage
        at_restart["new_process"] = broker.pid != pid
        proxy.refuse = proxy.mute_answers = proxy.hold_requests = False

    # A request timeout that cannot pass while the broker is brought to rest: the producer
    # keeps its connections (the proxy can only count answers on open ones).
    run = await produce_under_faults(
        proxy, topic, fault, seed=4, stream=stream, records=KEPT_RECORDS, request_timeout_ms=30_000
    )
    assert at_restart, "the broker was not restarted: the test proved nothing"
    assert at_restart["new_process"] and at_restart["cut"] > 0
    assert KEPT_MIDWAY in at_restart["unacknowledged"]
    assert at_restart["acknowledged"], "nothing was acknowledged before the restart"
    # Every record acknowledged, and in the log once, in send order per partition, at the offset
    # it was acknowledged with; every future resolved. Those acknowledged before the restart
    # too: the restarted broker kept its log.
    stats = await asyncio.to_thread(check, run, broker.bootstrap, topic, offsets=True)
    report("restart-kept", run, stats)
    failed = [o for o in run.outcomes if isinstance(o, BaseException)]
    assert stats["acked"] == stats["consumed"] == KEPT_RECORDS, failed[:3]
    # The broker had written batches whose answers the producer never got. The producer sent
    # them again after the restart under the same identity (the broker knew it: no new one
    # taken) and the same sequences, and the broker took them as what they were: duplicates,
    # acknowledged without their offsets (Tansu answers DUPLICATE_SEQUENCE_NUMBER), in the log once.
    assert at_restart["dropped"] > 0
    assert run.retries > 0 and run.resets == 0, f"retries={run.retries} resets={run.resets}"
    deduplicated = [i for i, o in enumerate(run.outcomes) if isinstance(o, RecordMetadata) and o.offset < 0]
    assert deduplicated, "no batch was acknowledged as a duplicate: the broker did not recognise a retry"
    assert set(deduplicated) <= set(at_restart["unacknowledged"])

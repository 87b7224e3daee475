"""Cancelling send() and close(): all or nothing, and everything released."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import KafkaError, ProducerClosedError, SendManyError
from aioprod.net.connection import BrokerConnection
from aioprod.producer.sender import Sender
from tests.conftest import Scripted
from tests.fakes.clock import VirtualClock
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.network import MemoryNetwork


@pytest.mark.parametrize("waiting_for", ["nothing", "metadata", "buffer"])
async def test_a_cancelled_send_queued_nothing_or_returned_its_future(scripted: Scripted, waiting_for: str) -> None:
    # Cancel a send() after every number of loop steps it may take, also while it waits for a new
    # topic's metadata or for buffer space: each time, either the caller got the record's future,
    # or the record never reaches the broker.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    options = {"buffer_memory": 4096, "batch_size": 1024} if waiting_for == "buffer" else {}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, **options) as p:
        await p.partitions_for("t")
        returned: list[bytes] = []
        waited = 0
        for steps in range(12):
            topic = "t"
            if waiting_for == "metadata":
                topic = f"new-{steps}"
                cluster.create_topic(topic, 1)
            elif waiting_for == "buffer":
                node.holding = True
                blocker = await p.send("t", b"b" * 3000)  # most of the buffer, until its answer
                returned.append(b"b" * 3000)
            value = b"steps-%d " % steps + b"." * 1500  # with the blocker, more than the buffer
            task = asyncio.ensure_future(p.send(topic, value))
            for _ in range(steps):
                await asyncio.sleep(0)
            waited += not task.done()
            task.cancel()
            node.release()
            try:
                await (await task)
                returned.append(value)
            except asyncio.CancelledError:
                pass
            if waiting_for == "buffer":
                await blocker
        await p.flush()
    values = [v for topic in cluster.topics for v in cluster.partition(topic).values]
    assert sorted(values) == sorted(returned)
    if waiting_for != "nothing":
        assert waited >= 4  # cancelled while it waited, not only before its first step


async def test_close_fails_a_send_waiting_for_metadata_with_producer_closed(scripted: Scripted) -> None:
    cluster = scripted.cluster  # the topic does not exist, so send() waits for it
    p = Producer(bootstrap_servers=cluster.bootstrap, allow_auto_create_topics=False)
    await p.start()
    waiting = asyncio.ensure_future(p.send("missing", b"v"))
    await asyncio.sleep(0.5)
    await p.close()
    with pytest.raises(ProducerClosedError):
        await waiting


def aioprod_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("aioprod-") and not t.done()]


async def test_a_cancelled_close_still_releases_everything(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0)
    await p.start()
    await p.send_and_wait("t", b"warm-up")
    cluster.nodes[1].holding = True  # close() waits for this record's answer
    fut = await p.send("t", b"in flight")
    closing = asyncio.ensure_future(p.close())
    await asyncio.sleep(1)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await p.close()  # a second close() finishes the job
    assert aioprod_tasks() == []
    assert cluster.nodes[1].open_connections == 0
    with pytest.raises(ProducerClosedError) as info:
        await fut
    assert info.value.possibly_persisted is True


async def test_close_with_a_timeout_marks_in_flight_records_possibly_persisted(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        cluster.nodes[1].holding = True
        cluster.stop(2)
        in_flight = await p.send("t", b"in flight", partition=0)
        never_sent = await p.send("t", b"never sent", partition=1)
        await asyncio.sleep(0.1)
        await p.close(timeout=1)
    with pytest.raises(ProducerClosedError) as sent:
        await in_flight
    with pytest.raises(ProducerClosedError) as unsent:
        await never_sent
    assert sent.value.possibly_persisted is True
    assert unsent.value.possibly_persisted is False


async def test_records_a_close_fails_are_logged_for_a_close_nobody_waits_on(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    # A SyncProducer closed at interpreter exit (a confluent-kafka script ported without its
    # final flush()) failed its records within the 5-second bound without a word.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].holding = True
        for _ in range(3):
            await p.send("t", b"unanswered")
        with caplog.at_level(logging.WARNING, logger="aioprod"):
            await p.close(timeout=1)
    assert [r.getMessage() for r in caplog.records if "closed with" in r.getMessage()] == [
        "[aioprod] producer closed with 3 record(s) not acknowledged: they fail with ProducerClosedError"
    ]


async def test_close_ends_an_end_offsets_call_waiting_for_a_connection(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[2])
    p = Producer(bootstrap_servers="127.0.0.1:9091", linger_ms=0)
    await p.start()
    await p.partitions_for("t")
    scripted.network.black_holes.add(("127.0.0.1", 9092))  # connecting to node 2 never completes
    asking = asyncio.ensure_future(p.end_offsets("t"))
    await asyncio.sleep(1)
    await p.close()
    done, _ = await asyncio.wait([asking], timeout=60)
    assert done, "end_offsets() still waits for a connection the closed producer will never make"
    assert isinstance(asking.exception(), KafkaError)


async def test_a_send_many_that_close_interrupts_between_its_runs_still_resolves(scripted: Scripted) -> None:
    # Its bulk path yields after each full batch: runs appended after close() had stopped the
    # sender sat in the accumulator, and the future never resolved.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, batch_size=1024)
    await p.start()
    await p.partitions_for("t")
    many = asyncio.ensure_future(p.send_many("t", [b"x" * 100] * 2000, partition=0))  # ~200 full batches
    await asyncio.sleep(0)  # its first run is queued, and it yields
    await p.close(timeout=0)
    future = await many
    with pytest.raises(KafkaError) as info:
        await future
    assert "the producer is closing" in str(info.value)


async def test_a_send_waiting_for_metadata_when_close_begins_fails_though_the_topic_appears(
    scripted: Scripted,
) -> None:
    # docs/delivery.md: "A send() waiting for metadata when close begins fails with
    # ProducerClosedError". If the topic appeared while close() delivered a slow batch, the send
    # returned a future (its record appended after the sender stopped, then failed).
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1])
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10)
    await p.start()
    await p.send_and_wait("t", b"warm-up")
    cluster.nodes[1].holding = True  # close() waits for the next record's answer
    await p.send("t", b"in flight")
    waiting = asyncio.ensure_future(p.send("late", b"sent before close, waiting for metadata"))
    many = asyncio.ensure_future(p.send_many("late", [b"also waiting"]))
    await asyncio.sleep(0.5)
    closing = asyncio.ensure_future(p.close())
    await asyncio.sleep(0.1)
    cluster.create_topic("late", leaders=[2])  # the topic appears while close() delivers
    await asyncio.sleep(2)
    cluster.nodes[1].release()
    await closing
    for call in (waiting, many):
        with pytest.raises(ProducerClosedError):
            await call


async def test_close_after_a_cancelled_close_of_a_transactional_producer_returns_promptly(
    scripted: Scripted,
) -> None:
    # The cancelled close() released the connections, but the abort it had begun went on asking
    # the closed pool for a connection (a retriable error) until transaction_timeout_ms (60 s):
    # the next close() waited that long, on a healthy cluster.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    loop = asyncio.get_running_loop()
    p = Producer(bootstrap_servers=cluster.bootstrap, transactional_id="tx", linger_ms=0)
    await p.start()
    p.begin_transaction()
    await p.send_and_wait("t", b"in the open transaction")
    closing = asyncio.ensure_future(p.close())
    for _ in range(5):  # close() is aborting the open transaction
        await asyncio.sleep(0)
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    started = loop.time()
    await p.close()
    assert loop.time() - started < 5  # not transaction_timeout_ms


@pytest.mark.parametrize("turns", [1, 5, 22])
async def test_a_cancelled_transactional_start_warns_of_no_transaction(
    scripted: Scripted, caplog: pytest.LogCaptureFixture, turns: int
) -> None:
    # start()'s own close(timeout=0) timed out waiting for the cancelled initialisation and
    # warned "could not abort transaction" where there was none.
    scripted.cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=scripted.cluster.bootstrap, transactional_id="tx")
    starting = asyncio.ensure_future(p.start())
    for _ in range(turns):
        await asyncio.sleep(0)
    starting.cancel()
    with caplog.at_level(logging.WARNING, logger="aioprod"):
        await asyncio.gather(starting, return_exceptions=True)
        await p.close()
    assert "could not abort" not in caplog.text


async def test_close_fails_a_send_waiting_for_metadata_when_it_begins_not_when_it_ends(scripted: Scripted) -> None:
    # The waiting send failed only once close() had delivered everything else: here the held
    # record's delivery timeout (30 s); by default up to 120 s.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, allow_auto_create_topics=False)
    await p.start()
    await p.send_and_wait("t", b"warm-up")
    cluster.nodes[1].holding = True  # close() waits for this record's answer
    held = await p.send("t", b"in flight")
    waiting = asyncio.ensure_future(p.send("missing", b"v"))
    await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    closing = asyncio.ensure_future(p.close())
    with pytest.raises(ProducerClosedError):
        await waiting
    assert loop.time() == started and not closing.done()  # virtual time: at once
    cluster.nodes[1].release()
    await closing
    assert (await held).offset == 1


async def test_close_returns_when_the_last_record_expires(scripted: Scripted) -> None:
    # "None waits for every record's own delivery timeout": the round that expired the last batch
    # went to sleep instead of ending, and close() returned only when something else woke the
    # sender (here a request timing out, 2.8 s later).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, delivery_timeout_ms=3000, request_timeout_ms=2900)
    await p.start()
    await p.send_and_wait("t", b"warm-up")
    cluster.nodes[1].holding = True
    loop = asyncio.get_running_loop()
    started = loop.time()
    future = await p.send("t", b"x")
    await p.close()
    with pytest.raises(KafkaError, match="delivery_timeout_ms"):
        await future
    assert loop.time() - started <= 3.1  # virtual time: the delivery timeout, and a round


@contextlib.contextmanager
def loop_own_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedCluster]:
    """A one-node ScriptedCluster with topic t, in virtual time, on the running loop: the
    ``scripted`` fixture's, for a test that runs its own ``asyncio.run()`` (to end the loop)."""
    clock = VirtualClock(asyncio.get_running_loop()).install()
    network = MemoryNetwork()
    monkeypatch.setattr(asyncio, "open_connection", network.open_connection)
    try:
        cluster = ScriptedCluster(network)
        cluster.create_topic("t", 1)
        yield cluster
    finally:
        clock.uninstall()


def test_a_close_nobody_awaits_cut_off_by_the_loops_end_fails_what_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    # A close() begun where nobody can await it (a done-callback) and still running when
    # asyncio.run() ends is cancelled with the loop's other tasks: the records' futures stayed
    # pending for good and the connections open, without a word.
    futures: list[asyncio.Future[object]] = []

    async def service() -> None:
        with loop_own_cluster(monkeypatch) as cluster:
            producer = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0)
            await producer.start()
            await producer.send_and_wait("t", b"warm-up")
            cluster.nodes[1].holding = True  # the broker stops answering
            futures.extend([await producer.send("t", b"%d" % i) for i in range(10)])
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(producer.close()))
            while producer._closing is None or not aioprod_tasks():
                await asyncio.sleep(0)
            for _ in range(3):  # the close task is under way
                await asyncio.sleep(0)
            assert not producer._closing.done()

    asyncio.run(service())
    assert [f for f in futures if not f.done()] == []
    assert all(isinstance(f.exception(), KafkaError) for f in futures)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_a_keyboard_interrupt_raised_in_the_sender_task_stops_the_program(
    monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    # Ctrl-C lands in whatever frame runs (the second one under asyncio.run(); any, under
    # run_forever()), often the sender's. It swallowed it: the producer failed, the program went on.
    futures: list[asyncio.Future[object]] = []
    armed = False
    run_once = Sender.run_once

    def interrupted(self: Sender, now: float) -> float:
        nonlocal armed
        if armed:
            armed = False
            raise interrupt()
        return run_once(self, now)

    monkeypatch.setattr(Sender, "run_once", interrupted)

    async def service() -> None:
        nonlocal armed
        with loop_own_cluster(monkeypatch) as cluster:
            async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=60_000) as producer:
                await producer.send_and_wait("t", b"warm-up")
                futures.append(await producer.send("t", b"queued"))
                armed = True
                producer._wakeup()
                await asyncio.sleep(3600)  # virtual time: the service runs on until interrupted

    with pytest.raises(interrupt):
        asyncio.run(service())
    assert isinstance(futures[0].exception(), KafkaError)  # not left pending


def _interrupted_once_in_the_reader(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str
) -> tuple[float, list[asyncio.Future[object]], list[bytes | None]]:
    """A KeyboardInterrupt raised once by ``owner.name`` (a fake fault) while ten records are
    answered, then close(), as an application that caught it does: how long close() took (virtual
    time), the records' futures, and the values the partition holds."""
    armed = False
    original = getattr(owner, name)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        nonlocal armed
        if armed:
            armed = False
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)
    loop = asyncio.new_event_loop()
    producer: Producer | None = None
    futures: list[asyncio.Future[object]] = []
    values: list[bytes | None] = []

    async def service() -> None:
        nonlocal armed, producer
        with loop_own_cluster(monkeypatch) as cluster:
            producer = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, request_timeout_ms=3_600_000)
            await producer.start()
            await producer.send_and_wait("t", b"warm-up")
            armed = True
            futures.extend([await producer.send("t", b"%d" % i) for i in range(10)])
            try:
                await producer.flush()
            finally:
                values.extend(cluster.partition("t").values)

    main = loop.create_task(service())
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main)
        assert producer is not None
        started = loop.time()
        loop.run_until_complete(producer.close())
        took = loop.time() - started
    finally:
        main.cancel()
        loop.run_until_complete(asyncio.gather(main, return_exceptions=True))
        loop.close()
        gc.collect()  # the interrupted reader's task, here, not inside a later import's compile
    return took, futures, values


def test_a_keyboard_interrupt_raised_in_a_connections_reader_closes_that_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The interrupt ended the reader task and left its connection open: the records on it, and
    # the ones sent on it next, waited for request_timeout_ms before their retry (close() too).
    took, futures, values = _interrupted_once_in_the_reader(monkeypatch, BrokerConnection, "_complete")
    assert took < 60  # virtual time: no request waited out request_timeout_ms
    assert all(f.done() and f.exception() is None for f in futures)
    assert sorted(values) == sorted([b"warm-up"] + [b"%d" % i for i in range(10)])  # each once


@pytest.mark.parametrize("closed", [False, True])
def test_a_producer_never_closed_is_a_resource_warning_at_the_loops_end(
    monkeypatch: pytest.MonkeyPatch, closed: bool
) -> None:
    # Nothing said so when no record was left: a producer made per request and never closed
    # kept its connections for the loop's life, silently.
    async def service() -> None:
        with loop_own_cluster(monkeypatch) as cluster:
            producer = Producer(bootstrap_servers=cluster.bootstrap, client_id="per-request")
            await producer.start()
            await producer.send_and_wait("t", b"acknowledged")
            if closed:
                await producer.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(service())
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    expected = [] if closed else ["unclosed aioprod Producer 'per-request': its event loop shut down without close()"]
    assert unclosed == expected


def test_an_unclosed_producer_made_an_error_by_w_error_is_still_cleaned_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under -W error::ResourceWarning (a test suite's filterwarnings = error), the warning raised
    # before the queued records were failed and the connections closed: pending for good.
    futures: list[asyncio.Future[object]] = []
    producers: list[Producer] = []

    async def service() -> None:
        with loop_own_cluster(monkeypatch) as cluster:
            producer = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=60_000)
            producers.append(producer)
            await producer.start()
            await producer.send_and_wait("t", b"warm")
            futures.extend([await producer.send("t", b"queued %d" % i) for i in range(3)])

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        asyncio.run(service())
    assert [f for f in futures if not f.done()] == []
    assert producers[0]._pool.connections() == []


@pytest.mark.parametrize("waits_in", ["sleep", "wait_for", "child_task", "taskgroup"])
def test_async_with_in_a_task_the_loops_end_cancels_is_not_called_unclosed(
    monkeypatch: pytest.MonkeyPatch, waits_in: str
) -> None:
    # Its close() ran (the `async with`), cut short by the loop's end before the sender was told;
    # a step later or several (a TaskGroup cancels and waits for its children first).
    closed: list[bool] = []

    async def service() -> None:
        with loop_own_cluster(monkeypatch) as cluster:

            async def worker() -> None:
                p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100)
                try:
                    async with p:
                        await p.send_and_wait("t", b"x")
                        queue: asyncio.Queue[int] = asyncio.Queue()
                        if waits_in == "sleep":
                            await asyncio.sleep(3600)
                        elif waits_in == "wait_for":
                            await asyncio.wait_for(queue.get(), 3600)
                        elif waits_in == "child_task":
                            await asyncio.create_task(queue.get())
                        else:
                            async with asyncio.TaskGroup() as group:
                                group.create_task(queue.get())
                finally:
                    closed.append(p._state == "closed")

            asyncio.create_task(worker())  # noqa: RUF006 (cancelled by asyncio.run()'s end)
            await asyncio.sleep(1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(service())
    assert closed == [True]  # close() did run, from __aexit__
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.parametrize("path", ["keyed", "bulk"])
async def test_a_close_while_send_many_yields_after_its_last_record_fails_none(scripted: Scripted, path: str) -> None:
    # The check after the yield failed "the rest", none: the call raised SendManyError("0 of
    # 4096 records failed"), all of them written (a caller retrying on it wrote them twice).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=cluster.bootstrap, batch_size=1_000_000, linger_ms=5)
    await p.start()
    await p.partitions_for("t")
    count = 4096  # the keyed path yields after its 4096th record: the last one

    async def close_soon() -> None:
        await asyncio.sleep(0)  # runs in send_many's yield after its last record
        await p.close()  # (another task closes the producer, as a shutdown handler does)

    closer = asyncio.ensure_future(close_soon())
    await asyncio.sleep(0)  # (close_soon waits at its sleep(0) now)
    keys = [b"k"] * count if path == "keyed" else None
    future = await p.send_many("t", [b"x"] * count, keys=keys)
    await closer
    assert cluster.partition("t").end_offset == count  # every record was written...
    try:
        results = await future
    except SendManyError as exc:
        failed = sum(isinstance(r, BaseException) for r in exc.results)
        raise AssertionError(f"{exc} ({failed} failed of {len(exc.results)})") from None
    assert len(results) == count  # ...and the call must say so


def test_a_keyboard_interrupt_raised_while_a_reader_decodes_an_answer_fails_that_request_as_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Raised after the reader took the request off the in-flight queue (and cancelled its timer),
    # inside decode_response: close() failed only what was still in flight, and that request's
    # batch (and the one queued behind it) stayed pending until delivery_timeout_ms, then failed
    # with DeliveryTimeoutError though the broker had written them.
    from aioprod.net import connection as connection_module

    _, futures, values = _interrupted_once_in_the_reader(monkeypatch, connection_module, "decode_response")
    assert all(f.done() and f.exception() is None for f in futures), [f.exception() for f in futures]
    assert sorted(values) == sorted([b"warm-up"] + [b"%d" % i for i in range(10)])  # each once

"""Bad arguments are refused at once, naming the problem, and the producer keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import threading
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import KafkaTimeoutError, PartitionNotFoundError, ProducerClosedError, RecordTooLargeError
from aioprod.producer.transactions import PreparedTransaction
from tests.brokers import TansuBroker, refused_port
from tests.conftest import Scripted
from tests.readback import read_topic

pytestmark = pytest.mark.integration


@pytest.fixture
async def producer(tansu_broker: TansuBroker) -> Any:
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, max_request_size=10_000) as p:
        yield p


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"value": "text"}, TypeError, "value must be bytes or None, got str"),
        ({"value": b"v", "key": 42}, TypeError, "key must be bytes or None, got int"),
        ({"value": b"v", "headers": [("h", "text")]}, TypeError, "header 'h' value must be bytes or None"),
        ({"value": b"v", "headers": [(1, b"x")]}, TypeError, "header name must be a str"),
        ({"value": b"v", "headers": "h=1"}, TypeError, "headers must be a list of"),
        ({"value": b"v", "headers": [("only-name",)]}, TypeError, "each header must be a (str, bytes | None) pair"),
        ({"value": b"v", "partition": -1}, ValueError, "partition must be >= 0, got -1"),
        ({"value": b"v", "partition": "0"}, TypeError, "partition must be an int or None"),
        ({"value": b"v", "timestamp_ms": -5}, ValueError, "timestamp_ms must be >= 0"),
        ({"value": b"v", "timestamp_ms": 1.5}, TypeError, "timestamp_ms must be an int"),
        ({"value": b"x" * 20_000}, RecordTooLargeError, "larger than max_request_size (10000)"),
    ],
)
async def test_bad_record_is_refused_and_producer_keeps_working(
    producer: Producer, topic: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        await producer.send(topic, **kwargs)
    assert message in str(info.value)
    md = await producer.send_and_wait(topic, b"still fine")
    assert md.offset >= 0


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("", ValueError, "topic name is empty"),
        ("a" * 250, ValueError, "limit is 249"),
        ("bad topic!", ValueError, "illegal topic name 'bad topic!'"),
        ("..", ValueError, "illegal topic name"),
        (None, TypeError, "topic must be a str, got NoneType"),
        # Unhashable: "unhashable type: 'list'", from the caches send() looks in first.
        (["t"], TypeError, "topic must be a str, got list"),
        (bytearray(b"t"), TypeError, "topic must be a str, got bytearray"),
    ],
)
async def test_bad_topic_names(producer: Producer, name: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=None) as info:
        await producer.send(name, b"v")
    assert message in str(info.value)


async def test_subclasses_of_str_and_bytes_are_names_and_bytes(tansu_broker: TansuBroker, topic: str) -> None:
    # A StrEnum of topic names is common in services; a bytes subclass is bytes. The first
    # send to a topic refused both (a later one took the StrEnum, from a cache).
    class Key(bytes):
        pass

    topics = enum.StrEnum("Topics", {"EVENTS": topic})
    async with Producer(bootstrap_servers=tansu_broker.bootstrap) as p:
        first = await p.send_and_wait(topics.EVENTS, Key(b"v1"), key=Key(b"k"), headers=[(topics.EVENTS, Key(b"h"))])
        await (await p.send_many(topics.EVENTS, [Key(b"v2")], keys=[Key(b"k")]))
    assert type(first.topic) is str and first.topic == topic
    assert [(r.key, r.value, r.headers) for r in read_topic(tansu_broker.bootstrap, topic)] == [
        (b"k", b"v1", ((topic, b"h"),)),
        (b"k", b"v2", ()),
    ]


async def test_partition_beyond_the_topic_says_the_count(producer: Producer, topic: str) -> None:
    count = len(await producer.partitions_for(topic))
    with pytest.raises(PartitionNotFoundError) as info:
        await producer.send(topic, b"v", partition=count + 3)
    assert f"has {count} partitions" in str(info.value)
    assert (info.value.topic, info.value.partition, info.value.partition_count) == (topic, count + 3, count)


async def test_a_serializer_returning_other_than_bytes_is_named(tansu_broker: TansuBroker, topic: str) -> None:
    bad = Producer(bootstrap_servers=tansu_broker.bootstrap, value_serializer=len)
    async with bad:
        with pytest.raises(TypeError, match="value_serializer returned int"):
            await bad.send(topic, "abc")


async def test_send_before_start_and_after_close(tansu_broker: TansuBroker, topic: str) -> None:
    p = Producer(bootstrap_servers=tansu_broker.bootstrap)
    with pytest.raises(ProducerClosedError, match="not started"):
        await p.send(topic, b"v")
    await p.start()
    await p.send_and_wait(topic, b"v")
    await p.close()
    await p.close()  # idempotent
    with pytest.raises(ProducerClosedError, match="closed"):
        await p.send(topic, b"v")


async def test_unreachable_bootstrap_fails_within_max_block(topic: str) -> None:
    port = refused_port()
    async with Producer(bootstrap_servers=f"127.0.0.1:{port}", max_block_ms=300) as p:
        with pytest.raises(KafkaTimeoutError) as info:
            await asyncio.wait_for(p.send(topic, b"v"), 10)  # the 10 s guard only catches a hang
    assert topic in str(info.value) and "no broker reachable" in str(info.value)


async def test_a_transactional_producer_that_reaches_no_broker_says_why() -> None:
    producer = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", transactional_id="tx", max_block_ms=300)
    with pytest.raises(KafkaTimeoutError) as info:
        await asyncio.wait_for(producer.start(), 10)  # the 10 s guard only catches a hang
    message = str(info.value)
    assert "could not initialise within max_block_ms (300 ms)" in message
    assert "(the last answer: connecting to broker -1 at 127.0.0.1:" in message and "[Errno 111]" in message


async def test_close_from_a_delivery_callback(tansu_broker: TansuBroker, topic: str) -> None:
    p = Producer(bootstrap_servers=tansu_broker.bootstrap)
    await p.start()
    fut = await p.send(topic, b"v")
    closing: list[asyncio.Task[None]] = []
    fut.add_done_callback(lambda _f: closing.append(asyncio.ensure_future(p.close())))
    await fut
    await asyncio.gather(*closing)
    with pytest.raises(ProducerClosedError, match="is closed"):  # close() ran to its end
        await p.send(topic, b"later")
    assert p.metrics()["connection-count"] == 0


def test_a_producer_used_on_another_event_loop_says_so() -> None:
    # Its tasks and connections live on the loop that started it: on another, a send waited
    # out max_block_ms and failed with "topic not present in metadata", and close() with
    # "Event loop is closed".
    producer = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", max_block_ms=60_000)
    asyncio.run(producer.start())
    calls = [
        lambda: producer.send("t", b"v"),
        lambda: producer.send_many("t", [b"v"]),
        lambda: producer.partitions_for("t"),
        lambda: producer.commit_prepared_transaction(PreparedTransaction("t", 1, 0)),  # it waited out max_block_ms
        producer.flush,
        producer.close,
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="started on another event loop"):
            asyncio.run(call())


def test_closing_a_closed_producer_is_a_no_op_from_any_loop() -> None:
    producer = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")

    async def start_and_close() -> None:
        await producer.start()
        await producer.close()

    asyncio.run(start_and_close())
    asyncio.run(producer.close())  # a fixture's teardown, say, on a loop of its own


@contextlib.contextmanager
def running_in_a_thread(loop: asyncio.AbstractEventLoop, producer: Producer) -> Iterator[Callable[[Any], Any]]:
    """``loop`` run by a thread of its own, and how to run a coroutine there; on leaving,
    ``producer`` is closed there, and the loop stopped and closed."""
    thread = threading.Thread(target=loop.run_forever)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    try:
        yield run
    finally:
        run(producer.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_a_transactional_call_from_another_thread_while_the_loop_runs_says_so() -> None:
    loop = asyncio.new_event_loop()
    producer = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")
    with running_in_a_thread(loop, producer) as run:
        run(producer.start())
        with pytest.raises(RuntimeError, match="started on another event loop"):
            producer.begin_transaction()  # synchronous, from a thread the loop is not running in


@pytest.mark.parametrize("lane", [True, False], ids=["send-lane", "python-path"])
def test_a_send_of_a_known_topic_from_another_threads_loop_says_so(
    tansu_broker: TansuBroker, topic: str, lane: bool
) -> None:
    # A send that need not wait (its topic known) skipped the loop check: the record went into
    # the accumulator from the wrong thread, bound to the caller's loop, and was lost; flush()
    # and close() on the producer's own loop then hung.
    loop = asyncio.new_event_loop()
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap)
    producer._lanes_on = producer._lanes_on and lane
    with running_in_a_thread(loop, producer) as run:
        run(producer.start())
        run(producer.send_and_wait(topic, b"known"))
        with pytest.raises(RuntimeError, match="started on another event loop"):
            asyncio.run(producer.send(topic, b"from another loop"))  # type: ignore[arg-type]
        run(producer.flush())
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known"]


def started_on_a_loop_of_its_own(
    bootstrap: str, topic: str, loop_kind: str = "asyncio", lane: bool = True
) -> tuple[asyncio.AbstractEventLoop, Producer]:
    """A producer started on a new loop (not running now) that has written b"known" to ``topic``."""
    import uvloop

    loop = asyncio.new_event_loop() if loop_kind == "asyncio" else uvloop.new_event_loop()
    producer = Producer(bootstrap_servers=bootstrap)
    loop.run_until_complete(producer.start())
    producer._lanes_on = producer._lanes_on and lane
    loop.run_until_complete(producer.send_and_wait(topic, b"known"))
    return loop, producer


@pytest.mark.parametrize("lane", [True, False], ids=["send-lane", "python-path"])
def test_a_send_from_another_loop_of_the_same_thread_says_so(tansu_broker: TansuBroker, topic: str, lane: bool) -> None:
    # The producer's loop idle, not closed (run_until_complete), and asyncio.run() in the same
    # thread: the record's batch was bound to the caller's loop, and flush() then never returned.
    loop, producer = started_on_a_loop_of_its_own(tansu_broker.bootstrap, topic, lane=lane)
    try:
        with pytest.raises(RuntimeError, match="started on another event loop"):
            asyncio.run(producer.send(topic, b"from another loop"))  # type: ignore[arg-type]
        loop.run_until_complete(asyncio.wait_for(producer.flush(), 30))  # the guard only catches a hang
    finally:
        loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
        loop.close()
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known"]


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("lane", [True, False], ids=["send-lane", "python-path"])
def test_a_producer_follows_its_loop_into_another_thread(
    tansu_broker: TansuBroker, topic: str, lane: bool, loop_kind: str
) -> None:
    # Started in the main thread, then the loop handed to a thread (asyncio allows it): every
    # send() there was refused as "the producer is started; no more records are accepted".
    loop, producer = started_on_a_loop_of_its_own(tansu_broker.bootstrap, topic, loop_kind, lane)
    with running_in_a_thread(loop, producer) as run:
        assert run(producer.send_and_wait(topic, b"from the loop's thread")).offset == 1


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("lane", [True, False], ids=["send-lane", "python-path"])
def test_send_and_wait_from_another_loop_queues_nothing(
    tansu_broker: TansuBroker, topic: str, lane: bool, loop_kind: str
) -> None:
    # On uvloop, send() from another loop of the same thread was taken; the wait then failed
    # with asyncio's "attached to a different loop", after the record was queued: a caller
    # retrying on that RuntimeError wrote it twice.
    loop, producer = started_on_a_loop_of_its_own(tansu_broker.bootstrap, topic, loop_kind, lane)
    try:
        with pytest.raises(RuntimeError, match="started on another event loop"):
            asyncio.run(producer.send_and_wait(topic, b"from another loop"))  # type: ignore[arg-type]
    finally:
        loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
        loop.close()
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # its tasks die with the loop
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_send_after_the_producers_loop_closed_is_refused(
    tansu_broker: TansuBroker, topic: str, loop_kind: str
) -> None:
    # loop.close() without producer.close(): on uvloop the first send queued its record, then
    # raised "Event loop is closed"; the next was taken, its future never to settle.
    loop, producer = started_on_a_loop_of_its_own(tansu_broker.bootstrap, topic, loop_kind)
    loop.close()

    async def two_sends() -> None:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="started on another event loop"):
                await producer.send(topic, b"after its loop closed")

    asyncio.run(two_sends())
    producer = None  # type: ignore[assignment]
    del loop
    gc.collect()  # what the closed loop left, collected here rather than in a later test


def test_a_send_from_a_thread_running_no_asyncio_loop_says_so(tansu_broker: TansuBroker, topic: str) -> None:
    # trio's, say: it got asyncio's bare "no running event loop".
    loop, producer = started_on_a_loop_of_its_own(tansu_broker.bootstrap, topic)
    with running_in_a_thread(loop, producer):
        send = producer.send(topic, b"no asyncio loop here")
        with pytest.raises(RuntimeError, match="started on another event loop"):
            send.send(None)  # driven by hand, as another framework's loop would


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_send_from_the_thread_a_loop_moved_away_from_is_refused(
    tansu_broker: TansuBroker, topic: str, loop_kind: str
) -> None:
    # On uvloop (3.11), checked by the thread of the last send, it was taken; awaiting its future
    # then raised on the caller's loop though the record was delivered: a retry wrote it twice.
    loop, producer = started_on_a_loop_of_its_own(tansu_broker.bootstrap, topic, loop_kind)
    with running_in_a_thread(loop, producer) as run:
        with pytest.raises(RuntimeError, match="started on another event loop"):
            asyncio.run(producer.send(topic, b"from the old thread"))  # type: ignore[arg-type]
        run(producer.flush())
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known"]


def test_a_loop_that_ends_without_close_says_what_it_dropped(
    tansu_broker: TansuBroker, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The records send() accepted failed with an error nobody read, without a log line, and the
    # producer's connections were left open.
    import warnings

    async def service() -> None:
        producer = Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=60_000)
        await producer.start()
        await producer.send(topic, b"warm")
        await producer.flush()  # sent at once, not after its linger
        for i in range(10):
            await producer.send(topic, b"queued %d" % i)
        # ... and asyncio.run() returns: no close()

    gc.collect()  # earlier tests' garbage is not this test's
    with caplog.at_level("WARNING", logger="aioprod"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(service())
        gc.collect()
    assert any("without producer.close(): 10 record(s) not acknowledged" in r.getMessage() for r in caplog.records)
    # The producer's own "unclosed" warning, and no unclosed socket or transport: its connections
    # were closed.
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == [
        "unclosed aioprod Producer 'aioprod': its event loop shut down without close()"
    ]


@pytest.mark.parametrize("offsets", [[("in", 0)], None, 5])
async def test_offsets_that_are_not_a_mapping_are_a_type_error(tansu_broker: TansuBroker, offsets: object) -> None:
    # confluent-kafka's form, consumer.position(consumer.assignment()), is a list: AttributeError.
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=f"offsets-{offsets!r}") as p:
        p.begin_transaction()
        with pytest.raises(TypeError, match="offsets must be a mapping of TopicPartition"):
            await p.send_offsets_to_transaction(offsets, "group")  # type: ignore[arg-type]
        await p.abort_transaction()


def _picky(topic: str, key: bytes | None, partitions: object) -> int:
    if key == b"bad":
        raise LookupError("no partition for this key")
    return 0


async def test_a_raising_partitioner_in_send_many_gives_back_the_buffer_memory(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, partitioner=_picky, buffer_memory=10_000, max_block_ms=1_000
    ) as p:
        await p.partitions_for("t")
        for _ in range(200):
            with pytest.raises(LookupError):
                await p.send_many("t", [b"v"], keys=[b"bad"])
        meta = await p.send_and_wait("t", b"still fine", key=b"good")
        assert meta.offset == 0


async def test_a_send_many_whose_partitioner_refuses_a_record_sends_none(scripted: Scripted) -> None:
    # The partitioner was asked record by record while they were queued: the records before
    # the refused one were delivered, though send_many raised ("a bad one raises with nothing
    # sent"), and a retry wrote them twice.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, partitioner=_picky) as p:
        await p.partitions_for("t")
        with pytest.raises(LookupError):
            await p.send_many("t", [b"a", b"b", b"c"], keys=[b"k1", b"k2", b"bad"])
        await p.flush()
    assert cluster.partition("t", 0).values == []


@pytest.mark.parametrize("answer", [-1, 7, "1", True])
@pytest.mark.parametrize("many", [False, True])
async def test_a_user_partitioners_answer_outside_the_topic_is_a_clear_error(
    scripted: Scripted, answer: object, many: bool
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", [1, 1, 1])
    async with Producer(bootstrap_servers=cluster.bootstrap, partitioner=lambda t, k, parts: answer) as p:
        await p.partitions_for("t")
        with pytest.raises(
            ValueError, match=f"the partitioner returned {answer!r} for topic 't', which has partitions 0-2"
        ):
            if many:
                await p.send_many("t", [b"v"], keys=[b"k"])
            else:
                await p.send("t", b"v", key=b"k")
    assert cluster.partition("t", 0).values + cluster.partition("t", 1).values + cluster.partition("t", 2).values == []


@pytest.mark.parametrize(("values", "error"), [([bytes(20_000)], RecordTooLargeError), (["text"], TypeError)])
async def test_send_many_refuses_bad_records_before_waiting_for_the_topic(
    scripted: Scripted, values: list[object], error: type[Exception]
) -> None:
    scripted.cluster.create_topic("other", 1)
    loop = asyncio.get_running_loop()  # virtual time
    async with Producer(
        bootstrap_servers=scripted.cluster.bootstrap, max_request_size=10_000, max_block_ms=30_000
    ) as p:
        await p.partitions_for("other")
        started = loop.time()
        with pytest.raises(error):
            await p.send_many("missing", values)
        assert loop.time() == started


async def test_a_record_whose_batch_would_pass_max_request_size_is_refused_by_send(scripted: Scripted) -> None:
    scripted.cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap, max_request_size=10_000) as p:
        await p.partitions_for("t")
        with pytest.raises(RecordTooLargeError, match="is larger than max_request_size"):
            await p.send("t", bytes(10_000 - 64))
        with pytest.raises(RecordTooLargeError, match="is larger than max_request_size"):
            await p.send_many("t", [bytes(10_000 - 64)])


def test_a_producer_whose_loop_ended_says_so_on_the_next_loop(tansu_broker: TansuBroker, topic: str) -> None:
    """Used again in a second asyncio.run() without close(), for a topic it already knows: the
    send once waited forever for a sender the first loop had cancelled."""
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap)

    async def first() -> None:
        await producer.start()
        await producer.send_and_wait(topic, b"1")

    async def second() -> None:
        await asyncio.wait_for(producer.send_and_wait(topic, b"2"), 60)  # a guard against the hang only

    asyncio.run(first())
    with pytest.raises(RuntimeError, match="started on another event loop"):
        asyncio.run(second())


class IntLike:
    """As numpy.int64: not an int, but an index (``__index__``)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize("many", [False, True])
async def test_a_user_partitioners_int_like_answer_is_a_partition(scripted: Scripted, many: bool) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", [1, 1, 1])
    async with Producer(bootstrap_servers=cluster.bootstrap, partitioner=lambda t, k, parts: IntLike(2)) as p:
        if many:
            results = await (await p.send_many("t", [b"v"], keys=[b"k"]))
            assert results[0].partition == 2
        else:
            assert (await p.send_and_wait("t", b"v", key=b"k")).partition == 2


def test_a_closed_producer_says_closed_on_the_next_loop() -> None:
    producer = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")

    async def first() -> None:
        await producer.start()
        await producer.close()

    async def second() -> None:
        await producer.send("t", b"x")

    asyncio.run(first())
    with pytest.raises(ProducerClosedError):
        asyncio.run(second())


async def test_send_many_takes_keys_and_headers_as_it_takes_values() -> None:
    async with Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", max_block_ms=200) as p:
        with pytest.raises(TypeError, match="keys must be a sequence parallel to values"):
            await p.send_many("t", [b"a"], keys=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="headers must be a sequence parallel to values"):
            await p.send_many("t", [b"a"], headers=5)  # type: ignore[arg-type]
        with pytest.raises(KafkaTimeoutError):  # past the argument checks: then no broker
            await p.send_many("t", [b"a"], keys=(k for k in [b"k"]))


@pytest.mark.parametrize("timeout", ["5", b"5", [5], True, float("nan")])
async def test_a_bad_close_or_flush_timeout_is_refused_by_name_and_the_producer_still_closes(timeout: Any) -> None:
    # close("5") raised "unsupported operand type(s) for +" after the producer was already
    # closing: no later close() could close it, and its tasks ran on.
    p = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")
    await p.start()
    with pytest.raises((TypeError, ValueError), match=r"flush\(\) timeout must be a number of seconds or None"):
        await p.flush(timeout)
    with pytest.raises((TypeError, ValueError), match=r"close\(\) timeout must be a number of seconds or None"):
        await p.close(timeout)
    await p.close(0)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("aioprod")]


async def test_a_timeout_may_be_any_real_number() -> None:
    # check_timeout took int and float only: numpy's numbers (a Real, as Fraction is) were refused.
    p = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")
    await p.start()
    await p.flush(Fraction(1, 2))
    await p.close(Fraction(0))

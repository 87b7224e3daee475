"""SyncProducer: the blocking facade, from plain threads, against real brokers."""

from __future__ import annotations

import asyncio
import collections.abc
import concurrent.futures
import contextlib
import gc
import inspect
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any, TypeVar

import pytest

from aioprod import Producer, RecordMetadata, SyncProducer, TopicPartition, sync
from aioprod.errors import (
    ConfigError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    ProducerFatalError,
    RecordTooLargeError,
    SendManyError,
)
from aioprod.sync import _Delivery
from tests.brokers import TansuBroker, free_port, refused_port, tansu
from tests.chaos.proxy import FaultProxy
from tests.readback import read_committed_from_markers, read_topic

pytestmark = pytest.mark.integration

T = TypeVar("T")


def producer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aioprod-sync-producer")]


@pytest.fixture(autouse=True)
def no_leftover_threads() -> Iterator[None]:
    """Every test must leave no producer thread (and so no event loop) behind."""
    yield
    deadline = time.monotonic() + 10
    while producer_threads():
        if time.monotonic() > deadline:
            raise AssertionError(f"producer threads still running: {producer_threads()}")
        time.sleep(0.02)


def test_send_returns_a_concurrent_future(tansu_broker: TansuBroker, topic: str) -> None:
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        future = producer.send(topic, b"v1", b"k1", headers=[("h", b"x"), ("n", None)], timestamp_ms=1_700_000_000_000)
        assert isinstance(future, concurrent.futures.Future)
        metadata = future.result(30)
        assert isinstance(metadata, RecordMetadata)
        assert (metadata.topic, metadata.offset, metadata.timestamp) == (topic, 0, 1_700_000_000_000)
        assert not future.cancel()  # a queued record cannot be withdrawn
        again = producer.send_and_wait(topic, b"v2", b"k1")
        assert (again.partition, again.offset) == (metadata.partition, 1)
        assert producer.partitions_for(topic) == list(range(len(producer.partitions_for(topic))))
        assert producer.end_offsets(topic)[metadata.partition] == 2
        assert sorted(producer.cluster().topics[topic].partitions) == producer.partitions_for(topic)
    records = read_topic(tansu_broker.bootstrap, topic)
    assert [(r.key, r.value, r.headers) for r in records] == [
        (b"k1", b"v1", (("h", b"x"), ("n", None))),
        (b"k1", b"v2", ()),
    ]


def test_send_many_and_flush(tansu_broker: TansuBroker, topic: str) -> None:
    values = [b"m%d" % i for i in range(1000)]
    with SyncProducer(
        bootstrap_servers=tansu_broker.bootstrap, linger_ms=600_000, delivery_timeout_ms=700_000
    ) as producer:
        future = producer.send_many(topic, values, keys=[b"k%d" % (i % 7) for i in range(1000)])
        producer.flush(5)  # had it waited for the 10-minute linger: KafkaTimeoutError
        assert future.done()
        results = future.result()
        assert len(results) == 1000 and all(isinstance(r, RecordMetadata) for r in results)
    assert sorted(r.value or b"" for r in read_topic(tansu_broker.bootstrap, topic)) == sorted(values)


def test_many_threads_share_one_producer(tansu_broker: TansuBroker, topic: str) -> None:
    threads, per_thread = 8, 300
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:

        def work(t: int) -> list[RecordMetadata]:
            futures = [producer.send(topic, b"t%d-%d" % (t, i), b"t%d" % t) for i in range(per_thread)]
            return [f.result(60) for f in futures]

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(work, range(threads)))
    # Each thread's records keep their order (same key, same partition, rising offsets).
    for per in results:
        assert len({m.partition for m in per}) == 1
        assert [m.offset for m in per] == sorted(m.offset for m in per)
    got = Counter(r.value for r in read_topic(tansu_broker.bootstrap, topic))
    assert got == Counter(b"t%d-%d" % (t, i) for t in range(threads) for i in range(per_thread))


def test_errors_are_the_aioprod_exceptions(tansu_broker: TansuBroker, topic: str) -> None:
    with pytest.raises(ConfigError, match="linger_ms"):
        SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=-1)
    assert producer_threads() == []  # a bad configuration starts no thread
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, max_request_size=10_000) as producer:
        with pytest.raises(TypeError, match="value must be bytes"):
            producer.send(topic, "text")
        with pytest.raises(ValueError, match="illegal topic name"):
            producer.send("bad topic", b"x")
        with pytest.raises(RecordTooLargeError):
            producer.send(topic, b"x" * 20_000)
        with pytest.raises(ValueError, match="partition 99 does not exist"):
            producer.send_and_wait(topic, b"x", partition=99)
        # send_many: a bad record raises at once, here in the calling thread.
        with pytest.raises(TypeError):
            producer.send_many(topic, [b"ok", 42])
        assert producer.send_and_wait(topic, b"still usable").topic == topic
    with pytest.raises(ProducerClosedError):
        producer.send(topic, b"after close")
    with pytest.raises(ProducerClosedError):
        producer.submit(_noop)


async def _noop(_producer: Any) -> None:
    return None


def test_delivery_failures_arrive_through_the_future(topic: str) -> None:
    with tansu() as broker:
        producer = SyncProducer(
            bootstrap_servers=broker.bootstrap, request_timeout_ms=500, delivery_timeout_ms=1500, linger_ms=0
        )
        try:
            producer.send_and_wait(topic, b"warm-up")  # metadata is known from here on
            broker.stop()
            single = producer.send(topic, b"lost")
            many = producer.send_many(topic, [b"lost-1", b"lost-2"])
            with pytest.raises(KafkaError) as info:
                single.result(30)
            assert not isinstance(info.value, SendManyError)
            with pytest.raises(SendManyError) as many_info:
                many.result(30)
            assert len(many_info.value.results) == 2
            assert all(isinstance(r, KafkaError) for r in many_info.value.results)
        finally:
            producer.close(2)


def test_waits_are_bounded(topic: str) -> None:
    unreachable = f"127.0.0.1:{refused_port()}"
    with SyncProducer(bootstrap_servers=unreachable, max_block_ms=300) as producer, pytest.raises(KafkaTimeoutError):
        producer.send(topic, b"x")
    with tansu() as broker:
        producer = SyncProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000, linger_ms=0)
        producer.send_and_wait(topic, b"warm-up")
        broker.stop()
        pending = producer.send(topic, b"never acknowledged")
        with pytest.raises(KafkaTimeoutError):
            producer.flush(0.3)
        with pytest.raises(KafkaTimeoutError, match="gave up waiting"):
            producer.send_and_wait(topic, b"neither", timeout=0.3)
        producer.close(0.3)  # pending records fail instead of holding close up
        assert pending.done()
        with pytest.raises(ProducerClosedError):
            pending.result(0)


def test_close_is_idempotent_and_thread_safe(tansu_broker: TansuBroker, topic: str) -> None:
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=200)
    futures = [producer.send(topic, b"%d" % i) for i in range(100)]
    assert not producer.closed
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: producer.close(), range(4)))
    assert producer.closed
    assert "closed" in repr(producer)
    producer.close()
    producer.flush()  # nothing to do once closed
    assert all(f.result(0).topic == topic for f in futures)
    # Close delivered what was queued: each record is in the log once, where its future says.
    log = read_topic(tansu_broker.bootstrap, topic)
    assert sorted((r.partition, r.offset, r.value) for r in log) == sorted(
        (m.partition, m.offset, b"%d" % i) for i, m in enumerate(f.result(0) for f in futures)
    )


def test_a_thread_that_reuses_the_ended_loop_threads_id_may_still_call_close(tansu_broker: TansuBroker) -> None:
    # Once the producer's loop thread has ended, the system may give its id to a new thread
    # (glibc does at once); such a thread is not the loop thread. Seen in CI as a close() from
    # a thread pool refused with "cannot be called from its own thread".
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap)
    producer.close()
    ended = producer._thread
    assert not ended.is_alive()
    outcomes: list[BaseException | None] = []
    release = threading.Event()

    def close_if_id_reused() -> None:
        if threading.get_ident() != ended.ident:
            release.wait()
            return
        try:
            producer.close()
            producer.flush()
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)

    # Until the system hands the ended thread's id out again. glibc gives a new thread the stack
    # (and id) freed last: a thread that ended after the loop thread would be handed out each time
    # if each probe ended before the next began (seen here: 645 probes). So the probes live on
    # until one gets the id, each taking the next freed stack.
    probes: list[threading.Thread] = []
    try:
        for _ in range(1000):
            probes.append(threading.Thread(target=close_if_id_reused))
            probes[-1].start()
            if probes[-1].ident == ended.ident:
                probes[-1].join()
                break
    finally:
        release.set()
        for probe in probes:
            probe.join()
    assert outcomes == [None]


def test_blocking_calls_from_a_delivery_callback_are_refused(tansu_broker: TansuBroker, topic: str) -> None:
    seen: list[BaseException] = []
    done = threading.Event()
    # A long linger keeps the record queued until flush(), so the callback is added to a pending
    # future and runs on the producer's thread (added to a done one, it would run right here).
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=600_000) as producer:

        def callback(_: concurrent.futures.Future[RecordMetadata]) -> None:
            for call in (
                lambda: producer.send(topic, b"from the callback"),
                lambda: producer.submit(_noop),
                lambda: producer.close(0),  # it waited for itself (delivery_timeout_ms), then gave up
            ):
                try:
                    call()
                except BaseException as exc:
                    seen.append(exc)
            done.set()

        future = producer.send(topic, b"x")
        assert not future.done()
        future.add_done_callback(callback)
        producer.flush(30)  # bounded: with the refusal gone, the callback would wait for itself
        assert done.wait(30)
    assert len(seen) == 3 and all(isinstance(exc, RuntimeError) for exc in seen), seen
    assert all("its own thread" in str(exc) for exc in seen)


async def _parked(_: Producer, release: threading.Event) -> None:
    """A submit() coroutine that ends once ``release`` is set (waited for in a worker thread)."""
    await asyncio.to_thread(release.wait)


def test_waiting_for_a_pending_future_from_a_callback_is_refused(tansu_broker: TansuBroker, topic: str) -> None:
    # Only the producer's thread settles its futures: a callback waiting there for another one
    # (a later record's, a submit()'s) blocked the loop until its wait ran out, or forever.
    release_first, release_second = threading.Event(), threading.Event()

    waited: list[BaseException] = []
    called_back = threading.Event()

    def wait_for_the_second(_: concurrent.futures.Future[None]) -> None:
        try:
            second.result(5)  # (refused at once; before, the loop waited the 5 s out)
        except BaseException as exc:
            waited.append(exc)
        try:
            record.exception(5)
        except BaseException as exc:
            waited.append(exc)
        called_back.set()

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=600_000) as producer:
        record = producer.send(topic, b"lingering", partition=0)
        first = producer.submit(_parked, release_first)
        second = producer.submit(_parked, release_second)
        first.add_done_callback(wait_for_the_second)
        release_first.set()
        assert called_back.wait(60)
        assert [type(exc) for exc in waited] == [RuntimeError, RuntimeError]
        assert "wait for itself forever" in str(waited[0])
        release_second.set()
        assert second.result(30) is None
        producer.flush(30)
        assert record.result(0).offset == 0


def test_polling_a_pending_future_from_a_callback_is_told_it_is_pending(tansu_broker: TansuBroker, topic: str) -> None:
    # result(0) / exception(0) wait for nothing: a callback polling another future (to act on it
    # in a later callback if pending) gets concurrent.futures' TimeoutError, as anywhere else, not
    # the RuntimeError for a wait, which escaped a callback written for TimeoutError.
    release_first, release_second = threading.Event(), threading.Event()

    polled: list[BaseException] = []
    called_back = threading.Event()

    def poll_the_second(_: concurrent.futures.Future[None]) -> None:
        for poll in (second.result, second.exception):
            try:
                poll(0)
            except BaseException as exc:
                polled.append(exc)
        called_back.set()

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        first = producer.submit(_parked, release_first)
        second = producer.submit(_parked, release_second)
        first.add_done_callback(poll_the_second)
        release_first.set()
        assert called_back.wait(60)
        assert [type(exc) for exc in polled] == [TimeoutError, TimeoutError]
        release_second.set()
        assert second.result(30) is None


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_callbacks_system_exit_reaches_the_caller_and_the_producer_goes_on(
    tansu_broker: TansuBroker, topic: str, raised: BaseException
) -> None:
    # It stopped the producer's event loop: flush() raised ProducerClosedError, later records
    # failed ("use SyncProducer"), and the program went on, the exit it asked for lost.
    def leave(_: concurrent.futures.Future[RecordMetadata]) -> None:
        raise raised

    ran: list[str] = []
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=600_000) as producer:
        first = producer.send(topic, b"first", partition=0)
        assert not first.done()  # the callbacks run on the producer's thread (see above)
        first.add_done_callback(leave)
        first.add_done_callback(lambda _: ran.append("the next callback"))
        with pytest.raises(type(raised)) as info:
            producer.flush(30)
        assert info.value is raised
        assert first.result(0).offset == 0 and ran == ["the next callback"]
        second = producer.send(topic, b"second", partition=0)
        producer.flush(30)  # raised once; the producer goes on
        assert second.result(0).offset == 1
        third = producer.send(topic, b"third", partition=0)
        third.add_done_callback(leave)
        with pytest.raises(type(raised)):
            producer.close(30)  # closed, then raised
    assert third.result(0).offset == 2
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"first", b"second", b"third"]
    with pytest.raises(type(raised)):
        first.add_done_callback(leave)  # added to a done future, it runs in the caller's thread, as ever


def test_a_system_exit_of_a_call_on_the_loop_reaches_its_caller_and_the_producer_goes_on(
    tansu_broker: TansuBroker, topic: str
) -> None:
    # A serializer's (or a submit() coroutine's) sys.exit() left the call's task and stopped the
    # producer's loop: the record queued before it failed ("use SyncProducer across asyncio.run()
    # calls"), every later send too, and the exit was only logged.
    def serializer(value: str) -> bytes:
        if value == "exit":
            sys.exit(3)
        return value.encode()

    async def exits(_: Producer) -> None:
        sys.exit(4)

    with SyncProducer(
        bootstrap_servers=tansu_broker.bootstrap, value_serializer=serializer, linger_ms=600_000
    ) as producer:
        before = producer.send(topic, "before", partition=0)
        with pytest.raises(SystemExit) as info:
            producer.send(topic, "exit", partition=0)
        assert info.value.code == 3
        with pytest.raises(SystemExit) as info:
            producer.submit(exits).result(30)
        assert info.value.code == 4
        after = producer.send(topic, "after", partition=0)
        producer.flush(30)
        assert (before.result(0).offset, after.result(0).offset) == (0, 1)
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"before", b"after"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_statistics_callbacks_system_exit_reaches_the_caller_and_the_producer_goes_on(
    tansu_broker: TansuBroker, topic: str, kind: str
) -> None:
    # It left the reporter task and stopped the producer's loop: the record queued failed ("use
    # SyncProducer across asyncio.run() calls"), the producer with it, and the exit was only logged.
    go, exited, again = threading.Event(), threading.Event(), threading.Event()

    def on_statistics(_: object) -> None:
        if exited.is_set():
            again.set()  # the exit was kept before this call
        elif go.is_set():
            exited.set()
            sys.exit(5)

    async def on_statistics_async(snapshot: object) -> None:
        on_statistics(snapshot)

    callback = on_statistics if kind == "sync" else on_statistics_async
    with SyncProducer(
        bootstrap_servers=tansu_broker.bootstrap,
        linger_ms=600_000,
        statistics_interval_ms=10,
        statistics_callback=callback,
    ) as producer:
        queued = producer.send(topic, b"queued", partition=0)
        go.set()
        assert again.wait(30)
        with pytest.raises(SystemExit) as info:
            producer.flush(30)
        assert info.value.code == 5
        producer.flush(30)  # raised once; the producer goes on
        assert queued.result(0).offset == 0


def test_a_callbacks_cancelled_error_is_logged_not_raised_in_the_next_call(
    tansu_broker: TansuBroker, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Only an exit asked for (SystemExit, KeyboardInterrupt) reaches the caller's thread: any
    # other BaseException was kept too, and flush() raised asyncio.CancelledError in a plain thread.
    def cancelled(_: concurrent.futures.Future[RecordMetadata]) -> None:
        raise asyncio.CancelledError  # (as .result() of a cancelled asyncio future raises it)

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=600_000) as producer:
        future = producer.send(topic, b"first", partition=0)
        assert not future.done()
        future.add_done_callback(cancelled)
        producer.flush(30)
        assert future.result(0).offset == 0
        second = producer.send(topic, b"second", partition=0)
        producer.flush(30)
        assert second.result(0).offset == 1
    assert any(r.exc_info and r.exc_info[0] is asyncio.CancelledError for r in caplog.records)


def test_a_submit_callbacks_system_exit_reaches_the_caller_and_the_producer_goes_on(
    tansu_broker: TansuBroker, topic: str
) -> None:
    # docs/sync.md promises it of "a callback"; one on submit()'s future (run on the producer's
    # thread too) still stopped the event loop: the next send raised ProducerClosedError, and
    # the exit it asked for was only logged ("event loop failed").
    release = threading.Event()

    async def held(_producer: Any) -> str:
        await asyncio.to_thread(release.wait)
        return "done"

    def leave(_: concurrent.futures.Future[str]) -> None:
        raise SystemExit(3)

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        work = producer.submit(held)
        work.add_done_callback(leave)
        release.set()
        assert work.result(30) == "done"
        with pytest.raises(SystemExit):
            producer.flush(30)
        assert producer.send_and_wait(topic, b"after", partition=0, timeout=30).offset == 0
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"after"]


def test_submit_runs_a_coroutine_on_the_producer_loop(tansu_broker: TansuBroker, topic: str) -> None:
    async def batch(producer: Any, count: int) -> list[int]:
        futures = [await producer.send(topic, b"%d" % i) for i in range(count)]
        return [(await f).offset for f in futures]

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, partitioner="round_robin") as producer:
        offsets = producer.submit(batch, 10).result(30)
    assert len(offsets) == 10


async def _loop_type(_producer: Any) -> type:
    import asyncio

    return type(asyncio.get_running_loop())


def test_a_runtime_error_of_the_function_given_to_submit_is_its_own(tansu_broker: TansuBroker, topic: str) -> None:
    # submit() calls the function in the caller's thread (to get its coroutine): a RuntimeError it
    # raised there (asyncio's "no running event loop", say) was reported as ProducerClosedError,
    # "the producer's event loop is not running", of a producer that was running fine.
    def not_a_coroutine_function(producer: Any) -> Any:
        raise RuntimeError("the function's own error")

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        with pytest.raises(RuntimeError, match="the function's own error") as raised:
            producer.submit(not_a_coroutine_function)
        assert not isinstance(raised.value, ProducerClosedError)
        assert producer.send_and_wait(topic, b"v").offset == 0


def test_use_uvloop_false_is_asyncios_loop_under_uvloops_policy(tansu_broker: TansuBroker) -> None:
    # uvloop.install() (a common first line of an application) sets uvloop's policy: use_uvloop=False
    # still ran the producer on uvloop, anyio's default loop being the policy's.
    import asyncio

    import uvloop

    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, use_uvloop=False) as producer:
            loop_type = producer.submit(_loop_type).result(10)
            producer.send_and_wait("aioprod-use-uvloop-false", b"v")
    finally:
        asyncio.set_event_loop_policy(previous)
    assert loop_type.__module__.startswith("asyncio.")


class _ProgramsLoop(asyncio.SelectorEventLoop):
    """The loop of a program's own policy (not uvloop's)."""


class _ProgramsPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _ProgramsLoop()


def test_use_uvloop_false_keeps_a_programs_own_policy(tansu_broker: TansuBroker) -> None:
    # Only uvloop's loop is put aside: a policy of the program's (Windows' selector one, say) is kept.
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_ProgramsPolicy())
    try:
        with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, use_uvloop=False) as producer:
            loop_type = producer.submit(_loop_type).result(10)
    finally:
        asyncio.set_event_loop_policy(previous)
    assert loop_type is _ProgramsLoop


def test_uvloop_is_used_when_installed(tansu_broker: TansuBroker) -> None:
    import uvloop

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        assert issubclass(producer.submit(_loop_type).result(10), uvloop.Loop)
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, use_uvloop=False) as producer:
        assert not issubclass(producer.submit(_loop_type).result(10), uvloop.Loop)


def test_everything_works_without_uvloop(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop is an optional extra (aioprod[speed]): without it, asyncio's own loop serves."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        assert producer.submit(_loop_type).result(10).__module__.startswith("asyncio.")
        assert producer.send_and_wait(topic, b"on asyncio's loop").topic == topic
    with pytest.raises(ImportError):
        SyncProducer(bootstrap_servers=tansu_broker.bootstrap, use_uvloop=True)
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"on asyncio's loop"]


class Interrupted(BaseException):
    """Stands in for KeyboardInterrupt (which would also stop pytest itself)."""


def test_an_interrupted_caller_withdraws_the_unqueued_record(topic: str) -> None:
    """A signal handler raising in the waiting thread: the record is not queued, nothing hangs."""
    unreachable = f"127.0.0.1:{refused_port()}"

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    main = threading.get_ident()
    try:
        with SyncProducer(bootstrap_servers=unreachable, max_block_ms=20_000) as producer:
            timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGUSR1))
            timer.start()
            with pytest.raises(Interrupted):  # not KafkaTimeoutError after max_block_ms
                producer.send(topic, b"x")  # waits for metadata that never comes
            timer.join()
            # The withdrawn send was cancelled on the loop, which still answers at once.
            with pytest.raises(TimeoutError):
                producer.submit(_slow_partitions, topic).result(10)
    finally:
        signal.signal(signal.SIGUSR1, previous)


async def _slow_partitions(producer: Any, topic: str) -> list[int]:
    import asyncio

    return list(await asyncio.wait_for(producer.partitions_for(topic), 0.2))


def test_an_abandoned_producer_is_closed_in_the_background(tansu_broker: TansuBroker, topic: str) -> None:
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap)
    future = producer.send(topic, b"queued before the producer was dropped")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del producer
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    metadata = future.result(30)
    assert metadata.topic == topic
    # The background close still delivered it: the log holds it, where its future says.
    log = read_topic(tansu_broker.bootstrap, topic)
    assert [(r.partition, r.offset, r.value) for r in log] == [
        (metadata.partition, metadata.offset, b"queued before the producer was dropped")
    ]


def test_a_shared_failure_does_not_grow_its_traceback_per_result_call() -> None:
    # The records of a failed batch share one exception; each future re-raises it from the
    # traceback it had when the batch failed (as asyncio.Future does).
    try:
        raise KafkaError("the batch failed")
    except KafkaError as exc:
        error = exc
    escaped = sync._Escaped(threading.current_thread())
    futures: list[concurrent.futures.Future[RecordMetadata]] = [_Delivery(escaped) for _ in range(200)]
    for future in futures:
        future.set_running_or_notify_cancel()
        future.set_exception(error)
    for future in futures:
        with pytest.raises(KafkaError) as info:
            future.result(1)
        assert info.value is error
    depth, tb = 0, error.__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    assert depth <= 4


def test_transactions_from_a_thread(tansu_broker: TansuBroker, topic: str) -> None:
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=f"{topic}-sync") as p:
        with p.transaction():
            p.send(topic, b"kept", partition=0)
            p.send_offsets_to_transaction({TopicPartition(topic, 0): 3}, "sync-group")
        with pytest.raises(ZeroDivisionError), p.transaction():
            p.send(topic, b"dropped", partition=0)
            p.flush()
            1 / 0  # noqa: B018
        assert not p.in_transaction  # aborted by the block
        p.begin_transaction()
        assert p.in_transaction
        p.send(topic, b"also kept", partition=0)
        p.commit_transaction()
        assert not p.in_transaction
    visible = asyncio.run(read_committed_from_markers(tansu_broker.bootstrap, topic, 1))
    assert visible[0] == [b"kept", b"also kept"]


def test_a_transaction_block_whose_commit_finds_the_producer_failed_aborts_it(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As Producer.transaction(): the block re-raised and left the transaction open until close().
    async def failed(self: Producer) -> None:
        raise ProducerFatalError("the producer failed (injected by the test)")

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=f"{topic}-fatal") as p:
        with pytest.raises(ProducerFatalError, match="injected"), p.transaction():
            p.send(topic, b"never visible", partition=0)
            monkeypatch.setattr(Producer, "commit_transaction", failed)
        assert not p.in_transaction  # aborted by the block, before close()
        monkeypatch.undo()
        with p.transaction():
            p.send(topic, b"kept", partition=0)
    visible = asyncio.run(read_committed_from_markers(tansu_broker.bootstrap, topic, 1))
    assert visible[0] == [b"kept"]


def test_a_transaction_prepared_in_one_thread_is_committed_from_another_producer(
    tansu_broker: TansuBroker, topic: str
) -> None:
    bootstrap = tansu_broker.bootstrap
    with SyncProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-kept") as p:
        p.begin_transaction()
        p.send(topic, b"kept", partition=0)
        kept = p.prepare_transaction()
    with SyncProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-dropped") as p:
        p.begin_transaction()
        p.send(topic, b"dropped", partition=0)
        dropped = p.prepare_transaction()
    with SyncProducer(bootstrap_servers=bootstrap) as q:
        q.commit_prepared_transaction(kept)
        q.abort_prepared_transaction(dropped)
    visible = asyncio.run(read_committed_from_markers(bootstrap, topic, 1))
    assert visible[0] == [b"kept"]


def test_waits_without_end_are_accepted_as_the_async_producer_accepts_them(
    tansu_broker: TansuBroker, topic: str
) -> None:
    # Java's "block forever" (max.block.ms = Long.MAX_VALUE) and infinite timeouts were passed
    # to a thread's wait as they were, past threading.TIMEOUT_MAX: OverflowError on every call.
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap, max_block_ms=2**63 - 1)
    first = producer.send(topic, b"one").result(30)
    second = producer.send_and_wait(topic, b"two", timeout=float("inf"))
    producer.flush(float("inf"))
    producer.close(float("inf"))
    assert (first.offset, second.offset) == (0, 1)
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"one", b"two"]


def test_flush_waits_for_the_records_a_concurrent_close_is_still_settling(topic: str) -> None:
    with tansu() as broker:
        producer = SyncProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000, linger_ms=0)
        producer.send_and_wait(topic, b"warm-up")
        broker.stop()  # nothing is acknowledged from now on
        pending = producer.send(topic, b"in flight")
        closer = threading.Thread(target=producer.close, args=(3,))  # fails what is pending after 3 s
        closer.start()
        try:
            while not producer.closed:  # close() has begun
                pass
            producer.flush(60)
            assert pending.done()  # flush() returned: every record queued before it is settled
        finally:
            closer.join(60)


def test_a_flush_overtaken_by_a_concurrent_close_waits_for_it(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A close() begun between flush()'s look for one and its call to the loop got flush() a
    # ProducerClosedError ("no more records are accepted"), the record still on its way. The
    # interleaving is forced: flush() is held there (its second _check_process) until close() began.
    close_began = threading.Event()
    checks = Counter[str]()
    check_process, begin_close = SyncProducer._check_process, SyncProducer._begin_close

    def held_check_process(self: SyncProducer) -> None:
        if threading.current_thread().name == "flusher":
            checks["flusher"] += 1
            if checks["flusher"] == 2:  # flush() has found no close under way
                assert close_began.wait(30)
        check_process(self)

    def begin_close_and_tell(self: SyncProducer, timeout: float) -> concurrent.futures.Future[None]:
        closing = begin_close(self, timeout)
        close_began.set()
        return closing

    monkeypatch.setattr(SyncProducer, "_check_process", held_check_process)
    monkeypatch.setattr(SyncProducer, "_begin_close", begin_close_and_tell)
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=600_000)
    record = producer.send(topic, b"lingering", partition=0)
    outcome: list[BaseException | None] = []

    def flush() -> None:
        try:
            producer.flush(60)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    flusher = threading.Thread(target=flush, name="flusher")
    flusher.start()
    producer.close(60)
    flusher.join(60)
    assert outcome == [None]
    assert record.result(0).offset == 0


FORKING = """
import os, sys
from aioprod import SyncProducer
producer = SyncProducer(bootstrap_servers="127.0.0.1:{port}", max_block_ms=200)
pid = os.fork()
if pid == 0:
    if {call!r}:
        try:
            producer.send("t", b"from the child") if {call!r} == "send" else getattr(producer, {call!r})()
        except Exception as exc:
            print("child error:", type(exc).__name__, exc, flush=True)
    sys.exit(0)  # a normal exit: atexit hooks run
_, status = os.waitpid(pid, 0)
producer.close(1)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
@pytest.mark.parametrize("call", ["", "send", "metrics", "metrics_snapshot"])
def test_a_forked_child_exits_and_is_told_to_make_its_own_producer(call: str) -> None:
    # metrics() asked the parent's loop, whose thread the child does not have: 10 s, then a
    # TimeoutError with no text.
    code = FORKING.format(port=refused_port(), call=call)
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=60)  # a guard: the child hung in the parent's producer
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("the forked child hung")
    assert process.returncode == 0, err
    if call:
        assert "child error: ProducerClosedError" in out and "create a new SyncProducer after fork" in out


FORKED_FUTURE = """
import asyncio, os, sys, threading
from aioprod import SyncProducer
release = threading.Event()
async def parked(_):
    await asyncio.to_thread(release.wait)
producer = SyncProducer(bootstrap_servers="127.0.0.1:{port}")
future = producer.submit(parked)
pid = os.fork()
if pid == 0:
    try:
        future.result(10)  # (refused at once; before, it waited the whole 10 s, or forever)
    except Exception as exc:
        print("child error:", type(exc).__name__, exc, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
future.result(30)
producer.close(1)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
def test_a_forked_child_waiting_for_an_inherited_future_is_told_nothing_will_settle_it() -> None:
    code = FORKED_FUTURE.format(port=refused_port())
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=60)  # a guard: the child hung
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("the forked child hung")
    assert process.returncode == 0, err
    assert "child error: ProducerClosedError" in out and "forked child process" in out, out


@pytest.mark.parametrize("call", ["send", "send_many", "close"])
def test_a_call_gives_up_when_the_producers_loop_does_not_answer(call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/sync.md: a loop that stops answering (a callback that blocks it) gets the caller a
    KafkaTimeoutError, not a hang; the call once waited, unbounded, for the loop to take it."""
    monkeypatch.setattr(sync, "_GRACE", 0.5)
    producer = SyncProducer(
        bootstrap_servers=f"127.0.0.1:{refused_port()}",
        max_block_ms=200,
        request_timeout_ms=500,
        delivery_timeout_ms=1000,
    )
    release, blocking = threading.Event(), threading.Event()

    async def block_the_loop(_producer: Any) -> None:
        blocking.set()
        release.wait(120)  # blocks the event loop's thread

    producer.submit(block_the_loop)
    assert blocking.wait(60)
    try:
        with pytest.raises(KafkaTimeoutError, match="did not close within" if call == "close" else "gave up waiting"):
            if call == "send":
                producer.send("t", b"x")
            elif call == "send_many":  # bounded by the loop's answer, not by time (each wait is)
                producer.send_many("t", [b"x"])
            else:
                producer.close(0.2)
    finally:
        release.set()
        producer.close(2)


def test_the_start_is_waited_for_as_long_as_max_block_ms_bounds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transactional start takes up to max_block_ms (60 s by default) and then names its
    coordinator's last answer; the constructor gave up at 30 s with "gave up waiting" instead."""
    waits: list[float | None] = []
    call = SyncProducer._call

    def recording(self: SyncProducer, timeout: float | None, fn: Any, *args: Any) -> Any:
        if fn == self._producer.start:
            waits.append(timeout)
        return call(self, timeout, fn, *args)

    monkeypatch.setattr(SyncProducer, "_call", recording)
    with SyncProducer(bootstrap_servers=f"127.0.0.1:{refused_port()}", max_block_ms=120_000):
        pass
    with SyncProducer(bootstrap_servers=f"127.0.0.1:{refused_port()}", start_timeout=None):
        pass
    assert waits == [120 + sync._GRACE, None]


@pytest.mark.parametrize("use_uvloop", ["no", "false", 0, 1])
def test_use_uvloop_of_another_type_is_refused_by_name(use_uvloop: object) -> None:
    # Taken for its truth value: use_uvloop="no" ran the producer on uvloop.
    with pytest.raises(TypeError, match=r"SyncProducer\(\) use_uvloop must be True, False or None"):
        SyncProducer(bootstrap_servers=f"127.0.0.1:{refused_port()}", use_uvloop=use_uvloop)  # type: ignore[arg-type]


def test_sync_timeouts_of_the_wrong_type_are_refused_by_name_before_anything_happens() -> None:
    with pytest.raises(TypeError, match=r"SyncProducer\(\) start_timeout must be a number"):
        SyncProducer(bootstrap_servers=f"127.0.0.1:{refused_port()}", start_timeout="5")  # type: ignore[arg-type]
    producer = SyncProducer(bootstrap_servers=f"127.0.0.1:{refused_port()}", max_block_ms=500)
    try:
        with pytest.raises(TypeError, match=r"send_and_wait\(\) timeout must be a number"):
            producer.send_and_wait("t", b"v", timeout="5")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"flush\(\) timeout must be a number"):
            producer.flush("5")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"close\(\) timeout must be a number"):
            producer.close("5")  # type: ignore[arg-type]
        assert producer.metrics()["record-send-total"] == 0  # send_and_wait queued nothing
    finally:
        producer.close(0)  # still closes


def test_send_many_refuses_what_the_async_producer_refuses(tansu_broker: TansuBroker, topic: str) -> None:
    # list(values) made a str one record per character (written), a dict one per key.
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, value_serializer=str.encode) as producer:
        for values in ("abc", {"x": "y"}, b"abc"):
            with pytest.raises(TypeError, match="values must be a sequence"):
                producer.send_many(topic, values).result(30)  # type: ignore[arg-type]
        producer.send_and_wait(topic, "after")
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"after"]


def test_generators_are_consumed_in_the_calling_thread(tansu_broker: TansuBroker, topic: str) -> None:
    # keys= and headers= iterators were consumed on the producer's loop thread: a source tied to
    # its thread (a sqlite3 cursor) failed there, and a slow one blocked every other caller.
    seen: list[str] = []

    def items(values: list[Any]) -> Iterator[Any]:
        for value in values:
            seen.append(threading.current_thread().name)
            yield value

    db = sqlite3.connect(":memory:")
    db.execute("create table r (k blob)")
    db.executemany("insert into r values (?)", [(b"k1",), (b"k2",)])
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap) as producer:
        producer.send_many(topic, items([b"v1", b"v2"]), headers=items([items([("h", b"1")]), None])).result(30)
        producer.send_many(topic, [b"v3", b"v4"], keys=(k for (k,) in db.execute("select k from r"))).result(30)
        producer.send(topic, b"v5", headers=items([("h", b"2")])).result(30)
    assert set(seen) == {threading.current_thread().name}
    assert sorted(r.key for r in read_topic(tansu_broker.bootstrap, topic) if r.key) == [b"k1", b"k2"]


@pytest.mark.parametrize("max_block_ms", [1000, 2**63 - 1])  # the second: Java's "wait forever"
def test_a_send_racing_close_gets_producer_closed(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch, max_block_ms: int
) -> None:
    # A send() past the closed checks as another thread's close() stopped the loop handed its
    # work to a loop that closed without running it: the caller waited max_block_ms + 5 s for a
    # KafkaTimeoutError, or for good. The thread schedule is forced with events; the code is not
    # changed: the sender is held as it makes its coroutine (after both checks), the loop thread
    # just before the loop closes.
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap, use_uvloop=False, max_block_ms=max_block_ms)
    loop = producer._loop
    in_window, last_run_over, scheduled = threading.Event(), threading.Event(), threading.Event()
    enqueue = sync._enqueue

    def held_enqueue(*args: Any) -> Any:
        in_window.set()
        assert last_run_over.wait(10)
        return enqueue(*args)

    close_loop, call_soon_threadsafe = loop.close, loop.call_soon_threadsafe

    def held_close() -> None:
        last_run_over.set()
        scheduled.wait(10)
        close_loop()

    def noting(*args: Any, **kwargs: Any) -> Any:
        try:
            return call_soon_threadsafe(*args, **kwargs)
        finally:
            if threading.current_thread().name == "racing-sender":
                scheduled.set()

    monkeypatch.setattr(sync, "_enqueue", held_enqueue)
    loop.close = held_close  # type: ignore[method-assign]
    loop.call_soon_threadsafe = noting  # type: ignore[method-assign]
    outcome: list[BaseException] = []

    def sender() -> None:
        try:
            producer.send(topic, b"late")
        except BaseException as exc:
            outcome.append(exc)

    racing = threading.Thread(target=sender, name="racing-sender", daemon=True)
    racing.start()
    assert in_window.wait(10)
    monkeypatch.setattr(sync, "_enqueue", enqueue)
    producer.close()
    racing.join(15)
    assert not racing.is_alive(), "send() still blocked 15 s after close() returned"
    assert len(outcome) == 1 and isinstance(outcome[0], ProducerClosedError), outcome


def test_a_forked_child_dropping_the_parents_producer_does_nothing() -> None:
    # The child warned "was never closed; closing it now" and poked the parent's loop.
    code = f"""
import gc, os, sys, warnings
from aioprod import SyncProducer
producer = SyncProducer(bootstrap_servers="127.0.0.1:{refused_port()}", max_block_ms=200)
pid = os.fork()
if pid == 0:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del producer
        gc.collect()
    os._exit(1 if caught else 0)
_, status = os.waitpid(pid, 0)
producer.close(1)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_producers_loop_resolves_names_at_interpreter_exit() -> None:
    # Interpreter exit stops every thread pool before atexit hooks run, asyncio's default
    # executor included, which asyncio's loop resolves host names on: the exit-time close could
    # not reconnect to a broker named by host ("cannot schedule new futures after shutdown").
    code = f"""
import asyncio, atexit
from aioprod import SyncProducer
producer = SyncProducer(bootstrap_servers="127.0.0.1:{refused_port()}", use_uvloop=False)

async def resolve(_producer):
    return await asyncio.get_running_loop().getaddrinfo("localhost", 9092)

def at_exit():  # registered after aioprod's own hook: runs before the exit-time close
    print("resolved" if producer.submit(resolve).result(10) else "nothing", flush=True)

atexit.register(at_exit)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "resolved" in done.stdout, done.stderr[-2000:]


# Python 3.12+ refuses to start a thread once the interpreter exits; this makes 3.11 do the same
# from an atexit hook that runs before aioprod's exit-time close.
_REFUSE_THREADS_AT_EXIT = """
import atexit, threading

def refuse_threads():
    def start(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")
    threading.Thread.start = start

atexit.register(refuse_threads)
"""


@pytest.mark.parametrize("use_uvloop", [False, True])
def test_a_producer_closed_at_exit_without_new_threads_closes_quietly(use_uvloop: bool) -> None:
    # The loop's teardown starts a thread to shut its default executor down: on Python 3.12+
    # the exit-time close logged "SyncProducer event loop failed" with a RuntimeError.
    code = f"""
from aioprod import SyncProducer
producer = SyncProducer(bootstrap_servers="127.0.0.1:{refused_port()}", use_uvloop={use_uvloop})
{_REFUSE_THREADS_AT_EXIT}
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]


def test_names_resolve_at_exit_without_new_threads() -> None:
    # Python 3.12+ starts no thread at exit, so the resolver thread per call failed there too.
    code = f"""
import asyncio, atexit
from aioprod import SyncProducer
producer = SyncProducer(bootstrap_servers="127.0.0.1:{refused_port()}", use_uvloop=False)

async def resolve(_producer):
    return await asyncio.get_running_loop().getaddrinfo("localhost", 9092)

def at_exit():  # runs after refuse_threads, before the exit-time close
    print("resolved" if producer.submit(resolve).result(10) else "nothing", flush=True)

atexit.register(at_exit)
{_REFUSE_THREADS_AT_EXIT}
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "resolved" in done.stdout, done.stderr[-2000:]


def test_a_producer_dropped_unclosed_just_before_exit_still_delivers(tansu_broker: TansuBroker, topic: str) -> None:
    # Its background close was not waited for at exit: the daemon loop thread died with the
    # record queued (docs/sync.md promises queued records a chance).
    code = f"""
import warnings
warnings.simplefilter("ignore", ResourceWarning)
from aioprod import SyncProducer

def main():
    producer = SyncProducer(bootstrap_servers="{tansu_broker.bootstrap}", linger_ms=200)
    producer.send("{topic}", b"queued")  # not yet acknowledged; dropped unclosed on return

main()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"queued"]


def test_exit_waits_one_bound_for_all_the_producers_it_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each unclosed producer whose loop did not answer got its own 10 s, one after another: three
    # blocked loops (a delivery callback that blocks) made exit take 30 s. Virtual time here.
    clock = [100.0]
    waited: list[float] = []

    class NeverClosing:
        def exception(self, timeout: float) -> None:
            waited.append(timeout)
            clock[0] += timeout
            raise TimeoutError

    class Thread:
        def join(self, timeout: float) -> None:
            waited.append(timeout)
            clock[0] += timeout

    monkeypatch.setattr(sync, "time", types.SimpleNamespace(monotonic=lambda: clock[0]), raising=False)
    monkeypatch.setattr(sync, "_live", weakref.WeakSet())
    monkeypatch.setattr(sync, "_abandoned_closes", {(NeverClosing(), Thread(), os.getpid()) for _ in range(3)})
    sync._close_at_exit()
    assert len(waited) == 3 and sum(waited) <= sync._ATEXIT_CLOSE_TIMEOUT + sync._GRACE, waited


def test_a_timeout_may_be_any_real_number(tansu_broker: TansuBroker, topic: str) -> None:
    # check_timeout took any real number, but a thread's wait takes only a float or an int:
    # a Fraction timeout raised a bare TypeError, after the record was queued.
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, start_timeout=Fraction(30)) as producer:
        assert producer.send_and_wait(topic, b"v", timeout=Fraction(30)).offset == 0
        producer.flush(Fraction(5))


class _CompiledCoroutine(collections.abc.Coroutine[Any, Any, None]):
    """A coroutine that is not Python's own (Cython's, say): it tells no state."""

    def send(self, value: Any) -> Any:
        raise StopIteration(None)

    def throw(self, *args: Any) -> Any:
        raise RuntimeError

    def close(self) -> None:
        pass

    def __await__(self) -> Iterator[Any]:
        return iter(())


def test_work_a_closed_loop_never_ran_is_cancelled_whatever_its_coroutine() -> None:
    # The sweep asked every coroutine for its state: a non-native one (submit() takes any) raised
    # AttributeError there, and every future after it was left pending, its caller waiting for good.
    gate = sync._Gate()
    first, second = concurrent.futures.Future[None](), concurrent.futures.Future[None]()

    async def never_started() -> None:
        pass

    coroutine = never_started()
    gate.track(first, _CompiledCoroutine())
    gate.track(second, coroutine)
    gate.end()
    assert first.cancelled() and second.cancelled()
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # closed, not left to warn


def _a_close_left_under_way_delivers_before_exit(topic: str, close: str, said: str) -> None:
    """A child process queues a record while the broker is cut off (tests/chaos/proxy.py's
    FaultProxy refuses connections), runs ``close`` (code that leaves a close under way, then
    prints ``said``), and exits once the broker is back: the record must have been delivered."""
    proxy_port = free_port()
    broker = TansuBroker(advertised_port=proxy_port).start()
    proxy_loop = asyncio.new_event_loop()
    proxy_thread = threading.Thread(target=proxy_loop.run_forever, daemon=True)
    proxy_thread.start()

    def on_proxy_loop(coroutine: collections.abc.Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, proxy_loop).result(30)

    async def cut_off(refuse: bool) -> None:
        proxy.refuse = refuse
        proxy.cut_all()

    proxy = on_proxy_loop(FaultProxy(broker.port, proxy_port).start())
    code = f"""
import os, signal, sys, threading
from aioprod import SyncProducer
producer = SyncProducer(bootstrap_servers="127.0.0.1:{proxy_port}", linger_ms=0)
producer.send_and_wait("{topic}", b"warm-up", partition=0)
print("cut the broker off", flush=True)
sys.stdin.readline()
producer.send("{topic}", b"queued", partition=0)  # the broker is out of reach: close() waits to deliver it
{close}
print("{said}", flush=True)
sys.stdin.readline()  # the broker is back: exit now
"""
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "cut the broker off\n"
        on_proxy_loop(cut_off(True))
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == f"{said}\n"
        on_proxy_loop(cut_off(False))
        child.stdin.write("\n")
        child.stdin.flush()
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-2000:]
        assert [r.value for r in read_topic(broker.bootstrap, topic)] == [b"warm-up", b"queued"]
    finally:
        child.kill()
        on_proxy_loop(proxy.close())
        proxy_loop.call_soon_threadsafe(proxy_loop.stop)
        proxy_thread.join(30)
        proxy_loop.close()
        broker.stop()


#: Ctrl-C once the close is under way, from another thread (docs/sync.md: a close() interrupted
#: "goes on in the background"). Interpreter exit did not wait for it (the producer was no longer
#: open, nor dropped unclosed): the daemon loop thread died mid-delivery, the record lost unsaid.
_CTRL_C_WHILE_IT_WAITS = """
def interrupt_once_closing():
    while not producer.closed:
        pass
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_closing).start()
"""

#: Ctrl-C landing after close() started the close and before it told exit to wait for it: the
#: producer had left the open producers already, so exit neither closed it nor waited. Fault
#: injected: the interrupt is raised where the exit wait is registered.
_CTRL_C_AS_IT_BEGINS = """
from aioprod import sync
register = sync._wait_at_exit

def interrupted_first(*args):
    sync._wait_at_exit = register
    raise KeyboardInterrupt

sync._wait_at_exit = interrupted_first
"""


@pytest.mark.parametrize(
    "interrupt",
    [pytest.param(_CTRL_C_WHILE_IT_WAITS, id="while it waits"), pytest.param(_CTRL_C_AS_IT_BEGINS, id="as it begins")],
)
def test_an_interrupted_close_still_delivers_before_exit(topic: str, interrupt: str) -> None:
    interrupted_close = (
        interrupt
        + """
try:
    producer.close()
except KeyboardInterrupt:
    pass
else:
    sys.exit("close() was not interrupted")
"""
    )
    _a_close_left_under_way_delivers_before_exit(topic, interrupted_close, "interrupted")


def test_a_close_under_way_in_a_daemon_thread_delivers_before_exit(topic: str) -> None:
    # A worker (daemon) thread's close() was under way when the program ended: it had left the
    # open producers, and registered with the exit wait only once interrupted (as a KeyboardInterrupt
    # landing before close()'s wait began did not either): the loop thread died mid-delivery.
    worker_close = """
threading.Thread(target=producer.close, daemon=True).start()  # a worker's close, under way at exit
while not producer.closed:
    pass
"""
    _a_close_left_under_way_delivers_before_exit(topic, worker_close, "closing")


def test_close_says_closed_when_the_loop_ended_before_running_it(
    tansu_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # When the loop thread ends under a close() (a delivery callback's SystemExit stops the loop),
    # the close's work is cancelled unrun (_Gate.end): close() raised a bare
    # concurrent.futures.CancelledError. Fault injected: the close handed to the loop comes back
    # cancelled, as _Gate.end leaves it.
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap)
    start_close = sync._start_close
    closes: list[concurrent.futures.Future[None]] = []

    def cancelled_unrun_close(*args: Any) -> concurrent.futures.Future[None]:
        closes.append(start_close(*args))  # the real close still runs, so the thread ends
        unrun: concurrent.futures.Future[None] = concurrent.futures.Future()
        unrun.cancel()
        return unrun

    monkeypatch.setattr(sync, "_start_close", cancelled_unrun_close)
    producer.close()  # no CancelledError
    assert producer.closed
    closes[0].result(30)


class _EndsAsTheWaitRunsOut(concurrent.futures.Future[str]):
    """Fault injection: the work completes just after the caller's wait ran out."""

    def result(self, timeout: float | None = None) -> str:
        self._ends_as_this_wait_runs_out(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._ends_as_this_wait_runs_out(timeout)
        return super().exception(timeout)

    def _ends_as_this_wait_runs_out(self, timeout: float | None) -> None:
        if timeout is not None and timeout > 0 and not self.done():
            self.set_result("queued")
            raise TimeoutError  # what a Future's wait raises when it runs out first


def test_work_that_ends_as_the_wait_runs_out_gives_its_outcome() -> None:
    # The work completed between the wait running out and the check of the future: the caller got
    # a bare TimeoutError() for a record that was queued (and a retry wrote it twice).
    future = _EndsAsTheWaitRunsOut()
    future.set_running_or_notify_cancel()
    assert SyncProducer._wait(future, 1.0, "the producer") == "queued"


class _Interrupted(BaseException):
    """What the test's SIGINT handler raises (a KeyboardInterrupt of its own)."""


@contextlib.contextmanager
def _ctrl_c_raises_interrupted() -> Iterator[None]:
    """In the block, SIGINT raises :class:`_Interrupted`: a KeyboardInterrupt would stop pytest."""

    def handler(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Waited(concurrent.futures.Future[str]):
    """A call that never ends; it says when the caller's wait has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.waiting.set()
        return super().exception(timeout)

    def result(self, timeout: float | None = None) -> str:
        self.waiting.set()
        return super().result(timeout)


def test_ctrl_c_taken_by_another_thread_interrupts_a_wait_of_the_main_thread() -> None:
    # The kernel hands a process's SIGINT to any thread that does not block it, the producer's
    # loop thread included. Python runs the handler on the main thread, but only once that thread
    # runs again: a close() waiting out delivery_timeout_ms (120 s) ignored Ctrl-C until then.
    future = _Waited()
    future.set_running_or_notify_cancel()
    unanswered: list[bool] = []
    interrupted = threading.Event()

    def ctrl_c_in_this_thread() -> None:
        future.waiting.wait(60)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # the main thread is not woken
        if not interrupted.wait(60):  # a hung main thread: end its wait, so that the test fails
            unanswered.append(True)
            future.set_result("the wait ended without the interrupt")

    other = threading.Thread(target=ctrl_c_in_this_thread)
    with _ctrl_c_raises_interrupted():
        other.start()
        with pytest.raises(_Interrupted):
            SyncProducer._wait(future, None, "the producer")
        interrupted.set()
        other.join(60)
    assert unanswered == []


def test_a_queued_records_future_cannot_be_cancelled(tansu_broker: TansuBroker, topic: str) -> None:
    # "The future cannot be cancelled: a queued record is delivered or fails on its own." A
    # cancel() that succeeded left the future saying cancelled of a record that was written.
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=600_000) as producer:
        single, many = producer.send(topic, b"one"), producer.send_many(topic, [b"two"])
        assert not single.done() and not many.done()  # lingering
        assert not single.cancel() and not many.cancel()
        producer.flush(30)
        assert single.result(0).offset == 0 and many.result(0)[0].offset == 1
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"one", b"two"]


def test_close_returns_once_the_producers_thread_has_ended(tansu_broker: TansuBroker, topic: str) -> None:
    # "Deliver what is queued, then stop the producer and its thread."
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=200)
    future = producer.send(topic, b"v")
    producer.close()
    assert future.result(0).offset == 0
    assert not producer_threads()
    with pytest.raises(ProducerClosedError, match="the producer is closed"):  # not "its loop is not running"
        producer.send(topic, b"later")


def test_a_producer_whose_start_fails_leaves_no_thread_behind() -> None:
    with pytest.raises(KafkaTimeoutError, match="could not initialise within max_block_ms"):
        SyncProducer(bootstrap_servers=f"127.0.0.1:{refused_port()}", transactional_id="tx", max_block_ms=300)
    assert not producer_threads()


def test_a_producer_left_open_at_exit_delivers_its_records(tansu_broker: TansuBroker, topic: str) -> None:
    # Not dropped (a module's global, still referenced at exit) and never closed: interpreter
    # exit closes it, within its bound, instead of killing the loop thread with the record queued.
    code = f"""
from aioprod import SyncProducer
producer = SyncProducer(bootstrap_servers="{tansu_broker.bootstrap}", linger_ms=200)
producer.send("{topic}", b"queued")  # not yet acknowledged when the program ends
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"queued"]


@pytest.mark.parametrize("how", ["send timed out", "send interrupted", "send_many timed out"])
def test_a_send_given_up_while_the_loop_is_blocked_is_never_queued(
    tansu_broker: TansuBroker, topic: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caller was told the send failed (KafkaTimeoutError, or its own interrupt) before the
    # loop took it: the work must be withdrawn, not run once the loop is free again. It ran: the
    # record the caller took for not sent was written (and a retry wrote it twice).
    monkeypatch.setattr(sync, "_GRACE", 0.5)
    release, blocking = threading.Event(), threading.Event()

    async def block_the_loop(_producer: Any) -> None:
        blocking.set()
        release.wait(120)  # blocks the event loop's thread

    previous = signal.signal(signal.SIGUSR1, _interrupt)
    max_block_ms = 20_000 if how == "send interrupted" else 200
    try:
        with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, max_block_ms=max_block_ms, linger_ms=0) as producer:
            producer.send_and_wait(topic, b"warm-up")
            producer.submit(block_the_loop)
            assert blocking.wait(60)
            try:
                if how == "send timed out":
                    with pytest.raises(KafkaTimeoutError, match="gave up waiting"):
                        producer.send(topic, b"given up")
                elif how == "send_many timed out":
                    with pytest.raises(KafkaTimeoutError, match="gave up waiting"):
                        producer.send_many(topic, [b"given up"])
                else:
                    # (whenever it comes: the loop stays blocked until the send was given up)
                    timer = threading.Timer(0.3, signal.pthread_kill, (threading.get_ident(), signal.SIGUSR1))
                    timer.start()
                    with pytest.raises(Interrupted):
                        producer.send(topic, b"given up")
                    timer.join()
            finally:
                release.set()
            producer.flush(30)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"warm-up"]


def test_work_given_up_between_its_start_and_its_first_step_never_runs() -> None:
    # As above, with the loop held up after it took the work but before the task's first step
    # (a callback behind it in the same turn): the cancel from the caller's thread came behind
    # that step in the loop's queue, and a send queued its record there.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    ran: list[str] = []
    held, given_up = threading.Event(), threading.Event()
    taken: list[concurrent.futures.Future[None]] = []

    async def work() -> None:
        ran.append("ran")

    def hold_up() -> None:
        held.set()
        given_up.wait(30)

    def take() -> None:
        taken.append(sync._run_soon(work(), loop))  # begins next turn...
        loop.call_soon(hold_up)  # ...and this runs right after, in the same turn

    try:
        loop.call_soon_threadsafe(take)
        assert held.wait(30)
        (future,) = taken
        assert future.cancel()  # the caller's wait ran out
        given_up.set()
        for _ in range(3):  # every turn the loop has queued
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
    assert ran == []


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted


def test_a_send_whose_record_was_queued_is_not_reported_given_up(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The send's task queued its record, and a callback of the same turn (a slow delivery callback)
    # held the loop until the caller's wait ran out: the future was settled by a callback behind
    # it, so the caller was told "gave up waiting" of a record that was then written (and its
    # retry wrote it twice). Whatever the caller is told must be what happened.
    monkeypatch.setattr(sync, "_GRACE", 0.5)
    release, blocking, tracked, told = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    outcome: list[object] = []

    async def block_the_loop(_producer: Any) -> None:
        blocking.set()
        release.wait(120)  # blocks the event loop's thread

    async def hold_up(_producer: Any) -> None:
        told.wait(120)  # the send's step is just ahead of this one, in the same turn

    def send(producer: SyncProducer) -> None:
        try:
            outcome.append(producer.send(topic, b"late"))
        except BaseException as exc:
            outcome.append(exc)
        told.set()

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, max_block_ms=2000, linger_ms=0) as producer:
        producer.send_and_wait(topic, b"warm-up")
        track = producer._gate.track

        def tracking(future: concurrent.futures.Future[Any], coro: Any) -> concurrent.futures.Future[Any]:
            track(future, coro)
            if coro.__qualname__ == "_enqueue":
                tracked.set()
            return future

        monkeypatch.setattr(producer._gate, "track", tracking)
        producer.submit(block_the_loop)
        assert blocking.wait(60)
        sender = threading.Thread(target=send, args=(producer,))
        try:
            sender.start()
            assert tracked.wait(60)  # the send's start is queued, and now this one behind it
            producer.submit(hold_up)
        finally:
            release.set()
        sender.join(120)
        producer.flush(30)
    (result,) = outcome
    written = [r.value for r in read_topic(tansu_broker.bootstrap, topic)]
    if isinstance(result, concurrent.futures.Future):
        assert written == [b"warm-up", b"late"]
    else:
        assert written == [b"warm-up"], f"told {result!r}, yet the record was written"


@pytest.mark.parametrize("where", ["its last step done", "its wake-up queued"])
def test_work_given_up_is_not_run_on_nor_reported_given_up_once_done(where: str) -> None:
    # A callback held the loop until the caller's wait ran out, (a) right after the work's last step
    # (its future was set by a callback behind that one), or (b) right after the work's wake-up was
    # queued (what it waited for came: metadata, buffer memory; the cancel came behind the wake-up,
    # and the work went on). Either way the caller was told "gave up waiting" of work that ran.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    ran: list[str] = []
    held, given_up = threading.Event(), threading.Event()
    told: list[object] = []
    waited_for = loop.create_future()

    async def work() -> str:
        if where == "its wake-up queued":
            await waited_for
        ran.append("ran")
        return "done"

    def hold_up() -> None:
        held.set()
        given_up.wait(30)

    try:
        future = sync._run_soon(work(), loop)
        if where == "its last step done":
            # start() runs in the next turn and the task's step in the one after: this behind it
            loop.call_soon_threadsafe(loop.call_soon, hold_up)
        else:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)  # it waits now
            loop.call_soon_threadsafe(lambda: (waited_for.set_result(None), hold_up()))
        assert held.wait(30)
        try:
            told.append(sync.SyncProducer._wait(future, 0, "the producer"))
        except KafkaTimeoutError as exc:
            told.append(exc)
        given_up.set()
        for _ in range(3):  # every turn the loop has queued
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)
    finally:
        given_up.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
    if ran:
        assert told == ["done"], "told it was given up, yet it ran"
    else:
        (error,) = told
        assert isinstance(error, KafkaTimeoutError)


def test_a_send_whose_wait_runs_out_during_its_step_is_told_what_the_step_did(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caller's wait ran out while the loop ran the send's own step (a slow serializer): the
    # cancel from the caller's thread landed in the middle of it, the step queued the record all
    # the same, and the caller, told "gave up waiting", wrote it twice with a retry. The give-up
    # now waits for the step, and the caller gets its future.
    in_step, cancelling = threading.Event(), threading.Event()
    armed = threading.Event()
    real_settled = sync._settled

    def slow(value: bytes) -> bytes:
        if value == b"slow":
            in_step.set()
            cancelling.wait(60)  # the caller gives up while this step runs
        return value

    def runs_out_during_the_step(future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
        if not armed.is_set():
            return real_settled(future, timeout)
        armed.clear()
        real_cancel = future.cancel

        def cancel() -> bool:
            cancelling.set()
            return real_cancel()

        future.cancel = cancel  # type: ignore[method-assign]
        assert in_step.wait(60)
        return False  # as if max_block_ms and the grace ran out now

    monkeypatch.setattr(sync, "_settled", runs_out_during_the_step)
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, value_serializer=slow, linger_ms=0) as producer:
        producer.send_and_wait(topic, b"warm-up")
        armed.set()
        try:
            told: object = producer.send(topic, b"slow")
        except KafkaTimeoutError as exc:
            told = exc
        producer.flush(30)
    assert isinstance(told, concurrent.futures.Future), f"told {told!r}, though its step queued the record"
    assert told.result(0).offset == 1
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"warm-up", b"slow"]


class _EndsAsTheCancelComes(concurrent.futures.Future[str]):
    """Work that ends just before the caller's cancel reaches it: the cancel is refused."""

    def cancel(self) -> bool:
        if not self.done():
            self.set_running_or_notify_cancel()
            self.set_result("queued")
        return super().cancel()


def test_work_that_ends_as_the_caller_cancels_gives_its_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    # Between the wait's last look (not done) and its cancel, the work ended: the cancel was
    # refused, its answer not read, and the caller told "gave up waiting" of a queued record.
    monkeypatch.setattr(sync, "_settled", lambda future, timeout: False)  # the wait ran out
    assert SyncProducer._wait(_EndsAsTheCancelComes(), 1.0, "the producer") == "queued"


def test_a_send_many_queued_as_its_wait_runs_out_is_not_reported_given_up(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # send_many's wait for its records to queue ran out just as they were queued, and the check
    # that the loop still answers ran out too: the caller got "gave up waiting" (its cancel came
    # too late, unread) for records that were then written, and a retry wrote them twice.
    armed = threading.Event()
    real_settled = sync._settled

    def runs_out_as_it_ends(future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
        if not armed.is_set():
            return real_settled(future, timeout)
        armed.clear()
        assert real_settled(future, 60)  # queued...
        return False  # ...as the wait ran out

    async def unanswered() -> None:
        raise KafkaTimeoutError("gave up waiting for the producer after 5.0s")

    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=0) as producer:
        producer.send_and_wait(topic, b"warm-up")
        monkeypatch.setattr(sync, "_settled", runs_out_as_it_ends)
        monkeypatch.setattr(sync, "_nothing", unanswered)
        armed.set()
        try:
            told: object = producer.send_many(topic, [b"a", b"b"])
        except KafkaTimeoutError as exc:
            told = exc
        monkeypatch.undo()
        producer.flush(30)
    assert not isinstance(told, BaseException), f"told {told!r}, though the records were queued"
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"warm-up", b"a", b"b"]


class _HeldStep:
    """Fakes for a send_many whose wait runs out while the loop runs the call's own first step
    (held by its serializer, on the value ``b"slow"``): the caller's first wait runs out once the
    serializer has begun and ``when_it_runs_out()`` returned, and any give-up (a cancel: the probe
    of the loop's or the call's) lets the serializer return. ``decided``: the caller cancelled the
    call, or went back to waiting for it."""

    def __init__(self, *, hold_the_loop_after_it: bool = False) -> None:
        self.entered, self.release, self.decided = threading.Event(), threading.Event(), threading.Event()
        self.hold_the_loop_after_it = hold_the_loop_after_it

    def serializer(self, value: bytes) -> bytes:
        if value == b"slow":
            if self.hold_the_loop_after_it:
                # Another callback holds the loop right after this step, until the caller has
                # decided: the call's next step comes after the give-up, as on a busy loop.
                asyncio.get_running_loop().call_soon(self.decided.wait, 60)
            self.entered.set()
            self.release.wait(60)
        return value

    def install(self, monkeypatch: pytest.MonkeyPatch, when_it_runs_out: Callable[[], None] = lambda: None) -> None:
        armed = threading.Event()
        armed.set()
        queuing: list[concurrent.futures.Future[Any]] = []
        real_settled, real_cancel = sync._settled, sync._Work.cancel

        def settled(future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
            if armed.is_set():
                armed.clear()
                queuing.append(future)
                assert self.entered.wait(60)
                when_it_runs_out()
                return False
            if queuing and future is queuing[0]:
                self.decided.set()  # back to waiting for the call
            return real_settled(future, timeout)

        def cancel(work: sync._Work[Any], unless_stepped_since: int | None = None) -> bool:
            self.release.set()
            try:
                return real_cancel(work, unless_stepped_since)
            finally:
                if queuing and work is queuing[0]:
                    self.decided.set()

        monkeypatch.setattr(sync, "_settled", settled)
        monkeypatch.setattr(sync._Work, "cancel", cancel)
        monkeypatch.setattr(sync, "_GRACE", 0.2)  # the probe of a loop the serializer holds runs out sooner


def test_a_send_many_whose_step_queues_its_records_as_its_wait_runs_out_is_not_given_up(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wait ran out during send_many's own step (a slow serializer), and the probe of the loop
    # too. The give-up waited for the step, which queued every record and then yielded (a run
    # queued: the sender's turn): the cancel was accepted, and the caller told "gave up waiting" of
    # records that were then written (a retry wrote them twice). A step of the call is the loop
    # answering: the caller goes on waiting for the call.
    held = _HeldStep(hold_the_loop_after_it=True)
    with SyncProducer(
        bootstrap_servers=tansu_broker.bootstrap, value_serializer=held.serializer, linger_ms=0, max_block_ms=100
    ) as producer:
        producer.send_and_wait(topic, b"warm-up")
        held.install(monkeypatch)
        try:
            told: object = producer.send_many(topic, [b"slow", b"b"])
        except KafkaTimeoutError as exc:
            told = exc
        monkeypatch.undo()
        producer.flush(30)
    assert isinstance(told, concurrent.futures.Future), f"told {told!r}, though its step queued the records"
    assert [m.offset for m in told.result(0)] == [1, 2]
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"warm-up", b"slow", b"b"]


def test_a_send_many_whose_wait_runs_out_during_a_close_gets_its_outcome(
    tansu_broker: TansuBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # send_many's wait ran out while another thread's close() was under way: the probe of the loop
    # was refused as a call of a closed producer, and send_many raised "the producer is closed; no
    # more records are accepted" though its call queued its records, which the close then wrote.
    held = _HeldStep()
    producer = SyncProducer(bootstrap_servers=tansu_broker.bootstrap, value_serializer=held.serializer, linger_ms=0)
    closer = threading.Thread(target=producer.close, args=(30,))

    def close_under_way() -> None:
        closer.start()
        while not producer.closed:  # (set by close() at once, before its wait)
            closer.join(0.01)

    try:
        producer.send_and_wait(topic, b"warm-up")
        held.install(monkeypatch, close_under_way)
        try:
            told: object = producer.send_many(topic, [b"slow", b"b"])
        except ProducerClosedError as exc:
            told = exc
        monkeypatch.undo()
    finally:
        held.release.set()
        if closer.ident is not None:
            closer.join(60)
        producer.close(30)
    assert isinstance(told, concurrent.futures.Future), f"told {told!r}, though its records were queued"
    assert [m.offset for m in told.result(0)] == [1, 2]
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"warm-up", b"slow", b"b"]


class _CancelSays(sync._Work[str]):
    """A call whose ``cancel()`` says when it begins."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelling = threading.Event()

    def cancel(self, unless_stepped_since: int | None = None) -> bool:
        self.cancelling.set()
        return super().cancel(unless_stepped_since)


def test_ctrl_c_taken_by_another_thread_interrupts_a_wait_for_the_calls_step() -> None:
    # The main thread's give-up waits for a step of the call under way on the loop (its serializer),
    # and that wait, unlike the main thread's others, was not cut into slices: a Ctrl-C the kernel
    # handed to another thread ran its handler only once the step ended (a stuck one: never).
    work = _CancelSays()
    held, interrupted = threading.Event(), threading.Event()
    unanswered: list[bool] = []

    def the_loop_in_the_calls_step() -> None:
        with work.stepping:  # as the loop's thread runs a step
            work.between_steps.clear()
            held.set()
            work.cancelling.wait(60)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # the main thread is not woken
            if not interrupted.wait(60):  # a hung main thread: end the step, so that the test fails
                unanswered.append(True)

    loop_thread = threading.Thread(target=the_loop_in_the_calls_step)
    with _ctrl_c_raises_interrupted():
        loop_thread.start()
        assert held.wait(60)
        with pytest.raises(_Interrupted):
            work.cancel()  # the caller's give-up, its wait run out
        interrupted.set()
        loop_thread.join(60)
    assert unanswered == []


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_a_give_up_after_the_call_ended_returns_at_once(ending: str) -> None:
    # The main thread's give-up first waits for the step under way to end: a call whose last step
    # ended (returned or raised) must leave nothing to wait for, or the give-up waits for ever.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()

    async def work() -> str:
        if ending == "raises":
            raise ValueError("the work's own")
        return "done"

    guard = threading.Timer(30, signal.pthread_kill, (threading.get_ident(), signal.SIGUSR1))
    previous = signal.signal(signal.SIGUSR1, _interrupt)
    try:
        future = sync._run_soon(work(), loop)
        assert future.exception(30) is None if ending == "returns" else isinstance(future.exception(30), ValueError)
        guard.start()  # a hung give-up is interrupted, and the test fails
        assert future.cancel() is False
    finally:
        guard.cancel()
        signal.signal(signal.SIGUSR1, previous)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_work_the_loop_took_in_its_last_turn_leaves_no_never_awaited_warning() -> None:
    # A call racing the loop's close: start() created the task in the loop's last turn, and the
    # task never stepped. The gate cancels its future and closes the work's coroutine once the
    # loop closed; the coroutine _run_soon wrapped it in was left to warn "never awaited".
    loop = asyncio.new_event_loop()
    gate = sync._Gate()
    coros = [_noop(None)]

    def take() -> None:
        gate.track(sync._run_soon(coros[0], loop), coros[0])  # start() runs next turn...
        loop.call_soon(loop.stop)  # ...the last

    loop.call_soon(take)
    loop.run_forever()
    loop.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gate.end()
        coros.clear()
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]


def test_work_that_fails_logs_no_unretrieved_task_exception(caplog: pytest.LogCaptureFixture) -> None:
    # Its future is set in its last step; the task's exception is retrieved all the same.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()

    async def fails() -> None:
        raise ValueError("the work's own")

    try:
        with pytest.raises(ValueError, match="the work's own"):
            sync._run_soon(fails(), loop).result(30)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)  # settle() has run
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
    gc.collect()
    assert "never retrieved" not in caplog.text

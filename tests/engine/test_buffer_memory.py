"""buffer_memory bounds what the producer holds, and no reservation leaks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aioprod import Producer, RecordFuture
from aioprod.errors import KafkaTimeoutError, ProducerClosedError, SendManyError
from aioprod.producer.accumulator import BufferPool
from tests.conftest import Scripted
from tests.fakes.cluster import ScriptedCluster


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


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0)


@pytest.mark.parametrize("close_timeout", [None, 20.0])
@pytest.mark.parametrize("many", [False, True])
async def test_close_refuses_a_send_waiting_for_buffer_memory_at_once(
    scripted: Scripted, close_timeout: float | None, many: bool
) -> None:
    # As Java's BufferPool.close: a record granted memory after close() began would be refused
    # as "closing" anyway. It waited out max_block_ms, then failed as if the buffer were full.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    options = {"buffer_memory": 5000, "max_block_ms": 10_000, "linger_ms": 0, "delivery_timeout_ms": 60_000}
    p = Producer(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000, **options)
    await p.start()
    await p.partitions_for("t")
    cluster.nodes[1].holding = True  # the broker is slow: the buffer stays full
    queued = [await p.send("t", b"x" * 1000) for _ in range(4)]
    pool = p._accumulator.pool
    waiting = asyncio.ensure_future(p.send_many("t", [b"y" * 2000]) if many else p.send("t", b"y" * 2000))
    await _until(lambda: pool._waiters)
    loop = asyncio.get_running_loop()
    started = loop.time()
    closing = asyncio.ensure_future(p.close(timeout=close_timeout))
    try:
        if many:
            with pytest.raises(SendManyError) as many_info:
                await (await waiting)
            error = many_info.value.results[0]
        else:
            with pytest.raises(ProducerClosedError) as info:
                await waiting
            error = info.value
        waited = loop.time() - started
    finally:
        cluster.nodes[1].release()
        await closing
    await asyncio.gather(*queued)
    assert isinstance(error, ProducerClosedError), repr(error)
    assert waited == 0, waited  # virtual time: not max_block_ms (10 s)
    assert pool.used == 0


async def test_send_many_larger_than_the_buffer_goes_on_while_the_broker_makes_room(scripted: Scripted) -> None:
    # max_block_ms bounds each wait for memory, as for send(), not the whole call: 3.3 MB
    # through a 20 kB buffer, answered every 50 ms, failed 18,700 of 20,000 records once a
    # second had passed since the call began, with "stayed full for max_block_ms (50 ms)".
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.nodes[1].delay = 0.05
    options = {"buffer_memory": 20_000, "batch_size": 10_000, "max_block_ms": 1000, "linger_ms": 5}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        await p.partitions_for("t")
        results = await (await p.send_many("t", [b"x" * 100] * 20_000))
    assert [r.offset for r in results] == list(range(20_000))
    assert cluster.partition("t").end_offset == 20_000


async def test_a_buffer_full_error_says_how_long_the_record_waited(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.nodes[1].holding = True
    async with Producer(bootstrap_servers=cluster.bootstrap, buffer_memory=5000, max_block_ms=700, linger_ms=0) as p:
        await p.partitions_for("t")
        queued = [await p.send("t", b"x" * 1000) for _ in range(4)]
        with pytest.raises(SendManyError) as info:
            await (await p.send_many("t", [b"y" * 2000]))
        cluster.nodes[1].release()
        await asyncio.gather(*queued)
    assert "stayed full for max_block_ms (waited 700 ms for memory)" in str(info.value.results[0])


@pytest.mark.parametrize("shape", ["headers", "keys"])
async def test_send_many_lets_the_loop_run_while_it_queues_record_by_record(scripted: Scripted, shape: str) -> None:
    # Keyed records, or records with headers, go one at a time; that path never let the loop
    # run while memory was free, so the whole call (here over 1 MB) was queued in one step, with
    # nothing sent and every other task stalled (300,000 records on Tansu: up to 1.7 s).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    count = 20_000
    values = [b"x" * 50] * count
    options: dict[str, Any] = {"headers": [[("a", b"b")]] * count}
    if shape == "keys":
        options = {"keys": [b"k%d" % (i % 100) for i in range(count)]}
    async with Producer(bootstrap_servers=cluster.bootstrap, batch_size=16384) as p:
        await p.partitions_for("t")
        seen: list[int] = []

        async def other_task() -> None:
            await asyncio.sleep(0)  # past send_many's start
            seen.append(p._accumulator.pool.used)

        watcher = asyncio.ensure_future(other_task())
        await asyncio.sleep(0)
        future = await p.send_many("t", values, **options)
        await watcher
        await future
    assert seen[0] < 100_000, seen  # a few batches, not the whole call


async def test_an_ascii_header_name_counts_its_own_length(scripted: Scripted) -> None:
    # Names were charged 4 bytes a character (UTF-8's worst case): a 301 kB record was refused
    # as "about 1,201,075 bytes" against max_request_size (1 MiB). Java counts the real length.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    name = "h" * 300_000
    async with Producer(bootstrap_servers=cluster.bootstrap) as p:
        await p.partitions_for("t")
        metadata = await (await p.send("t", b"x" * 1000, headers=[(name, b"y")]))
        many = await (await p.send_many("t", [b"x" * 1000], headers=[[(name, b"y")]]))
        assert p._accumulator.headers_size([("\u00e9t\u00e9", b"")]) == 10 + 5
    assert metadata.offset == 0 and many[0].offset == 1


async def test_send_manys_first_wait_for_memory_gets_all_of_max_block(scripted: Scripted) -> None:
    # The deadline was set as the call began and reset only after a wait: records queued for
    # longer than max_block_ms before the first wait failed it at once ("waited 0 ms").
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    options = {"buffer_memory": 200_000, "batch_size": 16_384, "max_block_ms": 1000, "linger_ms": 0}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        await p.partitions_for("t")
        cluster.nodes[1].holding = True  # the broker is slow for a moment: the buffer fills
        stop = False

        async def other_work() -> None:
            # The application's other tasks (the yields in send_many let them run): each turn
            # takes 250 ms of CPU (virtual time here), 1.25 s in all
            # before the buffer is full.
            while not stop:
                await asyncio.sleep(0)
                if not p._accumulator.pool.waiting:  # (not while send_many waits for memory)
                    scripted.clock.now += 0.25

        async def broker_catches_up() -> None:
            await asyncio.sleep(2.0)  # the broker answers 2 s after the call began
            cluster.nodes[1].release()

        worker = asyncio.ensure_future(other_work())
        releaser = asyncio.ensure_future(broker_catches_up())
        await asyncio.sleep(0)
        count = 4000
        started = scripted.clock.now
        future = await p.send_many("t", [b"x" * 100] * count, keys=[b"k"] * count)
        stop = True
        await worker
        await releaser
        try:
            results = await future
        except SendManyError as exc:
            errors = [r for r in exc.results if isinstance(r, BaseException)]
            raise AssertionError(
                f"{len(errors)} of {count} records failed after {scripted.clock.now - started:.2f}s: {errors[0]}"
            ) from None
        assert len(results) == count


@contextlib.asynccontextmanager
async def a_large_send_waiting_for_memory(
    cluster: ScriptedCluster,
) -> AsyncIterator[tuple[Producer, RecordFuture, asyncio.Future[RecordFuture]]]:
    """A producer with 3,000 bytes of buffer_memory: a record of 1,500 B held by the broker (1,564
    bytes reserved until its answer), and a send() of 2,000 B (2,064 more) waiting for memory."""
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, buffer_memory=3000) as p:
        await p.partitions_for("t")
        cluster.nodes[1].holding = True
        held = await p.send("t", b"x" * 1500)
        large = asyncio.ensure_future(p.send("t", b"y" * 2000))
        await asyncio.sleep(0.01)
        yield p, held, large


async def test_a_send_that_gives_up_waiting_for_memory_lets_the_ones_behind_it_through(scripted: Scripted) -> None:
    # Memory is granted in order: a small record waits behind a large one, though it would fit.
    # When the large one's send() is cancelled, the small one takes the room at once, not at the
    # next release (none comes here: the broker holds every answer) nor at max_block_ms.
    cluster = scripted.cluster
    async with a_large_send_waiting_for_memory(cluster) as (p, held, large):
        small = asyncio.ensure_future(p.send("t", b"z" * 500))  # 564: fits, but waits its turn
        await asyncio.sleep(0.01)
        assert not large.done() and not small.done()
        large.cancel()
        queued = await small
        cluster.nodes[1].release()
        await asyncio.gather(held, queued)
    assert cluster.partition("t").values == [b"x" * 1500, b"z" * 500]


async def test_a_record_as_large_as_buffer_memory_is_sent_once_the_buffer_empties(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, buffer_memory=2000) as p:
        await p.partitions_for("t")
        cluster.nodes[1].holding = True
        held = await p.send("t", b"x" * 100)
        whole = asyncio.ensure_future(p.send("t", b"y" * (2000 - 64)))  # its size is all of buffer_memory
        await asyncio.sleep(0.01)
        assert not whole.done()  # waiting for the first record's memory
        cluster.nodes[1].release()
        await held
        cluster.nodes[1].holding = False
        await (await whole)
    assert cluster.partition("t").values == [b"x" * 100, b"y" * (2000 - 64)]


async def test_send_many_waits_for_memory_behind_a_send_that_waits_already(scripted: Scripted) -> None:
    # Memory is granted in the order the calls asked for it: send_many's bulk path must not take
    # room that a waiting send() needs (a stream of send_many calls starved it to max_block_ms).
    cluster = scripted.cluster
    async with a_large_send_waiting_for_memory(cluster) as (p, held, large):
        many = asyncio.ensure_future(p.send_many("t", [b"z" * 100] * 3))  # 492 bytes would fit now
        await asyncio.sleep(0.01)
        assert not many.done()  # behind the waiting send()
        cluster.nodes[1].release()
        await asyncio.gather(held, await large, await many)
    assert cluster.partition("t").values == [b"x" * 1500, b"y" * 2000, *[b"z" * 100] * 3]

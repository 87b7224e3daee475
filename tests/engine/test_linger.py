"""When a lingering batch goes, in virtual time on the scripted cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aioprod import Producer, RecordFuture
from aioprod.protocol.messages import MetadataRequest, ProduceRequest
from aioprod.protocol.records import RecordBatchBuilder
from tests.conftest import Scripted

#: Virtual clock readings to start from. Which of two timers due in the same tick comes first
#: depends on the rounding of the floats: from these (found by a search over 400 starts), the
#: sender's linger timer came before the caller's, and a send() that still meant to let a round
#: run (asked for by the send before, although a round had run since) yielded to it.
_CLOCK_STARTS = [1000.0, 18089.004059, 29688.37984445807, 76465.72816333626, 90082.031535246, 97009.85394515052]


@pytest.mark.parametrize("clock_start", _CLOCK_STARTS)
async def test_a_record_sent_in_the_tick_the_linger_ends_goes_with_that_batch(
    scripted: Scripted, clock_start: float
) -> None:
    # A caller pacing its sends wakes from its own timer in the same tick as the sender's
    # linger timer. Had the sender's round run first, the paced record would have started a
    # new batch and waited a whole linger more.
    cluster = scripted.cluster
    scripted.clock.now = clock_start  # before anything is scheduled
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, enable_idempotence=False) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await scripted.clock.advance_to_whole_millisecond()
        start = scripted.clock.now
        first = await p.send("t", b"first", partition=0)
        await asyncio.sleep(start + 0.005 - scripted.clock.now)
        second = await p.send("t", b"second", partition=0)
        sent_at = scripted.clock.now
        assert (await first).offset + 1 == (await second).offset
    produce = cluster.requests_of(ProduceRequest)
    assert len(produce) == 2  # the warm-up, then one request with both records
    assert produce[-1].at == sent_at == pytest.approx(start + 0.005, abs=1e-9)


async def test_lingers_ending_behind_a_busy_connection_make_no_rounds_and_go_together(scripted: Scripted) -> None:
    # A connection that cannot take a request wakes the sender when it can. Until then,
    # batches of its partitions reaching their linger (or being opened) are no reason for a
    # round: with 1,000 partitions behind a busy broker, those rounds (each visiting every
    # partition with data) came every millisecond or so and could send nothing.
    cluster = scripted.cluster
    cluster.create_topic("t", 10)
    config: dict[str, Any] = {"linger_ms": 5, "max_in_flight_requests_per_connection": 1, "enable_idempotence": False}
    async with Producer(bootstrap_servers=cluster.bootstrap, **config) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        node = cluster.nodes[1]
        node.holding = True
        held = await p.send("t", b"held", partition=0)
        while len(cluster.requests_of(ProduceRequest)) < 2:
            await asyncio.sleep(0.001)
        rounds = _count_rounds(p)
        waiting = []
        for partition in range(1, 10):
            waiting.append(await p.send("t", b"waiting", partition=partition))
            await asyncio.sleep(0.001)  # each opens its batch a millisecond after the last
        await asyncio.sleep(0.020)  # every linger has ended
        assert rounds == [0]
        node.release()
        await held
        offsets = [(await future).offset for future in waiting]
    assert offsets == [0] * 9
    produce = cluster.requests_of(ProduceRequest)
    assert len(produce) == 3  # the warm-up, the held one, then the nine batches in one
    assert rounds[0] >= 1


async def test_a_busy_broker_holds_back_only_its_own_partitions(scripted: Scripted) -> None:
    # Node 1 cannot take a request (its one place in flight waits on a held answer); node 2's
    # partition still goes when its linger ends, to the millisecond.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2])
    config: dict[str, Any] = {"linger_ms": 5, "max_in_flight_requests_per_connection": 1, "enable_idempotence": False}
    async with Producer(bootstrap_servers=cluster.bootstrap, **config) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await p.send_and_wait("t", b"warm-up", partition=1)
        busy = cluster.nodes[1]
        busy.holding = True
        held = await p.send("t", b"held", partition=0)
        while not cluster.requests_of(ProduceRequest, node=1)[1:]:
            await asyncio.sleep(0.001)
        queued_behind = await p.send("t", b"behind", partition=0)
        await scripted.clock.advance_to_whole_millisecond()
        start = scripted.clock.now
        free = await p.send("t", b"free", partition=1)
        await free
        # To the nanosecond: whole milliseconds on the clock, as floats, need not add up exactly.
        assert cluster.requests_of(ProduceRequest, node=2)[-1].at == pytest.approx(start + 0.005, abs=1e-9)
        assert not held.done() and not queued_behind.done()
        busy.release()
        assert (await held).offset + 1 == (await queued_behind).offset


async def _hold_the_only_place(p: Producer, cluster: Any) -> RecordFuture:
    """Send a record whose produce request node 1 holds: with one place in flight, the
    connection is then full until the node is released."""
    cluster.nodes[1].holding = True
    held = await p.send("t", b"held")
    while len(cluster.requests_of(ProduceRequest)) < 2:
        await asyncio.sleep(0.001)
    return held


async def _release_the_place(cluster: Any, held: RecordFuture, futures: list[RecordFuture]) -> list[int]:
    """Release node 1; the offsets ``futures`` were written at, counted from just after ``held``'s."""
    cluster.nodes[1].release()
    first = (await held).offset + 1
    return [(await future).offset - first for future in futures]


class _OtherTask:
    """Another task on the loop, counting the turns it gets."""

    def __init__(self) -> None:
        self.turns = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.turns += 1
            await asyncio.sleep(0)

    def cancel(self) -> None:
        self._task.cancel()


async def test_a_tight_send_loop_lets_the_loop_run_while_a_connection_is_busy(scripted: Scripted) -> None:
    # Nothing wakes the sender for a busy broker's batches, but the connection's reader must
    # still get to read the answers that free it: send() yields as each batch completes,
    # or a caller that never awaits anything else would starve it until the buffer is full.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    config: dict[str, Any] = {"linger_ms": 5, "max_in_flight_requests_per_connection": 1, "batch_size": 200}
    async with Producer(bootstrap_servers=cluster.bootstrap, **config) as p:
        await p.send_and_wait("t", b"warm-up")
        held = await _hold_the_only_place(p, cluster)
        other = _OtherTask()
        await asyncio.sleep(0)
        before = other.turns
        futures = [await p.send("t", b"x" * 50) for _ in range(100)]  # a batch every few records
        other_turns = other.turns - before
        other.cancel()
        assert await _release_the_place(cluster, held, futures) == list(range(100))
    assert other_turns >= 20


async def _tight_send_loop_of_150_ms(p: Producer, clock: Any) -> tuple[list[RecordFuture], int]:
    """200 sends into one open batch, far from full, in a tight loop that takes 150 ms of the
    clock half-way; their futures, and the turns another task got meanwhile."""
    other = _OtherTask()
    await asyncio.sleep(0)
    futures = [await p.send("t", b"x" * 50) for _ in range(100)]
    before = other.turns
    clock.now += 0.15
    futures += [await p.send("t", b"x" * 50) for _ in range(100)]
    other.cancel()
    return futures, other.turns - before


async def test_a_tight_send_loop_lets_the_loop_run_while_no_batch_completes(scripted: Scripted) -> None:
    # With many partitions, or a large batch_size, a tight loop of sends can go on for long
    # without completing a batch. While a connection is full, send() still lets the loop run
    # once 100 ms have passed since it last did, so that the reader reads the answers.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    config: dict[str, Any] = {"linger_ms": 5, "max_in_flight_requests_per_connection": 1, "batch_size": 1 << 20}
    async with Producer(bootstrap_servers=cluster.bootstrap, **config) as p:
        await p.send_and_wait("t", b"warm-up")
        held = await _hold_the_only_place(p, cluster)
        futures, other_turns = await _tight_send_loop_of_150_ms(p, clock)
        assert await _release_the_place(cluster, held, futures) == list(range(200))
    assert other_turns >= 1


@pytest.mark.parametrize("topics", [1, 8])
async def test_a_tight_send_loop_that_fills_no_batch_still_sends_at_the_linger(scripted: Scripted, topics: int) -> None:
    # The linger's timer cannot fire while the loop does not run, and a caller that spends its
    # own time on each record between sends (here 0.2 ms) and awaits nothing else never lets it:
    # its records had all waited for the loop's end (400 ms here), or for the batch to fill.
    # send() looks at the clock every 64 sends and lets a round that is due run. The next batch
    # then waits for the first one's answer, which the loop must run to read: within 100 ms,
    # given the turns that reading it and the round it wakes take (it had taken 200-300).
    # Over 8 topics, every 64 sends too, not every 64 of each topic's (each had its own count).
    cluster, clock = scripted.cluster, scripted.clock
    names = [f"t{i}" for i in range(topics)]
    for name in names:
        cluster.create_topic(name, 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, batch_size=1 << 20) as p:
        for name in names:
            await p.send_and_wait(name, b"warm-up")
        written = _record_requests(p, clock)
        start = clock.now
        futures = []
        for i in range(2000):
            futures.append(await p.send(names[i % topics], b"x" * 100))
            clock.now += 0.0002
        first_at, second_at = (at - start for at, _ in written[:2])
        offsets = [(await f).offset for f in futures]
    assert offsets == [1 + i // topics for i in range(2000)]
    assert first_at <= 0.005 + 0.001 + 65 * 0.0002 + 1e-9  # the linger, 1 ms late, and one clock check more
    assert second_at - first_at <= 0.1 + 65 * 0.0002 + 1e-9


async def test_a_tight_send_loop_lets_the_loop_run_while_a_batch_waits_for_an_answer(scripted: Scripted) -> None:
    # The connection can take requests, but the partition's open batch goes with the answer
    # to its batch in flight: a tight loop of sends still lets the loop run once 100 ms have
    # passed since it last did, so that the reader reads that answer.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, batch_size=1 << 20) as p:
        _, node, (first,) = await _requests_unanswered(p, scripted, [0])
        futures, other_turns = await _tight_send_loop_of_150_ms(p, clock)
        node.release()
        assert [(await f).offset for f in (first, *futures)] == list(range(1, 202))
    assert other_turns >= 1


def _record_requests(p: Producer, clock: Any) -> list[tuple[float, list[tuple[int, int]]]]:
    """Each produce request as the sender writes it: when, and (partition, records) per batch.
    (The scripted broker reads a connection's requests one at a time, so it would not see a
    request written behind one it holds.)"""
    written: list[tuple[float, list[tuple[int, int]]]] = []
    send = p._sender._send

    def recorded(conn: Any, batches: list[Any], *args: Any) -> None:
        written.append((clock.now, [(b.tp.partition, b.record_count) for b in batches]))
        send(conn, batches, *args)

    p._sender._send = recorded  # type: ignore[method-assign]
    return written


async def _requests_unanswered(
    p: Producer, scripted: Scripted, partitions: list[int]
) -> tuple[list[tuple[float, list[tuple[int, int]]]], Any, list[RecordFuture]]:
    """Warm up, record the requests written from then on, and leave one request per partition
    of ``partitions`` on the wire (a batch of one record each, 10 ms apart), unanswered until
    the node is released."""
    await p.send_and_wait("t", b"warm-up", partition=0)
    written = _record_requests(p, scripted.clock)
    node = scripted.cluster.nodes[1]
    node.holding = True
    unanswered = []
    for partition in partitions:
        unanswered.append(await p.send("t", b"unanswered", partition=partition))
        await asyncio.sleep(0.010)
    assert [batches for _, batches in written] == [[(partition, 1)] for partition in partitions]
    return written, node, unanswered


def _count_rounds(p: Producer) -> list[int]:
    """A one-item list counting the sender's rounds from now on."""
    rounds = [0]
    run_once = p._sender.run_once

    def counted(now: float) -> float:
        rounds[0] += 1
        return run_once(now)

    p._sender.run_once = counted  # type: ignore[method-assign]
    return rounds


async def test_a_partitions_next_batch_goes_with_the_answer_to_its_batch_in_flight(scripted: Scripted) -> None:
    # Past its linger, a partition's lone open batch waits while its last batch is unanswered,
    # and goes in the round the answer wakes. Over 1,000 partitions on a busy broker each
    # request had taken a record or two of every partition: 6,000-9,000 batches per 100,000
    # records, each costing the client and the broker their per-batch work. Other partitions
    # still go at their linger on the same connection.
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        written, node, (first,) = await _requests_unanswered(p, scripted, [0])
        second = await p.send("t", b"second", partition=0)
        third = await p.send("t", b"third", partition=0)
        other = await p.send("t", b"other", partition=1)
        await asyncio.sleep(0.020)  # every linger has ended
        assert [batches for _, batches in written] == [[(0, 1)], [(1, 1)]]  # `first`, then `other` alone
        released_at = scripted.clock.now
        node.release()
        assert [(await f).offset for f in (first, second, third, other)] == [1, 2, 3, 0]
    assert [batches for _, batches in written] == [[(0, 1)], [(1, 1)], [(0, 2)]]
    assert written[-1][0] == pytest.approx(released_at, abs=1e-9)  # `second` and `third` went with the answer


async def test_a_full_batch_does_not_wait_for_its_partitions_batch_in_flight(scripted: Scripted) -> None:
    # Pipelining stays for partitions with more than a batch of records: a batch that filled
    # (a newer one was opened behind it) goes as soon as the connection can take a request.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, batch_size=1024) as p:
        written, node, (first,) = await _requests_unanswered(p, scripted, [0])
        filling = [await p.send("t", b"x" * 300, partition=0) for _ in range(4)]  # 3 fill a batch, 1 opens the next
        await asyncio.sleep(0.020)
        assert [batches for _, batches in written] == [[(0, 1)], [(0, 3)]]  # the full one, `first` unanswered
        node.release()
        offsets = [(await f).offset for f in (first, *filling)]
    assert offsets == [1, 2, 3, 4, 5]
    assert [batches for _, batches in written] == [[(0, 1)], [(0, 3)], [(0, 1)]]


async def test_a_batch_full_with_its_first_record_does_not_wait_for_its_partitions_answer(scripted: Scripted) -> None:
    # A record larger than batch_size fills its batch on its own: no record opens a batch
    # behind it, and nothing woke the sender for it, so it waited for the partition's answer
    # (here held: forever) although it was full.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, batch_size=1024) as p:
        written, node, (first,) = await _requests_unanswered(p, scripted, [0])
        large = await p.send("t", b"x" * 2000, partition=0)
        await asyncio.sleep(0.020)
        sent = [batches for _, batches in written]
        node.release()
        assert [(await f).offset for f in (first, large)] == [1, 2]
    assert sent == [[(0, 1)], [(0, 1)]]  # the full one went, `first` unanswered


@pytest.mark.parametrize("how", ["send", "lane", "send_many", "send_many_keyed"])
async def test_a_batch_filled_to_the_byte_does_not_wait_for_its_partitions_answer(scripted: Scripted, how: str) -> None:
    # Records that fill a batch exactly (no room for even an empty record after them) refuse no
    # record, so no batch opens behind it and nothing woke the sender: the full batch waited for
    # the partition's answer (or its linger), through each way a record goes into a batch.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    key = None if how in ("send", "send_many") else b"k"
    measure = RecordBatchBuilder(batch_size=1 << 20)
    for _ in range(3):
        measure.append(1_700_000_000_000, key, b"v" * 100)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, batch_size=measure.size_in_bytes) as p:
        written, node, (first,) = await _requests_unanswered(p, scripted, [0])
        if how == "send":  # send()'s own path (a timestamp given)
            futures = [await p.send("t", b"v" * 100, key, timestamp_ms=1_700_000_000_000) for _ in range(3)]
        elif how == "lane":  # the compiled lane, where built (same timestamp delta: sent within 64 ms)
            futures = [await p.send("t", b"v" * 100, key) for _ in range(3)]
        else:  # the bulk path, or record by record for keys
            futures = [await p.send_many("t", [b"v" * 100] * 3, keys=None if key is None else [key] * 3)]
        await asyncio.sleep(0.020)
        sent = [batches for _, batches in written]
        node.release()
        await asyncio.gather(first, *futures)
    assert sent == [[(0, 1)], [(0, 3)]]


async def test_a_batch_full_with_its_first_record_does_not_wait_for_a_linger(scripted: Scripted) -> None:
    # Nor did it go before the sender's next round, here another partition's linger ending.
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=1000, batch_size=1024) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        written = _record_requests(p, scripted.clock)
        lingering = await p.send("t", b"lingering", partition=1)  # the sender sleeps until its linger ends
        await asyncio.sleep(0.1)
        queued_at = scripted.clock.now
        large = await p.send("t", b"x" * 2000, partition=0)
        await large
        assert written[0] == (queued_at, [(0, 1)])  # at once, not 0.9 s later with `lingering`
        await lingering


async def test_a_batch_waiting_for_its_partitions_answer_makes_no_rounds(scripted: Scripted) -> None:
    # The answer wakes the sender: neither the batch being opened nor its linger ending is a
    # reason for a round (over 1,000 partitions such rounds, each visiting every partition with
    # data, had come 300-650 times per 100,000 records, sending nothing).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        written, node, (first,) = await _requests_unanswered(p, scripted, [0])
        rounds = _count_rounds(p)
        second = await p.send("t", b"second", partition=0)
        await asyncio.sleep(0.020)
        assert rounds == [0]
        node.release()
        assert [(await f).offset for f in (first, second)] == [1, 2]
    assert [batches for _, batches in written] == [[(0, 1)], [(0, 1)]]


async def test_a_lingered_batch_waits_while_its_leader_has_two_requests_in_flight(scripted: Scripted) -> None:
    # Past its linger, a batch waits while its leader's connection has two requests unanswered,
    # and goes in the round the first answer wakes. Over 1,000 partitions on a busy broker, a
    # request per linger ending had each taken a record or two of many partitions; held, the
    # partitions' batches gather the records that come meanwhile and go together.
    cluster = scripted.cluster
    cluster.create_topic("t", 4)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        written, node, unanswered = await _requests_unanswered(p, scripted, [0, 1])
        rounds = _count_rounds(p)
        lingered = [await p.send("t", b"lingered", partition=partition) for partition in (2, 3)]
        await asyncio.sleep(0.020)  # their lingers have ended
        assert len(written) == 2
        assert rounds == [0]  # neither their opening nor their lingers ending made a round
        released_at = scripted.clock.now
        node.release()
        assert [(await f).offset for f in (*unanswered, *lingered)] == [1, 0, 0, 0]
    assert [batches for _, batches in written] == [[(0, 1)], [(1, 1)], [(2, 1), (3, 1)]]
    assert written[-1][0] == pytest.approx(released_at, abs=1e-9)


async def test_a_lingered_batch_goes_with_a_full_batch_to_its_leader(scripted: Scripted) -> None:
    # A full batch still takes one of the five places at once, and a batch held by its linger
    # rides with it: partitions with more than a batch of records keep their pipelining, and a
    # stream of full batches cannot keep a lingered one back.
    cluster = scripted.cluster
    cluster.create_topic("t", 4)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, batch_size=1024) as p:
        written, node, unanswered = await _requests_unanswered(p, scripted, [0, 1])
        lingered = await p.send("t", b"lingered", partition=2)
        await asyncio.sleep(0.010)
        assert len(written) == 2
        filling = [await p.send("t", b"x" * 300, partition=3) for _ in range(4)]  # 3 fill a batch, 1 opens the next
        await asyncio.sleep(0)
        assert [sorted(batches) for _, batches in written][2:] == [[(2, 1), (3, 3)]]
        node.release()
        assert [(await f).offset for f in (*unanswered, lingered, *filling)] == [1, 0, 0, 0, 1, 2, 3]


async def test_other_requests_on_the_leaders_connection_do_not_hold_a_lingered_batch(scripted: Scripted) -> None:
    # Only the producer's own produce requests count: each of their answers wakes the sender,
    # an answer to anything else would not, and a batch held for it could wait for the next
    # record or its delivery timeout. Here the connection has three requests unanswered, one of
    # them a produce request: partition 1's batch still goes when its linger ends.
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        written, node, (first,) = await _requests_unanswered(p, scripted, [0])
        conn = p._pool.connection(1)
        assert conn is not None
        lookups = [asyncio.create_task(conn.send(MetadataRequest(topics=[]))) for _ in range(2)]
        await asyncio.sleep(0)
        assert conn.in_flight_count == 3
        await scripted.clock.advance_to_whole_millisecond()
        start = scripted.clock.now
        lingered = await p.send("t", b"lingered", partition=1)
        await asyncio.sleep(0.010)
        assert [batches for _, batches in written] == [[(0, 1)], [(1, 1)]]
        assert written[-1][0] == pytest.approx(start + 0.005, abs=1e-9)
        node.release()
        assert [(await f).offset for f in (first, lingered)] == [1, 0]
        await asyncio.gather(*lookups)


async def test_a_lingered_batch_is_not_left_out_of_requests_cut_at_the_size_limit(scripted: Scripted) -> None:
    # A broker slower than the records coming: full batches of three partitions keep two or more
    # requests unanswered, and each request is cut at max_request_size (two batches). The fourth
    # partition's lingered batch has its turn in the drain order like theirs; put after them, it
    # had waited for the whole backlog (or its delivery timeout, had the load lasted).
    cluster = scripted.cluster
    cluster.create_topic("t", 4)
    cluster.nodes[1].delay = 0.010
    config: dict[str, Any] = {"linger_ms": 5, "batch_size": 1024, "max_request_size": 2100}
    async with Producer(bootstrap_servers=cluster.bootstrap, **config) as p:
        await p.send_and_wait("t", b"warm-up", partition=3)
        hot = [await p.send("t", b"x" * 300, partition=index % 3) for index in range(900)]  # 300 full batches
        cold = await p.send("t", b"cold", partition=3)
        await cold
        assert sum(future.done() for future in hot) < 100
        await asyncio.gather(*hot)


@pytest.mark.parametrize("many", [False, True])
async def test_keyless_records_move_to_another_partition_after_a_batch_of_bytes(scripted: Scripted, many: bool) -> None:
    """KIP-794: the sticky partition changes after about batch_size bytes as encoded (records
    of 10-byte values take 17-18 bytes), not after a fraction of a batch nor after two."""
    scripted.cluster.create_topic("t", 2)
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap, linger_ms=10_000, batch_size=16_384) as p:
        await p.partitions_for("t")
        sticky = p._partitioner.sticky_states
        runs: list[int] = []  # records sent to each partition before it changed
        current, sent, since = None, 0, 0
        step = 10 if many else 1
        while len(runs) < 5:
            if many:
                await p.send_many("t", [b"0123456789"] * step)
            else:
                await p.send("t", b"0123456789")
            sent += step
            now = sticky["t"].partition
            if current is not None and now != current:
                runs.append(sent - since)
                since = sent
            current = now
        # The first run ends at its first switch; the others are whole runs.
        assert all(14_000 // 18 <= run <= 16_384 // 17 + step for run in runs[1:]), runs
        await p.close(timeout=0)


async def test_with_a_codec_keyless_records_stay_on_a_partition_for_a_batch_filled_compressed(
    scripted: Scripted,
) -> None:
    """KIP-794 with a codec: the sticky partition changes after a batch's worth of its estimated
    compressed bytes (the batch is filled by them). Counted uncompressed, it changed after
    batch_size bytes of records, leaving a batch of JSON a quarter full on the wire."""
    scripted.cluster.create_topic("t", 2)
    async with Producer(
        bootstrap_servers=scripted.cluster.bootstrap, linger_ms=10_000, batch_size=1024, compression_type="lz4"
    ) as p:
        await p.partitions_for("t")
        sticky = p._partitioner.sticky_states
        runs: list[int] = []  # records sent to each partition before it changed
        current, sent, since = None, 0, 0
        value = b'{"user": 12345, "event": "page_view", "page": "/catalog/item/7", "ok": true}'
        while sent < 8_000:
            await p.send("t", value)
            sent += 1
            now = sticky["t"].partition
            if current is not None and now != current:
                runs.append(sent - since)
                since = sent
            current = now
        # A record takes 85 bytes in its batch: 12 make batch_size. Once the estimate has learned
        # how lz4 shrinks them, a partition takes several times that before the next.
        assert runs[0] <= 13
        assert min(runs[-10:]) > 4 * 13, runs[-10:]
        await p.flush()
    assert sum(len(part.values) for part in scripted.cluster.topics["t"]) == 8_000

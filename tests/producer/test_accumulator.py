"""The accumulator and sequence bookkeeping, driven with an injected clock (no sleeping)."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

import pytest

from aioprod.cluster.metadata import Broker, ClusterSnapshot, PartitionInfo, TopicInfo
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaTimeoutError
from aioprod.producer.accumulator import BufferPool, RecordAccumulator
from aioprod.producer.batch import ProducerBatch, TopicPartition
from aioprod.producer.idempotence import SEQUENCE_MODULUS, IdempotenceState, sequence_before


def cluster(partitions: dict[int, int]) -> ClusterSnapshot:
    """One topic 't' whose partition p is led by node partitions[p] (-1: no leader)."""
    parts = {p: PartitionInfo(p, leader, 0, (leader,), (leader,)) for p, leader in partitions.items()}
    brokers = {n: Broker(n, "h", 9000 + n) for n in set(partitions.values()) if n >= 0}
    return ClusterSnapshot(MappingProxyType(brokers), MappingProxyType({"t": TopicInfo("t", MappingProxyType(parts))}))


def accumulator(**options: object) -> tuple[RecordAccumulator, list[int]]:
    wakeups: list[int] = []
    config = ProducerConfig.from_options(bootstrap_servers="h:1", **options)
    return RecordAccumulator(config, lambda: wakeups.append(1)), wakeups


def append(acc: RecordAccumulator, partition: int, value: bytes, now: float) -> None:
    size = acc.record_size(None, value, ())
    assert acc.pool.try_reserve(size)
    acc.append(TopicPartition("t", partition), 0, None, value, (), size, now)


async def test_batch_waits_for_linger_then_is_ready() -> None:
    acc, _ = accumulator(linger_ms=10)
    snapshot = cluster({0: 1})
    append(acc, 0, b"v", now=100.0)
    ready, delay, unknown, _, _ = acc.ready(snapshot, 100.004)
    assert ready == set() and delay == pytest.approx(0.006) and not unknown
    ready, _, _, _, _ = acc.ready(snapshot, 100.010)
    assert ready == {1}


async def test_full_batch_is_ready_at_once() -> None:
    acc, wakeups = accumulator(linger_ms=10_000, batch_size=200)
    snapshot = cluster({0: 1})
    append(acc, 0, b"x" * 100, now=0.0)
    append(acc, 0, b"y" * 100, now=0.0)  # does not fit: a second batch, the first is sendable
    assert acc.ready(snapshot, 0.0)[0] == {1}
    assert wakeups  # the sender was told


async def test_unknown_leader_is_reported() -> None:
    acc, _ = accumulator()
    append(acc, 0, b"v", now=0.0)
    ready, _, unknown, _, leaderless = acc.ready(cluster({0: -1}), 1.0)
    assert ready == set() and unknown == {"t"} and leaderless == [TopicPartition("t", 0)]


async def test_drain_respects_max_request_size_and_resumes_where_it_stopped() -> None:
    acc, _ = accumulator(linger_ms=0, batch_size=1000)
    snapshot = cluster({0: 1, 1: 1, 2: 1})
    for p in range(3):
        for _ in range(3):
            append(acc, p, b"x" * 900, now=0.0)
    served = []
    for _round in range(6):
        drained = acc.drain(acc.ready(snapshot, 1.0), [1], 1500, lambda b, q: True)
        assert len(drained[1]) == 1  # two 900-byte batches exceed 1500 bytes
        served.append(drained[1][0].tp.partition)
    assert served == [0, 1, 2, 0, 1, 2]  # each round starts where the last one stopped


async def test_expire_reports_not_sent_for_queued_batches() -> None:
    acc, _ = accumulator(delivery_timeout_ms=40_000)
    append(acc, 0, b"v", now=0.0)
    assert acc.next_deadline() == 40.0
    assert acc.expired(39.9) == []
    (batch,) = acc.expired(40.0)
    error = batch.expiry_error(40.0, 40_000)
    assert not error.possibly_persisted and "not sent" in str(error)
    assert not acc.has_queued  # taken out of its queue


async def test_reenqueue_keeps_sequence_order() -> None:
    acc, _ = accumulator(linger_ms=0)
    snapshot = cluster({0: 1})
    for value in (b"a", b"b", b"c"):
        append(acc, 0, value, now=0.0)
        (batch,) = acc.drain(acc.ready(snapshot, 0.0), [1], 10_000, lambda b, q: True)[1]
        batch.build(7, 0, {b"a": 0, b"b": 1, b"c": 2}[value], False)
        if value == b"a":
            a = batch
        elif value == b"b":
            b = batch
        else:
            c = batch
    for batch in (c, a, b):  # they come back in any order
        acc.reenqueue(batch, retry_at=0.0)
    order = []
    while True:
        drained = acc.drain(acc.ready(snapshot, 1.0), [1], 10_000, lambda b, q: True)
        if not drained:
            break
        order.extend(b.base_sequence for b in drained[1])
    assert order == [0, 1, 2]


async def test_buffer_pool_is_fifo_and_times_out() -> None:
    pool = BufferPool(100)
    assert pool.try_reserve(80)
    assert not pool.try_reserve(30)
    with pytest.raises(KafkaTimeoutError, match="buffer_memory"):
        await pool.reserve(30, timeout=0.01)
    pool.release(80)
    assert pool.used == 0


async def test_buffer_wait_cancelled_as_space_is_granted_is_cancelled() -> None:
    # The grant and the cancellation land in the same loop iteration: the caller must see
    # its cancellation (Python 3.11's wait_for returned normally here) and get no bytes.
    pool = BufferPool(100)
    assert pool.try_reserve(100)
    waiter = asyncio.ensure_future(pool.reserve(50, timeout=60))
    await asyncio.sleep(0)  # the waiter is queued
    assert pool.exhausted
    pool.release(100)  # grants the waiter its 50 bytes
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.used == 0 and not pool.exhausted


async def test_sequences_wrap_at_int32_max() -> None:
    acc, _ = accumulator(linger_ms=0)
    ident = IdempotenceState()
    ident.set_producer_id(5, 0)
    tp = TopicPartition("t", 0)
    ident.partition(tp).next_sequence = SEQUENCE_MODULUS - 2
    stamps = []
    for _ in range(2):
        for value in (b"a", b"b", b"c"):  # three records per batch
            append(acc, 0, value, now=0.0)
        (batch,) = acc.drain(acc.ready(cluster({0: 1}), 1.0), [1], 10_000, ident.can_send)[1]
        stamps.append(ident.stamp(batch))
    first, second = stamps[0][2], stamps[1][2]
    assert stamps[0][:2] == (5, 0) and first == 2**31 - 2 and second == 1  # 2**31-2, 2**31-1, 0 then 1
    assert sequence_before(first, second) and not sequence_before(second, first)


async def test_ready_and_drain_agree_at_the_linger_deadline() -> None:
    # With floats, created + 0.005 - now <= 0 while now - created < 0.005 for these two
    # times: the two rules once disagreed here, and the sender slept forever beside a batch
    # it believed sendable.
    created, now = 710.2446637546498, 710.2496637546498
    assert created + 0.005 - now <= 0 and now - created < 0.005
    acc, _ = accumulator(linger_ms=5)
    snapshot = cluster({0: 1})
    append(acc, 0, b"v", now=created)
    readiness = acc.ready(snapshot, now)
    drained = acc.drain(readiness, readiness.nodes, 10_000, lambda b, q: True)
    assert readiness.nodes == {1} and [b.tp.partition for b in drained[1]] == [0]


async def test_a_linger_that_passed_on_a_millisecond_clock_is_not_a_tiny_wait() -> None:
    # uvloop's clock counts milliseconds: 5 ms after 4298.377 it reads 4298.382, yet
    # created + 0.005 - now is 9e-13 > 0. Reported as a wait, the sender slept 9e-13 s,
    # woke on the next loop iteration to the same clock, and did so until it ticked.
    created, now = 4298.377, 4298.382
    assert created + 0.005 - now > 0
    acc, _ = accumulator(linger_ms=5)
    snapshot = cluster({0: 1})
    append(acc, 0, b"v", now=created)
    readiness = acc.ready(snapshot, now)
    assert readiness.nodes == {1}
    assert [b.tp.partition for b in acc.drain(readiness, readiness.nodes, 10_000, lambda b, q: True)[1]] == [0]


async def test_a_batch_counts_its_age_from_the_millisecond_it_was_opened_in() -> None:
    # As the Java producer's millisecond clock does. On asyncio's exact clock, a linger
    # counted from the exact instant ended on average 0.3 ms later still, as the selector
    # rounds a sleep up to the next millisecond.
    acc, _ = accumulator(linger_ms=5, delivery_timeout_ms=30_000, request_timeout_ms=20_000)
    snapshot = cluster({0: 1})
    append(acc, 0, b"v", now=100.0007)
    assert acc.ready(snapshot, 100.0049).nodes == set()
    assert acc.ready(snapshot, 100.005).nodes == {1}
    assert acc.next_deadline() == pytest.approx(130.0, abs=1e-9)


async def test_a_delivery_deadline_that_passed_on_a_millisecond_clock_expires_then() -> None:
    # 1000.003 + 120.0 is one float step past 1120.003, what uvloop's clock reads 120 s on.
    created, now = 1000.003, 1120.003
    assert created + 120.0 > now
    acc, _ = accumulator(linger_ms=5, delivery_timeout_ms=120_000, request_timeout_ms=30_000)
    append(acc, 0, b"v", now=created)
    assert [b.tp.partition for b in acc.expired(now)] == [0]


async def test_a_batch_split_across_the_sequence_wrap_hands_on_wrapped_sequences() -> None:
    # Its records had sequences 2**31-2, 2**31-1, 0 and 1: the parts must carry those, not 2**31
    # (out of int32: the part could not be built, and the sender failed).
    acc, _ = accumulator(linger_ms=0)
    ident = IdempotenceState()
    ident.set_producer_id(5, 0)
    ident.partition(TopicPartition("t", 0)).next_sequence = SEQUENCE_MODULUS - 2
    for value in (b"a" * 100, b"b" * 100, b"c" * 100, b"d" * 100):
        append(acc, 0, value, now=0.0)
    (batch,) = acc.drain(acc.ready(cluster({0: 1}), 0.0), [1], 10_000, ident.can_send)[1]
    batch.build(*ident.stamp(batch), False)
    parts = acc.split_and_reenqueue(batch, retry_at=0.0)
    assert len(parts) == 4  # at most half the batch's bytes each: one record
    sequences = [ident.stamp(part)[2] for part in parts]
    assert sequences == [2**31 - 2, 2**31 - 1, 0, 1]
    for part in parts:
        part.build(*ident.stamp(part), False)  # each part can be sent


def drain_one(acc: RecordAccumulator, ident: IdempotenceState) -> list[ProducerBatch]:
    """What one drain of partition 0 (leader 1) sends, stamped and on the wire."""
    sent = acc.drain(acc.ready(cluster({0: 1}), 0.0), [1], 10_000, ident.can_send).get(1, [])
    for batch in sent:
        batch.build(*ident.stamp(batch), False)
        ident.sent(batch)
    return sent


async def test_a_batch_acknowledged_after_it_expired_across_the_wrap_resolves_the_doubt() -> None:
    # The batch expired on the wire (the partition's next sequence in doubt), then the broker
    # acknowledged it: the broker has every sequence given out, across the wrap at 2**31, so the
    # partition goes on under its identity, pipelining again, with no new identity.
    acc, _ = accumulator(linger_ms=0, batch_size=200)
    ident = IdempotenceState()
    ident.set_producer_id(5, 0)
    entry = ident.partition(TopicPartition("t", 0))
    entry.next_sequence = entry.acked_next = SEQUENCE_MODULUS - 2
    for value in (b"a", b"b", b"c"):
        append(acc, 0, value, now=0.0)
    (expired,) = drain_one(acc, ident)  # sequences 2**31-2, 2**31-1 and 0
    ident.failed(expired)
    ident.returned(expired)
    ident.acked(expired)
    for value in (b"d" * 100, b"e" * 100):  # a batch each
        append(acc, 0, value, now=0.0)
    (first,) = drain_one(acc, ident)
    (second,) = drain_one(acc, ident)  # not waiting for the first's answer
    assert not ident.in_doubt
    assert [ident.stamp(b) for b in (first, second)] == [(5, 0, 1), (5, 0, 2)]


async def test_acknowledgements_out_of_order_do_not_take_the_acknowledged_sequence_back() -> None:
    # Two leaders answer in their own order (the leader moved with a batch on the wire): the
    # later batch's acknowledgement first. The broker has both: the partition's doubt (the later
    # batch had expired) is resolved without a new identity.
    acc, _ = accumulator(linger_ms=0, batch_size=200)
    ident = IdempotenceState()
    ident.set_producer_id(5, 0)
    for value in (b"a" * 100, b"b" * 100):
        append(acc, 0, value, now=0.0)
    (earlier,) = drain_one(acc, ident)
    (later,) = drain_one(acc, ident)
    ident.failed(later)  # expired on the wire
    for batch in (later, earlier):
        ident.returned(batch)
        ident.acked(batch)
    append(acc, 0, b"c", now=0.0)
    (after,) = drain_one(acc, ident)
    assert not ident.new_identity_needed and ident.stamp(after) == (5, 0, 2)


async def test_at_most_five_batches_of_a_partition_are_on_the_wire() -> None:
    # The broker recognises a repeat among the last five batches of a producer and partition only.
    acc, _ = accumulator(linger_ms=0, batch_size=200)
    ident = IdempotenceState()
    ident.set_producer_id(5, 0)
    for i in range(6):
        append(acc, 0, b"%d" % i * 100, now=0.0)
    sent = [batch for _ in range(6) for batch in drain_one(acc, ident)]
    assert [ident.stamp(b)[2] for b in sent] == [0, 1, 2, 3, 4]
    ident.returned(sent[0])
    ident.acked(sent[0])
    assert [ident.stamp(b)[2] for b in drain_one(acc, ident)] == [5]


async def test_batches_filling_max_request_size_exactly_go_in_one_request() -> None:
    acc, _ = accumulator(linger_ms=0, batch_size=200)
    for partition in (0, 1):
        append(acc, partition, b"x" * 100, now=0.0)
    readiness = acc.ready(cluster({0: 1, 1: 1}), 0.0)
    total = sum(queue[0].size for _, queue, _ in readiness.sendable)
    assert len(acc.drain(readiness, [1], total, lambda b, q: True)[1]) == 2


async def test_a_split_batch_expires_at_its_original_deadline_among_later_batches() -> None:
    # The parts of a split batch keep the first batch's deadline, earlier than that of a batch
    # created after it: they expire first, and the next deadline is theirs until then.
    acc, _ = accumulator(linger_ms=0, delivery_timeout_ms=30_000, request_timeout_ms=20_000)
    snapshot = cluster({0: 1, 1: 1})
    for value in (b"a" * 100, b"b" * 100):
        append(acc, 0, value, now=0.0)
    (first,) = acc.drain(acc.ready(snapshot, 0.0), [1], 10_000, lambda b, q: True)[1]
    first.build(-1, -1, -1, False)
    append(acc, 1, b"later", now=10.0)
    parts = acc.split_and_reenqueue(first, retry_at=10.0)
    assert len(parts) == 2 and acc.next_deadline() == 30.0
    assert acc.expired(29.9) == []
    assert sorted(map(id, acc.expired(30.0))) == sorted(map(id, parts)) and acc.next_deadline() == 40.0
    (later,) = acc.expired(40.0)
    assert later.tp.partition == 1 and acc.next_deadline() is None


def _compressible(i: int) -> bytes:
    """A JSON event of about 100 bytes, as an application writes them: lz4 shrinks a batch of
    them about 4 times."""
    return b'{"user": %d, "event": "page_view", "page": "/catalog/item/%d", "ok": true}' % (i % 997, i % 13)


def _send_compressible(
    acc: RecordAccumulator, records: int, refused_over: int | None = None
) -> tuple[list[tuple[int, int]], int]:
    """Append ``records`` JSON records to t-0, sending each batch as it fills as the sender does
    (built; the estimate told its compressed size on its first attempt); a broker refuses those
    over ``refused_over`` bytes (MESSAGE_TOO_LARGE: split). The batches sent (uncompressed size,
    size on the wire), and how many were refused."""
    snapshot = cluster({0: 1})
    queue = acc._queue_for(TopicPartition("t", 0))
    sent: list[tuple[int, int]] = []
    refused = 0
    for i in range(records):
        append(acc, 0, _compressible(i), now=0.0)
        while len(queue) > 1:
            batch = acc.drain(acc.ready(snapshot, 0.0), [1], 10_000_000, lambda b, q: True)[1][0]
            payload = batch.build(-1, -1, -1, False)
            if not batch.attempts:
                acc.compressed(batch, len(payload))
            batch.attempts += 1
            if refused_over is not None and len(payload) > refused_over:
                refused += 1
                acc.split_and_reenqueue(batch, 0.0)
            else:
                sent.append((batch.builder.size_in_bytes, len(payload)))
    return sent, refused


async def test_with_a_codec_batches_fill_batch_size_compressed_as_the_ratio_estimate_learns() -> None:
    # Batches were closed at batch_size uncompressed: 16 KiB of JSON went as 4 KiB of lz4, four
    # times the batches (requests, broker work) Java's producer makes of the same records, whose
    # estimate of the topic's compression ratio fills them compressed.
    acc, _ = accumulator(linger_ms=60_000, batch_size=16384, compression_type="lz4")
    sent, _ = _send_compressible(acc, 60_000)
    first_uncompressed, first_wire = sent[0]
    assert first_uncompressed <= 16384  # nothing learned yet: as without a codec
    last_uncompressed, last_wire = sent[-1]
    # The estimate improves by 0.005 a batch (Java's pace: a batch estimated too full goes over
    # batch_size): after 160 batches of these, the last holds four times the records of the first.
    assert last_uncompressed > 4 * 16384 and last_wire > 4 * first_wire
    assert all(wire <= 16384 for _, wire in sent)  # never more than batch_size on the wire


async def test_a_split_batch_starts_its_topics_ratio_estimate_over() -> None:
    # The broker refused a batch as too large: the estimate that filled it is not trusted (Java's).
    acc, _ = accumulator(linger_ms=60_000, batch_size=16384, compression_type="lz4")
    sent, _ = _send_compressible(acc, 30_000)
    assert sent[-1][0] > 2 * 16384
    (refused,) = acc._batches[TopicPartition("t", 0)]  # the open batch, refused when it goes
    refused.build(-1, -1, -1, False)
    parts = acc.split_and_reenqueue(refused, 0.0)
    # Each part at most half the refused batch's uncompressed bytes, and batch_size: not half its
    # compressed size (which cut it into four times as many parts).
    assert all(part.builder.size_in_bytes <= 16384 for part in parts)
    assert len(parts) <= 3  # 24 KB of records: two halves (and a record left over), not 16 parts
    sent, _ = _send_compressible(acc, 400)
    assert sent and sent[-1][0] <= 16384  # batches of batch_size uncompressed again


async def test_a_topic_whose_limit_is_below_batch_size_has_a_batch_refused_once_not_again() -> None:
    # The topic's max.message.bytes (2,500) is below batch_size (4,096), and above any 4 KiB of JSON
    # compressed: counted uncompressed, no batch was refused. With the ratio estimate, batches grew
    # until one was refused; the split started the estimate over, the batches grew again, and a
    # batch was refused and split every hundred or so, for ever.
    acc, _ = accumulator(linger_ms=60_000, batch_size=4096, compression_type="lz4")
    _, refusals = _send_compressible(acc, 60_000, refused_over=2500)
    assert refusals, "the estimate never grew a batch past the topic's limit: the test proves nothing"
    assert refusals <= 2  # the batch refused, and the one open meanwhile at most

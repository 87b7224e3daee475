"""The compiled send lane (``SendLane`` in aioprod/_speedups.c) against send()'s own path.

The lane queues a record in its partition's open batch in one C call, or changes nothing and
returns None so that send() takes its own path. These tests drive it with a real accumulator
and partitioner (no broker) and check that what it does matches what send()'s path would have
done, and that everything it declines leaves no trace; the last one runs the same records
through a producer with and without lanes on a real broker and reads both back. Skipped where
the extension was not built, unless ``AIOPROD_REQUIRE_SPEEDUPS=1`` (set by CI).
"""

from __future__ import annotations

import asyncio
import os
import random
from types import MappingProxyType
from typing import Any

import pytest

from aioprod import Producer
from aioprod._compiled import COMPILED
from aioprod.cluster.metadata import Broker, ClusterSnapshot, PartitionInfo, TopicInfo
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaError
from aioprod.producer.accumulator import RECORD_OVERHEAD, RecordAccumulator
from aioprod.producer.batch import ProducerBatch, TopicPartition
from aioprod.producer.partitioner import RECORD_FRAMING, Partitioner, partition_for_key
from aioprod.protocol.records import RecordBatchBuilder
from tests.brokers import TansuBroker
from tests.readback import read_topic

try:
    from aioprod import _speedups
except ImportError:
    if os.environ.get("AIOPROD_REQUIRE_SPEEDUPS", "") not in ("", "0"):
        raise
    pytest.skip("aioprod._speedups is not built (no C compiler at install time)", allow_module_level=True)
if not COMPILED:
    pytest.skip("AIOPROD_PURE_PYTHON=1: the pure-Python path has no lane", allow_module_level=True)

PARTITIONS = 3
TPS = [TopicPartition("t", p) for p in range(PARTITIONS)]


def snapshot(leaders: tuple[int, ...] = (1,) * PARTITIONS) -> ClusterSnapshot:
    """Topic 't': partition p led by node leaders[p] (-1: no leader, so not available)."""
    parts = {p: PartitionInfo(p, leader, 0, (1,), (1,)) for p, leader in enumerate(leaders)}
    info = TopicInfo("t", MappingProxyType(parts))
    return ClusterSnapshot(MappingProxyType({1: Broker(1, "h", 9001)}), MappingProxyType({"t": info}))


class FakeProducer:
    """What the lane asks of its producer: the count of sends, shared with send()'s own path, the
    clock check, and the word that a record filled its batch (which may wake the sender, counted)."""

    def __init__(self) -> None:
        self._sends = _speedups.SendCount()
        self.clock_checks = 0
        self.wakeups = 0
        self.acc: RecordAccumulator | None = None

    def _clock_check(self) -> None:
        self._sends.count = 0
        self.clock_checks += 1

    def _batch_filled(self, batch: ProducerBatch) -> None:
        assert self.acc is not None
        self.acc.filled(batch)

    def wakeup(self) -> None:
        self.wakeups += 1


class Setup:
    """An accumulator, a partitioner and a lane over them, as Producer._open_lane makes it."""

    def __init__(
        self, batch_size: int = 16384, clock_every: int = 64, buffer_memory: int = 32 << 20, compression: str = "none"
    ) -> None:
        self.config = ProducerConfig.from_options(
            bootstrap_servers="h:1", batch_size=batch_size, buffer_memory=buffer_memory, compression_type=compression
        )
        self.producer = FakeProducer()
        self.acc = self.producer.acc = RecordAccumulator(self.config, self.producer.wakeup)
        self.partitioner = Partitioner("default", batch_size, random.Random(3))
        if compression != "none":  # as Producer.start(): a batch's worth is what fills one compressed
            self.partitioner.batch_fill = self.acc.fill_size
        self.clock_every = clock_every
        self.metadata = type("Metadata", (), {})()
        self.new_metadata(snapshot())

    def new_metadata(self, cluster: ClusterSnapshot) -> None:
        """A metadata refresh, and the lane send() then makes for the new snapshot."""
        self.snapshot = self.metadata.snapshot = cluster
        info = cluster.topics["t"]
        batch_size = self.config.batch_size
        self.lane = _speedups.SendLane(
            topic="t",
            producer=self.producer,
            sends=self.producer._sends,
            metadata=self.metadata,
            snapshot=self.snapshot,
            tps=TPS,
            batches=self.acc.open_batches,
            pool=self.acc.pool,
            sticky=self.partitioner.sticky_states,
            available=info.available_partitions,
            partitions=len(info.all_partitions),
            overhead=RECORD_OVERHEAD,
            framing=RECORD_FRAMING,
            size_limit=min(self.config.max_request_size, self.config.buffer_memory),
            batch_size=batch_size,
            clock_every=self.clock_every,
        )

    def own_path(self, key: bytes | None, value: bytes | None, timestamp: int | None = None) -> Any:
        """What send() does for a record the lane declines: partition, reserve (None: it would
        wait for memory), append, and count a send that opened no batch."""
        info = self.snapshot.topics["t"]
        size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
        if key is None:
            counted = size - RECORD_OVERHEAD + RECORD_FRAMING
            partition = self.partitioner.keyless("t", counted, info.all_partitions, info.available_partitions)
        else:
            partition = partition_for_key(key, PARTITIONS)
        if not self.acc.pool.try_reserve(size):
            return None
        created = self.acc.batches_created
        now = _speedups.now_ms() if timestamp is None else timestamp
        future = self.acc.append(TPS[partition], now, key, value, (), size)
        if self.acc.batches_created == created:
            self.producer._sends.count += 1
            if self.producer._sends.count >= self.clock_every:
                self.producer._clock_check()
        return future

    def send(self, key: bytes | None, value: bytes | None) -> tuple[Any, bool]:
        """send()'s order: the lane, then (the lane having left no trace) its own path; the
        future, and whether the lane took the record."""
        before = self.state()
        future = self.lane.send(value, key)
        if future is not None:
            return future, True
        assert self.state() == before
        return self.own_path(key, value), False

    def state(self) -> tuple[Any, ...]:
        """Everything the lane may change: the pool, each batch's records, bytes, reserve and
        fullness, the sticky state, the count of sends and of clock checks."""
        batches = tuple(
            (
                tp,
                tuple(
                    (b.builder.record_count, len(b.builder._buf), b.reserved, b.builder.is_full, b.payload)
                    for b in queue
                ),
            )
            for tp, queue in self.acc.open_batches.items()
        )
        sticky = {t: (s.partition, s.produced, s.available) for t, s in self.partitioner.sticky_states.items()}  # type: ignore[union-attr]
        counts = self.producer._sends.count, self.producer.clock_checks, self.producer.wakeups
        return self.acc.pool.used, batches, sticky, counts


def send_both(laned: Setup, reference: Setup, key: bytes | None, value: bytes | None) -> bool:
    """The record through ``laned`` as send() does and through ``reference``'s own path alone, at
    the same timestamp (the lane reads the clock itself); whether the lane took it."""
    future, through_lane = laned.send(key, value)
    expected = reference.own_path(key, value, None if future is None else future._timestamp)
    assert (future is None) == (expected is None)  # send() would wait for memory in both
    assert future is None or future._index == expected._index
    return through_lane


async def test_a_keyed_record_joins_its_partitions_open_batch_as_sends_own_path_would() -> None:
    laned, reference = Setup(), Setup()
    assert not send_both(laned, reference, b"key", b"first")  # send()'s own path opens the batch
    assert send_both(laned, reference, b"key", b"second")
    assert laned.state() == reference.state()
    future = laned.lane.send(b"third", b"key")
    assert future is not None and future._index == 2
    batch = laned.acc.open_batches[TPS[partition_for_key(b"key", PARTITIONS)]][-1]
    assert future._settlement is batch.settlement


async def test_keyless_records_count_towards_the_sticky_partition_alike() -> None:
    laned, reference = Setup(batch_size=1024), Setup(batch_size=1024)
    # First records of 128 bytes in their batch (with RECORD_FRAMING), eight to the sticky partition's 1,024:
    # the eighth reaches it exactly, and the partition switches after it.
    values = [bytes(128 - RECORD_FRAMING)] * 40 + [bytes(random.Random(i).randrange(0, 200)) for i in range(200)]
    declined = sum(not send_both(laned, reference, None, value) for value in values)
    assert laned.state() == reference.state()
    # The lane took the records between switches; each switch (and each new batch) was send()'s own.
    assert 0 < declined < len(values) // 3


async def test_what_the_lane_declines_leaves_no_trace() -> None:
    setup = Setup(batch_size=512)
    setup.own_path(b"key", b"v")
    before = setup.state()
    assert setup.lane.send(bytearray(b"v"), b"key") is None  # send() converts it, or refuses it
    assert setup.lane.send(b"v", "key") is None
    assert setup.lane.send(b"v" * (setup.config.max_request_size + 1), b"key") is None  # send() raises
    home = partition_for_key(b"key", PARTITIONS)
    elsewhere = next(k for k in (b"k%d" % i for i in range(100)) if partition_for_key(k, PARTITIONS) != home)
    assert setup.lane.send(b"v", elsewhere) is None  # no batch open there: send() starts one
    assert setup.lane.send(b"v" * 600, b"key") is None  # does not fit: send() starts the next batch
    assert setup.state() == before

    setup.metadata.snapshot = snapshot()  # new metadata: send() looks the topic up again
    assert setup.lane.send(b"v", b"key") is None
    setup.metadata.snapshot = setup.snapshot

    waiter = asyncio.get_running_loop().create_future()
    setup.acc.pool._waiters.append((1, waiter))  # someone waits for memory: no queue-jumping
    assert setup.lane.send(b"v", b"key") is None
    setup.acc.pool._waiters.clear()

    queue = setup.acc.open_batches[TPS[home]]
    queue[-1].payload = b"built"  # the sender has taken the batch
    assert setup.lane.send(b"v", b"key") is None
    queue[-1].payload = None
    assert setup.state() == before
    assert setup.lane.send(b"v", b"key") is not None


async def test_every_so_many_sends_through_the_lane_look_at_the_clock() -> None:
    # Whether or not answers are awaited: a round due by its linger needs the loop to run too.
    setup = Setup(clock_every=4)
    setup.own_path(b"key", b"v")  # opens the batch: not counted
    assert setup.producer._sends.count == 0
    for _ in range(10):
        assert setup.lane.send(b"v", b"key") is not None
    assert setup.producer.clock_checks == 2  # at the lane's 4th and 8th record
    setup.acc.on_wire[TPS[0]] = 1  # a batch awaits its answer: no different
    for _ in range(10):
        assert setup.lane.send(b"v", b"key") is not None
    assert setup.producer.clock_checks == 5
    # One count for send()'s own path and every lane (one per topic; here a second lane over the
    # same one): a loop over many topics looks at the clock as often as a loop over one.
    other_lane = setup.lane
    setup.new_metadata(setup.snapshot)
    for sent in range(1, 7):
        lane = (other_lane, setup.lane)[sent % 2]
        assert lane.send(b"v", b"key") is not None
        setup.own_path(b"key", b"v")
        assert setup.producer._sends.count == 2 * sent % 4
    assert setup.producer.clock_checks == 8


@pytest.mark.parametrize("seed", range(16))
async def test_the_lane_and_sends_own_path_stay_in_step_through_what_a_producer_meets(seed: int) -> None:
    """Two accumulators fed the same records, one through the lane first: after every step they
    hold the same state, and whatever the lane declined left none. Between records, what a running
    producer meets: a full buffer, batches taken by the sender (built, or closed with nothing
    sent), batches answered, leaders lost and found, a connection full, answers awaited."""
    rng = random.Random(seed)
    batch_size, memory = rng.choice([256, 1024, 4096]), rng.choice([3000, 20000, 1 << 20])
    laned, reference = Setup(batch_size, 5, memory), Setup(batch_size, 5, memory)
    through_lane = 0
    for _ in range(1000):
        roll = rng.random()
        tp = rng.choice(TPS)
        leaders = (*(rng.choice((1, 1, -1)) for _ in range(PARTITIONS - 1)), 1)  # partition 2 keeps one
        for setup in (laned, reference):
            queue = setup.acc.open_batches.get(tp)
            if roll < 0.03 and queue:
                answer_the_head(setup, tp)
            elif roll < 0.05 and queue and queue[-1].payload is None:  # taken by the sender
                queue[-1].payload = queue[-1].builder.build()
            elif roll < 0.06 and queue and queue[-1].payload is None:  # closed, not yet sent
                queue[-1].builder.build()
            elif 0.06 <= roll < 0.08:
                setup.new_metadata(snapshot(leaders))
            elif 0.08 <= roll < 0.10:
                setup.acc.blocked.symmetric_difference_update({1})
            elif 0.10 <= roll < 0.12 and setup.acc.on_wire.pop(tp, None) is None:
                setup.acc.on_wire[tp] = 1
        if roll >= 0.12:
            key = None if rng.random() < 0.5 else b"key-%d" % rng.randrange(30)
            value = None if rng.random() < 0.05 else bytes(rng.randrange(0, 400))
            through_lane += send_both(laned, reference, key, value)
        assert laned.state() == reference.state()
    assert through_lane > 0


def answer_the_head(setup: Setup, tp: TopicPartition) -> None:
    """The head batch of ``tp`` answered: it leaves the queue and its memory goes back."""
    queue = setup.acc.open_batches[tp]
    batch = queue.popleft()
    if not queue:
        del setup.acc.open_batches[tp]
    setup.acc.pool.release(batch.reserved)
    batch.reserved = 0


@pytest.mark.parametrize("seed", range(6))
async def test_with_a_codec_the_lane_and_sends_own_path_count_the_sticky_partition_alike(seed: int) -> None:
    """With a codec the sticky count starts below 0 (a batch fills past batch_size uncompressed),
    at the topic's estimate when the partition is chosen; the estimate changes as batches are
    compressed, compressible values then random ones, leaders lost and found meanwhile."""
    rng = random.Random(seed)
    batch_size = rng.choice([256, 1024, 4096])
    laned, reference = Setup(batch_size, 5, compression="lz4"), Setup(batch_size, 5, compression="lz4")
    for setup in (laned, reference):
        setup.acc._ratios["t"] = 0.15  # learned from earlier batches
    through_lane, lowest = 0, 0
    for step in range(1500):
        roll = rng.random()
        tp = rng.choice(TPS)
        leaders = (*(rng.choice((1, 1, -1)) for _ in range(PARTITIONS - 1)), 1)
        for setup in (laned, reference):
            queue = setup.acc.open_batches.get(tp)
            if roll < 0.03 and queue:
                answer_the_head(setup, tp)
            elif roll < 0.10 and queue and queue[0].payload is None:  # sent, its ratio told
                queue[0].payload = queue[0].build(-1, -1, -1, False)
                setup.acc.compressed(queue[0], len(queue[0].payload))
            elif 0.10 <= roll < 0.11:
                setup.new_metadata(snapshot(leaders))
        if roll >= 0.11:
            key = None if rng.random() < 0.8 else b"key-%d" % rng.randrange(30)
            value = b'{"user": %d, "event": "page_view", "ok": true}' % rng.randrange(100)
            if step >= 1000:
                value = rng.randbytes(rng.randrange(0, 300))
            through_lane += send_both(laned, reference, key, value)
        assert laned.state() == reference.state()
        lowest = min([lowest, *(state.produced for state in laned.partitioner._sticky.values())])
    assert through_lane > 0 and lowest < 0


async def test_a_producer_failing_everything_queued_leaves_the_lane_nothing_to_append_to() -> None:
    setup = Setup()
    queued = [setup.send(b"key", b"v")[0] for _ in range(3)]
    batches = setup.acc.open_batches
    failed = setup.acc.fail_all(lambda _batch: KafkaError("the producer is closing"))
    assert setup.acc.open_batches is batches and not batches  # emptied in place: the lane sees it
    assert setup.lane.send(b"v", b"key") is None
    assert len(failed) == 1 and all(isinstance(future.exception(), KafkaError) for future in queued)


class InterruptedProducer(FakeProducer):
    """A fake producer to inject one fault: a signal handler's ``SystemExit`` (``sys.exit()`` on
    SIGTERM) or ``KeyboardInterrupt`` raised while the lane tells it that a record filled its batch."""

    interrupt: type[BaseException] = SystemExit

    def _batch_filled(self, batch: ProducerBatch) -> None:
        raise self.interrupt()


@pytest.mark.parametrize("interrupt", [SystemExit, KeyboardInterrupt])
async def test_an_exit_raised_as_the_lane_reports_a_filled_batch_is_raised(interrupt: type[BaseException]) -> None:
    # send()'s own path raises it (from RecordAccumulator.filled); the lane wrote it as
    # "Exception ignored" and went on: a SIGTERM handler's sys.exit() was lost.
    measure = RecordBatchBuilder(batch_size=1 << 20)
    for _ in range(3):
        measure.append(1_700_000_000_000, b"k", b"v" * 100)
    setup = Setup(batch_size=measure.size_in_bytes)
    setup.producer.__class__ = InterruptedProducer  # (the lane holds this object)
    setup.producer.interrupt = interrupt  # type: ignore[attr-defined]
    setup.own_path(b"k", b"v" * 100)
    assert setup.lane.send(b"v" * 100, b"k") is not None
    with pytest.raises(interrupt):
        setup.lane.send(b"v" * 100, b"k")  # fills the batch (queued, as by send()'s own path)
    batch = setup.acc.open_batches[TPS[partition_for_key(b"k", PARTITIONS)]][-1]
    assert batch.builder.record_count == 3 and batch.builder.is_full


def records(seed: int) -> list[tuple[bytes | None, Any, dict[str, Any]]]:
    """Keyed and keyless records with, now and then, what the lane leaves to send()'s own path."""
    rng = random.Random(seed)
    made: list[tuple[bytes | None, Any, dict[str, Any]]] = []
    for i in range(3000):
        key = None if rng.random() < 0.4 else b"key-%d" % rng.randrange(20)
        value: Any = bytes([i % 256]) * rng.randrange(0, 300)
        extra: dict[str, Any] = {}
        roll = rng.random()
        if roll < 0.02:
            value = bytearray(value)
        elif roll < 0.04:
            extra["headers"] = [("h", b"%d" % i)]
        elif roll < 0.06:
            extra["partition"] = rng.randrange(4)
        made.append((key, value, extra))
    return made


async def produce(bootstrap: str, topic: str, lanes: bool) -> tuple[list[tuple[int, int]], int]:
    """Send the records; their (partition, offset) and how many went through send()'s own path."""
    async with Producer(bootstrap_servers=bootstrap, batch_size=2048, linger_ms=5) as producer:
        producer._partitioner._random.seed(11)
        producer._lanes_on = lanes
        acc = producer._accumulator
        own_path = 0
        append = acc.append

        def counted(*args: Any) -> Any:
            nonlocal own_path
            own_path += 1
            return append(*args)

        acc.append = counted  # type: ignore[method-assign]
        held = (acc.open_batches, acc.blocked, acc.on_wire)  # what the lanes hold: never rebound
        futures = [await producer.send(topic, value, key=key, **extra) for key, value, extra in records(5)]
        acked = [await future for future in futures]
        assert acc.pool.used == 0
        assert all(now is then for now, then in zip((acc.open_batches, acc.blocked, acc.on_wire), held, strict=True))
        assert list(producer._lanes) == ([topic] if lanes else [])
    return [(md.partition, md.offset) for md in acked], own_path


@pytest.mark.integration
async def test_a_producer_with_lanes_writes_what_one_without_writes(tansu_broker: TansuBroker, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = tansu_broker.bootstrap
    topics = [f"{topic}-lanes", f"{topic}-own"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(t, 4, 1) for t in topics])
    for future in created.values():
        future.result(30)
    with_lanes, laned_own_path = await produce(bootstrap, topics[0], lanes=True)
    without, unlaned_own_path = await produce(bootstrap, topics[1], lanes=False)
    assert with_lanes == without  # every record at the same partition and offset
    assert unlaned_own_path == 3000 and laned_own_path < 3000 // 2
    sent = records(5)
    for name in topics:
        got = {(c.partition, c.offset): (c.key, c.value) for c in read_topic(bootstrap, name)}
        assert got == {where: (key, bytes(value)) for where, (key, value, _) in zip(with_lanes, sent, strict=True)}

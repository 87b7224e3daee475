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
from aioprod.producer.accumulator import RECORD_OVERHEAD, RecordAccumulator
from aioprod.producer.batch import TopicPartition
from aioprod.producer.partitioner import Partitioner, partition_for_key
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


def snapshot() -> ClusterSnapshot:
    parts = {p: PartitionInfo(p, 1, 0, (1,), (1,)) for p in range(PARTITIONS)}
    info = TopicInfo("t", MappingProxyType(parts))
    return ClusterSnapshot(MappingProxyType({1: Broker(1, "h", 9001)}), MappingProxyType({"t": info}))


class FakeProducer:
    """The two things the lane asks of its producer: the unyielded-send count and the clock check."""

    def __init__(self) -> None:
        self._sends_since_clock_check = 0
        self.clock_checks = 0

    def _clock_check(self) -> None:
        self._sends_since_clock_check = 0
        self.clock_checks += 1


class Setup:
    """An accumulator, a partitioner and a lane over them, as Producer._open_lane makes it."""

    def __init__(self, batch_size: int = 16384, clock_every: int = 64) -> None:
        self.config = ProducerConfig.from_options(bootstrap_servers="h:1", batch_size=batch_size)
        self.acc = RecordAccumulator(self.config, lambda: None)
        self.partitioner = Partitioner("default", batch_size, random.Random(3))
        self.producer = FakeProducer()
        self.snapshot = snapshot()
        self.metadata = type("Metadata", (), {})()
        self.metadata.snapshot = self.snapshot
        info = self.snapshot.topics["t"]
        self.lane = _speedups.SendLane(
            topic="t",
            producer=self.producer,
            metadata=self.metadata,
            snapshot=self.snapshot,
            tps=TPS,
            batches=self.acc.open_batches,
            pool=self.acc.pool,
            blocked=self.acc.blocked,
            on_wire=self.acc.on_wire,
            sticky=self.partitioner.sticky_states,
            available=info.available_partitions,
            partitions=len(info.all_partitions),
            overhead=RECORD_OVERHEAD,
            size_limit=self.config.max_request_size,
            batch_size=batch_size,
            clock_every=clock_every,
        )

    def own_path(self, key: bytes | None, value: bytes | None) -> Any:
        """What send() does for a record the lane declines: partition, reserve, append."""
        info = self.snapshot.topics["t"]
        size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
        if key is None:
            partition = self.partitioner.keyless("t", size, info.all_partitions, info.available_partitions)
        else:
            partition = partition_for_key(key, PARTITIONS)
        assert self.acc.pool.try_reserve(size)
        return self.acc.append(TPS[partition], _speedups.now_ms(), key, value, (), size)

    def send(self, key: bytes | None, value: bytes | None) -> Any:
        """send()'s order: the lane, then its own path if the lane declined."""
        return self.lane.send(value, key) or self.own_path(key, value)

    def state(self) -> tuple[Any, ...]:
        """Everything the lane may change: the pool, each batch's records and reserve, the sticky state."""
        batches = tuple(
            (tp, tuple((batch.builder.record_count, batch.reserved) for batch in queue))
            for tp, queue in self.acc.open_batches.items()
        )
        sticky = {t: (s.partition, s.produced) for t, s in self.partitioner.sticky_states.items()}  # type: ignore[union-attr]
        return self.acc.pool.used, batches, sticky, self.producer._sends_since_clock_check


async def test_a_keyed_record_joins_its_partitions_open_batch_as_sends_own_path_would() -> None:
    laned, reference = Setup(), Setup()
    for setup in (laned, reference):
        setup.own_path(b"key", b"first")  # opens the partition's batch
    future = laned.lane.send(b"second", b"key")
    reference.own_path(b"key", b"second")
    assert future is not None and future._index == 1
    assert laned.state() == reference.state()
    batch = laned.acc.open_batches[TPS[partition_for_key(b"key", PARTITIONS)]][-1]
    assert future._settlement is batch.settlement


async def test_keyless_records_count_towards_the_sticky_partition_alike() -> None:
    laned, reference = Setup(batch_size=1024), Setup(batch_size=1024)
    values = [bytes(random.Random(i).randrange(0, 200)) for i in range(200)]
    declined = 0
    for value in values:
        if laned.lane.send(value, None) is None:
            declined += 1
            laned.own_path(None, value)
        reference.own_path(None, value)
    assert laned.state() == reference.state()
    # The lane took the records between switches; each switch (and each new batch) was send()'s own.
    assert 0 < declined < len(values) // 4


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


async def test_every_so_many_sends_with_answers_awaited_look_at_the_clock() -> None:
    setup = Setup(clock_every=4)
    setup.own_path(b"key", b"v")
    for _ in range(10):
        assert setup.lane.send(b"v", b"key") is not None
    assert setup.producer.clock_checks == 0 and setup.producer._sends_since_clock_check == 0
    setup.acc.on_wire[TPS[0]] = 1  # a batch awaits its answer
    for _ in range(10):
        assert setup.lane.send(b"v", b"key") is not None
    assert setup.producer.clock_checks == 2 and setup.producer._sends_since_clock_check == 2


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
        futures = [await producer.send(topic, value, key=key, **extra) for key, value, extra in records(5)]
        acked = [await future for future in futures]
        assert acc.pool.used == 0
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

"""Partitioning: Java/librdkafka-compatible murmur2, librdkafka's CRC32, sticky, round-robin, user functions."""

from __future__ import annotations

import random

import confluent_kafka
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioprod import Producer
from aioprod.producer.partitioner import Partitioner, murmur2, partition_for_key
from tests.conftest import Scripted


def test_murmur2_matches_the_java_client() -> None:
    # Vectors from Kafka's UtilsTest.testMurmur2.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64), st.integers(1, 200))
def test_keyed_partition_matches_librdkafka_murmur2_random(key: bytes, partitions: int) -> None:
    expected = confluent_kafka.murmur2(key, partitions)  # type: ignore[attr-defined]
    assert partition_for_key(key, partitions) == expected
    assert Partitioner("default", 16384).partition("t", key, list(range(partitions)), []) == expected


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(1, 200))
def test_consistent_random_places_keys_as_confluent_kafkas_default(key: bytes, partitions: int) -> None:
    # librdkafka's default partitioner (so a confluent-kafka producer's that did not set one):
    # murmur2 would move most of its keys to other partitions.
    expected = confluent_kafka.consistent(key, partitions)  # type: ignore[attr-defined]
    assert Partitioner("consistent_random", 16384).partition("t", key, list(range(partitions)), []) == expected


def test_consistent_random_takes_an_empty_key_for_keyless_as_librdkafka_does() -> None:
    p = Partitioner("consistent_random", batch_size=1000, rng=random.Random(4))
    parts = list(range(8))
    sticky = p.keyless("t", 10, parts, parts)
    assert {p.partition("t", b"", parts, parts) for _ in range(20)} == {sticky}


@pytest.mark.parametrize("path", ["send", "send_many"])
async def test_consistent_random_spreads_empty_keyed_records_as_keyless_ones(scripted: Scripted, path: str) -> None:
    # They went to the sticky partition uncounted: one partition for the producer's life.
    parts = scripted.cluster.create_topic("t", 6)
    values = [b"v%05d" % i for i in range(3000)]
    options = {"partitioner": "consistent_random", "batch_size": 1000, "linger_ms": 0}
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap, **options) as producer:
        if path == "send":
            for value in values:
                await producer.send("t", value, key=b"")
            await producer.flush()
        else:
            await (await producer.send_many("t", values, keys=[b""] * len(values)))
    assert len([part for part in parts if part.values]) > 1


def test_keyless_records_stick_until_a_batch_worth_then_move() -> None:
    p = Partitioner("default", batch_size=1000, rng=random.Random(7))
    parts, available = [0, 1, 2, 3], [0, 1, 2, 3]
    first = p.keyless("t", 400, parts, available)
    assert p.keyless("t", 400, parts, available) == first
    p.keyless("t", 400, parts, available)  # 1200 bytes: time to move
    assert p.keyless("t", 1, parts, available) != first


def test_the_record_that_completes_a_batch_worth_stays_and_the_next_moves() -> None:
    p = Partitioner("default", batch_size=1000, rng=random.Random(5))
    parts = (0, 1, 2, 3)
    first = p.keyless("t", 500, parts, parts)
    assert p.keyless("t", 500, parts, parts) == first  # exactly a batch's worth
    second = p.keyless("t", 1, parts, parts)
    assert second != first
    assert p.keyless("t", 998, parts, parts) == second  # the count started again at the move


def test_keyless_records_follow_round_robin_and_a_user_partitioner_not_stickiness() -> None:
    parts = (0, 1, 2)
    rr = Partitioner("round_robin", batch_size=1000, rng=random.Random(2))
    assert sorted(rr.keyless("t", 10, parts, parts) for _ in range(3)) == [0, 1, 2]
    user = Partitioner(lambda topic, key, partitions: 1, batch_size=1000)
    assert {user.keyless("t", 10, parts, parts) for _ in range(3)} == {1}


def test_keyless_records_avoid_partitions_without_a_leader() -> None:
    p = Partitioner("default", batch_size=10, rng=random.Random(1))
    chosen = {p.keyless("t", 100, [0, 1, 2, 3], [2]) for _ in range(20)}
    assert chosen == {2}


def test_keyless_records_leave_a_sticky_partition_that_lost_its_leader() -> None:
    # Each metadata refresh brings new (immutable) partition tuples: the sticky choice is
    # checked against every new one, and only then.
    p = Partitioner("default", batch_size=10_000, rng=random.Random(3))
    parts = (0, 1, 2, 3)
    first = p.keyless("t", 10, parts, (0, 1, 2, 3))
    assert p.keyless("t", 10, parts, (0, 1, 2, 3)) == first  # an equal tuple from a new snapshot
    without = tuple(x for x in parts if x != first)
    moved = p.keyless("t", 10, parts, without)
    assert moved in without
    assert {p.keyless("t", 10, parts, without) for _ in range(5)} == {moved}
    assert p.sticky("t", parts, without) == moved


def test_round_robin_cycles_through_every_partition() -> None:
    p = Partitioner("round_robin", 16384, rng=random.Random(3))
    chosen = [p.partition("t", b"same-key", [0, 1, 2], [0, 1, 2]) for _ in range(6)]
    assert sorted(chosen[:3]) == [0, 1, 2] and chosen[:3] == chosen[3:]


def test_user_partitioner_decides() -> None:
    calls: list[tuple[str, bytes | None, tuple[int, ...]]] = []

    def last(topic: str, key: bytes | None, partitions: object) -> int:
        calls.append((topic, key, tuple(partitions)))  # type: ignore[arg-type]
        return 2

    p = Partitioner(last, 16384)
    assert p.partition("t", b"k", [0, 1, 2], [0, 1, 2]) == 2
    assert p.keyless("t", 10, [0, 1, 2], [0, 1, 2]) == 2
    assert calls[0] == ("t", b"k", (0, 1, 2))


def test_round_robin_takes_every_partition_in_turn_and_skips_those_without_a_leader() -> None:
    # Java's RoundRobinPartitioner: each available partition once per cycle, an even count too.
    p = Partitioner("round_robin", 16384, rng=random.Random(3))
    parts = [0, 1, 2, 3]
    assert sorted(p.partition("t", None, parts, parts) for _ in range(4)) == parts
    assert sorted(p.partition("t", b"k", parts, [0, 2, 3]) for _ in range(3)) == [0, 2, 3]


def test_send_manys_sticky_partition_stays_while_it_has_a_leader_and_leaves_when_not() -> None:
    # sticky() (send_many's runs of keyless records) checks the partition as keyless() does:
    # against each new snapshot's partitions, kept while it is among them.
    p = Partitioner("default", batch_size=10_000, rng=random.Random(3))
    parts = (0, 1, 2, 3)
    first = p.sticky("t", parts, parts)
    assert {p.sticky("t", parts, tuple(list(parts))) for _ in range(10)} == {first}  # equal, from new snapshots
    without = tuple(x for x in parts if x != first)
    moved = p.sticky("t", parts, without)
    assert moved in without
    assert p.sticky("t", parts, without) == moved


@pytest.mark.parametrize("answer", [3, -1, True, False])
def test_a_user_partitioners_answer_must_name_one_of_the_topics_partitions(answer: object) -> None:
    p = Partitioner(lambda topic, key, partitions: answer, 16384)  # type: ignore[arg-type,return-value]
    message = f"the partitioner returned {answer!r} for topic 't', which has partitions 0-2"
    with pytest.raises(ValueError, match=message):
        p.partition("t", b"k", [0, 1, 2], [0, 1, 2])


@pytest.mark.parametrize("path", ["send", "send_many"])
async def test_consistent_random_places_keyed_records_sent_as_confluent_kafka_does(
    scripted: Scripted, path: str
) -> None:
    # The partitioner's own answer (above) must be what send() and send_many() use, not murmur2.
    parts = scripted.cluster.create_topic("t", 6)
    keys = [b"key-%d" % i for i in range(30)]
    expected = [confluent_kafka.consistent(key, 6) for key in keys]  # type: ignore[attr-defined]
    assert expected != [partition_for_key(key, 6) for key in keys]
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap, partitioner="consistent_random") as producer:
        if path == "send":
            chosen = [(await producer.send_and_wait("t", b"v", key=key)).partition for key in keys]
        else:
            chosen = [m.partition for m in await (await producer.send_many("t", [b"v"] * len(keys), keys=keys))]
    assert chosen == expected
    assert sum(len(part.values) for part in parts) == len(keys)

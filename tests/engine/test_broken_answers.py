"""Broker answers that are wrong, as a buggy proxy or a Kafka-compatible broker may give them:
nothing acknowledged is lost or written twice, and the producer does not wedge or crash."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import pytest

from aioprod import Producer
from aioprod.errors import KafkaTimeoutError, NotEnoughReplicasError, ProducerFatalError, SendManyError
from aioprod.producer.batch import ProducerBatch
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.engine.test_cluster_replaced import name_cluster
from tests.fakes.cluster import Appended, ScriptedCluster, _ProducerState
from tests.fakes.coordinator import FakeCoordinator


async def test_a_new_cluster_behind_the_bootstrap_name_does_not_swallow_records(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Producer ids start from 0 in every cluster: the new one knew ours as another producer's,
    # whose batch at our next sequence made the broker answer "duplicate" with its offset, and
    # our record was acknowledged and not written. A new cluster id now means a new producer id.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"ours-0")  # producer id 1000 (cluster A's first), sequence 0
        # Cluster B replaces A under the same name: its topic "t" is its own, and its own first
        # producer also got id 1000 and has written two single-record batches (sequences 0 and 1).
        (part,) = cluster.create_topic("t", 1)
        part.log = [Appended(1, 1000, 0, 0, (b"theirs-0",), 0), Appended(1, 1000, 0, 1, (b"theirs-1",), 1)]
        part.producers[1000] = _ProducerState(0, deque([(0, 0, 0), (1, 1, 1)], maxlen=5))
        cluster_id["now"] = "cluster-B"
        await asyncio.sleep(2)  # a refresh or two: the producer has seen cluster B's id
        assert p.cluster().cluster_id == "cluster-B"
        md = await p.send_and_wait("t", b"ours-1")  # sequence 1 under id 1000
    # Acknowledged (at offset 1: "theirs-1"), yet not in the log.
    assert b"ours-1" in cluster.partition("t").values, (md, cluster.partition("t").values)


def lower_case_topic(response: m.ProduceResponse) -> None:
    for topic in response.responses:
        topic.name = topic.name.lower()


def omit_partition(response: m.ProduceResponse) -> None:
    response.responses = []


def named_twice(response: m.ProduceResponse) -> None:
    for topic in response.responses:
        first = m.ProduceResponsePartition(index=0, error_code=7, base_offset=-1)  # REQUEST_TIMED_OUT
        topic.partition_responses.insert(0, first)


@pytest.mark.parametrize("edit", [lower_case_topic, omit_partition, named_twice])
async def test_a_record_is_written_once_whatever_the_answer_names(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, edit: Callable[[m.ProduceResponse], None]
) -> None:
    # An answer with no result for a partition sent (or two) was retried as possibly written:
    # without idempotence, 34 copies of one record within delivery_timeout_ms. Java completes
    # only what the answer names; the rest expire in flight, written once.
    cluster = scripted.cluster
    cluster.create_topic("Orders", 1)
    produce = ScriptedCluster._produce

    def answering(self: ScriptedCluster, node: object, request: m.ProduceRequest, version: int) -> object:
        response, hold = produce(self, node, request, version)  # written
        edit(response)
        return response, hold

    monkeypatch.setattr(ScriptedCluster, "_produce", answering)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, enable_idempotence=False, delivery_timeout_ms=30_000
    ) as p:
        future = await p.send("Orders", b"v")
        outcome = (await asyncio.gather(future, return_exceptions=True))[0]
    assert cluster.partition("Orders").values == [b"v"], (
        f"{len(cluster.partition('Orders').values)} copies; {outcome!r}"
    )


async def test_one_find_coordinator_answer_naming_node_minus_1_is_recovered_from(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Node -1 is the producer's id for its first bootstrap address, which taking the answer
    # overwrote for good: start() failed after max_block_ms, "cannot connect to broker -1 at :-1".
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    find = FakeCoordinator.find
    answers = []

    def answering(self: FakeCoordinator, request: m.FindCoordinatorRequest) -> m.FindCoordinatorResponse:
        response = find(self, request)
        answers.append(response)
        if len(answers) == 1:  # the first answer only
            for found in response.coordinators:
                found.node_id, found.host, found.port = -1, "", -1
            response.node_id, response.host, response.port = -1, "", -1
        return response

    monkeypatch.setattr(FakeCoordinator, "find", answering)
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, transactional_id="x", max_block_ms=5000)
    await p.start()  # KafkaTimeoutError: ... cannot connect to broker -1 at :-1 ...
    try:
        async with p.transaction():
            await p.send_and_wait("t", b"v")
    finally:
        await p.close()
    assert cluster.partition("t").committed == [b"v"]


async def test_an_init_producer_id_answer_without_an_id_is_retried_after_a_backoff(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Taken as the identity, so the next round asked again at once: back-to-back requests for as
    # long as records waited (with every answer bad, virtual time never advanced).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    asked: list[float] = []

    def answering(self: ScriptedCluster, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        asked.append(scripted.clock.now)
        if len(asked) <= 20:
            return m.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)  # error_code 0
        return m.InitProducerIdResponse(producer_id=5000, producer_epoch=0)

    monkeypatch.setattr(ScriptedCluster, "_init_producer_id", answering)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100) as p:
        await p.send_and_wait("t", b"v")
    span = asked[20] - asked[0]
    assert span >= 1, f"{len(asked)} InitProducerId requests in {span:.3f} s"


def naming_also(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)
        for topic in response.topics:
            if topic.partitions:
                topic.partitions.append(m.MetadataResponsePartition(0, index, 1, 0, [1], [1], []))
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)


async def test_a_huge_partition_id_does_not_make_send_allocate_for_every_id_below_it(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    naming_also(monkeypatch, 2_000_000)  # 2**31 - 1 kills the process
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        # send() kept a list up to the largest id named: 2,000,000 took 200 MB and seconds of a
        # blocked loop, 2**31 - 1 all memory.
        assert await p.partitions_for("t") == [0, 1]
        assert (await p.send_and_wait("t", b"v", partition=1)).offset == 0
        assert len(p._tps["t"]) == 2


async def test_a_negative_partition_id_is_no_partition(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    # A keyed send() raised a bare IndexError, a keyless one wrote to the last partition.
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    naming_also(monkeypatch, -1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, delivery_timeout_ms=2000, request_timeout_ms=1000
    ) as p:
        metadata = [await p.send_and_wait("t", b"v", key=b"k%d" % i) for i in range(10)]
        assert sorted({md.partition for md in metadata}) == [0, 1]
        assert -1 not in p.cluster().topics["t"].partitions


async def test_a_retry_across_a_cluster_change_is_not_swallowed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch numbered under the old cluster's producer id, retried after the change, met the new
    # cluster's own producer of that id: "duplicate", acknowledged, written nowhere.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"ours-0")  # producer id 1000, sequence 0, in cluster A
        node = cluster.nodes[1]
        node.script.extend([19] * 1000)  # NOT_ENOUGH_REPLICAS: not written, retried under its stamp
        future = await p.send("t", b"ours-1")  # producer id 1000, sequence 1
        await asyncio.sleep(0.5)
        # Cluster B replaces A under the same address; its own first producer also got id 1000.
        (part,) = cluster.create_topic("t", 1)
        part.log = [Appended(1, 1000, 0, 0, (b"theirs-0",), 0), Appended(1, 1000, 0, 1, (b"theirs-1",), 1)]
        part.producers[1000] = _ProducerState(0, deque([(0, 0, 0), (1, 1, 1)], maxlen=5))
        cluster_id["now"] = "cluster-B"
        await asyncio.sleep(2.5)  # the producer has seen cluster B's id (and reset its producer id)
        assert p.cluster().cluster_id == "cluster-B"
        node.script.clear()  # cluster B's broker takes the next attempt
        md = await future
    written = cluster.partition("t").values
    # Observed: acknowledged at offset 1 ("theirs-1"), in neither cluster's log.
    assert b"ours-1" in written, (md, written)


async def test_a_batch_on_the_wire_at_a_cluster_change_is_not_swallowed_when_retried(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)  # metadata is answered by node 2 while node 1 sits on the produce request
    cluster.create_topic("t", 1)
    cluster.create_topic("u", [2])  # a connection to node 2, idle: metadata goes there
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"ours-0")
        await p.send_and_wait("u", b"x")
        node = cluster.nodes[1]
        node.stalling = True
        node.script.append(19)  # when it looks at it: NOT_ENOUGH_REPLICAS, not written
        future = await p.send("t", b"ours-1")  # producer id 1000, sequence 1: on the wire
        await asyncio.sleep(0.1)
        (part,) = cluster.create_topic("t", 1)
        part.log = [Appended(1, 1000, 0, 0, (b"theirs-0",), 0), Appended(1, 1000, 0, 1, (b"theirs-1",), 1)]
        part.producers[1000] = _ProducerState(0, deque([(0, 0, 0), (1, 1, 1)], maxlen=5))
        cluster_id["now"] = "cluster-B"
        await asyncio.sleep(2.5)
        assert p.cluster().cluster_id == "cluster-B"
        node.release()
        md = await future
    written = cluster.partition("t").values
    assert b"ours-1" in written, (md, written)


async def test_a_transactional_init_producer_id_answer_without_an_id_is_not_taken(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # start() took producer id -1, and the first transaction failed (INVALID_PRODUCER_ID_MAPPING).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    init = FakeCoordinator.init_producer_id
    asked: list[float] = []

    def answering(self: FakeCoordinator, txn_id: str, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        asked.append(scripted.clock.now)
        if len(asked) == 1:  # one broken answer: error_code 0, no identity
            return m.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
        return init(self, txn_id, request)

    monkeypatch.setattr(FakeCoordinator, "init_producer_id", answering)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        transactional_id="x",
        delivery_timeout_ms=10_000,
        request_timeout_ms=5_000,
    ) as p:
        assert p._sender.idempotence.producer_id >= 0, "start() took producer id -1 as its identity"
        async with p.transaction():
            await p.send_and_wait("t", b"v")
    assert cluster.partition("t").committed == [b"v"]


async def test_a_fence_answered_without_an_id_is_asked_again(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fence a failed Spark write ends its stopped tasks' transactions with took the broken
    # answer as done: the old producer's transaction stayed open, and its commit went through.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    init = FakeCoordinator.init_producer_id
    broken = {"left": 0}

    def answering(self: FakeCoordinator, txn_id: str, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        if broken["left"]:
            broken["left"] -= 1
            return m.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)  # error_code 0, nothing done
        return init(self, txn_id, request)

    monkeypatch.setattr(FakeCoordinator, "init_producer_id", answering)
    async with (
        Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, transactional_id="task-3") as old,
        Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, transactional_id="driver") as driver,
    ):
        await old.begin_transaction()
        await old.send_and_wait("t", b"of the stopped task")
        broken["left"] = 1
        await driver._fence("task-3")
        assert broken["left"] == 0
        with pytest.raises(ProducerFatalError, match="PRODUCER_FENCED"):
            await old.commit_transaction()
    assert cluster.partition("t").committed == []


async def test_a_partition_replaced_by_a_bad_id_in_one_answer_is_still_sent_to(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ids [-1, 1, 2] for a 3-partition topic: the bad id was dropped and the rest installed, a topic
    # of 2 partitions with a gap at 0 ("partition 0 does not exist"; keys hashed over 2).
    cluster = scripted.cluster
    cluster.create_topic("t", 3)
    broken = {"on": False}
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)
        for topic in response.topics:
            if broken["on"] and topic.partitions:
                topic.partitions[0].partition_index = -1  # in place of partition 0
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        assert (await p.send_and_wait("t", b"v0", partition=0)).partition == 0
        broken["on"] = True
        await asyncio.sleep(2)  # a refresh or two: the broken answer is taken
        partitions = await p.partitions_for("t")
        # Observed: ValueError: partition 0 does not exist: topic 't' has 2 partitions (0-1)
        md = await p.send_and_wait("t", b"v1", partition=0)
    assert (md.partition, partitions) == (0, [0, 1, 2])


# e736458: an answer whose partition ids outside 0..n-1 leave a gap keeps the topic's previous view
# whole -- its leaders too. While a broker answers so (a proxy's or a broker's bug that persists),
# a leader move of the topic's other partitions is never taken: their records go to the old leader,
# are refused NOT_LEADER_OR_FOLLOWER, and the refresh that follows keeps the old view again, until
# delivery_timeout_ms fails them.
async def test_a_leader_move_is_taken_while_another_partitions_id_is_broken(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.kip951 = False  # (a NOT_LEADER answer without the new leader, as before Kafka 3.7)
    cluster.create_topic("t", [1, 1, 1])
    broken = {"on": False}
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)
        for topic in response.topics:
            if broken["on"] and topic.name == "t":
                topic.partitions[0].partition_index = -1  # in place of partition 0
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, delivery_timeout_ms=20_000, request_timeout_ms=5_000
    ) as p:
        assert (await p.send_and_wait("t", b"v0", partition=1)).partition == 1
        broken["on"] = True
        cluster.move_leader("t", 1, 2)
        outcome = (await asyncio.gather(p.send_and_wait("t", b"v1", partition=1), return_exceptions=True))[0]
    assert not isinstance(outcome, BaseException), repr(outcome)
    assert b"v1" in cluster.partition("t", 1).values


# e736458: partition ids outside 0..n-1 are 'ignored when the rest is contiguous from 0'. An answer
# for a 3-partition topic naming partitions 0, 1, 7 (the last id broken, as -1 in place of 0 was the
# first) is taken as a 2-partition topic: a keyed record goes to another partition than its key's
# (hash mod 2, not mod 3), and an explicit partition 2 is refused, until a sound answer comes. The
# answer's own count (3 entries) says partition 2 exists; Kafka topics never shrink.
@pytest.mark.parametrize("named", [7, 1], ids=["out-of-range", "named-twice"])
async def test_a_broken_last_partition_id_does_not_remap_keys(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, named: int
) -> None:
    # [0, 1, 1] for a topic of 3 passed the range check: installed as 2 partitions, a third of
    # the keys moved.
    cluster = scripted.cluster
    cluster.create_topic("t", [1, 1, 1])
    broken = {"on": False}
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)
        if broken["on"]:
            for t in response.topics:
                if t.name == "t":
                    t.partitions[2].partition_index = named
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        keys = [b"k%d" % i for i in range(50)]
        before = {k: (await p.send_and_wait("t", b"v", key=k)).partition for k in keys}
        assert 2 in before.values()
        broken["on"] = True
        await asyncio.sleep(2.5)  # a refresh or two with the broken answer
        after = {k: (await p.send_and_wait("t", b"v", key=k)).partition for k in keys}
    moved = {k: (before[k], after[k]) for k in keys if before[k] != after[k]}
    assert not moved, f"{len(moved)} of {len(keys)} keys moved partition: {moved}"


# e736458/f025f03: the ("partition-ids", topic) problem is never resolved nor forgotten: a topic
# forgotten after metadata_max_idle_ms drops its ("topic", t) and ("leader", t) entries
# (Metadata._forget), not this one -- one _Seen per topic that ever had a broken answer, for the
# producer's life (a producer writing to a topic per tenant).
async def test_a_forgotten_topic_leaves_no_event_log_entry(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = scripted.cluster
    for i in range(5):
        cluster.create_topic(f"tenant-{i}", 2)
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)
        for topic in response.topics:
            if topic.partitions:
                topic.partitions.append(m.MetadataResponsePartition(0, 7, 1, 0, [1], [1], []))
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_idle_ms=5000, metadata_max_age_ms=1000
    ) as p:
        for i in range(5):
            await p.send_and_wait(f"tenant-{i}", b"v")
        await asyncio.sleep(60)  # every topic idle, forgotten
        assert not p._metadata._topics
        left = [key for key in p._metrics.events._problems if isinstance(key, tuple) and "tenant" in str(key)]
    assert not left, left


async def test_a_fence_always_answered_without_an_id_times_out_saying_so(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The answer said no error: the timeout's "last answer" must not be a COORDINATOR_NOT_AVAILABLE
    # no broker gave (the stand-in code the retry used), but what the answer lacked.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)

    def answering(self: FakeCoordinator, txn_id: str, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        return m.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)  # error_code 0, nothing done

    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, max_block_ms=2000) as driver:
        monkeypatch.setattr(FakeCoordinator, "init_producer_id", answering)
        with pytest.raises(KafkaTimeoutError) as info:
            await driver._fence("task-3")
    assert "COORDINATOR_NOT_AVAILABLE" not in str(info.value)
    assert "answered no error, but no identity (producer id -1, epoch -1)" in str(info.value)


async def test_send_many_resolves_when_handling_an_answer_fails_with_an_injected_bug(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sender's last resort ("a bug here must not leave futures pending forever") failed the
    # request's batches, one of them already put back in its queue for a retry; the producer's
    # failure then failed every queued batch, that one again, and a send_many group counted its
    # records twice: its future never resolved (or resolved before its last batch had).
    cluster = scripted.cluster
    cluster.create_topic("t", 3)
    node = cluster.nodes[1]
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=10_000,
        delivery_timeout_ms=60_000,
        batch_size=1024,
        max_in_flight_requests_per_connection=1,
        enable_idempotence=False,
    ) as p:
        for partition in range(3):
            await p.send_and_wait("t", b"warm-up", partition=partition)
        node.holding = True
        blocker = await p.send("t", b"blocker", partition=2)
        flushing = asyncio.ensure_future(p.flush())
        while len(cluster.requests_of(m.ProduceRequest)) < 4:
            await asyncio.sleep(0)  # the blocker is on the wire: the connection takes no other request
        many = await p.send_many("t", [b"x" * 400 for _ in range(5)], partition=0)  # three batches of t-0
        other = await p.send("t", b"y", partition=1)
        # The next request: t-0's first batch (refused: retried) and t-1's, whose handling breaks.
        node.script = deque([NotEnoughReplicasError.code, 0])
        succeed = ProducerBatch.succeed

        def broken(self: ProducerBatch, base_offset: int, log_append_time: int) -> None:
            if self.tp.partition == 1:
                raise RuntimeError("injected bug")
            succeed(self, base_offset, log_append_time)

        monkeypatch.setattr(ProducerBatch, "succeed", broken)
        node.release()
        with pytest.raises(ProducerFatalError):
            await other
        await asyncio.gather(flushing, blocker, return_exceptions=True)
    assert many.done()  # every record of it has its outcome, and the producer is closed
    error = many.exception()
    assert isinstance(error, SendManyError)
    assert all(isinstance(result, ProducerFatalError) for result in error.results)

"""Metadata under faults: newer leaders win, refreshes are not stuck or stormy."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from aioprod import Producer
from aioprod.cluster.metadata import Metadata
from aioprod.errors import (
    KafkaTimeoutError,
    NotLeaderOrFollowerError,
    PartitionNotFoundError,
    UnknownTopicOrPartitionError,
)
from aioprod.protocol.messages import MetadataRequest, MetadataResponseBroker, ProduceRequest
from tests.conftest import Scripted
from tests.fakes.cluster import FakeNode, Partition, ScriptedCluster


def lose_one_metadata_answer(
    monkeypatch: pytest.MonkeyPatch, *, node_id: int | None = None, hang: bool = False
) -> list[bool]:
    """Once armed (``lose[0] = True``), the fake cluster loses the next Metadata answer (of
    ``node_id``, if given): the connection drops before it, or (``hang``) it never comes."""
    handle = ScriptedCluster.handle
    lose = [False]

    async def losing(self: ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        answer = await handle(self, conn, frame)
        if lose[0] and node_id in (None, conn.node.node_id) and type(self.requests[-1].body) is MetadataRequest:
            lose[0] = False
            if hang:
                await conn.closed_or(asyncio.Event())
            else:
                conn.side.close()
            return None
        return answer

    monkeypatch.setattr(ScriptedCluster, "handle", losing)
    return lose


async def test_a_lagging_broker_does_not_take_the_producer_back_to_an_old_leader(scripted: Scripted) -> None:
    # The partition moved from node 1 (epoch 0) to node 2 (epoch 1); nodes 1 and 3 lag and
    # still say node 1 at epoch 0. Refreshes go to whichever node is least loaded, so some
    # answers are stale: they must not undo what the producer already learned.
    cluster = three_nodes_two_lagging(scripted, leader=2)
    cluster.partition("t").epoch = 1
    lag_behind(cluster)
    async with Producer(bootstrap_servers="127.0.0.1:9092", linger_ms=0, metadata_max_age_ms=200) as p:
        await p.send_and_wait("t", b"learn the leader")  # at node 2, epoch 1, one way or another
        learned = len(cluster.requests)
        await twenty_beside_lagging_answers(p)
    assert produced_to_t_after(cluster, learned) == [2] * 20


def three_nodes_two_lagging(scripted: Scripted, leader: int) -> ScriptedCluster:
    """Nodes 1-3; "t" led by ``leader``; "elsewhere" on nodes 1 and 3, which keeps them connected."""
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("t", leaders=[leader])
    cluster.create_topic("elsewhere", leaders=[1, 3])
    return cluster


def lag_behind(cluster: ScriptedCluster) -> None:
    """Nodes 1 and 3 answer that node 1 leads "t" at epoch 0."""
    for lagging in (1, 3):
        cluster.nodes[lagging].stale[("t", 0)] = (1, 0)


async def twenty_beside_lagging_answers(p: Producer) -> None:
    """Twenty records to "t", each after one to "elsewhere", 0.3 s apart: refreshes (every 0.2 s)
    go to whichever node is least loaded, so some are answered by the lagging nodes."""
    for i in range(20):
        await p.send_and_wait("elsewhere", b"%d" % i, partition=i % 2)
        await p.send_and_wait("t", b"%d" % i)
        await asyncio.sleep(0.3)


def produced_to_t_after(cluster: ScriptedCluster, learned: int) -> list[int]:
    """The nodes "t"'s produce requests went to after request ``learned``, once a lagging node
    answered a refresh among them (without one, the test proves nothing)."""
    later = cluster.requests[learned:]
    stale_answers = [r for r in later if isinstance(r.body, MetadataRequest) and r.node in (1, 3)]
    assert stale_answers, "no refresh reached a lagging node: the test proves nothing"
    return [r.node for r in later if isinstance(r.body, ProduceRequest) and r.body.topic_data[0].name == "t"]


async def test_a_lagging_broker_does_not_undo_a_leader_learned_from_a_produce_answer(scripted: Scripted) -> None:
    # As above, with the new leader learned from the old one's NOT_LEADER_OR_FOLLOWER answer
    # (KIP-951's CurrentLeader, epoch 1): the lagging answers (node 1 at epoch 0) that follow
    # must not take the producer back to node 1.
    cluster = three_nodes_two_lagging(scripted, leader=1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=200) as p:
        await p.send_and_wait("t", b"at node 1")
        cluster.move_leader("t", 0, 2)  # epoch 1
        lag_behind(cluster)
        learned = len(cluster.requests)
        await p.send_and_wait("t", b"moved")  # node 1 answers NOT_LEADER, naming node 2 at epoch 1
        await twenty_beside_lagging_answers(p)
    assert produced_to_t_after(cluster, learned) == [1] + [2] * 21


async def test_metadata_is_not_queued_behind_stuck_produce_requests(scripted: Scripted) -> None:
    # Node 2 holds five produce requests (acks=all waiting for replicas); node 1 dies and
    # its partition moves to node 3. The refresh that finds node 3 must not go to node 2,
    # where it would wait behind the stuck requests for a whole request timeout.
    cluster, clock = scripted.cluster, scripted.clock
    for node in (2, 3):
        cluster.add_node(node)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, request_timeout_ms=30_000
    ) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await p.send_and_wait("t", b"warm-up", partition=1)
        cluster.disconnect(3)  # known to the producer, not connected
        await asyncio.sleep(1)
        cluster.nodes[2].holding = True
        stuck = [await p.send("t", b"s" * 80, partition=1) for _ in range(5)]
        await asyncio.sleep(0.1)
        cluster.stop(1)
        cluster.move_leader("t", 0, 3)
        started = clock.now
        await p.send_and_wait("t", b"after failover", partition=0)
        recovered = clock.now - started
        cluster.nodes[2].release()
        await asyncio.gather(*stuck)
    assert recovered < 2.0  # not a request timeout (30 s)
    assert cluster.partition("t", 0).values[-1] == b"after failover"


async def test_a_not_leader_answer_naming_the_new_leader_is_followed_at_once(scripted: Scripted) -> None:
    # KIP-951: the old leader's answer carries the new leader and its address; the retry
    # goes straight there, with no metadata request and no backoff.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=1000) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await p.send_and_wait("t", b"warm-up", partition=1)
        metadata_before = len(cluster.requests_of(MetadataRequest))
        cluster.move_leader("t", 0, 2)
        started = clock.now
        await p.send_and_wait("t", b"moved", partition=0)
        took = clock.now - started
        metadata_during = len(cluster.requests_of(MetadataRequest)) - metadata_before
    assert took < 0.1  # no retry_backoff_ms (1 s)
    assert [r.node for r in cluster.requests_of(ProduceRequest)][-2:] == [1, 2]
    assert cluster.partition("t", 0).values == [b"warm-up", b"moved"]
    # A refresh may be asked for in the background, but the retry did not wait for it.
    assert metadata_during <= 1


async def test_a_not_leader_answer_naming_a_moved_leader_is_followed_to_its_new_address(scripted: Scripted) -> None:
    # Node 2 moved to another address as it took the partition over; the NOT_LEADER answer's
    # NodeEndpoints (KIP-951) say where. The snapshot's old address was kept instead: the retry
    # went there, and where it swallows connection attempts, waited out the connect timeout.
    cluster, network = scripted.cluster, scripted.network
    node2 = cluster.add_node(2)
    cluster.create_topic("t", leaders=[1])
    async with Producer(bootstrap_servers="127.0.0.1:9091", linger_ms=0) as p:
        await p.send_and_wait("t", b"at node 1")
        old_address = node2.address
        network.stop_listening(*old_address)
        network.black_holes.add(old_address)
        node2.port = 9999
        network.listen(node2.host, node2.port, node2)
        cluster.move_leader("t", 0, 2)
        await p.send_and_wait("t", b"at node 2")
    assert old_address not in network.connects
    assert cluster.partition("t").values == [b"at node 1", b"at node 2"]


async def test_a_leaderless_partition_nobody_writes_to_causes_no_refreshes(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1, -1])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100) as p:
        await p.send_and_wait("t", b"v", partition=0)
        before = len(cluster.requests_of(MetadataRequest))
        await asyncio.sleep(60)
        idle_refreshes = len(cluster.requests_of(MetadataRequest)) - before
    assert idle_refreshes <= 1  # none asked for; at most the periodic one (metadata_max_age_ms)


async def test_keyless_records_avoid_a_partition_led_by_a_broker_the_answer_does_not_name(scripted: Scripted) -> None:
    # Java's Cluster has no leader for it, so the partitioner never picks it; the sticky
    # partitioner stuck to it, and its records waited there until they expired.
    cluster = scripted.cluster
    cluster.create_topic("t", [1, 7])  # partition 1's leader, broker 7, is not among the brokers
    options: dict[str, Any] = {"linger_ms": 0, "batch_size": 200, "delivery_timeout_ms": 5000}
    async with Producer(bootstrap_servers=cluster.bootstrap, request_timeout_ms=4000, **options) as p:
        futures = [await p.send("t", b"x" * 50) for _ in range(40)]
        results = await asyncio.gather(*futures, return_exceptions=True)
    assert [getattr(r, "partition", r) for r in results] == [0] * 40


async def test_a_record_for_a_leader_the_answer_does_not_name_goes_once_a_refresh_names_it(
    scripted: Scripted,
) -> None:
    # Java's Cluster has no leader node for such a partition: its records wait, asking for
    # refreshes (backed off), and go as soon as one names the leader (a broker still joining),
    # not at the next periodic refresh (metadata_max_age_ms, 5 minutes).
    cluster = scripted.cluster
    cluster.create_topic("t", [1, 7])  # partition 1's leader, broker 7, is not among the brokers
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_max_ms=1000) as p:
        waiting = await p.send("t", b"for 7", partition=1)
        await asyncio.sleep(2)
        cluster.add_node(7)
        joined = scripted.clock.now
        await waiting
        took = scripted.clock.now - joined
    assert cluster.partition("t", 1).values == [b"for 7"]
    assert took <= 1.0 + 0.5, took  # the next refresh, at most retry_backoff_max_ms away


async def test_refreshes_for_a_leaderless_partition_back_off_while_records_wait(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1, -1])
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        retry_backoff_ms=100,
        retry_backoff_max_ms=1000,
        delivery_timeout_ms=120_000,
    ) as p:
        await p.send_and_wait("t", b"v", partition=0)
        before = len(cluster.requests_of(MetadataRequest))
        fut = await p.send("t", b"waits for a leader", partition=1)
        await asyncio.sleep(20)
        times = [r.at for r in cluster.requests_of(MetadataRequest)[before:]]
        cluster.partition("t", 1).leader = 1
        await fut
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # 100 ms doubling to the 1 s cap, each within ±20 % jitter: ~25 refreshes in 20 s, not 200.
    assert len(times) <= 30
    assert all(gap >= 0.08 for gap in gaps)
    assert max(gaps) <= 1.0 + 1e-6


async def test_a_new_topic_is_described_at_once_while_refreshes_for_another_back_off(scripted: Scripted) -> None:
    # Refreshes for a leaderless partition have backed off to retry_backoff_max_ms; a send to a
    # topic not asked for before must not wait out that backoff (as Java's requestUpdateForNewTopics),
    # or a max_block_ms shorter than it times out with the topic there all along.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1, -1])
    cluster.create_topic("fresh", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        retry_backoff_ms=100,
        retry_backoff_max_ms=5000,
        max_block_ms=300,
    ) as p:
        await p.send_and_wait("t", b"v", partition=0)
        waiting = await p.send("t", b"waits for a leader", partition=1)
        await asyncio.sleep(30)  # refreshes that find nothing new: 100 ms doubling to 5 s apart
        metadata = await p.send_and_wait("fresh", b"new topic")
        cluster.partition("t", 1).leader = 1
        await waiting
    assert metadata.topic == "fresh"


async def test_a_new_topic_asked_for_during_a_fruitless_refresh_is_described_at_once(scripted: Scripted) -> None:
    # As above, the wait beginning while such a refresh is in flight: its end counted one more
    # fruitless refresh and the backoff after it forgot the new topic, which then waited a
    # retry_backoff_ms (here longer than max_block_ms).
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1, -1])
    cluster.create_topic("fresh", 1)
    handle = cluster.handle

    async def slow_metadata(conn: Any, frame: bytes) -> bytes | None:  # a broker 50 ms away for metadata
        answer = await handle(conn, frame)
        if type(cluster.requests[-1].body) is MetadataRequest:
            await asyncio.sleep(0.05)
        return answer

    cluster.handle = slow_metadata  # type: ignore[method-assign]
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        retry_backoff_ms=500,
        retry_backoff_max_ms=5000,
        max_block_ms=400,
    ) as p:
        await p.send_and_wait("t", b"v", partition=0)
        waiting = await p.send("t", b"waits for a leader", partition=1)
        await asyncio.sleep(30)  # the refreshes for the leaderless partition back off to 5 s
        seen = len(cluster.requests_of(MetadataRequest))
        while len(cluster.requests_of(MetadataRequest)) == seen:  # until the next fruitless refresh goes out
            await asyncio.sleep(0.001)
        metadata = await p.send_and_wait("fresh", b"new topic")
        cluster.partition("t", 1).leader = 1
        await waiting
    assert metadata.topic == "fresh"


async def test_refreshes_whose_answers_keep_changing_are_a_retry_backoff_apart(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Demanded refreshes back off only while they find nothing new; answers that change every
    # time (brokers lagging by different amounts) made them go back to back, a storm at one
    # instant while a record waited for a leader. Java keeps them retry_backoff_ms apart.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1, -1])
    answer_of = ScriptedCluster._metadata
    answers = itertools.count()

    def changing(self: ScriptedCluster, node: Any, request: MetadataRequest) -> Any:
        response = answer_of(self, node, request)
        if next(answers) % 2:  # a broker in every other answer
            response.brokers.append(MetadataResponseBroker(9, "elsewhere.example", 9092))
        return response

    handle = ScriptedCluster.handle

    async def slowed(self: ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        if len(self.requests_of(MetadataRequest)) > 150:
            await asyncio.sleep(0.01)  # a storm at one instant: let virtual time move, for the assert
        return await handle(self, conn, frame)

    monkeypatch.setattr(ScriptedCluster, "_metadata", changing)
    monkeypatch.setattr(ScriptedCluster, "handle", slowed)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100) as p:
        await p.send_and_wait("t", b"v", partition=0)
        before = len(cluster.requests_of(MetadataRequest))
        waiting = await p.send("t", b"waits for a leader", partition=1)
        await asyncio.sleep(1)
        refreshes = len(cluster.requests_of(MetadataRequest)) - before
        cluster.partition("t", 1).leader = 1
        await waiting
    assert refreshes <= 12  # one per 100 ms over a second, not hundreds


async def test_throttled_broker_gets_no_requests_until_the_throttle_ends(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].throttle_ms = 500
        throttled_at = clock.now
        await p.send_and_wait("t", b"throttled")
        cluster.nodes[1].throttle_ms = 0
        await p.send_and_wait("t", b"after")
    produced = cluster.requests_of(ProduceRequest)
    assert produced[-1].at - throttled_at >= 0.5


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_throttle_outlives_the_connection_it_came_on(scripted: Scripted, idempotent: bool) -> None:
    # KIP-219: the broker mutes the client, not one connection. A connection lost inside the
    # throttle must not let the next one send at once (with idempotence the cluster check waits
    # it out first; without, nothing else does).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    loop = asyncio.get_running_loop()
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, enable_idempotence=idempotent) as p:
        cluster.nodes[1].throttle_ms = 10_000
        await p.send_and_wait("t", b"one")
        throttled_until = loop.time() + 10
        cluster.nodes[1].throttle_ms = 0
        cluster.disconnect(1)  # lost inside the throttle
        await asyncio.sleep(0.01)
        await (await p.send("t", b"two"))
    produced = [r.at for r in cluster.requests_of(ProduceRequest)]
    assert produced[-1] >= throttled_until - 0.01, (produced[-1], throttled_until)


async def test_a_shorter_throttle_answered_later_does_not_cut_a_longer_one_short(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two answers read one after the other, the first asking for 10 s, the second for 1 s: the
    # client keeps to the longer (Java's ClusterConnectionStates.throttle takes the max).
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    loop = asyncio.get_running_loop()
    throttles = deque([10_000, 1_000])
    produce = ScriptedCluster._produce

    def throttling(self: ScriptedCluster, node: Any, request: ProduceRequest, version: int) -> Any:
        response, hold = produce(self, node, request, version)
        if throttles:
            response.throttle_time_ms = throttles.popleft()
        return response, hold

    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await p.send_and_wait("t", b"warm-up", partition=1)
        monkeypatch.setattr(ScriptedCluster, "_produce", throttling)
        cluster.nodes[1].holding = True
        first = await p.send("t", b"10 s", partition=0)
        await asyncio.sleep(0.01)
        second = await p.send("t", b"1 s", partition=1)
        await asyncio.sleep(0.01)
        cluster.nodes[1].release()
        await asyncio.gather(first, second)
        throttled_until = loop.time() + 10
        await p.send_and_wait("t", b"after", partition=0)
    assert cluster.requests_of(ProduceRequest)[-1].at >= throttled_until - 0.01


async def test_a_round_in_a_throttle_plans_the_next_one_for_its_end(scripted: Scripted) -> None:
    # The connection's timer wakes the sender as the throttle ends; asyncio may run that timer
    # a clock tick early (it runs timers due within the clock's resolution), and the round it
    # starts, finding the connection still throttled, must plan the next one for the end
    # instead of sleeping on with the batch until its delivery deadline.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].throttle_ms = 500
        await p.send_and_wait("t", b"throttles")  # its answer starts a 500 ms throttle
        cluster.nodes[1].throttle_ms = 0
        queued = await p.send("t", b"queued")
        conn = p._pool.connection(1)
        assert conn is not None and not conn.can_send_more()
        now = asyncio.get_running_loop().time()
        assert p._sender.run_once(now) == pytest.approx(conn.throttled_until - now)
        await queued


async def test_topics_unused_for_metadata_max_idle_ms_are_dropped_from_refreshes(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("old", 1)
    cluster.create_topic("new", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_idle_ms=5000, metadata_max_age_ms=1000
    ) as p:
        await p.send_and_wait("old", b"v")
        for _ in range(10):
            await p.send_and_wait("new", b"v")
            await asyncio.sleep(1)
        last = cluster.requests_of(MetadataRequest)[-1].body
    assert isinstance(last, MetadataRequest) and last.topics is not None
    assert [t.name for t in last.topics] == ["new"]


async def test_setup_timeout_bounds_a_connect_that_never_completes(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    cluster.network.black_holes.add(cluster.nodes[1].address)
    p = Producer(
        bootstrap_servers=cluster.bootstrap,
        socket_connection_setup_timeout_ms=2000,
        socket_connection_setup_timeout_max_ms=8000,
        request_timeout_ms=30_000,
        max_block_ms=120_000,
    )
    await p.start()
    try:
        started = clock.now
        waiting = asyncio.ensure_future(p.partitions_for("t"))
        await asyncio.sleep(60)
        attempts = [c for c in cluster.network.connects if c == cluster.nodes[1].address]
        cluster.network.black_holes.clear()
        await waiting
    finally:
        await p.close()
    # 2, 4, 8, 8, ... s (±20 %) plus reconnect backoff: not two 30 s request timeouts.
    assert len(attempts) >= 6
    assert clock.now - started >= 60


NOT_LEADER = NotLeaderOrFollowerError.code
_ = deque


async def test_a_recreated_topic_is_followed_to_its_new_leader(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1])
    for leader in (2, 1, 2, 1):  # some leader changes: the partition is at leader epoch 4
        cluster.move_leader("t", 0, leader)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, delivery_timeout_ms=30_000) as p:
        await p.send_and_wait("t", b"before", partition=0)
        cluster.create_topic("t", leaders=[2])  # deleted and created again: node 2 leads, epoch 0
        md = await p.send_and_wait("t", b"after", partition=0)  # the old leader (node 1) does not know it
    assert md.offset == 0
    assert cluster.partition("t", 0).values == [b"after"]


async def test_a_dead_leader_keeps_metadata_coming_until_its_partitions_move(scripted: Scripted) -> None:
    # Node 1 dies and its partition moves to node 2 only a second later. The refresh made
    # when the connection dropped still names node 1; failed reconnects must keep asking
    # (with backoff), or the producer waits for metadata_max_age_ms.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"before", partition=0)
        await p.send_and_wait("t", b"before", partition=1)
        cluster.stop(1)
        died = clock.now
        waiting = await p.send("t", b"after", partition=0)
        await asyncio.sleep(1)
        cluster.move_leader("t", 0, 2)
        await waiting
        recovered = clock.now - died
    assert recovered < 3  # not metadata_max_age_ms (5 minutes)
    assert cluster.partition("t", 0).values == [b"before", b"after"]


@pytest.mark.parametrize("old_brokers", ["refuse connections", "swallow connection attempts"])
async def test_a_cluster_replaced_under_the_bootstrap_name_is_found(scripted: Scripted, old_brokers: str) -> None:
    # The known brokers are gone and the bootstrap name points at a new cluster. Going back to
    # the bootstrap list needed every known broker backing off at once, which never happens
    # when their addresses swallow connection attempts (an attempt outlasts a backoff). And
    # once found, the new cluster was not asked about the topic: the record waiting for it had
    # not touched it for metadata_max_idle_ms, so the refreshes had stopped describing it.
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    cluster.create_topic("t", [1])
    network.listen("kafka.example", 9092, cluster.nodes[1])
    async with Producer(
        bootstrap_servers="kafka.example:9092", linger_ms=0, delivery_timeout_ms=3_600_000, request_timeout_ms=10_000
    ) as p:
        await (await p.send("t", b"before"))
        for node in (1, 2):
            cluster.stop(node)
            if old_brokers == "swallow connection attempts":
                network.black_holes.add(cluster.nodes[node].address)
            del cluster.nodes[node]
        cluster.add_node(3)
        cluster.move_leader("t", 0, 3)
        network.listen("kafka.example", 9092, cluster.nodes[3])
        await asyncio.wait_for(await p.send("t", b"after"), 1800)  # virtual seconds; the trigger is 300
    assert cluster.partition("t").values == [b"before", b"after"]


async def test_metadata_max_age_0_refreshes_no_more_often_than_the_retry_backoff(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, metadata_max_age_ms=0, retry_backoff_ms=100) as p:
        await (await p.send("t", b"v"))
        before = len(cluster.requests_of(MetadataRequest))
        await asyncio.sleep(10)  # virtual time
        refreshes = len(cluster.requests_of(MetadataRequest)) - before
    assert 50 <= refreshes <= 101


async def test_one_failed_refresh_long_after_the_last_does_not_abandon_a_healthy_broker(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trigger counts how long refreshes have been failing, not how old the last good one
    # is: idle for longer than it, one lost answer sent the producer to the bootstrap name
    # alone (here a dead broker) for good, with the leader healthy and connected.
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    cluster.create_topic("t", [2])
    network.listen("kafka.example", 9092, cluster.nodes[1])
    lose = lose_one_metadata_answer(monkeypatch, node_id=2, hang=True)
    async with Producer(
        bootstrap_servers="kafka.example:9092", linger_ms=0, metadata_max_age_ms=3_600_000, request_timeout_ms=5_000
    ) as p:
        await (await p.send("t", b"before"))
        cluster.stop(1)
        network.stop_listening("kafka.example", 9092)  # the bootstrap name's broker is gone
        await asyncio.sleep(400)  # virtual: longer than metadata_recovery_rebootstrap_trigger_ms
        cluster.create_topic("t2", [2])
        lose[0] = True
        await asyncio.wait_for(await p.send("t2", b"after"), 600)
    assert cluster.partition("t2").values == [b"after"]


async def test_a_refresh_failure_the_next_refresh_recovered_from_is_no_outage_later(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rebootstrap trigger counts from the first failure of refreshes failing since the last
    # one that worked: one failed refresh, retried successfully, must not send the producer to
    # the bootstrap name alone (here a broker gone) once the trigger's time has passed.
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    cluster.create_topic("t", [2])
    cluster.create_topic("x", [2])
    network.listen("kafka.example", 9092, cluster.nodes[1])
    lose = lose_one_metadata_answer(monkeypatch)
    async with Producer(bootstrap_servers="kafka.example:9092", linger_ms=0, metadata_max_age_ms=10_000) as p:
        await p.send_and_wait("t", b"before")
        lose[0] = True
        await p.send_and_wait("x", b"x")  # its first refresh fails (the answer lost), the next works
        assert not lose[0]
        cluster.stop(1)
        network.stop_listening("kafka.example", 9092)  # the bootstrap name's broker is gone
        await asyncio.sleep(400)  # virtual: longer than metadata_recovery_rebootstrap_trigger_ms
        cluster.create_topic("t2", [2])
        await p.send_and_wait("t2", b"after")
    assert cluster.partition("t2").values == [b"after"]


async def test_a_partition_added_since_the_last_refresh_is_waited_for_by_send(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=5_000) as p:
        assert await p.partitions_for("t") == [0]
        cluster.topics["t"].extend(cluster.create_topic("grown", 1))  # t now has partitions 0 and 1
        assert (await p.send_and_wait("t", b"v", partition=1)).partition == 1
        assert (await (await p.send_many("t", [b"w"], partition=1)))[0].partition == 1
        with pytest.raises(ValueError, match=r"partition 2 does not exist: topic 't' has 2 partitions \(0-1\)"):
            await p.send("t", b"v", partition=2)


async def test_the_timeout_for_a_missing_topic_gives_the_clusters_answer(scripted: Scripted) -> None:
    async with Producer(
        bootstrap_servers=scripted.cluster.bootstrap, allow_auto_create_topics=False, max_block_ms=2000
    ) as p:
        with pytest.raises(KafkaTimeoutError) as info:
            await p.send("no-such-topic", b"x")
    assert str(info.value).startswith("topic 'no-such-topic' not present in metadata after 2000 ms")
    assert "(the cluster's last answer: " in str(info.value)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in str(info.value)


async def test_a_failed_refresh_is_not_taken_for_proof_that_a_partition_is_missing(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    lose = lose_one_metadata_answer(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=10_000) as p:
        assert await p.partitions_for("t") == [0]
        cluster.topics["t"].extend(cluster.create_topic("grown", 1))  # t now has partitions 0 and 1
        lose[0] = True
        assert (await p.send_and_wait("t", b"v", partition=1)).partition == 1


async def test_sends_to_a_missing_partition_are_refused_after_a_second_not_max_block_ms(scripted: Scripted) -> None:
    # Bad input: refused once refreshes over retry_backoff_max_ms (1 s) lack the partition, not
    # after max_block_ms; the sends after it are refused at once, with no refresh of their own.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=60_000) as p:
        await p.partitions_for("t")
        before, started = len(cluster.requests_of(MetadataRequest)), scripted.clock.now
        with pytest.raises(PartitionNotFoundError) as info:
            await p.send("t", b"v", partition=5)
        assert 1.0 <= scripted.clock.now - started < 2.0
        # A ValueError too (what the caller passed), saying which partition of which topic.
        assert isinstance(info.value, ValueError)
        assert (info.value.topic, info.value.partition, info.value.partition_count) == ("t", 5, 1)
        assert str(info.value) == "partition 5 does not exist: topic 't' has 1 partition (0-0)"
        refreshes = len(cluster.requests_of(MetadataRequest)) - before
        for _ in range(9):
            with pytest.raises(PartitionNotFoundError, match="partition 5 does not exist"):
                await p.send("t", b"v", partition=5)
        assert len(cluster.requests_of(MetadataRequest)) - before == refreshes <= 6


async def test_one_lagging_answer_does_not_make_an_added_partition_bad_input(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Partitions were just added; the broker that answers the send's refresh still has the old
    # count. One such answer made the new partition "not exist" (a ValueError, bad input);
    # Java waits, and the next answers, a moment later, have it.
    cluster = scripted.cluster
    cluster.add_node(2)
    parts = cluster.create_topic("t", leaders=[1, 2])
    answer_of = ScriptedCluster._metadata
    lagging = [True]

    def lagging_node_1(self: ScriptedCluster, node: Any, request: MetadataRequest) -> Any:
        answer = answer_of(self, node, request)
        if node.node_id == 1 and lagging:  # its view does not have the added partitions yet
            for topic in answer.topics:
                topic.partitions = topic.partitions[:2]
        return answer

    monkeypatch.setattr(ScriptedCluster, "_metadata", lagging_node_1)
    options = {"linger_ms": 0, "max_block_ms": 5000, "max_in_flight_requests_per_connection": 1}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await p.send_and_wait("t", b"warm-up", partition=1)
        parts.extend([Partition(2, parts[0].topic_id), Partition(2, parts[0].topic_id)])  # 4 partitions now
        cluster.nodes[2].holding = True  # node 2 is busy: the refreshes go to node 1
        busy = await p.send("t", b"held", partition=1)
        await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        loop.call_later(0.8, lagging.clear)  # node 1 catches up
        loop.call_later(0.8, cluster.nodes[2].release)
        record = await p.send("t", b"to an added partition", partition=3)
        assert (await record).partition == 3
        await busy


async def test_a_refresh_from_before_a_send_is_no_proof_its_partition_is_missing(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only refreshes asked for after the send began count against its partition: the last one
    # before it may be from before the partition was added. Counted, one lagging answer since
    # (a broker still on the old count) would make the partition "not exist".
    cluster = scripted.cluster
    parts = cluster.create_topic("t", 1)
    answer_of = ScriptedCluster._metadata
    lagging = [0]  # answers still to come with the old count

    def lagging_answers(self: ScriptedCluster, node: Any, request: MetadataRequest) -> Any:
        answer = answer_of(self, node, request)
        if lagging[0]:
            lagging[0] -= 1
            for topic in answer.topics:
                topic.partitions = topic.partitions[:1]
        return answer

    monkeypatch.setattr(ScriptedCluster, "_metadata", lagging_answers)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, max_block_ms=10_000) as p:
        await p.send_and_wait("t", b"warm-up")  # described with one partition
        await asyncio.sleep(1.5)  # longer than retry_backoff_max_ms (1 s)
        parts.append(Partition(1, parts[0].topic_id))
        lagging[0] = 1  # the first answer after the send began still has one partition
        assert (await p.send_and_wait("t", b"to the added partition", partition=1)).partition == 1
    assert cluster.partition("t", 1).values == [b"to the added partition"]


async def test_a_partition_added_after_a_refusal_is_found(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=10_000) as p:
        assert await p.partitions_for("t") == [0]
        with pytest.raises(ValueError, match="partition 1 does not exist"):
            await p.send("t", b"v", partition=1)
        cluster.topics["t"].extend(cluster.create_topic("grown", 1))  # kafka-topics --alter --partitions 2
        await asyncio.sleep(60)  # virtual time; the job retries a minute later
        assert (await p.send_and_wait("t", b"v", partition=1)).partition == 1


async def test_a_partition_wait_without_a_refresh_in_time_is_a_timeout_and_proves_nothing(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    lose = lose_one_metadata_answer(monkeypatch, hang=True)
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=20_000, request_timeout_ms=30_000) as p:
        assert await p.partitions_for("t") == [0]
        cluster.topics["t"].extend(cluster.create_topic("grown", 1))  # t has partitions 0 and 1 now
        lose[0] = True  # the refresh the send asks for is not answered within max_block_ms
        with pytest.raises(KafkaTimeoutError, match="partition 1 of topic 't' not present in metadata after 20000 ms"):
            await p.send("t", b"v", partition=1)
        # The hung refresh times out at 30 s; the next finds partition 1 within this send's 20 s.
        assert (await p.send_and_wait("t", b"v", partition=1)).partition == 1


async def test_a_demand_after_fruitless_refreshes_waits_at_most_the_backoff_since_the_last(scripted: Scripted) -> None:
    # The backoff was counted from the demand, not from the last refresh: after refreshes that
    # found nothing new, a failover's refresh (no KIP-951 hint) came up to 2 x
    # retry_backoff_max_ms after the last one. Java's timeToAllowUpdate counts from the last.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1])
    async with Producer(bootstrap_servers=cluster.bootstrap, retry_backoff_ms=100, retry_backoff_max_ms=1000) as p:
        await p.partitions_for("t")
        metadata = p._metadata
        for _ in range(6):  # demanded refreshes that find nothing new: the backoff grows to 1 s
            before = len(cluster.requests_of(MetadataRequest))
            metadata.request_update()
            while len(cluster.requests_of(MetadataRequest)) == before:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)
        last = metadata.last_refresh
        await asyncio.sleep(0.95 - (scripted.clock.now - last))  # no quiet spell yet
        before = len(cluster.requests_of(MetadataRequest))
        metadata.request_update()  # a NOT_LEADER answer after a failover, say
        while len(cluster.requests_of(MetadataRequest)) == before:
            await asyncio.sleep(0.001)
    assert cluster.requests_of(MetadataRequest)[-1].at - last <= 1.0 + 0.05


def answering_no_brokers(monkeypatch: pytest.MonkeyPatch, when: Callable[[], bool]) -> None:
    """Metadata answers name no brokers and no topics while ``when()``: a broker starting up."""
    answer = ScriptedCluster._metadata

    def starting_up(self: ScriptedCluster, node: Any, request: Any) -> Any:
        response = answer(self, node, request)
        if when():
            response.brokers = []
            for topic in response.topics:
                topic.error_code, topic.partitions = UnknownTopicOrPartitionError.code, []
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", starting_up)


async def test_an_answer_naming_no_brokers_does_not_wipe_the_leaders(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A broker in its startup phase answers with an empty cache. Taken as the cluster, every
    # leader was forgotten and records waited on a healthy broker; Java ignores such an answer.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    empty = [False]
    answering_no_brokers(monkeypatch, lambda: empty[0])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"before")
        empty[0] = True
        await clock.advance(2)  # a periodic refresh gets the empty answer
        started = clock.now
        await asyncio.wait_for(p.send_and_wait("t", b"during"), 5)  # node 1 still leads and takes it
        assert clock.now - started < 1
    assert cluster.partition("t").values == [b"before", b"during"]


async def test_a_cluster_that_keeps_answering_no_brokers_says_so(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Such answers are failed refreshes, logged at DEBUG only: the send's timeout named no cause.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    answering_no_brokers(monkeypatch, lambda: True)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, max_block_ms=5000) as p:
        with pytest.raises(KafkaTimeoutError, match=r"metadata refresh failing: .*named no brokers"):
            await p.send_and_wait("t", b"v")


async def test_a_new_topics_refresh_describes_it_alone_and_keeps_the_others(scripted: Scripted) -> None:
    # KIP-526: a producer meeting topics one by one (a topic per tenant) described every topic
    # in use for each new one, a cost growing with the square of the topics.
    cluster = scripted.cluster
    for i in range(20):
        cluster.create_topic(f"tenant-{i}", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        for i in range(20):
            await p.send_and_wait(f"tenant-{i}", b"v")
        asked = [[t.name for t in r.body.topics or []] for r in cluster.requests_of(MetadataRequest)]
        cluster.create_topic("tenant-new", 1)
        await p.send_and_wait("tenant-new", b"v")
        for i in range(20):  # the others' metadata stayed: no refresh before these go
            await p.send_and_wait(f"tenant-{i}", b"again")
        later = [[t.name for t in r.body.topics or []] for r in cluster.requests_of(MetadataRequest)][len(asked) :]
        age = p.metrics()["metadata-age"]
    assert asked[0] == ["tenant-0"]  # the first describes every topic in use: it is the only one
    assert all(len(topics) == 1 for topics in asked[1:])
    assert later == [["tenant-new"]]
    assert not math.isnan(age)  # the first refresh was of every topic


async def test_a_topic_being_created_is_asked_for_alone_a_backoff_apart(scripted: Scripted) -> None:
    # Each answer without the topic wakes its wait, which asks again: alone, those requests must
    # keep the refreshes' spacing (an answer is not a refresh of every topic, but it is one).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        allow_auto_create_topics=False,
        retry_backoff_ms=100,
        retry_backoff_max_ms=1000,
        max_block_ms=10_000,
    ) as p:
        await p.send_and_wait("t", b"v")
        before = len(cluster.requests_of(MetadataRequest))
        waiting = asyncio.ensure_future(p.send("late", b"v"))
        await asyncio.sleep(5)
        requests = cluster.requests_of(MetadataRequest)[before:]
        cluster.create_topic("late", 1)
        metadata = await (await waiting)
    assert metadata.topic == "late"
    assert {t.name for r in requests for t in r.body.topics or []} == {"late"}
    gaps = [b.at - a.at for a, b in itertools.pairwise(requests)]
    # 100 ms doubling to the 1 s cap, each within ±20 %: about 8 in 5 s, not one per answer.
    assert 3 <= len(requests) <= 12
    assert all(gap >= 0.08 for gap in gaps)


async def test_a_new_topics_answer_naming_other_brokers_moves_the_other_topics_too(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A partial answer still names every broker: a topic it does not describe, led by a broker
    # it no longer names, has no leader now, so keyless records go to its other partitions.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    cluster.create_topic("fresh", leaders=[1])
    view = ScriptedCluster.metadata_view
    unlisted: set[int] = set()

    def without(self: ScriptedCluster, node: Any) -> Any:
        brokers, topics = view(self, node)
        return [b for b in brokers if b[0] not in unlisted], topics

    monkeypatch.setattr(ScriptedCluster, "metadata_view", without)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"v", partition=1)
        unlisted.add(2)
        requests = len(cluster.requests_of(MetadataRequest))
        await p.send_and_wait("fresh", b"new topic")
        refreshes = [r for r in cluster.requests_of(MetadataRequest)[requests:] if r.body.allow_auto_topic_creation]
        assert [[t.name for t in r.body.topics or []] for r in refreshes] == [["fresh"]]  # (not a connection's check)
        partitions = {(await p.send_and_wait("t", b"%d" % i)).partition for i in range(20)}
    assert partitions == {0}


async def test_a_wait_for_a_missing_topic_does_not_put_off_the_refresh_of_the_others(scripted: Scripted) -> None:
    # Each answer without the topic made a partial refresh and restarted the metadata_max_age_ms
    # timer: the topics in use were never described again (Java refreshes by the last full one).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        allow_auto_create_topics=False,
        metadata_max_age_ms=2000,
        retry_backoff_max_ms=1000,
        max_block_ms=30_000,
    ) as p:
        await p.send_and_wait("t", b"v")
        before = len(cluster.requests_of(MetadataRequest))
        waiting = asyncio.ensure_future(p.send("not-yet", b"v"))
        # "t" grows a partition: only a refresh of "t" finds it.
        cluster.topics["t"].append(Partition(1, cluster.topics["t"][0].topic_id))
        await asyncio.sleep(20)
        asked = [[t.name for t in r.body.topics or []] for r in cluster.requests_of(MetadataRequest)[before:]]
        age = p.metrics()["metadata-age"]
        waiting.cancel()
    # 20 s with metadata_max_age_ms=2000: "t" must have been described again (about 10 times).
    assert any("t" in names for names in asked), f"only partial refreshes in 20 s: {asked}"
    assert age <= 3.0, f"metadata-age {age:.1f}s with metadata_max_age_ms=2000"


async def test_new_topics_coming_faster_than_the_max_age_do_not_put_off_the_refresh_of_the_others(
    scripted: Scripted,
) -> None:
    # A topic per tenant, a new one every 1.5 s, with metadata_max_age_ms=2000: each new topic's
    # partial refresh restarted the periodic timer, so "t" was never described again.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=2000) as p:
        await p.send_and_wait("t", b"v")
        before = len(cluster.requests_of(MetadataRequest))
        for i in range(12):
            cluster.create_topic(f"tenant-{i}", 1)
            await p.send_and_wait(f"tenant-{i}", b"v")
            await p.send_and_wait("t", b"v")
            await asyncio.sleep(1.5)
        asked = [[t.name for t in r.body.topics or []] for r in cluster.requests_of(MetadataRequest)[before:]]
        age = p.metrics()["metadata-age"]
    assert any("t" in names for names in asked), f"only partial refreshes in 18 s: {asked}"
    assert age <= 3.0, f"metadata-age {age:.1f}s with metadata_max_age_ms=2000"


async def test_the_periodic_refresh_is_due_by_the_last_full_one_after_a_new_topic(scripted: Scripted) -> None:
    # A new topic's refresh describes it alone: the next periodic refresh is still due
    # metadata_max_age_ms after the last one of every topic (Java's timeToNextUpdate), not
    # after the new topic's.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.create_topic("new", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=2000) as p:
        await p.send_and_wait("t", b"v")
        described_t = [
            r.at for r in cluster.requests_of(MetadataRequest) if r.body.topics and r.body.topics[0].name == "t"
        ]
        await asyncio.sleep(1.5)
        await p.send_and_wait("new", b"v")  # described alone
        await asyncio.sleep(3)
        full = [
            r.at
            for r in cluster.requests_of(MetadataRequest)
            if r.at > described_t[-1] and "t" in [t.name for t in r.body.topics or []]
        ]
    assert full and full[0] - described_t[-1] <= 2.0 + 0.01, (full, described_t)


async def test_a_lookup_goes_to_the_broker_with_fewest_requests_in_flight(scripted: Scripted) -> None:
    # Java's leastLoadedNode: a request any broker can answer waits behind as few requests as it
    # can. Broker 1 has two produce requests held for 10 s, broker 2 one, answered in 0.1 s.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1, 1, 2])
    cluster.create_topic("u", [2])
    loop = asyncio.get_running_loop()
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        for partition in range(3):
            await p.send_and_wait("t", b"warm-up", partition=partition)
        cluster.nodes[1].holding = cluster.nodes[2].holding = True
        held = []
        for partition in range(3):
            held.append(await p.send("t", b"held", partition=partition))
            await asyncio.sleep(0.01)  # on the wire: one request each
        loop.call_later(0.1, cluster.nodes[2].release)
        loop.call_later(10, cluster.nodes[1].release)
        started = loop.time()
        assert await p.partitions_for("u") == [0]  # a topic not known yet: a metadata request
        took = loop.time() - started
        await asyncio.gather(*held)
    assert took < 1, took


async def test_a_bootstrap_server_that_refuses_does_not_keep_the_others_untried(scripted: Scripted) -> None:
    # Of the bootstrap servers, the one tried longest ago goes first: three that refuse
    # connections must not be tried again and again while the fourth is never tried.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    dead = ",".join(f"127.0.0.1:{port}" for port in (9201, 9202, 9203))  # nothing listens there
    for seed in range(4):  # the servers are shuffled: whichever comes first
        random.seed(seed)
        async with Producer(bootstrap_servers=f"{dead},{cluster.bootstrap}", linger_ms=0, max_block_ms=5000) as p:
            await p.send_and_wait("t", b"v")


async def test_failed_refreshes_back_off_afresh_once_one_has_worked(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backoff between failed refreshes grows with the failures in a row; a refresh that
    # works ends the row. Counted on, a second outage, however much later, would wait the first
    # one's longest backoff before its second refresh.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.create_topic("u", 1)
    answer_of = ScriptedCluster._metadata
    starting_up = [False]

    def no_brokers_while_starting_up(self: ScriptedCluster, node: Any, request: MetadataRequest) -> Any:
        answer = answer_of(self, node, request)
        if starting_up[0]:
            answer.brokers = []  # a broker starting up: a failed refresh, retried after a backoff
        return answer

    monkeypatch.setattr(ScriptedCluster, "_metadata", no_brokers_while_starting_up)
    options = {"linger_ms": 0, "retry_backoff_ms": 100, "retry_backoff_max_ms": 10_000, "max_block_ms": 60_000}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        starting_up[0] = True
        first = asyncio.ensure_future(p.send_and_wait("t", b"v"))
        await asyncio.sleep(15)  # seven failures in a row: 0.1 s doubling to 6.4 s
        starting_up[0] = False
        await first
        await asyncio.sleep(5)
        starting_up[0] = True  # a second outage
        before = len(cluster.requests_of(MetadataRequest))
        second = asyncio.ensure_future(p.send_and_wait("u", b"v"))
        await asyncio.sleep(1)
        failed = len(cluster.requests_of(MetadataRequest)) - before
        starting_up[0] = False
        await second
    assert failed >= 3, f"{failed} refreshes in the first second of the second outage"


@pytest.mark.parametrize("kip951", [True, False])
async def test_a_recreated_topic_is_followed_to_its_new_leader_without_topic_ids(
    scripted: Scripted, kip951: bool
) -> None:
    # Metadata below v10 (Kafka < 2.8) names no topic id: a topic deleted and created again is
    # seen only as leader epochs starting over. Taken for a lagging broker's view, the old leader
    # (node 1, epoch 4) was kept for good and every record of the partition expired.
    cluster = scripted.cluster
    cluster.versions[MetadataRequest.API_KEY] = (1, 9)
    cluster.kip951 = kip951
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1])
    for leader in (2, 1, 2, 1):  # the partition is at leader epoch 4, led by node 1
        cluster.move_leader("t", 0, leader)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, delivery_timeout_ms=30_000) as p:
        await p.send_and_wait("t", b"before", partition=0)
        cluster.create_topic("t", leaders=[2])  # deleted and created again: node 2 leads, epoch 0
        md = await p.send_and_wait("t", b"after", partition=0)
    assert md.offset == 0
    assert cluster.partition("t", 0).values == [b"after"]


async def test_without_topic_ids_a_lagging_broker_still_does_not_undo_a_leader_change(scripted: Scripted) -> None:
    # The rule above takes an older epoch only once the leader at the newest one refused: a lagging
    # broker's answer alone still does not take the producer back (no topic ids either).
    scripted.cluster.versions[MetadataRequest.API_KEY] = (1, 9)
    cluster = three_nodes_two_lagging(scripted, leader=2)
    cluster.partition("t").epoch = 1
    lag_behind(cluster)
    async with Producer(bootstrap_servers="127.0.0.1:9092", linger_ms=0, metadata_max_age_ms=200) as p:
        await p.send_and_wait("t", b"learn the leader")
        learned = len(cluster.requests)
        await twenty_beside_lagging_answers(p)
    assert produced_to_t_after(cluster, learned) == [2] * 20


@pytest.mark.parametrize("where", ["queued", "on the wire"])
async def test_records_for_a_partition_a_recreated_topic_lacks_fail_as_such(scripted: Scripted, where: str) -> None:
    # The topic is deleted and created again with 2 partitions while records for its partition 3
    # wait (or are on the wire, and come back UNKNOWN_TOPIC_OR_PARTITION): no leader will ever
    # take them. They waited out delivery_timeout_ms (2 minutes), refreshing all along, and failed
    # with a bare DeliveryTimeoutError ("not sent").
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=4)
    linger_ms = 0 if where == "on the wire" else 60_000
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=linger_ms, metadata_max_age_ms=1_000) as p:
        await p.send_and_wait("t", b"a", partition=3)
        cluster.nodes[1].stalling = where == "on the wire"
        future = await p.send("t", b"b", partition=3)
        await asyncio.sleep(0)
        cluster.create_topic("t", leaders=2)
        cluster.nodes[1].release()
        with pytest.raises(PartitionNotFoundError) as caught:  # not DeliveryTimeoutError, 2 minutes later
            await future
        assert (await p.send_and_wait("t", b"c", partition=1)).offset == 0
    assert (caught.value.topic, caught.value.partition, caught.value.partition_count) == ("t", 3, 2)
    assert caught.value.possibly_persisted is False  # type: ignore[attr-defined]
    assert [part.values for part in cluster.topics["t"]] == [[], [b"c"]]


async def test_records_for_a_partition_a_topic_recreated_without_topic_ids_lacks_fail_as_such(
    scripted: Scripted,
) -> None:
    # The partition count named under "t"'s topic id (4) held after answers stopped naming ids
    # (Metadata < v10: a cluster downgraded, or replaced under the bootstrap name by an older one)
    # and "t" was created again with 2 partitions: its t-3 record waited out delivery_timeout_ms
    # (DeliveryTimeoutError, "not sent"), and every send(partition=3) max_block_ms (KafkaTimeoutError).
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=4)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=60_000, metadata_max_age_ms=1_000) as p:
        await p.send_and_wait("t", b"a", partition=3)
        cluster.versions[MetadataRequest.API_KEY] = (1, 9)
        cluster.disconnect(1)  # connected again: Metadata v9 now, no topic ids
        future = await p.send("t", b"b", partition=3)
        cluster.create_topic("t", leaders=2)
        with pytest.raises(PartitionNotFoundError) as queued:
            await future
        with pytest.raises(PartitionNotFoundError) as sent:
            await p.send("t", b"c", partition=3)
    assert queued.value.partition_count == sent.value.partition_count == 2


# Seeds whose refresh after the refusal goes to a lagging node (asserted below).
@pytest.mark.parametrize("scripted", [2, 3, 6], indirect=True)
async def test_without_topic_ids_one_lagging_answer_after_a_leader_change_does_not_take_the_producer_back(
    scripted: Scripted,
) -> None:
    # An ordinary leader change (no topic recreated): node 2 led at epoch 1, node 4 leads at epoch 2.
    # Node 2 refuses the next batch; the refresh that follows is answered by a lagging node (node 1
    # at epoch 0). Taken on that one answer, it sent the records back to node 1, and the older epoch
    # let every other lagging answer in after it.
    scripted.cluster.versions[MetadataRequest.API_KEY] = (1, 9)
    scripted.cluster.kip951 = False
    cluster = three_nodes_two_lagging(scripted, leader=2)
    cluster.add_node(4)
    cluster.partition("t").epoch = 1
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"at epoch 1")
        for i in (0, 1):  # connected to nodes 1 and 3 too: the refresh goes to one of nodes 1-3
            await p.send_and_wait("elsewhere", b"x", partition=i)
        learned = len(cluster.requests)
        lag_behind(cluster)
        cluster.move_leader("t", 0, 4)
        await p.send_and_wait("t", b"at epoch 2")
    later = cluster.requests[learned:]
    refused = next(i for i, r in enumerate(later) if isinstance(r.body, ProduceRequest) and r.node == 2)
    answers = [r.node for r in later[refused:] if isinstance(r.body, MetadataRequest)]
    assert answers[0] in (1, 3), "the refresh after the refusal did not reach a lagging node: the test proves nothing"
    assert [r.node for r in later if isinstance(r.body, ProduceRequest) and r.body.topic_data[0].name == "t"][-1] == 4
    assert produced_to_t_after(cluster, learned).count(1) == 0
    assert cluster.partition("t").values == [b"at epoch 1", b"at epoch 2"]


async def test_a_round_with_a_leaderless_partition_looks_at_that_partition_alone_for_unplaceable_records(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One partition of 50, all with records queued, has no leader (an election). Each sender round
    # looked at every partition of its topic for records no leader will take (a lookup per partition
    # with data: with 10,000, more than the round's ready() itself), not at the leaderless one.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1] * 49 + [-1])
    asked: list[int] = []
    partition_gone = Metadata.partition_gone

    def counted(self: Metadata, topic: str, partition: int) -> int | None:
        asked.append(partition)
        return partition_gone(self, topic, partition)

    monkeypatch.setattr(Metadata, "partition_gone", counted)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=60_000) as p:
        for i in range(50):
            await p.send("t", b"%d" % i, partition=i)
        await asyncio.sleep(3)  # refreshes for the leaderless partition, each answered by a round
        assert asked, "no round looked for unplaceable records: the test proves nothing"
        assert set(asked) == {49}
        cluster.move_leader("t", 49, 1)
        await p.flush()
    assert all(part.values == [b"%d" % i] for i, part in enumerate(cluster.topics["t"]))


@contextlib.asynccontextmanager
async def node_1_busy_node_2_lagging(
    scripted: Scripted, partitions: int, lagging: Callable[[FakeNode], None], **options: Any
) -> AsyncIterator[Producer]:
    """Topic "t" (``partitions``, on node 1) and "o" (on node 2, whose answers ``lagging`` makes
    lag), and a producer connected to both (a record to t's last partition, one to "o"). Then
    node 1 holds what it is sent, a record of t-0 on the wire, so that refreshes go to the idle
    node 2 until the block ends, which releases node 1."""
    cluster = scripted.cluster
    lagging(cluster.add_node(2))
    cluster.create_topic("t", leaders=[1] * partitions)
    cluster.create_topic("o", leaders=[2])
    async with Producer(
        bootstrap_servers="127.0.0.1:9091",
        linger_ms=0,
        max_in_flight_requests_per_connection=1,
        metadata_max_age_ms=500,
        request_timeout_ms=30_000,
        **options,
    ) as p:
        await p.send_and_wait("t", b"warm-up", partition=partitions - 1)
        await p.send_and_wait("o", b"warm-up")  # connected to node 2 too
        cluster.nodes[1].holding = True
        held = await p.send("t", b"held", partition=0)
        yield p
        cluster.nodes[1].release()
        await held


def node_2_answers(scripted: Scripted) -> int:
    return len(scripted.cluster.requests_of(MetadataRequest, node=2))


async def test_a_broker_lagging_behind_a_partition_increase_does_not_fail_the_new_partitions_records(
    scripted: Scripted,
) -> None:
    # "t" (with a topic id) has 4 partitions, all on node 1; node 2 lags behind their increase
    # and names 2. A record for t-3 is queued while node 1's connection is busy, so refreshes go
    # to the idle node 2. Taken for "the topic was created again with fewer partitions", t-3's
    # record failed with PartitionNotFoundError after retry_backoff_max_ms: under the same topic
    # id a topic never loses partitions.
    async with node_1_busy_node_2_lagging(scripted, 4, lambda node: node.stale_counts.update(t=2)) as p:
        refreshes = node_2_answers(scripted)
        queued = await p.send("t", b"queued", partition=3)
        await asyncio.sleep(5)  # refreshes, at least 0.5 s apart, answered by node 2
        assert node_2_answers(scripted) - refreshes >= 3, "no lagging answers"
    await queued
    assert scripted.cluster.partition("t", 3).values == [b"warm-up", b"queued"]


async def test_a_send_to_a_partition_a_lagging_broker_lacks_is_not_refused_as_missing(scripted: Scripted) -> None:
    # As above, for send(partition=3) itself once node 2's answers dropped t-3 from the snapshot:
    # it was refused with PartitionNotFoundError ("bad input") after retry_backoff_max_ms, though
    # an answer had named t-3 under the same topic id. It waits for the partition instead.
    lagging = node_1_busy_node_2_lagging(scripted, 4, lambda node: node.stale_counts.update(t=2), max_block_ms=5_000)
    async with lagging as p:
        await asyncio.sleep(2)  # refreshes, answered by node 2
        assert await p.partitions_for("t") == [0, 1], "no lagging answer"
        with pytest.raises(KafkaTimeoutError) as waited:  # not PartitionNotFoundError
            await p.send("t", b"late", partition=3)
    assert not isinstance(waited.value, PartitionNotFoundError)


async def test_one_answer_of_a_broker_lagging_behind_an_acl_grant_does_not_fail_queued_records(
    scripted: Scripted,
) -> None:
    # Node 2 lags behind an ACL grant: its Metadata answers refuse "t" (TOPIC_AUTHORIZATION_FAILED),
    # while node 1, the leader, takes its records. A record of "t" is queued while node 1's
    # connection is busy, so a refresh goes to the idle node 2: that one answer failed the queued
    # record at once (one lagging answer is no proof, as for a partition gone).
    async with node_1_busy_node_2_lagging(scripted, 1, lambda node: node.stale_denied.add("t")) as p:
        refreshes = node_2_answers(scripted)
        queued = await p.send("t", b"queued")
        await asyncio.sleep(0.6)  # one periodic refresh, answered by node 2
        assert node_2_answers(scripted) > refreshes, "no lagging answer"
    await queued
    assert scripted.cluster.partition("t").values == [b"warm-up", b"held", b"queued"]

"""A producer that runs for weeks: state that must not grow with time, topics or ids used.

Counts of what is kept, in virtual time on the scripted cluster; no memory thresholds.
"""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from aioprod import Producer, TopicPartition
from aioprod.errors import TopicAuthorizationFailedError
from aioprod.net.pool import ConnectionPool
from aioprod.producer.coordinators import MAX_CACHED
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.cluster import Partition, ScriptedCluster


async def test_one_offline_partition_does_not_keep_the_other_partitions_batches(scripted: Scripted) -> None:
    # A batch waiting out its delivery timeout (no leader) held every later batch, acknowledged
    # or not, with its payload: memory grew past buffer_memory for as long as the outage lasted.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", leaders=[1, -1])  # partition 1 has no leader
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, delivery_timeout_ms=3_600_000) as p:
        stuck = await p.send("t", b"stuck", partition=1)
        for _ in range(300):
            await (await p.send_many("t", [b"x" * 1000] * 16, partition=0))
            await clock.advance(1)
        held = [batch for batch in p._accumulator._deadlines._in_order if batch.done]
        assert not stuck.done()
        assert len(held) <= 32


async def test_the_state_of_topics_no_longer_used_goes_with_their_metadata(scripted: Scripted) -> None:
    # Topic per tenant: a topic idle for metadata_max_idle_ms leaves the refreshes, but its
    # leader epochs, topic id, TopicPartitions, partitioner state, warnings and per-topic
    # metrics stayed for good.
    cluster, clock = scripted.cluster, scripted.clock
    options = {"metadata_max_idle_ms": 5000, "metadata_max_age_ms": 1000}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, **options) as p:
        for i in range(50):
            name = f"tenant-{i}"
            cluster.create_topic(name, 6)
            await p.send_and_wait(name, b"v")  # keyless: the sticky partitioner
            await p.send_and_wait(name, b"v", key=b"k")
            del cluster.topics[name]  # the tenant is gone: its topic is unknown, then idle
            await clock.advance(10)
        metadata = p._metadata
        kept = {
            "leader epochs": len(metadata._leader_epochs),
            "topic ids": len(metadata._topic_ids),
            "partition counts": len(metadata._partition_counts),
            "refusals": len(metadata._topic_errors),
            "topic partitions": len(p._tps),
            "sticky partitions": len(p._partitioner._sticky),
            "warnings": len(p._metrics.events._problems),
            "topic metrics": len(p.metrics_snapshot().topics),
        }
        assert metadata.snapshot.topics == {}
        assert kept == dict.fromkeys(kept, 0)


@pytest.mark.parametrize("transactional", [False, True])
async def test_sequences_of_topics_no_longer_used_go_once_a_new_identity_replaced_them(
    scripted: Scripted, caplog: pytest.LogCaptureFixture, transactional: bool
) -> None:
    # Each partition's sequence state stayed for good once used (a topic per tenant: an entry per
    # partition ever written). An entry the broker knows at a later sequence under the current
    # identity must stay (as Java's and librdkafka's): the partition used again goes on from there.
    # One a new identity made obsolete (a transaction version 2 producer takes one per
    # transaction) goes with its topic.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("tenant", 2)
    cluster.create_topic("other", 1)
    cluster.coordinator.transaction_version = 2
    options: dict[str, object] = {"metadata_max_idle_ms": 5000, "metadata_max_age_ms": 1000, "linger_ms": 0}
    if transactional:
        options["transactional_id"] = "svc"

    async def write(topic: str, value: bytes) -> None:
        if transactional:
            async with p.transaction():
                await p.send(topic, value, partition=0)
        else:
            await p.send_and_wait(topic, value, partition=0)

    with caplog.at_level(logging.INFO, logger="aioprod"):
        async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
            ident = p._sender.idempotence
            assert ident is not None
            for i in range(3):
                await write("tenant", b"%d" % i)
            await write("other", b"o")
            await clock.advance(10)  # both idle: forgotten
            kept = sorted(f"{tp.topic}-{tp.partition}" for tp in ident._partitions)
            await write("tenant", b"again")
            await write("other", b"o2")
            await write("tenant", b"last")
            producer_metrics = p.metrics_snapshot().producer
    assert kept == ([] if transactional else ["other-0", "tenant-0"])
    assert cluster.partition("tenant").values == [b"0", b"1", b"2", b"again", b"last"]
    assert cluster.partition("other").values == [b"o", b"o2"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (producer_metrics["producer-id-reset-total"], producer_metrics["record-retry-total"]) == (0, 0)


async def test_an_idle_producer_keeps_nothing_of_topics_it_never_used(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once its topics went idle, the refreshes asked for none, and Tansu answers that with every
    # topic of the cluster: the producer described them, warned about another service's
    # leaderless partition, and kept their leader epochs and ids for good.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("mine", 1)
    cluster.create_topic("someone-elses", leaders=[1, -1])
    for i in range(20):
        cluster.create_topic(f"other-{i}", 3)
    answer = ScriptedCluster._metadata

    def as_tansu(self: ScriptedCluster, node: object, request: object) -> object:
        if request.topics == []:  # type: ignore[attr-defined]
            request.topics = None  # type: ignore[attr-defined]
        return answer(self, node, request)  # type: ignore[arg-type]

    monkeypatch.setattr(ScriptedCluster, "_metadata", as_tansu)
    options = {"metadata_max_idle_ms": 5000, "metadata_max_age_ms": 1000}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, **options) as p:
        await p.send_and_wait("mine", b"v")
        await clock.advance(20)  # "mine" idle: the refreshes ask for no topic
        metadata = p._metadata
        assert metadata.snapshot.topics == {}
        assert (metadata._leader_epochs, metadata._topic_ids, p._metrics.events._problems) == ({}, {}, {})
        await p.send_and_wait("mine", b"again")
        assert set(metadata.snapshot.topics) == {"mine"}
        assert {topic for topic, _ in metadata._leader_epochs} == {"mine"}


async def test_brokers_that_left_the_cluster_are_not_kept(scripted: Scripted) -> None:
    # Brokers replaced under new ids over the producer's life (scaling out, then
    # decommissioning): every id ever seen kept its pool state (its last error holding the closed
    # connection), its per-broker metrics, which every snapshot and scrape reported as a
    # broker with no connection, and its event-log notes.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", leaders=[1])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"a")
        old = 1
        for new in range(2, 42):  # a new broker takes over, the old one leaves
            cluster.add_node(new)
            cluster.move_leader("t", 0, new)
            await p.send_and_wait("t", b"x")
            cluster.stop(old)
            del cluster.nodes[old]
            await clock.advance(2)
            old = new
        await clock.advance(60)
        assert set(p._metadata.snapshot.brokers) == {41}
        kept = {
            "pool nodes": {n for n in p._pool._nodes if n >= 0},
            "brokers in metrics_snapshot()": {n for n in p.metrics_snapshot().brokers if n >= 0},
            "event-log notes": {key[1] for key in p._metrics.events._notes if key[1] != -1},
        }
        assert kept == {key: {41} for key in kept}


async def test_a_connection_unused_for_connections_max_idle_ms_is_closed_and_opened_again_on_use(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    # A load balancer or NAT that drops idle connections without a word (Azure's after four
    # minutes) made the next request wait out request_timeout_ms; and connections_max_idle_ms
    # (180000, as Azure Event Hubs advises) was refused as not implemented.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    options = {"connections_max_idle_ms": 180_000, "metadata_max_age_ms": 3_600_000}
    with caplog.at_level(logging.INFO, logger="aioprod"):
        async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, **options) as p:
            await p.send_and_wait("t", b"a")
            opened = node.open_connections  # the bootstrap's and the leader's
            await clock.advance(170)
            await p.send_and_wait("t", b"b")  # the leader's is used: its count starts again
            await clock.advance(15)
            assert node.open_connections == opened - 1  # the bootstrap's, unused for 185 s
            await clock.advance(170)
            assert node.open_connections == 0
            assert (await p.send_and_wait("t", b"c")).offset == 2
            assert node.open_connections == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "lost" in r.getMessage()] == []


async def test_a_connection_waiting_for_an_answer_is_not_idle(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        await p.send_and_wait("t", b"a")
        node.holding = True
        held = await p.send("t", b"held")
        await clock.advance(10)  # ten times the idle limit, its request unanswered
        assert not held.done() and node.open_connections == 1
        connections = len(node.connections)
        node.release()
        assert (await held).offset == 1
        assert (await p.send_and_wait("t", b"next")).offset == 2
        assert len(node.connections) == connections  # on the same one: it was never taken for idle
        await clock.advance(2)
        assert node.open_connections == 0


def count_idle_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the idle check runs; past 10,000 it stops checking (a spin never lets virtual
    time move on)."""
    calls = [0]
    check = ConnectionPool._close_idle

    def counted(pool: ConnectionPool) -> None:
        calls[0] += 1
        if calls[0] < 10_000:
            check(pool)

    monkeypatch.setattr(ConnectionPool, "_close_idle", counted)
    return calls


async def test_the_idle_check_does_not_spin_on_a_connection_it_retired_that_is_still_writing(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retired connection closes once its writes are out; counted with its old use, it had the
    # check due in the past, at once, again and again (a busy loop until the write timed out).
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    calls = count_idle_checks(monkeypatch)
    options = {"acks": 0, "enable_idempotence": False, "connections_max_idle_ms": 1000}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, **options) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].stop_reading()  # the last writes stay in the buffer
        for _ in range(20):
            await p.send("t", b"x" * 100_000)
        calls[0] = 0
        await clock.advance(5)
        assert calls[0] < 20
        p._pool.close_now()  # (close() would wait for the broker that stopped reading)


async def test_a_connection_is_idle_at_the_time_its_check_was_due(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Due at last_used + limit, checked as last_used <= now - limit: a float a ulp off, not idle at
    # its own due time, checked again at that same time, for good.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    clock.now = 1023.9645178547144  # (1023.9645178547144 + 0.1) - 0.1 == 1023.9645178547142
    calls = count_idle_checks(monkeypatch)
    options = {"connections_max_idle_ms": 100, "metadata_max_age_ms": 3_600_000}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, **options) as p:
        await p.send_and_wait("t", b"a")
        await clock.advance(1)
        assert calls[0] < 10
        assert cluster.nodes[1].open_connections == 0


async def test_opening_a_connection_again_after_an_idle_close_is_not_news(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("t", [1, 2, 3])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        for partition in range(3):
            await p.send_and_wait("t", b"first", partition=partition)
        with caplog.at_level(logging.INFO, logger="aioprod"):
            for i in range(6):  # an hour, a record to each broker every ten minutes
                await clock.advance(600)
                for partition in range(3):
                    await p.send_and_wait("t", b"%d" % i, partition=partition)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "connected" in r.getMessage()] == []


@pytest.mark.parametrize("lost", [False, True])
async def test_a_throttle_outlives_the_connection_it_came_on(scripted: Scripted, lost: bool) -> None:
    # The throttle (KIP-219) was the connection's: once connections_max_idle_ms closed it (or it
    # was lost), the next connection sent at once, 3 s into a 10 s throttle.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000, metadata_max_age_ms=3_600_000
    ) as p:
        await p.send_and_wait("t", b"warm-up")
        node.throttle_ms = 10_000
        await p.send_and_wait("t", b"throttled")  # the answer asks for 10 s without requests
        node.throttle_ms = 0
        if lost:
            cluster.disconnect(1)
        await clock.advance(3)  # the throttled connection is closed by now, either way
        loop = asyncio.get_running_loop()
        throttled_at = cluster.requests_of(m.ProduceRequest)[-1].at
        metadata = await (await p.send("t", b"after"))
        assert metadata.offset == 2
        assert cluster.requests_of(m.ProduceRequest)[-1].at >= throttled_at + 10, loop.time()


async def test_transactions_v2_outlive_an_idle_close_of_every_connection(scripted: Scripted) -> None:
    # begin_transaction() read the cluster's transaction.version from the connections open at
    # that moment: after an idle pause there were none, and the next transaction ran as v1
    # (AddPartitionsToTxn round trips, no epoch bump per transaction).
    cluster, clock = scripted.cluster, scripted.clock
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    cluster.coordinator.transaction_version = 2
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        transactional_id="txn-1",
        linger_ms=0,
        retry_backoff_ms=10,
        connections_max_idle_ms=1000,
        metadata_max_age_ms=3_600_000,
    ) as p:
        async with p.transaction():
            await p.send("t", b"a", partition=0)
        await clock.advance(5)
        assert p._pool.connections() == []
        async with p.transaction():
            await p.send("t", b"b", partition=0)
    assert cluster.requests_of(m.AddPartitionsToTxnRequest) == []
    assert [r.version for r in cluster.requests_of(m.ProduceRequest)] == [12, 12]
    assert [r.version for r in cluster.requests_of(m.EndTxnRequest)] == [5, 5]


@pytest.mark.parametrize("value", [0, -1])  # librdkafka's default, and Java's "never"
async def test_connections_max_idle_ms_of_0_or_less_never_closes(scripted: Scripted, value: int) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=value) as p:
        await p.send_and_wait("t", b"a")
        opened = cluster.nodes[1].open_connections
        await clock.advance(3600)
        assert cluster.nodes[1].open_connections == opened


def deny_topics(monkeypatch: pytest.MonkeyPatch, denied: set[str]) -> None:
    """The scripted cluster's metadata answers TOPIC_AUTHORIZATION_FAILED for the topics in
    ``denied`` (changed by the test as it goes: an ACL revoked or granted)."""
    answer = ScriptedCluster._metadata

    def metadata_without_acl(self: ScriptedCluster, node: object, request: object) -> object:
        response = answer(self, node, request)  # type: ignore[arg-type]
        for topic in response.topics:
            if topic.name in denied:
                topic.error_code, topic.partitions = TopicAuthorizationFailedError.code, []
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", metadata_without_acl)


async def test_a_topic_refused_for_authorization_is_asked_about_again(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused once (sent a moment before its ACL existed), it was refused from the cached
    # answer for good, without asking the cluster again, however often the service retried.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("tenant", 1)
    denied = {"tenant"}
    deny_topics(monkeypatch, denied)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        with pytest.raises(TopicAuthorizationFailedError):
            await p.send_and_wait("tenant", b"early")
        denied.clear()  # the ACL is granted; the service retries every second
        for _ in range(5):
            try:
                await p.send_and_wait("tenant", b"later")
                break
            except TopicAuthorizationFailedError:  # at once, from the last answer, which it asks again
                await clock.advance(1)
        # Nor is the refusal kept once an answer has the topic: a partition added since is
        # waited for, not refused with it.
        parts = cluster.topics["tenant"]
        parts.append(Partition(1, parts[0].topic_id))
        await p.send_and_wait("tenant", b"added", partition=1)
    assert cluster.partition("tenant").values == [b"later"]
    assert cluster.partition("tenant", 1).values == [b"added"]


async def test_queued_records_of_a_topic_whose_acl_is_revoked_fail_with_the_refusal(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A refresh answers TOPIC_AUTHORIZATION_FAILED while records of the topic wait for their
    # linger: the topic leaves the snapshot, so no leader takes them. They waited out
    # delivery_timeout_ms (2 minutes) and failed with a bare "not sent" DeliveryTimeoutError,
    # while send() raised the typed refusal at once.
    cluster = scripted.cluster
    cluster.create_topic("tenant", 1)
    denied: set[str] = set()
    deny_topics(monkeypatch, denied)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=60_000, metadata_max_age_ms=1_000) as p:
        await p.send_and_wait("tenant", b"allowed")
        future = await p.send("tenant", b"queued")
        denied.add("tenant")  # the ACL is revoked; the next periodic refresh says so
        with pytest.raises(TopicAuthorizationFailedError) as info:
            await future
    assert info.value.possibly_persisted is False  # type: ignore[attr-defined]
    assert cluster.partition("tenant").values == [b"allowed"]


async def test_the_coordinators_of_many_groups_are_not_all_kept(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.create_topic("in", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="svc") as p:
        for i in range(MAX_CACHED + 20):
            async with p.transaction():
                await p.send("t", b"v")
                await p.send_offsets_to_transaction({TopicPartition("in", 0): i}, f"group-{i}")
        assert p._txn is not None and len(p._txn._coordinators._nodes) <= MAX_CACHED


def _traceback_depth(error: BaseException) -> int:
    depth, tb = 0, error.__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    return depth


async def test_retrying_a_refused_topic_keeps_no_earlier_callers_frames(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each refused send raised the one kept error object: its traceback grew by the caller's
    # frames on every retry (their locals kept alive) until the next metadata answer.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("tenant", 1)
    answer = ScriptedCluster._metadata

    def metadata_without_acl(self: ScriptedCluster, node: object, request: object) -> object:
        response = answer(self, node, request)  # type: ignore[arg-type]
        for topic in response.topics:
            topic.error_code, topic.partitions = TopicAuthorizationFailedError.code, []
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", metadata_without_acl)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        depths = []
        for _ in range(50):
            with pytest.raises(TopicAuthorizationFailedError) as info:
                await p.send("tenant", b"v")
            depths.append(_traceback_depth(info.value))
            await clock.advance(0.001)
    assert max(depths) == depths[0]


async def test_the_compression_estimates_of_topics_no_longer_used_go_with_their_metadata(scripted: Scripted) -> None:
    # Topic per tenant, with a codec: each topic's ratio estimate, and its cap on a batch's
    # compressed size after a too-large refusal, stayed for good once the topic was written.
    cluster, clock = scripted.cluster, scripted.clock
    options = {"metadata_max_idle_ms": 5000, "metadata_max_age_ms": 1000, "compression_type": "lz4"}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=50, **options) as p:
        acc = p._accumulator
        for i in range(20):
            name = f"tenant-{i}"
            cluster.create_topic(name, 1)
            cluster.partition(name).max_batch_bytes = 300  # two records' batch refused, each alone taken
            incompressible = [random.Random(i * 2 + j).randbytes(200) for j in range(2)]
            await (await p.send_many(name, incompressible, partition=0))  # one batch, refused
            await p.send_and_wait(name, b"x" * 200)  # a batch compressed on its first attempt: its ratio learned
            assert name in acc._ratios and name in acc._wire_caps  # what the test is about
            del cluster.topics[name]
            await clock.advance(10)
        assert p._metadata.snapshot.topics == {}
        assert (len(acc._ratios), len(acc._wire_caps)) == (0, 0)

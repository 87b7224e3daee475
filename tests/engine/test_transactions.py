"""The transactional producer against the scripted fake cluster's coordinator: every answer
the protocol allows, in virtual time. (Real brokers: tests/integration/test_transactions.py.)"""

from __future__ import annotations

import asyncio
import gc
import logging
import struct
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from aioprod import ConsumerGroupMetadata, OffsetAndMetadata, Producer, TopicPartition
from aioprod.errors import (
    ConfigError,
    CoordinatorLoadInProgressError,
    DeliveryTimeoutError,
    GroupAuthorizationFailedError,
    InvalidRecordError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    ProducerFatalError,
    ProducerFencedError,
    SendManyError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionalIdAuthorizationFailedError,
    TransactionStateError,
    UnsupportedVersionError,
)
from aioprod.producer import transactions
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.coordinator import Lost

LOADING = CoordinatorLoadInProgressError.code
CONCURRENT = 51
NOT_ENOUGH_REPLICAS = 19
UNKNOWN_PRODUCER_ID = 59
NOT_COORDINATOR = 16
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = TransactionalIdAuthorizationFailedError.code


@pytest.fixture
def cluster(scripted: Scripted) -> ScriptedCluster:
    scripted.cluster.add_node(2)
    scripted.cluster.create_topic("t", leaders=[1, 2])
    return scripted.cluster


def producer(cluster: ScriptedCluster, **options: object) -> Producer:
    defaults: dict[str, object] = {"transactional_id": "txn-1", "linger_ms": 0, "retry_backoff_ms": 10}
    defaults.update(options)
    return Producer(bootstrap_servers=cluster.bootstrap, **defaults)


def requests(cluster: ScriptedCluster, cls: type) -> list[object]:
    return [r.body for r in cluster.requests_of(cls)]


async def test_commit_shows_the_records_and_abort_hides_them(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        async with p.transaction():
            values = [b"c%d" % i for i in range(4)]
            await p.send_many("t", values, keys=[b"k3", b"k0", b"k3", b"k0"])  # partitions 0, 1, 0, 1
        p.begin_transaction()
        aborted = [await p.send("t", b"a%d" % i, partition=i % 2) for i in range(2)]
        await p.flush()
        await p.abort_transaction()
        async with p.transaction():
            await p.send("t", b"last", partition=0)
    committed = cluster.partition("t", 0).committed + cluster.partition("t", 1).committed
    assert sorted(committed) == [b"c0", b"c1", b"c2", b"c3", b"last"]
    assert b"a0" in cluster.partition("t", 0).values  # written, then aborted
    assert all(f.exception() is None for f in aborted)  # delivered into the aborted transaction
    # The partitions new in one sender round joined in one AddPartitionsToTxn request.
    first_add = requests(cluster, m.AddPartitionsToTxnRequest)[0]
    assert sorted(p for t in first_add.v3_and_below_topics for p in t.partitions) == [0, 1]  # type: ignore[attr-defined]


async def test_records_not_sent_when_the_transaction_aborts_fail_as_aborted(cluster: ScriptedCluster) -> None:
    async with producer(cluster, linger_ms=60_000) as p:
        p.begin_transaction()
        queued = await p.send("t", b"never", partition=0)
        await p.abort_transaction()
        with pytest.raises(TransactionAbortedError):
            await queued
        # The caller's abort, not a failed delivery (as Java): routine aborts read as errors.
        assert p.metrics()["record-error-total"] == 0
    assert cluster.partition("t", 0).values == []
    (end,) = requests(cluster, m.EndTxnRequest)  # the partition had joined: the abort ends it
    assert end.committed is False  # type: ignore[attr-defined]


async def test_offsets_commit_with_the_transaction_and_only_then(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        async with p.transaction():
            await p.send("t", b"out", partition=0)
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 42}, "group-a")
            assert cluster.coordinator.committed == {}
        assert cluster.coordinator.committed == {"group-a": {("in", 0): 42}}
        p.begin_transaction()
        await p.send_offsets_to_transaction({TopicPartition("in", 0): 99}, "group-a")
        await p.abort_transaction()
    assert cluster.coordinator.committed == {"group-a": {("in", 0): 42}}


async def test_another_clients_offset_and_metadata_is_taken(cluster: ScriptedCluster) -> None:
    # aiokafka's consume-transform-produce code passes its own OffsetAndMetadata (and
    # TopicPartition) values: refused as "must be an int or OffsetAndMetadata, got OffsetAndMetadata".
    from aiokafka.structs import OffsetAndMetadata as AiokafkaOffsetAndMetadata  # type: ignore[import-untyped]
    from aiokafka.structs import TopicPartition as AiokafkaTopicPartition

    async with producer(cluster) as p, p.transaction():
        await p.send("t", b"out", partition=0)
        offsets = {AiokafkaTopicPartition("in", 0): AiokafkaOffsetAndMetadata(42, "m")}
        await p.send_offsets_to_transaction(offsets, "group-a")  # type: ignore[dict-item]
    assert cluster.coordinator.committed == {"group-a": {("in", 0): 42}}


async def test_begin_transaction_may_be_awaited_as_aiokafka_spells_it(cluster: ScriptedCluster) -> None:
    # aiokafka's is a coroutine: awaiting aioprod's raised TypeError after the transaction had begun.
    async with producer(cluster) as p:
        await p.begin_transaction()
        await p.send("t", b"in", partition=0)
        await p.commit_transaction()
        p.begin_transaction()  # as before, without await
        await p.send("t", b"out", partition=0)
        await p.abort_transaction()
    assert cluster.partition("t").committed == [b"in"]


async def test_confluent_kafkas_topic_partition_is_taken(cluster: ScriptedCluster) -> None:
    # What a confluent-kafka consumer's assignment() hands out: it was refused with
    # "keys must be TopicPartition(topic, partition), got TopicPartition{topic=in,partition=0,...}".
    from confluent_kafka import TopicPartition as ConfluentTopicPartition

    async with producer(cluster) as p, p.transaction():
        await p.send("t", b"out", partition=0)
        await p.send_offsets_to_transaction({ConfluentTopicPartition("in", 0): 42}, "group-a")  # type: ignore[dict-item]
    assert cluster.coordinator.committed == {"group-a": {("in", 0): 42}}


async def test_confluent_kafkas_group_metadata_is_taken_with_its_generation(cluster: ScriptedCluster) -> None:
    # consumer_group_metadata() is librdkafka's own encoding: refused, a port had to give the
    # group id alone, and lost KIP-447's fencing of a consumer that has left its group.
    from confluent_kafka import Consumer

    unjoined = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "group-a"}).consumer_group_metadata()
    joined = b"CGMDv2:" + struct.pack("=i", 7) + b"group-b\0member-1\0\0instance-9\0"  # as librdkafka writes it
    async with producer(cluster) as p:
        for metadata, offset in ((unjoined, 42), (joined, 43)):
            async with p.transaction():
                await p.send("t", b"out", partition=0)
                await p.send_offsets_to_transaction({TopicPartition("in", 0): offset}, metadata)
        p.begin_transaction()
        with pytest.raises(TypeError, match="not confluent_kafka's consumer_group_metadata"):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 1}, b"CGMDv2:\xff")
        await p.abort_transaction()
    assert cluster.coordinator.committed == {"group-a": {("in", 0): 42}, "group-b": {("in", 0): 43}}
    commits = [r.body for r in cluster.requests_of(m.TxnOffsetCommitRequest)]
    assert [(c.group_id, c.generation_id, c.member_id, c.group_instance_id) for c in commits] == [
        ("group-a", -1, "", None),
        ("group-b", 7, "member-1", "instance-9"),
    ]


async def test_a_newer_instance_fences_the_older_one(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as old:
        old.begin_transaction()
        await old.send("t", b"zombie", partition=0)
        await old.flush()
        async with producer(cluster) as new:  # same transactional id
            async with new.transaction():
                await new.send("t", b"fresh", partition=0)
            with pytest.raises(ProducerFatalError) as info:
                await old.commit_transaction()
            assert isinstance(info.value.__cause__, ProducerFencedError)
            with pytest.raises(ProducerFatalError):
                await old.send("t", b"after", partition=0)
    # The new instance's InitProducerId aborted the old one's open transaction.
    assert cluster.partition("t", 0).committed == [b"fresh"]


async def test_a_transactional_id_no_longer_authorized_where_the_coordinator_moved_is_fatal(
    cluster: ScriptedCluster,
) -> None:
    # The coordinator moves; looking it up again, the cluster refuses the transactional id (its
    # ACL was revoked): the producer cannot go on, and says so to every later call.
    async with producer(cluster) as p:
        p.begin_transaction()
        await p.send("t", b"unauthorized", partition=0)
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([NOT_COORDINATOR])
        cluster.coordinator.script[m.FindCoordinatorRequest.API_KEY] = deque([TRANSACTIONAL_ID_AUTHORIZATION_FAILED])
        cluster.coordinator.find_refusal_message = "User:bob may not Write TransactionalId txn-1"
        with pytest.raises(ProducerFatalError) as info:
            await p.commit_transaction()
        assert isinstance(info.value.__cause__, TransactionalIdAuthorizationFailedError)
        assert "User:bob may not Write TransactionalId txn-1" in str(info.value)  # the broker's own words
        with pytest.raises(ProducerFatalError):
            await p.send("t", b"after", partition=0)
    assert cluster.partition("t", 0).committed == []


async def test_the_coordinator_moving_or_loading_is_retried_inside_the_call(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        async with p.transaction():
            await p.send("t", b"one", partition=0)
        cluster.coordinator.move_to(2)  # node 1 now answers NOT_COORDINATOR
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([LOADING, LOADING, CONCURRENT])
        async with p.transaction():
            await p.send("t", b"two", partition=1)
    assert cluster.partition("t", 0).committed == [b"one"]
    assert cluster.partition("t", 1).committed == [b"two"]
    assert len(cluster.requests_of(m.FindCoordinatorRequest)) >= 2  # looked up again after the move


async def test_an_end_txn_answer_lost_is_retried_and_commits_once(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([Lost])
        async with p.transaction():
            await p.send("t", b"once", partition=0)
        async with p.transaction():
            await p.send("t", b"next", partition=0)
    assert cluster.partition("t", 0).committed == [b"once", b"next"]
    assert len(requests(cluster, m.EndTxnRequest)) == 3  # the lost one, its retry, the next


async def test_a_commit_whose_answer_was_lost_then_fenced_says_it_may_have_committed(cluster: ScriptedCluster) -> None:
    # The EndTxn commits, its answer is lost; a newer producer of the id fences the epoch before
    # the retry, which Kafka answers PRODUCER_FENCED whatever became of the transaction. The
    # error said only "fenced", as if the transaction's records would never be visible.
    async with producer(cluster) as p:
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([Lost, ProducerFencedError.code])
        with pytest.raises(ProducerFatalError, match="outcome is in doubt") as info:
            async with p.transaction():
                await p.send("t", b"committed", partition=0)
        assert info.value.possibly_persisted
        assert [request.body.committed for request in cluster.requests_of(m.EndTxnRequest)] == [True, True]  # type: ignore[attr-defined]
    assert cluster.partition("t", 0).committed == [b"committed"]


async def test_a_failed_record_makes_the_transaction_abortable_and_the_producer_goes_on(
    cluster: ScriptedCluster,
) -> None:
    async with producer(cluster) as p:
        p.begin_transaction()
        good = await p.send("t", b"good", partition=1)
        cluster.nodes[1].script = deque([InvalidRecordError.code])
        bad = await p.send("t", b"bad", partition=0)
        with pytest.raises(InvalidRecordError):
            await bad
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        with pytest.raises(TransactionAbortableError):
            await p.send("t", b"refused", partition=0)
        await p.abort_transaction()
        assert (await good).offset == 0
        async with p.transaction():
            await p.send("t", b"again", partition=0)
    assert cluster.partition("t", 0).committed == [b"again"]
    assert cluster.partition("t", 1).committed == []


async def test_transaction_block_aborts_on_an_exception_and_reraises_it(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        with pytest.raises(ZeroDivisionError):
            async with p.transaction():
                await p.send("t", b"x", partition=0)
                await p.flush()
                1 / 0  # noqa: B018
        async with p.transaction():
            await p.send("t", b"y", partition=0)
    assert cluster.partition("t", 0).committed == [b"y"]


async def test_transactional_calls_in_the_wrong_state_or_at_once_fail_clearly(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        with pytest.raises(TransactionStateError, match="begin_transaction"):
            await p.send("t", b"outside", partition=0)
        with pytest.raises(TransactionStateError, match="commit_transaction"):
            await p.commit_transaction()
        p.begin_transaction()
        with pytest.raises(TransactionStateError, match="begin_transaction"):
            p.begin_transaction()
        await p.send("t", b"v", partition=0)
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([LOADING] * 5)
        committing = asyncio.ensure_future(p.commit_transaction())
        await asyncio.sleep(0.05)  # the commit is waiting for the coordinator
        with pytest.raises(TransactionStateError, match=r"commit_transaction\(\) is still in progress"):
            await p.abort_transaction()
        with pytest.raises(TransactionStateError, match="in progress"):
            p.begin_transaction()
        await committing
    assert cluster.partition("t", 0).committed == [b"v"]


async def test_a_commit_that_outlasts_max_block_can_be_waited_for_again(cluster: ScriptedCluster) -> None:
    async with producer(cluster, max_block_ms=1000, retry_backoff_max_ms=100) as p:
        p.begin_transaction()
        await p.send("t", b"slow", partition=0)
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([CONCURRENT] * 15)
        with pytest.raises(KafkaTimeoutError, match="call commit_transaction"):
            await p.commit_transaction()
        await p.commit_transaction()  # the same commit, still going: wait for it
    assert cluster.partition("t", 0).committed == [b"slow"]
    assert len([r for r in requests(cluster, m.EndTxnRequest) if r.committed]) == 16  # type: ignore[attr-defined]


async def test_close_aborts_an_open_transaction(cluster: ScriptedCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "aioprod.producer.transactions")
    async with producer(cluster, client_id="billing") as p:
        p.begin_transaction()
        await p.send("t", b"left open", partition=0)
        await p.flush()
    assert cluster.partition("t", 0).values == [b"left open"]
    assert cluster.partition("t", 0).committed == []
    (end,) = requests(cluster, m.EndTxnRequest)
    assert end.committed is False  # type: ignore[attr-defined]
    # Which of the process's producers it was, as every line the producer logs says.
    assert "[billing] aborting transaction 'txn-1': the producer is closing" in caplog.messages


async def test_close_finishes_an_abort_that_failed_part_way(cluster: ScriptedCluster) -> None:
    # The abort's EndTxn was refused (a non-retriable answer), leaving the producer ABORTING:
    # not "in a transaction", so close() left the transaction open at the coordinator, and
    # read_committed readers waited for its timeout.
    async with producer(cluster) as p:
        p.begin_transaction()
        await p.send("t", b"to abort", partition=0)
        await p.flush()
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([42])  # INVALID_REQUEST
        with pytest.raises(KafkaError):
            await p.abort_transaction()
    assert [end.committed for end in requests(cluster, m.EndTxnRequest)] == [False, False]  # type: ignore[attr-defined]
    assert not cluster.coordinator.transactions["txn-1"].ongoing
    assert cluster.partition("t", 0).committed == []


async def test_close_with_a_timeout_ends_within_it_when_the_broker_is_silent(
    scripted: Scripted, cluster: ScriptedCluster
) -> None:
    # The abort on close had the whole timeout, and then the sender as much again: close(2)
    # took 4 s with a silent broker.
    p = producer(cluster)
    await p.start()
    p.begin_transaction()
    cluster.nodes[1].holding = True  # written, never answered
    in_flight = await p.send("t", b"unanswered", partition=0)
    while not cluster.requests_of(m.ProduceRequest):
        await asyncio.sleep(0)
    started = scripted.clock.now
    await p.close(2)
    assert scripted.clock.now - started <= 2.001
    with pytest.raises(ProducerClosedError):
        await in_flight


async def test_a_transactions_first_add_refused_as_concurrent_is_retried_within_milliseconds(
    scripted: Scripted, cluster: ScriptedCluster
) -> None:
    # After a commit Kafka answers the next transaction's first AddPartitionsToTxn with
    # CONCURRENT_TRANSACTIONS while the markers are written: with the retry backoff (100 ms,
    # doubling) a loop of small transactions ran a few a second. As Java, 20 ms then.
    async with producer(cluster, retry_backoff_ms=100) as p:
        for first in (True, False):
            p.begin_transaction()
            if not first:
                await p.send_and_wait("t", b"joined", partition=1)
            cluster.coordinator.script[m.AddPartitionsToTxnRequest.API_KEY] = deque([CONCURRENT] * 3)
            started = scripted.clock.now
            await p.send_and_wait("t", b"v", partition=0)
            took = scripted.clock.now - started
            await p.commit_transaction()
            if first:
                assert took <= 0.061, took  # three retries 20 ms apart
            else:
                assert took >= 0.079 * 3, took  # a later add: the retry backoff, as before
    assert len(cluster.partition("t", 0).committed) == 2


async def test_a_sequence_in_doubt_aborts_the_transaction_and_bumps_the_epoch(cluster: ScriptedCluster) -> None:
    async with producer(cluster, request_timeout_ms=200, delivery_timeout_ms=500) as p:
        async with p.transaction():
            await p.send("t", b"before", partition=0)
        p.begin_transaction()
        cluster.nodes[1].stalling = True  # never answered: its sequence is in doubt
        lost = await p.send("t", b"lost", partition=0)
        with pytest.raises(DeliveryTimeoutError):
            await lost
        cluster.disconnect(1)
        cluster.nodes[1].release()
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        await p.abort_transaction()
        async with p.transaction():
            await p.send("t", b"after", partition=0)
    inits = requests(cluster, m.InitProducerIdRequest)
    assert [(r.producer_id, r.producer_epoch) for r in inits] == [(-1, -1), (5000, 0)]  # type: ignore[attr-defined]
    assert cluster.partition("t", 0).committed == [b"before", b"after"]
    assert cluster.partition("t", 0).log[-2].producer_epoch == 1  # "after" under the bumped epoch


async def test_transactions_v2_adds_partitions_and_offsets_implicitly_and_bumps_the_epoch(
    cluster: ScriptedCluster,
) -> None:
    cluster.coordinator.transaction_version = 2
    async with producer(cluster) as p:
        async with p.transaction():
            await p.send("t", b"a", partition=0)
            await p.send("t", b"b", partition=1)
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 7}, "g")
        async with p.transaction():
            await p.send("t", b"c", partition=0)
    assert requests(cluster, m.AddPartitionsToTxnRequest) == []
    assert requests(cluster, m.AddOffsetsToTxnRequest) == []
    assert {r.version for r in cluster.requests_of(m.ProduceRequest)} == {12}
    assert {r.version for r in cluster.requests_of(m.EndTxnRequest)} == {5}
    assert {r.version for r in cluster.requests_of(m.TxnOffsetCommitRequest)} == {5}
    assert cluster.partition("t", 0).committed == [b"a", b"c"]
    assert cluster.coordinator.committed == {"g": {("in", 0): 7}}
    # Each EndTxn answered with the next epoch; the second transaction used it.
    assert [b.producer_epoch for b in cluster.partition("t", 0).log if b.marker is None] == [0, 1]


def test_the_newest_cluster_features_decide_transactions_v2() -> None:
    # Features carry an epoch that grows with each change. A connection opened before
    # transaction.version was lowered still reports level 2: taken because it came first, v2
    # transactions (no AddPartitionsToTxn) went on against a cluster back on v1.
    def connection(level: int, epoch: int) -> Any:
        return SimpleNamespace(
            finalized_features={"transaction.version": level} if level else {},
            finalized_features_epoch=epoch,
            api_versions={m.ProduceRequest.API_KEY: (3, 12), m.EndTxnRequest.API_KEY: (0, 5)},
        )

    speaks_v2 = transactions._speaks_transactions_v2
    assert not speaks_v2([connection(2, 1), connection(1, 2)])  # lowered after the first connect
    assert speaks_v2([connection(1, 1), connection(2, 2)])  # raised
    assert speaks_v2([connection(2, 3), connection(0, -1)])  # a broker before ApiVersions v3 says nothing
    assert not speaks_v2([])


def test_transactional_settings_that_cannot_work_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="transactional_id needs idempotence"):
        Producer(bootstrap_servers="h:1", transactional_id="x", acks=1)
    with pytest.raises(ConfigError, match="enable_idempotence=False"):
        Producer(bootstrap_servers="h:1", transactional_id="x", enable_idempotence=False)
    with pytest.raises(ConfigError, match="transactional_id"):
        Producer(bootstrap_servers="h:1", transactional_id="")


async def test_a_commit_after_an_earlier_timed_out_commit_really_commits(cluster: ScriptedCluster) -> None:
    async with producer(cluster, max_block_ms=1000, retry_backoff_max_ms=100) as p:
        p.begin_transaction()
        await p.send("t", b"first", partition=0)
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([CONCURRENT] * 15)
        with pytest.raises(KafkaTimeoutError):
            await p.commit_transaction()
        await asyncio.sleep(5)  # the first commit finishes in the background
        assert cluster.partition("t", 0).committed == [b"first"]
        p.begin_transaction()  # allowed: the earlier commit is over
        await p.send("t", b"second", partition=0)
        await p.commit_transaction()  # returns normally...
        # ...so the second transaction must be committed:
        assert cluster.partition("t", 0).committed == [b"first", b"second"]


async def test_a_commit_after_a_cancelled_commit_really_commits(cluster: ScriptedCluster) -> None:
    async with producer(cluster, retry_backoff_max_ms=100) as p:
        p.begin_transaction()
        await p.send("t", b"first", partition=0)
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([CONCURRENT] * 5)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await p.commit_transaction()
        await asyncio.sleep(5)
        async with p.transaction():
            await p.send("t", b"second", partition=0)
        assert cluster.partition("t", 0).committed == [b"first", b"second"]


async def test_a_send_that_straddles_a_commit_does_not_leak_into_the_next_transaction(
    cluster: ScriptedCluster,
) -> None:
    # send() checks the transaction state only before it waits for metadata; the commit
    # (from another task) ends the transaction meanwhile.
    async with producer(cluster, max_block_ms=10_000) as p:
        p.begin_transaction()
        await p.send("t", b"in-txn-1", partition=0)
        straddling = asyncio.ensure_future(p.send("later", b"sent-during-txn-1"))
        await asyncio.sleep(0.5)  # waiting for the topic's metadata
        await p.commit_transaction()
        p.begin_transaction()
        cluster.create_topic("later", 1)
        outcome = await asyncio.gather(straddling, return_exceptions=True)
        await p.commit_transaction()
    # As in Java (maybeAddPartition): the record is refused, not put in transaction 2.
    assert isinstance(outcome[0], TransactionStateError), outcome
    assert cluster.partition("later", 0).values == []


async def test_a_send_waiting_for_buffer_space_during_commit_is_not_written_after_the_commit_marker(
    cluster: ScriptedCluster,
) -> None:
    # r2 waits for buffer space while another task commits: once the commit began, r2 must
    # not be queued (it would be written after the commit marker, outside any transaction).
    async with producer(cluster, buffer_memory=4000, max_block_ms=10_000) as p:
        p.begin_transaction()
        cluster.nodes[2].holding = True  # r1 is written, its answer held
        await p.send("t", b"r1" + b"x" * 2500, partition=1)
        while not cluster.partition("t", 1).log:
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(p.send("t", b"r2" + b"y" * 2500, partition=1))  # buffer full
        committing = asyncio.ensure_future(p.commit_transaction())
        await asyncio.sleep(0.1)  # the commit's flush waits for r1
        cluster.nodes[2].release()
        await committing
        with pytest.raises(TransactionStateError, match="ended"):
            await waiting
        async with p.transaction():
            await p.send("t", b"r3", partition=1)
    assert cluster.partition("t", 1).committed == [b"r1" + b"x" * 2500, b"r3"]
    assert b"r2" + b"y" * 2500 not in cluster.partition("t", 1).values


async def test_aborting_while_a_batch_waits_to_retry_does_not_spoil_the_next_transaction(
    cluster: ScriptedCluster,
) -> None:
    async with producer(cluster, retry_backoff_ms=1000, retry_backoff_max_ms=1000) as p:
        async with p.transaction():
            await p.send("t", b"warm-up", partition=1)  # node 1 and 2 connected, partition 1 only
        p.begin_transaction()
        cluster.nodes[1].script = deque([NOT_ENOUGH_REPLICAS])  # retriable; not written
        fut = await p.send("t", b"retried", partition=0)
        while not cluster.requests_of(m.ProduceRequest, node=1):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)  # the answer came: the batch (sequence 0) waits 1 s to retry
        await p.abort_transaction()
        with pytest.raises(TransactionAbortedError) as info:
            await fut
        assert info.value.possibly_persisted is False  # refused, not written
        # The next transaction has nothing to do with the aborted one.
        async with p.transaction():
            await p.send("t", b"next", partition=0)
    assert cluster.partition("t", 0).committed == [b"next"]


async def test_a_record_sent_before_the_abort_fails_as_possibly_in_the_log(cluster: ScriptedCluster) -> None:
    """Written, its answer lost to the request timeout, then aborted while it waited to retry:
    not "aborted before the record was sent"."""
    async with producer(
        cluster, request_timeout_ms=1000, retry_backoff_ms=8000, retry_backoff_max_ms=8000, delivery_timeout_ms=60_000
    ) as p:
        p.begin_transaction()
        await (await p.send("t", b"first", partition=0))
        cluster.nodes[1].holding = True  # the next batch is written; its answer comes too late
        fut = await p.send("t", b"second", partition=0)
        await asyncio.sleep(1.5)  # virtual time: the request timed out, the retry is 8 s away
        cluster.nodes[1].release()
        await p.abort_transaction()
        with pytest.raises(TransactionAbortedError) as info:
            await fut
    assert info.value.possibly_persisted is True
    assert "after the record was sent, before it was acknowledged (it may be in the log" in str(info.value)
    assert cluster.partition("t", 0).values == [b"first", b"second"]
    assert cluster.partition("t", 0).committed == []


async def test_a_transaction_made_abortable_by_a_sequence_gap_fails_its_commit_promptly(
    scripted: Scripted, cluster: ScriptedCluster
) -> None:
    async with producer(cluster, delivery_timeout_ms=120_000, max_block_ms=60_000) as p:
        async with p.transaction():
            await p.send("t", b"warm-up", partition=0)
        p.begin_transaction()
        cluster.nodes[1].script = deque([UNKNOWN_PRODUCER_ID])  # the broker lost our state
        await p.send("t", b"v", partition=0)
        started = scripted.clock.now
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        # Abortable in the sender round that saw the gap, and swept at once (the sender does
        # not sleep until the batch's delivery deadline).
        assert scripted.clock.now - started < 5


async def test_close_during_a_commit_fails_the_commit_with_a_kafka_error_not_a_bare_cancel(
    cluster: ScriptedCluster,
) -> None:
    p = producer(cluster, retry_backoff_max_ms=100)
    await p.start()
    p.begin_transaction()
    await p.send("t", b"v", partition=0)
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([CONCURRENT] * 1000)
    committing = asyncio.ensure_future(p.commit_transaction())
    await asyncio.sleep(0.5)
    await p.close(timeout=1)
    outcome = await asyncio.gather(committing, return_exceptions=True)
    assert isinstance(outcome[0], ProducerClosedError), outcome


async def test_abort_does_not_resend_batches_that_come_back_for_a_retry(
    scripted: Scripted, cluster: ScriptedCluster
) -> None:
    async with producer(cluster, request_timeout_ms=1000, delivery_timeout_ms=120_000) as p:
        p.begin_transaction()
        cluster.nodes[2].stalling = True  # partition 1's leader never answers
        await p.send("t", b"v", partition=1)
        await asyncio.sleep(0.5)
        started = scripted.clock.now
        await p.abort_transaction()
        took = scripted.clock.now - started
        produces = len(cluster.requests_of(m.ProduceRequest, node=2))
        cluster.nodes[2].release()
    # As Java (maybeAbortBatches): what comes back for a retry while aborting is failed, not
    # sent again until its delivery timeout.
    assert took < 5, (took, produces)


async def test_two_concurrent_send_offsets_calls_do_not_drop_one_of_them(cluster: ScriptedCluster) -> None:
    async with producer(cluster, retry_backoff_max_ms=100) as p:
        p.begin_transaction()
        await p.send("t", b"out", partition=0)
        cluster.coordinator.script[m.AddOffsetsToTxnRequest.API_KEY] = deque([CONCURRENT] * 3)
        first = asyncio.ensure_future(p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g"))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(p.send_offsets_to_transaction({TopicPartition("in", 1): 7}, "g"))
        outcome = await asyncio.gather(first, second, return_exceptions=True)
        await p.commit_transaction()
    # Two calls at once: the second fails at once, and the first's offsets commit.
    assert isinstance(outcome[1], TransactionStateError), outcome
    assert cluster.coordinator.committed == {"g": {("in", 0): 5}}


@pytest.mark.parametrize(
    ("offset", "group", "error"),
    [
        (OffsetAndMetadata(5, metadata=123), "g", "metadata .* must be a str or None"),  # AttributeError
        (OffsetAndMetadata(5, metadata=b"x"), "g", "metadata .* must be a str or None"),
        (OffsetAndMetadata(5, leader_epoch="7"), "g", "leader_epoch .* must be an int"),  # struct.error
        (OffsetAndMetadata(2**63), "g", r"offset .* must be >= 0 and < 9223372036854775808"),
        (OffsetAndMetadata(5.5), "g", "offset .* must be an int, got float"),  # type: ignore[arg-type]
        (5, ConsumerGroupMetadata("g", generation_id=2**40), "generation_id must be >= -2147483648"),
        (5, ConsumerGroupMetadata("g", member_id=None), "member_id must be a str"),  # type: ignore[arg-type]
    ],
)
async def test_offsets_the_protocol_cannot_carry_are_refused_before_anything_is_sent(
    cluster: ScriptedCluster, offset: Any, group: Any, error: str
) -> None:
    # They failed in the encoder (AttributeError, struct.error) after AddOffsetsToTxn had gone
    # out, and the transaction stayed committable: its output committed without its offsets.
    async with producer(cluster) as p, p.transaction():
        await p.send("t", b"out", partition=0)
        with pytest.raises((TypeError, ValueError), match=error):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): offset}, group)
        assert not cluster.requests_of(m.AddOffsetsToTxnRequest)
    assert cluster.partition("t", 0).committed == [b"out"]  # bad input, as a bad send(): nothing else changes


@pytest.mark.parametrize(
    ("offset", "group", "error"),
    [
        (5, "g\ud800", "the consumer group id cannot be encoded as UTF-8"),
        (5, ConsumerGroupMetadata("g", member_id="m\ud800"), "member_id cannot be encoded as UTF-8"),
        (OffsetAndMetadata(5, "\ud800"), "g", r"metadata for .* cannot be encoded as UTF-8"),
    ],
)
async def test_strings_utf8_cannot_carry_are_refused_before_anything_is_sent(
    cluster: ScriptedCluster, offset: Any, group: Any, error: str
) -> None:
    # They failed in the encoder, a bare UnicodeEncodeError, and left the transaction abortable.
    async with producer(cluster) as p, p.transaction():
        await p.send("t", b"out", partition=0)
        with pytest.raises(ValueError, match=error):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): offset}, group)
    assert cluster.partition("t", 0).committed == [b"out"]


async def test_offsets_that_fail_part_way_for_any_reason_stop_the_commit(
    cluster: ScriptedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Offsets cut short after AddOffsetsToTxn (here by a bug in building TxnOffsetCommit): a
    # transaction committed then would have its output without its offsets.
    def broken(**_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(transactions, "TxnOffsetCommitRequest", broken)
    async with producer(cluster) as p:
        p.begin_transaction()
        await p.send("t", b"out", partition=0)
        with pytest.raises(RuntimeError, match="a bug"):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g")
        assert cluster.requests_of(m.AddOffsetsToTxnRequest)
        with pytest.raises(TransactionAbortableError, match="sending the offsets did not finish"):
            await p.commit_transaction()
        await p.abort_transaction()
    assert cluster.partition("t", 0).committed == []
    assert cluster.coordinator.committed == {}


async def test_empty_offsets_send_nothing_and_an_idle_round_commits(cluster: ScriptedCluster) -> None:
    # As Java. Under transactions v2 Kafka answers an empty TxnOffsetCommit without opening the
    # transaction, and the EndTxn that followed was refused with INVALID_TXN_STATE: fatal.
    cluster.coordinator.transaction_version = 2
    async with producer(cluster) as p:
        async with p.transaction():  # a consume-transform-produce round that consumed nothing
            await p.send_offsets_to_transaction({}, "g")
        async with p.transaction():
            await p.send("t", b"after", partition=0)
    assert not cluster.requests_of(m.TxnOffsetCommitRequest)
    assert [end.committed for end in requests(cluster, m.EndTxnRequest)] == [True]  # type: ignore[attr-defined]
    assert cluster.partition("t", 0).committed == [b"after"]


async def test_abort_ends_a_transaction_the_coordinator_started_for_cancelled_offsets(
    cluster: ScriptedCluster,
) -> None:
    async with producer(cluster, retry_backoff_ms=500, retry_backoff_max_ms=500) as p:
        p.begin_transaction()
        cluster.coordinator.script[m.AddOffsetsToTxnRequest.API_KEY] = deque([Lost])
        offsets = asyncio.ensure_future(p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g"))
        await asyncio.sleep(0.1)  # AddOffsetsToTxn acted on, its answer lost; retry in 0.5 s
        await p.abort_transaction()  # cancels the pending send_offsets
        await asyncio.gather(offsets, return_exceptions=True)
        still_open = cluster.coordinator.transactions["txn-1"].ongoing
        ends = len(cluster.requests_of(m.EndTxnRequest))
    assert not still_open, f"the coordinator's transaction was left open (EndTxn sent: {ends})"


GROUP_AUTHORIZATION_FAILED = 30


async def test_offsets_the_group_coordinator_refused_make_the_transaction_abortable(cluster: ScriptedCluster) -> None:
    # As the Java client: a TxnOffsetCommit refused for good (here: no Read on the group) leaves a
    # transaction that must not commit; committing it would write the output without the offsets.
    async with producer(cluster) as p:
        p.begin_transaction()
        await p.send("t", b"out", partition=0)
        cluster.coordinator.script[m.TxnOffsetCommitRequest.API_KEY] = deque([GROUP_AUTHORIZATION_FAILED])
        with pytest.raises(GroupAuthorizationFailedError):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 7}, "g")
        with pytest.raises(TransactionAbortableError, match="GROUP_AUTHORIZATION_FAILED"):
            await p.commit_transaction()
        await p.abort_transaction()
        async with p.transaction():  # the producer goes on
            await p.send("t", b"next", partition=0)
    assert cluster.partition("t", 0).committed == [b"next"]
    assert cluster.coordinator.committed == {}


async def test_offsets_refused_after_the_caller_stopped_waiting_still_stop_the_commit(cluster: ScriptedCluster) -> None:
    # send_offsets_to_transaction() outlasts max_block_ms (the coordinator is loading), then the
    # coordinator refuses the offsets: the commit that follows must not go through without them,
    # and the refusal is not logged again as asyncio's "Task exception was never retrieved".
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unhandled.append(context))
    async with producer(cluster, max_block_ms=1000, retry_backoff_max_ms=100) as p:
        p.begin_transaction()
        await p.send("t", b"out", partition=0)
        cluster.coordinator.script[m.TxnOffsetCommitRequest.API_KEY] = deque(
            [LOADING] * 30 + [GROUP_AUTHORIZATION_FAILED]
        )
        with pytest.raises(KafkaTimeoutError, match="send_offsets_to_transaction"):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 7}, "g")
        assert p._txn is not None and p._txn._operation is not None
        await asyncio.wait([p._txn._operation[1]])  # it ends, refused, with nobody waiting for it
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        await p.abort_transaction()
    assert cluster.partition("t", 0).committed == []
    del p
    gc.collect()
    assert [c["message"] for c in unhandled] == []


async def test_a_partition_new_to_the_transaction_joins_while_its_leader_is_busy(cluster: ScriptedCluster) -> None:
    # The sender passes over a leader whose connection cannot take a request, but the
    # AddPartitionsToTxn of a partition new to the transaction goes to the coordinator (node 1)
    # meanwhile: otherwise the batch would wait that round trip more once the leader is free.
    cluster.create_topic("busy", leaders=[2, 2])
    busy = cluster.nodes[2]
    async with producer(cluster, max_in_flight_requests_per_connection=1) as p, p.transaction():
        busy.holding = True
        first = await p.send("busy", b"first", partition=0)
        while not cluster.requests_of(m.ProduceRequest, node=2):
            await asyncio.sleep(0.001)
        second = await p.send("busy", b"second", partition=1)
        for _ in range(50):  # 50 ms of virtual time; the linger is 0
            if len(requests(cluster, m.AddPartitionsToTxnRequest)) == 2:
                break
            await asyncio.sleep(0.001)
        added_while_busy = len(requests(cluster, m.AddPartitionsToTxnRequest))
        held_meanwhile = not first.done() and not second.done()
        busy.release()
    assert added_while_busy == 2
    assert held_meanwhile  # the leader held the first batch all along
    assert cluster.partition("busy", 0).committed == [b"first"]
    assert cluster.partition("busy", 1).committed == [b"second"]


async def test_a_producer_whose_sender_died_commits_no_part_of_its_transaction(
    cluster: ScriptedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sender's death failed the records still queued, but the transaction was not told:
    # commit_transaction() found every record "done" and committed those written before it.
    from aioprod.producer.accumulator import RecordAccumulator

    async with producer(cluster) as p:
        p.begin_transaction()
        await (await p.send("t", b"written", partition=0))

        def broken(*args: object) -> Any:
            raise RuntimeError("sender bug injected by the test")

        monkeypatch.setattr(RecordAccumulator, "ready", broken)
        lost = await p.send("t", b"failed with the sender", partition=0)
        with pytest.raises(ProducerFatalError):
            await lost
        with pytest.raises(ProducerFatalError, match="sender task died"):
            await p.commit_transaction()
        with pytest.raises(ProducerFatalError):
            p.begin_transaction()
    # close() still aborts the open transaction: read_committed readers need not wait for its timeout.
    assert cluster.partition("t", 0).committed == []
    assert [request.body.committed for request in cluster.requests_of(m.EndTxnRequest)] == [False]  # type: ignore[attr-defined]


async def test_a_producer_failed_by_a_broker_begins_no_transaction_and_commits_no_offsets(
    cluster: ScriptedCluster,
) -> None:
    # A refused sequence 0 is the broker breaking the protocol: the producer stops. The
    # transaction was only made abortable, so after the abort a new one began and committed
    # consumer offsets with none of its output.
    async with producer(cluster) as p:
        p.begin_transaction()
        cluster.nodes[1].script = deque([45])  # OUT_OF_ORDER_SEQUENCE_NUMBER at sequence 0
        refused = await p.send("t", b"refused", partition=0)
        with pytest.raises(ProducerFatalError):
            await refused
        with pytest.raises(ProducerFatalError, match="sequence gap"):
            await p.commit_transaction()
        await p.abort_transaction()  # ends the open transaction, as close() would
        with pytest.raises(ProducerFatalError, match="sequence gap"):
            p.begin_transaction()
        with pytest.raises(ProducerFatalError):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 10}, "g")
    assert cluster.coordinator.committed == {}
    assert cluster.partition("t", 0).committed == []


async def test_a_transaction_block_whose_commit_finds_the_producer_failed_aborts_it(cluster: ScriptedCluster) -> None:
    # The block re-raised the ProducerFatalError and left the transaction open at the coordinator
    # until close(): read_committed readers of the partition waited meanwhile.
    async with producer(cluster) as p:
        with pytest.raises(ProducerFatalError, match="sequence gap") as info:
            async with p.transaction():
                cluster.nodes[1].script = deque([45])  # OUT_OF_ORDER_SEQUENCE_NUMBER at sequence 0
                await p.send("t", b"refused", partition=0)
        assert not cluster.coordinator.transactions["txn-1"].ongoing
        assert getattr(info.value, "__notes__", []) == []  # the abort went through
        requests = [request.body.committed for request in cluster.requests_of(m.EndTxnRequest)]  # type: ignore[attr-defined]
    assert requests == [False]
    assert cluster.partition("t", 0).committed == []


async def test_a_transaction_block_whose_producer_was_fenced_raises_the_fence(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        with pytest.raises(ProducerFatalError) as info:
            async with p.transaction():
                await (await p.send("t", b"fenced", partition=0))
                async with producer(cluster):  # a newer producer of txn-1: aborts it, fences this one
                    pass
        assert isinstance(info.value.__cause__, ProducerFencedError)
        assert getattr(info.value, "__notes__", []) == []  # nothing but the fence to say
    assert cluster.partition("t", 0).committed == []


@pytest.mark.parametrize("version", [1, 2])
async def test_a_transactional_id_the_coordinator_forgot_is_renewed_after_one_abort(
    cluster: ScriptedCluster, version: int
) -> None:
    # The id expired while the producer idled (transactional.id.expiration.ms): the coordinator
    # answers INVALID_PRODUCER_ID_MAPPING. Without a new identity every later transaction
    # failed the same way (v1), or abort_transaction() failed forever (v2).
    cluster.coordinator.transaction_version = version
    async with producer(cluster) as p:
        async with p.transaction():
            await p.send("t", b"before", partition=0)
        del cluster.coordinator.transactions["txn-1"]
        p.begin_transaction()
        await p.send("t", b"refused", partition=0)
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        await p.abort_transaction()
        async with p.transaction():
            await p.send("t", b"after", partition=0)
        inits = cluster.requests_of(m.InitProducerIdRequest)
    assert cluster.partition("t", 0).committed == [b"before", b"after"]
    assert len(inits) == 2 and inits[1].body.producer_id >= 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", [1, 2])
async def test_an_abort_that_finds_the_transactional_id_forgotten_renews_it(
    cluster: ScriptedCluster, version: int
) -> None:
    # The coordinator forgot the id while a transaction was open (it timed out and aborted it,
    # then the id expired): the abort's EndTxn is the first to hear so. The identity is renewed
    # there, so the next transaction commits, instead of failing once more to find out.
    cluster.coordinator.transaction_version = version
    async with producer(cluster) as p:
        p.begin_transaction()
        await (await p.send("t", b"aborted", partition=0))
        del cluster.coordinator.transactions["txn-1"]
        await p.abort_transaction()
        async with p.transaction():
            await p.send("t", b"after", partition=0)
    assert cluster.partition("t", 0).committed == [b"after"]


# -- second transactions review -----------------------------------------------------------------

INVALID_PRODUCER_ID_MAPPING = 49
UNKNOWN_TOPIC_OR_PARTITION = 3


async def test_a_send_many_that_queued_part_of_its_records_does_not_commit(cluster: ScriptedCluster) -> None:
    # The buffer stayed full past max_block_ms: the rest failed in the returned future, and the
    # transaction committed without them. As Java's send: a failed send makes it abortable.
    options: dict[str, Any] = {"linger_ms": 0, "buffer_memory": 4000, "batch_size": 1000, "max_block_ms": 500}
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", **options) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True  # written, answers held: the buffer does not free
        result = await p.send_many("t", [b"r%02d" % i + b"x" * 400 for i in range(20)], partition=0)
        cluster.nodes[1].release()
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        await p.abort_transaction()
        with pytest.raises(SendManyError):
            await result
    assert cluster.partition("t", 0).committed == []


async def _abortable_needing_a_new_epoch(cluster: ScriptedCluster) -> Producer:
    """A transaction the coordinator forgot (its abort must bump the epoch, KIP-360), with the
    coordinator on broker 2 and partition 0's leader on broker 1."""
    cluster.coordinator.node = 2
    options: dict[str, Any] = {"retry_backoff_ms": 10, "retry_backoff_max_ms": 100, "request_timeout_ms": 1000}
    p = Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", linger_ms=0, **options)
    await p.start()
    p.begin_transaction()
    cluster.coordinator.script[m.AddPartitionsToTxnRequest.API_KEY] = deque([INVALID_PRODUCER_ID_MAPPING])
    await p.send("t", b"v", partition=0)
    with pytest.raises(TransactionAbortableError):
        await p.commit_transaction()
    return p


async def test_an_abort_that_bumps_the_epoch_finds_a_coordinator_that_moved(cluster: ScriptedCluster) -> None:
    p = await _abortable_needing_a_new_epoch(cluster)
    cluster.stop(2)  # the coordinator's broker dies, and broker 1 takes the transactional id over
    cluster.coordinator.move_to(1)
    try:
        await p.abort_transaction()  # failed at once with the connection error
        async with p.transaction():
            await p.send("t", b"after", partition=0)
    finally:
        await p.close()
    assert cluster.partition("t", 0).committed == [b"after"]


async def test_an_abort_whose_own_request_timed_out_can_be_called_again(cluster: ScriptedCluster) -> None:
    # The epoch bump's connection timed out (a KafkaTimeoutError, a TimeoutError): the abort
    # said "did not complete within max_block_ms; it goes on", though its task had ended, and
    # every later call returned that task's error at once, the broker answering again or not.
    p = await _abortable_needing_a_new_epoch(cluster)
    handle = cluster.handle
    silent = True

    async def answer_unless_silent(conn: Any, frame: bytes) -> bytes | None:
        if conn.node.node_id == 2 and silent:
            await asyncio.sleep(3600)
        return await handle(conn, frame)

    cluster.handle = answer_unless_silent  # type: ignore[method-assign]
    cluster.disconnect(2)
    try:
        with pytest.raises(KafkaError):
            await p.abort_transaction()
        silent = False
        await p.abort_transaction()  # it goes on, and now gets through
        async with p.transaction():
            await p.send("t", b"after", partition=0)
    finally:
        await p.close()
    assert cluster.partition("t", 0).committed == [b"after"]


async def test_a_record_written_while_its_transaction_aborts_fails_as_aborted(cluster: ScriptedCluster) -> None:
    # Its answer came during the abort: it was reported delivered, though never visible
    # (docs/transactions.md: records not acknowledged when the abort begins fail).
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", linger_ms=0) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True
        future = await p.send("t", b"in flight", partition=0)
        while not cluster.requests_of(m.ProduceRequest, node=1):
            await asyncio.sleep(0.001)
        aborting = asyncio.ensure_future(p.abort_transaction())
        await asyncio.sleep(0.05)
        cluster.nodes[1].release()
        await aborting
        with pytest.raises(TransactionAbortedError) as info:
            await future
    assert info.value.possibly_persisted is True
    assert cluster.partition("t", 0).committed == []


async def test_a_send_during_a_commit_says_the_transaction_is_committing(cluster: ScriptedCluster) -> None:
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", linger_ms=0) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True
        await p.send("t", b"a", partition=0)
        committing = asyncio.ensure_future(p.commit_transaction())
        await asyncio.sleep(0.01)
        with pytest.raises(TransactionStateError, match="while the transaction is committing") as info:
            await p.send("t", b"b", partition=0)
        cluster.nodes[1].release()
        await committing
    assert "began in" not in str(info.value)  # it began in none


async def test_send_offsets_called_again_after_its_timeout_waits_as_the_error_says(cluster: ScriptedCluster) -> None:
    options: dict[str, Any] = {"max_block_ms": 1000, "retry_backoff_ms": 10, "retry_backoff_max_ms": 100}
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", linger_ms=0, **options) as p:
        p.begin_transaction()
        await p.send("t", b"out", partition=0)
        cluster.coordinator.script[m.TxnOffsetCommitRequest.API_KEY] = deque([LOADING] * 15)
        offsets = {TopicPartition("in", 0): 7}
        with pytest.raises(KafkaTimeoutError, match=r"call send_offsets_to_transaction\(\) again to keep waiting"):
            await p.send_offsets_to_transaction(offsets, "g")
        await p.send_offsets_to_transaction(offsets, "g")  # was refused: "still in progress"
        await p.commit_transaction()
    assert cluster.coordinator.committed == {"g": {("in", 0): 7}}


async def test_a_transactional_call_that_times_out_says_what_the_coordinator_answered(
    cluster: ScriptedCluster,
) -> None:
    options: dict[str, Any] = {"max_block_ms": 1000, "retry_backoff_max_ms": 100}
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", linger_ms=0, **options) as p:
        p.begin_transaction()
        cluster.coordinator.script[m.TxnOffsetCommitRequest.API_KEY] = deque([UNKNOWN_TOPIC_OR_PARTITION] * 1000)
        with pytest.raises(KafkaTimeoutError, match=r"the coordinator's last answer: .*UNKNOWN_TOPIC_OR_PARTITION"):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 7}, "g")
        cluster.coordinator.script.clear()
        await p.abort_transaction()


async def test_a_record_written_after_the_transactional_producer_failed_fails_with_it(cluster: ScriptedCluster) -> None:
    # Its transaction never commits: acknowledging it (as a non-transactional producer's
    # written record is, even after a fatal error) reports a record no reader will see. The
    # coordinator is not on the held broker and requests do not time out: the fenced answer,
    # then the held acknowledgement, come in that order.
    cluster.coordinator.node = 2
    options: dict[str, Any] = {"linger_ms": 0, "request_timeout_ms": 600_000, "delivery_timeout_ms": 1_200_000}
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", **options) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True
        written = await p.send("t", b"written", partition=0)
        while not cluster.partition("t", 0).values:
            await asyncio.sleep(0.001)
        cluster.nodes[2].script = deque([ProducerFencedError.code])
        fenced = await p.send("t", b"fenced", partition=1)
        with pytest.raises(ProducerFencedError):
            await fenced
        cluster.nodes[1].release()
        with pytest.raises(ProducerFatalError) as info:
            await written
    assert info.value.possibly_persisted is True
    assert cluster.partition("t", 0).committed == []


async def test_group_metadata_a_broker_cannot_take_is_refused_not_dropped(cluster: ScriptedCluster) -> None:
    # A broker before Kafka 2.5 (TxnOffsetCommit up to v2) has no generation or member id:
    # the offsets were committed without them, the KIP-447 fencing silently gone (Java refuses).
    cluster.versions[m.TxnOffsetCommitRequest.API_KEY] = (0, 2)
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", linger_ms=0) as p:
        p.begin_transaction()
        await p.send("t", b"out", partition=0)
        with pytest.raises(UnsupportedVersionError, match="generation_id"):
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 42}, ConsumerGroupMetadata("g", 7, "m-1"))
        await p.abort_transaction()  # the transaction cannot commit without them
        async with p.transaction():
            await p.send("t", b"again", partition=0)
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 42}, "g")  # a group id alone is fine
    assert cluster.coordinator.committed == {"g": {("in", 0): 42}}


async def test_a_send_many_cancelled_part_way_does_not_commit(cluster: ScriptedCluster) -> None:
    # Its queued records are delivered; the transaction committed them without the rest.
    options: dict[str, Any] = {"linger_ms": 0, "buffer_memory": 4000, "batch_size": 1000, "max_block_ms": 60_000}
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", **options) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True  # written, answers held: the buffer does not free
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(p.send_many("t", [b"r%02d" % i + b"x" * 400 for i in range(20)], partition=0), 1)
        cluster.nodes[1].release()
        with pytest.raises(TransactionAbortableError, match="send_many"):
            await p.commit_transaction()
        await p.abort_transaction()
    assert cluster.partition("t", 0).committed == []


async def test_a_send_many_that_a_commit_overtakes_does_not_commit_half_of_it(cluster: ScriptedCluster) -> None:
    # Another task's commit began while send_many waited for buffer memory: the rest were
    # refused (TransactionStateError) and the transaction committed the part already queued.
    options: dict[str, Any] = {"linger_ms": 0, "buffer_memory": 4000, "batch_size": 1000, "retry_backoff_ms": 10}
    async with Producer(bootstrap_servers=cluster.bootstrap, transactional_id="txn-1", **options) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True  # written, answers held: the buffer does not free
        many = asyncio.ensure_future(p.send_many("t", [b"r%02d" % i + b"x" * 400 for i in range(20)], partition=0))
        await asyncio.sleep(0.01)  # a part is queued; the call waits for memory
        commit = asyncio.ensure_future(p.commit_transaction())
        await asyncio.sleep(0.01)
        cluster.nodes[1].release()
        with pytest.raises(SendManyError) as info:
            await (await many)
        assert any(isinstance(result, TransactionStateError) for result in info.value.results)
        with pytest.raises(TransactionAbortableError):
            await commit
        await p.abort_transaction()
    assert cluster.partition("t", 0).committed == []


@pytest.mark.parametrize("newest", [6, 5])
async def test_committed_offsets_are_read_from_a_broker_before_2_5(scripted: Scripted, newest: int) -> None:
    # OffsetFetch without require_stable (v6 and older): every exactly-once Spark unit reads its
    # commit marker so, and failed with UnsupportedVersionError. Read as they are, as Java does.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.versions[m.OffsetFetchRequest.API_KEY] = (0, newest)
    async with Producer(bootstrap_servers=cluster.bootstrap) as p:
        assert await p._committed_offsets("g") == {}


async def test_abort_completes_when_a_partition_being_added_was_deleted(scripted: Scripted) -> None:
    # Kafka's coordinator answers AddPartitionsToTxn UNKNOWN_TOPIC_OR_PARTITION (retriable) for
    # as long as it is asked about a partition that no longer exists; abort waited for that add
    # to end, so every abort_transaction() timed out and the producer was wedged until close().
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    p = Producer(
        bootstrap_servers=cluster.bootstrap,
        transactional_id="txn-1",
        linger_ms=0,
        retry_backoff_ms=10,
        max_block_ms=2000,
    )
    await p.start()
    try:
        async with p.transaction():  # the producer knows t and its two partitions
            await p.send("t", b"first", partition=0)
        p.begin_transaction()
        # t-1 is deleted (the topic created again with one partition) as the transaction
        # adds it: Kafka's coordinator answers AddPartitionsToTxn UNKNOWN_TOPIC_OR_PARTITION
        # for it, as long as it is asked.
        cluster.topics["t"] = cluster.topics["t"][:1]
        cluster.coordinator.script[m.AddPartitionsToTxnRequest.API_KEY] = deque([UNKNOWN_TOPIC_OR_PARTITION] * 100_000)
        fut = await p.send("t", b"doomed", partition=1)
        timeouts = 0
        for _ in range(5):
            try:
                await p.abort_transaction()
                break
            except KafkaTimeoutError as exc:
                timeouts += 1
                last = exc
        else:
            raise AssertionError(
                f"abort_transaction() timed out {timeouts} times in a row ({5 * 2} virtual s), "
                f"the record still {'pending' if not fut.done() else 'done'}: {last}"
            )
        assert fut.done() and isinstance(fut.exception(), KafkaError)
        cluster.coordinator.script.clear()  # (only the missing partition is refused)
        async with p.transaction():  # and the producer goes on
            await p.send("t", b"after", partition=0)
    finally:
        await p.close(0)


async def test_a_coordinator_whose_broker_is_gone_is_looked_up_again(cluster: ScriptedCluster) -> None:
    # The coordinator's broker dies and another takes over: the connection to the old one is
    # refused, and the coordinator is found again, within the call.
    cluster.coordinator.move_to(2)
    async with producer(cluster, max_block_ms=30_000) as p:
        async with p.transaction():
            await p.send("t", b"one", partition=0)  # the coordinator found at broker 2
        p.begin_transaction()
        await (await p.send("t", b"two", partition=0))  # its partition added at broker 2
        cluster.stop(2)
        cluster.coordinator.move_to(1)
        cluster.move_leader("t", 1, 1)
        await asyncio.sleep(0.1)  # the connection to broker 2 is lost; reconnecting is refused
        await p.commit_transaction()
    assert cluster.partition("t", 0).committed == [b"one", b"two"]


async def test_a_group_coordinator_look_up_refused_for_authorization_fails_at_once(cluster: ScriptedCluster) -> None:
    # GROUP_AUTHORIZATION_FAILED is no answer to wait out: the call says so, not a timeout
    # after max_block_ms of asking again.
    loop = asyncio.get_running_loop()
    async with producer(cluster, max_block_ms=30_000) as p:
        p.begin_transaction()
        await p.send("t", b"v", partition=0)
        cluster.coordinator.script[m.FindCoordinatorRequest.API_KEY] = deque([GroupAuthorizationFailedError.code])
        started = loop.time()
        with pytest.raises(KafkaError) as info:
            await p.send_offsets_to_transaction({TopicPartition("t", 0): OffsetAndMetadata(5)}, "g")
        took = loop.time() - started
        await p.abort_transaction()
    assert isinstance(info.value, GroupAuthorizationFailedError), repr(info.value)
    assert took < 1, took


async def test_a_committed_offset_of_0_is_read_back(cluster: ScriptedCluster) -> None:
    # Offset 0 is an offset (the first record); only a negative one means "none committed".
    async with producer(cluster) as p:
        async with p.transaction():
            await p.send("t", b"v", partition=0)
            await p.send_offsets_to_transaction({TopicPartition("t", 0): OffsetAndMetadata(0)}, "g")
        assert await p._committed_offsets("g") == {TopicPartition("t", 0): 0}


async def test_a_partition_refused_for_authorization_among_others_not_attempted_fails_at_once(
    cluster: ScriptedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kafka answers an AddPartitionsToTxn naming a topic the producer may not write to with
    # TOPIC_AUTHORIZATION_FAILED for its partitions and OPERATION_NOT_ATTEMPTED for the others:
    # the refusal decides, whichever partition comes first (not a retry until max_block_ms).
    cluster.create_topic("denied", leaders=[1])
    add = type(cluster.coordinator).add_partitions
    asked: list[list[str]] = []

    def refusing_denied(self: Any, request: m.AddPartitionsToTxnRequest) -> m.AddPartitionsToTxnResponse:
        names = [t.name for t in request.v3_and_below_topics]
        asked.append(names)
        if "denied" not in names:
            return add(self, request)
        results = [
            m.AddPartitionsToTxnResponseTopicResult(
                t.name,
                [
                    m.AddPartitionsToTxnResponsePartitionResult(p, 29 if t.name == "denied" else 55)
                    for p in t.partitions
                ],
            )
            for t in sorted(request.v3_and_below_topics, key=lambda t: t.name == "denied")  # the others first
        ]
        return m.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=results)

    monkeypatch.setattr(type(cluster.coordinator), "add_partitions", refusing_denied)
    loop = asyncio.get_running_loop()
    async with producer(cluster, max_block_ms=30_000) as p:
        p.begin_transaction()
        started = loop.time()
        allowed, refused = await asyncio.gather(p.send("t", b"allowed", partition=0), p.send("denied", b"refused"))
        outcomes = await asyncio.gather(allowed, refused, return_exceptions=True)
        took = loop.time() - started
        await p.abort_transaction()
    assert asked == [["denied", "t"]]  # one request, answered 55 for "t" (first), 29 for "denied"
    assert all(isinstance(o, TransactionAbortedError) and "TOPIC_AUTHORIZATION_FAILED" in str(o) for o in outcomes)
    assert took < 1, took


async def test_an_abort_does_not_overtake_offsets_on_the_wire_to_another_group_coordinator(
    cluster: ScriptedCluster,
) -> None:
    # abort_transaction() cancels a send_offsets_to_transaction() whose TxnOffsetCommit is on the
    # wire to the group's coordinator (node 2, slow to answer). Were the EndTxn sent at once to the
    # transaction's coordinator (node 1), the offsets would be handled after the abort marker: a
    # broker without KIP-890 verification keeps them pending under the producer id, and the next
    # transaction's commit marker commits them. As Java: the EndTxn waits for that answer.
    coordinator = cluster.coordinator
    find, coordinate, handle = coordinator.find, cluster._coordinate, cluster.handle
    offsets_arrived, release_offsets, end_arrived = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def find_group_on_node_2(request: m.FindCoordinatorRequest) -> m.FindCoordinatorResponse:
        response = find(request)
        if request.key_type == 0:
            node = cluster.nodes[2]
            for found in response.coordinators:
                found.node_id, found.host, found.port = node.node_id, node.host, node.port
            response.node_id, response.host, response.port = node.node_id, node.host, node.port
        return response

    def coordinate_group_on_node_2(conn: Any, request: Any, version: int, cid: int) -> bytes | None:
        if isinstance(request, m.TxnOffsetCommitRequest):
            assert conn.node.node_id == 2
            return coordinate(
                SimpleNamespace(node=cluster.nodes[coordinator.node], side=conn.side), request, version, cid
            )
        return coordinate(conn, request, version, cid)

    async def slow_group_coordinator(conn: Any, frame: bytes) -> bytes | None:
        api_key = struct.unpack(">h", frame[:2])[0]
        if api_key == m.TxnOffsetCommitRequest.API_KEY:
            offsets_arrived.set()
            await release_offsets.wait()
        elif api_key == m.EndTxnRequest.API_KEY:
            end_arrived.set()
        return await handle(conn, frame)

    coordinator.find = find_group_on_node_2  # type: ignore[method-assign]
    cluster._coordinate = coordinate_group_on_node_2  # type: ignore[method-assign]
    cluster.handle = slow_group_coordinator  # type: ignore[method-assign]
    async with producer(cluster) as p:
        p.begin_transaction()
        await p.send("t", b"aborted", partition=0)
        offsets = asyncio.ensure_future(p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g"))
        await offsets_arrived.wait()
        abort = asyncio.ensure_future(p.abort_transaction())
        # (virtual time) long enough for an EndTxn that does not wait to reach node 1
        await asyncio.wait([asyncio.ensure_future(end_arrived.wait())], timeout=1)
        overtaken = end_arrived.is_set()
        release_offsets.set()
        await abort
        await asyncio.gather(offsets, return_exceptions=True)
        async with p.transaction():
            await p.send("t", b"next", partition=0)
    assert not overtaken, "EndTxn(abort) was sent before the TxnOffsetCommit on the wire was answered"
    assert cluster.partition("t", 0).committed == [b"next"]
    assert coordinator.committed == {}


TOPIC_AUTHORIZATION_FAILED = 29


async def test_an_abort_ends_a_transaction_opened_by_an_add_whose_answer_was_lost(cluster: ScriptedCluster) -> None:
    # The transaction's first AddPartitionsToTxn is acted on but its answer is lost; its retry is
    # refused for good (the topic's ACL was revoked meanwhile). The coordinator has the transaction
    # open: the abort must end it, or it stays open until the coordinator times it out (and then
    # fences this producer, which believes itself ready).
    async with producer(cluster) as p:
        p.begin_transaction()
        cluster.coordinator.script[m.AddPartitionsToTxnRequest.API_KEY] = deque([Lost, TOPIC_AUTHORIZATION_FAILED])
        record = await p.send("t", b"refused", partition=0)
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        await p.abort_transaction()
        still_open = cluster.coordinator.transactions["txn-1"].ongoing
        with pytest.raises(KafkaError):
            await record
    assert not still_open, "the abort left the coordinator's transaction open"


async def offsets_pending_after_a_lost_answer(p: Producer, cluster: ScriptedCluster) -> asyncio.Future[None]:
    """A transaction with a record in it, and its send_offsets_to_transaction() pending: AddOffsetsToTxn
    acted on, its answer lost, the retry due in 0.5 s (the producer's retry_backoff_ms=500)."""
    p.begin_transaction()
    await p.send_and_wait("t", b"out", partition=0)
    cluster.coordinator.script[m.AddOffsetsToTxnRequest.API_KEY] = deque([Lost])
    offsets = asyncio.ensure_future(p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g"))
    await asyncio.sleep(0.1)
    return offsets


@pytest.mark.parametrize("turns", [1, 2, 3])
async def test_an_abort_cancelled_while_it_cuts_offsets_short_leaves_a_transaction_that_cannot_commit(
    cluster: ScriptedCluster, turns: int
) -> None:
    # abort_transaction() cancels a pending send_offsets_to_transaction() and waits for it; cancelled
    # there, it aborted nothing, and the offsets, joined in part (AddOffsetsToTxn acted on), were
    # cut short: the transaction committed its output without its offsets.
    async with producer(cluster, retry_backoff_ms=500, retry_backoff_max_ms=500) as p:
        offsets = await offsets_pending_after_a_lost_answer(p, cluster)
        aborting = asyncio.ensure_future(p.abort_transaction())
        for _ in range(turns):  # the abort is waiting for the offsets it cancelled
            await asyncio.sleep(0)
        aborting.cancel()
        aborted, sent = await asyncio.gather(aborting, offsets, return_exceptions=True)
        assert isinstance(aborted, asyncio.CancelledError)
        assert isinstance(sent, TransactionAbortedError | TransactionAbortableError), sent
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        await p.abort_transaction()
        async with p.transaction():  # the producer goes on
            await p.send("t", b"next", partition=0)
    assert cluster.partition("t", 0).committed == [b"next"]
    assert cluster.coordinator.committed.get("g", {}) == {}


async def test_two_aborts_cutting_offsets_short_end_the_transaction_once(cluster: ScriptedCluster) -> None:
    # Each abort_transaction() cancelled the pending send_offsets_to_transaction(), waited for it,
    # then started an abort of its own: two EndTxn, and once the first abort returned,
    # begin_transaction() failed with "abort_transaction() is still in progress" (the second's).
    async with producer(cluster, retry_backoff_ms=500, retry_backoff_max_ms=500) as p:
        offsets = await offsets_pending_after_a_lost_answer(p, cluster)
        first = asyncio.ensure_future(p.abort_transaction())
        second = asyncio.ensure_future(p.abort_transaction())
        await first
        async with p.transaction():  # the abort has ended: the producer goes on
            await p.send("t", b"next", partition=0)
        ended = await asyncio.gather(second, offsets, return_exceptions=True)
        assert ended[0] is None and isinstance(ended[1], TransactionAbortedError), ended
    ends = requests(cluster, m.EndTxnRequest)
    assert [end.committed for end in ends] == [False, True]  # type: ignore[attr-defined]
    assert cluster.partition("t", 0).committed == [b"next"]

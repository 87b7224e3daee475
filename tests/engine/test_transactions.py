"""The transactional producer against the scripted fake cluster's coordinator: every answer
the protocol allows, in virtual time. (Real brokers: tests/integration/test_transactions.py.)"""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from aioprod import Producer, TopicPartition
from aioprod.errors import (
    ConfigError,
    CoordinatorLoadInProgressError,
    InvalidRecordError,
    KafkaTimeoutError,
    ProducerFatalError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
)
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.coordinator import Lost

LOADING = CoordinatorLoadInProgressError.code
CONCURRENT = 51


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


async def test_close_aborts_an_open_transaction(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        p.begin_transaction()
        await p.send("t", b"left open", partition=0)
        await p.flush()
    assert cluster.partition("t", 0).values == [b"left open"]
    assert cluster.partition("t", 0).committed == []
    (end,) = requests(cluster, m.EndTxnRequest)
    assert end.committed is False  # type: ignore[attr-defined]


async def test_a_sequence_in_doubt_aborts_the_transaction_and_bumps_the_epoch(cluster: ScriptedCluster) -> None:
    async with producer(cluster, request_timeout_ms=200, delivery_timeout_ms=500) as p:
        async with p.transaction():
            await p.send("t", b"before", partition=0)
        p.begin_transaction()
        cluster.nodes[1].stalling = True  # never answered: its sequence is in doubt
        lost = await p.send("t", b"lost", partition=0)
        with pytest.raises(Exception):  # noqa: B017 - delivery timeout
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


def test_transactional_settings_that_cannot_work_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="transactional_id needs idempotence"):
        Producer(bootstrap_servers="h:1", transactional_id="x", acks=1)
    with pytest.raises(ConfigError, match="enable_idempotence=False"):
        Producer(bootstrap_servers="h:1", transactional_id="x", enable_idempotence=False)
    with pytest.raises(ConfigError, match="transactional_id"):
        Producer(bootstrap_servers="h:1", transactional_id="")

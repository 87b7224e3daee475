"""Prepared transactions against the scripted fake coordinator: one producer delivers a
transaction and leaves it open (prepare_transaction), another ends it by its handle. The
exact requests, and every answer a real broker will not give on demand. (Real brokers:
tests/integration/test_transactions.py.)"""

from __future__ import annotations

import asyncio
import pickle
from collections import deque

import pytest

from aioprod import PreparedTransaction, Producer, TopicPartition
from aioprod.errors import (
    InvalidRecordError,
    KafkaError,
    KafkaTimeoutError,
    PreparedTransactionError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
)
from aioprod.protocol import messages as m
from aioprod.spark import transactions as spark_transactions
from tests.conftest import Scripted
from tests.engine.test_transactions import CONCURRENT, LOADING, producer, requests
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.coordinator import Lost


@pytest.fixture
def cluster(scripted: Scripted) -> ScriptedCluster:
    """Two nodes; topic t with partition 0 led by node 1, partition 1 by node 2 (the coordinator is node 1)."""
    scripted.cluster.add_node(2)
    scripted.cluster.create_topic("t", leaders=[1, 2])
    return scripted.cluster


async def prepared_transaction(cluster: ScriptedCluster, **options: object) -> PreparedTransaction:
    """txn-1 writes a0, a1 to partition 0 and b0 to partition 1, commits offset 1 for group
    'marker' with them, prepares, and closes."""
    async with producer(cluster, **options) as p:
        p.begin_transaction()
        await p.send_many("t", [b"a0", b"a1"], partition=0)
        await p.send("t", b"b0", partition=1)
        await p.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "marker")
        prepared = await p.prepare_transaction()
        assert await p.prepare_transaction() is prepared  # asking again gives the same handle
    return prepared


def committer(cluster: ScriptedCluster, **options: object) -> Producer:
    """A producer with no transactional id of its own."""
    defaults: dict[str, object] = {"retry_backoff_ms": 10}
    defaults.update(options)
    return Producer(bootstrap_servers=cluster.bootstrap, **defaults)


def committed(cluster: ScriptedCluster) -> list[bytes | None]:
    return cluster.partition("t", 0).committed + cluster.partition("t", 1).committed


async def test_another_producer_commits_a_prepared_transaction_by_its_handle(cluster: ScriptedCluster) -> None:
    prepared = await prepared_transaction(cluster)
    assert prepared == PreparedTransaction("txn-1", 5000, 0, transaction_version=1, cluster_id="scripted")
    # Delivered and left open: close() did not abort it, and nothing is visible yet.
    assert requests(cluster, m.EndTxnRequest) == []
    assert cluster.coordinator.transactions["txn-1"].ongoing
    assert cluster.partition("t", 0).values + cluster.partition("t", 1).values == [b"a0", b"a1", b"b0"]
    assert committed(cluster) == []
    async with committer(cluster) as q:
        await q.commit_prepared_transaction(prepared)
        await q.commit_prepared_transaction(prepared)  # a repeat (an outcome in doubt) succeeds
        assert await q._committed_offsets("marker") == {TopicPartition("t", 0): 1}
    assert committed(cluster) == [b"a0", b"a1", b"b0"]
    first = cluster.requests_of(m.EndTxnRequest)[0]
    assert first.version == 4  # transactions v1: EndTxn below v5
    assert first.body == m.EndTxnRequest(transactional_id="txn-1", producer_id=5000, producer_epoch=0, committed=True)


async def test_a_prepared_transaction_aborted_by_its_handle_is_never_visible(cluster: ScriptedCluster) -> None:
    prepared = await prepared_transaction(cluster)
    async with committer(cluster) as q:
        await q.abort_prepared_transaction(prepared)
        await q.abort_prepared_transaction(prepared)
        with pytest.raises(PreparedTransactionError, match="it was aborted already") as info:
            await q.commit_prepared_transaction(prepared)
        assert await q._committed_offsets("marker") == {}
    assert info.value.prepared == prepared
    assert committed(cluster) == []
    assert [b.marker for b in cluster.partition("t", 0).log if b.marker] == ["abort"]


async def test_a_fenced_prepared_transaction_cannot_commit_and_says_so(cluster: ScriptedCluster) -> None:
    prepared = await prepared_transaction(cluster)
    async with producer(cluster):  # a retried attempt with the same transactional id: fences, aborts
        pass
    async with committer(cluster) as q:
        with pytest.raises(PreparedTransactionError) as info:
            await q.commit_prepared_transaction(prepared)
    message = str(info.value)
    assert "cannot commit transaction 'txn-1' (producer id 5000, epoch 0)" in message
    assert "fenced" in message and "transaction timeout" in message
    assert isinstance(info.value.__cause__, ProducerFencedError)
    assert committed(cluster) == []


async def test_ending_by_handle_is_retried_while_the_coordinator_moves_or_loses_answers(
    cluster: ScriptedCluster,
) -> None:
    prepared = await prepared_transaction(cluster)
    cluster.coordinator.move_to(2)  # node 1 now answers NOT_COORDINATOR
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([LOADING, CONCURRENT, Lost])
    async with committer(cluster) as q:
        await q.commit_prepared_transaction(prepared)
    assert committed(cluster) == [b"a0", b"a1", b"b0"]
    ends = cluster.requests_of(m.EndTxnRequest)
    assert [r.node for r in ends][-4:] == [2, 2, 2, 2]  # loading, concurrent, lost, then done
    assert len(cluster.requests_of(m.FindCoordinatorRequest)) >= 2


async def test_a_commit_by_handle_that_outlasts_max_block_can_be_repeated(cluster: ScriptedCluster) -> None:
    prepared = await prepared_transaction(cluster)
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([CONCURRENT] * 30)
    async with committer(cluster, max_block_ms=1000, retry_backoff_max_ms=100) as q:
        with pytest.raises(KafkaTimeoutError, match=r"commit_prepared_transaction\('txn-1'\) did not complete") as info:
            await q.commit_prepared_transaction(prepared)
        assert "CONCURRENT_TRANSACTIONS" in str(info.value)
        assert committed(cluster) == []
        cluster.coordinator.script[m.EndTxnRequest.API_KEY].clear()
        await q.commit_prepared_transaction(prepared)
    assert committed(cluster) == [b"a0", b"a1", b"b0"]


async def test_offsets_of_an_open_transaction_are_not_stable(cluster: ScriptedCluster) -> None:
    prepared = await prepared_transaction(cluster)
    async with committer(cluster, max_block_ms=1000) as q:
        # OffsetFetch with require_stable: the coordinator answers UNSTABLE_OFFSET_COMMIT until
        # the transaction holding the group's offset ends; the look-up waits, up to max_block_ms.
        cluster.coordinator.committed["marker"] = {("t", 0): 0}  # an older commit is not the answer
        with pytest.raises(KafkaTimeoutError, match="UNSTABLE_OFFSET_COMMIT"):
            await q._committed_offsets("marker")
        await q.commit_prepared_transaction(prepared)
        assert await q._committed_offsets("marker") == {TopicPartition("t", 0): 1}
    fetch = cluster.requests_of(m.OffsetFetchRequest)[-1]
    assert fetch.version == 9
    assert fetch.body.require_stable is True  # type: ignore[attr-defined]
    assert fetch.body.groups == [m.OffsetFetchRequestGroup(group_id="marker", topics=None)]  # type: ignore[attr-defined]


async def test_a_prepared_producer_only_closes(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        p.begin_transaction()
        await p.send("t", b"v", partition=0)
        await p.prepare_transaction()
        with pytest.raises(TransactionStateError, match="holding a prepared transaction"):
            await p.send("t", b"more", partition=0)
        with pytest.raises(TransactionStateError, match="holding a prepared transaction"):
            p.begin_transaction()
        with pytest.raises(TransactionStateError, match="holding a prepared transaction"):
            await p.commit_transaction()
        with pytest.raises(TransactionStateError, match="holding a prepared transaction"):
            await p.abort_transaction()
        assert not p.in_transaction
    assert requests(cluster, m.EndTxnRequest) == []
    assert cluster.coordinator.transactions["txn-1"].ongoing


async def test_an_empty_or_failed_transaction_is_not_prepared(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        p.begin_transaction()
        with pytest.raises(TransactionStateError, match="the transaction is empty"):
            await p.prepare_transaction()
        assert p.in_transaction  # still open: abort (or commit) it
        await p.abort_transaction()
        p.begin_transaction()
        cluster.nodes[1].script = deque([InvalidRecordError.code])
        await p.send("t", b"refused", partition=0)
        with pytest.raises(TransactionAbortableError):
            await p.prepare_transaction()
        await p.abort_transaction()
    assert cluster.partition("t", 0).committed == []


async def test_transactions_v2_prepares_with_its_epoch_and_ends_with_end_txn_v5(cluster: ScriptedCluster) -> None:
    cluster.coordinator.transaction_version = 2
    async with producer(cluster) as p:
        async with p.transaction():  # EndTxn bumps the epoch to 1 (KIP-890)
            await p.send("t", b"first", partition=0)
        p.begin_transaction()
        await p.send("t", b"second", partition=0)
        prepared = await p.prepare_transaction()
    assert prepared == PreparedTransaction("txn-1", 5000, 1, transaction_version=2, cluster_id="scripted")
    async with committer(cluster) as q:
        await q.commit_prepared_transaction(prepared)
    assert cluster.partition("t", 0).committed == [b"first", b"second"]
    assert cluster.requests_of(m.EndTxnRequest)[-1].version == 5


def test_a_handle_pickles_and_one_pickled_before_its_cluster_id_still_loads() -> None:
    handle = PreparedTransaction("txn-1", 5000, 1, transaction_version=2, cluster_id="c1")
    assert pickle.loads(pickle.dumps(handle)) == handle
    assert spark_transactions.decode(spark_transactions.encode(handle)) == handle
    # PreparedTransaction("txn-1", 5000, 0, 2) as pickled and JSON-encoded (for a Spark driver)
    # before handles had a cluster id:
    old_pickle = (
        b"\x80\x02caioprod.producer.transactions\nPreparedTransaction\nq\x00)\x81q\x01]q\x02"
        b"(X\x05\x00\x00\x00txn-1q\x03M\x88\x13K\x00K\x02eb."
    )
    old_json = '{"transactional_id": "txn-1", "producer_id": 5000, "producer_epoch": 0, "transaction_version": 2}'
    unknown = PreparedTransaction("txn-1", 5000, 0, transaction_version=2, cluster_id=None)
    assert pickle.loads(old_pickle) == spark_transactions.decode(old_json) == unknown
    later = PreparedTransaction.__new__(PreparedTransaction)  # a later version's, with a field more
    later.__setstate__(["txn-1", 5000, 1, 2, "c1", "a field of a later version"])
    assert later == handle


async def test_ending_by_handle_checks_its_argument(cluster: ScriptedCluster) -> None:
    async with committer(cluster) as q:
        with pytest.raises(TypeError, match="takes a PreparedTransaction, got tuple"):
            await q.commit_prepared_transaction(("txn-1", 5000, 0))  # type: ignore[arg-type]


async def test_close_aborts_a_prepared_transaction_whose_handle_never_reached_the_caller(
    cluster: ScriptedCluster,
) -> None:
    async with producer(cluster, max_block_ms=1000) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True  # the record's answer is held: the prepare waits for it
        await p.send("t", b"v", partition=0)
        with pytest.raises(KafkaTimeoutError, match="prepare_transaction"):
            await p.prepare_transaction()
        cluster.nodes[1].release()  # the prepare completes in the background, its handle unseen
    (end,) = requests(cluster, m.EndTxnRequest)
    assert end.committed is False  # type: ignore[attr-defined]
    assert cluster.partition("t", 0).values == [b"v"]
    assert cluster.partition("t", 0).committed == []
    assert not cluster.coordinator.transactions["txn-1"].ongoing


async def test_close_keeps_a_prepared_transaction_whose_handle_a_repeated_call_returned(
    cluster: ScriptedCluster,
) -> None:
    # prepare_transaction() times out, the prepare completes in the background, and calling
    # it again (as the KafkaTimeoutError says) returns the handle: close() must then leave the
    # transaction open for the handle's holder, not abort it.
    async with producer(cluster, max_block_ms=1000) as p:
        p.begin_transaction()
        cluster.nodes[1].holding = True
        await p.send("t", b"v", partition=0)
        with pytest.raises(KafkaTimeoutError, match="prepare_transaction"):
            await p.prepare_transaction()
        cluster.nodes[1].release()
        assert p._txn is not None and p._txn._operation is not None
        await asyncio.wait([p._txn._operation[1]])  # the prepare ends before the caller asks again
        prepared = await p.prepare_transaction()
    assert requests(cluster, m.EndTxnRequest) == []
    assert cluster.coordinator.transactions["txn-1"].ongoing
    async with committer(cluster) as q:
        await q.commit_prepared_transaction(prepared)
    assert cluster.partition("t", 0).committed == [b"v"]


async def test_ends_by_handle_at_once_wait_for_room_instead_of_backing_off(
    cluster: ScriptedCluster, scripted: Scripted
) -> None:
    """The Spark driver ends up to 32 prepared transactions at once: a look-up that found every
    connection at its in-flight limit backed off, longer for every such look-up (one count
    shared by all), and 32 at once took longer than one at a time."""
    handles = [await prepared_transaction(cluster, transactional_id=f"txn-{i}") for i in range(10)]
    async with committer(cluster, retry_backoff_ms=100, max_in_flight_requests_per_connection=1) as q:
        await asyncio.gather(*(q.commit_prepared_transaction(h) for h in handles[:2]))  # both brokers connected
        start = scripted.clock.now
        await asyncio.gather(*(q.commit_prepared_transaction(h) for h in handles[2:]))
        assert scripted.clock.now == start  # no one slept a backoff: each waited for room
    assert len(committed(cluster)) == 3 * 10


async def test_calls_at_once_do_not_lengthen_each_others_backoff(cluster: ScriptedCluster, scripted: Scripted) -> None:
    """Each call counts its own failures: two ends answered "loading" twice each back off
    0.1 s then 0.2 s (±20 %). With one count shared by both, each failure lengthened the
    other's next backoff too (0.45 s here)."""
    first, second = [await prepared_transaction(cluster, transactional_id=f"txn-{i}") for i in range(2)]
    async with committer(cluster, retry_backoff_ms=100, retry_backoff_max_ms=10_000) as q:
        await q._committed_offsets("another-group")  # connected to the coordinator
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([LOADING] * 4)
        start = scripted.clock.now
        await asyncio.gather(q.commit_prepared_transaction(first), q.commit_prepared_transaction(second))
        assert scripted.clock.now - start <= 1.2 * (0.1 + 0.2)
    assert len(cluster.requests_of(m.EndTxnRequest)) == 6
    assert len(committed(cluster)) == 6


PRODUCER_FENCED = ProducerFencedError.code


async def test_a_commit_by_handle_whose_answer_was_lost_is_not_called_invisible_when_then_fenced(
    cluster: ScriptedCluster,
) -> None:
    # The EndTxn commits, its answer is lost; before the retry a newer producer of the transactional
    # id fences the epoch, and Kafka answers the retry PRODUCER_FENCED (its epoch check comes before
    # its "already committed" one). The records ARE visible: a PreparedTransactionError ("never
    # visible: write them again") would have them written twice. The outcome is in doubt.
    prepared = await prepared_transaction(cluster)
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([Lost, PRODUCER_FENCED])
    async with committer(cluster) as q:
        with pytest.raises(KafkaError, match="in doubt") as info:
            await q.commit_prepared_transaction(prepared)
    assert committed(cluster) == [b"a0", b"a1", b"b0"]
    assert not isinstance(info.value, PreparedTransactionError)
    assert isinstance(info.value.__cause__, ProducerFencedError)


async def test_a_repeated_commit_by_handle_after_a_timeout_is_not_called_invisible_when_then_fenced(
    cluster: ScriptedCluster,
) -> None:
    # As the docs advise, a commit that outlasted max_block_ms is repeated; its EndTxn had committed
    # meanwhile, and a newer producer fenced the epoch since: the repeat cannot say "never visible".
    prepared = await prepared_transaction(cluster)
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([Lost])
    async with committer(cluster, max_block_ms=1000, retry_backoff_ms=2000, retry_backoff_max_ms=2000) as q:
        with pytest.raises(KafkaTimeoutError):
            await q.commit_prepared_transaction(prepared)  # committed; the answer lost, the retry too late
        async with producer(cluster):  # a newer producer of txn-1: fences the epoch
            pass
        # (Kafka's answer to an EndTxn under a fenced epoch, whatever state the transaction is in)
        cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([PRODUCER_FENCED])
        with pytest.raises(KafkaError, match="in doubt") as info:
            await q.commit_prepared_transaction(prepared)
    assert committed(cluster) == [b"a0", b"a1", b"b0"]
    assert not isinstance(info.value, PreparedTransactionError)


async def test_a_commit_by_handle_refused_then_fenced_is_still_called_invisible(cluster: ScriptedCluster) -> None:
    # Every earlier EndTxn was answered (CONCURRENT_TRANSACTIONS: not acted on): nothing is in doubt.
    prepared = await prepared_transaction(cluster)
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([CONCURRENT, PRODUCER_FENCED])
    async with committer(cluster) as q:
        with pytest.raises(PreparedTransactionError, match="fenced"):
            await q.commit_prepared_transaction(prepared)
    assert committed(cluster) == []


COORDINATOR_NOT_AVAILABLE = 15


async def test_a_commit_by_handle_that_sent_nothing_before_timing_out_is_called_invisible_when_then_fenced(
    cluster: ScriptedCluster,
) -> None:
    # The first call finds no coordinator within max_block_ms: no EndTxn was written. Its repeat,
    # refused PRODUCER_FENCED (a newer producer fenced the epoch meanwhile), is not in doubt: the
    # transaction never committed, and the caller must be told to write its records again.
    prepared = await prepared_transaction(cluster)
    cluster.coordinator.script[m.FindCoordinatorRequest.API_KEY] = deque([COORDINATOR_NOT_AVAILABLE] * 1000)
    async with committer(cluster, max_block_ms=1000) as q:
        with pytest.raises(KafkaTimeoutError):
            await q.commit_prepared_transaction(prepared)
        assert cluster.requests_of(m.EndTxnRequest) == []
        cluster.coordinator.script.clear()
        async with producer(cluster):  # a newer producer of txn-1: fences the epoch (and aborts)
            pass
        with pytest.raises(PreparedTransactionError, match="fenced"):
            await q.commit_prepared_transaction(prepared)
    assert committed(cluster) == []


async def test_a_commit_by_handle_repeated_after_an_outcome_in_doubt_is_still_in_doubt(
    cluster: ScriptedCluster,
) -> None:
    # The first call's EndTxn commits, its answer is lost, its retry is refused PRODUCER_FENCED: in
    # doubt. Repeated (any KafkaError may be), the refusal must not turn into "never visible".
    prepared = await prepared_transaction(cluster)
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([Lost, PRODUCER_FENCED, PRODUCER_FENCED])
    async with committer(cluster) as q:
        with pytest.raises(KafkaError, match="in doubt"):
            await q.commit_prepared_transaction(prepared)
        with pytest.raises(KafkaError, match="in doubt") as info:
            await q.commit_prepared_transaction(prepared)
    assert not isinstance(info.value, PreparedTransactionError)
    assert committed(cluster) == [b"a0", b"a1", b"b0"]

"""Transactions against real brokers the suite starts: Tansu (a transaction coordinator that
writes commit and abort markers and fences) and librdkafka's three-broker mock cluster.

What was written is read back independently: the markers and data with aiokafka's decoder
(see ``read_committed_from_markers``), committed offsets with confluent_kafka. Faults the
brokers will not produce on demand are in tests/engine/test_transactions.py.
"""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_INVALID
from confluent_kafka.admin import AdminClient

from aioprod import ConsumerGroupMetadata, PreparedTransaction, Producer, TopicPartition
from aioprod.errors import (
    KafkaTimeoutError,
    PreparedTransactionError,
    ProducerFatalError,
    ProducerFencedError,
)
from tests.brokers import MockCluster, TansuBroker, tansu, time_out_on_the_wire, topic_across_leaders
from tests.integration.test_produce import create_topic
from tests.readback import read_committed_from_markers, read_topic

pytestmark = pytest.mark.integration


async def test_committed_records_are_visible_and_aborted_ones_are_not(tansu_broker: TansuBroker, topic: str) -> None:
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=f"{topic}-tx") as p:
        async with p.transaction():
            for i in range(10):
                await p.send(topic, b"committed-%d" % i, partition=0)
        p.begin_transaction()
        for i in range(5):
            await p.send(topic, b"aborted-%d" % i, partition=0)
        await p.flush()
        await p.abort_transaction()
        async with p.transaction():
            await p.send(topic, b"last", partition=0)
    visible = await read_committed_from_markers(tansu_broker.bootstrap, topic, 1)
    assert visible[0] == [b"committed-%d" % i for i in range(10)] + [b"last"]


def committed_offset(bootstrap: str, group: str, topic: str, partition: int) -> int:
    """The group's committed offset for the partition, as confluent_kafka reads it
    (``confluent_kafka.OFFSET_INVALID`` when none is)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CkTopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        (committed,) = consumer.committed([CkTopicPartition(topic, partition)], timeout=30)
    finally:
        consumer.close()
    assert committed.error is None, committed.error
    offset: int = committed.offset
    return offset


async def test_offsets_commit_with_the_transaction(tansu_broker: TansuBroker, topic: str) -> None:
    group = f"{topic}-group"
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=f"{topic}-tx")
    async with producer as p, p.transaction():
        await p.send(topic, b"out", partition=0)
        await p.send_offsets_to_transaction({TopicPartition(topic, 0): 17}, ConsumerGroupMetadata(group))
    assert committed_offset(tansu_broker.bootstrap, group, topic, 0) == 17


async def test_a_second_instance_fences_the_first(tansu_broker: TansuBroker, topic: str) -> None:
    txn_id = f"{topic}-tx"
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=txn_id) as old:
        async with old.transaction():
            await old.send(topic, b"before", partition=0)
        async with Producer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=txn_id) as new:
            with pytest.raises(ProducerFatalError) as info:
                async with old.transaction():
                    await old.send(topic, b"zombie", partition=0)
            assert isinstance(info.value.__cause__, ProducerFencedError)
            async with new.transaction():
                await new.send(topic, b"after", partition=0)
    visible = await read_committed_from_markers(tansu_broker.bootstrap, topic, 1)
    assert visible[0] == [b"before", b"after"]


async def test_a_transaction_across_three_brokers(mock3: MockCluster, topic: str) -> None:
    # The mock cluster spreads partition leaders and its transaction coordinator over
    # three brokers: partitions join on their leaders' behalf, the commit goes elsewhere.
    async with Producer(bootstrap_servers=mock3.bootstrap, transactional_id=f"{topic}-tx") as p:
        topic = await topic_across_leaders(p, topic)
        p.begin_transaction()
        futures = [await p.send(topic, b"%d" % i, partition=i % 4) for i in range(30)]
        await p.commit_transaction()
        assert all(f.exception() is None for f in futures)
    values = sorted(int(r.value or b"") for r in read_topic(mock3.bootstrap, topic))
    assert values == list(range(30))


async def prepare(bootstrap: str, topic: str, txn_id: str, values: list[bytes]) -> PreparedTransaction:
    """Write ``values`` and a marker offset (group ``txn_id``) in one transaction; prepare it; close."""
    async with Producer(bootstrap_servers=bootstrap, transactional_id=txn_id) as p:
        p.begin_transaction()
        for value in values:
            await p.send(topic, value, partition=0)
        await p.send_offsets_to_transaction({TopicPartition(topic, 0): 1}, txn_id)
        return await p.prepare_transaction()


async def test_a_prepared_transaction_is_committed_or_aborted_by_another_producer(
    tansu_broker: TansuBroker, topic: str
) -> None:
    bootstrap = tansu_broker.bootstrap
    kept = await prepare(bootstrap, topic, f"{topic}-kept", [b"kept-1", b"kept-2"])
    dropped = await prepare(bootstrap, topic, f"{topic}-dropped", [b"dropped"])
    assert await read_committed_from_markers(bootstrap, topic, 1) == {0: []}  # both open: nothing visible
    async with Producer(bootstrap_servers=bootstrap) as q:  # no transactional id of its own
        await q.commit_prepared_transaction(kept)
        await q.commit_prepared_transaction(kept)  # a repeat succeeds
        await q.abort_prepared_transaction(dropped)
    # The offsets went with their transactions: committed for the one committed, none for the
    # one aborted (read with confluent_kafka, not with aioprod's own OffsetFetch).
    assert committed_offset(bootstrap, f"{topic}-kept", topic, 0) == 1
    assert committed_offset(bootstrap, f"{topic}-dropped", topic, 0) == OFFSET_INVALID
    assert await read_committed_from_markers(bootstrap, topic, 1) == {0: [b"kept-1", b"kept-2"]}


async def test_a_prepared_transaction_is_ended_only_in_the_cluster_it_was_prepared_in(
    tansu_broker: TansuBroker, topic: str
) -> None:
    # Producer ids start from 0 in every cluster: in another one, the handle's id and epoch may be
    # another producer's, whose open transaction an EndTxn would end.
    prepared = await prepare(tansu_broker.bootstrap, topic, f"{topic}-tx", [b"prepared"])
    assert prepared.cluster_id == cluster_id_seen_by_librdkafka(tansu_broker.bootstrap) == "tansu_cluster"
    with tansu(tansu_args=("--cluster-id", "another-cluster")) as other:
        async with Producer(bootstrap_servers=other.bootstrap) as elsewhere:
            with pytest.raises(PreparedTransactionError, match="brokers are now cluster 'another-cluster'"):
                await elsewhere.commit_prepared_transaction(prepared)
    async with Producer(bootstrap_servers=tansu_broker.bootstrap) as q:
        await q.commit_prepared_transaction(prepared)
    assert await read_committed_from_markers(tansu_broker.bootstrap, topic, 1) == {0: [b"prepared"]}


def cluster_id_seen_by_librdkafka(bootstrap: str) -> str | None:
    cluster_id: str | None = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).cluster_id
    return cluster_id


async def test_a_prepared_transaction_fenced_by_a_newer_producer_is_aborted_and_cannot_commit(
    tansu_broker: TansuBroker, topic: str
) -> None:
    bootstrap = tansu_broker.bootstrap
    prepared = await prepare(bootstrap, topic, f"{topic}-tx", [b"zombie"])
    async with Producer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-tx") as newer, newer.transaction():
        await newer.send(topic, b"newer", partition=0)
    async with Producer(bootstrap_servers=bootstrap, max_block_ms=2000) as q:
        # Kafka answers PRODUCER_FENCED; Tansu 0.6 closes the connection instead of answering,
        # so the commit is retried until max_block_ms. Either way it fails, and says why.
        with pytest.raises((PreparedTransactionError, KafkaTimeoutError)) as info:
            await q.commit_prepared_transaction(prepared)
    if isinstance(info.value, PreparedTransactionError):
        assert "fenced" in str(info.value)
    else:
        assert "closed the connection" in str(info.value)
    assert await read_committed_from_markers(bootstrap, topic, 1) == {0: [b"newer"]}


async def test_an_abort_after_a_timeout_on_the_wire_leaves_the_producer_usable_or_fatal(topic: str) -> None:
    # A record of the transaction timed out on the wire (the broker stopped): its sequence is in
    # doubt, so the abort bumps the epoch (KIP-360, InitProducerId with the current id and
    # epoch). Tansu 0.6 answers that bump UNKNOWN_SERVER_ERROR: the abort raised it, left the
    # producer "aborting" for good (every abort asked again and was refused again, and
    # begin_transaction() raised TransactionStateError), where Java fails the producer.
    with tansu() as broker:
        create_topic(broker.bootstrap, topic, 1)
        options = {"linger_ms": 0, "request_timeout_ms": 1000, "delivery_timeout_ms": 1500, "retry_backoff_ms": 50}
        async with Producer(
            bootstrap_servers=broker.bootstrap,
            transactional_id=f"{topic}-tx",
            **options,  # type: ignore[arg-type]
        ) as p:
            p.begin_transaction()
            await p.send_and_wait(topic, b"first")  # the partition is in the transaction already
            await time_out_on_the_wire(broker, p, topic)
            try:
                await p.abort_transaction()
            except ProducerFatalError as fatal:
                # The bump refused: the producer is failed, and says so on every later call.
                with pytest.raises(ProducerFatalError):
                    await p.abort_transaction()
                with pytest.raises(ProducerFatalError):
                    p.begin_transaction()
                assert fatal.__cause__ is not None
            else:
                # The bump taken (a broker that implements KIP-360): the producer goes on.
                async with p.transaction():
                    await p.send(topic, b"after")

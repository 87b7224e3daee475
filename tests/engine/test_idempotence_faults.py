"""Idempotence under faults: nothing acknowledged is written twice, order per partition holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import (
    InvalidRecordError,
    MessageTooLargeError,
    NotEnoughReplicasError,
    OutOfOrderSequenceNumberError,
    ProducerFatalError,
    TransactionAbortableError,
    TransactionAbortedError,
    UnknownServerError,
)
from aioprod.producer.batch import TopicPartition
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.cluster import OUT_OF_ORDER_SEQUENCE_NUMBER, FakeNode, Hold, ScriptedCluster

NOT_ENOUGH_REPLICAS = 19


def stateless_broker(scripted: Scripted) -> tuple[ScriptedCluster, FakeNode]:
    """The scripted cluster as a Kafka 2.5+ broker (KIP-360): a producer it holds no state for
    may write at any sequence. Topic "t" has one partition, led by the node returned."""
    cluster = scripted.cluster
    cluster.accepts_unknown_producers = True
    cluster.create_topic("t", leaders=[1])
    return cluster, cluster.nodes[1]


async def written_ahead(p: Producer, node: FakeNode, values: list[bytes]) -> list[Any]:
    """Send ``values`` to "t", a batch each, all on the wire before the broker looks at any
    (sequences 0, 1, ...); then the broker refuses all but the last before the append
    (NOT_ENOUGH_REPLICAS) and writes the last, holding its answer: as a broker without state
    for the producer may. Returns their futures."""
    node.stalling = True
    futures = []
    for value in values:
        futures.append(await p.send("t", value))
        await asyncio.sleep(0.01)
    node.script = deque([NOT_ENOUGH_REPLICAS] * (len(values) - 1) + [Hold])
    node.release()
    await asyncio.sleep(0.01)
    return futures


async def test_a_batch_in_doubt_keeps_its_identity_when_another_partition_fails(scripted: Scripted) -> None:
    # B1 (partition 0, node 1) is written but its answer never comes: the request times
    # out and B1 is retried. Meanwhile C1 (partition 1, node 2) fails for good, which puts
    # partition 1's sequence in doubt. B1's retry must keep its producer id and sequence
    # so the broker recognises it; re-stamped under a new identity it would land twice.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, request_timeout_ms=1000, retry_backoff_ms=10
    ) as p:
        await p.send_and_wait("t", b"A0", partition=0)  # both brokers connected, identity taken
        await p.send_and_wait("t", b"A1", partition=1)
        cluster.nodes[1].script = deque([Hold])
        cluster.nodes[2].script = deque([InvalidRecordError.code])
        b1 = await p.send("t", b"B1", partition=0)
        c1 = await p.send("t", b"C1", partition=1)
        with pytest.raises(InvalidRecordError):
            await c1
        md = await b1
        after = await p.send_and_wait("t", b"B2", partition=0)
    assert cluster.partition("t", 0).values == [b"A0", b"B1", b"B2"]
    assert (md.offset, after.offset) == (1, 2)


@contextlib.asynccontextmanager
async def two_partitions_written(cluster: ScriptedCluster) -> AsyncIterator[Producer]:
    """A producer (retry backoff 100 ms) that wrote w0 and w1 to partitions 0 and 1 of "t", led
    by nodes 1 and 2."""
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100, retry_backoff_max_ms=100
    ) as p:
        await p.send_and_wait("t", b"w0", partition=0)
        await p.send_and_wait("t", b"w1", partition=1)
        yield p


async def a_new_identity_for_partition_1(p: Producer, cluster: ScriptedCluster) -> None:
    """Partition 1 fails a batch (C) for good: its sequence is in doubt, and its next batch (D)
    makes the producer take a new identity (the epoch bumped, as Java)."""
    cluster.nodes[2].script = deque([InvalidRecordError.code])
    c = await p.send("t", b"C", partition=1)
    await asyncio.gather(c, return_exceptions=True)
    await p.send_and_wait("t", b"D", partition=1)
    assert p.metrics()["producer-id-reset-total"] == 1


async def test_retries_of_a_partition_survive_an_identity_change_caused_elsewhere(scripted: Scripted) -> None:
    cluster = scripted.cluster
    async with two_partitions_written(cluster) as p:
        node1 = cluster.nodes[1]
        node1.stalling = True  # A and B both go out before node 1 looks at either
        a = await p.send("t", b"A", partition=0)
        await asyncio.sleep(0.05)
        b = await p.send("t", b"B", partition=0)
        await asyncio.sleep(0.05)
        await a_new_identity_for_partition_1(p, cluster)
        # Node 1 answers A with a retriable error (not written); B's answer is lost.
        node1.script = deque([NOT_ENOUGH_REPLICAS, Hold])
        node1.release()
        await asyncio.sleep(0.05)
        cluster.disconnect(1)
        outcome = await asyncio.gather(a, b, return_exceptions=True)
        assert not any(isinstance(o, BaseException) for o in outcome), outcome
    assert cluster.partition("t", 0).values == [b"w0", b"A", b"B"]


async def test_a_partition_starts_its_sequences_again_only_once_its_batch_on_the_wire_is_answered(
    scripted: Scripted,
) -> None:
    # A (partition 0) is on the wire when partition 1's failure makes the producer take a new
    # identity. B, queued for partition 0 after that, must wait for A's answer before partition 0
    # numbers from 0 under the new epoch: sent at once, B was written first, and A's retry, under
    # the old epoch, was refused (INVALID_PRODUCER_EPOCH) and lost.
    cluster = scripted.cluster
    async with two_partitions_written(cluster) as p:
        node1 = cluster.nodes[1]
        node1.stalling = True  # A waits on the wire
        a = await p.send("t", b"A", partition=0)
        await a_new_identity_for_partition_1(p, cluster)
        b = await p.send("t", b"B", partition=0)
        flushing = asyncio.ensure_future(p.flush())  # B goes as soon as it may (not with A's answer)
        await asyncio.sleep(0.05)
        node1.script = deque([NOT_ENOUGH_REPLICAS])  # A is refused before the append: retried
        node1.release()
        outcome = await asyncio.gather(a, b, flushing, return_exceptions=True)
        assert not any(isinstance(o, BaseException) for o in outcome), outcome
    assert cluster.partition("t", 0).values == [b"w0", b"A", b"B"]


async def test_a_batch_written_before_its_leader_answered_not_leader_is_not_written_twice(
    scripted: Scripted,
) -> None:
    # Kafka answers NOT_LEADER_OR_FOLLOWER to a produce that waited in purgatory after the
    # leader appended it (Partition.checkEnoughReplicasReachOffset, leadership lost): the
    # batch may be in the log and on the new leader. Its retry must keep its stamp.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    cluster.kip951 = False
    real_produce = cluster._produce

    def appended_then_lost_leadership(node, request, version):  # type: ignore[no-untyped-def]
        response, hold = real_produce(node, request, version)
        part = response.responses[0].partition_responses[0]
        if node.node_id == 1 and part.error_code == 0 and cluster.partition("t", 0).leader == 1:
            cluster.move_leader("t", 0, 2)  # the follower had it: node 2 leads now
            part.error_code, part.base_offset = 6, -1  # NOT_LEADER_OR_FOLLOWER
        return response, hold

    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=1000, retry_backoff_max_ms=1000
    ) as p:
        await p.send_and_wait("t", b"w1", partition=1)
        cluster._produce = appended_then_lost_leadership  # type: ignore[method-assign]
        a = await p.send("t", b"A", partition=0)
        while not cluster.partition("t", 0).log:
            await asyncio.sleep(0.01)
        cluster._produce = real_produce  # type: ignore[method-assign]
        # While A waits out its backoff, partition 1 fails a batch for good and the next
        # batch there takes a new identity.
        cluster.nodes[2].script = deque([InvalidRecordError.code])
        c = await p.send("t", b"C", partition=1)
        await asyncio.gather(c, return_exceptions=True)
        await p.send_and_wait("t", b"D", partition=1)
        await a
    assert cluster.partition("t", 0).values == [b"A"]


@pytest.mark.parametrize("first_batch", [False, True])
async def test_a_written_batch_retried_after_it_left_the_brokers_duplicate_window_is_not_written_again(
    scripted: Scripted, first_batch: bool
) -> None:
    # The broker recognises a repeat only among the last five batches it holds per producer and
    # partition. A batch written, its answer lost, and retried after six more went past it, is
    # answered OUT_OF_ORDER_SEQUENCE_NUMBER: taken for a gap, it was renumbered and written
    # again (or, at sequence 0, stopped the producer). Later sequences of its identity were
    # acknowledged, so it may well be in the log: it fails, as possibly written, and is not
    # sent again. (Not acknowledged either: a broker without state for the producer takes a
    # later sequence without the earlier ones.)
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2, 1])
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10, metadata_max_age_ms=500
    ) as p:
        await (await p.send("t", b"x", partition=1))  # both brokers connected
        await (await p.send("t", b"x", partition=2))
        if not first_batch:
            await (await p.send("t", b"before", partition=0))
        cluster.nodes[1].script = deque([Hold])  # written; its answer held
        held = await p.send("t", b"held", partition=0)
        while b"held" not in cluster.partition("t", 0).values:
            await asyncio.sleep(0.01)  # virtual time
        cluster.move_leader("t", 0, 2)
        await asyncio.sleep(1.0)  # virtual: a periodic refresh finds the new leader
        flushing = asyncio.ensure_future(p.flush())  # later batches go while "held" is unanswered
        for i in range(6):
            await (await p.send("t", b"later-%d" % i, partition=0))
        cluster.disconnect(1)  # the held answer is lost: "held" is retried with its stamp
        with pytest.raises(OutOfOrderSequenceNumberError, match="may be in the log") as info:
            await held  # written, here; a broker without state for the producer could have skipped it
        await flushing
        await (await p.send("t", b"after", partition=0))  # the producer goes on
    assert cluster.partition("t", 0).values.count(b"held") == 1
    assert info.value.possibly_persisted is True  # the flag, not only the text (set apart)


async def test_a_record_maybe_in_the_log_when_the_producer_goes_fatal_says_so(scripted: Scripted) -> None:
    # The batches a fatal error fails keep what is known of them: one written, its answer lost,
    # must not be told it was not written.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10)
    await p.start()
    try:
        await p.partitions_for("t")
        cluster.nodes[2].script = deque([Hold])  # written, its answer held ...
        maybe = await p.send("t", b"maybe", partition=1)
        while not cluster.partition("t", 1).values:
            await asyncio.sleep(0.001)  # virtual time
        cluster.stop(2)  # ... and lost with the broker: the retry waits for node 2
        await asyncio.sleep(0.5)
        assert not maybe.done()
        # Sequence 0 of partition 0 refused as out of order: a gap the producer cannot explain.
        cluster.nodes[1].script = deque([OUT_OF_ORDER_SEQUENCE_NUMBER])
        trigger = await p.send("t", b"trigger", partition=0)
        with pytest.raises(ProducerFatalError):
            await trigger
        with pytest.raises(ProducerFatalError) as info:
            await maybe
    finally:
        await p.close(0)
    assert cluster.partition("t", 1).values == [b"maybe"]  # it is in the log
    assert info.value.possibly_persisted is True


async def test_a_batch_a_stateless_broker_skipped_is_not_reported_as_delivered(scripted: Scripted) -> None:
    # A Kafka 2.5+ broker holding no state for the producer takes a later sequence without the
    # earlier ones. Here the first batch is refused before it is written, the second taken,
    # and the first's retry refused OUT_OF_ORDER: later sequences were acknowledged, yet it is
    # not in the log. It must not count as delivered (nor be written twice, nor behind the
    # second); it fails, saying it is not in the log.
    cluster = scripted.cluster
    cluster.accepts_unknown_producers = True
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10) as p:
        await p.partitions_for("t")
        node.stalling = True  # both requests on the wire before the broker looks at either
        first = await p.send("t", b"first", partition=0)
        while not cluster.requests_of(m.ProduceRequest):
            await asyncio.sleep(0)
        flushing = asyncio.ensure_future(p.flush())  # sends the second without waiting for the first
        second = await p.send("t", b"second", partition=0)
        while p.metrics()["requests-in-flight"] < 2:  # (the broker handles a connection's requests in turn)
            await asyncio.sleep(0)
        node.script = deque([19, 0])  # NOT_ENOUGH_REPLICAS (not written), then taken
        node.release()
        with pytest.raises(OutOfOrderSequenceNumberError, match="not in the log") as refused:
            await first
        assert refused.value.possibly_persisted is False  # its one attempt was refused before the append
        await second
        await flushing
    assert cluster.partition("t").values == [b"second"]


async def test_a_renumbered_batch_is_not_written_twice_by_a_late_earlier_attempt(scripted: Scripted) -> None:
    # After an unexplained gap the producer took a new producer id (Kafka answers InitProducerId
    # without a transactional id with a new id, whatever it is sent), renumbered B under it, and
    # the old id's attempts still queued in the broker (on a connection given up on) were then
    # written too: B twice. As Java's, the producer now bumps its own epoch: the broker refuses
    # the old epoch's attempts where the new one was written.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1])
    node = cluster.nodes[1]
    options = {"request_timeout_ms": 1000, "delivery_timeout_ms": 2500, "retry_backoff_ms": 100}
    # Each record fills a batch: each goes at once, not with W's answer.
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, **options) as p:
        await p.send_and_wait("t", b"w0" * 100)  # connected, identity taken (sequence 0)
        node.delay = 5.0  # a slow broker: it appends at once, answers 5 s later
        w = await p.send("t", b"W" * 100)  # sequence 1
        await asyncio.sleep(0.01)
        node.delay = 0.0  # W's answer holds up those of A and B, behind it on that connection
        a = await p.send("t", b"A" * 100)  # sequence 2
        await asyncio.sleep(0.8)  # B's delivery deadline comes well after A's
        b = await p.send("t", b"B" * 100)  # sequence 3
        # At 1 s the request timeout closes the connection; W, A and B are retried on a new one:
        # W's retry is a duplicate (success), A's refused until A's delivery timeout.
        node.script = deque([0] + [NOT_ENOUGH_REPLICAS] * 40)
        await asyncio.gather(w, a, return_exceptions=True)
        node.script.clear()
        await asyncio.gather(b, return_exceptions=True)  # refused as out of order, then renumbered
        await asyncio.sleep(10)  # the old connection's queued requests are handled meanwhile
    assert cluster.partition("t").values.count(b"B" * 100) == 1


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_broker_error_after_an_attempt_that_may_be_written_says_so(
    scripted: Scripted, idempotent: bool
) -> None:
    # Written, its answer lost; the retry refused as too large (the limit lowered meanwhile): a
    # plain MessageTooLargeError said nothing of the record in the log, and a resend wrote it twice.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1])
    options: dict[str, object] = {} if idempotent else {"enable_idempotence": False, "acks": 1}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10, **options) as p:
        await p.send_and_wait("t", b"w")
        cluster.nodes[1].script = deque([Hold])
        future = await p.send("t", b"v" * 200)
        await asyncio.sleep(0.01)
        cluster.partition("t").max_batch_bytes = 150
        cluster.disconnect(1)
        with pytest.raises(MessageTooLargeError) as info:
            await future
    assert b"v" * 200 in cluster.partition("t").values
    assert getattr(info.value, "possibly_persisted", None) is True


@pytest.mark.parametrize("retries", [2, None])
async def test_a_batch_written_ahead_of_refused_ones_is_resolved_and_they_fail(
    scripted: Scripted, retries: int | None
) -> None:
    # A broker with no state for a producer id takes its batch at any sequence (Apache Kafka 2.5+,
    # KIP-360). A new identity's A, B and C go out pipelined; A and B are refused before the append
    # (NOT_ENOUGH_REPLICAS), C is written and its answer lost. The broker now expects sequence 3:
    # A's and B's retries are refused as out of order. C must be resolved under its own stamp before
    # the partition is renumbered (renumbered, it was written twice), and A's refusal at sequence 0,
    # explained by C, must not stop the producer (it did). A and B are not in the log, and written
    # now they would land behind C: they fail, saying so.
    cluster, node = stateless_broker(scripted)
    options = {} if retries is None else {"retries": retries}
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, retry_backoff_ms=10, **options
    ) as p:
        await p.partitions_for("t")
        futures = await written_ahead(p, node, [b"A" * 100, b"B" * 100, b"C" * 100])
        node.script = deque([NOT_ENOUGH_REPLICAS] * 2)  # A's retries refused again (retries=2: A fails)
        cluster.disconnect(1)
        a, b, c = await asyncio.gather(*futures, return_exceptions=True)
        after = await p.send_and_wait("t", b"D")  # the partition goes on, under a new identity
    assert [v[:1] for v in cluster.partition("t").values] == [b"C", b"D"]
    assert not isinstance(c, BaseException)
    assert (c.offset, after.offset) == (0, 1)
    assert isinstance(b, OutOfOrderSequenceNumberError) and "not in the log" in str(b)
    assert b.possibly_persisted is False
    if retries is None:
        assert isinstance(a, OutOfOrderSequenceNumberError) and a.possibly_persisted is False, a
    else:
        assert isinstance(a, NotEnoughReplicasError), a


async def test_refused_batches_are_not_written_behind_a_later_one_that_failed_possibly_persisted(
    scripted: Scripted,
) -> None:
    # As above, but C (written ahead of A and B, its answer lost) is never resolved: its retries are
    # refused before the append until it is out of retries, and it fails, possibly persisted. A and
    # B were renumbered and written behind it: the log read C, A, B, all three sent in that order.
    cluster, node = stateless_broker(scripted)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, retry_backoff_ms=10, retries=2
    ) as p:
        await p.partitions_for("t")
        futures = await written_ahead(p, node, [b"A" * 100, b"B" * 100, b"C" * 100])
        # C's answer is lost; A's and B's retries are refused as out of order (the broker expects 3),
        # C's refused before the append until it is out of retries.
        node.script = deque([0, 0, NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS])
        cluster.disconnect(1)
        a, b, c = await asyncio.gather(*futures, return_exceptions=True)
    assert [v[:1] for v in cluster.partition("t").values] == [b"C"]
    assert isinstance(c, NotEnoughReplicasError) and c.possibly_persisted is True
    for refused in (a, b):
        assert isinstance(refused, OutOfOrderSequenceNumberError) and refused.possibly_persisted is False, refused


async def test_refused_batches_are_not_written_behind_a_later_one_refused_as_too_large(scripted: Scripted) -> None:
    # The same with unlimited retries: C's retry is refused MESSAGE_TOO_LARGE (the topic's limit was
    # lowered meanwhile), so C fails, possibly persisted, and A and B must not land behind it.
    cluster, node = stateless_broker(scripted)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, retry_backoff_ms=10) as p:
        await p.partitions_for("t")
        futures = await written_ahead(p, node, [b"A" * 10, b"B" * 10, b"C" * 100])  # C larger than A and B
        cluster.partition("t").max_batch_bytes = 130  # A and B (~90 bytes) fit, C (~180) does not
        node.script = deque([0, 0])
        cluster.disconnect(1)
        await asyncio.sleep(0.2)  # A's and B's retries refused out of order, C's refused too large
        cluster.partition("t").max_batch_bytes = None
        a, b, c = await asyncio.gather(*futures, return_exceptions=True)
    assert [v[:1] for v in cluster.partition("t").values] == [b"C"]
    assert isinstance(c, MessageTooLargeError) and c.possibly_persisted is True
    for refused in (a, b):
        assert isinstance(refused, OutOfOrderSequenceNumberError) and refused.possibly_persisted is False, refused


async def test_a_record_written_before_its_topic_was_recreated_is_not_said_unwritten(scripted: Scripted) -> None:
    # X is written, its answer held; the topic is deleted and created again (no producer state);
    # X's answer is lost and its retry refused UNKNOWN_PRODUCER_ID. That refusal said X was not in
    # the log, but the broker that gave it had lost the state X was written under.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1])
    node = cluster.nodes[1]
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10, metadata_max_age_ms=100)
    await p.start()
    await p.send_and_wait("t", b"w0")
    node.script = deque([Hold])  # X is written, its answer held
    x = await p.send("t", b"X")
    while cluster.partition("t").values != [b"w0", b"X"]:
        await asyncio.sleep(0.001)
    old = cluster.partition("t")
    cluster.create_topic("t", leaders=[1])  # deleted and created again: empty, no producer state
    await asyncio.sleep(0.5)
    sent = len(cluster.requests_of(m.ProduceRequest))
    cluster.disconnect(1)  # X's answer is lost; its retry is refused UNKNOWN_PRODUCER_ID
    while len(cluster.requests_of(m.ProduceRequest)) == sent:
        await asyncio.sleep(0.0005)
    await asyncio.sleep(0.001)
    await p.close(0)
    assert old.values == [b"w0", b"X"]  # X was written
    error = x.exception()
    assert error is not None and error.possibly_persisted is True, error


async def test_no_acknowledgement_for_a_record_whose_transaction_its_own_answer_made_abortable(
    scripted: Scripted,
) -> None:
    # The KIP-360 shape in a transaction: A refused before the append, C written with its answer
    # lost, A's retry refused as out of order, C's retry acknowledged. Handling C's answer fails A
    # (C was written ahead of it), which makes the transaction abortable: C, never to be visible,
    # was acknowledged all the same.
    cluster, node = stateless_broker(scripted)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, retry_backoff_ms=10, transactional_id="tx"
    ) as p:
        await p.partitions_for("t")
        p.begin_transaction()
        node.stalling = True
        futures = []
        for name in (b"A", b"C"):
            futures.append(await p.send("t", name * 100))
            await asyncio.sleep(0.01)
        flushing = asyncio.ensure_future(p.flush())
        await asyncio.sleep(0.01)
        node.script = deque([NOT_ENOUGH_REPLICAS, Hold])  # A refused; C written, its answer held
        node.release()
        await asyncio.sleep(0.01)
        cluster.disconnect(1)  # C's answer is lost
        a, c = await asyncio.gather(*futures, return_exceptions=True)
        await flushing
        with pytest.raises(TransactionAbortableError):
            await p.commit_transaction()
        await p.abort_transaction()
    assert cluster.partition("t").committed == []
    assert isinstance(a, OutOfOrderSequenceNumberError), a
    assert isinstance(c, TransactionAbortedError) and c.possibly_persisted is True, c


async def fail_one_for_good(p: Producer, node: FakeNode) -> None:
    """A batch of partition 0 of "t" refused for good (INVALID_RECORD): its sequence is in doubt,
    so the producer bumps its own epoch before the partition goes on."""
    node.script = deque([InvalidRecordError.code])
    with pytest.raises(InvalidRecordError):
        await p.send_and_wait("t", b"refused", partition=0)


async def test_a_broker_that_refuses_the_producers_own_epoch_bump_gets_asked_for_a_new_identity(
    scripted: Scripted,
) -> None:
    # Tansu takes only the epoch its InitProducerId handed out. After a batch failed for good (its
    # partition's sequence in doubt) the producer bumped its epoch itself, as Java does; Tansu
    # refused that with PRODUCER_FENCED, and every record after it failed so, for good.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.refuses_client_epoch_bumps = True
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10) as p:
        await p.send_and_wait("t", b"a")
        await fail_one_for_good(p, cluster.nodes[1])
        for i in range(3):
            await p.send_and_wait("t", b"after-%d" % i)
    assert cluster.partition("t").values == [b"a", b"after-0", b"after-1", b"after-2"]


async def test_a_batch_refused_after_a_later_one_failed_possibly_persisted_is_not_written_behind_it(
    scripted: Scripted,
) -> None:
    # As above, in the other order: C is written ahead of A (a broker without state for the
    # producer) and fails at once, possibly persisted (an error after the append: this broker
    # answers UNKNOWN_SERVER_ERROR); only then is A's retry refused as out of order. A was
    # renumbered and written behind C, which was sent after it: the log read C, A.
    cluster, node = stateless_broker(scripted)
    real_produce = cluster._produce

    def c_written_then_unknown_server_error(node_, request, version):  # type: ignore[no-untyped-def]
        response, hold = real_produce(node_, request, version)
        part = response.responses[0].partition_responses[0]
        if part.error_code == 0 and cluster.partition("t").values[-1:] == [b"C" * 100] and part.base_offset == 0:
            part.error_code, part.base_offset = UnknownServerError.code, -1
        return response, hold

    cluster._produce = c_written_then_unknown_server_error  # type: ignore[method-assign]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, retry_backoff_ms=10) as p:
        await p.partitions_for("t")
        node.stalling = True  # both on the wire before the broker looks at either
        a = await p.send("t", b"A" * 100)
        await asyncio.sleep(0.01)
        flushing = asyncio.ensure_future(p.flush())  # C goes without waiting for A's answer
        c = await p.send("t", b"C" * 100)
        while p.metrics()["requests-in-flight"] < 2:
            await asyncio.sleep(0)
        node.script = deque([NOT_ENOUGH_REPLICAS])  # A refused before the append; C written
        node.release()
        a_out, c_out = await asyncio.gather(a, c, return_exceptions=True)
        await flushing
        after = await p.send_and_wait("t", b"D")  # the partition goes on, under a new identity
    assert [v[:1] for v in cluster.partition("t").values] == [b"C", b"D"]
    assert isinstance(c_out, UnknownServerError) and c_out.possibly_persisted is True, c_out
    assert isinstance(a_out, OutOfOrderSequenceNumberError) and a_out.possibly_persisted is False, a_out
    assert after.offset == 1


async def test_every_batch_refused_under_the_producers_own_epoch_bump_gets_a_new_identity(
    scripted: Scripted,
) -> None:
    # Tansu refuses the producer's own epoch bump for every partition, and for every batch of a
    # partition on the wire under it: not only the first refusal read must move to a new identity,
    # or the other partitions' records (and the later batches of the first) failed PRODUCER_FENCED.
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1, 1])
    cluster.refuses_client_epoch_bumps = True
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10) as p:
        await p.send_and_wait("t", b"a0", partition=0)
        await p.send_and_wait("t", b"a1", partition=1)
        await fail_one_for_good(p, cluster.nodes[1])
        futures = [await p.send("t", b"b%d-%d" % (i % 2, i), partition=i % 2) for i in range(6)]
        await asyncio.gather(*futures)
    assert cluster.partition("t", 0).values == [b"a0", b"b0-0", b"b0-2", b"b0-4"]
    assert cluster.partition("t", 1).values == [b"a1", b"b1-1", b"b1-3", b"b1-5"]


async def test_batches_of_a_partition_refused_under_the_producers_own_epoch_bump_keep_their_order(
    scripted: Scripted,
) -> None:
    # Several batches of the partition are on the wire under the epoch the producer bumped itself
    # when the broker (as Tansu) refuses them all: each is renumbered under the broker's new
    # identity, in the order they were sent; none fails PRODUCER_FENCED.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.refuses_client_epoch_bumps = True
    node = cluster.nodes[1]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10, batch_size=16) as p:
        await p.send_and_wait("t", b"a")
        await fail_one_for_good(p, node)
        node.stalling = True
        tp = TopicPartition("t", 0)
        futures = []
        for i, on_wire in enumerate([1, 2, 2]):  # (each record a full batch; two requests on the wire)
            futures.append(await p.send("t", b"b%d" % i))
            while p._accumulator.on_wire.get(tp, 0) < on_wire:  # (the broker answers nothing yet)
                await asyncio.sleep(0)
        node.release()
        await asyncio.gather(*futures)
    assert cluster.partition("t").values == [b"a", b"b0", b"b1", b"b2"]

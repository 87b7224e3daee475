"""One test per broker answer the idempotent producer must handle, on the scripted fake cluster."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import (
    DeliveryTimeoutError,
    DuplicateSequenceNumberError,
    InvalidBatchError,
    InvalidRecordError,
    KafkaTimeoutError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
    ProducerFatalError,
    SendManyError,
    TopicAuthorizationFailedError,
    UnknownProducerIdError,
    UnsupportedVersionError,
)
from aioprod.protocol import framing
from aioprod.protocol.messages import (
    ApiVersionsRequest,
    InitProducerIdRequest,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponseTopic,
    ProduceRequest,
    ProduceResponseBatchIndexError,
)
from aioprod.protocol.records import read_batch
from tests.conftest import Scripted
from tests.fakes.cluster import Hold, ScriptedCluster

DUPLICATE = DuplicateSequenceNumberError.code
OUT_OF_ORDER = OutOfOrderSequenceNumberError.code
UNKNOWN_PRODUCER = UnknownProducerIdError.code
NOT_LEADER = NotLeaderOrFollowerError.code
UNKNOWN_SERVER_ERROR = -1
NOT_ENOUGH_REPLICAS = NotEnoughReplicasError.code


@pytest.fixture
def cluster(scripted: Scripted) -> ScriptedCluster:
    scripted.cluster.create_topic("t", 1)
    return scripted.cluster


def producer(cluster: ScriptedCluster, **options: object) -> Producer:
    defaults: dict[str, object] = {"linger_ms": 0, "retry_backoff_ms": 1, "retry_backoff_max_ms": 5}
    defaults.update(options)
    return Producer(bootstrap_servers=cluster.bootstrap, **defaults)


def init_calls(cluster: ScriptedCluster) -> int:
    """Identities the producer used: InitProducerId answers, and epochs it bumped itself (as Java's
    idempotent producer does) — each distinct (producer id, epoch) its batches carried."""
    stamps = set()
    for request in cluster.requests_of(ProduceRequest):
        for topic in request.body.topic_data:
            for part in topic.partition_data:
                batch = read_batch(part.records)
                stamps.add((batch.producer_id, batch.producer_epoch))
    return max(len(stamps), len(cluster.requests_of(InitProducerIdRequest)))


async def test_a_broker_answering_acks_0_far_behind_loses_nothing(cluster: ScriptedCluster) -> None:
    # Tansu answers acks=0 requests, which Kafka does not. Of the ids written, the last 1,024 were
    # remembered to skip their answers: a broker more than 1,024 requests behind (a pause, a
    # loaded host) had its answer taken for a malformed one, and the connection dropped with the
    # requests it had not read yet, whose records were reported sent.
    node = cluster.nodes[1]
    node.answers_acks_0 = True
    async with producer(cluster, acks=0, batch_size=100, enable_idempotence=False) as p:
        await p.send_and_wait("t", b"warm-up")
        node.stalling = True  # it reads on, and looks at the requests only when released
        values = [b"%05d" % i + b"x" * 90 for i in range(2000)]  # a batch each
        sent = [await p.send("t", value) for value in values]
        await asyncio.gather(*sent)  # written: every record reported sent
        node.release()
        await p.flush()
        await asyncio.sleep(1)  # (virtual time) the broker works through them
        assert len(cluster.requests_of(ProduceRequest)) > 1100  # answered far behind
        assert node.open_connections == 2  # the bootstrap's and the leader's: none dropped
    assert cluster.partition("t").values == [b"warm-up", *values]


async def test_close_lets_a_broker_answering_acks_0_read_every_request(cluster: ScriptedCluster) -> None:
    # Closed as soon as the last acks=0 request was written, the connection was reset under the
    # answers it had not read, and Tansu dropped the requests it had not read yet: of 20,000
    # records "sent", 12,000-16,000 were in the log.
    node = cluster.nodes[1]
    node.answers_acks_0 = True
    p = producer(cluster, acks=0, enable_idempotence=False)
    await p.start()
    node.stalling = True  # behind: it has read none of them when the last is written
    for i in range(100):
        await p.send("t", b"%03d" % i)
    closing = asyncio.ensure_future(p.close())
    await asyncio.sleep(1)
    assert not closing.done()  # the broker has not read them yet
    node.release()
    await closing
    assert cluster.partition("t").values == [b"%03d" % i for i in range(100)]


async def test_an_idle_close_lets_a_broker_behind_read_its_acks_0_requests(scripted: Scripted) -> None:
    # A connection retired for being idle was aborted under the requests the broker had not read.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    node.answers_acks_0 = True
    p = producer(cluster, acks=0, enable_idempotence=False, connections_max_idle_ms=1000, metadata_max_age_ms=3_600_000)
    await p.start()
    node.stalling = True
    for i in range(100):
        await p.send("t", b"%03d" % i)
    await clock.advance(3)  # idle: retired
    node.release()
    await clock.advance(1)
    await p.close()
    assert cluster.partition("t").values == [b"%03d" % i for i in range(100)]


async def test_duplicate_sequence_counts_as_success(cluster: ScriptedCluster) -> None:
    cluster.nodes[1].script = deque([DUPLICATE])  # answered without writing: "already have it"
    async with producer(cluster) as p:
        md = await p.send_and_wait("t", b"a")
        assert md.partition == 0
        assert (await p.send_and_wait("t", b"b")).offset == 0  # the duplicate was not logged


async def test_out_of_order_behind_a_failed_batch_is_retried_in_order(cluster: ScriptedCluster) -> None:
    # Two batches of one partition in flight; the first fails retriably, so the broker
    # refuses the second as out of order. Both must land, in send order.
    cluster.nodes[1].script = deque([NOT_LEADER, OUT_OF_ORDER])
    async with producer(cluster, batch_size=100) as p:
        await p.partitions_for("t")
        cluster.nodes[1].stalling = True  # both requests reach the broker before any answer
        first = await p.send("t", b"x" * 60)
        second = await p.send("t", b"y" * 60)  # does not fit the first batch
        await asyncio.sleep(0.01)
        cluster.nodes[1].release()
        await asyncio.gather(first, second)
        assert p.metrics()["record-retry-total"] == 2  # each batch once: NOT_LEADER, then OUT_OF_ORDER
    assert cluster.partition("t").values == [b"x" * 60, b"y" * 60]
    assert [a.base_sequence for a in cluster.partition("t").log] == [0, 1]
    assert init_calls(cluster) == 1  # an explained gap needs no new identity


async def test_unknown_producer_id_takes_a_new_identity_invisibly(cluster: ScriptedCluster) -> None:
    cluster.nodes[1].script = deque([UNKNOWN_PRODUCER])
    async with producer(cluster) as p:
        md = await p.send_and_wait("t", b"v")
        assert md.offset == 0
    assert init_calls(cluster) == 2
    (accepted,) = cluster.partition("t").log
    assert (accepted.producer_id, accepted.base_sequence) == (1001, 0)  # sequence 0 refused: a new id


async def test_out_of_order_when_the_broker_forgot_resets_sequences(cluster: ScriptedCluster) -> None:
    async with producer(cluster) as p:
        await p.send_and_wait("t", b"first")
        cluster.nodes[1].script.append(OUT_OF_ORDER)  # the broker lost what it knew of us
        await p.send_and_wait("t", b"second")
    assert init_calls(cluster) == 2
    log = cluster.partition("t").log
    assert [(a.producer_id, a.producer_epoch, a.base_sequence) for a in log] == [(1000, 0, 0), (1000, 1, 0)]


async def test_out_of_order_behind_a_failed_batch_is_retried_in_order_after_the_sequences_restarted(
    cluster: ScriptedCluster,
) -> None:
    # The same, once the partition numbered from 0 again under a new epoch (the broker lost what
    # it knew of the producer after three batches): what the broker acknowledged under the old
    # epoch says nothing of the new one, and the second batch, refused behind the first, is no
    # batch the broker "acknowledged later records" of: retried, not failed.
    async with producer(cluster, batch_size=100) as p:
        for value in (b"w0", b"w1", b"w2"):
            await p.send_and_wait("t", value)
        cluster.nodes[1].script.append(OUT_OF_ORDER)
        await p.send_and_wait("t", b"restarted")  # sequence 0 under the next epoch
        cluster.nodes[1].script = deque([NOT_LEADER, OUT_OF_ORDER])
        cluster.nodes[1].stalling = True  # both requests reach the broker before any answer
        first = await p.send("t", b"x" * 60)
        second = await p.send("t", b"y" * 60)
        await asyncio.sleep(0.01)
        cluster.nodes[1].release()
        await asyncio.gather(first, second)
    log = cluster.partition("t").log
    assert [a.values for a in log[3:]] == [(b"restarted",), (b"x" * 60,), (b"y" * 60,)]
    assert [(a.producer_epoch, a.base_sequence) for a in log[3:]] == [(1, 0), (1, 1), (1, 2)]


async def test_producer_id_0_is_an_identity(cluster: ScriptedCluster) -> None:
    # A new Apache Kafka cluster hands out producer id 0 first (ProducerIdManager's first block).
    cluster._producer_ids = itertools.count(0)
    async with producer(cluster) as p:
        assert (await p.send_and_wait("t", b"v")).offset == 0
    (accepted,) = cluster.partition("t").log
    assert (accepted.producer_id, accepted.producer_epoch, accepted.base_sequence) == (0, 0, 0)


async def test_a_broker_that_cannot_bump_the_epoch_gives_a_new_producer_id(scripted: Scripted) -> None:
    # Sequence 0 refused as UNKNOWN_PRODUCER_ID: the producer asks InitProducerId for another
    # identity with its current id and epoch (KIP-360). A broker that cannot do that for an
    # idempotent producer (Tansu: UNKNOWN_SERVER_ERROR, not retriable) is asked again for a fresh
    # one: its refusal is no reason to stop the producer.
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    async with producer(cluster) as p:
        await p.send_and_wait("t", b"w", partition=1)  # identity 1000 taken
        cluster.init_script = deque([UNKNOWN_SERVER_ERROR])
        cluster.nodes[1].script = deque([UNKNOWN_PRODUCER])  # partition 0's sequence 0 refused
        md = await p.send_and_wait("t", b"v", partition=0)
    assert md.offset == 0
    bump, fresh = (r.body for r in cluster.requests_of(InitProducerIdRequest)[1:])
    assert (bump.producer_id, bump.producer_epoch, fresh.producer_id, fresh.producer_epoch) == (1000, 0, -1, -1)  # type: ignore[attr-defined]
    (accepted,) = cluster.partition("t", 0).log
    assert accepted.producer_id == 1001


async def test_a_producer_at_the_largest_epoch_takes_a_new_id_instead_of_bumping_it(
    cluster: ScriptedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The epoch is an int16: at 32767 it cannot be bumped, and a new identity is a new producer id.
    # Fake: the cluster's first InitProducerId answer gives the largest epoch.
    answer = cluster._init_producer_id
    epochs = iter([32767])

    def at_the_largest_epoch(request: InitProducerIdRequest) -> Any:
        response = answer(request)
        response.producer_epoch = next(epochs, response.producer_epoch)
        return response

    monkeypatch.setattr(cluster, "_init_producer_id", at_the_largest_epoch)
    async with producer(cluster) as p:
        await p.send_and_wait("t", b"first")
        cluster.nodes[1].script.append(OUT_OF_ORDER)  # the broker lost what it knew of us
        await p.send_and_wait("t", b"second")
    log = cluster.partition("t").log
    assert [(a.producer_id, a.producer_epoch, a.base_sequence) for a in log] == [(1000, 32767, 0), (1001, 0, 0)]


async def test_unexplainable_sequence_gap_is_fatal(cluster: ScriptedCluster) -> None:
    cluster.nodes[1].script = deque([OUT_OF_ORDER])  # sequence 0 of a fresh identity refused
    async with producer(cluster) as p:
        fut = await p.send("t", b"v")
        with pytest.raises(ProducerFatalError, match="sequence gap"):
            await fut
        with pytest.raises(ProducerFatalError):
            await p.send("t", b"later")
        assert p.metrics()["record-retry-total"] == 0  # failed, not retried (nor logged as retrying)


async def test_unexplainable_sequence_gap_is_fatal_though_a_later_batch_was_refused(cluster: ScriptedCluster) -> None:
    # Sequence 0 of a fresh identity refused after the batch behind it was refused before the
    # append (it is not in the log): nothing later of the identity can have been written ahead
    # of it, so the refusal is still unexplainable.
    async with producer(cluster, batch_size=100) as p:
        await p.partitions_for("t")
        cluster.nodes[1].stalling = True
        first = await p.send("t", b"x" * 60)
        second = await p.send("t", b"y" * 60)
        while p.metrics()["requests-in-flight"] < 2:
            await asyncio.sleep(0)
        cluster.nodes[1].script = deque([NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS, OUT_OF_ORDER])
        cluster.nodes[1].release()
        with pytest.raises(ProducerFatalError, match="sequence gap"):
            await first
        with pytest.raises(ProducerFatalError):
            await second
    assert cluster.partition("t").values == []


async def test_after_a_fatal_error_each_record_is_told_what_became_of_it(scripted: Scripted) -> None:
    # One broker's answer makes the producer fail while another broker holds the answer to
    # a batch it wrote, and a third cannot be reached. The written record is acknowledged
    # (it is in the log: failing it invites a resend, a duplicate); the others fail, each
    # saying it is certainly not in the log.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("t", leaders=[1, 2, 3])
    async with producer(cluster) as p:
        await p.partitions_for("t")
        cluster.nodes[1].holding = True
        cluster.stop(3)
        written = await p.send("t", b"written", partition=0)
        unsent = await p.send("t", b"unsent", partition=2)
        while not cluster.partition("t", 0).values:
            await asyncio.sleep(0.001)
        cluster.nodes[2].script = deque([OUT_OF_ORDER])  # sequence 0 refused: fatal
        refused = await p.send("t", b"refused", partition=1)
        with pytest.raises(ProducerFatalError, match="sequence gap") as info:
            await refused
        assert info.value.possibly_persisted is False
        with pytest.raises(ProducerFatalError) as info:
            await unsent
        assert info.value.possibly_persisted is False
        cluster.nodes[1].release()
        assert (await written).offset == 0
    assert cluster.partition("t", 0).values == [b"written"]


async def test_a_lost_attempt_the_brokers_sequence_check_refused_is_not_in_the_log(cluster: ScriptedCluster) -> None:
    # A and X go out, and their answers are lost with the connection (the broker had not looked
    # at them). A is then refused until it is out of retries; X's retry, out of order behind it:
    # the broker checked X's sequence, which it would have recognised had an attempt of X been
    # written. Renumbered, X is refused until it too is out of retries: it is not in the log,
    # and says so (a user may send it again), where A, whose first answer never came, may be.
    async with producer(cluster, batch_size=100, retries=2) as p:
        await p.send_and_wait("t", b"w")  # the broker knows the producer (else: UNKNOWN_PRODUCER_ID)
        node = cluster.nodes[1]
        node.stalling = True
        a = await p.send("t", b"A" * 60)
        while len(cluster.requests_of(ProduceRequest)) < 2:
            await asyncio.sleep(0)  # the broker holds A
        node.stop_reading()  # and never reads X (else it would look at X once released)
        x = await p.send("t", b"X" * 60)
        while p.metrics()["requests-in-flight"] < 2:
            await asyncio.sleep(0)
        # A's retries refused; X's first retry handled (out of order), its renumbered one refused.
        node.script = deque([NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS, 0, NOT_ENOUGH_REPLICAS])
        cluster.disconnect(1)
        node.release()
        outcomes = await asyncio.gather(a, x, return_exceptions=True)
    assert cluster.partition("t").values == [b"w"]
    assert all(isinstance(o, NotEnoughReplicasError) for o in outcomes), outcomes
    assert [getattr(o, "possibly_persisted", False) for o in outcomes] == [True, False]


async def test_a_batch_larger_than_max_request_size_goes_in_a_request_of_its_own(scripted: Scripted) -> None:
    # batch_size above max_request_size: a full batch passes the request size, and goes alone (as
    # Java's drain takes a node's first batch whatever its size) instead of waiting forever.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=100, batch_size=20_000, max_request_size=10_000
    ) as p:
        await p.partitions_for("t")
        futures = [await p.send("t", b"%02d" % i + b"x" * 498) for i in range(30)]  # one 15 KB batch
        await asyncio.gather(*futures)
    assert len(cluster.partition("t").values) == 30


async def test_not_leader_is_retried_with_the_same_bytes(cluster: ScriptedCluster) -> None:
    cluster.nodes[1].script = deque([NOT_LEADER, NOT_LEADER])
    async with producer(cluster) as p:
        md = await p.send_and_wait("t", b"v", key=b"k")
    assert md.offset == 0
    attempts = [r.body for r in cluster.requests_of(ProduceRequest)]
    payloads = {r.topic_data[0].partition_data[0].records for r in attempts}  # type: ignore[attr-defined]
    assert len(attempts) == 3 and len(payloads) == 1  # same batch, same sequence, every time


async def test_timeout_in_flight_is_possibly_persisted(cluster: ScriptedCluster) -> None:
    async with producer(cluster, request_timeout_ms=200, delivery_timeout_ms=700) as p:
        await p.partitions_for("t")
        cluster.nodes[1].stalling = True  # the broker does not look at the request yet
        fut = await p.send("t", b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
        assert info.value.possibly_persisted is True
        assert "possibly persisted" in str(info.value)
        cluster.nodes[1].release()  # ... and then it does: the batch was persisted after all
        await p.send_and_wait("t", b"after")
    # The broker acknowledged the expired batch's sequence, so the next one follows it.
    assert init_calls(cluster) == 1
    assert [(a.values, a.base_sequence) for a in cluster.partition("t").log] == [((b"v",), 0), ((b"after",), 1)]


async def test_a_partition_whose_last_batch_is_lost_in_doubt_renumbers_under_a_new_identity(
    cluster: ScriptedCluster,
) -> None:
    async with producer(cluster, request_timeout_ms=200, delivery_timeout_ms=700) as p:
        await p.partitions_for("t")
        cluster.nodes[1].stalling = True
        fut = await p.send("t", b"v")
        with pytest.raises(DeliveryTimeoutError):
            await fut
        cluster.disconnect(1)  # the broker never looked at it: it is not in the log
        cluster.nodes[1].release()
        await p.send_and_wait("t", b"after")
    # The producer cannot know that: rather than guess the broker's next sequence, the
    # partition starts again from 0 under a new identity.
    assert init_calls(cluster) == 2
    log = cluster.partition("t").log
    assert [(a.values, a.producer_id, a.producer_epoch, a.base_sequence) for a in log] == [((b"after",), 1000, 1, 0)]


async def test_never_sent_is_reported_as_not_sent(cluster: ScriptedCluster) -> None:
    async with producer(cluster, request_timeout_ms=200, delivery_timeout_ms=500) as p:
        await p.partitions_for("t")
        cluster.stop(1)  # the broker goes away before anything is sent
        fut = await p.send("t", b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
    assert info.value.possibly_persisted is False and "not sent" in str(info.value)


async def test_internal_error_fails_pending_records_instead_of_hanging(
    cluster: ScriptedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioprod.producer.sender import Sender

    def broken(self: Sender, decisions: object, now: float) -> None:
        raise RuntimeError("bug injected by the test")

    async with producer(cluster) as p:
        await p.send_and_wait("t", b"warm")
        monkeypatch.setattr(Sender, "_apply", broken)
        fut = await p.send("t", b"v")
        with pytest.raises(ProducerFatalError, match="internal error") as info:
            await fut
        assert info.value.possibly_persisted is True  # the broker answered: what it said is lost
        with pytest.raises(ProducerFatalError):
            await p.send("t", b"later")


async def test_sender_task_death_fails_everything(cluster: ScriptedCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from aioprod.producer.sender import Sender

    async with producer(cluster, linger_ms=50) as p:
        await p.partitions_for("t")
        fut = await p.send("t", b"v")

        def broken(self: Sender, now: float) -> float:
            raise RuntimeError("sender bug injected by the test")

        monkeypatch.setattr(Sender, "run_once", broken)
        flushing = asyncio.ensure_future(p.flush())  # wakes the sender
        with pytest.raises(ProducerFatalError, match="sender task died"):
            await fut
        await flushing
        with pytest.raises(ProducerFatalError):
            await p.send("t", b"later")


async def test_a_sender_that_dies_mid_round_fails_the_batches_it_had_drained(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A round drains the batches of every ready broker, then writes one request per broker:
    # those drained but not yet written when it raised (the rest of the request, the other
    # brokers' requests) were neither queued nor in flight, and their records never settled.
    from aioprod.producer.batch import ProducerBatch

    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 1, 2])
    build = ProducerBatch.build

    def broken(self: ProducerBatch, *args: object) -> bytes:
        if self.tp.partition == 0:
            raise ValueError("encoding bug injected by the test")
        return build(self, *args)  # type: ignore[arg-type]

    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=50) as p:
        await p.partitions_for("t")
        await p.end_offsets("t")  # both brokers connected: one round drains for both
        monkeypatch.setattr(ProducerBatch, "build", broken)
        futures = [await p.send("t", b"v", partition=partition) for partition in (0, 1, 2)]
        for future in futures:
            with pytest.raises(ProducerFatalError, match="sender task died"):
                await asyncio.wait_for(future, 10)


async def test_send_many_records_that_could_not_be_queued_fail_in_its_future(cluster: ScriptedCluster) -> None:
    # The broker never answers, so the ~3 records that fit the buffer stay there; the rest
    # cannot be queued within max_block_ms and fail in the group's future, not by raising.
    async with producer(
        cluster, buffer_memory=600, max_block_ms=200, request_timeout_ms=300, delivery_timeout_ms=600
    ) as p:
        await p.partitions_for("t")
        cluster.nodes[1].stalling = True
        future = await p.send_many("t", [b"x" * 100] * 10)
        with pytest.raises(SendManyError) as info:
            await future
    outcomes = info.value.results
    assert len(outcomes) == 10
    queued = [o for o in outcomes if isinstance(o, DeliveryTimeoutError)]
    refused = [o for o in outcomes if isinstance(o, KafkaTimeoutError) and not isinstance(o, DeliveryTimeoutError)]
    assert queued and refused and len(queued) + len(refused) == 10
    assert all(o.possibly_persisted for o in queued)
    assert "buffer_memory" in str(refused[0])


async def test_send_many_takes_a_generator_and_refuses_a_string(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        with pytest.raises(TypeError, match="values must be a sequence of values"):
            await p.send_many("t", "abc")  # type: ignore[arg-type]
        metadata = await (await p.send_many("t", (b"%d" % i for i in range(3))))  # type: ignore[arg-type]
    assert [m.offset for m in metadata] == [0, 1, 2]
    assert cluster.partition("t").values == [b"0", b"1", b"2"]


async def test_a_timed_out_batch_that_expires_waiting_to_retry_is_possibly_persisted(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        request_timeout_ms=200,
        delivery_timeout_ms=700,
        retry_backoff_ms=1000,  # the retry would come after the deadline: the batch expires queued
        retry_backoff_max_ms=1000,
    ) as p:
        await p.partitions_for("t")
        cluster.nodes[1].stalling = True  # the request is written and never answered
        fut = await p.send("t", b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
        cluster.nodes[1].release()

    assert info.value.possibly_persisted is True, str(info.value)
    assert "possibly persisted" in str(info.value)


async def test_a_leader_hint_the_metadata_refuses_does_not_make_a_zero_backoff_loop(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NOT_LEADER_OR_FOLLOWER answer names the new leader (KIP-951) at an epoch newer than the
    # batch's: the retry went at once. But the metadata refused the hint (it remembered an epoch
    # as new, from before a lagging answer put the old leader back), so the batch went straight
    # back to the broker that refused it: hundreds of requests at one instant, for good.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("t", leaders=[2])
    cluster.create_topic("u", leaders=[2])
    cluster.partition("t").epoch = 5  # moved about: led by node 2 at epoch 5
    handle = ScriptedCluster.handle
    produced: list[tuple[float, int]] = []

    async def counting(self: ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        if int.from_bytes(frame[:2], "big") == ProduceRequest.API_KEY:
            produced.append((self.clock(), conn.node.node_id))
            if len(produced) > 300:
                await asyncio.sleep(0.01)  # let virtual time move on: the loop is proven
        return await handle(self, conn, frame)

    monkeypatch.setattr(ScriptedCluster, "handle", counting)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100, max_in_flight_requests_per_connection=1
    ) as p:
        await p.send_and_wait("t", b"learns node 2 at epoch 5")
        # Node 2, the new leader, is slow (acks=all waiting for its followers): its one request
        # in flight is held, so refreshes go to the other brokers, which lag.
        cluster.nodes[2].holding = True
        slow = await p.send("u", b"slow")
        await asyncio.sleep(0.01)
        # Lagging answers reach the producer (as refreshes to a lagging broker would): first it
        # does not know the topic yet, then it has it led by node 1 at epoch 0 (node 3 lags;
        # nodes 1 and 2 are up to date: node 1 answers NOT_LEADER naming node 2 at epoch 5).
        request = MetadataRequest(topics=[MetadataRequestTopic(name="t")])
        unknown = cluster._metadata(cluster.nodes[3], request)
        unknown.topics = [MetadataResponseTopic(3, "t", partitions=[])]
        p._metadata._apply(unknown, 3)
        cluster.nodes[3].stale[("t", 0)] = (1, 0)
        p._metadata._apply(cluster._metadata(cluster.nodes[3], request), 3)
        assert p.cluster().leader_for("t", 0) == 1  # the old leader is back in the snapshot
        before = len(produced)
        started = scripted.clock.now
        record = await p.send("t", b"after the lagging answers")
        await asyncio.sleep(1)
        took = scripted.clock.now - started
        cluster.nodes[3].stale.clear()
        cluster.nodes[2].release()
        await asyncio.gather(slow, record)
    to_old_leader = [at for at, node in produced[before:] if node == 1]
    # Java: the hint is taken (or, not taken, the retry backs off retry_backoff_ms): a request or
    # two to node 1, not hundreds at one instant.
    assert len(to_old_leader) <= 3, (
        f"{len(to_old_leader)} produce requests to the old leader in {took:.3f} s "
        f"({sum(1 for at in to_old_leader if at == to_old_leader[0])} at one instant)"
    )


async def test_a_leader_hint_at_the_newest_epoch_seen_replaces_a_lagging_view(scripted: Scripted) -> None:
    # A lagging broker's answer put the old leader back in the snapshot (epoch 0) after the
    # producer had seen epoch 5; a KIP-951 hint naming epoch 5's leader was refused as no newer
    # than what was known, and the batch kept going to the old leader until a refresh.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("t", leaders=[2])
    cluster.partition("t").epoch = 5
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"learns node 2 at epoch 5")
        request = MetadataRequest(topics=[MetadataRequestTopic(name="t")])
        unknown = cluster._metadata(cluster.nodes[3], request)
        unknown.topics = [MetadataResponseTopic(3, "t", partitions=[])]
        p._metadata._apply(unknown, 3)  # a broker that does not know the topic yet
        cluster.nodes[3].stale[("t", 0)] = (1, 0)
        p._metadata._apply(cluster._metadata(cluster.nodes[3], request), 3)  # then an old view of it
        assert p.cluster().leader_for("t", 0) == 1
        assert p._metadata.update_leader("t", 0, 2, 5, None)
        assert p.cluster().leader_for("t", 0) == 2
        assert not p._metadata.update_leader("t", 0, 1, 5, None)  # the same epoch again: nothing newer
        cluster.nodes[3].stale.clear()


@pytest.fixture
def validating(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake refuses a batch holding a record whose value starts with b"bad" as Kafka's
    LogValidator does (INVALID_RECORD, KIP-467): the batch whole, naming each bad record."""
    produce = ScriptedCluster._produce

    def validated(self: ScriptedCluster, node: Any, request: ProduceRequest, version: int) -> Any:
        bad: dict[tuple[str, int], list[int]] = {}
        for topic in request.topic_data:
            for data in topic.partition_data:
                records = read_batch(data.records).records
                indexes = [i for i, r in enumerate(records) if (r.value or b"").startswith(b"bad")]
                if indexes:
                    bad[(topic.name, data.index)] = indexes
                    node.script.append(InvalidRecordError.code)
        response, hold = produce(self, node, request, version)
        for topic_response in response.responses:
            for part in topic_response.partition_responses:
                for index in bad.get((topic_response.name, part.index), []):
                    part.error_message = "one or more records have been rejected"
                    part.record_errors.append(ProduceResponseBatchIndexError(index, f"record {index} is bad"))
        return response, hold

    monkeypatch.setattr(ScriptedCluster, "_produce", validated)


async def test_only_the_records_the_broker_names_get_its_error(cluster: ScriptedCluster, validating: None) -> None:
    # Every record of the batch failed with the one error: a good record was told it was
    # invalid, and nothing said which one was (Java gives each its own, as here).
    cluster.create_topic("v", 2)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=50) as p:
        await p.partitions_for("v")
        sent = [await p.send("v", v, partition=0) for v in (b"ok-0", b"bad-1", b"ok-2")]
        many = await p.send_many("v", [b"ok-3", b"ok-4", b"bad-5"], partition=1)
        results = await asyncio.gather(*sent, return_exceptions=True)
        with pytest.raises(InvalidBatchError):
            await sent[2]  # raised as awaited, too
        with pytest.raises(SendManyError) as info:
            await many
    results += info.value.results
    kinds = [type(r).__name__ for r in results]
    assert kinds == ["InvalidBatchError", "InvalidRecordError"] + ["InvalidBatchError"] * 3 + ["InvalidRecordError"]
    assert "record 1 is bad" in str(results[1]) and "record 2 is bad" in str(results[5])
    assert "refused its batch for record(s) [1]" in str(results[0])
    assert all(isinstance(r, InvalidBatchError) and not r.possibly_persisted for r in (results[0], results[2]))
    assert cluster.partition("v", 0).values == cluster.partition("v", 1).values == []


def node_2_speaks_produce_v0_to_v2(cluster: ScriptedCluster) -> None:
    """Node 2 answers ApiVersions as Kafka 0.10 does for Produce: no version the client speaks."""
    handle = cluster.handle

    async def answering(conn: Any, frame: bytes) -> Any:
        header, _ = framing.decode_request_header(frame)
        if conn.node.node_id == 2 and header.api_key == ApiVersionsRequest.API_KEY:
            response = cluster._api_versions()
            for key in response.api_keys:
                if key.api_key == ProduceRequest.API_KEY:
                    key.min_version, key.max_version = 0, 2
            return framing.encode_response(response, header.api_version, header.correlation_id)
        return await handle(conn, frame)

    cluster.handle = answering  # type: ignore[method-assign]


async def test_a_broker_sharing_no_produce_version_fails_its_batches_not_the_producer(
    cluster: ScriptedCluster,
) -> None:
    # The version choice raised into the sender's round: every record, those of the other brokers
    # too, failed with ProducerFatalError("the sender task died"), the old broker's as possibly
    # written. As Java, only that broker's batches fail, with UnsupportedVersionError.
    cluster.add_node(2)
    cluster.create_topic("mixed", [1, 2])
    node_2_speaks_produce_v0_to_v2(cluster)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, enable_idempotence=False) as p:
        old = await p.send("mixed", b"to-old", partition=1)
        new = await p.send("mixed", b"to-new", partition=0)
        results = await asyncio.gather(old, new, return_exceptions=True)
        await p.send_and_wait("mixed", b"still-open", partition=0)
    assert isinstance(results[0], UnsupportedVersionError) and not getattr(results[0], "possibly_persisted", False)
    assert results[1].offset == 0  # type: ignore[union-attr]
    assert cluster.partition("mixed", 0).values == [b"to-new", b"still-open"]


async def written_unanswered(cluster: ScriptedCluster, topic: str) -> None:
    """Node 1 writes what was just sent and holds its answer (past a short request timeout)."""
    cluster.nodes[1].holding = True
    while not cluster.partition(topic).values:
        await asyncio.sleep(0.01)  # virtual time


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_retry_refused_for_its_produce_version_says_an_earlier_attempt_may_be_in_the_log(
    scripted: Scripted, idempotent: bool
) -> None:
    # It said nothing: told it was never written, a caller resending it wrote it twice.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1])
    node_2_speaks_produce_v0_to_v2(cluster)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        request_timeout_ms=200,
        delivery_timeout_ms=5000,
        enable_idempotence=idempotent,
    ) as p:
        await p.partitions_for("t")
        fut = await p.send("t", b"v")
        await written_unanswered(cluster, "t")
        cluster.move_leader("t", 0, 2)  # the retry goes to a broker sharing no Produce version
        with pytest.raises(UnsupportedVersionError) as info:
            await fut
        cluster.nodes[1].release()
    assert cluster.partition("t").values == [b"v"]  # the record is in the log
    assert getattr(info.value, "possibly_persisted", False) is True, repr(info.value)


@pytest.mark.parametrize("named", [2, 7])  # of a 2-record batch: one past its last, and further
async def test_record_errors_naming_no_record_of_the_batch_leave_the_brokers_error_to_all(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, named: int
) -> None:
    # Every record was told InvalidBatchError, "not at fault", and may be sent again: the bad one too.
    produce = ScriptedCluster._produce

    def refused(self: ScriptedCluster, node: Any, request: ProduceRequest, version: int) -> Any:
        node.script.append(InvalidRecordError.code)
        response, hold = produce(self, node, request, version)
        for topic in response.responses:
            for part in topic.partition_responses:
                part.record_errors.append(ProduceResponseBatchIndexError(named, f"record {named} is bad"))
        return response, hold

    monkeypatch.setattr(ScriptedCluster, "_produce", refused)
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=50) as p:
        await p.partitions_for("t")
        futures = [await p.send("t", v) for v in (b"a", b"b")]
        results = await asyncio.gather(*futures, return_exceptions=True)
    assert not any(isinstance(r, InvalidBatchError) for r in results), results
    assert all(isinstance(r, InvalidRecordError) for r in results)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_note_on_one_records_error_stays_on_it(scripted: Scripted, idempotent: bool) -> None:
    # Each record's copy of its batch's error shared the batch's notes list: a note one caller
    # added showed up on every other record of the batch.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=20,
        request_timeout_ms=200,
        delivery_timeout_ms=5000,
        enable_idempotence=idempotent,
        retry_backoff_ms=1,
        retry_backoff_max_ms=5,
    ) as p:
        await p.partitions_for("t")
        node.script.extend([Hold, TopicAuthorizationFailedError.code])  # answer lost, then a refusal
        first = await p.send("t", b"a")
        second = await p.send("t", b"b")
        with pytest.raises(TopicAuthorizationFailedError) as one:
            await first
        one.value.add_note("caller of record a: moved to the dead-letter queue")
        with pytest.raises(TopicAuthorizationFailedError) as two:
            await second
        node.release()
    notes = getattr(two.value, "__notes__", [])
    assert any("may be in the log" in n for n in notes)  # the batch's own note
    assert not any("record a" in n for n in notes), notes


async def test_an_innocent_record_of_a_retry_refused_for_others_may_be_in_the_log(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without idempotence the first attempt was written, its answer lost; the retry is refused
    # for record 1 (its timestamp now too old). Record 0 is in the log: its error said "not written".
    produce = ScriptedCluster._produce
    refuse = {"on": False}

    def maybe_refuse(self: ScriptedCluster, node: Any, request: ProduceRequest, version: int) -> Any:
        if refuse["on"]:  # the retry: record 1's timestamp is now too old (message.timestamp.before.max.ms)
            node.script.append(InvalidRecordError.code)
        response, hold = produce(self, node, request, version)
        if refuse["on"]:
            for t in response.responses:
                for part in t.partition_responses:
                    part.record_errors.append(ProduceResponseBatchIndexError(1, "record 1 is too old"))
        return response, hold

    monkeypatch.setattr(ScriptedCluster, "_produce", maybe_refuse)
    cluster = scripted.cluster
    cluster.create_topic("w", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=50,
        request_timeout_ms=200,
        delivery_timeout_ms=5000,
        enable_idempotence=False,
    ) as p:
        await p.partitions_for("w")
        futs = [await p.send("w", v) for v in (b"a", b"b")]
        await written_unanswered(cluster, "w")
        refuse["on"] = True
        cluster.nodes[1].holding = False  # answers the retry
        results = await asyncio.gather(*futs, return_exceptions=True)
        cluster.nodes[1].release()
    assert cluster.partition("w").values == [b"a", b"b"]  # both records are in the log
    first = results[0]
    assert isinstance(first, InvalidBatchError), results
    assert first.possibly_persisted is True
    assert "not written" not in str(first), str(first)
    assert "possibly_persisted" in (InvalidBatchError.__doc__ or "")


async def test_every_record_gets_the_brokers_time_on_a_log_append_time_topic(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A topic with message.timestamp.type=LogAppendTime: the broker stamps the batch, and each
    # record's metadata carries the broker's time, not the producer's, for send() and send_many().
    produce = ScriptedCluster._produce

    def log_append_time_topic(self: ScriptedCluster, node: Any, request: ProduceRequest, version: int) -> Any:
        response, hold = produce(self, node, request, version)
        for topic in response.responses:
            for part in topic.partition_responses:
                part.log_append_time_ms = 1_234
        return response, hold

    monkeypatch.setattr(ScriptedCluster, "_produce", log_append_time_topic)
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        one = await p.send_and_wait("t", b"a")
        many = await (await p.send_many("t", [b"b", b"c"]))
    assert [md.timestamp for md in (one, *many)] == [1_234] * 3

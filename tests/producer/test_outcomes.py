"""What a produce response means per batch: the decision rules alone, no socket, no clock."""

from __future__ import annotations

import asyncio

import pytest

from aioprod.errors import (
    DeliveryTimeoutError,
    InvalidRecordError,
    KafkaConnectionError,
    MessageTooLargeError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
    RecordListTooLargeError,
    RequestTimedOutError,
    UnknownProducerIdError,
)
from aioprod.producer.batch import ProducerBatch, TopicPartition
from aioprod.producer.outcomes import Action, RetryPolicy, decide
from aioprod.protocol import messages as m
from aioprod.protocol.records import RecordBatchBuilder

POLICY = RetryPolicy(retries=10, backoff=0.1, backoff_max=1.0, idempotent=True, delivery_timeout_ms=10_000)


def batch(records: int = 1, partition: int = 0, attempts: int = 1) -> ProducerBatch:
    b = ProducerBatch(TopicPartition("t", partition), RecordBatchBuilder(), 0.0, 10.0, asyncio.get_running_loop())
    for i in range(records):
        b.builder.append(0, None, b"%d" % i)
    b.attempts = attempts
    return b


def answer(
    *parts: m.ProduceResponsePartition, endpoints: list[m.ProduceResponseNodeEndpoint] | None = None
) -> m.ProduceResponse:
    return m.ProduceResponse(
        responses=[m.ProduceResponseTopic("t", list(parts))], throttle_time_ms=0, node_endpoints=endpoints or []
    )


def part(code: int, partition: int = 0, offset: int = -1, **kw: object) -> m.ProduceResponsePartition:
    return m.ProduceResponsePartition(index=partition, error_code=code, base_offset=offset, **kw)  # type: ignore[arg-type]


async def test_acks_0_acknowledges_what_was_written_out() -> None:
    (d,) = decide([batch()], None, 1.0, POLICY)
    assert d.action is Action.ACK and d.base_offset == -1


async def test_success_and_duplicate_acknowledge() -> None:
    b0, b1 = batch(partition=0), batch(partition=1)
    ok, dup = decide([b0, b1], answer(part(0, 0, offset=42), part(46, 1)), 1.0, POLICY)
    assert (ok.action, ok.base_offset) == (Action.ACK, 42)
    assert dup.action is Action.ACK


async def test_an_acknowledgement_whose_offsets_pass_int64_fails_the_batch_as_written() -> None:
    # The records' offsets would overflow int64: the compiled RecordMetadata raised from within
    # the answer's handling, which made the producer fatal over one broken answer.
    last = 2**63 - 1
    fits, passes = batch(records=3, partition=0), batch(records=3, partition=1)
    ok, broken = decide([fits, passes], answer(part(0, 0, offset=last - 2), part(0, 1, offset=last - 1)), 1.0, POLICY)
    assert (ok.action, ok.base_offset) == (Action.ACK, last - 2)
    assert (broken.action, broken.maybe_written) == (Action.FAIL, True)
    assert "past the largest offset" in str(broken.error)


async def test_a_lost_connection_retries_and_the_outcome_is_unknown() -> None:
    (d,) = decide([batch()], KafkaConnectionError("reset"), 1.0, POLICY)
    assert d.action is Action.RETRY and d.maybe_written
    assert 1.0 + 0.08 <= d.retry_at <= 1.0 + 0.12  # retry_backoff_ms, ±20 %


async def test_request_timed_out_at_the_broker_may_have_been_written() -> None:
    (d,) = decide([batch()], answer(part(RequestTimedOutError.code)), 1.0, POLICY)
    assert d.action is Action.RETRY and d.maybe_written and not d.refresh_metadata


@pytest.mark.parametrize("code", [19, 3])  # NOT_ENOUGH_REPLICAS; UNKNOWN_TOPIC_OR_PARTITION (a topic deleted)
async def test_errors_answered_before_the_append_say_the_batch_is_not_written(code: int) -> None:
    # Kafka checks both before it appends (ReplicaManager.appendToLocalLog finds the partition,
    # Partition.appendRecordsToLeader checks the in-sync replicas first).
    (d,) = decide([batch()], answer(part(code)), 1.0, POLICY)
    assert d.action is Action.RETRY and not d.maybe_written
    (last,) = decide([batch()], answer(part(code)), 10.0, POLICY)  # its deadline passed meanwhile
    assert isinstance(last.error, DeliveryTimeoutError) and not last.error.possibly_persisted


async def test_not_leader_asks_for_metadata_and_follows_a_named_leader_without_backoff() -> None:
    b = batch()
    b.leader_epoch = 3
    (plain,) = decide([b], answer(part(NotLeaderOrFollowerError.code)), 1.0, POLICY)
    assert plain.action is Action.RETRY and plain.refresh_metadata and plain.retry_at > 1.0
    # A produce that waited for its replicas while leadership moved is answered so after the
    # append: the batch may be in the log.
    assert plain.maybe_written and plain.leader is None
    hinted = part(NotLeaderOrFollowerError.code, current_leader=m.ProduceResponseLeaderIdAndEpoch(7, 4))
    endpoint = m.ProduceResponseNodeEndpoint(7, "h7", 9097)
    (d,) = decide([b], answer(hinted, endpoints=[endpoint]), 1.0, POLICY)
    assert d.leader is not None and (d.leader.leader, d.leader.epoch) == (7, 4)
    assert d.leader.address is not None and (d.leader.address.host, d.leader.address.port) == ("h7", 9097)
    assert d.retry_at == 1.0  # a newer leader: no backoff (KIP-951)


async def test_too_large_splits_a_batch_of_many_and_fails_a_single_record() -> None:
    for code in (MessageTooLargeError.code, RecordListTooLargeError.code):
        (many,) = decide([batch(records=5)], answer(part(code)), 1.0, POLICY)
        assert many.action is Action.SPLIT
        (one,) = decide([batch(records=1)], answer(part(code)), 1.0, POLICY)
        assert one.action is Action.FAIL and one.error is not None and one.error.code == code  # type: ignore[attr-defined]


async def test_sequence_refusals_are_retried_and_say_the_batch_is_not_in_the_log() -> None:
    (ooo,) = decide([batch()], answer(part(OutOfOrderSequenceNumberError.code)), 1.0, POLICY)
    assert ooo.action is Action.RETRY and ooo.sequence_refused and not ooo.unknown_producer
    (unknown,) = decide([batch()], answer(part(UnknownProducerIdError.code)), 1.0, POLICY)
    assert unknown.sequence_refused and unknown.unknown_producer
    plain = RetryPolicy(10, 0.1, 1.0, idempotent=False, delivery_timeout_ms=10_000)
    (no_idempotence,) = decide([batch()], answer(part(OutOfOrderSequenceNumberError.code)), 1.0, plain)
    assert no_idempotence.action is Action.FAIL


async def test_a_fatal_answer_fails_the_batch() -> None:
    (d,) = decide([batch()], answer(part(InvalidRecordError.code)), 1.0, POLICY)
    assert d.action is Action.FAIL and isinstance(d.error, InvalidRecordError)


async def test_retries_run_out() -> None:
    (d,) = decide([batch(attempts=11)], answer(part(NotLeaderOrFollowerError.code)), 1.0, POLICY)
    assert d.action is Action.FAIL and isinstance(d.error, NotLeaderOrFollowerError)


async def test_past_the_deadline_a_failure_is_a_delivery_timeout() -> None:
    b = batch()
    b.maybe_written = True  # an earlier attempt's answer never came
    (d,) = decide([b], answer(part(NotLeaderOrFollowerError.code)), 10.0, POLICY)
    assert d.action is Action.FAIL and isinstance(d.error, DeliveryTimeoutError)
    assert d.error.possibly_persisted


@pytest.mark.parametrize(
    "answered",
    [answer(part(RequestTimedOutError.code)), KafkaConnectionError("reset")],
    ids=["request_timed_out", "connection_lost"],
)
async def test_a_first_attempt_whose_outcome_is_unknown_at_the_deadline_is_possibly_persisted(
    answered: m.ProduceResponse | KafkaConnectionError,
) -> None:
    # No earlier attempt may be in the log, but this one may: the timeout must say so, not "not sent".
    (d,) = decide([batch()], answered, 10.0, POLICY)
    assert d.action is Action.FAIL and isinstance(d.error, DeliveryTimeoutError)
    assert d.error.possibly_persisted and "possibly persisted" in str(d.error)


async def test_a_partition_missing_from_the_answer_is_retried_as_unknown() -> None:
    b0, b1 = batch(partition=0), batch(partition=1)
    decisions = decide([b0, b1], answer(part(0, 0, offset=1)), 1.0, POLICY)
    assert [d.action for d in decisions] == [Action.ACK, Action.RETRY]
    assert decisions[1].batch is b1 and decisions[1].maybe_written


@pytest.mark.parametrize("attempts", [1, 3, 30])
async def test_backoff_grows_and_stays_within_the_maximum(attempts: int) -> None:
    policy = RetryPolicy(2**31 - 1, 0.1, 1.0, idempotent=True, delivery_timeout_ms=10_000)
    (d,) = decide([batch(attempts=attempts)], answer(part(NotLeaderOrFollowerError.code)), 1.0, policy)
    low = min(1.0, 0.1 * 2 ** (attempts - 1)) * 0.8
    assert 1.0 + low <= d.retry_at <= 1.0 + policy.backoff_max

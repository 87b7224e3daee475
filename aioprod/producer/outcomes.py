"""What a produce response means for each batch it carried: decisions, without I/O.

:func:`decide` reads one response — or the exception its request failed with, or None
for acks=0 — against the batches of the request, and says for each batch: acknowledged,
retry (and when), split (too large for the broker), or failed (and with what error); what
the answer says of the cluster (the leader moved; the broker named the new one, KIP-951);
and what it says of the batch's place in the log (written, certainly not written by this
attempt, or unknown). The sender carries the decisions out. Rules follow the Java
client's ``Sender.completeBatch`` and ``TransactionManager.canRetry``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aioprod.cluster.metadata import Broker
from aioprod.config import ProducerConfig
from aioprod.errors import (
    BrokerResponseError,
    DuplicateSequenceNumberError,
    FencedLeaderEpochError,
    InvalidBatchError,
    KafkaConnectionError,
    KafkaError,
    MessageTooLargeError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
    ProtocolError,
    RecordListTooLargeError,
    UnknownProducerIdError,
    error_for_code,
)
from aioprod.net.pool import exponential_backoff
from aioprod.producer.batch import ProducerBatch
from aioprod.protocol.messages import ProduceResponse, ProduceResponsePartition
from aioprod.protocol.primitives import INT64_MAX
from aioprod.protocol.records import BATCH_HEADER_SIZE

#: Answers a broker gives before it appends the batch: this attempt is certainly not in the
#: log. Any other error may come after the leader appended it (NOT_LEADER_OR_FOLLOWER, for
#: one, answers a produce that waited for its replicas while leadership moved away).
_NOT_WRITTEN = frozenset(
    {
        2,  # CORRUPT_MESSAGE
        3,  # UNKNOWN_TOPIC_OR_PARTITION
        5,  # LEADER_NOT_AVAILABLE
        10,  # MESSAGE_TOO_LARGE
        18,  # RECORD_LIST_TOO_LARGE
        19,  # NOT_ENOUGH_REPLICAS (checked before the append; ..._AFTER_APPEND is not)
        21,  # INVALID_REQUIRED_ACKS
        29,  # TOPIC_AUTHORIZATION_FAILED
        32,  # INVALID_TIMESTAMP
        43,  # UNSUPPORTED_FOR_MESSAGE_FORMAT
        45,  # OUT_OF_ORDER_SEQUENCE_NUMBER
        47,  # INVALID_PRODUCER_EPOCH
        48,  # INVALID_TXN_STATE
        53,  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        59,  # UNKNOWN_PRODUCER_ID
        76,  # UNSUPPORTED_COMPRESSION_TYPE
        87,  # INVALID_RECORD
        90,  # PRODUCER_FENCED
        120,  # TRANSACTION_ABORTABLE
    }
)
_TOO_LARGE = frozenset({MessageTooLargeError.code, RecordListTooLargeError.code})
_LEADER_HINTS = frozenset({NotLeaderOrFollowerError.code, FencedLeaderEpochError.code})
_SEQUENCE_CHECKED = frozenset({OutOfOrderSequenceNumberError.code, UnknownProducerIdError.code})


class Action(enum.Enum):
    ACK = "ack"
    RETRY = "retry"
    SPLIT = "split"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class LeaderHint:
    """The partition's current leader, as the old leader's answer named it (KIP-951)."""

    leader: int
    epoch: int
    address: Broker | None


@dataclass(slots=True)
class Decision:
    batch: ProducerBatch
    action: Action
    error: KafkaError | None = None
    base_offset: int = -1
    log_append_time: int = -1
    #: When a retry may go (loop time).
    retry_at: float = 0.0
    #: This attempt's outcome in the log is unknown (the batch may have been written).
    maybe_written: bool = False
    #: The broker checked the batch's sequence and refused it (so it is not in the log):
    #: OUT_OF_ORDER_SEQUENCE_NUMBER, or UNKNOWN_PRODUCER_ID when ``unknown_producer``.
    sequence_refused: bool = False
    unknown_producer: bool = False
    #: The answer says the client's metadata is stale.
    refresh_metadata: bool = False
    leader: LeaderHint | None = None
    #: A refusal naming the records at fault (KIP-467): offset delta -> that record's error.
    record_errors: dict[int, KafkaError] | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retries: int
    backoff: float
    backoff_max: float
    idempotent: bool
    delivery_timeout_ms: int

    def backoff_after(self, attempts: int) -> float:
        """Seconds to wait before the next try, after ``attempts`` (KIP-580: exponential, jittered)."""
        return exponential_backoff(self.backoff, self.backoff_max, attempts)

    @classmethod
    def of(cls, config: ProducerConfig) -> RetryPolicy:
        return cls(
            config.retries,
            config.retry_backoff_ms / 1000,
            config.retry_backoff_max_ms / 1000,
            config.enable_idempotence,
            config.delivery_timeout_ms,
        )


def decide(
    batches: list[ProducerBatch], answer: ProduceResponse | BaseException | None, now: float, policy: RetryPolicy
) -> list[Decision]:
    """One decision per batch of the request ``answer`` belongs to."""
    if answer is None:  # acks=0: no answer comes; the request was written out
        return [Decision(batch, Action.ACK) for batch in batches]
    if isinstance(answer, BaseException):
        error = answer if isinstance(answer, KafkaError) else _wrap(answer)
        return [_retry_or_fail(batch, error, now, policy, maybe_written=True) for batch in batches]
    addresses = {e.node_id: Broker(e.node_id, e.host, e.port, e.rack) for e in answer.node_endpoints}
    by_tp = {(batch.tp.topic, batch.tp.partition): batch for batch in batches}
    answered: dict[tuple[str, int], list[ProduceResponsePartition]] = {}
    for topic in answer.responses:
        for part in topic.partition_responses:
            key = (topic.name, part.index)
            if key in by_tp:
                answered.setdefault(key, []).append(part)
    decisions = []
    for key, batch in by_tp.items():
        parts = answered.get(key)
        if parts is not None and len(parts) == 1:
            decisions.append(_partition(batch, parts[0], addresses, now, policy))
            continue
        # No result for a partition that was sent, or two: a broken answer, after which the batch
        # may be in the log. Java completes only what the answer names (the rest expire in
        # flight): a retry without idempotence writes it again, each time the answer is broken.
        where = f"{batch.tp.topic}-{batch.tp.partition}"
        broken = ProtocolError(
            (
                f"the broker's answer had no result for {where}"
                if parts is None
                else f"the broker's answer named {where} {len(parts)} times"
            )
            + " (the batch may have been written)"
        )
        decisions.append(_retry_or_fail(batch, broken, now, policy, maybe_written=True, retriable=policy.idempotent))
    return decisions


def _partition(
    batch: ProducerBatch,
    part: ProduceResponsePartition,
    addresses: dict[int, Broker],
    now: float,
    policy: RetryPolicy,
) -> Decision:
    code = part.error_code
    if code == 0 or code == DuplicateSequenceNumberError.code:
        if part.base_offset > INT64_MAX - (batch.record_count - 1):
            # Its records' offsets would pass the largest there is: a broken answer. Written,
            # say the broker; so failed as possibly written, not retried.
            impossible = ProtocolError(
                f"{batch.tp.topic}-{batch.tp.partition}: the broker acknowledged {batch.record_count} record(s) "
                f"at base offset {part.base_offset}, past the largest offset for the last of them"
            )
            return Decision(batch, Action.FAIL, impossible, maybe_written=True)
        return Decision(batch, Action.ACK, base_offset=part.base_offset, log_append_time=part.log_append_time_ms)
    if code in _TOO_LARGE:
        if batch.record_count > 1:
            return Decision(batch, Action.SPLIT, error_for_code(code, part.error_message), retry_at=now)
        error = _record_too_large(batch, code, part.error_message)
    else:
        error = error_for_code(code, part.error_message)
    leader = None
    current = part.current_leader
    if code in _LEADER_HINTS and current.leader_id >= 0 and current.leader_epoch >= 0:
        leader = LeaderHint(current.leader_id, current.leader_epoch, addresses.get(current.leader_id))
    if policy.idempotent and code in _SEQUENCE_CHECKED:
        # Retried whatever the error's class says: the sender resolves the sequence first.
        decision = _retry_or_fail(batch, error, now, policy, maybe_written=False, retriable=True)
        decision.sequence_refused = True
        decision.unknown_producer = code == UnknownProducerIdError.code
        return decision
    decision = _retry_or_fail(batch, error, now, policy, maybe_written=code not in _NOT_WRITTEN, leader=leader)
    decision.refresh_metadata = error.invalid_metadata
    if part.record_errors and decision.action is Action.FAIL and decision.error is error:  # (not expired)
        decision.record_errors = _record_errors(batch, part, error) or None
    return decision


def _record_too_large(batch: ProducerBatch, code: int, said: str | None) -> BrokerResponseError:
    """The broker's refusal of a batch of one record, saying which record and how large, and
    the limit it passed (the broker does not say what the limit is): the batch cannot be split."""
    where = f"{batch.tp.topic}-{batch.tp.partition}"
    record = batch.builder.size_in_bytes - BATCH_HEADER_SIZE
    sent = f"a batch of {batch.size} bytes" + (" compressed" if batch.size < batch.builder.size_in_bytes else "")
    limit = (
        "the broker's message.max.bytes, or the topic's max.message.bytes"
        if code == MessageTooLargeError.code
        else "the topic's segment.bytes"
    )
    text = f"{where}: a record of {record} bytes ({sent}) is larger than the broker accepts ({limit})"
    return error_for_code(code, f"{text} (the broker said: {said})" if said else text)


def _record_errors(batch: ProducerBatch, part: ProduceResponsePartition, error: KafkaError) -> dict[int, KafkaError]:
    """Each record's error when the broker named the invalid ones (as Java's failBatch): the
    named records get the broker's error with their own message; the others were refused
    only for sharing a batch with them."""
    code = part.error_code
    named = {
        e.batch_index: error_for_code(code, e.batch_index_error_message or part.error_message)
        for e in part.record_errors
        if 0 <= e.batch_index < batch.record_count
    }
    if not named:  # no record of this batch named: nothing says which records are innocent
        return {}
    where = f"{batch.tp.topic}-{batch.tp.partition}"
    innocent = InvalidBatchError(
        f"{where}: the broker refused its batch for record(s) {sorted(named)} of it ({error}); "
        "this one was not at fault"
    )
    innocent.__cause__ = error
    return {index: named.get(index, innocent) for index in range(batch.record_count)}


def _retry_or_fail(
    batch: ProducerBatch,
    error: KafkaError,
    now: float,
    policy: RetryPolicy,
    *,
    maybe_written: bool,
    retriable: bool | None = None,
    leader: LeaderHint | None = None,
) -> Decision:
    # The batch may retry while its deadline has not passed; a retry that cannot happen
    # in time waits in the queue and expires there, at its deadline, like any other.
    if (
        (error.retriable if retriable is None else retriable)
        and batch.attempts <= policy.retries
        and now < batch.deadline
    ):
        if leader is not None and leader.epoch > batch.leader_epoch:
            backoff = 0.0  # the broker named a newer leader: go there now (KIP-951)
        else:
            backoff = policy.backoff_after(batch.attempts)
        return Decision(batch, Action.RETRY, error, retry_at=now + backoff, maybe_written=maybe_written, leader=leader)
    if now >= batch.deadline:
        if not maybe_written:
            batch.last_refusal = error  # this attempt's refusal: the expiry says it
        error = batch.expiry_error(now, policy.delivery_timeout_ms, batch.maybe_written or maybe_written)
    return Decision(batch, Action.FAIL, error, maybe_written=maybe_written, leader=leader)


def _wrap(error: BaseException) -> KafkaError:
    wrapped = KafkaConnectionError(f"request failed: {error!r}")
    wrapped.__cause__ = error
    return wrapped

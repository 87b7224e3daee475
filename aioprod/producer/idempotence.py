"""Producer identity and per-partition sequence numbers (KIP-98 idempotence).

A sequence is assigned when a batch is first drained and kept on every retry, so the
broker can drop a batch it already wrote (DUPLICATE_SEQUENCE_NUMBER) and refuse a gap
(OUT_OF_ORDER_SEQUENCE_NUMBER). When the broker no longer knows the producer
(UNKNOWN_PRODUCER_ID, e.g. after it lost its state), the producer waits for its
in-flight requests to come back, takes a new identity and numbers its batches again from
zero (KIP-360). Only the sender task touches this state.
"""

from __future__ import annotations

from aioprod.producer.batch import ProducerBatch, TopicPartition

SEQUENCE_MODULUS = 1 << 31
#: The broker keeps the last five batches per producer and partition for deduplication,
#: which is why at most five may be in flight per partition.
MAX_IN_FLIGHT_PER_PARTITION = 5


class IdempotenceState:
    def __init__(self) -> None:
        self.producer_id = -1
        self.producer_epoch = -1
        #: Set when the broker forgot this producer: no new sends until a new identity.
        self.needs_reset = False
        #: How many times the identity was replaced after the broker forgot it (a statistic).
        self.resets = 0
        self._next_sequence: dict[TopicPartition, int] = {}
        self._in_flight: dict[TopicPartition, list[ProducerBatch]] = {}

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0 and not self.needs_reset

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """A new identity: every partition's sequence starts again at zero."""
        if self.needs_reset:
            self.resets += 1
        self.producer_id, self.producer_epoch = producer_id, epoch
        self.needs_reset = False
        self._next_sequence.clear()

    def owns_sequence(self, batch: ProducerBatch) -> bool:
        """The batch already carries a sequence under the current identity."""
        return (
            batch.base_sequence >= 0
            and batch.producer_id == self.producer_id
            and batch.producer_epoch == self.producer_epoch
        )

    def can_send(self, batch: ProducerBatch) -> bool:
        in_flight = self._in_flight.get(batch.tp)
        if not in_flight:
            return True
        if self.owns_sequence(batch):
            # A retry goes out only once everything before it has come back, so the
            # broker sees the partition's sequences in order.
            return False
        return len(in_flight) < MAX_IN_FLIGHT_PER_PARTITION

    def assign(self, batch: ProducerBatch) -> int:
        """The batch's base sequence: kept across retries, fresh after an identity change."""
        if self.owns_sequence(batch):
            return batch.base_sequence
        sequence = self._next_sequence.get(batch.tp, 0)
        self._next_sequence[batch.tp] = (sequence + batch.record_count) % SEQUENCE_MODULUS
        return sequence

    def explains_gap(self, batch: ProducerBatch) -> bool:
        """An earlier batch of the partition is unacknowledged, so an out-of-order answer
        for ``batch`` only means it was sent ahead of a retry."""
        return any(
            other is not batch and sequence_before(other.base_sequence, batch.base_sequence)
            for other in self._in_flight.get(batch.tp, ())
        )

    def sent(self, batch: ProducerBatch) -> None:
        self._in_flight.setdefault(batch.tp, []).append(batch)

    def returned(self, batch: ProducerBatch) -> None:
        in_flight = self._in_flight.get(batch.tp)
        if in_flight and batch in in_flight:
            in_flight.remove(batch)

    @property
    def any_in_flight(self) -> bool:
        return any(self._in_flight.values())


def sequence_before(a: int, b: int) -> bool:
    """Sequence ``a`` comes before ``b``, allowing for the wrap at 2**31."""
    return a != b and ((b - a) % SEQUENCE_MODULUS) < (SEQUENCE_MODULUS // 2)

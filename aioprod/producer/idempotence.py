"""Producer identity and per-partition sequence numbers (KIP-98 idempotence, KIP-360 recovery).

A batch is *stamped* (producer id, epoch, base sequence) when it is first sent, and keeps
its stamp on every retry, whatever identity the producer has meanwhile: that is what lets
the broker recognise a batch it already wrote (among the last five it holds: a batch
refused after later sequences were acknowledged is not sent again, see ``overtaken``). A
stamp is dropped only for a batch the broker refused for a sequence gap nothing of ours
explains (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID), and the stamp cannot work any
more. Such batches wait behind those that keep their stamps (the accumulator's ``reenqueue``):
a batch whose answer never came may be in the log even so, since a broker without state for
the producer takes a batch at any sequence (KIP-360), and only its own stamp lets the broker
say so. Once it is resolved, the refused batches are renumbered.

Each partition numbers its batches under its own identity: the producer's identity when
the partition last started from sequence 0 (Java's ``TxnPartitionMap``). When a
partition's sequence state is in doubt (a stamped batch failed for good, or the broker
lost the producer), the partition takes no new batches until every batch of it that may
be in the log is resolved by the broker. If the broker then has every sequence we gave
out, the doubt is gone; otherwise the producer takes a new identity (InitProducerId with
its current id and epoch, KIP-360) and the partition starts again from 0 under it. Other
partitions keep their stamps and move to the new identity the next time nothing of theirs
is outstanding. Only the sender task touches this state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from itertools import chain

from aioprod.producer.batch import ProducerBatch, TopicPartition

SEQUENCE_MODULUS = 1 << 31
#: The broker keeps the last five batches per producer and partition for deduplication,
#: which is why at most five may be in flight per partition.
MAX_IN_FLIGHT_PER_PARTITION = 5

#: (producer id, epoch, generation): the generation counts identities taken, so one handed
#: out twice (a restarted broker that lost its state gives the same id again) is still new.
Identity = tuple[int, int, int]


class PartitionSequences:
    """One partition's sequence state (Java's TxnPartitionEntry)."""

    __slots__ = ("acked_next", "failed_written", "identity", "in_doubt", "next_sequence", "on_wire")

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.next_sequence = 0
        #: The sequence after the last one the broker acknowledged.
        self.acked_next = 0
        #: Stamped batches sent and not answered yet, in send order.
        self.on_wire: list[ProducerBatch] = []
        self.in_doubt = False
        #: The stamps (producer id, epoch, base sequence) of batches that failed for good and
        #: may be in the log: a batch of their identity with an earlier sequence, refused after
        #: they failed, would land behind them if renumbered (see ``behind_failed``).
        self.failed_written: list[tuple[int, int, int]] = []

    def restart(self, identity: Identity, queue: deque[ProducerBatch]) -> None:
        """Number from 0 under ``identity``; queued batches lose their stamps (only refused
        ones are stamped at the head of a queue whose partition restarts: none is in the log)."""
        for batch in queue:
            if not batch.stamped:
                break
            if batch.maybe_written:  # (renumbered after a cluster change: the old cluster's log)
                batch.lost_attempt = True
            batch.unstamp()
        self.identity = identity
        self.next_sequence = self.acked_next = 0
        self.in_doubt = False
        self.failed_written.clear()  # no batch of an earlier identity is left to renumber


class IdempotenceState:
    def __init__(self) -> None:
        self.producer_id = -1
        self.producer_epoch = -1
        self._generation = 0
        #: A partition needs sequences under a new identity: ask for one (InitProducerId).
        self.new_identity_needed = False
        self._partitions: dict[TopicPartition, PartitionSequences] = {}

    @property
    def identity(self) -> Identity:
        return self.producer_id, self.producer_epoch, self._generation

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def needs_producer_id(self) -> bool:
        return self.producer_id < 0 or self.new_identity_needed

    @property
    def in_doubt(self) -> bool:
        """Some partition's sequence state is in doubt (or already needs a new identity)."""
        return self.new_identity_needed or any(entry.in_doubt for entry in self._partitions.values())

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._generation += 1
        self.new_identity_needed = False

    def partition(self, tp: TopicPartition) -> PartitionSequences:
        entry = self._partitions.get(tp)
        if entry is None:
            entry = self._partitions[tp] = PartitionSequences(self.identity)
        return entry

    def can_send(self, batch: ProducerBatch, queue: deque[ProducerBatch]) -> bool:
        """May ``batch`` (the head of its partition's ``queue``) be sent now?

        May move the partition to the current identity, or ask for a new one, on the way.
        """
        if self.producer_id < 0:
            return False
        entry = self.partition(batch.tp)
        if batch.stamped and not batch.needs_new_sequence:
            # A retry, under its own stamp: alone, so the broker sees sequences in order.
            return not entry.on_wire
        stale = entry.identity != self.identity
        if batch.stamped or entry.in_doubt or stale:
            # The partition (re)starts its sequences first: once nothing of it is unanswered.
            if entry.on_wire:
                return False
            if stale:
                entry.restart(self.identity, queue)
            elif batch.stamped or entry.acked_next != entry.next_sequence:
                self.new_identity_needed = True  # the broker's next sequence is not ours
                return False
            else:
                entry.in_doubt = False  # the broker acknowledged every sequence we gave out
                entry.failed_written.clear()
        return len(entry.on_wire) < MAX_IN_FLIGHT_PER_PARTITION

    def forget(self, topics: Collection[str], busy: Callable[[TopicPartition], bool]) -> None:
        """Drop the entries of ``topics`` (no longer used) that a new entry would replace as
        well: nothing of the partition unanswered, queued (``busy``) or in doubt, and no sequence
        given out under the current identity (a transaction version 2 producer takes a new epoch
        per transaction). An entry the broker knows at a later sequence under the current
        identity stays, as Java's and librdkafka's keep theirs: the partition may be used again,
        and starting it from 0 would need a new identity."""
        names = set(topics)
        for tp in [tp for tp in self._partitions if tp.topic in names]:
            entry = self._partitions[tp]
            if entry.on_wire or entry.in_doubt or busy(tp):
                continue
            if entry.identity == self.identity and entry.next_sequence:
                continue
            del self._partitions[tp]

    def stamp(self, batch: ProducerBatch) -> tuple[int, int, int]:
        """The batch's (producer id, epoch, base sequence): its own, or the next ones."""
        if batch.stamped:
            return batch.producer_id, batch.producer_epoch, batch.base_sequence
        entry = self.partition(batch.tp)
        sequence = entry.next_sequence
        entry.next_sequence = (sequence + batch.record_count) % SEQUENCE_MODULUS
        return entry.identity[0], entry.identity[1], sequence

    def sent(self, batch: ProducerBatch) -> None:
        self.partition(batch.tp).on_wire.append(batch)

    def returned(self, batch: ProducerBatch) -> None:
        on_wire = self.partition(batch.tp).on_wire
        if batch in on_wire:
            on_wire.remove(batch)

    def overtaken(self, batch: ProducerBatch) -> bool:
        """The broker acknowledged later sequences of ``batch``'s identity than its own. A
        broker recognises a repeat only among the last five batches it holds: past them, a
        written batch retried is answered OUT_OF_ORDER_SEQUENCE_NUMBER, as one never written
        is. Whether it is in the log its answer cannot tell (a broker without state for the
        producer may have taken the later ones without it), so it is neither renumbered,
        which would write it twice, nor taken as acknowledged."""
        entry = self._partitions.get(batch.tp)
        if entry is None:
            return False
        end = _end_under(entry, batch)
        return end is not None and not sequence_before(entry.acked_next, end)

    def acked(self, batch: ProducerBatch) -> None:
        entry = self.partition(batch.tp)
        end = _end_under(entry, batch)
        if end is not None and not sequence_before(end, entry.acked_next):
            entry.acked_next = end

    def failed(self, batch: ProducerBatch) -> None:
        """A stamped batch's records failed for good: the broker may or may not hold that
        sequence, so the partition's next expected sequence is unknown until resolved."""
        if batch.stamped:
            entry = self.partition(batch.tp)
            entry.in_doubt = True
            if batch.stamp_maybe_written:
                entry.failed_written.append((batch.producer_id, batch.producer_epoch, batch.base_sequence))

    def behind_failed(self, batch: ProducerBatch) -> bool:
        """A later batch of ``batch``'s identity failed for good and may be in the log (a broker
        without state for the producer takes any sequence, KIP-360): ``batch``, refused, would
        land behind it if renumbered."""
        entry = self._partitions.get(batch.tp)
        return entry is not None and any(
            (batch.producer_id, batch.producer_epoch) == (producer_id, epoch)
            and sequence_before(batch.base_sequence, sequence)
            for producer_id, epoch, sequence in entry.failed_written
        )

    def rejected_sequence(self, batch: ProducerBatch, gap: bool, lost_state: bool = False) -> None:
        """The broker checked the batch's sequence and did not write it (so no attempt of it
        is in the log, unless ``lost_state``: a broker without state for the producer cannot
        tell, and an attempt may be in the log it lost that state with). ``gap``: nothing
        earlier of ours explains the refusal — the broker lost the producer, or an earlier
        batch is missing for good — so the partition must start again under a new identity;
        otherwise the batch is retried in order."""
        if lost_state and batch.maybe_written:
            batch.lost_attempt = True
        batch.maybe_written = False
        if gap:
            batch.needs_new_sequence = True
            self.partition(batch.tp).in_doubt = True

    def split(self, batch: ProducerBatch) -> None:
        """A batch refused as too large is replaced by parts that inherit its sequences."""
        self.returned(batch)

    def earlier_on_wire(self, batch: ProducerBatch) -> bool:
        """A batch of the same partition and identity with an earlier sequence is unanswered."""
        return any(earlier_under(other, batch) for other in self.partition(batch.tp).on_wire)

    def written_later(self, batch: ProducerBatch, queue: deque[ProducerBatch]) -> bool:
        """A later batch of ``batch``'s identity may be in the log: it is on the wire, or an
        answer of it never came. A broker without state for the producer takes a batch at any
        sequence (KIP-360), and then refuses the earlier ones as out of order, even sequence 0."""
        return any(
            earlier_under(batch, other)
            for other in chain(self.partition(batch.tp).on_wire, (q for q in queue if q.maybe_written))
        )


def _end_under(entry: PartitionSequences, batch: ProducerBatch) -> int | None:
    """The sequence after ``batch``'s last, if it is stamped under the partition's identity."""
    if not batch.stamped or (batch.producer_id, batch.producer_epoch) != entry.identity[:2]:
        return None
    return (batch.base_sequence + batch.record_count) % SEQUENCE_MODULUS


def earlier_under(batch: ProducerBatch, other: ProducerBatch) -> bool:
    """``batch`` is stamped under ``other``'s identity, with an earlier sequence."""
    return (batch.producer_id, batch.producer_epoch) == (other.producer_id, other.producer_epoch) and sequence_before(
        batch.base_sequence, other.base_sequence
    )


def sequence_before(a: int, b: int) -> bool:
    """Sequence ``a`` comes before ``b``, allowing for the wrap at 2**31."""
    return a != b and ((b - a) % SEQUENCE_MODULUS) < (SEQUENCE_MODULUS // 2)

"""The record accumulator: per-partition queues of batches and the memory budget.

Appends happen in the caller's task; ``ready``/``drain``/``expired`` are called only by the
sender task. Time is passed in, so tests drive it without sleeping.

Only partitions that hold batches are kept, in the order the sender should next look at
them: a partition drained goes to the back, so a drain resumes where the last one stopped
and every partition is served within (partitions with data / batches per request) rounds.
The sender's per-round cost follows the partitions with data, never all partitions.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from aioprod.cluster.metadata import ClusterSnapshot
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaError, KafkaTimeoutError, RecordTooLargeError, TransactionAbortedError
from aioprod.metrics import ProducerMetrics
from aioprod.producer.batch import Headers, ProducerBatch, SendGroup, TopicPartition
from aioprod.producer.idempotence import earlier_under, sequence_before
from aioprod.producer.record_future import BatchFailure, RecordFuture
from aioprod.protocol.records import BATCH_HEADER_SIZE, Codec, RecordBatchBuilder, resolve_codec


class Readiness(NamedTuple):
    """One sender round's view of the queues (``RecordAccumulator.ready``)."""

    #: Leaders with a batch that may be sent now.
    nodes: set[int]
    #: Seconds until a batch not sendable now may become so.
    next_check: float
    #: Topics with a batch for a partition of no known leader (a topic dropped from the
    #: refreshes after metadata_max_idle_ms among them: describing it again finds its leader).
    unknown_leader: set[str]
    #: (partition, its queue, its leader) of every sendable head batch, in drain order.
    sendable: list[tuple[TopicPartition, deque[ProducerBatch], int]]
    #: The partitions of no known leader (in ``unknown_leader``'s topics): the sender looks at
    #: them alone for records no leader will take, not at every partition with data.
    leaderless: list[TopicPartition]


_UNKNOWN: Any = object()
#: A wait this short is no wait. ``created + linger - now`` is a difference of rounded
#: floats: on uvloop, whose clock counts milliseconds, a linger (or a delivery deadline)
#: that has passed can come out as 1e-12 s to go, and sleeping that long made a round per
#: loop iteration until the clock ticked (thousands of empty rounds a second).
_DUE = 1e-6
#: Java's CompressionRatioEstimator: the margin on the estimate, and how far one batch moves it
#: (a worse ratio at once, a better one slowly).
_RATIO_MARGIN = 1.05
_RATIO_WORSE_STEP = 0.05
_RATIO_BETTER_STEP = 0.005


def _whole_ms(now: float) -> float:
    """``now`` down to its millisecond: a batch's age, linger and delivery timeout count
    whole milliseconds, as the Java producer's clock and uvloop's do. On asyncio's exact
    clock a linger otherwise ended 0.3 ms (p50) late on average, since its selector rounds
    a sleep up to the next millisecond. (The 1e-6 keeps uvloop's k/1000 at k.)"""
    return math.floor(now * 1000.0 + 1e-6) / 1000.0


def _resent_before(queued: ProducerBatch, batch: ProducerBatch) -> bool:
    """Does the stamped ``queued`` go before the stamped ``batch`` coming back for a retry?"""
    if queued.needs_new_sequence != batch.needs_new_sequence:
        return batch.needs_new_sequence
    return sequence_before(queued.base_sequence, batch.base_sequence)


# Per-record bytes beyond key/value/headers: the record's framing on the wire (at most
# ~26 bytes) plus the Python objects that hold it while queued (future, list slots).
RECORD_OVERHEAD = 64


class BufferPool:
    """``buffer_memory`` as a byte budget with FIFO waiters."""

    def __init__(
        self, total: int, metrics: ProducerMetrics | None = None, on_exhausted: Callable[[], None] | None = None
    ) -> None:
        self.total = total
        self.used = 0
        self._metrics = metrics
        #: Called when a reservation starts to wait: queued batches are then sendable at once
        #: (RecordAccumulator._forced), and only the sender sending them frees space.
        self._on_exhausted = on_exhausted
        self._waiters: deque[tuple[int, asyncio.Future[bool]]] = deque()
        #: Set by ``close``: what a reservation that can no longer be granted raises.
        self._closed: Callable[[], BaseException] | None = None

    @property
    def exhausted(self) -> bool:
        return bool(self._waiters)

    @property
    def waiting(self) -> int:
        """Reservations waiting for space now."""
        return len(self._waiters)

    @property
    def available(self) -> bool:
        """Space may be taken without waiting (no one is queued ahead)."""
        return not self._waiters

    def try_reserve(self, size: int) -> bool:
        if not self._waiters and self.used + size <= self.total:
            self.used += size
            return True
        return False

    def close(self, error: Callable[[], BaseException]) -> None:
        """The producer is closing: no waiting reservation will be of use (as Java's
        BufferPool.close, "Producer closed while allocating memory"). Each waiter, and each
        reservation that would wait from now on, raises ``error()`` at once."""
        self._closed = error
        waiters, self._waiters = self._waiters, deque()
        for _, future in waiters:
            if not future.done():
                future.set_result(False)

    async def reserve(self, size: int, timeout: float) -> None:
        """Wait, behind earlier waiters, until ``size`` bytes are free."""
        if self.try_reserve(size):
            return
        if self._closed is not None:
            raise self._closed()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        entry = (size, future)
        self._waiters.append(entry)
        if len(self._waiters) == 1 and self._on_exhausted is not None:
            self._on_exhausted()
        started = loop.time()
        try:
            async with asyncio.timeout(timeout):
                granted = await future
        except TimeoutError:
            if future.done() and not future.cancelled() and future.result():
                return  # granted in the very iteration the timeout fired: the space is ours
            if self._metrics is not None:
                self._metrics.record_buffer_exhausted(loop.time())
            raise KafkaTimeoutError(
                f"buffer_memory ({self.total} bytes) stayed full for max_block_ms (waited "
                f"{(loop.time() - started) * 1000:.0f} ms for memory); {self.used} bytes are queued"
            ) from None
        except BaseException:
            if future.done() and not future.cancelled() and future.result():
                self.release(size)  # granted just as we were cancelled
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
                self._grant()
            if self._metrics is not None:
                now = loop.time()
                self._metrics.record_buffer_wait(now - started, now)
        if not granted:
            assert self._closed is not None
            raise self._closed()

    def release(self, size: int) -> None:
        self.used -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            size, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if self.used + size > self.total:
                return
            self.used += size
            self._waiters.popleft()
            future.set_result(True)


class _Deadlines:
    """Unfinished batches by delivery deadline.

    New batches come in deadline order (each is its creation time plus the one delivery
    timeout), so they queue in a deque: constant time to add and to take, where a heap cost a
    tuple and two logarithmic sifts per batch. A batch that comes out of order (a split part
    keeps its original's deadline) goes to a heap beside it. Finished batches are dropped when
    they reach the front.
    """

    __slots__ = ("_in_order", "_out_of_order", "_tiebreak")

    def __init__(self) -> None:
        self._in_order: deque[ProducerBatch] = deque()
        self._out_of_order: list[tuple[float, int, ProducerBatch]] = []
        self._tiebreak = itertools.count()

    def add(self, batch: ProducerBatch) -> None:
        in_order = self._in_order
        if not in_order or in_order[-1].deadline <= batch.deadline:
            in_order.append(batch)
        else:
            heapq.heappush(self._out_of_order, (batch.deadline, next(self._tiebreak), batch))

    def earliest(self, live: set[ProducerBatch]) -> ProducerBatch | None:
        """The unfinished batch with the earliest deadline (finished ones ahead of it go)."""
        in_order, heap = self._in_order, self._out_of_order
        while in_order and in_order[0] not in live:
            in_order.popleft()
        while heap and heap[0][2] not in live:
            heapq.heappop(heap)
        if not heap:
            return in_order[0] if in_order else None
        if in_order and in_order[0].deadline <= heap[0][0]:
            return in_order[0]
        return heap[0][2]

    def compact(self, live: set[ProducerBatch]) -> None:
        """Drop finished batches once they outnumber the unfinished ones: behind one batch that
        stays unfinished (a partition without a leader, waiting out its delivery timeout)
        every later batch, acknowledged or not, was held with its payload until it finished.
        Linear, but only once the queue doubled: amortized constant per batch."""
        if len(self._in_order) + len(self._out_of_order) <= 2 * len(live) + 16:
            return
        self._in_order = deque(batch for batch in self._in_order if batch in live)
        self._out_of_order = [entry for entry in self._out_of_order if entry[2] in live]
        heapq.heapify(self._out_of_order)

    def remove_earliest(self, batch: ProducerBatch) -> None:
        """Take ``batch``, which ``earliest`` just returned."""
        if self._in_order and self._in_order[0] is batch:
            self._in_order.popleft()
        else:
            heapq.heappop(self._out_of_order)


class RecordAccumulator:
    def __init__(
        self, config: ProducerConfig, wakeup: Callable[[], None], metrics: ProducerMetrics | None = None
    ) -> None:
        self._config = config
        self._wakeup = wakeup
        self._loop = asyncio.get_running_loop()
        self._metrics = metrics if metrics is not None else ProducerMetrics(config)
        #: Non-empty queues only, in drain order (see the module docstring). Never rebound:
        #: the compiled send lane (Producer._open_lane) holds this dict, as it does ``on_wire``
        #: and ``blocked``.
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        #: Queues emptied by ``drain``, for the next partition that gets a batch. Over many
        #: partitions most queues empty at every drain; a new deque each time was promoted to
        #: the collector's oldest generation with its batch, one more object per batch there.
        self._spare_queues: list[deque[ProducerBatch]] = []
        self.pool = BufferPool(config.buffer_memory, self._metrics, wakeup)
        self._codec = resolve_codec(config.compression_type)
        #: A codec is set: batches are filled by their estimated compressed size (see ``_ratios``),
        #: which the sender tells ``compressed`` and the partitioner asks ``fill_size``.
        self.compressing = self._codec is not Codec.NONE
        #: Each topic's compression ratio (compressed / uncompressed bytes), estimated as Java's
        #: CompressionRatioEstimator does: with a codec, a batch is full once its records are
        #: estimated to fill batch_size compressed. Counted in uncompressed bytes, batches of
        #: JSON were 5-12 times smaller on the wire than Java's: as many more batches, requests
        #: and broker work for the same records.
        self._ratios: dict[str, float] = {}
        #: Each topic's compressed size a batch is filled to, below batch_size once a batch of the
        #: topic was refused as too large: half that batch's size on the wire. Without it, a topic
        #: whose max.message.bytes is below batch_size (every batch of batch_size uncompressed
        #: fitting it, compressed) had a batch refused and split every few dozen, for ever: the
        #: estimate, started over at each split, grew the batches to the limit again.
        self._wire_caps: dict[str, int] = {}
        self._linger = config.linger_ms / 1000
        self._delivery_timeout = config.delivery_timeout_ms / 1000
        self._deadlines = _Deadlines()
        #: Batches of each partition on the wire (sent, not yet answered; see ``ready``), kept by
        #: ``sent`` and ``returned``. send() reads it on every record (is any answer awaited?):
        #: a plain attribute, which a property would have cost 50 ns a record.
        self.on_wire: dict[TopicPartition, int] = {}
        #: Without idempotence, order holds only if a partition has one batch in flight at a
        #: time (Java's guaranteeMessageOrder): nothing more of it is sent meanwhile.
        self._one_on_wire = not config.enable_idempotence and config.max_in_flight_requests_per_connection == 1
        #: Leaders whose connection could not take a request at the sender's last round (set
        #: by the sender): nothing of theirs can go until it can, and the connection wakes
        #: the sender then. So their partitions are passed over, and neither their lingers
        #: ending nor their new batches make a round. With 1,000 partitions on a busy
        #: broker, those had made a round every millisecond or so that could send nothing.
        #: Updated in place (see ``_batches``).
        self.blocked: set[int] = set()
        #: Leaders with two produce requests of the sender unanswered at its last round (set by
        #: the sender; each answer wakes it). A batch of theirs due only by its linger waits: it
        #: goes with the next request that leaves for the leader anyway (a full batch's, a
        #: retry's, a flush's) or in the round an answer wakes, so requests of lingering batches
        #: pipeline two deep, not five. Over 1,000 partitions on a busy broker, a request per
        #: linger ending had each taken a record or two of many partitions: more batches, each
        #: costing both sides their per-batch work. Neither those lingers ending nor such
        #: batches opening make a round.
        self.busy: set[int] = set()
        self.incomplete: set[ProducerBatch] = set()
        self.flushing = 0
        self.closing = False
        #: Counts new batches; send() yields to the loop when it changes (see there).
        self.batches_created = 0
        #: When the sender's next round is due (loop time; set by the sender as it sleeps, -inf
        #: while a round is running or pending). A new batch wakes the sender only if it may be
        #: sent before then: otherwise that round finds it anyway. With many partitions, a wake-up
        #: per new batch made a round (each visiting every partition with data) per record.
        self.next_round = float("inf")
        #: The turns of the loop the next send() gives before it queues more: set by send()
        #: when a round is due or a connection's reader must read the answers that free it;
        #: cleared (0) by each round of the sender, which could not have run without the loop.
        self.yield_wanted = 0
        #: ready()'s leader of each partition, for the snapshot it was found in.
        self._leaders_cluster: ClusterSnapshot | None = None
        self._leaders: dict[TopicPartition, int | None] = {}
        #: Told the partition of every new batch (a transaction adds the partition then).
        #: True when that gives the sender something to send (AddPartitionsToTxn), which
        #: then wakes it even if the partition's leader is ``blocked``.
        self.on_new_batch: Callable[[TopicPartition], bool] | None = None

    @staticmethod
    def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
        """An upper bound of what the record costs on the wire and in memory."""
        size = RECORD_OVERHEAD + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        return size + RecordAccumulator.headers_size(headers) if headers else size

    @staticmethod
    def headers_size(headers: Headers) -> int:
        # A name's UTF-8 length: exact for ASCII (the common case), else encoded (the names were
        # checked encodable); Java counts the same (Utils.utf8Length).
        return sum(
            10 + (len(name) if name.isascii() else len(name.encode())) + (len(value) if value is not None else 0)
            for name, value in headers
        )

    def check_size(self, size: int, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        """Refuse a record of ``size`` (:meth:`record_size`) that no request or buffer can hold.

        Against max_request_size, the batch the record makes counts as Java counts it
        (estimateSizeInBytesUpperBound: the record's framing at its largest, not the 64 bytes
        ``size`` reserves in memory): a record whose batch fits was refused, with a batch size
        it would not have."""
        batch = RecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
        if batch > self._config.max_request_size:
            raise RecordTooLargeError(
                f"record of about {batch - BATCH_HEADER_SIZE} bytes (a batch of {batch}) is larger than "
                f"max_request_size ({self._config.max_request_size})"
            )
        if size > self._config.buffer_memory:
            raise RecordTooLargeError(
                f"record of about {size} bytes is larger than buffer_memory ({self._config.buffer_memory})"
            )

    def append(
        self,
        tp: TopicPartition,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        now: float | None = None,
    ) -> RecordFuture:
        """Add a record whose ``size`` bytes are already reserved from the pool."""
        # _add's common case inlined (a call less per record): the partition's open batch.
        queue = self._batches.get(tp)
        if queue:
            last = queue[-1]
            if last.payload is None:
                builder = last.builder
                index = builder.append(timestamp, key, value, headers)
                if index is not None:
                    last.reserved += size
                    if builder.is_full:
                        self.filled(last)
                    return RecordFuture(last.settlement, index, timestamp)
        return RecordFuture(
            self._add_to_new_batch(tp, timestamp, key, value, headers, size, now).settlement, 0, timestamp
        )

    def append_to_group(
        self,
        tp: TopicPartition,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        group: SendGroup,
        index: int,
    ) -> None:
        """Add record ``index`` of a ``send_many`` group (its outcome goes to the group)."""
        self._add(tp, group.timestamp, key, value, headers, size, None)[0].append_to_group(group, index)

    def append_run(
        self,
        tp: TopicPartition,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        start: int,
        stop: int,
        group: SendGroup,
    ) -> tuple[int, int]:
        """Append as many of ``values[start:stop]`` as fit the open batch and the free
        buffer memory, in one builder call; returns how many, and the buffer memory they
        reserve (``record_size`` of each). None appended means the caller must take the
        per-record path for ``values[start]`` (full buffer, or not bytes)."""
        pool = self.pool
        budget = pool.total - pool.used if pool.available else 0
        if budget <= 0:
            return 0, 0
        queue = self._batches.get(tp)
        batch = queue[-1] if queue else None
        appended = 0
        if batch is not None and batch.payload is None:
            appended, cost = batch.builder.append_values(
                group.timestamp, values, keys, start, stop, budget, RECORD_OVERHEAD
            )
            if appended and batch.builder.is_full:
                self.filled(batch)
        if not appended:
            batch = self._new_batch(tp, None)
            appended, cost = batch.builder.append_values(
                group.timestamp, values, keys, start, stop, budget, RECORD_OVERHEAD
            )
            if not appended:
                return 0, 0
            self._enqueue_new(batch)
        assert batch is not None
        pool.used += cost
        batch.reserved += cost
        batch.append_range_to_group(group, start, appended)
        return appended, cost

    def _add(
        self,
        tp: TopicPartition,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        now: float | None,
    ) -> tuple[ProducerBatch, int]:
        """Encode the record into the partition's open batch, or a new one; the batch and
        the record's offset delta in it. The per-record hot path, with one builder call in
        the common case."""
        queue = self._batches.get(tp)
        if queue:
            last = queue[-1]
            if last.payload is None:
                builder = last.builder
                index = builder.append(timestamp, key, value, headers)
                if index is not None:
                    last.reserved += size
                    if builder.is_full:
                        self.filled(last)
                    return last, index
        return self._add_to_new_batch(tp, timestamp, key, value, headers, size, now), 0

    def _add_to_new_batch(
        self,
        tp: TopicPartition,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        now: float | None,
    ) -> ProducerBatch:
        """Start the partition's next batch with the record (its offset delta is 0)."""
        batch = self._new_batch(tp, now)
        if batch.builder.append(timestamp, key, value, headers) is None:
            raise RecordTooLargeError(f"record does not fit an empty batch for {tp.topic}-{tp.partition}")
        batch.reserved = size
        self._enqueue_new(batch)
        return batch

    def _new_batch(self, tp: TopicPartition, now: float | None) -> ProducerBatch:
        """An empty batch for ``tp``, opened on the millisecond of ``now`` (default: the loop's)."""
        created = _whole_ms(self._loop.time() if now is None else now)
        fill = self.fill_size(tp.topic) if self.compressing else None
        return ProducerBatch(tp, self._new_builder(fill), created, self._delivery_timeout, self._loop)

    def fill_size(self, topic: str) -> int:
        """The uncompressed bytes a batch of ``topic`` takes: batch_size over the estimated ratio
        (with Java's 5% margin), never less than batch_size (a codec that does not shrink the
        records changes nothing) nor more than max_request_size (a request's limit, counted
        uncompressed before the batch is built, still bounds the batch)."""
        batch_size = self._config.batch_size
        ratio = self._ratios.get(topic, 1.0) * _RATIO_MARGIN
        target = min(batch_size, self._wire_caps.get(topic, batch_size))
        return max(batch_size, min(int(target / ratio), self._config.max_request_size))

    def forget_topics(self, topics: Sequence[str]) -> None:
        """Topics unused for metadata_max_idle_ms: their ratio estimates and caps go too (a topic
        per tenant kept an entry in each for good)."""
        for topic in topics:
            self._ratios.pop(topic, None)
            self._wire_caps.pop(topic, None)

    def compressed(self, batch: ProducerBatch, wire_size: int) -> None:
        """``batch`` was built and compressed to ``wire_size`` bytes: the topic's ratio estimate
        follows it, as Java's (a worse ratio at once, by 0.05 at least; a better one 0.005 a batch:
        a batch estimated too full is larger than batch_size on the wire)."""
        observed = wire_size / batch.builder.size_in_bytes
        topic = batch.tp.topic
        estimate = self._ratios.get(topic, 1.0)
        if observed > estimate:
            self._ratios[topic] = max(estimate + _RATIO_WORSE_STEP, observed)
        elif observed < estimate:
            self._ratios[topic] = max(estimate - _RATIO_BETTER_STEP, observed)

    def _enqueue_new(self, batch: ProducerBatch) -> None:
        queue = self._queue_for(batch.tp)
        queue.append(batch)
        self._track(batch)
        self.batches_created += 1
        news = self.on_new_batch is not None and self.on_new_batch(batch.tp)
        if self.blocked and not news and self._leader_in(batch.tp, self.blocked):
            # The leader's throttle or answers free it; but the sender, asleep until then, must
            # expire the batch first if its delivery timeout ends sooner.
            if batch.deadline < self.next_round:
                self._wakeup()
            return
        # The one before it (if any) is now complete and sendable, as is the new batch if its
        # first record filled it (one larger than batch_size): neither waits for a linger or an
        # answer. Else the new batch is sendable once it lingered (or at once, if something
        # forces sending), or, if a batch of its partition is unanswered, with that answer,
        # which wakes the sender anyway.
        if len(queue) > 1 or batch.builder.is_full or self._forced():
            if self.next_round > batch.created:
                self._wakeup()
        elif (
            batch.created + self._linger < self.next_round
            and batch.tp not in self.on_wire
            and not (self.busy and not news and self._leader_in(batch.tp, self.busy))
        ):
            self._wakeup()

    def filled(self, batch: ProducerBatch) -> None:
        """The partition's open ``batch`` just filled (no record fits it any more, and none was
        refused, so no batch opens behind it): it is sendable now, not at its linger or with its
        partition's answer (see ``ready``), and a round must come to send it."""
        if self.blocked and self._leader_in(batch.tp, self.blocked):
            return  # the connection wakes the sender once it can take a request
        if self.next_round > batch.created:
            self._wakeup()

    def _queue_for(self, tp: TopicPartition) -> deque[ProducerBatch]:
        """The partition's queue; a partition without one gets a spare, at the back of the drain order."""
        queue = self._batches.get(tp)
        if queue is None:
            queue = self._batches[tp] = self._spare_queues.pop() if self._spare_queues else deque()
        return queue

    def _leader_in(self, tp: TopicPartition, nodes: set[int]) -> bool:
        """The partition's leader, in the snapshot of the last round, is in ``nodes``."""
        leader = self._leaders.get(tp, _UNKNOWN)
        if leader is _UNKNOWN:
            cluster = self._leaders_cluster
            if cluster is None:
                return False
            leader = self._leaders[tp] = cluster.leader_for(tp.topic, tp.partition)
        return leader in nodes

    def _track(self, batch: ProducerBatch) -> None:
        self.incomplete.add(batch)
        self._deadlines.add(batch)

    def _new_builder(self, batch_size: int | None = None) -> RecordBatchBuilder:
        return RecordBatchBuilder(
            self._codec,
            self._config.batch_size if batch_size is None else batch_size,
            compression_level=self._config.compression_level,
        )

    def ready(self, cluster: ClusterSnapshot, now: float) -> Readiness:
        """Which partitions may send their head batch now, and when the next one may.

        The one readiness rule: ``drain`` takes its batches from what this found, so the two
        cannot disagree (as two float comparisons of the linger deadline once did, leaving
        the sender asleep with a batch it saw as ready but could not drain). It runs every
        sender round over every partition with data, so it is written for speed.

        Partitions led by a ``blocked`` node are passed over (see there); those led by a
        ``busy`` one go only with a batch that is due for more than its linger.
        """
        nodes: set[int] = set()
        sendable: list[tuple[TopicPartition, deque[ProducerBatch], int]] = []
        next_check = 3600.0
        unknown_leader: set[str] = set()
        leaderless: list[TopicPartition] = []
        force = self._forced()
        on_wire = self.on_wire
        one_on_wire = self._one_on_wire
        blocked = self.blocked
        linger = self._linger
        leaders = self._leaders_of(cluster)
        busy = self.busy
        riders: set[int] = set()  # busy leaders with a batch due only by its linger
        for tp, queue in self._batches.items():
            waiting = tp in on_wire
            if waiting and one_on_wire:
                continue
            leader = leaders.get(tp, _UNKNOWN)
            if leader is _UNKNOWN:
                leader = leaders[tp] = cluster.leader_for(tp.topic, tp.partition)
            if leader is None:
                unknown_leader.add(tp.topic)
                leaderless.append(tp)
                continue
            if leader in blocked:
                continue
            batch = queue[0]
            if batch.retry_at > now:
                wait = batch.retry_at - now
            elif force or batch.attempts or len(queue) > 1:
                wait = 0.0
            elif waiting and not batch.builder.is_full:
                # Its linger may be over, but the partition's last batch is unanswered: this one
                # goes with the answer (which wakes the sender), unless it fills first. Over many
                # partitions on a busy broker, batches then gather what comes meanwhile instead of
                # each request taking a record or two of every partition.
                continue
            else:
                wait = batch.created + linger - now
                if batch.builder.is_full:
                    wait = min(wait, 0.0)
                elif wait <= _DUE and leader in busy:
                    # With the leader's next request, if it has one this round; in its place in
                    # the drain order, so that a request cut at max_request_size does not leave
                    # it out round after round.
                    riders.add(leader)
                    sendable.append((tp, queue, leader))
                    continue
            if wait <= _DUE:
                nodes.add(leader)
                sendable.append((tp, queue, leader))
            elif wait < next_check:
                next_check = wait
        if not riders <= nodes:
            idle = riders - nodes  # their batches are all riders: no request for them this round
            sendable = [entry for entry in sendable if entry[2] not in idle]
        return Readiness(nodes, next_check, unknown_leader, sendable, leaderless)

    def _leaders_of(self, cluster: ClusterSnapshot) -> dict[TopicPartition, int | None]:
        """Each partition's usable leader in ``cluster``, found once per snapshot."""
        if self._leaders_cluster is not cluster:
            self._leaders_cluster = cluster
            self._leaders = {}
        return self._leaders

    def _forced(self) -> bool:
        """Send without waiting for linger: a flush or close is waiting, or memory is short."""
        return self.flushing > 0 or self.closing or self.pool.exhausted

    def drain(
        self,
        readiness: Readiness,
        nodes: Iterable[int],
        max_request_size: int,
        can_send: Callable[[ProducerBatch, deque[ProducerBatch]], bool],
    ) -> dict[int, list[ProducerBatch]]:
        """Take at most one batch per sendable partition for each of ``nodes``, up to
        ``max_request_size``; ``readiness`` is what ``ready`` found, this round.

        Partitions are visited in drain order; each one drained moves to the back, and a
        node's drain stops at the first batch that does not fit, so the next round starts
        with the partitions this one could not serve.
        """
        open_nodes = set(nodes)
        if not open_nodes:
            return {}
        drained: dict[int, list[ProducerBatch]] = {}
        sizes: dict[int, int] = {}
        batches = self._batches
        for tp, queue, leader in readiness.sendable:
            if leader not in open_nodes:
                continue
            batch = queue[0]
            if not can_send(batch, queue):
                continue
            size = sizes.get(leader, 0)
            if size and size + batch.size > max_request_size:
                open_nodes.discard(leader)  # this request is full; the rest wait their turn
                continue
            queue.popleft()
            sizes[leader] = size + batch.size
            if leader in drained:
                drained[leader].append(batch)
            else:
                drained[leader] = [batch]
            del batches[tp]
            if queue:
                batches[tp] = queue  # to the back of the drain order
            else:
                self._spare_queues.append(queue)
        return drained

    def sent(self, batch: ProducerBatch) -> None:
        self.on_wire[batch.tp] = self.on_wire.get(batch.tp, 0) + 1

    def returned(self, batch: ProducerBatch) -> None:
        """A batch ``sent`` came back (answered, or its request failed)."""
        left = self.on_wire[batch.tp] - 1
        if left:
            self.on_wire[batch.tp] = left
        else:
            del self.on_wire[batch.tp]

    def reenqueue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put a batch back at the head of its partition: batches that keep their stamps
        first, in sequence order, then those waiting for new sequences, in their old order.
        A batch that keeps its stamp may be in the log, and only its own stamp lets the broker
        say so: it must be resolved before the partition is renumbered (see idempotence.py)."""
        batch.retry_at = retry_at
        batch.in_flight = False
        queue = self._queue_for(batch.tp)
        if batch.stamped:
            index = 0
            while index < len(queue) and queue[index].stamped and _resent_before(queue[index], batch):
                index += 1
            queue.insert(index, batch)
        else:
            queue.appendleft(batch)
        self._wakeup()

    def split_and_reenqueue(self, batch: ProducerBatch, retry_at: float) -> list[ProducerBatch]:
        """Replace a batch the broker found too large by smaller ones, in its place.

        Each part gets at most half the original's uncompressed bytes (and never more than
        batch_size), so repeated refusals end, at worst, with one record per batch. Half the
        compressed size, applied to uncompressed records, cut a compressed batch into many more
        parts than it needed. The topic's ratio estimate starts over from 1 (Java's), or its
        next batches would be refused the same way; and, with a codec, its batches are filled to
        at most half the refused batch's compressed size from then on (see ``_wire_caps``).
        """
        limit = max(1, min(self._config.batch_size, batch.builder.size_in_bytes // 2))
        topic = batch.tp.topic
        self._ratios.pop(topic, None)
        if self.compressing:
            self._wire_caps[topic] = min(self._wire_caps.get(topic, self._config.batch_size), batch.size // 2)
        parts = batch.split(limit, self._new_builder)
        self.incomplete.discard(batch)
        for part in reversed(parts):
            self._track(part)
            self.reenqueue(part, retry_at)
        return parts

    def stamped_before(self, batch: ProducerBatch) -> bool:
        """A queued batch of the same partition and identity has an earlier sequence."""
        for other in self._batches.get(batch.tp, ()):
            if not other.stamped:
                return False  # stamped batches come first: none further on
            if earlier_under(other, batch):
                return True
        return False

    def renumber_queued(self) -> None:
        """Every queued stamped batch waits for a new sequence (the cluster changed), in the order
        of its old one: those that kept their stamps went ahead of refused earlier ones only to be
        resolved under those stamps first, which no longer happens."""
        for queue in self._batches.values():
            stamped: list[ProducerBatch] = []
            for batch in queue:
                if not batch.stamped:
                    break
                batch.needs_new_sequence = True
                at = next((i for i, placed in enumerate(stamped) if earlier_under(batch, placed)), len(stamped))
                stamped.insert(at, batch)
            for index, batch in enumerate(stamped):
                queue[index] = batch

    def withdraw(self, tp: TopicPartition, which: Callable[[ProducerBatch], bool]) -> list[ProducerBatch]:
        """Take the queued batches of ``tp`` that ``which`` picks out of their queue."""
        queue = self._batches.get(tp)
        if queue is None:
            return []
        taken = [batch for batch in queue if which(batch)]
        for batch in taken:
            queue.remove(batch)
        if not queue:
            del self._batches[tp]
            self._spare_queues.append(queue)
        return taken

    def queue(self, tp: TopicPartition) -> deque[ProducerBatch]:
        return self._batches.get(tp) or deque()

    def expired(self, now: float) -> list[ProducerBatch]:
        """Unfinished batches past their delivery deadline, queued or in flight; queued ones
        are taken out of their queue."""
        deadlines, live = self._deadlines, self.incomplete
        expired: list[ProducerBatch] = []
        while (batch := deadlines.earliest(live)) is not None and batch.deadline <= now + _DUE:
            deadlines.remove_earliest(batch)
            expired.append(batch)
            if not batch.in_flight:
                queue = self._batches.get(batch.tp)
                if queue is not None and batch in queue:
                    queue.remove(batch)
                    if not queue:
                        del self._batches[batch.tp]
        return expired

    def next_deadline(self) -> float | None:
        """The earliest delivery deadline of an unfinished batch."""
        batch = self._deadlines.earliest(self.incomplete)
        return None if batch is None else batch.deadline

    def complete(self, batch: ProducerBatch) -> None:
        """The batch is finished (acked or failed): give back its memory."""
        if batch in self.incomplete:
            self.incomplete.discard(batch)
            self._deadlines.compact(self.incomplete)
            self.pool.release(batch.reserved)
            batch.reserved = 0
            outcome = batch.settlement.outcome
            # As Java's abortUndrainedBatches: records of an aborted transaction are the caller's
            # abort, not failed deliveries (routine aborts would read as errors).
            if isinstance(outcome, BatchFailure) and not isinstance(outcome.error, TransactionAbortedError):
                self._metrics.record_error(batch, self._loop.time())

    def holds(self, tp: TopicPartition) -> bool:
        """A batch of ``tp`` is queued or on the wire."""
        return tp in self._batches or tp in self.on_wire

    @property
    def has_queued(self) -> bool:
        return bool(self._batches)

    @property
    def open_batches(self) -> dict[TopicPartition, deque[ProducerBatch]]:
        """Each partition's queue of batches, the last one open for appends (for the compiled
        send lane, which appends to it where ``append`` would)."""
        return self._batches

    def fail_all(self, error_for: Callable[[ProducerBatch], KafkaError]) -> list[ProducerBatch]:
        """Fail every queued batch, each with the error ``error_for`` gives it; returns them."""
        failed = [batch for queue in self._batches.values() for batch in queue]
        self._batches.clear()
        for batch in failed:
            batch.fail(error_for(batch))
            self.complete(batch)
        return failed

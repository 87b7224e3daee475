"""The producer's metrics, with the Java producer's names and meanings.

Counting happens per batch and per request — when a produce request is written, when its
answer comes, when a batch is retried, split or fails — never per record: ``send()``
counts nothing. Gauges (buffer, requests in flight, connections, metadata age) are read
from the producer's parts when a snapshot is taken.

Rates, averages and maxima are over Java's windows: ``metrics_num_samples`` samples of
``metrics_sample_window_ms`` each (2 x 30 s by default), computed as Java's ``Rate``,
``Avg`` and ``Max`` stats compute them, so the figures can be put beside a Java
producer's. An average or maximum with nothing recorded in the window is NaN, as in Java.
Times are the event loop's clock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aioprod.event_log import EventLog
from aioprod.protocol.records import BATCH_HEADER_SIZE

if TYPE_CHECKING:
    from aioprod.cluster.metadata import Metadata
    from aioprod.config import ProducerConfig
    from aioprod.net.pool import ConnectionPool
    from aioprod.producer.accumulator import BufferPool
    from aioprod.producer.batch import ProducerBatch

log = logging.getLogger(__name__)

NAN = math.nan
#: How long a snapshot asked for from another thread waits for the producer's loop.
SNAPSHOT_TIMEOUT = 10.0

#: Producer-wide metrics (Java's ``producer-metrics`` group): name -> meaning.
PRODUCER_METRICS: dict[str, str] = {
    "record-send-total": "Records sent in produce requests (a retried record counts again)",
    "record-send-rate": "Records sent per second",
    "record-retry-total": "Records put back for another attempt after a retriable error",
    "record-retry-rate": "Records retried per second",
    "record-error-total": "Records whose delivery failed",
    "record-error-rate": "Records failed per second",
    "records-per-request-avg": "Average records per produce request",
    "record-queue-time-avg": "Average ms a batch waited in the accumulator before it was sent",
    "record-queue-time-max": "Longest ms a batch waited in the accumulator before it was sent",
    "record-size-avg": "Average size of an encoded record, in bytes (uncompressed)",
    "batch-size-avg": "Average bytes per batch sent (after compression)",
    "batch-size-max": "Largest batch sent, in bytes (after compression)",
    "batch-split-total": "Batches split because the broker found them too large",
    "batch-split-rate": "Batch splits per second",
    "compression-rate-avg": "Average compressed/uncompressed size ratio of the batches sent",
    "request-latency-avg": "Average ms from writing a produce request to its response",
    "request-latency-max": "Longest ms from writing a produce request to its response",
    "produce-throttle-time-avg": "Average ms the brokers asked produce requests to be throttled",
    "produce-throttle-time-max": "Longest throttle the brokers asked for, in ms",
    "requests-in-flight": "Requests sent and waiting for their response, now",
    "request-total": "Requests sent, of every kind",
    "request-rate": "Requests sent per second",
    "request-size-avg": "Average request size in bytes",
    "request-size-max": "Largest request in bytes",
    "response-total": "Responses received",
    "response-rate": "Responses received per second",
    "outgoing-byte-total": "Bytes sent to all brokers",
    "outgoing-byte-rate": "Bytes sent to all brokers per second",
    "incoming-byte-total": "Bytes received from all brokers",
    "incoming-byte-rate": "Bytes received from all brokers per second",
    "connection-count": "Open broker connections, now",
    "connection-creation-total": "Broker connections established",
    "connection-creation-rate": "Broker connections established per second",
    "connection-close-total": "Broker connections closed",
    "connection-close-rate": "Broker connections closed per second",
    "successful-authentication-total": "Connections that authenticated with SASL",
    "successful-authentication-rate": "Successful authentications per second",
    "failed-authentication-total": "Connections refused in authentication",
    "failed-authentication-rate": "Failed authentications per second",
    "buffer-total-bytes": "buffer_memory: the bytes records may take while queued",
    "buffer-available-bytes": "Bytes of buffer_memory not taken, now",
    "bufferpool-wait-time-total": "Nanoseconds sends waited for buffer memory (Java's older name)",
    "bufferpool-wait-time-ns-total": "Nanoseconds sends waited for buffer memory",
    "bufferpool-wait-ratio": "Fraction of time sends waited for buffer memory",
    "bufferpool-wait-total": "Sends that had to wait for buffer memory (aioprod)",
    "buffer-exhausted-total": "Sends refused because buffer memory stayed full for max_block_ms",
    "buffer-exhausted-rate": "Sends refused for a full buffer per second",
    "waiting-threads": "Sends waiting for buffer memory, now",
    "metadata-age": "Seconds since the last successful metadata refresh (NaN before the first)",
    "metadata-wait-time-ns-total": "Nanoseconds sends waited for topic metadata",
    "flush-time-ns-total": "Nanoseconds spent in flush()",
    "producer-id-reset-total": "Producer identities taken after the first (idempotence recovery; aioprod)",
}

#: Per-topic metrics (Java's ``producer-topic-metrics`` group).
TOPIC_METRICS: dict[str, str] = {
    "record-send-total": "Records of the topic sent in produce requests (a retried record counts again)",
    "record-send-rate": "Records of the topic sent per second",
    "byte-total": "Bytes of the topic's batches sent (after compression)",
    "byte-rate": "Bytes of the topic's batches sent per second",
    "compression-rate": "Average compressed/uncompressed size ratio of the topic's batches",
    "record-retry-total": "Records of the topic retried",
    "record-retry-rate": "Records of the topic retried per second",
    "record-error-total": "Records of the topic whose delivery failed",
    "record-error-rate": "Records of the topic failed per second",
}

#: Per-broker metrics (Java's ``producer-node-metrics`` and per-node network metrics).
BROKER_METRICS: dict[str, str] = {
    "request-latency-avg": "Average ms from writing a produce request to the broker to its response",
    "request-latency-max": "Longest ms from writing a produce request to the broker to its response",
    "request-total": "Requests sent to the broker",
    "request-rate": "Requests sent to the broker per second",
    "request-size-avg": "Average size of requests to the broker, in bytes",
    "request-size-max": "Largest request to the broker, in bytes",
    "response-total": "Responses received from the broker",
    "response-rate": "Responses received from the broker per second",
    "outgoing-byte-total": "Bytes sent to the broker",
    "outgoing-byte-rate": "Bytes sent to the broker per second",
    "incoming-byte-total": "Bytes received from the broker",
    "incoming-byte-rate": "Bytes received from the broker per second",
    "requests-in-flight": "Requests sent to the broker and waiting for their response, now",
    "connection-count": "1 while a connection to the broker is open, else 0",
}


class Sensor:
    """One recorded quantity: cumulative ``total`` and ``count``, and ``samples``
    windows of ``window`` seconds each for rates, averages and maxima.

    As Java's ``SampledStat``: a sample starts at its first record and is complete after
    ``window`` seconds; the next record then reuses the oldest sample; samples older than
    ``samples * window`` are reset when read.
    """

    __slots__ = ("_current", "_samples", "_size", "_window", "count", "total")

    def __init__(self, window: float, samples: int) -> None:
        self.total = 0.0
        self.count = 0
        self._window = window
        self._size = samples
        #: Each sample: [start, events, sum of values, max value].
        self._samples: list[list[float]] = []
        self._current = 0

    def record(self, value: float, now: float) -> None:
        """Record ``value`` at loop time ``now``."""
        self.record_many(value, 1, now, value)

    def record_many(self, total: float, events: int, now: float, peak: float | None = None) -> None:
        """Record ``events`` values at once, at loop time ``now``: their ``total`` and, if it
        is wanted, the largest."""
        self.total += total
        self.count += events
        samples = self._samples
        if samples:
            sample = samples[self._current]
            if now - sample[0] >= self._window:
                sample = self._advance(now)
        else:
            sample = self._advance(now)
        sample[1] += events
        sample[2] += total
        if peak is not None and peak > sample[3]:
            sample[3] = peak

    def _advance(self, now: float) -> list[float]:
        samples = self._samples
        if samples:
            self._current = (self._current + 1) % self._size
        if self._current >= len(samples):
            sample = [now, 0, 0.0, -math.inf]
            samples.append(sample)
            return sample
        sample = samples[self._current]
        sample[:] = (now, 0, 0.0, -math.inf)
        return sample

    def _live(self, now: float) -> list[list[float]]:
        expire = self._size * self._window
        for sample in self._samples:
            if now - sample[0] >= expire:
                sample[:] = (now, 0, 0.0, -math.inf)
        return self._samples

    def rate(self, now: float, *, events: bool = False) -> float:
        """Per second over the window: of the values recorded, or of the events."""
        samples = self._live(now)
        amount = sum(s[1] if events else s[2] for s in samples)
        # Java's Rate.windowSize: time since the oldest sample, but never less than
        # (samples - 1) whole windows, so one early burst does not read as a huge rate.
        elapsed = now - min((s[0] for s in samples), default=now)
        whole = int(elapsed // self._window)
        if whole < self._size - 1:
            elapsed += (self._size - 1 - whole) * self._window
        return amount / max(elapsed, 0.001)

    def avg(self, now: float) -> float:
        samples = self._live(now)
        events = sum(s[1] for s in samples)
        return sum(s[2] for s in samples) / events if events else NAN

    def max(self, now: float) -> float:
        return float(max((s[3] for s in self._live(now) if s[1]), default=NAN))


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every metric at one moment: producer-wide, per topic and per broker.

    Broker ids are the cluster's node ids; negative ids are bootstrap connections, made
    before metadata named the brokers (Java's ``node--1``).
    """

    client_id: str
    #: When the snapshot was taken, in seconds since the epoch.
    time: float
    producer: dict[str, float]
    topics: dict[str, dict[str, float]]
    brokers: dict[int, dict[str, float]]


class TopicMetrics:
    __slots__ = ("bytes", "compression", "errors", "records", "retries")

    def __init__(self, new: Callable[[], Sensor]) -> None:
        self.records = new()
        self.bytes = new()
        self.compression = new()
        self.retries = new()
        self.errors = new()

    def values(self, now: float) -> dict[str, float]:
        return {
            "record-send-total": self.records.total,
            "record-send-rate": self.records.rate(now),
            "byte-total": self.bytes.total,
            "byte-rate": self.bytes.rate(now),
            "compression-rate": self.compression.avg(now),
            "record-retry-total": self.retries.total,
            "record-retry-rate": self.retries.rate(now),
            "record-error-total": self.errors.total,
            "record-error-rate": self.errors.rate(now),
        }


class BrokerMetrics:
    """One broker's requests and bytes; its connection counts into it, across reconnects."""

    __slots__ = ("_all_received", "_all_sent", "latency", "node_id", "received", "sent")

    def __init__(self, node_id: int, new: Callable[[], Sensor], all_sent: Sensor, all_received: Sensor) -> None:
        self.node_id = node_id
        self.sent = new()
        self.received = new()
        self.latency = new()
        self._all_sent = all_sent
        self._all_received = all_received

    def request_sent(self, size: int, now: float) -> None:
        self.sent.record(size, now)
        self._all_sent.record(size, now)

    def response_received(self, size: int, now: float) -> None:
        self.received.record(size, now)
        self._all_received.record(size, now)

    def values(self, now: float, in_flight: int, connected: bool) -> dict[str, float]:
        return {
            "request-latency-avg": self.latency.avg(now),
            "request-latency-max": self.latency.max(now),
            **_traffic(self.sent, self.received, now),
            "requests-in-flight": float(in_flight),
            "connection-count": 1.0 if connected else 0.0,
        }


StatisticsCallback = Callable[[MetricsSnapshot], Any]


class ProducerMetrics:
    """What one producer counts; its parts call the ``record_*`` methods.

    Only the producer's event loop records. :meth:`snapshot` may be called from any
    thread: from another one it asks the loop for the snapshot and waits for it.
    """

    def __init__(self, config: ProducerConfig) -> None:
        self.client_id = config.client_id
        self.events = EventLog(config.client_id)
        self._window = config.metrics_sample_window_ms / 1000
        self._samples = config.metrics_num_samples
        self._buffer_memory = config.buffer_memory
        self._statistics_interval = config.statistics_interval_ms / 1000
        self._statistics_callback: StatisticsCallback | None = config.statistics_callback
        new = self._sensor
        self._records = new()  # per request: records in it
        self._batch_bytes = new()
        self._queue_time = new()
        self._compression = new()
        self._record_bytes = new()  # per batch: uncompressed record bytes, one event per record
        self._latency = new()
        self._throttle = new()
        self._retries = new()
        self._errors = new()
        self._splits = new()
        self._sent = new()  # every request: its size
        self._received = new()
        self._connections_created = new()
        self._connections_closed = new()
        self._authenticated = new()
        self._authentication_failed = new()
        self._buffer_waits = new()  # seconds per wait
        self._buffer_exhausted = new()
        self._metadata_wait = 0.0
        self._flush_time = 0.0
        self._identity_resets = 0
        self._topics: dict[str, TopicMetrics] = {}
        self._brokers: dict[int, BrokerMetrics] = {}
        self._buffer: BufferPool | None = None
        self._pool: ConnectionPool | None = None
        self._metadata: Metadata | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._reporter: asyncio.Task[None] | None = None
        #: A forked child's copy: the figures are the parent's as of the fork.
        self._forked = False

    def _sensor(self) -> Sensor:
        return Sensor(self._window, self._samples)

    # -- lifecycle -------------------------------------------------------------------

    def start(
        self, loop: asyncio.AbstractEventLoop, buffer: BufferPool, pool: ConnectionPool, metadata: Metadata
    ) -> None:
        """Read gauges from these parts from now on; start the statistics callback."""
        self._loop = loop
        self._clock = loop.time
        self._buffer, self._pool, self._metadata = buffer, pool, metadata
        if self._statistics_callback is not None:
            self._reporter = loop.create_task(self._report(self._statistics_callback), name="aioprod-statistics")

    def forked(self) -> None:
        """A forked child's copy: snapshots are taken here (the loop copied as running runs
        nowhere), and the copied reporter calls no statistics_callback."""
        self._forked = True
        self._loop = None

    def stop(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()
            self._reporter = None

    async def _report(self, callback: StatisticsCallback) -> None:
        while True:
            await asyncio.sleep(self._statistics_interval)
            if self._forked:
                return
            try:
                result = callback(self._take())
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self.events.problem(
                    log, "statistics-callback", type(exc).__name__, "statistics_callback raised %r", exc
                )

    # -- recording (the event loop only) ------------------------------------------------

    def topic(self, name: str) -> TopicMetrics:
        metrics = self._topics.get(name)
        if metrics is None:
            metrics = self._topics[name] = TopicMetrics(self._sensor)
        return metrics

    def forget_topics(self, names: list[str]) -> None:
        """Topics unused for metadata_max_idle_ms leave the per-topic metrics with their
        metadata: a producer writing to a topic per tenant would otherwise keep them all."""
        for name in names:
            self._topics.pop(name, None)

    def forget_brokers(self, node_ids: list[int]) -> None:
        """Brokers that left the cluster leave the per-broker metrics and the event log."""
        for node_id in node_ids:
            self._brokers.pop(node_id, None)
            for key in (("connect", node_id), ("connected", node_id), ("lost", node_id)):
                self.events.forget(key)

    def broker(self, node_id: int) -> BrokerMetrics:
        metrics = self._brokers.get(node_id)
        if metrics is None:
            metrics = self._brokers[node_id] = BrokerMetrics(node_id, self._sensor, self._sent, self._received)
        return metrics

    def record_request(self, batches: Sequence[ProducerBatch], now: float) -> None:
        """A produce request carrying ``batches`` (built) was written.

        Sums over the request first, so each stat is recorded once per request (and per
        topic in it), whatever the number of batches.
        """
        records = size_sum = size_max = raw = 0
        queue_sum = queue_max = ratio_sum = 0.0
        # topic -> [records, bytes, sum of compression ratios, batches]
        by_topic: dict[str, list[float]] = {}
        for batch in batches:
            count = batch.record_count
            size = batch.size
            uncompressed = batch.builder.size_in_bytes
            # Java's ratio (MemoryRecordsBuilder): the records section, without the batch header.
            ratio = (size - BATCH_HEADER_SIZE) / (uncompressed - BATCH_HEADER_SIZE)
            queued = now - batch.created
            records += count
            size_sum += size
            raw += uncompressed - BATCH_HEADER_SIZE
            queue_sum += queued
            ratio_sum += ratio
            if size > size_max:
                size_max = size
            if queued > queue_max:
                queue_max = queued
            sums = by_topic.get(batch.tp.topic)
            if sums is None:
                by_topic[batch.tp.topic] = [count, size, ratio, 1]
            else:
                sums[0] += count
                sums[1] += size
                sums[2] += ratio
                sums[3] += 1
        n = len(batches)
        self._records.record(records, now)
        self._batch_bytes.record_many(size_sum, n, now, size_max)
        self._queue_time.record_many(queue_sum * 1000, n, now, queue_max * 1000)
        self._compression.record_many(ratio_sum, n, now)
        self._record_bytes.record_many(raw, records, now)
        topics = self._topics
        for name, (topic_records, topic_bytes, topic_ratios, topic_batches) in by_topic.items():
            topic = topics.get(name) or self.topic(name)
            topic.records.record(topic_records, now)
            topic.bytes.record_many(topic_bytes, int(topic_batches), now)
            topic.compression.record_many(topic_ratios, int(topic_batches), now)

    def record_response(self, node_id: int, latency: float, throttle_ms: int, now: float) -> None:
        """A produce response came from ``node_id``, ``latency`` seconds after its request."""
        ms = latency * 1000
        self._latency.record(ms, now)
        self.broker(node_id).latency.record(ms, now)
        self._throttle.record(throttle_ms, now)

    def record_retry(self, batch: ProducerBatch, now: float) -> None:
        count = batch.record_count
        self._retries.record(count, now)
        self.topic(batch.tp.topic).retries.record(count, now)

    def record_error(self, batch: ProducerBatch, now: float) -> None:
        count = batch.record_count
        self._errors.record(count, now)
        self.topic(batch.tp.topic).errors.record(count, now)

    def record_send_error(self, records: int, now: float) -> None:
        """``records`` failed in send()/send_many() before they were queued (metadata or buffer
        memory not there in max_block_ms, a record too large, a partition the topic lacks): as
        Java's doSend, which records the producer-wide "errors" sensor (record-error-rate/-total)
        for them."""
        self._errors.record(records, now)

    def record_split(self, now: float) -> None:
        self._splits.record(1, now)

    def record_identity_reset(self) -> None:
        self._identity_resets += 1

    def record_buffer_wait(self, seconds: float, now: float) -> None:
        self._buffer_waits.record(seconds, now)

    def record_buffer_exhausted(self, now: float) -> None:
        self._buffer_exhausted.record(1, now)

    def record_metadata_wait(self, seconds: float) -> None:
        self._metadata_wait += seconds

    def record_flush(self, seconds: float) -> None:
        self._flush_time += seconds

    def record_connection(self, opened: bool, now: float) -> None:
        (self._connections_created if opened else self._connections_closed).record(1, now)

    def record_authentication(self, succeeded: bool, now: float) -> None:
        (self._authenticated if succeeded else self._authentication_failed).record(1, now)

    # -- reading --------------------------------------------------------------------------

    def snapshot(self) -> MetricsSnapshot:
        """Every metric now. From a thread other than the producer's loop, the snapshot is
        taken on the loop (waiting up to ``SNAPSHOT_TIMEOUT`` seconds for it)."""
        loop = self._loop
        if loop is not None and loop.is_running() and not _running_in(loop):
            future: concurrent.futures.Future[MetricsSnapshot] = concurrent.futures.Future()

            def take() -> None:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(self._take())
                    except BaseException as exc:
                        future.set_exception(exc)

            try:
                loop.call_soon_threadsafe(take)
            except RuntimeError:  # closed meanwhile
                return self._take()
            deadline = time.monotonic() + SNAPSHOT_TIMEOUT
            while True:
                try:
                    return future.result(max(0.0, min(0.05, deadline - time.monotonic())))
                except TimeoutError:
                    # A loop that stopped before running it (a SyncProducer closing) never will.
                    stopped = not loop.is_running()
                    if (stopped or time.monotonic() >= deadline) and future.cancel():
                        if not stopped:
                            raise TimeoutError(
                                f"metrics snapshot: the producer's event loop did not take it within "
                                f"{SNAPSHOT_TIMEOUT:.0f} s (is the loop blocked?)"
                            ) from None
                        break
            # The loop is not running: nothing changes the figures now, take them here.
        return self._take()

    def _take(self) -> MetricsSnapshot:
        now = self._clock()
        pool = self._pool
        connections = {conn.node_id: conn for conn in pool.connections()} if pool is not None else {}
        brokers = {
            node: metrics.values(
                now,
                connections[node].in_flight_count if node in connections else 0,
                node in connections,
            )
            for node, metrics in sorted(self._brokers.items())
        }
        topics = {name: metrics.values(now) for name, metrics in sorted(self._topics.items())}
        return MetricsSnapshot(self.client_id, time.time(), self._producer_values(now, connections), topics, brokers)

    def _producer_values(self, now: float, connections: dict[int, Any]) -> dict[str, float]:
        records = self._records
        buffer, waits = self._buffer, self._buffer_waits
        metadata = self._metadata
        refreshed = metadata.last_refresh if metadata is not None else -math.inf
        values = {
            "record-send-total": records.total,
            "record-send-rate": records.rate(now),
            "record-retry-total": self._retries.total,
            "record-retry-rate": self._retries.rate(now),
            "record-error-total": self._errors.total,
            "record-error-rate": self._errors.rate(now),
            "records-per-request-avg": records.avg(now),
            "record-queue-time-avg": self._queue_time.avg(now),
            "record-queue-time-max": self._queue_time.max(now),
            "record-size-avg": self._record_bytes.avg(now),
            "batch-size-avg": self._batch_bytes.avg(now),
            "batch-size-max": self._batch_bytes.max(now),
            "batch-split-total": self._splits.total,
            "batch-split-rate": self._splits.rate(now),
            "compression-rate-avg": self._compression.avg(now),
            "request-latency-avg": self._latency.avg(now),
            "request-latency-max": self._latency.max(now),
            "produce-throttle-time-avg": self._throttle.avg(now),
            "produce-throttle-time-max": self._throttle.max(now),
            "requests-in-flight": float(sum(conn.in_flight_count for conn in connections.values())),
            **_traffic(self._sent, self._received, now),
            "connection-count": float(len(connections)),
            "connection-creation-total": self._connections_created.total,
            "connection-creation-rate": self._connections_created.rate(now),
            "connection-close-total": self._connections_closed.total,
            "connection-close-rate": self._connections_closed.rate(now),
            "successful-authentication-total": self._authenticated.total,
            "successful-authentication-rate": self._authenticated.rate(now),
            "failed-authentication-total": self._authentication_failed.total,
            "failed-authentication-rate": self._authentication_failed.rate(now),
            "buffer-total-bytes": float(self._buffer_memory),
            "buffer-available-bytes": float(self._buffer_memory - (buffer.used if buffer is not None else 0)),
            "bufferpool-wait-time-total": waits.total * 1e9,
            "bufferpool-wait-time-ns-total": waits.total * 1e9,
            "bufferpool-wait-ratio": waits.rate(now),
            "bufferpool-wait-total": float(waits.count),
            "buffer-exhausted-total": self._buffer_exhausted.total,
            "buffer-exhausted-rate": self._buffer_exhausted.rate(now),
            "waiting-threads": float(buffer.waiting if buffer is not None else 0),
            "metadata-age": now - refreshed if refreshed > -math.inf else NAN,
            "metadata-wait-time-ns-total": self._metadata_wait * 1e9,
            "flush-time-ns-total": self._flush_time * 1e9,
            "producer-id-reset-total": float(self._identity_resets),
        }
        return values


def _traffic(sent: Sensor, received: Sensor, now: float) -> dict[str, float]:
    """Requests and bytes, from the sensors of what was sent and what was received."""
    return {
        "request-total": float(sent.count),
        "request-rate": sent.rate(now, events=True),
        "request-size-avg": sent.avg(now),
        "request-size-max": sent.max(now),
        "response-total": float(received.count),
        "response-rate": received.rate(now, events=True),
        "outgoing-byte-total": sent.total,
        "outgoing-byte-rate": sent.rate(now),
        "incoming-byte-total": received.total,
        "incoming-byte-rate": received.rate(now),
    }


def _running_in(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False

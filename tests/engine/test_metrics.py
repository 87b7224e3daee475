"""Metric values after known workloads, on the scripted cluster in virtual time: what the
Java producer's metrics of the same name would read."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

import aioprod.metrics as metrics_module
from aioprod import Producer
from aioprod.errors import (
    DeliveryTimeoutError,
    InvalidRecordError,
    KafkaTimeoutError,
    MessageTooLargeError,
    NotLeaderOrFollowerError,
    PartitionNotFoundError,
    ProducerClosedError,
    RecordTooLargeError,
    SaslAuthenticationFailedError,
    SendManyError,
)
from aioprod.metrics import BROKER_METRICS, PRODUCER_METRICS, TOPIC_METRICS, MetricsSnapshot
from aioprod.protocol import messages as m_
from aioprod.protocol.framing import decode_request_header, encode_response
from aioprod.protocol.records import RecordBatchBuilder
from tests.brokers import refused_port
from tests.conftest import Scripted
from tests.fakes import cluster as fake_cluster

NOT_LEADER = NotLeaderOrFollowerError.code
SASL_AUTHENTICATION_FAILED = SaslAuthenticationFailedError.code
TS = 1_700_000_000_000


def batch_bytes(values: list[bytes], compression: str = "none") -> tuple[int, int]:
    """(bytes on the wire, bytes uncompressed) of one batch of ``values``, as the producer builds it."""
    builder = RecordBatchBuilder(compression, 16384)
    for value in values:
        builder.append(TS, None, value)
    return len(builder.build(1000, 0, 0)), builder.size_in_bytes


async def test_the_compression_rate_is_javas_ratio_of_the_records_section(scripted: Scripted) -> None:
    # Java's MemoryRecordsBuilder: (batch - its 61-byte header) / the records uncompressed. With
    # the header on both sides, a small gzip batch read 2.5 times Java's figure.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, compression_type="gzip") as p:
        await p.send_and_wait("t", b"a" * 1000, timestamp_ms=TS)
        m, topic = p.metrics(), p.metrics_snapshot().topics["t"]
    wire, raw = batch_bytes([b"a" * 1000], "gzip")
    java = (wire - 61) / (raw - 61)
    assert java < 0.05
    assert m["compression-rate-avg"] == pytest.approx(java, rel=1e-9)
    assert topic["compression-rate"] == pytest.approx(java, rel=1e-9)


async def test_a_known_workload_reads_as_java_would(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    cluster.nodes[1].delay = 0.020  # every produce answered 20 ms after it arrives
    cluster.nodes[1].throttle_ms = 40
    values = [b"a" * 100, b"b" * 200, b"c" * 300]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        await p.partitions_for("t")
        await clock.advance_to_whole_millisecond()
        sent_at = clock.now
        futures = [await p.send("t", v, timestamp_ms=TS) for v in values]
        await asyncio.gather(*futures)
        acked_at = clock.now
        m = p.metrics()
        wire, raw = batch_bytes(values)
        assert m["record-send-total"] == 3
        assert m["records-per-request-avg"] == 3
        assert m["record-retry-total"] == m["record-error-total"] == 0
        assert m["batch-size-avg"] == m["batch-size-max"] == wire
        assert m["compression-rate-avg"] == 1.0
        assert m["record-size-avg"] == pytest.approx((raw - 61) / 3)
        # The batch lingered 5 ms, then its request took the broker's 20 ms.
        assert m["record-queue-time-avg"] == m["record-queue-time-max"] == pytest.approx(5.0, abs=1e-6)
        assert m["request-latency-avg"] == m["request-latency-max"] == pytest.approx(20.0, abs=1e-6)
        assert acked_at - sent_at == pytest.approx(0.025, abs=1e-9)
        assert m["produce-throttle-time-avg"] == m["produce-throttle-time-max"] == 40
        assert m["requests-in-flight"] == 0
        assert m["buffer-available-bytes"] == m["buffer-total-bytes"] == 32 * 1024 * 1024
        # Java's Rate: 3 records over (20 ms since the sample began + one padding window of 30 s).
        assert m["record-send-rate"] == pytest.approx(3 / 30.020, rel=1e-9)

        snapshot = p.metrics_snapshot()
        assert snapshot.topics["t"]["record-send-total"] == 3
        assert snapshot.topics["t"]["byte-total"] == wire
        assert snapshot.topics["t"]["compression-rate"] == 1.0
        assert snapshot.brokers[1]["request-latency-avg"] == pytest.approx(20.0, abs=1e-6)
        assert snapshot.brokers[1]["connection-count"] == 1
        assert snapshot.brokers[1]["response-total"] == snapshot.brokers[1]["request-total"]
        # Requests of every kind (ApiVersions, Metadata, InitProducerId, Produce) count on the wire.
        assert m["request-total"] == sum(b["request-total"] for b in snapshot.brokers.values())
        assert m["outgoing-byte-total"] == sum(b["outgoing-byte-total"] for b in snapshot.brokers.values())
        assert m["outgoing-byte-total"] > wire
        # ... and their answers: producer-wide, the sum of the brokers'.
        assert m["response-total"] == sum(b["response-total"] for b in snapshot.brokers.values()) > 0
        assert m["incoming-byte-total"] == sum(b["incoming-byte-total"] for b in snapshot.brokers.values()) > 0
        # Rates over the same window: the topic's bytes as its records, requests as their bytes.
        assert snapshot.topics["t"]["record-send-rate"] == pytest.approx(3 / 30.020, rel=1e-9)
        assert snapshot.topics["t"]["byte-rate"] == pytest.approx(wire / 30.020, rel=1e-9)
        assert m["request-rate"] / m["outgoing-byte-rate"] == pytest.approx(
            m["request-total"] / m["outgoing-byte-total"]
        )
        assert m["response-rate"] / m["incoming-byte-rate"] == pytest.approx(
            m["response-total"] / m["incoming-byte-total"]
        )

        # 40 s on: a whole window back, the rate is over the real elapsed time; 70 s on the
        # samples have expired: rates read 0, averages NaN, totals stay.
        await clock.advance(40.0)
        assert p.metrics()["record-send-rate"] == pytest.approx(3 / 40.020, rel=1e-9)
        await clock.advance(30.0)
        m = p.metrics()
        assert m["record-send-rate"] == 0.0
        assert math.isnan(m["request-latency-avg"]) and math.isnan(m["batch-size-max"])
        assert m["record-send-total"] == 3


async def test_every_metric_named_in_the_tables_is_reported(scripted: Scripted) -> None:
    scripted.cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap) as p:
        await p.send_and_wait("t", b"v")
        snapshot = p.metrics_snapshot()
    assert isinstance(snapshot, MetricsSnapshot) and snapshot.client_id == "aioprod"
    assert list(snapshot.producer) == list(PRODUCER_METRICS)
    assert list(snapshot.topics["t"]) == list(TOPIC_METRICS)
    assert all(list(values) == list(BROKER_METRICS) for values in snapshot.brokers.values())
    assert all(isinstance(v, float) for v in snapshot.producer.values())


async def test_retries_count_records_and_each_attempt_is_sent(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, retry_backoff_ms=10) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([NOT_LEADER, NOT_LEADER])
        futures = [await p.send("t", b"%d" % i) for i in range(4)]
        await asyncio.gather(*futures)
        m, topic = p.metrics(), p.metrics_snapshot().topics["t"]
    assert m["record-retry-total"] == topic["record-retry-total"] == 8  # 4 records, retried twice
    # As in Java, record-send-total counts records in produce requests: each attempt.
    assert m["record-send-total"] == topic["record-send-total"] == 12
    assert m["record-error-total"] == 0
    assert cluster.partition("t").values == [b"0", b"1", b"2", b"3"]


async def test_failures_count_as_errors_per_topic(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    cluster.create_topic("u", 1)
    cluster.partition("t").max_batch_bytes = 500
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, delivery_timeout_ms=31_000) as p:
        with pytest.raises(MessageTooLargeError):
            await p.send_and_wait("t", b"x" * 1000)
        cluster.nodes[1].stalling = True  # "u" is never answered: its records expire
        start = clock.now
        futures = [await p.send("u", b"v") for _ in range(2)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert clock.now - start == pytest.approx(31.0, abs=0.01)
        assert all(isinstance(r, DeliveryTimeoutError) for r in results)
        m, topics = p.metrics(), p.metrics_snapshot().topics
        cluster.nodes[1].release()
    assert m["record-error-total"] == 3
    assert topics["t"]["record-error-total"] == 1 and topics["u"]["record-error-total"] == 2
    assert m["buffer-available-bytes"] == m["buffer-total-bytes"]


async def test_records_their_call_could_not_queue_count_as_errors(scripted: Scripted) -> None:
    # As Java's doSend: a producer whose every send() times out (no metadata, a full buffer) read
    # 0 errors, and the failure alert of docs/observability.md never fired.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    options: dict[str, Any] = {"buffer_memory": 3000, "batch_size": 1024, "max_block_ms": 200}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, **options) as p:
        await p.send_and_wait("t", b"warm-up")
        with pytest.raises(RecordTooLargeError):
            await p.send("t", b"x" * 5000)  # beyond buffer_memory
        with pytest.raises(RecordTooLargeError):
            await p.send_many("t", [b"small", b"x" * 5000])  # refused whole
        with pytest.raises(KafkaTimeoutError):
            await p.send("missing", b"v")  # no such topic within max_block_ms
        cluster.nodes[1].holding = True  # the buffer fills
        held = [await p.send("t", b"x" * 900) for _ in range(3)]
        with pytest.raises(KafkaTimeoutError):
            await p.send("t", b"y" * 900)
        many = await p.send_many("t", [b"z" * 900] * 3)  # none fits within max_block_ms
        await clock.advance(0.5)
        cluster.nodes[1].release()
        with pytest.raises(SendManyError) as info:
            await many
        await asyncio.gather(*held)
        m, topics = p.metrics(), p.metrics_snapshot().topics
    assert sum(isinstance(r, KafkaTimeoutError) for r in info.value.results) == 3
    assert m["record-error-total"] == 1 + 2 + 1 + 1 + 3
    assert topics["t"]["record-error-total"] == 0  # none reached a batch (Java counts them producer-wide)


async def test_a_split_batch_counts_once_per_split(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 2000
    values = [b"%02d" % i + b"x" * 398 for i in range(8)]  # ~3.3 KB: split in two halves that fit
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100) as p:
        await p.partitions_for("t")
        await asyncio.gather(*[await p.send("t", v) for v in values])
        m = p.metrics()
    assert m["batch-split-total"] == 1
    assert m["record-send-total"] == 16  # the whole batch once, then its two halves
    assert m["record-error-total"] == 0


async def test_buffer_waits_and_exhaustion(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, buffer_memory=3000, batch_size=1024, max_block_ms=2000
    ) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].holding = True  # answers wait until released: the buffer fills
        held = [await p.send("t", b"x" * 900) for _ in range(3)]
        waiting = asyncio.ensure_future(p.send("t", b"y" * 900))
        await clock.advance(0.5)
        m = p.metrics()
        assert m["waiting-threads"] == 1
        assert m["buffer-available-bytes"] < 900
        cluster.nodes[1].release()  # at 0.5 s: the wait ends
        await (await waiting)
        await asyncio.gather(*held)
        m = p.metrics()
        assert m["bufferpool-wait-total"] == 1
        assert m["bufferpool-wait-time-ns-total"] == pytest.approx(0.5e9, rel=1e-3)
        assert m["bufferpool-wait-time-total"] == m["bufferpool-wait-time-ns-total"]
        # Java's ratio: the time waited over the window (here one padding window of 30 s).
        assert m["bufferpool-wait-ratio"] == pytest.approx(0.5 / 30, rel=1e-3)
        assert m["waiting-threads"] == 0
        assert m["buffer-exhausted-total"] == 0

        cluster.nodes[1].holding = True
        held = [await p.send("t", b"x" * 900) for _ in range(3)]
        with pytest.raises(KafkaTimeoutError):
            await p.send("t", b"y" * 900)  # stays full for max_block_ms
        assert p.metrics()["buffer-exhausted-total"] == 1
        cluster.nodes[1].release()
        await asyncio.gather(*held)
        await p.flush()
        m = p.metrics()
    assert m["bufferpool-wait-time-ns-total"] == pytest.approx(2.5e9, rel=1e-3)
    assert m["buffer-available-bytes"] == m["buffer-total-bytes"] == 3000


async def test_metadata_age_and_waits(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap) as p:
        assert math.isnan(p.metrics()["metadata-age"])  # no refresh yet
        await p.partitions_for("t")
        await clock.advance(12.5)
        m = p.metrics()
    assert m["metadata-age"] == pytest.approx(12.5, abs=0.01)
    assert m["metadata-wait-time-ns-total"] == 0  # partitions_for() is not a send() waiting


async def test_metadata_wait_time_counts_the_wait(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=60_000) as p:
        waiting = asyncio.ensure_future(p.send("t", b"v"))  # "t" does not exist yet
        await clock.advance(2.0)
        assert not waiting.done()
        cluster.create_topic("t", 1)
        await (await waiting)
        m = p.metrics()
    assert 2.0e9 <= m["metadata-wait-time-ns-total"] < 3.0e9  # virtual time: the wait and a refresh's backoff


async def test_statistics_callback_gets_a_snapshot_every_interval(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    seen: list[tuple[float, float]] = []

    async def on_statistics(snapshot: MetricsSnapshot) -> None:  # a coroutine is awaited
        seen.append((clock.now, snapshot.producer["record-send-total"]))

    async with Producer(bootstrap_servers=cluster.bootstrap, statistics_interval_ms=1000, stats_cb=on_statistics) as p:
        start = clock.now
        await p.send_and_wait("t", b"v")
        await clock.advance(3.5 - (clock.now - start))
    assert [round(at - start, 6) for at, _ in seen] == [1.0, 2.0, 3.0]
    assert [count for _, count in seen] == [1.0, 1.0, 1.0]


async def test_a_failing_statistics_callback_is_logged_once_and_keeps_being_called(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[MetricsSnapshot] = []

    def broken(snapshot: MetricsSnapshot) -> None:
        calls.append(snapshot)
        raise ValueError("bug in the callback")

    async with Producer(
        bootstrap_servers=scripted.cluster.bootstrap, statistics_interval_ms=100, statistics_callback=broken
    ):
        await scripted.clock.advance(1.05)
    assert len(calls) == 10
    warnings = [r for r in caplog.records if "statistics_callback" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert "bug in the callback" in warnings[0].getMessage()


async def test_metrics_before_start_and_after_close(scripted: Scripted) -> None:
    scripted.cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=scripted.cluster.bootstrap)
    assert p.metrics()["record-send-total"] == 0
    assert p.metrics()["buffer-available-bytes"] == 32 * 1024 * 1024
    async with p:
        await p.send_and_wait("t", b"v")
    m, brokers = p.metrics(), p.metrics_snapshot().brokers
    assert m["record-send-total"] == 1
    assert m["connection-count"] == 0 and m["connection-close-total"] == m["connection-creation-total"] > 0
    assert brokers and all(b["connection-count"] == 0 for b in brokers.values())  # none open now
    assert m["successful-authentication-total"] == m["failed-authentication-total"] == 0  # PLAINTEXT


async def test_one_request_of_several_batches_and_topics(scripted: Scripted) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 2)
    cluster.create_topic("u", 1)
    t0, t1, u0 = [b"a" * 50] * 3, [b"b" * 500], [b"c" * 10] * 2
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=1000) as p:
        await p.partitions_for("t")
        await p.partitions_for("u")
        await clock.advance_to_whole_millisecond()
        futures = [await p.send("t", v, partition=0, timestamp_ms=TS) for v in t0]
        await clock.advance(0.004)  # this batch waits 4 ms longer than the others
        futures += [await p.send("t", v, partition=1, timestamp_ms=TS) for v in t1]
        futures += [await p.send("u", v, partition=0, timestamp_ms=TS) for v in u0]
        await p.flush()  # all three batches at once, in one request
        await asyncio.gather(*futures)
        m, topics = p.metrics(), p.metrics_snapshot().topics
    sizes = [batch_bytes(values)[0] for values in (t0, t1, u0)]
    assert m["records-per-request-avg"] == 6
    assert m["batch-size-avg"] == pytest.approx(sum(sizes) / 3) and m["batch-size-max"] == max(sizes)
    assert m["record-queue-time-max"] == pytest.approx(4.0, abs=1e-6)
    assert m["record-queue-time-avg"] == pytest.approx(4.0 / 3, abs=1e-6)
    assert (topics["t"]["record-send-total"], topics["u"]["record-send-total"]) == (4, 2)
    assert (topics["t"]["byte-total"], topics["u"]["byte-total"]) == (sizes[0] + sizes[1], sizes[2])


def test_metrics_from_another_thread_while_the_loop_stops_are_the_final_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A scrape from another thread (Prometheus, a SyncProducer's caller) asked the producer's
    # loop for the figures; a loop that stopped before running that request (a SyncProducer
    # closing) never answered, and the scrape failed after 10 s, or at once with CancelledError.
    # (FAKE: the request is dropped, as one queued behind the stop; asyncio may still run a
    # callback queued during its last iteration, which left the case to chance.)
    monkeypatch.setattr(metrics_module, "SNAPSHOT_TIMEOUT", 5.0)
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    producer = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")
    asyncio.run_coroutine_threadsafe(producer.start(), loop).result()
    scheduled = threading.Event()

    def noting(callback: Any, *args: Any, **kwargs: Any) -> Any:  # queued behind the stop: never run
        scheduled.set()

    def stop_once_the_scrape_is_scheduled() -> None:  # the loop is busy here meanwhile
        scheduled.wait()
        loop.stop()  # the scrape's callback, queued behind this one, never runs

    loop.call_soon_threadsafe(stop_once_the_scrape_is_scheduled)
    loop.call_soon_threadsafe = noting  # type: ignore[method-assign]
    try:
        figures = producer.metrics()
    finally:
        runner.join()
        del loop.call_soon_threadsafe
        loop.run_until_complete(producer.close(0))
        loop.close()
    assert figures["record-send-total"] == 0


def test_metrics_from_another_thread_while_the_loop_is_blocked_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loop blocked past SNAPSHOT_TIMEOUT (a callback that never yields) raised a TimeoutError
    # with no text at all.
    monkeypatch.setattr(metrics_module, "SNAPSHOT_TIMEOUT", 0.2)
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    producer = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}")
    asyncio.run_coroutine_threadsafe(producer.start(), loop).result()
    unblock = threading.Event()
    loop.call_soon_threadsafe(unblock.wait)  # the loop is stuck here
    try:
        with pytest.raises(TimeoutError, match="the producer's event loop did not take it within 0 s"):
            producer.metrics()
    finally:
        unblock.set()
        asyncio.run_coroutine_threadsafe(producer.close(0), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


def test_a_scrape_leaves_out_a_producer_whose_loop_is_blocked_and_exports_the_others(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The scrape failed whole after SNAPSHOT_TIMEOUT: one blocked loop blinded every producer's metrics.
    from prometheus_client import CollectorRegistry, generate_latest

    from aioprod.prometheus import ProducerCollector

    monkeypatch.setattr(metrics_module, "SNAPSHOT_TIMEOUT", 0.2)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    runners = [threading.Thread(target=loop.run_forever) for loop in loops]
    for runner in runners:
        runner.start()
    producers = [
        Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", client_id=name) for name in ("stuck", "fine")
    ]
    for producer, loop in zip(producers, loops, strict=True):
        asyncio.run_coroutine_threadsafe(producer.start(), loop).result()
    unblock = threading.Event()
    loops[0].call_soon_threadsafe(unblock.wait)  # the first producer's loop is stuck here
    try:
        registry = CollectorRegistry()
        registry.register(ProducerCollector(*producers))
        exported = generate_latest(registry).decode()
    finally:
        unblock.set()
        for producer, loop, runner in zip(producers, loops, runners, strict=True):
            asyncio.run_coroutine_threadsafe(producer.close(0), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            runner.join()
            loop.close()
    assert 'kafka_producer_record_send_total{client_id="fine"} 0.0' in exported
    assert 'client_id="stuck"' not in exported
    assert "producer 'stuck' left out of this scrape: metrics snapshot: the producer's event loop" in caplog.text


class _FakeProducerForScrapes:
    """Stands in for a producer in a collector: its snapshot runs ``take`` (a fault injected)."""

    def __init__(self, client_id: str, take: Any) -> None:
        self.config = SimpleNamespace(client_id=client_id)
        self._take = take

    def metrics_snapshot(self) -> MetricsSnapshot:
        result: MetricsSnapshot = self._take()
        return result


def test_a_scrape_asks_every_producer_at_once_within_one_budget(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # One after the other, each blocked loop held the scrape SNAPSHOT_TIMEOUT (10 s): past
    # Prometheus' default scrape_timeout (10 s), which then dropped the whole scrape anyway.
    from prometheus_client import CollectorRegistry, generate_latest

    import aioprod.prometheus as prometheus_module
    from aioprod.prometheus import ProducerCollector

    monkeypatch.setattr(prometheus_module, "SCRAPE_BUDGET", 0.5)
    fine = Producer(bootstrap_servers="127.0.0.1:9", client_id="fine")
    asked_second, release = threading.Event(), threading.Event()

    def first() -> MetricsSnapshot:
        assert asked_second.wait(30), "the second producer was asked only after the first answered"
        release.wait(30)  # then blocked: a loop that does not take the snapshot
        return fine.metrics_snapshot()

    def second() -> MetricsSnapshot:
        asked_second.set()
        return fine.metrics_snapshot()

    def closed_by_fork() -> MetricsSnapshot:  # a SyncProducer of the parent, in a forked child
        raise ProducerClosedError("this SyncProducer was created in process 1 and cannot be used in process 2")

    registry = CollectorRegistry()
    producers = [
        _FakeProducerForScrapes("blocked", first),
        _FakeProducerForScrapes("fine", second),
        _FakeProducerForScrapes("parent", closed_by_fork),
    ]
    registry.register(ProducerCollector(*producers))
    try:
        exported = generate_latest(registry).decode()
    finally:
        release.set()
    assert 'kafka_producer_record_send_total{client_id="fine"} 0.0' in exported
    assert 'client_id="blocked"' not in exported and 'client_id="parent"' not in exported
    assert "producer 'blocked' left out of this scrape: no snapshot within the scrape's 0.5 s" in caplog.text
    assert "producer 'parent' left out of this scrape: this SyncProducer was created in process 1" in caplog.text


async def test_a_scrape_on_the_producers_own_loop_takes_its_snapshot_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A /metrics handler on the producer's loop (aiohttp, Starlette): a thread asked for the
    # snapshot waited for the very loop the scrape held, for the whole budget, then left it out.
    from prometheus_client import CollectorRegistry, generate_latest

    from aioprod.prometheus import ProducerCollector

    async with Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", client_id="web") as producer:
        registry = CollectorRegistry()
        registry.register(ProducerCollector(producer))
        exported = generate_latest(registry).decode()
        await producer.close(0)
    assert 'kafka_producer_record_send_total{client_id="web"} 0.0' in exported
    assert "left out" not in caplog.text


async def test_a_scrape_on_an_event_loop_asks_producers_of_other_loops_on_threads_within_the_budget(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A /metrics handler on the application's loop waited there for each producer of another
    # loop (a SyncProducer's, another thread's) in turn: a blocked one held the application's
    # loop SNAPSHOT_TIMEOUT (10 s) each, past Prometheus' scrape_timeout, ignoring SCRAPE_BUDGET.
    from prometheus_client import CollectorRegistry, generate_latest

    import aioprod.prometheus as prometheus_module
    from aioprod.prometheus import ProducerCollector

    monkeypatch.setattr(prometheus_module, "SCRAPE_BUDGET", 0.2)
    scrape_thread, release = threading.get_ident(), threading.Event()
    async with Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", client_id="web") as web:

        def blocked_elsewhere() -> MetricsSnapshot:  # a producer whose own loop is blocked
            if threading.get_ident() == scrape_thread:
                raise AssertionError("asked on the scrape's own event loop: its blocked loop holds this one")
            release.wait(30)
            return web.metrics_snapshot()

        registry = CollectorRegistry()
        registry.register(ProducerCollector(web, _FakeProducerForScrapes("stuck", blocked_elsewhere)))
        try:
            exported = generate_latest(registry).decode()
        finally:
            release.set()
        await web.close(0)
    assert 'kafka_producer_record_send_total{client_id="web"} 0.0' in exported
    assert 'client_id="stuck"' not in exported
    assert "producer 'stuck' left out of this scrape: no snapshot within the scrape's 0.2 s" in caplog.text


def test_a_producer_added_while_a_scrape_runs_does_not_fail_the_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another thread added a producer while a scrape started its threads: the scrape read the
    # collector's producers again, found one it had started no thread for, and failed (KeyError),
    # exporting nothing of any producer. (FAKE: the add is made to land in that window.)
    from prometheus_client import CollectorRegistry, generate_latest

    import aioprod.prometheus as prometheus_module
    from aioprod.prometheus import ProducerCollector

    def unstarted(client_id: str) -> Producer:
        return Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", client_id=client_id)

    collector, adder, added = ProducerCollector(unstarted("base")), unstarted("adder"), threading.Event()

    def adding() -> MetricsSnapshot:  # on the scrape's thread for "adder": meanwhile, a producer comes
        collector.add(unstarted("late"))
        added.set()
        return adder.metrics_snapshot()

    collector.add(_FakeProducerForScrapes("adder", adding))
    # The scrape's next step (its deadline) waits for the add.
    monkeypatch.setattr(prometheus_module, "time", SimpleNamespace(monotonic=lambda: added.wait(30) and 0.0))
    registry = CollectorRegistry()
    registry.register(collector)
    exported = generate_latest(registry).decode()
    assert 'kafka_producer_record_send_total{client_id="base"} 0.0' in exported
    assert 'kafka_producer_record_send_total{client_id="adder"} 0.0' in exported


async def test_records_refused_for_a_partition_the_topic_lacks_count_as_errors(scripted: Scripted) -> None:
    # PartitionNotFoundError is a KafkaError: counted as Java counts its TimeoutException there.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap) as p:
        await p.partitions_for("t")
        with pytest.raises(PartitionNotFoundError):
            await p.send("t", b"v", partition=5)
        with pytest.raises(PartitionNotFoundError):
            await p.send_many("t", [b"a", b"b", b"c"], partition=5)
        assert p.metrics()["record-error-total"] == 1 + 3


async def test_averages_and_maxima_of_requests_that_differ(scripted: Scripted) -> None:
    # Two produce requests, answered 10 ms and 30 ms after they were written, throttled 0 and
    # 40 ms: the averages are 20, the maxima 30 and 40, producer-wide and per broker.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.partitions_for("t")
        node.delay = 0.010
        await p.send_and_wait("t", b"a")
        node.delay, node.throttle_ms = 0.030, 40
        await p.send_and_wait("t", b"b")
        m, broker = p.metrics(), p.metrics_snapshot().brokers[1]
    assert m["request-latency-avg"] == broker["request-latency-avg"] == pytest.approx(20.0, abs=1e-6)
    assert m["request-latency-max"] == broker["request-latency-max"] == pytest.approx(30.0, abs=1e-6)
    assert (m["produce-throttle-time-avg"], m["produce-throttle-time-max"]) == (20, 40)


async def test_a_batch_that_fails_counts_each_of_its_records_for_its_topic(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=50) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([InvalidRecordError.code])  # not retriable: the batch fails
        futures = [await p.send("t", b"%d" % i) for i in range(3)]  # one batch
        results = await asyncio.gather(*futures, return_exceptions=True)
        m, topic = p.metrics(), p.metrics_snapshot().topics["t"]
    assert all(isinstance(r, InvalidRecordError) for r in results)
    assert m["record-error-total"] == topic["record-error-total"] == 3


async def test_bytes_out_and_in_are_the_bytes_on_the_wire(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the broker read from the producer's connections and wrote to them, size prefixes
    # included, is what outgoing-byte-total and incoming-byte-total say, producer-wide and per broker.
    from tests.fakes import network

    wire = {"in": 0, "out": 0}
    deliver, send = network.MemoryTransport.write, network.ServerSide.send

    def written(self: network.MemoryTransport, data: Any) -> None:
        wire["out"] += len(data)
        deliver(self, data)

    def answered(self: network.ServerSide, data: bytes) -> None:
        wire["in"] += len(data)
        send(self, data)

    monkeypatch.setattr(network.MemoryTransport, "write", written)
    monkeypatch.setattr(network.ServerSide, "send", answered)
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        for i in range(3):
            await p.send_and_wait("t", b"v" * (10 * i))
        m, brokers = p.metrics(), p.metrics_snapshot().brokers
    assert (m["outgoing-byte-total"], m["incoming-byte-total"]) == (wire["out"], wire["in"])
    assert sum(b["outgoing-byte-total"] for b in brokers.values()) == wire["out"]
    assert sum(b["incoming-byte-total"] for b in brokers.values()) == wire["in"]


async def test_authentications_count_as_they_went(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    # SASL (OAUTHBEARER) on the scripted cluster: accepted, refused, and a broker not there at all.
    from aioprod.errors import AuthenticationError
    from aioprod.net.auth import OAuthBearerToken
    from tests.net.test_reauthentication import accept_every_sasl_client, oauth_producer

    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    cluster.create_topic("t", 1)

    def token() -> OAuthBearerToken:
        return OAuthBearerToken("token", time.time() + 3600)

    async with oauth_producer(cluster, token, linger_ms=0) as p:
        await p.send_and_wait("t", b"v")
        m = p.metrics()
    assert m["successful-authentication-total"] == m["connection-creation-total"] >= 1
    assert m["failed-authentication-total"] == 0

    cluster.stop(1)  # refused: no authentication at all
    async with oauth_producer(cluster, token, max_block_ms=500) as p:
        with pytest.raises(KafkaTimeoutError):
            await p.send("t", b"v")
        m = p.metrics()
    assert m["successful-authentication-total"] == m["failed-authentication-total"] == 0

    cluster.start(1)
    handle = fake_cluster.ScriptedCluster.handle

    async def refusing(self: fake_cluster.ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        header, _ = decode_request_header(frame)
        if header.api_key == m_.SaslAuthenticateRequest.API_KEY:
            answer = m_.SaslAuthenticateResponse(SASL_AUTHENTICATION_FAILED, "bad token", b"")
            return encode_response(answer, header.api_version, header.correlation_id)
        return await handle(self, conn, frame)

    monkeypatch.setattr(fake_cluster.ScriptedCluster, "handle", refusing)
    async with oauth_producer(cluster, token, max_block_ms=500) as p:
        with pytest.raises((AuthenticationError, KafkaTimeoutError)):
            await p.send("t", b"v")
        m = p.metrics()
    assert m["failed-authentication-total"] >= 1
    assert m["successful-authentication-total"] == m["connection-creation-total"] == 0

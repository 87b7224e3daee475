"""OpenTelemetry spans and metrics per send, checked with the SDK's in-memory exporters, on
the scripted cluster (a failure the broker answers, a failure send() raises)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from aioprod import Producer
from aioprod.errors import ConfigError, InvalidRecordError, RecordTooLargeError
from aioprod.tracing import Telemetry
from tests.conftest import Scripted


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: Telemetry

    def finished(self) -> tuple[ReadableSpan, ...]:
        return self.spans.get_finished_spans()

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(exporter, reader, Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider))
    tracer_provider.shutdown()
    meter_provider.shutdown()


async def test_a_failed_delivery_ends_its_span_with_the_error(scripted: Scripted, otel: Otel) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=otel.telemetry) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([InvalidRecordError.code])  # not retriable
        future = await p.send("t", b"v", partition=0)
        future.cancel()  # the caller giving up on the outcome does not lose the span's
        await asyncio.sleep(0.01)
    (span,) = otel.finished()
    assert span.name == "send t" and span.kind is SpanKind.PRODUCER
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "aioprod.errors.InvalidRecordError"
    assert span.attributes["messaging.destination.partition.id"] == "0"
    assert "messaging.kafka.offset" not in span.attributes
    (sent,) = otel.points("messaging.client.sent.messages")
    assert sent.value == 1 and sent.attributes["error.type"] == "aioprod.errors.InvalidRecordError"


async def test_an_error_raised_by_send_ends_its_span(scripted: Scripted, otel: Otel) -> None:
    scripted.cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=scripted.cluster.bootstrap, max_request_size=1000, telemetry=otel.telemetry
    ) as p:
        with pytest.raises(RecordTooLargeError):
            await p.send("t", b"x" * 5000)
    (span,) = otel.finished()
    assert span.attributes is not None and span.attributes["error.type"] == "aioprod.errors.RecordTooLargeError"
    assert span.events[0].name == "exception"


async def test_send_many_is_one_span_and_counts_every_record(scripted: Scripted, otel: Otel) -> None:
    scripted.cluster.create_topic("t", 2)
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap, telemetry=otel.telemetry) as p:
        results = await (await p.send_many("t", [b"a", b"b", b"c"], partition=1))
    (span,) = otel.finished()
    assert span.attributes is not None
    assert span.attributes["messaging.batch.message_count"] == 3
    assert span.attributes["messaging.destination.partition.id"] == "1"
    assert [md.partition for md in results] == [1, 1, 1]
    (sent,) = otel.points("messaging.client.sent.messages")
    assert sent.value == 3 and "error.type" not in sent.attributes
    batches = scripted.cluster.partition("t", 1).log
    assert sum(len(b.values) for b in batches) == 3


async def test_telemetry_option_is_checked(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"telemetry must be True or an aioprod\.tracing\.Telemetry"):
        Producer(bootstrap_servers=scripted.cluster.bootstrap, telemetry="yes")
    import aioprod.tracing

    monkeypatch.setattr(aioprod.tracing, "opentelemetry_missing", lambda: "the opentelemetry-api package")
    with pytest.raises(ConfigError, match="telemetry needs the opentelemetry-api package"):
        Producer(bootstrap_servers=scripted.cluster.bootstrap, telemetry=True)


async def test_a_cancelled_send_many_future_still_ends_its_span_with_the_outcome(
    scripted: Scripted, otel: Otel
) -> None:
    # The caller's future was the one watched: cancelled (asyncio.wait_for timing out, say), the
    # span ended with no outcome and the records, which still went and failed, were not counted.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=otel.telemetry) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([InvalidRecordError.code])
        future = await p.send_many("t", [b"a", b"b"], partition=0)
        future.cancel()
        await p.flush()
    (span,) = otel.finished()
    assert span.attributes is not None and span.attributes.get("error.type") == "aioprod.errors.InvalidRecordError"
    assert sum(point.value for point in otel.points("messaging.client.sent.messages")) == 2


async def test_send_many_takes_a_generator_with_telemetry_on(scripted: Scripted, otel: Otel) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=otel.telemetry) as p:
        metadata = await (await p.send_many("t", (b"%d" % i for i in range(3))))  # type: ignore[arg-type]
    assert len(metadata) == 3
    (span,) = otel.finished()
    assert span.attributes is not None and span.attributes["messaging.batch.message_count"] == 3


async def test_a_send_many_cancelled_part_way_counts_the_records_it_queued_by_their_outcome(
    scripted: Scripted, otel: Otel
) -> None:
    # Cancelled while waiting for buffer memory, send_many() still delivers what it queued;
    # the telemetry counted all 20 records as failed (CancelledError) and none delivered.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    options = {"linger_ms": 0, "buffer_memory": 4000, "batch_size": 1024, "telemetry": otel.telemetry}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        await p.partitions_for("t")
        cluster.nodes[1].holding = True  # the buffer fills part-way through the call
        task = asyncio.ensure_future(p.send_many("t", [b"x" * 500] * 20))
        await clock.advance(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cluster.nodes[1].release()
        await p.flush()
    delivered = len(cluster.partition("t").values)
    points = otel.points("messaging.client.sent.messages")
    assert 0 < delivered < 20
    assert sum(pt.value for pt in points if "error.type" not in pt.attributes) == delivered
    assert (
        sum(pt.value for pt in points if pt.attributes.get("error.type") == "asyncio.exceptions.CancelledError")
        == 20 - delivered
    )
    (span,) = otel.finished()
    assert span.status.status_code is not StatusCode.ERROR

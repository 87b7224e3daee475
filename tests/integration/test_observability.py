"""Metrics, Prometheus exposition and OpenTelemetry spans against a real broker (Tansu),
read back with librdkafka."""

from __future__ import annotations

import asyncio
import math

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aioprod import Producer, SyncProducer
from aioprod.prometheus import ProducerCollector
from aioprod.tracing import Telemetry
from tests.brokers import TansuBroker
from tests.readback import read_topic

pytestmark = pytest.mark.integration


async def test_n_records_sent_read_as_n(tansu_broker: TansuBroker, topic: str) -> None:
    values = [b"%04d" % i + b"x" * 96 for i in range(1000)]
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, compression_type="lz4") as p:
        futures = [await p.send(topic, v) for v in values[:500]]
        bulk = await p.send_many(topic, values[500:])
        await p.flush()
        await asyncio.gather(*futures, bulk)
        m, snapshot = p.metrics(), p.metrics_snapshot()
    assert m["record-send-total"] == snapshot.topics[topic]["record-send-total"] == 1000
    assert m["record-error-total"] == m["record-retry-total"] == 0
    # After flush every byte of buffer memory is back, and nothing is in flight.
    assert m["buffer-available-bytes"] == m["buffer-total-bytes"]
    assert m["requests-in-flight"] == 0
    assert 0 < m["compression-rate-avg"] < 1  # lz4 finds the repeated x's
    assert m["batch-size-max"] <= 16384 and m["records-per-request-avg"] > 1
    assert m["request-latency-avg"] > 0 and m["flush-time-ns-total"] > 0
    assert m["outgoing-byte-total"] >= snapshot.topics[topic]["byte-total"]
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 1000


async def test_prometheus_exposition_parses_and_carries_the_java_names(tansu_broker: TansuBroker, topic: str) -> None:
    registry = CollectorRegistry()
    async with (
        Producer(bootstrap_servers=tansu_broker.bootstrap, client_id="svc-a") as a,
        Producer(bootstrap_servers=tansu_broker.bootstrap, client_id="svc-b") as b,
    ):
        registry.register(ProducerCollector(a, b))
        await (await a.send_many(topic, [b"1", b"2", b"3"]))
        await b.send_and_wait(topic, b"4")
        # A scrape comes from the exporter's thread: the snapshot is taken on the loop.
        text = (await asyncio.to_thread(generate_latest, registry)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("kafka_producer_record_send_total", (("client_id", "svc-a"),))] == 3
    assert samples[("kafka_producer_record_send_total", (("client_id", "svc-b"),))] == 1
    assert samples[("kafka_producer_topic_record_send_total", (("client_id", "svc-a"), ("topic", topic)))] == 3
    assert samples[("kafka_producer_buffer_total_bytes", (("client_id", "svc-a"),))] == 32 * 1024 * 1024
    nodes = [labels for name, labels in samples if name == "kafka_producer_node_request_latency_avg"]
    assert nodes and all(dict(labels)["node_id"].lstrip("-").isdigit() for labels in nodes)
    assert samples[("kafka_producer_produce_throttle_time_max", (("client_id", "svc-a"),))] == 0  # Tansu: no quotas
    assert math.isnan(samples[("kafka_producer_metadata_age", (("client_id", "svc-b"),))]) is False
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["kafka_producer_record_send"] == "counter"
    assert families["kafka_producer_request_latency_avg"] == "gauge"
    with pytest.raises(ValueError, match="client_id 'svc-a'"):
        ProducerCollector(a, a)


def test_sync_producer_metrics_and_collector(tansu_broker: TansuBroker, topic: str) -> None:
    with SyncProducer(bootstrap_servers=tansu_broker.bootstrap, client_id="sync") as p:
        p.send(topic, b"v").result(30)
        registry = CollectorRegistry()
        registry.register(ProducerCollector(p))
        assert p.metrics()["record-send-total"] == 1
        text = generate_latest(registry).decode()
    assert 'kafka_producer_record_send_total{client_id="sync"} 1.0' in text


async def test_a_span_per_send_and_trace_context_in_the_headers(tansu_broker: TansuBroker, topic: str) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    async with Producer(bootstrap_servers=tansu_broker.bootstrap, client_id="traced", telemetry=telemetry) as p:
        with tracer_provider.get_tracer("app").start_as_current_span("handle-request") as parent:
            md = await p.send_and_wait(topic, b"v1", key=b"k", headers=[("app", b"x")])
        mds = await (await p.send_many(topic, [b"v2", b"v3"], partition=md.partition))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    send = [s for s in exporter.get_finished_spans() if s.name == f"send {topic}"]
    assert len(send) == 2  # one per send() call, one for the send_many call
    one = next(s for s in send if s.attributes and "messaging.batch.message_count" not in s.attributes)
    assert one.kind is SpanKind.PRODUCER
    assert one.parent is not None and one.parent.span_id == parent.get_span_context().span_id
    assert one.attributes == {
        "messaging.system": "kafka",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": topic,
        "messaging.client.id": "traced",
        "messaging.destination.partition.id": str(md.partition),
        "messaging.kafka.offset": md.offset,
        "server.address": "127.0.0.1",
        "server.port": tansu_broker.port,
    }
    assert spans["handle-request"].context.trace_id == one.context.trace_id
    # The records carry each span's W3C trace context; the application's header is kept.
    many = next(s for s in send if s is not one)
    consumed = {c.value: dict(c.headers) for c in read_topic(tansu_broker.bootstrap, topic)}
    traceparent = f"00-{one.context.trace_id:032x}-{one.context.span_id:016x}-{one.context.trace_flags:02x}".encode()
    assert consumed[b"v1"] == {"app": b"x", "traceparent": traceparent}
    many_parent = f"00-{many.context.trace_id:032x}-{many.context.span_id:016x}-{many.context.trace_flags:02x}".encode()
    assert consumed[b"v2"]["traceparent"] == consumed[b"v3"]["traceparent"] == many_parent
    assert [m.offset for m in mds] == [md.offset + 1, md.offset + 2]
    data = reader.get_metrics_data()
    assert data is not None
    by_name = {
        metric.name: metric.data.data_points
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert sum(point.value for point in by_name["messaging.client.sent.messages"]) == 3
    assert sum(point.count for point in by_name["messaging.client.operation.duration"]) == 2
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing leaked into the caller's context

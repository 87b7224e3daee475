"""OpenTelemetry spans and metrics per send, checked with the SDK's in-memory exporters, on
the scripted cluster (a failure the broker answers, a failure send() raises)."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import aioprod.tracing
from aioprod import Producer
from aioprod.errors import ConfigError, InvalidRecordError, RecordTooLargeError, SendManyError
from aioprod.producer.partitioner import partition_for_key
from aioprod.protocol import messages as m
from aioprod.protocol.records import read_batches
from aioprod.tracing import Telemetry
from tests.conftest import Scripted
from tests.fakes.cluster import ScriptedCluster


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
    assert sent.attributes["messaging.destination.partition.id"] == "0"


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
    assert "messaging.destination.partition.id" not in span.attributes  # it never had one


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
    scripted: Scripted, otel: Otel, caplog: pytest.LogCaptureFixture
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
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # the cancelled copy is left alone


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


def written(cluster: ScriptedCluster) -> dict[bytes | None, list[tuple[str, bytes]]]:
    """Each record's headers as the broker got them, in order, by the record's value."""
    records = {}
    for request in cluster.requests_of(m.ProduceRequest):
        for topic in request.body.topic_data:
            for part in topic.partition_data:
                for batch in read_batches(part.records):
                    for record in batch.records:
                        records[record.value] = [tuple(h) for h in record.headers]
    return records


async def test_a_sends_span_and_metrics_name_its_partition_offset_and_leader(
    scripted: Scripted, otel: Otel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operation's duration on the loop's (virtual) clock: the broker answers 20 ms after.
    monkeypatch.setattr(aioprod.tracing, "time", SimpleNamespace(monotonic=scripted.clock.time))
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.nodes[1].delay = 0.020
    async with Producer(
        bootstrap_servers=cluster.bootstrap, client_id="svc", linger_ms=0, telemetry=otel.telemetry
    ) as p:
        await p.partitions_for("t")
        md = await p.send_and_wait("t", b"v")
    assert md.offset == 0  # the first record: offset 0 is an offset too
    (span,) = otel.finished()
    leader = {"server.address": "127.0.0.1", "server.port": 9091}
    common = {
        "messaging.system": "kafka",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "t",
        "messaging.destination.partition.id": "0",
    }
    assert span.attributes == {**common, **leader, "messaging.client.id": "svc", "messaging.kafka.offset": 0}
    (sent,) = otel.points("messaging.client.sent.messages")
    assert sent.value == 1 and sent.attributes == {**common, **leader}
    (duration,) = otel.points("messaging.client.operation.duration")
    assert (duration.count, duration.sum) == (1, pytest.approx(0.020))
    assert duration.attributes == {**common, **leader}
    # The semantic conventions' advice for this histogram, in seconds.
    assert tuple(duration.explicit_bounds) == (
        0.005,
        0.01,
        0.025,
        0.05,
        0.075,
        0.1,
        0.25,
        0.5,
        0.75,
        1,
        2.5,
        5,
        7.5,
        10,
    )


def keys_on(partition: int, count: int) -> list[bytes]:
    """``count`` keys the default partitioner puts on ``partition`` of 2."""
    return [k for k in (b"k%d" % i for i in range(100)) if partition_for_key(k, 2) == partition][:count]


#: Five records' keys: two on partition 0, three on partition 1.
KEYS_OVER_TWO_PARTITIONS = keys_on(0, 2) + keys_on(1, 3)


def topic_on_two_leaders(scripted: Scripted) -> ScriptedCluster:
    """Topic "t": partition 0 led by broker 1 (port 9091), partition 1 by broker 2 (9092)."""
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2])
    return cluster


async def test_send_many_over_partitions_is_one_span_and_one_duration_per_partition(
    scripted: Scripted, otel: Otel
) -> None:
    # Keys spread the call over partitions 0 (led by broker 1) and 1 (broker 2): its span names
    # neither, the metrics count each partition's records, with one duration for each.
    cluster = topic_on_two_leaders(scripted)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=otel.telemetry) as p:
        await (await p.send_many("t", [b"v"] * 5, keys=KEYS_OVER_TWO_PARTITIONS))
    (span,) = otel.finished()
    assert span.attributes is not None and span.attributes["messaging.batch.message_count"] == 5
    assert "messaging.destination.partition.id" not in span.attributes and "server.port" not in span.attributes
    sent = {
        pt.attributes["messaging.destination.partition.id"]: pt for pt in otel.points("messaging.client.sent.messages")
    }
    assert (sent["0"].value, sent["0"].attributes["server.port"]) == (2, 9091)
    assert (sent["1"].value, sent["1"].attributes["server.port"]) == (3, 9092)
    durations = otel.points("messaging.client.operation.duration")
    assert sorted(pt.attributes["messaging.destination.partition.id"] for pt in durations) == ["0", "1"]
    assert [pt.count for pt in durations] == [1, 1]


async def test_a_send_many_that_fails_in_part_is_failed_and_names_no_partition_of_its_successes(
    scripted: Scripted, otel: Otel
) -> None:
    # Partition 0's records (broker 1) are refused, partition 1's (broker 2) written: the span
    # named partition 1 and broker 2, whose records were fine, beside the other broker's error.
    cluster = topic_on_two_leaders(scripted)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=otel.telemetry) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([InvalidRecordError.code])
        with pytest.raises(SendManyError):
            await (await p.send_many("t", [b"v"] * 5, keys=KEYS_OVER_TWO_PARTITIONS))
    (span,) = otel.finished()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["error.type"] == "aioprod.errors.InvalidRecordError"
    assert "messaging.destination.partition.id" not in span.attributes and "server.address" not in span.attributes
    sent = {pt.attributes.get("error.type"): pt for pt in otel.points("messaging.client.sent.messages")}
    assert sent["aioprod.errors.InvalidRecordError"].value == 2
    assert sent[None].value == 3 and sent[None].attributes["messaging.destination.partition.id"] == "1"


async def test_trace_context_headers_replace_the_records_own_and_keep_the_rest(scripted: Scripted, otel: Otel) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    stale = b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=otel.telemetry) as p:
        await p.send_and_wait("t", b"listed", headers=[("app", b"x"), ("traceparent", stale)])
        await p.send_and_wait("t", b"mapping", headers={"app": b"y"})
        await (await p.send_many("t", [b"many-1", b"many-2"], headers=[[("app", b"1")], [("app", b"2")]]))
        await p.send_and_wait("t", b"")  # an empty value, not a tombstone
        await p.send_and_wait("t", None)
    spans = otel.finished()
    records = written(cluster)
    for value, app, span in [
        (b"listed", b"x", spans[0]),
        (b"mapping", b"y", spans[1]),
        (b"many-1", b"1", spans[2]),
        (b"many-2", b"2", spans[2]),
    ]:
        context = span.context
        traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}".encode()
        assert records[value] == [("app", app), ("traceparent", traceparent)], value
    assert [s.attributes is not None and s.attributes.get("messaging.kafka.message.tombstone") for s in spans[3:]] == [
        None,
        True,
    ]


async def test_without_propagation_records_carry_no_trace_context(scripted: Scripted, otel: Otel) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    telemetry = dataclasses.replace(otel.telemetry, propagate=False)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=telemetry) as p:
        await p.send_and_wait("t", b"one", headers=[("app", b"x")])
        await (await p.send_many("t", [b"two"]))
    assert written(cluster) == {b"one": [("app", b"x")], b"two": []}
    assert len(otel.finished()) == 2  # still traced


class FakeFaultySpanProcessor(SpanProcessor):
    """A span processor that raises (a vendor's, say): the SDK lets it through span start and end."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        raise RuntimeError("span processor broke on start")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("span processor broke on end")


class FakeFaultyPropagator(TraceContextTextMapPropagator):
    """A propagator that raises on inject: the global one, composite or not, lets it through."""

    def inject(self, carrier: Any, context: Context | None = None, setter: Any = None) -> None:
        raise ValueError("propagator broke")


async def test_telemetry_that_raises_never_breaks_or_changes_a_send(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    # A span processor raising in on_start refused the record (send() raised its RuntimeError);
    # one raising in on_end replaced send()'s own error (RecordTooLargeError) with it, and logged an
    # asyncio "Exception in callback" ERROR per record acknowledged. A propagator raising refused it too.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(FakeFaultySpanProcessor())
    telemetry = Telemetry(tracer_provider=tracer_provider)
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(FakeFaultyPropagator())
    try:
        async with Producer(
            bootstrap_servers=cluster.bootstrap, linger_ms=0, max_request_size=1000, telemetry=telemetry
        ) as p:
            first = await p.send_and_wait("t", b"one", headers=[("app", b"x")])
            many = await (await p.send_many("t", [b"two", b"three"]))
            with pytest.raises(RecordTooLargeError):
                await p.send("t", b"x" * 5000)
    finally:
        propagate.set_global_textmap(previous)
    assert (first.offset, [md.offset for md in many]) == (0, [1, 2])
    assert written(cluster) == {b"one": [("app", b"x")], b"two": [], b"three": []}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    warned = [r.getMessage() for r in caplog.records if r.name == "aioprod.tracing"]
    assert warned and all("the records are sent regardless" in line for line in warned)
    assert len(warned) == 2  # once per kind of error (RuntimeError, ValueError), then rate-limited


def _json_or_tombstone(value: Any) -> bytes | None:
    """A value serializer: JSON, and None (a tombstone) for "DELETE"."""
    return None if value == "DELETE" else json.dumps(value).encode()


async def test_with_a_value_serializer_the_record_written_says_whether_it_is_a_tombstone(
    scripted: Scripted, otel: Otel
) -> None:
    # The span said tombstone for a None given, which the serializer wrote as b"null", and not for
    # the value the serializer made None (a tombstone on the broker).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)

    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, value_serializer=_json_or_tombstone, telemetry=otel.telemetry
    ) as p:
        await p.send_and_wait("t", None, key=b"a")
        await p.send_and_wait("t", "DELETE", key=b"b")
        await p.send_and_wait("t", {"n": 1}, key=b"c")
    assert cluster.partition("t").values == [b"null", None, b'{"n": 1}']
    tombstones = [(s.attributes or {}).get("messaging.kafka.message.tombstone") for s in otel.finished()]
    assert tombstones == [None, True, None]


@pytest.mark.parametrize(
    "values, headers",
    [
        ([b"a", b"b"], {"app": b"x"}),  # one mapping for every record
        ([b"a", b"b"], b"ab"),
        ([b"a", b"b"], 5),
        ([b"a", b"b"], (h for h in [[("app", b"x")]])),  # a generator one item short
        (5, None),
    ],
)
async def test_send_many_refuses_bad_arguments_as_it_does_without_telemetry(
    scripted: Scripted, otel: Otel, values: Any, headers: Any
) -> None:
    # With telemetry, the wrapper took headers apart first: one mapping for all records was
    # "headers has 1 items but values has 2", bytes "headers must be a list of ... pairs, got int",
    # a number "'int' object is not iterable"; values that were none "object of type 'int' has no len()".
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    refusals = []
    for telemetry in (None, otel.telemetry):
        given = (h for h in [[("app", b"x")]]) if isinstance(headers, Iterator) else headers  # a fresh one each time
        async with Producer(bootstrap_servers=cluster.bootstrap, telemetry=telemetry) as p:
            with pytest.raises((TypeError, ValueError)) as refused:
                await p.send_many("t", values, headers=given)
            refusals.append((type(refused.value), str(refused.value)))
    assert refusals[0] == refusals[1]
    assert "sequence" in refusals[0][1] or "items but values has 2" in refusals[0][1]
    assert cluster.partition("t").values == []
    (span,) = otel.finished()
    assert span.status.status_code is StatusCode.ERROR


async def test_a_send_that_fails_after_serializing_a_tombstone_says_tombstone(
    scripted: Scripted, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    # The tombstone attribute was set after send()'s error had ended the span: dropped (the span
    # said no tombstone), and OpenTelemetry's SDK logged "Setting attribute on ended span".
    cluster = scripted.cluster
    cluster.create_topic("t", 1)

    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        max_request_size=1000,
        value_serializer=_json_or_tombstone,
        telemetry=otel.telemetry,
    ) as p:
        with pytest.raises(RecordTooLargeError):
            await p.send("t", "DELETE", key=b"k" * 5000)
    (span,) = otel.finished()
    assert (span.attributes or {}).get("messaging.kafka.message.tombstone") is True
    assert span.status.status_code is StatusCode.ERROR
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING]


async def test_a_traced_send_closed_outside_its_task_ends_its_span_with_no_error_of_its_own(
    scripted: Scripted, otel: Otel
) -> None:
    # A send() suspended in Producer.send (waiting for metadata) whose coroutine is closed from
    # another context (a pending task collected after its loop closed): resetting the tombstone
    # contextvar raised ValueError ("created in a different Context") over the GeneratorExit, out of
    # close() as an "Exception ignored", and the span ended with error.type ValueError.
    cluster = scripted.cluster
    async with Producer(
        bootstrap_servers=cluster.bootstrap, value_serializer=json_bytes, telemetry=otel.telemetry
    ) as p:
        send = p.send("not-yet", {"n": 1})
        contextvars.copy_context().run(send.send, None)  # its first step, in a context of its own
        send.close()  # here, in the test's context (a finalizer's)
    (span,) = otel.finished()
    assert (span.attributes or {}).get("error.type") == "GeneratorExit"


def json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()

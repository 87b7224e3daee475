"""OpenTelemetry for the producer: a PRODUCER span per send, the trace context in each
record's headers, and the messaging client metrics, after the semantic conventions for
Kafka (``send {topic}``, ``messaging.system=kafka``, destination, partition, offset,
``error.type``; ``messaging.client.operation.duration`` and
``messaging.client.sent.messages``).

Asked for with ``Producer(telemetry=True)`` or ``telemetry=Telemetry(...)``; it needs the
``opentelemetry-api`` package (``pip install 'aioprod[opentelemetry]'``), which is
imported only then. Without telemetry nothing of this module runs and ``send()`` costs
what it did. Spans and metrics go to the providers given, else to OpenTelemetry's global
ones, which do nothing until an SDK is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib.util
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from aioprod.event_log import EventLog
from aioprod.producer.producer import is_many_argument, send_many_values

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from aioprod.cluster.metadata import ClusterSnapshot
    from aioprod.config import ProducerConfig
    from aioprod.producer.record_future import RecordFuture, RecordMetadata

log = logging.getLogger(__name__)

#: Whether the value send() serialized last, in this task, came out None (a tombstone): with a
#: value serializer, the value given does not say (None may be written as b"null", a value as None).
_serialized_none: contextvars.ContextVar[bool] = contextvars.ContextVar("aioprod_serialized_none", default=False)

#: The semantic conventions' advice for ``messaging.client.operation.duration``, in seconds.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)

Send = TypeVar("Send", bound=Callable[..., Awaitable["RecordFuture"]])
SendMany = TypeVar("SendMany", bound=Callable[..., Awaitable["asyncio.Future[list[RecordMetadata]]"]])


@dataclass(frozen=True, slots=True)
class Telemetry:
    """The ``telemetry`` option: where spans and metrics go, and whether records carry
    the trace context. ``Producer(telemetry=True)`` is ``Telemetry()``."""

    #: An ``opentelemetry.trace.TracerProvider``; None: the global one.
    tracer_provider: Any = None
    #: An ``opentelemetry.metrics.MeterProvider``; None: the global one.
    meter_provider: Any = None
    #: Inject the send span's context into each record's headers (W3C ``traceparent``,
    #: or whatever propagators OpenTelemetry is configured with), so consumers continue
    #: the trace. ``send_many`` then encodes records one by one (they all have headers).
    propagate: bool = True


def opentelemetry_missing() -> str | None:
    """What to install for telemetry, or None when OpenTelemetry's API is there."""
    if importlib.util.find_spec("opentelemetry") is None or importlib.util.find_spec("opentelemetry.trace") is None:
        return "the opentelemetry-api package: pip install 'aioprod[opentelemetry]'"
    return None


class SendTelemetry:
    """Wraps ``Producer.send`` and ``send_many``: a span from the call to the outcome."""

    def __init__(self, options: Telemetry, config: ProducerConfig, cluster: Callable[[], ClusterSnapshot]) -> None:
        from opentelemetry import metrics, propagate, trace

        from aioprod import __version__

        self._trace = trace
        self._tracer = trace.get_tracer("aioprod", __version__, tracer_provider=options.tracer_provider)
        meter = metrics.get_meter("aioprod", __version__, meter_provider=options.meter_provider)
        self._duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of messaging operation initiated by a producer or consumer client.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._sent = meter.create_counter(
            "messaging.client.sent.messages",
            unit="{message}",
            description="Number of messages producer attempted to send to the broker.",
        )
        self._inject = propagate.inject if options.propagate else None
        self._client_id = config.client_id
        self._cluster = cluster
        #: OpenTelemetry's SDK lets what a span processor, propagator or metric reader raises
        #: through: said here (rate-limited), never to the send, whose record goes on.
        self._events = EventLog(config.client_id)
        self._serializes_values = False

    def _failed(self, exc: Exception) -> None:
        self._events.problem(
            log, "telemetry", type(exc).__name__, "OpenTelemetry raised %r; the records are sent regardless", exc
        )

    # -- the wrappers ------------------------------------------------------------------

    def watched_serializer(self, serializer: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``serializer``, telling the send span whether the record it makes is a tombstone."""
        self._serializes_values = True

        def serialize(value: Any) -> Any:
            serialized = serializer(value)
            _serialized_none.set(serialized is None)
            return serialized

        return serialize

    def traced_send(self, send: Send) -> Send:
        async def traced(
            topic: str,
            value: Any = None,
            key: Any = None,
            *,
            partition: int | None = None,
            timestamp_ms: int | None = None,
            headers: Any = None,
        ) -> RecordFuture:
            serialized = self._serializes_values
            span = self._start(topic, partition, tombstone=value is None and not serialized, count=None)
            started = time.monotonic()
            token = _serialized_none.set(False) if serialized else None
            try:
                try:
                    headers = self._with_context(span, headers)
                    future = await send(
                        topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers
                    )
                finally:  # before the span ends: a send that fails after serializing a tombstone says so too
                    if token is not None:
                        if _serialized_none.get():
                            self._tombstone(span)
                        # (Closed outside its task, a pending task collected: no value of it to restore.)
                        with contextlib.suppress(ValueError):
                            _serialized_none.reset(token)
            except BaseException as exc:
                self._end(span, started, topic, [(None, exc, 1)])
                raise
            # A twin of the caller's future: the caller may cancel theirs, the record goes on.
            future.twin().add_done_callback(lambda done: self._send_done(span, started, topic, done))
            return future

        return cast(Send, traced)

    def traced_send_many(self, send_many: SendMany) -> SendMany:
        async def traced(
            topic: str,
            values: Sequence[Any],
            *,
            keys: Sequence[Any] | None = None,
            headers: Sequence[Any] | None = None,
            partition: int | None = None,
            timestamp_ms: int | None = None,
        ) -> asyncio.Future[list[RecordMetadata]]:
            values = send_many_values(values)  # a generator listed, to be counted here first
            count = len(values) if is_many_argument(values) else 0  # not values at all: send_many says so
            span = self._start(topic, partition, tombstone=False, count=count)
            started = time.monotonic()
            try:
                if self._inject is not None:
                    headers = send_many_values(headers)  # a generator listed, once
                    each = [None] * count if headers is None else headers
                    # Headers that do not run parallel to the values go as given, for send_many to
                    # refuse with its own error (one mapping for all records: "1 items but 2").
                    if is_many_argument(each) and len(each) == count:
                        headers = [self._with_context(span, h) for h in each]
                future = await send_many(
                    topic, values, keys=keys, headers=headers, partition=partition, timestamp_ms=timestamp_ms
                )
            except BaseException as exc:
                queued = getattr(exc, "_aioprod_queued", None)
                if queued is None:
                    self._end(span, started, topic, [(None, exc, count)])
                else:  # stopped part-way: the records queued are delivered, or fail, on their own
                    done_count, group = queued
                    try:
                        self._sent.add(count - done_count, self._attributes(topic, None, exc))
                    except Exception as failure:
                        self._failed(failure)
                    group.add_done_callback(lambda done: self._send_many_done(span, started, topic, done_count, done))
                raise
            # The caller gets a copy: cancelling it (asyncio.wait_for, say) must not lose the
            # outcome of records that still go, as send()'s twin future does not.
            future.add_done_callback(lambda done: self._send_many_done(span, started, topic, count, done))
            caller: asyncio.Future[list[RecordMetadata]] = asyncio.get_running_loop().create_future()
            future.add_done_callback(lambda done: _copy_outcome(done, caller))
            return caller

        return cast(SendMany, traced)

    # -- spans -------------------------------------------------------------------------

    def _start(self, topic: str, partition: int | None, *, tombstone: bool, count: int | None) -> Span:
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
            "messaging.client.id": self._client_id,
        }
        if partition is not None:
            attributes["messaging.destination.partition.id"] = str(partition)
        if tombstone:
            attributes["messaging.kafka.message.tombstone"] = True
        if count is not None:
            attributes["messaging.batch.message_count"] = count
        try:
            return self._tracer.start_span(f"send {topic}", kind=self._trace.SpanKind.PRODUCER, attributes=attributes)
        except Exception as exc:
            self._failed(exc)
            return self._trace.INVALID_SPAN

    def _tombstone(self, span: Span) -> None:
        try:
            span.set_attribute("messaging.kafka.message.tombstone", True)
        except Exception as exc:
            self._failed(exc)

    def _with_context(self, span: Span, headers: Any) -> Any:
        """``headers`` and the span's context (replacing headers of the same names)."""
        if self._inject is None:
            return headers
        carrier: dict[str, str] = {}
        try:
            self._inject(carrier, context=self._trace.set_span_in_context(span))
        except Exception as exc:
            self._failed(exc)
            return headers
        if headers is None:
            existing: list[Any] = []
        elif isinstance(headers, Mapping):
            existing = list(headers.items())
        elif isinstance(headers, str | bytes) or not isinstance(headers, Iterable):
            return headers  # not headers at all: send() says so
        else:
            existing = list(headers)
        kept = [h for h in existing if not (isinstance(h, tuple) and len(h) == 2 and h[0] in carrier)]
        return kept + [(name, value.encode()) for name, value in carrier.items()]

    def _send_done(self, span: Span, started: float, topic: str, done: RecordFuture) -> None:
        error = done.exception()
        partition = getattr(getattr(done, "_settlement", None), "partition", -1) if error is not None else -1
        self._end(span, started, topic, [(None if error is not None else done.result(), error, 1)], partition)

    def _send_many_done(
        self, span: Span, started: float, topic: str, count: int, done: asyncio.Future[list[RecordMetadata]]
    ) -> None:
        error = done.exception()
        results: Sequence[Any] = done.result() if error is None else getattr(error, "results", [error] * count)
        outcomes: Counter[tuple[RecordMetadata | None, BaseException | None]] = Counter()
        for result in results:
            if isinstance(result, BaseException):
                outcomes[(None, result)] += 1
            else:  # one entry per partition: the metrics need no more
                outcomes[(result._replace(offset=-1, timestamp=-1), None)] += 1
        self._end(span, started, topic, [(md, exc, n) for (md, exc), n in outcomes.items()])

    def _end(
        self,
        span: Span,
        started: float,
        topic: str,
        outcomes: list[tuple[RecordMetadata | None, BaseException | None, int]],
        failed_partition: int = -1,
    ) -> None:
        """End the span and count the records: ``outcomes`` are (metadata, error, how many).
        Whatever OpenTelemetry raises stays here: the span is ended all the same."""
        try:
            self._record_end(span, started, topic, outcomes, failed_partition)
        except Exception as exc:
            self._failed(exc)
            try:
                if span.is_recording():  # not ended yet (the end itself may be what raised)
                    span.end()
            except Exception as again:
                self._failed(again)

    def _record_end(
        self,
        span: Span,
        started: float,
        topic: str,
        outcomes: list[tuple[RecordMetadata | None, BaseException | None, int]],
        failed_partition: int,
    ) -> None:
        duration = time.monotonic() - started
        partitions = {md.partition for md, _, _ in outcomes if md is not None}
        span_error = None
        for md, error, count in outcomes:
            attributes = self._attributes(topic, md, error)
            if md is None and failed_partition >= 0:
                attributes["messaging.destination.partition.id"] = str(failed_partition)
            span_error = span_error or error
            self._sent.add(count, attributes)
            self._duration.record(duration, attributes)
        # Records that failed are of no known partition (but send()'s): a call with some of them
        # names no partition (nor leader) for the span, though its other records had but one.
        unplaced = failed_partition < 0 and any(md is None for md, _, _ in outcomes)
        if len(partitions) == 1 and not unplaced:
            md = next(md for md, _, _ in outcomes if md is not None)
            span.set_attribute("messaging.destination.partition.id", str(md.partition))
            if md.offset >= 0 and len(outcomes) == 1:
                span.set_attribute("messaging.kafka.offset", md.offset)
            span.set_attributes(self._server(topic, md.partition))
        if not partitions and failed_partition >= 0:
            span.set_attribute("messaging.destination.partition.id", str(failed_partition))
        if span_error is not None:
            span.set_attribute("error.type", _error_type(span_error))
            span.record_exception(span_error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(span_error)))
        span.end()

    def _attributes(self, topic: str, md: RecordMetadata | None, error: BaseException | None) -> dict[str, Any]:
        """The metrics' attributes for records of ``topic`` acknowledged as ``md`` or failed with ``error``."""
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
        }
        if md is not None:
            attributes["messaging.destination.partition.id"] = str(md.partition)
            attributes.update(self._server(topic, md.partition))
        if error is not None:
            attributes["error.type"] = _error_type(error)
        return attributes

    def _server(self, topic: str, partition: int) -> dict[str, Any]:
        """The partition's leader now: the broker that took the record, all but always."""
        cluster = self._cluster()
        leader = cluster.leader_for(topic, partition)
        broker = None if leader is None else cluster.brokers.get(leader)
        return {} if broker is None else {"server.address": broker.host, "server.port": broker.port}


def _error_type(error: BaseException) -> str:
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _copy_outcome(done: asyncio.Future[list[RecordMetadata]], caller: asyncio.Future[list[RecordMetadata]]) -> None:
    if caller.done():  # the caller cancelled theirs
        return
    error = done.exception()
    if error is None:
        caller.set_result(done.result())
    else:
        caller.set_exception(error)
        caller.exception()  # retrieved, as the producer's own future is: the caller sees it on await

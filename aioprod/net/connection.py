"""One TCP connection to one broker.

The connection owns its stream and framing: requests are written in order, one reader
task completes responses in the order Kafka answers them (strictly the send order on a
connection), and any I/O error or request timeout fails every in-flight request and
closes the connection, because after either the stream position can no longer be trusted.

It takes a new request only once the last one is fully written out (the Java client's
``InFlightRequests.canSendMore``), so what a slow or stalled broker has not read stays
bounded by one request, and a request sent without a response expected (acks=0) counts as
done only when its bytes have left. It also honours the broker's throttle (KIP-219): no
new request until the throttle time a response asked for has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import math
import os
import re
import socket
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import aioprod
from aioprod.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, ProtocolError
from aioprod.event_log import log_prefix
from aioprod.net.tls import connection_error
from aioprod.protocol import versions
from aioprod.protocol.framing import FrameDecoder, decode_response, encode_request, peek_correlation_id
from aioprod.protocol.messages import ApiVersionsRequest, ApiVersionsResponse
from aioprod.protocol.schema import Request, Response

if TYPE_CHECKING:
    from aioprod.metrics import BrokerMetrics
    from aioprod.net.auth import ConnectionSecurity

log = logging.getLogger(__name__)
#: With TLS, a connection's setup covers the handshake, which a plaintext listener that waits
#: for the rest of what it took for a request's size (Tansu does) leaves hanging.
_TLS_WAIT_HINT = "with TLS, a plaintext listener can leave the handshake waiting: check security_protocol"

R = TypeVar("R", bound=Response)

_READ_CHUNK = 256 * 1024
#: How long a connect to one address of a name goes on before the next starts too (RFC 8305).
_NEXT_ADDRESS_DELAY = 0.25
#: A SASL listener closes on a client without SASL as soon as it reads its first request:
#: a close later than this after that request is something else (a broker restarting).
_SASL_CLOSE_WINDOW = 1.0


class Answer:
    """Where a request's response goes when its sender passed ``on_answer``: the reader
    hands the response over in the same step that read it, where a future's callbacks
    would run one loop iteration later — on every produce round trip. Failures (a closed
    connection, a timeout) are handed over with ``call_soon``, never from inside the
    ``send_nowait`` that wrote the request."""

    __slots__ = ("_done", "_loop", "_on_answer")

    def __init__(self, on_answer: Callable[[Any], None]) -> None:
        self._on_answer = on_answer
        self._done = False
        self._loop = asyncio.get_running_loop()

    def done(self) -> bool:
        return self._done

    def answer(self, response: Any) -> None:
        """From the reader: hand ``response`` over now."""
        self._done = True
        try:
            self._on_answer(response)
        except Exception:
            # The reader must go on reading for the other requests in flight.
            log.exception("aioprod failed handling a response")

    def set_result(self, result: Any) -> None:
        self._done = True
        self._loop.call_soon(self._on_answer, result)

    def set_exception(self, error: BaseException) -> None:
        self._done = True
        self._loop.call_soon(self._on_answer, error)


def _hand_over(answers: list[tuple[Answer, Response]]) -> None:
    """Hand each response to its :class:`Answer`, keeping none of them. The reader then awaits
    its next read for as long as the broker takes; responses it still held outlived the young
    collections there and were promoted to the oldest generation, which over 1,000 partitions
    made 8-9 full collections in a run of 1,000,000 records instead of 5."""
    for answer, response in answers:
        answer.answer(response)
    answers.clear()


#: A request's pending outcome: a future its sender awaits, or an :class:`Answer`.
_Outcome = asyncio.Future[Any] | Answer


@dataclass(slots=True)
class _InFlight:
    correlation_id: int
    response_cls: type[Response]
    version: int
    future: _Outcome
    timer: asyncio.TimerHandle | None
    #: Whether its answer counts as use (connections_max_idle_ms): not a re-authentication's.
    use: bool = True


class BrokerConnection:
    """A connected, version-negotiated stream to one broker.

    Created by :meth:`open`; after that, :meth:`send` may be called while
    :meth:`can_send_more` is true. Only the connection's reader task completes futures.
    ``on_ready`` is called whenever the connection may have become able to take a request
    it could not take before (its write buffer drained, a throttle ended, a response freed
    a place in flight, a hold was released): the sender counts on it to wake for a
    connection it found unable to take a request.
    """

    def __init__(
        self,
        node_id: int,
        host: str,
        port: int,
        *,
        client_id: str,
        request_timeout: float,
        max_in_flight: int,
        on_ready: Callable[[], None] | None = None,
        security: ConnectionSecurity | None = None,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.max_in_flight = max_in_flight
        self.api_versions: Mapping[int, tuple[int, int]] = {}
        #: The correlation id of the ApiVersions request that negotiated them.
        self._negotiated_id = -1
        #: Loop time the first request after ApiVersions was written (see _closed_hint).
        self._first_request_at: float | None = None
        #: Loop time until which the broker asked not to be sent anything (KIP-219).
        self.throttled_until = 0.0
        self._on_ready = on_ready or _nothing
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._flush_task: asyncio.Task[None] | None = None
        #: Futures of requests without a response (acks=0), done once their bytes are out.
        self._awaiting_flush: list[_Outcome] = []
        #: Whether any request went without a response expected (acks=0), and the last id
        #: written: a broker that answers one anyway (Tansu 0.6 does) gets its answer skipped,
        #: not the connection dropped with what it has not read yet.
        self._wrote_unanswered = False
        self._last_id = 0
        self._in_flight: deque[_InFlight] = deque()
        self._correlation = itertools.count(1)
        self._closed_error: KafkaError | None = None
        self._close_callbacks: list[Any] = []
        self._version_cache: dict[type[Request] | tuple[type[Request], int], int] = {}
        #: Cluster features the broker reports as finalized (ApiVersions v3+): name -> level.
        self.finalized_features: Mapping[str, int] = {}
        #: Their epoch: it grows with each change of a feature's level (-1 before ApiVersions v3).
        self.finalized_features_epoch = -1
        self._security = security
        #: Counts requests and bytes (per request, never per record).
        self._metrics = metrics
        #: What open() is doing, for its timeout message.
        self.phase = "ApiVersions handshake"
        # Requests written while re-authenticating wait here (see hold()).
        self._held: list[tuple[Request, int, bool, _Outcome]] | None = None
        #: Set by retire(): take no new request, close with this once nothing is in flight.
        self._retiring: KafkaError | None = None
        #: The peer answered in another protocol (HTTP): no security_protocol hint for it.
        self._not_kafka = False
        #: Loop time of the last request written or answer read (connections_max_idle_ms).
        self.last_used = 0.0

    def __repr__(self) -> str:
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port}>"

    @property
    def closed(self) -> bool:
        return self._closed_error is not None

    @property
    def retiring(self) -> bool:
        """Retired (see :meth:`retire`): it takes its answers, and no new request."""
        return self._retiring is not None

    @property
    def established(self) -> bool:
        """The TCP (and TLS) connection was made: a failure since is the handshake's."""
        return self._writer is not None

    @property
    def setting_up(self) -> str:
        """What open() is at ("in its ..."), for a wait that runs out before it ends."""
        if self.established:
            return f"in its {self.phase}"
        if self._security is not None and self._security.tls_context is not None:
            return f"in its TCP connection and TLS handshake; {_TLS_WAIT_HINT}"
        return "in its TCP connection"

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def flushed(self) -> bool:
        """Every request written so far has left the client."""
        return self._flush_task is None or self._flush_task.done()

    def can_send_more(self) -> bool:
        """Open, the last request fully written out, room in flight, not throttled, not held."""
        return (
            self._closed_error is None
            and self._retiring is None
            and self._held is None
            and self.flushed
            and len(self._in_flight) < self.max_in_flight
            and (self.throttled_until == 0.0 or self.throttled_until <= asyncio.get_running_loop().time())
        )

    def hold(self) -> None:
        """Hold new requests back until :meth:`release` (KIP-368 re-authentication).

        Requests already in flight complete as usual; requests sent meanwhile are written,
        in order, once released. Only requests sent with ``bypass_hold`` go out at once.
        """
        if self._held is None:
            self._held = []

    def release(self) -> None:
        held, self._held = self._held, None
        for request, version, expect_response, future in held or ():
            if not future.done():
                try:
                    self._write(request, version, expect_response, False, future)
                except Exception as exc:  # this request cannot be encoded: it fails alone
                    future.set_exception(exc)
        self._close_if_retired()
        self._on_ready()

    def retire(self, error: KafkaError) -> None:
        """Take no new request (see :meth:`can_send_more`) and close with ``error`` once the
        requests in flight are answered: their answers are not thrown away (a request failed
        after the broker wrote it is written again when retried without idempotence)."""
        if self._closed_error is not None or self._retiring is not None:
            return
        self._retiring = error
        if self._wrote_unanswered and self._held is None:
            # As at close (acks_0_read): one answered request after the acks=0 writes, so that the
            # broker has read them before the connection is closed (aborted) under them.
            self.send_nowait(_api_versions_request(), _nothing)
        self._close_if_retired()

    def _close_if_retired(self) -> None:
        if self._retiring is not None and not self._in_flight and self._held is None and self.flushed:
            self.close(self._retiring)

    async def acks_0_read(self) -> None:
        """Wait until the broker has read every acks=0 request written: the answer to one more
        request (ApiVersions), as a broker takes a connection's requests in order. Closed before,
        a broker that answers acks=0 requests all the same (Tansu; Kafka does not) has the
        connection reset under the answers it has not read, and drops the requests it has not
        read yet."""
        if not self._wrote_unanswered or self._closed_error is not None:
            return
        with contextlib.suppress(KafkaError):
            await self.send(_api_versions_request())

    def on_close(self, callback: Any) -> None:
        """Call ``callback(connection, error)`` once when the connection closes."""
        self._close_callbacks.append(callback)

    def off_close(self, callback: Any) -> None:
        """Forget a callback given to :meth:`on_close`."""
        with contextlib.suppress(ValueError):
            self._close_callbacks.remove(callback)

    async def open(self, setup_timeout: float, request_timeout: float | None = None, *, attempt: int = 0) -> None:
        """Connect (TLS-wrapped when configured) within ``setup_timeout``, then negotiate API
        versions and authenticate within ``request_timeout`` (default: the connection's).

        Every address the host name resolves to gets its chance: walked in order within one
        attempt, a first address that drops SYNs used up the whole setup timeout, every time.
        On asyncio's own loop the next address is tried too after 250 ms (RFC 8305); uvloop has
        no such option, so there ``attempt`` (the failed attempts before this one) picks the
        address to start from, as Java moves to the next address on each attempt.
        """
        if not 0 < self.port < 65536:  # asyncio raised IndexError: the pool never backed off
            raise KafkaConnectionError(
                f"cannot connect to broker {self.node_id} at {self.host}:{self.port}: "
                "the port is outside 1-65535 (the address the broker advertises?)"
            )
        tls = self._security.tls_context if self._security is not None else None
        loop = asyncio.get_running_loop()
        options: dict[str, Any] = {}
        literal = _ip_literal(self.host)
        if isinstance(loop, asyncio.BaseEventLoop) and not literal:
            # (Not for one address: CPython's staggered_race, cancelled as it connects -- a close()
            # while connecting -- drops the connected socket unclosed: a ResourceWarning.)
            options["happy_eyeballs_delay"] = _NEXT_ADDRESS_DELAY
        try:
            async with asyncio.timeout(setup_timeout):
                host = await self._address(loop, attempt) if attempt and not options and not literal else self.host
                self._reader, self._writer = await asyncio.open_connection(
                    host,
                    self.port,
                    limit=_READ_CHUNK,
                    ssl=tls,
                    server_hostname=self.host if tls else None,
                    **options,
                )
        except TimeoutError as exc:
            raise KafkaConnectionError(
                f"cannot connect to broker {self.node_id} at {self.host}:{self.port}: "
                f"no connection within {setup_timeout:.3g}s (socket_connection_setup_timeout_ms)"
                + (f"; {_TLS_WAIT_HINT}" if tls is not None else "")
            ) from exc
        except OSError as exc:
            failure = connection_error(exc, self.host, self.port, f"connecting to broker {self.node_id} at")
            if (
                tls is not None
                and type(failure) is KafkaConnectionError
                and isinstance(exc, ssl.SSLEOFError | ConnectionResetError | ConnectionAbortedError)
            ):
                # Not chained: the pool logs a cause's text alone, and the hint is the point.
                raise KafkaConnectionError(
                    f"broker {self.node_id} at {self.host}:{self.port} closed the connection during the TLS "
                    "handshake (a plaintext listener closes like this: check security_protocol)"
                ) from None
            raise failure from exc
        except UnicodeError as exc:  # a name IDNA cannot encode ("kafka..example.com"): no OSError
            raise KafkaConnectionError(
                f"cannot connect to broker {self.node_id} at {self.host}:{self.port}: not a valid host name ({exc})"
            ) from exc
        # Pause writing as soon as anything is left unsent, so the connection knows the
        # moment its last request has fully left (see can_send_more).
        self._writer.transport.set_write_buffer_limits(high=0)
        self._reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(), name=f"aioprod-reader-{self.node_id}"
        )
        timeout = self.request_timeout if request_timeout is None else request_timeout
        try:
            async with asyncio.timeout(timeout):
                await self._negotiate()
                if self._security is not None and self._security.authenticator is not None:
                    await self._security.authenticator.authenticate(self)
        except BaseException as exc:
            if isinstance(exc, KafkaError):
                error: KafkaError = exc
            elif isinstance(exc, TimeoutError):
                error = KafkaTimeoutError(
                    f"{self.phase} with {self.host}:{self.port} did not complete within {timeout:.3g}s "
                    "(request_timeout_ms)"
                )
            else:
                error = KafkaConnectionError(
                    f"{self.phase} with {self.host}:{self.port} failed: {type(exc).__name__}: {exc}"
                )
            if not self.api_versions and type(error) is KafkaConnectionError and not self._not_kafka:
                hint = (
                    "right after the TLS handshake (a broker that requires client certificates closes like this "
                    "when it rejects ours: check ssl_certificate_location)"
                    if tls is not None
                    else "before answering ApiVersions (a TLS listener closes like this on a plaintext client: "
                    "check security_protocol if it persists; a broker shutting down does it once)"
                )
                error = KafkaConnectionError(f"{error} {hint}")
            self.close(error)
            if not isinstance(exc, Exception) or error is exc:
                # A cancellation, KeyboardInterrupt or SystemExit is not a connection failure; a
                # KafkaError raised as it is (`from` itself made it its own cause: a cycle that
                # froze whatever walked the chain).
                raise
            raise error from exc

    async def _address(self, loop: asyncio.AbstractEventLoop, attempt: int) -> str:
        """The address attempt number ``attempt`` connects to: the resolver's list in turn."""
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        return addresses[attempt % len(addresses)] if addresses else self.host

    async def _negotiate(self) -> None:
        version = ApiVersionsRequest.MAX_VERSION
        while True:
            frame = await self._send(_api_versions_request(), version, raw=True)
            outcome = versions.read_api_versions_response(frame, version)
            if isinstance(outcome, ApiVersionsResponse):
                if outcome.error_code:
                    raise KafkaConnectionError(
                        f"broker {self.host}:{self.port} refused ApiVersions (error {outcome.error_code})"
                    )
                self.api_versions = {k.api_key: (k.min_version, k.max_version) for k in outcome.api_keys}
                self.finalized_features = {f.name: f.max_version_level for f in outcome.finalized_features}
                self.finalized_features_epoch = outcome.finalized_features_epoch
                self._negotiated_id = peek_correlation_id(frame)
                return
            if outcome >= version:
                raise ProtocolError("ApiVersions fallback did not lower the version")
            version = outcome

    def version_for(self, request_cls: type[Request], max_version: int | None = None) -> int:
        """The version to send ``request_cls`` at; ``max_version`` replaces the client's
        usual ceiling for it (see :data:`aioprod.protocol.versions.CLIENT_VERSION_CAPS`)."""
        key = request_cls if max_version is None else (request_cls, max_version)
        version = self._version_cache.get(key)
        if version is None:
            version = self._version_cache[key] = versions.choose_version(
                request_cls, self.api_versions, max_version=max_version
            )
        return version

    async def send(
        self,
        request: Request,
        *,
        expect_response: bool = True,
        bypass_hold: bool = False,
        max_version: int | None = None,
    ) -> Any:
        """Send ``request`` and await its decoded response (None when none is expected).

        ``bypass_hold`` is for the SASL requests of a re-authentication (see :meth:`hold`).
        """
        version = self.version_for(type(request), max_version)
        return await self._send(request, version, expect_response=expect_response, bypass_hold=bypass_hold)

    def send_nowait(
        self,
        request: Request,
        on_answer: Callable[[Any], None],
        *,
        expect_response: bool = True,
        max_version: int | None = None,
    ) -> None:
        """Write ``request`` now; ``on_answer`` gets its response (None when none is
        expected) or the :class:`~aioprod.errors.KafkaError` that ended it. It must not
        raise; a response is handed over from the reader as it is read (see :class:`Answer`)."""
        self._write(request, self.version_for(type(request), max_version), expect_response, False, Answer(on_answer))

    async def _send(
        self,
        request: Request,
        version: int,
        *,
        expect_response: bool = True,
        raw: bool = False,
        bypass_hold: bool = False,
    ) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._write(request, version, expect_response, raw, future, bypass_hold=bypass_hold)
        return await future

    def _write(
        self,
        request: Request,
        version: int,
        expect_response: bool,
        raw: bool,
        future: _Outcome,
        *,
        bypass_hold: bool = False,
    ) -> None:
        loop = asyncio.get_running_loop()
        if self._closed_error is not None:
            future.set_exception(self._closed_error)
            return
        if self._held is not None and not bypass_hold:
            self._held.append((request, version, expect_response, future))
            return
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        frame = encode_request(request, version, correlation_id, self.client_id)
        self._last_id = correlation_id
        writer = self._writer
        assert writer is not None
        try:
            writer.write(frame)
        except (OSError, RuntimeError) as exc:
            error = KafkaConnectionError(f"write to {self.host}:{self.port} failed: {exc}")
            self.close(error)
            future.set_exception(error)
            return
        now = loop.time()
        if not bypass_hold:
            # A SASL request is not use: re-authentication runs on idle connections too, and
            # counted, it kept them open for good (connections_max_idle_ms).
            self.last_used = now
        if self._metrics is not None:
            self._metrics.request_sent(len(frame), now)
        if self.flushed and writer.transport.get_write_buffer_size():
            self._flush_task = loop.create_task(self._await_flush(writer), name=f"aioprod-flush-{self.node_id}")
        if not expect_response:
            self._wrote_unanswered = True
            if self.flushed:
                future.set_result(None)
            else:
                self._awaiting_flush.append(future)
            return
        if correlation_id == self._negotiated_id + 1:
            self._first_request_at = now
        timer = loop.call_later(self.request_timeout, self._on_timeout, correlation_id)
        self._in_flight.append(
            _InFlight(correlation_id, None if raw else request.RESPONSE, version, future, timer, not bypass_hold)  # type: ignore[arg-type]
        )

    async def _await_flush(self, writer: asyncio.StreamWriter) -> None:
        # Bounded as a request is: with acks=0 nothing else times out a broker that stopped
        # reading, and the connection, never flushed, would take no request again.
        try:
            async with asyncio.timeout(self.request_timeout):
                await writer.drain()
        except TimeoutError:
            self.close(
                KafkaTimeoutError(
                    f"write to broker {self.node_id} ({self.host}:{self.port}) did not complete within "
                    f"{self.request_timeout:.3f}s: the broker is not reading"
                )
            )
            return
        except (OSError, RuntimeError) as exc:
            self.close(KafkaConnectionError(f"write to {self.host}:{self.port} failed: {exc}"))
            return
        waiting, self._awaiting_flush = self._awaiting_flush, []
        for future in waiting:
            if not future.done():
                future.set_result(None)
        if self._retiring is not None:
            self._close_if_retired()
        self._on_ready()

    def _on_timeout(self, correlation_id: int) -> None:
        self.close(
            KafkaTimeoutError(
                f"request {correlation_id} to broker {self.node_id} ({self.host}:{self.port}) "
                f"got no response within {self.request_timeout:.3f}s"
            )
        )

    async def _read_loop(self) -> None:
        assert self._reader is not None
        decoder = FrameDecoder()
        reader = self._reader
        first = b""  # the stream's first bytes, to tell what answered when it is not Kafka
        try:
            while True:
                data = await reader.read(_READ_CHUNK)
                if len(first) < 4:
                    first += data[: 4 - len(first)]
                if not data:
                    raise KafkaConnectionError(
                        f"broker {self.node_id} ({self.host}:{self.port}) closed the connection{self._closed_hint()}"
                    )
                # Every response read is taken off the in-flight queue before any is handed
                # over: a handler that closes this connection must not fail the responses
                # that arrived with its own (they are answers, not lost requests).
                answers: list[tuple[Answer, Response]] = []
                full = len(self._in_flight) >= self.max_in_flight
                try:
                    for frame in decoder.feed(data):
                        self._complete(frame, answers)
                finally:
                    _hand_over(answers)
                if full and len(self._in_flight) < self.max_in_flight:
                    self._on_ready()  # a request may go now (whatever the response was to)
                if self._retiring is not None:
                    self._close_if_retired()
                if self._closed_error is not None:
                    # Closed from this task (retired, or by a response's handler): close() cancels
                    # every task but the current one. Reading on would wait for the transport's
                    # connection_lost, which reaches the StreamReader only by a weak reference:
                    # a collection before it frees this task pending.
                    return
        except asyncio.CancelledError:
            raise
        except ProtocolError as exc:
            # A response that could not be read (its own request has the ProtocolError) leaves
            # the stream unreadable: for the other requests on it, a lost connection (retriable),
            # not a verdict on them.
            what = f"connection to broker {self.node_id} ({self.host}:{self.port}) dropped after a malformed response"
            if not self.api_versions and first[:4] == b"HTTP":
                # The first answer on the port is HTTP's: a REST proxy, Schema Registry, a web UI.
                self._not_kafka = True
                what += (
                    f" (it answered in HTTP: {self.host}:{self.port} is not a Kafka listener; check the port in "
                    "bootstrap_servers)"
                )
            self.close(KafkaConnectionError(f"{what}: {exc}"))
        except KafkaError as exc:
            self.close(exc)
        except OSError as exc:
            if self.api_versions and isinstance(exc, ssl.SSLError):
                # Past the handshake (a refused client certificate shows on the first read, in
                # ApiVersions): a bad record or an alert now is a lost connection, retriable.
                self.close(KafkaConnectionError(f"TLS connection to {self.host}:{self.port} failed: {exc}"))
            else:
                self.close(connection_error(exc, self.host, self.port, "read from"))
        except ValueError as exc:
            self.close(KafkaConnectionError(f"read from {self.host}:{self.port} failed: {exc}"))
        except (Exception, KeyboardInterrupt, SystemExit) as exc:  # (not GeneratorExit: a task freed unfinished)
            # KeyboardInterrupt or SystemExit (a Ctrl-C lands in whatever frame runs), or a bug: this
            # task ends, and with it the reading. Left open, the connection took requests whose
            # answers nobody read, each failing only at request_timeout_ms (close() waited that long).
            self.close(KafkaConnectionError(f"reading from broker {self.node_id} stopped: {exc!r}"))
            raise

    def _closed_hint(self) -> str:
        """Why a broker may have closed the connection on the first request after ApiVersions.

        A SASL listener answers ApiVersions, then closes the connection on any request
        other than SASL's: to a client without SASL that is the only sign it gets.
        """
        if self._security is not None and self._security.authenticator is not None:
            return ""
        if not self._in_flight or self._in_flight[0].correlation_id != self._negotiated_id + 1:
            return ""
        sent = self._first_request_at
        if sent is None or asyncio.get_running_loop().time() - sent > _SASL_CLOSE_WINDOW:
            return ""
        return (
            " on the first request after ApiVersions (a SASL listener closes like this on a client "
            "without SASL: check security_protocol)"
        )

    def _complete(self, frame: bytes, answers: list[tuple[Answer, Response]]) -> None:
        """Match ``frame`` to its request and settle it; an :class:`Answer`'s response is
        added to ``answers``, for the reader to hand over."""
        correlation_id = peek_correlation_id(frame)
        if not self._in_flight or self._in_flight[0].correlation_id != correlation_id:
            # Answers come in order: one for an id written before the first request awaiting
            # its answer (or before the last written, with none awaited) that is not that
            # request's is an acks=0 request's answer, however far behind the broker is.
            bound = self._in_flight[0].correlation_id if self._in_flight else self._last_id + 1
            if self._wrote_unanswered and 0 < (bound - correlation_id) & 0x7FFFFFFF < 2**30:
                log.debug(
                    log_prefix(self.client_id) + "broker %s answered acks=0 request %d: answer skipped",
                    self.node_id,
                    correlation_id,
                )
                return
            expected = self._in_flight[0].correlation_id if self._in_flight else None
            raise ProtocolError(f"response correlation id {correlation_id}, expected {expected}")
        entry = self._in_flight.popleft()
        if entry.timer is not None:
            entry.timer.cancel()
        now = asyncio.get_running_loop().time()
        if entry.use:
            self.last_used = now
        if self._metrics is not None:
            self._metrics.response_received(4 + len(frame), now)
        if entry.future.done():  # the awaiting caller was cancelled
            return
        if entry.response_cls is None:
            entry.future.set_result(frame)
            return
        future = entry.future
        try:
            response = decode_response(frame, entry.response_cls, entry.version)
        except ProtocolError as exc:
            future.set_exception(exc)
            raise
        except BaseException:
            # A KeyboardInterrupt (a Ctrl-C lands in whatever frame runs: decoding is the reader's
            # heaviest step): back in flight, for close() to fail as lost (retriable). Taken off,
            # its timer cancelled, it stayed pending until delivery_timeout_ms.
            self._in_flight.appendleft(entry)
            raise
        throttle_ms = versions.client_throttle_ms(response, entry.version)
        if throttle_ms:
            loop = asyncio.get_running_loop()
            # On a whole millisecond: uvloop's clock reads whole milliseconds, and an end 1e-12 s
            # past the one its timer fires on kept the connection throttled at that tick (the
            # sender slept 1e-12 s at a time until the clock ticked again).
            until = math.ceil((loop.time() + throttle_ms / 1000) * 1000 - 1e-6) / 1000
            if until > self.throttled_until:
                self.throttled_until = until
                loop.call_at(until, self._on_ready)
        if type(future) is Answer:
            answers.append((future, response))
        else:
            future.set_result(response)

    def close(self, error: KafkaError | None = None) -> None:
        """Close now; every in-flight request fails with ``error``."""
        if self._closed_error is not None:
            return
        self._closed_error = error or KafkaConnectionError(f"connection to {self.host}:{self.port} closed")
        if self._writer is not None:
            if error is not None or not self.flushed:
                # Nothing good can come of bytes still queued for a broker that failed us
                # or stopped reading: drop them, or closing would wait for them forever.
                self._writer.transport.abort()
            else:
                self._writer.close()
        current = asyncio.current_task()
        for task in (self._reader_task, self._flush_task):
            if task is not None and task is not current:
                task.cancel()
        in_flight, self._in_flight = self._in_flight, deque()
        held, self._held = self._held or [], None
        for *_, future in held:
            if not future.done():
                future.set_exception(self._closed_error)
        for entry in in_flight:
            if entry.timer is not None:
                entry.timer.cancel()
            if not entry.future.done():
                entry.future.set_exception(self._closed_error)
        waiting, self._awaiting_flush = self._awaiting_flush, []
        for future in waiting:
            if not future.done():
                future.set_exception(self._closed_error)
        for callback in self._close_callbacks:
            callback(self, self._closed_error)
        self._close_callbacks.clear()

    def disown(self) -> None:
        """A forked child's copy: its socket's descriptor is made an unconnected socket's, here
        only. Its reads and writes then fail here, and never take the parent's answers nor
        write into its stream; and the selector's removal of the descriptor (epoll_ctl on the
        epoll instance the child shares with its parent) names another file, so it leaves the
        parent's registration alone, where closing the transport would have removed it."""
        if self._writer is None:
            return
        sock = self._writer.transport.get_extra_info("socket")
        fd = -1 if sock is None else sock.fileno()
        if fd < 0:
            return
        with contextlib.suppress(OSError), socket.socket(sock.family, socket.SOCK_STREAM) as dead:
            os.dup2(dead.fileno(), fd, inheritable=False)

    def abort(self) -> None:
        """Cut the socket now: after :meth:`close`, a TLS close waits for the broker's
        close_notify, for 30 s when it has hung."""
        if self._writer is not None:
            self._writer.transport.abort()

    async def wait_closed(self) -> None:
        tasks = [task for task in (self._reader_task, self._flush_task) if task is not None]
        if tasks:
            await asyncio.wait(tasks)
        if self._writer is not None:
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()


def _ip_literal(host: str) -> bool:
    """An address, not a name: nothing to resolve, one address to try."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _api_versions_request() -> ApiVersionsRequest:
    return ApiVersionsRequest(
        client_software_name="aioprod", client_software_version=_software_version(aioprod.__version__)
    )


def _software_version(version: str) -> str:
    """``version`` as a broker takes it (KIP-511: ``[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?``).
    A broker answers ApiVersions v3+ with INVALID_REQUEST otherwise, and every connect fails: a
    packager's local version (``0.2.0+dfsg``) would do it. Other characters become ``-``, as
    librdkafka does."""
    return re.sub(r"[^a-zA-Z0-9.-]", "-", version).strip(".-") or "unknown"


def _nothing(*_: Any) -> None:
    pass

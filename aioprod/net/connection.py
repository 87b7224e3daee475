"""One TCP connection to one broker.

The connection owns its stream and framing: requests are written in order, one reader
task completes responses in the order Kafka answers them (strictly the send order on a
connection), and any I/O error or request timeout fails every in-flight request and
closes the connection, because after either the stream position can no longer be trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from aioprod.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, ProtocolError
from aioprod.net.tls import connection_error
from aioprod.protocol import versions
from aioprod.protocol.framing import FrameDecoder, decode_response, encode_request, peek_correlation_id
from aioprod.protocol.messages import ApiVersionsRequest, ApiVersionsResponse
from aioprod.protocol.schema import Request, Response

if TYPE_CHECKING:
    from aioprod.net.auth import ConnectionSecurity

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Response)

_READ_CHUNK = 256 * 1024


@dataclass(slots=True)
class _InFlight:
    correlation_id: int
    response_cls: type[Response]
    version: int
    future: asyncio.Future[Any]
    timer: asyncio.TimerHandle | None


class BrokerConnection:
    """A connected, version-negotiated stream to one broker.

    Created by :meth:`open`; after that, :meth:`send` may be called while
    :meth:`can_send_more` is true. Only the connection's reader task completes futures.
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
        security: ConnectionSecurity | None = None,
    ) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.max_in_flight = max_in_flight
        self.api_versions: Mapping[int, tuple[int, int]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._in_flight: deque[_InFlight] = deque()
        self._correlation = itertools.count(1)
        self._closed_error: KafkaError | None = None
        self._close_callbacks: list[Any] = []
        self._version_cache: dict[type[Request], int] = {}
        self._security = security
        # Requests written while re-authenticating wait here (see hold()).
        self._held: list[tuple[Request, int, bool, asyncio.Future[Any]]] | None = None
        self._release_callbacks: list[Any] = []

    def __repr__(self) -> str:
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port}>"

    @property
    def closed(self) -> bool:
        return self._closed_error is not None

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def can_send_more(self) -> bool:
        return self._closed_error is None and self._held is None and len(self._in_flight) < self.max_in_flight

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
                self._write(request, version, expect_response, raw=False, future=future)
        for callback in self._release_callbacks:
            callback()

    def on_release(self, callback: Any) -> None:
        """Call ``callback()`` each time held requests are released (the sender may send again)."""
        self._release_callbacks.append(callback)

    def on_close(self, callback: Any) -> None:
        """Call ``callback(connection, error)`` once when the connection closes."""
        self._close_callbacks.append(callback)

    async def open(self, timeout: float) -> None:
        """Connect (TLS-wrapped when configured), negotiate API versions, then authenticate."""
        tls = self._security.tls_context if self._security is not None else None
        try:
            async with asyncio.timeout(timeout):
                self._reader, self._writer = await asyncio.open_connection(
                    self.host, self.port, limit=_READ_CHUNK, ssl=tls, server_hostname=self.host if tls else None
                )
        except TimeoutError as exc:
            raise KafkaConnectionError(
                f"cannot connect to broker {self.node_id} at {self.host}:{self.port}: timed out"
            ) from exc
        except OSError as exc:
            raise connection_error(exc, self.host, self.port, f"connecting to broker {self.node_id} at") from exc
        self._reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(), name=f"aioprod-reader-{self.node_id}"
        )
        try:
            async with asyncio.timeout(timeout):
                await self._negotiate()
                if self._security is not None and self._security.authenticator is not None:
                    await self._security.authenticator.authenticate(self)
        except BaseException as exc:
            error = (
                exc
                if isinstance(exc, KafkaError)
                else KafkaConnectionError(f"ApiVersions handshake with {self.host}:{self.port} failed: {exc!r}")
            )
            if tls is not None and not self.api_versions and type(error) is KafkaConnectionError:
                error = KafkaConnectionError(
                    f"{error} right after the TLS handshake (a broker that requires client certificates "
                    "closes like this when it rejects ours: check ssl_certificate_location)"
                )
            self.close(error)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise error from exc

    async def _negotiate(self) -> None:
        version = ApiVersionsRequest.MAX_VERSION
        while True:
            request = ApiVersionsRequest(client_software_name="aioprod", client_software_version="0.1.0")
            frame = await self._send(request, version, raw=True)
            outcome = versions.read_api_versions_response(frame, version)
            if isinstance(outcome, ApiVersionsResponse):
                if outcome.error_code:
                    raise KafkaConnectionError(
                        f"broker {self.host}:{self.port} refused ApiVersions (error {outcome.error_code})"
                    )
                self.api_versions = {k.api_key: (k.min_version, k.max_version) for k in outcome.api_keys}
                return
            if outcome >= version:
                raise ProtocolError("ApiVersions fallback did not lower the version")
            version = outcome

    def version_for(self, request_cls: type[Request]) -> int:
        version = self._version_cache.get(request_cls)
        if version is None:
            version = self._version_cache[request_cls] = versions.choose_version(request_cls, self.api_versions)
        return version

    async def send(self, request: Request, *, expect_response: bool = True, bypass_hold: bool = False) -> Any:
        """Send ``request`` and await its decoded response (None when none is expected).

        ``bypass_hold`` is for the SASL requests of a re-authentication (see :meth:`hold`).
        """
        version = self.version_for(type(request))
        return await self._send(request, version, expect_response=expect_response, bypass_hold=bypass_hold)

    def send_nowait(self, request: Request, *, expect_response: bool = True) -> asyncio.Future[Any]:
        """Write ``request`` now; the returned future resolves with its response."""
        return self._write(request, self.version_for(type(request)), expect_response, raw=False)

    async def _send(
        self,
        request: Request,
        version: int,
        *,
        expect_response: bool = True,
        raw: bool = False,
        bypass_hold: bool = False,
    ) -> Any:
        future = self._write(request, version, expect_response, raw, bypass_hold=bypass_hold)
        writer = self._writer
        if writer is not None and writer.transport.get_write_buffer_size() > _READ_CHUNK:
            try:
                await writer.drain()
            except (OSError, RuntimeError) as exc:
                self.close(KafkaConnectionError(f"write to {self.host}:{self.port} failed: {exc}"))
        return await future

    def _write(
        self,
        request: Request,
        version: int,
        expect_response: bool,
        raw: bool,
        *,
        bypass_hold: bool = False,
        future: asyncio.Future[Any] | None = None,
    ) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if future is None:
            future = loop.create_future()
        if self._closed_error is not None:
            future.set_exception(self._closed_error)
            return future
        if self._held is not None and not bypass_hold:
            self._held.append((request, version, expect_response, future))
            return future
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        frame = encode_request(request, version, correlation_id, self.client_id)
        assert self._writer is not None
        try:
            self._writer.write(frame)
        except (OSError, RuntimeError) as exc:
            error = KafkaConnectionError(f"write to {self.host}:{self.port} failed: {exc}")
            self.close(error)
            future.set_exception(error)
            return future
        if not expect_response:
            future.set_result(None)
            return future
        timer = loop.call_later(self.request_timeout, self._on_timeout, correlation_id)
        self._in_flight.append(
            _InFlight(correlation_id, None if raw else request.RESPONSE, version, future, timer)  # type: ignore[arg-type]
        )
        return future

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
        try:
            while True:
                data = await reader.read(_READ_CHUNK)
                if not data:
                    raise KafkaConnectionError(f"broker {self.node_id} ({self.host}:{self.port}) closed the connection")
                for frame in decoder.feed(data):
                    self._complete(frame)
        except asyncio.CancelledError:
            raise
        except KafkaError as exc:
            self.close(exc)
        except OSError as exc:
            self.close(connection_error(exc, self.host, self.port, "read from"))
        except ValueError as exc:
            self.close(KafkaConnectionError(f"read from {self.host}:{self.port} failed: {exc}"))

    def _complete(self, frame: bytes) -> None:
        correlation_id = peek_correlation_id(frame)
        if not self._in_flight or self._in_flight[0].correlation_id != correlation_id:
            expected = self._in_flight[0].correlation_id if self._in_flight else None
            raise ProtocolError(f"response correlation id {correlation_id}, expected {expected}")
        entry = self._in_flight.popleft()
        if entry.timer is not None:
            entry.timer.cancel()
        if entry.future.done():  # the awaiting caller was cancelled
            return
        if entry.response_cls is None:
            entry.future.set_result(frame)
            return
        try:
            response = decode_response(frame, entry.response_cls, entry.version)
        except ProtocolError as exc:
            entry.future.set_exception(exc)
            raise
        entry.future.set_result(response)

    def close(self, error: KafkaError | None = None) -> None:
        """Close now; every in-flight request fails with ``error``."""
        if self._closed_error is not None:
            return
        self._closed_error = error or KafkaConnectionError(f"connection to {self.host}:{self.port} closed")
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None and self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
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
        for callback in self._close_callbacks:
            callback(self, self._closed_error)
        self._close_callbacks.clear()

    async def wait_closed(self) -> None:
        if self._reader_task is not None:
            await asyncio.wait([self._reader_task])
        if self._writer is not None:
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()

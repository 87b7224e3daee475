"""An in-memory network: ``asyncio.open_connection`` routed to fake servers.

The producer's real connection code runs unchanged on top of it (StreamReader,
StreamWriter, flow control), while a test decides what the "network" does: refuse a
connection, never complete it, stop reading (so the client's write buffer fills and
its transport pauses writing), or cut it. Used with :mod:`tests.fakes.clock`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

#: What the client's transport buffers before it asks the protocol to pause writing
#: (asyncio's default high-water mark).
HIGH_WATER = 64 * 1024


class Server(Protocol):
    """One listening address of the fake network."""

    def accept(self, conn: ServerSide) -> None: ...


class Listener(Protocol):
    """Where fake servers listen: this in-memory network, or real TCP (tests/fakes/tcp.py)."""

    def listen(self, host: str, port: int, server: Server) -> None: ...

    def stop_listening(self, host: str, port: int) -> None: ...


class ServerSide:
    """The server's end of one in-memory connection."""

    def __init__(self, transport: MemoryTransport) -> None:
        self._transport = transport
        self.on_data: Callable[[bytes], None] = lambda data: None
        self.on_close: Callable[[], None] = lambda: None
        self.closed = False

    @property
    def reading(self) -> bool:
        return self._transport.peer_reading

    @reading.setter
    def reading(self, value: bool) -> None:
        self._transport.set_peer_reading(value)

    def send(self, data: bytes) -> None:
        """Bytes to the client (delivered on the next loop iteration)."""
        if not self.closed:
            self._transport.deliver_to_client(data)

    def close(self) -> None:
        """Close as a broker would: the client reads EOF."""
        if not self.closed:
            self._transport.peer_closed()


class MemoryTransport(asyncio.Transport):
    """The client's end: what StreamWriter writes through."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self.server = ServerSide(self)
        self.peer_reading = True
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._closing = False
        self._lost = False
        self._paused = False
        self._high = HIGH_WATER
        self._low = HIGH_WATER // 4
        self.written = 0  # bytes the server has taken

    # -- asyncio.Transport ---------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        self._buffer.append(bytes(data))
        self._buffered += len(data)
        if self.peer_reading:
            self._loop.call_soon(self._flush)
        self._maybe_pause()

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = HIGH_WATER if high is None else high
        self._low = self._high // 4 if low is None else low
        self._maybe_pause()
        self._maybe_resume()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.call_soon(self._flush)

    def abort(self) -> None:
        self._closing = True
        self._buffer.clear()
        self._buffered = 0
        self._lose(ConnectionResetError("connection aborted"))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("memory", 0), "sockname": ("memory", 0)}.get(name, default)

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    # -- the server's side ------------------------------------------------------------------

    def set_peer_reading(self, value: bool) -> None:
        self.peer_reading = value
        if value:
            self._loop.call_soon(self._flush)

    def deliver_to_client(self, data: bytes) -> None:
        def deliver() -> None:
            if not self._lost:
                self._protocol.data_received(data)

        self._loop.call_soon(deliver)

    def peer_closed(self) -> None:
        self.server.closed = True

        def eof() -> None:
            if self._lost:
                return
            self._protocol.eof_received()
            self._closing = True
            self._lose(None)

        self._loop.call_soon(eof)

    def _flush(self) -> None:
        if self.peer_reading and self._buffer and not self.server.closed:
            chunks, self._buffer = self._buffer, []
            self._buffered = 0
            for chunk in chunks:
                self.written += len(chunk)
                self.server.on_data(chunk)
            self._maybe_resume()
        if self._closing and not self._buffer:
            self._lose(None)

    def _maybe_pause(self) -> None:
        if not self._paused and self._buffered > self._high:
            self._paused = True
            self._protocol.pause_writing()

    def _maybe_resume(self) -> None:
        if self._paused and self._buffered <= self._low:
            self._paused = False
            self._protocol.resume_writing()

    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if not self.server.closed:
            self.server.closed = True
            self.server.on_close()
        self._loop.call_soon(self._protocol.connection_lost, exc)


class MemoryNetwork:
    """Addresses → fake servers; installed in place of ``asyncio.open_connection``."""

    def __init__(self) -> None:
        self.servers: dict[tuple[str, int], Server] = {}
        #: Addresses whose connections never complete (a black hole: SYNs dropped).
        self.black_holes: set[tuple[str, int]] = set()
        self.connects: list[tuple[str, int]] = []

    def listen(self, host: str, port: int, server: Server) -> None:
        self.servers[(host, port)] = server

    def stop_listening(self, host: str, port: int) -> None:
        self.servers.pop((host, port), None)

    async def open_connection(
        self, host: str, port: int, *, limit: int = 2**16, **_: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.connects.append((host, port))
        if (host, port) in self.black_holes:
            await asyncio.get_running_loop().create_future()  # never completes
        server = self.servers.get((host, port))
        if server is None:
            raise ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})")
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport = MemoryTransport(loop, protocol)
        protocol.connection_made(transport)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        server.accept(transport.server)
        return reader, writer

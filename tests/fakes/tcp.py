"""The scripted fake cluster over real loopback TCP, for clients that cannot use the
in-memory network (librdkafka, in the failover benchmark).

:class:`TcpNetwork` has the in-memory network's ``listen`` / ``stop_listening``: each
address becomes a real asyncio server, and each accepted socket reaches the fake node as a
server side (``send``, ``close``, ``on_data``, ``on_close``, ``reading``) just like an
in-memory connection. Real time, no virtual clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tests.fakes.network import Server


class TcpServerSide:
    """A server's end of one real socket, shaped like the in-memory ServerSide."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self.on_data: Callable[[bytes], None] = lambda data: None
        self.on_close: Callable[[], None] = lambda: None
        self.closed = False
        self._reading = True
        self._task = asyncio.ensure_future(self._pump(reader))

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(256 * 1024):
                self.on_data(data)
        except (ConnectionError, OSError):
            pass
        finally:
            self._closed()

    def _closed(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.transport.abort()
            self.on_close()

    @property
    def reading(self) -> bool:
        return self._reading

    @reading.setter
    def reading(self, value: bool) -> None:
        self._reading = value
        transport: Any = self._writer.transport
        transport.resume_reading() if value else transport.pause_reading()

    def send(self, data: bytes) -> None:
        if not self.closed:
            self._writer.write(data)

    def close(self) -> None:
        self._closed()


class TcpNetwork:
    """Addresses → real loopback servers that hand their connections to fake nodes."""

    def __init__(self) -> None:
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._starting: list[asyncio.Future[None]] = []

    def listen(self, host: str, port: int, server: Server) -> None:
        async def bind() -> None:
            async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                server.accept(TcpServerSide(reader, writer))  # type: ignore[arg-type]

            self._servers[(host, port)] = await asyncio.start_server(accepted, host, port, reuse_address=True)

        self._starting.append(asyncio.ensure_future(bind()))

    def stop_listening(self, host: str, port: int) -> None:
        listening = self._servers.pop((host, port), None)
        if listening is not None:
            listening.close()

    async def ready(self) -> None:
        """Every address given to ``listen`` so far is accepting."""
        starting, self._starting = self._starting, []
        await asyncio.gather(*starting)

    async def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()

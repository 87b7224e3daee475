"""A loopback TCP proxy that injects network faults between the producer and a broker.

The broker advertises the proxy's address, so every connection the producer makes
(bootstrap, metadata, produce) passes through here and can be cut, delayed or
black-holed on command. It also follows the Kafka frames each way (a 4-byte size, then the
frame), so that it knows which requests the broker has answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: The Produce request's api key.
PRODUCE = 0


class _Frames:
    """Follows the Kafka frames of one direction of a connection, as its bytes pass."""

    def __init__(self) -> None:
        self._head = bytearray()  # the frame's size, then up to two bytes of it
        self._left = -1  # bytes of the frame still to come; -1: its size is still being read

    def feed(self, data: bytes) -> list[int]:
        """One entry per frame that ``data`` completes: its first two bytes as an int16 (a
        request's api key; meaningless for an answer), -1 for a frame shorter than that."""
        done: list[int] = []
        i, end = 0, len(data)
        while True:
            if self._left < 0:
                take = min(4 - len(self._head), end - i)
                self._head += data[i : i + take]
                i += take
                if len(self._head) < 4:
                    return done
                self._left = int.from_bytes(self._head[:4], "big")
            if self._left > 0:
                take = min(self._left, end - i)
                self._head += data[i : i + min(take, 6 - len(self._head))]
                i += take
                self._left -= take
                if self._left > 0:
                    return done
            done.append(int.from_bytes(self._head[4:6], "big", signed=True) if len(self._head) >= 6 else -1)
            self._head.clear()
            self._left = -1
            if i == end:
                return done


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    sent: int = 0  # bytes forwarded client -> broker
    requests: _Frames = field(default_factory=_Frames)
    answers: _Frames = field(default_factory=_Frames)
    #: The api key of each request forwarded whole to the broker and not answered yet, in order.
    unanswered: deque[int] = field(default_factory=deque)

    def cut(self) -> None:
        for writer in (self.client, self.upstream):
            transport = writer.transport
            if not transport.is_closing():
                transport.abort()  # RST, no orderly close: like a dropped network path


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``target_port``; faults are injected by method calls."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self.delay = 0.0
        self.black_hole = False
        #: Abort every new connection at once, as a port with no broker behind it would.
        self.refuse = False
        #: Cut each new connection after it has forwarded this many bytes (None: never).
        self.cut_after_bytes: int | None = None
        #: Stop cutting by bytes after this many cuts (None: keep cutting).
        self.byte_cuts_left: int | None = None
        #: Cut each new connection after a random lifetime drawn from this range, in seconds.
        self.lifetime: tuple[float, float] | None = None
        self.rng = random.Random(0)
        #: The broker's answers are read and dropped: it still handles (and writes) what it is
        #: sent, and the client never learns the outcome.
        self.mute_answers = False
        #: Requests are dropped: from now on nothing the client sends reaches the broker.
        self.hold_requests = False
        #: Answers to Produce requests dropped by ``mute_answers``.
        self.produce_answers_dropped = 0
        self.connections_cut = 0
        self.connections_accepted = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self._progress = asyncio.Event()  # set as an answer passes or a connection ends

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut_all()
        # Let every connection handler finish on its own rather than be cancelled later.
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def cut_all(self) -> int:
        """Abort every open connection; returns how many were cut."""
        links = list(self._links)
        for link in links:
            link.cut()
        self.connections_cut += len(links)
        return len(links)

    def _expire(self, link: _Link) -> None:
        if link in self._links:
            self.connections_cut += 1
            link.cut()

    @property
    def open_connections(self) -> int:
        return len(self._links)

    def all_answered(self) -> bool:
        """The broker has answered every request forwarded to it on the open connections: with
        ``hold_requests`` on, it has nothing left to do for a client (a connection the client
        closed meanwhile is not counted)."""
        return not any(link.unanswered for link in self._links)

    async def until(self, condition: Callable[[], bool]) -> None:
        """Until ``condition()`` holds, checked as each answer passes and each connection ends."""
        while not condition():
            self._progress.clear()
            await self._progress.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        if self.refuse:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        if self.lifetime is not None:
            asyncio.get_running_loop().call_later(self.rng.uniform(*self.lifetime), self._expire, link)
        link.tasks = [
            asyncio.ensure_future(self._pump(reader, up_writer, link, upstream=True)),
            asyncio.ensure_future(self._pump(up_reader, writer, link, upstream=False)),
        ]
        try:
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            link.cut()
            self._progress.set()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link, *, upstream: bool
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.black_hole:
                    continue  # swallowed: the peer waits for an answer that never comes
                if upstream and self.hold_requests:
                    continue  # dropped before the broker
                if not upstream:
                    self._answered(link, data)
                    if self.mute_answers:
                        continue
                if upstream and self.cut_after_bytes is not None and link.sent + len(data) > self.cut_after_bytes:
                    # Forward part of the request, then drop the line mid-frame.
                    writer.write(data[: max(0, self.cut_after_bytes - link.sent)])
                    self.connections_cut += 1
                    if self.byte_cuts_left is not None:
                        self.byte_cuts_left -= 1
                        if self.byte_cuts_left <= 0:
                            self.cut_after_bytes = None
                    link.cut()
                    return
                if upstream:
                    link.sent += len(data)
                    link.unanswered.extend(link.requests.feed(data))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                link.cut()

    def _answered(self, link: _Link, data: bytes) -> None:
        for _ in link.answers.feed(data):
            api_key = link.unanswered.popleft() if link.unanswered else -1
            if self.mute_answers and api_key == PRODUCE:
                self.produce_answers_dropped += 1
        self._progress.set()


async def cut_randomly(proxy: FaultProxy, stop: asyncio.Event, low: float, high: float, rng: random.Random) -> None:
    """Cut every connection after a random lifetime in [low, high) seconds, until ``stop``."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(low, high))
        if not stop.is_set():
            proxy.cut_all()

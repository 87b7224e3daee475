"""A precise fake broker, for answers a real broker will not give on demand.

It is NOT a Kafka implementation: it speaks just enough of ApiVersions, Metadata,
InitProducerId and Produce for one node leading every partition, and answers each
Produce partition with the next scripted error code (success when the script is empty).
What it accepted is kept in ``log`` so tests can check order and sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from aioprod.protocol import messages as m
from aioprod.protocol.framing import FrameDecoder, decode_request_body, decode_request_header, encode_response
from aioprod.protocol.records import read_batch

NODE_ID = 1
SUPPORTED = {
    m.ApiVersionsRequest.API_KEY: (0, 4),
    m.MetadataRequest.API_KEY: (1, 12),
    m.ProduceRequest.API_KEY: (3, 11),
    m.InitProducerIdRequest.API_KEY: (0, 5),
}
REQUESTS = {
    cls.API_KEY: cls for cls in (m.ApiVersionsRequest, m.MetadataRequest, m.ProduceRequest, m.InitProducerIdRequest)
}


@dataclass(frozen=True)
class Accepted:
    partition: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    values: tuple[bytes | None, ...]
    offset: int


@dataclass(eq=False)
class FakeBroker:
    topic: str = "fake"
    partitions: int = 1
    port: int = 0
    #: Error codes to answer Produce partitions with, in order of arrival (0 = accept).
    script: deque[int] = field(default_factory=deque)
    #: Hold each Produce response until this many Produce requests have arrived.
    hold_until: int = 0
    #: Never answer Produce requests (the connection stays open).
    swallow_produce: bool = False
    log: list[Accepted] = field(default_factory=list)
    produce_requests: int = 0
    init_producer_id_calls: int = 0
    answered: list[tuple[int, int, int]] = field(default_factory=list)  # (partition, base_sequence, code)
    _server: asyncio.Server | None = None
    _next_pid: int = 1000
    _held: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> FakeBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def values(self, partition: int = 0) -> list[bytes | None]:
        return [v for a in self.log if a.partition == partition for v in a.values]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        pending: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue()

        async def answer_in_order() -> None:
            while (future := await pending.get()) is not None:
                writer.write(await future)

        answerer = asyncio.ensure_future(answer_in_order())
        try:
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    pending.put_nowait(asyncio.ensure_future(self._handle(frame)))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            pending.put_nowait(None)
            answerer.cancel()
            writer.transport.abort()

    async def _handle(self, frame: bytes) -> bytes:
        header, body_reader = decode_request_header(frame)
        request = decode_request_body(body_reader, header, REQUESTS[header.api_key])
        version, cid = header.api_version, header.correlation_id
        if isinstance(request, m.ApiVersionsRequest):
            keys = [m.ApiVersionsResponseApiKey(k, lo, hi) for k, (lo, hi) in SUPPORTED.items()]
            return encode_response(m.ApiVersionsResponse(api_keys=keys), version, cid)
        if isinstance(request, m.MetadataRequest):
            assert self._server is not None
            parts = [
                m.MetadataResponsePartition(0, p, NODE_ID, 0, [NODE_ID], [NODE_ID], []) for p in range(self.partitions)
            ]
            response = m.MetadataResponse(
                brokers=[m.MetadataResponseBroker(NODE_ID, "127.0.0.1", self.port)],
                controller_id=NODE_ID,
                topics=[m.MetadataResponseTopic(0, self.topic, partitions=parts)],
            )
            return encode_response(response, version, cid)
        if isinstance(request, m.InitProducerIdRequest):
            self.init_producer_id_calls += 1
            self._next_pid += 1
            return encode_response(m.InitProducerIdResponse(producer_id=self._next_pid, producer_epoch=0), version, cid)
        assert isinstance(request, m.ProduceRequest)
        return await self._produce(request, version, cid)

    async def _produce(self, request: m.ProduceRequest, version: int, cid: int) -> bytes:
        self.produce_requests += 1
        if self.swallow_produce:
            await asyncio.Event().wait()
        # Decide the answer on arrival, so the script is consumed in arrival order even
        # when responses are held back.
        topics = []
        for t in request.topic_data:
            parts = []
            for p in t.partition_data:
                assert p.records is not None
                batch = read_batch(p.records)
                code = self.script.popleft() if self.script else 0
                self.answered.append((p.index, batch.base_sequence, code))
                offset = -1
                if code == 0:
                    offset = sum(len(a.values) for a in self.log if a.partition == p.index)
                    self.log.append(
                        Accepted(
                            p.index,
                            batch.producer_id,
                            batch.producer_epoch,
                            batch.base_sequence,
                            tuple(r.value for r in batch.records),
                            offset,
                        )
                    )
                parts.append(m.ProduceResponsePartition(index=p.index, error_code=code, base_offset=offset))
            topics.append(m.ProduceResponseTopic(name=t.name, partition_responses=parts))
        if self.hold_until:
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._held.append(gate)
            if self.produce_requests >= self.hold_until:
                self.hold_until = 0
                for held in self._held:
                    if not held.done():
                        held.set_result(None)
                self._held.clear()
            await gate
        return encode_response(m.ProduceResponse(responses=topics), version, cid)

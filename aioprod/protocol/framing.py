"""Request/response headers and the size-prefixed frame stream.

:class:`FrameDecoder` is fed whatever chunks the socket yields and hands back whole
frames; chunks are kept in a list and joined once per frame, so a large response
arriving in many small reads costs linear, not quadratic, copying.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import TypeVar, cast

from aioprod.errors import ProtocolError
from aioprod.protocol import primitives as p
from aioprod.protocol.messages import ProduceResponse
from aioprod.protocol.primitives import Reader
from aioprod.protocol.produce_response import decode_produce_response
from aioprod.protocol.schema import Request, Response, S, struct_codec

R = TypeVar("R", bound=Request)

_SIZE = _INT32 = struct.Struct(">i")

#: Refuse frames larger than this unless configured otherwise: a corrupt or hostile
#: size prefix must not make the client buffer gigabytes.
DEFAULT_MAX_FRAME_SIZE = 256 * 1024 * 1024

API_VERSIONS_KEY = 18


def request_header_version(request: type[Request], version: int) -> int:
    return 2 if request.is_flexible(version) else 1


def response_header_version(response: type[Response], version: int) -> int:
    # ApiVersions answers with header v0 even in flexible versions, so a client can
    # read the error code whatever version it asked for (KIP-511).
    if response.API_KEY == API_VERSIONS_KEY:
        return 0
    return 1 if response.is_flexible(version) else 0


def encode_request(request: Request, version: int, correlation_id: int, client_id: str | None) -> bytes:
    """One whole frame: size prefix, header, body."""
    cls = type(request)
    if not cls.MIN_VERSION <= version <= cls.MAX_VERSION:
        raise ProtocolError(f"{cls.__name__} has no version {version}", remote=False)
    out = bytearray(4)
    p.write_int16(out, cls.API_KEY)
    p.write_int16(out, version)
    p.write_int32(out, correlation_id)
    # client_id stays a classic nullable string even in header v2.
    p.write_string(out, client_id, compact=False, nullable=True)
    flexible = cls.is_flexible(version)
    if flexible:
        out.append(0)  # no tagged fields in the header
    struct_codec(cls, version, flexible)[0](out, request)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def decode_request_header(frame: bytes) -> tuple[RequestHeader, Reader]:
    """Parse a request frame's header; the reader is left at the body (fake brokers, tests)."""
    r = Reader(frame)
    header = RequestHeader(r.int16(), r.int16(), r.int32(), r.string(compact=False, nullable=True))
    return header, r


def decode_request_body(r: Reader, header: RequestHeader, request: type[R]) -> R:
    flexible = request.is_flexible(header.api_version)
    if flexible:
        _skip_tagged_fields(r)
    body: R = struct_codec(request, header.api_version, flexible)[1](r)
    if r.remaining:
        raise ProtocolError(f"{request.__name__}: {r.remaining} trailing bytes")
    return body


def peek_correlation_id(frame: bytes | memoryview) -> int:
    if len(frame) < 4:
        raise ProtocolError("response frame shorter than its header")
    return int(_INT32.unpack_from(frame, 0)[0])


def decode_response(frame: bytes | memoryview, response: type[S], version: int) -> S:
    """Parse a response frame body (without size prefix, correlation id included)."""
    cls: type[Response] = response  # type: ignore[assignment]
    r = Reader(frame)
    r.int32()  # correlation id, matched by the connection
    if response_header_version(cls, version) >= 1:
        _skip_tagged_fields(r)
    # Bytes after the last known field are ignored, as the Java client and librdkafka do:
    # the frame size already delimits the response, and some brokers (librdkafka's mock
    # cluster, for flexible Metadata) append a byte the spec does not have.
    if cls is ProduceResponse:  # the data path's answer: a decoder of its own, equal in result
        return cast(S, decode_produce_response(r, version))
    body: S = struct_codec(response, version, cls.is_flexible(version))[1](r)
    return body


def encode_response(response: Response, version: int, correlation_id: int) -> bytes:
    """One whole response frame; used by the fault-injecting fake broker in tests."""
    cls = type(response)
    out = bytearray(4)
    p.write_int32(out, correlation_id)
    if response_header_version(cls, version) >= 1:
        out.append(0)
    struct_codec(cls, version, cls.is_flexible(version))[0](out, response)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _skip_tagged_fields(r: Reader) -> None:
    for _ in range(r.unsigned_varint()):
        r.unsigned_varint()
        r.raw(r.unsigned_varint())


class FrameDecoder:
    """Turns a byte stream into size-prefixed frames (sans-IO)."""

    __slots__ = ("_buffered", "_chunks", "_need", "_offset", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._chunks: deque[bytes] = deque()
        self._offset = 0  # bytes of chunks[0] already consumed
        self._buffered = 0
        self._need = -1  # body size of the frame being assembled, -1 until its prefix is read
        self.max_frame_size = max_frame_size

    @property
    def buffered(self) -> int:
        return self._buffered

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return every frame (body without size) now complete."""
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
        frames: list[bytes] = []
        while True:
            if self._need < 0:
                if self._buffered < 4:
                    return frames
                size = int(_SIZE.unpack(self._take(4))[0])
                if size < 0 or size > self.max_frame_size:
                    raise ProtocolError(f"frame size {size} outside 0..{self.max_frame_size}")
                self._need = size
            if self._buffered < self._need:
                return frames
            frames.append(self._take(self._need))
            self._need = -1

    def _take(self, n: int) -> bytes:
        if n == 0:
            return b""  # an empty frame may follow a prefix that used up every chunk
        chunks = self._chunks
        self._buffered -= n
        first = chunks[0]
        off = self._offset
        if len(first) - off >= n:
            piece = first[off : off + n]
            off += n
            if off == len(first):
                chunks.popleft()
                off = 0
            self._offset = off
            return piece
        parts = [first[off:]]
        got = len(first) - off
        chunks.popleft()
        off = 0
        while got < n:
            chunk = chunks[0]
            want = n - got
            if len(chunk) > want:
                parts.append(chunk[:want])
                off = want
                got = n
            else:
                parts.append(chunk)
                chunks.popleft()
                got += len(chunk)
        self._offset = off
        return b"".join(parts)

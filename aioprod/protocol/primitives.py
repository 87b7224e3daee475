"""Kafka's primitive types: fixed-width integers, varints, strings, bytes, UUIDs.

Writers append to a ``bytearray``; :class:`Reader` walks an immutable buffer and raises
:class:`~aioprod.errors.ProtocolError` on anything truncated or out of range, so a
malformed response can never make the client hang or allocate what a length claims.
"""

from __future__ import annotations

import builtins
import struct
import uuid

from aioprod.errors import ProtocolError

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

INT8_MIN, INT8_MAX = -(1 << 7), (1 << 7) - 1
INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT32_MAX = (1 << 32) - 1


def write_int8(out: bytearray, value: int) -> None:
    out += _I8.pack(value)


def write_int16(out: bytearray, value: int) -> None:
    out += _I16.pack(value)


def write_uint16(out: bytearray, value: int) -> None:
    out += _U16.pack(value)


def write_int32(out: bytearray, value: int) -> None:
    out += _I32.pack(value)


def write_uint32(out: bytearray, value: int) -> None:
    out += _U32.pack(value)


def write_int64(out: bytearray, value: int) -> None:
    out += _I64.pack(value)


def write_float64(out: bytearray, value: float) -> None:
    out += _F64.pack(value)


def write_bool(out: bytearray, value: bool) -> None:
    out.append(1 if value else 0)


def write_unsigned_varint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"unsigned varint cannot hold {value}")
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def zigzag(value: int) -> int:
    """Map a signed int to an unsigned one so small magnitudes stay short (protobuf)."""
    return (value << 1) ^ (value >> 63)


def unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def write_varint(out: bytearray, value: int) -> None:
    """Zig-zag varint (int32 range), as in record fields."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint out of int32 range: {value}")
    write_unsigned_varint(out, zigzag(value) & 0xFFFFFFFF)


def write_varlong(out: bytearray, value: int) -> None:
    """Zig-zag varlong (int64 range), as in record timestamps."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong out of int64 range: {value}")
    write_unsigned_varint(out, zigzag(value) & 0xFFFFFFFFFFFFFFFF)


def varint_size(value: int) -> int:
    """Bytes a zig-zag varint/varlong of ``value`` occupies."""
    return unsigned_varint_size(zigzag(value) & 0xFFFFFFFFFFFFFFFF)


def unsigned_varint_size(value: int) -> int:
    size = 1
    while value > 0x7F:
        value >>= 7
        size += 1
    return size


def write_string(out: bytearray, value: str | None, *, compact: bool, nullable: bool) -> None:
    if value is None:
        _write_null(out, compact, nullable, "string")
        return
    data = value.encode()
    # Kafka caps compact strings at the classic limit too (its parsers reject longer ones).
    if len(data) > INT16_MAX:
        raise ProtocolError(f"string of {len(data)} bytes is too long", remote=False)
    if compact:
        write_unsigned_varint(out, len(data) + 1)
    else:
        write_int16(out, len(data))
    out += data


def write_bytes(out: bytearray, value: bytes | bytearray | memoryview | None, *, compact: bool, nullable: bool) -> None:
    if value is None:
        _write_null(out, compact, nullable, "bytes")
        return
    if compact:
        write_unsigned_varint(out, len(value) + 1)
    else:
        write_int32(out, len(value))
    out += value


def write_array_length(out: bytearray, length: int | None, *, compact: bool, nullable: bool) -> None:
    if length is None:
        _write_null(out, compact, nullable, "array")
    elif compact:
        write_unsigned_varint(out, length + 1)
    else:
        write_int32(out, length)


def _write_null(out: bytearray, compact: bool, nullable: bool, what: str) -> None:
    if not nullable:
        raise ProtocolError(f"null {what} where the field is not nullable", remote=False)
    if compact:
        out.append(0)
    elif what == "string":
        write_int16(out, -1)
    else:
        write_int32(out, -1)


def write_uuid(out: bytearray, value: uuid.UUID) -> None:
    out += value.bytes


class Reader:
    """A cursor over one buffer; every read checks bounds before it copies."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: builtins.bytes | bytearray | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, builtins.bytes) else buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise ProtocolError(f"truncated data: need {n} bytes at offset {start}, have {self.end - start}")
        self.pos = start + n
        return start

    def raw(self, n: int) -> builtins.bytes:
        start = self._take(n)
        return bytes(self.buf[start : start + n])

    def view(self, n: int) -> memoryview:
        start = self._take(n)
        return memoryview(self.buf)[start : start + n]

    def int8(self) -> int:
        return int(_I8.unpack_from(self.buf, self._take(1))[0])

    def int16(self) -> int:
        return int(_I16.unpack_from(self.buf, self._take(2))[0])

    def uint16(self) -> int:
        return int(_U16.unpack_from(self.buf, self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack_from(self.buf, self._take(4))[0])

    def uint32(self) -> int:
        return int(_U32.unpack_from(self.buf, self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack_from(self.buf, self._take(8))[0])

    def float64(self) -> float:
        return float(_F64.unpack_from(self.buf, self._take(8))[0])

    def bool(self) -> builtins.bool:
        return self.int8() != 0

    def unsigned_varint(self, max_bytes: int = 5) -> int:
        """Read an unsigned varint of at most ``max_bytes`` (5 for int32, 10 for int64)."""
        value = 0
        shift = 0
        buf = self.buf
        for _ in range(max_bytes):
            if self.pos >= self.end:
                raise ProtocolError("truncated varint")
            byte = buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise ProtocolError(f"varint longer than {max_bytes} bytes")

    def varint(self) -> int:
        raw = self.unsigned_varint(5)
        if raw > UINT32_MAX:
            raise ProtocolError("varint out of int32 range")
        return unzigzag(raw)

    def varlong(self) -> int:
        raw = self.unsigned_varint(10)
        if raw > 0xFFFFFFFFFFFFFFFF:
            raise ProtocolError("varlong out of int64 range")
        return unzigzag(raw)

    def _length(self, compact: builtins.bool, nullable: builtins.bool, wide: builtins.bool) -> int | None:
        if compact:
            n = self.unsigned_varint() - 1
        elif wide:
            n = self.int32()
        else:
            n = self.int16()
        if n < 0:
            if n == -1 and nullable:
                return None
            raise ProtocolError(f"invalid length {n}" + ("" if nullable else " for a non-nullable field"))
        return n

    def string(self, *, compact: builtins.bool, nullable: builtins.bool) -> str | None:
        n = self._length(compact, nullable, wide=False)
        if n is None:
            return None
        start = self._take(n)
        try:
            return bytes(self.buf[start : start + n]).decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"string is not valid UTF-8: {exc}") from None

    def bytes(self, *, compact: builtins.bool, nullable: builtins.bool) -> builtins.bytes | None:
        n = self._length(compact, nullable, wide=True)
        return None if n is None else self.raw(n)

    def array_length(self, *, compact: builtins.bool, nullable: builtins.bool, min_item_size: int = 1) -> int | None:
        """An array's element count, refused if the buffer could not possibly hold it."""
        n = self._length(compact, nullable, wide=True)
        if n is not None and n * min_item_size > self.remaining:
            raise ProtocolError(f"array claims {n} elements but only {self.remaining} bytes remain")
        return n

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.raw(16))

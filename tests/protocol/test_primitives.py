"""Kafka's primitive types: round trips, exact encodings at the edges, and bounds errors."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.util import encode_varint as kafka_python_encode_varint

from aioprod.errors import ProtocolError
from aioprod.protocol import primitives as p
from aioprod.protocol.primitives import Reader

FAST = settings(max_examples=150, deadline=None)


def written(fn: Callable[..., None], *args: Any, **kwargs: Any) -> bytes:
    out = bytearray()
    fn(out, *args, **kwargs)
    return bytes(out)


# --- fixed-width ----------------------------------------------------------------------------

FIXED = [
    ("int8", p.write_int8, Reader.int8, p.INT8_MIN, p.INT8_MAX, 1),
    ("int16", p.write_int16, Reader.int16, p.INT16_MIN, p.INT16_MAX, 2),
    ("uint16", p.write_uint16, Reader.uint16, 0, 0xFFFF, 2),
    ("int32", p.write_int32, Reader.int32, p.INT32_MIN, p.INT32_MAX, 4),
    ("uint32", p.write_uint32, Reader.uint32, 0, p.UINT32_MAX, 4),
    ("int64", p.write_int64, Reader.int64, p.INT64_MIN, p.INT64_MAX, 8),
]


@pytest.mark.parametrize(("name", "write", "read", "low", "high", "size"), FIXED, ids=[f[0] for f in FIXED])
def test_fixed_width_edges(
    name: str, write: Callable[..., None], read: Callable[[Reader], int], low: int, high: int, size: int
) -> None:
    for value in (low, low + 1, -1 if low < 0 else 1, 0, high - 1, high):
        data = written(write, value)
        assert len(data) == size
        assert data == value.to_bytes(size, "big", signed=low < 0)
        r = Reader(data)
        assert read(r) == value
        assert r.remaining == 0
    for bad in (low - 1, high + 1):
        with pytest.raises(struct.error):
            written(write, bad)
    with pytest.raises(ProtocolError):
        read(Reader(b"\x00" * (size - 1)))


@FAST
@given(st.data())
def test_fixed_width_round_trip(data: st.DataObject) -> None:
    _, write, read, low, high, _ = data.draw(st.sampled_from(FIXED))
    value = data.draw(st.integers(low, high))
    r = Reader(written(write, value))
    assert read(r) == value and r.remaining == 0


@FAST
@given(st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, float("inf"), float("-inf")]))
def test_float64_round_trip(value: float) -> None:
    data = written(p.write_float64, value)
    assert data == struct.pack(">d", value)
    assert Reader(data).float64() == value


def test_float64_nan() -> None:
    assert Reader(written(p.write_float64, float("nan"))).float64() != 0.0  # nan != anything


def test_bool() -> None:
    assert written(p.write_bool, True) == b"\x01"
    assert written(p.write_bool, False) == b"\x00"
    assert Reader(b"\x00").bool() is False
    assert Reader(b"\x01").bool() is True
    assert Reader(b"\x7f").bool() is True  # any non-zero byte, as the Java client reads it
    with pytest.raises(ProtocolError):
        Reader(b"").bool()


# --- varints -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (p.INT32_MAX, b"\xff\xff\xff\xff\x07"),
        (p.UINT32_MAX, b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_unsigned_varint_known(value: int, encoded: bytes) -> None:
    assert written(p.write_unsigned_varint, value) == encoded
    assert p.unsigned_varint_size(value) == len(encoded)
    r = Reader(encoded)
    assert r.unsigned_varint() == value
    assert r.remaining == 0


@FAST
@given(st.integers(0, p.UINT32_MAX))
def test_unsigned_varint_round_trip(value: int) -> None:
    data = written(p.write_unsigned_varint, value)
    assert len(data) == p.unsigned_varint_size(value) <= 5
    assert Reader(data).unsigned_varint() == value


@FAST
@given(st.integers(0, (1 << 64) - 1))
def test_unsigned_varint_64_bit(value: int) -> None:
    data = written(p.write_unsigned_varint, value)
    assert len(data) <= 10
    assert Reader(data).unsigned_varint(10) == value


def test_unsigned_varint_errors() -> None:
    with pytest.raises(ValueError):
        written(p.write_unsigned_varint, -1)
    with pytest.raises(ProtocolError, match="truncated"):
        Reader(b"").unsigned_varint()
    with pytest.raises(ProtocolError, match="truncated"):
        Reader(b"\x80\x80").unsigned_varint()
    with pytest.raises(ProtocolError, match="longer than 5"):
        Reader(b"\x80\x80\x80\x80\x80\x01").unsigned_varint()
    with pytest.raises(ProtocolError, match="longer than 10"):
        Reader(b"\x80" * 10 + b"\x01").unsigned_varint(10)


@pytest.mark.parametrize(
    ("value", "zigzagged"),
    [(0, 0), (-1, 1), (1, 2), (-2, 3), (2, 4), (p.INT32_MAX, 0xFFFFFFFE), (p.INT32_MIN, 0xFFFFFFFF)],
)
def test_zigzag_known(value: int, zigzagged: int) -> None:
    assert p.zigzag(value) == zigzagged
    assert p.unzigzag(zigzagged) == value


@FAST
@given(st.integers(p.INT64_MIN, p.INT64_MAX))
def test_zigzag_round_trip(value: int) -> None:
    z = p.zigzag(value)
    assert 0 <= z <= (1 << 64) - 1
    assert p.unzigzag(z) == value
    assert z == (2 * value if value >= 0 else -2 * value - 1)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (p.INT32_MAX, b"\xfe\xff\xff\xff\x0f"),
        (p.INT32_MIN, b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_varint_known(value: int, encoded: bytes) -> None:
    assert written(p.write_varint, value) == encoded
    assert p.varint_size(value) == len(encoded)
    assert Reader(encoded).varint() == value


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (p.INT64_MAX, b"\xfe" + b"\xff" * 8 + b"\x01"),
        (p.INT64_MIN, b"\xff" * 9 + b"\x01"),
        (-1, b"\x01"),
        (1 << 40, written(p.write_unsigned_varint, 1 << 41)),
    ],
)
def test_varlong_known(value: int, encoded: bytes) -> None:
    assert written(p.write_varlong, value) == encoded
    assert p.varint_size(value) == len(encoded)
    assert Reader(encoded).varlong() == value


@FAST
@given(st.integers(p.INT32_MIN, p.INT32_MAX))
def test_varint_round_trip_matches_kafka_python(value: int) -> None:
    data = written(p.write_varint, value)
    reference = bytearray()
    kafka_python_encode_varint(value, reference.append)
    assert data == bytes(reference)
    assert len(data) == p.varint_size(value)
    r = Reader(data)
    assert r.varint() == value and r.remaining == 0


@FAST
@given(st.integers(p.INT64_MIN, p.INT64_MAX))
def test_varlong_round_trip(value: int) -> None:
    data = written(p.write_varlong, value)
    assert len(data) == p.varint_size(value) <= 10
    r = Reader(data)
    assert r.varlong() == value and r.remaining == 0


def test_varint_bounds() -> None:
    for bad in (p.INT32_MIN - 1, p.INT32_MAX + 1):
        with pytest.raises(ValueError):
            written(p.write_varint, bad)
    for bad in (p.INT64_MIN - 1, p.INT64_MAX + 1):
        with pytest.raises(ValueError):
            written(p.write_varlong, bad)
    # five bytes can carry 35 bits: more than an int32 is an error, not a silent wrap
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff\xff\xff\x1f").varint()
    with pytest.raises(ProtocolError):
        Reader(b"\xff" * 10 + b"\x01").varlong()
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff").varint()


# --- strings, bytes, arrays -------------------------------------------------------------------


@FAST
@given(st.text(max_size=40), st.booleans(), st.booleans())
def test_string_round_trip(value: str, compact: bool, nullable: bool) -> None:
    data = written(p.write_string, value, compact=compact, nullable=nullable)
    raw = value.encode()
    if compact:
        assert data == written(p.write_unsigned_varint, len(raw) + 1) + raw
    else:
        assert data == len(raw).to_bytes(2, "big") + raw
    r = Reader(data)
    assert r.string(compact=compact, nullable=nullable) == value
    assert r.remaining == 0


def test_string_null_and_edges() -> None:
    assert written(p.write_string, None, compact=False, nullable=True) == b"\xff\xff"
    assert written(p.write_string, None, compact=True, nullable=True) == b"\x00"
    assert Reader(b"\xff\xff").string(compact=False, nullable=True) is None
    assert Reader(b"\x00").string(compact=True, nullable=True) is None
    assert written(p.write_string, "", compact=False, nullable=False) == b"\x00\x00"
    assert written(p.write_string, "", compact=True, nullable=False) == b"\x01"
    assert written(p.write_string, "é", compact=True, nullable=False) == b"\x03\xc3\xa9"
    for compact in (False, True):
        with pytest.raises(ProtocolError) as info:
            written(p.write_string, None, compact=compact, nullable=False)
        assert info.value.remote is False
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff").string(compact=False, nullable=False)
    with pytest.raises(ProtocolError):
        Reader(b"\x00").string(compact=True, nullable=False)
    with pytest.raises(ProtocolError, match="invalid length -2"):
        Reader(b"\xff\xfe").string(compact=False, nullable=True)


def test_string_limits() -> None:
    longest = "x" * p.INT16_MAX
    assert (
        Reader(written(p.write_string, longest, compact=False, nullable=False)).string(compact=False, nullable=False)
        == longest
    )
    with pytest.raises(ProtocolError) as info:
        written(p.write_string, longest + "x", compact=False, nullable=False)
    assert info.value.remote is False
    # a multi-byte character counts by its UTF-8 length
    with pytest.raises(ProtocolError):
        written(p.write_string, "é" * (p.INT16_MAX // 2 + 1), compact=False, nullable=False)


def test_string_truncated_and_bad_utf8() -> None:
    with pytest.raises(ProtocolError, match="truncated"):
        Reader(b"\x00\x05abc").string(compact=False, nullable=False)
    with pytest.raises(ProtocolError, match="truncated"):
        Reader(b"\x06abc").string(compact=True, nullable=False)
    with pytest.raises(ProtocolError, match="UTF-8"):
        Reader(b"\x00\x02\xc3\x28").string(compact=False, nullable=False)
    with pytest.raises(ProtocolError, match="UTF-8"):
        Reader(b"\x02\xff").string(compact=True, nullable=False)
    with pytest.raises(ProtocolError):  # lone surrogate encoded as UTF-8 is not valid UTF-8
        Reader(b"\x04\xed\xa0\x80").string(compact=True, nullable=False)


@FAST
@given(st.binary(max_size=64), st.booleans(), st.booleans())
def test_bytes_round_trip(value: bytes, compact: bool, nullable: bool) -> None:
    data = written(p.write_bytes, value, compact=compact, nullable=nullable)
    if compact:
        assert data == written(p.write_unsigned_varint, len(value) + 1) + value
    else:
        assert data == len(value).to_bytes(4, "big") + value
    r = Reader(data)
    assert r.bytes(compact=compact, nullable=nullable) == value
    assert r.remaining == 0


def test_bytes_null_and_errors() -> None:
    assert written(p.write_bytes, None, compact=False, nullable=True) == b"\xff\xff\xff\xff"
    assert written(p.write_bytes, None, compact=True, nullable=True) == b"\x00"
    assert Reader(b"\xff\xff\xff\xff").bytes(compact=False, nullable=True) is None
    assert Reader(b"\x00").bytes(compact=True, nullable=True) is None
    assert written(p.write_bytes, memoryview(b"ab"), compact=True, nullable=False) == b"\x03ab"
    with pytest.raises(ProtocolError):
        written(p.write_bytes, None, compact=False, nullable=False)
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff\xff\xff").bytes(compact=False, nullable=False)
    with pytest.raises(ProtocolError):
        Reader(b"\x80\x00\x00\x00").bytes(compact=False, nullable=True)  # -2**31
    with pytest.raises(ProtocolError, match="truncated"):
        Reader(b"\x7f\xff\xff\xff").bytes(compact=False, nullable=False)  # claims 2 GiB
    with pytest.raises(ProtocolError, match="truncated"):
        Reader(b"\xff\xff\xff\xff\x0f").bytes(compact=True, nullable=False)  # claims 4 GiB


@FAST
@given(st.one_of(st.none(), st.integers(0, 1000)), st.booleans())
def test_array_length_round_trip(length: int | None, compact: bool) -> None:
    data = written(p.write_array_length, length, compact=compact, nullable=True)
    if length is None:
        assert data == (b"\x00" if compact else b"\xff\xff\xff\xff")
    elif compact:
        assert data == written(p.write_unsigned_varint, length + 1)
    else:
        assert data == length.to_bytes(4, "big")
    r = Reader(data + b"\x00" * (length or 0))
    assert r.array_length(compact=compact, nullable=True) == length


def test_array_length_errors() -> None:
    with pytest.raises(ProtocolError):
        written(p.write_array_length, None, compact=True, nullable=False)
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff\xff\xff").array_length(compact=False, nullable=False)
    with pytest.raises(ProtocolError):
        Reader(b"\x00").array_length(compact=True, nullable=False)
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff\xff\xfe").array_length(compact=False, nullable=True)
    # a count the remaining bytes cannot hold is refused before anything is allocated
    with pytest.raises(ProtocolError, match="claims"):
        Reader(b"\x7f\xff\xff\xff" + b"\x00" * 8).array_length(compact=False, nullable=False)
    with pytest.raises(ProtocolError, match="claims"):
        Reader(b"\xff\xff\xff\xff\x0f").array_length(compact=True, nullable=False)
    with pytest.raises(ProtocolError, match="claims"):
        Reader(b"\x00\x00\x00\x03" + b"\x00" * 8).array_length(compact=False, nullable=False, min_item_size=4)
    assert Reader(b"\x00\x00\x00\x02" + b"\x00" * 8).array_length(compact=False, nullable=False, min_item_size=4) == 2


# --- UUID and the reader itself ----------------------------------------------------------------


@FAST
@given(st.uuids())
def test_uuid_round_trip(value: uuid.UUID) -> None:
    data = written(p.write_uuid, value)
    assert data == value.bytes and len(data) == 16
    assert Reader(data).uuid() == value


def test_uuid_edges() -> None:
    assert written(p.write_uuid, uuid.UUID(int=0)) == b"\x00" * 16
    assert Reader(b"\xff" * 16).uuid() == uuid.UUID(int=(1 << 128) - 1)
    with pytest.raises(ProtocolError):
        Reader(b"\x00" * 15).uuid()


def test_reader_respects_window_and_buffer_types() -> None:
    buf = b"\x00\x01\x00\x02\x00\x03"
    r = Reader(buf, 2, 4)
    assert r.remaining == 2
    assert r.int16() == 2
    with pytest.raises(ProtocolError):
        r.int16()  # the bytes exist in the buffer, but past the window
    for kind in (bytes, bytearray, memoryview):
        r = Reader(kind(buf))
        assert [r.int16() for _ in range(3)] == [1, 2, 3]
    r = Reader(bytearray(b"abcdef"))
    assert r.raw(2) == b"ab"
    assert bytes(r.view(2)) == b"cd"
    with pytest.raises(ProtocolError):
        r.raw(3)
    with pytest.raises(ProtocolError):
        r.raw(-1)
    assert r.pos == 4  # failed reads do not move the cursor

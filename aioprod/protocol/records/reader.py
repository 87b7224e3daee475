"""Parse record batches (magic v2) into immutable value objects.

Everything read from the wire is checked before it is trusted: batch and record lengths
against the bytes actually present, the CRC-32C, the codec id, the record count, and the
decompressed size against a ceiling. Any violation raises :class:`CorruptRecordError`; no
length field is ever used to allocate memory before the buffer is known to hold that much.

A buffer of several batches (a fetch response's records) may end with a partial batch,
because brokers cut responses at a byte limit. :func:`read_batches` ignores such a tail, as
the Java consumer does; :func:`read_batch` reads exactly one batch and rejects truncation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NoReturn

import crc32c

from aioprod.errors import CorruptRecordError
from aioprod.protocol.records.compression import DEFAULT_MAX_DECOMPRESSED_SIZE, BytesLike, Codec, decompress

__all__ = [
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "Record",
    "RecordBatch",
    "read_batch",
    "read_batches",
]

CREATE_TIME: Final = 0
LOG_APPEND_TIME: Final = 1

_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
_HEADER_SIZE: Final = _HEADER.size  # 61
_LOG_OVERHEAD: Final = 12  # baseOffset + batchLength: the part batchLength does not count
_LENGTH: Final = struct.Struct(">qi")
_CRC_START: Final = 21  # the CRC covers attributes .. end
_MIN_RECORD_SIZE: Final = 7  # length, attributes, 2 deltas, null key, null value, 0 headers

_CODEC_MASK: Final = 0x07
_TIMESTAMP_TYPE: Final = 0x08
_TRANSACTIONAL: Final = 0x10
_CONTROL: Final = 0x20

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One record with its absolute offset and timestamp resolved against its batch."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A decoded batch: every header field as on the wire, plus its records."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records: tuple[Record, ...]

    @property
    def compression(self) -> Codec:
        return Codec(self.attributes & _CODEC_MASK)

    @property
    def timestamp_type(self) -> int:
        """:data:`CREATE_TIME` or :data:`LOG_APPEND_TIME`."""
        return LOG_APPEND_TIME if self.attributes & _TIMESTAMP_TYPE else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + _LOG_OVERHEAD


def read_batch(data: BytesLike, *, max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE) -> RecordBatch:
    """Decode a buffer that holds exactly one batch; truncation or trailing bytes are errors."""
    buf = data if isinstance(data, bytes) else bytes(data)
    end = _batch_end(buf, 0)
    if end is None:
        raise CorruptRecordError(f"record batch is truncated: {len(buf)} bytes")
    if end != len(buf):
        raise CorruptRecordError(f"{len(buf) - end} unexpected bytes after the record batch")
    return _decode(buf, 0, end, max_decompressed_size)


def read_batches(
    data: BytesLike,
    *,
    allow_partial: bool = True,
    max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
) -> list[RecordBatch]:
    """Decode concatenated batches.

    A trailing partial batch — fewer bytes than its length field announces — is skipped when
    ``allow_partial`` (the fetch case: the broker cut the response) and raises otherwise.
    A batch that is complete but malformed always raises.
    """
    buf = data if isinstance(data, bytes) else bytes(data)
    size = len(buf)
    batches: list[RecordBatch] = []
    pos = 0
    while pos < size:
        end = _batch_end(buf, pos)
        if end is None:
            if allow_partial:
                break
            raise CorruptRecordError(f"record batch at byte {pos} is truncated: {size - pos} bytes")
        batches.append(_decode(buf, pos, end, max_decompressed_size))
        pos = end
    return batches


def _batch_end(buf: bytes, pos: int) -> int | None:
    """Where the batch at ``pos`` ends, or None if the buffer stops before that."""
    if len(buf) - pos < _LOG_OVERHEAD:
        return None
    _, length = _LENGTH.unpack_from(buf, pos)
    if length < _HEADER_SIZE - _LOG_OVERHEAD:
        raise CorruptRecordError(f"record batch length {length} is smaller than a batch header")
    end = pos + _LOG_OVERHEAD + length
    return end if end <= len(buf) else None


def _decode(buf: bytes, pos: int, end: int, max_size: int) -> RecordBatch:
    magic = buf[pos + 16]
    if magic != 2:
        raise CorruptRecordError(f"unsupported record batch magic {magic} (only v2 is supported)")
    (base_offset, length, epoch, _, crc, attributes, last_delta, base_ts, max_ts, producer_id,
     producer_epoch, base_sequence, count) = _HEADER.unpack_from(buf, pos)  # fmt: skip
    actual = crc32c.crc32c(memoryview(buf)[pos + _CRC_START : end])
    if actual != crc:
        raise CorruptRecordError(
            f"record batch at offset {base_offset} failed its CRC: stored {crc:#010x}, computed {actual:#010x}"
        )
    if count < 0:
        raise CorruptRecordError(f"record batch claims a negative record count {count}")
    codec = attributes & _CODEC_MASK
    start = pos + _HEADER_SIZE
    if codec:
        if codec > Codec.ZSTD:
            raise CorruptRecordError(f"record batch uses unknown compression codec id {codec}")
        records_buf = decompress(codec, memoryview(buf)[start:end], max_size)
        start, end = 0, len(records_buf)
    else:
        records_buf = buf
    if count > (end - start) // _MIN_RECORD_SIZE:
        raise CorruptRecordError(f"record batch claims {count} records but holds only {end - start} bytes")
    fixed_ts = max_ts if attributes & _TIMESTAMP_TYPE else None
    records = _decode_records(records_buf, start, end, count, base_offset, base_ts, fixed_ts)
    return RecordBatch(base_offset, length, epoch, magic, crc, attributes, last_delta, base_ts, max_ts,
                       producer_id, producer_epoch, base_sequence, count, records)  # fmt: skip


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A zig-zag varint of at most 5 bytes (int32) inside ``buf[pos:end]``."""
    byte = buf[pos] if pos < end else _truncated()
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    value = byte & 0x7F
    shift = 7
    pos += 1
    stop = min(end, pos + 4)
    while pos < stop:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > 0xFFFFFFFF:
                break
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    if pos >= end and byte >= 0x80:
        _truncated()
    raise CorruptRecordError("varint does not fit in 32 bits")


def _varlong(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A zig-zag varint of at most 10 bytes (int64) inside ``buf[pos:end]``."""
    value = 0
    shift = 0
    stop = min(end, pos + 10)
    byte = 0x80
    while pos < stop:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > 0xFFFFFFFFFFFFFFFF:
                break
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    if pos >= end and byte >= 0x80:
        _truncated()
    raise CorruptRecordError("varlong does not fit in 64 bits")


def _truncated() -> NoReturn:
    raise CorruptRecordError("record is truncated")


def _decode_records(
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_ts: int,
    fixed_ts: int | None,
) -> tuple[Record, ...]:
    records: list[Record] = []
    varint = _varint
    for index in range(count):
        if pos >= end:
            raise CorruptRecordError(f"record batch claims {count} records but holds {index}")
        size, pos = varint(buf, pos, end)
        rec_end = pos + size
        if size < _MIN_RECORD_SIZE - 1 or rec_end > end:
            raise CorruptRecordError(f"record {index} has invalid length {size} ({end - pos} bytes left)")
        pos += 1  # attributes: unused in v2
        ts_delta, pos = _varlong(buf, pos, rec_end)
        offset_delta, pos = varint(buf, pos, rec_end)
        n, pos = varint(buf, pos, rec_end)
        if n >= 0 and pos + n <= rec_end:
            key: bytes | None = buf[pos : pos + n]
            pos += n
        elif n == -1:
            key = None
        else:
            raise CorruptRecordError(f"record {index} has invalid key length {n}")
        n, pos = varint(buf, pos, rec_end)
        if n >= 0 and pos + n <= rec_end:
            value: bytes | None = buf[pos : pos + n]
            pos += n
        elif n == -1:
            value = None
        else:
            raise CorruptRecordError(f"record {index} has invalid value length {n}")
        n, pos = varint(buf, pos, rec_end)
        if n:
            headers, pos = _decode_headers(buf, pos, rec_end, n, index)
        else:
            headers = ()
        if pos != rec_end:
            raise CorruptRecordError(f"record {index} is {size} bytes long but its fields take {size + pos - rec_end}")
        timestamp = base_ts + ts_delta if fixed_ts is None else fixed_ts
        records.append(Record(base_offset + offset_delta, timestamp, key, value, headers))
    if pos != end:
        raise CorruptRecordError(f"{end - pos} unexpected bytes after the last of {count} records")
    return tuple(records)


def _decode_headers(buf: bytes, pos: int, end: int, count: int, index: int) -> tuple[tuple[Header, ...], int]:
    # Each header takes at least two bytes (key length and value length).
    if count < 0 or count > (end - pos) // 2:
        raise CorruptRecordError(f"record {index} has invalid header count {count}")
    headers: list[Header] = []
    for _ in range(count):
        n, pos = _varint(buf, pos, end)
        if n < 0 or pos + n > end:
            raise CorruptRecordError(f"record {index} has invalid header key length {n}")
        try:
            h_key = buf[pos : pos + n].decode()
        except UnicodeDecodeError:
            raise CorruptRecordError(f"record {index} has a header key that is not UTF-8") from None
        pos += n
        n, pos = _varint(buf, pos, end)
        if n >= 0 and pos + n <= end:
            h_value: bytes | None = buf[pos : pos + n]
            pos += n
        elif n == -1:
            h_value = None
        else:
            raise CorruptRecordError(f"record {index} has invalid header value length {n}")
        headers.append((h_key, h_value))
    return tuple(headers), pos

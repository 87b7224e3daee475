"""Build one record batch (magic v2): the producer's hot path.

Records are encoded straight into one ``bytearray`` as they are appended, so the batch's
uncompressed size is always known exactly and ``append`` can refuse a record that would push
it past ``batch_size``. :meth:`RecordBatchBuilder.build` compresses the records section once
and caches it; only the 61-byte header and its CRC depend on the build arguments, so a retried
batch is re-sent byte-identical and a re-sequenced one costs a header and a CRC pass.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import crc32c

from aioprod._compiled import speedups
from aioprod.protocol.primitives import INT16_MAX, INT16_MIN, INT32_MAX, INT64_MAX
from aioprod.protocol.records.compression import Codec, compress, resolve_codec, resolve_level

__all__ = ["BATCH_HEADER_SIZE", "MAX_RECORD_OVERHEAD", "RecordBatchBuilder"]

Header = tuple[str, bytes | None]

#: Bytes before the first record: baseOffset .. recordCount.
BATCH_HEADER_SIZE: Final = 61
#: Most bytes a record's fixed framing can take: length (5), attributes (1), timestamp delta
#: (10) and offset delta (5). Key, value and header varints come on top; see
#: :meth:`RecordBatchBuilder.estimate_size_in_bytes`.
MAX_RECORD_OVERHEAD: Final = 21

MAGIC: Final = 2
_TRANSACTIONAL: Final = 0x10

# baseOffset, batchLength, partitionLeaderEpoch, magic — the part before the CRC.
_PREFIX: Final = struct.Struct(">qiib")
_CRC: Final = struct.Struct(">I")
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordCount — the CRC covers these and the records that follow.
_TAIL: Final = struct.Struct(">hiqqqhii")
_AFTER_LENGTH: Final = BATCH_HEADER_SIZE - 12  # batchLength counts bytes after itself


def _put_uvarint(buf: bytearray, value: int) -> None:
    while value > 0x7F:
        buf.append((value & 0x7F) | 0x80)
        value >>= 7
    buf.append(value)


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    _put_uvarint(out, value)
    return bytes(out)


def _byte_view(data: object) -> memoryview:
    """``data``'s bytes, one item each (BufferError if not C-contiguous, as PyBUF_SIMPLE)."""
    view = memoryview(data)  # type: ignore[arg-type]  # TypeError for a str or an int, as the compiled one
    if not view.c_contiguous:
        raise BufferError("memoryview: underlying buffer is not C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _bytes_size(data: object) -> int:
    """A length varint and the bytes of ``data`` (bytes-like), as a record holds them."""
    n = len(data) if type(data) is bytes else _byte_view(data).nbytes
    return _varint_size(n) + n


def _varint_size(value: int) -> int:
    """Bytes of a zig-zag varint for a non-negative ``value``."""
    value <<= 1
    size = 1
    while value > 0x7F:
        value >>= 7
        size += 1
    return size


class _PyRecordsCore:
    """The record encoder of :class:`RecordBatchBuilder`, in Python: the reference, and the
    fallback where the compiled ``aioprod._speedups.RecordsCore`` (the same fields, bytes and
    errors) is not built or is turned off (``AIOPROD_PURE_PYTHON=1``)."""

    __slots__ = ("_base_ts", "_buf", "_count", "_full", "_limit", "_max_ts", "_section")

    _buf: bytearray
    _section: bytes | None
    _count: int
    _base_ts: int
    _max_ts: int
    _limit: int
    _full: bool

    @property
    def is_full(self) -> bool:
        """True once a record was refused, the builder was built, or not even an empty record fits."""
        return self._full

    def _note_if_full(self) -> None:
        # A flag, not computed when asked: the sender asks of every queued batch every round.
        # The smallest record: null key and value, no headers, the first record's timestamp.
        if len(self._buf) + 6 + _varint_size(self._count) > self._limit:
            self._full = True

    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None = (),
    ) -> int | None:
        """Encode one record; return its offset delta, or None if it does not fit.

        ``timestamp_ms`` is milliseconds since the epoch, 0 <= ts < 2**63 as Kafka requires.
        Invalid arguments raise TypeError/ValueError and leave the batch unchanged.
        """
        if not isinstance(timestamp_ms, int):  # as the compiled builder: a float went in, to fail at build()
            raise TypeError(f"timestamp must be an int, not {type(timestamp_ms).__name__}")
        if not 0 <= timestamp_ms <= INT64_MAX:
            raise ValueError(f"timestamp must be in [0, 2**63), got {timestamp_ms}")
        # As the compiled builder: any C-contiguous buffer counts in bytes, and the headers are
        # read once (a list changed while its pairs are unpacked cannot skew the count).
        if key is not None and type(key) is not bytes:
            key = _byte_view(key)  # type: ignore[assignment]
        if value is not None and type(value) is not bytes:
            value = _byte_view(value)  # type: ignore[assignment]
        if headers is not None and type(headers) is not tuple:
            headers = tuple(iter(headers))  # as the compiled one: any iterable, its truth never asked
        count = self._count
        delta = timestamp_ms - self._base_ts if count else 0
        buf = self._buf
        start = len(buf)
        try:
            # Two placeholder bytes for the length varint (fixed up below), then attributes.
            buf += b"\x00\x00\x00"
            u = (delta << 1) ^ (delta >> 63)
            if u < 0x80:
                buf.append(u)
            elif u < 0x4000:
                buf.append((u & 0x7F) | 0x80)
                buf.append(u >> 7)
            elif u < 0x200000:
                buf.append((u & 0x7F) | 0x80)
                buf.append(((u >> 7) & 0x7F) | 0x80)
                buf.append(u >> 14)
            else:
                _put_uvarint(buf, u)
            u = count << 1
            if u < 0x80:
                buf.append(u)
            elif u < 0x4000:
                buf.append((u & 0x7F) | 0x80)
                buf.append(u >> 7)
            elif u < 0x200000:
                buf.append((u & 0x7F) | 0x80)
                buf.append(((u >> 7) & 0x7F) | 0x80)
                buf.append(u >> 14)
            else:
                _put_uvarint(buf, u)
            if key is None:
                buf.append(1)
            else:
                u = len(key) << 1
                if u < 0x80:
                    buf.append(u)
                elif u < 0x4000:
                    buf.append((u & 0x7F) | 0x80)
                    buf.append(u >> 7)
                else:
                    _put_uvarint(buf, u)
                buf += key
            if value is None:
                buf.append(1)
            else:
                u = len(value) << 1
                if u < 0x80:
                    buf.append(u)
                elif u < 0x4000:
                    buf.append((u & 0x7F) | 0x80)
                    buf.append(u >> 7)
                else:
                    _put_uvarint(buf, u)
                buf += value
            if headers:
                _put_uvarint(buf, len(headers) << 1)
                for h_key, h_value in headers:
                    if not isinstance(h_key, str):
                        raise TypeError(f"header key must be str, not {type(h_key).__name__}")
                    encoded = str.encode(h_key)  # a str subclass's own encode() is not asked, as compiled
                    _put_uvarint(buf, len(encoded) << 1)
                    buf += encoded
                    if h_value is None:
                        buf.append(1)
                    else:
                        if type(h_value) is not bytes:
                            h_value = _byte_view(h_value)
                        _put_uvarint(buf, len(h_value) << 1)
                        buf += h_value
            else:
                buf.append(0)
            size = len(buf) - start - 2
            u = size << 1
            if 0x80 <= u < 0x4000:
                buf[start] = (u & 0x7F) | 0x80
                buf[start + 1] = u >> 7
            elif u < 0x80:
                del buf[start]
                buf[start] = u
            else:
                buf[start : start + 2] = _uvarint_bytes(u)
        except BaseException:
            del buf[start:]
            raise
        if len(buf) > self._limit and count:
            del buf[start:]
            self._full = True
            return None
        if count:
            if timestamp_ms > self._max_ts:
                self._max_ts = timestamp_ms
        else:
            self._base_ts = self._max_ts = timestamp_ms
        self._count = count + 1
        self._note_if_full()
        return count

    def append_values(
        self,
        timestamp_ms: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        start: int,
        stop: int,
        budget: int,
        overhead: int,
    ) -> tuple[int, int]:
        """Append ``values[start:stop]`` (and ``keys``), with no headers, in one loop.

        The bulk path's encoder: no call per record. It stops at the first record that does
        not fit the batch, that is not ``bytes``/None (the caller handles it), or that
        would take the records' cost — ``overhead`` plus key and value lengths each — past
        ``budget``. Returns (records appended, their cost).
        """
        if not isinstance(timestamp_ms, int):
            raise TypeError(f"timestamp must be an int, not {type(timestamp_ms).__name__}")
        if not 0 <= timestamp_ms <= INT64_MAX:
            raise ValueError(f"timestamp must be in [0, 2**63), got {timestamp_ms}")
        if self._section is not None:
            return 0, 0
        if start < 0 or stop > len(values) or (keys is not None and stop > len(keys)):
            raise IndexError("append_values range out of bounds")  # as the compiled one: before any change
        first = count = self._count
        delta = timestamp_ms - self._base_ts if count else 0
        ts = _uvarint_bytes((delta << 1) ^ (delta >> 63))
        buf = self._buf
        limit = self._limit
        cost = 0
        index = start
        while index < stop:
            value = values[index]
            key = None if keys is None else keys[index]
            if (value is not None and type(value) is not bytes) or (key is not None and type(key) is not bytes):
                break
            size = overhead + (0 if key is None else len(key)) + (0 if value is None else len(value))
            if cost + size > budget:
                break
            mark = len(buf)
            buf += b"\x00\x00\x00"  # length placeholder (2 bytes), attributes
            buf += ts
            u = count << 1
            if u < 0x80:
                buf.append(u)
            elif u < 0x4000:
                buf.append((u & 0x7F) | 0x80)
                buf.append(u >> 7)
            else:
                _put_uvarint(buf, u)
            if key is None:
                buf.append(1)
            else:
                _put_uvarint(buf, len(key) << 1)
                buf += key
            if value is None:
                buf.append(1)
            else:
                u = len(value) << 1
                if u < 0x80:
                    buf.append(u)
                elif u < 0x4000:
                    buf.append((u & 0x7F) | 0x80)
                    buf.append(u >> 7)
                else:
                    _put_uvarint(buf, u)
                buf += value
            buf.append(0)  # no headers
            u = (len(buf) - mark - 2) << 1
            if u < 0x80:
                del buf[mark]
                buf[mark] = u
            elif u < 0x4000:
                buf[mark] = (u & 0x7F) | 0x80
                buf[mark + 1] = u >> 7
            else:
                buf[mark : mark + 2] = _uvarint_bytes(u)
            if len(buf) > limit and count:  # measured with the final length varint, as append does
                del buf[mark:]
                self._full = True
                break
            count += 1
            cost += size
            index += 1
        if count > first:
            self._count = count
            self._note_if_full()
            if not first:
                self._base_ts = self._max_ts = timestamp_ms
            elif timestamp_ms > self._max_ts:
                self._max_ts = timestamp_ms
        return index - start, cost


# The compiled encoder when built (aioprod/_compiled.py); mypy checks against the Python one.
if TYPE_CHECKING or speedups is None:  # noqa: SIM108 (mypy follows only this form)
    _RecordsCore = _PyRecordsCore
else:
    _RecordsCore = speedups.RecordsCore


class RecordBatchBuilder(_RecordsCore):
    """Accumulates records for one partition and serialises them as a v2 record batch.

    Timestamps are create-time (the producer's clock). ``append`` returns the record's offset
    delta, or None when the record does not fit; a record larger than ``batch_size`` is still
    accepted into an empty builder, so any record that passed the producer's max-request-size
    check can be sent. ``build`` closes the builder: later appends return None.
    """

    __slots__ = ("_batch_size", "_built", "_built_args", "_codec", "_level", "_section_codec", "_size")

    def __init__(
        self,
        compression_type: str | int = Codec.NONE,
        batch_size: int = 16384,
        *,
        compression_level: int | None = None,
    ) -> None:
        codec = resolve_codec(compression_type)
        batch_size = operator.index(batch_size)  # as the compiled base: a float is a TypeError
        if not 0 < batch_size <= INT32_MAX:
            raise ValueError(f"batch_size must be in [1, {INT32_MAX}], got {batch_size}")
        self._codec = codec
        self._level = resolve_level(codec, compression_level)
        self._batch_size = batch_size
        self._limit = batch_size - BATCH_HEADER_SIZE  # records-section bytes that fit
        self._buf = bytearray()
        self._count = 0
        self._base_ts = 0
        self._max_ts = 0
        self._full = False
        self._size = 0  # uncompressed size, frozen once the builder is closed
        self._section: bytes | None = None
        self._section_codec = Codec.NONE
        self._built_args: tuple[int, int, int, bool, int, int] | None = None
        self._built = b""

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def size_in_bytes(self) -> int:
        """The batch's uncompressed size: exact, and an upper bound on what ``build`` returns."""
        if self._section is not None:
            return self._size
        return BATCH_HEADER_SIZE + len(self._buf)

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def compression_type(self) -> Codec:
        """The configured codec (``build`` may still send uncompressed if that is smaller)."""
        return self._codec

    @property
    def base_timestamp(self) -> int:
        return self._base_ts

    @property
    def max_timestamp(self) -> int:
        return self._max_ts

    @staticmethod
    def estimate_size_in_bytes(key: bytes | None, value: bytes | None, headers: Sequence[Header] | None = ()) -> int:
        """Upper bound on the size of a batch holding just this record, for max-size checks.

        Key, value and header values count in bytes, as ``append`` encodes them: any
        bytes-like object (``len()`` of an ``array('q')`` or its memoryview counts items)."""
        headers = headers or ()
        size = BATCH_HEADER_SIZE + MAX_RECORD_OVERHEAD + _varint_size(len(headers))
        for item in (key, value):
            size += 1 if item is None else _bytes_size(item)
        for h_key, h_value in headers:
            key_len = len(h_key.encode())
            size += _varint_size(key_len) + key_len
            size += 1 if h_value is None else _bytes_size(h_value)
        return size

    def build(
        self,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        is_transactional: bool = False,
        base_offset: int = 0,
        partition_leader_epoch: int = -1,
    ) -> bytes:
        """Serialise the batch; the same arguments always give the same bytes.

        The first call closes the builder and compresses the records once; if compression
        would not shrink them they are sent uncompressed (as kafka-python and aiokafka do),
        which keeps the result within ``batch_size`` and never costs bytes on the wire.
        """
        args = (producer_id, producer_epoch, base_sequence, is_transactional, base_offset,
                partition_leader_epoch)  # fmt: skip
        if args == self._built_args:
            return self._built
        count = self._count
        if not count:
            raise ValueError("cannot build a record batch with no records")
        if is_transactional and producer_id < 0:
            raise ValueError("a transactional batch needs a producer id")
        if not INT16_MIN <= producer_epoch <= INT16_MAX:
            raise ValueError(f"producer epoch out of int16 range: {producer_epoch}")
        section = self._section
        if section is None:
            section = self._close()
        try:
            tail = _TAIL.pack(
                self._section_codec | (_TRANSACTIONAL if is_transactional else 0),
                count - 1,
                self._base_ts,
                self._max_ts,
                producer_id,
                producer_epoch,
                base_sequence,
                count,
            )
            head = _PREFIX.pack(base_offset, _AFTER_LENGTH + len(section), partition_leader_epoch, MAGIC)
        except struct.error as exc:
            raise ValueError(f"record batch field out of range: {exc}") from None
        crc = crc32c.crc32c(section, crc32c.crc32c(tail))
        built = b"".join((head, _CRC.pack(crc), tail, section))
        self._built_args = args
        self._built = built
        return built

    def close(self) -> None:
        """Take no more records (``append`` returns None), as ``build`` does: for a batch whose
        records are fixed before it is built, such as a part of a split batch, whose sequence
        range covers only what it was given."""
        if self._section is None and self._count:
            self._close()

    def _close(self) -> bytes:
        raw = self._buf
        self._size = BATCH_HEADER_SIZE + len(raw)
        section = None
        if self._codec is not Codec.NONE:
            compressed = compress(self._codec, raw, self._level)
            if len(compressed) < len(raw):
                section = compressed
                self._section_codec = self._codec
        if section is None:
            section = bytes(raw)
        self._section = section
        self._buf = bytearray()  # release the memory; ...
        self._limit = -1  # ... and refuse every later append (count > 0, so no first-record pass)
        self._full = True
        return section

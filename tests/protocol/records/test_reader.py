"""Reading record batches (``aioprod.protocol.records.reader``).

Batches built by kafka-python and aiokafka read by ours, and malformed batches: every defect
is a CorruptRecordError, raised early and cheaply. :func:`read_batch` takes exactly one batch
and rejects truncation and trailing bytes; :func:`read_batches` skips a trailing *partial*
batch (fewer bytes than its length field announces, as when a broker cuts a fetch response)
unless ``allow_partial`` is False, but a batch whose length field is impossible (< a header)
always raises.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from aioprod.errors import CorruptRecordError
from aioprod.protocol.records import (
    BATCH_HEADER_SIZE,
    Codec,
    Record,
    RecordBatch,
    read_batch,
    read_batches,
)
from tests.protocol.records.samples import (
    AIOKAFKA_BUILDERS,
    CODECS,
    GOLDEN,
    TS,
    MiB,
    as_tuples,
    batch_of,
    build,
    expected,
    ours,
    reseal,
    small_batch,
    theirs,
    with_count,
)


def test_log_append_time_batches_take_the_max_timestamp() -> None:
    data = bytearray(build([(TS, None, b"a", []), (TS + 9, None, b"b", [])]))
    struct.pack_into(">h", data, 21, 0x08)
    struct.pack_into(">I", data, 17, crc32c.crc32c(data[21:]))
    batch = read_batch(data)
    assert batch.timestamp_type == 1
    assert [r.timestamp for r in batch.records] == [TS + 9, TS + 9]


def test_readers_accept_bytes_bytearray_and_memoryview() -> None:
    data = build([(TS, b"k", b"v", [("h", b"x")])])
    expected = read_batch(data)
    assert read_batch(bytearray(data)) == expected
    assert read_batch(memoryview(data)) == expected
    assert read_batches(memoryview(bytearray(data * 2))) == [expected, expected]
    assert read_batches(b"") == []


def test_value_objects_are_frozen_hashable_and_compare_by_value() -> None:
    a = read_batch(build([(TS, b"k", b"v", [("h", None)])]))
    b = read_batch(build([(TS, b"k", b"v", [("h", None)])]))
    assert a == b and hash(a.records[0]) == hash(b.records[0])
    assert a.records[0] == Record(0, TS, b"k", b"v", (("h", None),))
    assert a.records[0] != Record(0, TS, b"k", b"v", (("h", b""),))
    with pytest.raises(AttributeError):
        a.records[0].value = b"x"  # type: ignore[misc]
    assert not hasattr(a, "__dict__")
    assert isinstance(a, RecordBatch)


@pytest.mark.parametrize(
    "builder_cls",
    [KafkaPythonBuilder, *AIOKAFKA_BUILDERS],
    ids=["kafka-python", "aiokafka-C", "aiokafka-py"],
)
@pytest.mark.parametrize("codec", CODECS)
def test_we_read_their_batches(codec: Codec, builder_cls: Any) -> None:
    data = theirs(builder_cls, GOLDEN, codec, pid=77, epoch=2, seq=31)
    batch = read_batch(data)
    assert batch.compression is codec  # GOLDEN compresses, so they did not fall back to none
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 2, 31)
    assert batch.crc == crc32c.crc32c(data[21:])
    assert batch.base_timestamp == TS and batch.max_timestamp == TS + 70_000
    assert as_tuples(batch.records) == expected(GOLDEN)
    assert read_batches(data + data[:-1]) == [batch]


def test_record_objects_expose_what_other_clients_expose() -> None:
    batch = read_batch(ours(GOLDEN[:1], Codec.NONE))
    assert batch.records == (Record(0, TS, b"key", b"value", ()),)


# --- truncation and trailing bytes --------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_every_truncation_raises_for_one_batch_and_is_skipped_as_a_tail(codec: Codec) -> None:
    data = small_batch(codec)
    whole = read_batch(data)
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError, match="truncated"):
            read_batch(data[:cut])
        assert read_batches(data + data[:cut]) == [whole]
        if cut:
            with pytest.raises(CorruptRecordError, match="truncated"):
                read_batches(data + data[:cut], allow_partial=False)


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_records_inside_a_consistent_batch_raise(codec: Codec) -> None:
    """Length and CRC agree but the records (or compressed stream) stop early."""
    data = small_batch(codec)
    for cut in range(BATCH_HEADER_SIZE, len(data)):
        with pytest.raises(CorruptRecordError):
            read_batch(reseal(data[:cut]))


def test_trailing_bytes() -> None:
    data = small_batch()
    whole = read_batch(data)
    with pytest.raises(CorruptRecordError, match="1 unexpected bytes after the record batch"):
        read_batch(data + b"\x00")
    # Fewer than 12 bytes cannot even hold a length: a partial tail.
    assert read_batches(data + b"\x00" * 11) == [whole]
    # 12 bytes whose length field is 0 can never be a batch: corrupt, not partial.
    with pytest.raises(CorruptRecordError, match="smaller than a batch header"):
        read_batches(data + b"\x00" * 12)


# --- header fields ----------------------------------------------------------------------------


def test_bad_crc_is_reported() -> None:
    data = small_batch(Codec.GZIP)
    for pos in range(21, len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(CorruptRecordError, match="failed its CRC"):
            read_batch(bad)
    bad = bytearray(data)
    bad[17] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        read_batches(bad)


@pytest.mark.parametrize("length", [-1, -(1 << 31), 0, 48])
def test_impossible_batch_lengths_raise(length: int) -> None:
    data = bytearray(small_batch())
    struct.pack_into(">i", data, 8, length)
    for decode in (read_batch, read_batches):
        with pytest.raises(CorruptRecordError, match=f"length {length} is smaller"):
            decode(data)


def test_huge_batch_length_is_truncation_not_allocation() -> None:
    data = bytearray(small_batch())
    struct.pack_into(">i", data, 8, (1 << 31) - 1)
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_batch(data)
    assert read_batches(data) == []
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_batches(data, allow_partial=False)


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_other_magic_values_raise(magic: int) -> None:
    data = bytearray(small_batch())
    data[16] = magic
    with pytest.raises(CorruptRecordError, match=f"magic {magic}"):
        read_batch(data)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_raises_naming_it(codec_id: int) -> None:
    data = bytearray(small_batch())
    struct.pack_into(">h", data, 21, codec_id)
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec id {codec_id}"):
        read_batch(reseal(data))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("count", [-1, -(1 << 31), 0, 4, 6, (1 << 31) - 1])
def test_record_count_mismatch_raises(codec: Codec, count: int) -> None:
    data = small_batch(codec, n=5)
    with pytest.raises(CorruptRecordError, match="record"):
        read_batch(with_count(data, count))


def test_compressed_section_in_an_uncompressed_batch_is_caught() -> None:
    data = bytearray(small_batch(Codec.ZSTD))
    struct.pack_into(">h", data, 21, 0)
    with pytest.raises(CorruptRecordError):
        read_batch(reseal(data))


# --- record fields ------------------------------------------------------------------------------


def record(*fields: bytes) -> bytes:
    body = b"".join(fields)
    return bytes([len(body) << 1]) + body


GOOD_FIELDS = (b"\x00", b"\x00", b"\x00", b"\x02k", b"\x02v", b"\x02", b"\x02h", b"\x02x")


def test_hand_made_record_is_valid() -> None:
    batch = read_batch(batch_of(record(*GOOD_FIELDS), 1))
    assert batch.records[0].key == b"k" and batch.records[0].headers == (("h", b"x"),)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (record(b"\x00", b"\x00", b"\x00", b"\x03", b"\x01", b"\x00"), "invalid key length -2"),
        (record(b"\x00", b"\x00", b"\x00", b"\xfe\xff\xff\xff\x07k", b"\x01", b"\x00"), "invalid key length"),
        (record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x05", b"\x00"), "invalid value length -3"),
        (record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x40v", b"\x00"), "invalid value length 32"),
        (record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\x01"), "invalid header count -1"),
        (
            record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\xfe\xff\xff\xff\x07"),
            "invalid header count",
        ),
        (
            record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\x02", b"\x01", b"\x01"),
            "header key length -1",
        ),
        (record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\x02", b"\x04\xff\xfe", b"\x01"), "not UTF-8"),
        (
            record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\x02", b"\x02h", b"\x07"),
            "header value length",
        ),
        (record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\x00", b"\x00"), "fields take"),
        (record(b"\x00", b"\x00", b"\xff\xff\xff\xff\xff\x01", b"\x01", b"\x01", b"\x00"), "32 bits"),
        (record(b"\x00", b"\xff" * 10 + b"\x01", b"\x00", b"\x01", b"\x01", b"\x00"), "64 bits"),
        (record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\x80"), "truncated"),
        (b"\x7f", "invalid length -64"),
        (b"\x0a", "invalid length 5"),
        (bytes([0x0C]) + b"\x00\x00\x00\x01\x01\x00" + b"\x00", "unexpected bytes after the last"),
    ],
)
def test_malformed_records_raise_clear_errors(section: bytes, message: str) -> None:
    count = 1
    with pytest.raises(CorruptRecordError, match=message):
        read_batch(batch_of(section + b"\x00" * (7 - len(section)) if len(section) < 7 else section, count))


def test_fewer_records_than_claimed() -> None:
    empty = record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x01", b"\x00")
    # Checked against the bytes before parsing: no record takes fewer than 7 bytes.
    with pytest.raises(CorruptRecordError, match="claims 3 records but holds only 14 bytes"):
        read_batch(batch_of(empty * 2, 3))
    fourteen = record(b"\x00", b"\x00", b"\x00", b"\x01", b"\x0e1234567", b"\x00")
    with pytest.raises(CorruptRecordError, match="claims 2 records but holds 1"):
        read_batch(batch_of(fourteen, 2))


# --- fuzzing: nothing but CorruptRecordError may escape ------------------------------------------

BASES = {codec: small_batch(codec, n=6, value=b"abcabc" * 5) for codec in CODECS}


def decode_or_reject(data: bytes) -> None:
    for decode in (read_batch, read_batches):
        with contextlib.suppress(CorruptRecordError):
            decode(data, max_decompressed_size=MiB)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    codec=st.sampled_from(CODECS),
    edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.none() | st.integers(0, 1 << 16),
    extra=st.binary(max_size=16),
    fix_crc=st.booleans(),
)
def test_mutated_batches_only_raise_corrupt_record_error(
    codec: Codec, edits: list[tuple[int, int]], cut: int | None, extra: bytes, fix_crc: bool
) -> None:
    data = bytearray(BASES[codec])
    for pos, byte in edits:
        data[pos % len(data)] = byte
    if cut is not None:
        del data[max(cut % len(data), BATCH_HEADER_SIZE) :]
    data += extra
    if fix_crc and len(data) >= BATCH_HEADER_SIZE:
        struct.pack_into(">I", data, 17, crc32c.crc32c(data[21:]))
    decode_or_reject(bytes(data))
    if len(data) >= BATCH_HEADER_SIZE:
        decode_or_reject(reseal(data))

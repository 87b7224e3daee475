"""Record batch v2: round trips, size accounting, byte-identical rebuilds, codec selection.

Interoperability with kafka-python and aiokafka lives in test_records_interop.py; malformed
input and decompression bombs in test_records_malformed.py.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.util import decode_varint as kafka_python_decode_varint
from kafka.record.util import encode_varint as kafka_python_encode_varint

from aioprod.errors import ConfigError, CorruptRecordError
from aioprod.protocol import primitives as p
from aioprod.protocol.records import (
    BATCH_HEADER_SIZE,
    Codec,
    Record,
    RecordBatch,
    RecordBatchBuilder,
    compress,
    decompress,
    read_batch,
    read_batches,
    resolve_codec,
    resolve_level,
)
from aioprod.protocol.records import reader as reader_module

FAST = settings(max_examples=150, deadline=None)
SOME = settings(max_examples=60, deadline=None)

CODECS = list(Codec)
Header = tuple[str, bytes | None]
Rec = tuple[int, bytes | None, bytes | None, list[Header]]

TS = 1_700_000_000_000

keys_st = st.none() | st.binary(max_size=40)
values_st = st.none() | st.binary(max_size=400)
headers_st = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "trace-id", "ü-ключ"]) | st.text(max_size=8),
        st.none() | st.binary(max_size=30),
    ),
    max_size=4,
)
timestamps_st = st.integers(min_value=0, max_value=p.INT64_MAX)
records_st = st.lists(st.tuples(timestamps_st, keys_st, values_st, headers_st), min_size=1, max_size=40)


def build(records: Sequence[Rec], codec: str | int = "none", batch_size: int = 1 << 20, **kwargs: int) -> bytes:
    builder = RecordBatchBuilder(codec, batch_size)
    for index, (ts, key, value, headers) in enumerate(records):
        assert builder.append(ts, key, value, headers) == index
    return builder.build(**kwargs)  # type: ignore[arg-type]


def expected_records(records: Sequence[Rec], base_offset: int = 0) -> tuple[Record, ...]:
    return tuple(
        Record(base_offset + i, ts, key, value, tuple(headers)) for i, (ts, key, value, headers) in enumerate(records)
    )


# --- varints: the builder's inline encoder, the reader's decoder, the primitives ---------------


@FAST
@given(st.integers(min_value=p.INT32_MIN, max_value=p.INT32_MAX))
def test_varint_round_trip_and_agreement(value: int) -> None:
    out = bytearray()
    p.write_varint(out, value)
    assert len(out) == p.varint_size(value)
    assert bytes(out) == bytes(_kafka_python_varint(value))
    assert p.Reader(bytes(out)).varint() == value
    assert reader_module._varint(bytes(out), 0, len(out)) == (value, len(out))
    assert kafka_python_decode_varint(out, 0) == (value, len(out))


@FAST
@given(st.integers(min_value=p.INT64_MIN, max_value=p.INT64_MAX))
def test_varlong_round_trip_and_agreement(value: int) -> None:
    out = bytearray()
    p.write_varlong(out, value)
    assert len(out) == p.varint_size(value)
    assert bytes(out) == bytes(_kafka_python_varint(value))
    assert p.Reader(bytes(out)).varlong() == value
    assert reader_module._varlong(bytes(out) + b"\xff", 0, len(out)) == (value, len(out))


def _kafka_python_varint(value: int) -> bytearray:
    out = bytearray()
    kafka_python_encode_varint(value, out.append)
    return out


@FAST
@given(st.integers(min_value=0, max_value=p.INT64_MAX), st.integers(min_value=0, max_value=p.INT64_MAX))
def test_builder_timestamp_delta_encoding_matches_primitives(first: int, second: int) -> None:
    """The builder inlines its varint encoder for speed; it must equal write_varlong's."""
    builder = RecordBatchBuilder()
    builder.append(first, None, None)
    builder.append(second, None, None)
    body = bytearray([0])
    p.write_varlong(body, second - first)
    p.write_varint(body, 1)
    body += b"\x01\x01\x00"
    expected = bytearray()
    p.write_varint(expected, len(body))
    expected += body
    section = builder.build()[BATCH_HEADER_SIZE:]
    assert section.endswith(bytes(expected))


@pytest.mark.parametrize("count", [63, 64, 65, 8191, 8192, 8193])
def test_offset_delta_varint_width_boundaries(count: int) -> None:
    builder = RecordBatchBuilder("none", 1 << 24)
    for _ in range(count):
        builder.append(TS, None, None)
    batch = read_batch(builder.build())
    assert [r.offset for r in batch.records] == list(range(count))


@pytest.mark.parametrize("size", [0, 1, 57, 58, 59, 63, 64, 8185, 8186, 8191, 8192, 100_000])
def test_record_length_varint_width_boundaries(size: int) -> None:
    """Value sizes around the points where the record's own length varint grows a byte."""
    value = os.urandom(size)
    batch = read_batch(build([(TS, None, value, []), (TS + 1, b"k", value, [("h", None)])]))
    assert [r.value for r in batch.records] == [value, value]


# --- round trips ---------------------------------------------------------------------------------


@SOME
@given(
    records=records_st,
    codec=st.sampled_from(CODECS),
    producer_id=st.integers(-1, p.INT64_MAX),
    producer_epoch=st.integers(-1, p.INT16_MAX),
    base_sequence=st.integers(-1, p.INT32_MAX),
    base_offset=st.integers(0, 1 << 40),
    leader_epoch=st.integers(-1, p.INT32_MAX),
)
def test_batch_round_trip(
    records: list[Rec],
    codec: Codec,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    base_offset: int,
    leader_epoch: int,
) -> None:
    transactional = producer_id >= 0 and base_sequence % 2 == 0
    data = build(
        records,
        codec,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=transactional,
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
    )
    batch = read_batch(data)
    assert batch.records == expected_records(records, base_offset)
    assert batch.base_offset == base_offset
    assert batch.batch_length == len(data) - 12
    assert batch.partition_leader_epoch == leader_epoch
    assert batch.magic == 2
    assert batch.crc == crc32c.crc32c(data[21:])
    assert batch.compression in (codec, Codec.NONE)
    assert batch.timestamp_type == 0
    assert not batch.is_control
    assert batch.is_transactional == transactional
    assert batch.last_offset_delta == len(records) - 1
    assert batch.next_offset == base_offset + len(records)
    assert batch.base_timestamp == records[0][0]
    assert batch.max_timestamp == max(r[0] for r in records)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert batch.record_count == len(records)
    assert batch.size_in_bytes == len(data)
    assert read_batches(data + data) == [batch, batch]


def test_field_edge_cases_round_trip() -> None:
    records: list[Rec] = [
        (TS, None, None, []),
        (TS, b"", b"", []),
        (TS + 5, b"key", None, []),
        (TS - 5, None, b"value", []),
        (0, b"k", b"v", [("dup", b"1"), ("dup", b"2"), ("dup", None), ("", b""), ("ünïcode", b"\x00\xff")]),
        (p.INT64_MAX, b"\x00" * 3, b"\xff" * 1000, [("n", None)]),
    ]
    for codec in CODECS:
        batch = read_batch(build(records, codec))
        assert batch.records == expected_records(records)
        assert batch.max_timestamp == p.INT64_MAX
        assert batch.base_timestamp == TS


def test_compressed_batches_really_use_their_codec() -> None:
    records: list[Rec] = [(TS + i, b"key-%d" % (i % 7), b"the same old value " * 20, []) for i in range(200)]
    plain = build(records)
    for codec in CODECS:
        data = build(records, codec)
        batch = read_batch(data)
        assert batch.compression is codec
        assert batch.records == expected_records(records)
        if codec is not Codec.NONE:
            assert len(data) < len(plain) // 4


def test_incompressible_records_fall_back_to_no_compression() -> None:
    """Sending the raw records when a codec would grow them keeps the batch <= batch_size."""
    records: list[Rec] = [(TS, None, os.urandom(500), [])]
    for codec in (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD):
        builder = RecordBatchBuilder(codec, 1000)
        builder.append(*records[0])
        data = builder.build()
        assert len(data) == builder.size_in_bytes
        batch = read_batch(data)
        assert batch.compression is Codec.NONE
        assert batch.records == expected_records(records)


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


# --- size accounting -----------------------------------------------------------------------------


@SOME
@given(
    records=st.lists(st.tuples(st.integers(0, 1 << 45), keys_st, values_st, headers_st), min_size=1, max_size=80),
    batch_size=st.integers(1, 6000),
    codec=st.sampled_from(CODECS),
)
def test_batch_never_exceeds_batch_size(records: list[Rec], batch_size: int, codec: Codec) -> None:
    builder = RecordBatchBuilder(codec, batch_size)
    accepted: list[Rec] = []
    for record in records:
        before = builder.size_in_bytes
        offset = builder.append(*record)
        if offset is None:
            assert builder.is_full
            assert builder.size_in_bytes == before  # a refused record leaves no trace
            break
        assert offset == len(accepted)
        accepted.append(record)
        assert builder.record_count == len(accepted)
        assert builder.size_in_bytes <= batch_size or len(accepted) == 1
    data = builder.build()
    assert len(data) <= builder.size_in_bytes
    assert len(data) <= batch_size or len(accepted) == 1
    if read_batch(data).compression is Codec.NONE:
        assert len(data) == builder.size_in_bytes  # exact, not just a bound
    assert read_batch(data).records == expected_records(accepted)


def test_lone_oversized_record_is_accepted_then_batch_is_full() -> None:
    builder = RecordBatchBuilder("none", 100)
    assert not builder.is_full
    assert builder.append(TS, b"k", b"x" * 1000) == 0
    assert builder.is_full
    assert builder.append(TS, None, None) is None
    data = builder.build()
    assert len(data) > 1000
    assert read_batch(data).records[0].value == b"x" * 1000


def test_record_that_exactly_fills_the_batch_is_accepted() -> None:
    one = RecordBatchBuilder("none", 1 << 20)
    one.append(TS, None, b"a")
    one.append(TS, None, b"b" * 40)
    exact = one.size_in_bytes
    builder = RecordBatchBuilder("none", exact)
    assert builder.append(TS, None, b"a") == 0
    assert builder.append(TS, None, b"b" * 40) == 1
    assert builder.size_in_bytes == exact
    assert builder.is_full
    assert builder.append(TS, None, None) is None
    smaller = RecordBatchBuilder("none", exact - 1)
    smaller.append(TS, None, b"a")
    assert smaller.append(TS, None, b"b" * 40) is None


def test_is_full_when_not_even_an_empty_record_fits() -> None:
    builder = RecordBatchBuilder("none", BATCH_HEADER_SIZE + 7 + 7)  # two 7-byte records
    assert builder.append(TS, None, None) == 0
    assert not builder.is_full
    assert builder.append(TS, None, None) == 1
    assert builder.is_full


def test_estimate_size_is_an_upper_bound() -> None:
    cases: list[tuple[bytes | None, bytes | None, list[Header]]] = [
        (None, None, []),
        (b"k" * 10, b"v" * 100, []),
        (b"k" * 10000, None, [("h", b"x" * 300), ("ü", None)]),
    ]
    for key, value, headers in cases:
        builder = RecordBatchBuilder()
        builder.append(p.INT64_MAX, key, value, headers)
        assert builder.size_in_bytes <= RecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
        assert RecordBatchBuilder.estimate_size_in_bytes(key, value, headers) - builder.size_in_bytes <= 21


# --- build: caching and byte identity -------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_rebuild_is_byte_identical_and_resequencing_touches_only_header_and_crc(codec: Codec) -> None:
    builder = RecordBatchBuilder(codec, 1 << 20)
    for i in range(300):
        builder.append(TS + i, b"key", b"value %d " % i * 5, [("h", b"v")])
    first = builder.build(producer_id=42, producer_epoch=3, base_sequence=100)
    assert builder.build(producer_id=42, producer_epoch=3, base_sequence=100) == first
    other = builder.build(producer_id=42, producer_epoch=3, base_sequence=400)
    diff = [i for i in range(len(first)) if first[i] != other[i]]
    assert len(other) == len(first)
    assert diff and all(17 <= i < 21 or 53 <= i < 57 for i in diff)  # crc, baseSequence
    assert read_batch(other).base_sequence == 400
    assert builder.build(producer_id=42, producer_epoch=3, base_sequence=100) == first
    transactional = builder.build(producer_id=42, producer_epoch=3, base_sequence=100, is_transactional=True)
    assert read_batch(transactional).is_transactional
    assert transactional[BATCH_HEADER_SIZE:] == first[BATCH_HEADER_SIZE:]


def test_build_closes_the_builder() -> None:
    builder = RecordBatchBuilder("gzip")
    builder.append(TS, b"k", b"v" * 100)
    size = builder.size_in_bytes
    data = builder.build()
    assert builder.is_full
    assert builder.append(TS, None, None) is None
    assert builder.record_count == 1
    assert builder.size_in_bytes == size
    assert builder.build() == data


def test_build_validation() -> None:
    with pytest.raises(ValueError, match="no records"):
        RecordBatchBuilder().build()
    builder = RecordBatchBuilder()
    builder.append(TS, None, b"v")
    with pytest.raises(ValueError, match="producer id"):
        builder.build(is_transactional=True)
    with pytest.raises(ValueError, match="epoch"):
        builder.build(producer_id=1, producer_epoch=1 << 15, base_sequence=0)
    with pytest.raises(ValueError, match="out of range"):
        builder.build(producer_id=1, producer_epoch=0, base_sequence=1 << 31)
    assert read_batch(builder.build(producer_id=1, producer_epoch=0, base_sequence=0)).producer_id == 1


def test_bad_appends_raise_and_leave_the_batch_unchanged() -> None:
    builder = RecordBatchBuilder()
    builder.append(TS, b"k", b"v", [("h", b"x")])
    size = builder.size_in_bytes
    bad_calls: list[tuple[object, ...]] = [
        (-1, None, None, []),
        (1 << 63, None, None, []),
        (TS, "str key", None, []),
        (TS, None, 12, []),
        (TS, None, b"v", [(b"bytes-key", b"x")]),
        (TS, None, b"v", [("h", "str value")]),
        (1.5, None, None, []),
    ]
    for args in bad_calls:
        with pytest.raises((TypeError, ValueError)):
            builder.append(*args)  # type: ignore[arg-type]
        assert builder.size_in_bytes == size
        assert builder.record_count == 1
    builder.append(TS, None, b"after")
    assert [r.value for r in read_batch(builder.build()).records] == [b"v", b"after"]


# --- codecs ----------------------------------------------------------------------------------------


def test_resolve_codec_and_level() -> None:
    assert resolve_codec("GZIP") is Codec.GZIP
    assert resolve_codec("zstd") is Codec.ZSTD
    assert resolve_codec(3) is Codec.LZ4
    assert resolve_codec(Codec.SNAPPY) is Codec.SNAPPY
    for bad in ("brotli", 5, -1):
        with pytest.raises(ConfigError):
            resolve_codec(bad)
    assert resolve_level(Codec.GZIP, None) is None
    assert resolve_level(Codec.GZIP, -1) is None
    assert resolve_level(Codec.LZ4, 17) == 17
    assert resolve_level(Codec.ZSTD, -5) == -5
    for codec, level in [
        (Codec.GZIP, 0),
        (Codec.GZIP, 10),
        (Codec.LZ4, 0),
        (Codec.ZSTD, 23),
        (Codec.SNAPPY, 1),
    ]:
        with pytest.raises(ConfigError):
            resolve_level(codec, level)
    with pytest.raises(ConfigError):
        RecordBatchBuilder("snappy", compression_level=3)
    with pytest.raises(ValueError):
        RecordBatchBuilder("none", 0)


@pytest.mark.parametrize(
    ("codec", "levels"), [(Codec.GZIP, [1, 9]), (Codec.LZ4, [1, 9, 12, 17]), (Codec.ZSTD, [-3, 1, 19])]
)
def test_levels_change_output_and_all_decode(codec: Codec, levels: list[int]) -> None:
    data = b"".join(b"record %d with some repetitive payload; " % (i % 97) for i in range(5000))
    outputs = {level: compress(codec, data, level) for level in levels}
    for out in outputs.values():
        assert decompress(codec, out) == data
    assert len(set(outputs.values())) > 1
    records: list[Rec] = [(TS, None, data[:5000], [])]
    builder = RecordBatchBuilder(codec, compression_level=levels[-1])
    builder.append(*records[0])
    assert read_batch(builder.build()).records == expected_records(records)


@pytest.mark.parametrize("codec", CODECS)
def test_codec_round_trip(codec: Codec) -> None:
    for data in (b"", b"x", os.urandom(100_000), b"abc" * 100_000):
        assert decompress(codec, compress(codec, data)) == data
        assert decompress(codec, memoryview(compress(codec, data))) == data


def test_unknown_codec_id_is_named() -> None:
    for codec in (5, 6, 7):
        with pytest.raises(CorruptRecordError, match=f"codec id {codec}"):
            decompress(codec, b"data")
        with pytest.raises(CorruptRecordError, match=f"codec id {codec}"):
            compress(codec, b"data")

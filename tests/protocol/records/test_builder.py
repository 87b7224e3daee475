"""Building record batches (``aioprod.protocol.records.builder``).

Varint encodings, round trips through our reader, size accounting against ``batch_size``,
byte-identical rebuilds, the bulk encoder, and our batches read by independent
implementations (kafka-python, and aiokafka's C extension and pure-Python fallback), byte for
byte where uncompressed.
"""

from __future__ import annotations

import array
import os
import struct
from typing import Any

import crc32c
import pytest
from aiokafka import codec as aiokafka_codec
from aiokafka.record import default_records as aiokafka_default
from aiokafka.record.memory_records import MemoryRecords as AiokafkaMemoryRecords
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_python_codec
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder
from kafka.record.memory_records import MemoryRecords as KafkaPythonMemoryRecords
from kafka.record.util import decode_varint as kafka_python_decode_varint
from kafka.record.util import encode_varint as kafka_python_encode_varint

from aioprod.protocol import primitives as p
from aioprod.protocol.records import (
    BATCH_HEADER_SIZE,
    Codec,
    RecordBatchBuilder,
    read_batch,
    read_batches,
)
from aioprod.protocol.records import reader as reader_module
from tests.protocol.records.samples import (
    AIOKAFKA_BATCHES,
    AIOKAFKA_BUILDERS,
    CODECS,
    FAST,
    GOLDEN,
    SOME,
    TS,
    Header,
    Rec,
    as_tuples,
    build,
    expected,
    expected_records,
    headers_st,
    interop_records_st,
    keys_st,
    ours,
    records_st,
    theirs,
    values_st,
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


def test_estimate_size_is_an_upper_bound_for_buffers_counted_in_bytes() -> None:
    # append() takes any bytes-like key, value and header value and encodes its bytes; the
    # estimate took len(), which counts an array('q') or its memoryview in items: 1,190 bytes
    # "at most" for a batch of 8,875, so a max-size check built on it let such a record through.
    value = array.array("q", range(1000))
    headers: list[Any] = [("h", memoryview(array.array("d", [1.0] * 100)))]
    builder = RecordBatchBuilder("none", 100_000)
    builder.append(0, None, value, headers)
    estimate = RecordBatchBuilder.estimate_size_in_bytes(None, value, headers)  # type: ignore[arg-type]
    assert builder.size_in_bytes <= estimate <= builder.size_in_bytes + 21
    with pytest.raises(TypeError):
        RecordBatchBuilder.estimate_size_in_bytes("text", None)  # type: ignore[arg-type]  # as append() refuses it


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


def test_a_closed_builder_takes_no_more_records_and_builds_what_it_had() -> None:
    open_one, closed = RecordBatchBuilder("lz4"), RecordBatchBuilder("lz4")
    for builder in (open_one, closed):
        builder.append(TS, b"k", b"v" * 100)
    closed.close()
    assert closed.is_full
    assert closed.append(TS, None, None) is None
    assert closed.record_count == 1
    assert closed.build(7, 0, 3) == open_one.build(7, 0, 3)


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


blobs = st.none() | st.binary(max_size=300)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(blobs, min_size=1, max_size=120),
    with_keys=st.booleans(),
    batch_size=st.integers(80, 6000),
    codec=st.sampled_from(["none", "lz4", "zstd"]),
    preexisting=st.integers(0, 3),
    data=st.data(),
)
def test_bulk_equals_per_record(
    values: list[bytes | None],
    with_keys: bool,
    batch_size: int,
    codec: str,
    preexisting: int,
    data: st.DataObject,
) -> None:
    keys = data.draw(st.lists(blobs, min_size=len(values), max_size=len(values)), label="keys") if with_keys else None
    ts = 1_700_000_000_123
    one = RecordBatchBuilder(codec, batch_size)
    bulk = RecordBatchBuilder(codec, batch_size)
    accepted = 0
    for i in range(preexisting):  # records already in the batch, at an earlier time
        outcome = one.append(ts - 5, b"pre", b"%d" % i)
        assert outcome == bulk.append(ts - 5, b"pre", b"%d" % i)
        accepted += outcome is not None
    expected = 0
    for i, value in enumerate(values):
        if one.append(ts, None if keys is None else keys[i], value) is None:
            break
        expected += 1
    appended, cost = bulk.append_values(ts, values, keys, 0, len(values), 1 << 40, 64)
    assert appended == expected
    pairs = zip(keys[:expected] if keys else [None] * expected, values[:expected], strict=True)
    assert cost == sum(64 + len(k or b"") + len(v or b"") for k, v in pairs)
    if one.record_count:
        assert bulk.build(3, 1, 7) == one.build(3, 1, 7)
        batch = read_batch(bulk.build(3, 1, 7))
        assert [r.value for r in batch.records[accepted:]] == values[:expected]


def test_bulk_stops_at_budget_and_at_non_bytes() -> None:
    b = RecordBatchBuilder("none", 1 << 20)
    values: list[object] = [b"a" * 10, b"b" * 10, "text", b"c"]
    appended, cost = b.append_values(1, values, None, 0, 4, 150, 64)  # type: ignore[arg-type]
    assert (appended, cost) == (2, 148)
    appended, _ = b.append_values(1, values, None, 2, 4, 1000, 64)  # type: ignore[arg-type]
    assert appended == 0  # "text" is for the caller to convert or refuse
    appended, cost = b.append_values(1, [b"x" * 100], None, 0, 1, 100, 64)
    assert (appended, cost) == (0, 0)  # over budget


def test_independent_libraries_are_what_we_think() -> None:
    """Guards the premise: aiokafka's default classes are its C extension, and both libraries
    can handle every codec, so no codec silently goes unchecked."""
    assert aiokafka_default.DefaultRecordBatch.__module__.startswith("aiokafka.record._crecords")
    assert aiokafka_default._DefaultRecordBatchPy is not aiokafka_default.DefaultRecordBatch
    for module in (aiokafka_codec, kafka_python_codec):
        assert module.has_gzip() and module.has_snappy() and module.has_lz4() and module.has_zstd()


GOLDEN += [(TS + 10 + i, b"key-%d" % (i % 13), b"repetitive payload %d " % (i % 5) * 8, []) for i in range(120)]


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_reads_our_batches(codec: Codec) -> None:
    data = ours(GOLDEN, codec, producer_id=9876, producer_epoch=4, base_sequence=1000, base_offset=50)
    batch = KafkaPythonBatch(bytearray(data))
    assert batch.validate_crc()
    assert batch.compression_type == int(codec)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9876, 4, 1000)
    assert batch.base_offset == 50
    assert batch.last_offset_delta == len(GOLDEN) - 1
    assert batch.first_timestamp == TS
    assert batch.max_timestamp == TS + 70_000
    assert not batch.is_transactional
    assert as_tuples(batch) == expected(GOLDEN, 50)
    two = KafkaPythonMemoryRecords(data + data)
    decoded = []
    while two.has_next():
        decoded.append(as_tuples(two.next_batch()))
    assert decoded == [expected(GOLDEN, 50)] * 2


@pytest.mark.parametrize("batch_cls", AIOKAFKA_BATCHES, ids=["aiokafka-C", "aiokafka-py"])
@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_reads_our_batches(codec: Codec, batch_cls: Any) -> None:
    data = ours(GOLDEN, codec, producer_id=5, producer_epoch=1, base_sequence=7, is_transactional=True)
    batch = batch_cls(data)
    assert batch.validate_crc()
    assert batch.compression_type == int(codec)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (5, 1, 7)
    assert batch.is_transactional
    assert batch.next_offset == len(GOLDEN)
    assert as_tuples(batch) == expected(GOLDEN)


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_memory_records_reads_concatenated_batches(codec: Codec) -> None:
    records = AiokafkaMemoryRecords(ours(GOLDEN[:5], codec) + ours(GOLDEN[5:], codec, base_offset=5))
    decoded: list[Any] = []
    while records.has_next():
        batch = records.next_batch()
        assert batch is not None
        decoded += as_tuples(batch)
    assert decoded == expected(GOLDEN)


def test_uncompressed_bytes_equal_kafka_python_and_aiokafka() -> None:
    """With no codec the encoding is fully determined, so it must match byte for byte.

    The one difference is the partition leader epoch a producer leaves for the broker:
    -1 (Java's NO_PARTITION_LEADER_EPOCH, as aiokafka) where kafka-python writes 0."""
    ref = ours(GOLDEN, Codec.NONE, producer_id=12, producer_epoch=0, base_sequence=99)
    for builder_cls in AIOKAFKA_BUILDERS:
        assert theirs(builder_cls, GOLDEN, Codec.NONE, pid=12, epoch=0, seq=99) == ref
    kafka_python = theirs(KafkaPythonBuilder, GOLDEN, Codec.NONE, pid=12, epoch=0, seq=99)
    assert kafka_python == ours(
        GOLDEN, Codec.NONE, producer_id=12, producer_epoch=0, base_sequence=99, partition_leader_epoch=0
    )


def test_hand_checked_golden_bytes() -> None:
    """One record, spelled out field by field from the protocol guide."""
    builder = RecordBatchBuilder()
    builder.append(1000, b"k", None, [("h", b"v")])
    record = bytes(
        [
            0x16,  # length of the rest: 11, zig-zag
            0x00,  # attributes
            0x00,  # timestamp delta 0
            0x00,  # offset delta 0
            0x02, ord("k"),  # key length 1, key
            0x01,  # value length -1: null
            0x02,  # one header
            0x02, ord("h"), 0x02, ord("v"),  # header key "h", value "v"
        ]
    )  # fmt: skip
    tail = struct.pack(">hiqqqhii", 0, 0, 1000, 1000, -1, -1, -1, 1) + record
    head = struct.pack(">qiib", 0, 49 + len(record), -1, 2)
    assert builder.build() == head + struct.pack(">I", crc32c.crc32c(tail)) + tail
    assert len(head) + 4 + len(tail) == BATCH_HEADER_SIZE + len(record)


@settings(max_examples=40, deadline=None)
@given(records=interop_records_st, codec=st.sampled_from(CODECS))
def test_random_batches_agree_with_both_libraries(records: list[Rec], codec: Codec) -> None:
    data = ours(records, codec, producer_id=1, producer_epoch=0, base_sequence=0)
    want = expected(records)
    assert as_tuples(KafkaPythonBatch(bytearray(data))) == want
    assert as_tuples(aiokafka_default.DefaultRecordBatch(data)) == want
    for builder_cls in (KafkaPythonBuilder, aiokafka_default.DefaultRecordBatchBuilder):
        assert as_tuples(read_batch(theirs(builder_cls, records, codec)).records) == want


def test_a_batch_size_that_is_not_an_integer_is_refused_with_or_without_the_compiled_path() -> None:
    # The pure-Python builder took 1000.0 (the compiled one raised TypeError).
    with pytest.raises(TypeError):
        RecordBatchBuilder("none", 1000.0)  # type: ignore[arg-type]
    assert RecordBatchBuilder("none", 1000).record_count == 0

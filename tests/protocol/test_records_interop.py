"""Record batches checked against independent implementations: kafka-python and aiokafka.

Our batches are decoded by both libraries' readers (aiokafka's C extension and its pure-Python
fallback), and batches built by their builders are decoded by ours, for every codec. Both
libraries read all five codecs here (kafka-python via python-snappy/lz4/zstandard, aiokafka
via cramjam), so each codec is checked both ways against both. Uncompressed output is also
compared byte for byte with kafka-python's, and compressed sections are checked for the
framing the Java client expects (xerial snappy, independent-block lz4 frames, gzip, zstd).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import crc32c
import pytest
import snappy  # python-snappy: an independent raw-snappy decoder
from aiokafka import codec as aiokafka_codec
from aiokafka.record import default_records as aiokafka_default
from aiokafka.record.memory_records import MemoryRecords as AiokafkaMemoryRecords
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_python_codec
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder
from kafka.record.memory_records import MemoryRecords as KafkaPythonMemoryRecords

from aioprod.protocol.records import (
    BATCH_HEADER_SIZE,
    Codec,
    Record,
    RecordBatchBuilder,
    read_batch,
    read_batches,
)

CODECS = list(Codec)
Header = tuple[str, bytes | None]
Rec = tuple[int, bytes | None, bytes | None, list[Header]]
TS = 1_700_000_000_000

AIOKAFKA_BATCHES: list[Any] = [aiokafka_default.DefaultRecordBatch, aiokafka_default._DefaultRecordBatchPy]
AIOKAFKA_BUILDERS: list[Any] = [
    aiokafka_default.DefaultRecordBatchBuilder,
    aiokafka_default._DefaultRecordBatchBuilderPy,
]


def test_independent_libraries_are_what_we_think() -> None:
    """Guards the premise: aiokafka's default classes are its C extension, and both libraries
    can handle every codec, so no codec silently goes unchecked."""
    assert aiokafka_default.DefaultRecordBatch.__module__.startswith("aiokafka.record._crecords")
    assert aiokafka_default._DefaultRecordBatchPy is not aiokafka_default.DefaultRecordBatch
    for module in (aiokafka_codec, kafka_python_codec):
        assert module.has_gzip() and module.has_snappy() and module.has_lz4() and module.has_zstd()


# Golden cases: every field shape a record can take.
GOLDEN: list[Rec] = [
    (TS, b"key", b"value", []),
    (TS + 1, None, b"null key", []),
    (TS + 2, b"null value", None, []),
    (TS + 3, None, None, []),
    (TS + 4, b"", b"", []),
    (TS - 1000, b"k", b"earlier timestamp", []),
    (TS + 70_000, b"k", b"later timestamp (3-byte delta)", []),
    (TS + 5, b"h", b"headers", [("trace", b"abc"), ("trace", b"def"), ("nil", None), ("empty", b"")]),
    (TS + 6, b"\x00\xff" * 50, b"\x01" * 5000, [("ü-ключ", b"\xff" * 300)]),
]
GOLDEN += [(TS + 10 + i, b"key-%d" % (i % 13), b"repetitive payload %d " % (i % 5) * 8, []) for i in range(120)]


def ours(records: Sequence[Rec], codec: Codec, **build: Any) -> bytes:
    builder = RecordBatchBuilder(codec, 1 << 22)
    for ts, key, value, headers in records:
        assert builder.append(ts, key, value, headers) is not None
    return builder.build(**build)


def theirs(
    builder_cls: Any, records: Sequence[Rec], codec: Codec, pid: int = -1, epoch: int = -1, seq: int = -1
) -> bytes:
    builder = builder_cls(2, int(codec), 0, pid, epoch, seq, 1 << 22)
    for offset, (ts, key, value, headers) in enumerate(records):
        assert builder.append(offset, ts, key, value, headers) is not None
    return bytes(builder.build())


def as_tuples(records: Iterable[Any]) -> list[tuple[int, int, bytes | None, bytes | None, list[Header]]]:
    return [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in records]


def expected(records: Sequence[Rec], base: int = 0) -> list[tuple[int, int, bytes | None, bytes | None, list[Header]]]:
    return [(base + i, ts, key, value, list(headers)) for i, (ts, key, value, headers) in enumerate(records)]


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


def _section(data: bytes) -> bytes:
    return data[BATCH_HEADER_SIZE:]


def test_snappy_output_is_xerial_framed() -> None:
    data = ours(GOLDEN * 30, Codec.SNAPPY)  # > 32 KiB of records: several xerial blocks
    section = _section(data)
    assert section[:8] == b"\x82SNAPPY\x00"
    assert struct.unpack(">ii", section[8:16]) == (1, 1)
    pos, blocks, raw = 16, 0, b""
    while pos < len(section):
        (size,) = struct.unpack_from(">i", section, pos)
        raw += snappy.decompress(section[pos + 4 : pos + 4 + size])
        pos += 4 + size
        blocks += 1
    assert pos == len(section) and blocks > 1
    assert raw == _section(ours(GOLDEN * 30, Codec.NONE))
    assert kafka_python_codec.snappy_decode(section) == raw
    assert aiokafka_codec.snappy_decode(section) == raw


def test_raw_snappy_batches_are_read_too() -> None:
    """librdkafka and old clients send unframed snappy; readers must accept both."""
    plain = bytearray(ours(GOLDEN, Codec.NONE))
    section = snappy.compress(bytes(plain[BATCH_HEADER_SIZE:]))
    data = bytearray(plain[:BATCH_HEADER_SIZE]) + section
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">h", data, 21, int(Codec.SNAPPY))
    struct.pack_into(">I", data, 17, crc32c.crc32c(data[21:]))
    batch = read_batch(data)
    assert batch.compression is Codec.SNAPPY
    assert as_tuples(batch.records) == expected(GOLDEN)
    assert as_tuples(KafkaPythonBatch(data)) == expected(GOLDEN)


def test_lz4_output_is_a_java_compatible_frame() -> None:
    section = _section(ours(GOLDEN, Codec.LZ4))
    assert section[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic, little-endian
    flg, bd = section[4], section[5]
    assert flg >> 6 == 1  # version 1
    assert flg & 0x20  # independent blocks: Kafka's reader rejects linked blocks
    assert not flg & 0x08  # no content size, as Java writes
    assert (bd >> 4) & 7 == 4  # 64 KiB blocks, as Java writes


def test_gzip_and_zstd_framing() -> None:
    gz = _section(ours(GOLDEN, Codec.GZIP))
    assert gz[:3] == b"\x1f\x8b\x08"
    assert zlib.decompress(gz, 31) == _section(ours(GOLDEN, Codec.NONE))
    zs = _section(ours(GOLDEN, Codec.ZSTD))
    assert zs[:4] == b"\x28\xb5\x2f\xfd"


keys_st = st.none() | st.binary(max_size=30)
values_st = st.none() | st.binary(max_size=200) | st.sampled_from([b"abc" * 50, b"\x00" * 300])
headers_st = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3)
records_st = st.lists(
    st.tuples(st.integers(TS - 10**6, TS + 10**6), keys_st, values_st, headers_st), min_size=1, max_size=25
)


@settings(max_examples=40, deadline=None)
@given(records=records_st, codec=st.sampled_from(CODECS))
def test_random_batches_agree_with_both_libraries(records: list[Rec], codec: Codec) -> None:
    data = ours(records, codec, producer_id=1, producer_epoch=0, base_sequence=0)
    want = expected(records)
    assert as_tuples(KafkaPythonBatch(bytearray(data))) == want
    assert as_tuples(aiokafka_default.DefaultRecordBatch(data)) == want
    for builder_cls in (KafkaPythonBuilder, aiokafka_default.DefaultRecordBatchBuilder):
        assert as_tuples(read_batch(theirs(builder_cls, records, codec)).records) == want


def test_record_objects_expose_what_other_clients_expose() -> None:
    batch = read_batch(ours(GOLDEN[:1], Codec.NONE))
    assert batch.records == (Record(0, TS, b"key", b"value", ()),)

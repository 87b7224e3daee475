"""Malformed record batches: every defect is a CorruptRecordError, raised early and cheaply.

Policy under test: :func:`read_batch` takes exactly one batch and rejects truncation and
trailing bytes; :func:`read_batches` skips a trailing *partial* batch (fewer bytes than its
length field announces, as when a broker cuts a fetch response) unless ``allow_partial`` is
False, but a batch whose length field is impossible (< a header) always raises.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
import tracemalloc
import zlib

import cramjam
import crc32c
import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioprod.errors import CorruptRecordError, ProtocolError
from aioprod.protocol.records import (
    BATCH_HEADER_SIZE,
    Codec,
    RecordBatchBuilder,
    compress,
    decompress,
    read_batch,
    read_batches,
)

CODECS = list(Codec)
TS = 1_700_000_000_000
MiB = 1 << 20


def build(codec: Codec = Codec.NONE, n: int = 5, value: bytes = b"value value value") -> bytes:
    builder = RecordBatchBuilder(codec, 1 << 24)
    for i in range(n):
        builder.append(TS + i, b"key%d" % i, value, [("h", b"x"), ("n", None)] if i % 2 else [])
    return builder.build(producer_id=3, producer_epoch=0, base_sequence=0)


def reseal(data: bytes | bytearray) -> bytes:
    """Fix the length and CRC after tampering, so the checks behind them get exercised."""
    out = bytearray(data)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 17, crc32c.crc32c(out[21:]))
    return bytes(out)


def batch_of(section: bytes, count: int, codec: int = 0) -> bytes:
    """A batch around a hand-made records section."""
    tail = struct.pack(">hiqqqhii", codec, max(count - 1, 0), TS, TS, -1, -1, -1, count) + section
    return struct.pack(">qiib", 0, 49 + len(section), -1, 2) + struct.pack(">I", crc32c.crc32c(tail)) + tail


def with_count(data: bytes, count: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(">i", out, 57, count)
    return reseal(out)


# --- truncation and trailing bytes --------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_every_truncation_raises_for_one_batch_and_is_skipped_as_a_tail(codec: Codec) -> None:
    data = build(codec)
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
    data = build(codec)
    for cut in range(BATCH_HEADER_SIZE, len(data)):
        with pytest.raises(CorruptRecordError):
            read_batch(reseal(data[:cut]))


def test_trailing_bytes() -> None:
    data = build()
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
    data = build(Codec.GZIP)
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
    data = bytearray(build())
    struct.pack_into(">i", data, 8, length)
    for decode in (read_batch, read_batches):
        with pytest.raises(CorruptRecordError, match=f"length {length} is smaller"):
            decode(data)


def test_huge_batch_length_is_truncation_not_allocation() -> None:
    data = bytearray(build())
    struct.pack_into(">i", data, 8, (1 << 31) - 1)
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_batch(data)
    assert read_batches(data) == []
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_batches(data, allow_partial=False)


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_other_magic_values_raise(magic: int) -> None:
    data = bytearray(build())
    data[16] = magic
    with pytest.raises(CorruptRecordError, match=f"magic {magic}"):
        read_batch(data)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_raises_naming_it(codec_id: int) -> None:
    data = bytearray(build())
    struct.pack_into(">h", data, 21, codec_id)
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec id {codec_id}"):
        read_batch(reseal(data))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("count", [-1, -(1 << 31), 0, 4, 6, (1 << 31) - 1])
def test_record_count_mismatch_raises(codec: Codec, count: int) -> None:
    data = build(codec, n=5)
    with pytest.raises(CorruptRecordError, match="record"):
        read_batch(with_count(data, count))


def test_compressed_section_in_an_uncompressed_batch_is_caught() -> None:
    data = bytearray(build(Codec.ZSTD))
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


# --- decompression limits -----------------------------------------------------------------------


@pytest.mark.parametrize("codec", [c for c in CODECS if c is not Codec.NONE])
def test_batch_over_the_decompression_limit_is_refused(codec: Codec) -> None:
    builder = RecordBatchBuilder(codec, 1 << 24)
    builder.append(TS, None, bytes(2 * MiB))
    data = builder.build()
    assert len(data) < 200_000
    with pytest.raises(CorruptRecordError, match=f"more than the {MiB}-byte limit"):
        read_batch(data, max_decompressed_size=MiB)
    with pytest.raises(CorruptRecordError, match="limit"):
        read_batches(data, max_decompressed_size=MiB)
    assert read_batch(data).records[0].value == bytes(2 * MiB)


BOMB_SIZE = 64 * MiB


@pytest.fixture(scope="module")
def bombs() -> dict[Codec, bytes]:
    bomb = bytes(BOMB_SIZE)
    return {
        Codec.GZIP: gzip.compress(bomb, 1),
        Codec.SNAPPY: compress(Codec.SNAPPY, bomb),
        Codec.LZ4: lz4.frame.compress(bomb),  # content size in the header, unlike ours
        Codec.ZSTD: zstandard.ZstdCompressor(level=1).compress(bomb),
    }


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_zip_bomb_is_refused_without_inflating_it(codec: Codec, bombs: dict[Codec, bytes]) -> None:
    payload = bombs[codec]
    assert len(payload) < BOMB_SIZE // 20
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="limit"):
            decompress(codec, payload, max_size=MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MiB


def test_raw_snappy_block_claiming_a_huge_length_is_refused_before_allocating() -> None:
    claims_4gib = b"\x80\x80\x80\x80\x10" + b"\x00" * 10
    with pytest.raises(CorruptRecordError, match="limit"):
        decompress(Codec.SNAPPY, claims_4gib, max_size=MiB)
    xerial = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    block = bytes(cramjam.snappy.compress_raw(bytes(600_000)))
    many = xerial + (struct.pack(">i", len(block)) + block) * 2
    assert len(decompress(Codec.SNAPPY, many, max_size=2 * 600_000)) == 1_200_000
    with pytest.raises(CorruptRecordError, match="limit"):
        decompress(Codec.SNAPPY, many, max_size=1_000_000)


@pytest.mark.parametrize(
    ("codec", "payload"),
    [
        (Codec.GZIP, b"\x1f\x8b\x08\x00garbage"),
        (Codec.GZIP, zlib.compress(b"abc")[:-2]),
        (Codec.SNAPPY, b""),
        (Codec.SNAPPY, b"\x82SNAPPY\x00\x00\x00\x00\x01"),
        (Codec.SNAPPY, b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 100) + b"short"),
        (Codec.SNAPPY, b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, -5)),
        (Codec.SNAPPY, b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"\x00\x00"),
        (Codec.SNAPPY, b"\x0a\x00\x00"),
        (Codec.LZ4, b"\x04\x22\x4d\x18garbage"),
        (Codec.LZ4, lz4.frame.compress(b"abc" * 100)[:-3]),
        (Codec.ZSTD, b""),
        (Codec.ZSTD, zstandard.ZstdCompressor().compress(b"abc" * 100)[:-3]),
        (Codec.ZSTD, zstandard.ZstdCompressor().compress(b"abc") + b"junk"),
        (Codec.ZSTD, b"\x28\xb5\x2f\xfdgarbage"),
    ],
)
def test_corrupt_compressed_data_raises(codec: Codec, payload: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(codec, payload)


@pytest.mark.parametrize("codec", [c for c in CODECS if c is not Codec.NONE])
def test_compressed_stream_with_trailing_junk_raises(codec: Codec) -> None:
    """Whole streams decode (concatenated ones too, as Java's stream readers allow), but bytes
    after the last complete stream are corruption, not something to ignore."""
    stream = compress(codec, b"payload " * 1000)
    assert decompress(codec, stream) == b"payload " * 1000
    assert decompress(codec, stream + stream) == b"payload " * 2000
    for junk in (b"\x00", b"junk!", b"\xff" * 40):
        with pytest.raises(CorruptRecordError):
            decompress(codec, stream + junk)


# --- fuzzing: nothing but CorruptRecordError may escape ------------------------------------------

BASES = {codec: build(codec, n=6, value=b"abcabc" * 5) for codec in CODECS}


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


@settings(max_examples=200, deadline=None)
@given(codec=st.integers(0, 7), payload=st.binary(max_size=300))
def test_random_compressed_payloads_only_raise_corrupt_record_error(codec: int, payload: bytes) -> None:
    try:
        decompress(codec, payload, max_size=MiB)
    except CorruptRecordError as exc:
        assert isinstance(exc, ProtocolError)


STREAMS = {codec: compress(codec, b"some records " * 200 + os.urandom(50)) for codec in CODECS}


@settings(max_examples=150, deadline=None)
@given(codec=st.sampled_from([c for c in CODECS if c is not Codec.NONE]), data=st.data())
def test_mutated_compressed_streams_only_raise_corrupt_record_error(codec: Codec, data: st.DataObject) -> None:
    stream = bytearray(STREAMS[codec])
    for _ in range(data.draw(st.integers(1, 4))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(CorruptRecordError):
        decompress(codec, bytes(stream), max_size=MiB)

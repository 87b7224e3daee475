"""Compression codecs (``aioprod.protocol.records.compression``).

Codec selection and levels, the framing the Java client expects (xerial snappy,
independent-block lz4 frames, gzip, zstd), decompression limits and bombs, and corrupt
compressed data that may only raise CorruptRecordError.
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
import snappy  # python-snappy: an independent raw-snappy decoder
import zstandard
from aiokafka import codec as aiokafka_codec
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_python_codec
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

from aioprod.errors import ConfigError, CorruptRecordError, ProtocolError
from aioprod.protocol.records import (
    BATCH_HEADER_SIZE,
    Codec,
    RecordBatchBuilder,
    compress,
    decompress,
    read_batch,
    read_batches,
    resolve_codec,
    resolve_level,
)
from tests.protocol.records.samples import (
    CODECS,
    GOLDEN,
    TS,
    MiB,
    Rec,
    as_tuples,
    build,
    expected,
    expected_records,
    ours,
)


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


class _Counting:
    """A decompressor that adds the input it is fed, and the output it is asked to make room
    for, to ``fed`` and ``room``: how often a byte of input is handed over."""

    def __init__(self, inner: object, fed: list[int], room: list[int]) -> None:
        self._inner, self._fed, self._room = inner, fed, room

    def decompress(self, data: bytes, *args: int, **kwargs: int) -> bytes:
        self._fed.append(len(data))
        self._room.extend([*args, *kwargs.values()])
        return self._inner.decompress(data, *args, **kwargs)  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


EMPTY_FRAMES = {  # each decompresses to nothing
    Codec.GZIP: bytes.fromhex("1f8b080000000000000303000000000000000000"),
    Codec.LZ4: bytes.fromhex("04224d1860408200000000"),
    Codec.ZSTD: bytes.fromhex("28b52ffd0000010000"),
}


@pytest.mark.parametrize("codec", list(EMPTY_FRAMES))
def test_many_concatenated_frames_are_read_in_linear_time(codec: Codec, monkeypatch: pytest.MonkeyPatch) -> None:
    # After each frame the rest of the input was handed over (and copied) again: 1 MiB of empty
    # frames took 0.7-3 s, 2 MiB four times that. Each frame is now fed a few hundred bytes.
    from aioprod.protocol.records import compression as module

    fed: list[int] = []
    room: list[int] = []
    if codec is Codec.GZIP:
        real = zlib.decompressobj
        monkeypatch.setattr(module.zlib, "decompressobj", lambda *a: _Counting(real(*a), fed, room))
    elif codec is Codec.LZ4:
        real_lz4 = lz4.frame.LZ4FrameDecompressor
        monkeypatch.setattr(module.lz4.frame, "LZ4FrameDecompressor", lambda: _Counting(real_lz4(), fed, room))
    else:
        real_zstd = zstandard.ZstdDecompressor

        class Zstd:
            def decompressobj(self) -> _Counting:
                return _Counting(real_zstd().decompressobj(), fed, room)

        monkeypatch.setattr(module.zstandard, "ZstdDecompressor", Zstd)
    frames = 2_000
    data = EMPTY_FRAMES[codec] * frames + compress(codec, b"last")
    assert decompress(codec, data) == b"last"
    assert sum(fed) <= 300 * frames  # the whole rest, each time: about 10 MB here
    if codec is Codec.LZ4:
        assert max(room) <= 256 * 1024  # lz4 allocates what it may return, up front


def test_a_small_lz4_frame_does_not_allocate_the_size_ceiling() -> None:
    tracemalloc.start()
    try:
        decompress(Codec.LZ4, compress(Codec.LZ4, b"x" * 100))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 * MiB  # was the 64 MiB ceiling, for every frame

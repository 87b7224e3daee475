"""Record batch codecs: none, gzip, snappy, lz4, zstd — compression and bounded decompression.

Output follows what the Java client writes so that every broker and consumer can read it:
gzip as a gzip member, snappy in xerial framing, lz4 as an LZ4 frame with independent 64 KiB
blocks and no content size, zstd as a plain frame. Decompression never produces more than a
caller-given number of bytes, so a small hostile batch cannot inflate into gigabytes; every
failure (corrupt data, unknown codec, too much output) is a :class:`CorruptRecordError`.
"""

from __future__ import annotations

import enum
import struct
import zlib
from typing import Final, NoReturn

import cramjam
import lz4.frame
import zstandard

from aioprod.errors import ConfigError, CorruptRecordError

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_SIZE",
    "BytesLike",
    "Codec",
    "compress",
    "decompress",
    "resolve_codec",
    "resolve_level",
]

BytesLike = bytes | bytearray | memoryview

#: Default ceiling on one batch's decompressed records section (brokers cap batches far lower).
DEFAULT_MAX_DECOMPRESSED_SIZE: Final = 64 * 1024 * 1024


class Codec(enum.IntEnum):
    """Compression codec ids, as stored in bits 0-2 of a record batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_BY_NAME: Final = {codec.name.lower(): codec for codec in Codec}

# Level ranges and defaults follow the Java client (KIP-390), so a level means the same thing
# in every client; None asks for the default.
_LEVELS: Final[dict[Codec, tuple[int, int, int]]] = {
    Codec.GZIP: (1, 9, 6),
    Codec.LZ4: (1, 17, 9),
    Codec.ZSTD: (-131072, 22, 3),
}
_LZ4_FAST_LEVEL: Final = 9  # Java uses the fast (non-HC) compressor at its default level

# xerial snappy framing: magic, then version 1 and minimum compatible version 1 (big-endian).
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK: Final = 32 * 1024  # xerial's default block size, as the Java client writes
_I32: Final = struct.Struct(">i")

_ZSTD_MIN_STEP: Final = 64  # input bytes per zstd feed near the ceiling (<= 2 MiB output)
# Input fed to a decompressor at a time, and lz4 output asked for at a time: what a decompressor
# copies of the rest of its input (its unused_data), or allocates up front, stays this small.
# (Fed the whole rest, a batch of many tiny concatenated frames took quadratic time; asked for
# up to the size ceiling, lz4 allocated 64 MiB for every frame.)
_INPUT_STEP: Final = 64 * 1024
_FIRST_STEP: Final = 256  # a frame's first piece (doubling up to _INPUT_STEP): tiny frames copy little
_OUTPUT_STEP: Final = 256 * 1024


def resolve_codec(codec: str | int) -> Codec:
    """Map a name (``"gzip"``) or id (``1``) to a :class:`Codec`; ConfigError if unknown."""
    if type(codec) is Codec:  # the accumulator's case, once per batch
        return codec
    if isinstance(codec, str):
        try:
            return _BY_NAME[codec.lower()]
        except KeyError:
            raise ConfigError(f"unknown compression type {codec!r}; expected one of {sorted(_BY_NAME)}") from None
    try:
        return Codec(codec)
    except ValueError:
        raise ConfigError(f"unknown compression codec id {codec!r}") from None


def resolve_level(codec: Codec, level: int | None) -> int | None:
    """Check ``level`` against the codec's range; None stays None (codec default)."""
    if level is None:
        return None
    bounds = _LEVELS.get(codec)
    if bounds is None:
        raise ConfigError(f"compression_level: compression type {codec.name.lower()} has no compression levels")
    low, high, _ = bounds
    if codec is Codec.GZIP and level == -1:  # Java's Deflater.DEFAULT_COMPRESSION
        return None
    if not low <= level <= high:
        raise ConfigError(f"compression_level: {codec.name.lower()} levels are {low} to {high}, got {level}")
    return level


def compress(codec: int, data: BytesLike, level: int | None = None) -> bytes:
    """Compress a records section with ``codec`` at ``level`` (None: the codec's default)."""
    if codec == Codec.GZIP:
        # wbits=31 writes a gzip member with mtime 0: deterministic, as GZIPOutputStream reads.
        z = zlib.compressobj(_LEVELS[Codec.GZIP][2] if level is None else level, zlib.DEFLATED, 31)
        return z.compress(data) + z.flush()
    if codec == Codec.SNAPPY:
        return _snappy_xerial(data)
    if codec == Codec.LZ4:
        lz4_level = 0 if level is None or level == _LZ4_FAST_LEVEL else min(level, 16)
        return bytes(
            lz4.frame.compress(
                data,
                compression_level=lz4_level,
                block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                block_linked=False,
                content_checksum=False,
                store_size=False,
            )
        )
    if codec == Codec.ZSTD:
        cctx = zstandard.ZstdCompressor(level=_LEVELS[Codec.ZSTD][2] if level is None else level)
        return bytes(cctx.compress(data))
    if codec == Codec.NONE:
        return bytes(data)
    raise CorruptRecordError(f"unknown compression codec id {codec}", remote=False)


def _snappy_xerial(data: BytesLike) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    pack = _I32.pack
    compress_raw = cramjam.snappy.compress_raw
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(compress_raw(view[start : start + _XERIAL_BLOCK]))
        parts.append(pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def decompress(codec: int, data: BytesLike, max_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE) -> bytes:
    """Decompress a records section, refusing to produce more than ``max_size`` bytes.

    Raises CorruptRecordError for an unknown codec, malformed or truncated input, or output
    beyond ``max_size`` (detected before it is materialised).
    """
    try:
        if codec == Codec.GZIP:
            return _gunzip(data, max_size)
        if codec == Codec.SNAPPY:
            return _unsnappy(data, max_size)
        if codec == Codec.LZ4:
            return _unlz4(data, max_size)
        if codec == Codec.ZSTD:
            return _unzstd(data, max_size)
        if codec == Codec.NONE:
            if len(data) > max_size:
                _too_big(codec, max_size)
            return bytes(data)
    except CorruptRecordError:
        raise
    except (MemoryError, RecursionError):
        raise
    except Exception as exc:  # codec libraries raise assorted types for malformed input
        raise CorruptRecordError(f"{Codec(codec).name.lower()} data is corrupt: {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec id {codec}")


def _too_big(codec: int, max_size: int) -> NoReturn:
    if codec == Codec.NONE:
        raise CorruptRecordError(f"records section is larger than the {max_size}-byte limit")
    raise CorruptRecordError(f"{Codec(codec).name.lower()} records decompress to more than the {max_size}-byte limit")


def _gunzip(data: BytesLike, max_size: int) -> bytes:
    out: list[bytes] = []
    total = 0
    view = memoryview(data)
    pos, end = 0, len(view)
    while True:
        # wbits=47 accepts gzip or zlib headers; Java's GZIPInputStream also reads concatenated members.
        d = zlib.decompressobj(47)
        step = _FIRST_STEP
        while not d.eof:
            if pos >= end:
                raise CorruptRecordError("gzip data is truncated")
            piece = view[pos : pos + step]
            step = min(2 * step, _INPUT_STEP)
            chunk = d.decompress(piece, max_size - total + 1)
            total += len(chunk)
            if total > max_size:
                _too_big(Codec.GZIP, max_size)
            out.append(chunk)
            pos += len(piece) - len(d.unused_data)
        if pos >= end:
            return b"".join(out)


def _unlz4(data: BytesLike, max_size: int) -> bytes:
    out: list[bytes] = []
    total = 0
    view = memoryview(data)
    pos, end = 0, len(view)
    while True:
        d = lz4.frame.LZ4FrameDecompressor()
        fed = 0
        step = _FIRST_STEP
        while not d.eof:
            # At most _OUTPUT_STEP at a time: the library allocates max_length before decoding.
            room = min(max_size - total + 1, _OUTPUT_STEP)
            if d.needs_input:
                if pos >= end:
                    raise CorruptRecordError("lz4 frame is truncated")
                piece = view[pos : pos + step]
                step = min(2 * step, _INPUT_STEP)
                pos += len(piece)
                fed = len(piece)
                chunk = d.decompress(piece, max_length=room)
            else:
                chunk = d.decompress(b"", max_length=room)
            total += len(chunk)
            if total > max_size:
                _too_big(Codec.LZ4, max_size)
            out.append(chunk)
        pos -= min(len(d.unused_data or b""), fed)
        if pos >= end:
            return b"".join(out)


def _unzstd(data: BytesLike, max_size: int) -> bytes:
    # zstandard has no output ceiling for streaming, so feed input in steps small enough that
    # one step cannot overshoot by much: a zstd block yields at most 128 KiB from >= 4 bytes.
    out: list[bytes] = []
    total = 0
    dctx = zstandard.ZstdDecompressor()
    view = memoryview(data)
    pos, end = 0, len(view)
    if not end:
        raise CorruptRecordError("zstd data is empty")
    while pos < end:
        dobj = dctx.decompressobj()
        grown = _FIRST_STEP
        while not dobj.eof:
            if pos >= end:
                raise CorruptRecordError("zstd frame is truncated")
            step = max(_ZSTD_MIN_STEP, min(grown, (max_size - total) >> 15))
            grown *= 2
            piece = view[pos : pos + step]
            chunk = dobj.decompress(piece)
            pos += len(piece)
            total += len(chunk)
            if total > max_size:
                _too_big(Codec.ZSTD, max_size)
            out.append(chunk)
        pos -= len(dobj.unused_data)  # the next frame's first bytes, fed with this one's last
    return b"".join(out)


def _unsnappy(data: BytesLike, max_size: int) -> bytes:
    view = memoryview(data)
    if view[:8].tobytes() != _XERIAL_MAGIC:
        return _snappy_block(view, max_size, max_size)
    out: list[bytes] = []
    total = 0
    pos = 0
    end = len(view)
    unpack = _I32.unpack_from
    while pos < end:
        if view[pos : pos + 8].tobytes() == _XERIAL_MAGIC:  # a stream header, possibly of a concatenated stream
            if pos + 16 > end:
                raise CorruptRecordError("xerial snappy header is truncated")
            pos += 16
            continue
        if pos + 4 > end:
            raise CorruptRecordError("xerial snappy block length is truncated")
        (size,) = unpack(view, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise CorruptRecordError(f"xerial snappy block of {size} bytes does not fit the data")
        block = _snappy_block(view[pos : pos + size], max_size - total, max_size)
        pos += size
        total += len(block)
        out.append(block)
    return b"".join(out)


def _snappy_block(view: memoryview, budget: int, max_size: int) -> bytes:
    """Decompress one raw snappy block, checking its declared length before allocating it."""
    claimed = 0
    shift = 0
    for i in range(min(len(view), 5)):
        byte = view[i]
        claimed |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    else:
        raise CorruptRecordError("snappy block length is malformed")
    if claimed > budget:
        _too_big(Codec.SNAPPY, max_size)
    block = bytes(cramjam.snappy.decompress_raw(view))
    if len(block) != claimed:
        raise CorruptRecordError("snappy block length does not match its contents")
    return block

"""``aioprod produce``'s input: records split from a stream however it arrives (no broker)."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st

from aioprod.cli.produce import LineFormat, OverlongRecord, read_records
from aioprod.protocol.records.builder import BATCH_HEADER_SIZE, RecordBatchBuilder


class Chunked:
    """A stream that hands its data over in the given pieces, as a pipe may."""

    def __init__(self, data: bytes, cuts: list[int]) -> None:
        self._pieces: list[bytes] = []
        for cut in cuts:
            if not data:
                break
            self._pieces.append(data[:cut])
            data = data[cut:]
        if data:
            self._pieces.append(data)

    def read1(self, size: int) -> bytes:
        return self._pieces.pop(0) if self._pieces else b""

    read = read1


def split(data: bytes, delimiter: bytes, drop_cr: bool) -> list[bytes]:
    """What the records must be: ``bytes.split``, a last unterminated record counted once."""
    records = data.split(delimiter)
    if not records[-1]:
        records.pop()
    return [record.removesuffix(b"\r") for record in records] if drop_cr else records


async def read_all(
    data: bytes, cuts: list[int], delimiter: bytes, drop_cr: bool, longest: int | None = None
) -> list[bytes | OverlongRecord]:
    stream = Chunked(data, cuts)
    return [record async for record in read_records(stream, delimiter, drop_cr=drop_cr, longest=longest)]  # type: ignore[arg-type]


@given(
    data=st.lists(st.sampled_from([b"a", b"b", b"-", b"\r", b"\n", b"xyz"]), max_size=60).map(b"".join),
    cuts=st.lists(st.integers(1, 9), max_size=30),
    delimiter=st.sampled_from([b"\n", b"a", b"aa", b"aab", b"-\n", b"\r\n"]),
    drop_cr=st.booleans(),
)
def test_records_are_split_at_every_delimiter_even_one_cut_across_pieces(
    data: bytes, cuts: list[int], delimiter: bytes, drop_cr: bool
) -> None:
    assert asyncio.run(read_all(data, cuts, delimiter, drop_cr)) == split(data, delimiter, drop_cr)


def test_a_trailing_cr_is_dropped_only_when_asked() -> None:
    data = b"a\r\nb\r\nc\r"
    assert asyncio.run(read_all(data, [3, 1], b"\n", True)) == [b"a", b"b", b"c"]
    assert asyncio.run(read_all(data, [3, 1], b"\n", False)) == [b"a\r", b"b\r", b"c\r"]
    assert asyncio.run(read_all(b"a\r-b\r-", [2], b"-", False)) == [b"a\r", b"b\r"]
    assert asyncio.run(read_all(b"a\r-b\r-", [2], b"-", True)) == [b"a", b"b"]


@given(
    data=st.lists(st.sampled_from([b"a", b"b", b"-", b"\r", b"\n", b"xyz"]), max_size=60).map(b"".join),
    cuts=st.lists(st.integers(1, 9), max_size=30),
    delimiter=st.sampled_from([b"\n", b"a", b"aa", b"aab", b"-\n", b"\r\n"]),
    drop_cr=st.booleans(),
    longest=st.integers(0, 8),
)
def test_a_record_longer_than_the_limit_comes_as_its_exact_size_however_it_is_cut(
    data: bytes, cuts: list[int], delimiter: bytes, drop_cr: bool, longest: int
) -> None:
    expected = [r if len(r) <= longest else OverlongRecord(len(r)) for r in split(data, delimiter, drop_cr)]
    assert asyncio.run(read_all(data, cuts, delimiter, drop_cr, longest)) == expected


class Endless:
    """A 64 MiB line, then a short one, made as they are read: nothing holds the input."""

    def __init__(self) -> None:
        self._chunks: Iterator[bytes] = iter([b"x" * 65536] * 1024 + [b"\nshort\n"])

    def read1(self, size: int) -> bytes:
        return next(self._chunks, b"")

    read = read1


def test_a_huge_line_is_measured_without_being_held() -> None:
    async def read() -> list[bytes | OverlongRecord]:
        return [record async for record in read_records(Endless(), b"\n", longest=1_048_576)]  # type: ignore[arg-type]

    tracemalloc.start()
    try:
        records = asyncio.run(read())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert records == [OverlongRecord(64 * 1_048_576), b"short"]
    assert peak < 8 * 1_048_576  # the limit and a few chunks, not the line's 64 MiB


@given(
    headers_separator=st.sampled_from([b",", b";;", b"<sep>"]),
    key_separator=st.sampled_from([b":", b"=>"]),
    items=st.integers(1, 40),
    value=st.binary(max_size=20),
)
def test_the_longest_line_bounds_what_a_parsed_line_can_make(
    headers_separator: bytes, key_separator: bytes, items: int, value: bytes
) -> None:
    # The line that shrinks most into its record: headers that are only separators.
    line_format = LineFormat(
        key_separator=b"\t",
        headers_delimiter=b"|",
        headers_separator=headers_separator,
        headers_key_separator=key_separator,
    )
    line = headers_separator.join([key_separator] * items) + b"|k\t" + value
    key, parsed_value, headers = line_format.split(line)
    # The record's bytes on the wire, less than send()'s estimate: a line longer than
    # longest_line(limit) can only make a record the producer refuses.
    builder = RecordBatchBuilder()
    builder.append(0, key, parsed_value, headers)
    assert len(line) <= line_format.longest_line(builder.size_in_bytes - BATCH_HEADER_SIZE)

"""``aioprod produce``'s input: records split from a stream however it arrives (no broker)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from aioprod.cli.produce import read_records


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


async def read_all(data: bytes, cuts: list[int], delimiter: bytes, drop_cr: bool) -> list[bytes]:
    return [record async for record in read_records(Chunked(data, cuts), delimiter, drop_cr=drop_cr)]  # type: ignore[arg-type]


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

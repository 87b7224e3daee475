"""Record batches and records for the record-batch tests: samples, strategies, and builders (ours and
the independent libraries').
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

import crc32c
from aiokafka.record import default_records as aiokafka_default
from hypothesis import settings
from hypothesis import strategies as st

from aioprod.protocol import primitives as p
from aioprod.protocol.records import (
    Codec,
    Record,
    RecordBatchBuilder,
)

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


AIOKAFKA_BATCHES: list[Any] = [aiokafka_default.DefaultRecordBatch, aiokafka_default._DefaultRecordBatchPy]
AIOKAFKA_BUILDERS: list[Any] = [
    aiokafka_default.DefaultRecordBatchBuilder,
    aiokafka_default._DefaultRecordBatchBuilderPy,
]


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


interop_keys_st = st.none() | st.binary(max_size=30)
interop_values_st = st.none() | st.binary(max_size=200) | st.sampled_from([b"abc" * 50, b"\x00" * 300])
interop_headers_st = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3)
interop_records_st = st.lists(
    st.tuples(st.integers(TS - 10**6, TS + 10**6), interop_keys_st, interop_values_st, interop_headers_st),
    min_size=1,
    max_size=25,
)

MiB = 1 << 20


def small_batch(codec: Codec = Codec.NONE, n: int = 5, value: bytes = b"value value value") -> bytes:
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

"""The bulk encoder (append_values) writes exactly what per-record appends write."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aioprod.protocol.records import RecordBatchBuilder, read_batch

blobs = st.none() | st.binary(max_size=300)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(blobs, min_size=1, max_size=120),
    with_keys=st.booleans(),
    keys_seed=st.lists(blobs, min_size=120, max_size=120),
    batch_size=st.integers(80, 6000),
    codec=st.sampled_from(["none", "lz4", "zstd"]),
    preexisting=st.integers(0, 3),
)
def test_bulk_equals_per_record(
    values: list[bytes | None],
    with_keys: bool,
    keys_seed: list[bytes | None],
    batch_size: int,
    codec: str,
    preexisting: int,
) -> None:
    keys = keys_seed[: len(values)] if with_keys else None
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

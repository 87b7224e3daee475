"""The compiled hot path (aioprod/_speedups.c) against its pure-Python twins, input for input.

Each compiled function must give the same bytes, fields, return values and error types as the
Python code it replaces. Where the extension was not built these tests are skipped, unless
``AIOPROD_REQUIRE_SPEEDUPS=1`` (set by CI) says it must be there.
"""

from __future__ import annotations

import array
import asyncio
import enum
import gc
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioprod import RecordMetadata
from aioprod._compiled import COMPILED
from aioprod.errors import NotLeaderOrFollowerError
from aioprod.producer import record_future
from aioprod.producer.batch import _py_metadata_range
from aioprod.producer.partitioner import _py_murmur2, _py_partition_for_key
from aioprod.producer.producer import _py_plain_payloads
from aioprod.producer.record_future import BatchFailure, BatchSettlement, _PyRecordFuture
from aioprod.protocol.records.builder import RecordBatchBuilder, _PyRecordsCore

try:
    from aioprod import _speedups
except ImportError:
    if os.environ.get("AIOPROD_REQUIRE_SPEEDUPS", "") not in ("", "0"):
        raise
    pytest.skip("aioprod._speedups is not built (no C compiler at install time)", allow_module_level=True)

FIELDS = ("_buf", "_count", "_base_ts", "_max_ts", "_limit", "_full", "_section")
INT64_MAX = 2**63 - 1

maybe_bytes = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=20), st.none() | st.binary(max_size=50)), max_size=4)
timestamps = st.integers(min_value=0, max_value=INT64_MAX)
record = st.tuples(timestamps, maybe_bytes, maybe_bytes, headers)


def cores(limit: int) -> tuple[Any, Any]:
    made = []
    for cls in (_PyRecordsCore, _speedups.RecordsCore):
        core = cls()
        core._buf, core._count, core._base_ts, core._max_ts = bytearray(), 0, 0, 0
        core._limit, core._full, core._section = limit, False, None
        made.append(core)
    return made[0], made[1]


def state(core: Any) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in (getattr(core, f) for f in FIELDS))


def same(python: Any, compiled: Any, method: str, *args: Any) -> Any:
    """Call ``method`` on both; the same result or the same exception type, and the same state after."""
    outcomes = []
    for core in (python, compiled):
        try:
            outcomes.append(("ok", getattr(core, method)(*args)))
        except Exception as exc:
            outcomes.append(("raised", type(exc)))
    assert outcomes[0] == outcomes[1]
    assert state(python) == state(compiled)
    return outcomes[0][1]


@settings(max_examples=300, deadline=None)
@given(st.lists(record, min_size=1, max_size=30), st.integers(min_value=1, max_value=3000))
def test_append_gives_the_same_bytes_and_state(records: list[Any], limit: int) -> None:
    python, compiled = cores(limit)
    for timestamp, key, value, header_list in records:
        same(python, compiled, "append", timestamp, key, value, header_list)


class _LengthRaises:
    def __iter__(self) -> Any:
        return iter([("h", b"x")])

    def __len__(self) -> int:
        raise RuntimeError("len")


class _OwnEncode(str):
    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b"other"


@pytest.mark.parametrize(
    "given", [0, False, _LengthRaises(), [(_OwnEncode("name"), b"v")]], ids=["0", "False", "len-raises", "str-subclass"]
)
def test_both_encoders_take_odd_headers_alike(given: Any) -> None:
    # RecordBatchBuilder is exported: pure Python took headers=0 as none, asked an iterable's
    # length, and wrote what a str subclass's own encode() returned; compiled did none of these.
    same(*cores(10_000), "append", 5, b"k", b"v", given)


def test_the_compiled_clock_reads_wall_clock_milliseconds() -> None:
    for _ in range(1000):
        before = time.time_ns() // 1_000_000
        now = _speedups.now_ms()
        assert before <= now <= time.time_ns() // 1_000_000


@pytest.mark.parametrize("limit", [100, 16_384 - 61, 65_536 - 61])
def test_a_batch_filled_a_record_at_a_time_holds_no_memory_beyond_its_limit(limit: int) -> None:
    # The compiled builder grows its buffer by doubling (a record at a time, bytearray's own
    # growth by an eighth reallocated a 16 KiB batch some forty times), capped at the limit.
    _, compiled = cores(limit)
    empty = sys.getsizeof(bytearray())
    while compiled.append(1_700_000_000_000, b"key", b"v" * 97, ()) is not None:
        assert len(compiled._buf) <= sys.getsizeof(compiled._buf) - empty <= max(limit, len(compiled._buf)) + 1
    assert compiled._full


def test_a_batch_builder_is_never_left_to_the_collector() -> None:
    # A builder lives as long as its batch is unanswered: over 1,000 partitions on a busy
    # broker, long enough to reach the collector's oldest generation, where each one brought
    # the next full collection (a walk over everything the application keeps) nearer. It refers
    # to nothing that could refer back to it, so the compiled one is untracked all its life.
    builder = RecordBatchBuilder("lz4", 16_384)
    untracked = [not gc.is_tracked(builder)]
    assert builder.append(1_700_000_000_000, b"key", b"v" * 97) == 0
    untracked.append(not gc.is_tracked(builder))
    built = builder.build(7, 0, 0)
    untracked.append(not gc.is_tracked(builder))
    assert untracked == [COMPILED] * 3
    assert built == builder.build(7, 0, 0) and len(built) > 61


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(maybe_bytes, maybe_bytes), min_size=1, max_size=50),
    st.booleans(),
    timestamps,
    st.integers(min_value=1, max_value=4000),
    st.integers(min_value=0, max_value=20_000),
)
def test_append_values_gives_the_same_bytes_and_state(
    pairs: list[tuple[bytes | None, bytes | None]], keyed: bool, timestamp: int, limit: int, budget: int
) -> None:
    python, compiled = cores(limit)
    values = [v for _, v in pairs]
    keys = [k for k, _ in pairs] if keyed else None
    start = 0
    while start < len(values):
        appended, _ = same(python, compiled, "append_values", timestamp, values, keys, start, len(values), budget, 64)
        if not appended:
            break
        start += appended


def test_append_values_stops_at_what_is_not_bytes_and_after_closing() -> None:
    python, compiled = cores(10_000)
    values: Sequence[Any] = [b"a", b"b", bytearray(b"c"), b"d"]
    assert same(python, compiled, "append_values", 5, values, None, 0, 4, 10_000, 64) == (2, 130)
    for core in (python, compiled):
        core._section = b"closed"
    assert same(python, compiled, "append_values", 5, values, None, 3, 4, 10_000, 64) == (0, 0)


@pytest.mark.parametrize(
    "args",
    [
        (-1, b"k", b"v", ()),
        (2**63, b"k", b"v", ()),
        (1.5, b"k", b"v", ()),
        (0, "text", b"v", ()),
        (0, b"k", 12, ()),
        (0, b"k", b"v", [(b"bytes-name", b"v")]),
        (0, b"k", b"v", [("name", "text value")]),
        (0, b"k", b"v", [("only-one",)]),
        (0, b"k", b"v", 5),
    ],
)
def test_bad_appends_fail_alike_and_change_nothing(args: tuple[Any, ...]) -> None:
    python, compiled = cores(10_000)
    same(python, compiled, "append", 1000, b"first", b"record", ())
    same(python, compiled, "append", *args)


def test_memoryview_and_bytearray_values_encode_as_bytes() -> None:
    python, compiled = cores(10_000)
    same(python, compiled, "append", 7, bytearray(b"key"), memoryview(b"value"), [("h", bytearray(b"x"))])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_murmur2_and_key_partition_agree(key: bytes, partitions: int) -> None:
    assert _speedups.murmur2(key) == _py_murmur2(key)
    assert _speedups.partition_for_key(key, partitions) == _py_partition_for_key(key, partitions)


@pytest.mark.parametrize(("first", "count"), [(0, 0), (0, 3), (2**40, 5), (-1, 4)])
def test_metadata_range_agrees(first: int, count: int) -> None:
    expected = _py_metadata_range(RecordMetadata, "topic", 7, first, count, 1234)
    got = _speedups.metadata_range(RecordMetadata, "topic", 7, first, count, 1234)
    assert got == expected
    assert all(type(m) is RecordMetadata for m in got)
    assert [m.offset for m in got] == [m.offset for m in expected]


payload = st.none() | st.binary(max_size=40) | st.sampled_from([bytearray(b"ab"), memoryview(b"ab"), "ab", 0])


@settings(max_examples=500, deadline=None)
@given(
    st.lists(payload, max_size=12),
    st.none() | st.lists(payload, max_size=12),
    st.integers(min_value=-1, max_value=80),
    st.booleans(),
)
def test_plain_payloads_agrees(values: list[Any], keys: list[Any] | None, room: int, as_tuples: bool) -> None:
    # Keys drawn apart from values: lengths that differ say False (send_many raises on them first).
    if as_tuples:
        values, keys = tuple(values), None if keys is None else tuple(keys)
    assert _speedups.plain_payloads(values, keys, room) is _py_plain_payloads(values, keys, room)


class Topic(enum.StrEnum):
    ORDERS = "orders"


@pytest.mark.parametrize("topic", ["orders", Topic.ORDERS])
def test_acknowledgements_are_left_to_the_collector_only_when_they_could_be_in_a_cycle(topic: str) -> None:
    # An application keeps one RecordMetadata per record it sent (send_many hands back lists of
    # them); a full collection walked them all. A str, partition, offset and timestamp can never
    # refer back: untracked. A str subclass (a StrEnum member) may carry attributes: tracked.
    one = _speedups.metadata(RecordMetadata, topic, 7, 42, 1234)
    many = _speedups.metadata_range(RecordMetadata, topic, 7, 42, 3, 1234)
    assert one == record_future._py_record_metadata(topic, 7, 42, 1234) == (topic, 7, 42, 1234)
    assert many == _py_metadata_range(RecordMetadata, topic, 7, 42, 3, 1234)
    assert type(one) is RecordMetadata and type(one.topic) is type(topic)
    tracked = type(topic) is not str
    assert [gc.is_tracked(m) for m in (one, *many)] == [tracked] * 4


async def test_a_record_futures_metadata_is_untracked_when_compiled(compiled_record_future: type[Any]) -> None:
    settlement = BatchSettlement(asyncio.get_running_loop())
    python, compiled = _PyRecordFuture(settlement, 2, 1000), compiled_record_future(settlement, 2, 1000)
    settlement.settle(("t", 1, 41, -1))
    assert python.result() == compiled.result() == RecordMetadata("t", 1, 43, 1000)
    assert gc.is_tracked(python.result()) is not COMPILED  # _metadata_of builds it with the compiled helper
    assert not gc.is_tracked(compiled.result())


@pytest.mark.parametrize("base_offset", [-1, 0, 41, 2**62])
@pytest.mark.parametrize("log_append_time", [-1, 0, 1_700_000_000_000])
async def test_an_acknowledged_record_reads_alike_from_both_futures(
    compiled_record_future: type[Any], base_offset: int, log_append_time: int
) -> None:
    # The compiled future reads an acknowledgement itself instead of calling _metadata_of:
    # the offset is -1 with acks=0 (base -1), the timestamp the broker's with log-append time.
    settlement = BatchSettlement(asyncio.get_running_loop())
    futures = [
        cls(settlement, index, 1_600_000_000_000)
        for index in (0, 5)
        for cls in (_PyRecordFuture, compiled_record_future)
    ]
    settlement.settle(("t", 3, base_offset, log_append_time))
    python_first, compiled_first, python_fifth, compiled_fifth = [(await f, f.exception()) for f in futures]
    assert python_first == compiled_first and python_fifth == compiled_fifth
    assert compiled_fifth == (
        RecordMetadata(
            "t",
            3,
            -1 if base_offset < 0 else base_offset + 5,
            1_600_000_000_000 if log_append_time < 0 else log_append_time,
        ),
        None,
    )


def test_the_environment_variable_turns_the_compiled_path_off() -> None:
    probe = (
        "import aioprod._compiled as c, aioprod.protocol.records.builder as b; "
        "print(c.COMPILED, b._RecordsCore.__name__)"
    )
    outputs = {}
    for setting in ("1", "0"):
        env = {**os.environ, "AIOPROD_PURE_PYTHON": setting}
        outputs[setting] = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
    assert outputs["1"] == ["False", "_PyRecordsCore"]
    assert outputs["0"] == ["True", "RecordsCore"]


@pytest.fixture
def compiled_record_future() -> type[Any]:
    """The compiled RecordFuture, ready to use: under AIOPROD_PURE_PYTHON=1 record_future.py
    leaves it unused, so hand it its helpers here, as record_future.py does otherwise."""
    _speedups.setup_record_future(
        record_future._metadata_of,
        record_future._error_of,
        record_future._call_back,
        record_future._describe,
        asyncio.CancelledError,
        asyncio.InvalidStateError,
        RecordMetadata,
    )
    return _speedups.RecordFuture


async def test_both_record_futures_report_the_same_outcomes(compiled_record_future: type[Any]) -> None:
    loop = asyncio.get_running_loop()
    results = []
    for cls in (_PyRecordFuture, compiled_record_future):
        acked, failed = BatchSettlement(loop), BatchSettlement(loop)
        futures = [cls(acked, 3, 1000), cls(failed, 0, 1000), cls(acked, 0, 5)]
        seen: list[str] = []
        futures[0].add_done_callback(lambda f, seen=seen: seen.append(repr(f)))
        futures[2].cancel("no longer wanted")
        pending = repr(futures[0])
        acked.settle(("t", 1, 40, -1))
        error = NotLeaderOrFollowerError("gone")
        failed.settle(BatchFailure(error, None))
        await asyncio.sleep(0)
        results.append(
            (
                pending,
                await futures[0],
                repr(futures[1].exception()),
                futures[2].cancelled(),
                futures[2]._cancel_message,
                seen,
                asyncio.isfuture(futures[0]),
                futures[0].twin().result(),
            )
        )
    assert results[0] == results[1]
    assert results[0][1] == RecordMetadata("t", 1, 43, 1000)


async def test_the_collector_tracks_a_record_future_only_once_it_may_be_in_a_cycle(
    compiled_record_future: type[Any],
) -> None:
    # Applications keep a future per record in flight; walking them all on every full
    # collection was the compiled future's largest cost. It refers only to its batch until it
    # gets a callback or a cancellation message, which may refer back to it.
    settlement = BatchSettlement(asyncio.get_running_loop())
    plain, called_back, cancelled = (compiled_record_future(settlement, i, 1000) for i in range(3))
    called_back.add_done_callback(lambda _: None)
    cancelled.cancel("no longer wanted")
    assert [gc.is_tracked(f) for f in (plain, plain.twin(), called_back, cancelled)] == [False, False, True, True]
    settlement.settle(BatchFailure(NotLeaderOrFollowerError("gone"), None))
    assert type(plain.exception()) is NotLeaderOrFollowerError and not gc.is_tracked(plain)


# Python code that runs in the middle of a compiled call (a header pair's __iter__, a property,
# an __index__, an __eq__) must not leave the C code holding pointers into what it changed:
# the process crashed on each of these (found by AddressSanitizer and a review).


async def test_calling_a_record_future_is_a_type_error(compiled_record_future: type[Any]) -> None:
    future = compiled_record_future(BatchSettlement(asyncio.get_running_loop()), 0, 1000)
    with pytest.raises(TypeError, match="not callable"):
        future()


class _ClearsOnRead:
    """A header pair whose unpacking empties the header list it is in."""

    def __init__(self, headers: list[Any]) -> None:
        self.headers = headers

    def __iter__(self) -> Any:
        self.headers.clear()
        return iter(("k", b"v"))


def test_headers_changed_while_they_are_read_encode_as_they_were_given() -> None:
    _, compiled = cores(10_000)
    _, reference = cores(10_000)
    listed: list[Any] = []
    listed[:] = [_ClearsOnRead(listed), ("a", b"b")]
    name = ["n" * 1000, b"v"]

    def rebinds_the_first_pair() -> Any:
        name[0] = "x"  # the only reference to the first pair's name, whose UTF-8 was taken
        yield "k"
        yield b"v"

    class Rebinds:
        def __iter__(self) -> Any:
            return rebinds_the_first_pair()

    assert compiled.append(0, b"key", b"value", listed) == 0
    assert compiled.append(0, None, None, [name, Rebinds()]) == 1
    assert reference.append(0, b"key", b"value", [("k", b"v"), ("a", b"b")]) == 0
    assert reference.append(0, None, None, [("n" * 1000, b"v"), ("k", b"v")]) == 1
    assert bytes(compiled._buf) == bytes(reference._buf)


@pytest.mark.parametrize("change", ["delete", "bytes", "append"])
def test_a_builder_changed_while_headers_are_read_refuses_the_record(change: str) -> None:
    _, core = cores(10_000)
    assert core.append(0, b"k", b"first", ()) == 0
    before = bytes(core._buf)

    def headers() -> Any:
        if change == "delete":
            del core._buf
        elif change == "bytes":
            core._buf = b"abc"
        else:
            core.append(0, b"k", b"in between", ())
        yield ("h", b"v")

    with pytest.raises(TypeError if change != "append" else RuntimeError):
        core.append(0, b"k", b"second", headers())
    if change == "append":
        assert core._count == 2 and bytes(core._buf).startswith(before)


class _ReentrantSettlement:
    """A settlement whose outcome, read once armed, runs ``action`` first (the compiled future
    reads it from within remove_done_callback and cancel)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.action: Any = None

    def _watch(self, future: Any) -> None:
        pass

    def _unwatch(self, future: Any) -> None:
        pass

    @property
    def outcome(self) -> None:
        action, self.action = self.action, None
        if action is not None:
            action()


async def test_callbacks_run_while_one_is_removed_leave_nothing_to_remove(
    compiled_record_future: type[Any],
) -> None:
    settlement = _ReentrantSettlement(asyncio.get_running_loop())
    future = compiled_record_future(settlement, 0, 1000)
    future.add_done_callback(print)
    settlement.action = future._run_callbacks
    assert future.remove_done_callback(print) == 0


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
async def test_removing_a_callback_whose_comparison_cancels_the_future_compares_identity_first(
    compiled_record_future: type[Any], compiled: bool
) -> None:
    """As asyncio's Future: the registered callback itself is removed without running its __eq__."""
    future = (compiled_record_future if compiled else _PyRecordFuture)(
        BatchSettlement(asyncio.get_running_loop()), 0, 1
    )
    calls: list[str] = []

    class Callback:
        def __call__(self, fut: Any) -> None:
            calls.append("called")

        def __eq__(self, other: object) -> bool:
            future.cancel("from __eq__")
            return other is self

        __hash__ = object.__hash__

    callback = Callback()
    future.add_done_callback(callback)
    future.add_done_callback(callback)
    assert future.remove_done_callback(callback) == 2
    await asyncio.sleep(0)
    assert (future.cancelled(), calls) == (False, [])


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
async def test_a_callback_removed_by_another_removals_comparison_stays_removed(
    compiled_record_future: type[Any], compiled: bool
) -> None:
    """remove_done_callback(a), whose comparison removes b: neither runs, and a counts once."""
    settlement = BatchSettlement(asyncio.get_running_loop())
    future = (compiled_record_future if compiled else _PyRecordFuture)(settlement, 0, 1)
    ran: list[str] = []

    def b(fut: Any) -> None:
        ran.append("b")

    class A:
        armed = True

        def __call__(self, fut: Any) -> None:
            ran.append("a")

        def __eq__(self, other: object) -> bool:
            if A.armed:
                A.armed = False
                future.remove_done_callback(b)
            return other is self

        __hash__ = object.__hash__

    a = A()
    future.add_done_callback(a)
    future.add_done_callback(b)
    assert future.remove_done_callback(a) == 1
    settlement.settle(("t", 0, 5, -1))
    for _ in range(3):
        await asyncio.sleep(0)
    assert ran == []


async def test_a_future_cancelled_while_it_is_cancelled_keeps_the_first_message(
    compiled_record_future: type[Any],
) -> None:
    settlement = _ReentrantSettlement(asyncio.get_running_loop())
    held = [compiled_record_future(settlement, 0, 1000)]
    first = object()
    settlement.action = lambda: held[0].cancel(first)
    refs = sys.getrefcount(first)
    assert held[0].cancel("second") is False
    assert held[0]._cancel_message is first
    held.clear()
    assert sys.getrefcount(first) == refs  # the future took one reference, and gave it back


def test_a_bad_range_argument_is_a_type_error_before_any_other_runs() -> None:
    ran: list[bool] = []

    class Index:
        def __index__(self) -> int:
            ran.append(True)
            return 3

    _, core = cores(1000)
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        core.append_values(0, [], None, "x", Index(), 0, 0)
    with pytest.raises(TypeError):
        _speedups.metadata_range(RecordMetadata, "t", 7, "x", Index(), 0)
    assert ran == []


def test_metadata_range_refuses_offsets_past_int64() -> None:
    with pytest.raises(OverflowError):
        _speedups.metadata_range(RecordMetadata, "t", 7, INT64_MAX - 1, 3, 0)
    assert [m.offset for m in _speedups.metadata_range(RecordMetadata, "t", 7, INT64_MAX - 2, 3, 0)] == [
        INT64_MAX - 2,
        INT64_MAX - 1,
        INT64_MAX,
    ]


async def test_a_callback_added_while_reading_the_outcome_cancels_the_future_still_runs(
    compiled_record_future: type[Any],
) -> None:
    settlement = _ReentrantSettlement(asyncio.get_running_loop())
    held = [compiled_record_future(settlement, 0, 1000)]
    settlement.action = lambda: held[0].cancel()
    called: list[Any] = []
    held[0].add_done_callback(called.append)
    await asyncio.sleep(0)
    assert called == held


class _EmptiesItsList:
    """A header pair whose unpacking empties the header list it is in."""

    def __init__(self, headers: list[Any]) -> None:
        self.headers = headers

    def __iter__(self) -> Any:
        self.headers.clear()
        return iter(("k", b"v"))


def _emptied_while_read() -> list[Any]:
    headers: list[Any] = []
    headers[:] = [_EmptiesItsList(headers), ("a", b"b")]
    return headers


# Inputs the public RecordBatchBuilder takes but send() never passes (it makes bytes first).
_ODD_RECORDS = {
    "a value of 2-byte items": lambda: (None, array.array("H", [1, 2, 3]), ()),
    "a key of 4-byte items": lambda: (memoryview(bytes(8)).cast("I"), b"v", ()),
    "a header value of 2-byte items": lambda: (None, None, [("h", array.array("H", [1, 2, 3]))]),
    "a header list emptied while read": lambda: (b"key", b"val", _emptied_while_read()),
    "headers from a generator": lambda: (None, None, (h for h in [("h", b"x")])),
    "a non-contiguous value": lambda: (None, memoryview(b"abcdef")[::2], ()),
}


@pytest.mark.parametrize("case", list(_ODD_RECORDS))
def test_append_takes_odd_input_as_the_compiled_one_does(case: str) -> None:
    # The pure-Python twin wrote item counts as byte lengths, and a header count it then did
    # not write: corrupt batches where the compiled builder wrote good ones.
    outcomes = []
    made = cores(10_000)
    for core in made:
        key, value, header_list = _ODD_RECORDS[case]()
        try:
            outcomes.append(("ok", core.append(5, key, value, header_list)))
        except Exception as exc:
            outcomes.append(("raised", type(exc)))
    assert outcomes[0] == outcomes[1]
    assert state(made[0]) == state(made[1])


def test_append_values_past_the_list_changes_nothing() -> None:
    # A list shortened while send_many() queued it: the pure-Python twin wrote records, then
    # raised before counting them, and the next caller's batch was corrupt.
    python, compiled = cores(10_000)
    values = [b"a", b"b"]
    assert same(python, compiled, "append_values", 5, values, None, 0, 5, 10_000, 64) is IndexError
    assert python._count == 0 and python._buf == b""


@pytest.mark.parametrize("data", [array.array("H", [1, 2, 3]), memoryview(b"abcdef")[::2]])
def test_murmur2_takes_odd_buffers_as_the_compiled_one_does(data: Any) -> None:
    def outcome(murmur2: Any) -> Any:
        try:
            return murmur2(data)
        except Exception as exc:
            return type(exc)

    assert outcome(_py_murmur2) == outcome(_speedups.murmur2)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.11's holder: 3.12 asks the running loop itself")
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_running_loop_holder_names_one_run_of_one_loop_in_one_thread(loop_kind: str) -> None:
    # send()'s loop check on 3.11 (producer._RunOf) is exact only if a thread's holder is a new
    # object whenever a loop starts or stops running in it, and no other thread's.
    import threading

    import uvloop

    run = asyncio.run if loop_kind == "asyncio" else uvloop.run

    async def holders() -> tuple[object, object]:
        return _speedups.running_loop_holder(), _speedups.running_loop_holder()

    first, again = run(holders())
    assert first is not None and first is again  # the same run
    assert _speedups.running_loop_holder() is not first  # the loop stopped
    assert run(holders())[0] is not first  # another run, same thread
    elsewhere: list[object] = []
    thread = threading.Thread(target=lambda: elsewhere.extend((_speedups.running_loop_holder(), run(holders())[0])))
    thread.start()
    thread.join(30)
    assert elsewhere[0] is None  # a thread that never ran a loop
    assert elsewhere[1] is not first and elsewhere[1] is not None


# Reference cycles the collector must still find, though the compiled objects keep themselves
# out of its sight where they can (counted, not timed: N cycles made, far fewer may be left).
CYCLES = 2_000


def _collected_objects_left(make_cycle: Any) -> int:
    """Objects the collector still sees after ``CYCLES`` unreachable cycles were made."""
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(CYCLES):
        make_cycle()
    gc.collect()
    return len(gc.get_objects()) - before


@pytest.mark.parametrize("future_class", ["python", "compiled"])
async def test_a_cancellation_message_that_refers_to_its_future_is_collected(
    future_class: str, compiled_record_future: type[Any]
) -> None:
    # asyncio's own futures take any object as the message; a tuple (which has no tp_clear of
    # its own) holding the future made a cycle the compiled future never broke: it and its
    # batch's settlement stayed in memory for good.
    cls = _PyRecordFuture if future_class == "python" else compiled_record_future
    loop = asyncio.get_running_loop()

    def make_cycle() -> None:
        future = cls(BatchSettlement(loop), 0, 1000)
        assert future.cancel((future, "no longer wanted"))

    assert _collected_objects_left(make_cycle) < CYCLES // 10


def test_a_subclass_of_the_batch_builder_with_a_dict_is_collected() -> None:
    # RecordBatchBuilder is exported; the compiled one keeps itself out of the collector's sight
    # (see test_a_batch_builder_is_never_left_to_the_collector), and so did every subclass, whose
    # instance __dict__ may hold anything, the builder itself included: such cycles stayed in
    # memory for good.
    class Annotated(RecordBatchBuilder):
        pass

    def make_cycle() -> None:
        builder = Annotated()
        builder.note = {"builder": builder}

    assert _collected_objects_left(make_cycle) < CYCLES // 10
    assert gc.is_tracked(Annotated()) and gc.is_tracked(RecordBatchBuilder()) is not COMPILED

"""The arithmetic behind the reports: the smoke check and latency percentiles (no broker)."""

from __future__ import annotations

import random
import tracemalloc

from aioprod.cli.smoke import SmokeResult
from aioprod.cli.stats import AckTracker


def test_the_check_catches_lost_duplicated_and_failed_records() -> None:
    good = SmokeResult("t", 3, before={0: 10, 1: 0}, after={0: 12, 1: 1})
    good.acked_offsets.update({0: [10, 11], 1: [0]})
    assert good.problems() == []

    lost = SmokeResult("t", 3, before={0: 10, 1: 0}, after={0: 11, 1: 1})
    lost.acked_offsets.update({0: [10, 11], 1: [0]})
    assert lost.problems() == ["partition 0: end offset advanced by 1 (10 -> 11) but 2 records were acked there"]

    duplicated = SmokeResult("t", 2, before={0: 10}, after={0: 12})
    duplicated.acked_offsets.update({0: [10, 10]})
    assert duplicated.problems() == ["partition 0: acked offsets are not exactly the new offsets 10..11"]

    unknown_partition = SmokeResult("t", 1, before={0: 0}, after={0: 0})
    unknown_partition.acked_offsets.update({5: [0]})
    assert "partition 5" in unknown_partition.problems()[0]

    failed = SmokeResult("t", 2, before={0: 0}, after={0: 1}, failed=1, first_error=TimeoutError("late"))
    failed.acked_offsets.update({0: [0]})
    assert failed.problems() == ["1 of 2 records failed (first: TimeoutError: late)"]


def test_latency_percentiles_are_nearest_rank_to_the_microsecond() -> None:
    tracker = AckTracker()
    tracker.latencies_ms.extend(float(i) for i in range(1, 101))
    summary = tracker.summary()
    assert (summary.p50, summary.p95, summary.p99, summary.p999) == (50.0, 95.0, 99.0, 100.0)
    assert (summary.count, summary.avg, summary.max) == (100, 50.5, 100.0)
    one = AckTracker()
    one.latencies_ms.append(7.0004)
    assert (one.summary().p50, one.summary().max) == (7.0, 7.0004)
    assert AckTracker().summary().count == 0


def test_the_p99_9_of_a_round_count_is_not_one_rank_too_high() -> None:
    # In floats, 99.9 / 100 * 1000 is 999.0000000000001: the rank was 1,000, the maximum.
    for total in (1_000, 10_000):
        tracker = AckTracker()
        tracker.latencies_ms.extend(float(i) for i in range(1, total + 1))
        summary = tracker.summary()
        assert (summary.p50, summary.p99, summary.p999) == (total * 0.5, total * 0.99, total * 0.999)


def test_no_percentile_is_above_the_maximum() -> None:
    # To the microsecond, 8.6849 ms rounded up to 8.685: perf --json printed p99_9 8.69 and max 8.68.
    tracker = AckTracker()
    tracker.latencies_ms.extend([1.0, 8.6848, 8.6849])
    summary = tracker.summary()
    assert (summary.p50, summary.p95, summary.p99, summary.p999, summary.max) == (8.6849,) * 5


def test_the_latency_summary_needs_no_second_copy_of_the_samples() -> None:
    """perf keeps 8 bytes a record; its summary once sorted them into Python floats (5x that:
    several GB at the end of a 100M-record run)."""
    tracker = AckTracker()
    rng = random.Random(1)
    # 200,000 samples (1.6 MB) over 5,000 distinct microseconds: a second copy as Python floats
    # would take 6.4 MB, the count of distinct values about 0.5 MB.
    tracker.latencies_ms.extend(rng.random() * 5 for _ in range(200_000))
    tracemalloc.start()
    try:
        summary = tracker.summary()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.count == 200_000
    assert peak < 1_600_000

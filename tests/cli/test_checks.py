"""The arithmetic behind the reports: the smoke check and latency percentiles (no broker)."""

from __future__ import annotations

from aioprod.cli.smoke import SmokeResult
from aioprod.cli.stats import percentile


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


def test_percentile_nearest_rank() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert percentile(samples, 50) == 50.0
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 99.9) == 100.0
    assert percentile([7.0], 50) == 7.0
    assert percentile([], 50) == 0.0

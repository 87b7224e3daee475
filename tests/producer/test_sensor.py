"""Sensor: Java's windowed Rate, Avg and Max (metrics.sample.window.ms x metrics.num.samples)."""

from __future__ import annotations

import math

import pytest

from aioprod.metrics import Sensor


def test_totals_count_everything_and_windows_forget() -> None:
    sensor = Sensor(window=30.0, samples=2)
    sensor.record(10, now=0.0)
    sensor.record(20, now=10.0)
    # Java's Rate: time since the oldest sample, padded to (samples - 1) whole windows.
    assert sensor.rate(20.0) == pytest.approx(30 / 50)
    assert sensor.rate(20.0, events=True) == pytest.approx(2 / 50)
    assert sensor.avg(20.0) == 15
    assert sensor.max(20.0) == 20
    sensor.record(5, now=31.0)  # the first sample is complete: a second one starts
    assert sensor.rate(40.0) == pytest.approx(35 / 40)  # a whole window behind: no padding
    sensor.record(1, now=65.0)  # both complete: the oldest is reused
    assert sensor.rate(70.0) == pytest.approx(6 / 39)
    assert sensor.max(70.0) == 5
    # Nothing in the last two windows: rates are zero, averages and maxima NaN, as in Java.
    assert sensor.rate(125.0) == 0.0
    assert math.isnan(sensor.avg(125.0)) and math.isnan(sensor.max(125.0))
    assert (sensor.total, sensor.count) == (36, 4)


def test_an_empty_sensor_reads_zero_rate_and_nan() -> None:
    sensor = Sensor(window=30.0, samples=2)
    assert sensor.rate(5.0) == 0.0
    assert math.isnan(sensor.avg(5.0)) and math.isnan(sensor.max(5.0))


def test_events_weigh_the_average() -> None:
    sensor = Sensor(window=1.0, samples=3)
    sensor.record_many(300, 3, now=0.0)  # 3 records of 100 bytes in one batch
    sensor.record(50, now=0.5)
    assert sensor.avg(0.5) == pytest.approx(350 / 4)
    assert sensor.rate(0.5, events=True) == pytest.approx(4 / 2.5)  # padded to 2 whole windows


def test_many_values_at_once_read_as_if_recorded_one_by_one() -> None:
    one_by_one, at_once = Sensor(window=30.0, samples=2), Sensor(window=30.0, samples=2)
    for value in (10, 40, 25):
        one_by_one.record(value, now=3.0)
    at_once.record_many(75, 3, now=3.0, peak=40)
    for sensor in (one_by_one, at_once):
        assert (sensor.total, sensor.count, sensor.avg(4.0), sensor.max(4.0)) == (75, 3, 25, 40)
        assert sensor.rate(4.0) == pytest.approx(75 / 31)


def test_a_sample_is_complete_after_exactly_one_window_as_in_java() -> None:
    # Java's SampledStat.isComplete: now - start >= window. A record exactly a window after the
    # first starts the second sample, so the first can expire on its own.
    sensor = Sensor(window=30.0, samples=2)
    sensor.record(10, now=0.0)
    sensor.record(1, now=30.0)
    assert sensor.rate(61.0) == pytest.approx(1 / 31)  # the first sample (10) expired at 60 s
    assert sensor.max(61.0) == 1


def test_a_rate_read_as_its_only_sample_begins_is_over_one_millisecond() -> None:
    # metrics_num_samples=1: no padding window, and a read in the instant of the first record
    # has no elapsed time at all; Java's Rate takes 1 ms then, never a division by zero.
    sensor = Sensor(window=30.0, samples=1)
    sensor.record(5, now=10.0)
    assert sensor.rate(10.0) == pytest.approx(5 / 0.001)
    assert sensor.rate(12.0) == pytest.approx(5 / 2)

"""The benchmark compares clients at equal settings (docs/benchmarks.md): these check the two a
client's defaults made unequal, the lz4 level (aiokafka's is 9, LZ4-HC) and the key hash
(librdkafka's default is CRC32)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as RdkafkaProducer

from aioprod.producer.partitioner import partition_for_key
from tests.brokers import TansuBroker
from tests.integration.test_produce import create_topic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = importlib.import_module("bench_producers")


def test_aiokafka_compresses_at_lz4s_fast_level_as_the_others_do(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = importlib.import_module("aiokafka.codec")
    builders = importlib.import_module("aiokafka.record.default_records")
    levels: list[int] = []
    encode = codec.lz4_encode

    def spy(payload: Any, level: int = 9) -> bytes:
        levels.append(level)
        return bytes(encode(payload, level))

    monkeypatch.setattr(codec, "lz4_encode", spy)
    for name in ("default_records", "legacy_records", "_crecords.default_records", "_crecords.legacy_records"):
        try:
            module = importlib.import_module(f"aiokafka.record.{name}")
        except ImportError:
            continue
        if hasattr(module, "lz4_encode"):
            monkeypatch.setattr(module, "lz4_encode", module.lz4_encode)  # restored after the test
    bench.aiokafka_fast_lz4()
    builder = builders.DefaultRecordBatchBuilder(2, 3, 0, -1, -1, -1, 16384)  # magic 2, lz4
    for offset, value in enumerate(bench.make_values(150, 100)):
        builder.append(offset, timestamp=None, key=None, value=value, headers=[])
    builder.build()
    assert levels == [0]


@pytest.mark.integration
def test_librdkafka_puts_the_benchmarks_keys_where_aioprod_does(tansu_broker: TansuBroker, topic: str) -> None:
    create_topic(tansu_broker.bootstrap, topic, 3)
    spec = {"bootstrap": tansu_broker.bootstrap, "linger_ms": 5, "batch_size": 16384, "idempotence": True}
    placed: dict[bytes, int] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None
        placed[message.key()] = message.partition()

    producer = RdkafkaProducer(bench.librdkafka_config(spec, on_delivery=delivered))
    keys = [key for key in bench.make_keys(100, 100) if key is not None]
    for key in keys:
        producer.produce(topic, b"v", key)
    assert producer.flush(30) == 0
    assert placed == {key: partition_for_key(key, 3) for key in keys}


def _stored_as_sent(spec: dict[str, Any]) -> dict[int, list[Any]]:
    """What a correct run leaves: the warm-up, then the records, keys spread by their hash."""
    stored: dict[int, list[Any]] = {p: [] for p in range(spec["partitions"])}
    stored[0].append((None, b"warm-up"))
    keys = bench.make_keys(spec["records"], spec["keys"])
    for key, value in zip(keys, bench.make_values(spec["records"], spec["value_size"]), strict=True):
        stored[partition_for_key(key, spec["partitions"])].append((key, value))
    return stored


BENCH_SPEC = {"records": 3000, "keys": 7, "value_size": 100, "partitions": 3}


def test_the_benchmark_takes_a_run_that_stored_every_record_once_in_order() -> None:
    assert bench.stored_problem(BENCH_SPEC, _stored_as_sent(BENCH_SPEC)) is None


def test_the_benchmark_fails_a_run_that_lost_one_record_and_wrote_another_twice() -> None:
    stored = _stored_as_sent(BENCH_SPEC)
    stored[1][5] = stored[1][6]  # the count is right
    problem = bench.stored_problem(BENCH_SPEC, stored)
    assert problem is not None and "1 missing, 1 extra or written twice" in problem


def test_the_benchmark_fails_a_run_that_stored_a_partition_out_of_order() -> None:
    stored = _stored_as_sent(BENCH_SPEC)
    stored[2][10], stored[2][11] = stored[2][11], stored[2][10]
    assert bench.stored_problem(BENCH_SPEC, stored) == "partition 2 holds offset 11 out of the order it was sent in"

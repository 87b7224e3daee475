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

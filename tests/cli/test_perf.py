"""``aioprod perf``: small runs; the numbers' shape, not their size (no timing thresholds)."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import aioprod

pytestmark = pytest.mark.integration


def test_json_result(bootstrap: str, topic: str) -> None:
    result = aioprod("perf", "-b", bootstrap, "--topic", topic, "--num-records", "500", "--record-size", "64", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["records"] == 500 and report["acked"] == 500 and report["failed"] == 0
    assert report["record_size"] == 64
    assert report["throughput_limit"] is None
    assert report["embedded_broker"] is False
    assert report["records_per_sec"] > 0 and report["mb_per_sec"] > 0
    latency = report["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["p99_9"] <= latency["max"]
    assert latency["avg"] <= latency["max"]


def test_throughput_is_the_configured_pace(bootstrap: str, topic: str) -> None:
    args = ["perf", "-b", bootstrap, "-t", topic, "-n", "40", "-s", "10", "--throughput", "2000"]
    as_json = aioprod(*args, "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["throughput_limit"] == 2000
    table = aioprod(*args)
    assert table.exit_code == 0, table.output
    assert "configured throughput" in table.stdout and "2,000 records/s" in table.stdout


def test_table_and_embedded_broker_without_bootstrap() -> None:
    result = aioprod("perf", "-t", "perf-test", "-n", "200", "-s", "100")
    assert result.exit_code == 0, result.output
    assert "embedded Tansu broker" in result.stderr  # said up front...
    assert "embedded Tansu broker" in result.stdout  # ...and in the results
    for metric in ("records/s", "MB/s", "avg latency", "max latency", "p50", "p95", "p99 ", "p99.9"):
        assert metric in result.stdout
    assert "unlimited" in result.stdout


def test_bad_option_names_it() -> None:
    result = aioprod("perf", "-t", "x", "-n", "1", "-s", "1", "-X", "compression.type=brotli")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "compression_type" in result.stderr and "brotli" in result.stderr


def test_print_metrics_lists_the_java_metrics(bootstrap: str, topic: str) -> None:
    args = ["perf", "-b", bootstrap, "-t", topic, "-n", "300", "-s", "50", "-X", "client.id=perf-client"]
    table = aioprod(*args, "--print-metrics")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    # As kafka-producer-perf-test prints them: group:name:{tags} : value, sorted.
    sent = [line for line in lines if line.startswith("producer-metrics:record-send-total:")]
    assert sent == [
        f"{'producer-metrics:record-send-total:{client-id=perf-client}':<{len(sent[0].split(' : ')[0])}} : 300.000"
    ]
    assert any(
        line.startswith(f"producer-topic-metrics:record-send-total:{{client-id=perf-client, topic={topic}}}")
        for line in lines
    )
    assert any(
        line.startswith("producer-node-metrics:request-latency-avg:{client-id=perf-client, node-id=node-")
        for line in lines
    )
    bootstrap_latency = "producer-node-metrics:request-latency-avg:{client-id=perf-client, node-id=node--1}"
    assert any(line.startswith(bootstrap_latency) and line.endswith(" : NaN") for line in lines)  # as Java prints it
    names = [line.split(" : ")[0] for line in lines if " : " in line]
    assert names == sorted(names)
    report = json.loads(aioprod(*args, "--json", "--print-metrics").stdout)
    assert report["metrics"]["producer"]["record-send-total"] == 300
    assert report["metrics"]["topics"][topic]["record-send-total"] == 300

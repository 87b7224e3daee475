"""``aioprod perf``: small runs; the numbers' shape, not their size (no timing thresholds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aioprod.cli.perf import payload
from tests.cli.conftest import aioprod, full_buffer_after
from tests.readback import read_topic

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


def test_acks_0_says_its_records_were_sent_not_acknowledged(bootstrap: str, topic: str) -> None:
    # "records acked 20,000" with acks=0, which no broker acknowledges.
    args = ["perf", "-b", bootstrap, "--topic", topic, "--num-records", "500", "--record-size", "64", "-X", "acks=0"]
    table = aioprod(*args)
    assert table.exit_code == 0, table.output
    assert "records sent (acks=0)" in table.stdout and "records acked" not in table.stdout
    report = json.loads(aioprod(*args, "--json").stdout)
    assert (report["acks"], report["acked"]) == (0, 500)
    assert json.loads(aioprod(*args[:-2], "--json").stdout)["acks"] == "all"


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


def decimals(value: float) -> int:
    text = repr(value)
    return len(text.split(".")[1]) if "." in text else 0


def test_json_numbers_are_rounded_as_documented(bootstrap: str, topic: str) -> None:
    """Point 4: seconds to 4 places, records/s to 1, MB/s to 4, latencies to 2 (docs/cli.md)."""
    result = aioprod("perf", "-b", bootstrap, "-t", topic, "-n", "300", "-s", "33", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert decimals(report["elapsed_s"]) <= 4
    assert decimals(report["records_per_sec"]) <= 1
    assert decimals(report["mb_per_sec"]) <= 4
    assert all(decimals(v) <= 2 for v in report["latency_ms"].values())


def test_payload_file_and_keys(bootstrap: str, topic: str, tmp_path: Path) -> None:
    """Point 7: values drawn from --payload-file, keys from --keys N, all read back."""
    payloads = tmp_path / "payloads.txt"
    payloads.write_bytes(b"alpha\nbeta\n\ngamma-gamma\n")  # the empty piece is dropped, as Java's tool does
    result = aioprod("perf", "-b", bootstrap, "-t", topic, "-n", "200", "--payload-file", str(payloads), "--keys", "3")
    assert result.exit_code == 0, result.output
    assert "3 payloads" in result.stdout and "3 distinct" in result.stdout
    records = read_topic(bootstrap, topic)
    assert len(records) == 200
    assert {r.value for r in records} <= {b"alpha", b"beta", b"gamma-gamma"}
    assert {r.key for r in records} == {b"key-0", b"key-1", b"key-2"}
    # One key, one partition (murmur2, as the Java client).
    assert all(len({r.partition for r in records if r.key == key}) == 1 for key in (b"key-0", b"key-1", b"key-2"))
    both = aioprod("perf", "-b", bootstrap, "-t", topic, "-n", "1", "-s", "1", "--payload-file", str(payloads))
    assert both.exit_code == 2 and "either --record-size or --payload-file (not both)" in both.stderr
    neither = aioprod("perf", "-b", bootstrap, "-t", topic, "-n", "1")
    assert neither.exit_code == 2 and "either --record-size or --payload-file (one of them is needed)" in neither.stderr


def test_a_terminal_gets_a_progress_bar_with_rate_and_eta(bootstrap: str, topic: str) -> None:
    """Point 2: on a terminal, a live bar (records, rate, ETA) instead of interim lines."""
    result = aioprod(
        "perf", "-b", bootstrap, "-t", topic, "-n", "3000", "-s", "10", "--throughput", "3000",
        env={"TTY_COMPATIBLE": "1"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "records/s" in result.stderr and "ETA" in result.stderr and "/3000" in result.stderr
    assert "aioprod perf: " not in result.stderr  # no interim lines on a terminal


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
    report = json.loads(aioprod(*args, "--json", "--print-metrics").stdout, parse_constant=not_json)
    assert report["metrics"]["producer"]["record-send-total"] == 300
    assert report["metrics"]["topics"][topic]["record-send-total"] == 300
    # JSON has no NaN (strict parsers, JavaScript's JSON.parse among them, refuse it): an
    # average over an empty window, the bootstrap connection's latency, is null.
    assert report["metrics"]["brokers"]["-1"]["request-latency-avg"] is None


def not_json(constant: str) -> object:
    raise ValueError(f"not JSON: {constant}")


def test_interim_lines_stay_one_line_each_when_stderr_is_not_a_terminal(kafka_bootstrap: str, topic: str) -> None:
    result = aioprod(
        "perf",
        "-b",
        kafka_bootstrap,
        "-t",
        topic,
        "-n",
        "6000",
        "-s",
        "100",
        "--throughput",
        "3000",
        "--reporting-interval",
        "500",
        env={"COLUMNS": "80"},
    )
    assert result.exit_code == 0, result.stderr
    interim = [line for line in result.stderr.splitlines() if line.startswith("aioprod perf:")]
    assert interim
    assert all(line.endswith("awaiting an ack") for line in interim), interim


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_throughput_that_is_not_a_number_is_a_usage_error(value: str) -> None:
    result = aioprod("perf", "-b", "127.0.0.1:9", "-t", "t", "-n", "1", "-s", "1", "--throughput", value, "--json")
    assert result.exit_code == 2
    assert "Invalid value for '--throughput'" in result.stderr


def test_the_payload_is_random_uppercase_letters_the_same_each_run() -> None:
    value = payload(100_000)
    assert len(value) == 100_000 and set(value) == set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert payload(100_000) == value


def test_a_record_size_over_max_request_size_is_a_usage_error() -> None:
    # Every record would fail as too large; -s 10000000000 raised OverflowError, and a size of a
    # few GB built its payload (twice) first.
    result = aioprod("perf", "-t", "p", "-n", "1", "-s", "10000000000", "-b", "127.0.0.1:9")
    assert result.exit_code == 2, result.stderr
    assert "--record-size 10,000,000,000 is larger than max.request.size (1,048,576)" in result.stderr


def test_a_record_size_that_fits_only_without_its_overhead_is_a_usage_error() -> None:
    # -s 1048576, the obvious 1 MB test, connected and then failed every record as too large.
    result = aioprod("perf", "-t", "p", "-n", "3", "-s", "1048576", "-b", "127.0.0.1:9")
    assert result.exit_code == 2, result.stderr
    assert "--record-size 1,048,576 is larger than max.request.size (1,048,576) with the record's" in result.stderr


def test_a_send_that_fails_stops_the_run_which_still_reports_the_records_sent(
    bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The buffer full for max.block.ms (a cluster that takes nothing) on the 51st send: the run
    # once ended with one line, no table and no counts, after up to delivery.timeout.ms of silence.
    full_buffer_after(monkeypatch, 50)
    result = aioprod("perf", "-b", bootstrap, "-t", topic, "-n", "1000", "-s", "10", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert (report["acked"], report["failed"], report["unsent"]) == (50, 1, 949)  # every record accounted for
    assert report["first_error"] == "KafkaTimeoutError: buffer_memory stayed full for max_block_ms"
    assert (
        "stopped sending after 50 of 1,000 records: KafkaTimeoutError: buffer_memory stayed full for max_block_ms; "
        "50 records delivered, 1 failed, 949 unsent"
    ) in result.stderr
    assert result.stderr.count("buffer_memory stayed full") == 2  # as it happens, and at the end: not a third time
    assert len(read_topic(bootstrap, topic)) == 50


def test_the_java_tools_producer_flags_get_aioprods_spelling() -> None:
    result = aioprod("perf", "-t", "p", "-n", "1", "-s", "1", "--producer-props", "acks=1")
    assert result.exit_code == 2
    assert "No such option '--producer-props': aioprod's is -X KEY=VALUE, once per option" in result.stderr
    result = aioprod("perf", "-t", "p", "-n", "1", "-s", "1", "--producer.config", "p.properties")
    assert "No such option '--producer.config': aioprod's is -F FILE" in result.stderr

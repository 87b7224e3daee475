"""``aioprod smoke``: on the embedded broker, on the suite's broker, and when it must fail."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.brokers import TansuBroker, refused_port
from tests.cli.conftest import aioprod

pytestmark = pytest.mark.integration


def test_smoke_without_bootstrap_runs_on_the_embedded_broker() -> None:
    result = aioprod("smoke", "--records", "300")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "embedded Tansu broker" in out
    assert "aioprod smoke: OK" in out
    assert "300 sent, 300 acked, 0 failed" in out
    assert re.search(r"partitions\s+\d+ \(\d+ written to; end offsets checked\)", out)
    assert re.search(r"throughput\s+[\d,]+ records/s", out)
    assert re.search(r"ack latency\s+p50 [\d.]+ ms, p99 [\d.]+ ms", out)
    assert result.stderr == ""


def test_smoke_against_a_cluster_counts_from_the_existing_end_offsets(bootstrap: str, topic: str) -> None:
    first = aioprod("smoke", "-b", bootstrap, "--topic", topic, "--records", "200")
    assert first.exit_code == 0, first.output
    # The topic now holds 200 records: the second run must check only its own 150.
    second = aioprod("smoke", "-b", bootstrap, "--topic", topic, "--records", "150")
    assert second.exit_code == 0, second.output
    assert "150 sent, 150 acked, 0 failed" in second.stdout
    assert "embedded" not in second.stdout


def test_smoke_fails_with_one_line_when_the_cluster_is_unreachable() -> None:
    port = refused_port()
    result = aioprod("smoke", "-b", f"127.0.0.1:{port}", "-X", "max.block.ms=500")
    assert result.exit_code == 1
    warning, error = result.stderr.splitlines()  # the connection warning at once, the failure at the end
    assert warning.startswith("aioprod: warning: ") and f"127.0.0.1:{port}" in warning and "refused" in warning
    assert error.startswith(f"aioprod: error: smoke test failed on 127.0.0.1:{port}: KafkaTimeoutError")
    assert "Traceback" not in result.output


def test_json_still_reports_a_run_that_could_not_finish() -> None:
    """A script reading `smoke --json` got nothing on stdout when the run failed (here: no broker)."""
    port = refused_port()
    result = aioprod("smoke", "-b", f"127.0.0.1:{port}", "-X", "max.block.ms=500", "-n", "7", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    (problem,) = report.pop("problems")
    assert problem.startswith(f"smoke test failed on 127.0.0.1:{port}: KafkaTimeoutError")
    assert report == {
        "ok": False,
        "cluster": f"127.0.0.1:{port}",
        "embedded_broker": False,
        "topic": "aioprod-smoke",
        "records": 7,
        "acked": 0,
        "failed": 0,
    }
    assert result.stderr.splitlines()[-1] == f"aioprod: error: {problem}"


def test_json_report(bootstrap: str, topic: str) -> None:
    """Point 4: --json is the report as one object, nothing else on stdout."""
    result = aioprod("smoke", "-b", bootstrap, "--topic", topic, "--records", "120", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["problems"] == []
    assert (report["records"], report["acked"], report["failed"]) == (120, 120, 0)
    assert report["topic"] == topic and report["embedded_broker"] is False
    advanced = sum(p["after"] - p["before"] for p in report["end_offsets"].values())
    assert advanced == 120
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p99"] <= report["latency_ms"]["max"]


def test_smoke_refuses_acks_0_because_there_is_nothing_to_check() -> None:
    result = aioprod("smoke", "-b", "127.0.0.1:9", "-X", "acks=0")
    assert result.exit_code == 2
    assert "acks=0" in result.stderr


def test_smoke_on_a_tansu_topic_that_already_holds_batched_data_is_ok(tansu_broker: TansuBroker, topic: str) -> None:
    """Tansu's end offsets count batches: after someone else's batches of many records, the
    offset read before the run is below the log's end (docs/cli.md: the topic may hold data)."""
    bootstrap = tansu_broker.bootstrap
    first = aioprod("perf", "-b", bootstrap, "-t", topic, "-n", "500", "-s", "10", "--keys", "1")
    assert first.exit_code == 0, first.output
    second = aioprod("smoke", "-b", bootstrap, "-t", topic, "-n", "50")
    assert second.exit_code == 0, second.output
    assert "aioprod smoke: OK" in second.stdout
    assert "checked from its first acked offset" in second.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("metadata",),
        ("smoke", "-n", "5"),
        ("smoke", "-n", "5", "--json"),
        ("perf", "-t", "pipe-perf", "-n", "5", "-s", "10"),
    ],
    ids=" ".join,
)
def test_a_reader_that_goes_away_does_not_fail_the_command(bootstrap: str, args: tuple[str, ...]) -> None:
    # `aioprod smoke | head -1` exited 1 ("a smoke check failed") with nothing said, and metadata
    # with "aioprod: error: BrokenPipeError": as the Unix tools, the output stops, the result stands.
    read, write = os.pipe()
    os.close(read)  # stdout's reader is gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "aioprod.cli", *args, "-b", bootstrap],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("AIOPROD_")},
            timeout=120,
        )
    finally:
        os.close(write)
    assert (done.returncode, "BrokenPipeError" in done.stderr) == (0, False), done.stderr[-2000:]

"""``aioprod produce``: lines in, records out, read back with confluent_kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import aioprod, create_topic
from tests.readback import read_topic

pytestmark = pytest.mark.integration


def test_file_with_keys_and_headers(bootstrap: str, topic: str, tmp_path: Path) -> None:
    data = tmp_path / "records.txt"
    data.write_bytes(b"k1:v1\r\nk2:v:with:colons\nno separator\n:empty key\n\nlast-without-newline:x")
    result = aioprod("produce", topic, str(data), "-b", bootstrap, "-K", ":", "-H", "source=cli", "-H", "n=2")
    assert result.exit_code == 0, result.output
    assert "6 records produced" in result.stderr
    records = read_topic(bootstrap, topic)
    assert sorted(((r.key, r.value) for r in records), key=repr) == sorted(
        [
            (b"k1", b"v1"),
            (b"k2", b"v:with:colons"),
            (None, b"no separator"),  # as kcat: no separator, no key
            (b"", b"empty key"),
            (None, b""),  # an empty line is an empty record
            (b"last-without-newline", b"x"),
        ],
        key=repr,
    )
    assert {r.headers for r in records} == {(("source", b"cli"), ("n", b"2"))}


def test_stdin_in_order_to_one_partition(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=3)
    lines = [f"line {i}" for i in range(50)]
    result = aioprod("produce", topic, "-", "-b", bootstrap, "--partition", "2", input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    records = read_topic(bootstrap, topic)
    assert {r.partition for r in records} == {2}
    assert [r.value for r in sorted(records, key=lambda r: r.offset)] == [line.encode() for line in lines]
    assert all(r.key is None and r.headers == () for r in records)


def test_a_failing_line_is_reported_and_the_others_still_go(bootstrap: str, topic: str) -> None:
    too_big = "x" * 5000
    result = aioprod("produce", topic, "-b", bootstrap, "-X", "max.request.size=2000", input=f"ok 1\n{too_big}\nok 3\n")
    assert result.exit_code == 1
    assert "line 2: RecordTooLargeError" in result.stderr
    assert "line 1" not in result.stderr and "line 3" not in result.stderr
    assert "aioprod: error: 2 records produced" in result.stderr and "1 failed" in result.stderr
    assert sorted(r.value for r in read_topic(bootstrap, topic)) == [b"ok 1", b"ok 3"]


def test_a_partition_that_does_not_exist_fails_every_line(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=1)
    result = aioprod("produce", topic, "-b", bootstrap, "-p", "7", input="a\nb\n")
    assert result.exit_code == 1
    assert "line 1: ValueError: partition 7 does not exist" in result.stderr
    assert "line 2: ValueError" in result.stderr


def test_bootstrap_from_the_environment(bootstrap: str, topic: str) -> None:
    result = aioprod("produce", topic, input="from env\n", env={"AIOPROD_BOOTSTRAP_SERVERS": bootstrap})
    assert result.exit_code == 0, result.output
    assert [r.value for r in read_topic(bootstrap, topic)] == [b"from env"]


def test_no_bootstrap_is_a_usage_error() -> None:
    result = aioprod("produce", "t", input="x\n")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "aioprod: error: no bootstrap servers: pass -b HOST:PORT or set AIOPROD_BOOTSTRAP_SERVERS"
    )


def test_malformed_header_is_a_usage_error() -> None:
    result = aioprod("produce", "t", "-b", "127.0.0.1:9", "-H", "novalue", input="x\n")
    assert result.exit_code == 2
    assert "--header 'novalue': expected KEY=VALUE" in result.stderr

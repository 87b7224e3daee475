"""``aioprod metadata``: the cluster's brokers, topics, partitions and leaders; creating nothing."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.conftest import aioprod, create_topic, topic_names

pytestmark = pytest.mark.integration


def test_named_topic_shows_every_partition_and_its_leader(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=3)
    result = aioprod("metadata", "-b", bootstrap, "--topic", topic)
    assert result.exit_code == 0, result.output
    port = bootstrap.rsplit(":", 1)[1]
    assert re.search(rf"^\s*\d+\s+\S+\s+{port}\s", result.stdout, re.MULTILINE), result.stdout  # the broker row
    rows = re.findall(rf"^{topic}\s+(\d+)\s+(\d+)\s", result.stdout, re.MULTILINE)
    assert sorted(int(p) for p, _leader in rows) == [0, 1, 2]
    assert "1 topic" in result.stdout


def test_without_topic_lists_the_cluster_topics(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=2)
    result = aioprod("metadata", env={"AIOPROD_BOOTSTRAP_SERVERS": bootstrap})
    assert result.exit_code == 0, result.output
    assert len(re.findall(rf"^{topic}\s", result.stdout, re.MULTILINE)) == 2
    assert "broker" in result.stdout


def test_a_mistyped_topic_is_reported_and_not_created(bootstrap: str, topic: str) -> None:
    """Point 5: a viewing command asks without auto-creation, even on a cluster that auto-creates."""
    typo = topic + "-typo"
    result = aioprod("metadata", "-b", bootstrap, "-t", typo)
    assert result.exit_code == 1
    assert result.stderr == f"aioprod: error: topic {typo!r} does not exist\n"
    assert typo not in topic_names(bootstrap)
    # ...while the producer's own path does create it here (Tansu auto-creates topics).
    assert aioprod("produce", typo, "-b", bootstrap, input="x\n").exit_code == 0
    assert typo in topic_names(bootstrap)


def test_json_output(bootstrap: str, topic: str) -> None:
    """Point 4: --json is one object with brokers, topics and partitions, and the topics in error."""
    create_topic(bootstrap, topic, partitions=2)
    result = aioprod("metadata", "-b", bootstrap, "-t", topic, "-t", topic + "-missing", "--json")
    assert result.exit_code == 1  # one topic does not exist
    report = json.loads(result.stdout)
    assert [b["port"] for b in report["brokers"]] == [int(bootstrap.rsplit(":", 1)[1])]
    assert [t["name"] for t in report["topics"]] == [topic]
    partitions = report["topics"][0]["partitions"]
    assert [p["partition"] for p in partitions] == [0, 1]
    assert all(p["leader"] in [b["id"] for b in report["brokers"]] for p in partitions)
    assert report["errors"][topic + "-missing"]["error"] == "UnknownTopicOrPartitionError"


def test_unreachable_cluster_is_one_line() -> None:
    from tests.brokers import refused_port

    result = aioprod("metadata", "-b", f"127.0.0.1:{refused_port()}", "-X", "max.block.ms=500")
    assert result.exit_code == 1
    # Said at once, then tried again until max.block.ms: one warning, one error.
    warning, error = result.stderr.splitlines()
    assert warning.startswith("aioprod: warning: no bootstrap server answered (KafkaConnectionError: ")
    assert error.startswith("aioprod: error: KafkaTimeoutError: no metadata from the bootstrap servers within 500 ms: ")


@pytest.mark.parametrize(
    ("env", "boxed"),
    [({}, False), ({"TTY_COMPATIBLE": "1"}, True), ({"TTY_COMPATIBLE": "1", "NO_COLOR": "1"}, False)],
    ids=["piped", "terminal", "terminal-no-color"],
)
def test_plain_tables_when_piped_or_no_color(bootstrap: str, topic: str, env: dict[str, str], boxed: bool) -> None:
    """Point 4: boxes and colours only on a terminal that did not ask for NO_COLOR."""
    create_topic(bootstrap, topic, partitions=1)
    result = aioprod("metadata", "-b", bootstrap, "-t", topic, env=env)
    assert result.exit_code == 0, result.output
    assert ("│" in result.stdout) is boxed
    assert ("\x1b[" in result.stdout) is boxed  # colour and style codes
    assert re.search(rf"{topic}\W+0\W+\d+", result.stdout)

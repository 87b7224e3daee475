"""``aioprod metadata``: the tables show the broker, topics, partitions and leaders."""

from __future__ import annotations

import re

import pytest

from tests.cli.conftest import aioprod, create_topic

pytestmark = pytest.mark.integration


def test_named_topic_shows_every_partition_and_its_leader(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=3)
    result = aioprod("metadata", "-b", bootstrap, "--topic", topic)
    assert result.exit_code == 0, result.output
    port = bootstrap.rsplit(":", 1)[1]
    assert re.search(rf"│\s*\d+\s*│\s*\S+\s*│\s*{port}\s*│", result.stdout), result.stdout  # the broker row
    rows = re.findall(rf"│\s*{topic}\s*│\s*(\d+)\s*│\s*(\d+)\s*│", result.stdout)
    assert sorted(int(p) for p, _leader in rows) == [0, 1, 2]
    assert "1 topic" in result.stdout


def test_without_topic_lists_the_cluster_topics(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=2)
    result = aioprod("metadata", env={"AIOPROD_BOOTSTRAP_SERVERS": bootstrap})
    assert result.exit_code == 0, result.output
    assert len(re.findall(rf"│\s*{topic}\s*│", result.stdout)) == 2
    assert "broker" in result.stdout


def test_unreachable_cluster_is_one_line() -> None:
    from aioprod.embedded import free_port

    result = aioprod("metadata", "-b", f"127.0.0.1:{free_port()}", "-X", "max.block.ms=500")
    assert result.exit_code == 1
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("aioprod: error: ")

"""CLI test helpers: run ``aioprod`` in-process with click's CliRunner, make topics."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from click.testing import CliRunner, Result

from aioprod.cli.main import cli

#: The developer's own settings must not leak into the tests.
CLEAN_ENV: dict[str, str | None] = {"AIOPROD_BOOTSTRAP_SERVERS": None, "AIOPROD_DEBUG": None}


def aioprod(*args: str, input: bytes | str | None = None, env: Mapping[str, str | None] | None = None) -> Result:
    """Run ``aioprod ARGS`` in-process; stdout and stderr are kept apart."""
    return CliRunner().invoke(cli, list(args), input=input, env={**CLEAN_ENV, **(env or {})}, catch_exceptions=False)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create a topic with an independent client, so partition tests do not depend on auto-creation."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(30)


@pytest.fixture
def bootstrap(kafka_bootstrap: str) -> str:
    """The suite's broker (Tansu, or the cluster named by AIOPROD_TEST_BOOTSTRAP)."""
    return kafka_bootstrap

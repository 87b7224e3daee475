"""Shared fixtures: brokers started by the suite, unique topics, read-back helpers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.brokers import MockCluster, TansuBroker, docker_available, kafka_container, mock_cluster, tansu


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[TansuBroker]:
    with tansu() as broker:
        yield broker


@pytest.fixture(scope="session", params=["tansu", "kafka-container"])
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """A single-broker cluster: Tansu (or ``AIOPROD_TEST_BOOTSTRAP``), and Apache Kafka in a
    container when ``AIOPROD_TEST_KAFKA_CONTAINER=1`` and a Docker engine answers."""
    if request.param == "kafka-container":
        if os.environ.get("AIOPROD_TEST_KAFKA_CONTAINER") != "1":
            pytest.skip("set AIOPROD_TEST_KAFKA_CONTAINER=1 to also run against Apache Kafka in Docker")
        if not docker_available():
            pytest.skip("AIOPROD_TEST_KAFKA_CONTAINER=1 but no Docker engine answers")
        with kafka_container() as bootstrap:
            yield bootstrap
        return
    external = os.environ.get("AIOPROD_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    yield request.getfixturevalue("tansu_broker").bootstrap


@pytest.fixture(scope="session")
def mock3() -> Iterator[MockCluster]:
    with mock_cluster(3) as cluster:
        yield cluster


@pytest.fixture
def topic() -> str:
    return f"aioprod-{uuid.uuid4().hex[:12]}"

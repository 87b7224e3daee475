"""Shared fixtures: brokers started by the suite, unique topics, read-back helpers."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from tests.brokers import MockCluster, TansuBroker, docker_available, kafka_container, mock_cluster, tansu
from tests.fakes.clock import VirtualClock
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.network import MemoryNetwork


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


@dataclass
class Scripted:
    """A scripted fake cluster on an in-memory network, in virtual time."""

    clock: VirtualClock
    network: MemoryNetwork
    cluster: ScriptedCluster


@pytest.fixture
async def scripted(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> AsyncIterator[Scripted]:
    """Virtual time, an in-memory network in place of TCP, and a one-node ScriptedCluster
    (add nodes with ``cluster.add_node``)."""
    clock = VirtualClock(asyncio.get_running_loop()).install()
    network = MemoryNetwork()
    monkeypatch.setattr(asyncio, "open_connection", network.open_connection)
    state = random.getstate()
    random.seed(request.param if hasattr(request, "param") else 0)  # jitter and node choices repeat
    try:
        yield Scripted(clock, network, ScriptedCluster(network))
    finally:
        random.setstate(state)
        clock.uninstall()

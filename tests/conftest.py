"""Shared fixtures: brokers started by the suite, unique topics, read-back helpers.

Every test that starts a broker is marked ``integration``, so that ``-m "not integration"``
starts none; the guard below enforces it (see ``tests/test_integration_marker.py``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import MockCluster, TansuBroker, docker_available, kafka_container, mock_cluster, tansu
from tests.fakes.clock import VirtualClock
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.network import MemoryNetwork

#: Fixtures that start (or stand for) a real broker.
BROKER_FIXTURES = frozenset({"tansu_broker", "kafka_bootstrap", "mock3"})
#: Set in a test that is not marked integration: the Tansu binary of any process it starts.
GUARD_ENV = "CALF_TANSU_BIN"


def unmarked_broker_message(what: str) -> str:
    return f"{what}, but the test is not marked integration: add @pytest.mark.integration (or pytestmark)"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep what collection built out of the collector's way: every full collection walked the
    imported test modules and libraries again, about a tenth of the suite's CPU time."""
    gc.freeze()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that asks for a broker fixture must be marked integration (checked before setup)."""
    if item.get_closest_marker("integration") is not None:
        return
    used = sorted(BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if used:
        pytest.fail(unmarked_broker_message(f"{item.nodeid} uses the broker fixture {', '.join(used)}"), pytrace=False)


@pytest.fixture(scope="session")
def guard_binary(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A stand-in Tansu binary that leaves a trace and exits 1; (binary, trace file)."""
    directory = tmp_path_factory.mktemp("broker-guard")
    binary, trace = directory / "tansu", directory / "started"
    binary.write_text(f"#!/bin/sh\necho \"$*\" >> '{trace}'\necho 'no broker outside integration tests' >&2\nexit 1\n")
    binary.chmod(0o755)
    return binary, trace


@pytest.fixture(autouse=True)
def no_broker_unless_integration(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, guard_binary: tuple[Path, Path]
) -> Iterator[None]:
    """Outside integration tests, starting a broker fails the test, in this process or a child.

    In-process, ``EmbeddedBroker`` finds no binary and librdkafka's mock cluster is refused;
    a child process (``python -m aioprod.cli smoke``) gets a Tansu binary that only leaves a
    trace, checked after the test.
    """
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    import confluent_kafka

    import aioprod.embedded

    binary, trace = guard_binary
    trace.unlink(missing_ok=True)
    monkeypatch.setattr(aioprod.embedded, "broker_binary", _no_tansu)
    monkeypatch.setattr(confluent_kafka, "Producer", _no_mock_cluster(confluent_kafka.Producer))
    monkeypatch.setenv(GUARD_ENV, str(binary))
    yield
    if trace.exists():
        trace.unlink()
        pytest.fail(unmarked_broker_message("a child process of this test started the Tansu broker"), pytrace=False)


def _no_tansu() -> str:
    pytest.fail(unmarked_broker_message("this test starts the embedded Tansu broker"), pytrace=False)


def _no_mock_cluster(producer_class: Any) -> Any:
    """``confluent_kafka.Producer`` that refuses to start librdkafka's mock cluster."""

    def producer(config: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if "test.mock.num.brokers" in config:
            pytest.fail(unmarked_broker_message("this test starts librdkafka's mock cluster"), pytrace=False)
        return producer_class(config, *args, **kwargs)

    return producer


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


@pytest.hookimpl(optionalhook=True)  # xdist's hook: "-p no:xdist" leaves it unknown, which is no error
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Load balancing, except that the Spark tests run on one worker and the docs site's on one.

    One Spark session (a JVM, about 25 s of CPU to start and warm up) and one site build and
    browser, instead of one per worker: on two cores that is about 15% of the suite's time.
    pytest-xdist's own ``--dist loadgroup`` would do it, but with pytest 9 its group marks are
    silently ignored (it renames ``item._nodeid``, which pytest 9 no longer reads). Only in place
    of ``--dist load`` (what ``-n`` alone gives): another ``--dist`` asked for is xdist's.
    """
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for group in ("tests/spark/", "tests/docs/test_site.py"):
                if nodeid.startswith(group):
                    return group
            return nodeid  # every other test on its own

        def _reschedule(self, node: Any) -> None:
            # A worker runs a test only once it holds the next one, or is told to shut down. The
            # base class tops a worker up by one unit: a one-test unit alone on a worker (the
            # replacement of a crashed worker gets one) waited for ever, and the run with it.
            super()._reschedule(node)
            while node in self.assigned_work and not node.shutting_down:
                if self._pending_of(self.assigned_work[node]) >= 2:
                    break
                if not self.workqueue:
                    node.shutdown()
                    break
                self._assign_work_unit(node)

        def remove_node(self, node: Any) -> str | None:
            # A crashed worker's test is reported as the crash and not run again, as --dist load
            # does: the base class queued it again, and it crashed worker after worker until
            # --max-worker-restart ran out and the run stopped. Its other tests go to the others.
            workload = self.assigned_work.pop(node)
            pending = [(unit, nodeid) for unit in workload.values() for nodeid, done in unit.items() if not done]
            if not pending:
                return None
            unit, crashed = pending[0]
            unit[crashed] = True
            self.workqueue.update((scope, unit) for scope, unit in workload.items() if not all(unit.values()))
            for other in self.nodes:
                self._reschedule(other)
            return crashed

    return Grouped(config, log)

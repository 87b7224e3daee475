"""What an operator sees under faults: log lines rate-limited and prefixed with the producer's
client_id, the identity-reset count, and the partition a failed record's span names
(docs/observability.md)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aioprod import Producer, event_log
from aioprod.errors import MessageTooLargeError
from aioprod.event_log import EventLog
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.engine.test_cluster_replaced import name_cluster
from tests.engine.test_tracing import Otel, otel  # noqa: F401  (the fixture)
from tests.fakes.cluster import ScriptedCluster


# A metadata answer naming a partition id outside the topic's range is logged at WARNING on
async def test_a_bad_partition_id_is_one_warning_per_interval_naming_the_producer(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aioprod")
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 2)
    cluster.partition("t", 1).leader = -1  # leaderless for a while: refreshes come often
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)  # type: ignore[arg-type]
        for topic in response.topics:
            if topic.name == "t":
                topic.partitions.append(m.MetadataResponsePartition(0, 7, 1, 0, [1], [1], []))
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)
    async with Producer(bootstrap_servers=cluster.bootstrap, client_id="orders", linger_ms=0) as p:
        future = await p.send("t", b"x", partition=1)
        await clock.advance(30)
        cluster.partition("t", 1).leader = 1
        await future
    lines = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "partition ids 7 " in r.getMessage()
    ]
    assert lines and all(line.startswith("[orders] ") for line in lines), lines[:2]
    assert len(lines) <= 2, f"{len(lines)} WARNINGs in 30 s for one broken answer"


# A broker in a crash loop (refusing, then accepting and dropping) is one WARNING per 30 s per
async def test_a_crash_looping_broker_is_not_a_warning_per_flip(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aioprod")
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, delivery_timeout_ms=600_000, reconnect_backoff_max_ms=200
    ) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].stalling = True  # a record stays in flight: the producer keeps reconnecting
        future = await p.send("t", b"x")
        for _ in range(30):  # down 1 s, up 1 s, for a minute
            cluster.stop(1)
            await clock.advance(1)
            cluster.start(1)
            await clock.advance(1)
        cluster.nodes[1].release()
        await future
    refused = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and r.getMessage().startswith("[aioprod] broker 1 ")
        and "refused" in r.getMessage()
    ]
    # One minute, one reason: the first, and at most one more per 30 s.
    assert len(refused) <= 3, f"{len(refused)} WARNINGs for one crash-looping broker in 60 s"


# docs/observability.md: the send span carries messaging.destination.partition.id "the partition
async def test_a_failed_record_span_names_its_partition(scripted: Scripted, otel: Otel) -> None:  # noqa: F811
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 100
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, telemetry=otel.telemetry) as p:
        with pytest.raises(MessageTooLargeError):
            await p.send_and_wait("t", b"x" * 500)
    (span,) = otel.finished()
    assert span.attributes is not None and span.attributes["error.type"] == "aioprod.errors.MessageTooLargeError"
    assert span.attributes.get("messaging.destination.partition.id") == "0"


# producer-id-reset-total ("New producer identities taken after the first", docs/observability.md)
async def test_a_new_id_from_a_new_cluster_counts_as_an_identity_reset(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"a")
        cluster_id["now"] = "cluster-B"
        await asyncio.sleep(2)
        await p.send_and_wait("t", b"b")
        resets = p.metrics()["producer-id-reset-total"]
    init = [r for r in cluster.requests if r.api_key == m.InitProducerIdRequest.API_KEY]
    assert len(init) == 2  # a second identity was taken
    assert resets == 1


# docs/observability.md ("Logs"): "each line starting with the producer's [client_id]". Several
async def test_a_close_losing_records_names_the_producer(scripted: Scripted, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aioprod")
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, client_id="audit", linger_ms=0):
        p = Producer(bootstrap_servers=cluster.bootstrap, client_id="orders", linger_ms=0)
        await p.start()
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].holding = True
        future = await p.send("t", b"x")
        await p.close(timeout=0.5)
        await asyncio.gather(future, return_exceptions=True)
        cluster.nodes[1].release()
    (line,) = [r.getMessage() for r in caplog.records if "not acknowledged" in r.getMessage()]
    assert line.startswith("[orders] "), line


async def test_a_cluster_id_change_names_the_producer(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aioprod")
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, client_id="orders", linger_ms=0, metadata_max_age_ms=1000
    ) as p:
        await p.send_and_wait("t", b"a")
        cluster_id["now"] = "cluster-B"
        await asyncio.sleep(2)
        await p.send_and_wait("t", b"b")
    (line,) = [r.getMessage() for r in caplog.records if "taking a new producer id" in r.getMessage()]
    assert line.startswith("[orders] "), line


# f025f03: EventLog.resolved() of a problem that came back within the interval of its last
# warning (so was not logged again) deletes the entry silently once that warning is older than the
# interval: the second outage is in no line at all -- neither a warning, nor its end, nor the
# '(N more ...)' count the next warning would have carried.
def test_an_outage_within_the_interval_is_counted_somewhere(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    now = {"t": 0.0}
    monkeypatch.setattr(event_log, "_now", lambda: now["t"])
    log = logging.getLogger("aioprod.test")
    events = EventLog("c", interval=30.0)
    events.problem(log, ("connect", 1), "refused", "broker 1 refused")  # WARNING
    now["t"] = 1.0
    assert events.resolved(log, ("connect", 1), "broker 1 back")  # INFO
    now["t"] = 29.0
    events.problem(log, ("connect", 1), "refused", "broker 1 refused")  # suppressed (within 30 s)
    now["t"] = 31.0
    events.resolved(log, ("connect", 1), "broker 1 back")  # silent, entry deleted
    now["t"] = 40.0
    events.problem(log, ("connect", 1), "refused", "broker 1 refused")  # a new entry: no count
    lines = [r.getMessage() for r in caplog.records]
    assert any("1 more" in line for line in lines), lines

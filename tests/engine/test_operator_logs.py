"""What operators see in the log: each problem at WARNING once, promptly, naming the broker
and the reason, then rate-limited; recovery at INFO; never a secret. In virtual time."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque

import pytest

from aioprod import Producer
from aioprod.errors import (
    CoordinatorLoadInProgressError,
    KafkaTimeoutError,
    NotLeaderOrFollowerError,
    UnknownProducerIdError,
)
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.network import ServerSide

NOT_LEADER = NotLeaderOrFollowerError.code


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="aioprod")
    return caplog


def lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


async def test_a_refused_connection_is_one_prompt_warning_and_its_recovery_an_info(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    cluster.stop(1)  # nothing listens: every connection is refused
    async with Producer(
        bootstrap_servers=cluster.bootstrap, client_id="orders-svc", max_block_ms=20_000, reconnect_backoff_max_ms=500
    ) as p:
        sending = asyncio.ensure_future(p.send_and_wait("t", b"v"))
        await clock.advance(0.1)
        assert not sending.done()  # still within max_block_ms, and the operator already knows
        refused = lines(logs, logging.WARNING, "refused")
        assert len(refused) == 1
        assert refused[0].startswith("[orders-svc] bootstrap server 1 (127.0.0.1:9091): connection refused")
        await clock.advance(10)  # ~20 more attempts in 10 s: no more lines (rate-limited)
        assert len(lines(logs, logging.WARNING, "refused")) == 1
        cluster.start(1)
        await sending
        recovered = lines(logs, logging.INFO, "connected to bootstrap server 1")
        assert len(recovered) == 1 and "failed attempts" in recovered[0]


async def test_a_failed_handshake_is_a_warning_naming_the_broker(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    class HangsUp:
        """A FAKE listener that accepts, then closes before answering ApiVersions."""

        def accept(self, side: ServerSide) -> None:
            side.close()

    scripted.network.listen("127.0.0.1", 9999, HangsUp())
    async with Producer(bootstrap_servers="127.0.0.1:9999", max_block_ms=1000) as p:
        with pytest.raises(KafkaTimeoutError):
            await p.send("t", b"v")
    warnings = lines(logs, logging.WARNING, "handshake")
    assert len(warnings) == 1
    assert "bootstrap server 1 (127.0.0.1:9999)" in warnings[0]


async def test_credentials_never_reach_the_log(scripted: Scripted, logs: pytest.LogCaptureFixture) -> None:
    scripted.cluster.stop(1)
    async with Producer(
        bootstrap_servers=scripted.cluster.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="svc",
        sasl_password="hunter2-do-not-log",
        max_block_ms=500,
    ) as p:
        with pytest.raises(KafkaTimeoutError):
            await p.send("t", b"v")
    assert lines(logs, logging.WARNING, "refused")
    assert not any("hunter2" in r.getMessage() for r in logs.records)


async def test_a_partition_without_leader_is_a_warning_then_an_info(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", [1, 1])
    cluster.partition("t", 1).leader = -1  # an election under way
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=30_000) as p:
        fut = await p.send("t", b"v", partition=1)
        leaderless = lines(logs, logging.WARNING, "no leader")
        assert len(leaderless) == 1
        assert "metadata from bootstrap server 1: topic 't' partition(s) 1 have no leader" in leaderless[0]
        assert "LEADER_NOT_AVAILABLE" in leaderless[0]
        await clock.advance(2)  # refreshes keep finding no leader: no new line
        assert len(lines(logs, logging.WARNING, "no leader")) == 1
        cluster.move_leader("t", 1, 1)
        await fut
    assert len(lines(logs, logging.INFO, "every partition has a leader again")) == 1


async def test_a_missing_topic_is_a_warning_from_the_second_answer(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap, max_block_ms=2000) as p:
        with pytest.raises(KafkaTimeoutError):
            await p.send("nope", b"v")
    missing = lines(logs, logging.WARNING, "UNKNOWN_TOPIC_OR_PARTITION")
    assert len(missing) == 1 and "topic 'nope'" in missing[0]


async def test_a_retry_storm_is_one_warning_per_interval(scripted: Scripted, logs: pytest.LogCaptureFixture) -> None:
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100, retry_backoff_max_ms=100
    ) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([NOT_LEADER] * 400)  # ~40 s of refusals, 10 a second
        await p.send_and_wait("t", b"v")
        retries = p.metrics()["record-retry-total"]
        assert not lines(logs, logging.INFO, "acknowledged again")  # not over until quiet for 30 s
        await clock.advance(30)
        await p.send_and_wait("t", b"w")
    assert retries == 400
    warnings = lines(logs, logging.WARNING, "retrying")
    assert len(warnings) == 2  # at once, then 30 s later saying how many there were meanwhile
    assert "to broker 1: NOT_LEADER_OR_FOLLOWER" in warnings[0]
    assert "more since the last warning" in warnings[1]
    assert clock.now > 30
    # Its end is said, with the retries since the last warning (they were reported an hour late,
    # on the next unrelated warning).
    (ended,) = lines(logs, logging.INFO, "acknowledged again")
    assert "records retried from broker 1 are acknowledged again" in ended
    between, after = (int(re.search(r"\((\d+) more", line).group(1)) for line in (warnings[1], ended))  # type: ignore[union-attr]
    assert 1 + between + 1 + after == retries  # every retry told, none late


async def test_a_broker_refusing_each_record_once_is_not_a_warning_per_record(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    # Each acknowledgement ended the warning at once, so the next retry warned again: a WARNING
    # and an INFO line per record.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10) as p:
        for i in range(20):
            cluster.nodes[1].script = deque([NOT_LEADER])
            await p.send_and_wait("t", b"%d" % i)
    assert len(lines(logs, logging.WARNING, "retrying")) == 1
    assert lines(logs, logging.INFO, "acknowledged again") == []


async def test_a_reason_that_flips_back_and_forth_is_still_one_warning_per_interval_each(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    # A broker in a crash loop refuses, then accepts and drops: every change of reason was a
    # new warning, one per attempt.
    from aioprod.event_log import EventLog

    events, log = EventLog("c"), logging.getLogger("aioprod.test")
    for attempt in range(60):  # one attempt a second for a minute
        reason = "refused" if attempt % 2 else "dropped"
        events.problem(log, ("connect", 1), reason, "broker 1: %s", reason)
        await scripted.clock.advance(1)
    warnings = lines(logs, logging.WARNING, "broker 1")
    assert warnings[:2] == ["[c] broker 1: dropped", "[c] broker 1: refused"]
    assert len(warnings) == 4  # each reason again after 30 s


async def test_a_new_producer_identity_is_a_warning_with_its_reason(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"a")
        cluster.nodes[1].script = deque([UnknownProducerIdError.code])
        await p.send_and_wait("t", b"b")
        resets = p.metrics()["producer-id-reset-total"]
    assert resets == 1
    warnings = lines(logs, logging.WARNING, "new producer identity")
    assert len(warnings) == 1
    assert "broker 1 does not continue the sequence of t-0" in warnings[0]
    assert "UNKNOWN_PRODUCER_ID" in warnings[0]


async def test_new_producer_identities_across_partitions_are_one_warning_per_interval(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    # The warning's reason was its whole text, which names the partition: a broker refusing each
    # partition's sequence (UNKNOWN_PRODUCER_ID, a fault that lasts) was one WARNING per partition.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 20)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=10) as p:
        await p.partitions_for("t")
        start = clock.now
        for partition in range(20):
            cluster.nodes[1].script = deque([UnknownProducerIdError.code])
            await p.send_and_wait("t", b"v", partition=partition)
        assert clock.now - start < 30
        await clock.advance(30)
        cluster.nodes[1].script = deque([UnknownProducerIdError.code])
        await p.send_and_wait("t", b"w", partition=0)
        resets = p.metrics()["producer-id-reset-total"]
    assert resets == 21
    warnings = lines(logs, logging.WARNING, "new producer identity")
    assert len(warnings) == 2  # at once, then 30 s later with the count meanwhile
    assert "does not continue the sequence of t-0" in warnings[0]
    assert "(19 more since the last warning)" in warnings[1]


async def test_connection_set_up_is_info(scripted: Scripted, logs: pytest.LogCaptureFixture) -> None:
    scripted.cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=scripted.cluster.bootstrap) as p:
        await p.send_and_wait("t", b"v")
    assert lines(logs, logging.INFO, "connected to broker 1 at 127.0.0.1:9091")
    assert not [r for r in logs.records if r.levelno >= logging.WARNING]


async def test_every_line_a_producer_logs_names_it_at_every_level(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    # With two producers in one process, a DEBUG line about a retry, a closed connection or a
    # transaction, or the configuration's note, said nothing of whose it was.
    caplog.set_level(logging.DEBUG, logger="aioprod")
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    Producer(bootstrap_servers=cluster.bootstrap, client_id="orders-svc", acks=1)  # idempotence turned off
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        client_id="orders-svc",
        transactional_id="orders-1",
        linger_ms=0,
        retry_backoff_ms=10,
        max_block_ms=1000,
    ) as p:
        p.begin_transaction()
        cluster.nodes[1].script = deque([NOT_LEADER] * 3)
        await p.send_and_wait("t", b"v")
        cluster.disconnect(1)
        await p.send_and_wait("t", b"w")
        await p.commit_transaction()
        p.begin_transaction()  # left open: the close aborts it
        with pytest.raises(KafkaTimeoutError):
            await p.send("no-such-topic", b"x")
    by_producer = [r for r in caplog.records if r.name.startswith("aioprod.")]
    assert {"aioprod.config", "aioprod.net.pool", "aioprod.producer.transactions"} <= {r.name for r in by_producer}
    assert [r.getMessage() for r in by_producer if not r.getMessage().startswith("[orders-svc] ")] == []


async def test_a_recovery_is_said_once_and_a_client_id_with_a_percent_sign_is_text(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    # The producer's [client_id] starts every line's format string: a "%" in it must stay text.
    # Once a broker's refusals ended (one INFO line), a later reconnection within the interval,
    # with no refusal between, is no recovery to announce again.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, client_id="50%-off", max_block_ms=20_000, reconnect_backoff_max_ms=500
    ) as p:
        await p.send_and_wait("t", b"v")
        cluster.stop(1)  # the broker goes: its connection is cut, new ones refused
        sending = asyncio.ensure_future(p.send_and_wait("t", b"w"))
        await clock.advance(1.0)
        cluster.start(1)
        await sending
        cluster.disconnect(1)  # the broker drops the connection; the next one is accepted
        await clock.advance(1.0)
        await p.send_and_wait("t", b"x")
    refused = lines(logs, logging.WARNING, "refused")
    assert refused and all(line.startswith("[50%-off] ") for line in refused)
    recovered = lines(logs, logging.INFO, "failed attempts")
    assert len(recovered) == 1 and recovered[0].startswith("[50%-off] connected to broker 1")


async def test_one_brokers_retries_ending_leaves_another_brokers_retries_as_they_were(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    from aioprod.event_log import EventLog

    events, log = EventLog("c"), logging.getLogger("aioprod.test")
    for node in (1, 2):
        events.problem(log, ("retry", node, "NotLeaderOrFollowerError"), "", "retrying from broker %d", node)
    events.resolved_all(log, ("retry", 1), "broker 1 acknowledged again")
    await scripted.clock.advance(1)
    events.problem(log, ("retry", 2, "NotLeaderOrFollowerError"), "", "retrying from broker %d", 2)  # rate-limited
    events.resolved_all(log, ("retry", 2), "broker 2 acknowledged again")
    assert lines(logs, logging.WARNING, "retrying from broker 2") == ["[c] retrying from broker 2"]
    assert lines(logs, logging.INFO, "acknowledged again") == [
        "[c] broker 1 acknowledged again",
        "[c] broker 2 acknowledged again (1 more after the last warning)",
    ]


async def test_a_transaction_close_could_not_abort_is_a_warning_naming_the_producer(
    scripted: Scripted, logs: pytest.LogCaptureFixture
) -> None:
    # The one WARNING the producer's close() logs itself went to the module's logger as it was:
    # no [client_id], so with two transactional producers in a process, whose transaction?
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    p = Producer(bootstrap_servers=cluster.bootstrap, transactional_id="tx", client_id="orders", linger_ms=0)
    await p.start()
    p.begin_transaction()
    await (await p.send("t", b"v"))
    cluster.coordinator.script[m.EndTxnRequest.API_KEY] = deque([CoordinatorLoadInProgressError.code] * 1000)
    await p.close(timeout=1)
    (warning,) = [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING]
    assert warning == "[orders] could not abort transaction 'tx' while closing: TimeoutError()"

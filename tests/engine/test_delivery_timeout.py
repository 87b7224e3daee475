"""Every record's future resolves within delivery_timeout_ms, wherever its batch is."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from aioprod import Producer
from aioprod.errors import (
    CoordinatorLoadInProgressError,
    DeliveryTimeoutError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)
from tests.conftest import Scripted
from tests.fakes.cluster import Hold


async def test_a_batch_in_flight_expires_at_its_delivery_deadline(scripted: Scripted) -> None:
    # The first attempt is refused, the retry is written but never answered. The record
    # must fail at its deadline (1.2 s after it was queued), as possibly persisted, not
    # when the retry's request times out later.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        request_timeout_ms=1000,
        delivery_timeout_ms=1200,
        retry_backoff_ms=100,
    ) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.nodes[1].script = deque([NotLeaderOrFollowerError.code, Hold])
        cluster.nodes[1].delay = 0.3
        queued_at = clock.now
        fut = await p.send("t", b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
        failed_at = clock.now
        cluster.nodes[1].delay = 0
        cluster.nodes[1].release()
    assert info.value.possibly_persisted is True
    assert failed_at - queued_at == pytest.approx(1.2, abs=0.002)


async def test_records_expire_while_no_producer_id_can_be_had(scripted: Scripted) -> None:
    # InitProducerId keeps answering "coordinator loading": nothing can be sent, but the
    # record still fails at its deadline, and close() does not wait on the producer id.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    cluster.init_script = deque([CoordinatorLoadInProgressError.code] * 10_000)
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, request_timeout_ms=500, delivery_timeout_ms=1000)
    await p.start()
    try:
        queued_at = clock.now
        fut = await p.send("t", b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
        failed_at = clock.now
    finally:
        closing_at = clock.now
        await p.close()
        closed_at = clock.now
    assert info.value.possibly_persisted is False
    assert failed_at - queued_at == pytest.approx(1.0, abs=0.002)
    assert closed_at - closing_at < 0.1
    assert cluster.partition("t").values == []


async def test_a_record_for_a_throttled_leader_expires_at_its_delivery_timeout(scripted: Scripted) -> None:
    # The sender sleeps until the leader's throttle ends (KIP-219); a batch started meanwhile
    # did not wake it, so its record failed when the throttle ended (200 s), not at 30 s.
    cluster, clock = scripted.cluster, scripted.clock
    cluster.create_topic("t", 1)
    cluster.nodes[1].throttle_ms = 200_000
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, request_timeout_ms=5_000, delivery_timeout_ms=30_000
    ) as p:
        await (await p.send("t", b"first"))  # its answer throttles the leader
        await asyncio.sleep(0.01)  # virtual time: passes once the sender sleeps until the throttle ends
        started = clock.now
        late = await p.send("t", b"second")
        with pytest.raises(DeliveryTimeoutError):
            await late
        waited = clock.now - started
    assert 29 < waited < 31


async def test_a_record_refused_until_its_delivery_timeout_does_not_say_it_was_not_sent(scripted: Scripted) -> None:
    # Every attempt is refused before the append (NOT_ENOUGH_REPLICAS) until the delivery timeout:
    # the error said "not sent", hiding the four attempts and why the broker refused them.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        request_timeout_ms=500,
        delivery_timeout_ms=1000,
        retry_backoff_ms=100,
        retry_backoff_max_ms=100,
    ) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([NotEnoughReplicasError.code] * 100)
        fut = await p.send("t", b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
    assert info.value.possibly_persisted is False
    assert "not sent" not in str(info.value)
    assert "not written: sent" in str(info.value) and "NotEnoughReplicasError" in str(info.value), info.value
    assert cluster.partition("t").values == []

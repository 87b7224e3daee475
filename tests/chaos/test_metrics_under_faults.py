"""Retries the fault proxy forces show in the metrics, and the log says what happened."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aioprod import Producer
from tests.brokers import TansuBroker
from tests.chaos.proxy import FaultProxy
from tests.readback import read_topic

pytestmark = pytest.mark.integration


async def test_a_request_cut_on_the_wire_is_one_retry_in_the_metrics(
    proxied_broker: tuple[TansuBroker, FaultProxy], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    broker, proxy = proxied_broker
    async with Producer(bootstrap_servers=f"127.0.0.1:{proxy.port}", linger_ms=0) as p:
        await p.send_and_wait(topic, b"warm-up")  # connections, metadata and producer id in place
        before = p.metrics()
        # The next bytes any connection sends (the produce request) are dropped with the line.
        proxy.cut_after_bytes, proxy.byte_cuts_left = 0, 1
        await p.send_and_wait(topic, b"cut-then-retried")
        after, topics = p.metrics(), p.metrics_snapshot().topics
    assert proxy.connections_cut == 1
    assert after["record-retry-total"] == before["record-retry-total"] + 1 == 1
    assert topics[topic]["record-retry-total"] == 1
    assert after["record-send-total"] == 3  # the warm-up, the cut attempt and its retry
    assert after["record-error-total"] == 0
    assert after["connection-close-total"] >= 1
    assert after["connection-creation-total"] > before["connection-creation-total"]
    retried = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "retrying" in r.getMessage()]
    assert len(retried) == 1 and f"retrying 1 record(s) of {topic}-" in retried[0]
    consumed = await asyncio.to_thread(read_topic, broker.bootstrap, topic)  # the proxy runs on this loop
    assert sorted(c.value for c in consumed) == [b"cut-then-retried", b"warm-up"]

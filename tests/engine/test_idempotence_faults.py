"""Idempotence under faults: nothing acknowledged is written twice, order per partition holds."""

from __future__ import annotations

from collections import deque

import pytest

from aioprod import Producer
from aioprod.errors import InvalidRecordError
from tests.conftest import Scripted
from tests.fakes.cluster import Hold


async def test_a_batch_in_doubt_keeps_its_identity_when_another_partition_fails(scripted: Scripted) -> None:
    # B1 (partition 0, node 1) is written but its answer never comes: the request times
    # out and B1 is retried. Meanwhile C1 (partition 1, node 2) fails for good, which puts
    # partition 1's sequence in doubt. B1's retry must keep its producer id and sequence
    # so the broker recognises it; re-stamped under a new identity it would land twice.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(
        bootstrap_servers=cluster.bootstrap, linger_ms=0, request_timeout_ms=1000, retry_backoff_ms=10
    ) as p:
        await p.send_and_wait("t", b"A0", partition=0)  # both brokers connected, identity taken
        await p.send_and_wait("t", b"A1", partition=1)
        cluster.nodes[1].script = deque([Hold])
        cluster.nodes[2].script = deque([InvalidRecordError.code])
        b1 = await p.send("t", b"B1", partition=0)
        c1 = await p.send("t", b"C1", partition=1)
        with pytest.raises(InvalidRecordError):
            await c1
        md = await b1
        after = await p.send_and_wait("t", b"B2", partition=0)
    assert cluster.partition("t", 0).values == [b"A0", b"B1", b"B2"]
    assert (md.offset, after.offset) == (1, 2)

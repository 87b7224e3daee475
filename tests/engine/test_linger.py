"""When a lingering batch goes, in virtual time on the scripted cluster."""

from __future__ import annotations

import asyncio

from aioprod import Producer
from aioprod.protocol.messages import ProduceRequest
from tests.conftest import Scripted


async def test_a_record_sent_in_the_tick_the_linger_ends_goes_with_that_batch(scripted: Scripted) -> None:
    # A caller pacing its sends wakes from its own timer in the same tick as the sender's
    # linger timer. Had the sender's round run first, the paced record would have started a
    # new batch and waited a whole linger more.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, enable_idempotence=False) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await scripted.clock.advance_to_whole_millisecond()
        start = scripted.clock.now
        first = await p.send("t", b"first", partition=0)
        await asyncio.sleep(start + 0.005 - scripted.clock.now)
        second = await p.send("t", b"second", partition=0)
        sent_at = scripted.clock.now
        assert (await first).offset + 1 == (await second).offset
    produce = cluster.requests_of(ProduceRequest)
    assert len(produce) == 2  # the warm-up, then one request with both records
    assert produce[-1].at == sent_at == start + 0.005

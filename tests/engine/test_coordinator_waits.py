"""A request any broker can answer (a coordinator look-up) while every connection is at its
in-flight limit: it waits for a place, without spinning, and a deadline running out meanwhile
says why. (Scripted cluster, virtual time.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import KafkaTimeoutError
from tests.conftest import Scripted
from tests.fakes.cluster import FakeNode


@contextlib.asynccontextmanager
async def the_only_place_in_flight_taken(
    scripted: Scripted, **options: Any
) -> AsyncIterator[tuple[Producer, FakeNode]]:
    """A producer whose one connection has its one place in flight taken by a produce request
    whose answer the broker holds (until the node is released)."""
    cluster = scripted.cluster
    cluster.create_topic("t", leaders=[1])
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        max_in_flight_requests_per_connection=1,
        enable_idempotence=False,
        linger_ms=0,
        **options,
    ) as p:
        await p._committed_offsets("warm-up")  # metadata known, node 1 connected
        node = cluster.nodes[1]
        node.holding = True
        record = await p.send("t", b"held", partition=0)
        await asyncio.sleep(0.01)  # virtual: on the wire, its answer held
        yield p, node
        node.release()
        await record


async def test_a_lookup_waiting_for_room_does_not_spin(scripted: Scripted) -> None:
    """reconnect_backoff_ms=0 is allowed (as Java's); it made each wait for a place time out at
    once, a busy loop polling least_loaded_node()."""
    async with the_only_place_in_flight_taken(scripted, reconnect_backoff_ms=0) as (p, node):
        metadata = p._metadata
        real = metadata.least_loaded_node
        calls = 0
        stuck_at = scripted.clock.now

        def counting() -> int | None:
            nonlocal calls
            calls += 1
            if calls == 10_000:  # the virtual clock never moved: release, or it spins forever
                node.release()
            return real()

        metadata.least_loaded_node = counting  # type: ignore[method-assign]
        asyncio.get_running_loop().call_later(1.0, node.release)  # the answer comes 1 s later
        await p._committed_offsets("g")
        waited = scripted.clock.now - stuck_at
        # A look every 10 ms at most during that second.
        assert calls <= 200, f"{calls} calls of least_loaded_node in {waited * 1000:.1f} virtual ms"


async def test_a_lookup_that_never_got_a_place_in_flight_says_so(scripted: Scripted) -> None:
    async with the_only_place_in_flight_taken(scripted, max_block_ms=2000, request_timeout_ms=30_000) as (p, _):
        with pytest.raises(KafkaTimeoutError) as info:
            await p._committed_offsets("g")
    message = str(info.value)
    assert "did not complete within max_block_ms" in message
    assert message.endswith(
        "the last answer: no broker can take a request now: every connection is at its in-flight limit or backing off"
    )

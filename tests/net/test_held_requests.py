"""Requests a connection holds while it re-authenticates (KIP-368), then writes out."""

from __future__ import annotations

import asyncio

import pytest

from aioprod import Producer
from aioprod.errors import UnsupportedVersionError
from aioprod.protocol import messages as m
from tests.conftest import Scripted


async def test_a_held_request_that_cannot_be_encoded_fails_alone(scripted: Scripted) -> None:
    # Writing the held requests out raised at the first that could not be encoded (a field
    # the broker's version lacks): it and every request behind it waited for good.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.versions[m.OffsetFetchRequest.API_KEY] = (0, 6)  # a broker before Kafka 2.5
    async with Producer(bootstrap_servers=cluster.bootstrap) as p:
        await p.partitions_for("t")
        conn = await p._pool.get(1)
        conn.hold()  # as a re-authentication does
        group = [m.OffsetFetchRequestGroup(group_id="g", topics=None)]
        stable = asyncio.ensure_future(
            conn.send(m.OffsetFetchRequest(group_id="g", topics=None, groups=group, require_stable=True))
        )
        behind = asyncio.ensure_future(conn.send(m.MetadataRequest(topics=[])))
        await asyncio.sleep(0)
        conn.release()
        with pytest.raises(UnsupportedVersionError, match="require_stable"):
            await stable
        assert isinstance(await behind, m.MetadataResponse)

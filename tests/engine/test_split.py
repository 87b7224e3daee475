"""A batch the broker finds too large is split and sent again; only a record that is
itself too large fails."""

from __future__ import annotations

import asyncio

import pytest

from aioprod import Producer
from aioprod.errors import MessageTooLargeError
from aioprod.protocol.messages import InitProducerIdRequest
from tests.conftest import Scripted


async def test_a_batch_too_large_for_the_broker_is_split_and_every_record_delivered(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 2000  # the topic's max.message.bytes
    values = [b"%02d" % i + b"x" * 398 for i in range(12)]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100, batch_size=16384) as p:
        await p.partitions_for("t")
        futures = [await p.send("t", v) for v in values]
        metadata = await asyncio.gather(*futures)
        inits = len(cluster.requests_of(InitProducerIdRequest))
    assert cluster.partition("t").values == values
    assert [md.offset for md in metadata] == list(range(12))
    assert inits == 1  # a split is not a sequence gap: no new identity


async def test_only_a_record_larger_than_the_broker_allows_fails(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 2000
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100) as p:
        await p.partitions_for("t")
        small_before = await p.send("t", b"a" * 100)
        huge = await p.send("t", b"h" * 3000)
        small_after = await p.send("t", b"b" * 100)
        with pytest.raises(MessageTooLargeError):
            await huge
        await asyncio.gather(small_before, small_after)
    assert cluster.partition("t").values == [b"a" * 100, b"b" * 100]

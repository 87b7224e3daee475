"""The metadata refresher's lifecycle, without a broker."""

from __future__ import annotations

import asyncio
import uuid

from aioprod.cluster.metadata import Broker, Metadata
from aioprod.config import ProducerConfig
from aioprod.net.pool import ConnectionPool
from aioprod.protocol.messages import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)


async def test_refresher_stops_when_an_update_is_due_at_the_same_moment() -> None:
    # A connection that drops as the producer closes asks for a metadata update in the loop
    # iteration in which close() cancels the refresher. Python 3.11's wait_for dropped that
    # cancellation, and close() hung for metadata.max.age.ms (found by the chaos tests).
    config = ProducerConfig.from_options(bootstrap_servers="127.0.0.1:1", metadata_max_age_ms=600_000)
    pool = ConnectionPool(config)
    metadata = Metadata(config, pool)
    metadata.start()
    await asyncio.sleep(0)  # the refresher now waits for a reason to refresh
    metadata.request_update()
    closing = asyncio.ensure_future(metadata.close())
    done, _ = await asyncio.wait([closing], timeout=60)  # a hang lasts the 10-minute max age
    assert done, "close() hung: the refresher lost its cancellation"
    await pool.close()


def _part(index: int, leader: int) -> MetadataResponsePartition:
    return MetadataResponsePartition(0, index, leader, 3, [leader], [leader], [])


async def test_a_broker_named_by_a_hint_makes_its_partitions_of_other_topics_available() -> None:
    config = ProducerConfig.from_options(bootstrap_servers="127.0.0.1:1")
    pool = ConnectionPool(config)
    metadata = Metadata(config, pool)
    try:
        metadata.touch("a")
        metadata.touch("b")
        metadata._apply(
            MetadataResponse(
                0,
                [MetadataResponseBroker(1, "127.0.0.1", 9091)],  # broker 7 not (yet) listed
                None,
                1,
                [
                    MetadataResponseTopic(0, "a", uuid.uuid4(), False, [_part(0, 1)]),
                    MetadataResponseTopic(0, "b", uuid.uuid4(), False, [_part(0, 1), _part(1, 7)]),
                ],
            )
        )
        assert metadata.snapshot.topics["b"].available_partitions == (0,)
        # A produce answer for a-0 names broker 7 as its new leader, with its address.
        assert metadata.update_leader("a", 0, 7, 4, Broker(7, "127.0.0.1", 9097))
        snap = metadata.snapshot
        assert snap.leader_for("b", 1) == 7
        # As Java's MetadataSnapshot.mergeWith: b-1 stayed unavailable to keyless records until a
        # refresh (metadata_max_age_ms, nothing else asks for one) though the snapshot named its leader.
        assert snap.topics["b"].available_partitions == (0, 1)
    finally:
        await pool.close()

"""The metadata refresher's lifecycle, without a broker."""

from __future__ import annotations

import asyncio

from aioprod.cluster.metadata import Metadata
from aioprod.config import ProducerConfig
from aioprod.net.pool import ConnectionPool


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

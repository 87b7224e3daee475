from __future__ import annotations

from aioprod import Producer
from tests.conftest import Scripted


async def test_producer_runs_on_the_scripted_cluster(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    start = scripted.clock.now
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        md = await p.send_and_wait("t", b"hello", partition=1)
        assert md.offset == 0
        await scripted.clock.advance(10)
    assert cluster.partition("t", 1).values == [b"hello"]
    assert scripted.clock.now - start >= 10

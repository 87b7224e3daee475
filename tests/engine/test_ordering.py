"""Order per partition, and fairness between partitions."""

from __future__ import annotations

import asyncio

import pytest

from aioprod import Producer
from aioprod._compiled import speedups
from aioprod.protocol.messages import ProduceRequest
from tests.conftest import Scripted


@pytest.mark.parametrize("flushing", [False, True])
async def test_one_in_flight_keeps_order_when_the_leader_moves(scripted: Scripted, flushing: bool) -> None:
    # Without idempotence, max_in_flight_requests_per_connection=1 promises order. The
    # first batch is in flight to the old leader when the leader moves; the second must
    # not overtake it on the new leader's connection. Also when a flush() waits, which sends
    # a batch without waiting for anything else (its linger, its partition's answer).
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", leaders=[1, 2])
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        enable_idempotence=False,
        max_in_flight_requests_per_connection=1,
        linger_ms=0,
        retry_backoff_ms=10,
        metadata_max_age_ms=1000,
    ) as p:
        await p.send_and_wait("t", b"warm-up", partition=0)
        await p.send_and_wait("t", b"warm-up", partition=1)  # node 2 connected and idle
        cluster.nodes[1].stalling = True
        first = await p.send("t", b"first", partition=0)
        await asyncio.sleep(0.01)
        cluster.move_leader("t", 0, 2)
        second = await p.send("t", b"second", partition=0)
        flush = asyncio.ensure_future(p.flush()) if flushing else None
        await asyncio.sleep(2)  # a periodic refresh shows node 2 as the leader
        cluster.nodes[1].release()  # node 1 looks at "first" now: it no longer leads
        await asyncio.gather(first, second, *([flush] if flush is not None else []))
    assert cluster.partition("t").values == [b"warm-up", b"first", b"second"]


async def test_every_partition_is_drained_within_a_fair_number_of_requests(scripted: Scripted) -> None:
    # 200 partitions on one broker, each with four batches waiting; a request takes about
    # 27 batches. Each partition must be served at least once every 8 requests.
    cluster = scripted.cluster
    partitions = 200
    cluster.create_topic("t", partitions)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        batch_size=200,  # one 150-byte record per batch
        max_request_size=6000,
        max_in_flight_requests_per_connection=1,
    ) as p:
        await p.partitions_for("t")
        cluster.nodes[1].stalling = True  # the first request waits until everything is queued
        futures = [await p.send("t", b"v" * 150, partition=i % partitions) for i in range(partitions * 4)]
        cluster.nodes[1].release()
        await asyncio.gather(*futures)
    produce = [r.body for r in cluster.requests_of(ProduceRequest)][1:]  # after the stalled one
    last_served: dict[int, int] = {}
    worst = 0
    for number, request in enumerate(produce):
        assert isinstance(request, ProduceRequest)
        for part in request.topic_data[0].partition_data:
            worst = max(worst, number - last_served.get(part.index, -1))
            last_served[part.index] = number
    assert len(produce) >= partitions * 4 // 30
    assert worst <= 8


@pytest.mark.parametrize("lanes", [True, False])
async def test_callbacks_of_one_partition_run_in_record_order(scripted: Scripted, lanes: bool) -> None:
    # As Java promises: they ran in the order they were added (two tasks sending to a partition,
    # the later one adding its callback first).
    if lanes and speedups is None:
        pytest.skip("the compiled send lane is off (AIOPROD_PURE_PYTHON): its test is the other case")
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    order: list[int] = []
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=50) as p:
        p._lanes_on = lanes
        await p.partitions_for("t")
        futures = [await p.send("t", b"%d" % i) for i in range(4)]
        for i in (3, 1, 0, 2):
            futures[i].add_done_callback(lambda _f, i=i: order.append(i))
        await asyncio.gather(*futures)
        await asyncio.sleep(0)  # the callbacks of the last future gathered
    assert order == [0, 1, 2, 3]

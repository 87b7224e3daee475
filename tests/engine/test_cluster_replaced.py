"""Another cluster behind the bootstrap addresses (a new cluster id): producer ids start from 0 in
every cluster, so the new one may know ours as its own producer's. A batch numbered under the old
id, retried there, or a new one sent on a connection opened before a metadata answer named the new
cluster, was taken for that producer's duplicate: acknowledged, written nowhere (or refused
OUT_OF_ORDER_SEQUENCE_NUMBER for good). Found by produce_faults.py's cluster swaps.
"""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from aioprod import Producer
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.cluster import Appended, ScriptedCluster, _ProducerState


def name_cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    cluster_id = {"now": "cluster-A"}
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)
        response.cluster_id = cluster_id["now"]
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)
    return cluster_id


def replace(cluster: ScriptedCluster, cluster_id: dict[str, str], leader: int, theirs: list[int]) -> None:
    """Cluster B behind the same addresses: "t" led by ``leader``, where B's first producer (id
    1000, epoch 0) wrote single-record batches at sequences ``theirs``."""
    (part,) = cluster.create_topic("t", [leader])
    for offset, seq in enumerate(theirs):
        part.log.append(Appended(leader, 1000, 0, seq, (b"theirs-%d" % seq,), offset))
    part.producers[1000] = _ProducerState(0, deque([(s, s, o) for o, s in enumerate(theirs)], maxlen=5))
    cluster._producer_ids = iter(range(2000, 3000))  # B's next ids are past those it gave out
    cluster_id["now"] = "cluster-B"


async def test_a_retry_whose_answer_the_swap_cut_is_not_swallowed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"ours-0")  # id 1000 (cluster A's first), sequence 0
        cluster.nodes[1].stalling = True  # A's broker has not looked at the next request yet
        future = await p.send("t", b"ours-1")  # stamped 1000/0/1
        await asyncio.sleep(0.01)
        replace(cluster, cluster_id, 1, [0, 1])
        cluster.nodes[1].release()
        cluster.disconnect(1)  # A's brokers gone
        # The producer refreshes metadata, sees cluster B, takes id 2000 from it, then retries
        # ours-1 as 1000/0/1: "duplicate" of theirs-1.
        md = await future
    assert b"ours-1" in cluster.partition("t").values, (md, cluster.partition("t").values)


async def test_a_retry_after_the_new_id_was_taken_is_not_swallowed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1])
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100) as p:
        await p.send_and_wait("t", b"ours-0")
        cluster.nodes[1].script.append(19)  # NOT_ENOUGH_REPLICAS: not written, retried
        future = await p.send("t", b"ours-1")  # stamped 1000/0/1
        replace(cluster, cluster_id, 2, [0, 1])  # B's "t" led by node 2, down for a while
        cluster.stop(2)
        cluster.disconnect(1)
        await asyncio.sleep(2)
        assert p.cluster().cluster_id == "cluster-B"
        assert p._sender.idempotence.producer_id == 2000  # the new id is taken ...
        cluster.start(2)
        md = await future  # ... and the retry still goes as 1000/0/1
    assert b"ours-1" in cluster.partition("t").values, (md, cluster.partition("t").values)


async def test_an_idempotent_producer_outlives_a_cluster_swap(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CHANGELOG: a new cluster id "gives an idempotent producer a new producer id from it".
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        cluster.nodes[1].holding = True  # A writes ours-0 (1000/0/0), its answer never comes
        future = await p.send("t", b"ours-0")
        await asyncio.sleep(0.01)
        assert cluster.partition("t").values == [b"ours-0"]
        replace(cluster, cluster_id, 1, [5, 6, 7])  # B's producer 1000 is at sequence 8
        cluster.nodes[1].holding = False
        cluster.disconnect(1)
        outcome = (await asyncio.gather(future, return_exceptions=True))[0]
    # Observed: ProducerFatalError "t-0: the broker reported a sequence gap at 0 that the
    # producer cannot explain" (the retry went as 1000/0/0; B's producer 1000 is at 8), and the
    # producer takes no more records.
    assert not isinstance(outcome, BaseException), outcome


async def test_a_record_sent_after_the_swap_before_a_metadata_refresh_is_not_swallowed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # b46d7e7's test waits for a metadata refresh (metadata_max_age_ms=1000) before sending. A
    # producer whose connections were idle (closed) when the cluster was replaced reconnects to
    # the same addresses and sends under the old id until its next periodic refresh (5 minutes
    # by default): nothing else asks for metadata. (Harness seed 135.)
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        await p.send_and_wait("t", b"ours-0")  # id 1000, sequence 0
        await asyncio.sleep(3)  # idle: the producer closed its connections
        replace(cluster, cluster_id, 1, [0, 1])  # B at the same addresses
        md = await p.send_and_wait("t", b"ours-1")  # 1000/0/1 on a new connection, to B
        seen = p.cluster().cluster_id
    # Observed: acknowledged at offset 1 (B's "theirs-1"), written nowhere; the producer still
    # takes the cluster for cluster-A.
    assert b"ours-1" in cluster.partition("t").values, (md, seen, cluster.partition("t").values)

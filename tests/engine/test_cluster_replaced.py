"""Another cluster behind the bootstrap addresses (a new cluster id): producer ids start from 0 in
every cluster, so the new one may know ours as its own producer's. A batch numbered under the old
id, retried there, or a new one sent on a connection opened before a metadata answer named the new
cluster, was taken for that producer's duplicate: acknowledged, written nowhere (or refused
OUT_OF_ORDER_SEQUENCE_NUMBER for good). Found by produce_faults.py's cluster swaps.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import pytest

from aioprod import Producer
from aioprod.errors import KafkaError
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.cluster import Appended, Hold, ScriptedCluster, _ProducerState


def name_cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Metadata answers name the cluster ``cluster_id["now"]`` (cluster-A until a test changes it)."""
    cluster_id = {"now": "cluster-A"}
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)  # type: ignore[arg-type]
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


# 7ad1c12 (produce_faults seed 789, reduced): _confirm_cluster records the new cluster id in the
# sender only; the metadata snapshot keeps the old one until its next refresh. A snapshot installed
# meanwhile without a metadata answer -- Metadata.update_leader, from a NOT_LEADER answer's
# CurrentLeader (KIP-951) -- carries the old id, and the sender's listener takes it for another
# cluster change (B -> A): a new producer id, and a batch of ours on the wire under the previous one
# is renumbered and written again in the same cluster (a duplicate).
async def test_a_leader_hint_after_a_confirmed_cluster_change_does_not_duplicate(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("t", [1, 2])
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        await p.send_and_wait("t", b"a0", partition=0)  # id 1000
        await p.send_and_wait("t", b"a1", partition=1)
        await asyncio.sleep(3)  # idle: every connection closed
        # Cluster B behind the same addresses; its t-1 is led by 3 (at a newer epoch).
        cluster.create_topic("t", [1, 2])
        cluster.move_leader("t", 1, 3)
        cluster._producer_ids = iter(range(2000, 3000))
        cluster_id["now"] = "cluster-B"
        cluster.nodes[1].holding = True  # B writes x, its answer does not come yet
        x = await p.send("t", b"x", partition=0)  # the confirm sees B: id 2000; x is 2000/0/0
        await asyncio.sleep(0.5)
        assert p._sender.idempotence.producer_id == 2000
        # y goes to node 2: NOT_LEADER_OR_FOLLOWER, CurrentLeader 3 -> Metadata.update_leader
        y = await p.send_and_wait("t", b"y", partition=1)
        ids = (p._sender._cluster_id, p.cluster().cluster_id, p._sender.idempotence.producer_id)
        cluster.nodes[1].holding = False
        cluster.disconnect(1)  # x's answer lost: retried
        await asyncio.gather(x, return_exceptions=True)
    values = cluster.partition("t", 0).values
    # Observed: the sender takes the cluster for 'cluster-A' again, takes id 2001, and x is
    # retried as 2001/0/0: [b'x', b'x'].
    assert values.count(b"x") == 1, (values, ids, y)


# produce_faults seed 457 (reduced): a batch refused UNKNOWN_PRODUCER_ID waits for a new sequence
# behind later batches of its partition that keep their stamps (retried after a lost connection):
# the order that lets those be resolved under their own stamps first (reenqueue/_resent_before).
# Then the cluster id changes: _cluster_seen renumbers every queued batch -- in that queue order, so
# the refused batch is written after the records sent after it (idempotence: order is promised).
async def test_renumbering_after_a_cluster_change_keeps_the_send_order(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, batch_size=100, retry_backoff_ms=500) as p:
        await p.send_and_wait("t", b"ours-0")  # id 1000, sequence 0
        # seq 1: NOT_ENOUGH_REPLICAS (retried under its stamp); seq 2: UNKNOWN_PRODUCER_ID (waits
        # for a new sequence); seq 3 written, its answer held; seq 4 not looked at yet.
        cluster.nodes[1].script.extend([19, 59, Hold])
        values = [b"ours-%d:" % i + b"x" * 80 for i in range(1, 5)]
        futures = [await p.send("t", v) for v in values]
        await asyncio.sleep(0.05)
        replace(cluster, cluster_id, 1, [])  # cluster B behind the same address
        cluster.disconnect(1)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    offsets = [o.offset for o in outcomes if not isinstance(o, BaseException)]
    written = [v[:7] for v in cluster.partition("t").values if v in values]
    # Observed: all acknowledged at offsets [0, 2, 1, 3]: B's log is ours-1, ours-3, ours-2, ours-4.
    assert offsets == sorted(offsets), (offsets, written, outcomes)


# produce_faults seed 404: a batch whose attempt on cluster A may be in A's log (its answer was
# lost), renumbered under cluster B's new producer id, then refused by B with a definite error, fails
# as 'not written' (no possibly_persisted, no 'may be in the log' note): the renumbering
# (PartitionSequences.restart -> ProducerBatch.unstamp) clears maybe_written.
async def test_a_batch_maybe_in_the_old_clusters_log_still_says_so(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, retry_backoff_ms=100) as p:
        await p.send_and_wait("t", b"ours-0")  # id 1000, sequence 0
        cluster.nodes[1].holding = True  # A writes ours-1, its answer never comes
        future = await p.send("t", b"ours-1")
        await asyncio.sleep(0.01)
        a_log = cluster.partition("t")
        assert b"ours-1" in a_log.values
        replace(cluster, cluster_id, 1, [0, 1])  # B behind the same address
        cluster.nodes[1].holding = False
        cluster.nodes[1].script.append(87)  # B refuses the retry: INVALID_RECORD (not written)
        cluster.disconnect(1)
        outcome = (await asyncio.gather(future, return_exceptions=True))[0]
    assert isinstance(outcome, KafkaError), outcome
    # ours-1 is in cluster A's log: the error must not say "not written".
    assert getattr(outcome, "possibly_persisted", None) is True or any(
        "may be in the log" in n for n in getattr(outcome, "__notes__", [])
    ), (repr(outcome), getattr(outcome, "possibly_persisted", None), getattr(outcome, "__notes__", None))


# 7ad1c12: ConnectionPool._connect awaits confirm_cluster(conn) after conn.open(). close()
# cancels the connecting task; the CancelledError passes `except Exception`, and the connection --
# open, negotiated, its reader task running -- is neither the node's connection nor closed by
# anyone: close() returns with the socket still open (the broker sees it open).
async def test_close_while_a_connection_confirms_the_cluster_closes_it(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    slow = {"on": False}
    handle = ScriptedCluster.handle

    async def handling(self: ScriptedCluster, conn: object, frame: bytes) -> bytes | None:
        answer = await handle(self, conn, frame)
        if slow["on"] and isinstance(self.requests[-1].body, m.MetadataRequest) and self.requests[-1].body.topics == []:
            await asyncio.sleep(25)  # a slow broker: the confirm's answer takes a while
        return answer

    monkeypatch.setattr(ScriptedCluster, "handle", handling)
    p = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000)
    await p.start()
    await p.send_and_wait("t", b"one")
    await asyncio.sleep(3)  # idle: the connections are closed (the pool counts a close)
    assert cluster.nodes[1].open_connections == 0
    slow["on"] = True
    sending = asyncio.ensure_future(p.send_and_wait("t", b"two"))
    await asyncio.sleep(1)  # a new connection is open, asking the cluster id
    assert cluster.nodes[1].open_connections == 1
    await p.close(0)
    await asyncio.sleep(60)  # past the answer, and past request_timeout_ms
    await asyncio.gather(sending, return_exceptions=True)
    assert cluster.nodes[1].open_connections == 0, "close() left a connection open"


# f025f03: producer-id-reset-total now counts the id taken after a cluster-id change, and
# _take_identity warns 'took a new producer identity N/E (was P/E)'; but _cluster_seen has already
# set the id to -1/-1, so the warning says 'was -1/-1' instead of the id it replaced.
async def test_the_identity_warning_names_the_replaced_id(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aioprod")
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        await p.send_and_wait("t", b"ours-0")  # id 1000
        await asyncio.sleep(3)
        replace(cluster, cluster_id, 1, [])
        await p.send_and_wait("t", b"ours-1")  # id 2000 from B
    lines = [r.getMessage() for r in caplog.records if "took a new producer identity" in r.getMessage()]
    assert lines and "was 1000/0" in lines[0], lines

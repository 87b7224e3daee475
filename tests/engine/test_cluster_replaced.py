"""Another cluster behind the bootstrap addresses (a new cluster id): producer ids start from 0 in
every cluster, so the new one may know ours as its own producer's. A batch numbered under the old
id, retried there, or a new one sent on a connection opened before a metadata answer named the new
cluster, was taken for that producer's duplicate: acknowledged, written nowhere (or refused
OUT_OF_ORDER_SEQUENCE_NUMBER for good). Found by produce_faults.py's cluster swaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from aioprod import PreparedTransaction, Producer, TopicPartition
from aioprod.errors import KafkaError, PreparedTransactionError, ProducerFatalError
from aioprod.producer.partitioner import _py_partition_for_key
from aioprod.protocol import messages as m
from aioprod.protocol.framing import decode_request_body, decode_request_header
from tests.conftest import Scripted
from tests.fakes.cluster import Appended, Hold, ScriptedCluster, _ProducerState
from tests.fakes.coordinator import FakeCoordinator, Lost


def name_cluster(monkeypatch: pytest.MonkeyPatch, per_node: dict[int, str] | None = None) -> dict[str, str]:
    """Metadata answers name the cluster ``cluster_id["now"]`` (cluster-A until a test changes it),
    or, with ``per_node``, the id given there for the broker answering."""
    cluster_id = {"now": "cluster-A"}
    metadata = ScriptedCluster._metadata

    def answering(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(self, node, request)  # type: ignore[arg-type]
        response.cluster_id = cluster_id["now"] if per_node is None else per_node[node.node_id]  # type: ignore[attr-defined]
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", answering)
    return cluster_id


def two_brokers(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, per_node: dict[int, str] | None = None
) -> tuple[ScriptedCluster, dict[str, str]]:
    """Brokers 1 and 2, leading t-0 and t-1, and the cluster id their answers name (see name_cluster)."""
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2])
    return cluster, name_cluster(monkeypatch, per_node)


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


def three_brokers_named(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> tuple[ScriptedCluster, dict[str, str]]:
    """Brokers 1-3, "t" led by 1 and 2, and metadata answers naming cluster-A (see name_cluster)."""
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("t", [1, 2])
    return cluster, name_cluster(monkeypatch)


async def replaced_while_idle(p: Producer, cluster: ScriptedCluster, cluster_id: dict[str, str]) -> None:
    """a0 and a1 written to "t" in cluster A; every connection closed idle
    (connections_max_idle_ms=1000); then cluster B behind the same addresses: its t-1 led by 3
    (at a newer epoch), its producer ids from 2000."""
    await p.send_and_wait("t", b"a0", partition=0)
    await p.send_and_wait("t", b"a1", partition=1)
    await asyncio.sleep(3)
    cluster.create_topic("t", [1, 2])
    cluster.move_leader("t", 1, 3)
    cluster._producer_ids = iter(range(2000, 3000))
    cluster_id["now"] = "cluster-B"


# 7ad1c12 (produce_faults seed 789, reduced): _confirm_cluster records the new cluster id in the
# sender only; the metadata snapshot keeps the old one until its next refresh. A snapshot installed
# meanwhile without a metadata answer -- Metadata.update_leader, from a NOT_LEADER answer's
# CurrentLeader (KIP-951) -- carries the old id, and the sender's listener takes it for another
# cluster change (B -> A): a new producer id, and a batch of ours on the wire under the previous one
# is renumbered and written again in the same cluster (a duplicate).
async def test_a_leader_hint_after_a_confirmed_cluster_change_does_not_duplicate(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, cluster_id = three_brokers_named(scripted, monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        await replaced_while_idle(p, cluster, cluster_id)  # a0, a1 under id 1000, in A
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
        if slow["on"] and isinstance(self.requests[-1].body, m.MetadataRequest):
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


class HeldInitProducerId:
    """Fault injection: the first InitProducerId answer once ``holding`` is computed by the cluster
    as it is then (the old one) and reaches the producer only at :meth:`release`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, holding: bool = True) -> None:
        self.holding = holding
        self.held = asyncio.Event()
        self._released = asyncio.Event()
        handle = ScriptedCluster.handle

        async def handling(cluster: ScriptedCluster, conn: object, frame: bytes) -> bytes | None:
            answer = await handle(cluster, conn, frame)  # type: ignore[arg-type]  # computed now
            if isinstance(cluster.requests[-1].body, m.InitProducerIdRequest) and self.holding:
                self.holding = False
                self.held.set()
                await self._released.wait()
            return answer

        monkeypatch.setattr(ScriptedCluster, "handle", handling)

    def release(self) -> None:
        self._released.set()


async def test_an_init_producer_id_answered_by_the_old_cluster_is_not_taken(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The answer was read after a refresh named the new cluster: the producer took the old
    # cluster's id 1001 there, where it was another producer's, and "ours" was acknowledged
    # as that producer's duplicate, written nowhere.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2, 1])
    cluster_id = name_cluster(monkeypatch)
    init = HeldInitProducerId(monkeypatch, holding=False)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"a0", partition=0)  # id 1000
        await p.send_and_wait("t", b"a1", partition=1)
        cluster.nodes[1].script.append(59)  # UNKNOWN_PRODUCER_ID: a fresh id is asked for
        init.holding = True
        future = await p.send("t", b"ours", partition=2)
        await asyncio.sleep(0.3)
        assert init.held.is_set()
        # The old cluster answered 1001/0; before it is read, the new cluster, whose producer
        # 1001 wrote sequence 0 of t-2, replaces it, and a refresh names it.
        cluster.create_topic("t", [1, 2, 1])
        part = cluster.partition("t", 2)
        part.log.append(Appended(1, 1001, 0, 0, (b"theirs",), 0))
        part.producers[1001] = _ProducerState(0, deque([(0, 0, 0)], maxlen=5))
        cluster._producer_ids = iter(range(2000, 3000))
        cluster_id["now"] = "cluster-B"
        await asyncio.sleep(2)
        assert p.cluster().cluster_id == "cluster-B"
        init.release()
        await future
    assert cluster.partition("t", 2).values == [b"theirs", b"ours"]


async def test_a_first_connection_to_a_broker_is_checked_too(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A switch by name (DNS, a load balancer) leaves the old cluster's connections open: the
    # check ran only after some connection had closed, so the first connection to broker 2
    # reached the new cluster unchecked, and "ours" was taken for its producer 1000's duplicate.
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"a0", partition=0)  # id 1000; only broker 1 connected
        part = cluster.partition("t", 1)
        part.log.append(Appended(2, 1000, 0, 0, (b"theirs",), 0))
        part.producers[1000] = _ProducerState(0, deque([(0, 0, 0)], maxlen=5))
        cluster._producer_ids = iter(range(2000, 3000))
        cluster_id["now"] = "cluster-B"
        await p.send_and_wait("t", b"ours", partition=1)
    assert cluster.partition("t", 1).values == [b"theirs", b"ours"]


async def test_a_broker_naming_another_cluster_id_does_not_write_a_record_twice(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Same brokers, same logs, one of them naming another id: the batch broker 1 had written
    # (its answer lost) was renumbered under a new producer id and written again.
    ids = {1: "X", 2: "X"}
    cluster, _ = two_brokers(scripted, monkeypatch, ids)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"a0", partition=0)
        await p.send_and_wait("t", b"b0", partition=1)
        cluster.nodes[1].holding = True  # broker 1 writes ours, its answer is held
        future = await p.send("t", b"ours", partition=0)
        await asyncio.sleep(0.01)
        assert cluster.partition("t", 0).values.count(b"ours") == 1
        ids[2] = "Y"
        await asyncio.sleep(1.5)  # a periodic refresh goes to broker 2
        cluster.nodes[1].holding = False
        cluster.disconnect(1)  # ours's answer is lost: retried
        outcome = (await asyncio.gather(future, return_exceptions=True))[0]
    assert cluster.partition("t", 0).values.count(b"ours") == 1
    assert not isinstance(outcome, BaseException) or getattr(outcome, "possibly_persisted", False), repr(outcome)


async def test_brokers_naming_two_clusters_stop_an_idempotent_producer_once(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Broker 1 naming X, broker 2 Y: a new producer id at nearly every refresh (19 in 20 s),
    # each renumbering what was on the wire. Now: the first flip back is a fatal error naming both.
    cluster, _ = two_brokers(scripted, monkeypatch, {1: "X", 2: "Y"})
    futures = []
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, metadata_max_age_ms=500) as p:
        for i in range(2000):  # 20 s of steady sends
            try:
                futures.append((i, await p.send("t", b"%d" % i, partition=i % 2)))
            except ProducerFatalError as exc:
                stopped = exc
                break
            await asyncio.sleep(0.01)
        outcomes = await asyncio.gather(*(f for _, f in futures), return_exceptions=True)
    assert "name different clusters" in str(stopped)
    assert len(cluster.requests_of(m.InitProducerIdRequest)) <= 2
    values = Counter(cluster.partition("t", 0).values + cluster.partition("t", 1).values)
    assert max(values.values()) == 1
    for (i, _), outcome in zip(futures, outcomes, strict=True):
        assert isinstance(outcome, BaseException) or values[b"%d" % i] == 1, (i, outcome)


async def test_brokers_naming_two_clusters_do_not_stop_a_producer_without_idempotence(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It numbers nothing: nothing to get wrong by the ids, and nothing to stop for.
    cluster, _ = two_brokers(scripted, monkeypatch, {1: "X", 2: "Y"})
    async with Producer(bootstrap_servers=cluster.bootstrap, acks=1, linger_ms=0, metadata_max_age_ms=500) as p:
        for i in range(40):  # 4 s: several refreshes from each broker
            await p.send_and_wait("t", b"%d" % i, partition=i % 2)
            await asyncio.sleep(0.1)
    assert len(cluster.partition("t", 0).values + cluster.partition("t", 1).values) == 40


async def test_the_cluster_check_waits_out_the_brokers_throttle(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check went out ~9.9 s inside a 10 s KIP-219 throttle carried over from the node's
    # last connection, while the produce waited it out: a request against the quota.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    loop = asyncio.get_running_loop()
    checks: list[float] = []
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        confirm = p._pool.confirm_cluster
        assert confirm is not None

        async def checking(conn):  # type: ignore[no-untyped-def]
            sent = len(cluster.requests)
            await confirm(conn)
            checks.extend(r.at for r in cluster.requests[sent:] if isinstance(r.body, m.MetadataRequest))

        p._pool.confirm_cluster = checking
        cluster.nodes[1].throttle_ms = 10_000
        await p.send_and_wait("t", b"one")
        throttled_until = loop.time() + 10
        checks.clear()
        cluster.nodes[1].throttle_ms = 0
        cluster.disconnect(1)  # lost inside the throttle
        await asyncio.sleep(0.01)
        await (await p.send("t", b"two"))
        produced = [r.at for r in cluster.requests_of(m.ProduceRequest, node=1)]
    assert produced[-1] >= throttled_until - 0.01
    assert checks and min(checks) >= throttled_until - 0.01, (checks, throttled_until)


async def test_a_reconnects_cluster_check_does_not_fetch_every_topic(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tansu answers Metadata for no topics with every topic: each reconnect's check fetched
    # the cluster's whole topic list (300 here) before the connection could be used.
    cluster = scripted.cluster
    for i in range(300):
        cluster.create_topic(f"topic-{i}", 1)
    name_cluster(monkeypatch)
    metadata = ScriptedCluster._metadata
    answered: list[int] = []

    def like_tansu(self: ScriptedCluster, node: object, request: m.MetadataRequest) -> m.MetadataResponse:
        if request.topics == []:
            request = m.MetadataRequest(topics=None)
        response = metadata(self, node, request)  # type: ignore[arg-type]
        answered.append(len(response.topics))
        return response

    monkeypatch.setattr(ScriptedCluster, "_metadata", like_tansu)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        confirm = p._pool.confirm_cluster
        sizes: list[int] = []

        async def checking(conn):  # type: ignore[no-untyped-def]
            before = len(answered)
            await confirm(conn)
            sizes.extend(answered[before:])

        p._pool.confirm_cluster = checking
        await p.send_and_wait("topic-0", b"v")
        for _ in range(3):
            await asyncio.sleep(3)  # idle: the connections close, the next send reconnects
            await p.send_and_wait("topic-0", b"v")
        installed = sorted(p.cluster().topics)
    assert installed == ["topic-0"]  # the check's answer is never installed
    assert sizes and max(sizes) <= 1, sizes


async def test_a_redpanda_cluster_getting_its_id_is_no_cluster_change(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh Redpanda cluster names itself "redpanda.initializing" until its id reaches each
    # broker, at its own moment: taken for an id, it was a cluster replaced (a new producer id),
    # then, from the broker still lagging, one already left: the producer stopped for good.
    ids = {1: "redpanda.initializing", 2: "redpanda.initializing"}
    cluster, _ = two_brokers(scripted, monkeypatch, ids)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        for i in range(4):
            await p.send_and_wait("t", b"warm-%d" % i, partition=i % 2)
        ids[1] = "redpanda.0f1e2d3c"  # broker 1 has the id, broker 2 in 200 ms
        cluster.disconnect(1)  # a reconnect is checked
        for i in range(40):
            await p.send_and_wait("t", b"%d" % i, partition=i % 2)
            if i == 20:
                ids[2] = "redpanda.0f1e2d3c"
            await asyncio.sleep(0.01)
        assert p.metrics()["producer-id-reset-total"] == 0
    assert len(cluster.partition("t", 0).values + cluster.partition("t", 1).values) == 44


async def test_a_handle_prepared_while_redpanda_named_no_id_yet_names_the_id_named_since(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The identity was taken while the brokers named Redpanda's placeholder: every handle of the
    # producer carried cluster_id=None, and was ended in any cluster unchecked.
    ids = {1: "redpanda.initializing", 2: "redpanda.initializing"}
    cluster, _ = two_brokers(scripted, monkeypatch, ids)
    async with transactional(cluster) as p:
        ids[1] = ids[2] = "redpanda.0f1e2d3c"
        p.begin_transaction()
        await (await p.send("t", b"x", partition=0))  # its metadata names the id
        prepared = await p.prepare_transaction()
    assert prepared.cluster_id == "redpanda.0f1e2d3c"
    async with Producer(bootstrap_servers=cluster.bootstrap) as ender:
        await ender.commit_prepared_transaction(prepared)
    assert cluster.partition("t", 0).committed == [b"x"]


# A transactional producer across a cluster change. Its producer id and epoch are the old
# cluster's, and the new cluster hands out ids from the same start (both FAKE coordinators from
# 5000, as two fresh Kafka clusters from 0): another producer of the transactional id there may
# hold the very same id and epoch, and a request under ours is taken for that producer's.


def replace_coordinator(cluster: ScriptedCluster, cluster_id: dict[str, str]) -> None:
    """Cluster B behind the same addresses: "t" anew (led by 1 and 2), and a fresh coordinator."""
    cluster.topics = {}
    cluster.create_topic("t", [1, 2])
    cluster.coordinator = FakeCoordinator(cluster)
    cluster_id["now"] = "cluster-B"


def transactional(cluster: ScriptedCluster, **options: object) -> Producer:
    settings: dict[str, object] = {"transactional_id": "txn-1", "linger_ms": 0, "retry_backoff_ms": 10}
    settings.update(options)
    return Producer(bootstrap_servers=cluster.bootstrap, **settings)


async def test_a_transactional_producer_that_left_a_cluster_ends_no_transaction_in_the_new_one(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its abort (by close()) went to B as EndTxn(5000/0): B aborted the open transaction of the
    # producer that replaced it, whose commit then failed (INVALID_TXN_STATE).
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    left = transactional(cluster, metadata_max_age_ms=1000)
    await left.start()
    left.begin_transaction()
    await (await left.send("t", b"in-A", partition=0))  # A: 5000/0
    replace_coordinator(cluster, cluster_id)
    await asyncio.sleep(2)  # a refresh names B
    with pytest.raises(ProducerFatalError, match="cluster changed"):
        await left.commit_transaction()
    async with transactional(cluster) as replacement:  # B: 5000/0
        replacement.begin_transaction()
        await (await replacement.send("t", b"in-B", partition=0))
        await left.abort_transaction()  # the transaction of A is left to A's coordinator
        await left.close()
        await replacement.commit_transaction()
    assert cluster.partition("t", 0).committed == [b"in-B"]
    assert [r.body.producer_epoch for r in cluster.requests_of(m.EndTxnRequest)] == [0]  # type: ignore[attr-defined]


async def test_offsets_retried_after_a_cluster_change_do_not_reach_the_new_cluster(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A TxnOffsetCommit whose answer never came was retried on B under A's 5000/0: it joined the
    # open transaction of B's producer 5000/0, whose commit committed A's offset for the group.
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    silent = {"on": False}
    handle = ScriptedCluster.handle

    async def handling(self: ScriptedCluster, conn: object, frame: bytes) -> bytes | None:
        answer = await handle(self, conn, frame)  # type: ignore[arg-type]
        if silent["on"] and isinstance(self.requests[-1].body, m.TxnOffsetCommitRequest):
            silent["on"] = False
            return None  # acted on; the answer never comes
        return answer

    monkeypatch.setattr(ScriptedCluster, "handle", handling)
    left = transactional(cluster, metadata_max_age_ms=1000, request_timeout_ms=3000)
    await left.start()
    left.begin_transaction()
    await (await left.send("t", b"in-A", partition=0))
    silent["on"] = True
    offsets = asyncio.ensure_future(left.send_offsets_to_transaction({TopicPartition("in", 0): 777}, "g"))
    await asyncio.sleep(0.2)
    replace_coordinator(cluster, cluster_id)
    async with transactional(cluster) as other:  # B: 5000/0
        other.begin_transaction()
        await (await other.send("t", b"other", partition=1))
        await other.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g")
        with pytest.raises(ProducerFatalError, match="cluster changed"):
            await offsets  # timed out on A, not retried on B
        await other.commit_transaction()
    await left.close()
    assert cluster.coordinator.committed == {"g": {("in", 0): 5}}


async def test_a_cluster_replaced_between_a_transactional_start_and_the_first_send_is_noticed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # start() asks no metadata: the producer never saw A's id, took B's first answer for the
    # cluster its identity came from, and used A's 5000/0 in B, where it is an older instance's,
    # which it then neither fenced nor was told apart from: its commit committed that one's
    # open transaction.
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    async with transactional(cluster) as p:  # A: 5000/0
        replace_coordinator(cluster, cluster_id)
        cluster.disconnect(1)
        async with transactional(cluster) as zombie:  # B: 5000/0
            zombie.begin_transaction()
            await (await zombie.send("t", b"zombie's", partition=1))
            with pytest.raises(ProducerFatalError, match="cluster changed"):
                async with p.transaction():
                    await p.send("t", b"ours", partition=0)
    assert cluster.partition("t", 1).committed == []


async def test_a_transactional_identity_answered_by_the_old_cluster_is_not_taken(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # InitProducerId answered by A, read once a refresh had named B: the producer took A's
    # 5000/0, B's other producer's identity (which it then did not fence).
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    init = HeldInitProducerId(monkeypatch)
    p = transactional(cluster, metadata_max_age_ms=1000)
    starting = asyncio.ensure_future(p.start())
    await init.held.wait()
    replace_coordinator(cluster, cluster_id)
    async with transactional(cluster) as other:  # B: 5000/0
        other.begin_transaction()
        await (await other.send("t", b"other's", partition=1))
        await asyncio.sleep(2)  # a refresh names B
        init.release()
        await starting  # asks B again: 5000/1, which fences the other
        async with p.transaction():
            await p.send("t", b"ours", partition=0)
        with pytest.raises(ProducerFatalError):
            await other.commit_transaction()
    await p.close()
    assert (cluster.partition("t", 0).committed, cluster.partition("t", 1).committed) == ([b"ours"], [])


async def test_a_transactional_start_that_saw_two_clusters_fails(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The refreshes named B, then A again, while InitProducerId was answered: the producer failed
    # (two clusters behind the addresses), yet start() asked again, took the answer and returned,
    # its state READY; only its sends failed.
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    init = HeldInitProducerId(monkeypatch)
    p = transactional(cluster, metadata_max_age_ms=1000)
    starting = asyncio.ensure_future(p.start())
    await init.held.wait()
    cluster_id["now"] = "cluster-B"
    await asyncio.sleep(2)  # a refresh names B
    cluster_id["now"] = "cluster-A"
    await asyncio.sleep(2)  # and one names A again
    init.release()
    with pytest.raises(ProducerFatalError, match="different clusters"):
        await starting
    await p.close()


async def test_a_handle_prepared_in_the_cluster_left_ends_nothing_in_the_new_one(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The producer prepared a transaction in A (5000/0), then saw B: committing its handle sent
    # EndTxn(5000/0, commit) to B, which committed the open transaction of B's producer 5000/0
    # (and commit_prepared_transaction() returned, the transaction of A left open).
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    left = transactional(cluster, metadata_max_age_ms=1000)
    await left.start()
    left.begin_transaction()
    await (await left.send("t", b"in-A", partition=0))
    prepared = await left.prepare_transaction()  # A: 5000/0
    replace_coordinator(cluster, cluster_id)
    await asyncio.sleep(2)  # a refresh names B
    async with transactional(cluster) as other:  # B: 5000/0
        other.begin_transaction()
        await (await other.send("t", b"other's", partition=1))
        with pytest.raises(ProducerFatalError, match="cluster changed"):
            await left.commit_prepared_transaction(prepared)
        assert cluster.requests_of(m.EndTxnRequest) == []
        await other.abort_transaction()
    await left.close()
    assert cluster.partition("t", 1).committed == []


@dataclass
class HandleOfA:
    """txn-1's transaction prepared in cluster A (5000/0, left open), then cluster B behind the
    addresses, where B's own txn-1 (5000/0 too) has a transaction open with b"other's"."""

    cluster: ScriptedCluster
    cluster_id: dict[str, str]
    prepared: PreparedTransaction
    #: B's producer, its transaction open.
    other: Producer
    #: Each cluster's topics and coordinator, to put one or the other behind the addresses.
    a: tuple[dict[str, Any], FakeCoordinator]
    b: tuple[dict[str, Any], FakeCoordinator]


@contextlib.asynccontextmanager
async def a_handle_of_a_with_b_open(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[HandleOfA]:
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    async with transactional(cluster) as left:
        left.begin_transaction()
        await (await left.send("t", b"in-A", partition=0))
        prepared = await left.prepare_transaction()
    a = (cluster.topics, cluster.coordinator)
    replace_coordinator(cluster, cluster_id)
    async with transactional(cluster) as other:
        other.begin_transaction()
        await (await other.send("t", b"other's", partition=1))
        yield HandleOfA(cluster, cluster_id, prepared, other, a, (cluster.topics, cluster.coordinator))


@pytest.mark.parametrize("idempotence", [True, False])
async def test_a_handle_prepared_in_another_cluster_ends_nothing_there(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, idempotence: bool
) -> None:
    # A handle prepared in A (5000/0), ended by another producer once B is behind the addresses:
    # its EndTxn(5000/0, commit) went to B and committed the open transaction of B's producer
    # 5000/0, and commit_prepared_transaction() returned.
    async with a_handle_of_a_with_b_open(scripted, monkeypatch) as swapped:
        cluster, prepared = swapped.cluster, swapped.prepared
        assert prepared.cluster_id == "cluster-A"
        async with Producer(bootstrap_servers=cluster.bootstrap, enable_idempotence=idempotence) as ender:
            refused = r"prepared in cluster 'cluster-A'.*brokers are now cluster 'cluster-B'"
            for end in (ender.commit_prepared_transaction, ender.abort_prepared_transaction):
                with pytest.raises(PreparedTransactionError, match=refused) as e:
                    await end(prepared)
                assert e.value.prepared == prepared
        assert cluster.requests_of(m.EndTxnRequest) == []
        await swapped.other.commit_transaction()
    assert cluster.partition("t", 1).committed == [b"other's"]


@pytest.mark.parametrize("idempotence", [True, False])
async def test_a_handles_end_retried_after_the_cluster_was_replaced_ends_nothing_there(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, idempotence: bool
) -> None:
    # The cluster was checked once, before the EndTxn's retries: A answered the first EndTxn
    # CONCURRENT_TRANSACTIONS, B replaced A, and the retry's EndTxn(5000/0, commit) committed
    # the open transaction of B's producer 5000/0 (and commit_prepared_transaction() returned).
    async with a_handle_of_a_with_b_open(scripted, monkeypatch) as swapped:
        cluster, cluster_id, a, b = swapped.cluster, swapped.cluster_id, swapped.a, swapped.b
        (cluster.topics, cluster.coordinator), cluster_id["now"] = a, "cluster-A"  # A again, for now
        a[1].script[m.EndTxnRequest.API_KEY] = deque([51])  # CONCURRENT_TRANSACTIONS

        def a_answers_then_b_replaces_it(coordinator: FakeCoordinator, api_key: int) -> int | type[Lost]:
            answer = scripted_answer(coordinator, api_key)
            if coordinator is a[1] and api_key == m.EndTxnRequest.API_KEY:
                (cluster.topics, cluster.coordinator), cluster_id["now"] = b, "cluster-B"
            return answer

        scripted_answer = FakeCoordinator.scripted
        monkeypatch.setattr(FakeCoordinator, "scripted", a_answers_then_b_replaces_it)
        async with Producer(
            bootstrap_servers=cluster.bootstrap, enable_idempotence=idempotence, retry_backoff_ms=10
        ) as ender:
            # An earlier EndTxn went to A: had its answer been lost rather than "not now", it may have
            # committed there. Not PreparedTransactionError ("never visible"): in doubt.
            with pytest.raises(KafkaError, match=r"in doubt: .*brokers are now cluster 'cluster-B'") as refused:
                await ender.commit_prepared_transaction(swapped.prepared)
            assert not isinstance(refused.value, PreparedTransactionError)
        assert len(cluster.requests_of(m.EndTxnRequest)) == 1  # to A, answered "not now"; none to B
        await swapped.other.commit_transaction()
    assert b[0]["t"][1].committed == [b"other's"]
    assert a[0]["t"][0].committed == []  # left open in A, for its coordinator to abort


async def test_the_same_producer_id_from_the_new_cluster_is_a_new_identity(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new cluster hands out the same first producer id as the one it replaced (Kafka: 0 in both).
    # It is a new identity all the same: the partition numbers from 0 under it, not from where
    # the old cluster's sequence stopped (which the new cluster refuses: one more identity taken).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"a0")  # 1000/0/0 in cluster A
        await p.send_and_wait("t", b"a1")
        cluster.create_topic("t", [1])  # cluster B: "t" empty, no producer state
        cluster._producer_ids = iter(range(1000, 2000))  # B's first id is ours again
        cluster_id["now"] = "cluster-B"
        cluster.disconnect(1)  # the new connection finds cluster B (see _confirm_cluster)
        await p.send_and_wait("t", b"b0")
    (written,) = cluster.partition("t").log
    assert (written.values, written.producer_id, written.producer_epoch, written.base_sequence) == (
        (b"b0",),
        1000,
        0,
        0,
    )


def naming(cluster: ScriptedCluster, cluster_id: str) -> ScriptedCluster:
    """``cluster``, its metadata answers naming ``cluster_id`` (this cluster only)."""
    metadata = cluster._metadata

    def answering(node: Any, request: m.MetadataRequest) -> m.MetadataResponse:
        response = metadata(node, request)
        response.cluster_id = cluster_id
        return response

    cluster._metadata = answering  # type: ignore[method-assign]
    return cluster


def cluster_a(scripted: Scripted) -> ScriptedCluster:
    """Cluster A: brokers 1 and 2, leading "t"'s partitions 0 and 1."""
    a = naming(scripted.cluster, "cluster-A")
    a.add_node(2)
    a.create_topic("t", [1, 2])
    return a


async def written_in_a_then_b_listens(p: Producer, scripted: Scripted) -> ScriptedCluster:
    """a0 and a1 written to "t" in cluster A; then cluster B, returned, listening at A's
    addresses: the connections made from now on reach it."""
    await p.send_and_wait("t", b"a0", partition=0)
    await p.send_and_wait("t", b"a1", partition=1)
    b = naming(ScriptedCluster(scripted.network, nodes=2), "cluster-B")
    b.create_topic("t", [1, 2])
    return b


async def test_the_connections_left_open_to_the_old_cluster_are_closed_once_another_is_found(
    scripted: Scripted,
) -> None:
    # A switch by name (DNS, a load balancer): cluster B now answers at the addresses, and the
    # producer's connections to cluster A stay open. Once a new connection finds B, the old ones
    # must go: records sent on them would go on being written in the cluster left, numbered under
    # B's producer id.
    a = cluster_a(scripted)
    async with Producer(bootstrap_servers=a.bootstrap, linger_ms=0) as p:
        b = await written_in_a_then_b_listens(p, scripted)
        a.disconnect(2)  # A's broker 2 goes: the next connection to broker 2 reaches B
        await p.send_and_wait("t", b"b1", partition=1)
        assert p._sender._cluster_id == "cluster-B"
        await p.send_and_wait("t", b"b0", partition=0)
    assert (a.partition("t", 0).values, a.partition("t", 1).values) == ([b"a0"], [b"a1"])
    assert (b.partition("t", 0).values, b.partition("t", 1).values) == ([b"b0"], [b"b1"])
    assert a.nodes[1].open_connections == 0


async def test_a_cluster_a_reconnects_check_finds_is_looked_up_before_the_next_send(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cluster B behind the same addresses has "t" in two partitions. The check of the first new
    # connection finds B: its metadata must be fetched then, not at the next periodic refresh
    # (5 minutes), until which keyed records would be placed by A's partition count.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster_id = name_cluster(monkeypatch)
    key = next(k for k in (b"k%d" % i for i in range(100)) if _py_partition_for_key(k, 2) == 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        await p.send_and_wait("t", b"a", key=key)
        await asyncio.sleep(3)  # idle: every connection closed
        cluster.create_topic("t", 2)
        cluster._producer_ids = iter(range(2000, 3000))
        cluster_id["now"] = "cluster-B"
        await p.send_and_wait("t", b"b0", partition=0)  # a new connection: its check finds B
        keyed = await p.send_and_wait("t", b"b1", key=key)
    assert keyed.partition == 1
    assert cluster.partition("t", 1).values == [b"b1"]


async def test_a_leader_hint_before_the_refresh_a_cluster_check_asked_for_keeps_the_new_cluster(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # test_a_leader_hint_after_a_confirmed_cluster_change_does_not_duplicate, with the refresh the
    # check asked for answered late (a busy broker): a leader hint (KIP-951) comes first, and the
    # snapshot it installs must name the cluster the check found. Naming the old one, it would be taken
    # for a change back ("the brokers name different clusters"): the producer would stop.
    cluster, cluster_id = three_brokers_named(scripted, monkeypatch)
    handle = ScriptedCluster.handle
    slow = [False]

    async def slow_refreshes(self: ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        header, body = decode_request_header(frame)
        if (
            slow[0]
            and header.api_key == m.MetadataRequest.API_KEY
            and decode_request_body(body, header, m.MetadataRequest).allow_auto_topic_creation
        ):
            await asyncio.sleep(10)  # a refresh (a connection's check creates no topic)
        return await handle(self, conn, frame)

    monkeypatch.setattr(ScriptedCluster, "handle", slow_refreshes)
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, connections_max_idle_ms=1000) as p:
        await replaced_while_idle(p, cluster, cluster_id)
        slow[0] = True
        x = await p.send("t", b"x", partition=0)  # the check of broker 1's connection finds B
        await asyncio.sleep(0.5)
        assert p._sender.idempotence.producer_id == 2000
        await p.send_and_wait("t", b"y", partition=1)  # to 2: NOT_LEADER_OR_FOLLOWER, CurrentLeader 3
        ids = (p._sender._cluster_id, p.cluster().cluster_id, p._sender.idempotence.producer_id)
        fatal = p._sender.fatal
        await x
    assert (ids, fatal) == (("cluster-B", "cluster-B", 2000), None)
    assert (cluster.partition("t", 0).values, cluster.partition("t", 1).values) == ([b"x"], [b"y"])


async def test_a_metadata_answer_from_the_old_cluster_arriving_after_the_switch_is_not_taken(
    scripted: Scripted,
) -> None:
    # As above, with a refresh on the old cluster's open connection answered late, after the
    # check of a new connection has found cluster B: that answer (cluster A's brokers, leaders
    # and id) must not be installed (taken for a change back, it would stop the producer).
    a = cluster_a(scripted)
    handle = a.handle
    slow = [False]

    async def slow_metadata(conn: Any, frame: bytes) -> bytes | None:
        if slow[0] and decode_request_header(frame)[0].api_key == m.MetadataRequest.API_KEY:
            await asyncio.sleep(10)
        return await handle(conn, frame)

    a.handle = slow_metadata  # type: ignore[method-assign]
    async with Producer(bootstrap_servers=a.bootstrap, linger_ms=0) as p:
        b = await written_in_a_then_b_listens(p, scripted)
        slow[0] = True
        a.disconnect(2)  # the refresh this asks for goes to A's broker 1, and is answered late
        await p.send_and_wait("t", b"b1", partition=1)  # a new connection to broker 2: B
        await asyncio.sleep(15)  # A's late answer comes
        await p.send_and_wait("t", b"b0", partition=0)
        state = (p._sender._cluster_id, p.cluster().cluster_id, p._sender.fatal)
    assert state == ("cluster-B", "cluster-B", None)
    assert (b.partition("t", 0).values, b.partition("t", 1).values) == ([b"b0"], [b"b1"])


async def test_a_transaction_block_whose_commit_answer_the_swap_cut_says_it_may_have_committed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A committed the transaction (its EndTxn answer lost), B replaced A before the retry: the
    # block raised ProducerFatalError("the cluster changed"), then "aborted" it (nothing sent, a log
    # saying A's coordinator aborts it), so that the block's error read as "aborted, never visible"
    # and a caller writing the records again wrote them twice.
    cluster, cluster_id = two_brokers(scripted, monkeypatch)
    a_coordinator = cluster.coordinator
    scripted_answer = FakeCoordinator.scripted

    def a_commits_then_b_replaces_it(coordinator: FakeCoordinator, api_key: int) -> int | type[Lost]:
        answer = scripted_answer(coordinator, api_key)
        if api_key == m.EndTxnRequest.API_KEY and cluster_id["now"] == "cluster-A":
            replace_coordinator(cluster, cluster_id)
            return Lost  # acted on (committed in A), never answered
        return answer

    monkeypatch.setattr(FakeCoordinator, "scripted", a_commits_then_b_replaces_it)
    async with transactional(cluster) as p:
        with pytest.raises(ProducerFatalError, match="in doubt") as info:
            async with p.transaction():
                await (await p.send("t", b"in-A", partition=0))
        assert info.value.possibly_persisted
        assert not p.in_transaction  # nothing left for the block or close() to "abort"
    assert a_coordinator.transactions["txn-1"].last_end == (True, 0)  # A committed it
    assert [r.body.committed for r in cluster.requests_of(m.EndTxnRequest)] == [True]  # type: ignore[attr-defined]

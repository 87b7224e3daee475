"""The connection pool: what it leaves open, and how it paces connection attempts. On the scripted
fake cluster (in-memory network, virtual time)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import DeliveryTimeoutError, KafkaTimeoutError
from aioprod.protocol import messages as m
from tests.conftest import Scripted
from tests.fakes.cluster import ScriptedCluster


async def test_a_broker_the_cluster_no_longer_names_has_its_connection_closed_at_close(scripted: Scripted) -> None:
    # Broker 2 left the cluster's metadata (decommissioned, still up): its connection is kept
    # while it is open, and must still be the pool's to close.
    cluster = scripted.cluster
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=1000) as p:
        await p.send_and_wait("t", b"a", partition=0)
        await p.send_and_wait("t", b"b", partition=1)
        leaving = cluster.nodes[2]
        cluster.move_leader("t", 1, 1)
        del cluster.nodes[2]  # no longer named; its connection stays open
        await asyncio.sleep(3)  # periodic refreshes, without broker 2
        assert 2 not in p.cluster().brokers
        await p.send_and_wait("t", b"c", partition=1)
        assert leaving.open_connections == 1
    assert leaving.open_connections == 0, "close() left the connection to the broker that left open"


async def test_a_broker_whose_handshake_fails_is_left_no_connection_open(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every attempt reaches the broker and fails in the handshake (here ApiVersions refused):
    # each is retried, and none may stay open behind the pool's back.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    versions = ScriptedCluster._api_versions

    def refusing(self: ScriptedCluster) -> m.ApiVersionsResponse:
        response = versions(self)
        response.error_code = 42  # INVALID_REQUEST
        return response

    monkeypatch.setattr(ScriptedCluster, "_api_versions", refusing)
    node = cluster.nodes[1]
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=5_000) as p:
        with pytest.raises(KafkaTimeoutError, match="refused ApiVersions"):
            await p.send("t", b"v")
        attempts = len(node.connections)
        assert attempts > 1
        assert node.open_connections == 0, f"{node.open_connections} of {attempts} failed connections left open"


async def test_the_setup_timeout_grows_with_each_attempt_in_a_row(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Java's socket.connection.setup.timeout.ms: 10 s for the first attempt, doubled for each
    # one that failed in a row, up to socket.connection.setup.timeout.max.ms (30 s), ±20 %.
    cluster, network = scripted.cluster, scripted.network
    cluster.create_topic("t", 1)
    network.black_holes.add(cluster.nodes[1].address)  # SYNs dropped: every attempt times out
    started = record_connects(monkeypatch)
    async with Producer(bootstrap_servers=cluster.bootstrap, max_block_ms=100_000) as p:
        with pytest.raises(KafkaTimeoutError):
            await p.send("t", b"v")
        await p.close(0)
    took = [later - earlier for earlier, later in itertools.pairwise(started)]
    assert len(took) >= 4, took
    # Each attempt lasts its setup timeout, then waits a reconnect backoff (at most 1 s here).
    assert 8 <= took[0] <= 12 + 1
    assert 16 <= took[1] <= 24 + 1
    assert all(24 <= t <= 30 + 1 for t in took[2:4])


def record_connects(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The loop time of every connection attempt from now on."""
    loop = asyncio.get_running_loop()
    started: list[float] = []
    open_connection = asyncio.open_connection

    async def recording(*args: Any, **kwargs: Any) -> Any:
        started.append(loop.time())
        return await open_connection(*args, **kwargs)

    monkeypatch.setattr(asyncio, "open_connection", recording)
    return started


async def test_a_broker_back_after_an_outage_starts_its_backoff_afresh(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reconnect backoff grows with the failures in a row; a connection made ends the row.
    # Counted on, a broker that once failed many times in a row would wait out a long backoff
    # before its second attempt at every later outage, however long it had been up since.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    options: dict[str, Any] = {"reconnect_backoff_ms": 100, "reconnect_backoff_max_ms": 10_000, "linger_ms": 0}
    async with Producer(bootstrap_servers=cluster.bootstrap, **options) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.stop(1)  # a first outage: attempts refused, their backoff grows
        pending = await p.send("t", b"first outage")
        await asyncio.sleep(10)
        cluster.start(1)
        await pending
        await asyncio.sleep(60)  # up for a minute
        started = record_connects(monkeypatch)
        cluster.stop(1)  # a second outage
        pending = await p.send("t", b"second outage")
        await asyncio.sleep(2)
        cluster.start(1)
        await pending
    # Every attempt to the broker's address (its node's, and the bootstrap server's, the same
    # broker): the first ones of the second outage come a short backoff apart.
    gaps = [later - earlier for earlier, later in itertools.pairwise(started)]
    assert len(started) >= 4 and max(gaps[:3]) < 1, gaps


async def test_a_record_expiring_after_the_broker_came_back_does_not_blame_an_old_connect_failure(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The error of a record that expires unsent names its leader's connect error: one from an
    # outage the broker has come back from since says what is no longer so.
    cluster, network = scripted.cluster, scripted.network
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap,
        linger_ms=0,
        connections_max_idle_ms=5_000,
        delivery_timeout_ms=5_000,
        request_timeout_ms=5_000,
    ) as p:
        await p.send_and_wait("t", b"warm-up")
        cluster.stop(1)  # refused for a while
        pending = await p.send("t", b"through the outage")
        await asyncio.sleep(2)
        cluster.start(1)
        await pending
        await asyncio.sleep(20)  # idle: the connections are closed
        network.black_holes.add(cluster.nodes[1].address)  # the next attempt hangs (no error yet)
        expiring = await p.send("t", b"expires")
        with pytest.raises(DeliveryTimeoutError) as expired:
            await expiring
        await p.close(0)
    # Nothing has failed since the broker came back: no connect error to give.
    assert expired.value.__cause__ is None and str(expired.value).endswith("; not sent"), expired.value


async def test_a_lost_connection_is_made_again_after_the_reconnect_backoff(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A broker that drops each connection soon after it is made (crash-looping, a proxy) must
    # not be reconnected to in a loop as fast as it drops them (reconnect_backoff_ms, as Java).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    loop = asyncio.get_running_loop()
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, reconnect_backoff_ms=1_000) as p:
        await p.send_and_wait("t", b"warm-up")
        started = record_connects(monkeypatch)
        lost_at = loop.time()
        cluster.disconnect(1)
        await p.send_and_wait("t", b"after")
    assert started and min(started) - lost_at >= 0.8, [t - lost_at for t in started]


async def test_close_does_not_wait_for_a_connection_attempt_under_way(scripted: Scripted) -> None:
    # A broker that swallows SYNs: an attempt lasts its setup timeout (10 s). close() stops it,
    # it does not wait it out.
    cluster, network, clock = scripted.cluster, scripted.network, scripted.clock
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2])
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as p:
        await p.send_and_wait("t", b"v", partition=0)
        network.black_holes.add(cluster.nodes[2].address)
        pending = await p.send("t", b"v", partition=1)  # broker 2 is being connected to
        await asyncio.sleep(1)
        assert p._pool.connecting(2)
        started = clock.now
        await p.close(0)
    assert clock.now - started < 1, clock.now - started
    assert pending.done()


async def test_dead_bootstrap_servers_are_passed_over_without_a_metadata_backoff_each(scripted: Scripted) -> None:
    # Eight bootstrap servers refuse connections, one answers. A failed connect moves on to the
    # next server at once (as Java's leastLoadedNode): counted as a failed metadata refresh, each
    # dead server tried before the live one cost a retry backoff (here 5 s each).
    cluster, network, clock = scripted.cluster, scripted.network, scripted.clock
    cluster.create_topic("t", 1)
    live = cluster.nodes[1].address
    dead = [(live[0], port) for port in range(9200, 9208)]
    bootstrap = ",".join(f"{host}:{port}" for host, port in [*dead, live])
    started = clock.now
    async with Producer(
        bootstrap_servers=bootstrap, linger_ms=0, retry_backoff_ms=5_000, retry_backoff_max_ms=5_000
    ) as p:
        await p.send_and_wait("t", b"v")
        waited = clock.now - started
    refused = [address for address in network.connects[: network.connects.index(live)] if address in dead]
    assert refused, "the live server was tried first: nothing to pass over"
    assert waited < 5, f"{len(refused)} refused connect(s) before the live server took {waited:.1f} s"

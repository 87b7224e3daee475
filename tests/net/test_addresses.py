"""Where a broker is: names with several addresses, addresses that change, and a TLS stream
that breaks after its handshake. The scripted cluster, in memory or over loopback TCP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from aioprod import Producer
from aioprod.certs import CertificateAuthority
from aioprod.cli.cluster import ask_metadata
from aioprod.config import ProducerConfig
from aioprod.embedded import free_port
from aioprod.errors import KafkaConnectionError
from aioprod.net.pool import ConnectionPool
from tests.conftest import Scripted
from tests.fakes.cluster import FakeNode, ScriptedCluster
from tests.fakes.network import ServerSide
from tests.fakes.tcp import TcpNetwork
from tests.net.test_connection import produce_one_record


class SlowToAnswer:
    """Serves as ``node`` does, every answer ``delay`` seconds late (a slow handshake)."""

    def __init__(self, node: FakeNode, delay: float) -> None:
        self.node, self.delay = node, delay

    def accept(self, side: ServerSide) -> None:
        send = side.send
        side.send = lambda data: asyncio.get_running_loop().call_later(self.delay, send, data)  # type: ignore[method-assign]
        self.node.accept(side)


async def test_a_connection_made_to_the_address_a_broker_left_is_not_kept(scripted: Scripted) -> None:
    # The broker moved while the pool was connecting to its old address: that connection,
    # completed afterwards, was installed and kept (a Kubernetes pod IP reused by another broker).
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    network.listen("old.example", 9092, SlowToAnswer(cluster.nodes[1], 1.0))
    pool = ConnectionPool(ProducerConfig(bootstrap_servers="127.0.0.1:9091"))
    pool.set_address(2, "old.example", 9092)
    assert pool.connection(2) is None  # connecting to old.example
    await asyncio.sleep(0.1)  # in its ApiVersions handshake
    pool.set_address(2, "127.0.0.1", 9092)
    conn = await pool.get(2)
    try:
        assert (conn.host, conn.port) == ("127.0.0.1", 9092)
    finally:
        await pool.close()


async def test_a_request_after_a_move_goes_to_the_new_address(scripted: Scripted) -> None:
    # The connection to the old address, kept to take the answers in flight, was still handed
    # out by get(): metadata, coordinator and InitProducerId requests went to where the broker
    # was (another broker now, or a dead host where they waited request_timeout_ms).
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    cluster.create_topic("t", [1])
    network.listen("old.example", 9092, cluster.nodes[1])  # broker 2's old address is broker 1's now
    pool = ConnectionPool(ProducerConfig(bootstrap_servers="127.0.0.1:9091"))
    pool.set_address(2, "old.example", 9092)
    old = await pool.get(2)
    cluster.nodes[1].holding = True
    old.send_nowait(produce_one_record("t"), lambda answer: None)  # its answer held back
    pool.set_address(2, "127.0.0.1", 9092)
    getting = asyncio.ensure_future(pool.get(2))
    cluster.nodes[1].release()
    try:
        conn = await asyncio.wait_for(getting, 10)
        assert (conn.host, conn.port) == ("127.0.0.1", 9092)
        assert old.closed  # once its answer came
    finally:
        await pool.close()


@pytest.mark.parametrize(
    ("host", "port", "error"),
    [("127.0.0.1", 70000, "port is outside 1-65535"), ("broker\0.example", 9092, "embedded null character")],
)
async def test_an_address_asyncio_cannot_take_is_backed_off_with_a_clear_error(
    host: str, port: int, error: str
) -> None:
    # asyncio raised IndexError for port 70000 (Metadata's port is an int32), ValueError for a
    # NUL in a name: the pool took no failure, so get() hung and the sender reconnected as fast
    # as the loop turned.
    pool = ConnectionPool(ProducerConfig(bootstrap_servers="127.0.0.1:9091"))
    pool.set_address(2, host, port)
    try:
        with pytest.raises(KafkaConnectionError, match=error):
            await asyncio.wait_for(pool.get(2), 10)
        assert pool.backing_off(2, asyncio.get_running_loop().time())
    finally:
        await pool.close()


@pytest.mark.parametrize("old_attempt", ["succeeds", "fails"])
async def test_an_attempt_to_where_a_broker_was_neither_raises_nor_backs_off(
    scripted: Scripted, old_attempt: str
) -> None:
    # The broker moved while the pool was connecting to its old address. Whether that attempt then
    # succeeded (closed, as another broker's now) or failed (the old address dead), get() raised a
    # failure of the old address, and a failed attempt backed the new one off, never tried.
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    config = ProducerConfig(bootstrap_servers="127.0.0.1:9091", reconnect_backoff_ms=10, request_timeout_ms=2000)
    pool = ConnectionPool(config)
    pool.set_address(2, "old.example", 9092)
    try:
        if old_attempt == "succeeds":  # after an earlier failure there, whose error get() raised
            with pytest.raises(KafkaConnectionError):
                await pool.get(2)  # nothing listens there yet
        delay = 1.0 if old_attempt == "succeeds" else 30.0  # 30 s: past the handshake's 2 s timeout
        network.listen("old.example", 9092, SlowToAnswer(cluster.nodes[1], delay))
        getting = asyncio.ensure_future(pool.get(2))
        while not pool.connecting(2):
            await asyncio.sleep(0.001)  # virtual time
        pool.set_address(2, "127.0.0.1", 9092)
        conn = await asyncio.wait_for(getting, 10)
        assert (conn.host, conn.port) == ("127.0.0.1", 9092)
    finally:
        await pool.close()


async def test_records_for_a_broker_that_moved_while_being_connected_to_are_delivered(scripted: Scripted) -> None:
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    cluster.add_node(3)
    cluster.create_topic("w", [1])
    cluster.create_topic("t", [2])
    # Broker 2 is first advertised where broker 3 now answers, slowly.
    network.listen("old.example", 9092, SlowToAnswer(cluster.nodes[3], 1.0))
    cluster.nodes[2].host = "old.example"
    options: dict[str, Any] = {"linger_ms": 0, "metadata_max_age_ms": 300, "delivery_timeout_ms": 60_000}
    async with Producer(bootstrap_servers="127.0.0.1:9091", **options) as p:
        await p.send_and_wait("w", b"warm-up")  # broker 1 connected: refreshes go there
        sent = asyncio.ensure_future(p.send_and_wait("t", b"v"))  # connects to broker 2 at old.example
        await asyncio.sleep(0.05)  # in its handshake
        cluster.nodes[2].host = "127.0.0.1"  # the next refresh has broker 2's new address
        await sent
    assert cluster.partition("t").values == [b"v"]


@pytest.mark.parametrize("idempotent", [False, True])
async def test_an_address_change_does_not_write_a_record_in_flight_twice(scripted: Scripted, idempotent: bool) -> None:
    # The pool closed the connection at once, failing the written request, and sent it again
    # on the new connection: written twice without idempotence. As Java, the connection now
    # takes its answers first, and only the next connection goes to the new address.
    cluster, network = scripted.cluster, scripted.network
    cluster.add_node(2)
    cluster.create_topic("t", [1, 2])
    node = cluster.nodes[1]
    options: dict[str, Any] = {"acks": "all" if idempotent else 1, "enable_idempotence": idempotent}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0, metadata_max_age_ms=300, **options) as p:
        await p.send_and_wait("t", b"warm-up", partition=1)  # broker 2 connected: refreshes can go there
        await p.send_and_wait("t", b"warm-up", partition=0)
        node.holding = True  # written, the answer held back (a busy broker)
        sent = asyncio.ensure_future(p.send_and_wait("t", b"once", partition=0))
        await asyncio.sleep(0.05)
        network.listen("broker1.example", node.port, node)  # broker 1 advertises a second name
        node.host = "broker1.example"
        await asyncio.sleep(1)  # a refresh has seen it
        node.release()
        await sent
    assert cluster.partition("t", 0).values == [b"warm-up", b"once"]


async def test_a_name_whose_first_address_drops_connections_is_reached_on_the_next() -> None:
    # Walked in order within one attempt, the first address used up the whole setup timeout,
    # every attempt. Loopback TCP: 127.0.0.2 is a listener whose accept queue is full (it
    # drops SYNs, as a dead host does).
    port = free_port()
    hole = socket.socket()
    hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hole.bind(("127.0.0.2", port))
    hole.listen(0)
    filler = socket.create_connection(("127.0.0.2", port), timeout=1)
    network = TcpNetwork()
    cluster = ScriptedCluster(network, nodes=1, ports=lambda _node: port)
    cluster.create_topic("t", 1)
    await network.ready()
    loop = asyncio.get_running_loop()
    resolve = loop.getaddrinfo

    async def two_addresses(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "kafka.test":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            ]
        return await resolve(host, *args, **kwargs)

    loop.getaddrinfo = two_addresses  # type: ignore[method-assign]
    options: dict[str, Any] = {
        "socket_connection_setup_timeout_ms": 500,
        "socket_connection_setup_timeout_max_ms": 1000,
    }
    try:
        async with Producer(bootstrap_servers=f"kafka.test:{port}", max_block_ms=8_000, **options) as p:
            await p.send_and_wait("t", b"v")
    finally:
        del loop.getaddrinfo
        filler.close()
        hole.close()
        await network.close()
    assert cluster.partition("t").values == [b"v"]


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, corrupt: list[bool] | None = None) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while data := await reader.read(65536):
            if corrupt and corrupt[0] and len(data) > 40:
                corrupt[0] = False
                data = data[:-20] + bytes([data[-20] ^ 0xFF]) + data[-19:]  # a bad record MAC
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


async def test_a_tls_record_corrupted_after_the_handshake_is_a_lost_connection(tmp_path: Path) -> None:
    # It failed the request in flight for good, as "TLS handshake ... failed"
    # (SslAuthenticationError), though the broker had written it: a resend wrote it twice.
    # Loopback TCP: producer -> a proxy that flips a byte -> TLS terminator -> scripted broker.
    ca = CertificateAuthority()
    cert, key = ca.issue("localhost", hostnames=("127.0.0.1",)).write(tmp_path, "server")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    network = TcpNetwork()
    cluster = ScriptedCluster(network, nodes=1, ports=lambda _node: free_port())
    cluster.create_topic("t", 1)
    await network.ready()
    broker_port = cluster.nodes[1].port

    async def terminate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", broker_port)
        await asyncio.gather(_relay(reader, upstream_writer), _relay(upstream_reader, writer))

    terminator = await asyncio.start_server(terminate, "127.0.0.1", 0, ssl=server_tls)
    corrupt = [False]

    async def flip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await asyncio.open_connection("127.0.0.1", terminator.sockets[0].getsockname()[1])
        await asyncio.gather(_relay(reader, upstream[1]), _relay(upstream[0], writer, corrupt))

    front = await asyncio.start_server(flip, "127.0.0.1", 0)
    cluster.nodes[1].port = front.sockets[0].getsockname()[1]  # the broker advertises the front door
    options: dict[str, Any] = {"security_protocol": "SSL", "ssl_ca_location": str(ca.write(tmp_path))}
    try:
        async with Producer(bootstrap_servers=f"127.0.0.1:{cluster.nodes[1].port}", linger_ms=0, **options) as p:
            await p.send_and_wait("t", b"one")
            corrupt[0] = True  # the next answer arrives corrupted: retried, as on any lost connection
            await p.send_and_wait("t", b"two")
    finally:
        front.close()
        terminator.close()
        await network.close()
    assert cluster.partition("t").values == [b"one", b"two"]


@pytest.mark.parametrize("client", ["producer", "metadata"])
def test_on_uvloop_each_new_attempt_starts_at_the_next_address_of_the_name(client: str) -> None:
    # uvloop has no happy_eyeballs_delay: there the producer never got past a first address
    # that does not answer. Each new attempt now starts at the next address, as Java's do.
    # (uvloop resolves names itself; this name is known only to the loop's getaddrinfo, so the
    # first attempt, by name, fails at once and the next ones go by address.) `aioprod
    # metadata`'s rounds each started at the first address too.
    import uvloop

    async def produce() -> list[bytes | None]:
        port = free_port()
        network = TcpNetwork()
        cluster = ScriptedCluster(network, nodes=1, ports=lambda _node: port)
        cluster.create_topic("t", 1)
        await network.ready()
        loop = asyncio.get_running_loop()

        async def two_addresses(host: Any, *args: Any, **kwargs: Any) -> Any:
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),  # nothing listens
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            ]

        loop.getaddrinfo = two_addresses  # type: ignore[method-assign]
        try:
            if client == "metadata":
                config = ProducerConfig.from_options(
                    bootstrap_servers=f"kafka.test:{port}", reconnect_backoff_ms=10, max_block_ms=3000
                )
                return [t.name.encode() for t in (await ask_metadata(config, ["t"])).topics if t.name]
            async with Producer(bootstrap_servers=f"kafka.test:{port}", reconnect_backoff_ms=10) as p:
                await p.send_and_wait("t", b"v")
        finally:
            await network.close()
        return cluster.partition("t").values

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(produce()) == ([b"t"] if client == "metadata" else [b"v"])

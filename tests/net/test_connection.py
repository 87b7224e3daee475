"""How a connection hands responses back to a sender that passed ``on_answer``, and when a
throttle ends: on the scripted fake cluster (in-memory network and virtual time, or real
loopback TCP where the loop's own clock is the point)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from aioprod import Producer
from aioprod.config import ProducerConfig
from aioprod.embedded import free_port
from aioprod.errors import KafkaConnectionError, KafkaTimeoutError, SslAuthenticationError
from aioprod.net.auth import ConnectionSecurity
from aioprod.net.connection import BrokerConnection
from aioprod.protocol.framing import decode_request_header
from aioprod.protocol.messages import (
    MetadataRequest,
    MetadataResponse,
    ProduceRequest,
    ProduceRequestPartition,
    ProduceRequestTopic,
    ProduceResponse,
)
from aioprod.protocol.records import RecordBatchBuilder
from tests.brokers import TansuBroker
from tests.conftest import Scripted
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.tcp import TcpNetwork


async def connected(scripted: Scripted) -> BrokerConnection:
    node = scripted.cluster.nodes[1]
    conn = BrokerConnection(1, node.host, node.port, client_id="t", request_timeout=30.0, max_in_flight=5)
    await conn.open(setup_timeout=5.0)
    return conn


async def test_a_response_is_handed_over_by_the_reader_as_it_is_read(scripted: Scripted) -> None:
    # A future's done-callbacks run one loop iteration after the reader resolves it; on every
    # produce round trip that was an iteration of latency. on_answer runs in the reader's step.
    conn = await connected(scripted)
    answered: list[tuple[Any, str]] = []
    done = asyncio.Event()

    def on_answer(answer: Any) -> None:
        task = asyncio.current_task()
        answered.append((answer, "" if task is None else task.get_name()))
        done.set()

    conn.send_nowait(MetadataRequest(topics=[]), on_answer)
    await done.wait()
    ((answer, task_name),) = answered
    assert isinstance(answer, MetadataResponse) and task_name == "aioprod-reader-1"
    conn.close()


async def test_a_response_handed_over_is_not_kept_while_the_reader_waits_for_the_next(scripted: Scripted) -> None:
    # Kept through the wait for the next read (as long as the broker takes: tens of ms over many
    # partitions), every answer outlived the young collections and reached the oldest
    # generation, whose full collections then came several times as often.
    conn = await connected(scripted)
    handed: list[int] = []
    done = asyncio.Event()

    def on_answer(answer: Any) -> None:
        assert isinstance(answer, MetadataResponse)
        handed.append(id(answer))
        done.set()

    conn.send_nowait(MetadataRequest(topics=[]), on_answer)
    await done.wait()  # the reader ran on to its next read in the step that handed it over
    assert not [o for o in gc.get_objects() if type(o) is MetadataResponse and id(o) == handed[0]]
    conn.close()


async def test_a_closed_connection_answers_with_its_error_later_never_inside_send(scripted: Scripted) -> None:
    # The sender writes requests in a loop over nodes: an answer from inside send_nowait would
    # run its bookkeeping in the middle of that loop.
    conn = await connected(scripted)
    answers: list[Any] = []
    conn.send_nowait(MetadataRequest(topics=[]), answers.append)
    conn.close(KafkaConnectionError("gone"))
    conn.send_nowait(MetadataRequest(topics=[]), answers.append)
    assert answers == []
    await asyncio.sleep(0)
    assert [str(a) for a in answers] == ["gone", "gone"]
    assert all(isinstance(a, KafkaConnectionError) for a in answers)


async def test_an_answer_handler_that_raises_does_not_stop_the_reader(scripted: Scripted) -> None:
    conn = await connected(scripted)

    def broken(answer: Any) -> None:
        raise RuntimeError("bug in a handler")

    conn.send_nowait(MetadataRequest(topics=[]), broken)
    assert isinstance(await conn.send(MetadataRequest(topics=[])), MetadataResponse)
    assert not conn.closed
    conn.close()


async def test_a_handler_that_closes_the_connection_keeps_the_responses_read_with_its_own(scripted: Scripted) -> None:
    # Both answers arrive in one read. Had the first handler's close() come before the second
    # response was taken off the in-flight queue, that request would have failed though its
    # answer was read: a produce request the broker wrote, retried.
    conn = await connected(scripted)
    got: list[tuple[str, Any]] = []
    both = asyncio.Event()

    def first(answer: Any) -> None:
        got.append(("first", answer))
        conn.close()

    def second(answer: Any) -> None:
        got.append(("second", answer))
        both.set()

    conn.send_nowait(MetadataRequest(topics=[]), first)
    conn.send_nowait(MetadataRequest(topics=[]), second)
    await both.wait()
    assert [(name, type(answer)) for name, answer in got] == [
        ("first", MetadataResponse),
        ("second", MetadataResponse),
    ]


async def test_a_response_that_frees_a_place_in_flight_calls_on_ready_whatever_it_answers(
    scripted: Scripted,
) -> None:
    # The sender passes over a connection that cannot take a request and sleeps until
    # on_ready: a Metadata answer freeing the only place in flight must wake it too, not
    # only its own produce answers.
    node = scripted.cluster.nodes[1]
    readied: list[int] = []
    conn = BrokerConnection(
        1,
        node.host,
        node.port,
        client_id="t",
        request_timeout=30.0,
        max_in_flight=1,
        on_ready=lambda: readied.append(len(conn._in_flight)),
    )
    await conn.open(setup_timeout=5.0)
    response = asyncio.ensure_future(conn.send(MetadataRequest(topics=[])))
    await asyncio.sleep(0)  # the request is written: the place is taken
    assert conn.in_flight_count == 1 and not conn.can_send_more()
    assert isinstance(await response, MetadataResponse)
    # Called (with the place free) once the response was read; the other call, if any, is
    # for the write buffer draining while the request was still in flight.
    assert 0 in readied and conn.can_send_more()
    conn.close()


def test_on_a_millisecond_clock_a_throttle_ends_on_the_tick_its_timer_fires() -> None:
    # uvloop's clock reads whole milliseconds (N / 1000). A throttle end computed as
    # N / 1000 + 0.005 is, for about a third of N, one float step past (N + 5) / 1000: at the
    # tick its own timer fired on, the connection still said "throttled", and the sender slept
    # 1e-12 s at a time until the clock ticked again. Real loopback TCP to the scripted
    # cluster, on uvloop, 20 throttled answers.
    uvloop = pytest.importorskip("uvloop")

    async def run() -> list[bool]:
        network = TcpNetwork()
        cluster = ScriptedCluster(network, nodes=1, ports=lambda _node: free_port())
        cluster.create_topic("t", 1)
        cluster.nodes[1].throttle_ms = 5
        await network.ready()
        node = cluster.nodes[1]
        conn = BrokerConnection(1, node.host, node.port, client_id="t", request_timeout=30.0, max_in_flight=5)
        await conn.open(setup_timeout=5.0)
        loop = asyncio.get_running_loop()
        sendable_at_the_end: list[bool] = []
        try:
            for _ in range(20):
                answered: asyncio.Future[Any] = loop.create_future()
                conn.send_nowait(produce_one_record("t"), answered.set_result)
                assert isinstance(await answered, ProduceResponse)
                at_the_end: asyncio.Future[bool] = loop.create_future()
                loop.call_at(conn.throttled_until, lambda f=at_the_end: f.set_result(conn.can_send_more()))
                sendable_at_the_end.append(await at_the_end)
        finally:
            conn.close()
            await network.close()
        return sendable_at_the_end

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(run()) == [True] * 20
    finally:
        loop.close()


def produce_one_record(topic: str) -> ProduceRequest:
    builder = RecordBatchBuilder("none", 1024)
    builder.append(0, None, b"v", ())
    partition = ProduceRequestPartition(index=0, records=builder.build())
    return ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=30_000,
        topic_data=[ProduceRequestTopic(name=topic, partition_data=[partition])],
    )


async def test_a_host_name_the_resolver_cannot_take_is_a_connection_error() -> None:
    # A broker may advertise it ("kafka..example.com"): the encoder's UnicodeError escaped as
    # no connection error at all, so the pool recorded no failure and retried at once, forever.
    conn = BrokerConnection(7, "kafka..example.com", 9092, client_id="t", request_timeout=30.0, max_in_flight=5)
    with pytest.raises(KafkaConnectionError, match=r"broker 7 at kafka\.\.example\.com:9092: not a valid host name"):
        await conn.open(setup_timeout=5.0)


async def test_an_acks_0_write_the_broker_does_not_read_ends_at_the_request_timeout(scripted: Scripted) -> None:
    # Nothing answers an acks=0 request, so nothing timed it out: the connection, never
    # flushed, could take no request again, and every later record for the leader expired.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(
        bootstrap_servers=cluster.bootstrap, acks=0, linger_ms=0, request_timeout_ms=5_000, delivery_timeout_ms=60_000
    ) as p:
        await (await p.send("t", b"warm-up"))
        stalled = cluster.nodes[1].connections[-1]
        stalled.side.reading = False  # this connection only: the next one is read
        started = scripted.clock.now
        await (await p.send("t", b"x" * 300_000))  # more than the transport takes at once
        await (await p.send("t", b"later"))
    assert stalled.side.closed and 5 <= scripted.clock.now - started < 10
    assert cluster.partition("t").values[-1] == b"later"


async def test_a_malformed_response_fails_the_other_requests_on_its_connection_as_a_lost_connection(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stream is unreadable after it, and the requests behind it got its ProtocolError, which
    # is not retriable: records the broker may well have written failed for good.
    conn = await connected(scripted)
    original = ScriptedCluster.handle
    answered = 0

    async def mismatched_first(self: ScriptedCluster, connection: Any, frame: bytes) -> bytes | None:
        nonlocal answered
        answer = await original(self, connection, frame)
        answered += 1
        if answered == 1 and answer is not None:  # the first answer names another request
            answer = answer[:4] + (int.from_bytes(answer[4:8], "big") + 1000).to_bytes(4, "big") + answer[8:]
        return answer

    monkeypatch.setattr(ScriptedCluster, "handle", mismatched_first)
    outcomes: list[Any] = []
    for _ in range(2):
        conn.send_nowait(MetadataRequest(topics=[]), outcomes.append)
    while len(outcomes) < 2:
        await asyncio.sleep(0)
    assert [type(outcome) for outcome in outcomes] == [KafkaConnectionError] * 2
    assert all(outcome.retriable and "malformed response" in str(outcome) for outcome in outcomes)


async def test_a_broker_stopping_during_the_first_request_is_not_blamed_on_security_protocol(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SASL listener closes a client without SASL the moment it reads its first request; a
    # broker that goes down two seconds into it (a restart) was hinted as one.
    cluster = scripted.cluster
    handle = ScriptedCluster.handle

    async def slow_metadata(self: ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        if decode_request_header(frame)[0].api_key == MetadataRequest.API_KEY:
            await asyncio.sleep(10)  # a busy broker
        return await handle(self, conn, frame)

    monkeypatch.setattr(ScriptedCluster, "handle", slow_metadata)
    node = cluster.nodes[1]
    conn = BrokerConnection(1, node.host, node.port, client_id="t", request_timeout=30.0, max_in_flight=5)
    await conn.open(setup_timeout=5.0)
    request = asyncio.ensure_future(conn.send(MetadataRequest(topics=[])))
    await asyncio.sleep(2)
    cluster.stop(1)
    with pytest.raises(KafkaConnectionError) as info:
        await request
    assert "security_protocol" not in str(info.value)


async def test_an_http_port_is_called_not_a_kafka_listener_not_a_tls_one() -> None:
    # A REST proxy, Schema Registry or web UI in bootstrap_servers: its "HTTP" read as a frame
    # size of 1213486160, and the hint sent the user to security_protocol.
    async def http_400(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http_400, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with Producer(bootstrap_servers=f"127.0.0.1:{port}", max_block_ms=1500) as p:
            with pytest.raises(KafkaTimeoutError) as failed:
                await p.send("t", b"v")
            await p.close(0)
    finally:
        server.close()
    assert f"it answered in HTTP: 127.0.0.1:{port} is not a Kafka listener" in str(failed.value)
    assert "TLS" not in str(failed.value)


def a_tls_connection(port: int, request_timeout: float, **options: Any) -> BrokerConnection:
    """A connection to 127.0.0.1:``port`` with security_protocol=SSL and ``options``."""
    config = ProducerConfig.from_options(bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SSL", **options)
    return BrokerConnection(
        -1,
        "127.0.0.1",
        port,
        client_id="test",
        request_timeout=request_timeout,
        max_in_flight=1,
        security=ConnectionSecurity.from_config(config),
    )


async def test_a_tls_handshake_a_plaintext_listener_leaves_waiting_says_check_security_protocol() -> None:
    # A plaintext listener that waits for a request (Tansu does) never answers a ClientHello:
    # the setup timeout, with no word of TLS, was all the user saw.
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = a_tls_connection(port, request_timeout=1.0)
    try:
        with pytest.raises(KafkaConnectionError, match="a plaintext listener can leave the handshake waiting"):
            await conn.open(0.2)
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_a_plaintext_listener_closing_on_the_tls_handshake_is_said_to_have_closed() -> None:
    # Apache Kafka's plaintext listener closes on a ClientHello; asyncio raises a
    # ConnectionResetError whose text is empty, and the message read "failed:  during the TLS
    # handshake", never saying the broker closed the connection.
    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(closing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    options = {"bootstrap_servers": f"127.0.0.1:{port}", "security_protocol": "SSL", "max_block_ms": 1500}
    async with server, Producer(**options) as p:
        with pytest.raises(KafkaTimeoutError) as failed:
            await p.send("t", b"x")
    assert f"127.0.0.1:{port} closed the connection during the TLS handshake" in str(failed.value), failed.value


async def test_a_broker_refusing_an_expired_client_certificate_says_it_is_ours(tmp_path: Path) -> None:
    # A fake listener for one fault: it refuses the client's certificate with the alert a Java
    # broker sends (Python's blocking ssl sends it too; the embedded broker's gateway does not).
    # "failed: SSLV3_ALERT_CERTIFICATE_EXPIRED" alone read as the broker's certificate expired.
    from aioprod.certs import CertificateAuthority

    ca = CertificateAuthority("test CA")
    ca_file = ca.write(tmp_path, "ca")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*ca.issue("broker", hostnames=("127.0.0.1",)).write(tmp_path, "broker"))
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(ca_file)
    # TLS 1.2, where the client's certificate is refused within the handshake. (Under 1.3 the
    # refusal comes after the client's handshake is done, often as a reset that beats the alert:
    # "right after the TLS handshake", which has its own hint.)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError), listener.accept()[0] as sock, context.wrap_socket(sock, server_side=True):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    cert, key = ca.issue("client", client=True, expired=True).write(tmp_path, "client")
    port = listener.getsockname()[1]
    conn = a_tls_connection(
        port,
        request_timeout=10,
        ssl_ca_location=str(ca_file),
        ssl_certificate_location=str(cert),
        ssl_key_location=str(key),
    )
    try:
        with pytest.raises(SslAuthenticationError) as info:
            await conn.open(10)
    finally:
        listener.close()
        thread.join(10)  # a bound on cleanup only: the connect above has already been accepted
    assert "CERTIFICATE_EXPIRED" in str(info.value)
    assert "the broker refused this client's certificate: check ssl_certificate_location" in str(info.value)


async def retire_with_an_answer_in_flight(host: str, port: int) -> list[str]:
    """Retire a connection with a request in flight, drop it as the pool does, and collect
    garbage right after its reader closed it: the reader must end, not be destroyed pending.
    Returns the loop's error messages."""
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context["message"]))
    conn = BrokerConnection(1, host, port, client_id="t", request_timeout=30.0, max_in_flight=5)
    await conn.open(setup_timeout=5.0)
    ended = asyncio.Event()
    assert conn._reader_task is not None
    conn._reader_task.add_done_callback(lambda _task: ended.set())
    # The answer's handler runs in the reader, just before it closes the retired connection: a
    # collection then lands before the transport's connection_lost.
    conn.send_nowait(MetadataRequest(topics=[]), lambda _answer: loop.call_soon(gc.collect))
    conn.retire(KafkaConnectionError("broker 1 moved"))
    del conn  # the pool drops a closed connection: nothing else holds it
    await asyncio.wait_for(ended.wait(), 10)
    return errors


async def test_a_retired_connection_closed_by_its_own_reader_ends_the_reader(scripted: Scripted) -> None:
    # The reader closed the connection, then went back to reading: a task only the transport's
    # weak path to its StreamReader could wake, freed pending by the next collection ("Task was
    # destroyed but it is pending!").
    node = scripted.cluster.nodes[1]
    assert await retire_with_an_answer_in_flight(node.host, node.port) == []


@pytest.mark.integration
async def test_a_retired_connection_closed_by_its_own_reader_ends_the_reader_on_a_socket(
    tansu_broker: TansuBroker,
) -> None:
    assert await retire_with_an_answer_in_flight("127.0.0.1", tansu_broker.port) == []


async def test_an_answer_to_a_request_whose_caller_stopped_waiting_does_not_stop_the_reader(
    scripted: Scripted,
) -> None:
    # A coordinator request or a metadata refresh cancelled (a commit given up, close()) leaves
    # its request in flight: its answer comes all the same, and the requests behind it on the
    # connection must still get theirs.
    conn = await connected(scripted)
    abandoned = asyncio.ensure_future(conn.send(MetadataRequest(topics=[])))
    await asyncio.sleep(0)  # written, unanswered
    abandoned.cancel()
    assert isinstance(await conn.send(MetadataRequest(topics=[])), MetadataResponse)
    assert not conn.closed
    conn.close()


async def test_a_request_waits_while_the_last_one_is_still_being_written(scripted: Scripted) -> None:
    # What a broker that stopped reading has not read stays one request: the next one waits in
    # the producer, where it is known never to have been sent, not in the socket's buffer.
    conn = await connected(scripted)
    (server,) = scripted.cluster.nodes[1].connections
    server.side.reading = False
    readied = asyncio.Event()
    conn._on_ready = readied.set
    conn.send_nowait(MetadataRequest(topics=[]), lambda _answer: None)
    assert conn.in_flight_count == 1 and not conn.flushed
    assert not conn.can_send_more()  # a place in flight is free, the write is not done
    server.side.reading = True
    await readied.wait()
    assert conn.flushed and conn.can_send_more()
    conn.close()


async def test_an_acks_0_record_whose_bytes_never_left_is_not_reported_sent(scripted: Scripted) -> None:
    # An acks=0 request is done once its bytes have left: before, the record may still be lost
    # with the connection, and is sent again on the next one.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap, acks=0, linger_ms=0) as p:
        await (await p.send("t", b"warm-up"))
        cluster.nodes[1].stop_reading()
        stuck = await p.send("t", b"stuck")
        await asyncio.sleep(1)
        cluster.disconnect(1)  # what was not read is gone with the connection
        await stuck
    assert cluster.partition("t").values == [b"warm-up", b"stuck"]  # sent again, not taken for sent


async def test_correlation_ids_wrap_at_int32_max_and_answers_still_match(scripted: Scripted) -> None:
    # The id is an int32, counted per connection: a connection that lives long and busy (10,000
    # requests a second for 60 hours) passes 2^31 - 1, and goes on at 0.
    conn = await connected(scripted)
    conn._correlation = itertools.count(2**31 - 2)  # as if 2^31 - 3 requests had been sent on it
    for _ in range(4):
        assert isinstance(await conn.send(MetadataRequest(topics=[])), MetadataResponse)
    assert not conn.closed
    conn.close()


@pytest.mark.parametrize("error", [None, KafkaConnectionError("lost")])
async def test_a_connection_closed_and_dropped_at_once_leaves_no_task_to_be_destroyed_pending(
    scripted: Scripted, error: KafkaConnectionError | None
) -> None:
    # The pool drops a connection as it closes. Its reader, left waiting for the transport's
    # connection_lost (which reaches the StreamReader only by a weak reference), would be freed
    # by a collection before it: "Task was destroyed but it is pending!".
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context["message"]))
    conn = await connected(scripted)
    conn.close(error)
    del conn
    gc.collect()
    await asyncio.sleep(0.1)
    assert errors == []

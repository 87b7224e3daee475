"""A producer in a forked child (``os.fork()``, multiprocessing's "fork" start method): the child's
copy is the parent's, with its connections, producer id and sequence numbers. Whatever the child
does, even running its copy of the parent's event loop, the parent loses and duplicates nothing,
and the child's calls say they cannot be made there."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import selectors
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import ProducerClosedError
from aioprod.producer.transactions import PreparedTransaction
from tests.brokers import TansuBroker
from tests.producer.test_bad_input import started_on_a_loop_of_its_own
from tests.readback import read_topic

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning"),  # 3.12+
]

REFUSED = "refused: this producer was started in process "


def in_a_forked_child(work: Callable[[], str]) -> str:
    """``work()``'s answer (or what it raised), run in a child forked here: from sync code between
    the loop's runs (a multiprocessing "fork" Pool with a module-level loop, say), or from a
    coroutine (a "fork" Process started from async code)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                said = work()
            except BaseException as exc:
                said = f"raised {exc!r}"
            os.write(w, said.encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    said = os.read(r, 8192).decode()
    os.close(r)
    return said


def request_in_flight(loop: asyncio.AbstractEventLoop, producer: Producer, topic: str) -> tuple[Any, list[bytes]]:
    """Send a record and run the loop until its request is on the wire, unanswered (the loop not
    running now): its future, and every value sent (an attempt answered in the same turn of the
    loop that wrote it is followed by another)."""
    sent: list[bytes] = []
    for attempt in range(50):
        value = b"in flight at the fork %d" % attempt
        future = loop.run_until_complete(producer.send(topic, value))
        sent.append(value)
        while not future.done():
            if any(c.in_flight_count for c in producer._pool.connections()):
                return future, sent
            loop.run_until_complete(asyncio.sleep(0))
    raise AssertionError("every answer came in the turn of the loop that wrote its request")


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_forked_child_cannot_send_on_its_parents_producer(
    tansu_broker: TansuBroker, topic: str, loop_kind: str
) -> None:
    # A multiprocessing "fork" Process started from async code, sending from asyncio.run(): on
    # 3.11 the send was taken (the copied loop still named the forking thread), and its record
    # never written. By hand too, with no loop running: the child's copy of the thread's state
    # still holds the parent's running loop.
    import uvloop

    async def child(producer: Producer) -> str:
        try:
            await producer.send(topic, b"from the forked child")
        except RuntimeError as exc:
            return f"refused: {exc}"
        return "taken"

    def child_by_hand(producer: Producer) -> str:
        try:
            producer.send(topic, b"by hand, from the forked child").send(None)
        except RuntimeError as exc:
            return f"refused: {exc}"
        except StopIteration:
            pass
        return "taken"

    async def parent() -> list[str]:
        async with Producer(bootstrap_servers=tansu_broker.bootstrap) as producer:
            await producer.send_and_wait(topic, b"known")
            said = in_a_forked_child(lambda: f"{child_by_hand(producer)}\n{asyncio.run(child(producer))}")
        return said.split("\n")

    said = (asyncio.run if loop_kind == "asyncio" else uvloop.run)(parent())
    assert len(said) == 2, said
    assert all(s.startswith(REFUSED) for s in said), said
    assert [c.value for c in read_topic(tansu_broker.bootstrap, topic)] == [b"known"]


def test_a_forked_childs_refusal_names_the_fork_not_another_loop(tansu_broker: TansuBroker, topic: str) -> None:
    # It said "started on another event loop ... use SyncProducer": a SyncProducer made in the
    # parent is refused in the child too. The way out is a new producer in the child.
    async def child(producer: Producer) -> str:
        try:
            await producer.send(topic, b"from the forked child")
        except RuntimeError as exc:
            return str(exc)
        return "taken"

    async def parent() -> tuple[int, str]:
        async with Producer(bootstrap_servers=tansu_broker.bootstrap) as producer:
            await producer.send_and_wait(topic, b"known")
            return os.getpid(), in_a_forked_child(lambda: asyncio.run(child(producer)))

    pid, said = asyncio.run(parent())
    assert f"started in process {pid}, and this is a forked child" in said, said
    assert "create a new Producer in the child" in said and "SyncProducer" not in said, said


@pytest.mark.parametrize("how", ["send", "send_many", "send_and_wait"])
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_forked_child_running_its_copy_of_the_loop_cannot_send(
    tansu_broker: TansuBroker, topic: str, loop_kind: str, how: str
) -> None:
    # The child ran the parent's loop (its copy) and its send was taken: under the parent's
    # producer id and sequence numbers, so the parent's next record was acknowledged as a
    # duplicate of the child's, with no offset, and never written.
    loop, producer = started_on_a_loop_of_its_own(tansu_broker.bootstrap, topic, loop_kind)

    async def child() -> str:
        try:
            if how == "send":
                await producer.send(topic, b"from the child")
            elif how == "send_many":
                await producer.send_many(topic, [b"from the child"])
            else:
                await asyncio.wait_for(producer.send_and_wait(topic, b"from the child"), 10)
        except RuntimeError as exc:
            return f"refused: {exc}"
        except BaseException as exc:
            return f"taken, then {exc!r}"
        finally:
            await producer.close()  # the parent's to close: nothing happens here
        return "taken"

    said = in_a_forked_child(lambda: loop.run_until_complete(child()))
    try:
        after = loop.run_until_complete(asyncio.wait_for(producer.send_and_wait(topic, b"parent after"), 30))
    finally:
        loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
        loop.close()
    assert said.startswith(REFUSED), said
    assert after.offset == 1
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known", b"parent after"]


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_forked_child_running_its_copy_of_the_loop_sends_nothing_of_the_parents(
    tansu_broker: TansuBroker, topic: str, idempotent: bool
) -> None:
    # The copy of the sender task sent the parent's lingering batch from the child: without
    # idempotence the record was written twice; with it, the parent's was acknowledged with no
    # offset, as a duplicate.
    loop = asyncio.new_event_loop()
    options: dict[str, Any] = {} if idempotent else {"enable_idempotence": False, "acks": 1}
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap, linger_ms=200, **options)
    loop.run_until_complete(producer.start())
    loop.run_until_complete(producer.send_and_wait(topic, b"known"))
    lingering = loop.run_until_complete(producer.send(topic, b"queued in the parent"))
    # The child's own work, no producer call, past the batch's linger (loop time).
    in_a_forked_child(lambda: loop.run_until_complete(asyncio.sleep(0.5)) or "")
    try:
        metadata = loop.run_until_complete(asyncio.wait_for(lingering, 30))
    finally:
        loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
        loop.close()
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known", b"queued in the parent"]
    assert metadata.offset == 1


@pytest.mark.parametrize(("loop_kind", "idempotent"), [("asyncio", False), ("uvloop", True)])
def test_a_child_running_its_copy_of_the_loop_leaves_the_parents_answers_alone(
    tansu_broker: TansuBroker, topic: str, loop_kind: str, idempotent: bool
) -> None:
    # The child's copies of the connection readers read the answer to the parent's request in
    # flight: the parent's request timed out, and its retry wrote the record twice (idempotent:
    # acknowledged as a duplicate, with no offset).
    import uvloop

    loop = asyncio.new_event_loop() if loop_kind == "asyncio" else uvloop.new_event_loop()
    options: dict[str, Any] = {} if idempotent else {"enable_idempotence": False, "acks": 1}
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap, request_timeout_ms=3000, **options)
    loop.run_until_complete(producer.start())
    loop.run_until_complete(producer.send_and_wait(topic, b"known"))
    future, sent = request_in_flight(loop, producer, topic)
    in_a_forked_child(lambda: loop.run_until_complete(asyncio.sleep(0.3)) or "")  # its own work
    try:
        metadata = loop.run_until_complete(asyncio.wait_for(future, 30))
    finally:
        loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
        loop.close()
    assert metadata.offset >= 1
    assert sorted(r.value for r in read_topic(tansu_broker.bootstrap, topic)) == sorted([b"known", *sent])


def test_a_child_leaving_asyncio_run_leaves_the_parents_connections_alone(
    tansu_broker: TansuBroker, topic: str
) -> None:
    # os.fork() inside asyncio.run(), the child leaving it the ordinary way: asyncio.run()
    # cancelled the copy of the sender, which closed the copied connections, and each closed
    # transport took the parent's socket out of the epoll instance the two share. The parent's
    # next request timed out, and its retry wrote the record twice.
    parent = os.getpid()

    async def scenario() -> None:
        async with Producer(
            bootstrap_servers=tansu_broker.bootstrap, request_timeout_ms=3000, enable_idempotence=False, acks=1
        ) as producer:
            await producer.send_and_wait(topic, b"known")
            pid = os.fork()
            if pid == 0:
                return  # the child's work is done
            os.waitpid(pid, 0)
            await asyncio.wait_for(producer.send_and_wait(topic, b"parent after"), 30)

    try:
        asyncio.run(scenario())
    finally:
        if os.getpid() != parent:
            os._exit(0)
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known", b"parent after"]


def registered(loop: asyncio.AbstractEventLoop) -> list[int]:
    """The descriptors the kernel's epoll instance under ``loop`` watches (Linux's fdinfo)."""
    epoll = loop._selector._selector.fileno()  # type: ignore[attr-defined]
    with open(f"/proc/self/fdinfo/{epoll}") as info:
        return sorted(int(line.split()[1]) for line in info if line.startswith("tfd:"))


def once_polling(thread: int) -> None:
    """Returns once ``thread`` (the loop's, by native id) sleeps in epoll_wait: a wake-up handed
    over sooner finds the loop awake anyway. (Bounded: a kernel that names no wait channel.)"""
    for _ in range(5000):
        with open(f"/proc/self/task/{thread}/wchan") as channel:
            if "epoll" in channel.read():
                break
        time.sleep(0.001)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="epoll is Linux's")
def test_a_child_leaving_asyncio_run_leaves_the_parents_loop_awake(tansu_broker: TansuBroker, topic: str) -> None:
    # The child's copy of the loop shared the parent's epoll instance: leaving asyncio.run(), it
    # took out of it the parent loop's self-pipe (its loop.close()) and the socket of a connect
    # still under way (its cancellations). The parent then slept through what its threads handed
    # it (the getaddrinfo of its next connect) and through that connect, until a timer woke it:
    # about 11 s for a producer started beside the fork.
    parent = os.getpid()

    async def scenario() -> tuple[list[int], list[int]]:
        loop = asyncio.get_running_loop()
        async with Producer(bootstrap_servers=tansu_broker.bootstrap) as producer:
            await producer.send_and_wait(topic, b"known")
            second = Producer(bootstrap_servers=tansu_broker.bootstrap)
            starting = asyncio.create_task(second.start())
            await asyncio.sleep(0)  # its first connect begun
            before = registered(loop)
            pid = os.fork()
            if pid == 0:
                return [], []  # the child's work is done
            os.waitpid(pid, 0)  # (blocking: the loop runs nothing meanwhile)
            after = registered(loop)
            # A thread's wake-up (as getaddrinfo's), handed over while the loop sleeps:
            await asyncio.wait_for(loop.run_in_executor(None, once_polling, threading.get_native_id()), 30)
            await asyncio.wait_for(starting, 30)
            try:
                await asyncio.wait_for(second.send_and_wait(topic, b"second"), 30)
            finally:
                await second.close()
            await asyncio.wait_for(producer.send_and_wait(topic, b"parent after"), 30)
        return before, after

    try:
        before, after = asyncio.run(scenario())
    finally:
        if os.getpid() != parent:
            os._exit(0)
    assert after == before
    assert sorted(r.value for r in read_topic(tansu_broker.bootstrap, topic)) == [b"known", b"parent after", b"second"]


def test_a_childs_copy_of_a_connect_under_way_writes_nothing_into_the_parents_stream(
    tansu_broker: TansuBroker, topic: str
) -> None:
    # Forked while the bootstrap connect's SYN was unanswered (no socket of a connection to
    # detach yet), a child running its copy of the loop saw the connect complete too: its copy
    # wrote ApiVersions into the parent's connection (a TLS hello, into the parent's handshake)
    # and read the answers. Loopback TCP: a relay to the broker whose listener's accept queue is
    # full drops SYNs until it accepts; it notes the api key of every request on its first link.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())  # the queue is full
    requests: list[int] = []

    def relay() -> None:
        listener.accept()[0].close()  # the filler's: the producer's SYN is taken next
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", tansu_broker.port))
        threading.Thread(target=lambda: _pump(upstream, client, None), daemon=True).start()
        _pump(client, upstream, requests)

    loop = asyncio.new_event_loop()
    producer = Producer(bootstrap_servers=f"127.0.0.1:{listener.getsockname()[1]}")
    loop.run_until_complete(producer.start())
    first = loop.create_task(producer.send_and_wait(topic, b"first"))
    while not any(key.events & selectors.EVENT_WRITE for key in loop._selector.get_map().values()):  # type: ignore[attr-defined]
        loop.run_until_complete(asyncio.sleep(0))  # until the connect waits for the SYN's answer
    (node,) = producer._pool._nodes.values()
    connecting = node.connecting
    assert connecting is not None

    pid = os.fork()
    if pid == 0:
        try:  # its own work: until its copy of the connect is done (or given up)
            loop.run_until_complete(asyncio.wait([connecting], timeout=30))
        finally:
            os._exit(0)
    threading.Thread(target=relay, daemon=True).start()
    os.waitpid(pid, 0)
    try:
        loop.run_until_complete(asyncio.wait_for(first, 30))
    finally:
        loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
        loop.close()
        filler.close()
        listener.close()
    assert requests[:2] == [API_VERSIONS, METADATA], requests  # the parent's, once
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"first"]


API_VERSIONS, METADATA = 18, 3


def _pump(source: socket.socket, to: socket.socket, requests: list[int] | None) -> None:
    """Forward ``source`` to ``to``; ``requests``: note each request's api key (a frame each)."""
    pending = b""
    while data := source.recv(65536):
        if requests is not None:  # noted before it is forwarded: before its answer comes back
            pending += data
            while len(pending) >= 6 and len(pending) >= 4 + int.from_bytes(pending[:4], "big"):
                requests.append(int.from_bytes(pending[4:6], "big"))
                pending = pending[4 + int.from_bytes(pending[:4], "big") :]
        to.sendall(data)
    with contextlib.suppress(OSError):
        to.shutdown(socket.SHUT_WR)


def test_a_childs_copy_of_a_transaction_writes_nothing_into_the_parents_stream(
    tansu_broker: TansuBroker, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The copy of the task adding the partition to the transaction wrote AddPartitionsToTxn on
    # the parent's connection, under the correlation id the parent's next request took too: the
    # parent dropped the connection as malformed and retried what it had on it.
    loop = asyncio.new_event_loop()
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap, transactional_id=f"fork-{uuid.uuid4().hex[:8]}")
    loop.run_until_complete(producer.start())
    producer.begin_transaction()
    loop.run_until_complete(producer.send(topic, b"in the transaction"))
    in_a_forked_child(lambda: loop.run_until_complete(asyncio.sleep(0)) or "")  # brief work of its own
    with caplog.at_level(logging.INFO, logger="aioprod"):
        try:
            loop.run_until_complete(asyncio.wait_for(producer.commit_transaction(), 30))
        finally:
            loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
            loop.close()
    assert [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()] == []
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"in the transaction"]


PREPARED = PreparedTransaction("some-prepared-txn", 12345, 0)


def test_a_prepared_transaction_call_in_a_forked_child_is_refused(tansu_broker: TansuBroker, topic: str) -> None:
    # It ran on the parent's connections (FindCoordinator, EndTxn written into the parent's
    # streams) and timed out; closing the child's copies unwatched the parent's sockets.
    loop = asyncio.new_event_loop()
    producer = Producer(
        bootstrap_servers=tansu_broker.bootstrap,
        max_block_ms=3000,
        request_timeout_ms=3000,
        enable_idempotence=False,
        acks=1,
    )
    loop.run_until_complete(producer.start())
    loop.run_until_complete(producer.send_and_wait(topic, b"known"))

    def abort_in_the_child() -> str:
        try:
            loop.run_until_complete(producer.abort_prepared_transaction(PREPARED))
        except RuntimeError as exc:
            return f"refused: {exc}"
        return "taken"

    said = in_a_forked_child(abort_in_the_child)
    try:
        loop.run_until_complete(asyncio.wait_for(producer.send_and_wait(topic, b"parent after"), 30))
    finally:
        loop.run_until_complete(asyncio.wait_for(producer.close(), 30))
        loop.close()
    assert said.startswith(REFUSED), said
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"known", b"parent after"]


def test_metrics_in_a_child_forked_from_async_code_answer(tansu_broker: TansuBroker, topic: str) -> None:
    # The copied loop says it is running, so the snapshot was handed to it and waited for: 10 s,
    # then TimeoutError "is the loop blocked?". metrics() is documented safe from anywhere.
    async def main() -> str:
        async with Producer(bootstrap_servers=tansu_broker.bootstrap) as producer:
            await producer.send_and_wait(topic, b"known")
            return in_a_forked_child(lambda: f"{producer.metrics()['record-send-total']:.0f}")

    assert asyncio.run(main()) == "1"


def test_the_statistics_callback_is_not_called_in_a_forked_child(tansu_broker: TansuBroker, topic: str) -> None:
    # The copy of the reporter task called the user's callback in the child, with the parent's
    # figures as of the fork, as if they were the producer's.
    calls: list[int] = []
    loop = asyncio.new_event_loop()
    producer = Producer(
        bootstrap_servers=tansu_broker.bootstrap,
        statistics_interval_ms=100,
        statistics_callback=lambda snapshot: calls.append(os.getpid()),
    )
    loop.run_until_complete(producer.start())
    loop.run_until_complete(producer.send_and_wait(topic, b"known"))

    def child() -> str:
        calls.clear()
        loop.run_until_complete(asyncio.sleep(0.5))  # its own work, five intervals long
        return str(len(calls))

    said = in_a_forked_child(child)
    loop.run_until_complete(producer.close())
    loop.close()
    assert said == "0"


def test_a_producer_closed_before_the_fork_says_closed_in_the_child(tansu_broker: TansuBroker, topic: str) -> None:
    loop = asyncio.new_event_loop()
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap)
    loop.run_until_complete(producer.start())
    loop.run_until_complete(producer.close())
    loop.close()

    async def send() -> str:
        try:
            await producer.send(topic, b"x")
        except Exception as exc:
            return type(exc).__name__
        return "taken"

    assert asyncio.run(send()) == ProducerClosedError.__name__
    assert in_a_forked_child(lambda: asyncio.run(send())) == ProducerClosedError.__name__


def test_the_childs_detached_sockets_do_not_outlive_an_exec(tansu_broker: TansuBroker, topic: str) -> None:
    # The descriptors the child's copies were detached onto were inheritable (dup2's default):
    # a child that forks and execs handed the new program one socket per broker connection.
    import ast
    import sys

    loop = asyncio.new_event_loop()
    producer = Producer(bootstrap_servers=tansu_broker.bootstrap)
    loop.run_until_complete(producer.start())
    loop.run_until_complete(producer.send_and_wait(topic, b"known"))
    ours = [conn._writer.transport.get_extra_info("socket").fileno() for conn in producer._pool.connections()]
    assert ours
    probe = (  # (the descriptor listdir reads with is gone by the time it is looked at)
        "import os; print([int(f) for f in os.listdir('/proc/self/fd') "
        "if os.path.islink('/proc/self/fd/' + f) and os.readlink('/proc/self/fd/' + f).startswith('socket:')])"
    )
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # only execs: it never touches the producer
        try:
            os.dup2(w, 1)
            os.execv(sys.executable, [sys.executable, "-c", probe])
        finally:
            os._exit(1)
    os.close(w)
    os.waitpid(pid, 0)
    sockets = ast.literal_eval(os.read(r, 8192).decode())
    os.close(r)
    loop.run_until_complete(producer.close())
    loop.close()
    assert [fd for fd in sockets if fd in ours] == []

"""The producer's connections, one per broker, with reconnect backoff.

Both the sender and the metadata refresher take connections from here; connecting happens
in a background task per node, so a slow or dead broker never stalls the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from aioprod.config import ProducerConfig
from aioprod.errors import AuthenticationError, KafkaConnectionError, KafkaError, ProducerClosedError
from aioprod.event_log import ClientLogger
from aioprod.metrics import ProducerMetrics
from aioprod.net.auth import ConnectionSecurity
from aioprod.net.connection import BrokerConnection

log = logging.getLogger(__name__)

#: The longest :meth:`ConnectionPool.close` lets a connection close cleanly, in seconds.
CLOSE_GRACE = 1.0


@dataclass(slots=True)
class _NodeState:
    host: str
    port: int
    connection: BrokerConnection | None = None
    connecting: asyncio.Task[None] | None = None
    failures: int = 0
    next_attempt: float = 0.0
    last_attempt: float = 0.0
    #: A connection attempt is under way (not just waiting out its backoff).
    attempting: bool = False
    #: The connection open() is under way on (connected, negotiating): a forked child detaches it too.
    opening: BrokerConnection | None = None
    last_error: KafkaError | None = None
    #: Its connection was retired for being idle: its close, and opening the next one, are
    #: neither failures nor news.
    idled: bool = False
    #: Until when the broker throttles this client (KIP-219), kept for its next connection: a
    #: connection closed while throttled (idle, or lost) must not start the next one unthrottled.
    throttled_until: float = 0.0
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def wake_waiters(self) -> None:
        """Every get() waiting for the node looks again."""
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)


class ConnectionPool:
    """node id → connection. Bootstrap servers get negative ids, as in the Java client."""

    def __init__(
        self,
        config: ProducerConfig,
        on_change: Callable[[], None] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        metrics: ProducerMetrics | None = None,
    ) -> None:
        self._config = config
        self._log = ClientLogger(log, config.client_id)
        self._nodes: dict[int, _NodeState] = {}
        self._on_change = on_change or (lambda: None)
        self._on_disconnect = on_disconnect or (lambda: None)
        self._closed = False
        #: What close_now() closed, for close() to wait for (closing drops it from its node).
        self._closing: list[BrokerConnection] = []
        self._security = ConnectionSecurity.from_config(config)
        self._metrics = metrics if metrics is not None else ProducerMetrics(config)
        #: connections_max_idle_ms in seconds (None: never): a connection with nothing in flight
        #: for that long is closed, before a load balancer or NAT drops it without a word (the
        #: next request would then wait out request_timeout_ms).
        idle_ms = config.connections_max_idle_ms  # 0 (librdkafka's) or negative (Java's): never
        self._idle_limit = idle_ms / 1000 if idle_ms > 0 else None
        self._idle_timer: asyncio.TimerHandle | None = None
        #: The connection opened last, kept once closed for what it negotiated (API versions, the
        #: cluster's finalized features): an idle close can leave no connection open to ask.
        self.last_opened: BrokerConnection | None = None
        #: Run on every connection opened, before it is used (the producer's check that the
        #: cluster behind the address is still the one it numbers batches for).
        self.confirm_cluster: Callable[[BrokerConnection], Awaitable[None]] | None = None

    def set_address(self, node_id: int, host: str, port: int) -> None:
        state = self._nodes.get(node_id)
        if state is None:
            self._nodes[node_id] = _NodeState(host, port)
        elif (state.host, state.port) != (host, port):
            state.host, state.port = host, port
            if state.connection is not None:
                # Still the broker: its answers in flight are taken, then the next connection
                # goes to the new address (Java keeps the old one until it drops).
                state.connection.retire(KafkaConnectionError(f"broker {node_id} moved to {host}:{port}"))

    def forget_absent(self, live: Collection[int]) -> list[int]:
        """Forget the brokers (ids >= 0) the cluster no longer names that have nothing open or
        under way, so that brokers replaced over the producer's life leave no state per id
        ever seen; returns their ids. A connection still open is kept: a broker that answers
        is not dropped on one answer's word, and one that left closes it."""
        gone = []
        for node_id, state in list(self._nodes.items()):
            if node_id < 0 or node_id in live or state.attempting or state.waiters:
                continue
            if (state.connection is not None and not state.connection.closed) or (
                state.connecting is not None and not state.connecting.done()
            ):
                continue
            del self._nodes[node_id]
            gone.append(node_id)
        return gone

    def retire_all(self, error: KafkaError) -> None:
        """Every open connection takes no new request, and closes once its answers are in (the
        next one to its node is opened at once)."""
        for state in self._nodes.values():
            if state.connection is not None and not state.connection.closed:
                state.connection.retire(error)

    def connection(self, node_id: int) -> BrokerConnection | None:
        """The ready connection to ``node_id``, or None (then a connect is started)."""
        state = self._nodes.get(node_id)
        if state is None:
            return None
        conn = state.connection
        if conn is not None and not conn.closed:
            # A retired connection (its broker moved) takes only its answers; get() waits for
            # it to close, then connects to the new address.
            return None if conn.retiring else conn
        self._start_connect(node_id, state)
        return None

    def is_connected(self, node_id: int) -> bool:
        state = self._nodes.get(node_id)
        return state is not None and state.connection is not None and not state.connection.closed

    def in_flight(self, node_id: int) -> int:
        state = self._nodes.get(node_id)
        if state is None or state.connection is None or state.connection.closed:
            return -1
        return state.connection.in_flight_count

    def connections(self) -> list[BrokerConnection]:
        """Every open connection."""
        return [s.connection for s in self._nodes.values() if s.connection is not None and not s.connection.closed]

    def ready_load(self, node_id: int) -> int | None:
        """Requests in flight on a connection that can take one more now, else None."""
        state = self._nodes.get(node_id)
        conn = None if state is None else state.connection
        if conn is None or not conn.can_send_more():
            return None
        return conn.in_flight_count

    def connecting(self, node_id: int) -> bool:
        """A connection attempt is under way (a reconnect still in its backoff is not)."""
        state = self._nodes.get(node_id)
        return state is not None and state.attempting

    def can_connect(self, node_id: int, now: float) -> bool:
        """No connection, none being made, and not backing off after a failure."""
        state = self._nodes.get(node_id)
        return (
            state is not None
            and (state.connection is None or state.connection.closed)
            and not state.attempting
            and state.next_attempt <= now
        )

    def last_attempt(self, node_id: int) -> float:
        state = self._nodes.get(node_id)
        return 0.0 if state is None else state.last_attempt

    def backing_off(self, node_id: int, now: float) -> bool:
        state = self._nodes.get(node_id)
        return state is not None and state.connection is None and state.next_attempt > now

    def attempt_under_way(self, node_id: int) -> str | None:
        """The node's connection attempt under way, what it is at and for how long: a wait that
        runs out before the attempt's first failure has nothing else to say."""
        state = self._nodes.get(node_id)
        conn = None if state is None else state.opening
        if state is None or conn is None:
            return None
        waited = asyncio.get_running_loop().time() - state.last_attempt
        return f"{state.host}:{state.port}, {waited * 1000:.0f} ms {conn.setting_up}"

    def last_error(self, node_id: int) -> KafkaError | None:
        state = self._nodes.get(node_id)
        return None if state is None else state.last_error

    async def get(self, node_id: int) -> BrokerConnection:
        """Wait for a connection to ``node_id``; raises the connect error on failure."""
        while True:
            if self._closed:
                # Not retriable: a caller retrying (a coordinator request of close()'s abort) would
                # back off until its own deadline for a connection that never comes.
                raise ProducerClosedError("the producer is closing: no new connections")
            conn = self.connection(node_id)
            if conn is not None:
                return conn
            state = self._nodes.get(node_id)
            if state is None:  # forgotten as it left the cluster: the caller looks it up again
                raise KafkaConnectionError(f"{describe_node(node_id)} is not in the cluster's metadata")
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            state.waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in state.waiters:
                    state.waiters.remove(waiter)
            if state.connection is None and state.last_error is not None:
                raise state.last_error

    def _start_connect(self, node_id: int, state: _NodeState) -> None:
        if self._closed or (state.connecting is not None and not state.connecting.done()):
            return
        state.connection = None
        state.connecting = asyncio.get_running_loop().create_task(
            self._connect(node_id, state), name=f"aioprod-connect-{node_id}"
        )

    async def _connect(self, node_id: int, state: _NodeState) -> None:
        loop = asyncio.get_running_loop()
        delay = state.next_attempt - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        state.last_attempt = loop.time()
        conn = BrokerConnection(
            node_id,
            state.host,
            state.port,
            client_id=self._config.client_id,
            request_timeout=self._config.request_timeout_ms / 1000,
            max_in_flight=self._config.max_in_flight_requests_per_connection,
            on_ready=self._on_change,
            security=self._security,
            metrics=self._metrics.broker(node_id),
        )
        setup_timeout = connection_setup_timeout(self._config, state.failures + 1)
        state.attempting = True
        state.opening = conn
        metrics, events = self._metrics, self._metrics.events
        try:
            await conn.open(setup_timeout, attempt=state.failures)
            if self.confirm_cluster is not None:
                try:
                    # Not before the broker's throttle (KIP-219) carried over from the node's last
                    # connection has ended: the check is a request like any other.
                    throttled = state.throttled_until - loop.time()
                    if throttled > 0:
                        await asyncio.sleep(throttled)
                    await self.confirm_cluster(conn)
                except BaseException as problem:  # a cancellation (close()) too: it is no one's connection yet
                    conn.close(problem if isinstance(problem, KafkaError) else None)
                    raise
        except Exception as failure:
            if isinstance(failure, KafkaError):
                exc = failure
            else:  # still a failed attempt, backed off: never a reconnect at once
                conn.close()
                exc = KafkaConnectionError(
                    f"cannot connect to {describe_node(node_id)} at {state.host}:{state.port}: {failure!r}"
                )
                exc.__cause__ = failure
            if (conn.host, conn.port) != (state.host, state.port) and not self._closed:
                # The broker moved while this failed: the old address's failure says nothing of
                # the new one, not tried yet. The waiters, woken below, connect there at once.
                self._log.debug("%s: attempt to its old address failed: %s", describe_node(node_id), exc)
                state.last_error = None
                return
            state.failures += 1
            state.last_error = exc
            backoff = self._backoff(state.failures)
            state.next_attempt = loop.time() + backoff
            if isinstance(exc, AuthenticationError):
                metrics.record_authentication(False, loop.time())
            # Promptly (a wrong address is not silence until max_block_ms), then rate-limited.
            what, detail = _connect_failure(exc, conn.established)
            events.problem(
                log,
                ("connect", node_id),
                what,
                "%s (%s:%s): %s: %s; retrying in %.0f ms (attempt %d)",
                describe_node(node_id),
                state.host,
                state.port,
                what,
                detail,
                backoff * 1000,
                state.failures,
            )
            if not self._closed:
                # As a lost connection: the broker may be gone for good and its partitions
                # led elsewhere now (the Java client refreshes on every failed connect too).
                self._on_disconnect()
        else:
            if self._closed:
                conn.close()
                return
            if (conn.host, conn.port) != (state.host, state.port):
                # The broker moved while this connected (set_address): it is a connection to
                # where the broker was, maybe another broker now. The waiters and the sender,
                # woken below, connect to the new address at once.
                conn.close(KafkaConnectionError(f"broker {node_id} moved to {state.host}:{state.port}"))
                state.last_error = None  # an earlier attempt's failure says nothing of the new address
                return
            now = loop.time()
            metrics.record_connection(True, now)
            if self._security is not None and self._security.authenticator is not None:
                metrics.record_authentication(True, now)
            if (
                not events.resolved(
                    log,
                    ("connect", node_id),
                    "connected to %s at %s:%s after %d failed attempts",
                    describe_node(node_id),
                    state.host,
                    state.port,
                    state.failures,
                )
                and not state.idled
            ):
                events.note(
                    log,
                    ("connected", node_id),
                    "connected to %s at %s:%s",
                    describe_node(node_id),
                    state.host,
                    state.port,
                )
            state.connection = conn
            self.last_opened = conn
            conn.throttled_until = max(conn.throttled_until, state.throttled_until)
            state.idled = False
            state.failures = 0
            state.last_error = None
            conn.on_close(lambda c, err: self._on_connection_closed(node_id, c, err))
            self._watch_idle()
        finally:
            state.attempting = False
            state.opening = None
            state.wake_waiters()
            self._on_change()

    def _watch_idle(self) -> None:
        """Have the idle check run when the least recently used connection may be idle."""
        if self._idle_limit is None or self._closed or self._idle_timer is not None:
            return
        # A retired one (idle, or its broker moved) closes by itself once it can (its writes out,
        # a re-authentication over): counted here, its past due time re-armed the timer at once.
        connections = [conn for conn in self.connections() if not conn.retiring]
        if connections:
            loop = asyncio.get_running_loop()
            # One with requests in flight is in use now: its answer makes it used again.
            now = loop.time()
            due = min(now if conn.in_flight_count else conn.last_used for conn in connections) + self._idle_limit
            self._idle_timer = loop.call_at(due, self._close_idle)

    def _close_idle(self) -> None:
        self._idle_timer = None
        limit = self._idle_limit
        assert limit is not None
        now = asyncio.get_running_loop().time()
        for state in self._nodes.values():
            conn = state.connection
            # As _watch_idle reckons the due time: now - limit is not always last_used + limit - limit.
            if conn is not None and not conn.closed and not conn.in_flight_count and conn.last_used + limit <= now:
                state.idled = True
                conn.retire(KafkaConnectionError(f"unused for connections_max_idle_ms ({limit * 1000:.0f} ms)"))
        self._watch_idle()

    def _on_connection_closed(self, node_id: int, conn: BrokerConnection, error: KafkaError) -> None:
        state = self._nodes.get(node_id)
        self._metrics.record_connection(False, asyncio.get_running_loop().time())
        idled = state is not None and state.connection is conn and state.idled
        if state is not None and state.connection is conn:
            state.connection = None
            state.throttled_until = conn.throttled_until
            if conn.retiring:  # moved or idle: no failure, and get() connects (to the new address) now
                state.wake_waiters()
            else:
                state.last_error = error
                state.failures += 1
                state.next_attempt = asyncio.get_running_loop().time() + self._backoff(1)
        if self._closed or idled:
            self._log.debug("connection to %s closed: %s", describe_node(node_id), error)
        else:
            self._metrics.events.note(
                log, ("lost", node_id), "connection to %s lost: %s", describe_node(node_id), error
            )
            # A broker that went away may come back with other leaders, or without the
            # topics it had (a restarted memory broker): look at the cluster again.
            self._on_disconnect()
        self._on_change()

    def _backoff(self, failures: int) -> float:
        base = self._config.reconnect_backoff_ms / 1000
        cap = self._config.reconnect_backoff_max_ms / 1000
        return exponential_backoff(base, cap, failures)

    def forked(self) -> None:
        """In a forked child, whose copies of the sockets are the parent's: no new connection,
        and every copied socket detached (see BrokerConnection.disown), so that nothing the
        child runs (its copy of the loop) reads the parent's answers or writes into its stream."""
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        for state in self._nodes.values():
            for conn in (state.connection, state.opening):
                if conn is not None:
                    conn.disown()
            if state.connecting is not None and not state.connecting.done():
                # A connect under way has no socket to detach yet: its copy, run by the child's
                # loop, finished the parent's connect and wrote its ApiVersions (its TLS hello)
                # into the parent's stream, and read the answers. Cancelled, it touches nothing.
                # (Debug mode refuses a call from another thread than the loop's: the copy of a
                # loop run in a thread, which no thread runs here.)
                with contextlib.suppress(RuntimeError):
                    state.connecting.cancel()
        for conn in self._closing:
            conn.disown()

    async def settle(self, timeout: float) -> None:
        """Before a close: let every broker read the acks=0 requests written to it (at most
        ``timeout`` seconds), so that closing loses none of them."""
        waits = [asyncio.ensure_future(conn.acks_0_read()) for conn in self.connections()]
        if waits:
            _, late = await asyncio.wait(waits, timeout=timeout)
            for wait in late:
                wait.cancel()

    def close_now(self) -> None:
        """Stop connecting and close every connection, without waiting for either."""
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._security is not None and self._security.authenticator is not None:
            self._security.authenticator.close()
        for state in self._nodes.values():
            if state.connecting is not None:
                state.connecting.cancel()
            if state.connection is not None:
                self._closing.append(state.connection)
                state.connection.close()
            state.wake_waiters()  # get() wakes up and sees the pool closed

    async def close(self, grace: float = CLOSE_GRACE) -> None:
        """Close every connection and wait for them; a TLS close left waiting for the
        broker's close_notify after ``grace`` seconds is cut (the socket leaked otherwise)."""
        self.close_now()
        connecting = [state.connecting for state in self._nodes.values() if state.connecting is not None]
        if connecting:
            await asyncio.wait(connecting)
        connections, self._closing = self._closing, []
        closing = [asyncio.ensure_future(conn.wait_closed()) for conn in connections]
        if closing:
            await asyncio.wait(closing, timeout=grace)
            for conn, waiting in zip(connections, closing, strict=True):
                if not waiting.done():
                    conn.abort()
            await asyncio.wait(closing)


def _connect_failure(error: KafkaError, established: bool) -> tuple[str, str]:
    """What went wrong in a connection attempt, in a few words, and the details."""
    cause = error.__cause__
    detail = str(cause) if isinstance(cause, OSError) and not established else str(error)
    if isinstance(error, AuthenticationError):
        return "authentication failed", detail
    if established:
        return "handshake failed", detail
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused", detail
    if isinstance(cause, TimeoutError):
        return "connection timed out", str(error)
    if isinstance(cause, socket.gaierror):
        return "address not resolved", detail
    return "cannot connect", detail


def describe_node(node_id: int) -> str:
    """How logs name a node: ``broker 1``, or ``bootstrap server 2`` before metadata named it."""
    return f"broker {node_id}" if node_id >= 0 else f"bootstrap server {-node_id}"


def exponential_backoff(base: float, cap: float, attempts: int) -> float:
    """KIP-580: base * 2^(attempts-1) up to ``cap``, with ±20 % jitter so clients spread
    out, and never above ``cap`` (as Java's ExponentialBackoff)."""
    delay = min(cap, base * (2 ** min(max(0, attempts - 1), 62)))
    return float(min(cap, delay * random.uniform(0.8, 1.2)))


def connection_setup_timeout(config: ProducerConfig, attempts: int) -> float:
    """How long the ``attempts``-th connection attempt in a row may take to be established
    (Java's socket.connection.setup.timeout.ms): exponential per consecutive failure."""
    return exponential_backoff(
        config.socket_connection_setup_timeout_ms / 1000, config.socket_connection_setup_timeout_max_ms / 1000, attempts
    )

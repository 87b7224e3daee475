"""The coordinators of transactional ids and consumer groups: finding them, and asking them
until they answer without a retriable error.

The transactional producer sends every InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit and EndTxn through a :class:`Coordinators`; so do the calls that end a
prepared transaction by its handle, and the look-up of a group's committed offsets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aioprod.cluster.metadata import Metadata
from aioprod.config import ProducerConfig
from aioprod.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaError,
    KafkaTimeoutError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
)
from aioprod.event_log import ClientLogger
from aioprod.net.connection import BrokerConnection
from aioprod.net.pool import ConnectionPool, exponential_backoff
from aioprod.producer.batch import TopicPartition
from aioprod.protocol.messages import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    FindCoordinatorResponseCoordinator,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchResponse,
)
from aioprod.protocol.schema import Request, Response

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Response)

GROUP, TRANSACTION = 0, 1  # FindCoordinator key types

#: Coordinators remembered, the most recently used: a producer that ends prepared transactions
#: of many transactional ids (or sends offsets of many groups) looks each one up once, and
#: keeps only the latest ones.
MAX_CACHED = 128

#: Answers after which the request is sent again, the coordinator looked up anew first.
FIND_AGAIN = frozenset({CoordinatorNotAvailableError.code, NotCoordinatorError.code})
#: Answers after which the request is sent again as it is, after a backoff.
RETRY = frozenset(
    {
        CoordinatorLoadInProgressError.code,
        ConcurrentTransactionsError.code,
        UnknownTopicOrPartitionError.code,
        OperationNotAttemptedError.code,
        7,  # REQUEST_TIMED_OUT
        88,  # UNSTABLE_OFFSET_COMMIT: a transaction with offsets of the group is being ended
    }
)


class Coordinators:
    """Finds the coordinator of a key (cached until it moves) and sends it requests.

    ``fatal_codes`` are answers that end the caller for good: ``on_fatal`` turns such an
    answer into the error raised (the transactional producer fails itself there); other
    answers that are not retriable are raised as they are.
    """

    def __init__(
        self,
        config: ProducerConfig,
        metadata: Metadata,
        pool: ConnectionPool,
        *,
        name: str,
        fatal_codes: frozenset[int] = frozenset(),
        on_fatal: Callable[[KafkaError], KafkaError] | None = None,
    ) -> None:
        self._config = config
        self._log = ClientLogger(log, config.client_id)
        self._metadata = metadata
        self._pool = pool
        self._name = name
        self._fatal_codes = fatal_codes
        self._on_fatal = on_fatal
        self._nodes: dict[tuple[int, str], int] = {}
        #: The last answer or connection error that made a request go again, for timeout messages.
        self.last_error: KafkaError | None = None

    async def node(self, key_type: int, key: str) -> int:
        """The node coordinating ``key`` (a transactional id or a group id)."""
        node = self._nodes.pop((key_type, key), None)
        if node is not None:
            self._nodes[(key_type, key)] = node  # the most recently used, last
            return node
        failures = 0
        while True:
            candidate = await self._metadata.node_for_request(self._waiting_for_room)
            try:
                conn = await self._pool.get(candidate)
                response: FindCoordinatorResponse = await conn.send(
                    FindCoordinatorRequest(key=key, key_type=key_type, coordinator_keys=[key])
                )
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                failures += 1
                await self._backoff(exc, failures)
                continue
            found: FindCoordinatorResponse | FindCoordinatorResponseCoordinator = (
                response.coordinators[0] if response.coordinators else response
            )
            code, node_id, host, port = found.error_code, found.node_id, found.host, found.port
            if not code and (node_id < 0 or not host or not 0 < port < 65536):
                # No coordinator named, though no error said so (a proxy dropping the error code):
                # node -1 is the producer's own id for its first bootstrap address, which taking
                # this answer would overwrite for good.
                code = CoordinatorNotAvailableError.code
            if code:
                said = f": {found.error_message}" if found.error_message else ""  # the broker's why (an ACL's)
                error = error_for_code(code, f"FindCoordinator for {key!r}{said}")
                self._raise_if_fatal(code, error)
                if not error.retriable:
                    raise error
                failures += 1
                await self._backoff(error, failures)
                continue
            self._pool.set_address(node_id, host, port)
            self._nodes[(key_type, key)] = node_id
            if len(self._nodes) > MAX_CACHED:
                del self._nodes[next(iter(self._nodes))]  # the least recently used
            return node_id

    async def connection(self, key_type: int, key: str) -> BrokerConnection:
        """A connection to the coordinator of ``key``, found again (with backoff) while the
        one known cannot be reached."""
        failures = 0
        while True:
            node = await self.node(key_type, key)
            try:
                return await self._pool.get(node)
            except KafkaError as exc:
                failures += 1
                await self.unreachable(key_type, key, exc, failures)

    async def request(
        self,
        key_type: int,
        key: str,
        build: Callable[[], Request],
        response_cls: type[R],
        error_codes: Callable[[R], list[int]],
        *,
        max_version: int | None = None,
        tolerate: frozenset[int] = frozenset(),
        concurrent_backoff: float | None = None,
        before: Callable[[BrokerConnection], Awaitable[None]] | None = None,
        on_wire: Callable[[asyncio.Future[R]], None] | None = None,
        lacking: Callable[[R], str | None] | None = None,
    ) -> R:
        """Send to the coordinator of ``key`` until it answers without a retriable error.
        An answer in ``tolerate`` is returned as it is; after CONCURRENT_TRANSACTIONS the wait
        is at most ``concurrent_backoff`` seconds, when given. ``before`` is awaited on the
        connection each try is sent on, first (it may raise to stop the request). ``on_wire``
        is given each try as it is sent: a try outlives the call's cancellation, so that its
        caller can wait for the answer to what was written. ``lacking`` says what an answer
        without error lacks (None: nothing): such an answer is asked again of the coordinator
        found again, as after COORDINATOR_NOT_AVAILABLE, and a timeout's "last answer" says so."""
        failures = 0
        while True:
            conn = await self.connection(key_type, key)
            try:
                if before is not None:
                    await before(conn)
                if on_wire is None:
                    response: R = await conn.send(build(), max_version=max_version)
                else:
                    sent: asyncio.Future[R] = asyncio.ensure_future(conn.send(build(), max_version=max_version))
                    sent.add_done_callback(mark_retrieved)
                    on_wire(sent)
                    response = await asyncio.shield(sent)
            except KafkaError as exc:
                failures += 1
                await self.unreachable(key_type, key, exc, failures)
                continue
            assert isinstance(response, response_cls)
            codes = [code for code in error_codes(response) if code]
            missing = None if codes or lacking is None else lacking(response)
            if missing is not None:
                failures += 1
                self._nodes.pop((key_type, key), None)
                name = type(response).__name__.removesuffix("Response")
                await self._backoff(KafkaError(f"{name} for {key!r} answered no error, but {missing}"), failures)
                continue
            if not codes or all(code in tolerate for code in codes):
                self.last_error = None
                return response
            code = next((c for c in codes if c in self._fatal_codes), None) or next(
                (c for c in codes if c not in FIND_AGAIN and c not in RETRY), codes[0]
            )
            error = error_for_code(code, f"{type(response).__name__.removesuffix('Response')} for {key!r}")
            self._raise_if_fatal(code, error)
            if code in FIND_AGAIN:
                self._nodes.pop((key_type, key), None)
            elif code not in RETRY:
                raise error
            failures += 1
            cap = concurrent_backoff if code == ConcurrentTransactionsError.code else None
            await self._backoff(error, failures, cap)

    async def unreachable(self, key_type: int, key: str, error: KafkaError, failures: int) -> None:
        """The coordinator of ``key`` could not be reached or answer: a retriable ``error`` means
        finding it again after a backoff; any other is raised."""
        if not error.retriable:
            raise error
        self._nodes.pop((key_type, key), None)
        await self._backoff(error, failures)

    def _waiting_for_room(self) -> None:
        """A wait, not a failure; but a deadline running out meanwhile says why (unless an
        earlier error says more)."""
        if self.last_error is None:
            self.last_error = KafkaTimeoutError(
                "no broker can take a request now: every connection is at its in-flight limit or backing off"
            )

    def _raise_if_fatal(self, code: int, error: KafkaError) -> None:
        """An answer in ``fatal_codes`` ends the caller, whichever request it came to."""
        if code in self._fatal_codes:
            raise error if self._on_fatal is None else self._on_fatal(error)

    async def _backoff(self, error: KafkaError, failures: int, cap: float | None = None) -> None:
        """Before the next try of one call, its ``failures``-th: each call counts its own, so
        that callers at once do not lengthen each other's backoffs."""
        self.last_error = error
        self._log.debug("%s: %s; trying again", self._name, error)
        delay = exponential_backoff(
            self._config.retry_backoff_ms / 1000, self._config.retry_backoff_max_ms / 1000, failures
        )
        await asyncio.sleep(delay if cap is None else min(cap, delay))


def mark_retrieved(future: asyncio.Future[Any]) -> None:
    """A done callback: its exception counts as retrieved (its caller may be gone, cancelled), so
    no "exception was never retrieved"; a later await still gets it."""
    if not future.cancelled():
        future.exception()


async def committed_offsets(coordinators: Coordinators, group_id: str) -> dict[TopicPartition, int]:
    """Every offset committed for ``group_id``: none for a group that never committed.

    Stable (KIP-447, OffsetFetch v7+): while a transaction that commits offsets of the group
    is being ended, the coordinator answers UNSTABLE_OFFSET_COMMIT and the request waits.
    """

    def fetch(stable: bool) -> Awaitable[OffsetFetchResponse]:
        return coordinators.request(
            GROUP,
            group_id,
            lambda: OffsetFetchRequest(
                group_id=group_id,
                topics=None,
                groups=[OffsetFetchRequestGroup(group_id=group_id, topics=None)],
                require_stable=stable,
            ),
            OffsetFetchResponse,
            _offset_fetch_codes,
        )

    try:
        response = await fetch(True)
    except UnsupportedVersionError:
        # A broker before Kafka 2.5 (OffsetFetch < v7) cannot wait for stable offsets: read
        # them as they are, as Java's OffsetFetchRequest.Builder falls back by default.
        response = await fetch(False)
    topics = response.groups[0].topics if response.groups else response.topics
    return {
        TopicPartition(topic.name, p.partition_index): p.committed_offset
        for topic in topics
        for p in topic.partitions
        if p.committed_offset >= 0
    }


def _offset_fetch_codes(response: OffsetFetchResponse) -> list[int]:
    """Group-level (v8+) or top-level (v2-v7), then per-partition error codes."""
    if response.groups:
        group = response.groups[0]
        return [group.error_code] + [p.error_code for t in group.topics for p in t.partitions]
    return [response.error_code] + [p.error_code for t in response.topics for p in t.partitions]

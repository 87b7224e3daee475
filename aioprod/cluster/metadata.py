"""The cluster snapshot and the metadata refresher.

One task owns refreshing: periodically (``metadata_max_age_ms``), and on demand when the
producer meets an unknown topic or a stale leader. Requests are single-flight and always
go to the least-loaded node; when no known broker can be reached, the bootstrap list is
tried again (its names re-resolved), so a cluster that moved is found again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from aioprod.config import ProducerConfig
from aioprod.errors import (
    AuthenticationError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
    error_for_code,
)
from aioprod.net.pool import ConnectionPool, exponential_backoff
from aioprod.protocol.messages import MetadataRequest, MetadataRequestTopic, MetadataResponse

log = logging.getLogger(__name__)

_FATAL_TOPIC_ERRORS = (InvalidTopicError.code, TopicAuthorizationFailedError.code)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int  # -1 while no leader is known
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: Mapping[int, PartitionInfo]
    #: Every partition id, sorted; and those whose leader is known.
    all_partitions: tuple[int, ...] = field(init=False)
    available_partitions: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        ids = tuple(sorted(self.partitions))
        object.__setattr__(self, "all_partitions", ids)
        object.__setattr__(self, "available_partitions", tuple(p for p in ids if self.partitions[p].leader >= 0))


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """An immutable view of the cluster; replaced whole on every refresh."""

    brokers: Mapping[int, Broker]
    topics: Mapping[str, TopicInfo]
    cluster_id: str | None = None
    controller_id: int = -1
    version: int = 0

    def leader_for(self, topic: str, partition: int) -> int | None:
        info = self.topics.get(topic)
        if info is None:
            return None
        part = info.partitions.get(partition)
        if part is None or part.leader < 0 or part.leader not in self.brokers:
            return None
        return part.leader


EMPTY_CLUSTER = ClusterSnapshot(MappingProxyType({}), MappingProxyType({}))


class Metadata:
    """Holds the current :class:`ClusterSnapshot`; its task refreshes it."""

    def __init__(self, config: ProducerConfig, pool: ConnectionPool) -> None:
        self._config = config
        self._pool = pool
        self.snapshot = EMPTY_CLUSTER
        self._topics: set[str] = set()
        self._topic_errors: dict[str, KafkaError] = {}
        self._need_update = asyncio.Event()
        self._updated: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[ClusterSnapshot], None]] = []
        self._failures = 0
        # Set while the last refresh failed to authenticate: waiting cannot fix credentials,
        # so callers fail at once instead of after max_block_ms (as the Java client does).
        self._auth_error: AuthenticationError | None = None
        self._bootstrap_ids = []
        for index, (host, port) in enumerate(config.bootstrap_servers):
            node_id = -1 - index
            pool.set_address(node_id, host, port)
            self._bootstrap_ids.append(node_id)

    def add_listener(self, callback: Callable[[ClusterSnapshot], None]) -> None:
        self._listeners.append(callback)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aioprod-metadata")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        if self._updated is not None and not self._updated.done():
            self._updated.cancel()

    def request_update(self) -> None:
        self._need_update.set()

    async def topic(self, topic: str, timeout: float) -> TopicInfo:
        """The topic's metadata, fetching it first if needed (up to ``timeout`` seconds)."""
        info = self.snapshot.topics.get(topic)
        if info is not None and info.partitions:
            return info
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._topics.add(topic)
        while True:
            error = self._topic_errors.get(topic) or self._auth_error
            if error is not None:
                raise error
            info = self.snapshot.topics.get(topic)
            if info is not None and info.partitions:
                return info
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise KafkaTimeoutError(
                    f"topic {topic!r} not present in metadata after {timeout * 1000:.0f} ms" + self._reachability_hint()
                )
            self.request_update()
            if self._updated is None or self._updated.done():
                self._updated = loop.create_future()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await asyncio.shield(self._updated)

    def _reachability_hint(self) -> str:
        if self.snapshot.brokers:
            return ""
        errors = [self._pool.last_error(n) for n in self._bootstrap_ids]
        seen = [str(e) for e in errors if e is not None]
        if seen:
            return f" (no broker reachable: {seen[0]})"
        return ""

    def least_loaded_node(self) -> int | None:
        """The connected node with fewest requests in flight, else one to connect to."""
        now = asyncio.get_running_loop().time()
        candidates = list(self.snapshot.brokers) or list(self._bootstrap_ids)
        if all(self._pool.backing_off(n, now) for n in candidates):
            # Everyone known is failing: go back to the bootstrap list (KIP-899).
            candidates = candidates + [n for n in self._bootstrap_ids if n not in candidates]
        random.shuffle(candidates)
        best, best_load = None, None
        for node in candidates:
            load = self._pool.in_flight(node)
            if load >= 0 and (best_load is None or load < best_load):
                best, best_load = node, load
        if best is not None:
            return best
        idle = [n for n in candidates if not self._pool.backing_off(n, now)]
        return idle[0] if idle else (candidates[0] if candidates else None)

    async def _run(self) -> None:
        max_age = self._config.metadata_max_age_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max_age):
                    await self._need_update.wait()
            self._need_update.clear()
            try:
                await self._refresh()
                self._failures = 0
                self._auth_error = None
            except KafkaError as exc:
                self._failures += 1
                if isinstance(exc, AuthenticationError):
                    self._auth_error = exc
                log.debug("metadata refresh failed: %s", exc)
                self._notify()
                await asyncio.sleep(
                    exponential_backoff(
                        self._config.retry_backoff_ms / 1000,
                        self._config.retry_backoff_max_ms / 1000,
                        self._failures,
                    )
                )
                self._need_update.set()
                continue
            # Topics still unknown or leaderless: look again after a backoff.
            if any(self._missing(t) for t in self._topics):
                await asyncio.sleep(self._config.retry_backoff_ms / 1000)
                self._need_update.set()

    def _missing(self, topic: str) -> bool:
        info = self.snapshot.topics.get(topic)
        return topic not in self._topic_errors and (
            info is None or not info.partitions or len(info.available_partitions) < len(info.partitions)
        )

    async def _refresh(self) -> None:
        node = self.least_loaded_node()
        if node is None:
            raise KafkaError("no broker address known")
        conn = await self._pool.get(node)
        request = MetadataRequest(
            topics=[MetadataRequestTopic(name=t) for t in sorted(self._topics)],
            allow_auto_topic_creation=self._config.allow_auto_create_topics,
        )
        response: MetadataResponse = await conn.send(request)
        self._apply(response)

    def _apply(self, response: MetadataResponse) -> None:
        brokers = {b.node_id: Broker(b.node_id, b.host, b.port, b.rack) for b in response.brokers}
        topics: dict[str, TopicInfo] = {}
        for t in response.topics:
            if t.name is None:
                continue
            if t.error_code in _FATAL_TOPIC_ERRORS:
                self._topic_errors[t.name] = error_for_code(t.error_code, f"topic {t.name!r}")
                continue
            self._topic_errors.pop(t.name, None)
            if t.error_code:
                log.debug("metadata for %s: %s", t.name, error_for_code(t.error_code))
            parts = {
                p.partition_index: PartitionInfo(
                    p.partition_index,
                    p.leader_id if p.error_code != 5 or p.leader_id >= 0 else -1,
                    p.leader_epoch,
                    tuple(p.replica_nodes),
                    tuple(p.isr_nodes),
                )
                for p in t.partitions
            }
            if parts:
                topics[t.name] = TopicInfo(t.name, MappingProxyType(parts))
        for b in brokers.values():
            self._pool.set_address(b.node_id, b.host, b.port)
        self.snapshot = ClusterSnapshot(
            MappingProxyType(brokers),
            MappingProxyType(topics),
            response.cluster_id,
            response.controller_id,
            self.snapshot.version + 1,
        )
        self._notify()
        for listener in self._listeners:
            listener(self.snapshot)

    def _notify(self) -> None:
        if self._updated is not None and not self._updated.done():
            self._updated.set_result(None)

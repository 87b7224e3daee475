"""The cluster snapshot and the metadata refresher.

One task owns refreshing: periodically (``metadata_max_age_ms``), and on demand when the
producer meets an unknown topic or a stale leader. Requests are single-flight and go to
the least-loaded node that can take a request now (never behind a connection's stuck
requests), else to a node worth connecting to; when no known broker can be reached, the
bootstrap list is tried again (its names re-resolved), so a cluster that moved is found
again. Demanded refreshes that bring nothing new back off exponentially, so a partition
that stays leaderless does not make a refresh every ``retry_backoff_ms``.

What an answer says is kept only if it is not older than what the producer already knows:
a partition's leader epoch never goes back (a lagging broker cannot undo a leader change
learned from a newer answer, Java's ``Metadata.updateLatestMetadata``), and a produce
response that names a newer leader (KIP-951) updates that partition at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import InitVar, dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from aioprod.config import ProducerConfig
from aioprod.errors import (
    AuthenticationError,
    InvalidTopicError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    PartitionNotFoundError,
    ProducerClosedError,
    TopicAuthorizationFailedError,
    _partitions_of,
    copy_error,
    error_for_code,
)
from aioprod.event_log import ClientLogger
from aioprod.metrics import ProducerMetrics
from aioprod.net.connection import BrokerConnection
from aioprod.net.pool import ConnectionPool, describe_node, exponential_backoff
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
    #: The brokers the answer named: a leader not among them is no leader (Java's Cluster has no
    #: leader Node for it, so availablePartitionsForTopic leaves the partition out). None: any id >= 0.
    brokers: InitVar[Collection[int] | None] = None
    #: Every partition id, sorted; and those whose leader is known.
    all_partitions: tuple[int, ...] = field(init=False)
    available_partitions: tuple[int, ...] = field(init=False)

    def __post_init__(self, brokers: Collection[int] | None) -> None:
        ids = tuple(sorted(self.partitions))
        object.__setattr__(self, "all_partitions", ids)
        object.__setattr__(
            self,
            "available_partitions",
            tuple(
                p
                for p in ids
                if self.partitions[p].leader >= 0 and (brokers is None or self.partitions[p].leader in brokers)
            ),
        )


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


#: What brokers name before their cluster has an id: none yet. Redpanda answers this until the
#: cluster id (a cluster config property) reaches it, each broker at its own moment; taken for
#: an id, it looked like a cluster replaced, then one already left.
PLACEHOLDER_CLUSTER_IDS = frozenset({"redpanda.initializing"})


def is_cluster_id(cluster_id: str | None) -> bool:
    """A cluster's own id, not "none" (Kafka's null, an empty string, a placeholder)."""
    return bool(cluster_id) and cluster_id not in PLACEHOLDER_CLUSTER_IDS


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


#: The shortest wait between two looks of node_for_request() for a node (ms).
MIN_LOOK_MS = 10


class _Refusal(NamedTuple):
    """The error answers refuse a topic with, and the loop times of the first and the last answer
    in a row that did."""

    error: KafkaError
    first: float
    last: float


class Metadata:
    """Holds the current :class:`ClusterSnapshot`; its task refreshes it."""

    def __init__(self, config: ProducerConfig, pool: ConnectionPool, metrics: ProducerMetrics | None = None) -> None:
        self._config = config
        self._log = ClientLogger(log, config.client_id)
        self._pool = pool
        self._metrics = metrics if metrics is not None else ProducerMetrics(config)
        #: Topics whose metadata came with a topic-level error: how many answers in a row, and
        #: the last error (for the message of a wait that times out).
        self._troubled: dict[str, tuple[int, KafkaError]] = {}
        self.snapshot = EMPTY_CLUSTER
        #: Topics to describe in refreshes, with when each was last used (loop time).
        self._topics: dict[str, float] = {}
        #: Topics the last answer refused (authorization, an invalid name).
        self._topic_errors: dict[str, _Refusal] = {}
        #: The newest leader epoch seen per partition; answers older than it are ignored.
        self._leader_epochs: dict[tuple[str, int], int] = {}
        #: Each topic's id (Metadata v10+): a new id is a topic deleted and created again,
        #: whose epochs start over.
        self._topic_ids: dict[str, uuid.UUID] = {}
        #: Topic -> the most partitions an answer named under its current topic id: a topic never
        #: loses partitions, so an answer naming fewer under the same id lags (a partition
        #: increase not reached yet), and proves no partition gone (see :meth:`partition_gone`).
        self._partition_counts: dict[str, int] = {}
        #: Partitions whose leader at the newest epoch known answered a produce request that it
        #: does not lead (or host) them: the epoch so refused. Without topic ids (Metadata < v10,
        #: Kafka < 2.8) a topic deleted and created again is seen only so: its epochs start over.
        self._refused_epochs: dict[tuple[str, int], int] = {}
        #: Of those, when an answer first named an older epoch since the refusal (loop time):
        #: taken once answers have said so for ``retry_backoff_max_ms``, see :meth:`_older_proved`.
        self._older_since: dict[tuple[str, int], float] = {}
        #: Partitions with records waiting that the snapshot lacks: when a full refresh first
        #: lacked each (loop time); see :meth:`partition_gone`.
        self._gone_since: dict[tuple[str, int], float] = {}
        self._need_update = asyncio.Event()
        self._updated: asyncio.Future[None] | None = None
        #: Set (and dropped) at the next change of the pool, when someone waits for one.
        self._pool_changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[ClusterSnapshot], None]] = []
        #: Told the topics dropped from the refreshes (unused for metadata_max_idle_ms).
        self._evict_listeners: list[Callable[[list[str]], None]] = []
        self._closed = False
        self._failures = 0
        #: Demanded refreshes in a row that found nothing new (their backoff grows).
        self._fruitless = 0
        #: Set when a topic not asked for before is waited for: it ends that backoff.
        self._new_topic = asyncio.Event()
        #: Topics waited for that the snapshot lacks, and whether anything else asked for a
        #: refresh: a refresh for new topics alone describes only them (KIP-526), so a producer
        #: meeting topics one by one does not describe every topic in use for each.
        self._unknown_topics: set[str] = set()
        self._full_refresh_wanted = False
        #: Loop time of the last refresh of every topic that worked, and of the last of any kind.
        self._last_refresh = float("-inf")
        self._last_answer = float("-inf")
        #: Refreshes started, and the number of the latest one that succeeded (a wait for a
        #: partition needs an answer asked for after it began, not a failure or an older answer).
        self._refreshes_started = 0
        self._refresh_succeeded = 0
        #: (topic, partition) that the latest successful refresh found missing: sent to again,
        #: refused at once, not after a refresh each (a column of bad partitions in a job).
        self._missing_partitions: set[tuple[str, int]] = set()
        #: Loop time of the first failed refresh since the last one that worked (None: working).
        self._failing_since: float | None = None
        self._refresh_error: KafkaError | None = None
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

    def add_evict_listener(self, callback: Callable[[list[str]], None]) -> None:
        self._evict_listeners.append(callback)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aioprod-metadata")

    def refuse_waits(self) -> None:
        """The producer is closing: whoever waits for a topic gets ProducerClosedError now
        (refreshes go on, for the records close() still delivers)."""
        self._closed = True
        self._notify()

    def stop(self) -> None:
        """Stop refreshing now; whoever waits for a topic gets ProducerClosedError."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._notify()

    async def close(self) -> None:
        self.stop()
        if self._task is not None:
            await asyncio.wait([self._task])
            self._task = None

    @property
    def last_refresh(self) -> float:
        """Loop time of the last successful refresh (-inf before the first)."""
        return self._last_refresh

    def cluster_confirmed(self, cluster_id: str | None) -> None:
        """A broker just named ``cluster_id`` (the producer's check of a new connection): another
        than the snapshot's, it is the snapshot's from now on, and the metadata is looked up again."""
        old = self.snapshot
        if not is_cluster_id(cluster_id) or old.cluster_id is None or cluster_id == old.cluster_id:
            return
        self._install(old.brokers, dict(old.topics), cluster_id, old.controller_id)
        self.request_update()

    def topic_in_use(self) -> str | None:
        """A topic the refreshes describe (None: none yet)."""
        return next(iter(self._topics), None)

    async def cluster_named_by(self, conn: BrokerConnection) -> str | None:
        """The cluster id the broker behind ``conn`` names now (None: no id, or a placeholder),
        asked without touching the snapshot."""
        # One topic in use, not none: Tansu answers "no topics" with every topic of the cluster.
        in_use = self.topic_in_use()
        response: MetadataResponse = await conn.send(
            MetadataRequest(
                topics=[] if in_use is None else [MetadataRequestTopic(name=in_use)],
                allow_auto_topic_creation=False,
            )
        )
        return response.cluster_id if is_cluster_id(response.cluster_id) else None

    def request_update(self) -> None:
        self._full_refresh_wanted = True
        self._need_update.set()

    def pool_changed(self) -> None:
        """A connection came up, went down or freed room: requests waiting for a node may go."""
        changed, self._pool_changed = self._pool_changed, None
        if changed is not None:
            changed.set()

    def touch(self, topic: str, now: float | None = None) -> None:
        """``topic`` is in use (at loop time ``now``): keep describing it (see
        ``metadata_max_idle_ms``)."""
        self._topics[topic] = asyncio.get_running_loop().time() if now is None else now

    async def topic(self, topic: str, timeout: float, partition: int | None = None) -> TopicInfo:
        """The topic's metadata, fetching it first if needed (up to ``timeout`` seconds); with
        ``partition``, until it has that partition (one added since the last refresh), as
        Java's waitOnMetadata."""
        info = self.snapshot.topics.get(topic)
        if info is not None and info.partitions and (partition is None or partition in info.partitions):
            return info
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            return await self._wait_for_topic(topic, started + timeout, timeout, partition)
        finally:
            self._metrics.record_metadata_wait(loop.time() - started)

    async def _wait_for_topic(
        self, topic: str, deadline: float, timeout: float, partition: int | None = None
    ) -> TopicInfo:
        loop = asyncio.get_running_loop()
        asked_after = self._refreshes_started  # a refresh started after this one answers the wait
        missing_since: float | None = None  # when a refresh since the wait began first lacked the partition
        while True:
            if self._closed:
                raise ProducerClosedError(f"the producer closed while waiting for metadata of topic {topic!r}")
            refusal = self._topic_errors.get(topic)
            error = self._auth_error if refusal is None else refusal.error
            if error is not None:
                if refusal is not None:
                    # Refused now, from the last answer; asked again, so that a later send sees
                    # an ACL granted since (as Java asks on every send).
                    self.touch(topic)
                    self.request_update()
                raise copy_error(error)  # not the kept object: see copy_error
            info = self.snapshot.topics.get(topic)
            if info is not None and info.partitions:
                if partition is None or partition in info.partitions:
                    return info
                count = len(info.partitions)
                if missing_since is None and self._refresh_succeeded > asked_after:
                    missing_since = self._last_refresh
                # Refreshes asked for after the wait began found no such partition, over
                # retry_backoff_max_ms (one lagging broker's answer is not proof: a partition
                # just added may not be in its view yet): bad input, refused now, not after
                # max_block_ms. A partition added since the last refresh is found by them.
                span = self._config.retry_backoff_max_ms / 1000
                proved = (
                    missing_since is not None
                    and self._last_refresh - missing_since >= span
                    # An answer named it under the topic's current id: the ones lacking it lag.
                    and partition >= self._partition_counts.get(topic, 0)
                )
                recent = loop.time() - self._last_refresh < span
                if proved or ((topic, partition) in self._missing_partitions and recent):
                    # Only a refresh's answer is remembered, and only briefly (the topic may grow).
                    if proved:
                        self._missing_partitions.add((topic, partition))
                    raise PartitionNotFoundError(topic, partition, count)
                if deadline - loop.time() <= 0:  # no refresh answered in time: proves nothing
                    raise KafkaTimeoutError(
                        f"partition {partition} of topic {topic!r} not present in metadata after "
                        f"{timeout * 1000:.0f} ms ({_partitions_of(topic, count)} as of the last refresh)"
                    )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self.topic_timeout(topic, timeout * 1000)
            if topic not in self._topics:
                # Not asked for before: no backoff that other topics' refreshes earned applies
                # (Java's requestUpdateForNewTopics), or a short max_block_ms would run out.
                self._fruitless = 0
                self._new_topic.set()
            self.touch(topic)
            if info is None:
                self._unknown_topics.add(topic)
                self._need_update.set()
            else:
                self.request_update()  # known, without the partition (or any): describe all again
            if self._updated is None or self._updated.done():
                self._updated = loop.create_future()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await asyncio.shield(self._updated)

    def topic_timeout(self, topic: str, waited_ms: float) -> KafkaTimeoutError:
        """The error for a wait for ``topic`` that ran out, saying why as far as it is known."""
        trouble = self._troubled.get(topic)
        hint = self._reachability_hint()
        answer = None
        if not hint and trouble is not None:
            answer = trouble[1]  # the cause: UNKNOWN_TOPIC_OR_PARTITION tells "no such topic" from "no answer"
            hint = f" (the cluster's last answer: {answer})"
        error = KafkaTimeoutError(f"topic {topic!r} not present in metadata after {waited_ms:.0f} ms" + hint)
        error.__cause__ = answer
        return error

    def _reachability_hint(self) -> str:
        if self.snapshot.brokers:
            return ""
        errors = [self._pool.last_error(n) for n in self._bootstrap_ids]
        seen = [str(e) for e in errors if e is not None]
        if seen:
            return f" (no broker reachable: {seen[0]})"
        if self._refresh_error is not None:
            return f" (metadata refresh failing: {self._refresh_error})"
        under_way = [a for a in map(self._pool.attempt_under_way, self._bootstrap_ids) if a is not None]
        if under_way:
            return f" (no broker answered yet: {under_way[0]})"
        return ""

    def least_loaded_node(self) -> int | None:
        """Where to send a request that any broker can answer (Java's ``leastLoadedNode``).

        A connected node that can take a request now, fewest in flight first (an idle one
        at once); else one being connected to; else one worth connecting to, the one tried
        longest ago first; else None. A connection at its in-flight limit is never chosen:
        Kafka answers a connection's requests in order, so a request queued behind stuck
        produce requests would wait for them.
        """
        now = asyncio.get_running_loop().time()
        pool = self._pool
        candidates = list(self.snapshot.brokers) or list(self._bootstrap_ids)
        failing = self._failing_since
        if failing is not None and now - failing > self._config.metadata_recovery_rebootstrap_trigger_ms / 1000:
            # No metadata for that long, refreshes failing: the cluster may have moved under the
            # bootstrap names (KIP-1102). Known brokers that swallow connection attempts are
            # never all backing off at once (an attempt outlasts a backoff), so the rule below
            # alone could keep to them for good.
            candidates = list(self._bootstrap_ids)
        elif all(pool.backing_off(n, now) for n in candidates):
            # Everyone known is failing: go back to the bootstrap list (KIP-899).
            candidates = candidates + [n for n in self._bootstrap_ids if n not in candidates]
        random.shuffle(candidates)
        ready, ready_load, connecting, connectable = None, 0, None, None
        for node in candidates:
            load = pool.ready_load(node)
            if load is not None:
                if load == 0:
                    return node
                if ready is None or load < ready_load:
                    ready, ready_load = node, load
            elif pool.connecting(node):
                connecting = node
            elif pool.can_connect(node, now) and (
                connectable is None or pool.last_attempt(node) < pool.last_attempt(connectable)
            ):
                connectable = node
        if ready is not None:
            return ready
        return connecting if connecting is not None else connectable

    async def node_for_request(self, waiting: Callable[[], None] | None = None) -> int:
        """:meth:`least_loaded_node`, waiting while there is none: every broker at its in-flight
        limit or backing off. A wait, not a failure to back off from: a request queued behind
        the others, as many callers at once do (the Spark driver ends 32 transactions at once),
        goes as soon as an answer frees room. ``waiting`` is called before each wait."""
        # A backoff ending changes nothing the pool reports: look again after one. Not less
        # than MIN_LOOK_MS apart: reconnect_backoff_ms=0 (no backoff ever, so nothing to look
        # again for) made this a busy loop while every connection was at its in-flight limit.
        look_again = max(self._config.reconnect_backoff_ms, MIN_LOOK_MS) / 1000
        while (node := self.least_loaded_node()) is None:
            if waiting is not None:
                waiting()
            if self._pool_changed is None:
                self._pool_changed = asyncio.Event()
            changed = self._pool_changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(look_again):
                    await changed.wait()
        return node

    def leader_refused(self, topic: str, partition: int, node: int, epoch: int) -> None:
        """``node``, to which a batch of the partition went as its leader at ``epoch``, answered
        that it does not lead (or host) it. Kept only for the newest epoch known and that epoch's
        leader: see the use in :meth:`_apply`."""
        key = (topic, partition)
        if epoch < 0 or epoch != self._leader_epochs.get(key, -1):
            return
        if self.snapshot.leader_for(topic, partition) == node:
            self._refused_epochs[key] = epoch

    def _older_proved(self, key: tuple[str, int], newest: int) -> bool:
        """An answer names an older epoch of ``key`` than ``newest``, whose leader refused it:
        taken once answers have named older ones since the first such, for ``retry_backoff_max_ms``
        (none at ``newest`` or later between). One lagging broker's answer is no proof: after an
        ordinary leader change (the leader at ``newest`` refuses because a newer one leads), it
        sent the records back to the leader of an older epoch, the same proof as
        :meth:`partition_gone`'s."""
        if self._refused_epochs.get(key) != newest:
            return False
        now = asyncio.get_running_loop().time()
        since = self._older_since.setdefault(key, now)
        return now - since >= self._config.retry_backoff_max_ms / 1000

    def topic_error(self, topic: str) -> KafkaError | None:
        """The error the last answer refused ``topic`` with (authorization, an invalid name),
        if answers in a row have refused it for ``retry_backoff_max_ms``: the records queued for it
        fail with it. One answer is no proof: a broker lagging behind an ACL grant refuses a topic
        its leader takes (send() raises on one answer, as Java's, but nothing queued is lost so)."""
        refusal = self._topic_errors.get(topic)
        if refusal is None or refusal.last - refusal.first < self._config.retry_backoff_max_ms / 1000:
            return None
        return refusal.error

    def partition_gone(self, topic: str, partition: int) -> int | None:
        """The topic's partition count, if full refreshes have lacked ``partition`` (the topic
        still there) for ``retry_backoff_max_ms``: the topic was deleted and created with fewer
        partitions, and records queued for it will never have a leader. Else None. The same
        proof as a send() naming a missing partition needs (one lagging answer is not one)."""
        info = self.snapshot.topics.get(topic)
        key = (topic, partition)
        if (
            info is None
            or not info.partitions
            or partition in info.partitions
            or self._refresh_succeeded == 0
            # Named under the topic's current id: an answer without it lags (partitions added).
            or partition < self._partition_counts.get(topic, 0)
        ):
            self._gone_since.pop(key, None)
            return None
        first = self._gone_since.setdefault(key, self._last_refresh)
        if self._last_refresh - first < self._config.retry_backoff_max_ms / 1000:
            return None
        del self._gone_since[key]
        return len(info.partitions)

    def update_leader(self, topic: str, partition: int, leader: int, epoch: int, address: Broker | None) -> bool:
        """A produce response named the partition's new leader (KIP-951): use it now, if
        it is newer than what is known. Returns whether anything changed.

        The newest epoch seen may be newer than the snapshot's, when a lagging broker's answer
        described a partition the snapshot had lost: a hint at that newest epoch names the
        leader it belongs to (an epoch has one leader), and is taken."""
        info = self.snapshot.topics.get(topic)
        part = None if info is None else info.partitions.get(partition)
        newest = self._leader_epochs.get((topic, partition), -1)
        if info is None or part is None or leader < 0 or epoch < newest or (epoch == newest <= part.leader_epoch):
            return False
        brokers = self.snapshot.brokers
        known = brokers.get(leader)
        if address is not None and address.node_id == leader:
            if known is None or (known.host, known.port) != (address.host, address.port):
                # New to the snapshot, or moved: the answer's NodeEndpoints are where it is now
                # (Java's updatePartitionLeadership lets them win). The old address kept, a retry
                # went there, and waited out a connect timeout where it swallows connections.
                brokers = MappingProxyType({**brokers, leader: address})
                self._pool.set_address(address.node_id, address.host, address.port)
        elif known is None:
            return False
        self._leader_epochs[(topic, partition)] = epoch
        moved = PartitionInfo(partition, leader, epoch, part.replicas, part.isr)
        topics = dict(self.snapshot.topics)
        if brokers is not self.snapshot.brokers:
            # A broker new to the snapshot: its partitions of other topics have a leader now too.
            for name, other in topics.items():
                if any(p.leader == leader for p in other.partitions.values()):
                    topics[name] = TopicInfo(name, other.partitions, brokers)
        topics[topic] = TopicInfo(topic, MappingProxyType({**info.partitions, partition: moved}), brokers)
        self._install(brokers, topics, self.snapshot.cluster_id, self.snapshot.controller_id)
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # At least retry_backoff_ms apart, as Java paces them: metadata_max_age_ms=0 ("always
        # fresh") sent thousands of requests a second.
        max_age = max(self._config.metadata_max_age_ms, self._config.retry_backoff_ms) / 1000
        while True:
            # The periodic refresh is due max_age after the last refresh of every topic, not after
            # the last answer: partial ones (new topics) must not put it off (Java's timeToNextUpdate).
            due = max_age if self._last_refresh == float("-inf") else self._last_refresh + max_age - loop.time()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(due, 0)):
                    await self._need_update.wait()
            demanded = self._need_update.is_set()
            if demanded and not self._new_topic.is_set():
                now = loop.time()
                if now - self._last_answer > self._config.retry_backoff_max_ms / 1000:
                    self._fruitless = 0  # a demand after a quiet spell starts afresh
                # At least retry_backoff_ms after the last refresh (Java's timeToAllowUpdate):
                # answers that keep changing (brokers lagging by different amounts) refreshed
                # back to back; longer while demanded refreshes find nothing new.
                spacing = self._backoff(self._fruitless) if self._fruitless else self._config.retry_backoff_ms / 1000
                wait = self._last_answer + spacing - now  # counted from the last refresh, as Java's
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._new_topic.wait()
            self._need_update.clear()
            self._new_topic.clear()  # the refresh about to start describes every topic asked for so far
            # Only topics the snapshot lacks asked for it, and others are in use: describe the
            # new ones alone. That proves nothing about the others, so it does not count as a
            # refresh of them (metadata-age, a partition proven missing).
            unknown = self._unknown_topics
            others_in_use = not self._topics.keys() <= unknown
            fresh = loop.time() - self._last_refresh < max_age  # else due anyway (Java's newMetadataRequestAndVersion)
            partial = demanded and fresh and not self._full_refresh_wanted and bool(unknown) and others_in_use
            self._full_refresh_wanted = False
            self._unknown_topics = set()
            try:
                if partial:
                    changed = await self._refresh(sorted(unknown))
                else:
                    self._refreshes_started += 1
                    started = self._refreshes_started
                    changed = await self._refresh()
                    self._refresh_succeeded = started
                    self._missing_partitions.clear()
                    self._last_refresh = loop.time()
                self._failures = 0
                self._failing_since = None
                self._auth_error = None
                self._refresh_error = None
            except KafkaError as exc:
                self._refresh_error = exc
                self._failures += 1
                if self._failing_since is None:
                    self._failing_since = loop.time()
                if isinstance(exc, AuthenticationError):
                    self._auth_error = exc
                self._log.debug("metadata refresh failed: %s", exc)
                self._notify()
                await asyncio.sleep(self._backoff(self._failures))
                self._need_update.set()
                continue
            self._last_answer = loop.time()
            self._fruitless = 0 if changed or not demanded else self._fruitless + 1

    def _backoff(self, attempts: int) -> float:
        return exponential_backoff(
            self._config.retry_backoff_ms / 1000, self._config.retry_backoff_max_ms / 1000, attempts
        )

    async def _refresh(self, only: list[str] | None = None) -> bool:
        """Describe every topic in use, or ``only`` those (merged into the snapshot)."""
        loop = asyncio.get_running_loop()
        node, conn = await self._connect_any()
        idle_since = loop.time() - self._config.metadata_max_idle_ms / 1000
        idle = [t for t, used in self._topics.items() if used < idle_since]
        if idle:
            self._forget(idle)
        request = MetadataRequest(
            topics=[MetadataRequestTopic(name=t) for t in (sorted(self._topics) if only is None else only)],
            allow_auto_topic_creation=self._config.allow_auto_create_topics,
        )
        response: MetadataResponse = await conn.send(request)
        if conn.retiring:
            # Retired while it answered (the cluster behind the addresses changed): maybe the old
            # cluster's answer. Asked again on a connection opened since.
            raise KafkaError(f"metadata from {describe_node(node)} came on a retired connection")
        if not response.brokers:
            # A broker in its startup phase answers with an empty cache: no brokers, its topics
            # unknown. Not the cluster: a failed refresh, retried (Java's handleSuccessfulResponse).
            raise KafkaError(f"metadata from {describe_node(node)} named no brokers (a broker starting up?)")
        return self._apply(response, node, partial=only is not None)

    async def _connect_any(self) -> tuple[int, BrokerConnection]:
        """A connection to the least loaded node; one that cannot be connected to has the next
        one not backing off tried at once (Java's leastLoadedNode after a failed connect). Counted
        as a failed refresh, each dead bootstrap server before a live one cost a metadata retry
        backoff: 8 of them took up to 4 s to get past, doubling with each."""
        tried: set[int] = set()
        while True:
            node = await self.node_for_request()
            try:
                return node, await self._pool.get(node)
            except KafkaConnectionError:
                tried.add(node)
                following = self.least_loaded_node()
                if following is None or following in tried:
                    raise

    def _forget(self, topics: list[str]) -> None:
        """``topics`` went unused for metadata_max_idle_ms: stop describing them, and drop all
        that is kept about them (as Java's Metadata drops their leader epochs), so that a
        producer that sees topics come and go keeps no state for the ones gone; a topic error
        learned long ago is not raised again without asking (an ACL granted since)."""
        for topic in topics:
            del self._topics[topic]
            self._troubled.pop(topic, None)
            self._topic_errors.pop(topic, None)
            self._topic_ids.pop(topic, None)
            self._partition_counts.pop(topic, None)
            self._metrics.events.forget(("topic", topic))
            self._metrics.events.forget(("leader", topic))
            self._metrics.events.forget(("partition-ids", topic))
        self._drop_leader_epochs(set(topics))
        for listener in self._evict_listeners:
            listener(topics)

    def _drop_leader_epochs(self, topics: set[str]) -> None:
        """What is kept per partition of ``topics``: their epochs, and the proofs under way."""
        for kept in (self._leader_epochs, self._refused_epochs, self._older_since, self._gone_since):
            for key in [k for k in kept if k[0] in topics]:
                del kept[key]

    def _apply(self, response: MetadataResponse, node: int | None = None, *, partial: bool = False) -> bool:
        """Install what ``response`` (from ``node``) says; returns whether leaders, brokers
        or topics changed. A ``partial`` answer describes some topics: the others stay as
        they were, against the brokers it names."""
        # A broker id below 0 is a broken answer: those ids are the bootstrap addresses' here,
        # whose address it would overwrite for good.
        brokers = {b.node_id: Broker(b.node_id, b.host, b.port, b.rack) for b in response.brokers if b.node_id >= 0}
        old = self.snapshot
        topics: dict[str, TopicInfo] = {}
        if partial:
            same_brokers = brokers == dict(old.brokers)
            for name, info in old.topics.items():
                if name in self._topics:  # not forgotten as idle meanwhile
                    topics[name] = info if same_brokers else TopicInfo(name, info.partitions, brokers)
        for t in response.topics:
            if t.name is None or t.name not in self._topics:
                # Not asked for (Java's retainTopic): Tansu answers an empty topic list with every
                # topic of the cluster, and what is kept of those would never be forgotten.
                continue
            count = len(t.partitions)
            outside = sorted(p.partition_index for p in t.partitions if not 0 <= p.partition_index < count)
            # An id named twice ([0, 1, 1] for a topic of 3) leaves a partition out as surely.
            named = Counter(p.partition_index for p in t.partitions if 0 <= p.partition_index < count)
            outside += sorted(i for i, times in named.items() if times > 1)
            #: Partitions the answer names no valid entry for, taken from what was known of the topic.
            kept: dict[int, PartitionInfo] = {}
            if outside:
                # A topic's partitions are 0..n-1: ids outside them are a broken answer, ignored
                # (the producer keeps a list up to the largest id: 2**31-1 took all memory). A
                # partition the answer misnamed ([-1, 1, 2], [0, 1, 7] for a topic of 3) keeps what
                # was known of it (topics never shrink; the others' leaders are taken); the rest is
                # taken if it leaves no gap (-1 in place of 0 left one: "partition 0 does not exist").
                inside = {p.partition_index for p in t.partitions if 0 <= p.partition_index < count}
                before = old.topics.get(t.name)
                if before is not None:
                    kept = {i: part for i, part in before.partitions.items() if i not in inside}
                ids = sorted(inside | kept.keys())
                whole = ids == list(range(len(ids)))
                self._metrics.events.problem(
                    log,
                    ("partition-ids", t.name),
                    "outside",
                    "metadata from %s: topic %r: partition ids %s outside 0-%d or named twice: %s",
                    "a broker" if node is None else describe_node(node),
                    t.name,
                    ", ".join(map(str, outside)),
                    count - 1,
                    "ignored" if whole else "the topic's answer not taken (the rest leaves a gap)",
                )
                if not whole:
                    if before is not None:
                        topics[t.name] = TopicInfo(t.name, before.partitions, brokers)
                    continue
            if partial:
                topics.pop(t.name, None)  # described again: as the answer says, or not at all
            if t.error_code in _FATAL_TOPIC_ERRORS:
                error = error_for_code(t.error_code, f"topic {t.name!r}")
                now = asyncio.get_running_loop().time()
                earlier = self._topic_errors.get(t.name)
                self._topic_errors[t.name] = _Refusal(error, now if earlier is None else earlier.first, now)
                self._topic_trouble(t.name, error, node, at_once=True)
                continue
            self._topic_errors.pop(t.name, None)
            if t.error_code:
                self._topic_trouble(t.name, error_for_code(t.error_code), node, at_once=False)
            elif self._troubled.pop(t.name, None) is not None:
                self._metrics.events.resolved(log, ("topic", t.name), "topic %r: metadata is back", t.name)
            known = old.topics.get(t.name)
            if t.topic_id.int and self._topic_ids.get(t.name, t.topic_id) != t.topic_id:
                known = None  # recreated: what was known of it is about another topic
                self._drop_leader_epochs({t.name})
                self._partition_counts.pop(t.name, None)
            if t.topic_id.int:
                self._topic_ids[t.name] = t.topic_id
                if not outside:  # (a broken answer's count says nothing)
                    self._partition_counts[t.name] = max(self._partition_counts.get(t.name, 0), count)
            else:
                # No id (Metadata < v10): it may be the topic created again, with fewer partitions,
                # that the count named under the id known does not hold for.
                self._partition_counts.pop(t.name, None)
            parts: dict[int, PartitionInfo] = {}
            leaderless: list[tuple[int, int]] = []
            for p in t.partitions:
                if not 0 <= p.partition_index < count:
                    continue  # said above
                key = (t.name, p.partition_index)
                newest = self._leader_epochs.get(key, -1)
                previous = None if known is None else known.partitions.get(p.partition_index)
                if 0 <= p.leader_epoch < newest and previous is not None:
                    if t.topic_id.int or not self._older_proved(key, newest):
                        parts[p.partition_index] = previous  # a lagging broker's older view
                        continue
                    # No topic id to tell, the leader at the newest epoch said it does not lead,
                    # and answers have named an older epoch since, for retry_backoff_max_ms: the
                    # topic was created again (its epochs start over), or that broker lags itself.
                    # Taken: kept, the partition went to that broker for good.
                    self._leader_epochs[key] = p.leader_epoch
                self._older_since.pop(key, None)  # an answer at the newest epoch or later
                if p.leader_epoch != newest:
                    self._refused_epochs.pop(key, None)
                if p.leader_epoch > newest:
                    self._leader_epochs[key] = p.leader_epoch
                parts[p.partition_index] = PartitionInfo(
                    p.partition_index,
                    p.leader_id if p.error_code != 5 or p.leader_id >= 0 else -1,
                    p.leader_epoch,
                    tuple(p.replica_nodes),
                    tuple(p.isr_nodes),
                )
                if p.leader_id < 0 or p.leader_id not in brokers:
                    leaderless.append((p.partition_index, p.error_code))
            if known is not None:
                for index, kept_part in kept.items():
                    parts.setdefault(index, kept_part)
            if parts:
                topics[t.name] = TopicInfo(t.name, MappingProxyType(parts), brokers)
                self._leaders_found(t.name, leaderless, node)
        for key in [k for k in self._gone_since if k[1] in (topics[k[0]].partitions if k[0] in topics else ())]:
            del self._gone_since[key]  # there again: a lagging answer had left it out
        for b in brokers.values():
            self._pool.set_address(b.node_id, b.host, b.port)
        self._metrics.forget_brokers(self._pool.forget_absent(brokers))
        changed = brokers != dict(old.brokers) or topics != dict(old.topics)
        self._install(MappingProxyType(brokers), topics, response.cluster_id, response.controller_id)
        return changed

    def _topic_trouble(self, topic: str, error: KafkaError, node: int | None, *, at_once: bool) -> None:
        """A topic-level error in an answer. A topic being created answers so once or twice
        (LEADER_NOT_AVAILABLE), so a retriable one is worth a warning from the second
        answer in a row."""
        seen = self._troubled.get(topic, (0, error))[0] + 1
        self._troubled[topic] = (seen, error)
        if at_once or seen > 1:
            self._metrics.events.problem(
                log,
                ("topic", topic),
                type(error).__name__,
                "metadata from %s: topic %r: %s",
                "a broker" if node is None else describe_node(node),
                topic,
                error,
            )
        else:
            self._log.debug("metadata for %s: %s", topic, error)

    def _leaders_found(self, topic: str, leaderless: list[tuple[int, int]], node: int | None) -> None:
        events = self._metrics.events
        if not leaderless:
            events.resolved(log, ("leader", topic), "topic %r: every partition has a leader again", topic)
            return
        partitions = ", ".join(str(p) for p, _ in leaderless)
        code = next((c for _, c in leaderless if c), 0)
        reason = str(error_for_code(code)) if code else "no leader in the answer"
        events.problem(
            log,
            ("leader", topic),
            reason,
            "metadata from %s: topic %r partition(s) %s have no leader (%s); their records wait",
            "a broker" if node is None else describe_node(node),
            topic,
            partitions,
            reason,
        )

    def _install(
        self, brokers: Mapping[int, Broker], topics: dict[str, TopicInfo], cluster_id: str | None, controller: int
    ) -> None:
        self.snapshot = ClusterSnapshot(
            brokers, MappingProxyType(topics), cluster_id, controller, self.snapshot.version + 1
        )
        self._notify()
        for listener in self._listeners:
            listener(self.snapshot)

    def _notify(self) -> None:
        if self._updated is not None and not self._updated.done():
            self._updated.set_result(None)

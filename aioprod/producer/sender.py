"""The sender task: the Java producer's Sender thread, as one coroutine.

Each round (:meth:`Sender.run_once`, with the time passed in): fail what outlived its
delivery timeout — queued or in flight —, pass over the partitions of nodes whose connection
cannot take a request now (it wakes the sender when it can), find nodes with sendable
batches, take batches per node (``drain``), and write one ProduceRequest per node; then sleep
until the next thing is due (a linger, a retry backoff, a throttle, a delivery deadline) or
something wakes it. Responses are handed to
:meth:`Sender._on_response` by the connection's reader as it reads them:
:func:`aioprod.producer.outcomes.decide` says what each means per batch, and
:meth:`Sender._apply` carries that out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import warnings
from collections import deque
from collections.abc import Callable

from aioprod.cluster.metadata import ClusterSnapshot, Metadata, is_cluster_id
from aioprod.config import ProducerConfig
from aioprod.errors import (
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    KafkaConnectionError,
    KafkaError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
    PartitionNotFoundError,
    ProducerClosedError,
    ProducerFatalError,
    ProducerFencedError,
    TransactionAbortedError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    copy_error,
    error_for_code,
)
from aioprod.event_log import ClientLogger
from aioprod.metrics import ProducerMetrics
from aioprod.net.connection import BrokerConnection
from aioprod.net.pool import ConnectionPool, describe_node
from aioprod.producer.accumulator import RecordAccumulator
from aioprod.producer.batch import ProducerBatch, TopicPartition
from aioprod.producer.idempotence import IdempotenceState, earlier_under
from aioprod.producer.outcomes import Action, Decision, RetryPolicy, decide
from aioprod.producer.transactions import TransactionManager, TxnState
from aioprod.protocol.messages import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceRequestPartition,
    ProduceRequestTopic,
    ProduceResponse,
)

log = logging.getLogger(__name__)

#: The largest producer epoch (int16); past it, a new producer id is needed.
_MAX_EPOCH = 32767
#: A sleep long enough to mean "until something wakes me".
_IDLE = 3600.0
#: Requests in flight to a leader from which its batches due only by their linger wait (see
#: ``RecordAccumulator.busy``); full batches, retries and flushes use every place.
_LINGERED_IN_FLIGHT = 2


#: A produce refused for its epoch: for an idempotent producer's own epoch bump, not a fencing.
_EPOCH_REFUSED = (ProducerFencedError, InvalidProducerEpochError)
#: A produce refused by a broker that does not lead, or host, the partition.
_LEADER_REFUSED = (NotLeaderOrFollowerError, UnknownTopicOrPartitionError)


class Sender:
    """Owns draining, in-flight requests and their outcomes; runs as one task."""

    def __init__(
        self,
        config: ProducerConfig,
        metadata: Metadata,
        pool: ConnectionPool,
        accumulator: RecordAccumulator,
        on_fatal: Callable[[BaseException], None],
        metrics: ProducerMetrics | None = None,
    ) -> None:
        self._config = config
        self._log = ClientLogger(log, config.client_id)
        self._metrics = metrics if metrics is not None else ProducerMetrics(config)
        self._metadata = metadata
        self._pool = pool
        self._acc = accumulator
        self._on_fatal = on_fatal
        self._policy = RetryPolicy.of(config)
        self.idempotence = IdempotenceState() if config.enable_idempotence else None
        self.transactions: TransactionManager | None = None
        if config.transactional_id is not None:
            assert self.idempotence is not None
            self.transactions = TransactionManager(
                config,
                metadata,
                pool,
                self.idempotence,
                wakeup=self.wakeup,
                on_fatal=self._set_fatal,
                identify_cluster=self._identify_cluster,
                current_cluster=lambda: self._cluster_id,
            )
        self._acks = config.acks
        self._request_timeout_ms = config.request_timeout_ms
        #: Batches on the wire, including ones that expired there and are still unanswered.
        self._in_flight: set[ProducerBatch] = set()
        #: Produce requests written to each node whose answer (or failure) has not come.
        self._unanswered: dict[int, int] = {}
        #: The partitions whose records a broker's answers had retried (and warned of), and
        #: when it last did: once each is acknowledged again (by that broker or a new leader)
        #: and no retry came from it for the event log's interval, the warning ends (INFO).
        self._retry_warned: dict[int, set[TopicPartition]] = {}
        self._last_retry: dict[int, float] = {}
        self._quiet = asyncio.Event()
        self._quiet.set()
        #: The error that stopped this producer for good, if any.
        self.fatal: KafkaError | None = None
        #: Why a partition's sequence came in doubt last (said when a new identity is taken).
        self._doubt = "a partition's sequence is in doubt"
        #: Its kind, the identity warning's reason: the text names a partition and an error
        #: message (a record count, a deadline), so as the reason it made every partition's new
        #: identity a new warning, one per partition under a fault that lasts.
        self._doubt_kind = "doubt"
        self._wake_flag = False
        #: The sleeping sender's: True when the clock ends the sleep, False when a wake-up does.
        self._waiter: asyncio.Future[bool] | None = None
        self._stopping = False
        #: close() was called (its shutdown may not have reached stop() yet when the loop ends).
        self.close_begun = False
        #: This is a forked child's copy (see Producer): the parent sends what is queued.
        self.forked = False
        self._init_task: asyncio.Task[None] | None = None
        self._init_failures = 0
        #: The broker refused sequence 0 of our id as an unknown producer: bumping the epoch
        #: will not do, InitProducerId gives a new id.
        self._fresh_id_needed = False
        #: The identity last taken by bumping the epoch here, not from the broker; and whether a
        #: broker refused such an epoch (Tansu takes only those it handed out): from then on a
        #: new identity is asked of the broker.
        self._bumped: tuple[int, int] | None = None
        self._bump_refused = False
        self._task: asyncio.Task[None] | None = None
        #: The cluster id the metadata last named (None until one does).
        self._cluster_id: str | None = None
        #: Batches on the wire when the cluster id changed: a retry of them needs new sequences.
        self._other_cluster: set[ProducerBatch] = set()
        #: Cluster id changes seen: an InitProducerId answer read after one is the old cluster's.
        self._cluster_changes = 0
        #: The cluster ids the producer moved away from.
        self._clusters_left: set[str] = set()
        #: Identities _take_identity took: each after the first is a reset (producer-id-reset-total).
        self._identities_taken = 0
        self._last_identity = (-1, -1)
        if self.idempotence is not None:
            metadata.add_listener(self._on_metadata)
            pool.confirm_cluster = self._confirm_cluster

    def _on_metadata(self, snapshot: ClusterSnapshot) -> None:
        self._cluster_seen(snapshot.cluster_id)

    async def _confirm_cluster(self, conn: BrokerConnection) -> None:
        """Asked by the pool of every new connection, before anything is sent on it, once a
        metadata answer named the cluster: the cluster behind the address may be another now, and
        a batch numbered under the old one's producer id must not reach it (a metadata refresh may
        come only minutes later). A switch behind the same names (DNS, a load balancer) can leave
        the old cluster's connections open, and a first connection to a broker reach the new one."""
        if self._cluster_id is None:
            return  # nothing numbered yet for any cluster: the metadata answer names it
        await self._ask_cluster(conn)

    async def _identify_cluster(self, conn: BrokerConnection) -> None:
        """The transactional producer's, before it asks for its identity on ``conn``: its start
        fetches no metadata, and an identity taken before any answer named the cluster could not
        be told to be another cluster's (a cluster replaced before the first send)."""
        if self._cluster_id is None:
            await self._ask_cluster(conn)

    async def _ask_cluster(self, conn: BrokerConnection) -> None:
        named = await self._metadata.cluster_named_by(conn)
        self._cluster_seen(named)
        # The snapshot says so too: one installed without a metadata answer (a leader hint,
        # KIP-951) carried the old id, which the listener took for a change back (a new id
        # again, and a batch on the wire renumbered: written twice). Its leaders and topic ids
        # are the old cluster's: looked up again.
        self._metadata.cluster_confirmed(named)

    def _cluster_seen(self, new: str | None) -> None:
        """Another cluster behind the bootstrap addresses: the producer id (and the sequences
        under it) was the old cluster's, and producer ids start from 0 in every cluster, so the
        new one may know ours as another producer's (whose recent batch at our next sequence
        would be taken for ours: acknowledged, not written). Take an id from the new cluster.
        Only an idempotent producer listens (__init__): the others number nothing."""
        ident = self.idempotence
        assert ident is not None
        old = self._cluster_id
        if not is_cluster_id(new) or new == old:
            return
        self._cluster_id = new
        if old is None:
            return
        if self.transactions is not None:
            self.transactions.cluster_changed(
                ProducerFatalError(
                    f"the cluster changed (cluster id {old!r}, now {new!r}) under a transactional producer"
                )
            )
        if new in self._clusters_left:
            # Back to a cluster it left: the brokers behind these addresses answer for two clusters
            # (a switch half done, a proxy mixing them, a misconfigured broker). A batch of ours may
            # be in either, and a producer id of one is another producer's in the other: renumbering
            # at each flip wrote records twice, and keeping the stamps swallowed them. Stop.
            self._set_fatal(
                ProducerFatalError(
                    f"the brokers behind the bootstrap addresses name different clusters ({old!r}, {new!r}): "
                    f"an idempotent producer cannot number its records for both"
                )
            )
            return
        self._clusters_left.add(old)
        self._cluster_changes += 1  # an InitProducerId in flight is the old cluster's answer
        # The connections opened before are maybe the old cluster's still (a switch by name leaves
        # them open): closed once answered, the next ones are checked (_confirm_cluster).
        self._pool.retire_all(KafkaConnectionError(f"the cluster id changed from {old!r} to {new!r}"))
        if not ident.has_producer_id:
            return
        self._metrics.events.warning(
            log, "the cluster id changed from %r to %r: taking a new producer id from it", old, new
        )
        if self.transactions is not None:
            self._set_fatal(
                ProducerFatalError(
                    f"the cluster changed (cluster id {old!r}, now {new!r}) under a transactional producer"
                )
            )
            return
        self._doubt = f"the cluster id changed from {old!r} to {new!r}"
        self._doubt_kind = "cluster-changed"
        ident.set_producer_id(-1, -1)  # no client-side epoch bump of the old cluster's id
        # A stamp is the old cluster's too: a retry under it would meet the new cluster's own
        # producer of that id (a "duplicate" acknowledged, not written). Renumbered instead.
        self._acc.renumber_queued()
        self._other_cluster.update(self._in_flight)
        self._fresh_id_needed = True
        self.wakeup()

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aioprod-sender")

    def wakeup(self) -> None:
        self._wake_flag = True
        self._acc.next_round = -math.inf
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    def stop(self) -> None:
        """Finish what is queued, then end (close() bounds how long that may take)."""
        self._stopping = True
        self.wakeup()

    def fail_queued(self, error_for: Callable[[ProducerBatch], KafkaError]) -> None:
        """Fail every queued batch; a partition whose sequence a failed batch had taken is
        then in doubt (the broker expects that sequence next)."""
        for batch in self._acc.fail_all(error_for):
            if self.idempotence is not None:
                self.idempotence.failed(batch)

    def fail_aborted(self, cause: KafkaError | None) -> None:
        """Fail every queued batch: its transaction was aborted (because of ``cause``) before
        it was sent."""
        self.fail_queued(lambda batch: _aborted(cause, batch.possibly_persisted))

    async def quiet(self) -> None:
        """Wait until no request of this producer's is unanswered (expired batches included)."""
        await self._quiet.wait()

    def abort_now(self, error: Callable[[bool], KafkaError]) -> list[asyncio.Task[None]]:
        """Stop at once: every unfinished record fails with ``error(possibly_persisted)``.
        Returns the tasks that were cancelled, for the caller to wait on."""
        self._stopping = True
        self._acc.fail_all(lambda batch: error(batch.possibly_persisted))
        # The rest: on the wire (possibly persisted), or drained in a round that raised before
        # writing them (not).
        for batch in list(self._acc.incomplete):
            if not batch.done:
                batch.fail(error(batch.possibly_persisted))
                self._acc.complete(batch)
        tasks = [task for task in (self._task, self._init_task) if task is not None and not task.done()]
        for task in tasks:
            task.cancel()
        if self.transactions is not None:
            tasks += self.transactions.cancel()
        return tasks

    async def abort(self, error: Callable[[bool], KafkaError]) -> None:
        tasks = self.abort_now(error)
        if tasks:
            # wait(), not await: the tasks' own outcome is theirs, but our caller's cancellation is not ours to eat.
            await asyncio.wait(tasks)

    async def wait_stopped(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: no limit) for the task to end by itself."""
        if self._task is not None:
            # wait(), not await: the task's cancellation (a caller gave up on close) is not ours.
            await asyncio.wait([self._task], timeout=timeout)

    # -- the loop ------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not (self._stopping and not self._acc.incomplete):
                now = loop.time()
                delay = self.run_once(now)
                if self._stopping and not self._acc.incomplete:
                    break  # the round finished the last batch (it expired): close() waits for nothing more
                await self._sleep(now + delay)
                if self.forked:
                    # A child running its copy of the loop: sending the parent's batches from
                    # here wrote them twice (or, idempotent, had the parent's acknowledged as
                    # duplicates of the child's, with no offset).
                    return
        except asyncio.CancelledError:
            if not self._stopping and not self.forked:  # (a child's copy: the parent's records and connections)
                # Cancelled from outside, not by close(): the loop is being shut down (asyncio.run()
                # ended without close()). Nothing will ever send what is queued: say so, now and
                # to every later call, instead of leaving futures that never resolve.
                fatal = ProducerFatalError(
                    "the producer's sender task was cancelled: its event loop shut down without close() "
                    "(a Producer belongs to the loop it was started on; use SyncProducer across asyncio.run() calls)"
                )
                unfinished = sum(batch.record_count for batch in self._acc.incomplete)
                if unfinished:
                    self._metrics.events.warning(
                        log,
                        "the event loop shut down without producer.close(): %d record(s) not acknowledged "
                        "are dropped (await close() before the loop ends)",
                        unfinished,
                    )
                self._ended_by(fatal)
                self._pool.close_now()  # its connections, left open otherwise
                self._warn_unclosed_later(loop)
            raise
        except BaseException as exc:
            self._log.exception("aioprod sender task died")
            fatal = ProducerFatalError(f"the sender task died: {exc!r}")
            fatal.__cause__ = exc
            self._ended_by(fatal)
            if not isinstance(exc, Exception):
                # KeyboardInterrupt or SystemExit (a Ctrl-C lands in whatever frame runs): the
                # program's, not the producer's to end here. asyncio stops the loop with it.
                raise

    def _warn_unclosed_later(self, loop: asyncio.AbstractEventLoop) -> None:
        """Once the tasks cancelled with the sender have ended: the loop's end cancels them all
        at once, and an `async with` in one of them reaches its close() later, a step later or
        several (a TaskGroup waits for its children first)."""
        me = asyncio.current_task()
        ending = [t for t in asyncio.all_tasks(loop) if t is not me and not t.done() and t.cancelling()]
        if not ending:
            loop.call_soon(self._warn_unclosed)
            return
        left = [len(ending)]

        def one_ended(_task: asyncio.Task[object]) -> None:
            left[0] -= 1
            if not left[0]:
                self._warn_unclosed()

        for task in ending:
            task.add_done_callback(one_ended)

    def _warn_unclosed(self) -> None:
        """As an unclosed file or socket says so (aiokafka's producer too): its connections stayed
        open for the loop's life, which a producer made per request leaks. After the cleanup
        (under -W error it raises), and not for a close() the loop's end cut short."""
        if not self.close_begun:
            warnings.warn(
                f"unclosed aioprod Producer {self._config.client_id!r}: its event loop shut down without close()",
                ResourceWarning,
                stacklevel=1,
            )

    def _ended_by(self, fatal: ProducerFatalError) -> None:
        """The task ends without close(): the producer fails, and every unfinished record with it."""
        self._on_fatal(fatal)
        self.abort_now(lambda persisted: _fatal_as(fatal, persisted))

    async def _sleep(self, until: float) -> None:
        """Sleep until loop time ``until`` or a wake-up. The time is the round's start plus
        its delay, not "now" plus it: a linger of 5 ms stays 5 ms after a long round.

        Woken by the clock, it lets the tasks whose timers fell due in the same tick run
        first (a caller pacing its sends, say): their records join the batches this round
        sends instead of waiting a whole linger for the next."""
        if self._wake_flag:
            self._wake_flag = False
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._acc.next_round = until
        at_once = until <= loop.time()  # a round due now still lets other tasks run once
        handle = loop.call_at(until, _ring, waiter)
        try:
            timed = await waiter
        finally:
            handle.cancel()
            self._waiter = None
            self._wake_flag = False
            self._acc.next_round = -math.inf
        if timed and not at_once:
            await asyncio.sleep(0)

    def _why_unsent(self, batch: ProducerBatch) -> KafkaError | None:
        """Why a batch expiring unsent was not sent, if a connection says: its leader refusing
        the credentials (revoked while the producer ran) is otherwise a bare timeout."""
        leader = self._metadata.snapshot.leader_for(batch.tp.topic, batch.tp.partition)
        if leader is None or self._pool.is_connected(leader):
            return None
        return self._pool.last_error(leader)

    def run_once(self, now: float) -> float:
        """One round; returns how many seconds may pass before the next is due."""
        acc = self._acc
        acc.yield_wanted = 0  # the loop ran: whoever asked for this round had it
        fatal = self.fatal
        if fatal is not None:
            acc.fail_all(lambda batch: _fatal_as(fatal, batch.possibly_persisted))
            return _IDLE
        for batch in acc.expired(now):
            why = None if batch.possibly_persisted else self._why_unsent(batch)
            self._finish(batch, batch.expiry_error(now, self._config.delivery_timeout_ms, unsent_because=why))
        txn = self.transactions
        if txn is not None and txn.state in _SWEPT and acc.has_queued:
            # The transaction cannot commit, or is aborting: what it has not sent never will
            # be, and what comes back for a retry is not sent again.
            self.fail_aborted(txn.error)
        cluster = self._metadata.snapshot
        blocked = acc.blocked
        blocked.clear()
        throttle_end = _IDLE
        for open_conn in self._pool.connections():
            if not open_conn.can_send_more():
                blocked.add(open_conn.node_id)
                if open_conn.throttled_until > now:
                    # The connection wakes us as its throttle ends; its timer may fire a
                    # clock tick early (asyncio runs timers due within its resolution), so
                    # the end is the next round's time too.
                    throttle_end = min(throttle_end, open_conn.throttled_until - now)
        # Only this sender's produce requests: their answers wake it (any other request's would not).
        acc.busy = {node for node, count in self._unanswered.items() if count >= _LINGERED_IN_FLIGHT}
        readiness = acc.ready(cluster, now)
        delay = min(readiness.next_check, throttle_end)
        if readiness.unknown_leader:
            for topic in readiness.unknown_leader:
                self._metadata.touch(topic, now)  # records wait for it: keep describing it
            self._metadata.request_update()  # answered (or not) by a listener wake-up
            self._fail_unplaceable(readiness.leaderless)
        connections: dict[int, BrokerConnection] = {}
        for node in readiness.nodes:
            # None: connecting, and the pool wakes us when it is up.
            conn = self._pool.connection(node)
            if conn is not None and conn.can_send_more():
                connections[node] = conn
        drained: dict[int, list[ProducerBatch]] = {}
        ident = self.idempotence
        if connections:
            can_send: Callable[[ProducerBatch, deque[ProducerBatch]], bool]
            can_send = ident.can_send if ident is not None else _always
            if txn is not None:
                can_send = _also(txn.may_send, can_send)
            drained = acc.drain(readiness, connections, self._config.max_request_size, can_send)
            for node, batches in drained.items():
                self._send(connections[node], batches, cluster, now)
        if txn is not None:
            txn.poll()
            if ident is not None and ident.new_identity_needed:
                ident.new_identity_needed = False
                txn.sequence_in_doubt()
                return 0.0  # sweep what the transaction can no longer send, at once
        elif ident is not None and ident.needs_producer_id and acc.has_queued:
            if (
                ident.has_producer_id
                and ident.producer_epoch < _MAX_EPOCH
                and not self._fresh_id_needed
                and not self._init_running
                # (Tansu refuses an epoch it did not hand out: PRODUCER_FENCED. Then ask it.)
                and not self._bump_refused
            ):
                # Java's bumpIdempotentProducerEpoch: the same id at the next epoch, taken here. A
                # broker answers InitProducerId without a transactional id with a new id whatever
                # it is sent (TransactionCoordinator.handleInitProducerId), and attempts of the old
                # id still queued in a broker (a connection given up on) would then be taken as
                # another producer's: the new epoch fences them where the partition restarts.
                self._take_identity(ident.producer_id, ident.producer_epoch + 1)
                self._bumped = (ident.producer_id, ident.producer_epoch)
                return 0.0
            self._ensure_producer_id()
        if drained:
            # A drain takes one batch per partition: look again at once for the rest.
            return 0.0
        deadline = acc.next_deadline()
        if deadline is not None:
            delay = min(delay, deadline - now)
        return max(delay, 0.0)

    def _fail_unplaceable(self, leaderless: list[TopicPartition]) -> None:
        """Fail the queued batches of ``leaderless`` partitions that no leader will take: of a
        topic the metadata refuses (TOPIC_AUTHORIZATION_FAILED, INVALID_TOPIC_EXCEPTION: an ACL
        revoked), with that error, as send() now raises it; of a partition their topic no longer
        has (deleted and created with fewer partitions), with PartitionNotFoundError. Waiting out
        the delivery timeout ended in a bare "not sent" after two minutes of refreshes. Only the
        partitions without a leader: every partition with data, each round one of them had none
        (an election), cost as much again as the round's ready()."""
        for tp in leaderless:
            refused = self._metadata.topic_error(tp.topic)
            count = None if refused is not None else self._metadata.partition_gone(tp.topic, tp.partition)
            if refused is None and count is None:
                continue
            for batch in self._acc.withdraw(tp, _any):
                error = refused if refused is not None else PartitionNotFoundError(tp.topic, tp.partition, count or 0)
                self._finish(batch, _maybe_in_log(error) if batch.possibly_persisted else _not_in_log(error))

    # -- produce requests ------------------------------------------------------------

    def _send(self, conn: BrokerConnection, batches: list[ProducerBatch], cluster: ClusterSnapshot, now: float) -> None:
        ident, txn = self.idempotence, self.transactions
        transactional = txn is not None
        try:
            # Before anything is stamped or counted on the wire: a broker that shares no Produce
            # version fails these batches (never written), not the sender task.
            conn.version_for(ProduceRequest, None if txn is None else txn.produce_version())
        except UnsupportedVersionError as exc:
            for batch in batches:
                # A retried batch an earlier attempt of which may be in the log says so.
                self._finish(batch, _maybe_in_log(exc) if batch.possibly_persisted else copy_error(exc))
            return
        topics: dict[str, list[ProduceRequestPartition]] = {}
        for batch in batches:
            tp = batch.tp
            if ident is not None:
                payload = batch.build(*ident.stamp(batch), transactional)
                ident.sent(batch)
            else:
                payload = batch.build(-1, -1, -1, False)
            if not batch.attempts and self._acc.compressing:  # its compressed size, for the estimate
                self._acc.compressed(batch, len(payload))
            batch.in_flight = True
            batch.attempts += 1
            info = cluster.topics.get(tp.topic)
            part = None if info is None else info.partitions.get(tp.partition)
            batch.leader_epoch = -1 if part is None else part.leader_epoch
            self._in_flight.add(batch)
            self._quiet.clear()
            self._acc.sent(batch)
            parts = topics.get(tp.topic)
            if parts is None:
                parts = topics[tp.topic] = []
                self._metadata.touch(tp.topic, now)
            parts.append(ProduceRequestPartition(index=tp.partition, records=payload))
        request = ProduceRequest(
            transactional_id=None if txn is None else txn.transactional_id,
            acks=self._acks,
            timeout_ms=self._request_timeout_ms,
            topic_data=[ProduceRequestTopic(name=t, partition_data=parts) for t, parts in topics.items()],
        )
        node = conn.node_id
        self._metrics.record_request(batches, now)
        conn.send_nowait(
            request,
            lambda answer: self._on_response(batches, answer, node, now),
            expect_response=self._acks != 0,
            max_version=None if txn is None else txn.produce_version(),
        )
        self._unanswered[node] = self._unanswered.get(node, 0) + 1  # the answer never comes sooner

    def _on_response(
        self,
        batches: list[ProducerBatch],
        answer: ProduceResponse | BaseException | None,
        node: int,
        sent_at: float,
    ) -> None:
        """The request's response (None with acks=0) or what ended it; called by the
        connection's reader as it reads the response (see :class:`~aioprod.net.connection.Answer`)."""
        now = asyncio.get_running_loop().time()
        left = self._unanswered.get(node, 0) - 1
        if left > 0:
            self._unanswered[node] = left
        else:
            self._unanswered.pop(node, None)
        if isinstance(answer, ProduceResponse):
            self._metrics.record_response(node, now - sent_at, answer.throttle_time_ms, now)
        try:
            self._apply(decide(batches, answer, now, self._policy), now, node)
        except Exception as exc:
            # A bug here must not leave futures pending forever: stop the producer, loudly.
            self._log.exception("aioprod failed handling a produce response")
            fatal = ProducerFatalError(f"internal error handling a produce response: {exc!r}")
            fatal.__cause__ = exc
            for batch in batches:
                self._returned(batch)
                if not batch.done:
                    self._finish(batch, _fatal_as(fatal, True))  # answered, but what the answer said is lost
            self._set_fatal(fatal)
        self.wakeup()

    def _apply(self, decisions: list[Decision], now: float, node: int = -1) -> None:
        acc, ident, txn = self._acc, self.idempotence, self.transactions
        refresh = False
        for decision in decisions:
            batch = decision.batch
            self._returned(batch)
            if (
                self._bumped is not None
                and isinstance(decision.error, _EPOCH_REFUSED)
                and (batch.producer_id, batch.producer_epoch) == self._bumped
            ):
                decision = self._bumped_epoch_refused(decision, now)
            other_cluster = batch in self._other_cluster
            if other_cluster:
                self._other_cluster.discard(batch)
            if decision.maybe_written:
                batch.maybe_written = True
            hint = decision.leader
            if hint is not None:
                tp = batch.tp
                taken = self._metadata.update_leader(tp.topic, tp.partition, hint.leader, hint.epoch, hint.address)
                if not taken and decision.action is Action.RETRY and decision.retry_at <= now:
                    # The retry was to go at once, to the leader the answer named; the metadata
                    # did not take it (it knows a newer epoch than the hint's, and so no longer
                    # the leader it names): unless the metadata leads elsewhere since the batch
                    # went, the batch would go straight back to the broker that refused it.
                    info = self._metadata.snapshot.topics.get(tp.topic)
                    part = None if info is None else info.partitions.get(tp.partition)
                    if part is None or part.leader_epoch <= batch.leader_epoch:
                        decision.retry_at = now + self._policy.backoff_after(batch.attempts)
            if decision.refresh_metadata and isinstance(decision.error, _LEADER_REFUSED):
                self._metadata.leader_refused(batch.tp.topic, batch.tp.partition, node, batch.leader_epoch)
            refresh = refresh or decision.refresh_metadata
            action = decision.action
            if batch.done:
                # It failed already (expired on the wire, or the producer closed): what the
                # broker did only matters to the partition's sequence bookkeeping.
                if ident is not None and action is Action.ACK:
                    ident.acked(batch)
                continue
            if self.fatal is not None and action is not Action.ACK:  # a written one goes on below
                self._finish(batch, _fatal_as(self.fatal, batch.possibly_persisted))
            elif decision.sequence_refused and ident is not None and batch.split_unsure:
                # A part of a batch that may have been written whole: the broker refused the part's
                # range, which says nothing of the whole's. Renumbered, it would be written twice.
                batch.maybe_written = True
                self._finish(
                    batch,
                    OutOfOrderSequenceNumberError(
                        f"{batch.tp.topic}-{batch.tp.partition}: a part of a batch that was split after an attempt "
                        f"whose outcome is unknown was refused: the records may be in the log, and are not sent "
                        f"again ({decision.error})"
                    ),
                )
            elif decision.sequence_refused and ident is not None and ident.overtaken(batch):
                # Refused after later sequences of its identity were acknowledged. If an attempt
                # may have been written, it may be in the log, out of the broker's duplicate
                # window (renumbered, it was written twice); if not, written now it would land
                # behind records sent after it.
                self._finish(batch, _overtaken(batch, decision.error))
            elif action is Action.ACK:
                if ident is not None:
                    ident.acked(batch)
                    if ident.partition(batch.tp).in_doubt:
                        self._fail_overtaken(batch.tp)  # (which may make the transaction abortable)
                if txn is not None and (txn.state in _SWEPT or txn.failed):
                    # Written, but its transaction cannot commit or is being aborted: never
                    # visible, so not acknowledged (docs/transactions.md: records not acknowledged
                    # when the abort begins fail). So too once the transactional producer failed.
                    fatal = self.fatal
                    batch.fail(
                        _fatal_as(fatal, True)
                        if txn.failed and fatal is not None
                        else _aborted(txn.error, persisted=True)
                    )
                    acc.complete(batch)
                    continue
                batch.succeed(decision.base_offset, decision.log_append_time)
                acc.complete(batch)
                if self._retry_warned:
                    self._retries_ending(batch.tp, now)
            elif action is Action.RETRY:
                if other_cluster and batch.stamped:
                    batch.needs_new_sequence = True
                if decision.sequence_refused and not self._sequence_refused(batch, decision, node):
                    continue
                self._retrying(batch, decision, node, now)
                acc.reenqueue(batch, decision.retry_at)
            elif action is Action.SPLIT:
                self._log.debug("splitting %r: %s", batch, decision.error)
                self._metrics.record_split(now)
                for piece in acc.split_and_reenqueue(batch, decision.retry_at):
                    if other_cluster and piece.stamped:
                        piece.needs_new_sequence = True
            else:
                assert decision.error is not None
                error, per_record = decision.error, decision.record_errors
                if batch.possibly_persisted:  # (it is back from the wire)
                    # The broker's last word, but an earlier attempt's answer never came: the
                    # record may be in the log, and a resend would write it twice.
                    error = _maybe_in_log(error)
                    if per_record is not None:
                        marked = {id(e): _maybe_in_log(e) for e in per_record.values()}
                        per_record = {index: marked[id(e)] for index, e in per_record.items()}
                self._finish(batch, error, per_record)
        if refresh:
            self._metadata.request_update()

    def _bumped_epoch_refused(self, decision: Decision, now: float) -> Decision:
        """The broker refused (did not write) a batch under the epoch bumped here: it does not
        take epochs it did not hand out (Tansu: PRODUCER_FENCED, for an id no one else has).
        Every later batch was refused so, for good. Instead, a new identity from the broker, and
        the batch renumbered under it, as after UNKNOWN_PRODUCER_ID. ``_bumped`` stays: every
        batch on the wire under that epoch (other partitions', later ones of this partition, in
        this answer or a later one) is refused so too, and each is renumbered."""
        batch = decision.batch
        if not self._bump_refused:
            self._bump_refused = self._fresh_id_needed = True
            self._log.debug(
                "the broker refused epoch %s of producer id %s: %s",
                batch.producer_epoch,
                batch.producer_id,
                decision.error,
            )
        if decision.action is Action.FAIL and batch.attempts <= self._policy.retries and now < batch.deadline:
            decision = Decision(batch, Action.RETRY, decision.error, retry_at=now)
        decision.sequence_refused = decision.unknown_producer = decision.action is Action.RETRY
        return decision

    def _retrying(self, batch: ProducerBatch, decision: Decision, node: int, now: float) -> None:
        """Count the retry; warn of retries from a broker (once, then rate-limited: a storm
        of them is one line per interval, saying how many there were)."""
        self._metrics.record_retry(batch, now)
        error = decision.error
        batch.last_refusal = error
        self._retry_warned.setdefault(node, set()).add(batch.tp)
        self._last_retry[node] = now
        self._metrics.events.problem(
            log,
            ("retry", node, type(error).__name__),  # each kind of error on its own: no alternating flood
            "",
            "retrying %d record(s) of %s-%d sent to %s: %s (attempt %d)",
            batch.record_count,
            batch.tp.topic,
            batch.tp.partition,
            describe_node(node),
            error,
            batch.attempts,
        )

    def _retries_ending(self, tp: TopicPartition, now: float) -> None:
        """A batch of ``tp`` was acknowledged: a broker whose retried partitions all are again,
        and that caused no retry for an interval, has its retry warnings end (one INFO line).
        (At once, a broker refusing each record once would have been a warning per record.)"""
        events = self._metrics.events
        for node, partitions in list(self._retry_warned.items()):
            partitions.discard(tp)
            if not partitions and now - self._last_retry[node] >= events.interval:
                del self._retry_warned[node], self._last_retry[node]
                events.resolved_all(
                    log, ("retry", node), "records retried from %s are acknowledged again", describe_node(node)
                )

    def _sequence_refused(self, batch: ProducerBatch, decision: Decision, node: int) -> bool:
        """The broker checked the batch's sequence and did not write it; see
        docs/delivery.md for the policy. False when that stopped the producer."""
        ident = self.idempotence
        assert ident is not None
        entry = ident.partition(batch.tp)
        explained = ident.earlier_on_wire(batch) or self._acc.stamped_before(batch)
        gap = decision.unknown_producer or entry.in_doubt or not explained
        if gap and ident.behind_failed(batch):
            # A later batch of its identity, written ahead of it, failed (possibly persisted)
            # before this refusal came (_fail_behind covers the other order): renumbered, this
            # one would land behind it.
            ident.rejected_sequence(batch, gap, lost_state=decision.unknown_producer)
            self._finish(batch, _overtaken(batch, decision.error, certain=False))
            return False
        fresh = (batch.producer_id, batch.producer_epoch) == entry.identity[:2] and batch.base_sequence == 0
        if (
            gap
            and fresh
            and not decision.unknown_producer
            and not entry.in_doubt
            and not ident.written_later(batch, self._acc.queue(batch.tp))
        ):
            # Sequence 0 under an identity is always in order, unless the broker took a later
            # batch of it first: a broker that refuses it otherwise is not following the
            # protocol, and carrying on could hide lost records. Stop.
            fatal = ProducerFatalError(
                f"{batch.tp.topic}-{batch.tp.partition}: the broker reported a sequence gap at "
                f"{batch.base_sequence} that the producer cannot explain ({decision.error})"
            )
            fatal.__cause__ = decision.error
            self._set_fatal(fatal)
            self._finish(batch, _fatal_as(fatal, batch.possibly_persisted))
            return False
        if gap and fresh and decision.unknown_producer:
            # Sequence 0 of our identity refused as an unknown producer: this broker does not take
            # the id at any epoch (it lost it, or it only takes ids it gave out, as Tansu): a new id.
            self._fresh_id_needed = True
        if gap:
            self._doubt = (
                f"{describe_node(node)} does not continue the sequence of {batch.tp.topic}-{batch.tp.partition} "
                f"({decision.error})"
            )
            self._doubt_kind = f"gap {node} {type(decision.error).__name__}"
            self._log.debug("%s; renumbering under a new identity", self._doubt)
        ident.rejected_sequence(batch, gap, lost_state=decision.unknown_producer)
        return True

    def _fail_overtaken(self, tp: TopicPartition) -> None:
        """Fail the batches of ``tp`` waiting for new sequences that a later batch of their
        identity was written ahead of (a broker without state for the producer takes any
        sequence, KIP-360): the broker refused them, so they are not in the log, and written
        now they would land out of order."""
        ident = self.idempotence
        assert ident is not None
        for batch in self._acc.withdraw(tp, lambda queued: queued.needs_new_sequence and ident.overtaken(queued)):
            self._finish(batch, _overtaken(batch, None))

    def _fail_behind(self, failed: ProducerBatch) -> None:
        """``failed`` may be in the log and will never be resolved: refused batches of its
        identity with earlier sequences (not in the log) would land behind it, renumbered."""
        for batch in self._acc.withdraw(
            failed.tp, lambda queued: queued.needs_new_sequence and earlier_under(queued, failed)
        ):
            self._finish(batch, _overtaken(batch, None, certain=False))

    def _set_fatal(self, error: KafkaError) -> None:
        """From now on nothing is sent: queued batches fail with ``error``, and batches
        still in flight fail with it when they come back."""
        if self.fatal is None:
            self.fatal = error
            self._on_fatal(error)
        self._acc.fail_all(lambda batch: _fatal_as(error, batch.possibly_persisted))

    def _returned(self, batch: ProducerBatch) -> None:
        if batch.in_flight:
            self._acc.returned(batch)
        batch.in_flight = False
        self._in_flight.discard(batch)
        if not self._in_flight:
            self._quiet.set()
        if self.idempotence is not None:
            self.idempotence.returned(batch)

    def _finish(self, batch: ProducerBatch, error: KafkaError, per_record: dict[int, KafkaError] | None = None) -> None:
        batch.fail(error, per_record)
        self._acc.complete(batch)
        if self.idempotence is not None:
            if batch.stamped:
                self._doubt = f"a batch of {batch.tp.topic}-{batch.tp.partition} failed ({error})"
                self._doubt_kind = f"failed {type(error).__name__}"
            self.idempotence.failed(batch)
            if batch.stamp_maybe_written:
                self._fail_behind(batch)
        if self.transactions is not None:
            self.transactions.record_failed(error)

    def forget_topics(self, topics: list[str]) -> None:
        """Topics unused for metadata_max_idle_ms: their partitions' sequence state goes too
        (what a new entry would replace as well; see IdempotenceState.forget)."""
        if self.idempotence is not None:
            self.idempotence.forget(topics, self._acc.holds)

    # -- producer id -------------------------------------------------------------------

    @property
    def _init_running(self) -> bool:
        return self._init_task is not None and not self._init_task.done()

    def _take_identity(self, producer_id: int, epoch: int) -> None:
        """Stamp what comes next with ``producer_id``/``epoch``; a change of identity (not the
        first one) is counted and warned of, with why."""
        ident = self.idempotence
        assert ident is not None
        if self._identities_taken:
            self._metrics.record_identity_reset()
            self._metrics.events.problem(
                log,
                "identity",
                self._doubt_kind,
                "took a new producer identity %s/%s (was %s/%s): %s",
                producer_id,
                epoch,
                *self._last_identity,  # (a cluster change sets the id to -1/-1 first)
                self._doubt,
            )
        ident.set_producer_id(producer_id, epoch)
        self._identities_taken += 1
        self._last_identity = (producer_id, epoch)

    def _ensure_producer_id(self) -> None:
        if not self._init_running:
            self._init_task = asyncio.get_running_loop().create_task(
                self._init_producer_id(), name="aioprod-init-producer-id"
            )

    async def _init_producer_id(self) -> None:
        ident = self.idempotence
        assert ident is not None
        # KIP-360: the current id and epoch let a broker bump the epoch instead of handing
        # out a new id. A broker that cannot do that for an idempotent producer (Tansu
        # answers UNKNOWN_SERVER_ERROR) is asked once more for a fresh identity.
        bump = ident.has_producer_id
        while True:
            try:
                conn = await self._pool.get(await self._metadata.node_for_request())
                changes = self._cluster_changes
                response: InitProducerIdResponse = await conn.send(
                    InitProducerIdRequest(
                        transactional_id=None,
                        transaction_timeout_ms=2**31 - 1,
                        producer_id=ident.producer_id if bump else -1,
                        producer_epoch=ident.producer_epoch if bump else -1,
                    )
                )
                if response.error_code:
                    raise error_for_code(response.error_code, "InitProducerId")
                if response.producer_id < 0 or response.producer_epoch < 0:
                    # No identity, though no error said so: asked again at once, this was a
                    # stream of requests for as long as records waited. A failed attempt instead.
                    raise CoordinatorNotAvailableError(
                        f"InitProducerId answered producer id {response.producer_id}, epoch "
                        f"{response.producer_epoch} without an error"
                    )
            except ProducerClosedError:
                return  # close() released the connections: nothing more will be sent
            except KafkaError as exc:
                self._init_failures += 1
                if bump and not exc.retriable:
                    self._log.debug("InitProducerId with the current identity failed (%s); asking for a new one", exc)
                    bump = False
                    continue
                if not exc.retriable:
                    fatal = ProducerFatalError(f"cannot obtain a producer id: {exc}")
                    fatal.__cause__ = exc
                    self._set_fatal(fatal)
                    return
                self._log.debug("InitProducerId failed: %s", exc)
                await asyncio.sleep(self._policy.backoff_after(self._init_failures))
                continue
            if changes != self._cluster_changes:
                # Asked of the cluster the id changed from: its id may be another producer's in
                # the new one (whose batch at our sequence would be taken for ours: not written).
                self._log.debug("InitProducerId answered by the previous cluster; asking the new one")
                bump = False
                continue
            self._take_identity(response.producer_id, response.producer_epoch)
            self._init_failures = 0
            self._fresh_id_needed = False
            self.wakeup()
            return


def _ring(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)


def _always(batch: ProducerBatch, queue: deque[ProducerBatch]) -> bool:
    return True


def _any(batch: ProducerBatch) -> bool:
    return True


def _also(
    first: Callable[[TopicPartition], bool], then: Callable[[ProducerBatch, deque[ProducerBatch]], bool]
) -> Callable[[ProducerBatch, deque[ProducerBatch]], bool]:
    def can_send(batch: ProducerBatch, queue: deque[ProducerBatch]) -> bool:
        return first(batch.tp) and then(batch, queue)

    return can_send


_SWEPT = frozenset({TxnState.ABORTABLE_ERROR, TxnState.ABORTING})


def _fatal_as(error: KafkaError, persisted: bool) -> KafkaError:
    """The producer's fatal ``error`` as the records of one batch get it: whether that batch
    may be in the log is theirs, not the producer's."""
    if type(error) is not ProducerFatalError or error.possibly_persisted == persisted:
        return error
    copy = copy_error(error)
    copy.possibly_persisted = persisted  # type: ignore[attr-defined]
    return copy


def _overtaken(batch: ProducerBatch, refusal: KafkaError | None, certain: bool = True) -> OutOfOrderSequenceNumberError:
    """Why a batch (back from the wire, or queued) that later sequences of its identity were
    (``certain``) or may have been written ahead of is not sent again."""
    where = f"{batch.tp.topic}-{batch.tp.partition}"
    if not certain:
        text = (
            f"{where}: the broker refused these records (they are not in the log), and a later batch of the "
            f"partition whose outcome is unknown may have been written ahead of them: they are not sent again, "
            f"as they would land out of order"
        )
    elif batch.maybe_written:
        text = (
            f"{where}: the broker acknowledged later records of the partition and no longer recognises this "
            f"batch (beyond its duplicate window of five): it may be in the log, and is not sent again"
        )
    else:
        text = (
            f"{where}: the broker wrote later records of the partition first (a broker without state for the "
            f"producer takes any sequence) and refused these: they are not in the log, and are not sent again, "
            f"as they would land out of order"
        )
    if batch.lost_attempt and not batch.maybe_written:
        text += " (an earlier attempt may be in a log in which the broker lost the producer's state)"
    error = OutOfOrderSequenceNumberError(text if refusal is None else f"{text} ({refusal})")
    error.possibly_persisted = batch.possibly_persisted  # type: ignore[attr-defined]
    return error


def _not_in_log(error: KafkaError) -> KafkaError:
    """``error`` (a copy) for a batch that is certainly not in the log."""
    error = copy_error(error)
    error.possibly_persisted = False  # type: ignore[attr-defined]
    return error


def _maybe_in_log(error: KafkaError) -> KafkaError:
    """``error`` for a batch an earlier attempt of which may have been written."""
    error = copy_error(error)
    error.possibly_persisted = True  # type: ignore[attr-defined]
    error.add_note("an earlier attempt's answer never came: the record may be in the log")
    return error


def _aborted(cause: KafkaError | None, persisted: bool = False) -> TransactionAbortedError:
    what = (
        "after the record was sent, before it was acknowledged (it may be in the log, hidden by the abort marker)"
        if persisted
        else "before the record was sent"
    )
    error = TransactionAbortedError(f"the transaction was aborted {what} ({cause})", possibly_persisted=persisted)
    error.__cause__ = cause
    return error

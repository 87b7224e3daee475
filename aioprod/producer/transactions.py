"""Transactions: KIP-98's transactional producer, KIP-447's consumer-group metadata,
KIP-890's transactions v2.

The state follows the Java client's ``TransactionManager``: UNINITIALIZED → INITIALIZING →
READY ⇄ IN_TRANSACTION → COMMITTING / ABORTING → READY; a transaction that cannot commit
is in ABORTABLE_ERROR (abort it, and the producer goes on); an error nothing can repair
is FATAL_ERROR (close the producer). Beyond Java: IN_TRANSACTION → PREPARING → PREPARED
delivers the transaction and leaves it open for another process to end by its handle
(:class:`PreparedTransaction`, :func:`end_prepared`); a PREPARED producer can only close.

Under transactions v1 every partition joins the transaction (AddPartitionsToTxn to the
transaction coordinator) before its first batch is sent: the sender holds such batches
back and this module adds all partitions new in a sender round in one request. Offsets
join through AddOffsetsToTxn, then TxnOffsetCommit to the group coordinator; EndTxn ends
the transaction. Under transactions v2 (a cluster that finalizes ``transaction.version`` 2,
with Produce v12 and EndTxn v5) a transactional produce request adds its partitions by
itself, TxnOffsetCommit v5 adds the offsets, and EndTxn hands back the producer epoch for
the next transaction (the coordinator bumps it every time).

Requests to the coordinators are retried inside the call that needs them when the answer
says so (coordinator moved or loading, concurrent transaction, lost connection); the call
is bounded by ``max_block_ms`` and may be repeated to keep waiting for the same operation.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, fields
from typing import Any, NoReturn

from aioprod.cluster.metadata import Metadata
from aioprod.config import ProducerConfig
from aioprod.errors import (
    BrokerResponseError,
    BrokerTransactionAbortableError,
    ClusterAuthorizationFailedError,
    FencedInstanceIdError,
    IllegalGenerationError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    KafkaError,
    KafkaTimeoutError,
    PreparedTransactionError,
    ProducerClosedError,
    ProducerFatalError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionalIdAuthorizationFailedError,
    TransactionStateError,
    UnknownMemberIdError,
    UnknownProducerIdError,
    copy_error,
    has_cause,
)
from aioprod.event_log import ClientLogger
from aioprod.net.connection import BrokerConnection
from aioprod.net.pool import ConnectionPool
from aioprod.producer.batch import TopicPartition
from aioprod.producer.coordinators import GROUP, TRANSACTION, Coordinators, mark_retrieved
from aioprod.producer.idempotence import IdempotenceState
from aioprod.protocol import versions
from aioprod.protocol.messages import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnRequestTopic,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
    TxnOffsetCommitResponse,
)
from aioprod.protocol.schema import Request

log = logging.getLogger(__name__)

#: Operations that take no arguments: calling one again waits for (or reports) the first.
_RESUMABLE = frozenset({"start", "commit_transaction", "abort_transaction", "prepare_transaction"})

#: Answers that leave the producer unusable (Java's fatal transactional errors).
_FATAL = frozenset(
    {
        ProducerFencedError.code,
        InvalidProducerEpochError.code,
        TransactionalIdAuthorizationFailedError.code,
        ClusterAuthorizationFailedError.code,
        InvalidTxnStateError.code,
        35,  # UNSUPPORTED_VERSION
        50,  # INVALID_TRANSACTION_TIMEOUT
    }
)
#: Of those, the ones that are fatal when a produce request answers them: INVALID_PRODUCER_EPOCH
#: and INVALID_TXN_STATE there mean this transaction is over (it timed out at the
#: coordinator, say), so it is aborted and the producer goes on (KIP-588).
_FATAL_FOR_RECORDS = frozenset(
    {
        ProducerFencedError.code,
        TransactionalIdAuthorizationFailedError.code,
        ClusterAuthorizationFailedError.code,
        35,  # UNSUPPORTED_VERSION
    }
)
#: Answers meaning the coordinator no longer knows this producer id (the transactional id
#: expired while the producer was idle: transactional.id.expiration.ms). As Java does, the
#: transaction is aborted and the identity renewed: InitProducerId with the old id and epoch,
#: which the coordinator answers with a fresh id.
_IDENTITY_GONE = frozenset({InvalidProducerIdMappingError.code, UnknownProducerIdError.code})
#: TxnOffsetCommit answers meaning the consumer group moved on: the offsets cannot commit.
_GROUP_MOVED_ON = frozenset({UnknownMemberIdError.code, IllegalGenerationError.code, FencedInstanceIdError.code})
#: Java's ADD_PARTITIONS_RETRY_BACKOFF_MS, in seconds.
_FIRST_ADD_BACKOFF = 0.02


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in a transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "in a transaction that must be aborted"
    FATAL_ERROR = "failed"
    PREPARING = "preparing its transaction"
    PREPARED = "holding a prepared transaction (another process ends it; this producer can only close)"


#: The states in which the transaction's records are delivered before it ends or is handed over.
_DELIVERING = (TxnState.COMMITTING, TxnState.PREPARING)


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """An offset to commit with the transaction: the next record the consumer will read."""

    offset: int
    metadata: str | None = None
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """Who consumed the input (KIP-447): the group coordinator refuses a commit from a
    member that is no longer part of the group's current generation."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedTransaction:
    """The handle of a transaction left open by :meth:`aioprod.Producer.prepare_transaction`:
    enough for any process to commit or abort it. Plain data: it pickles and crosses
    processes (a Spark task hands it to the driver)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    #: 2 when the transaction ran under transactions v2 (KIP-890): it is ended with EndTxn v5.
    transaction_version: int = 1
    #: The cluster it was prepared in: producer ids start from 0 in every cluster, so another
    #: cluster may know this id and epoch as another producer's, whose transaction an EndTxn would
    #: end. None: not known (a handle of an earlier version, or brokers that name no cluster).
    cluster_id: str | None = None

    def __setstate__(self, state: list[Any]) -> None:
        """As the dataclass's: values in field order, extra ones (a later version's fields)
        ignored; but a pickle of a handle without the fields added since fills them with their
        defaults (a handle kept across an upgrade)."""
        for index, spec in enumerate(fields(self)):
            object.__setattr__(self, spec.name, state[index] if index < len(state) else spec.default)


class TransactionManager:
    """Transactional state and the coordinator requests; the sender asks it which
    partitions may be written (:meth:`may_send`) and tells it what failed."""

    def __init__(
        self,
        config: ProducerConfig,
        metadata: Metadata,
        pool: ConnectionPool,
        idempotence: IdempotenceState,
        *,
        wakeup: Callable[[], None],
        on_fatal: Callable[[KafkaError], None],
        identify_cluster: Callable[[BrokerConnection], Awaitable[None]] | None = None,
        current_cluster: Callable[[], str | None] = lambda: None,
    ) -> None:
        assert config.transactional_id is not None
        self.transactional_id = config.transactional_id
        self._config = config
        self._log = ClientLogger(log, config.client_id)
        self._metadata = metadata
        self._pool = pool
        self._ident = idempotence
        self._wakeup = wakeup
        self._on_fatal = on_fatal
        self._identify_cluster = identify_cluster
        self._current_cluster = current_cluster
        self.state = TxnState.UNINITIALIZED
        #: Why the transaction must be aborted, or why the producer failed.
        self.error: KafkaError | None = None
        #: This transaction speaks transactions v2 (decided when it begins).
        self.v2 = False
        self._coordinators = Coordinators(
            config,
            metadata,
            pool,
            name=f"transaction {self.transactional_id!r}",
            fatal_codes=_FATAL,
            on_fatal=self.fatal,
        )
        #: Partitions in the coordinator's transaction (v1), or written to (v2).
        self._partitions: set[TopicPartition] = set()
        self._to_add: set[TopicPartition] = set()
        #: Partitions in the AddPartitionsToTxn under way.
        self._pending: set[TopicPartition] = set()
        self._adding: asyncio.Task[None] | None = None
        #: The last TxnOffsetCommit written to the group coordinator: an abort waits for its answer.
        self._offsets_on_wire: asyncio.Future[Any] | None = None
        #: The coordinator has a transaction open (a partition or offsets were added) ...
        self._started = False
        #: ... or may have: a request that would open it went out without its answer.
        self._maybe_started = False
        #: After the abort, bump the epoch (KIP-360): a sequence of this producer is in doubt.
        self._bump_epoch = False
        self._operation: tuple[str, asyncio.Task[None]] | None = None
        #: The arguments of the operation (a repeated send_offsets_to_transaction waits for the same one).
        self._operation_key: object = None
        #: An operation's task cancelled from outside, and why, for its waiting caller.
        self._cut_short: tuple[asyncio.Task[None], KafkaError] | None = None
        #: The producer failed (see producer_failed): no transaction may commit or begin.
        self._producer_error: KafkaError | None = None
        #: Counts transactions begun: a send() must queue into the one it started in.
        self.generation = 0
        #: The handle of the prepared transaction, once PREPARED.
        self.prepared: PreparedTransaction | None = None
        #: A call returned that handle: its holder ends the transaction, close() leaves it open.
        self._handed_over = False
        #: send_many() calls queuing records now; a commit waits for them (see _deliver).
        self.queuing = 0
        self._none_queuing = asyncio.Event()
        self._none_queuing.set()
        #: Cluster id changes seen (see :meth:`cluster_changed`): an InitProducerId answer read
        #: after one is the old cluster's.
        self._cluster_changes = 0
        #: The cluster changed under this producer's identity (why, as raised): nothing more is
        #: asked of a coordinator under it (see :meth:`cluster_changed`).
        self._cluster_left: ProducerFatalError | None = None
        #: The id of the cluster the producer id and epoch came from (None: not named).
        self._cluster_id: str | None = None

    # -- state -------------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self.state is TxnState.FATAL_ERROR

    @property
    def in_transaction(self) -> bool:
        return self.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR)

    @property
    def has_transaction(self) -> bool:
        """A transaction exists, open, ending or prepared (not: starting up, ready, failed)."""
        return self.state not in (TxnState.UNINITIALIZED, TxnState.INITIALIZING, TxnState.READY, TxnState.FATAL_ERROR)

    def accepts(self, generation: int) -> bool:
        """Records may still be queued into transaction ``generation``."""
        return self.state is TxnState.IN_TRANSACTION and generation == self.generation

    def check_send(self, generation: int | None = None) -> int:
        """send() is allowed only inside a transaction that can still commit; with
        ``generation`` (what this call returned when the send began), only in that same
        transaction. Returns the current transaction's generation."""
        if self.state is TxnState.IN_TRANSACTION and (generation is None or generation == self.generation):
            return self.generation
        if generation is None and self.state in _DELIVERING:
            raise TransactionStateError(
                f"send() is not allowed while the transaction is {self._where()}: begin the next transaction "
                "once it ends"
            )
        if self.state is TxnState.IN_TRANSACTION or self.state in _DELIVERING:
            raise TransactionStateError(
                "the transaction this send() began in ended (it committed, aborted or was prepared) before the "
                "record could be queued; the record was not sent"
            )
        if self.state is TxnState.ABORTABLE_ERROR:
            raise self._must_abort()
        if self.state is TxnState.FATAL_ERROR:
            raise ProducerFatalError(f"the transactional producer failed: {self.error}") from self.error
        if self.state is TxnState.PREPARED:
            raise TransactionStateError(f"send() is not allowed: the producer is {self._where()}")
        raise TransactionStateError(
            f"send() needs an open transaction: call begin_transaction() first ({self._where()})"
        )

    def begin(self, connections: list[BrokerConnection]) -> None:
        self._fail_if_busy("begin_transaction")
        self._operation = None  # an earlier call's unreported outcome belongs to that transaction
        if self.state is not TxnState.READY:
            raise self._wrong_state("begin_transaction")
        self.v2 = _speaks_transactions_v2(connections)
        self._partitions.clear()
        self._to_add.clear()
        self._pending.clear()
        self._started = self._maybe_started = False
        self.generation += 1
        self.state = TxnState.IN_TRANSACTION

    def queued_done(self) -> None:
        self.queuing -= 1
        if not self.queuing:
            self._none_queuing.set()

    def partly_queued(self, generation: int, error: KafkaError) -> None:
        """A send_many() of transaction ``generation`` queued only part of its records: that
        transaction must not commit with the part alone."""
        if generation == self.generation:
            self.abortable(error)

    def abortable(self, error: KafkaError) -> None:
        """The current transaction cannot commit any more."""
        if _identity_gone(error):
            self._bump_epoch = True  # renewed after the abort, or every transaction fails alike
        if self.state in (TxnState.IN_TRANSACTION, *_DELIVERING, TxnState.ABORTABLE_ERROR):
            if self.state is not TxnState.ABORTABLE_ERROR:
                self._log.info("transaction %r must be aborted: %s", self.transactional_id, error)
                self.error = error
            self.state = TxnState.ABORTABLE_ERROR

    def fatal(self, error: KafkaError) -> ProducerFatalError:
        self.state = TxnState.FATAL_ERROR
        self.error = error
        fatal = ProducerFatalError(f"the transactional producer {self.transactional_id!r} failed: {error}")
        fatal.__cause__ = error
        self._on_fatal(fatal)
        return fatal

    def producer_failed(self, error: BaseException) -> None:
        """The producer failed outside the transaction's own requests (its sender died, or a
        broker broke the protocol): records of the transaction may have failed with it, so no
        transaction of this producer may commit, or begin. An open one may still be aborted
        (explicitly, or by close()), which frees its partitions for read_committed readers."""
        if self.failed or self._producer_error is not None:
            return
        if isinstance(error, KafkaError):
            failed = error
        else:
            failed = ProducerFatalError(f"the producer failed: {error!r}")
            failed.__cause__ = error
        self._producer_error = failed
        if self.state in (TxnState.IN_TRANSACTION, *_DELIVERING, TxnState.ABORTABLE_ERROR):
            self.abortable(failed)
        elif self.state is not TxnState.ABORTING:  # an abort under way ends in FATAL_ERROR (see _ended)
            self.state = TxnState.FATAL_ERROR
            self.error = failed

    def _ended(self) -> None:
        """The transaction was committed or aborted: the next may begin, unless the producer failed."""
        if self._producer_error is not None:
            self.state = TxnState.FATAL_ERROR
            self.error = self._producer_error
        elif not self.failed:
            self.error = None
            self.state = TxnState.READY

    def record_failed(self, error: KafkaError) -> None:
        """A record of the transaction failed (the sender tells us)."""
        if self.state is TxnState.ABORTING or self.state is TxnState.FATAL_ERROR:
            return
        if _is_fatal(error):
            self.fatal(error)
        else:
            self.abortable(error)

    def cluster_changed(self, error: ProducerFatalError) -> None:
        """Another cluster is behind the bootstrap addresses (the sender saw its id). The producer
        id and epoch are the old cluster's, and the new one, whose ids start from the same place,
        may have given them to another producer of this transactional id (a newer instance, which
        ours must not fence, nor be taken for): an EndTxn, AddPartitionsToTxn or TxnOffsetCommit
        under them would end, join or commit offsets into that producer's transaction. None goes
        out from now on; an identity still being asked for is asked of the new cluster."""
        self._cluster_changes += 1
        if self._ident.has_producer_id and self._cluster_left is None:
            self._cluster_left = error

    def _under_identity(self, build: Callable[[], Request]) -> Callable[[], Request]:
        """``build`` for a request that carries the producer id and epoch: it refuses to build
        once the cluster changed (each retry builds anew, and a retry reaches the new cluster)."""

        def checked() -> Request:
            self._refuse_if_cluster_left()
            return build()

        return checked

    def _refuse_if_cluster_left(self) -> None:
        if self._cluster_left is not None:
            raise copy_error(self._cluster_left)

    def check_handle(self, prepared: PreparedTransaction) -> None:
        """Before a handle of this transactional id is ended through this producer: once the
        cluster changed, a handle prepared in the old one names an id and epoch that may be
        another producer's in the new one, whose open transaction its EndTxn would end."""
        if prepared.transactional_id == self.transactional_id:
            self._refuse_if_cluster_left()

    def sequence_in_doubt(self) -> None:
        """A partition's sequence cannot continue; a transactional producer cannot renumber
        silently: the transaction is aborted, and the epoch bumped before the next one."""
        self._bump_epoch = True
        self.abortable(TransactionAbortableError("a batch of the transaction failed and its sequence is in doubt"))

    # -- what the sender asks ------------------------------------------------------------------

    def add_partition(self, tp: TopicPartition) -> bool:
        """A batch for ``tp`` was queued in the transaction (as Java's
        ``maybeAddPartitionToTransaction``, but per batch): under v1 the partition joins in
        the next AddPartitionsToTxn, with every other partition new by then. True when it
        is new: the sender has that request to send."""
        if self.v2:
            self._maybe_started = True  # the produce request adds it (KIP-890)
        elif tp not in self._partitions and tp not in self._pending:
            self._to_add.add(tp)
            return True
        return False

    def may_send(self, tp: TopicPartition) -> bool:
        """May a batch of ``tp`` go now? Under v1, only once the partition is in the
        coordinator's transaction."""
        return self.v2 or tp in self._partitions

    def poll(self) -> None:
        """Once a sender round: add the partitions that became new in it, in one request."""
        if (
            self._to_add
            and (self._adding is None or self._adding.done())
            and self.state in (TxnState.IN_TRANSACTION, *_DELIVERING)
        ):
            adding, self._to_add = self._to_add, set()
            self._pending = adding
            self._adding = asyncio.get_running_loop().create_task(
                self._add_partitions(adding), name="aioprod-txn-add-partitions"
            )

    def produce_version(self) -> int:
        """The Produce version ceiling: v12 only inside a transactions-v2 transaction."""
        return versions.TRANSACTIONS_V2_VERSIONS[ProduceRequest.API_KEY] if self.v2 else 11

    # -- operations (run as tasks, awaited by the public calls) -----------------------------------

    async def run(self, name: str, make: Callable[[], Coroutine[Any, Any, None]], key: object = None) -> None:
        """Run transactional operation ``name`` as a task the call waits for, up to
        ``max_block_ms``. A commit, abort or start whose caller gave up (timed out, or was
        cancelled) goes on, and calling it again waits for it, or reports how it ended; an
        abort cancels a pending ``send_offsets_to_transaction``; any other call while an
        operation runs fails at once."""
        op = self._operation
        task = None
        if (
            op is not None
            and op[0] == name
            and (name in _RESUMABLE or (key is not None and key == self._operation_key))
        ):
            task = op[1]  # the same call again: its task, running or ended unreported
        elif op is not None and not op[1].done():
            if not (name == "abort_transaction" and op[0] == "send_offsets_to_transaction"):
                raise TransactionStateError(f"{op[0]}() is still in progress; {name}() must wait for it to end")
            self._cut_short = (
                op[1],
                TransactionAbortedError(
                    "abort_transaction() was called while send_offsets_to_transaction() was in progress"
                ),
            )
            op[1].cancel()  # the offsets would be aborted with the rest anyway
            try:
                await asyncio.wait([op[1]])
            except BaseException:
                # This abort was cancelled before it began: nothing aborts the offsets it cut short,
                # which may have joined in part (AddOffsetsToTxn without TxnOffsetCommit). Committing
                # now would commit the output without them.
                abandoned = TransactionAbortableError(
                    "send_offsets_to_transaction() was cut short by an abort_transaction() that was itself "
                    "cancelled: the offsets may have joined in part; call abort_transaction()"
                )
                self.abortable(abandoned)
                self._cut_short = (op[1], abandoned)
                raise
            now = self._operation
            if now is not None and now[0] == name and now[1] is not op[1]:
                task = now[1]  # another abort_transaction() waited alongside and began the abort: join it
        if task is None:
            task = asyncio.get_running_loop().create_task(make(), name=f"aioprod-txn-{name}")
            # Its outcome is reported to the next call, or lives on in the state (an abortable
            # error): not as asyncio's "exception was never retrieved" if nobody calls again.
            task.add_done_callback(mark_retrieved)
            self._operation = (name, task)
            self._operation_key = key
        window = asyncio.timeout(self._config.max_block_ms / 1000)
        try:
            async with window:
                await asyncio.shield(task)
        except TimeoutError:
            if not window.expired():  # the operation itself ended with a timeout error: report it
                self._forget(task)
                raise
            last = self._coordinators.last_error
            if name == "start":  # start() closes the producer when it fails: nothing goes on
                raise KafkaTimeoutError(
                    f"the transactional producer could not initialise within max_block_ms "
                    f"({self._config.max_block_ms} ms): the coordinator did not answer InitProducerId"
                    + (f" (the last answer: {last})" if last is not None else "")
                    + "; the producer is closed"
                ) from None
            raise KafkaTimeoutError(
                f"{name}() did not complete within max_block_ms ({self._config.max_block_ms} ms)"
                + (f" (the coordinator's last answer: {last})" if last is not None else "")
                + f"; it goes on: call {name}() again to keep waiting"
            ) from None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                # Not our caller's cancellation: an abort or close cut the operation short.
                self._forget(task)
                cut = self._cut_short
                raise (
                    cut[1]
                    if cut is not None and cut[0] is task
                    else ProducerClosedError(f"the producer closed while {name}() was in progress")
                ) from None
            raise
        except BaseException:
            self._forget(task)
            raise
        self._forget(task)

    def _forget(self, task: asyncio.Task[None]) -> None:
        """The operation's outcome reached a caller: the next call starts afresh."""
        if self._operation is not None and self._operation[1] is task:
            self._operation = None

    async def initialize(self) -> None:
        self.state = TxnState.INITIALIZING
        while True:
            changes = self._cluster_changes
            # Which cluster the identity comes from must be known (asked on the connection each
            # InitProducerId goes on): one replaced before the first send would otherwise go
            # unnoticed, and its id and epoch be used there.
            response = await self._init_producer_id(-1, -1, before=self._identify_cluster)
            if self._producer_error is not None:
                # The producer failed meanwhile (the brokers named a cluster it had left: two
                # clusters behind the addresses): it is not ready, and start() says why.
                raise copy_error(self._producer_error)
            if changes == self._cluster_changes:
                break
            # Answered by the cluster the producer moved away from: its id and epoch may be those
            # of another producer of this transactional id in the new one, which ours would then
            # neither fence nor be told apart from.
            self._log.debug(
                "InitProducerId for %r answered by the previous cluster; asking the new one", self.transactional_id
            )
        self._cluster_id = self._current_cluster()  # no change since it was asked: the identity's
        self._ident.set_producer_id(response.producer_id, response.producer_epoch)
        self.state = TxnState.READY
        self._log.info(
            "transactional producer %r ready: producer id %s, epoch %s",
            self.transactional_id,
            response.producer_id,
            response.producer_epoch,
        )

    async def commit(self, flush: Callable[[], Awaitable[None]]) -> None:
        await self._deliver("commit_transaction", TxnState.COMMITTING, flush)
        try:
            await self._wait_for_adds()
            if self._started or self._maybe_started:
                await self._end(commit=True)
        except KafkaError as exc:
            self._cannot_end(exc)
        self._ended()

    async def prepare(self, flush: Callable[[], Awaitable[None]]) -> None:
        """Deliver the transaction and leave it open: every record acknowledged, every partition
        (and any offsets) in the coordinator's transaction; then only the handle is needed to end it."""
        await self._deliver("prepare_transaction", TxnState.PREPARING, flush)
        try:
            await self._wait_for_adds()
        except KafkaError as exc:
            self._cannot_end(exc)
        if not (self._started or self._maybe_started):
            self.state = TxnState.IN_TRANSACTION
            raise TransactionStateError(
                "prepare_transaction(): the transaction is empty (no record, no offsets), so the coordinator has "
                "nothing to end; commit or abort it instead"
            )
        self.prepared = self._handle()
        self.state = TxnState.PREPARED
        self._log.info("transaction %r prepared: %s", self.transactional_id, self.prepared)

    async def _deliver(self, name: str, state: TxnState, flush: Callable[[], Awaitable[None]]) -> None:
        """The transaction takes no more records (``state``); wait until every one it has is delivered."""
        if self.state is TxnState.ABORTABLE_ERROR:
            raise self._must_abort()
        if self.state is not TxnState.IN_TRANSACTION:
            raise self._wrong_state(name)
        self.state = state
        if self.queuing:
            # A send_many() is between two records: it stops queuing at its next check (the
            # transaction takes no more records), and its queued part must not commit alone.
            self._none_queuing.clear()
            await self._none_queuing.wait()
        await flush()
        if self.failed:
            raise self._wrong_state(name)
        if self.state is not state:  # a record failed meanwhile
            raise self._must_abort()

    def _cannot_end(self, error: KafkaError) -> NoReturn:
        """What commit or prepare raises when a request of its own failed."""
        if self.failed or isinstance(error, TransactionAbortableError | ProducerFatalError):
            raise error
        self.abortable(error)
        raise TransactionAbortableError(
            f"the transaction could not commit ({error}): call abort_transaction()"
        ) from error

    async def abort(self, fail_unsent: Callable[[KafkaError], None], flush: Callable[[], Awaitable[None]]) -> None:
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.ABORTING):
            raise self._wrong_state("abort_transaction")
        cause = self.error
        self.state = TxnState.ABORTING
        self._to_add.clear()
        fail_unsent(cause or TransactionStateError("the transaction was aborted"))
        await flush()  # what is on the wire comes back first
        sent, self._offsets_on_wire = self._offsets_on_wire, None
        if sent is not None and not sent.done():
            # A TxnOffsetCommit cut short by this abort (it cancels send_offsets_to_transaction)
            # is on the wire to the group coordinator, another broker: handled after the abort
            # marker, its offsets would stay pending under this producer id and commit with the
            # next transaction's (a broker without KIP-890 verification). As Java, the EndTxn
            # waits for it (its connection's request timeout bounds the wait).
            await asyncio.wait([sent])
        if self._adding is not None and not self._adding.done():
            # Nothing of the aborted transaction needs its partitions added, and an add the
            # coordinator keeps refusing with a retriable error (a partition deleted meanwhile:
            # UNKNOWN_TOPIC_OR_PARTITION) would never end: stop it (as Java fails it in an
            # error state). It may have reached the coordinator: the EndTxn may find nothing open.
            self._adding.cancel()
            await asyncio.wait([self._adding])
            self._maybe_started = True
        renewed = False
        if self._started or self._maybe_started:
            # Only maybe opened: the coordinator may answer that there is nothing to end.
            renewed = await self._end(commit=False, nothing_open_is_fine=not self._started)
        if (self._bump_epoch or self._ident.in_doubt) and not renewed and self._producer_error is None:
            await self._bump()
        self._bump_epoch = False
        self._ended()

    async def send_offsets(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], group: ConsumerGroupMetadata
    ) -> None:
        if self.state is TxnState.ABORTABLE_ERROR:
            raise self._must_abort()
        if self.state is not TxnState.IN_TRANSACTION:
            raise self._wrong_state("send_offsets_to_transaction")
        if not offsets:
            # As Java: nothing to commit, nothing sent. (Under transactions v2 Kafka answers an
            # empty TxnOffsetCommit without opening the transaction, and the commit's EndTxn was
            # then refused with INVALID_TXN_STATE, which is fatal.)
            return
        try:
            await self._add_offsets(offsets, group)
        except KafkaError as exc:
            # As the Java client: offsets that could not join leave a transaction that must not
            # commit (it would commit the output without them); fatal answers failed it already.
            if not self.failed:
                self.abortable(exc)
            if isinstance(exc, BrokerResponseError) and exc.code in _GROUP_MOVED_ON:
                raise TransactionAbortableError(
                    f"the consumer group {group.group_id!r} moved on (a rebalance?): the offsets cannot commit ({exc})"
                ) from exc
            raise
        except Exception as exc:
            # So do offsets a bug cut short: they may have joined in part. (Only an abort or
            # close cancels this, and they abort the transaction anyway.)
            if not self.failed:
                self.abortable(TransactionAbortableError(f"sending the offsets did not finish: {exc!r}"))
            raise

    async def _add_offsets(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], group: ConsumerGroupMetadata
    ) -> None:
        ident = self._ident
        self._maybe_started = True
        if not self.v2:
            await self._coordinators.request(
                TRANSACTION,
                self.transactional_id,
                self._under_identity(
                    lambda: AddOffsetsToTxnRequest(
                        transactional_id=self.transactional_id,
                        producer_id=ident.producer_id,
                        producer_epoch=ident.producer_epoch,
                        group_id=group.group_id,
                    )
                ),
                AddOffsetsToTxnResponse,
                lambda r: [r.error_code],
            )
        self._started = True
        by_topic: dict[str, list[TxnOffsetCommitRequestPartition]] = {}
        for tp, meta in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                TxnOffsetCommitRequestPartition(
                    partition_index=tp.partition,
                    committed_offset=meta.offset,
                    committed_leader_epoch=-1 if meta.leader_epoch is None else meta.leader_epoch,
                    committed_metadata=meta.metadata,
                )
            )
        topics = [TxnOffsetCommitRequestTopic(name, parts) for name, parts in by_topic.items()]
        await self._coordinators.request(
            GROUP,
            group.group_id,
            self._under_identity(
                lambda: TxnOffsetCommitRequest(
                    transactional_id=self.transactional_id,
                    group_id=group.group_id,
                    producer_id=ident.producer_id,
                    producer_epoch=ident.producer_epoch,
                    generation_id=group.generation_id,
                    member_id=group.member_id,
                    group_instance_id=group.group_instance_id,
                    topics=topics,
                )
            ),
            TxnOffsetCommitResponse,
            lambda r: [p.error_code for t in r.topics for p in t.partitions],
            max_version=versions.TRANSACTIONS_V2_VERSIONS[TxnOffsetCommitRequest.API_KEY] if self.v2 else None,
            on_wire=self._offsets_sent,
        )

    def _offsets_sent(self, sent: asyncio.Future[Any]) -> None:
        self._offsets_on_wire = sent

    async def end_on_close(
        self, fail_unsent: Callable[[KafkaError], None], flush: Callable[[], Awaitable[None]]
    ) -> None:
        """close() aborts a transaction that is still open (as the Java client does), but not a
        prepared one whose handle a caller has. A commit, abort or prepare under way is waited
        for; the whole is bounded by the transaction timeout, after which the coordinator
        aborts the transaction anyway."""
        async with asyncio.timeout(self._config.transaction_timeout_ms / 1000):
            op = self._operation
            if op is not None and not op[1].done():
                if op[0] in ("commit_transaction", "abort_transaction", "prepare_transaction"):
                    await asyncio.wait([op[1]])
                else:
                    op[1].cancel()
                    await asyncio.wait([op[1]])
            if self.in_transaction or self.state is TxnState.ABORTING:  # (an abort that failed part-way)
                self._log.info("aborting transaction %r: the producer is closing", self.transactional_id)
                await self.abort(fail_unsent, flush)
            elif self.state is TxnState.PREPARED and not self._handed_over:
                # Prepared, but its handle never reached a caller (prepare_transaction() timed
                # out or was cancelled, and was not called again): nobody else can end it.
                self._log.info("aborting prepared transaction %r: its handle was never returned", self.transactional_id)
                self.state = TxnState.ABORTING
                await self._end(commit=False)
                self.state = TxnState.READY

    def hand_over(self) -> PreparedTransaction:
        """The prepared transaction's handle, as returned to a caller (see :meth:`end_on_close`)."""
        assert self.prepared is not None
        self._handed_over = True
        return self.prepared

    def cancel(self) -> list[asyncio.Task[None]]:
        """The producer closes now: stop whatever runs."""
        tasks = [t for t in (self._adding, self._operation[1] if self._operation else None) if t is not None]
        for task in tasks:
            task.cancel()
        return tasks

    # -- the requests ----------------------------------------------------------------------------

    async def _init_producer_id(
        self, producer_id: int, epoch: int, *, before: Callable[[BrokerConnection], Awaitable[None]] | None = None
    ) -> InitProducerIdResponse:
        def build() -> Request:
            return InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self._config.transaction_timeout_ms,
                producer_id=producer_id,
                producer_epoch=epoch,
            )

        return await self._coordinators.request(
            TRANSACTION,
            self.transactional_id,
            # A bump (KIP-360) names the current identity: in another cluster, another producer's.
            build if producer_id < 0 else self._under_identity(build),
            InitProducerIdResponse,
            lambda r: [r.error_code],
            before=before,
            lacking=_without_identity,
        )

    async def _bump(self) -> None:
        """KIP-360: a new epoch for the same producer id, so sequences start again."""
        ident = self._ident
        conn = await self._coordinators.connection(TRANSACTION, self.transactional_id)
        if versions.choose_version(InitProducerIdRequest, conn.api_versions) < 3:
            raise self.fatal(
                TransactionStateError(
                    "a sequence is in doubt and the coordinator cannot bump the epoch (InitProducerId < v3)"
                )
            )
        try:
            response = await self._init_producer_id(ident.producer_id, ident.producer_epoch)
        except BrokerResponseError as exc:
            if exc.retriable:
                raise
            # As Java ("Unexpected error in InitProducerIdResponse"): the producer cannot go on
            # under an epoch whose sequences are in doubt. Left in ABORTING, every abort asked
            # again and was refused again, and begin_transaction() said "aborting" for good
            # (Tansu 0.6 answers a bump UNKNOWN_SERVER_ERROR).
            exc.add_note("the coordinator refused to bump the epoch after the abort (a sequence was in doubt)")
            raise self.fatal(exc) from exc
        ident.set_producer_id(response.producer_id, response.producer_epoch)
        self._log.info("transactional producer %r: epoch bumped to %s", self.transactional_id, response.producer_epoch)

    async def _end(self, *, commit: bool, nothing_open_is_fine: bool = False) -> bool:
        """End the transaction; True if the answer gave the producer a new epoch (KIP-890)."""
        ident = self._ident
        tolerate = frozenset({InvalidTxnStateError.code}) if nothing_open_is_fine else frozenset()
        if not commit:
            tolerate |= _IDENTITY_GONE  # no transaction of ours to abort: renew the identity
        sent: list[asyncio.Future[Any]] = []
        try:
            self._refuse_if_cluster_left()  # (before looking for a coordinator in the cluster left)
            response = await _end_txn(
                self._coordinators,
                self._handle(),
                commit=commit,
                tolerate=tolerate,
                under=self._under_identity,
                on_wire=sent.append,
            )
        except ProducerFatalError as exc:
            if commit and (self._cluster_left is not None or _fenced(exc)) and any(map(_unanswered, sent)):
                # An EndTxn committing it got no answer saying it was done, and the retry cannot say
                # either: it went to the cluster left, or the coordinator answers a fenced epoch so
                # whatever became of the transaction (Kafka checks the epoch first). It may be
                # committed. Not abortable (an abort would say "never visible").
                why = "before the producer left that cluster" if self._cluster_left is not None else "before a fence"
                doubt = KafkaError(
                    f"the commit's outcome is in doubt: an EndTxn committing the transaction got no answer "
                    f"{why} ({exc}): it may have committed"
                )
                doubt.__cause__ = exc
                fatal = self.fatal(doubt)
                fatal.possibly_persisted = True
                raise fatal from doubt
            if commit or self._cluster_left is None:
                raise
            # The transaction is in the cluster the producer left, which it cannot reach: that
            # cluster's coordinator aborts it once transaction_timeout_ms passes.
            self._log.info(
                "transaction %r is left to the coordinator of the cluster the producer left (%s): it aborts it "
                "after transaction_timeout_ms",
                self.transactional_id,
                self._cluster_left,
            )
            return False
        if response.error_code:
            if response.error_code in _IDENTITY_GONE:
                self._bump_epoch = True
            return False  # tolerated: nothing was open
        if self.v2 and response.producer_id >= 0:
            # KIP-890: the coordinator bumped the epoch (or, past its maximum, gave a new id).
            ident.set_producer_id(response.producer_id, response.producer_epoch)
            return True
        return False

    async def _add_partitions(self, adding: set[TopicPartition]) -> None:
        ident = self._ident
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(adding):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        # A try whose answer is lost may have opened the transaction, though the call fails in
        # the end (a retry refused for good): the abort must then end it, as after offsets.
        self._maybe_started = True
        try:
            await self._coordinators.request(
                TRANSACTION,
                self.transactional_id,
                self._under_identity(
                    lambda: AddPartitionsToTxnRequest(
                        v3_and_below_transactional_id=self.transactional_id,
                        v3_and_below_producer_id=ident.producer_id,
                        v3_and_below_producer_epoch=ident.producer_epoch,
                        v3_and_below_topics=[AddPartitionsToTxnRequestTopic(t, p) for t, p in by_topic.items()],
                    )
                ),
                AddPartitionsToTxnResponse,
                _add_partitions_codes,
                # As Java: the transaction's first add refused so is the last one's markers still
                # being written, a matter of milliseconds; the retry backoff (100 ms) capped small
                # transactions at a few a second.
                concurrent_backoff=None if self._partitions else _FIRST_ADD_BACKOFF,
            )
        except KafkaError as exc:
            self._pending = set()
            if self.state is not TxnState.FATAL_ERROR:
                self.abortable(exc)
            self._wakeup()
            return
        self._pending = set()
        self._partitions |= adding
        self._started = True
        self._wakeup()

    async def _wait_for_adds(self) -> None:
        while self._to_add or (self._adding is not None and not self._adding.done()):
            self.poll()
            if self._adding is not None:
                await asyncio.wait([self._adding])
            if self.state not in _DELIVERING:
                raise self._must_abort()

    # -- helpers -----------------------------------------------------------------------------------

    def _fail_if_busy(self, name: str) -> None:
        op = self._operation
        if op is not None and not op[1].done():
            raise TransactionStateError(f"{op[0]}() is still in progress; {name}() must wait for it to end")

    def _handle(self) -> PreparedTransaction:
        """This producer's transaction, as anyone can end it."""
        ident = self._ident
        # No id named when the identity was taken (a Redpanda cluster names a placeholder until its
        # id reaches the broker): the first one named since, which the sender too takes for the
        # cluster it has been writing to.
        cluster = self._cluster_id if self._cluster_id is not None else self._current_cluster()
        return PreparedTransaction(
            self.transactional_id, ident.producer_id, ident.producer_epoch, 2 if self.v2 else 1, cluster
        )

    def _must_abort(self) -> KafkaError:
        if self._producer_error is not None:
            failed = ProducerFatalError(
                f"the transactional producer failed: {self._producer_error} (abort_transaction() or close() "
                "ends the open transaction; no other can begin)"
            )
            failed.__cause__ = self._producer_error
            return failed
        error = TransactionAbortableError(f"the transaction cannot commit ({self.error}): call abort_transaction()")
        error.__cause__ = self.error
        return error

    def _wrong_state(self, name: str) -> KafkaError:
        if self._producer_error is not None and self.state is not TxnState.FATAL_ERROR:
            return self._must_abort()  # the producer failed: only the open transaction's abort is left
        if self.state is TxnState.FATAL_ERROR:
            error = ProducerFatalError(f"the transactional producer failed: {self.error}")
            error.__cause__ = self.error
            return error
        return TransactionStateError(f"{name}() is not allowed now: the producer is {self._where()}")

    def _where(self) -> str:
        return self.state.value


def _add_partitions_codes(response: AddPartitionsToTxnResponse) -> list[int]:
    return [p.partition_error_code for t in response.results_by_topic_v3_and_below for p in t.results_by_partition]


#: EndTxn answers meaning a prepared transaction is not open under its producer id and epoch.
_NOT_OPEN = {
    ProducerFencedError.code: "a newer producer with its transactional id fenced it (a retried or speculative "
    "attempt, say), or the coordinator aborted it when it outlived its transaction timeout",
    InvalidProducerEpochError.code: "a newer producer with its transactional id fenced it, or the coordinator "
    "aborted it when it outlived its transaction timeout",
    InvalidProducerIdMappingError.code: "the coordinator no longer knows its producer id (the transactional id "
    "expired?)",
    BrokerTransactionAbortableError.code: "the coordinator asked for it to be aborted",
}


async def end_prepared(
    coordinators: Coordinators,
    prepared: PreparedTransaction,
    *,
    commit: bool,
    cluster_named_by: Callable[[BrokerConnection], Awaitable[str | None]],
    sent_before: bool = False,
    on_wire: Callable[[], None] | None = None,
) -> None:
    """Commit or abort a prepared transaction from any process: EndTxn with its handle's
    producer id and epoch, to its coordinator. Ending it again the same way succeeds (the
    coordinator answers a repeat as done); a transaction that is no longer open under that
    epoch, or a handle of another cluster than the coordinator's (``cluster_named_by`` asks a
    connection's), raises :class:`PreparedTransactionError`. ``sent_before``: an earlier call's
    EndTxn for it may have reached the coordinator (the call gave up before an answer came);
    ``on_wire`` is called as each EndTxn is sent."""
    cannot = (
        f"cannot {'commit' if commit else 'abort'} transaction {prepared.transactional_id!r} "
        f"(producer id {prepared.producer_id}, epoch {prepared.producer_epoch})"
    )

    tries = 0
    #: Each EndTxn sent: one that ended without an answer may have committed.
    sent: list[asyncio.Future[Any]] = []

    async def in_its_cluster(conn: BrokerConnection) -> None:
        # On the connection each EndTxn goes on, before it: a retry (after CONCURRENT_TRANSACTIONS,
        # a coordinator moved, a connection lost) may reach a cluster that replaced the one checked.
        nonlocal tries
        tries += 1
        if prepared.cluster_id is None:
            return
        here = await cluster_named_by(conn)
        if here is None or here == prepared.cluster_id:
            return
        where = (
            f"it was prepared in cluster {prepared.cluster_id!r}, and this producer's brokers are now cluster "
            f"{here!r}, where its producer id and epoch may be another producer's"
        )
        if tries > 1:
            # An earlier EndTxn went to the handle's cluster, and its answer may be the one lost.
            raise KafkaError(
                f"{cannot} in cluster {here!r}, and its outcome is in doubt: {where}, and an earlier EndTxn to "
                f"{prepared.cluster_id!r} got no answer that said it was done: it may have ended there"
            )
        raise PreparedTransactionError(
            f"{cannot}: {where}. It stays open in {prepared.cluster_id!r} until its coordinator aborts it "
            "(transaction_timeout_ms), unless a producer of that cluster ends it",
            prepared,
        )

    def written(try_: asyncio.Future[Any]) -> None:
        sent.append(try_)
        if on_wire is not None:
            on_wire()

    try:
        await _end_txn(coordinators, prepared, commit=commit, before=in_its_cluster, on_wire=written)
    except BrokerResponseError as exc:
        if exc.code == InvalidTxnStateError.code:
            why = f"it is not open: it was {'aborted' if commit else 'committed'} already, or never began"
        elif exc.code in _NOT_OPEN:
            why = _NOT_OPEN[exc.code]
        else:
            raise
        if commit and exc.code in _FENCED and (sent_before or any(map(_unanswered, sent[:-1]))):
            # Kafka checks the epoch before the transaction's state: once a newer producer fenced it,
            # a commit that went through is answered so too. Not "never visible": written again, its
            # records would be there twice.
            raise KafkaError(
                f"{cannot}, and its outcome is in doubt: the coordinator answers {exc.name} (a newer producer "
                "with its transactional id fenced it, or it outlived its transaction timeout), but an earlier "
                "EndTxn committing it got no answer: it may have committed before that"
            ) from exc
        raise PreparedTransactionError(f"{cannot}: {why} ({exc.name})", prepared) from exc


#: Answers to an EndTxn under an epoch no longer current: given whatever the transaction's state.
_FENCED = frozenset({ProducerFencedError.code, InvalidProducerEpochError.code})


async def fence_transactional_id(
    coordinators: Coordinators, transactional_id: str, transaction_timeout_ms: int
) -> None:
    """What a new producer of ``transactional_id`` does first, and nothing more: InitProducerId,
    on which the coordinator aborts the transaction the id has open (answering
    CONCURRENT_TRANSACTIONS, retried, until the abort is written) and fences the producer that
    had it. An id never used gets its first producer id."""
    await coordinators.request(
        TRANSACTION,
        transactional_id,
        lambda: InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            producer_id=-1,
            producer_epoch=-1,
        ),
        InitProducerIdResponse,
        lambda r: [r.error_code],
        lacking=_without_identity,
    )


def _without_identity(response: InitProducerIdResponse) -> str | None:
    """An answer without an identity, though no error said so, is asked again (as the idempotent
    producer's): a fence it answered so may not have happened."""
    if response.producer_id >= 0 and response.producer_epoch >= 0:
        return None
    return f"no identity (producer id {response.producer_id}, epoch {response.producer_epoch})"


async def _end_txn(
    coordinators: Coordinators,
    transaction: PreparedTransaction,
    *,
    commit: bool,
    tolerate: frozenset[int] = frozenset(),
    under: Callable[[Callable[[], Request]], Callable[[], Request]] = lambda build: build,
    before: Callable[[BrokerConnection], Awaitable[None]] | None = None,
    on_wire: Callable[[asyncio.Future[Any]], None] | None = None,
) -> EndTxnResponse:
    """EndTxn for ``transaction`` (a producer's own, or a handle), retried as its answers allow;
    ``under`` wraps the request's builder (the producer's check of its identity), ``before`` is
    awaited on each try's connection (a handle's check of the cluster)."""
    return await coordinators.request(
        TRANSACTION,
        transaction.transactional_id,
        under(
            lambda: EndTxnRequest(
                transactional_id=transaction.transactional_id,
                producer_id=transaction.producer_id,
                producer_epoch=transaction.producer_epoch,
                committed=commit,
            )
        ),
        EndTxnResponse,
        lambda r: [r.error_code],
        max_version=versions.TRANSACTIONS_V2_VERSIONS[EndTxnRequest.API_KEY]
        if transaction.transaction_version >= 2
        else None,
        tolerate=tolerate,
        before=before,
        on_wire=on_wire,
    )


def _speaks_transactions_v2(connections: list[BrokerConnection]) -> bool:
    """KIP-890 part 2 is on when the cluster finalizes ``transaction.version`` >= 2 and the
    broker speaks its versions of Produce and EndTxn. The newest features decide (the highest
    epoch, as Java's ApiVersions keeps them): a connection opened before the feature was
    lowered still reports 2, and v2 requests went on to a cluster back on v1."""
    newest = max(connections, key=lambda conn: conn.finalized_features_epoch, default=None)
    if newest is None or newest.finalized_features.get(versions.TRANSACTION_VERSION_FEATURE, 0) < 2:
        return False
    supported = newest.api_versions
    return all(
        supported.get(key, (0, -1))[1] >= version
        for key, version in versions.TRANSACTIONS_V2_VERSIONS.items()
        if key != TxnOffsetCommitRequest.API_KEY
    )


def _unanswered(try_: asyncio.Future[Any]) -> bool:
    return not try_.done() or try_.cancelled() or try_.exception() is not None


def _fenced(error: BaseException) -> bool:
    return has_cause(error, lambda e: isinstance(e, BrokerResponseError) and e.code in _FENCED)


def _identity_gone(error: BaseException) -> bool:
    return has_cause(error, lambda e: isinstance(e, BrokerResponseError) and e.code in _IDENTITY_GONE)


def _is_fatal(error: KafkaError) -> bool:
    """A record failed with an error the transactional producer cannot go on after."""
    return has_cause(error, lambda e: isinstance(e, BrokerResponseError) and e.code in _FATAL_FOR_RECORDS)


def as_offsets(offsets: Mapping[TopicPartition, int | OffsetAndMetadata]) -> dict[TopicPartition, OffsetAndMetadata]:
    """Check and normalise ``send_offsets_to_transaction``'s offsets."""
    if not isinstance(offsets, Mapping):
        raise TypeError(
            "offsets must be a mapping of TopicPartition(topic, partition) to the next offset to read "
            f"(an int or OffsetAndMetadata), got {type(offsets).__name__}"
        )
    out = {}
    for tp, value in offsets.items():
        if not isinstance(tp, tuple) and isinstance(getattr(tp, "topic", None), str):
            # another client's TopicPartition (confluent-kafka's): its topic and partition
            tp = (tp.topic, getattr(tp, "partition", None))
        if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and type(tp[1]) is int):
            raise TypeError(f"offsets keys must be TopicPartition(topic, partition), got {tp!r}")
        if type(value) is int:
            value = OffsetAndMetadata(value)
        elif not isinstance(value, OffsetAndMetadata) and hasattr(value, "offset") and hasattr(value, "metadata"):
            # another client's OffsetAndMetadata (aiokafka's, kafka-python's): its fields, checked below
            value = OffsetAndMetadata(value.offset, value.metadata, getattr(value, "leader_epoch", None))
        if not isinstance(value, OffsetAndMetadata):
            raise TypeError(f"offset for {tp} must be an int or OffsetAndMetadata, got {type(value).__name__}")
        # Checked here, before anything is sent: the encoder's own errors came after
        # AddOffsetsToTxn, untyped.
        if not 0 <= tp[1] < 2**31:
            raise ValueError(f"offsets keys' partition must be an int32 >= 0, got {tp[1]}")
        _check_int(f"offset for {tp}", value.offset, 0, 2**63)
        if value.metadata is not None and not isinstance(value.metadata, str):
            raise TypeError(f"metadata for {tp} must be a str or None, got {type(value.metadata).__name__}")
        _check_utf8(f"offsets keys' topic {tp[0]!r}", tp[0])
        if value.metadata is not None:
            _check_utf8(f"metadata for {tp}", value.metadata)
        if value.leader_epoch is not None:
            _check_int(f"leader_epoch for {tp}", value.leader_epoch, -1, 2**31)
        out[TopicPartition(tp[0], tp[1])] = value
    return out


def _check_utf8(what: str, text: str) -> None:
    """``text`` has a UTF-8 form (no lone surrogate): the protocol's strings are UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} cannot be encoded as UTF-8: {exc.reason} at position {exc.start}") from None


def _check_int(what: str, value: Any, low: int, high: int) -> None:
    """``value`` is an int (not a bool) in [low, high)."""
    if type(value) is not int:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not low <= value < high:
        raise ValueError(f"{what} must be >= {low} and < {high}, got {value}")


#: How librdkafka's consumer_group_metadata() bytes begin (rd_kafka_consumer_group_metadata_write).
_LIBRDKAFKA_GROUP = b"CGMDv2:"


def _librdkafka_group(data: bytes) -> ConsumerGroupMetadata:
    """confluent-kafka's ``consumer.consumer_group_metadata()``: librdkafka's own form, made in
    this process. After the magic, the generation (int32, this host's byte order), the group id
    and the member id, each NUL-ended, then a byte: 1 when there is no group instance id, 0
    when its NUL-ended id follows."""
    problem = TypeError(
        "group: bytes that are not confluent_kafka's consumer_group_metadata() (librdkafka's CGMDv2 form); give "
        "the group id or ConsumerGroupMetadata(group_id, generation_id, member_id, group_instance_id)"
    )
    if not data.startswith(_LIBRDKAFKA_GROUP) or len(data) < len(_LIBRDKAFKA_GROUP) + 7:
        raise problem
    body = data[len(_LIBRDKAFKA_GROUP) :]
    (generation,) = struct.unpack("=i", body[:4])
    parts = body[4:].split(b"\0", 2)
    if len(parts) != 3:
        raise problem
    group_id, member_id, rest = parts
    if rest == b"\x01":
        instance = None
    elif rest[:1] == b"\x00" and rest.endswith(b"\0") and b"\0" not in rest[1:-1]:
        instance = rest[1:-1]
    else:
        raise problem
    try:
        return ConsumerGroupMetadata(
            group_id.decode(), generation, member_id.decode(), None if instance is None else instance.decode()
        )
    except UnicodeDecodeError:
        raise problem from None


def as_group(group: str | ConsumerGroupMetadata | Any) -> ConsumerGroupMetadata:
    """A group id, our ConsumerGroupMetadata, or any object with ``group_id`` (and
    optionally ``generation_id``, ``member_id``, ``group_instance_id``) attributes."""
    if isinstance(group, str):
        if not group:
            raise ValueError("the consumer group id is empty")
        group = ConsumerGroupMetadata(group)
    elif isinstance(group, bytes):
        group = _librdkafka_group(group)
    elif not isinstance(group, ConsumerGroupMetadata):
        group_id = getattr(group, "group_id", None)
        if not isinstance(group_id, str) or not group_id:
            raise TypeError(f"group must be a group id or consumer group metadata, got {type(group).__name__}")
        group = ConsumerGroupMetadata(
            group_id,
            int(getattr(group, "generation_id", -1)),
            str(getattr(group, "member_id", "") or ""),
            getattr(group, "group_instance_id", None),
        )
    if not isinstance(group.group_id, str) or not group.group_id:
        raise ValueError(f"the consumer group id must be a non-empty str, got {group.group_id!r}")
    _check_int("the consumer group's generation_id", group.generation_id, -(2**31), 2**31)
    if not isinstance(group.member_id, str):
        raise TypeError(f"the consumer group's member_id must be a str, got {type(group.member_id).__name__}")
    instance = group.group_instance_id
    if instance is not None and not isinstance(instance, str):
        raise TypeError(f"the consumer group's group_instance_id must be a str or None, got {type(instance).__name__}")
    _check_utf8("the consumer group id", group.group_id)
    _check_utf8("the consumer group's member_id", group.member_id)
    if instance is not None:
        _check_utf8("the consumer group's group_instance_id", instance)
    return group

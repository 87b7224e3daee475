"""The sender task: the Java producer's Sender thread, as one coroutine.

Each round: find nodes with sendable batches (``ready``), drop those whose connection is
not ready, take batches per node (``drain``), expire what outlived its delivery timeout,
and write one ProduceRequest per node. Responses come back as future callbacks that
resolve records, or put retriable batches back at the head of their partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aioprod.cluster.metadata import Metadata
from aioprod.config import ProducerConfig
from aioprod.errors import (
    BrokerResponseError,
    DuplicateSequenceNumberError,
    KafkaConnectionError,
    KafkaError,
    OutOfOrderSequenceNumberError,
    ProducerClosedError,
    ProducerFatalError,
    UnknownProducerIdError,
    error_for_code,
)
from aioprod.net.connection import BrokerConnection
from aioprod.net.pool import ConnectionPool, exponential_backoff
from aioprod.producer.accumulator import RecordAccumulator
from aioprod.producer.batch import ProducerBatch
from aioprod.producer.idempotence import IdempotenceState
from aioprod.protocol.messages import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceRequestPartition,
    ProduceRequestTopic,
    ProduceResponse,
)

log = logging.getLogger(__name__)

# Errors after which the leader we sent to is probably not the leader any more
# (Java's InvalidMetadataException family).
_STALE_METADATA = frozenset({3, 5, 6, 13, 56, 74, 75})
_DUPLICATE_SEQUENCE = DuplicateSequenceNumberError.code
_OUT_OF_ORDER_SEQUENCE = OutOfOrderSequenceNumberError.code
_UNKNOWN_PRODUCER_ID = UnknownProducerIdError.code


class Sender:
    """Owns draining, in-flight requests and their outcomes; runs as one task."""

    def __init__(
        self,
        config: ProducerConfig,
        metadata: Metadata,
        pool: ConnectionPool,
        accumulator: RecordAccumulator,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._config = config
        self._metadata = metadata
        self._pool = pool
        self._acc = accumulator
        self._on_fatal = on_fatal
        self.idempotence = IdempotenceState() if config.enable_idempotence else None
        self._acks = config.acks
        self._request_timeout_ms = config.request_timeout_ms
        self._in_flight: set[ProducerBatch] = set()
        #: The error that stopped this producer for good, if any.
        self.fatal: KafkaError | None = None
        #: Batches put back for another attempt (a statistic).
        self.retries = 0
        self._wake_flag = False
        self._waiter: asyncio.Future[None] | None = None
        self._stopping = False
        self._init_task: asyncio.Task[None] | None = None
        self._init_failures = 0
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aioprod-sender")

    def wakeup(self) -> None:
        self._wake_flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def stop(self) -> None:
        """Finish what is queued, then end (close() bounds how long that may take)."""
        self._stopping = True
        self.wakeup()

    async def abort(self, error: KafkaError) -> None:
        """Stop now: fail queued batches as not sent, in-flight ones as unknown."""
        self._stopping = True
        self._acc.fail_all(error)
        for batch in list(self._in_flight):
            batch.fail(error)
            self._acc.complete(batch)
        self._in_flight.clear()
        tasks = [task for task in (self._task, self._init_task) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            # wait(), not await: the tasks' own outcome is theirs, but our caller's cancellation is not ours to eat.
            await asyncio.wait(tasks)

    async def wait_stopped(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    # -- the loop ------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not (self._stopping and not self._acc.incomplete):
                delay = self._run_once(loop.time())
                await self._sleep(delay)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("aioprod sender task died")
            self._on_fatal(exc)
            fatal = ProducerFatalError(f"the sender task died: {exc!r}")
            fatal.__cause__ = exc
            self._acc.fail_all(fatal)
            for batch in list(self._in_flight):
                batch.fail(fatal)
                self._acc.complete(batch)
            self._in_flight.clear()

    async def _sleep(self, delay: float) -> None:
        if self._wake_flag:
            self._wake_flag = False
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        handle = loop.call_later(max(delay, 0.0), _resolve, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            self._waiter = None
            self._wake_flag = False

    def _run_once(self, now: float) -> float:
        acc = self._acc
        if self.fatal is not None:
            acc.fail_all(self.fatal)
            return 3600.0
        for batch in acc.expire(now):
            self._finish(batch, acc.expiry_error(batch, now))
        ident = self.idempotence
        if ident is not None and not ident.has_producer_id:
            # A new identity is taken only once nothing is in flight under the old one.
            if acc.incomplete and not ident.any_in_flight:
                self._ensure_producer_id()
            return 3600.0
        cluster = self._metadata.snapshot
        ready, delay, unknown_leader = acc.ready(cluster, now)
        if unknown_leader:
            self._metadata.request_update()
            delay = min(delay, self._config.retry_backoff_ms / 1000)
        connections: dict[int, BrokerConnection] = {}
        for node in ready:
            conn = self._pool.connection(node)
            if conn is not None and conn.can_send_more():
                connections[node] = conn
        if connections:
            can_send = ident.can_send if ident is not None else _always
            drained = acc.drain(cluster, connections, self._config.max_request_size, now, can_send)
            for node, batches in drained.items():
                self._send(connections[node], batches)
            if drained:
                # A drain takes one batch per partition: look again at once for the rest.
                # Nodes that cannot take more wake the sender when a response frees room.
                return 0.0
        return delay

    # -- produce requests ------------------------------------------------------------

    def _send(self, conn: BrokerConnection, batches: list[ProducerBatch]) -> None:
        ident = self.idempotence
        topics: dict[str, list[ProduceRequestPartition]] = {}
        for batch in batches:
            if ident is not None:
                payload = batch.build(ident.producer_id, ident.producer_epoch, ident.assign(batch), False)
                ident.sent(batch)
            else:
                payload = batch.build(-1, -1, -1, False)
            batch.in_flight = True
            batch.sent_once = True
            batch.attempts += 1
            self._in_flight.add(batch)
            topics.setdefault(batch.tp.topic, []).append(
                ProduceRequestPartition(index=batch.tp.partition, records=payload)
            )
        request = ProduceRequest(
            transactional_id=None,
            acks=self._acks,
            timeout_ms=self._request_timeout_ms,
            topic_data=[ProduceRequestTopic(name=t, partition_data=parts) for t, parts in topics.items()],
        )
        future = conn.send_nowait(request, expect_response=self._acks != 0)
        future.add_done_callback(lambda f: self._on_response(batches, f))

    def _on_response(self, batches: list[ProducerBatch], future: asyncio.Future[ProduceResponse | None]) -> None:
        try:
            self._handle_response(batches, future)
        except Exception as exc:
            # A bug here must not leave futures pending forever: stop the producer, loudly.
            log.exception("aioprod failed handling a produce response")
            fatal = ProducerFatalError(f"internal error handling a produce response: {exc!r}")
            fatal.__cause__ = exc
            for batch in batches:
                self._returned(batch)
                self._finish(batch, fatal)
            self._set_fatal(fatal)

    def _handle_response(self, batches: list[ProducerBatch], future: asyncio.Future[ProduceResponse | None]) -> None:
        now = asyncio.get_running_loop().time()
        error = future.exception() if not future.cancelled() else ProducerClosedError("request cancelled")
        if error is not None:
            for batch in batches:
                self._failed_attempt(batch, error if isinstance(error, KafkaError) else _wrap(error), now)
            self._metadata.request_update()
            self.wakeup()
            return
        response = future.result()
        if response is None:  # acks=0: the broker answers nothing
            for batch in batches:
                self._returned(batch)
                batch.succeed(-1, -1)
                self._acc.complete(batch)
            self.wakeup()
            return
        by_tp = {batch.tp: batch for batch in batches}
        for topic in response.responses:
            for part in topic.partition_responses:
                batch = by_tp.pop((topic.name, part.index), None)  # type: ignore[call-overload]
                if batch is None:
                    continue
                code = part.error_code
                if code == 0 or code == _DUPLICATE_SEQUENCE:
                    self._returned(batch)
                    batch.succeed(part.base_offset, part.log_append_time_ms)
                    self._acc.complete(batch)
                    continue
                if code in _STALE_METADATA:
                    self._metadata.request_update()
                error = error_for_code(code, part.error_message)
                if self.idempotence is not None and code in (_UNKNOWN_PRODUCER_ID, _OUT_OF_ORDER_SEQUENCE):
                    self._sequence_error(batch, error, now)
                else:
                    self._failed_attempt(batch, error, now)
        for batch in by_tp.values():
            self._failed_attempt(
                batch, KafkaError(f"broker response had no result for {batch.tp.topic}-{batch.tp.partition}"), now
            )
        self.wakeup()

    def _failed_attempt(self, batch: ProducerBatch, error: KafkaError, now: float) -> None:
        self._returned(batch)
        if self.fatal is not None:
            self._finish(batch, self.fatal)
            return
        retriable = error.retriable
        if retriable and not self._stopping_hard():
            backoff = exponential_backoff(
                self._config.retry_backoff_ms / 1000, self._config.retry_backoff_max_ms / 1000, batch.attempts
            )
            if batch.attempts <= self._config.retries and now + backoff < batch.deadline:
                log.debug("retrying %r after %s", batch, error)
                self.retries += 1
                self._acc.reenqueue(batch, now + backoff)
                return
            if now + backoff >= batch.deadline:
                error = self._acc.expiry_error(batch, now)
        self._finish(batch, error)

    def _sequence_error(self, batch: ProducerBatch, error: BrokerResponseError, now: float) -> None:
        """The broker's sequence check refused ``batch``; see docs/delivery.md for the policy."""
        ident = self.idempotence
        assert ident is not None
        explained = ident.explains_gap(batch) or self._acc.queued_before(batch)
        self._returned(batch)
        if error.code == _OUT_OF_ORDER_SEQUENCE and explained:
            # Sent ahead of an earlier batch that failed: retry behind it, in order.
            self.retries += 1
            self._acc.reenqueue(batch, now)
            return
        if error.code == _UNKNOWN_PRODUCER_ID or batch.base_sequence != 0:
            # The broker forgot this producer (it lost its state, or the head of the log
            # was removed): new identity, sequences from zero (KIP-360), as Java does.
            log.info("broker lost producer id %s (%s); taking a new one", ident.producer_id, error)
            ident.needs_reset = True
            self.retries += 1
            self._acc.reenqueue(batch, now)
            return
        # Sequence 0 under an identity is always in order: a broker that refuses it is not
        # following the protocol, and carrying on could hide lost records. Stop.
        fatal = ProducerFatalError(
            f"{batch.tp.topic}-{batch.tp.partition}: the broker reported a sequence gap at "
            f"{batch.base_sequence} that the producer cannot explain ({error})"
        )
        fatal.__cause__ = error
        self._set_fatal(fatal)
        self._finish(batch, fatal)

    def _set_fatal(self, error: KafkaError) -> None:
        """From now on nothing is sent: queued batches fail with ``error``, and batches
        still in flight fail with it when they come back."""
        if self.fatal is None:
            self.fatal = error
            self._on_fatal(error)
        self._acc.fail_all(error)

    def _stopping_hard(self) -> bool:
        return self._task is not None and self._task.done()

    def _returned(self, batch: ProducerBatch) -> None:
        batch.in_flight = False
        self._in_flight.discard(batch)
        if self.idempotence is not None:
            self.idempotence.returned(batch)

    def _finish(self, batch: ProducerBatch, error: KafkaError) -> None:
        batch.fail(error)
        self._acc.complete(batch)
        ident = self.idempotence
        if ident is not None and ident.owns_sequence(batch):
            # The batch's sequence is now a hole that the broker may or may not have filled
            # (it may have been written before its answer was lost). Continuing would mean
            # either a gap or a guess; a new identity starts every partition clean.
            ident.needs_reset = True

    # -- producer id -------------------------------------------------------------------

    def _ensure_producer_id(self) -> None:
        if self._init_task is None or self._init_task.done():
            self._init_task = asyncio.get_running_loop().create_task(
                self._init_producer_id(), name="aioprod-init-producer-id"
            )

    async def _init_producer_id(self) -> None:
        assert self.idempotence is not None
        while True:
            node = self._metadata.least_loaded_node()
            try:
                if node is None:
                    raise KafkaConnectionError("no broker address known")
                conn = await self._pool.get(node)
                response: InitProducerIdResponse = await conn.send(
                    InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=2**31 - 1)
                )
                if response.error_code:
                    raise error_for_code(response.error_code, "InitProducerId")
            except KafkaError as exc:
                self._init_failures += 1
                if not exc.retriable:
                    fatal = ProducerFatalError(f"cannot obtain a producer id: {exc}")
                    fatal.__cause__ = exc
                    self._set_fatal(fatal)
                    return
                log.debug("InitProducerId failed: %s", exc)
                await asyncio.sleep(
                    exponential_backoff(
                        self._config.retry_backoff_ms / 1000,
                        self._config.retry_backoff_max_ms / 1000,
                        self._init_failures,
                    )
                )
                continue
            self.idempotence.set_producer_id(response.producer_id, response.producer_epoch)
            self._init_failures = 0
            self.wakeup()
            return


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _always(batch: ProducerBatch) -> bool:
    return True


def _wrap(error: BaseException) -> KafkaError:
    wrapped = KafkaError(f"request failed: {error!r}")
    wrapped.__cause__ = error
    return wrapped

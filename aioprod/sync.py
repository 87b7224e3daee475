"""A synchronous facade over :class:`~aioprod.Producer`, for plain threads and non-async code.

One background thread runs an event loop (uvloop when installed) that owns one
``Producer``; every public method hands work to that loop through an anyio blocking portal
and waits, always for a bounded time, for the answer. Any number of threads may share one
``SyncProducer``.

    with SyncProducer(bootstrap_servers="localhost:9092") as producer:
        future = producer.send("orders", b"value", key=b"k")    # concurrent.futures.Future
        metadata = future.result()
        producer.send_and_wait("orders", b"other")

See ``docs/sync.md``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import importlib.util
import inspect
import itertools
import logging
import os
import sys
import threading
import time
import types
import warnings
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from aioprod.cluster.metadata import ClusterSnapshot
from aioprod.errors import (
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    ProducerFatalError,
    TransactionAbortableError,
)
from aioprod.metrics import MetricsSnapshot
from aioprod.producer.batch import TopicPartition
from aioprod.producer.producer import Producer, check_timeout, send_many_values
from aioprod.producer.record_future import RecordMetadata
from aioprod.producer.transactions import ConsumerGroupMetadata, OffsetAndMetadata, PreparedTransaction

__all__ = ["SyncProducer"]

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Settling(Protocol[T_co]):
    """What ``_chain`` needs of a future: an asyncio.Future or a RecordFuture."""

    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> T_co: ...
    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...


#: Added to every wait on the loop thread beyond the producer's own bound for the same work
#: (``max_block_ms`` for queueing, ``delivery_timeout_ms`` for acknowledgements), so that the
#: producer's precise error wins and the facade's fallback timeout only fires if the loop
#: itself is stuck.
_GRACE = 5.0


class _Unset:
    """The type of a keyword argument's "not given" (None means something else there)."""


_UNSET = _Unset()
#: How long interpreter exit waits for a SyncProducer the program never closed.
_ATEXIT_CLOSE_TIMEOUT = 5.0
_JOIN_TIMEOUT = 10.0
#: The longest a wait of the main thread blocks at a time (see ``_settled``).
_SLICE = 0.1

_counter = itertools.count(1)
_live: weakref.WeakSet[SyncProducer] = weakref.WeakSet()
#: Closes nobody waits for (of producers dropped unclosed, and those interpreter exit starts):
#: the exit waits for them, one bound for all.
_abandoned_closes: set[tuple[concurrent.futures.Future[None], threading.Thread, int]] = set()


class SyncProducer:
    """A thread-safe, blocking Kafka producer backed by one :class:`~aioprod.Producer`.

    The constructor takes the same options as ``Producer`` (a mapping of Java/librdkafka
    names and/or snake_case keywords) and starts the producer's thread; configuration
    errors raise here, in the caller's thread. Use it as a context manager or call
    :meth:`close`.

    Every method waits for a bounded time: queueing a record waits at most
    ``max_block_ms`` (plus a few seconds' grace; ``send_many`` each wait for buffer memory,
    for as long as the producer's loop answers), waiting for acknowledgements at most
    ``delivery_timeout_ms`` (plus grace) unless a shorter ``timeout`` is given. Errors are
    the same :mod:`aioprod.errors` exceptions the async producer raises.

    Futures returned by :meth:`send` and :meth:`send_many` are
    :class:`concurrent.futures.Future` objects; their callbacks run on the producer's
    thread, so keep them short and never call this producer's blocking methods from them.

    ``use_uvloop``: ``None`` (default) uses uvloop when it is installed.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        use_uvloop: bool | None = None,
        start_timeout: float | _Unset | None = _UNSET,
        **options: Any,
    ) -> None:
        if use_uvloop is not None and not isinstance(use_uvloop, bool):
            # "no", 0.0 or a string from a settings file: taken for its truth value, uvloop for "no".
            raise TypeError(f"SyncProducer() use_uvloop must be True, False or None, got {use_uvloop!r}")
        producer = Producer(config, **options)  # validates the configuration in this thread
        self._producer = producer
        self.config = producer.config
        self._max_block = producer.config.max_block_ms / 1000
        # A start bounds itself by max_block_ms (a transactional one's InitProducerId): a shorter
        # wait here cut off its error, which names the coordinator's last answer, with its own.
        start_wait = (
            self._max_block + _GRACE
            if isinstance(start_timeout, _Unset)
            else check_timeout("SyncProducer", start_timeout, "start_timeout")
        )
        self._delivery_timeout = producer.config.delivery_timeout_ms / 1000
        self._lock = threading.Lock()
        self._closing: concurrent.futures.Future[None] | None = None
        self._pid = os.getpid()
        self._portal, self._loop, self._thread, self._gate = _start_portal(
            use_uvloop, f"aioprod-sync-producer-{next(_counter)}"
        )
        self._escaped = _Escaped(self._thread)
        metrics = producer._metrics  # (its callback runs on this loop too: see _Escaped)
        if metrics._statistics_callback is not None:
            metrics._statistics_callback = self._escaped.statistics(metrics._statistics_callback)
        try:
            self._call(start_wait, producer.start)
        except BaseException:
            _start_close(self._portal, self._loop, self._gate, producer, 0)
            self._thread.join(_JOIN_TIMEOUT)
            raise
        # If the program drops the object without closing it, close it in the background.
        self._finalizer = weakref.finalize(
            self, _abandoned, self._portal, self._loop, self._gate, producer, self._thread, self._pid
        )
        self._finalizer.atexit = False
        _live.add(self)

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._closing is None else ("closed" if self._closing.done() else "closing")
        return f"<SyncProducer {state} thread={self._thread.name}>"

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called (the close may still be running)."""
        return self._closing is not None

    @property
    def in_transaction(self) -> bool:
        """A transaction is open (begun, not yet committed or aborted). Read in the caller's
        thread: a transactional call another thread has running may change it at any moment."""
        return self._producer.in_transaction

    # -- sending ---------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue a record; returns a future of its :class:`~aioprod.RecordMetadata`.

        Returns once the record is queued (blocking while the buffer is full or the
        topic's metadata is fetched, at most ``max_block_ms``); validation errors raise here.
        The future cannot be cancelled: a queued record is delivered or fails on its own.
        If the calling thread is interrupted (``KeyboardInterrupt``) while this waits, the
        record may or may not have been queued.
        """
        delivery: concurrent.futures.Future[RecordMetadata] = _Delivery(self._escaped)
        delivery.set_running_or_notify_cancel()
        if isinstance(headers, Iterator):  # a generator: consumed here, in the caller's thread
            headers = list(headers)
        send = functools.partial(
            self._producer.send, topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers
        )
        self._call(self._max_block + _GRACE, _enqueue, send, delivery)
        return delivery

    def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None,
        timeout: float | None = None,
    ) -> RecordMetadata:
        """Queue a record and wait for its acknowledgement.

        ``timeout`` bounds the wait for the acknowledgement (default: the record's
        ``delivery_timeout_ms``); when it runs out this raises ``KafkaTimeoutError`` but the
        record stays queued and may still be delivered.
        """
        timeout = check_timeout("send_and_wait", timeout)  # before the record is queued
        future = self.send(topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers)
        limit = self._delivery_timeout + _GRACE if timeout is None else timeout
        return self._waited(future, limit, "the acknowledgement")

    def send_many(
        self,
        topic: str,
        values: Sequence[Any],
        *,
        keys: Sequence[Any] | None = None,
        headers: Sequence[Iterable[tuple[str, bytes | None]] | None] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[list[RecordMetadata]]:
        """Queue many records of one topic; one future of all their metadata, in order.

        The future fails with :class:`~aioprod.errors.SendManyError` (whose ``results``
        hold each record's metadata or exception) when any record fails. Like
        :meth:`Producer.send_many <aioprod.Producer.send_many>`, every record is checked
        before any is queued: one that fails validation raises here, with nothing sent.
        """
        delivery: concurrent.futures.Future[list[RecordMetadata]] = _Delivery(self._escaped)
        delivery.set_running_or_notify_cancel()
        # A generator is consumed here, in the caller's thread (not on the loop's), a record's
        # headers too; anything else goes as it is, for Producer.send_many to take or refuse.
        headers = send_many_values(headers)
        if isinstance(headers, list):
            headers = [list(h) if isinstance(h, Iterator) else h for h in headers]
        send_many = functools.partial(
            self._producer.send_many,
            topic,
            send_many_values(values),
            keys=send_many_values(keys),
            headers=headers,
            partition=partition,
            timestamp_ms=timestamp_ms,
        )
        # Producer.send_many bounds each of its waits (metadata, buffer memory) by max_block_ms,
        # not the whole call: one larger than the buffer takes as long as the broker takes to
        # make room for it. So this wait ends when the loop stops answering, not at a time.
        self._check_thread()
        queuing = self._submit(_enqueue, send_many, delivery)
        try:
            while not _settled(queuing, self._max_block + _GRACE):
                steps = queuing.steps
                try:
                    self._answers()  # the loop answers: the call is still on its way
                except KafkaTimeoutError:
                    # A step of this call under way (its serializer) is waited for, and one run
                    # meanwhile is the loop answering: the call queues records in a step and then
                    # yields, so a cancel after it is accepted with records queued.
                    if queuing.cancel(unless_stepped_since=steps):
                        raise  # a stuck loop: the call takes no further step
                    # (else the loop ran a step of the call meanwhile: it goes on; or it ended: its outcome)
        except BaseException:
            queuing.cancel()  # KeyboardInterrupt: what is queued stays queued
            raise
        self._wait(queuing, 0, "the producer")
        return delivery

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait for the acknowledgements.

        ``timeout`` defaults to ``delivery_timeout_ms``; ``KafkaTimeoutError`` when it runs out.
        """
        self._check_thread()
        self._check_process()
        timeout = check_timeout("flush", timeout)
        limit = self._delivery_timeout if timeout is None else timeout
        closing = self._closing
        if closing is None:
            try:
                self._call(limit + _GRACE, self._producer.flush, limit)
                return
            except ProducerClosedError:
                closing = self._closing
                if closing is None:
                    raise
                # (a close began since the look above: refused, as a record would be, or its loop ended)
        # Another thread's close() is delivering: flushed means that close has settled every
        # record (whether it failed is close()'s to report).
        if not _settled(closing, limit + _GRACE):
            raise KafkaTimeoutError(f"gave up waiting for flush (a close under way) after {limit + _GRACE:.1f}s")

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (fetching metadata, up to ``max_block_ms``)."""
        return self._call(self._max_block + _GRACE, self._producer.partitions_for, topic)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (next offset to be written)."""
        timeout = self._max_block + self.config.request_timeout_ms / 1000 + _GRACE
        return self._call(timeout, self._producer.end_offsets, topic)

    def cluster(self) -> ClusterSnapshot:
        """The current metadata snapshot (see :meth:`Producer.cluster <aioprod.Producer.cluster>`):
        immutable, so read here, in the caller's thread."""
        self._check_process()
        return self._producer.cluster()

    def metrics(self) -> dict[str, float]:
        """The producer's metrics now (see :meth:`Producer.metrics <aioprod.Producer.metrics>`)."""
        self._check_process()  # the loop that takes the snapshot does not exist in a forked child
        return self._producer.metrics()

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Every metric at one moment: producer-wide, per topic and per broker."""
        self._check_process()
        return self._producer.metrics_snapshot()

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``await fn(producer, *args)`` on the producer's event loop.

        For batch work that would cost a thread hop per record otherwise: the coroutine
        gets the underlying :class:`~aioprod.Producer` and may ``await producer.send(...)``
        as often as it likes. Returns at once with a ``concurrent.futures.Future`` of the
        result; the caller decides how long to wait for it. Not from the producer's own thread
        (a delivery callback): a coroutine already on that loop awaits the producer directly.
        """
        self._check_thread()
        return _Guarded.adopt(self._submit(fn, self._producer, *args), self._escaped)

    # -- transactions ----------------------------------------------------------------

    def begin_transaction(self) -> None:
        """Start a transaction (see :meth:`aioprod.Producer.begin_transaction`)."""
        self._call(self._max_block + _GRACE, _begin_transaction, self._producer)

    def commit_transaction(self) -> None:
        """Deliver every record of the transaction and commit it (see
        :meth:`aioprod.Producer.commit_transaction`); bounded by ``max_block_ms``."""
        self._call(self._max_block + _GRACE, self._producer.commit_transaction)

    def abort_transaction(self) -> None:
        """Abort the transaction (see :meth:`aioprod.Producer.abort_transaction`)."""
        self._call(self._max_block + _GRACE, self._producer.abort_transaction)

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group: str | ConsumerGroupMetadata | Any,
    ) -> None:
        """Commit consumer offsets with the transaction (see
        :meth:`aioprod.Producer.send_offsets_to_transaction`)."""
        self._call(self._max_block + _GRACE, self._producer.send_offsets_to_transaction, offsets, group)

    def prepare_transaction(self) -> PreparedTransaction:
        """Deliver the transaction and leave it open for another process to end; returns its
        handle (see :meth:`aioprod.Producer.prepare_transaction`)."""
        return self._call(self._max_block + _GRACE, self._producer.prepare_transaction)

    def commit_prepared_transaction(self, prepared: PreparedTransaction) -> None:
        """Commit a transaction another producer prepared (see
        :meth:`aioprod.Producer.commit_prepared_transaction`)."""
        self._call(self._max_block + _GRACE, self._producer.commit_prepared_transaction, prepared)

    def abort_prepared_transaction(self, prepared: PreparedTransaction) -> None:
        """Abort a transaction another producer prepared (see
        :meth:`aioprod.Producer.abort_prepared_transaction`)."""
        self._call(self._max_block + _GRACE, self._producer.abort_prepared_transaction, prepared)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SyncProducer]:
        """``with producer.transaction():`` begins a transaction, commits it when the block
        ends, and aborts it (re-raising) when the block raises or the commit cannot happen, as
        :meth:`Producer.transaction <aioprod.Producer.transaction>`."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            self._abort_if_open()
            raise
        try:
            self.commit_transaction()
        except TransactionAbortableError:
            self._abort_if_open()
            raise
        except ProducerFatalError as exc:
            try:
                self._abort_if_open()
            except KafkaError as abort_failed:
                exc.add_note(f"its abort failed too: {abort_failed}")
            raise

    def _abort_if_open(self) -> None:
        if self._producer.in_transaction:
            self.abort_transaction()

    # -- closing ---------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued, then stop the producer and its thread.

        ``timeout`` (seconds) bounds the wait for delivery, as in
        :meth:`Producer.close <aioprod.Producer.close>`: records still pending then fail
        with ``ProducerClosedError``. ``None`` waits at most ``delivery_timeout_ms``.
        Safe to call from several threads and more than once; later calls wait for the
        first. If the calling thread is interrupted, the close goes on in the background.
        """
        self._check_thread()
        timeout = check_timeout("close", timeout)
        if os.getpid() != self._pid:
            return  # a forked child: the producer and its thread live in the parent process
        limit = self._delivery_timeout if timeout is None else timeout
        closing = self._begin_close(limit)
        try:
            if not _settled(closing, limit + _GRACE):
                raise KafkaTimeoutError(f"the producer did not close within {limit + _GRACE:.1f}s")
            closing.result(0)
        except concurrent.futures.CancelledError:
            pass  # the loop ended before it ran the close: closed
        finally:
            if closing.done():  # (else interrupted, or the loop stopped answering: it goes on, and exit waits for it)
                self._thread.join(_JOIN_TIMEOUT)
            self._escaped.raise_pending()

    # -- plumbing --------------------------------------------------------------------

    def _begin_close(self, timeout: float) -> concurrent.futures.Future[None]:
        """Start the close, once: a later call gets the first one's future."""
        with self._lock:
            if self._closing is None:
                self._finalizer.detach()
                self._closing = _start_close(self._portal, self._loop, self._gate, self._producer, timeout)
                # Exit waits for it, within its one bound, whoever waits for it now: a close()
                # interrupted (even before its wait began), or one in a daemon thread exit ends.
                _wait_at_exit(self._closing, self._thread, self._pid)
                # Only now: a Ctrl-C landing before this line leaves the producer to exit's close.
                _live.discard(self)
            return self._closing

    def _check_thread(self) -> None:
        # The Thread object, not its id: once the loop thread has ended, its id can be a
        # new thread's.
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a SyncProducer's blocking methods cannot be called from its own thread "
                "(e.g. from a delivery callback): that would wait for itself forever"
            )

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise ProducerClosedError(
                f"this SyncProducer was created in process {self._pid}, and its thread does not exist in this "
                "forked child process: create a new SyncProducer after fork"
            )

    def _submit(self, fn: Callable[..., Awaitable[T]], *args: Any, while_closing: bool = False) -> _Work[T]:
        """``fn(*args)`` on the loop; refused once a close has begun, unless ``while_closing``."""
        self._check_process()
        self._escaped.raise_pending()
        if self._closing is not None and not while_closing:
            raise ProducerClosedError("the producer is closed; no more records are accepted")
        try:
            return _spawn(self._loop, self._gate, fn, *args)
        except _LoopNotRunning:  # the portal stopped (not a RuntimeError of the caller's function)
            raise ProducerClosedError("the producer's event loop is not running") from None

    def _answers(self) -> None:
        """Whether the loop answers within ``_GRACE`` (KafkaTimeoutError if not): not a call of the
        producer, so not refused by a close under way (which settles the call waited for)."""
        self._wait(self._submit(_nothing, while_closing=True), _GRACE, "the producer")

    def _call(self, timeout: float | None, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` on the producer's loop, waiting at most ``timeout`` seconds."""
        self._check_thread()
        return self._waited(self._submit(fn, *args), timeout, "the producer")

    def _waited(self, future: concurrent.futures.Future[T], timeout: float | None, what: str) -> T:
        """:meth:`_wait`; then a callback's ``SystemExit`` raised meanwhile, which wins."""
        try:
            return self._wait(future, timeout, what)
        finally:
            self._escaped.raise_pending()

    @staticmethod
    def _wait(future: concurrent.futures.Future[T], timeout: float | None, what: str) -> T:
        try:
            settled = _settled(future, timeout)
        except BaseException:
            # KeyboardInterrupt or SystemExit in the waiting thread: withdraw the work if it
            # has not started (a record already queued stays queued).
            future.cancel()
            raise
        # A call's cancel refused is work that ended as the wait ran out (a step under way is
        # waited for): the caller gets its outcome, not a timeout for a record that was queued. A
        # delivery is never cancelled (it runs until the broker answers): only its wait ends.
        if not settled and (future.cancel() or not future.done()):
            raise KafkaTimeoutError(f"gave up waiting for {what} after {timeout:.1f}s")
        try:
            return future.result(0)
        except concurrent.futures.CancelledError:  # the portal cancelled it: the producer closed meanwhile
            raise ProducerClosedError("the producer closed before the call completed") from None


async def _begin_transaction(producer: Producer) -> None:
    producer.begin_transaction()  # on the loop's thread, where the producer's state lives


class _Gate:
    """The work handed to one loop and not yet answered. A callback scheduled between the loop's
    last run and its close() is dropped by close(): once the loop thread is over (``ended``),
    every such future is cancelled, so that no caller waits for work that will never run."""

    def __init__(self) -> None:
        self.ended = False
        #: Each future, with the coroutine it will run.
        self.pending: dict[concurrent.futures.Future[Any], Coroutine[Any, Any, Any]] = {}

    def track(
        self, future: concurrent.futures.Future[T], coro: Coroutine[Any, Any, Any]
    ) -> concurrent.futures.Future[T]:
        self.pending[future] = coro
        future.add_done_callback(self._done)
        if self.ended:  # the sweep may have run before the add: it ran after the loop closed
            _drop(future, coro)
        return future

    def _done(self, future: concurrent.futures.Future[Any]) -> None:
        self.pending.pop(future, None)

    def end(self) -> None:
        self.ended = True  # before the sweep: a track() after this point cancels its own future
        for future, coro in list(self.pending.items()):
            _drop(future, coro)


def _drop(future: concurrent.futures.Future[Any], coro: Coroutine[Any, Any, Any]) -> None:
    """Cancel work the closed loop never ran; a coroutine it never started is closed, not left
    to warn that it was never awaited."""
    future.cancel()
    # Only a native coroutine tells its state (submit() takes any collections.abc.Coroutine).
    if inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
        coro.close()


class _ThreadPerCall(concurrent.futures.ThreadPoolExecutor):
    """The producer loop's default executor (asyncio's getaddrinfo, ``asyncio.to_thread``): a
    daemon thread per call. Interpreter exit stops every ThreadPoolExecutor (threading._shutdown,
    before atexit hooks run), which left the exit-time close unable to resolve a broker's name."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to the waiting coroutine
                    future.set_exception(exc)

        try:
            threading.Thread(target=run, name="aioprod-sync-resolver", daemon=True).start()
        except RuntimeError as exc:
            if not _refused_at_exit(exc):
                raise
            run()  # the exit-time close still resolves its brokers' names, on the loop's thread
        return future


def _start_portal(
    use_uvloop: bool | None, name: str
) -> tuple[BlockingPortal, asyncio.AbstractEventLoop, threading.Thread, _Gate]:
    """A thread running an event loop that serves a blocking portal until the portal stops.

    ``use_uvloop``: None for uvloop when it is installed. Once the portal stops, anyio cancels
    what is left on the loop and closes it, and the thread ends.
    """
    if use_uvloop is None:
        use_uvloop = importlib.util.find_spec("uvloop") is not None
    ready: concurrent.futures.Future[tuple[BlockingPortal, asyncio.AbstractEventLoop]] = concurrent.futures.Future()
    gate = _Gate()
    served = threading.Event()

    async def serve() -> None:
        asyncio.get_running_loop().set_default_executor(_ThreadPerCall())
        async with BlockingPortal() as portal:
            ready.set_result((portal, asyncio.get_running_loop()))
            await portal.sleep_until_stopped()
        served.set()

    def run() -> None:
        try:
            # Without uvloop, asyncio's own loop named: the default one is the policy's, which
            # uvloop.install() (or a policy set for the tests) makes uvloop's all the same.
            options: dict[str, Any] = {"use_uvloop": True} if use_uvloop else {"loop_factory": _asyncio_loop}
            anyio.run(serve, backend="asyncio", backend_options=options)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif served.is_set() and _refused_at_exit(exc):
                # The loop's teardown starts a thread to shut its default executor down, which
                # Python 3.12+ refuses at interpreter exit; that executor's threads are daemons,
                # one per call, so nothing was left to shut down.
                pass
            else:  # pragma: no cover - defensive: never let the thread die silently
                log.exception("aioprod SyncProducer event loop failed")
        finally:
            gate.end()  # the loop is closed: what it has not answered, it never will

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    portal, loop = ready.result()
    return portal, loop, thread, gate


def _asyncio_loop() -> asyncio.AbstractEventLoop:
    """The event loop policy's loop, unless it is uvloop's: then asyncio's own. (A policy of the
    program's that is not uvloop's, Windows' selector one say, is kept.)"""
    loop = asyncio.new_event_loop()
    if not type(loop).__module__.startswith("uvloop"):
        return loop
    loop.close()
    if sys.platform == "win32":
        return asyncio.ProactorEventLoop()
    return asyncio.SelectorEventLoop()


def _refused_at_exit(exc: BaseException) -> bool:
    """Python 3.12+'s refusal to start a thread while the interpreter exits."""
    return isinstance(exc, RuntimeError) and "interpreter shutdown" in str(exc)


def _settled(future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (None: no limit) for ``future``; whether it is done.

    On the main thread the wait is cut into slices of ``_SLICE``: the kernel may hand a Ctrl-C to
    another thread (the producer's loop thread), which wakes no wait, and its KeyboardInterrupt
    was raised only once the whole wait ended (``delivery_timeout_ms`` for a close)."""
    if future.done():
        return True
    main = threading.current_thread() is threading.main_thread()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return future.done()
        step = left if not main else _SLICE if left is None else min(_SLICE, left)
        try:
            future.exception(_thread_timeout(step))
        except concurrent.futures.CancelledError:
            pass
        except TimeoutError:
            continue
        return True


def _thread_timeout(seconds: float | None) -> float | None:
    """``seconds`` as a thread's wait takes it: beyond ``threading.TIMEOUT_MAX`` (a
    ``max_block_ms`` of Java's Long.MAX_VALUE, an infinite timeout) it raised OverflowError."""
    return None if seconds is None or seconds >= threading.TIMEOUT_MAX else seconds


class _LoopNotRunning(RuntimeError):
    """The portal's loop stopped or closed: nothing can be run on it."""


def _spawn(loop: asyncio.AbstractEventLoop, gate: _Gate, fn: Callable[..., Awaitable[T]], *args: Any) -> _Work[T]:
    """``fn(*args)`` as a task on the portal's loop, without waiting for the loop to answer.

    ``BlockingPortal.start_task_soon`` waits, with no timeout, for the loop to spawn the
    task: a loop that does not answer (blocked by a callback, or absent in a forked child)
    hung the caller before any bounded wait began. A task left when the portal stops is
    cancelled as the loop shuts down (its future then says cancelled).
    """
    if loop.is_closed() or not loop.is_running():
        raise _LoopNotRunning("the producer's event loop is not running")
    coro = fn(*args)  # what the caller's function raises (a RuntimeError too) is theirs, as it is
    try:
        work: _Work[T] = _run_soon(coro, loop)  # type: ignore[arg-type]
    except RuntimeError as exc:
        coro.close()  # type: ignore[attr-defined]
        raise _LoopNotRunning(str(exc)) from exc
    gate.track(work, coro)  # type: ignore[arg-type]
    return work


class _Work(concurrent.futures.Future[T]):
    """A call's future on the loop (see :func:`_run_soon`), whose ``cancel()`` waits for a step of
    the call under way on the loop. A caller's wait can run out during a step (a send's serializer
    or partitioner runs in one): cancelled then, the step still queued the record, and the caller
    told "gave up waiting" wrote it twice with a retry. Now the cancel is refused if the step ended
    the call, as when the caller's own thread ran that step (the Java client's send)."""

    def __init__(self) -> None:
        super().__init__()
        #: Held by the loop's thread through each step of the call, and while it settles this future.
        self.stepping = threading.RLock()
        #: Set between the steps of the call (cleared by the loop's thread for each step).
        self.between_steps = threading.Event()
        self.between_steps.set()
        #: How many steps of the call the loop has run (counted under ``stepping``).
        self.steps = 0

    def cancel(self, unless_stepped_since: int | None = None) -> bool:
        """``Future.cancel()`` once a step under way has ended; refused also when the loop ran a
        step of the call since it had run ``unless_stepped_since`` (it answers: the call goes on)."""
        if threading.current_thread() is threading.main_thread():
            # In slices, as in ``_settled``: a Ctrl-C the kernel handed to another thread runs its
            # handler only once the main thread runs again (after a stuck step: never). Not on the
            # lock itself: an interrupt right after a timed acquire() took it would keep it.
            while not self.between_steps.wait(_SLICE):
                pass
        with self.stepping:  # (a step begun since is waited out)
            if unless_stepped_since is not None and self.steps != unless_stepped_since:
                return False
            return super().cancel()


def _run_soon(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> _Work[T]:
    """``asyncio.run_coroutine_threadsafe``, except that work given up (its future cancelled: the
    caller timed out or was interrupted) takes no further step, and work that ends settles its
    future in its last step.

    asyncio's cancels the task from the loop's queue, behind whatever step of it is queued (its
    first, or its wake-up once what it waited for came), and sets the future in a callback after
    the last: a ``send()`` whose caller was told "gave up waiting" (the loop was busy for longer)
    still queued its record, and the caller's retry wrote it twice.
    """
    if not asyncio.iscoroutine(coro):
        raise TypeError("A coroutine object is required")  # as asyncio's, in the caller's thread
    future: _Work[T] = _Work()
    withdrawn = False  # the caller's give-up was thrown into the work (so not cancelled again)

    @types.coroutine
    def stepped() -> Generator[Any, Any, T]:
        # ``await coro``, one step at a time, each checked first: the loop may have been held up
        # between the give-up and this step (a send queues its record in its first step, or in the
        # one its wake-up runs), and the cancel from the caller's thread comes behind it. A give-up
        # while a step runs waits for it (``_Work.cancel``), and is refused if the step ended it.
        nonlocal withdrawn
        value: Any = None
        error: BaseException | None = None
        while True:
            with future.stepping:
                if not withdrawn and future.cancelled():
                    withdrawn = True
                    error = error or asyncio.CancelledError()
                future.between_steps.clear()
                try:
                    step = coro.send(value) if error is None else coro.throw(error)
                    future.steps += 1
                except StopIteration as stop:
                    # Settled in this step, before any other callback runs: the caller's wait can
                    # no longer run out on work that is done.
                    if future.set_running_or_notify_cancel():
                        future.set_result(stop.value)
                    return stop.value  # type: ignore[no-any-return]
                except asyncio.CancelledError:
                    raise  # the task is cancelled: settle() cancels the future
                except (SystemExit, KeyboardInterrupt) as exc:
                    # The call's own (a serializer's or partitioner's sys.exit(), a submit()
                    # coroutine's): raised in the caller's thread, as if the step ran there. Out of
                    # the task it stopped the producer's loop: every other record failed, the
                    # producer with them ("use SyncProducer"), and the exit was only logged.
                    if future.set_running_or_notify_cancel():
                        future.set_exception(exc)
                    else:  # the caller gave up meanwhile: nobody to raise it in
                        log.warning("%r raised on the SyncProducer's thread by a call given up", exc)
                    return None  # type: ignore[return-value]
                except BaseException as exc:
                    if future.set_running_or_notify_cancel():
                        future.set_exception(exc)
                    raise
                finally:
                    future.between_steps.set()
            try:
                value, error = (yield step), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown into the task (its cancel): on into the work
                value, error = None, exc

    async def unless_given_up() -> T:
        return await stepped()

    def start() -> None:
        if future.cancelled():
            coro.close()  # withdrawn before it began
            return
        wrapper = unless_given_up()
        try:
            task = asyncio.ensure_future(wrapper)
        except BaseException as exc:
            wrapper.close()
            with future.stepping:
                if future.set_running_or_notify_cancel():
                    future.set_exception(exc)
            raise

        def settle(_: asyncio.Future[T]) -> None:
            if task.cancelled():
                coro.close()  # (never begun: no "never awaited" warning)
                future.cancel()
                return
            error = task.exception()  # retrieved even if unused: no "Task exception was never retrieved"
            with future.stepping:  # (a cancel refused finds the future done, not running)
                if not future.done() and future.set_running_or_notify_cancel():  # (else settled in its step)
                    if error is None:
                        future.set_result(task.result())
                    else:
                        future.set_exception(error)

        def cancel() -> None:
            if not withdrawn:
                task.cancel()

        def withdraw(_: concurrent.futures.Future[T]) -> None:
            if not future.cancelled() or task.done():
                return
            if asyncio._get_running_loop() is loop:
                cancel()  # cancelled as this begins: before the task's next step
            else:
                try:
                    loop.call_soon_threadsafe(cancel)
                except RuntimeError:  # the loop closed: its tasks went with it
                    if inspect.getcoroutinestate(wrapper) == inspect.CORO_CREATED:
                        wrapper.close()  # (never begun: no "never awaited" warning)

        task.add_done_callback(settle)
        future.add_done_callback(withdraw)

    loop.call_soon_threadsafe(start)
    return future


def _start_close(
    portal: BlockingPortal, loop: asyncio.AbstractEventLoop, gate: _Gate, producer: Producer, timeout: float
) -> concurrent.futures.Future[None]:
    """Close the producer on its loop, then stop the portal (and so the thread); the close's future."""
    try:
        return _spawn(loop, gate, _close_and_stop, producer, portal, timeout)
    except RuntimeError:  # the portal stopped already
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        return done


async def _close_and_stop(producer: Producer, portal: BlockingPortal, timeout: float) -> None:
    try:
        await producer.close(timeout)
    finally:
        await portal.stop(cancel_remaining=True)


async def _nothing() -> None:
    """A call that only shows the loop answers."""


async def _enqueue(send: Callable[[], Awaitable[_Settling[T]]], delivery: concurrent.futures.Future[T]) -> None:
    """Queue records on the loop and tie their outcome to ``delivery`` (not holding the SyncProducer)."""
    _chain(await send(), delivery)


class _Escaped:
    """A ``SystemExit`` or ``KeyboardInterrupt`` a callback raised on the producer's thread (any
    other exception is logged, as concurrent.futures logs an ``Exception``). concurrent.futures
    lets it out of the future's ``set_result``, where it stopped the producer's event loop: the
    records after it failed, and the program went on with the exit code it asked for lost. Kept
    instead, and raised in the thread that next calls the SyncProducer, or waits in a call (as
    confluent-kafka raises a callback's exception from ``poll()`` and ``flush()``)."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def guard(self, fn: Callable[[Any], object]) -> Callable[[Any], object]:
        def guarded(future: Any) -> object:
            if threading.current_thread() is not self.thread:
                return fn(future)  # added to a done future: it runs in the caller's own thread
            try:
                return fn(future)
            except Exception:
                raise  # concurrent.futures logs it
            except (SystemExit, KeyboardInterrupt) as exc:
                self.keep(exc)
            except BaseException:
                # Another BaseException (asyncio.CancelledError, of a cancelled future's result()): no
                # exit asked for, and not one for a plain thread's next call; logged, as an Exception.
                log.exception("exception calling callback for %r", future)
            return None

        return guarded

    def keep(self, exc: BaseException) -> None:
        """Keep ``exc`` (raised by user code on the producer's thread) for the next caller."""
        log.warning(
            "a callback raised %r on the SyncProducer's thread: the producer goes on, and it is raised in "
            "the thread that next calls the producer",
            exc,
        )
        with self._lock:
            if self._error is None:
                self._error = exc

    def statistics(self, callback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``statistics_callback`` (sync or async) whose ``SystemExit`` is kept: out of its task it
        stopped the producer's loop, failing every record queued ("use SyncProducer")."""

        async def awaited(result: Awaitable[Any]) -> Any:
            try:
                return await result
            except (SystemExit, KeyboardInterrupt) as exc:
                self.keep(exc)
                return None

        def call(snapshot: Any) -> Any:
            try:
                result = callback(snapshot)
            except (SystemExit, KeyboardInterrupt) as exc:
                self.keep(exc)
                return None
            return awaited(result) if inspect.isawaitable(result) else result

        return call

    def raise_pending(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error


class _Guarded(concurrent.futures.Future[T]):
    """A future the SyncProducer hands out: a callback's ``SystemExit`` reaches the caller's
    thread (see :class:`_Escaped`)."""

    _escaped: _Escaped

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        super().add_done_callback(self._escaped.guard(fn))

    def result(self, timeout: float | None = None) -> T:
        self._refuse_waiting_for_itself(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._refuse_waiting_for_itself(timeout)
        return super().exception(timeout)

    def _refuse_waiting_for_itself(self, timeout: float | None) -> None:
        # Only the producer's thread settles this future: waited for there (a delivery callback
        # waiting for a later record), or in a forked child (where that thread does not exist), it
        # waited until the wait ran out, or forever (the loop blocked meanwhile, in the first case).
        # A poll there (timeout 0: no wait) gets its TimeoutError: a later callback may find it done.
        if self.done():
            return
        if threading.current_thread() is self._escaped.thread and (timeout is None or timeout > 0):
            raise RuntimeError(
                "a SyncProducer's future cannot be waited for on the producer's own thread (e.g. in a "
                "delivery callback) before it is done: that would wait for itself forever"
            )
        if os.getpid() != self._escaped.pid:
            raise ProducerClosedError(
                f"this future's SyncProducer was created in process {self._escaped.pid}, and its thread does "
                "not exist in this forked child process: nothing here will settle it"
            )

    @classmethod
    def adopt(cls, future: concurrent.futures.Future[T], escaped: _Escaped) -> concurrent.futures.Future[T]:
        """``future`` (``submit``'s, made by asyncio.run_coroutine_threadsafe, whose ``cancel()``
        cancels the coroutine) as one of these, before anyone else adds a callback to it."""
        future._escaped = escaped  # type: ignore[attr-defined]
        future.__class__ = cls
        return future


class _Delivery(_Guarded[T]):
    """The future of one ``send``/``send_many``.

    The records of a failed batch share one exception object: ``result()`` re-raises it
    from the traceback it had when it was set, instead of adding frames to the shared one
    on every call (as concurrent.futures.Future does). A callback's ``SystemExit`` reaches the
    caller's thread (see :class:`_Escaped`).
    """

    _traceback: TracebackType | None = None

    def __init__(self, escaped: _Escaped) -> None:
        super().__init__()
        self._escaped = escaped

    def set_exception(self, exception: BaseException | None) -> None:
        self._traceback = None if exception is None else exception.__traceback__
        super().set_exception(exception)

    def result(self, timeout: float | None = None) -> T:
        try:
            return super().result(timeout)
        except BaseException as exc:
            if self.done() and not self.cancelled() and exc is self.exception(0):
                raise exc.with_traceback(self._traceback)  # noqa: B904 - the same exception, re-raised
            raise


def _chain(source: _Settling[T], target: concurrent.futures.Future[T]) -> None:
    """Copy an asyncio future's outcome into a concurrent one (callbacks on the loop thread)."""

    def copy(done: _Settling[T]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.set_exception(ProducerClosedError("the record was cancelled before it was acknowledged"))
        elif (error := done.exception()) is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)


def _abandoned(
    portal: BlockingPortal,
    loop: asyncio.AbstractEventLoop,
    gate: _Gate,
    producer: Producer,
    thread: threading.Thread,
    pid: int,
) -> None:
    """A SyncProducer was garbage-collected while open: close it without blocking (from any
    thread, its own loop's included: _spawn never waits for the loop)."""
    if os.getpid() != pid:
        return  # a forked child's copy: the producer and its thread live in the parent
    warnings.warn(f"SyncProducer ({thread.name}) was never closed; closing it now", ResourceWarning, stacklevel=2)
    _wait_at_exit(_start_close(portal, loop, gate, producer, _ATEXIT_CLOSE_TIMEOUT), thread, pid)


def _wait_at_exit(closing: concurrent.futures.Future[None], thread: threading.Thread, pid: int) -> None:
    """A close nobody waits for (a dropped producer's, an interrupted close()'s): interpreter exit
    waits for it, within its one bound, instead of killing the daemon loop thread mid-delivery."""
    entry = (closing, thread, pid)
    _abandoned_closes.add(entry)
    closing.add_done_callback(lambda _: _abandoned_closes.discard(entry))


@atexit.register
def _close_at_exit() -> None:
    """Give records of producers the program never closed a short, bounded chance: one bound
    for all of them (each closes on its own loop, in parallel; a loop that does not answer
    added its own wait to the next one's)."""
    deadline = time.monotonic() + _ATEXIT_CLOSE_TIMEOUT + _GRACE
    for producer in list(_live):
        if producer._pid == os.getpid():  # (one inherited by a forked child: the parent closes it)
            with contextlib.suppress(Exception):
                _abandoned_closes.add((producer._begin_close(_ATEXIT_CLOSE_TIMEOUT), producer._thread, producer._pid))
    for closing, thread, pid in list(_abandoned_closes):  # closing in the background
        if pid != os.getpid():
            continue  # a forked child's copy of the parent's close
        with contextlib.suppress(Exception):
            closing.exception(max(0.0, deadline - time.monotonic()))
            thread.join(max(0.0, deadline - time.monotonic()))

"""The future ``Producer.send`` returns: one record's delivery, settled with its batch."""

from __future__ import annotations

import asyncio
import contextvars
import operator
from bisect import bisect_right
from collections.abc import Callable, Generator, Mapping
from functools import partial
from types import TracebackType
from typing import Any, NamedTuple, TypeAlias

from aioprod._compiled import speedups
from aioprod.errors import KafkaError, copy_error


class RecordMetadata(NamedTuple):
    """Where the broker put a record. ``offset`` is -1 when acks=0 (nothing comes back)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class BatchFailure(NamedTuple):
    """A failed batch's error, with its traceback as it was when the batch failed.

    Callers never get this error object itself, but a copy each (:meth:`copy_error`): raising
    the shared one would attach the raiser's frame to it, and so to the batch every record
    future refers to — a cycle through objects the garbage collector may not track (the
    compiled RecordFuture is tracked only once it has callbacks), and one record's handling
    showing up in another's traceback.
    """

    error: KafkaError
    traceback: TracebackType | None
    #: Each record's own error, by offset delta, when the broker named the invalid ones.
    per_record: Mapping[int, KafkaError] | None = None

    def copy_error(self, index: int) -> KafkaError:
        """The error of the record at offset delta ``index``, as a new object: same class,
        arguments, attributes, cause and context, and the batch's traceback."""
        error = self.error if self.per_record is None else self.per_record.get(index, self.error)
        return copy_error(error, self.traceback)


class SplitOutcome:
    """A batch the broker found too large was split: each record's outcome is that of the
    smaller batch it went to (``parts``: (first offset delta, that batch's settlement))."""

    __slots__ = ("parts", "starts")

    def __init__(self, parts: list[tuple[int, BatchSettlement]]) -> None:
        self.parts = parts
        self.starts = [start for start, _ in parts]

    def locate(self, index: int) -> tuple[AckedOrFailed, int]:
        """The outcome of the record at offset delta ``index``, and its delta in that batch."""
        start, part = self.parts[bisect_right(self.starts, index) - 1]
        outcome, index = part.outcome, index - start
        assert outcome is not None, "a split batch settles after all its parts"
        if type(outcome) is SplitOutcome:
            return outcome.locate(index)
        return outcome, index  # type: ignore[return-value]


#: A batch's outcome: (topic, partition, base offset, log-append time or -1), or its failure.
AckedOrFailed: TypeAlias = "tuple[str, int, int, int] | BatchFailure"
#: ... or, for a batch that was split, where each record's outcome is.
BatchOutcome: TypeAlias = "AckedOrFailed | SplitOutcome"

_Callback: TypeAlias = "Callable[[RecordFuture], object]"
_record_index = operator.attrgetter("_index")
_NOT_CANCELLED: Any = object()
#: Builds a RecordMetadata without the namedtuple's argument handling.
_metadata = tuple.__new__


def _py_record_metadata(topic: str, partition: int, offset: int, timestamp: int) -> RecordMetadata:
    return _metadata(RecordMetadata, (topic, partition, offset, timestamp))


#: One record's RecordMetadata; the compiled one is untracked by the garbage collector (see
#: ``new_metadata`` in aioprod/_speedups.c), which then need not walk those an application keeps.
_record_metadata: Callable[[str, int, int, int], RecordMetadata] = (
    _py_record_metadata if speedups is None else partial(speedups.metadata, RecordMetadata)
)


class BatchSettlement:
    """A batch's outcome as its records see it.

    ``outcome`` is None until the batch has its :data:`BatchOutcome`. An asyncio future of it
    (``future``) is made only for whoever waits: flush(), and records with callbacks. Most
    batches never need one, and the records an application keeps keep their batch's
    settlement alive: a future each was one more object per batch for the garbage collector
    to carry in its oldest generation. The record futures that have callbacks are kept here
    (a dict: O(1) to add and to drop), so settling a batch touches only them, and dropping one
    is cheap however big the batch.
    """

    __slots__ = ("_future", "_split_from", "_waiting", "loop", "outcome", "partition")

    def __init__(self, loop: asyncio.AbstractEventLoop, partition: int = -1) -> None:
        self.loop = loop
        #: The batch's partition: what a failed record's telemetry names (no RecordMetadata says it).
        self.partition = partition
        self.outcome: BatchOutcome | None = None
        self._future: asyncio.Future[BatchOutcome] | None = None
        self._waiting: dict[RecordFuture, None] | None = None
        #: Called as this settles: the batch it is a part of (see split_into).
        self._split_from: Callable[[], None] | None = None

    @property
    def future(self) -> asyncio.Future[BatchOutcome]:
        """A future of the outcome (resolved at once if the batch has it)."""
        future = self._future
        if future is None:
            future = self.loop.create_future()
            if self.outcome is None:
                self._future = future
            else:
                future.set_result(self.outcome)
        return future

    def settle(self, outcome: BatchOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            future, self._future = self._future, None  # its waiters hold it
            if future is not None:
                future.set_result(outcome)
            if self._split_from is not None:
                self._split_from()

    def split_into(self, parts: list[tuple[int, BatchSettlement]]) -> None:
        """Settle once every part has: each record then reads its own part's outcome.

        In the same step as the last part, not a loop iteration later per level of splitting:
        flush() waits on the batches it finds unsettled, which after a split are the parts, and
        a record of a batch split twice or more still read as pending when flush() returned.
        """
        outcome = SplitOutcome(parts)
        pending = len(parts)

        def part_done() -> None:
            nonlocal pending
            pending -= 1
            if not pending:
                self.settle(outcome)

        for _, part in parts:
            assert part.outcome is None and part._split_from is None, "parts are new batches"
            part._split_from = part_done

    def _watch(self, future: RecordFuture) -> None:
        if self._waiting is None:
            self._waiting = {}
            self.future.add_done_callback(self._settled)
        self._waiting[future] = None

    def _unwatch(self, future: RecordFuture) -> None:
        if self._waiting is not None:
            self._waiting.pop(future, None)

    def _settled(self, _done: asyncio.Future[BatchOutcome]) -> None:
        # One callback on the batch future for all its watched records: each record's
        # callbacks run here, as they would have from a callback of their own.
        waiting, self._waiting = self._waiting, None
        if not waiting:
            return
        # In the order of the records in the batch (as Java runs a partition's callbacks, and as
        # futures resolved record by record would), not the order the callbacks were added in.
        futures = sorted(waiting, key=_record_index)
        for position, future in enumerate(futures):
            try:
                future._run_callbacks()
            except BaseException:  # SystemExit or KeyboardInterrupt: the rest still get theirs
                loop = self.loop
                for later in futures[position + 1 :]:
                    loop.call_soon(later._run_callbacks)
                raise


class RecordFuture:
    """One record's delivery: an asyncio-compatible future.

    Await it, pass it to ``asyncio.gather``/``wait``/``wait_for``/``shield``, or give it
    done-callbacks, as with an :class:`asyncio.Future` (it is not a subclass). Every record
    of a batch shares the batch's outcome, so nothing is done per record when the batch
    completes unless someone is waiting on that record, and the :class:`RecordMetadata` is
    made when asked for: the per-record cost of a real Future (created, then resolved) was
    the largest item of ``send`` after encoding.

    Cancelling it stops nobody's record: the record is still delivered (or not) with its
    batch, and the future reports :class:`asyncio.CancelledError`.

    A failed record raises (and ``exception()`` returns) its own copy of the batch's error:
    same class, message and attributes, a new object each time, so what one caller does with
    it (its traceback, notes) never reaches the batch's other records. (A batch the broker
    refused naming its invalid records, KIP-467, gives those the broker's error and the others
    :class:`~aioprod.errors.InvalidBatchError`.) The done-callbacks of a batch's records run
    in the records' order.
    """

    __slots__ = (
        "__weakref__",
        "_asyncio_future_blocking",
        "_callbacks",
        "_cancel_message",
        "_index",
        "_settlement",
        "_timestamp",
    )

    def __init__(self, settlement: BatchSettlement, index: int, timestamp: int) -> None:
        #: asyncio's duck-typing marker (see asyncio.isfuture); set while a task awaits this.
        self._asyncio_future_blocking = False
        self._settlement = settlement
        self._index = index  # the record's offset delta in its batch
        self._timestamp = timestamp
        self._callbacks: list[tuple[_Callback, contextvars.Context]] | None = None
        self._cancel_message: str | None = _NOT_CANCELLED

    def __repr__(self) -> str:
        return _describe(self)

    def done(self) -> bool:
        return self._cancel_message is not _NOT_CANCELLED or self._settlement.outcome is not None

    def cancelled(self) -> bool:
        return self._cancel_message is not _NOT_CANCELLED

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._settlement.loop

    def _make_cancelled_error(self) -> asyncio.CancelledError:
        """What asyncio (gather, for one) raises for a cancelled child; as asyncio.Future."""
        message = self._cancel_message
        return asyncio.CancelledError() if message is None else asyncio.CancelledError(message)

    def _outcome(self) -> BatchOutcome:
        if self._cancel_message is not _NOT_CANCELLED:
            raise self._make_cancelled_error()
        outcome = self._settlement.outcome
        if outcome is None:
            raise asyncio.InvalidStateError("the record is not acknowledged or failed yet")
        return outcome

    def result(self) -> RecordMetadata:
        return _metadata_of(self._outcome(), self._index, self._timestamp)

    def exception(self) -> BaseException | None:
        return _error_of(self._outcome(), self._index)

    def add_done_callback(self, fn: _Callback, /, *, context: contextvars.Context | None = None) -> None:
        if context is None:
            context = contextvars.copy_context()
        if self.done():
            self.get_loop().call_soon(fn, self, context=context)
        elif self._callbacks is None:
            self._callbacks = [(fn, context)]
            self._settlement._watch(self)
        else:
            self._callbacks.append((fn, context))

    def remove_done_callback(self, fn: _Callback, /) -> int:
        while True:
            callbacks = self._callbacks
            if not callbacks or self.done():  # once done, its callbacks are as good as scheduled
                return 0
            # Identity first (as the compiled twin and asyncio's C Future); a comparison runs
            # Python code, which may cancel the future or replace the list: then look again.
            kept = [entry for entry in callbacks if entry[0] is not fn and entry[0] != fn]
            if self._callbacks is callbacks:
                break
        removed = len(callbacks) - len(kept)
        if not kept:
            self._callbacks = None
            self._settlement._unwatch(self)
        elif removed:
            self._callbacks = kept
        return removed

    def twin(self) -> RecordFuture:
        """Another future of the same record, with callbacks and cancellation of its own:
        for an observer that must see the outcome whatever is done with this one."""
        return RecordFuture(self._settlement, self._index, self._timestamp)

    def cancel(self, msg: str | None = None) -> bool:
        if self.done():
            return False
        self._cancel_message = msg
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            self._settlement._unwatch(self)
            loop = self.get_loop()
            for fn, context in callbacks:
                loop.call_soon(fn, self, context=context)
        return True

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            _call_back(self, callbacks)

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if not self.done():
            self._asyncio_future_blocking = True
            yield self
            if not self.done():
                raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__


# -- shared by both RecordFuture implementations (the compiled one calls these too) -----------


def _metadata_of(outcome: BatchOutcome, index: int, timestamp: int) -> RecordMetadata:
    """The record's metadata from its batch's outcome, or the batch's error raised."""
    if type(outcome) is SplitOutcome:
        outcome, index = outcome.locate(index)
    if isinstance(outcome, BatchFailure):
        raise outcome.copy_error(index)
    topic, partition, base_offset, log_append_time = outcome  # type: ignore[misc]
    return _record_metadata(
        topic,
        partition,
        base_offset + index if base_offset >= 0 else -1,
        log_append_time if log_append_time >= 0 else timestamp,
    )


def _error_of(outcome: BatchOutcome, index: int) -> BaseException | None:
    if type(outcome) is SplitOutcome:
        outcome, index = outcome.locate(index)
    return outcome.copy_error(index) if isinstance(outcome, BatchFailure) else None


def _call_back(future: Any, callbacks: list[tuple[_Callback, contextvars.Context]]) -> None:
    """Run a settled future's callbacks, each in its context, as asyncio.Future would."""
    loop = future.get_loop()
    for position, (fn, context) in enumerate(callbacks):
        try:
            try:
                context.run(fn, future)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                loop.call_exception_handler(
                    {"message": f"Exception in callback {fn!r}", "exception": exc, "future": future}
                )
        except BaseException:  # SystemExit/KeyboardInterrupt, from fn or the exception handler
            for later, later_context in callbacks[position + 1 :]:
                loop.call_soon(later, future, context=later_context)
            raise


def _describe(future: Any) -> str:
    if future.cancelled():
        state = "cancelled"
    elif not future.done():
        state = "pending"
    else:
        outcome = future.exception()
        state = f"finished {outcome!r}" if outcome is not None else f"finished {future.result()!r}"
    return f"<RecordFuture {state}>"


_PyRecordFuture = RecordFuture
if speedups is not None:
    speedups.setup_record_future(
        _metadata_of,
        _error_of,
        _call_back,
        _describe,
        asyncio.CancelledError,
        asyncio.InvalidStateError,
        RecordMetadata,
    )
    RecordFuture = speedups.RecordFuture  # type: ignore[misc]

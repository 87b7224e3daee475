"""The future ``Producer.send`` returns: one record's delivery, settled with its batch."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, TypeAlias

from aioprod.errors import KafkaError


class RecordMetadata(NamedTuple):
    """Where the broker put a record. ``offset`` is -1 when acks=0 (nothing comes back)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


#: A batch's outcome: (topic, partition, base offset, log-append time or -1), or its error.
BatchOutcome: TypeAlias = "tuple[str, int, int, int] | KafkaError"

_Callback: TypeAlias = "Callable[[RecordFuture], object]"
_NOT_CANCELLED: Any = object()
#: Builds a RecordMetadata without the namedtuple's argument handling.
_metadata = tuple.__new__


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
    """

    __slots__ = ("_asyncio_future_blocking", "_batch_done", "_callbacks", "_cancel_message", "_index", "_timestamp")

    def __init__(self, batch_done: asyncio.Future[BatchOutcome], index: int, timestamp: int) -> None:
        #: asyncio's duck-typing marker (see asyncio.isfuture); set while a task awaits this.
        self._asyncio_future_blocking = False
        self._batch_done = batch_done
        self._index = index  # the record's offset delta in its batch
        self._timestamp = timestamp
        self._callbacks: list[tuple[_Callback, contextvars.Context]] | None = None
        self._cancel_message: str | None = _NOT_CANCELLED

    def __repr__(self) -> str:
        if self._cancel_message is not _NOT_CANCELLED:
            state = "cancelled"
        elif not self._batch_done.done():
            state = "pending"
        else:
            outcome = self.exception()
            state = f"finished {outcome!r}" if outcome is not None else f"finished {self.result()!r}"
        return f"<RecordFuture {state}>"

    def done(self) -> bool:
        return self._cancel_message is not _NOT_CANCELLED or self._batch_done.done()

    def cancelled(self) -> bool:
        return self._cancel_message is not _NOT_CANCELLED

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._batch_done.get_loop()

    def _outcome(self) -> BatchOutcome:
        if self._cancel_message is not _NOT_CANCELLED:
            raise asyncio.CancelledError(*(() if self._cancel_message is None else (self._cancel_message,)))
        if not self._batch_done.done():
            raise asyncio.InvalidStateError("the record is not acknowledged or failed yet")
        return self._batch_done.result()

    def result(self) -> RecordMetadata:
        outcome = self._outcome()
        if not isinstance(outcome, tuple):
            raise outcome
        topic, partition, base_offset, log_append_time = outcome
        return _metadata(
            RecordMetadata,
            (
                topic,
                partition,
                base_offset + self._index if base_offset >= 0 else -1,
                log_append_time if log_append_time >= 0 else self._timestamp,
            ),
        )

    def exception(self) -> BaseException | None:
        outcome = self._outcome()
        return None if isinstance(outcome, tuple) else outcome

    def add_done_callback(self, fn: _Callback, /, *, context: contextvars.Context | None = None) -> None:
        if context is None:
            context = contextvars.copy_context()
        if self.done():
            self.get_loop().call_soon(fn, self, context=context)
        elif self._callbacks is None:
            self._callbacks = [(fn, context)]
            self._batch_done.add_done_callback(self._settled)
        else:
            self._callbacks.append((fn, context))

    def remove_done_callback(self, fn: _Callback, /) -> int:
        callbacks = self._callbacks
        if not callbacks:
            return 0
        kept = [entry for entry in callbacks if entry[0] != fn]
        removed = len(callbacks) - len(kept)
        if not kept:
            self._callbacks = None
            self._batch_done.remove_done_callback(self._settled)
        elif removed:
            self._callbacks = kept
        return removed

    def cancel(self, msg: str | None = None) -> bool:
        if self.done():
            return False
        self._cancel_message = msg
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            self._batch_done.remove_done_callback(self._settled)
            loop = self.get_loop()
            for fn, context in callbacks:
                loop.call_soon(fn, self, context=context)
        return True

    def _settled(self, _batch_done: asyncio.Future[BatchOutcome]) -> None:
        # Runs from the batch future's own callback: run ours now, each in its context, as
        # that callback would have if they had been registered on the batch future directly.
        callbacks, self._callbacks = self._callbacks, None
        if not callbacks:
            return
        for fn, context in callbacks:
            try:
                context.run(fn, self)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self.get_loop().call_exception_handler(
                    {"message": f"Exception in callback {fn!r}", "exception": exc, "future": self}
                )

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if not self.done():
            self._asyncio_future_blocking = True
            yield self
            if not self.done():
                raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__

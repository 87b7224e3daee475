"""RecordFuture behaves like an asyncio.Future wherever asyncio (or a user) takes one.

Driven with a bare BatchSettlement standing in for a batch, so each test decides when and
how the batch settles.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from aioprod import RecordFuture, RecordMetadata
from aioprod import errors as aioprod_errors
from aioprod.errors import BrokerResponseError, DeliveryTimeoutError, KafkaError, NotLeaderOrFollowerError
from aioprod.producer.record_future import BatchFailure, BatchSettlement

TS = 1_700_000_000_000


def batch() -> BatchSettlement:
    return BatchSettlement(asyncio.get_running_loop())


def acked(done: BatchSettlement, base_offset: int = 100, log_append_time: int = -1) -> None:
    done.settle(("t", 2, base_offset, log_append_time))


def failed(done: BatchSettlement, error: BaseException) -> None:
    done.settle(BatchFailure(error, error.__traceback__))  # type: ignore[arg-type]


async def test_await_gives_the_record_metadata_from_the_batch_outcome() -> None:
    done = batch()
    first, third = RecordFuture(done, 0, TS), RecordFuture(done, 2, TS + 5)
    assert asyncio.isfuture(first) and not first.done()
    with pytest.raises(asyncio.InvalidStateError):
        first.result()
    asyncio.get_running_loop().call_soon(acked, done)
    assert await first == RecordMetadata("t", 2, 100, TS)
    assert third.done() and third.result() == RecordMetadata("t", 2, 102, TS + 5)
    assert third.exception() is None
    assert await third == third.result()  # awaiting a settled future returns at once


async def test_log_append_time_and_acks_0_offsets() -> None:
    done = batch()
    acked(done, base_offset=-1, log_append_time=TS + 99)
    assert RecordFuture(done, 3, TS).result() == RecordMetadata("t", 2, -1, TS + 99)


async def test_a_failed_batch_raises_its_error_from_every_record() -> None:
    done = batch()
    futures = [RecordFuture(done, i, TS) for i in range(3)]
    error = DeliveryTimeoutError("expired", possibly_persisted=True)
    error.add_note("a note")
    failed(done, error)
    seen: list[BaseException] = []
    for future in futures:
        given = future.exception()
        assert type(given) is DeliveryTimeoutError and given.args == ("expired",)
        assert given.possibly_persisted and given.__notes__ == ["a note"]
        with pytest.raises(DeliveryTimeoutError, match="expired") as info:
            await future
        assert info.value.possibly_persisted
        seen += [given, info.value]
    # Each is a copy of its own: what one caller does with it never reaches another.
    assert len({id(e) for e in seen}) == len(seen) and error not in seen


async def test_asyncio_combinators_accept_it() -> None:
    done = batch()
    futures = [RecordFuture(done, i, TS) for i in range(3)]
    loop = asyncio.get_running_loop()
    loop.call_soon(acked, done)
    assert [m.offset for m in await asyncio.gather(*futures)] == [100, 101, 102]
    finished, pending = await asyncio.wait(futures)
    assert finished == set(futures) and not pending
    assert (await asyncio.wait_for(futures[0], 5)).offset == 100
    assert (await asyncio.shield(futures[1])).offset == 101
    assert sorted([(await f).offset for f in asyncio.as_completed(futures)]) == [100, 101, 102]


async def test_wait_for_timeout_cancels_the_future_only() -> None:
    done = batch()
    future, other = RecordFuture(done, 0, TS), RecordFuture(done, 1, TS)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(future, 0)
    assert future.cancelled() and future.done()
    with pytest.raises(asyncio.CancelledError):
        future.result()
    assert not future.cancel()  # already done
    acked(done)  # the batch (and so the cancelled record) is still delivered
    assert other.result().offset == 101


async def test_cancelling_an_awaiting_task_cancels_the_record_future() -> None:
    future = RecordFuture(batch(), 0, TS)
    waiter = asyncio.ensure_future(future)
    task = asyncio.ensure_future(asyncio.wait([future]))
    awaiting = asyncio.create_task(_await(future))
    await asyncio.sleep(0)
    awaiting.cancel("stop")
    with pytest.raises(asyncio.CancelledError):
        await awaiting
    assert future.cancelled()
    assert waiter is future  # ensure_future hands it back as it is
    await task  # asyncio.wait saw it finish (cancelled)


async def _await(future: RecordFuture) -> RecordMetadata:
    return await future


async def test_callbacks_run_once_in_order_in_their_context() -> None:
    done = batch()
    future = RecordFuture(done, 0, TS)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    calls: list[tuple[str, str]] = []

    def callback(name: str) -> Callable[[RecordFuture], None]:
        return lambda f: calls.append((name, var.get()))

    var.set("registration")
    future.add_done_callback(callback("a"))
    context = contextvars.copy_context()
    context.run(var.set, "explicit")
    future.add_done_callback(callback("b"), context=context)
    removed = callback("removed")
    future.add_done_callback(removed)
    assert future.remove_done_callback(removed) == 1
    assert future.remove_done_callback(removed) == 0
    var.set("settling")
    acked(done)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert calls == [("a", "registration"), ("b", "explicit")]
    future.add_done_callback(callback("late"))  # added after the outcome: scheduled at once
    await asyncio.sleep(0)
    assert calls[-1] == ("late", "settling")


async def test_a_removed_callback_is_not_called() -> None:
    done = batch()
    future = RecordFuture(done, 0, TS)
    calls: list[RecordFuture] = []
    future.add_done_callback(calls.append)
    future.remove_done_callback(calls.append)
    acked(done)
    await asyncio.sleep(0)
    assert calls == [] and future.result().offset == 100


async def test_a_raising_callback_goes_to_the_loop_handler_and_the_others_still_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        done = batch()
        future = RecordFuture(done, 0, TS)
        calls: list[RecordFuture] = []

        def boom(_: RecordFuture) -> None:
            raise ValueError("boom")

        future.add_done_callback(boom)
        future.add_done_callback(calls.append)
        acked(done)
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert calls == [future]
    assert isinstance(reported[0]["exception"], ValueError)


async def test_cancel_runs_callbacks_and_later_outcome_changes_nothing() -> None:
    done = batch()
    future = RecordFuture(done, 0, TS)
    calls: list[bool] = []
    future.add_done_callback(lambda f: calls.append(f.cancelled()))
    assert future.cancel("why")
    with pytest.raises(asyncio.CancelledError, match="why"):
        future.exception()
    acked(done)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert calls == [True]
    assert "cancelled" in repr(future)


async def test_a_settled_record_keeps_its_outcome_whatever_comes_later() -> None:
    # A record reported delivered stays delivered (and a failed one failed), whatever reaches
    # its batch later: an answer after the batch expired, or a close failing what is left.
    done = batch()
    future = RecordFuture(done, 1, TS)
    calls: list[RecordMetadata] = []
    future.add_done_callback(lambda f: calls.append(f.result()))
    acked(done, base_offset=100)
    failed(done, DeliveryTimeoutError("expired", possibly_persisted=True))
    acked(done, base_offset=500)
    await asyncio.sleep(0)
    assert future.result() == RecordMetadata("t", 2, 101, TS)
    assert RecordFuture(done, 0, TS).result() == RecordMetadata("t", 2, 100, TS)  # read after, too
    assert calls == [RecordMetadata("t", 2, 101, TS)]
    assert not future.cancel()  # as asyncio.Future: a settled future cannot be cancelled
    assert not future.cancelled() and future.result() == RecordMetadata("t", 2, 101, TS)


async def test_repr_says_where_it_stands() -> None:
    done = batch()
    future = RecordFuture(done, 1, TS)
    assert repr(future) == "<RecordFuture pending>"
    acked(done)
    assert "offset=101" in repr(future)


def test_run_until_complete_and_uvloop_tasks_accept_it() -> None:
    async def scenario() -> RecordMetadata:
        done = batch()
        asyncio.get_running_loop().call_soon(acked, done)
        return await asyncio.create_task(_await(RecordFuture(done, 4, TS)))

    assert uvloop.run(scenario()).offset == 104
    loop = asyncio.new_event_loop()
    try:
        done = BatchSettlement(loop)
        future = RecordFuture(done, 1, TS)
        loop.call_soon(acked, done)
        assert loop.run_until_complete(future).offset == 101
    finally:
        loop.close()


async def test_cancelling_a_gather_over_pending_records_finishes() -> None:
    # gather asks a cancelled child for its CancelledError (_make_cancelled_error).
    futures = [RecordFuture(batch(), i, TS) for i in range(3)]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await asyncio.gather(*futures)
    assert all(f.cancelled() for f in futures)
    gathered = asyncio.gather(*[RecordFuture(batch(), 0, TS)], return_exceptions=True)
    await asyncio.sleep(0)
    gathered.cancel("enough")
    with pytest.raises(asyncio.CancelledError):
        await gathered


async def test_a_failed_batch_error_keeps_its_own_traceback() -> None:
    done = batch()
    try:
        raise NotLeaderOrFollowerError("gone")
    except NotLeaderOrFollowerError as exc:
        error = exc
    failed(done, error)
    original = error.__traceback__
    for i in range(50):
        with pytest.raises(NotLeaderOrFollowerError) as info:
            await RecordFuture(done, i, TS)
        # Each raise starts from the batch's traceback: it does not pile up frames (at most
        # the raising test's, __await__'s, result()'s and the helper's that raises, plus its own).
        depth, tb = 0, info.value.__traceback__
        while tb is not None:
            depth, tb = depth + 1, tb.tb_next
        assert depth <= 5
    assert error.__traceback__ is original is not None  # the batch's error never raised again


def _settle_through_an_exit(
    first_callback: Callable[[RecordFuture], None], exception_handler: Callable[..., None] | None = None
) -> tuple[list[RecordFuture], RecordFuture, RecordFuture]:
    """Settle a batch of two watched records whose first callback ends in SystemExit; what
    the other callbacks (the first record's second one, the second record's) saw after."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(exception_handler)
    try:
        done = BatchSettlement(loop)
        first, second = RecordFuture(done, 0, TS), RecordFuture(done, 1, TS)
        calls: list[RecordFuture] = []
        first.add_done_callback(first_callback)
        first.add_done_callback(calls.append)
        second.add_done_callback(calls.append)
        loop.call_soon(acked, done)
        with pytest.raises(SystemExit):
            loop.run_forever()
        loop.run_until_complete(asyncio.sleep(0))
        return calls, first, second
    finally:
        loop.close()


def test_a_system_exit_in_one_callback_leaves_the_others_to_run() -> None:
    def quit_now(_: RecordFuture) -> None:
        raise SystemExit(3)

    calls, first, second = _settle_through_an_exit(quit_now)
    assert calls == [first, second]


async def test_a_batch_future_carries_one_callback_for_all_its_watched_records() -> None:
    # Removing a record's callback is O(1) however big the batch (asyncio.wait with a
    # timeout removes one from every future it watched).
    done = batch()
    futures = [RecordFuture(done, i, TS) for i in range(2000)]
    finished, pending = await asyncio.wait(futures, timeout=0)
    assert not finished and len(pending) == 2000
    assert len(done.future._callbacks or ()) <= 1  # asyncio's own bookkeeping, read only
    for future in futures[:10]:
        future.add_done_callback(lambda f: None)
    assert len(done.future._callbacks or ()) == 1


async def test_a_batch_makes_an_asyncio_future_only_for_whoever_waits() -> None:
    # The records an application keeps keep their batch's settlement alive; without callbacks
    # or a flush, it carries the outcome alone (one object less per batch for the collector).
    done = batch()
    futures = [RecordFuture(done, i, TS) for i in range(3)]
    acked(done)
    assert [f.result().offset for f in futures] == [100, 101, 102]
    assert done._future is None
    waited = RecordFuture(batch(), 0, TS)
    waited.add_done_callback(lambda f: None)
    assert waited._settlement._future is not None


async def test_removing_a_callback_once_done_is_too_late_as_with_asyncio() -> None:
    done = batch()
    future = RecordFuture(done, 0, TS)
    calls: list[RecordFuture] = []
    future.add_done_callback(calls.append)
    acked(done)
    assert future.remove_done_callback(calls.append) == 0
    await asyncio.sleep(0)
    assert calls == [future]


async def test_weak_references_work() -> None:
    future = RecordFuture(batch(), 0, TS)
    ref = weakref.ref(future)
    assert ref() is future
    del future
    gc.collect()
    assert ref() is None


def test_an_exception_handler_that_exits_leaves_the_other_callbacks_to_run() -> None:
    def exit_now(_loop: asyncio.AbstractEventLoop, _context: dict[str, Any]) -> None:
        raise SystemExit(2)

    def fail(_: RecordFuture) -> None:
        raise ValueError("a bug in a callback")

    calls, first, second = _settle_through_an_exit(fail, exit_now)
    assert sorted(calls, key=id) == sorted([first, second], key=id)


async def test_records_of_a_failed_batch_are_freed_once_their_error_was_caught() -> None:
    # Re-raising the batch's error from a coroutine that holds the futures puts its frame in
    # the error's traceback: futures -> batch outcome -> error -> frame -> futures, a cycle
    # the garbage collector must be able to free, as it would for asyncio.Future.
    refs: list[weakref.ref[RecordFuture]] = []

    async def send_and_catch() -> None:
        done = batch()
        futures = [RecordFuture(done, index, TS) for index in range(3)]
        refs.extend(weakref.ref(future) for future in futures)
        failed(done, NotLeaderOrFollowerError("gone"))
        with pytest.raises(NotLeaderOrFollowerError):
            await futures[0]

    await send_and_catch()
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]


async def test_records_of_a_failed_batch_are_freed_once_a_caller_raised_their_exception() -> None:
    # ``raise future.exception()`` from the frame holding the futures: the same cycle as
    # above, by way of exception() instead of await.
    refs: list[weakref.ref[RecordFuture]] = []

    async def check_and_raise() -> None:
        done = batch()
        futures = [RecordFuture(done, index, TS) for index in range(3)]
        refs.extend(weakref.ref(future) for future in futures)
        failed(done, NotLeaderOrFollowerError("gone"))
        with pytest.raises(NotLeaderOrFollowerError):
            error = futures[1].exception()
            assert error is not None
            raise error

    await check_and_raise()
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]


async def test_a_future_cancelled_with_a_message_that_refers_to_it_is_freed() -> None:
    class Message(str):
        future: Any

    done = batch()
    future = RecordFuture(done, 0, TS)
    message = Message("stop")
    message.future = future
    future.cancel(message)
    ref = weakref.ref(future)
    del future, message
    gc.collect()
    assert ref() is None


async def test_a_future_whose_callback_refers_to_it_is_freed_if_its_batch_never_settles() -> None:
    done = batch()
    future = RecordFuture(done, 0, TS)
    future.add_done_callback(lambda _f, future=future: None)  # a closure holding the future
    ref = weakref.ref(future)
    del future, done
    gc.collect()
    assert ref() is None


async def test_a_callback_whose_comparison_cancels_the_future_is_safe_to_remove() -> None:
    # remove_done_callback compares each callback with ==, which runs the callback's __eq__:
    # one that cancels the future (scheduling and dropping the callbacks) must not crash it.
    future = RecordFuture(batch(), 0, TS)
    calls: list[Any] = []

    class CancelsWhenCompared:
        def __call__(self, f: RecordFuture) -> None:
            calls.append(f)

        def __eq__(self, other: object) -> bool:
            future.cancel()
            return False

        __hash__ = object.__hash__

    future.add_done_callback(CancelsWhenCompared())
    future.add_done_callback(calls.append)
    future.remove_done_callback(calls.append)  # the compiled future crashed here
    await asyncio.sleep(0)
    assert future.cancelled()
    assert calls == [future, future]  # cancelled before the removal: both were scheduled


def _every_error() -> list[KafkaError]:
    """One instance of every concrete error class, built with placeholder arguments."""
    errors: list[KafkaError] = []
    for cls in vars(aioprod_errors).values():
        if not (inspect.isclass(cls) and issubclass(cls, KafkaError)) or cls is BrokerResponseError:
            continue
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
            if param.default is not param.empty or param.kind is param.VAR_KEYWORD:
                continue
            if param.kind is param.KEYWORD_ONLY:
                kwargs[param.name] = {"enabled": ("PLAIN",), "possibly_persisted": True}.get(param.name, "x")
            else:
                args.append({"code": 7, "results": [], "partition": 7, "partition_count": 3}.get(param.name, "message"))
        errors.append(cls(*args, **kwargs))
    return errors


@pytest.mark.parametrize("error", _every_error(), ids=lambda e: type(e).__name__)
def test_every_error_reaches_the_caller_whole(error: KafkaError) -> None:
    # What a record raises is a copy of its batch's error: it must be the same to the caller.
    copy = BatchFailure(error, None).copy_error(0)
    assert type(copy) is type(error) and copy is not error
    assert (copy.args, str(copy), copy.__dict__) == (error.args, str(error), error.__dict__)


async def test_a_batch_split_again_and_again_settles_in_the_step_its_last_part_does() -> None:
    # flush() waits on the batches it finds unsettled, which after a split are the parts: a record
    # of a batch split twice or more had still read as pending when flush() returned, each level
    # of splitting settling a loop iteration after the one below it.
    top, first, second = batch(), batch(), batch()
    top.split_into([(0, first), (2, second)])
    second_a, second_b = batch(), batch()
    second.split_into([(0, second_a), (1, second_b)])
    second_b_a, second_b_b = batch(), batch()
    second_b.split_into([(0, second_b_a), (1, second_b_b)])
    records = [RecordFuture(top, index, TS) for index in range(5)]
    for leaf, offset in ((first, 10), (second_a, 20), (second_b_a, 30), (second_b_b, 40)):
        assert not records[0].done()
        acked(leaf, offset)
    assert [record.result().offset for record in records] == [10, 11, 20, 30, 40]

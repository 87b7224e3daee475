"""RecordFuture behaves like an asyncio.Future wherever asyncio (or a user) takes one.

Driven with a plain asyncio future standing in for the batch's outcome, so each test decides
when and how the batch settles.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from aioprod import RecordFuture, RecordMetadata
from aioprod.errors import NotLeaderOrFollowerError
from aioprod.producer.record_future import BatchOutcome

TS = 1_700_000_000_000


def batch() -> asyncio.Future[BatchOutcome]:
    return asyncio.get_running_loop().create_future()


def acked(done: asyncio.Future[BatchOutcome], base_offset: int = 100, log_append_time: int = -1) -> None:
    done.set_result(("t", 2, base_offset, log_append_time))


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
    error = NotLeaderOrFollowerError("gone")
    done.set_result(error)
    for future in futures:
        assert future.exception() is error
        with pytest.raises(NotLeaderOrFollowerError):
            await future


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
        done: asyncio.Future[BatchOutcome] = loop.create_future()
        future = RecordFuture(done, 1, TS)
        loop.call_soon(acked, done)
        assert loop.run_until_complete(future).offset == 101
    finally:
        loop.close()

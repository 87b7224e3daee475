"""One test per broker answer the idempotent producer must handle, on the fake broker."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import pytest

from aioprod import Producer
from aioprod.errors import (
    DeliveryTimeoutError,
    DuplicateSequenceNumberError,
    KafkaTimeoutError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
    ProducerFatalError,
    SendManyError,
    UnknownProducerIdError,
)
from tests.chaos.fake_broker import FakeBroker

DUPLICATE = DuplicateSequenceNumberError.code
OUT_OF_ORDER = OutOfOrderSequenceNumberError.code
UNKNOWN_PRODUCER = UnknownProducerIdError.code
NOT_LEADER = NotLeaderOrFollowerError.code


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    fake = await FakeBroker().start()
    yield fake
    await fake.close()


def producer(broker: FakeBroker, **options: object) -> Producer:
    defaults: dict[str, object] = {"linger_ms": 0, "retry_backoff_ms": 1, "retry_backoff_max_ms": 5}
    defaults.update(options)
    return Producer(bootstrap_servers=broker.bootstrap, **defaults)


async def test_duplicate_sequence_counts_as_success(broker: FakeBroker) -> None:
    broker.script = deque([DUPLICATE])
    async with producer(broker) as p:
        md = await p.send_and_wait(broker.topic, b"a")
        assert md.partition == 0
        assert (await p.send_and_wait(broker.topic, b"b")).offset == 0  # the duplicate was not logged
    assert broker.answered[0][2] == DUPLICATE


async def test_out_of_order_behind_a_failed_batch_is_retried_in_order(broker: FakeBroker) -> None:
    # Two batches of one partition in flight; the first fails retriably, so the broker
    # refuses the second as out of order. Both must land, in send order.
    broker.script = deque([NOT_LEADER, OUT_OF_ORDER])
    broker.hold_until = 2
    async with producer(broker, batch_size=100) as p:
        first = await p.send(broker.topic, b"x" * 60)
        second = await p.send(broker.topic, b"y" * 60)  # does not fit the first batch
        await asyncio.gather(first, second)
        assert p._sender.retries >= 2
    assert broker.values(0) == [b"x" * 60, b"y" * 60]
    sequences = [a.base_sequence for a in broker.log]
    assert sequences == [0, 1]


async def test_unknown_producer_id_takes_a_new_identity_invisibly(broker: FakeBroker) -> None:
    broker.script = deque([UNKNOWN_PRODUCER])
    async with producer(broker) as p:
        md = await p.send_and_wait(broker.topic, b"v")
        assert md.offset == 0
        assert p._sender.idempotence is not None and p._sender.idempotence.resets == 1
    assert broker.init_producer_id_calls == 2
    assert broker.log[0].base_sequence == 0 and broker.log[0].producer_id == 1002


async def test_out_of_order_when_the_broker_forgot_resets_sequences(broker: FakeBroker) -> None:
    async with producer(broker) as p:
        await p.send_and_wait(broker.topic, b"first")
        broker.script.append(OUT_OF_ORDER)  # the broker lost what it knew of us
        await p.send_and_wait(broker.topic, b"second")
    assert broker.init_producer_id_calls == 2
    assert [(a.producer_id, a.base_sequence) for a in broker.log] == [(1001, 0), (1002, 0)]


async def test_unexplainable_sequence_gap_is_fatal(broker: FakeBroker) -> None:
    broker.script = deque([OUT_OF_ORDER])  # sequence 0 of a fresh identity refused
    async with producer(broker) as p:
        fut = await p.send(broker.topic, b"v")
        with pytest.raises(ProducerFatalError, match="sequence gap"):
            await fut
        with pytest.raises(ProducerFatalError):
            await p.send(broker.topic, b"later")


async def test_not_leader_is_retried_after_a_metadata_refresh(broker: FakeBroker) -> None:
    broker.script = deque([NOT_LEADER, NOT_LEADER])
    async with producer(broker) as p:
        md = await p.send_and_wait(broker.topic, b"v")
    assert md.offset == 0
    assert [code for _, _, code in broker.answered] == [NOT_LEADER, NOT_LEADER, 0]
    # The retry is the same batch: same sequence every time.
    assert {seq for _, seq, _ in broker.answered} == {0}


async def test_retry_is_byte_identical(broker: FakeBroker) -> None:
    broker.script = deque([NOT_LEADER])
    seen: list[bytes] = []
    original = FakeBroker._produce

    async def spy(self: FakeBroker, request, version, cid):  # type: ignore[no-untyped-def]
        seen.extend(p.records for t in request.topic_data for p in t.partition_data)
        return await original(self, request, version, cid)

    FakeBroker._produce = spy  # type: ignore[method-assign]
    try:
        async with producer(broker) as p:
            await p.send_and_wait(broker.topic, b"v", key=b"k")
    finally:
        FakeBroker._produce = original  # type: ignore[method-assign]
    assert len(seen) == 2 and seen[0] == seen[1]


async def test_timeout_in_flight_is_possibly_persisted_then_identity_changes(broker: FakeBroker) -> None:
    broker.swallow_produce = True
    async with producer(broker, request_timeout_ms=200, delivery_timeout_ms=700, linger_ms=0) as p:
        fut = await p.send(broker.topic, b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
        assert info.value.possibly_persisted is True
        assert "possibly persisted" in str(info.value)
        broker.swallow_produce = False
        await p.send_and_wait(broker.topic, b"after")
    # The timed-out batch may be in the log: the next one is sent under a new identity.
    assert broker.init_producer_id_calls == 2
    assert broker.log[-1].base_sequence == 0


async def test_never_sent_is_reported_as_not_sent() -> None:
    fake = await FakeBroker().start()
    async with Producer(
        bootstrap_servers=fake.bootstrap, request_timeout_ms=200, delivery_timeout_ms=500, linger_ms=0
    ) as p:
        await p.partitions_for(fake.topic)
        fake_port = fake.port
        await fake.close()  # the broker goes away before anything is sent
        fut = await p.send(fake.topic, b"v")
        with pytest.raises(DeliveryTimeoutError) as info:
            await fut
    assert info.value.possibly_persisted is False and "not sent" in str(info.value)
    assert fake_port


async def test_internal_error_fails_pending_records_instead_of_hanging(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioprod.producer.sender import Sender

    def broken(self: Sender, batches: object, future: object) -> None:
        raise RuntimeError("bug injected by the test")

    async with producer(broker) as p:
        await p.send_and_wait(broker.topic, b"warm")
        monkeypatch.setattr(Sender, "_handle_response", broken)
        fut = await p.send(broker.topic, b"v")
        with pytest.raises(ProducerFatalError, match="internal error"):
            await asyncio.wait_for(fut, 30)  # the bound only turns a hang into a failure
        with pytest.raises(ProducerFatalError):
            await p.send(broker.topic, b"later")


async def test_sender_task_death_fails_everything(broker: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    from aioprod.producer.sender import Sender

    async with producer(broker, linger_ms=50) as p:
        await p.partitions_for(broker.topic)
        fut = await p.send(broker.topic, b"v")

        def broken(self: Sender, now: float) -> float:
            raise RuntimeError("sender bug injected by the test")

        monkeypatch.setattr(Sender, "_run_once", broken)
        p._sender.wakeup()
        with pytest.raises(ProducerFatalError, match="sender task died"):
            await asyncio.wait_for(fut, 30)
        with pytest.raises(ProducerFatalError):
            await p.send(broker.topic, b"later")


async def test_send_many_records_that_could_not_be_queued_fail_in_its_future(broker: FakeBroker) -> None:
    # The broker never answers, so the ~3 records that fit the buffer stay there; the rest
    # cannot be queued within max_block_ms and fail in the group's future, not by raising.
    broker.swallow_produce = True
    async with producer(
        broker, buffer_memory=600, max_block_ms=200, request_timeout_ms=300, delivery_timeout_ms=600
    ) as p:
        future = await p.send_many(broker.topic, [b"x" * 100] * 10)
        with pytest.raises(SendManyError) as info:
            await future
    outcomes = info.value.results
    assert len(outcomes) == 10
    queued = [o for o in outcomes if isinstance(o, DeliveryTimeoutError)]
    refused = [o for o in outcomes if isinstance(o, KafkaTimeoutError) and not isinstance(o, DeliveryTimeoutError)]
    assert queued and refused and len(queued) + len(refused) == 10
    assert all(o.possibly_persisted for o in queued)
    assert "buffer_memory" in str(refused[0])

"""A batch the broker finds too large is split and sent again; only a record that is
itself too large fails."""

from __future__ import annotations

import asyncio
import random
from collections import deque

import pytest

from aioprod import Producer
from aioprod.errors import MessageTooLargeError, RecordListTooLargeError
from aioprod.protocol.messages import InitProducerIdRequest, ProduceRequest
from tests.conftest import Scripted
from tests.fakes.cluster import Hold


async def test_a_batch_too_large_for_the_broker_is_split_and_every_record_delivered(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 2000  # the topic's max.message.bytes
    values = [b"%02d" % i + b"x" * 398 for i in range(12)]
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100, batch_size=16384) as p:
        await p.partitions_for("t")
        futures = [await p.send("t", v) for v in values]
        metadata = await asyncio.gather(*futures)
        inits = len(cluster.requests_of(InitProducerIdRequest))
    assert cluster.partition("t").values == values
    assert [md.offset for md in metadata] == list(range(12))
    assert inits == 1  # a split is not a sequence gap: no new identity


async def test_only_a_record_larger_than_the_broker_allows_fails(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 2000
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100) as p:
        await p.partitions_for("t")
        small_before = await p.send("t", b"a" * 100)
        huge = await p.send("t", b"h" * 3000)
        small_after = await p.send("t", b"b" * 100)
        with pytest.raises(MessageTooLargeError):
            await huge
        await asyncio.gather(small_before, small_after)
    assert cluster.partition("t").values == [b"a" * 100, b"b" * 100]


@pytest.mark.parametrize("codec", ["none", "zstd"])
async def test_a_record_too_large_for_the_broker_fails_naming_its_partition_size_and_the_limit(
    scripted: Scripted, codec: str
) -> None:
    # The error said only "MESSAGE_TOO_LARGE (code 10): The request holds a batch larger than
    # the broker accepts.": not which partition, how large, or which setting refused it.
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 2000
    value = random.Random(0).randbytes(2500) + bytes(2500)  # zstd halves it, still over 2,000
    async with Producer(bootstrap_servers=cluster.bootstrap, compression_type=codec) as p:
        huge = await p.send("t", value, partition=0)
        with pytest.raises(MessageTooLargeError) as refused:
            await huge
    text = str(refused.value)
    assert "t-0" in text and "a record of 50" in text and "message.max.bytes" in text
    assert ("compressed" in text) == (codec != "none")
    assert cluster.partition("t").values == []


async def test_a_record_refused_as_larger_than_a_log_segment_names_the_topic_setting(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with Producer(bootstrap_servers=cluster.bootstrap) as p:
        await p.partitions_for("t")
        cluster.nodes[1].script = deque([RecordListTooLargeError.code])
        with pytest.raises(RecordListTooLargeError, match=r"t-0: a record of \d+ bytes .*segment\.bytes"):
            await (await p.send("t", b"v" * 100, partition=0))


@pytest.mark.parametrize("transactional", [False, True])
async def test_a_record_sent_after_a_split_goes_in_a_batch_of_its_own(scripted: Scripted, transactional: bool) -> None:
    # The parts of a split batch carry the sequences of the records they were given. One left
    # open took a later record past its range: the broker wrote it, the producer's next batch
    # came with a sequence already used, and the gap cost a new producer identity (in a
    # transaction, the transaction).
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 2000
    node = cluster.nodes[1]
    values = [b"%02d" % i + b"x" * 398 for i in range(8)]  # one 3.2 KB batch: split in parts
    settings = {"transactional_id": "split"} if transactional else {}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100, **settings) as p:
        if transactional:
            p.begin_transaction()
        await p.partitions_for("t")
        node.script = deque([MessageTooLargeError.code, Hold])  # the batch refused; its first part held
        futures = [await p.send("t", v) for v in values]
        while len(cluster.requests_of(ProduceRequest)) < 2:
            await asyncio.sleep(0.001)  # the first part is on the wire, the others queued
        late = await p.send("t", b"late")
        node.release()
        await asyncio.gather(*futures, late)
        await (await p.send("t", b"after"))
        if transactional:
            await p.commit_transaction()
        inits = len(cluster.requests_of(InitProducerIdRequest))
    assert cluster.partition("t").values == [*values, b"late", b"after"]
    assert [list(batch.values) for batch in cluster.partition("t").log if b"late" in batch.values] == [[b"late"]]
    assert inits == 1


# A batch written, its answer lost, its retry refused as too large (the topic's
# max.message.bytes lowered meanwhile, or a new leader's lower limit: Kafka checks the size
# before it looks for a duplicate). Its parts keep its sequences, but the broker holds the
# whole range as one batch and refuses the first part as out of order.
SPLIT_VALUES = [b"%02d" % i + b"x" * 398 for i in range(8)]  # one 3.2 kB batch


async def _written_then_too_large(
    scripted: Scripted, *, warm_up: bool, parts_refused: bool = False, **options: object
) -> list[object]:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    node = cluster.nodes[1]
    timeouts: dict[str, object] = {"linger_ms": 100, "request_timeout_ms": 1000, "delivery_timeout_ms": 5000}
    async with Producer(bootstrap_servers=cluster.bootstrap, **timeouts, **options) as p:
        if warm_up:
            await (await p.send("t", b"warm-up"))
        # Written with its answer held; with parts_refused, the parts are then refused
        # (NOT_ENOUGH_REPLICAS: not written) until their delivery timeout.
        node.script = deque([Hold, 0] + ([19] * 1000 if parts_refused else []))
        futures = [await p.send("t", v) for v in SPLIT_VALUES]
        while len(cluster.partition("t").log) < 1 + warm_up:
            await asyncio.sleep(0.001)
        cluster.partition("t").max_batch_bytes = 2000
        cluster.disconnect(1)  # the answer is lost: the retry is refused as too large
        node.release()
        return await asyncio.gather(*futures, return_exceptions=True)


async def test_the_parts_of_a_batch_that_may_be_written_are_not_renumbered_and_written_again(
    scripted: Scripted,
) -> None:
    # The refusal was read as "not in the log": a new producer id, the parts renumbered, and
    # every record written twice, both copies acknowledged.
    results = await _written_then_too_large(scripted, warm_up=True)
    written = scripted.cluster.partition("t").values
    assert all(written.count(value) == 1 for value in SPLIT_VALUES)
    for result in results:
        assert not isinstance(result, BaseException) or "may be in the log" in str(result)


@pytest.mark.parametrize("idempotence", [True, False])
async def test_a_failed_part_of_a_batch_that_may_be_written_says_so(scripted: Scripted, idempotence: bool) -> None:
    options = {} if idempotence else {"enable_idempotence": False}
    results = await _written_then_too_large(scripted, warm_up=False, parts_refused=not idempotence, **options)
    written = scripted.cluster.partition("t").values
    for value, result in zip(SPLIT_VALUES, results, strict=True):
        if isinstance(result, BaseException) and value in written:  # never "certainly not in the log"
            assert getattr(result, "possibly_persisted", None) is not False, (value[:2], result)


async def test_a_compressed_batch_over_64_mib_refused_as_too_large_is_split(scripted: Scripted) -> None:
    # split() read its own batch back under read_batch's default 64 MiB ceiling: the
    # CorruptRecordError made the whole producer fatal.
    mib = 1 << 20
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    cluster.partition("t").max_batch_bytes = 50_000  # the compressed batch is about 130 kB
    sizes: dict[str, object] = {"batch_size": 100 * mib, "max_request_size": 200 * mib, "buffer_memory": 400 * mib}
    async with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=100, compression_type="gzip", **sizes) as p:
        await p.partitions_for("t")
        futures = [await p.send("t", bytes([i]) * (33 * mib)) for i in range(2)]
        await asyncio.gather(*futures)
    assert [len(v or b"") for v in cluster.partition("t").values] == [33 * mib, 33 * mib]

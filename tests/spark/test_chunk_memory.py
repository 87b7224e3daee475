"""What the writer keeps of a chunk once it is written: its memory stays within
``max_in_flight_rows``, whatever the rows' outcomes. (No Spark, no broker: ``_send_chunk``
with a stand-in producer that answers as a cluster without the topic does.)"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from aioprod.errors import KafkaTimeoutError, UnknownTopicOrPartitionError
from aioprod.spark.chunks import Chunk
from aioprod.spark.plan import Plan
from aioprod.spark.writer import _LoopState, _send_chunk


class _Rows(list):  # type: ignore[type-arg]
    """A chunk's values (a list that can be weakly referenced)."""


class _MissingTopicProducer:
    """send() as Producer.send answers for a topic the cluster says does not exist."""

    async def send(self, topic: str, value: Any, key: Any = None, **_: Any) -> Any:
        error = KafkaTimeoutError(f"topic {topic!r} not present in metadata after 100 ms")
        error.__cause__ = UnknownTopicOrPartitionError("UNKNOWN_TOPIC_OR_PARTITION")
        raise error


def _plan() -> Plan:
    return Plan(
        options={},
        topic=None,
        has_key=False,
        has_topic=True,
        has_partition=False,
        has_headers=False,
        errors="report",
        max_errors=10,
        max_in_flight_rows=1000,
        close_timeout=None,
    )


async def test_chunks_written_after_a_missing_topic_are_not_kept_alive() -> None:
    # The topic's first error was raised again for each later row: every raise added the
    # chunk's frame (its values, keys, futures) to the one traceback, kept for the whole write
    # and in the report.
    state = _LoopState(_plan())
    producer = _MissingTopicProducer()
    refs = []
    for c in range(20):
        values = _Rows(bytes(1000) for _ in range(100))  # 100 kB a chunk
        refs.append(weakref.ref(values))
        chunk = Chunk(first_row=c * 100, values=values, topics=["nope"] * 100)
        result = await _send_chunk(producer, chunk, state, [])  # type: ignore[arg-type]
        assert len(result.failures) == 100
        del chunk, values, result
    gc.collect()
    alive = sum(ref() is not None for ref in refs)
    tb, entries = state.missing_topics["nope"].__traceback__, 0
    while tb is not None:
        entries, tb = entries + 1, tb.tb_next
    assert alive <= 1, f"{alive} of 20 chunks still alive; the kept error's traceback has {entries} entries"


async def test_chunks_are_not_kept_alive_by_the_errors_of_many_missing_topics() -> None:
    # Each missing topic's remembered error (and a row error in the report) kept, through its
    # traceback, the frame of the chunk that met it: N topics, N chunks alive.
    state = _LoopState(_plan())
    producer = _MissingTopicProducer()
    refs = []
    for c in range(20):
        values = _Rows(bytes(1000) for _ in range(100))
        refs.append(weakref.ref(values))
        chunk = Chunk(first_row=c * 100, values=values, topics=[f"nope-{c}"] * 100)
        await _send_chunk(producer, chunk, state, [])  # type: ignore[arg-type]
        del chunk, values
    gc.collect()
    assert sum(ref() is not None for ref in refs) <= 1

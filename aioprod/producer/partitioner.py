"""Choosing a partition for a record.

Keyed records go where the Java client (``BuiltInPartitioner.partitionForKey``) and
librdkafka's ``murmur2_random`` put them: ``toPositive(murmur2(key)) % partitions``.
Keyless records use the uniform sticky partitioner (KIP-480/794): stay on one partition
until about ``batch_size`` bytes went to it, then move to another at random, so batches
fill instead of spreading one record per partition.
"""

from __future__ import annotations

import contextlib
import operator
import random
import struct
import zlib
from collections.abc import Callable, Sequence

from aioprod._compiled import speedups
from aioprod.config import PartitionerFn

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C


def _py_murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 as a signed int, bit for bit like ``Utils.murmur2``."""
    if type(data) is not bytes:  # as the compiled one: any C-contiguous buffer, byte by byte
        view = memoryview(data)
        if not view.c_contiguous:
            raise BufferError("memoryview: underlying buffer is not C-contiguous")
        data = bytes(view)
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length // 4
    if words:
        for k in struct.unpack_from(f"<{words}I", data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    base = length & ~3
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _py_partition_for_key(key: bytes, num_partitions: int) -> int:
    return (_py_murmur2(key) & 0x7FFFFFFF) % num_partitions


#: A small record's framing in its batch (length, attributes, deltas and lengths as varints: 7-10
#: bytes), which the sticky partition counts with key, value and headers (KIP-794 counts the bytes
#: appended to the batch). Counted high, it moves on just before its batch is full, never after a
#: tiny second batch; the memory estimate (64) moved it on at two thirds of a batch of 100 B values.
RECORD_FRAMING = 10


# The compiled twins (aioprod/_speedups.c), when built and not turned off: the same numbers,
# about 40 times faster (the largest item of a keyed send() in Python).
murmur2 = _py_murmur2 if speedups is None else speedups.murmur2
partition_for_key = _py_partition_for_key if speedups is None else speedups.partition_for_key


class _Sticky:
    """A topic's sticky partition and the bytes sent to it since it was chosen."""

    __slots__ = ("available", "partition", "produced")

    def __init__(self, partition: int, available: Sequence[int]) -> None:
        self.partition = partition
        self.produced = 0
        #: The available-partitions tuple ``partition`` was last found in: metadata
        #: snapshots are immutable, so while it is the same object there is nothing to
        #: check again (a membership test per record would cost O(partitions)).
        self.available = available


class Partitioner:
    """Picks partitions; keeps the per-topic sticky state for keyless records."""

    __slots__ = (
        "_batch_size",
        "_keyless_sticky",
        "_mode",
        "_random",
        "_round_robin",
        "_sticky",
        "_user",
        "batch_fill",
    )

    def __init__(self, mode: str | PartitionerFn, batch_size: int, rng: random.Random | None = None) -> None:
        self._user: PartitionerFn | None = None if isinstance(mode, str) else mode
        self._mode = mode if isinstance(mode, str) else "user"
        # consistent_random: librdkafka's (so confluent-kafka's) default, CRC32 of the key.
        self._keyless_sticky = self._mode in ("default", "murmur2_random", "sticky", "consistent_random")
        self._batch_size = batch_size
        self._random = rng or random.Random()
        self._sticky: dict[str, _Sticky] = {}
        self._round_robin: dict[str, int] = {}
        #: With a codec, the uncompressed bytes that fill a batch of the topic (the accumulator's
        #: estimate): the sticky partition moves on after that many, as Java's counts the batch's
        #: estimated compressed bytes against batch_size. Counted uncompressed, it moved on while
        #: its batch, filled by its compressed size, was a fraction full.
        self.batch_fill: Callable[[str], int] | None = None

    def partition(self, topic: str, key: bytes | None, partitions: Sequence[int], available: Sequence[int]) -> int:
        """``partitions``: every partition id; ``available``: those with a known leader."""
        if self._user is not None:
            chosen = self._user(topic, key, partitions)
            if type(chosen) is not int and not isinstance(chosen, bool):
                with contextlib.suppress(TypeError):
                    chosen = operator.index(chosen)  # an int subclass, numpy.int64: a partition id too
            if type(chosen) is not int or not partitions or not partitions[0] <= chosen <= partitions[-1]:
                raise ValueError(
                    f"the partitioner returned {chosen!r} for topic {topic!r}, which has partitions "
                    f"{partitions[0]}-{partitions[-1]}"
                    if partitions
                    else f"the partitioner returned {chosen!r}"
                )
            return chosen
        if key is not None and self._mode != "round_robin":
            if self._mode != "consistent_random":
                return partition_for_key(key, len(partitions))
            if key:  # librdkafka's rd_crc32(key) % partition_cnt; an empty key is keyless there
                return zlib.crc32(key) % len(partitions)
        choices = available or partitions
        if self._mode == "round_robin":
            counter = self._round_robin.get(topic)
            if counter is None:
                counter = self._random.randrange(len(choices))
            self._round_robin[topic] = counter + 1
            return choices[counter % len(choices)]
        return self.sticky(topic, partitions, available)

    @property
    def hashes_keys(self) -> bool:
        """A keyed record goes to ``partition_for_key(key, partition count)``."""
        return self._user is None and self._mode not in ("round_robin", "consistent_random")

    @property
    def user_defined(self) -> bool:
        """A callable given as ``partitioner``: it may raise, or answer a partition that is refused."""
        return self._user is not None

    @property
    def is_sticky(self) -> bool:
        """Keyless records follow the sticky partition (the default)."""
        return self._keyless_sticky

    @property
    def sticky_states(self) -> dict[str, _Sticky] | None:
        """Each topic's sticky state under a sticky mode, else None: the compiled send lane
        counts a keyless record in it where ``keyless`` would (never rebound)."""
        return self._sticky if self._keyless_sticky else None

    def sticky(self, topic: str, partitions: Sequence[int], available: Sequence[int]) -> int:
        """The topic's current sticky partition (chosen now if there is none)."""
        choices = available or partitions
        state = self._sticky.get(topic)
        if state is None or (state.available is not choices and state.partition not in choices):
            state = self._sticky[topic] = _Sticky(self._random.choice(choices), choices)
            state.produced = self._start_count(topic)
        else:
            state.available = choices
        return state.partition

    def count_sticky(self, topic: str, size: int, available: Sequence[int]) -> None:
        """``size`` more bytes went to the sticky partition; move on after a batch's worth."""
        state = self._sticky[topic]
        state.produced += size
        if state.produced >= self._batch_size:
            self._switch(topic, state, available)

    def keyless(self, topic: str, size: int, partitions: Sequence[int], available: Sequence[int]) -> int:
        """Partition for a keyless record taking ``size`` bytes in its batch (key, value, headers
        and RECORD_FRAMING); counts it for stickiness.

        The hot path for keyless records under the default partitioner: one call, and for all
        but a batch's last record one check (a topic has a sticky state only under a sticky
        partitioner) and one write.
        """
        state = self._sticky.get(topic)
        if state is None or state.available is not available:
            if state is None or state.partition not in available:
                partition = self.partition(topic, None, partitions, available)
                if self._keyless_sticky:  # partition() just chose (or kept) the sticky one
                    self.count_sticky(topic, size, available)
                return partition
            state.available = available
        produced = state.produced + size
        if produced < self._batch_size:
            state.produced = produced
            return state.partition
        partition = state.partition
        self._switch(topic, state, available)
        return partition

    def forget(self, topics: Sequence[str]) -> None:
        """Drop the state of topics no longer used (dropped from the metadata refreshes)."""
        for topic in topics:
            self._sticky.pop(topic, None)
            self._round_robin.pop(topic, None)

    def _switch(self, topic: str, state: _Sticky, available: Sequence[int]) -> None:
        if len(available) > 1:
            state.partition = self._random.choice([p for p in available if p != state.partition])
            state.available = available
        state.produced = self._start_count(topic)

    def _start_count(self, topic: str) -> int:
        """Where a new sticky partition's byte count starts: it moves on at batch_size (the
        compiled send lane compares the count with it too), so a batch filling more than that
        uncompressed starts it below 0."""
        fill = self.batch_fill
        return 0 if fill is None else self._batch_size - fill(topic)

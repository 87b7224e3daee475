import sys
from collections.abc import Sequence
from typing import Any

class RecordsCore:
    _buf: bytearray
    _section: bytes | None
    _count: int
    _base_ts: int
    _max_ts: int
    _limit: int
    _full: bool
    @property
    def is_full(self) -> bool: ...
    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None = (),
    ) -> int | None: ...
    def append_values(
        self,
        timestamp_ms: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        start: int,
        stop: int,
        budget: int,
        overhead: int,
    ) -> tuple[int, int]: ...

def now_ms() -> int: ...
def murmur2(data: bytes) -> int: ...
def partition_for_key(key: bytes, num_partitions: int) -> int: ...

if sys.version_info < (3, 12):
    def running_loop_holder() -> object: ...

def metadata(
    cls: type[tuple[str, int, int, int]], topic: str, partition: int, offset: int, timestamp: int
) -> tuple[str, int, int, int]: ...
def metadata_range(
    cls: type[tuple[str, int, int, int]], topic: str, partition: int, first_offset: int, count: int, timestamp: int
) -> list[tuple[str, int, int, int]]: ...
def plain_payloads(values: Sequence[Any], keys: Sequence[Any] | None, room: int) -> bool: ...

class SendCount:
    """Sends since the producer last looked at the clock; shared by its lanes and send()'s own path."""

    count: int

class SendLane:
    """Producer.send()'s common case for one topic (see aioprod/_speedups.c)."""

    topic: str
    snapshot: object
    def __init__(
        self,
        *,
        topic: str,
        producer: object,
        sends: SendCount,
        metadata: object,
        snapshot: object,
        tps: list[Any],
        batches: dict[Any, Any],
        pool: object,
        sticky: dict[str, Any] | None,
        available: Sequence[int],
        partitions: int,
        overhead: int,
        framing: int,
        size_limit: int,
        batch_size: int,
        clock_every: int,
    ) -> None: ...
    def send(self, value: object, key: object) -> Any: ...

"""Arrow record batches or Spark Rows → chunks: rows as parallel Python lists, ready to send."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aioprod.spark.plan import Plan

if TYPE_CHECKING:
    import pyarrow as pa

#: Row transport: rows handed to the event loop at once (an Arrow chunk is one record batch).
ROWS_PER_CHUNK = 10_000
#: A null element of a headers array, read as the Arrow transport reads it: a pair of nulls,
#: which the producer refuses (a row error), where indexing it raised out of the task.
_NO_HEADER = (None, None)


@dataclass
class Chunk:
    """Rows as parallel Python lists; a column the plan does not have is None."""

    first_row: int
    values: list[Any]
    keys: list[Any] | None = None
    topics: list[Any] | None = None
    partitions: list[Any] | None = None
    headers: list[Any] | None = None


def arrow_chunks(batches: Iterable[pa.RecordBatch], plan: Plan) -> Iterator[Chunk]:
    """One chunk per non-empty record batch of the prepared columns, rows numbered from 0."""
    row = 0
    for batch in batches:
        if batch.num_rows:
            yield arrow_chunk(batch, plan, row)
            row += batch.num_rows


def arrow_chunk(batch: pa.RecordBatch, plan: Plan, first_row: int) -> Chunk:
    names = batch.schema.names
    chunk = Chunk(first_row, batch.column(names.index("value")).to_pylist())
    if plan.has_key:
        chunk.keys = batch.column(names.index("key")).to_pylist()
    if plan.has_topic:
        chunk.topics = batch.column(names.index("topic")).to_pylist()
    if plan.has_partition:
        chunk.partitions = batch.column(names.index("partition")).to_pylist()
    if plan.has_headers:
        chunk.headers = _arrow_headers(batch.column(names.index("headers")))
    return chunk


def _arrow_headers(column: Any) -> list[Any]:
    """list<struct<key, value>> → per row a list of (key, value) tuples, or None."""
    offsets = column.offsets.to_pylist()
    if offsets[-1] == offsets[0]:
        return [None] * len(column)
    values = column.values
    pairs = list(zip(values.field("key").to_pylist(), values.field("value").to_pylist(), strict=True))
    out: list[Any] = []
    append = out.append
    start = offsets[0]
    for end in offsets[1:]:
        append(pairs[start:end] if end > start else None)
        start = end
    return out


def row_chunks(rows: Iterable[Any], plan: Plan) -> Iterator[Chunk]:
    """Spark Rows (columns in plan order) → chunks of up to ROWS_PER_CHUNK, rows numbered from 0."""
    names = plan.columns
    index = {name: names.index(name) for name in names}
    buffer: list[Any] = []

    def make(batch: list[Any], start: int) -> Chunk:
        columns = list(zip(*batch, strict=True))
        chunk = Chunk(start, [None if v is None else bytes(v) for v in columns[index["value"]]])
        if plan.has_key:
            chunk.keys = [None if k is None else bytes(k) for k in columns[index["key"]]]
        if plan.has_topic:
            chunk.topics = list(columns[index["topic"]])
        if plan.has_partition:
            chunk.partitions = list(columns[index["partition"]])
        if plan.has_headers:
            chunk.headers = [
                None
                if hs is None
                else [_NO_HEADER if h is None else (h[0], None if h[1] is None else bytes(h[1])) for h in hs]
                for hs in columns[index["headers"]]
            ]
        return chunk

    start = 0
    for row in rows:
        buffer.append(row)
        if len(buffer) >= ROWS_PER_CHUNK:
            yield make(buffer, start)
            start += len(buffer)
            buffer = []
    if buffer:
        yield make(buffer, start)

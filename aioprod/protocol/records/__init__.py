"""Kafka record batches (magic v2): building, reading and compressing them, without I/O."""

from aioprod.protocol.records.builder import BATCH_HEADER_SIZE, MAX_RECORD_OVERHEAD, RecordBatchBuilder
from aioprod.protocol.records.compression import (
    DEFAULT_MAX_DECOMPRESSED_SIZE,
    Codec,
    compress,
    decompress,
    resolve_codec,
    resolve_level,
)
from aioprod.protocol.records.reader import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    Record,
    RecordBatch,
    read_batch,
    read_batches,
)

__all__ = [
    "BATCH_HEADER_SIZE",
    "CREATE_TIME",
    "DEFAULT_MAX_DECOMPRESSED_SIZE",
    "LOG_APPEND_TIME",
    "MAX_RECORD_OVERHEAD",
    "Codec",
    "Record",
    "RecordBatch",
    "RecordBatchBuilder",
    "compress",
    "decompress",
    "read_batch",
    "read_batches",
    "resolve_codec",
    "resolve_level",
]

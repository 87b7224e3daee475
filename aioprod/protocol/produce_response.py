"""A faster decoder for ProduceResponse, the answer the data path reads for every request.

The generic codec (:mod:`aioprod.protocol.schema`) calls one closure per field and builds
each struct from a dict of keyword arguments: ~4 µs per partition, 4 ms for an answer about
1,000 partitions. Almost every partition's answer has the same shape, though: a run of
fixed-width fields (index, error code, base offset, log append time, log start offset)
followed by nothing more to say (no record errors, no error message, no tagged fields).
This decoder reads that run with one ``struct`` unpack and checks the rest byte for byte
against the encoding of an answer with nothing more to say.

Anything else is handed back to the generic codec from the start of the struct that has
it: a partition with record errors, an error message or KIP-951's leader hint, a topic or
response with tagged fields, and every malformed input (the generic codec then raises the
:class:`~aioprod.errors.ProtocolError`). Both what the run holds and what "nothing more to
say" looks like are derived from the declarations in :mod:`aioprod.protocol.messages`, so
the generic codec stays the one definition of the bytes' meaning;
``tests/protocol/test_produce_response.py`` checks that the two decoders agree.
"""

from __future__ import annotations

import dataclasses
import struct
from functools import cache

from aioprod.protocol.messages import ProduceResponse, ProduceResponsePartition, ProduceResponseTopic
from aioprod.protocol.primitives import Reader
from aioprod.protocol.schema import (
    INT8,
    INT16,
    INT32,
    INT64,
    UINT16,
    Decoder,
    FieldSpec,
    WireType,
    encode_struct,
    struct_codec,
)

__all__ = ["decode_produce_response"]

_STRUCT_CODES: dict[WireType, str] = {INT8: "b", INT16: "h", UINT16: "H", INT32: "i", INT64: "q"}


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    """How one version of ProduceResponse is read."""

    flexible: bool
    #: The fixed-width fields a partition's answer starts with, in declaration order.
    head: struct.Struct
    #: The bytes after ``head`` in a partition's answer with nothing more to say.
    quiet: bytes
    #: The generic codec's decoders, for whatever is not in the common shape.
    response: Decoder
    topic: Decoder
    partition: Decoder


@cache
def _layout(version: int) -> _Layout:
    flexible = ProduceResponse.is_flexible(version)
    codes = []
    for f in dataclasses.fields(ProduceResponsePartition):
        spec: FieldSpec = f.metadata["kafka"]
        # The run ends at the first field that is absent or not fixed-width: the fields it
        # holds must be the dataclass's first ones, so that they can be passed positionally
        # and every later field takes its default.
        code = _STRUCT_CODES.get(spec.type)
        if code is None or version not in spec.versions:
            break
        codes.append(code)
    head = struct.Struct(">" + "".join(codes))
    quiet = encode_struct(ProduceResponsePartition(), version, flexible)[head.size :]
    return _Layout(
        flexible,
        head,
        quiet,
        struct_codec(ProduceResponse, version, flexible)[1],
        struct_codec(ProduceResponseTopic, version, flexible)[1],
        struct_codec(ProduceResponsePartition, version, flexible)[1],
    )


def decode_produce_response(r: Reader, version: int) -> ProduceResponse:
    """Read a ProduceResponse body at ``r.pos``; equal to what the generic codec returns."""
    layout = _layout(version)
    start = r.pos
    flexible = layout.flexible
    topics = [_read_topic(r, layout) for _ in range(r.array_length(compact=flexible, nullable=False) or 0)]
    throttle_time_ms = r.int32()
    if flexible and r.unsigned_varint() != 0:
        # Tagged fields (KIP-951's node endpoints come with leader hints): rare enough that
        # the generic codec reads the whole answer again.
        r.pos = start
        response: ProduceResponse = layout.response(r)
        return response
    return ProduceResponse(topics, throttle_time_ms)


def _read_topic(r: Reader, layout: _Layout) -> ProduceResponseTopic:
    start = r.pos
    flexible = layout.flexible
    name = r.string(compact=flexible, nullable=False) or ""  # never None: not nullable
    count = r.array_length(compact=flexible, nullable=False) or 0
    buf, pos, end = r.buf, r.pos, r.end
    unpack = layout.head.unpack_from
    head_size = layout.head.size
    quiet = layout.quiet
    quiet_end = head_size + len(quiet)
    generic = layout.partition
    partitions: list[ProduceResponsePartition] = []
    append = partitions.append
    for _ in range(count):
        if pos + quiet_end <= end and buf[pos + head_size : pos + quiet_end] == quiet:
            append(ProduceResponsePartition(*unpack(buf, pos)))
            pos += quiet_end
        else:
            r.pos = pos
            append(generic(r))
            pos = r.pos
    r.pos = pos
    if flexible and r.unsigned_varint() != 0:  # tagged fields: none is known
        r.pos = start
        topic: ProduceResponseTopic = layout.topic(r)
        return topic
    return ProduceResponseTopic(name, partitions)

"""The struct codec (``aioprod.protocol.schema``): tagged fields, malformed input, fuzzing.

Nothing but :class:`ProtocolError` may escape a decode, however the bytes are cut,
mutated or made up, and no claimed length makes it allocate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
import tracemalloc
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioprod.errors import ProtocolError
from aioprod.protocol import messages as m
from aioprod.protocol.framing import (
    decode_response,
)
from aioprod.protocol.schema import (
    Message,
    Response,
    decode_struct,
    encode_struct,
)
from tests.protocol.strategies import CASES, message_strategy, mutate


def test_tagged_fields_are_omitted_at_their_defaults() -> None:
    partition = m.ProduceResponsePartition(0, 0, 5)
    plain = encode_struct(partition, 10, True)
    assert plain.endswith(b"\x00")  # no tagged fields
    moved = dataclasses.replace(partition, current_leader=m.ProduceResponseLeaderIdAndEpoch(1, -1))
    tagged = encode_struct(moved, 10, True)
    # one tagged field: tag 0, 9 bytes: leader id, epoch, the struct's own empty tagged fields
    assert tagged == plain[:-1] + b"\x01\x00\x09" + struct.pack(">ii", 1, -1) + b"\x00"
    assert decode_struct(m.ProduceResponsePartition, tagged, 10, True) == moved


def test_unknown_tagged_fields_are_skipped() -> None:
    body = bytearray(encode_struct(m.ProduceResponsePartition(0, 0, 5), 10, True))
    body[-1:] = b"\x02\x05\x02\xaa\xbb\x00\x00"  # unknown tag 5, and tag 0 with an empty struct body
    with pytest.raises(ProtocolError):  # tag 0 is CurrentLeader, which needs 8 bytes
        decode_struct(m.ProduceResponsePartition, bytes(body), 10, True)
    body[-7:] = b"\x01\x05\x02\xaa\xbb"
    assert decode_struct(m.ProduceResponsePartition, bytes(body), 10, True) == m.ProduceResponsePartition(0, 0, 5)


# --- malformed input ------------------------------------------------------------------------------


def test_truncated_and_trailing_bytes() -> None:
    resp = m.MetadataResponse(
        brokers=[m.MetadataResponseBroker(1, "h", 9092)],
        topics=[m.MetadataResponseTopic(0, "t", partitions=[m.MetadataResponsePartition(0, 0, 1, 1, [1], [1], [])])],
    )
    for version in (1, 9, 12):
        body = encode_struct(resp, version, version >= 9)
        for cut in range(len(body)):
            with pytest.raises(ProtocolError):
                decode_struct(m.MetadataResponse, body[:cut], version, version >= 9)
        with pytest.raises(ProtocolError, match="trailing"):
            decode_struct(m.MetadataResponse, body + b"\x00", version, version >= 9)
        # A whole response frame is delimited by its size: bytes after the last field are
        # ignored, as the Java client and librdkafka do.
        frame = b"\x00\x00\x00\x01" + (b"\x00" if version >= 9 else b"") + body + b"!"
        assert decode_response(frame, m.MetadataResponse, version) == decode_struct(
            m.MetadataResponse, body, version, version >= 9
        )


def test_huge_counts_and_lengths_are_refused_cheaply() -> None:
    tracemalloc.start()
    try:
        # brokers array claiming 2**31-1 entries
        with pytest.raises(ProtocolError):
            decode_struct(m.MetadataResponse, b"\x7f\xff\xff\xff" + b"\x00" * 16, 1, False)
        # compact array claiming 2**35 entries
        with pytest.raises(ProtocolError):
            decode_struct(m.SaslHandshakeResponse, b"\x00\x00" + b"\x7f\xff\xff\xff", 0, False)
        with pytest.raises(ProtocolError):
            decode_struct(m.MetadataResponse, b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff\x0f" + b"\x00" * 8, 9, True)
        # bytes claiming 2 GiB
        with pytest.raises(ProtocolError):
            decode_struct(m.SaslAuthenticateResponse, b"\x00\x00\xff\xff" + b"\x7f\xff\xff\xff" + b"\x00" * 8, 0, False)
        # a tagged field claiming more than remains
        with pytest.raises(ProtocolError):
            decode_struct(m.ApiVersionsResponse, b"\x00\x00\x01\x00\x00\x00\x00\x01\x00\xff\xff\xff\x0f", 3, True)
        # a tagged field count far beyond the data
        with pytest.raises(ProtocolError):
            decode_struct(m.ApiVersionsResponse, b"\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff\x0f", 3, True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_negative_lengths() -> None:
    with pytest.raises(ProtocolError):  # non-nullable array with length -1
        decode_struct(m.SaslHandshakeResponse, b"\x00\x00\xff\xff\xff\xff", 0, False)
    with pytest.raises(ProtocolError):  # non-nullable string with length -1
        decode_struct(m.SaslHandshakeRequest, b"\xff\xff", 0, False)
    with pytest.raises(ProtocolError):  # nullable array, length -2
        decode_struct(m.MetadataRequest, b"\xff\xff\xff\xfe", 1, False)
    assert decode_struct(m.MetadataRequest, b"\xff\xff\xff\xff", 1, False) == m.MetadataRequest(topics=None)


def test_bad_utf8() -> None:
    with pytest.raises(ProtocolError, match="UTF-8"):
        decode_struct(m.SaslHandshakeRequest, b"\x00\x02\xc3\x28", 0, False)


def test_encoding_null_into_non_nullable_field() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_struct(m.SaslHandshakeRequest(None), 0, False)  # type: ignore[arg-type]
    assert info.value.remote is False
    with pytest.raises(ProtocolError):  # topic names become nullable only in v10
        encode_struct(m.MetadataRequest(topics=[m.MetadataRequestTopic(name=None)]), 9, True)
    with pytest.raises(ProtocolError):  # the topic list is nullable from v1 on, but not its items
        encode_struct(m.SaslHandshakeResponse(mechanisms=[None]), 0, False)  # type: ignore[list-item]
    # ...but fine where the version allows it
    encode_struct(m.MetadataRequest(topics=[m.MetadataRequestTopic(name=None)]), 10, True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_encodings_decode_or_raise_protocol_error(data: st.DataObject) -> None:
    cls, version = data.draw(st.sampled_from(CASES), label="case")
    obj = data.draw(message_strategy(cls, version), label="message")
    flexible = cls.is_flexible(version)
    mutated = mutate(data, encode_struct(obj, version, flexible))
    with contextlib.suppress(ProtocolError):
        decode_struct(cls, mutated, version, flexible)
    frame = b"\x00\x00\x00\x01" + (b"\x00" if flexible and cls is not m.ApiVersionsResponse else b"") + mutated
    if issubclass(cls, Response):
        with contextlib.suppress(ProtocolError):
            decode_response(frame, cls, version)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.sampled_from(CASES))
def test_random_bytes_decode_or_raise_protocol_error(blob: bytes, case: tuple[type[Message], int]) -> None:
    cls, version = case
    with contextlib.suppress(ProtocolError):
        decode_struct(cls, blob, version, cls.is_flexible(version))


def test_uuid_fields_round_trip_exactly() -> None:
    topic_id = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    req = m.MetadataRequest(topics=[m.MetadataRequestTopic(topic_id=topic_id, name=None)])
    body = encode_struct(req, 12, True)
    assert topic_id.bytes in body
    assert decode_struct(m.MetadataRequest, body, 12, True).topics == [m.MetadataRequestTopic(topic_id, None)]

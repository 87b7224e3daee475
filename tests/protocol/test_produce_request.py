"""ProduceRequest's own encoder (``aioprod.protocol.produce_request``) against the generic codec.

The generic codec is the definition: on every version the fast encoder takes, generated
requests (every field drawn from the schema, some record batches long enough for multi-byte
lengths) must encode to the same bytes, and bad ones fail with the same error type. The
layout the fast encoder assumes is checked against the declaration, so a field added to
ProduceRequest in ``messages.py`` fails here instead of going unwritten.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioprod.errors import ProtocolError
from aioprod.protocol import messages as m
from aioprod.protocol.framing import encode_request
from aioprod.protocol.produce_request import PRODUCE_FAST_VERSIONS, encode_produce_request
from aioprod.protocol.schema import STRING, Array, Struct, field_specs, struct_codec, tagged_fields
from tests.protocol.strategies import message_strategy

#: Lengths around each varint width, and a batch larger than 64 KiB.
LONG_RECORDS = [127, 128, 16_383, 16_384, 70_000]


def generic(request: m.ProduceRequest, version: int) -> bytes:
    out = bytearray()
    struct_codec(m.ProduceRequest, version, m.ProduceRequest.is_flexible(version))[0](out, request)
    return bytes(out)


def fast(request: m.ProduceRequest, version: int) -> bytes:
    out = bytearray()
    encode_produce_request(out, request, version)
    return bytes(out)


def layout(cls: type[Struct], version: int) -> list[tuple[str, str, bool]]:
    return [
        (name, spec.type.name, version in spec.nullable) for name, spec in field_specs(cls) if version in spec.versions
    ]


@pytest.mark.parametrize("version", PRODUCE_FAST_VERSIONS)
def test_the_declaration_has_the_layout_the_fast_encoder_writes(version: int) -> None:
    assert m.ProduceRequest.is_flexible(version) == (version >= 9)
    assert layout(m.ProduceRequest, version) == [
        ("transactional_id", STRING.name, True),
        ("acks", "int16", False),
        ("timeout_ms", "int32", False),
        ("topic_data", Array(m.ProduceRequestTopic).name, False),
    ]
    assert layout(m.ProduceRequestTopic, version) == [
        ("name", STRING.name, False),
        ("partition_data", Array(m.ProduceRequestPartition).name, False),
    ]
    assert layout(m.ProduceRequestPartition, version) == [("index", "int32", False), ("records", "records", True)]
    for cls in (m.ProduceRequest, m.ProduceRequestTopic, m.ProduceRequestPartition):
        assert not tagged_fields(cls, version)


def test_every_declared_version_is_taken_by_the_fast_encoder() -> None:
    # Not required (another version would go to the generic codec), but a version added to the
    # declaration should be a decision: extend PRODUCE_FAST_VERSIONS once its layout is checked.
    assert range(m.ProduceRequest.MIN_VERSION, m.ProduceRequest.MAX_VERSION + 1) == PRODUCE_FAST_VERSIONS


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_requests_encode_as_the_generic_codec_encodes_them(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(PRODUCE_FAST_VERSIONS), label="version")
    request: m.ProduceRequest = data.draw(message_strategy(m.ProduceRequest, version))
    for topic in request.topic_data:
        for partition in topic.partition_data:
            if data.draw(st.booleans(), label="long records"):
                partition.records = bytes(data.draw(st.sampled_from(LONG_RECORDS)))
    assert fast(request, version) == generic(request, version)


@pytest.mark.parametrize("version", PRODUCE_FAST_VERSIONS)
def test_a_whole_frame_carries_the_fast_encoders_body(version: int) -> None:
    request = m.ProduceRequest(
        transactional_id="txn-é",
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            m.ProduceRequestTopic("a", [m.ProduceRequestPartition(0, b"x" * 200), m.ProduceRequestPartition(7, None)]),
            m.ProduceRequestTopic("b", []),
        ],
    )
    frame = encode_request(request, version, 42, "aioprod")
    body = generic(request, version)
    assert frame.endswith(body)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4


@pytest.mark.parametrize("version", PRODUCE_FAST_VERSIONS)
@pytest.mark.parametrize(
    ("topic", "partition"),
    [
        (None, m.ProduceRequestPartition(0, b"")),  # a topic name is not nullable
        ("t", m.ProduceRequestPartition(1 << 31, b"")),  # an index out of int32 range
    ],
)
def test_bad_requests_fail_as_the_generic_codec_fails(
    version: int, topic: str | None, partition: m.ProduceRequestPartition
) -> None:
    request = m.ProduceRequest(None, -1, 1000, [m.ProduceRequestTopic(topic, [partition])])  # type: ignore[arg-type]
    errors = []
    for encoder in (generic, fast):
        with pytest.raises((ProtocolError, struct.error)) as raised:
            encoder(request, version)
        errors.append(raised.type)
    assert errors[0] is errors[1]

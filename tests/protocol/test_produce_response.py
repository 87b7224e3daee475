"""ProduceResponse's own decoder (``aioprod.protocol.produce_response``) against the generic codec.

The generic codec is the definition. For every Produce version, on generated answers (every
field drawn from the schema, half the partitions in the common shape), on hand-made edge
cases and on mutated bytes, the two decoders must return equal objects (dataclass equality
compares classes too) and stop at the same byte, or raise the same ProtocolError.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioprod.errors import ProtocolError
from aioprod.protocol import messages as m
from aioprod.protocol import primitives as p
from aioprod.protocol import produce_response
from aioprod.protocol.framing import decode_response, encode_response
from aioprod.protocol.primitives import Reader
from aioprod.protocol.produce_response import decode_produce_response
from aioprod.protocol.schema import encode_struct, struct_codec
from tests.protocol.strategies import message_strategy, mutate

VERSIONS = range(m.ProduceResponse.MIN_VERSION, m.ProduceResponse.MAX_VERSION + 1)
FLEXIBLE_VERSIONS = [v for v in VERSIONS if m.ProduceResponse.is_flexible(v)]
INT64_MIN = -(1 << 63)


def generic(r: Reader, version: int) -> m.ProduceResponse:
    response: m.ProduceResponse = struct_codec(m.ProduceResponse, version, m.ProduceResponse.is_flexible(version))[1](r)
    return response


def encode(response: m.ProduceResponse, version: int) -> bytes:
    return encode_struct(response, version, m.ProduceResponse.is_flexible(version))


def outcome(decoder: Any, body: bytes, version: int, end: int | None) -> tuple[Any, int] | str:
    """What ``decoder`` makes of ``body[:end]``, and where it stopped; or the error it raised."""
    r = Reader(body, 0, end)
    try:
        return decoder(r, version), r.pos
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"


def assert_agree(body: bytes, version: int, end: int | None = None) -> Any:
    expected = outcome(generic, body, version, end)
    assert outcome(decode_produce_response, body, version, end) == expected
    return expected


def quiet(partition: m.ProduceResponsePartition) -> m.ProduceResponsePartition:
    """The partition with nothing to say beyond its fixed-width fields (the common shape)."""
    return dataclasses.replace(
        partition, record_errors=[], error_message=None, current_leader=m.ProduceResponseLeaderIdAndEpoch()
    )


def partition(index: int, version: int, **changes: Any) -> m.ProduceResponsePartition:
    part = m.ProduceResponsePartition(index, 0, 1000 + index, -1, 0 if version >= 5 else -1)
    return dataclasses.replace(part, **changes)


@st.composite
def responses(draw: st.DrawFn, version: int) -> m.ProduceResponse:
    response: m.ProduceResponse = draw(message_strategy(m.ProduceResponse, version))
    for topic in response.responses:
        topic.partition_responses = [
            quiet(part) if draw(st.booleans(), label="common shape") else part for part in topic.partition_responses
        ]
    return response


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_answers_decode_as_the_generic_codec_decodes_them(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(VERSIONS), label="version")
    response = data.draw(responses(version), label="response")
    body = encode(response, version)
    decoded, end = assert_agree(body + b"!", version)  # a trailing byte is left unread by both
    assert end == len(body)
    assert decoded == response


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_answers_decode_or_fail_as_the_generic_codec_does(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(VERSIONS), label="version")
    response = data.draw(responses(version), label="response")
    assert_agree(mutate(data, encode(response, version)), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_common_shape_never_reaches_the_generic_codec(version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Otherwise the answers would still be right, and only the benchmark would notice."""
    real = produce_response._layout(version)

    def refuse(r: Reader) -> Any:
        raise AssertionError(f"the generic codec was asked to decode at byte {r.pos}")

    layout = dataclasses.replace(real, partition=refuse)
    monkeypatch.setattr(produce_response, "_layout", lambda v: layout)
    # 200 partitions and a 200-byte topic name: counts and lengths of more than one varint byte
    parts = [partition(i, version, error_code=-1 if i % 7 else 0, base_offset=-1 - i) for i in range(200)]
    parts[0] = partition(0, version, base_offset=INT64_MIN, log_append_time_ms=INT64_MIN)
    response = m.ProduceResponse(
        [m.ProduceResponseTopic("t" * 200, parts), m.ProduceResponseTopic("", []), m.ProduceResponseTopic("é", [])],
        throttle_time_ms=-5,
    )
    assert decode_response(encode_response(response, version, 7)[4:], m.ProduceResponse, version) == response
    empty = m.ProduceResponse([], 0)
    assert decode_response(encode_response(empty, version, 7)[4:], m.ProduceResponse, version) == empty


@pytest.mark.parametrize("version", VERSIONS)
def test_partitions_with_more_to_say_among_common_ones(version: int) -> None:
    leader = m.ProduceResponseLeaderIdAndEpoch(3, 17)
    errors = [m.ProduceResponseBatchIndexError(2, None), m.ProduceResponseBatchIndexError(5, "bad key")]
    parts = [
        partition(0, version),
        partition(1, version, error_code=6, error_message="not the leader", current_leader=leader),
        partition(2, version, error_code=87, record_errors=errors),
        partition(3, version, error_message=""),  # empty, not null
        partition(4, version, current_leader=leader),
        partition(5, version),
    ]
    endpoints = [m.ProduceResponseNodeEndpoint(3, "broker-3", 9092, None), m.ProduceResponseNodeEndpoint(4, "b", 1, "")]
    for node_endpoints in ([], endpoints):
        response = m.ProduceResponse([m.ProduceResponseTopic("orders", parts)], 0, node_endpoints)
        body = encode(response, version)
        decoded, _ = assert_agree(body, version)
        expected = m.ProduceResponse(
            [m.ProduceResponseTopic("orders", parts)], 0, node_endpoints if version >= 10 else []
        )
        if version < 8:  # record errors and error messages arrived in v8, leader hints in v10
            expected.responses[0].partition_responses = [quiet(part) for part in parts]
        elif version < 10:
            expected.responses[0].partition_responses = [
                dataclasses.replace(part, current_leader=m.ProduceResponseLeaderIdAndEpoch()) for part in parts
            ]
        assert decoded == expected


UNKNOWN_TAG = b"\x01\x2a\x02\xaa\xbb"  # one tagged field: tag 42, two bytes


@pytest.mark.parametrize("version", FLEXIBLE_VERSIONS)
@pytest.mark.parametrize("level", ["partition", "topic", "response"])
def test_unknown_tagged_fields_are_skipped_at_every_level(version: int, level: str) -> None:
    parts = [partition(0, version), partition(1, version)]
    partition_bytes = [encode_struct(part, version, True) for part in parts]
    assert all(b.endswith(b"\x00") for b in partition_bytes)  # no tagged fields
    if level == "partition":
        partition_bytes[1] = partition_bytes[1][:-1] + UNKNOWN_TAG
    topic = bytearray()
    p.write_string(topic, "orders", compact=True, nullable=False)
    p.write_array_length(topic, len(parts), compact=True, nullable=False)
    topic += b"".join(partition_bytes) + (UNKNOWN_TAG if level == "topic" else b"\x00")
    body = b"\x03" + topic + topic + struct.pack(">i", 0) + (UNKNOWN_TAG if level == "response" else b"\x00")
    decoded, end = assert_agree(body, version)
    assert end == len(body)
    assert decoded == m.ProduceResponse([m.ProduceResponseTopic("orders", parts)] * 2, 0)


@pytest.mark.parametrize("version", FLEXIBLE_VERSIONS)
def test_longer_varints_than_needed_read_the_same(version: int) -> None:
    plain = encode(m.ProduceResponse([m.ProduceResponseTopic("t", [partition(0, version)])], 0), version)
    tail = b"\x01\x00\x00"  # no record errors, null message, no tagged fields
    assert plain.count(tail) == 1
    padded = plain.replace(tail, b"\x81\x00\x80\x00\x80\x80\x00")
    assert assert_agree(padded, version)[0] == assert_agree(plain, version)[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_truncated_answer_fails_as_the_generic_codec_fails(version: int) -> None:
    leader = m.ProduceResponseLeaderIdAndEpoch(3, 17)
    parts = [partition(0, version), partition(1, version, error_code=6, error_message="moved", current_leader=leader)]
    response = m.ProduceResponse(
        [m.ProduceResponseTopic("orders", parts)], 1, [m.ProduceResponseNodeEndpoint(3, "h", 1)]
    )
    body = encode(response, version)
    for cut in range(len(body)):
        assert isinstance(assert_agree(body[:cut], version), str)
        assert isinstance(assert_agree(body, version, end=cut), str)  # a reader that ends early


@pytest.mark.parametrize("version", [8, 11])
def test_bad_lengths_and_encodings_fail_as_the_generic_codec_fails(version: int) -> None:
    flexible = m.ProduceResponse.is_flexible(version)
    body = encode(m.ProduceResponse([m.ProduceResponseTopic("ab", [partition(0, version)])], 0), version)
    count = 1 if flexible else 4  # bytes of an array count; then the name's length and its two bytes
    name_at = count + (1 if flexible else 2)
    parts_at = name_at + 2
    minus_one = b"\x00" if flexible else b"\xff\xff\xff\xff"
    cases = [
        ("not valid UTF-8", body[:name_at] + b"\xc3\x28" + body[parts_at:]),
        ("array claims", (b"\xff\xff\xff\x0f" if flexible else b"\x7f\xff\xff\xff") + body[count:]),
        ("invalid length -1", minus_one + body[count:]),
        ("invalid length -1", body[:parts_at] + minus_one + body[parts_at + count :]),
        # a name length of -2 (classic), or of 2**32 - 2 bytes (compact lengths are never negative)
        (
            "truncated data" if flexible else "invalid length -2",
            body[:count] + (b"\xff\xff\xff\xff\x0f" if flexible else b"\xff\xfe") + body[name_at:],
        ),
    ]
    for fragment, bad in cases:
        failure = assert_agree(bad, version)
        assert isinstance(failure, str)
        assert fragment in failure


def test_frames_that_are_not_bytes_decode_the_same() -> None:
    response = m.ProduceResponse([m.ProduceResponseTopic("t", [partition(0, 11), partition(1, 11)])], 0)
    frame = encode_response(response, 11, 7)[4:] + b"!"  # a frame may carry a byte the spec has not
    for view in (frame, bytearray(frame), memoryview(frame)):
        assert decode_response(view, m.ProduceResponse, 11) == response

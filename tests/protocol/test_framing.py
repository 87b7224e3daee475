"""Request and response framing (``aioprod.protocol.framing``): headers and the frame decoder."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest
from aiokafka.protocol import api as aio_api
from aiokafka.protocol import produce as aio_produce
from hypothesis import given, settings
from hypothesis import strategies as st

from aioprod.errors import ProtocolError, UnsupportedVersionError
from aioprod.protocol import messages as m
from aioprod.protocol.framing import (
    FrameDecoder,
    decode_request_body,
    decode_request_header,
    decode_response,
    encode_request,
    encode_response,
    peek_correlation_id,
    request_header_version,
    response_header_version,
)
from aioprod.protocol.schema import (
    encode_struct,
)
from tests.protocol.references import (
    kp_api_versions_v3_obj,
    kp_produce_v10_obj,
    produce_kp_obj,
    produce_ours,
)

# --- headers --------------------------------------------------------------------------------------


def test_header_versions() -> None:
    assert request_header_version(m.ProduceRequest, 8) == 1
    assert request_header_version(m.ProduceRequest, 9) == 2
    assert request_header_version(m.ApiVersionsRequest, 3) == 2
    assert request_header_version(m.SaslHandshakeRequest, 1) == 1
    assert response_header_version(m.ProduceResponse, 8) == 0
    assert response_header_version(m.ProduceResponse, 9) == 1
    for version in range(5):
        assert response_header_version(m.ApiVersionsResponse, version) == 0


def test_request_header_v1_matches_aiokafka() -> None:
    ours = encode_request(produce_ours(), 7, 1234, "my-client")
    ref_struct = aio_produce.ProduceRequest_v7(
        "txn", -1, 30000, [("alpha", [(0, b"batch-0"), (3, None)]), ("beta", [])]
    )
    ref = bytes(aio_api.RequestHeader_v1(ref_struct, 1234, "my-client").encode()) + bytes(ref_struct.encode())
    assert ours == struct.pack(">i", len(ref)) + ref
    assert ours[4:14] == struct.pack(">hhih", 0, 7, 1234, 9)


def test_request_header_v2_matches_kafka_python() -> None:
    ours = encode_request(produce_ours(), 9, 99, "c")
    ref = produce_kp_obj(9)
    ref.with_header(correlation_id=99, client_id="c")
    assert ours == bytes(ref.encode(header=True, framed=True))
    # api key, version, correlation id, classic (non-compact) client id, empty tagged fields
    assert ours[4:16] == struct.pack(">hhih", 0, 9, 99, 1) + b"c" + b"\x00"


def test_request_header_null_client_id() -> None:
    frame = encode_request(m.ApiVersionsRequest(), 0, 1, None)
    assert frame == struct.pack(">ihhih", 10, 18, 0, 1, -1)
    header, reader = decode_request_header(frame[4:])
    assert header.client_id is None and reader.remaining == 0


def test_request_header_v2_tagged_fields_skipped() -> None:
    frame = bytearray(encode_request(m.ApiVersionsRequest("a", "b"), 3, 5, "c"))
    # give the header one tagged field (tag 7, 2 bytes); the size prefix is not read here
    at = 4 + 2 + 2 + 4 + 2 + 1
    assert frame[at] == 0
    frame[at : at + 1] = b"\x01\x07\x02zz"
    header, reader = decode_request_header(bytes(frame[4:]))
    assert decode_request_body(reader, header, m.ApiVersionsRequest) == m.ApiVersionsRequest("a", "b")


def test_encode_request_rejects_undeclared_version() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_request(produce_ours(), 2, 1, None)
    assert info.value.remote is False
    with pytest.raises(ProtocolError):
        encode_request(produce_ours(), 13, 1, None)


def test_response_header_v0_and_v1() -> None:
    resp = m.MetadataResponse(brokers=[m.MetadataResponseBroker(1, "h", 9092)], cluster_id="c", controller_id=1)
    v8 = encode_response(resp, 8, 77)
    assert v8[4:8] == struct.pack(">i", 77)
    assert v8[8:] == encode_struct(resp, 8, False)
    v9 = encode_response(resp, 9, 77)
    assert v9[4:9] == struct.pack(">i", 77) + b"\x00"
    assert v9[9:] == encode_struct(resp, 9, True)
    for frame, version in ((v8, 8), (v9, 9)):
        assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
        assert decode_response(frame[4:], m.MetadataResponse, version) == resp
    # a header v1 with a tagged field of its own
    with_tag = v9[4:8] + b"\x01\x03\x01\xff" + v9[9:]
    assert decode_response(with_tag, m.MetadataResponse, 9) == resp
    # reading a v1 header frame as v0 is caught by the trailing/garbled bytes
    with pytest.raises(ProtocolError):
        decode_response(v9[4:], m.MetadataResponse, 8)


def test_api_versions_response_header_is_always_v0() -> None:
    resp = m.ApiVersionsResponse(api_keys=[m.ApiVersionsResponseApiKey(18, 0, 4)])
    for version in (3, 4):
        frame = encode_response(resp, version, 5)
        assert frame[4:8] == b"\x00\x00\x00\x05"
        assert frame[8:] == encode_struct(resp, version, True)  # no header tagged-field byte
        assert decode_response(frame[4:], m.ApiVersionsResponse, version) == resp
    # kafka-python writes the same header
    ref = kp_api_versions_v3_obj()
    ref.with_header(correlation_id=5)
    ref_frame = bytes(ref.encode(header=True, framed=True))
    assert ref_frame[4:8] == b"\x00\x00\x00\x05"
    assert decode_response(ref_frame[4:], m.ApiVersionsResponse, 3).zk_migration_ready is True


def test_response_frames_from_kafka_python_with_header_v1() -> None:
    ref = kp_produce_v10_obj()
    ref.with_header(correlation_id=321)
    frame = bytes(ref.encode(header=True, framed=True))
    frames = FrameDecoder().feed(frame)
    assert len(frames) == 1 and peek_correlation_id(frames[0]) == 321
    decoded = decode_response(frames[0], m.ProduceResponse, 10)
    assert decoded.node_endpoints == [m.ProduceResponseNodeEndpoint(2, "h2", 9093, None)]


# --- FrameDecoder --------------------------------------------------------------------------------


def _frames(bodies: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(b)) + b for b in bodies)


BODIES = st.lists(st.binary(max_size=40), max_size=6)


@settings(max_examples=150, deadline=None)
@given(BODIES, st.data())
def test_frame_decoder_random_chunks(bodies: list[bytes], data: st.DataObject) -> None:
    stream = _frames(bodies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = FrameDecoder()
    got: list[bytes] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        got += decoder.feed(stream[start:cut])
        start = cut
    assert got == bodies
    assert decoder.buffered == 0


@settings(max_examples=60, deadline=None)
@given(BODIES)
def test_frame_decoder_whole_and_bytewise(bodies: list[bytes]) -> None:
    stream = _frames(bodies)
    assert FrameDecoder().feed(stream) == bodies
    decoder = FrameDecoder()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i : i + 1])
    assert got == bodies
    assert decoder.feed(b"") == []


@settings(max_examples=60, deadline=None)
@given(BODIES, st.binary(min_size=1, max_size=30))
def test_frame_decoder_trailing_partial_frame(bodies: list[bytes], tail: bytes) -> None:
    partial = _frames([tail])[: 4 + len(tail) - 1]  # one byte short
    decoder = FrameDecoder()
    assert decoder.feed(_frames(bodies) + partial) == bodies
    assert decoder.buffered == len(partial) - 4  # the size prefix has been consumed
    assert decoder.feed(tail[-1:]) == [tail]
    assert decoder.buffered == 0


def test_frame_decoder_empty_frames() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"\x00\x00\x00\x00") == [b""]
    assert decoder.feed(b"\x00\x00\x00\x00\x00\x00\x00\x01x\x00\x00\x00\x00") == [b"", b"x", b""]


def test_frame_decoder_rejects_bad_sizes() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\x80\x00\x00\x00")
    with pytest.raises(ProtocolError):
        FrameDecoder(max_frame_size=100).feed(struct.pack(">i", 101))
    assert FrameDecoder(max_frame_size=100).feed(struct.pack(">i", 100) + b"x" * 100) == [b"x" * 100]


def test_frame_decoder_does_not_allocate_claimed_size() -> None:
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        assert decoder.feed(struct.pack(">i", 200 * 1024 * 1024) + b"abc") == []
        for _ in range(100):
            assert decoder.feed(b"x" * 10) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
    assert decoder.buffered == 1003


def test_shuffled_stream_of_real_frames() -> None:
    """Several real response frames in one stream, cut at random places."""
    rng = random.Random(1234)
    responses = [(m.MetadataResponse(cluster_id=f"c{i}", controller_id=i), 12) for i in range(3)] + [
        (m.ProduceResponse(throttle_time_ms=i), 11) for i in range(3)
    ]
    stream = b"".join(encode_response(r, v, i) for i, (r, v) in enumerate(responses))
    decoder = FrameDecoder()
    frames: list[bytes] = []
    pos = 0
    while pos < len(stream):
        step = rng.randint(1, 17)
        frames += decoder.feed(stream[pos : pos + step])
        pos += step
    assert [peek_correlation_id(f) for f in frames] == list(range(6))
    for frame, (resp, version) in zip(frames, responses, strict=True):
        assert decode_response(frame, type(resp), version) == resp


def _offsets_with_metadata(metadata: str) -> m.TxnOffsetCommitRequest:
    partition = m.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=5, committed_metadata=metadata)
    topic = m.TxnOffsetCommitRequestTopic(name="t", partitions=[partition])
    return m.TxnOffsetCommitRequest(transactional_id="t", group_id="g", producer_id=1, producer_epoch=0, topics=[topic])


@pytest.mark.parametrize("version", [2, 3, 4])  # 2: a classic string; 3+: a compact one
def test_a_string_longer_than_kafka_reads_is_refused_at_every_version(version: int) -> None:
    # Compact strings went out at any length, though Kafka's parsers refuse more than 32,767
    # bytes (the broker drops the connection, the client retries until it times out).
    with pytest.raises(ProtocolError, match="too long"):
        encode_request(_offsets_with_metadata("x" * 40_000), version, 1, "c")
    encode_request(_offsets_with_metadata("x" * 32_767), version, 1, "c")


def test_a_field_the_version_lacks_is_refused_unless_it_keeps_its_default() -> None:
    # Left out silently, as for ignorable fields: OffsetFetch read unstable offsets, and
    # TxnOffsetCommit went without the KIP-447 generation and member id that fence zombies.
    with pytest.raises(UnsupportedVersionError, match="require_stable=True cannot be sent at version 6"):
        encode_request(m.OffsetFetchRequest(group_id="g", topics=None, require_stable=True), 6, 1, "c")
    encode_request(m.OffsetFetchRequest(group_id="g", topics=None), 6, 1, "c")
    fenced = _offsets_with_metadata("")
    fenced.generation_id, fenced.member_id = 7, "member-1"
    with pytest.raises(UnsupportedVersionError, match="generation_id=7"):
        encode_request(fenced, 2, 1, "c")
    encode_request(_offsets_with_metadata(""), 2, 1, "c")  # a group id alone goes to any version

"""Version negotiation (``aioprod.protocol.versions``): choosing versions and the ApiVersions fallback."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioprod.errors import ProtocolError, UnsupportedVersionError
from aioprod.protocol import messages as m
from aioprod.protocol import versions
from aioprod.protocol.framing import (
    FrameDecoder,
    encode_response,
)
from aioprod.protocol.schema import (
    Request,
)
from tests.protocol.references import (
    KPM,
    kp_api_versions_v3,
)

BROKER = {0: (0, 11), 3: (0, 12), 18: (0, 4), 22: (0, 5), 2: (0, 8), 19: (2, 7)}


def test_choose_version_picks_highest_common() -> None:
    assert versions.choose_version(m.ProduceRequest, BROKER) == 11
    assert versions.choose_version(m.MetadataRequest, BROKER) == 12
    assert versions.choose_version(m.ListOffsetsRequest, BROKER) == 8
    assert versions.choose_version(m.ProduceRequest, {0: (0, 5)}) == 5
    assert versions.choose_version(m.ProduceRequest, {0: (3, 3)}) == 3
    assert versions.choose_version(m.ProduceRequest, {0: (5, 40)}) == 11
    assert versions.choose_version(m.CreateTopicsRequest, BROKER) == 7


def test_choose_version_no_overlap() -> None:
    with pytest.raises(UnsupportedVersionError) as info:
        versions.choose_version(m.ProduceRequest, {0: (0, 2)})
    text = str(info.value)
    assert "Produce" in text and "3-11" in text and "0-2" in text
    with pytest.raises(UnsupportedVersionError, match="12-14"):
        versions.choose_version(m.ProduceRequest, {0: (12, 14)})
    with pytest.raises(UnsupportedVersionError, match="InitProducerId"):
        versions.choose_version(m.InitProducerIdRequest, {0: (0, 11)})


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(m.ALL_REQUESTS), st.integers(0, 20), st.integers(0, 20))
def test_choose_version_property(request_cls: type[Request], low: int, high: int) -> None:
    ceiling = versions.CLIENT_VERSION_CAPS.get(request_cls.API_KEY, request_cls.MAX_VERSION)
    for cap, top in (
        (None, ceiling),
        (request_cls.MAX_VERSION, request_cls.MAX_VERSION),
        (low, min(low, request_cls.MAX_VERSION)),
    ):
        common = [v for v in range(request_cls.MIN_VERSION, top + 1) if low <= v <= high]
        broker = {request_cls.API_KEY: (low, high)}
        if common:
            assert versions.choose_version(request_cls, broker, max_version=cap) == max(common)
        else:
            with pytest.raises(UnsupportedVersionError):
                versions.choose_version(request_cls, broker, max_version=cap)


def test_client_version_caps() -> None:
    """AddPartitionsToTxn v4+ is for brokers; EndTxn v5 needs transactions V2: opt-in only."""
    broker = {24: (0, 5), 26: (0, 5), 0: (0, 11)}
    assert versions.choose_version(m.AddPartitionsToTxnRequest, broker) == 3
    assert versions.choose_version(m.EndTxnRequest, broker) == 4
    assert versions.choose_version(m.EndTxnRequest, broker, max_version=5) == 5
    assert versions.choose_version(m.EndTxnRequest, broker, max_version=99) == 5
    assert versions.choose_version(m.ProduceRequest, broker, max_version=9) == 9
    with pytest.raises(UnsupportedVersionError, match=r"client supports 0-3, broker supports 4-5"):
        versions.choose_version(m.AddPartitionsToTxnRequest, {24: (4, 5)})
    for key, cap in versions.CLIENT_VERSION_CAPS.items():
        cls = {c.API_KEY: c for c in m.ALL_REQUESTS}[key]
        assert cls.MIN_VERSION <= cap < cls.MAX_VERSION


def _api_versions_frame(correlation_id: int, body: bytes) -> bytes:
    """A raw response frame as FrameDecoder yields it: correlation id, then the body."""
    return struct.pack(">i", correlation_id) + body


# What a Kafka >= 2.4 broker sends for an ApiVersions version it does not know: an
# ApiVersionsResponse v0 (header v0) with UNSUPPORTED_VERSION, listing its ApiVersions range.
UNSUPPORTED_V0_LISTING = bytes.fromhex("00000007 0023 00000001 0012 0000 0002")
# ... and what an older broker sends: no ApiVersions entry at all.
UNSUPPORTED_V0_EMPTY = bytes.fromhex("00000007 0023 00000000")


def test_api_versions_fallback_to_listed_version() -> None:
    frames = FrameDecoder().feed(struct.pack(">i", len(UNSUPPORTED_V0_LISTING)) + UNSUPPORTED_V0_LISTING)
    assert versions.read_api_versions_response(frames[0], 4) == 2
    assert versions.read_api_versions_response(UNSUPPORTED_V0_LISTING, 3) == 2


def test_api_versions_fallback_to_v0_without_listing() -> None:
    assert versions.read_api_versions_response(UNSUPPORTED_V0_EMPTY, 4) == 0
    assert versions.read_api_versions_response(UNSUPPORTED_V0_EMPTY, 1) == 0


def test_api_versions_fallback_never_retries_same_or_higher() -> None:
    claims_v9 = bytes.fromhex("00000007 0023 00000001 0012 0000 0009")
    assert versions.read_api_versions_response(claims_v9, 4) == 3
    assert versions.read_api_versions_response(claims_v9, 1) == 0
    with pytest.raises(UnsupportedVersionError):
        versions.read_api_versions_response(UNSUPPORTED_V0_EMPTY, 0)
    only_high = bytes.fromhex("00000007 0023 00000001 0012 0005 0009")
    with pytest.raises(UnsupportedVersionError, match="ApiVersions"):
        versions.read_api_versions_response(only_high, 4)


def test_api_versions_fallback_with_kafka_python_bytes() -> None:
    """The v0 error body as kafka-python's codec writes it."""
    r = KPM.ApiVersionsResponse
    body = bytes(r[0](error_code=35, api_keys=[r.ApiVersion(api_key=18, min_version=0, max_version=3)]).encode())
    assert versions.read_api_versions_response(_api_versions_frame(1, body), 4) == 3


def test_api_versions_fallback_at_sent_version_is_tolerated() -> None:
    """A broker that answers UNSUPPORTED_VERSION in the version we sent is understood too."""
    resp = m.ApiVersionsResponse(error_code=35, api_keys=[m.ApiVersionsResponseApiKey(18, 0, 3)])
    frame = encode_response(resp, 4, 9)[4:]
    assert versions.read_api_versions_response(frame, 4) == 3


# librdkafka's mock cluster answers ApiVersions v3/v4 with UNSUPPORTED_VERSION in a body
# that is not valid v0 (seen with confluent-kafka 2.16); read at the version sent it lists
# nothing, so the client falls back to v0, which the mock answers.
UNSUPPORTED_MOCK = bytes.fromhex("00000001 0023 01 0012 0000 0002 00000000")


def test_api_versions_mock_cluster_unsupported_falls_back_to_v0() -> None:
    assert versions.read_api_versions_response(UNSUPPORTED_MOCK, 4) == 0
    assert versions.read_api_versions_response(UNSUPPORTED_MOCK, 3) == 0


def test_api_versions_unreadable_unsupported_steps_down_one_version() -> None:
    truncated = bytes.fromhex("00000001 0023 00")
    assert versions.read_api_versions_response(truncated, 3) == 2
    assert versions.read_api_versions_response(truncated, 1) == 0
    with pytest.raises(UnsupportedVersionError):
        versions.read_api_versions_response(truncated, 0)


def test_api_versions_success() -> None:
    resp = m.ApiVersionsResponse(
        api_keys=[m.ApiVersionsResponseApiKey(k, lo, hi) for k, (lo, hi) in sorted(BROKER.items())],
        throttle_time_ms=3,
        finalized_features_epoch=4,
    )
    for version in range(5):
        expected = dataclasses.replace(resp, finalized_features_epoch=4 if version >= 3 else -1)
        if version == 0:
            expected.throttle_time_ms = 0
        outcome = versions.read_api_versions_response(encode_response(resp, version, 1)[4:], version)
        assert outcome == expected
        assert isinstance(outcome, m.ApiVersionsResponse)
        assert versions.broker_versions(outcome) == BROKER
    # the same negotiation with kafka-python's bytes
    outcome = versions.read_api_versions_response(_api_versions_frame(1, kp_api_versions_v3()), 3)
    assert isinstance(outcome, m.ApiVersionsResponse)
    assert versions.choose_version(m.ProduceRequest, versions.broker_versions(outcome)) == 11


def test_api_versions_other_errors_are_returned() -> None:
    resp = m.ApiVersionsResponse(error_code=42)  # INVALID_REQUEST, sent at the request's version
    outcome = versions.read_api_versions_response(encode_response(resp, 3, 1)[4:], 3)
    assert outcome == resp
    # and an error body in v0 form is read too, as the Java client does
    outcome = versions.read_api_versions_response(_api_versions_frame(1, bytes.fromhex("002a00000000")), 3)
    assert outcome == m.ApiVersionsResponse(error_code=42)


def test_api_versions_malformed() -> None:
    for frame in (b"", b"\x00\x00\x00\x01", b"\x00\x00\x00\x01\x00"):
        with pytest.raises(ProtocolError):
            versions.read_api_versions_response(frame, 3)
    with pytest.raises(ValueError):
        versions.read_api_versions_response(UNSUPPORTED_V0_LISTING, 5)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 4))
def test_api_versions_random_bytes(blob: bytes, version: int) -> None:
    try:
        outcome = versions.read_api_versions_response(blob, version)
    except (ProtocolError, UnsupportedVersionError):
        return
    assert isinstance(outcome, m.ApiVersionsResponse) or 0 <= outcome < version


def test_fallback_loop_terminates() -> None:
    """Driving the fallback like a connection does reaches a version the broker accepts."""
    broker_max = 1

    def broker(sent: int) -> bytes:
        if sent > broker_max:
            return UNSUPPORTED_V0_EMPTY
        ok = m.ApiVersionsResponse(api_keys=[m.ApiVersionsResponseApiKey(18, 0, broker_max)])
        return encode_response(ok, sent, 7)[4:]

    version = m.ApiVersionsRequest.MAX_VERSION
    for _ in range(10):
        outcome = versions.read_api_versions_response(broker(version), version)
        if isinstance(outcome, m.ApiVersionsResponse):
            break
        assert outcome < version
        version = outcome
    assert version == 0  # no listing: straight to v0, as the Java client does
    assert isinstance(outcome, m.ApiVersionsResponse)

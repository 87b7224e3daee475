"""Transactions v2 (KIP-890 part 2, Apache Kafka 4.0) against exact bytes from the specs.

No broker these tests can start speaks transactions v2 (Tansu and librdkafka's mock cluster
finalize no ``transaction.version``), so the wire forms are checked byte for byte here,
written out by hand from the JSON specs: EndTxn v5 (EndTxnRequest.json/EndTxnResponse.json:
"Version 5 enables bumping epoch on every transaction ... producer ID and epoch are included
in the response"), Produce v12 and TxnOffsetCommit v5 ("the same as" v11 and v4), and the
ApiVersions v3+ finalized feature that turns v2 on.
"""

from __future__ import annotations

import struct

from aioprod.protocol import messages as m
from aioprod.protocol import versions
from aioprod.protocol.framing import decode_response, encode_request


def body(frame: bytes) -> bytes:
    """A request frame without its size prefix and request header v2 (client id "c")."""
    size = struct.unpack(">i", frame[:4])[0]
    assert size == len(frame) - 4
    header = frame[4:]
    # api_key, api_version, correlation_id, client_id ("c": int16 length 1 + 1 byte), no tags
    assert header[8:11] == b"\x00\x01c" and header[11] == 0
    return header[12:]


def test_end_txn_v5_request_bytes() -> None:
    request = m.EndTxnRequest(transactional_id="tx", producer_id=0x0102030405060708, producer_epoch=3, committed=True)
    frame = encode_request(request, 5, 7, "c")
    assert frame[4:12] == struct.pack(">hhi", 26, 5, 7)
    # TransactionalId compact string (length+1 = 3), ProducerId int64, ProducerEpoch int16,
    # Committed bool, no tagged fields.
    assert body(frame) == b"\x03tx" + bytes.fromhex("0102030405060708") + b"\x00\x03" + b"\x01" + b"\x00"


def test_end_txn_v5_response_carries_the_bumped_epoch() -> None:
    # Response header v1 (correlation id, no tags); ThrottleTimeMs, ErrorCode, ProducerId,
    # ProducerEpoch, no tags.
    frame = struct.pack(">i", 7) + b"\x00" + struct.pack(">ihqh", 0, 0, 4242, 8) + b"\x00"
    response = decode_response(frame, m.EndTxnResponse, 5)
    assert (response.error_code, response.producer_id, response.producer_epoch) == (0, 4242, 8)
    # Version 4 has neither field: the defaults say "not given".
    v4 = decode_response(struct.pack(">i", 7) + b"\x00" + struct.pack(">ih", 0, 0) + b"\x00", m.EndTxnResponse, 4)
    assert (v4.producer_id, v4.producer_epoch) == (-1, -1)


def test_produce_v12_and_txn_offset_commit_v5_are_their_previous_versions_renumbered() -> None:
    produce = m.ProduceRequest(
        transactional_id="tx",
        acks=-1,
        timeout_ms=1000,
        topic_data=[m.ProduceRequestTopic("t", [m.ProduceRequestPartition(0, b"batch")])],
    )
    commit = m.TxnOffsetCommitRequest(
        transactional_id="tx",
        group_id="g",
        producer_id=1,
        producer_epoch=0,
        generation_id=5,
        member_id="m",
        group_instance_id=None,
        topics=[m.TxnOffsetCommitRequestTopic("t", [m.TxnOffsetCommitRequestPartition(0, 42, -1, None)])],
    )
    for request, new, old in ((produce, 12, 11), (commit, 5, 4)):
        newer, older = encode_request(request, new, 9, "c"), encode_request(request, old, 9, "c")
        assert newer[6:8] == struct.pack(">h", new) and older[6:8] == struct.pack(">h", old)
        assert newer[:6] + newer[8:] == older[:6] + older[8:]


def test_transactions_v2_versions_are_used_only_when_asked_for() -> None:
    broker = {
        m.ProduceRequest.API_KEY: (3, 12),
        m.EndTxnRequest.API_KEY: (0, 5),
        m.TxnOffsetCommitRequest.API_KEY: (0, 5),
    }
    assert versions.choose_version(m.ProduceRequest, broker) == 11
    assert versions.choose_version(m.EndTxnRequest, broker) == 4
    assert versions.choose_version(m.TxnOffsetCommitRequest, broker) == 4
    for cls in (m.ProduceRequest, m.EndTxnRequest, m.TxnOffsetCommitRequest):
        ceiling = versions.TRANSACTIONS_V2_VERSIONS[cls.API_KEY]
        assert versions.choose_version(cls, broker, max_version=ceiling) == ceiling


def test_the_finalized_transaction_version_feature_is_read_from_api_versions() -> None:
    # ApiVersionsResponse v3 (header v0): ErrorCode, ApiKeys (one: Produce 3-12), ThrottleTimeMs,
    # then tagged fields: tag 1 FinalizedFeaturesEpoch int64, tag 2 FinalizedFeatures
    # [("transaction.version", max 2, min 2)].
    api_keys = b"\x02" + struct.pack(">hhh", 0, 3, 12) + b"\x00"
    feature = b"\x14transaction.version" + struct.pack(">hh", 2, 2) + b"\x00"
    features = b"\x02" + feature
    tags = b"\x02" + b"\x01\x08" + struct.pack(">q", 1) + b"\x02" + bytes([len(features)]) + features
    frame = struct.pack(">i", 1) + struct.pack(">h", 0) + api_keys + struct.pack(">i", 0) + tags
    response = decode_response(frame, m.ApiVersionsResponse, 3)
    assert [(f.name, f.max_version_level) for f in response.finalized_features] == [("transaction.version", 2)]
    assert response.finalized_features_epoch == 1

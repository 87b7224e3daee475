"""The declared messages (``aioprod.protocol.messages``).

* Round trips of every declared message at every version, with values generated from the
  schema itself (so new messages are covered without new code), through the bare body
  codec and through whole frames.
* A differential check of every one of those encodings against kafka-python's
  independent, JSON-driven codec, and golden bytes against aiokafka's and kafka-python's
  hand-written protocol classes, in both directions.
* Annotations and defaults of the declared dataclasses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.protocol import admin as aio_admin
from aiokafka.protocol import coordination as aio_coordination
from aiokafka.protocol import metadata as aio_metadata
from aiokafka.protocol import offset as aio_offset
from aiokafka.protocol import produce as aio_produce
from aiokafka.protocol import transaction as aio_transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol import admin as kp_admin
from kafka.protocol import consumer as kp_consumer
from kafka.protocol import metadata as kp_metadata
from kafka.protocol import producer as kp_producer
from kafka.protocol import sasl as kp_sasl

from aioprod.errors import UnsupportedVersionError
from aioprod.protocol import messages as m
from aioprod.protocol.framing import (
    FrameDecoder,
    decode_request_body,
    decode_request_header,
    decode_response,
    encode_request,
    encode_response,
    peek_correlation_id,
)
from aioprod.protocol.schema import (
    Array,
    FieldSpec,
    Message,
    Request,
    Response,
    Struct,
    StructType,
    WireType,
    decode_struct,
    encode_struct,
)
from tests.protocol.references import (
    KP,
    KPM,
    kp_api_versions_v3,
    kp_produce_v10_obj,
    produce_kp_obj,
    produce_ours,
)
from tests.protocol.strategies import (
    CASES,
    MESSAGE_CLASSES,
    NEW_LAYOUT_CASES,
    REPEATED_LAYOUT_CASES,
    at_version,
    case_id,
    message_strategy,
)

# --- kafka-python's independent codec -----------------------------------------------------------

_KP_MODULES = (kp_metadata, kp_producer, kp_admin, kp_consumer, kp_sasl)


def kp_class(cls: type[Message]) -> Any:
    for module in _KP_MODULES:
        found = getattr(module, cls.__name__, None)
        if found is not None:
            return found
    raise AssertionError(f"kafka-python has no {cls.__name__}")


def kp_reencode(cls: type[Message], version: int, body: bytes) -> bytes:
    """Decode ``body`` with kafka-python and encode the result again with kafka-python."""
    decoded = kp_class(cls).decode(body, version=version)
    return bytes(decoded.encode())


# --- round trips and the differential check ----------------------------------------------------

ROUND_TRIP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("case", NEW_LAYOUT_CASES, ids=case_id)
@ROUND_TRIP
@given(data=st.data())
def test_round_trip(case: tuple[type[Message], int], data: st.DataObject) -> None:
    round_trip(case, data)


@pytest.mark.parametrize("case", REPEATED_LAYOUT_CASES, ids=case_id)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_at_a_version_laid_out_as_an_earlier_one(
    case: tuple[type[Message], int], data: st.DataObject
) -> None:
    """Half the versions encode as an earlier version of their message does (test_round_trip's
    25 examples of it): a few examples check what the version number changes, the frame's
    header and kafka-python's reading at that version, at a fifth of the time."""
    round_trip(case, data)


def test_every_version_of_every_message_is_round_tripped() -> None:
    assert sorted(NEW_LAYOUT_CASES + REPEATED_LAYOUT_CASES, key=case_id) == sorted(CASES, key=case_id)
    assert len(NEW_LAYOUT_CASES) > len(MESSAGE_CLASSES)  # layouts do change across versions


def round_trip(case: tuple[type[Message], int], data: st.DataObject) -> None:
    cls, version = case
    flexible = cls.is_flexible(version)
    obj = data.draw(message_strategy(cls, version), label="message")
    body = encode_struct(obj, version, flexible)
    assert decode_struct(cls, body, version, flexible) == obj

    correlation_id = data.draw(st.integers(0, (1 << 31) - 1), label="correlation_id")
    decoder = FrameDecoder()
    if isinstance(obj, Request):
        client_id = data.draw(st.none() | st.text(max_size=8), label="client_id")
        frames = decoder.feed(encode_request(obj, version, correlation_id, client_id))
        assert len(frames) == 1
        header, reader = decode_request_header(frames[0])
        assert (header.api_key, header.api_version) == (cls.API_KEY, version)
        assert (header.correlation_id, header.client_id) == (correlation_id, client_id)
        assert decode_request_body(reader, header, type(obj)) == obj
    else:
        assert isinstance(obj, Response)
        frames = decoder.feed(encode_response(obj, version, correlation_id))
        assert len(frames) == 1
        assert peek_correlation_id(frames[0]) == correlation_id
        assert decode_response(frames[0], cls, version) == obj
    assert decoder.buffered == 0

    # kafka-python reads our bytes and writes exactly the same bytes back.
    if cls is m.ApiVersionsResponse and obj.error_code != 0 and version > 0:
        return  # kafka-python always decodes an ApiVersions error response as v0
    assert kp_reencode(cls, version, body) == body


def test_strategies_cover_every_field() -> None:
    """Each declared field of each message is generated in at least one declared version."""
    for cls in MESSAGE_CLASSES:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec: FieldSpec = f.metadata["kafka"]
            assert any(v in spec.versions for v in range(cls.MIN_VERSION, cls.MAX_VERSION + 1)), (
                f"{cls.__name__}.{f.name} exists in no declared version"
            )


_PY_TYPES = {
    "int8": "int",
    "int16": "int",
    "uint16": "int",
    "int32": "int",
    "int64": "int",
    "float64": "float",
    "bool": "bool",
    "string": "str",
    "bytes": "bytes",
    "records": "bytes",
    "uuid": "uuid.UUID",
}


def _python_type(wire: WireType) -> str:
    if isinstance(wire, Array):
        return f"list[{_python_type(wire.item)}]"
    if isinstance(wire, StructType):
        return wire.cls.__name__
    return _PY_TYPES[wire.name]


def _all_structs() -> set[type[Struct]]:
    seen: set[type[Struct]] = set()
    todo: list[type[Struct]] = list(MESSAGE_CLASSES)
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            wire = f.metadata["kafka"].type
            item = wire.item if isinstance(wire, Array) else wire
            if isinstance(item, StructType):
                todo.append(item.cls)
    return seen


def test_annotations_match_wire_types() -> None:
    for cls in _all_structs():
        assert dataclasses.is_dataclass(cls) and hasattr(cls, "__slots__"), cls
        assert getattr(m, cls.__name__) is cls, f"{cls.__name__} is not a public name of messages"
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec: FieldSpec = f.metadata["kafka"]
            expected = _python_type(spec.type)
            if spec.nullable.low <= spec.nullable.high:
                expected += " | None"
            assert f.type == expected, f"{cls.__name__}.{f.name}: annotated {f.type}, wire says {expected}"


def test_defaults_are_fresh_and_valid() -> None:
    for cls in _all_structs():
        a, b = cls(), cls()
        assert a == b
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            value = getattr(a, f.name)
            if isinstance(value, list):
                assert value is not getattr(b, f.name), f"{cls.__name__}.{f.name} shares its default list"


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda c: c.__name__)
def test_default_instance_encodes_at_every_version(cls: type[Message]) -> None:
    for version in range(cls.MIN_VERSION, cls.MAX_VERSION + 1):
        flexible = cls.is_flexible(version)
        body = encode_struct(cls(), version, flexible)
        assert decode_struct(cls, body, version, flexible) == cls()
        assert kp_reencode(cls, version, body) == body


# --- golden bytes: requests against aiokafka's and kafka-python's classes ---------------------


def _produce_aiokafka(version: int) -> bytes:
    cls = getattr(aio_produce, f"ProduceRequest_v{version}")
    return bytes(cls("txn", -1, 30000, [("alpha", [(0, b"batch-0"), (3, None)]), ("beta", [])]).encode())


def _produce_kp(version: int) -> bytes:
    return bytes(produce_kp_obj(version).encode())


def _metadata_ours(version: int, topics: list[str] | None) -> m.MetadataRequest:
    return m.MetadataRequest(
        topics=None if topics is None else [m.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=version < 4,  # v1-3 cannot say False (broker-side auto-creation)
        include_topic_authorized_operations=version >= 8,
    )


def _metadata_aiokafka(version: int, topics: list[str] | None) -> bytes:
    cls = getattr(aio_metadata, f"MetadataRequest_v{version}")
    args: list[Any] = [topics]
    if version >= 4:
        args.append(False)
    return bytes(cls(*args).encode())


def _metadata_kp(version: int, topics: list[str] | None) -> bytes:
    t = KPM.MetadataRequest.MetadataRequestTopic
    req = KPM.MetadataRequest[version](
        topics=None if topics is None else [t(name=n) for n in topics],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=version >= 8,
    )
    return bytes(req.encode())


GOLDEN_REQUESTS: list[tuple[str, Request, int, Callable[[], bytes]]] = []
for _v in range(3, 8):
    GOLDEN_REQUESTS.append(("produce-aiokafka", produce_ours(), _v, lambda v=_v: _produce_aiokafka(v)))
for _v in range(3, 12):
    GOLDEN_REQUESTS.append(("produce-kafka-python", produce_ours(), _v, lambda v=_v: _produce_kp(v)))
for _v in range(1, 6):
    for _topics in (None, [], ["a", "topic-β"]):
        GOLDEN_REQUESTS.append(
            (
                f"metadata-aiokafka-{_topics}",
                _metadata_ours(_v, _topics),
                _v,
                lambda v=_v, t=_topics: _metadata_aiokafka(v, t),
            )
        )
for _v in range(1, 13):
    GOLDEN_REQUESTS.append(
        (
            "metadata-kafka-python",
            _metadata_ours(_v, ["a", "b"]),
            _v,
            lambda v=_v: _metadata_kp(v, ["a", "b"]),
        )
    )
for _v in range(3):
    GOLDEN_REQUESTS.append(
        (
            "api-versions-aiokafka",
            m.ApiVersionsRequest(),
            _v,
            lambda v=_v: bytes(getattr(aio_admin, f"ApiVersionRequest_v{v}")().encode()),
        )
    )
for _v in (3, 4):
    GOLDEN_REQUESTS.append(
        (
            "api-versions-kafka-python",
            m.ApiVersionsRequest(client_software_name="aioprod", client_software_version="0.1.0"),
            _v,
            lambda v=_v: bytes(
                KPM.ApiVersionsRequest[v](client_software_name="aioprod", client_software_version="0.1.0").encode()
            ),
        )
    )
_CREATE = m.CreateTopicsRequest(
    topics=[
        m.CreateTopicsRequestTopic(
            "new-topic",
            -1,
            -1,
            [m.CreateTopicsRequestAssignment(0, [1, 2]), m.CreateTopicsRequestAssignment(1, [2, 3])],
            [
                m.CreateTopicsRequestConfig("cleanup.policy", "compact"),
                m.CreateTopicsRequestConfig("x", None),
            ],
        )
    ],
    timeout_ms=5000,
    validate_only=True,
)
for _v in (2, 3):
    GOLDEN_REQUESTS.append(
        (
            "create-topics-aiokafka",
            _CREATE,
            _v,
            lambda v=_v: bytes(
                getattr(aio_admin, f"CreateTopicsRequest_v{v}")(
                    [
                        (
                            "new-topic",
                            -1,
                            -1,
                            [(0, [1, 2]), (1, [2, 3])],
                            [("cleanup.policy", "compact"), ("x", None)],
                        )
                    ],
                    5000,
                    True,
                ).encode()
            ),
        )
    )
GOLDEN_REQUESTS += [
    (
        "init-producer-id-aiokafka",
        m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000),
        0,
        lambda: bytes(aio_transaction.InitProducerIdRequest_v0(None, 60000).encode()),
    ),
    (
        "init-producer-id-kafka-python",
        m.InitProducerIdRequest(transactional_id="t", transaction_timeout_ms=60000, producer_id=7, producer_epoch=2),
        4,
        lambda: bytes(
            KP.InitProducerIdRequest[4](
                transactional_id="t", transaction_timeout_ms=60000, producer_id=7, producer_epoch=2
            ).encode()
        ),
    ),
    (
        "add-partitions-aiokafka",
        m.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="t",
            v3_and_below_producer_id=1 << 40,
            v3_and_below_producer_epoch=3,
            v3_and_below_topics=[m.AddPartitionsToTxnRequestTopic("a", [0, 1, 2])],
        ),
        0,
        lambda: bytes(aio_transaction.AddPartitionsToTxnRequest_v0("t", 1 << 40, 3, [("a", [0, 1, 2])]).encode()),
    ),
    (
        "add-offsets-aiokafka",
        m.AddOffsetsToTxnRequest("t", 5, 1, "group"),
        0,
        lambda: bytes(aio_transaction.AddOffsetsToTxnRequest_v0("t", 5, 1, "group").encode()),
    ),
    (
        "end-txn-aiokafka",
        m.EndTxnRequest("t", 5, 1, True),
        0,
        lambda: bytes(aio_transaction.EndTxnRequest_v0("t", 5, 1, True).encode()),
    ),
    (
        "txn-offset-commit-aiokafka",
        m.TxnOffsetCommitRequest(
            transactional_id="t",
            group_id="g",
            producer_id=5,
            producer_epoch=1,
            topics=[m.TxnOffsetCommitRequestTopic("a", [m.TxnOffsetCommitRequestPartition(0, 42, -1, "meta")])],
        ),
        0,
        lambda: bytes(aio_transaction.TxnOffsetCommitRequest_v0("t", "g", 5, 1, [("a", [(0, 42, "meta")])]).encode()),
    ),
    (
        "find-coordinator-aiokafka-v0",
        m.FindCoordinatorRequest(key="group"),
        0,
        lambda: bytes(aio_coordination.FindCoordinatorRequest_v0("group").encode()),
    ),
    (
        "find-coordinator-aiokafka-v1",
        m.FindCoordinatorRequest(key="txn", key_type=1),
        1,
        lambda: bytes(aio_coordination.FindCoordinatorRequest_v1("txn", 1).encode()),
    ),
    (
        "find-coordinator-kafka-python-v4",
        m.FindCoordinatorRequest(key_type=1, coordinator_keys=["t1", "t2"]),
        4,
        lambda: bytes(KPM.FindCoordinatorRequest[4](key_type=1, coordinator_keys=["t1", "t2"]).encode()),
    ),
    (
        "list-offsets-aiokafka-v1",
        m.ListOffsetsRequest(
            replica_id=-1,
            topics=[m.ListOffsetsRequestTopic("a", [m.ListOffsetsRequestPartition(0, timestamp=-1)])],
        ),
        1,
        lambda: bytes(aio_offset.OffsetRequest_v1(-1, [("a", [(0, -1)])]).encode()),
    ),
    (
        "list-offsets-aiokafka-v2",
        m.ListOffsetsRequest(
            replica_id=-1,
            isolation_level=1,
            topics=[m.ListOffsetsRequestTopic("a", [m.ListOffsetsRequestPartition(2, timestamp=-2)])],
        ),
        2,
        lambda: bytes(aio_offset.OffsetRequest_v2(-1, 1, [("a", [(2, -2)])]).encode()),
    ),
    (
        "sasl-handshake-aiokafka",
        m.SaslHandshakeRequest("SCRAM-SHA-512"),
        1,
        lambda: bytes(aio_admin.SaslHandShakeRequest_v1("SCRAM-SHA-512").encode()),
    ),
    (
        "sasl-authenticate-aiokafka",
        m.SaslAuthenticateRequest(b"\x00user\x00pass"),
        1,
        lambda: bytes(aio_admin.SaslAuthenticateRequest_v1(b"\x00user\x00pass").encode()),
    ),
    (
        "sasl-authenticate-kafka-python-v2",
        m.SaslAuthenticateRequest(b"\x00user\x00pass"),
        2,
        lambda: bytes(kp_sasl.SaslAuthenticateRequest[2](auth_bytes=b"\x00user\x00pass").encode()),
    ),
]


@pytest.mark.parametrize(
    ("name", "ours", "version", "reference"),
    GOLDEN_REQUESTS,
    ids=[f"{g[0]}-v{g[2]}" for g in GOLDEN_REQUESTS],
)
def test_golden_request_bytes(name: str, ours: Request, version: int, reference: Callable[[], bytes]) -> None:
    expected = reference()
    assert encode_struct(ours, version, type(ours).is_flexible(version)) == expected
    # and the reference bytes decode back into the same object with ours
    assert decode_struct(type(ours), expected, version, type(ours).is_flexible(version)) == at_version(ours, version)


def test_golden_produce_v9_literal() -> None:
    """ProduceRequest v9 spelled out byte by byte (compact encodings, tagged-field bytes)."""
    req = m.ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=1000,
        topic_data=[m.ProduceRequestTopic("t", [m.ProduceRequestPartition(0, b"abc")])],
    )
    expected = bytes.fromhex(
        "00"  # transactional_id: compact null
        "0001"  # acks
        "000003e8"  # timeout_ms
        "02"  # 1 topic
        "0274"  # name "t"
        "02"  # 1 partition
        "00000000"  # index
        "04616263"  # records: compact bytes "abc"
        "00"  # partition tagged fields
        "00"  # topic tagged fields
        "00"  # request tagged fields
    )
    assert encode_struct(req, 9, True) == expected


# --- golden bytes: responses encoded by others, decoded by us -----------------------------------


def _aio(module: Any, name: str, *args: Any) -> bytes:
    return bytes(getattr(module, name)(*args).encode())


GOLDEN_RESPONSES: list[tuple[str, type[Response], int, Callable[[], bytes], Response]] = [
    (
        "produce-v5",
        m.ProduceResponse,
        5,
        lambda: _aio(aio_produce, "ProduceResponse_v5", [("a", [(0, 0, 100, -1, 7), (1, 6, -1, -1, -1)])], 10),
        m.ProduceResponse(
            responses=[
                m.ProduceResponseTopic(
                    "a",
                    [
                        m.ProduceResponsePartition(0, 0, 100, -1, 7),
                        m.ProduceResponsePartition(1, 6, -1, -1, -1),
                    ],
                )
            ],
            throttle_time_ms=10,
        ),
    ),
    (
        "produce-v8",
        m.ProduceResponse,
        8,
        lambda: _aio(
            aio_produce,
            "ProduceResponse_v8",
            [("a", [(0, 87, -1, -1, 0, [(3, "bad"), (4, None)], "invalid")])],
            0,
        ),
        m.ProduceResponse(
            responses=[
                m.ProduceResponseTopic(
                    "a",
                    [
                        m.ProduceResponsePartition(
                            0,
                            87,
                            -1,
                            -1,
                            0,
                            [
                                m.ProduceResponseBatchIndexError(3, "bad"),
                                m.ProduceResponseBatchIndexError(4, None),
                            ],
                            "invalid",
                        )
                    ],
                )
            ],
        ),
    ),
    (
        "metadata-v5",
        m.MetadataResponse,
        5,
        lambda: _aio(
            aio_metadata,
            "MetadataResponse_v5",
            0,
            [(1, "h1", 9092, None), (2, "h2", 9093, "rack-b")],
            "cluster",
            2,
            [(0, "a", False, [(0, 0, 1, [1, 2], [1], [2])]), (3, "gone", False, [])],
        ),
        m.MetadataResponse(
            brokers=[
                m.MetadataResponseBroker(1, "h1", 9092, None),
                m.MetadataResponseBroker(2, "h2", 9093, "rack-b"),
            ],
            cluster_id="cluster",
            controller_id=2,
            topics=[
                m.MetadataResponseTopic(
                    0, "a", partitions=[m.MetadataResponsePartition(0, 0, 1, -1, [1, 2], [1], [2])]
                ),
                m.MetadataResponseTopic(3, "gone"),
            ],
        ),
    ),
    (
        "api-versions-v0",
        m.ApiVersionsResponse,
        0,
        lambda: _aio(aio_admin, "ApiVersionResponse_v0", 0, [(0, 0, 11), (18, 0, 4)]),
        m.ApiVersionsResponse(api_keys=[m.ApiVersionsResponseApiKey(0, 0, 11), m.ApiVersionsResponseApiKey(18, 0, 4)]),
    ),
    (
        "api-versions-v2",
        m.ApiVersionsResponse,
        2,
        lambda: _aio(aio_admin, "ApiVersionResponse_v2", 0, [(3, 0, 12)], 25),
        m.ApiVersionsResponse(api_keys=[m.ApiVersionsResponseApiKey(3, 0, 12)], throttle_time_ms=25),
    ),
    (
        "init-producer-id-v0",
        m.InitProducerIdResponse,
        0,
        lambda: _aio(aio_transaction, "InitProducerIdResponse_v0", 0, 0, 4000, 3),
        m.InitProducerIdResponse(producer_id=4000, producer_epoch=3),
    ),
    (
        "add-partitions-v0",
        m.AddPartitionsToTxnResponse,
        0,
        lambda: _aio(aio_transaction, "AddPartitionsToTxnResponse_v0", 0, [("a", [(0, 0), (1, 48)])]),
        m.AddPartitionsToTxnResponse(
            results_by_topic_v3_and_below=[
                m.AddPartitionsToTxnResponseTopicResult(
                    "a",
                    [
                        m.AddPartitionsToTxnResponsePartitionResult(0, 0),
                        m.AddPartitionsToTxnResponsePartitionResult(1, 48),
                    ],
                )
            ]
        ),
    ),
    (
        "end-txn-v0",
        m.EndTxnResponse,
        0,
        lambda: _aio(aio_transaction, "EndTxnResponse_v0", 5, 47),
        m.EndTxnResponse(throttle_time_ms=5, error_code=47),
    ),
    (
        "find-coordinator-v1",
        m.FindCoordinatorResponse,
        1,
        lambda: _aio(aio_coordination, "FindCoordinatorResponse_v1", 0, 15, None, -1, "", -1),
        m.FindCoordinatorResponse(error_code=15, error_message=None, node_id=-1, host="", port=-1),
    ),
    (
        "create-topics-v3",
        m.CreateTopicsResponse,
        3,
        lambda: _aio(aio_admin, "CreateTopicsResponse_v3", 0, [("t", 36, "exists"), ("u", 0, None)]),
        m.CreateTopicsResponse(
            topics=[
                m.CreateTopicsResponseTopic("t", error_code=36, error_message="exists"),
                m.CreateTopicsResponseTopic("u", error_code=0, error_message=None),
            ]
        ),
    ),
    (
        "list-offsets-v4",
        m.ListOffsetsResponse,
        4,
        lambda: _aio(aio_offset, "OffsetResponse_v4", 0, [("a", [(0, 0, -1, 42, 3)])]),
        m.ListOffsetsResponse(
            topics=[m.ListOffsetsResponseTopic("a", [m.ListOffsetsResponsePartition(0, 0, -1, 42, 3)])]
        ),
    ),
    (
        "sasl-handshake-v1",
        m.SaslHandshakeResponse,
        1,
        lambda: _aio(aio_admin, "SaslHandShakeResponse_v1", 0, ["PLAIN", "SCRAM-SHA-256"]),
        m.SaslHandshakeResponse(0, ["PLAIN", "SCRAM-SHA-256"]),
    ),
    (
        "sasl-authenticate-v1",
        m.SaslAuthenticateResponse,
        1,
        lambda: _aio(aio_admin, "SaslAuthenticateResponse_v1", 0, None, b"server-final", 3600000),
        m.SaslAuthenticateResponse(0, None, b"server-final", 3600000),
    ),
    (
        "txn-offset-commit-v0",
        m.TxnOffsetCommitResponse,
        0,
        lambda: _aio(aio_transaction, "TxnOffsetCommitResponse_v0", 0, [("a", [(0, 0), (1, 22)])]),
        m.TxnOffsetCommitResponse(
            topics=[
                m.TxnOffsetCommitResponseTopic(
                    "a", [m.TxnOffsetCommitResponsePartition(0, 0), m.TxnOffsetCommitResponsePartition(1, 22)]
                )
            ]
        ),
    ),
]


def _kp_produce_v10() -> bytes:
    return bytes(kp_produce_v10_obj().encode())


GOLDEN_RESPONSES += [
    (
        "produce-v10-tagged",
        m.ProduceResponse,
        10,
        _kp_produce_v10,
        m.ProduceResponse(
            responses=[
                m.ProduceResponseTopic(
                    "a",
                    [
                        m.ProduceResponsePartition(0, 6, -1, current_leader=m.ProduceResponseLeaderIdAndEpoch(2, 9)),
                        m.ProduceResponsePartition(1, 0, 5),
                    ],
                )
            ],
            node_endpoints=[m.ProduceResponseNodeEndpoint(2, "h2", 9093, None)],
        ),
    ),
    (
        "api-versions-v3-tagged",
        m.ApiVersionsResponse,
        3,
        kp_api_versions_v3,
        m.ApiVersionsResponse(
            api_keys=[m.ApiVersionsResponseApiKey(0, 3, 11)],
            supported_features=[m.ApiVersionsResponseSupportedFeature("metadata.version", 1, 20)],
            finalized_features_epoch=7,
            finalized_features=[m.ApiVersionsResponseFinalizedFeature("metadata.version", 20, 20)],
            zk_migration_ready=True,
        ),
    ),
]


@pytest.mark.parametrize(
    ("name", "cls", "version", "reference", "expected"),
    GOLDEN_RESPONSES,
    ids=[g[0] for g in GOLDEN_RESPONSES],
)
def test_golden_response_decode(
    name: str, cls: type[Response], version: int, reference: Callable[[], bytes], expected: Response
) -> None:
    body = reference()
    flexible = cls.is_flexible(version)
    assert decode_struct(cls, body, version, flexible) == expected
    assert encode_struct(expected, version, flexible) == body


def test_credentials_are_not_in_a_sasl_request_repr() -> None:
    # A request's repr reaches logs and tracebacks (a request that failed to encode, a debugger).
    request = m.SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00s3cret")
    assert "s3cret" not in repr(request)
    assert request.auth_bytes.endswith(b"s3cret")


@pytest.mark.parametrize(
    ("request_obj", "version"),
    [
        # allow_auto_topic_creation=False lost: the broker auto-created the topic (Metadata < v4).
        (m.MetadataRequest(topics=[m.MetadataRequestTopic(name="t")], allow_auto_topic_creation=False), 3),
        # A transaction coordinator lookup became a group coordinator lookup (FindCoordinator v0).
        (m.FindCoordinatorRequest(key="txn", key_type=1, coordinator_keys=["txn"]), 0),
        # KIP-360's epoch bump became a request for a new producer id (InitProducerId < v3).
        (
            m.InitProducerIdRequest(
                transactional_id="txn", transaction_timeout_ms=60000, producer_id=7, producer_epoch=3
            ),
            2,
        ),
        # read_committed became read_uncommitted (ListOffsets v1).
        (m.ListOffsetsRequest(replica_id=-1, isolation_level=1, topics=[]), 1),
    ],
    ids=lambda x: f"v{x}" if isinstance(x, int) else type(x).__name__,
)
def test_a_set_field_the_version_cannot_carry_is_refused_not_dropped(request_obj: Any, version: int) -> None:
    # As the specs say ("ignorable" is false unless given) and Java's writers do.
    with pytest.raises(UnsupportedVersionError):
        encode_request(request_obj, version, 1, "c")

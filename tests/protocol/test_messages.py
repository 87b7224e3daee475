"""Message codecs, framing and version negotiation.

* Round trips of every declared message at every version, with values generated from the
  schema itself (so new messages are covered without new code), through the bare body
  codec and through whole frames.
* A differential check of every one of those encodings against kafka-python's
  independent, JSON-driven codec, and golden bytes against aiokafka's and kafka-python's
  hand-written protocol classes, in both directions.
* Headers, :class:`FrameDecoder`, malformed input, and the ApiVersions fallback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import struct
import tracemalloc
import uuid
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from aiokafka.protocol import admin as aio_admin
from aiokafka.protocol import api as aio_api
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

from aioprod.errors import ProtocolError, UnsupportedVersionError
from aioprod.protocol import messages as m
from aioprod.protocol import versions
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

MESSAGE_CLASSES: list[type[Message]] = [cls for req in m.ALL_REQUESTS for cls in (req, req.RESPONSE)]
CASES = [(cls, v) for cls in MESSAGE_CLASSES for v in range(cls.MIN_VERSION, cls.MAX_VERSION + 1)]


def case_id(case: tuple[type[Message], int]) -> str:
    return f"{case[0].__name__}-v{case[1]}"


# --- value strategies derived from the schema -------------------------------------------------

_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}


def _int_strategy(name: str) -> st.SearchStrategy[int]:
    low, high = _INT_RANGES[name]
    return st.integers(low, high) | st.sampled_from([low, -1 if low else 0, 0, high])


def wire_strategy(wire: WireType, version: int, flexible: bool, nullable: bool) -> st.SearchStrategy[Any]:
    base: st.SearchStrategy[Any]
    if isinstance(wire, Array):
        base = st.lists(wire_strategy(wire.item, version, flexible, False), max_size=3)
    elif isinstance(wire, StructType):
        base = struct_strategy(wire.cls, version, flexible)
    elif wire.name in _INT_RANGES:
        base = _int_strategy(wire.name)
    elif wire.name == "float64":
        base = st.floats(allow_nan=False)
    elif wire.name == "bool":
        base = st.booleans()
    elif wire.name == "string":
        base = st.text(max_size=12)
    elif wire.name in ("bytes", "records"):
        base = st.binary(max_size=24)
    elif wire.name == "uuid":
        base = st.uuids()
    else:  # pragma: no cover - a new wire type needs a strategy here
        raise AssertionError(f"no strategy for {wire!r}")
    return st.none() | base if nullable else base


@cache
def struct_strategy(cls: type[Struct], version: int, flexible: bool) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` valid at ``version``: absent fields keep their defaults."""
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if version in spec.versions:
            kwargs[f.name] = wire_strategy(spec.type, version, flexible, version in spec.nullable)
    return st.builds(cls, **kwargs)


def at_version(obj: Any, version: int) -> Any:
    """``obj`` as it reads back at ``version``: fields absent there take their defaults."""
    if isinstance(obj, list):
        return [at_version(item, version) for item in obj]
    if not isinstance(obj, Struct):
        return obj
    values = {}
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if version in spec.versions:
            values[f.name] = at_version(getattr(obj, f.name), version)
    return type(obj)(**values)


def message_strategy(cls: type[Message], version: int) -> st.SearchStrategy[Any]:
    return struct_strategy(cls, version, cls.is_flexible(version))


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


@pytest.mark.parametrize("case", CASES, ids=case_id)
@ROUND_TRIP
@given(data=st.data())
def test_round_trip(case: tuple[type[Message], int], data: st.DataObject) -> None:
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

KP = kp_producer
KPM = kp_metadata


def _produce_ours(tid: str | None = "txn") -> m.ProduceRequest:
    return m.ProduceRequest(
        transactional_id=tid,
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            m.ProduceRequestTopic(
                "alpha", [m.ProduceRequestPartition(0, b"batch-0"), m.ProduceRequestPartition(3, None)]
            ),
            m.ProduceRequestTopic("beta", []),
        ],
    )


def _produce_aiokafka(version: int) -> bytes:
    cls = getattr(aio_produce, f"ProduceRequest_v{version}")
    return bytes(cls("txn", -1, 30000, [("alpha", [(0, b"batch-0"), (3, None)]), ("beta", [])]).encode())


def _produce_kp(version: int) -> bytes:
    return bytes(_produce_kp_obj(version).encode())


def _produce_kp_obj(version: int) -> Any:
    pd = KP.ProduceRequest.TopicProduceData.PartitionProduceData
    return KP.ProduceRequest[version](
        transactional_id="txn",
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            KP.ProduceRequest.TopicProduceData(
                name="alpha", partition_data=[pd(index=0, records=b"batch-0"), pd(index=3, records=None)]
            ),
            KP.ProduceRequest.TopicProduceData(name="beta", partition_data=[]),
        ],
    )


def _metadata_ours(version: int, topics: list[str] | None) -> m.MetadataRequest:
    return m.MetadataRequest(
        topics=None if topics is None else [m.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=False,
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
    GOLDEN_REQUESTS.append(("produce-aiokafka", _produce_ours(), _v, lambda v=_v: _produce_aiokafka(v)))
for _v in range(3, 12):
    GOLDEN_REQUESTS.append(("produce-kafka-python", _produce_ours(), _v, lambda v=_v: _produce_kp(v)))
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
    return bytes(_kp_produce_v10_obj().encode())


def _kp_produce_v10_obj() -> Any:
    r = KP.ProduceResponse
    t = r.TopicProduceResponse
    p = t.PartitionProduceResponse
    resp = r[10](
        responses=[
            t(
                name="a",
                partition_responses=[
                    p(
                        index=0,
                        error_code=6,
                        base_offset=-1,
                        current_leader=p.LeaderIdAndEpoch(leader_id=2, leader_epoch=9),
                    ),
                    p(index=1, error_code=0, base_offset=5),
                ],
            )
        ],
        throttle_time_ms=0,
        node_endpoints=[r.NodeEndpoint(node_id=2, host="h2", port=9093, rack=None)],
    )
    return resp


def _kp_api_versions_v3() -> bytes:
    return bytes(_kp_api_versions_v3_obj().encode())


def _kp_api_versions_v3_obj() -> Any:
    r = KPM.ApiVersionsResponse
    resp = r[3](
        error_code=0,
        api_keys=[r.ApiVersion(api_key=0, min_version=3, max_version=11)],
        throttle_time_ms=0,
        supported_features=[r.SupportedFeatureKey(name="metadata.version", min_version=1, max_version=20)],
        finalized_features_epoch=7,
        finalized_features=[r.FinalizedFeatureKey(name="metadata.version", max_version_level=20, min_version_level=20)],
        zk_migration_ready=True,
    )
    return resp


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
        _kp_api_versions_v3,
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
    ours = encode_request(_produce_ours(), 7, 1234, "my-client")
    ref_struct = aio_produce.ProduceRequest_v7(
        "txn", -1, 30000, [("alpha", [(0, b"batch-0"), (3, None)]), ("beta", [])]
    )
    ref = bytes(aio_api.RequestHeader_v1(ref_struct, 1234, "my-client").encode()) + bytes(ref_struct.encode())
    assert ours == struct.pack(">i", len(ref)) + ref
    assert ours[4:14] == struct.pack(">hhih", 0, 7, 1234, 9)


def test_request_header_v2_matches_kafka_python() -> None:
    ours = encode_request(_produce_ours(), 9, 99, "c")
    ref = _produce_kp_obj(9)
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
        encode_request(_produce_ours(), 2, 1, None)
    assert info.value.remote is False
    with pytest.raises(ProtocolError):
        encode_request(_produce_ours(), 13, 1, None)


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
    ref = _kp_api_versions_v3_obj()
    ref.with_header(correlation_id=5)
    ref_frame = bytes(ref.encode(header=True, framed=True))
    assert ref_frame[4:8] == b"\x00\x00\x00\x05"
    assert decode_response(ref_frame[4:], m.ApiVersionsResponse, 3).zk_migration_ready is True


def test_response_frames_from_kafka_python_with_header_v1() -> None:
    ref = _kp_produce_v10_obj()
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


def _mutate(data: st.DataObject, body: bytes) -> bytes:
    buf = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete", "huge"]), label="op")
        at = data.draw(st.integers(0, len(buf)), label="at")
        if op == "flip" and buf:
            buf[min(at, len(buf) - 1)] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del buf[at : at + data.draw(st.integers(1, 4))]
        elif op == "huge":
            buf[at : at + 4] = data.draw(
                st.sampled_from([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\xff\xff\xff\x0f"])
            )
    return bytes(buf)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_encodings_decode_or_raise_protocol_error(data: st.DataObject) -> None:
    cls, version = data.draw(st.sampled_from(CASES), label="case")
    obj = data.draw(message_strategy(cls, version), label="message")
    flexible = cls.is_flexible(version)
    mutated = _mutate(data, encode_struct(obj, version, flexible))
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


# --- version negotiation -------------------------------------------------------------------------

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
    outcome = versions.read_api_versions_response(_api_versions_frame(1, _kp_api_versions_v3()), 3)
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


def test_uuid_fields_round_trip_exactly() -> None:
    topic_id = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    req = m.MetadataRequest(topics=[m.MetadataRequestTopic(topic_id=topic_id, name=None)])
    body = encode_struct(req, 12, True)
    assert topic_id.bytes in body
    assert decode_struct(m.MetadataRequest, body, 12, True).topics == [m.MetadataRequestTopic(topic_id, None)]


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

"""The request and response bodies aioprod speaks, declared with :mod:`.schema`.

Each API gets a request class, a response class and the nested structures they use.
Field names are the snake_case (:func:`snake_case`) of the names in Kafka's message
specs, field order is wire order, and version ranges, nullability, tags and defaults
follow the specs; ``tests/protocol/test_spec_drift.py`` checks all of that against
the JSON specs for every declared version.
"""

# schema.field() wraps dataclasses.field(); ruff cannot tell, hence the file-wide RUF009 exemption.
# ruff: noqa: RUF009

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from aioprod.protocol.schema import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    INT64,
    RECORDS,
    STRING,
    UUID,
    Array,
    Request,
    Response,
    Struct,
    field,
)

__all__ = [
    "ALL_REQUESTS",
    "AddOffsetsToTxnRequest",
    "AddOffsetsToTxnResponse",
    "AddPartitionsToTxnRequest",
    "AddPartitionsToTxnRequestTopic",
    "AddPartitionsToTxnRequestTransaction",
    "AddPartitionsToTxnResponse",
    "AddPartitionsToTxnResponsePartitionResult",
    "AddPartitionsToTxnResponseResult",
    "AddPartitionsToTxnResponseTopicResult",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "ApiVersionsResponseApiKey",
    "ApiVersionsResponseFinalizedFeature",
    "ApiVersionsResponseSupportedFeature",
    "CreateTopicsRequest",
    "CreateTopicsRequestAssignment",
    "CreateTopicsRequestConfig",
    "CreateTopicsRequestTopic",
    "CreateTopicsResponse",
    "CreateTopicsResponseConfig",
    "CreateTopicsResponseTopic",
    "EndTxnRequest",
    "EndTxnResponse",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "FindCoordinatorResponseCoordinator",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "ListOffsetsRequest",
    "ListOffsetsRequestPartition",
    "ListOffsetsRequestTopic",
    "ListOffsetsResponse",
    "ListOffsetsResponsePartition",
    "ListOffsetsResponseTopic",
    "MetadataRequest",
    "MetadataRequestTopic",
    "MetadataResponse",
    "MetadataResponseBroker",
    "MetadataResponsePartition",
    "MetadataResponseTopic",
    "OffsetFetchRequest",
    "OffsetFetchRequestGroup",
    "OffsetFetchRequestTopic",
    "OffsetFetchRequestTopics",
    "OffsetFetchResponse",
    "OffsetFetchResponseGroup",
    "OffsetFetchResponsePartition",
    "OffsetFetchResponsePartitions",
    "OffsetFetchResponseTopic",
    "OffsetFetchResponseTopics",
    "ProduceRequest",
    "ProduceRequestPartition",
    "ProduceRequestTopic",
    "ProduceResponse",
    "ProduceResponseBatchIndexError",
    "ProduceResponseLeaderIdAndEpoch",
    "ProduceResponseNodeEndpoint",
    "ProduceResponsePartition",
    "ProduceResponseTopic",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "TxnOffsetCommitRequest",
    "TxnOffsetCommitRequestPartition",
    "TxnOffsetCommitRequestTopic",
    "TxnOffsetCommitResponse",
    "TxnOffsetCommitResponsePartition",
    "TxnOffsetCommitResponseTopic",
    "snake_case",
]

_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(spec_name: str) -> str:
    """The attribute name of a spec field: ``ThrottleTimeMs`` -> ``throttle_time_ms``.

    ``V3AndBelowTopics`` -> ``v3_and_below_topics``, ``timeoutMs`` -> ``timeout_ms``.
    """
    return _WORD_BOUNDARY.sub("_", spec_name).lower()


# --- ApiVersions (key 18) ----------------------------------------------------------------


@dataclass(slots=True)
class ApiVersionsResponseApiKey(Struct):
    api_key: int = field(INT16)
    min_version: int = field(INT16)
    max_version: int = field(INT16)


@dataclass(slots=True)
class ApiVersionsResponseSupportedFeature(Struct):
    name: str = field(STRING, "3+")
    min_version: int = field(INT16, "3+")
    max_version: int = field(INT16, "3+")


@dataclass(slots=True)
class ApiVersionsResponseFinalizedFeature(Struct):
    name: str = field(STRING, "3+")
    max_version_level: int = field(INT16, "3+")
    min_version_level: int = field(INT16, "3+")


@dataclass(slots=True)
class ApiVersionsResponse(Response):
    API_KEY = 18
    MIN_VERSION = 0
    MAX_VERSION = 4
    FLEXIBLE_FROM = 3

    error_code: int = field(INT16)
    api_keys: list[ApiVersionsResponseApiKey] = field(Array(ApiVersionsResponseApiKey))
    throttle_time_ms: int = field(INT32, "1+")
    supported_features: list[ApiVersionsResponseSupportedFeature] = field(
        Array(ApiVersionsResponseSupportedFeature), "3+", tagged="3+", tag=0
    )
    finalized_features_epoch: int = field(INT64, "3+", tagged="3+", tag=1, default=-1)
    finalized_features: list[ApiVersionsResponseFinalizedFeature] = field(
        Array(ApiVersionsResponseFinalizedFeature), "3+", tagged="3+", tag=2
    )
    zk_migration_ready: bool = field(BOOL, "3+", tagged="3+", tag=3)


@dataclass(slots=True)
class ApiVersionsRequest(Request):
    API_KEY = 18
    MIN_VERSION = 0
    MAX_VERSION = 4
    FLEXIBLE_FROM = 3
    RESPONSE = ApiVersionsResponse

    client_software_name: str = field(STRING, "3+")
    client_software_version: str = field(STRING, "3+")


# --- Metadata (key 3) ----------------------------------------------------------------------


@dataclass(slots=True)
class MetadataRequestTopic(Struct):
    topic_id: uuid.UUID = field(UUID, "10+")
    name: str | None = field(STRING, nullable="10+")


@dataclass(slots=True)
class MetadataResponseBroker(Struct):
    node_id: int = field(INT32)
    host: str = field(STRING)
    port: int = field(INT32)
    rack: str | None = field(STRING, "1+", nullable="1+", default=None)


@dataclass(slots=True)
class MetadataResponsePartition(Struct):
    error_code: int = field(INT16)
    partition_index: int = field(INT32)
    leader_id: int = field(INT32)
    leader_epoch: int = field(INT32, "7+", default=-1)
    replica_nodes: list[int] = field(Array(INT32))
    isr_nodes: list[int] = field(Array(INT32))
    offline_replicas: list[int] = field(Array(INT32), "5+")


@dataclass(slots=True)
class MetadataResponseTopic(Struct):
    error_code: int = field(INT16)
    name: str | None = field(STRING, nullable="12+")
    topic_id: uuid.UUID = field(UUID, "10+")
    is_internal: bool = field(BOOL, "1+")
    partitions: list[MetadataResponsePartition] = field(Array(MetadataResponsePartition))
    topic_authorized_operations: int = field(INT32, "8+", default=-(1 << 31))


@dataclass(slots=True)
class MetadataResponse(Response):
    API_KEY = 3
    MIN_VERSION = 1
    MAX_VERSION = 12
    FLEXIBLE_FROM = 9

    throttle_time_ms: int = field(INT32, "3+")
    brokers: list[MetadataResponseBroker] = field(Array(MetadataResponseBroker))
    cluster_id: str | None = field(STRING, "2+", nullable="2+", default=None)
    controller_id: int = field(INT32, "1+", default=-1)
    topics: list[MetadataResponseTopic] = field(Array(MetadataResponseTopic))
    cluster_authorized_operations: int = field(INT32, "8-10", default=-(1 << 31))


@dataclass(slots=True)
class MetadataRequest(Request):
    API_KEY = 3
    MIN_VERSION = 1
    MAX_VERSION = 12
    FLEXIBLE_FROM = 9
    RESPONSE = MetadataResponse

    #: None asks for every topic; an empty list for none.
    topics: list[MetadataRequestTopic] | None = field(Array(MetadataRequestTopic), nullable="1+")
    allow_auto_topic_creation: bool = field(BOOL, "4+", default=True, ignorable=False)
    include_cluster_authorized_operations: bool = field(BOOL, "8-10", ignorable=False)
    include_topic_authorized_operations: bool = field(BOOL, "8+", ignorable=False)


# --- Produce (key 0) -----------------------------------------------------------------------


@dataclass(slots=True)
class ProduceRequestPartition(Struct):
    index: int = field(INT32)
    records: bytes | None = field(RECORDS, nullable="0+")


@dataclass(slots=True)
class ProduceRequestTopic(Struct):
    name: str = field(STRING)
    partition_data: list[ProduceRequestPartition] = field(Array(ProduceRequestPartition))


@dataclass(slots=True)
class ProduceResponseBatchIndexError(Struct):
    batch_index: int = field(INT32, "8+")
    batch_index_error_message: str | None = field(STRING, "8+", nullable="8+", default=None)


@dataclass(slots=True)
class ProduceResponseLeaderIdAndEpoch(Struct):
    leader_id: int = field(INT32, "10+", default=-1)
    leader_epoch: int = field(INT32, "10+", default=-1)


@dataclass(slots=True)
class ProduceResponsePartition(Struct):
    index: int = field(INT32)
    error_code: int = field(INT16)
    base_offset: int = field(INT64)
    log_append_time_ms: int = field(INT64, "2+", default=-1)
    log_start_offset: int = field(INT64, "5+", default=-1)
    record_errors: list[ProduceResponseBatchIndexError] = field(Array(ProduceResponseBatchIndexError), "8+")
    error_message: str | None = field(STRING, "8+", nullable="8+", default=None)
    current_leader: ProduceResponseLeaderIdAndEpoch = field(ProduceResponseLeaderIdAndEpoch, "10+", tagged="10+", tag=0)


@dataclass(slots=True)
class ProduceResponseTopic(Struct):
    name: str = field(STRING)
    partition_responses: list[ProduceResponsePartition] = field(Array(ProduceResponsePartition))


@dataclass(slots=True)
class ProduceResponseNodeEndpoint(Struct):
    node_id: int = field(INT32, "10+")
    host: str = field(STRING, "10+")
    port: int = field(INT32, "10+")
    rack: str | None = field(STRING, "10+", nullable="10+", default=None)


@dataclass(slots=True)
class ProduceResponse(Response):
    API_KEY = 0
    MIN_VERSION = 3
    MAX_VERSION = 12
    FLEXIBLE_FROM = 9

    responses: list[ProduceResponseTopic] = field(Array(ProduceResponseTopic))
    throttle_time_ms: int = field(INT32, "1+")
    node_endpoints: list[ProduceResponseNodeEndpoint] = field(
        Array(ProduceResponseNodeEndpoint), "10+", tagged="10+", tag=0
    )


@dataclass(slots=True)
class ProduceRequest(Request):
    API_KEY = 0
    MIN_VERSION = 3
    MAX_VERSION = 12
    FLEXIBLE_FROM = 9
    RESPONSE = ProduceResponse

    transactional_id: str | None = field(STRING, "3+", nullable="3+", default=None)
    acks: int = field(INT16)
    timeout_ms: int = field(INT32)
    topic_data: list[ProduceRequestTopic] = field(Array(ProduceRequestTopic))


# --- InitProducerId (key 22) ---------------------------------------------------------------


@dataclass(slots=True)
class InitProducerIdResponse(Response):
    API_KEY = 22
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 2

    throttle_time_ms: int = field(INT32)
    error_code: int = field(INT16)
    producer_id: int = field(INT64, default=-1)
    producer_epoch: int = field(INT16)


@dataclass(slots=True)
class InitProducerIdRequest(Request):
    API_KEY = 22
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 2
    RESPONSE = InitProducerIdResponse

    #: The spec's default is the empty string; pass None for a non-transactional producer.
    transactional_id: str | None = field(STRING, nullable="0+")
    transaction_timeout_ms: int = field(INT32)
    producer_id: int = field(INT64, "3+", default=-1, ignorable=False)
    producer_epoch: int = field(INT16, "3+", default=-1, ignorable=False)


# --- ListOffsets (key 2) -------------------------------------------------------------------


@dataclass(slots=True)
class ListOffsetsRequestPartition(Struct):
    partition_index: int = field(INT32)
    current_leader_epoch: int = field(INT32, "4+", default=-1)
    timestamp: int = field(INT64)
    # MaxNumOffsets exists only in v0, which is not declared here.


@dataclass(slots=True)
class ListOffsetsRequestTopic(Struct):
    name: str = field(STRING)
    partitions: list[ListOffsetsRequestPartition] = field(Array(ListOffsetsRequestPartition))


@dataclass(slots=True)
class ListOffsetsResponsePartition(Struct):
    partition_index: int = field(INT32)
    error_code: int = field(INT16)
    # OldStyleOffsets exists only in v0, which is not declared here.
    timestamp: int = field(INT64, "1+", default=-1)
    offset: int = field(INT64, "1+", default=-1)
    leader_epoch: int = field(INT32, "4+", default=-1)


@dataclass(slots=True)
class ListOffsetsResponseTopic(Struct):
    name: str = field(STRING)
    partitions: list[ListOffsetsResponsePartition] = field(Array(ListOffsetsResponsePartition))


@dataclass(slots=True)
class ListOffsetsResponse(Response):
    API_KEY = 2
    MIN_VERSION = 1
    MAX_VERSION = 10
    FLEXIBLE_FROM = 6

    throttle_time_ms: int = field(INT32, "2+")
    topics: list[ListOffsetsResponseTopic] = field(Array(ListOffsetsResponseTopic))


@dataclass(slots=True)
class ListOffsetsRequest(Request):
    API_KEY = 2
    MIN_VERSION = 1
    MAX_VERSION = 10
    FLEXIBLE_FROM = 6
    RESPONSE = ListOffsetsResponse

    #: The spec's default is 0 (a broker id); clients must send -1.
    replica_id: int = field(INT32)
    isolation_level: int = field(INT8, "2+", ignorable=False)
    topics: list[ListOffsetsRequestTopic] = field(Array(ListOffsetsRequestTopic))
    timeout_ms: int = field(INT32, "10+")


# --- CreateTopics (key 19) -----------------------------------------------------------------


@dataclass(slots=True)
class CreateTopicsRequestAssignment(Struct):
    partition_index: int = field(INT32)
    broker_ids: list[int] = field(Array(INT32))


@dataclass(slots=True)
class CreateTopicsRequestConfig(Struct):
    name: str = field(STRING)
    value: str | None = field(STRING, nullable="0+")


@dataclass(slots=True)
class CreateTopicsRequestTopic(Struct):
    name: str = field(STRING)
    num_partitions: int = field(INT32)
    replication_factor: int = field(INT16)
    assignments: list[CreateTopicsRequestAssignment] = field(Array(CreateTopicsRequestAssignment))
    configs: list[CreateTopicsRequestConfig] = field(Array(CreateTopicsRequestConfig))


@dataclass(slots=True)
class CreateTopicsResponseConfig(Struct):
    name: str = field(STRING, "5+")
    value: str | None = field(STRING, "5+", nullable="5+")
    read_only: bool = field(BOOL, "5+")
    config_source: int = field(INT8, "5+", default=-1)
    is_sensitive: bool = field(BOOL, "5+")


@dataclass(slots=True)
class CreateTopicsResponseTopic(Struct):
    name: str = field(STRING)
    topic_id: uuid.UUID = field(UUID, "7+")
    error_code: int = field(INT16)
    error_message: str | None = field(STRING, "1+", nullable="0+")
    topic_config_error_code: int = field(INT16, "5+", tagged="5+", tag=0)
    num_partitions: int = field(INT32, "5+", default=-1)
    replication_factor: int = field(INT16, "5+", default=-1)
    configs: list[CreateTopicsResponseConfig] | None = field(Array(CreateTopicsResponseConfig), "5+", nullable="5+")


@dataclass(slots=True)
class CreateTopicsResponse(Response):
    API_KEY = 19
    MIN_VERSION = 2
    MAX_VERSION = 7
    FLEXIBLE_FROM = 5

    throttle_time_ms: int = field(INT32, "2+")
    topics: list[CreateTopicsResponseTopic] = field(Array(CreateTopicsResponseTopic))


@dataclass(slots=True)
class CreateTopicsRequest(Request):
    API_KEY = 19
    MIN_VERSION = 2
    MAX_VERSION = 7
    FLEXIBLE_FROM = 5
    RESPONSE = CreateTopicsResponse

    topics: list[CreateTopicsRequestTopic] = field(Array(CreateTopicsRequestTopic))
    timeout_ms: int = field(INT32, default=60000)
    validate_only: bool = field(BOOL, "1+")


# --- FindCoordinator (key 10) --------------------------------------------------------------


@dataclass(slots=True)
class FindCoordinatorResponseCoordinator(Struct):
    key: str = field(STRING, "4+")
    node_id: int = field(INT32, "4+")
    host: str = field(STRING, "4+")
    port: int = field(INT32, "4+")
    error_code: int = field(INT16, "4+")
    error_message: str | None = field(STRING, "4+", nullable="4+")


@dataclass(slots=True)
class FindCoordinatorResponse(Response):
    API_KEY = 10
    MIN_VERSION = 0
    MAX_VERSION = 6
    FLEXIBLE_FROM = 3

    throttle_time_ms: int = field(INT32, "1+")
    error_code: int = field(INT16, "0-3")
    error_message: str | None = field(STRING, "1-3", nullable="1-3")
    node_id: int = field(INT32, "0-3")
    host: str = field(STRING, "0-3")
    port: int = field(INT32, "0-3")
    coordinators: list[FindCoordinatorResponseCoordinator] = field(Array(FindCoordinatorResponseCoordinator), "4+")


@dataclass(slots=True)
class FindCoordinatorRequest(Request):
    API_KEY = 10
    MIN_VERSION = 0
    MAX_VERSION = 6
    FLEXIBLE_FROM = 3
    RESPONSE = FindCoordinatorResponse

    key: str = field(STRING, "0-3")
    #: 0 for a consumer group, 1 for a transaction.
    key_type: int = field(INT8, "1+", ignorable=False)
    coordinator_keys: list[str] = field(Array(STRING), "4+")


# --- AddPartitionsToTxn (key 24) -----------------------------------------------------------


@dataclass(slots=True)
class AddPartitionsToTxnRequestTopic(Struct):
    name: str = field(STRING)
    partitions: list[int] = field(Array(INT32))


@dataclass(slots=True)
class AddPartitionsToTxnRequestTransaction(Struct):
    transactional_id: str = field(STRING, "4+")
    producer_id: int = field(INT64, "4+")
    producer_epoch: int = field(INT16, "4+")
    verify_only: bool = field(BOOL, "4+")
    topics: list[AddPartitionsToTxnRequestTopic] = field(Array(AddPartitionsToTxnRequestTopic), "4+")


@dataclass(slots=True)
class AddPartitionsToTxnResponsePartitionResult(Struct):
    partition_index: int = field(INT32)
    partition_error_code: int = field(INT16)


@dataclass(slots=True)
class AddPartitionsToTxnResponseTopicResult(Struct):
    name: str = field(STRING)
    results_by_partition: list[AddPartitionsToTxnResponsePartitionResult] = field(
        Array(AddPartitionsToTxnResponsePartitionResult)
    )


@dataclass(slots=True)
class AddPartitionsToTxnResponseResult(Struct):
    transactional_id: str = field(STRING, "4+")
    topic_results: list[AddPartitionsToTxnResponseTopicResult] = field(
        Array(AddPartitionsToTxnResponseTopicResult), "4+"
    )


@dataclass(slots=True)
class AddPartitionsToTxnResponse(Response):
    API_KEY = 24
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 3

    throttle_time_ms: int = field(INT32)
    error_code: int = field(INT16, "4+")
    results_by_transaction: list[AddPartitionsToTxnResponseResult] = field(
        Array(AddPartitionsToTxnResponseResult), "4+"
    )
    results_by_topic_v3_and_below: list[AddPartitionsToTxnResponseTopicResult] = field(
        Array(AddPartitionsToTxnResponseTopicResult), "0-3"
    )


@dataclass(slots=True)
class AddPartitionsToTxnRequest(Request):
    API_KEY = 24
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 3
    RESPONSE = AddPartitionsToTxnResponse

    transactions: list[AddPartitionsToTxnRequestTransaction] = field(Array(AddPartitionsToTxnRequestTransaction), "4+")
    v3_and_below_transactional_id: str = field(STRING, "0-3")
    v3_and_below_producer_id: int = field(INT64, "0-3")
    v3_and_below_producer_epoch: int = field(INT16, "0-3")
    v3_and_below_topics: list[AddPartitionsToTxnRequestTopic] = field(Array(AddPartitionsToTxnRequestTopic), "0-3")


# --- AddOffsetsToTxn (key 25) --------------------------------------------------------------


@dataclass(slots=True)
class AddOffsetsToTxnResponse(Response):
    API_KEY = 25
    MIN_VERSION = 0
    MAX_VERSION = 4
    FLEXIBLE_FROM = 3

    throttle_time_ms: int = field(INT32)
    error_code: int = field(INT16)


@dataclass(slots=True)
class AddOffsetsToTxnRequest(Request):
    API_KEY = 25
    MIN_VERSION = 0
    MAX_VERSION = 4
    FLEXIBLE_FROM = 3
    RESPONSE = AddOffsetsToTxnResponse

    transactional_id: str = field(STRING)
    producer_id: int = field(INT64)
    producer_epoch: int = field(INT16)
    group_id: str = field(STRING)


# --- TxnOffsetCommit (key 28) --------------------------------------------------------------


@dataclass(slots=True)
class TxnOffsetCommitRequestPartition(Struct):
    partition_index: int = field(INT32)
    committed_offset: int = field(INT64)
    committed_leader_epoch: int = field(INT32, "2+", default=-1)
    committed_metadata: str | None = field(STRING, nullable="0+")


@dataclass(slots=True)
class TxnOffsetCommitRequestTopic(Struct):
    name: str = field(STRING)
    partitions: list[TxnOffsetCommitRequestPartition] = field(Array(TxnOffsetCommitRequestPartition))


@dataclass(slots=True)
class TxnOffsetCommitResponsePartition(Struct):
    partition_index: int = field(INT32)
    error_code: int = field(INT16)


@dataclass(slots=True)
class TxnOffsetCommitResponseTopic(Struct):
    name: str = field(STRING)
    partitions: list[TxnOffsetCommitResponsePartition] = field(Array(TxnOffsetCommitResponsePartition))


@dataclass(slots=True)
class TxnOffsetCommitResponse(Response):
    API_KEY = 28
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 3

    throttle_time_ms: int = field(INT32)
    topics: list[TxnOffsetCommitResponseTopic] = field(Array(TxnOffsetCommitResponseTopic))


@dataclass(slots=True)
class TxnOffsetCommitRequest(Request):
    API_KEY = 28
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 3
    RESPONSE = TxnOffsetCommitResponse

    transactional_id: str = field(STRING)
    group_id: str = field(STRING)
    producer_id: int = field(INT64)
    producer_epoch: int = field(INT16)
    generation_id: int = field(INT32, "3+", default=-1, ignorable=False)
    member_id: str = field(STRING, "3+", default="", ignorable=False)
    group_instance_id: str | None = field(STRING, "3+", nullable="3+", default=None, ignorable=False)
    topics: list[TxnOffsetCommitRequestTopic] = field(Array(TxnOffsetCommitRequestTopic))


# --- OffsetFetch (key 9) -------------------------------------------------------------------
# Read only to ask whether a transaction's offsets committed (aioprod.spark's exactly-once
# writes). Versions from 2: a null topic list (every topic of the group) needs v2 or later.


@dataclass(slots=True)
class OffsetFetchRequestTopic(Struct):
    name: str = field(STRING, "0-7")
    partition_indexes: list[int] = field(Array(INT32), "0-7")


@dataclass(slots=True)
class OffsetFetchRequestTopics(Struct):
    name: str = field(STRING, "8+")
    partition_indexes: list[int] = field(Array(INT32), "8+")


@dataclass(slots=True)
class OffsetFetchRequestGroup(Struct):
    group_id: str = field(STRING, "8+")
    member_id: str | None = field(STRING, "9+", nullable="9+", default=None)
    member_epoch: int = field(INT32, "9+", default=-1)
    #: None asks for every topic of the group.
    topics: list[OffsetFetchRequestTopics] | None = field(Array(OffsetFetchRequestTopics), "8+", nullable="8+")


@dataclass(slots=True)
class OffsetFetchResponsePartition(Struct):
    partition_index: int = field(INT32, "0-7")
    committed_offset: int = field(INT64, "0-7")
    committed_leader_epoch: int = field(INT32, "5-7", default=-1)
    metadata: str | None = field(STRING, "0-7", nullable="0-7")
    error_code: int = field(INT16, "0-7")


@dataclass(slots=True)
class OffsetFetchResponseTopic(Struct):
    name: str = field(STRING, "0-7")
    partitions: list[OffsetFetchResponsePartition] = field(Array(OffsetFetchResponsePartition), "0-7")


@dataclass(slots=True)
class OffsetFetchResponsePartitions(Struct):
    partition_index: int = field(INT32, "8+")
    committed_offset: int = field(INT64, "8+")
    committed_leader_epoch: int = field(INT32, "8+", default=-1)
    metadata: str | None = field(STRING, "8+", nullable="8+")
    error_code: int = field(INT16, "8+")


@dataclass(slots=True)
class OffsetFetchResponseTopics(Struct):
    name: str = field(STRING, "8+")
    partitions: list[OffsetFetchResponsePartitions] = field(Array(OffsetFetchResponsePartitions), "8+")


@dataclass(slots=True)
class OffsetFetchResponseGroup(Struct):
    group_id: str = field(STRING, "8+")
    topics: list[OffsetFetchResponseTopics] = field(Array(OffsetFetchResponseTopics), "8+")
    error_code: int = field(INT16, "8+", default=0)


@dataclass(slots=True)
class OffsetFetchResponse(Response):
    API_KEY = 9
    MIN_VERSION = 2
    MAX_VERSION = 9
    FLEXIBLE_FROM = 6

    throttle_time_ms: int = field(INT32, "3+")
    topics: list[OffsetFetchResponseTopic] = field(Array(OffsetFetchResponseTopic), "0-7")
    error_code: int = field(INT16, "2-7", default=0)
    groups: list[OffsetFetchResponseGroup] = field(Array(OffsetFetchResponseGroup), "8+")


@dataclass(slots=True)
class OffsetFetchRequest(Request):
    API_KEY = 9
    MIN_VERSION = 2
    MAX_VERSION = 9
    FLEXIBLE_FROM = 6
    RESPONSE = OffsetFetchResponse

    group_id: str = field(STRING, "0-7")
    #: None asks for every topic of the group.
    topics: list[OffsetFetchRequestTopic] | None = field(Array(OffsetFetchRequestTopic), "0-7", nullable="2-7")
    groups: list[OffsetFetchRequestGroup] = field(Array(OffsetFetchRequestGroup), "8+")
    require_stable: bool = field(BOOL, "7+", default=False, ignorable=False)


# --- EndTxn (key 26) -----------------------------------------------------------------------


@dataclass(slots=True)
class EndTxnResponse(Response):
    API_KEY = 26
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 3

    throttle_time_ms: int = field(INT32)
    error_code: int = field(INT16)
    producer_id: int = field(INT64, "5+", default=-1)
    producer_epoch: int = field(INT16, "5+", default=-1)


@dataclass(slots=True)
class EndTxnRequest(Request):
    API_KEY = 26
    MIN_VERSION = 0
    MAX_VERSION = 5
    FLEXIBLE_FROM = 3
    RESPONSE = EndTxnResponse

    transactional_id: str = field(STRING)
    producer_id: int = field(INT64)
    producer_epoch: int = field(INT16)
    committed: bool = field(BOOL)


# --- SaslHandshake (key 17) ----------------------------------------------------------------


@dataclass(slots=True)
class SaslHandshakeResponse(Response):
    API_KEY = 17
    MIN_VERSION = 0
    MAX_VERSION = 1
    FLEXIBLE_FROM = None

    error_code: int = field(INT16)
    mechanisms: list[str] = field(Array(STRING))


@dataclass(slots=True)
class SaslHandshakeRequest(Request):
    API_KEY = 17
    MIN_VERSION = 0
    MAX_VERSION = 1
    FLEXIBLE_FROM = None
    RESPONSE = SaslHandshakeResponse

    mechanism: str = field(STRING)


# --- SaslAuthenticate (key 36) -------------------------------------------------------------


@dataclass(slots=True)
class SaslAuthenticateResponse(Response):
    API_KEY = 36
    MIN_VERSION = 0
    MAX_VERSION = 2
    FLEXIBLE_FROM = 2

    error_code: int = field(INT16)
    error_message: str | None = field(STRING, nullable="0+")
    auth_bytes: bytes = field(BYTES)
    session_lifetime_ms: int = field(INT64, "1+")


@dataclass(slots=True)
class SaslAuthenticateRequest(Request):
    API_KEY = 36
    MIN_VERSION = 0
    MAX_VERSION = 2
    FLEXIBLE_FROM = 2
    RESPONSE = SaslAuthenticateResponse

    auth_bytes: bytes = field(BYTES, secret=True)  # PLAIN sends the password in it


ALL_REQUESTS: tuple[type[Request], ...] = (
    ProduceRequest,
    ListOffsetsRequest,
    MetadataRequest,
    FindCoordinatorRequest,
    SaslHandshakeRequest,
    ApiVersionsRequest,
    CreateTopicsRequest,
    InitProducerIdRequest,
    AddPartitionsToTxnRequest,
    AddOffsetsToTxnRequest,
    EndTxnRequest,
    TxnOffsetCommitRequest,
    OffsetFetchRequest,
    SaslAuthenticateRequest,
)

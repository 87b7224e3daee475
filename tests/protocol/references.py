"""The same messages as built by the independent libraries (kafka-python), for golden checks."""

from __future__ import annotations

from typing import Any

from kafka.protocol import metadata as kp_metadata
from kafka.protocol import producer as kp_producer

from aioprod.protocol import messages as m

KP = kp_producer
KPM = kp_metadata


def produce_ours(tid: str | None = "txn") -> m.ProduceRequest:
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


def produce_kp_obj(version: int) -> Any:
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


def kp_produce_v10_obj() -> Any:
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


def kp_api_versions_v3() -> bytes:
    return bytes(kp_api_versions_v3_obj().encode())


def kp_api_versions_v3_obj() -> Any:
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

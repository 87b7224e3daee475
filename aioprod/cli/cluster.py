"""Asking a bootstrap server directly, without a producer: Metadata that creates nothing.

A producer's metadata request may auto-create the topics it names; a command that only
looks (``aioprod metadata -t``) or checks a topic before producing must not, so it sends
its own request with ``allow_auto_topic_creation`` as it chooses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from aioprod.cli.common import quiet_config
from aioprod.cluster.metadata import Broker, ClusterSnapshot, PartitionInfo, TopicInfo
from aioprod.config import ProducerConfig
from aioprod.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from aioprod.net.auth import ConnectionSecurity
from aioprod.net.connection import BrokerConnection
from aioprod.net.pool import connection_setup_timeout, exponential_backoff
from aioprod.producer.producer import Producer
from aioprod.protocol.messages import MetadataRequest, MetadataRequestTopic, MetadataResponse

log = logging.getLogger(__name__)


async def ask_metadata(
    config: ProducerConfig,
    topics: list[str] | None,
    *,
    allow_auto_topic_creation: bool = False,
    retrying: Callable[[KafkaError], None] | None = None,
) -> MetadataResponse:
    """One Metadata request (``topics=None``: all) to the first bootstrap server that answers,
    the servers tried again, backing off as the producer's connections do, until
    ``max_block_ms``: a broker still starting is waited for, as the Kafka tools wait.
    ``retrying`` is told, once, why the first round found none."""
    errors: list[KafkaError] = []
    try:
        async with asyncio.timeout(config.max_block_ms / 1000):
            return await _ask_bootstrap(config, topics, allow_auto_topic_creation, errors, retrying)
    except TimeoutError as exc:
        why = f": {errors[-1]}" if errors else ""
        raise KafkaTimeoutError(f"no metadata from the bootstrap servers within {config.max_block_ms} ms{why}") from exc


async def _ask_bootstrap(
    config: ProducerConfig,
    topics: list[str] | None,
    auto_create: bool,
    errors: list[KafkaError],
    retrying: Callable[[KafkaError], None] | None,
) -> MetadataResponse:
    request = MetadataRequest(
        topics=None if topics is None else [MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=auto_create,
    )
    security = ConnectionSecurity.from_config(config)  # TLS and SASL, as the producer's connections
    rounds = 0
    while True:
        rounds += 1
        setup_timeout = connection_setup_timeout(config, rounds)  # as the pool's: it grows with the failed rounds
        for index, (host, port) in enumerate(config.bootstrap_servers):
            conn = BrokerConnection(
                -1 - index,
                host,
                port,
                client_id=config.client_id,
                request_timeout=config.request_timeout_ms / 1000,
                max_in_flight=1,
                security=security,
            )
            try:
                await conn.open(setup_timeout, attempt=rounds - 1)
                response: MetadataResponse = await conn.send(request)
            except KafkaError as exc:
                if not exc.retriable and not isinstance(exc, KafkaConnectionError):
                    raise  # wrong credentials, a TLS failure: another bootstrap server will say the same
                errors.append(exc)
                continue
            finally:
                conn.close()
            return response
        if rounds == 1 and retrying is not None:
            retrying(errors[-1])
        base, cap = config.reconnect_backoff_ms / 1000, config.reconnect_backoff_max_ms / 1000
        await asyncio.sleep(exponential_backoff(base, cap, rounds))


def to_snapshot(response: MetadataResponse) -> tuple[ClusterSnapshot, dict[str, KafkaError]]:
    """The cluster as the response describes it, and the topics it answered with an error."""
    brokers = {b.node_id: Broker(b.node_id, b.host, b.port, b.rack) for b in response.brokers}
    topics = {}
    errors: dict[str, KafkaError] = {}
    for t in response.topics:
        if t.name is None:
            continue
        if t.error_code:
            errors[t.name] = error_for_code(t.error_code, f"topic {t.name!r}")
            continue
        partitions = {
            p.partition_index: PartitionInfo(
                p.partition_index, p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(p.isr_nodes)
            )
            for p in t.partitions
        }
        topics[t.name] = TopicInfo(t.name, MappingProxyType(partitions))
    snapshot = ClusterSnapshot(
        MappingProxyType(brokers), MappingProxyType(topics), response.cluster_id, response.controller_id
    )
    return snapshot, errors


async def missing_topic(config: ProducerConfig, topic: str) -> str | None:
    """Why ``topic`` cannot be produced to, if the cluster says so now; else None.

    Asks exactly as the producer will (auto-creation as configured), so on a cluster that
    creates topics on first use this creates it, as producing would. A cluster that cannot
    be reached says nothing here: the producer's own connection warnings tell that story.
    """
    try:
        response = await ask_metadata(config, [topic], allow_auto_topic_creation=config.allow_auto_create_topics)
    except KafkaError as exc:
        log.debug("topic check for %r: %s", topic, exc)
        return None
    error = to_snapshot(response)[1].get(topic)
    if isinstance(error, UnknownTopicOrPartitionError):
        how = (
            "and the cluster does not create topics on first use"
            if config.allow_auto_create_topics
            else "(and allow.auto.create.topics is false)"
        )
        return f"topic {topic!r} does not exist {how}"
    if error is not None and not error.retriable:  # invalid name, not authorized
        return f"topic {topic!r}: {error}"
    return None  # there, or being created (LEADER_NOT_AVAILABLE)


def watch_topic(options: dict[str, Any], topic: str) -> asyncio.Task[str | None]:
    """Check ``topic`` in the background and warn at once if the cluster says it cannot be used.

    The command goes on meanwhile (the producer waits ``max.block.ms`` for metadata, as
    configured); the task's result, the problem or None, lets its final error say why.
    """

    async def check() -> str | None:
        problem = await missing_topic(quiet_config(options), topic)
        if problem is not None:
            log.warning("%s; waiting up to max.block.ms for it", problem)
        return problem

    return asyncio.get_running_loop().create_task(check(), name=f"aioprod-cli-topic-check-{topic}")


#: How long a command lets the topic check answer before its producer asks about the topic.
CHECK_HEAD_START = 2.0


async def check_first(check: asyncio.Task[str | None], producer: Producer, topic: str) -> None:
    """Let the topic check answer (at most :data:`CHECK_HEAD_START` seconds) before the producer
    asks about the topic, so that its one clear line comes before the producer's own warnings
    about the same topic.

    A cluster that has not answered the check by then is slow or unreachable: the producer's
    wait for the topic starts now and ends when ``max.block.ms`` from the start of the check
    does, so the head start does not make the command's error late.
    """
    loop = asyncio.get_running_loop()
    max_block_ms = producer.config.max_block_ms
    deadline = loop.time() + max_block_ms / 1000
    # At most half of max.block.ms: a head start that took all of it left the producer no try
    # at the cluster, and its error no reason ("not present in metadata", nothing more).
    await asyncio.wait([check], timeout=min(CHECK_HEAD_START, max_block_ms / 2000))
    if check.done():
        return
    try:
        async with asyncio.timeout_at(deadline):
            await producer.partitions_for(topic)
    except KafkaTimeoutError:
        raise
    except TimeoutError:
        # The producer's own reason (no broker reachable: ..., the cluster's last answer), as its
        # own wait would have said it.
        raise producer._metadata.topic_timeout(topic, max_block_ms) from None


def topic_problem(check: asyncio.Task[str | None]) -> str:
    """`` (topic 'x' does not exist ...)`` when the check found a problem, for an error message."""
    if check.done() and not check.cancelled() and check.result() is not None:
        return f" ({check.result()})"
    return ""

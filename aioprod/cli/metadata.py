"""``aioprod metadata``: brokers, topics, partitions and leaders, as tables (like ``kcat -L``).

With ``--topic``, the producer's own view is shown: ``partitions_for`` fetches each topic
(creating it when the cluster auto-creates topics), then ``cluster()`` gives the snapshot,
exactly what ``send()`` would route by. A producer only tracks the topics it was asked
about, so without ``--topic`` one Metadata request for *all* topics goes to a bootstrap
broker instead (never creating anything).
"""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from aioprod.cli.common import (
    bootstrap_option,
    config_option,
    console,
    debug_option,
    producer_options,
    require_bootstrap,
    run,
)
from aioprod.cluster.metadata import Broker, ClusterSnapshot, PartitionInfo, TopicInfo
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, error_for_code
from aioprod.net.connection import BrokerConnection
from aioprod.producer.producer import Producer
from aioprod.protocol.messages import MetadataRequest, MetadataResponse


async def topics_snapshot(options: dict[str, Any], topics: tuple[str, ...]) -> ClusterSnapshot:
    """The producer's snapshot after asking for each topic."""
    async with Producer(options) as producer:
        for topic in topics:
            await producer.partitions_for(topic)
        return producer.cluster()


async def cluster_snapshot(options: dict[str, Any]) -> ClusterSnapshot:
    """Every broker and topic, from the first bootstrap server that answers (within max.block.ms)."""
    config = ProducerConfig.from_options(options)
    try:
        async with asyncio.timeout(config.max_block_ms / 1000):
            return await _ask_bootstrap(config)
    except TimeoutError as exc:
        raise KafkaTimeoutError(f"no metadata from the bootstrap servers within {config.max_block_ms} ms") from exc


async def _ask_bootstrap(config: ProducerConfig) -> ClusterSnapshot:
    errors: list[KafkaError] = []
    for index, (host, port) in enumerate(config.bootstrap_servers):
        conn = BrokerConnection(
            -1 - index,
            host,
            port,
            client_id=config.client_id,
            request_timeout=config.request_timeout_ms / 1000,
            max_in_flight=1,
        )
        try:
            await conn.open(config.request_timeout_ms / 1000)
            response: MetadataResponse = await conn.send(MetadataRequest(topics=None, allow_auto_topic_creation=False))
        except KafkaError as exc:
            errors.append(exc)
            continue
        finally:
            conn.close()
        return to_snapshot(response)
    raise KafkaConnectionError(f"no bootstrap server answered: {'; '.join(str(e) for e in errors)}")


def to_snapshot(response: MetadataResponse) -> ClusterSnapshot:
    brokers = {b.node_id: Broker(b.node_id, b.host, b.port, b.rack) for b in response.brokers}
    topics = {}
    for t in response.topics:
        if t.name is None:
            continue
        if t.error_code:
            raise error_for_code(t.error_code, f"metadata for topic {t.name!r}")
        partitions = {
            p.partition_index: PartitionInfo(
                p.partition_index, p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(p.isr_nodes)
            )
            for p in t.partitions
        }
        topics[t.name] = TopicInfo(t.name, MappingProxyType(partitions))
    return ClusterSnapshot(
        MappingProxyType(brokers), MappingProxyType(topics), response.cluster_id, response.controller_id
    )


def render(snapshot: ClusterSnapshot, out: Console) -> None:
    out.print(f"cluster id: {snapshot.cluster_id or '-'}, controller: {snapshot.controller_id}")
    brokers = Table(title=f"{len(snapshot.brokers)} broker{'' if len(snapshot.brokers) == 1 else 's'}")
    for name in ("id", "host", "port", "rack", "controller"):
        brokers.add_column(name, justify="right" if name in ("id", "port") else "left")
    for broker in sorted(snapshot.brokers.values(), key=lambda b: b.node_id):
        controller = "yes" if broker.node_id == snapshot.controller_id else ""
        brokers.add_row(str(broker.node_id), broker.host, str(broker.port), broker.rack or "-", controller)
    out.print(brokers)
    partitions = Table(title=f"{len(snapshot.topics)} topic{'' if len(snapshot.topics) == 1 else 's'}")
    for name in ("topic", "partition", "leader", "leader epoch", "replicas", "isr"):
        partitions.add_column(name, justify="left" if name == "topic" else "right")
    for topic in sorted(snapshot.topics):
        for p in (snapshot.topics[topic].partitions[i] for i in snapshot.topics[topic].all_partitions):
            partitions.add_row(
                topic,
                str(p.partition),
                str(p.leader) if p.leader >= 0 else "none",
                str(p.leader_epoch),
                ",".join(map(str, p.replicas)),
                ",".join(map(str, p.isr)),
            )
    out.print(partitions)


@click.command()
@bootstrap_option
@click.option("-t", "--topic", "topics", metavar="TOPIC", multiple=True, help="Show this topic. Repeatable.")
@config_option
@debug_option
def metadata(bootstrap: str | None, topics: tuple[str, ...], overrides: tuple[str, ...]) -> None:
    """Show brokers, topics, partitions and leaders.

    With --topic, the producer fetches each named topic (auto-creating it where the
    cluster allows) and shows its own view: what send() routes by. Without --topic,
    every broker and every topic of the cluster, from one Metadata request to a
    bootstrap server (nothing is created).

    \b
    Examples:
      aioprod metadata -b localhost:9092
      aioprod metadata -b localhost:9092 -t orders -t payments
      AIOPROD_BOOTSTRAP_SERVERS=kafka1:9092 aioprod metadata
    """
    servers = require_bootstrap(bootstrap, overrides)
    options = producer_options(servers, overrides)
    snapshot = run(topics_snapshot(options, topics) if topics else cluster_snapshot(options))
    render(snapshot, console())

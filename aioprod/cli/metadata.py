"""``aioprod metadata``: brokers, topics, partitions and leaders, as tables (like ``kcat -L``).

One Metadata request to the first bootstrap server that answers, with auto-creation off:
a viewing command never creates a topic, not even a mistyped ``-t``. A topic the cluster
does not have is reported as such (exit code 1).
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console

from aioprod.cli.cluster import ask_metadata, to_snapshot
from aioprod.cli.common import (
    ClientOptions,
    CliError,
    client_options,
    console,
    debug_option,
    describe,
    echo,
    run,
    table,
    topic_names,
    warn,
)
from aioprod.cluster.metadata import ClusterSnapshot
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaError, UnknownTopicOrPartitionError


def as_dict(snapshot: ClusterSnapshot, errors: dict[str, KafkaError]) -> dict[str, Any]:
    """The ``--json`` form: brokers, topics with their partitions, and the topics in error."""
    return {
        "cluster_id": snapshot.cluster_id,
        "controller_id": snapshot.controller_id,
        "brokers": [
            {"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in sorted(snapshot.brokers.values(), key=lambda b: b.node_id)
        ],
        "topics": [
            {
                "name": name,
                "partitions": [
                    {
                        "partition": p.partition,
                        "leader": p.leader,
                        "leader_epoch": p.leader_epoch,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                    }
                    for p in (snapshot.topics[name].partitions[i] for i in snapshot.topics[name].all_partitions)
                ],
            }
            for name in sorted(snapshot.topics)
        ],
        "errors": {name: {"error": type(exc).__name__, "message": str(exc)} for name, exc in sorted(errors.items())},
    }


def render(snapshot: ClusterSnapshot, out: Console) -> None:
    out.print(f"cluster id: {snapshot.cluster_id or '-'}, controller: {snapshot.controller_id}")
    count = len(snapshot.brokers)
    brokers = table(
        out,
        "id",
        "host",
        "port",
        "rack",
        "controller",
        title=f"{count} broker{'' if count == 1 else 's'}",
        right=("id", "port"),
    )
    for broker in sorted(snapshot.brokers.values(), key=lambda b: b.node_id):
        controller = "yes" if broker.node_id == snapshot.controller_id else ""
        brokers.add_row(str(broker.node_id), broker.host, str(broker.port), broker.rack or "-", controller)
    out.print(brokers)
    count = len(snapshot.topics)
    partitions = table(
        out,
        "topic",
        "partition",
        "leader",
        "leader epoch",
        "replicas",
        "isr",
        title=f"{count} topic{'' if count == 1 else 's'}",
        right=("partition", "leader", "leader epoch", "replicas", "isr"),
    )
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


def explain(topic: str, exc: KafkaError) -> str:
    if isinstance(exc, UnknownTopicOrPartitionError):
        return f"topic {topic!r} does not exist"
    return f"topic {topic!r}: {describe(exc)}"


@click.command()
@client_options
@click.option(
    "-t",
    "--topic",
    "topics",
    metavar="TOPIC",
    multiple=True,
    callback=topic_names,
    help="Show only this topic. Repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@debug_option
def metadata(client: ClientOptions, topics: tuple[str, ...], as_json: bool) -> None:
    """Show brokers, topics, partitions and leaders.

    One Metadata request to the first bootstrap server that answers within
    max.block.ms (a broker still starting is waited for), with auto-creation off:
    nothing is ever created, not even a mistyped --topic. A named topic the cluster
    does not have is reported and the exit code is 1. Tables are plain columns when the output is not a terminal (or
    NO_COLOR is set); --json gives one JSON object.

    \b
    Examples:
      aioprod metadata -b localhost:9092
      aioprod metadata -b localhost:9092 -t orders -t payments
      aioprod metadata -b localhost:9092 --json | jq '.topics[].name'
      AIOPROD_BOOTSTRAP_SERVERS=kafka1:9092 aioprod metadata
    """
    options = client.producer_options(client.require_bootstrap())
    config = ProducerConfig.from_options(options)

    def retrying(exc: KafkaError) -> None:
        wait = f"max.block.ms ({config.max_block_ms:,} ms)"
        warn(f"no bootstrap server answered ({describe(exc)}); trying again for up to {wait}")

    response = run(ask_metadata(config, list(topics) or None, retrying=retrying))
    snapshot, errors = to_snapshot(response)
    if as_json:
        echo(json.dumps(as_dict(snapshot, errors)))
    else:
        render(snapshot, console())
    if errors:
        (first, exc), *rest = sorted(errors.items())
        more = f" (and {len(rest)} more topic{'' if len(rest) == 1 else 's'} in error)" if rest else ""
        raise CliError(explain(first, exc) + more)

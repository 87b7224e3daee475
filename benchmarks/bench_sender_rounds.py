"""Micro-benchmark: the sender's per-round work (``ready`` + ``drain``) against partition counts.

A topic of N partitions (1,000 or 10,000) led by three brokers. Every partition has been
written to once (so the producer has seen them all), then K of them hold a batch, and one
round — ``ready`` then ``drain`` of one batch per partition — is timed, the batches put back
each time. The sender's per-round cost should follow K (partitions with data), not N.

    python benchmarks/bench_sender_rounds.py [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from types import MappingProxyType

from aioprod.cluster.metadata import Broker, ClusterSnapshot, PartitionInfo, TopicInfo
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaError
from aioprod.producer.accumulator import RecordAccumulator
from aioprod.producer.batch import ProducerBatch, TopicPartition


def snapshot(partitions: int) -> ClusterSnapshot:
    parts = {p: PartitionInfo(p, p % 3 + 1, 0, (p % 3 + 1,), (p % 3 + 1,)) for p in range(partitions)}
    brokers = {n: Broker(n, "h", 9000 + n) for n in (1, 2, 3)}
    return ClusterSnapshot(MappingProxyType(brokers), MappingProxyType({"t": TopicInfo("t", MappingProxyType(parts))}))


def _always(batch: ProducerBatch, queue: object) -> bool:
    return True


async def one_case(partitions: int, with_data: int, rounds: int) -> float:
    """Microseconds per round."""
    config = ProducerConfig.from_options(bootstrap_servers="h:1", linger_ms=0, enable_idempotence=False)
    acc = RecordAccumulator(config, lambda: None)
    cluster = snapshot(partitions)
    tps = [TopicPartition("t", p) for p in range(partitions)]

    def fill(count: int) -> None:
        for tp in tps[:count]:
            size = acc.record_size(None, b"v", ())
            acc.pool.try_reserve(size)
            acc.append(tp, 0, None, b"v", (), size, 0.0)

    fill(partitions)  # every partition seen once...
    for batches in acc.drain(acc.ready(cluster, 1.0), [1, 2, 3], 1 << 30, _always).values():
        for batch in batches:
            batch.fail(KafkaError("done"))
            acc.complete(batch)
    fill(with_data)  # ... and K of them hold data now
    started = time.perf_counter()
    for _ in range(rounds):
        readiness = acc.ready(cluster, 1.0)
        drained = acc.drain(readiness, readiness.nodes, 1 << 30, _always)
        for batches in drained.values():
            for batch in batches:
                acc.reenqueue(batch, 0.0)
                batch.attempts = 0
    elapsed = time.perf_counter() - started
    return elapsed / rounds * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    print(f"{'partitions':>10} {'with data':>10} {'µs/round':>10} {'µs per partition with data':>28}")
    for partitions in (1_000, 10_000):
        for with_data in (10, 100, 1_000):
            us = await one_case(partitions, with_data, args.rounds)
            print(f"{partitions:>10,} {with_data:>10,} {us:>10.1f} {us / with_data:>28.2f}")


if __name__ == "__main__":
    asyncio.run(main())

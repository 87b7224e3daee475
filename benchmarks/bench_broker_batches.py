"""What a record batch costs the broker: Tansu's CPU per batch and per record.

    python benchmarks/bench_broker_batches.py [--partitions 1000] [--chunks 8]

With many partitions and a short linger, a client's batches are small, and the number of
batches, not of records, decides how much work the broker has. This writes requests of one
batch per partition (``records`` records each, 100 B values), flushing after each round so
that each round is one request per ``max_request_size``, on a fresh Tansu per setting, and
reads the broker process's CPU time (``/proc``) around each chunk of rounds. Idempotence on
and off: an idempotent batch carries a producer id and sequence the broker checks.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Tansu, cpu_seconds, create_topic

from aioprod import Producer

CHUNK_BATCHES = 2000


async def measure(broker: Tansu, partitions: int, records: int, idempotence: bool, chunks: int) -> list[float]:
    """Broker CPU µs per batch, for each chunk of about CHUNK_BATCHES batches."""
    value = b"x" * 100
    rounds = max(1, CHUNK_BATCHES // partitions)
    per_chunk = []
    async with Producer(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        linger_ms=60_000,
        batch_size=1 << 20,
        enable_idempotence=idempotence,
        max_in_flight_requests_per_connection=1,
    ) as producer:
        for partition in range(partitions):  # every partition written once before timing
            await producer.send("t", value, partition=partition)
        await producer.flush()
        assert broker.pid is not None
        for _ in range(chunks):
            before = cpu_seconds(broker.pid)
            for _ in range(rounds):
                for partition in range(partitions):
                    for _ in range(records):
                        await producer.send("t", value, partition=partition)
                await producer.flush()
            per_chunk.append((cpu_seconds(broker.pid) - before) / (rounds * partitions) * 1e6)
    return per_chunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--records", default="1,10,50", help="records per batch, comma-separated")
    parser.add_argument("--chunks", type=int, default=8, help=f"chunks of about {CHUNK_BATCHES:,} batches")
    args = parser.parse_args()
    print(f"{args.partitions:,} partitions, 100 B values, no compression; broker CPU µs per batch")
    print("| idempotence | records/batch | first chunk | last chunk | mean | µs per record (mean) |")
    print("|---|--:|--:|--:|--:|--:|")
    for idempotence in (True, False):
        for records in (int(r) for r in args.records.split(",")):
            started = time.perf_counter()
            with Tansu() as broker:
                create_topic(broker.bootstrap, "t", args.partitions)
                per_chunk = asyncio.run(measure(broker, args.partitions, records, idempotence, args.chunks))
            mean = sum(per_chunk) / len(per_chunk)
            print(
                f"| {'on' if idempotence else 'off'} | {records} | {per_chunk[0]:.0f} | {per_chunk[-1]:.0f} "
                f"| {mean:.0f} | {mean / records:.2f} |  ({time.perf_counter() - started:.0f} s)"
            )


if __name__ == "__main__":
    main()

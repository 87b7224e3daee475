"""Transactions per second for small transactions, on one Tansu broker.

- ``aioprod``                one transactional producer: begin, send N records, commit, in a loop.
- ``confluent-kafka``        the same with ``confluent_kafka.Producer`` (librdkafka), for scale.
- ``aioprod-two-phase``      what an exactly-once Spark write costs per Spark partition: a new
                             transactional producer (fencing), the commit-marker look-up, begin,
                             N records, the marker offset, prepare, close; then another producer
                             commits the transaction by its handle.

Each run has a fresh broker and runs for ``--seconds`` after a short untimed warm-up; rounds are
interleaved. Every transaction is checked committed afterwards (the topic holds what was committed).

    python benchmarks/bench_transactions.py [--records 1] [--seconds 5] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable

from common import Tansu, count_records, create_topic, machine_info, print_rates, tansu_version

from aioprod import Producer, TopicPartition

Method = Callable[[str, str, int, float], int]


def aioprod_loop(bootstrap: str, topic: str, records: int, seconds: float) -> int:
    async def run() -> int:
        done = 0
        async with Producer(bootstrap_servers=bootstrap, transactional_id=f"bench-{uuid.uuid4().hex}") as p:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                async with p.transaction():
                    for i in range(records):
                        await p.send(topic, b"v%d" % i, partition=0)
                done += 1
        return done

    return asyncio.run(run())


def confluent_loop(bootstrap: str, topic: str, records: int, seconds: float) -> int:
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex}", "linger.ms": 5}
    )
    producer.init_transactions(30)
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        producer.begin_transaction()
        for i in range(records):
            producer.produce(topic, b"v%d" % i, partition=0)
        producer.commit_transaction(30)
        done += 1
    return done


def aioprod_two_phase(bootstrap: str, topic: str, records: int, seconds: float) -> int:
    write_id = f"bench-{uuid.uuid4().hex[:12]}"

    async def run() -> int:
        done = 0
        async with Producer(bootstrap_servers=bootstrap) as committer:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                unit = f"{write_id}-{done}"
                async with Producer(bootstrap_servers=bootstrap, transactional_id=unit) as p:
                    if await p._committed_offsets(unit):
                        raise RuntimeError(f"{unit} is committed already")
                    p.begin_transaction()
                    for i in range(records):
                        await p.send(topic, b"v%d" % i, partition=0)
                    await p.send_offsets_to_transaction({TopicPartition(topic, 0): 1}, unit)
                    prepared = await p.prepare_transaction()
                await committer.commit_prepared_transaction(prepared)
                done += 1
        return done

    return asyncio.run(run())


METHODS: dict[str, Method] = {
    "aioprod": aioprod_loop,
    "confluent-kafka": confluent_loop,
    "aioprod-two-phase": aioprod_two_phase,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1, help="records per transaction")
    parser.add_argument("--seconds", type=float, default=5.0, help="each timed run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(METHODS))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    methods = {name: METHODS[name] for name in (args.only or METHODS)}
    results: dict[str, list[float]] = {name: [] for name in methods}
    # A fresh broker for every run: Tansu slows down as the transactions it has seen pile up
    # (every client alike, by half within a few thousand), which would favour whoever runs first.
    for round_ in range(args.repeat):
        for name, method in methods.items():
            with Tansu() as broker:
                bootstrap = broker.bootstrap
                topic = f"bench-txn-{uuid.uuid4().hex[:10]}"
                create_topic(bootstrap, topic, 1)
                warm = method(bootstrap, topic, args.records, 0.5)  # untimed: connections, imports
                started = time.perf_counter()
                done = method(bootstrap, topic, args.records, args.seconds)
                rate = done / (time.perf_counter() - started)
                held = count_records(bootstrap, topic)
            if held != (warm + done) * args.records:
                raise RuntimeError(f"{name}: {warm + done} transactions of {args.records} committed, {held} held")
            results[name].append(rate)
            print(f"round {round_ + 1}: {name:18} {rate:>8,.1f} transactions/s", file=sys.stderr)
    info = machine_info()
    print(
        f"\n{args.records} record(s) per transaction, Tansu {tansu_version()}, "
        f"median (best) of {args.repeat} runs of {args.seconds:g}s"
    )
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    print_rates(results, "transactions/s", 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": info, "transactions_per_second": results}, f, indent=2)


if __name__ == "__main__":
    main()

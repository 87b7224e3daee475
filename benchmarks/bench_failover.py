"""Leader failover: a keyed stream while a broker dies and comes back, aioprod beside librdkafka.

Issue 9's check is a 3-node Apache Kafka (RF 3, min ISR 2), 20,000 keyed records at 2,000/s,
the leader SIGKILLed at 3 s and back at 6 s. No Kafka cluster can run on this machine, so the
failure is scripted on the test suite's fake cluster (tests/fakes/), served over loopback TCP
so librdkafka can connect too: three nodes, six partitions led two per node; at 3 s node 1
dies (its connections cut, new ones refused) and the surviving nodes hold their produce answers
(as Kafka's leaders wait for the dead follower to leave the ISR) until the "election" has moved
node 1's partitions to them, ELECTION seconds later; at 6 s node 1 is back, leading nothing.

Each client runs the same stream against a fresh cluster; the run is timed from the first send
to the last acknowledgement, and the logs are checked afterwards: every record exactly once,
each key's records in send order. The timings model the mechanism (where a client waits, and
for what), not Apache Kafka's exact delays.

    python benchmarks/bench_failover.py [--election 1.0] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import statistics
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aioprod import Producer
from aioprod.embedded import free_port
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.tcp import TcpNetwork

T = TypeVar("T")
RECORDS = 20_000
RATE = 2_000
KEYS = 100
KILL_AT = 3.0
BACK_AT = 6.0  # (with --election above 3 s, node 1 returns as the election ends)
TOPIC = "failover"
LEADERS = [1, 2, 3, 1, 2, 3]


class ClusterThread:
    """The fake cluster on its own event loop, in its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.network = TcpNetwork()
        ports = {node: free_port() for node in (1, 2, 3)}
        self.cluster: ScriptedCluster = self.call(self._start(ports))

    async def _start(self, ports: dict[int, int]) -> ScriptedCluster:
        cluster = ScriptedCluster(self.network, nodes=3, ports=ports.__getitem__)
        # librdkafka writes record batches v2 only to brokers that list Fetch v4+ too (its
        # MsgVer2 feature); the fake never answers a Fetch, a producer sends none.
        cluster.versions[1] = (4, 11)
        cluster.create_topic(TOPIC, leaders=LEADERS)
        await self.network.ready()
        return cluster

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def fail_and_recover(self, election: float) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(self._fail_and_recover(election), self.loop)

    async def _fail_and_recover(self, election: float) -> None:
        cluster = self.cluster
        await asyncio.sleep(KILL_AT)
        cluster.stop(1)
        for node in (2, 3):
            cluster.nodes[node].holding = True  # acks=all: waiting for the dead follower
        await asyncio.sleep(election)
        for index, leader in enumerate(LEADERS):
            if leader == 1:
                cluster.move_leader(TOPIC, index, 2 if index < 3 else 3)
        for node in (2, 3):
            cluster.nodes[node].release()
        await asyncio.sleep(max(0.0, BACK_AT - KILL_AT - election))
        cluster.start(1)
        await self.network.ready()

    def logs(self) -> list[list[bytes | None]]:
        async def read() -> list[list[bytes | None]]:
            return [part.values for part in self.cluster.topics[TOPIC]]

        return self.call(read())

    def stop(self) -> None:
        self.call(self.network.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def record(i: int) -> tuple[bytes, bytes]:
    key = b"k%02d" % (i % KEYS)
    return key, key + b":%06d" % i


async def aioprod_stream(bootstrap: str) -> tuple[float, list[float]]:
    """The run's duration, and each record's send-to-acknowledgement latency."""
    async with Producer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True, acks="all") as p:
        await p.partitions_for(TOPIC)
        latencies: list[float] = []
        started = time.monotonic()
        futures = []
        for i in range(RECORDS):
            due = started + i / RATE
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            key, value = record(i)
            sent = time.monotonic()
            future = await p.send(TOPIC, value, key=key)
            future.add_done_callback(lambda _f, sent=sent: latencies.append(time.monotonic() - sent))
            futures.append(future)
        await asyncio.gather(*futures)
        return time.monotonic() - started, latencies


def librdkafka_stream(bootstrap: str) -> tuple[float, list[float]]:
    import confluent_kafka

    errors: list[Any] = []
    latencies: list[float] = []

    def delivered(err: Any, _msg: Any, sent: float) -> None:
        latencies.append(time.monotonic() - sent)
        if err:
            errors.append(err)

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "log_level": 0,
        }
    )
    producer.list_topics(TOPIC, timeout=30)
    started = time.monotonic()
    for i in range(RECORDS):
        due = started + i / RATE
        while time.monotonic() < due:
            producer.poll(min(0.001, max(0.0, due - time.monotonic())))
        key, value = record(i)
        sent = time.monotonic()
        producer.produce(TOPIC, value, key=key, on_delivery=lambda err, msg, sent=sent: delivered(err, msg, sent))
    remaining = producer.flush(120)
    took = time.monotonic() - started
    if remaining or errors:
        raise RuntimeError(f"librdkafka: {remaining} unflushed, {len(errors)} failed (first: {errors[:1]})")
    return took, latencies


def check(logs: list[list[bytes | None]]) -> str:
    seen: dict[bytes, list[int]] = {}
    total = 0
    for values in logs:
        for value in values:
            assert value is not None
            key, number = value.split(b":")
            seen.setdefault(key, []).append(int(number))
            total += 1
    duplicates = total - len({n for numbers in seen.values() for n in numbers})
    lost = RECORDS - len({n for numbers in seen.values() for n in numbers})
    out_of_order = sum(numbers != sorted(numbers) for numbers in seen.values())
    return f"records {total}, duplicates {duplicates}, lost {lost}, keys out of order {out_of_order}"


def one_run(client: str, election: float) -> tuple[float, float, str]:
    """Duration, the longest send-to-acknowledgement wait (what the failover cost a record),
    and what the logs say."""
    cluster = ClusterThread()
    try:
        bootstrap = cluster.cluster.bootstrap
        failing = cluster.fail_and_recover(election)
        took, latencies = (
            asyncio.run(aioprod_stream(bootstrap)) if client == "aioprod" else librdkafka_stream(bootstrap)
        )
        failing.result(30)
        return took, max(latencies), check(cluster.logs())
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--election", type=float, default=1.0, help="seconds from the death to the new leaders")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"aioprod": [], "librdkafka": []}
    for rep in range(args.reps):
        for client in ("aioprod", "librdkafka") if rep % 2 == 0 else ("librdkafka", "aioprod"):
            took, worst, verdict = one_run(client, args.election)
            results[client].append((took, worst))
            print(f"{client:>10}  run {took:6.2f} s  longest wait {worst:5.2f} s  {verdict}", flush=True)
    nominal = RECORDS / RATE
    print(f"(the stream alone takes {nominal:.0f} s; the election {args.election:.1f} s)")
    for client, runs in results.items():
        took = statistics.median(r[0] for r in runs)
        worst = statistics.median(r[1] for r in runs)
        print(f"{client:>10}  median run {took:.2f} s, median longest wait {worst:.2f} s")


if __name__ == "__main__":
    main()

"""Records/s over SASL_SSL beside PLAINTEXT, aioprod and aiokafka on the same listeners.

Listeners, all on one embedded Tansu setup (see aioprod.embedded):

- ``PLAINTEXT``: Tansu directly.
- ``PLAINTEXT via gateway``: the same relay that serves TLS/SASL, without them: its own cost.
- ``SASL_SSL``: TLS 1.3 + SCRAM-SHA-512 through ``aioprod.secure_gateway`` (Tansu's bundled
  build cannot serve TLS or SASL itself), so the difference to the row above is TLS's cost.

Each run sends ``--records`` values of ``--size`` bytes with send-and-gather (acks=all).

    python -m benchmarks.bench_security --records 200000 --size 100
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aioprod import Producer
from aioprod.embedded import BrokerSecurity, EmbeddedBroker
from benchmarks.common import create_topic

USER, PASSWORD = "bench", "bench-password"


async def run_aioprod(bootstrap: str, topic: str, values: list[bytes], security: dict[str, Any]) -> float:
    async with Producer(bootstrap_servers=bootstrap, linger_ms=5, **security) as producer:
        await producer.send_and_wait(topic, b"warm-up")
        start = time.perf_counter()
        futures = [await producer.send(topic, v) for v in values]
        await asyncio.gather(*futures)
        return len(values) / (time.perf_counter() - start)


async def run_aiokafka(bootstrap: str, topic: str, values: list[bytes], security: dict[str, Any]) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", **security)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"warm-up")
        start = time.perf_counter()
        futures = [await producer.send(topic, v) for v in values]
        await asyncio.gather(*futures)
        return len(values) / (time.perf_counter() - start)
    finally:
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    values = [bytes([i % 251]) * args.size for i in range(args.records)]
    workdir = Path(tempfile.mkdtemp(prefix="aioprod-bench-security-"))
    secured = BrokerSecurity.generate(workdir, tls=True, sasl_users={USER: PASSWORD})
    ca = str(workdir / "ca.pem")
    context = ssl.create_default_context(cafile=ca)
    listeners: list[tuple[str, BrokerSecurity | None, dict[str, Any], dict[str, Any]]] = [
        ("PLAINTEXT", None, {}, {}),
        ("PLAINTEXT via gateway", BrokerSecurity(sasl_users={}), {}, {}),
        (
            "SASL_SSL (SCRAM-SHA-512)",
            secured,
            {
                "security_protocol": "SASL_SSL",
                "ssl_ca_location": ca,
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": USER,
                "sasl_password": PASSWORD,
            },
            {
                "security_protocol": "SASL_SSL",
                "ssl_context": context,
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": USER,
                "sasl_plain_password": PASSWORD,
            },
        ),
    ]
    print(f"{args.records} records of {args.size} B, best of {args.runs} runs, records/s")
    print(f"{'listener':28} {'aioprod':>10} {'aiokafka':>10}")
    for name, security, ours, theirs in listeners:
        broker = EmbeddedBroker(security=security)
        if name == "PLAINTEXT via gateway":
            # A gateway with neither TLS nor SASL: force it on to measure the relay alone.
            broker.security = BrokerSecurity(sasl_users={}, sasl_mechanisms=())
        with broker:
            best: dict[str, float] = {"aioprod": 0.0, "aiokafka": 0.0}
            for _ in range(args.runs):
                for client, run, opts in (("aioprod", run_aioprod, ours), ("aiokafka", run_aiokafka, theirs)):
                    topic = f"bench-sec-{uuid.uuid4().hex[:8]}"
                    if security is None or not security.tls:
                        create_topic(broker.bootstrap, topic, 1)
                    rate = asyncio.run(run(broker.bootstrap, topic, values, opts))
                    best[client] = max(best[client], rate)
            print(f"{name:28} {best['aioprod']:>10,.0f} {best['aiokafka']:>10,.0f}")


if __name__ == "__main__":
    main()

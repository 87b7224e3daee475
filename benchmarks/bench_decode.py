"""Micro-benchmark: µs to decode a Produce answer, generic codec against ProduceResponse's own decoder.

An answer about one topic of 3 or 1,000 partitions, each in the shape a successful write
gets (error 0, a base offset, no log append time, a log start offset: what Tansu and Kafka
send), at Produce v8 (the last classic version) and v11 (what aioprod sends unless
transactions v2 are in use). The "1,000, 10 moved" row has 10 partitions answering
NOT_LEADER_OR_FOLLOWER with a message and KIP-951's leader hint (and, from v10, the new
leader's endpoint): those partitions, and in v10+ the whole answer, take the generic codec.
The last rows time encoding a ProduceRequest of 300-byte batches with the generic codec,
for scale. Runs are interleaved and the best kept (``timeit``, collector paused).

    python benchmarks/bench_decode.py [--repeat R] [--versions 8,11]
"""

from __future__ import annotations

import argparse
import platform
import timeit
from collections.abc import Callable
from functools import partial

from aioprod.protocol import messages as m
from aioprod.protocol.framing import encode_request
from aioprod.protocol.primitives import Reader
from aioprod.protocol.produce_response import decode_produce_response
from aioprod.protocol.schema import Decoder, encode_struct, struct_codec

NOT_LEADER_OR_FOLLOWER = 6


def answer(partitions: int, version: int, moved: int = 0) -> m.ProduceResponse:
    parts = [m.ProduceResponsePartition(i, 0, 1_234_567_890 + i, -1, 0) for i in range(partitions)]
    for i in range(moved):
        parts[i * (partitions // moved)] = m.ProduceResponsePartition(
            i * (partitions // moved),
            NOT_LEADER_OR_FOLLOWER,
            -1,
            -1,
            -1,
            error_message="This server is not the leader for that topic-partition.",
            current_leader=m.ProduceResponseLeaderIdAndEpoch(2, 7),
        )
    endpoints = [m.ProduceResponseNodeEndpoint(2, "broker-2.example.com", 9092, None)] if moved else []
    return m.ProduceResponse([m.ProduceResponseTopic("bench-topic", parts)], 0, endpoints)


def decode_generic(decoder: Decoder, body: bytes) -> object:
    return decoder(Reader(body))


def decode_own(version: int, body: bytes) -> object:
    return decode_produce_response(Reader(body), version)


def best_of(runs: dict[str, Callable[[], object]], number: int, repeat: int) -> dict[str, float]:
    """µs per call of each, best of ``repeat`` interleaved timings of ``number`` calls."""
    timers = {name: timeit.Timer(run) for name, run in runs.items()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, timer in timers.items():  # interleaved, so drift hits all alike
            best[name] = min(best[name], timer.timeit(number) / number * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--versions", default="8,11", help="Produce versions, comma-separated (3-12)")
    args = parser.parse_args()
    versions = [int(v) for v in args.versions.split(",")]

    print(f"Python {platform.python_version()} ({platform.python_implementation()}) on {platform.machine()}")
    print(f"best of {args.repeat} interleaved runs; µs per answer (lower is better)\n")
    header = f"{'ProduceResponse':<22} {'version':>7} {'bytes':>7} {'generic':>9} {'own':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for version in versions:
        flexible = m.ProduceResponse.is_flexible(version)
        generic = struct_codec(m.ProduceResponse, version, flexible)[1]
        for label, partitions, moved in (("3 partitions", 3, 0), ("1,000", 1000, 0), ("1,000, 10 moved", 1000, 10)):
            response = answer(partitions, version, moved)
            body = encode_struct(response, version, flexible)
            assert decode_produce_response(Reader(body), version) == generic(Reader(body))
            us = best_of(
                {"generic": partial(decode_generic, generic, body), "own": partial(decode_own, version, body)},
                max(1, 3000 // partitions),
                args.repeat,
            )
            print(
                f"{label:<22} {'v' + str(version):>7} {len(body):>7} {us['generic']:>9.1f} {us['own']:>9.1f}"
                f" {us['generic'] / us['own']:>5.1f}x"
            )
    print("\nratio = generic / own (> 1: the own decoder is faster).\n")

    header = f"{'ProduceRequest':<22} {'version':>7} {'bytes':>7} {'encode':>9}"
    print(header)
    print("-" * len(header))
    batch = bytes(300)
    for version in versions:
        for label, partitions in (("3 partitions", 3), ("1,000", 1000)):
            parts = [m.ProduceRequestPartition(i, batch) for i in range(partitions)]
            request = m.ProduceRequest(None, -1, 30_000, [m.ProduceRequestTopic("bench-topic", parts)])
            size = len(encode_request(request, version, 1, "bench"))
            us = best_of(
                {"encode": partial(encode_request, request, version, 1, "bench")},
                max(1, 3000 // partitions),
                args.repeat,
            )
            print(f"{label:<22} {'v' + str(version):>7} {size:>7} {us['encode']:>9.1f}")


if __name__ == "__main__":
    main()

"""Micro-benchmark: microseconds per record to build one 10,000-record batch, per codec.

Compares aioprod's RecordBatchBuilder with aiokafka's DefaultRecordBatchBuilder (its C
extension when installed, which is what aiokafka uses by default) and with aiokafka's
pure-Python builder. Each measurement covers creating the builder, appending 10,000 records
(~10-byte keys, 100-byte values of random hex, so they compress about 2:1) and ``build()``,
i.e. including compression at each library's default level. Runs are interleaved and the
best of several is kept, which filters out scheduler noise.

    python benchmarks/bench_record_batch.py [--records N] [--repeat R]
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import time
from collections.abc import Callable
from typing import Any

from aiokafka.record import default_records as aiokafka_default  # type: ignore[import-untyped]

from aioprod.protocol.records import Codec, RecordBatchBuilder

BATCH_SIZE = 1 << 24  # large enough that every record fits: we time encoding, not splitting

Runner = Callable[[Codec, list[tuple[int, bytes, bytes]]], bytes]


def make_records(n: int) -> list[tuple[int, bytes, bytes]]:
    rnd = random.Random(42)
    start = int(time.time() * 1000)
    return [
        (start + i // 100, b"user-%05d" % rnd.randrange(100_000), rnd.randbytes(50).hex().encode()) for i in range(n)
    ]


def run_aioprod(codec: Codec, records: list[tuple[int, bytes, bytes]]) -> bytes:
    builder = RecordBatchBuilder(codec, BATCH_SIZE)
    append = builder.append
    for ts, key, value in records:
        append(ts, key, value)
    return builder.build(producer_id=1000, producer_epoch=0, base_sequence=0)


def aiokafka_runner(cls: Any) -> Runner:
    def run(codec: Codec, records: list[tuple[int, bytes, bytes]]) -> bytes:
        builder = cls(2, int(codec), 0, 1000, 0, 0, BATCH_SIZE)
        append = builder.append
        no_headers: list[tuple[str, bytes | None]] = []
        for offset, (ts, key, value) in enumerate(records):
            append(offset, ts, key, value, no_headers)
        return bytes(builder.build())

    return run


def timed(impl: Runner, codec: Codec, records: list[tuple[int, bytes, bytes]]) -> tuple[float, int]:
    """Seconds for one run and the batch size, with the GC paused as timeit does."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        size = len(impl(codec, records))
        return time.perf_counter() - start, size
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    records = make_records(args.records)
    c_ext = aiokafka_default.DefaultRecordBatchBuilder
    implementations: dict[str, Runner] = {
        "aioprod": run_aioprod,
        "aiokafka": aiokafka_runner(c_ext),
        "aiokafka-py": aiokafka_runner(aiokafka_default._DefaultRecordBatchBuilderPy),
    }
    print(f"Python {platform.python_version()} ({platform.python_implementation()}) on {platform.machine()}")
    print(f"aiokafka builder: {c_ext.__module__}.{c_ext.__name__}", end=" ")
    print("(C extension)" if "_crecords" in c_ext.__module__ else "(pure Python)")
    print(f"{args.records} records/batch, key ~10 B, value 100 B; best of {args.repeat} runs\n")

    header = (
        f"{'codec':<7} {'aioprod':>9} {'aiokafka':>9} {'ratio':>6} {'aiokafka-py':>12} {'ratio':>6}"
        f"   {'aioprod B':>9} {'aiokafka B':>10}"
    )
    print(header)
    print("-" * len(header))
    for codec in Codec:
        best: dict[str, float] = {name: float("inf") for name in implementations}
        sizes: dict[str, int] = {}
        for _ in range(args.repeat):
            for name, impl in implementations.items():  # interleaved, so drift hits all alike
                elapsed, size = timed(impl, codec, records)
                best[name] = min(best[name], elapsed)
                sizes[name] = size
        us = {name: best[name] / args.records * 1e6 for name in implementations}
        print(
            f"{codec.name.lower():<7} {us['aioprod']:>9.3f} {us['aiokafka']:>9.3f}"
            f" {us['aiokafka'] / us['aioprod']:>6.2f} {us['aiokafka-py']:>12.3f}"
            f" {us['aiokafka-py'] / us['aioprod']:>6.2f}   {sizes['aioprod']:>9} {sizes['aiokafka']:>10}"
        )
    print("\nµs per record (lower is better); ratio = other / aioprod (> 1: aioprod is faster).")
    print("Default levels: aioprod gzip 6, lz4 fast (as Java's default), zstd 3;")
    print("                aiokafka gzip 9, lz4 9 (HC), zstd 3.")
    print("Both libraries send the records uncompressed when the codec would not shrink them.")


if __name__ == "__main__":
    main()

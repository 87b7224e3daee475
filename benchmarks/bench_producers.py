"""Producer throughput, latency, partition scaling and memory: aioprod vs aiokafka vs confluent-kafka.

    python benchmarks/bench_producers.py [--suites table,latency,scaling,memory] [--records N] [--reps R]
                                         [--quick] [--json out.json] [--update-docs] [--only each,16k,...]
                                         [--profile each|bulk]

Clients: aioprod ``Producer``, aiokafka ``AIOKafkaProducer``, ``confluent_kafka.aio.AIOProducer``
and ``confluent_kafka.Producer`` (librdkafka), all with lz4, linger 5 ms, acks=all and **equal
batch sizes**, on one Tansu broker. Suites:

- ``table``: records/s and CPU µs/record for every cell of batch size (16 KiB, 64 KiB) x keys
  (100 distinct keys, or none) x event loop (asyncio, uvloop) x idempotence (on, off: each client
  as far as it can), for two paths:

  - ``each`` (await-each-send): ``fut = await p.send(topic, v, key=k)`` per record
    (AIOProducer: ``await p.produce(...)``; ``confluent_kafka.Producer``: ``produce()`` +
    ``poll(0)`` per record), then ``flush()`` and check every record's outcome.
  - ``bulk`` (keyless): aioprod ``send_many`` with 10,000 values per call; aiokafka
    ``create_batch``/``send_batch``; ``confluent_kafka.Producer`` ``produce()`` in a tight loop
    with ``poll(0)`` every 10,000 records. AIOProducer has no public batch API.

- ``latency``: keyed records paced at 10,000/s; per-record latency from the ``send()`` call
  to the acknowledgement callback, p50/p99/max, with the garbage collector's pauses beside.
- ``scaling``: keyed await-each over a topic of 1,000 partitions and one of 3 (10,000 keys, so
  that every partition gets records), aioprod beside aiokafka and librdkafka; the 1,000
  partitions again at linger 20 ms, where each partition gathers a few records per linger; and
  both topics again with ten times the records (aioprod and librdkafka only), where each
  partition of 1,000 fills several batches instead of less than one.
- ``memory``: in a subprocess, queue 1,000,000 x 100 B records with the broker SIGSTOPped
  (nothing can be acknowledged) and report (RSS after - RSS before) / records.

Method (details in docs/benchmarks.md): every run is a fresh subprocess against a freshly
restarted broker with a fresh topic; one warm-up record is sent and acknowledged first; runs
are interleaved (rep 1 of every cell and client, then rep 2, ...; the client order rotates per
rep) and the tables show medians. Each run records the CPU that other processes and steal took
meanwhile; a run during which other processes took more than half a core is repeated. All runs
import one snapshot of aioprod/ taken at the start.

Profiling: ``--profile each|bulk`` runs one client's path under py-spy and prints the top
functions by self and inclusive time (raw stacks are kept for flame graphs).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import datetime
import gc
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

# The benchmarks directory (for ``common``) and the checkout itself: benchmark the working tree,
# whatever aioprod the environment has installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from common import (  # noqa: E402
    Tansu,
    cpu_seconds,
    create_topic,
    machine_info,
    peak_rss_bytes,
    read_topic,
    rss_bytes,
    system_busy_seconds,
    system_steal_seconds,
)

CLIENTS = ("aioprod", "aiokafka", "AIOProducer", "Producer")
#: aioprod as of another git revision (``--baseline REF``): what a change costs or gains.
BASELINE = "aioprod-baseline"
#: Where each client's rows go in a table: a baseline right after aioprod.
ROW_ORDER = {c: i for i, c in enumerate(("aioprod", BASELINE, *CLIENTS[1:]))}
LABELS = {
    "aioprod": "aioprod",
    BASELINE: "aioprod @ baseline",
    "aiokafka": "aiokafka",
    "AIOProducer": "confluent_kafka.aio.AIOProducer",
    "Producer": "confluent_kafka.Producer",
}
SHORT = {
    "aioprod": "aioprod",
    BASELINE: "aioprod @ baseline",
    "aiokafka": "aiokafka",
    "AIOProducer": "AIOProducer",
    "Producer": "librdkafka",
}
SUITES = ("table", "latency", "scaling", "memory")
MODES = ("each", "bulk")
MODE_LABELS = {"each": "await-each-send", "bulk": "bulk"}
BATCH_SIZES = (16384, 65536)
LOOPS = ("asyncio", "uvloop")
#: confluent_kafka.Producer runs no event loop: it runs once per cell, shown in both loop rows.
NO_LOOP = "-"
KEY_COUNTS = (100, 0)
#: Cells that cannot run, with the reason the tables give.
NOT_AVAILABLE = {
    ("bulk", None, "AIOProducer"): "no public batch API (its produce() already hands librdkafka batches of 1,000)",
    ("each", True, "aiokafka"): "aiokafka 0.14 only sends InitProducerId v0; Tansu 0.6.0 answers v0-v2 with "
    "UNKNOWN_SERVER_ERROR (v3+ work), so its idempotent producer cannot start; ratios use aiokafka without it",
    ("bulk", True, "aiokafka"): "as above: aiokafka's idempotent producer cannot start against Tansu",
}
MEMORY_CLIENTS = ("aioprod", "aiokafka", "Producer")
LATENCY_CLIENTS = ("aioprod", "aiokafka", "Producer")
SCALING_CLIENTS = ("aioprod", "aiokafka", "Producer")
#: (partitions, linger ms, records as a multiple of --records) of the scaling suite. The target
#: compares 1,000 partitions with 3 at linger 5 ms; the third cell is the same load with a
#: linger long enough for a partition to gather a few records. At 100,000 records a partition
#: of 1,000 gets 100, less than a 16 KiB batch: each of its batches is sent by its linger or by
#: flush(), and the broker's answer to flush()'s last thousand batches (about 100 ms) is a
#: fifth of the run. The last two cells run ten times the records (seven batches a partition),
#: where the steady state outweighs the start and the end.
SCALING_CELLS = ((3, 5, 1), (1000, 5, 1), (1000, 20, 1), (3, 5, 10), (1000, 5, 10))
#: The clients of the long scaling cells: aiokafka takes two minutes a run at 1,000 partitions.
LONG_SCALING_CLIENTS = ("aioprod", "Producer")
SCALING_KEYS = 10_000
CHUNK = 10_000
LINGER_MS = 5
REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks.md"
DOCS_START = "<!-- results:start -->"
DOCS_END = "<!-- results:end -->"

Spec = dict[str, Any]
Result = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Worker side: one client, one path, in its own process.
# ---------------------------------------------------------------------------------------------


def make_values(count: int, size: int, kind: str = "hex") -> list[bytes]:
    """``count`` references into a pool of 1,024 distinct values of ``size`` bytes: random hex
    (lz4: ~3% smaller), or ``json`` events of an application's sort (lz4: ~7 times smaller)."""
    rnd = random.Random(size)
    if kind == "json":
        pool = [
            b'{"user": %d, "event": "page_view", "page": "/catalog/item/%d", "ok": true, "pad": "%s"}'
            % (rnd.randrange(100_000), rnd.randrange(100), b" " * size)
            for _ in range(1024)
        ]
        pool = [v[: size - 2] + b'"}' if len(v) > size else v for v in pool]
    else:
        pool = [rnd.randbytes(size // 2 + 1).hex().encode()[:size] for _ in range(1024)]
    return [pool[i % len(pool)] for i in range(count)]


def make_keys(count: int, distinct: int) -> list[bytes | None]:
    """``count`` keys cycling through ``distinct`` ones (none at all when ``distinct`` is 0)."""
    if not distinct:
        return [None] * count
    pool = [b"key-%05d" % i for i in range(distinct)]
    return [pool[i % distinct] for i in range(count)]


def chunks(values: list[bytes], size: int) -> list[list[bytes]]:
    return [values[i : i + size] for i in range(0, len(values), size)]


class Timer:
    """Times the measured section: wall clock, this process's CPU (all threads, so librdkafka's
    count too), the broker's CPU, the CPU everything else on the machine used meanwhile (other
    people's tests: the noise indicator), and the CPU the hypervisor stole."""

    def __init__(self, broker_pid: int | None = None) -> None:
        self.broker_pid = broker_pid

    def _broker_cpu(self) -> float:
        return cpu_seconds(self.broker_pid) if self.broker_pid else 0.0

    def __enter__(self) -> Timer:
        self.busy0 = system_busy_seconds()
        self.steal0 = system_steal_seconds()
        self.broker0 = self._broker_cpu()
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0
        self.broker_cpu = self._broker_cpu() - self.broker0
        self.steal = system_steal_seconds() - self.steal0
        self.other_cpu = max(0.0, system_busy_seconds() - self.busy0 - self.cpu - self.broker_cpu - self.steal)

    def result(self, **extra: Any) -> Result:
        return {
            "elapsed": self.elapsed,
            "cpu": self.cpu,
            "broker_cpu": self.broker_cpu,
            "other_cpu": self.other_cpu,
            "steal": self.steal,
            **extra,
        }


class GcPauses:
    """The garbage collector's pauses while a section runs (gc.callbacks)."""

    def __enter__(self) -> GcPauses:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def result(self) -> Result:
        full = [s for g, s in self.pauses if g == 2]
        return {
            "gc_collections": len(self.pauses),
            "gc_full": len(full),
            "gc_total_ms": sum(s for _, s in self.pauses) * 1000,
            "gc_max_ms": max((s for _, s in self.pauses), default=0.0) * 1000,
        }


async def settle(futures: list[Any]) -> tuple[int, str | None]:
    """Wait until every future has its outcome; count the failures.

    Called after ``flush()``, when (nearly) all are done already. Cheaper than
    ``asyncio.gather`` (a Python-level callback per future), which would add the same harness
    cost to every async client and blur the ratios.
    """
    pending = [f for f in futures if not f.done()]
    if pending:  # AIOProducer resolves its futures from librdkafka's thread, after flush()
        await asyncio.wait(pending)
    # result(), as ``await fut`` does: aioprod makes a record's RecordMetadata only when asked
    # (the peers make theirs as the ack arrives, inside the clock), so exception() alone would
    # leave that per-record cost out for aioprod only.
    errors: list[BaseException] = []
    for future in futures:
        try:
            future.result()
        except Exception as exc:
            errors.append(exc)
    return len(errors), (repr(errors[0]) if errors else None)


def librdkafka_config(spec: Spec, **extra: Any) -> dict[str, Any]:
    config = {
        "bootstrap.servers": spec["bootstrap"],
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": spec["linger_ms"],
        # batch.num.messages (default 10,000) is never reached by 16/64 KiB of 100 B records.
        "batch.size": spec["batch_size"],
        "enable.idempotence": spec["idempotence"],
        # Keys where aioprod and aiokafka put them (murmur2; librdkafka's default, consistent_random,
        # hashes with CRC32: the benchmark's 100 keys would go 29/42/29% instead of 33/32/35%);
        # keyless records stay sticky, as with consistent_random.
        "partitioner": "murmur2_random",
        # aioprod's (and Java's) 5; librdkafka's default is 1,000,000 without idempotence.
        "max.in.flight.requests.per.connection": 5,
        # aioprod's buffer_memory (32 MiB, in bytes): librdkafka's default queue stops at 100,000
        # messages (each counted until its delivery report is served), under 100 records a
        # partition of 1,000 while aioprod holds about 270,000 100 B records.
        "queue.buffering.max.messages": 0,
        "queue.buffering.max.kbytes": 32 * 1024,
        "log_level": 3,
    }
    config.update(extra)
    return config


def aioprod_options(spec: Spec, **extra: Any) -> dict[str, Any]:
    """aioprod's Producer options for a run (as librdkafka_config is confluent's)."""
    return {
        "bootstrap_servers": spec["bootstrap"],
        "acks": "all",
        "compression_type": "lz4",
        "linger_ms": spec["linger_ms"],
        "batch_size": spec["batch_size"],
        "enable_idempotence": spec["idempotence"],
        **extra,
    }


def aiokafka_fast_lz4() -> None:
    """aiokafka 0.14 compresses lz4 at level 9 (LZ4-HC: ``aiokafka.codec.lz4_encode``'s default,
    with no producer option to change it); aioprod and librdkafka use lz4's fast mode (level 0).
    HC costs about 3.5x the CPU of a 16 KiB batch and 10x of a 64 KiB one, so aiokafka's record
    builders get level 0 too: every client pays for the same compression."""
    import importlib

    encode = getattr(importlib.import_module("aiokafka.codec"), "lz4_encode")  # noqa: B009 (no stubs)

    def lz4_fast(payload: Any, level: int = 0) -> bytes:
        return bytes(encode(payload, level))

    for name in ("default_records", "legacy_records", "_crecords.default_records", "_crecords.legacy_records"):
        with contextlib.suppress(ImportError):  # the compiled builders, when aiokafka has them
            module = importlib.import_module(f"aiokafka.record.{name}")
            if hasattr(module, "lz4_encode"):
                setattr(module, "lz4_encode", lz4_fast)  # noqa: B010


def aiokafka_options(spec: Spec, **extra: Any) -> dict[str, Any]:
    """AIOKafkaProducer's options for a run."""
    return {
        "bootstrap_servers": spec["bootstrap"],
        "acks": "all",
        "compression_type": "lz4",
        "linger_ms": spec["linger_ms"],
        "max_batch_size": spec["batch_size"],
        "enable_idempotence": spec["idempotence"],
        **extra,
    }


async def timed(
    spec: Spec, queue_all: Callable[[Callable[[Any], None]], Awaitable[None]], flush: Callable[[], Awaitable[Any]]
) -> Result:
    """Time one async path: queue every record (``queue_all`` hands each future it gets to
    the append it is given), flush, and collect every record's outcome."""
    futures: list[Any] = []
    with Timer(spec.get("broker_pid")) as timer, GcPauses() as pauses:
        await queue_all(futures.append)
        await flush()
        errors, first = await settle(futures)
    return timer.result(errors=errors, first_error=first, **pauses.result())


def each(
    send: Callable[..., Awaitable[Any]], topic: str, values: list[bytes], keys: list[bytes | None]
) -> Callable[..., Awaitable[None]]:
    """The await-each path for ``timed``: one ``await send(topic, value, key=key)`` per record."""
    return lambda append: _queue_all(send, append, topic, values, keys)


async def _queue_all(
    send: Callable[..., Awaitable[Any]],
    append: Callable[[Any], None],
    topic: str,
    values: list[bytes],
    keys: list[bytes | None],
) -> None:
    for value, key in zip(values, keys, strict=True):
        append(await send(topic, value, key=key))


async def run_aioprod(spec: Spec, values: list[bytes], keys: list[bytes | None]) -> Result:
    from aioprod import Producer

    topic = spec["topic"]
    async with Producer(**aioprod_options(spec)) as producer:
        await (await producer.send(topic, b"warm-up"))
        if spec["mode"] == "each":
            return await timed(spec, each(producer.send, topic, values, keys), producer.flush)
        parts = chunks(values, CHUNK)

        async def queue_parts(append: Callable[[Any], None]) -> None:
            for part in parts:
                append(await producer.send_many(topic, part))

        return await timed(spec, queue_parts, producer.flush)


async def run_aiokafka(spec: Spec, values: list[bytes], keys: list[bytes | None]) -> Result:
    from aiokafka import AIOKafkaProducer

    aiokafka_fast_lz4()
    topic = spec["topic"]
    producer = AIOKafkaProducer(**aiokafka_options(spec))
    await producer.start()
    try:
        await (await producer.send(topic, b"warm-up"))
        if spec["mode"] == "each":
            return await timed(spec, each(producer.send, topic, values, keys), producer.flush)
        partitions = sorted(await producer.partitions_for(topic))

        async def queue_batches(append: Callable[[Any], None]) -> None:
            index, total, turn = 0, len(values), 0
            while index < total:
                batch = producer.create_batch()
                while index < total and batch.append(key=None, value=values[index], timestamp=None) is not None:
                    index += 1
                append(await producer.send_batch(batch, topic, partition=partitions[turn % len(partitions)]))
                turn += 1

        return await timed(spec, queue_batches, producer.flush)
    finally:
        await producer.stop()


async def run_aioproducer(spec: Spec, values: list[bytes], keys: list[bytes | None]) -> Result:
    from confluent_kafka.aio import AIOProducer

    if spec["mode"] != "each":
        raise ValueError("AIOProducer has no public batch API")
    topic = spec["topic"]
    producer = AIOProducer(librdkafka_config(spec))
    try:
        warm = await producer.produce(topic, b"warm-up")
        await producer.flush()
        await warm

        # produce(topic, value, key) takes send()'s arguments as they are: no wrapper coroutine.
        return await timed(spec, each(producer.produce, topic, values, keys), producer.flush)
    finally:
        await producer.close()


def run_producer(spec: Spec, values: list[bytes], keys: list[bytes | None]) -> Result:
    from confluent_kafka import Producer

    topic = spec["topic"]
    failures: list[Any] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    # The bulk path learns every record's outcome as aioprod's send_many (one future a call) and
    # aiokafka's send_batch (one a batch) do: failures one by one, successes not one by one
    # (librdkafka reports only failed records; flush() returns how many are left undelivered).
    only_errors = {"delivery.report.only.error": True} if spec["mode"] == "bulk" else {}
    producer = Producer(librdkafka_config(spec, on_delivery=on_delivery, **only_errors))
    producer.produce(topic, b"warm-up")
    producer.flush(30)
    produce, poll = producer.produce, producer.poll
    every = 1 if spec["mode"] == "each" else CHUNK
    with Timer(spec.get("broker_pid")) as timer:
        for index, (value, key) in enumerate(zip(values, keys, strict=True)):
            while True:
                try:
                    produce(topic, value, key)
                    break
                except BufferError:  # librdkafka's queue is full: serve delivery reports, retry
                    poll(0.001)
            if index % every == 0:
                poll(0)
        remaining = producer.flush(120)
    return timer.result(
        errors=len(failures) + remaining,
        first_error=repr(failures[0]) if failures else (f"{remaining} undelivered" if remaining else None),
    )


# -- latency: paced sends, per-record ack latency -------------------------------------------------


class Latencies:
    """Send time → ack time of every record, by index."""

    def __init__(self, count: int) -> None:
        self.sent = [0.0] * count
        self.acked = [0.0] * count
        self.errors = 0
        self.first_error: str | None = None
        self.outstanding = 0

    def done(self, index: int, error: Any) -> None:
        self.acked[index] = time.perf_counter()
        self.outstanding -= 1
        if error is not None:
            self.errors += 1
            self.first_error = self.first_error or repr(error)

    def result(self, elapsed: float) -> Result:
        ms = sorted((a - s) * 1000 for s, a in zip(self.sent, self.acked, strict=True))
        worst = max(range(len(self.sent)), key=lambda i: self.acked[i] - self.sent[i])

        def pct(p: float) -> float:
            return ms[min(len(ms) - 1, int(p / 100 * len(ms)))]

        return {
            "elapsed": elapsed,
            "errors": self.errors,
            "first_error": self.first_error,
            "p50_ms": pct(50),
            "p99_ms": pct(99),
            "p999_ms": pct(99.9),
            "max_ms": ms[-1],
            # When the worst record was sent (seconds into the run): a stall at the start, or later?
            "max_at_s": self.sent[worst] - self.sent[0],
        }


def paced_schedule(count: int, rate: float) -> Iterator[tuple[int, float]]:
    """(index, seconds from the start when it is due), as Java's ThroughputThrottler paces."""
    return ((i, i / rate) for i in range(count))


async def latency_async(
    spec: Spec,
    send: Callable[[bytes, bytes | None], Awaitable[Any]],
    values: list[bytes],
    keys: list[bytes | None],
) -> Result:
    lat = Latencies(len(values))
    loop = asyncio.get_running_loop()
    rate = spec["rate"]
    with Timer(spec.get("broker_pid")) as timer, GcPauses() as pauses:
        started = time.perf_counter()
        for i, due in paced_schedule(len(values), rate):
            ahead = started + due - time.perf_counter()
            if ahead > 0.001:
                await asyncio.sleep(ahead)
            lat.sent[i] = time.perf_counter()
            lat.outstanding += 1
            future = await send(values[i], keys[i])
            future.add_done_callback(lambda f, i=i: lat.done(i, f.exception()))
        while lat.outstanding:
            await asyncio.sleep(0.001)
    del loop
    return {**timer.result(), **lat.result(timer.elapsed), **pauses.result()}


async def latency_aioprod(spec: Spec, values: list[bytes], keys: list[bytes | None]) -> Result:
    from aioprod import Producer

    topic = spec["topic"]
    async with Producer(**aioprod_options(spec)) as producer:
        await (await producer.send(topic, b"warm-up"))
        return await latency_async(spec, lambda v, k: producer.send(topic, v, k), values, keys)


async def latency_aiokafka(spec: Spec, values: list[bytes], keys: list[bytes | None]) -> Result:
    from aiokafka import AIOKafkaProducer

    aiokafka_fast_lz4()
    topic = spec["topic"]
    producer = AIOKafkaProducer(**aiokafka_options(spec))
    await producer.start()
    try:
        await (await producer.send(topic, b"warm-up"))
        return await latency_async(spec, lambda v, k: producer.send(topic, v, key=k), values, keys)
    finally:
        await producer.stop()


def latency_producer(spec: Spec, values: list[bytes], keys: list[bytes | None]) -> Result:
    from confluent_kafka import Producer

    topic = spec["topic"]
    lat = Latencies(len(values))
    producer = Producer(librdkafka_config(spec))
    producer.produce(topic, b"warm-up")
    producer.flush(30)
    rate = spec["rate"]
    with Timer(spec.get("broker_pid")) as timer:
        started = time.perf_counter()
        for i, due in paced_schedule(len(values), rate):
            ahead = started + due - time.perf_counter()
            while ahead > 0.001:  # wait by serving delivery reports, as a paced librdkafka app does
                producer.poll(ahead)
                ahead = started + due - time.perf_counter()
            lat.sent[i] = time.perf_counter()
            lat.outstanding += 1
            producer.produce(topic, values[i], keys[i], on_delivery=lambda err, _msg, i=i: lat.done(i, err))
            producer.poll(0)
        while lat.outstanding:
            producer.poll(0.001)
    return {**timer.result(), **lat.result(timer.elapsed)}


# -- memory: what a queued record costs ------------------------------------------------------------


async def memory_aioprod(spec: Spec, values: list[bytes], _keys: list[bytes | None]) -> Result:
    from aioprod import Producer

    topic = spec["topic"]
    producer = Producer(**aioprod_options(spec, buffer_memory=4 << 30))
    return await measure_send_queue(spec, producer, topic, values)


async def memory_aiokafka(spec: Spec, values: list[bytes], _keys: list[bytes | None]) -> Result:
    from aiokafka import AIOKafkaProducer

    aiokafka_fast_lz4()
    topic = spec["topic"]
    # aiokafka queues one open batch per partition and waits for it to drain when it is
    # full; a huge batch lets the whole run queue without waiting on the broker.
    producer = AIOKafkaProducer(**aiokafka_options(spec, max_batch_size=1 << 30))
    return await measure_send_queue(spec, producer, topic, values)


async def measure_send_queue(spec: Spec, producer: Any, topic: str, values: list[bytes]) -> Result:
    """Start an aioprod or aiokafka producer, warm it up, then measure queuing ``values``."""
    await producer.start()
    await (await producer.send(topic, b"warm-up"))
    futures: list[Any] = []
    keys: list[bytes | None] = [None] * len(values)
    return await measure_queue(spec, lambda: _queue_all(producer.send, futures.append, topic, values, keys), futures)


@contextlib.contextmanager
def broker_paused(spec: Spec) -> Iterator[None]:
    """SIGSTOP the broker while records are queued, so that nothing can be acknowledged (and
    freed) during the measurement, whether or not the client sends while it queues."""
    pid = spec.get("broker_pid")
    if pid:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)


async def measure_queue(spec: Spec, queue_all: Callable[[], Coroutine[Any, Any, None]], futures: list[Any]) -> Result:
    # The futures list (8 B/record, which every client needs to hand the futures back) counts
    # for every client alike.
    with broker_paused(spec):
        gc.collect()
        before = rss_bytes()
        with Timer() as timer:
            await queue_all()
        after = rss_bytes()
    return {
        "rss_before": before,
        "rss_after": after,
        "peak_rss": peak_rss_bytes(),
        "queued": len(futures),
        "done_when_measured": sum(1 for f in futures if f.done()),
        "elapsed": timer.elapsed,
    }


def memory_producer(spec: Spec, values: list[bytes], _keys: list[bytes | None]) -> Result:
    from confluent_kafka import Producer

    topic = spec["topic"]
    delivered: list[int] = [0]

    def on_delivery(_error: Any, _message: Any) -> None:
        delivered[0] += 1

    producer = Producer(
        librdkafka_config(
            spec,
            on_delivery=on_delivery,
            **{"queue.buffering.max.messages": 2 * len(values) + 10, "queue.buffering.max.kbytes": 2**31 - 1},
        )
    )
    producer.produce(topic, b"warm-up")
    producer.flush(30)
    delivered[0] = 0
    produce = producer.produce
    with broker_paused(spec):
        gc.collect()
        before = rss_bytes()
        with Timer() as timer:
            for value in values:
                produce(topic, value)  # no poll(): every message stays allocated until its report is served
        after = rss_bytes()
        producer.poll(0)  # serve whatever reports exist, to count them
    return {
        "rss_before": before,
        "rss_after": after,
        "peak_rss": peak_rss_bytes(),
        "queued": len(values),
        "done_when_measured": delivered[0],
        "elapsed": timer.elapsed,
    }


def run_async(coro: Coroutine[Any, Any, Result], loop_name: str) -> Result:
    if loop_name == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


WORKERS: dict[str, dict[str, Callable[[Spec, list[bytes], list[bytes | None]], Any]]] = {
    "throughput": {
        "aioprod": run_aioprod,
        "aiokafka": run_aiokafka,
        "AIOProducer": run_aioproducer,
        "Producer": run_producer,
    },
    "latency": {"aioprod": latency_aioprod, "aiokafka": latency_aiokafka, "Producer": latency_producer},
    "memory": {"aioprod": memory_aioprod, "aiokafka": memory_aiokafka, "Producer": memory_producer},
}


def worker(spec: Spec) -> Result:
    if spec.get("src"):
        # The snapshot of aioprod taken when the run started. ``common`` imported the working
        # tree's already: forget it, or the snapshot is ignored.
        for name in [m for m in sys.modules if m == "aioprod" or m.startswith("aioprod.")]:
            del sys.modules[name]
        sys.path.insert(0, spec["src"])
        import aioprod

        assert aioprod.__file__ is not None and aioprod.__file__.startswith(spec["src"]), aioprod.__file__
    values = make_values(spec["records"], spec["value_size"], spec.get("values", "hex"))
    keys = make_keys(spec["records"], spec["keys"])
    client = "aioprod" if spec["client"] == BASELINE else spec["client"]
    result = WORKERS[spec["kind"]][client](spec, values, keys)
    if asyncio.iscoroutine(result):
        result = run_async(result, spec["loop"])
    if client == "aioprod":
        try:
            from aioprod._compiled import COMPILED
        except ImportError:  # a baseline from before the compiled hot path
            COMPILED = False
        result["compiled"] = COMPILED
    return dict(result)


# ---------------------------------------------------------------------------------------------
# Driver side: plan, run the workers, aggregate, print.
# ---------------------------------------------------------------------------------------------


def snapshot_source() -> str:
    """Copy the working tree's aioprod/ aside (with a compiled extension, if built), so that every
    run of this benchmark measures the same code even while it is being edited; returns the
    directory to put on sys.path."""
    directory = tempfile.mkdtemp(prefix="aioprod-bench-")
    shutil.copytree(REPO / "aioprod", Path(directory) / "aioprod", ignore=shutil.ignore_patterns("__pycache__"))
    return directory


def export_source(ref: str) -> str:
    """aioprod/ as of git revision ``ref``, in a directory to put on sys.path (``--baseline``),
    with its C extension built when it has one."""
    directory = tempfile.mkdtemp(prefix="aioprod-bench-baseline-")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "aioprod"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
    if (Path(directory) / "aioprod" / "_speedups.c").exists():
        setup = (
            "from setuptools import Extension, setup; "
            "setup(name='aioprod-baseline', ext_modules=[Extension('aioprod._speedups', ['aioprod/_speedups.c'])])"
        )
        build = [sys.executable, "-c", setup, "build_ext", "--inplace", "--build-temp", "build"]
        subprocess.run(build, cwd=directory, check=True, capture_output=True)
    return directory


def tree_digest(root: Path) -> str:
    """A short digest of the snapshot's .py files, to tell runs of different code apart."""
    digest = hashlib.sha1()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.c")]):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def launch(spec: Spec, timeout: float) -> Result:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stack = dump_stack(proc.pid)
        proc.kill()
        proc.communicate()
        return {"failed": f"timed out after {timeout:.0f}s", "stack": stack}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        return {"failed": f"exit {proc.returncode}: {' | '.join(tail)}", "stderr": stderr[-5000:]}
    result: Result = json.loads(lines[-1])
    return result


def dump_stack(pid: int) -> str:
    """A hung worker's Python stacks (py-spy, when installed), kept in the JSON for diagnosis."""
    try:
        dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no stack: {exc}"
    return dump.stdout + dump.stderr


def one_run(broker: Tansu, spec: Spec, timeout: float, verify: bool) -> Result:
    broker.restart()
    partitions = spec["partitions"]
    spec = dict(spec, bootstrap=broker.bootstrap, topic=f"bench-{uuid.uuid4().hex[:12]}", broker_pid=broker.pid)
    create_topic(broker.bootstrap, spec["topic"], partitions)
    result = launch(spec, timeout)
    result["broker_rss"] = rss_bytes(broker.pid)
    if "failed" not in result and spec["kind"] in ("throughput", "latency"):
        if result["errors"]:
            result["failed"] = f"{result['errors']} delivery errors, first: {result['first_error']}"
        elif verify:
            try:
                problem = stored_problem(spec, read_topic(broker.bootstrap, spec["topic"], partitions))
            except RuntimeError as exc:
                problem = str(exc)
            result["verified"] = problem is None
            if problem is not None:
                result["failed"] = f"verification: {problem}"
    return {**spec, **result}


Record = tuple[bytes | None, bytes | None]


def stored_problem(spec: Spec, stored: dict[int, list[Record]]) -> str | None:
    """What is wrong with what a run left on the broker, or None: every record sent (the
    warm-up first) stored exactly once, and each partition's records in the order they were sent.

    A count alone would pass a record lost and another written twice."""
    sent: list[Record] = [(None, b"warm-up")]
    values = make_values(spec["records"], spec["value_size"], spec.get("values", "hex"))
    sent += zip(make_keys(spec["records"], spec["keys"]), values, strict=True)
    held = Counter(record for records in stored.values() for record in records)
    if held != Counter(sent):
        missing, extra = Counter(sent) - held, held - Counter(sent)
        return (
            f"the broker holds {sum(held.values())} records for {len(sent)} sent: "
            f"{sum(missing.values())} missing, {sum(extra.values())} extra or written twice"
        )
    # The records are not unique (values cycle through a pool), so each partition must be a
    # subsequence of the send order: take every record at its next sending after the one before.
    sendings: dict[Record, list[int]] = {}
    for position, record in enumerate(sent):
        sendings.setdefault(record, []).append(position)
    for partition, records in stored.items():
        after = -1
        for offset, record in enumerate(records):
            positions = sendings[record]
            at = bisect.bisect_right(positions, after)
            if at == len(positions):
                return f"partition {partition} holds offset {offset} out of the order it was sent in"
            after = positions[at]
    return None


def not_available(mode: str, idempotence: bool, client: str) -> str | None:
    return NOT_AVAILABLE.get((mode, None, client)) or NOT_AVAILABLE.get((mode, idempotence, client))


def base_spec(**fields: Any) -> Spec:
    spec: Spec = {
        "kind": "throughput",
        "mode": "each",
        "value_size": 100,
        "batch_size": 16384,
        "keys": 0,
        "idempotence": True,
        "partitions": 3,
        "linger_ms": LINGER_MS,
        "loop": "uvloop",
    }
    spec.update(fields)
    return spec


def table_plan(records: int, value_size: int) -> list[Spec]:
    """Every cell of the throughput table: mode x batch size x keys x idempotence x client x loop."""
    cells = []
    for mode in MODES:
        for batch_size in BATCH_SIZES:
            for keys in KEY_COUNTS if mode == "each" else (0,):
                for idempotence in (True, False):
                    for client in CLIENTS:
                        if not_available(mode, idempotence, client):
                            continue
                        for loop in (NO_LOOP,) if client == "Producer" else LOOPS:
                            cells.append(
                                base_spec(
                                    suite="table",
                                    client=client,
                                    mode=mode,
                                    batch_size=batch_size,
                                    keys=keys,
                                    idempotence=idempotence,
                                    loop=loop,
                                    value_size=value_size,
                                    records=records,
                                )
                            )
    return cells


def latency_plan(rate: int, seconds: float, loop: str) -> list[Spec]:
    """Paced keyed sends: every client with its default idempotence where it can have it."""
    return [
        base_spec(
            suite="latency",
            kind="latency",
            client=client,
            keys=100,
            idempotence=client != "aiokafka",
            loop=NO_LOOP if client == "Producer" else loop,
            rate=rate,
            records=int(rate * seconds),
        )
        for client in LATENCY_CLIENTS
    ]


def scaling_plan(records: int, loop: str) -> list[Spec]:
    return [
        base_spec(
            suite="scaling",
            client=client,
            keys=SCALING_KEYS,
            idempotence=client != "aiokafka",
            partitions=partitions,
            linger_ms=linger_ms,
            loop=NO_LOOP if client == "Producer" else loop,
            records=records * scale,
        )
        for partitions, linger_ms, scale in SCALING_CELLS
        for client in (SCALING_CLIENTS if scale == 1 else LONG_SCALING_CLIENTS)
    ]


def memory_plan(records: int, loop: str) -> list[Spec]:
    return [
        base_spec(
            suite="memory", kind="memory", client=client, mode="memory", idempotence=False, loop=loop, records=records
        )
        for client in MEMORY_CLIENTS
    ]


def group_key(spec: Spec) -> tuple[Any, ...]:
    """The cell a run belongs to, without the client and loop (interleaving rotates those)."""
    return (
        spec["suite"],
        spec["mode"],
        spec["batch_size"],
        spec["keys"],
        spec["idempotence"],
        spec["partitions"],
        spec.get("linger_ms", LINGER_MS),  # runs saved before the linger was a field: its constant
        spec["records"],
    )


#: Where a cell's key (``cell_key``) holds the fields the tables pick out.
PARTITIONS, LINGER, RECORDS, CLIENT, LOOP = 5, 6, 7, 8, 9


def cell_key(spec: Spec) -> tuple[Any, ...]:
    return (*group_key(spec), spec["client"], spec["loop"])


def rotate(specs: list[Spec], rep: int) -> list[Spec]:
    """Keep cells in order; within each cell, start the client order at a different client per rep."""
    out: list[Spec] = []
    cell: list[Spec] = []
    key = None
    for spec in [*specs, {}]:
        spec_key = group_key(spec) if spec else None
        if cell and spec_key != key:
            shift = rep % len(cell)
            out.extend(cell[shift:] + cell[:shift])
            cell = []
        key = spec_key
        if spec:
            cell.append(spec)
    return out


def other_load(run: Result) -> float:
    """Cores used by unrelated processes during the run's timed section."""
    return float(run.get("other_cpu", 0.0)) / max(float(run.get("elapsed", 1.0)), 1e-9)


def steal_load(run: Result) -> float:
    return float(run.get("steal", 0.0)) / max(float(run.get("elapsed", 1.0)), 1e-9)


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(runs: list[Result]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Per cell: medians of every figure over the runs that did not fail."""
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for run in runs:
        groups.setdefault(cell_key(run), []).append(run)
    cells = {}
    for key, group in groups.items():
        ok = [r for r in group if "failed" not in r]
        first = group[0]
        row: dict[str, Any] = {
            "suite": first["suite"],
            "client": first["client"],
            "loop": first["loop"],
            "runs": len(group),
            "failed": [r["failed"] for r in group if "failed" in r],
            "other_cores": median_or_none([other_load(r) for r in ok]),
            "steal_cores": median_or_none([steal_load(r) for r in ok]),
        }
        if first["kind"] in ("throughput", "latency"):
            rates = [r["records"] / r["elapsed"] for r in ok]
            row.update(
                records_per_s=median_or_none(rates),
                min_records_per_s=min(rates) if rates else None,
                max_records_per_s=max(rates) if rates else None,
                client_cpu_us=median_or_none([r["cpu"] / r["records"] * 1e6 for r in ok]),
                broker_cpu_us=median_or_none([r["broker_cpu"] / r["records"] * 1e6 for r in ok]),
            )
            for name in ("gc_full", "gc_total_ms", "gc_max_ms", "p50_ms", "p99_ms", "p999_ms", "max_ms", "max_at_s"):
                values = [r[name] for r in ok if name in r]
                row[name] = median_or_none(values)
            row["worst_max_ms"] = max((r["max_ms"] for r in ok if "max_ms" in r), default=None)
        else:
            per_record = [(r["rss_after"] - r["rss_before"]) / r["records"] for r in ok]
            row.update(
                records=first["records"],
                bytes_per_record=median_or_none(per_record),
                rss_delta_mb=median_or_none([(r["rss_after"] - r["rss_before"]) / 2**20 for r in ok]),
                queue_seconds=median_or_none([r["elapsed"] for r in ok]),
                acked_when_measured=max((r["done_when_measured"] for r in ok), default=0),
            )
        cells[key] = row
    return cells


def fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def rate_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if row.get("records_per_s") is None:
        return "failed: " + "; ".join(row["failed"])[:60]
    failed = f" ({len(row['failed'])} failed)" if row["failed"] else ""
    return f"{row['records_per_s'] / 1000:,.0f}k ({row['client_cpu_us']:.1f}){failed}"


def ratio(mine: dict[str, Any] | None, theirs: dict[str, Any] | None) -> float | None:
    if not mine or not theirs or not mine.get("records_per_s") or not theirs.get("records_per_s"):
        return None
    return float(mine["records_per_s"]) / float(theirs["records_per_s"])


def batch_label(size: int) -> str:
    return f"{size // 1024} KiB"


def table_lookup(cells: dict[tuple[Any, ...], dict[str, Any]]) -> Callable[..., dict[str, Any] | None]:
    records = next((key[RECORDS] for key in cells if key[0] == "table"), 0)  # one count for the whole table

    def get(
        mode: str, batch: int, keys: int, idempotence: bool, client: str, loop: str, partitions: int = 3
    ) -> dict[str, Any] | None:
        loop = NO_LOOP if client == "Producer" else loop
        return cells.get(("table", mode, batch, keys, idempotence, partitions, LINGER_MS, records, client, loop))

    return get


def throughput_tables(cells: dict[tuple[Any, ...], dict[str, Any]]) -> str:
    get = table_lookup(cells)
    present = {k for k in cells if k[0] == "table"}
    baseline = any(k[CLIENT] == BASELINE for k in present)
    out: list[str] = []
    notes: dict[str, int] = {}
    for mode in MODES:
        rows = []
        columns = ("aioprod", *((BASELINE,) if baseline else ()))
        columns += CLIENTS[1:] if mode == "each" else ("aiokafka", "Producer")
        for batch in BATCH_SIZES:
            for keys in KEY_COUNTS:
                for loop in LOOPS:
                    for idempotence in (True, False):
                        if not any(k[1:5] == (mode, batch, keys, idempotence) for k in present):
                            continue
                        entries = {c: get(mode, batch, keys, idempotence, c, loop) for c in (*CLIENTS, BASELINE)}
                        if entries["aioprod"] is None:
                            continue
                        cols = []
                        for client in columns:
                            reason = not_available(mode, idempotence, client)
                            if reason:
                                cols.append(f"N/A ({notes.setdefault(reason, len(notes) + 1)})")
                            else:
                                cols.append(rate_cell(entries[client]))
                        aiokafka = entries["aiokafka"] or get(mode, batch, keys, False, "aiokafka", loop)
                        vs_aiokafka = ratio(entries["aioprod"], aiokafka)
                        vs_rdkafka = ratio(entries["aioprod"], entries["Producer"])
                        loads = [e for e in entries.values() if e and e.get("other_cores") is not None]
                        other = max((e["other_cores"] for e in loads), default=None)
                        steal = max((e["steal_cores"] for e in loads), default=None)
                        rows.append(
                            [
                                batch_label(batch),
                                f"{keys} keys" if keys else "none",
                                loop,
                                "on" if idempotence else "off",
                                *cols,
                                fmt(vs_aiokafka, ".2f") + ("" if entries["aiokafka"] or not aiokafka else "*"),
                                fmt(vs_rdkafka, ".2f"),
                                f"{fmt(other, '.2f')} / {fmt(steal, '.2f')}",
                            ]
                        )
        if not rows:
            continue
        header = ["batch", "keys", "loop", "idempotence", *(SHORT[c] for c in columns)]
        header += ["x aiokafka", "x librdkafka", "other load / steal"]
        out += [
            f"**{MODE_LABELS[mode]}** — records/s (client CPU µs/record), medians:",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * 4 + "--:|" * (len(header) - 4),
            *("| " + " | ".join(r) + " |" for r in rows),
            "",
        ]
    if notes:
        out += [f"N/A ({number}): {reason}." for reason, number in notes.items()]
        out += [
            "",
            "\\* against aiokafka without idempotence. librdkafka runs no event loop: its figure is the "
            "same in both loop rows. *other load / steal*: cores used by other processes / stolen by the "
            "hypervisor during the timed section (medians; the highest of the row's clients).",
        ]
    return "\n".join(out)


def latency_table(cells: dict[tuple[Any, ...], dict[str, Any]]) -> str:
    rows = [row for key, row in cells.items() if key[0] == "latency"]
    if not rows:
        return ""
    lines = [
        "| client | loop | p50 ms | p99 ms | p99.9 ms | max ms (worst run) | worst at s | full GCs | "
        "longest GC ms | CPU µs/rec | other load / steal |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in sorted(rows, key=lambda r: (ROW_ORDER[r["client"]], r["loop"])):
        if row.get("p50_ms") is None:
            lines.append(f"| {SHORT[row['client']]} | {row['loop']} | failed: {'; '.join(row['failed'])[:80]} |")
            continue
        lines.append(
            f"| {SHORT[row['client']]} | {row['loop']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
            f"| {row['p999_ms']:.2f} | {row['max_ms']:.1f} ({row['worst_max_ms']:.1f}) | {row['max_at_s']:.2f} "
            f"| {fmt(row['gc_full'], '.0f')} | {fmt(row['gc_max_ms'], '.1f')} | {row['client_cpu_us']:.1f} "
            f"| {fmt(row['other_cores'], '.2f')} / {fmt(row['steal_cores'], '.2f')} |"
        )
    return "\n".join(lines)


def scaling_rows(cells: dict[tuple[Any, ...], dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The scaling suite's cells by (partitions, linger ms, records, client)."""
    return {
        (key[PARTITIONS], key[LINGER], key[RECORDS], key[CLIENT]): row
        for key, row in cells.items()
        if key[0] == "scaling"
    }


def scaling_table(cells: dict[tuple[Any, ...], dict[str, Any]]) -> str:
    rows = scaling_rows(cells)
    if not rows:
        return ""
    lines = [
        "| client | records | partitions | linger ms | records/s | CPU µs/rec | x its 3-partition figure "
        "| other load / steal |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for client in sorted({client for *_, client in rows}, key=ROW_ORDER.__getitem__):
        for records in sorted({records for _, _, records, _ in rows}):
            for partitions, linger_ms in dict.fromkeys(cell[:2] for cell in SCALING_CELLS):
                row = rows.get((partitions, linger_ms, records, client))
                if row is None:
                    continue
                where = f"| {SHORT[client]} | {records:,} | {partitions:,} | {linger_ms} |"
                if row.get("records_per_s") is None:
                    lines.append(f"{where} failed: {'; '.join(row['failed'])[:80]} | | | |")
                    continue
                versus = ratio(row, rows.get((3, LINGER_MS, records, client)))
                lines.append(
                    f"{where} {row['records_per_s']:,.0f} | {row['client_cpu_us']:.1f} "
                    f"| {fmt(versus, '.2f')} | {fmt(row['other_cores'], '.2f')} / {fmt(row['steal_cores'], '.2f')} |"
                )
    return "\n".join(lines)


def memory_table(cells: dict[tuple[Any, ...], dict[str, Any]]) -> str:
    rows = [row for key, row in cells.items() if key[0] == "memory"]
    if not rows:
        return ""
    base = next((r["bytes_per_record"] for r in rows if r["client"] == "aioprod"), None)
    lines = [
        "| client | records queued | RSS growth | bytes/record | x aioprod | time to queue | acked meanwhile |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in sorted(rows, key=lambda r: ROW_ORDER[r["client"]]):
        if row["bytes_per_record"] is None:
            lines.append(f"| {LABELS[row['client']]} | failed: {'; '.join(row['failed'])[:100]} | | | | | |")
            continue
        versus = row["bytes_per_record"] / base if base else None
        lines.append(
            f"| {LABELS[row['client']]} | {row['records']:,} | {row['rss_delta_mb']:,.0f} MiB "
            f"| {row['bytes_per_record']:,.0f} | {fmt(versus, '.2f')} "
            f"| {row['queue_seconds']:.2f} s | {row['acked_when_measured']:,} |"
        )
    return "\n".join(lines)


def target_lines(cells: dict[tuple[Any, ...], dict[str, Any]]) -> list[str]:
    get = table_lookup(cells)
    out = []

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    worst: tuple[float, str] | None = None
    worst_cpu: tuple[float, str] | None = None
    missing: list[str] = []  # cells of the target with no valid result: "every cell" is then unproven
    for batch in BATCH_SIZES:
        for keys in KEY_COUNTS:
            for loop in LOOPS:
                for idempotence in (True, False):
                    mine = get("each", batch, keys, idempotence, "aioprod", loop)
                    exact = get("each", batch, keys, idempotence, "aiokafka", loop)
                    theirs = exact or get("each", batch, keys, False, "aiokafka", loop)
                    where = (
                        f"{batch_label(batch)}, {'100 keys' if keys else 'keyless'}, {loop}, "
                        f"idempotence {'on' if idempotence else 'off'}"
                    )
                    value = ratio(mine, theirs)
                    if value is None:
                        missing.append(where)
                    if value is not None and (worst is None or value < worst[0]):
                        worst = (value, where + ("" if exact else ", against aiokafka without it"))
                    if mine and mine.get("client_cpu_us") is not None:
                        cpu = float(mine["client_cpu_us"])
                        if worst_cpu is None or cpu > worst_cpu[0]:
                            worst_cpu = (cpu, where)
    gaps = f" ({len(missing)} cells without a valid result, e.g. {missing[0]})" if missing else ""
    if worst is not None:
        out.append(
            f"- await-each ≥ 2.5x aiokafka in every cell: lowest {worst[0]:.2f}x ({worst[1]}){gaps}: "
            f"{verdict(worst[0] >= 2.5 and not missing)}"
        )
    if worst_cpu is not None:
        out.append(
            f"- await-each CPU ≤ 3 µs/record in every cell: highest {worst_cpu[0]:.2f} µs ({worst_cpu[1]}){gaps}: "
            f"{verdict(worst_cpu[0] <= 3.0 and not missing)}"
        )
    lowest_bulk: tuple[float, str] | None = None
    bulk_missing = 0
    for batch in BATCH_SIZES:
        for loop in LOOPS:
            for idempotence in (True, False):
                value = ratio(
                    get("bulk", batch, 0, idempotence, "aioprod", loop),
                    get("bulk", batch, 0, idempotence, "Producer", loop),
                )
                where = f"{batch_label(batch)}, {loop}, idempotence {'on' if idempotence else 'off'}"
                bulk_missing += value is None
                if value is not None and (lowest_bulk is None or value < lowest_bulk[0]):
                    lowest_bulk = (value, where)
    if lowest_bulk is not None:
        out.append(
            f"- bulk ≥ 1.0x confluent_kafka.Producer in every cell: lowest {lowest_bulk[0]:.2f}x ({lowest_bulk[1]})"
            + (f" ({bulk_missing} cells without a valid result)" if bulk_missing else "")
            + f": {verdict(lowest_bulk[0] >= 1.0 and not bulk_missing)}"
        )
    latency = {
        (k[CLIENT], k[LOOP]): row for k, row in cells.items() if k[0] == "latency" and row.get("p50_ms") is not None
    }
    rdkafka = latency.get(("Producer", NO_LOOP))
    for (client, loop), row in sorted(latency.items()):
        if client != "aioprod":
            continue
        parts = [
            f"p99 {row['p99_ms']:.2f} ms (≤ 9): {verdict(row['p99_ms'] <= 9)}",
            f"max {row['worst_max_ms']:.1f} ms in the worst run (≤ 20): {verdict(row['worst_max_ms'] <= 20)}",
        ]
        if rdkafka:
            parts.insert(
                0,
                f"p50 {row['p50_ms']:.2f} ms vs librdkafka {rdkafka['p50_ms']:.2f}: "
                f"{verdict(row['p50_ms'] <= rdkafka['p50_ms'])}",
            )
        out.append(f"- latency at 10,000 records/s, {loop}: " + "; ".join(parts))
    scaling = scaling_rows(cells)
    for records in sorted({records for _, _, records, _ in scaling}):
        value = ratio(
            scaling.get((1000, LINGER_MS, records, "aioprod")), scaling.get((3, LINGER_MS, records, "aioprod"))
        )
        if value is not None:
            out.append(
                f"- 1,000 partitions ≥ 0.8x the 3-partition figure, {records:,} records: {value:.3f}x: "
                f"{verdict(value >= 0.8)}"
            )
    memory = {k[CLIENT]: row for k, row in cells.items() if k[0] == "memory" and row.get("bytes_per_record")}
    if "aioprod" in memory and "aiokafka" in memory:
        mine, theirs = memory["aioprod"]["bytes_per_record"], memory["aiokafka"]["bytes_per_record"]
        out.append(
            f"- memory: aioprod {mine:,.0f} B/record vs aiokafka {theirs:,.0f} B/record (≤ aiokafka): "
            f"{verdict(mine <= theirs)}"
        )
    return out


def render(info: dict[str, str], settings: dict[str, Any], cells: dict[tuple[Any, ...], dict[str, Any]]) -> str:
    json_values = " (JSON)" if settings.get("values") == "json" else ""
    parts = [
        f"Run {settings['date']} ({settings['wall_seconds']:.0f} s): {settings['records']:,} records of "
        f"{settings['value_size']} B{json_values} per throughput run, {settings['reps']} interleaved repetitions "
        "(medians), "
        f"3 partitions per topic unless said. Load average before the run: {settings['load_before']}.",
        "",
        *(f"- {name}: {value}" for name, value in info.items()),
    ]
    tables = throughput_tables(cells)
    if tables:
        parts += ["", "### Throughput at equal batch sizes", "", tables]
    latency = latency_table(cells)
    if latency:
        parts += [
            "",
            f"### Latency: {settings['rate']:,} keyed records/s (100 keys), 16 KiB batches, for "
            f"{settings['latency_seconds']:.0f} s",
            "",
            latency,
        ]
    scaling = scaling_table(cells)
    if scaling:
        parts += [
            "",
            f"### Partition scaling: keyed await-each ({SCALING_KEYS:,} keys), 16 KiB batches",
            "",
            scaling,
        ]
    memory = memory_table(cells)
    if memory:
        records = next(row["records"] for key, row in cells.items() if key[0] == "memory")
        parts += ["", f"### Memory: {records:,} x 100 B records queued, nothing awaited", "", memory]
    targets = target_lines(cells)
    if targets:
        parts += ["", "### Targets", "", *targets]
    return "\n".join(parts) + "\n"


def update_docs(markdown: str, path: Path) -> None:
    block = f"{DOCS_START}\n{markdown}{DOCS_END}"
    text = path.read_text()
    head, rest = text.split(DOCS_START, 1)
    tail = rest.split(DOCS_END, 1)[1]
    path.write_text(head + block + tail)


def print_rich(markdown: str) -> None:
    try:
        from rich.console import Console
        from rich.markdown import Markdown
    except ImportError:
        print(markdown)
        return
    Console(width=200).print(Markdown(markdown))


# Stacks from outside the timed section: imports, test data, producer start/stop.
_SETUP_FRAMES = ("_find_and_load", "make_values (", "make_keys (", "chunks (", ".start (", ".close (", ".stop (")
# Frames every sample has (the harness around the timed section): left out of "inclusive".
_HARNESS_FRAMES = ("<module>", "main", "worker", "run_async", "Runner.run")


def profile_top(raw: Path, top: int) -> str:
    """Self and inclusive time per function from py-spy's raw (collapsed-stack) output."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or any(marker in stack for marker in _SETUP_FRAMES) or "argparse" in stack:
            continue
        count = int(count_text)
        total += count
        names = []
        for frame in stack.split(";"):
            # "func (path/file.py:123)" -> "func (path/file.py)"
            name, _, where = frame.partition(" (")
            names.append(f"{name} ({where.rsplit(':', 1)[0]})" if where else name)
        own[names[-1]] = own.get(names[-1], 0) + count
        for name in set(names):
            if name.split(" (")[0] not in _HARNESS_FRAMES:
                inclusive[name] = inclusive.get(name, 0) + count
    if not total:
        return "no samples"
    lines = [
        f"{total} samples in the timed section ('Runner.run' self time = the event loop's own C code)",
        "",
        "self time:",
    ]
    for name, count in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * count / total:5.1f}%  {name}")
    lines += ["", "inclusive time:"]
    for name, count in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * count / total:5.1f}%  {name}")
    return "\n".join(lines)


def profile(args: argparse.Namespace) -> int:
    """Run one client's path under ``py-spy record`` and print where its time goes."""
    if shutil.which("py-spy") is None:
        print("--profile needs py-spy on PATH: pip install py-spy", file=sys.stderr)
        return 2
    spec = base_spec(
        suite="profile",
        client=args.profile_client,
        mode=args.profile,
        value_size=args.value_size,
        batch_size=args.profile_batch_size,
        keys=args.profile_keys,
        idempotence=not args.profile_no_idempotence,
        records=args.records,
        loop=args.profile_loop,
        partitions=args.profile_partitions,
    )
    out = args.profile_out or Path(f"profile-{spec['client']}-{spec['mode']}.txt")
    broker = Tansu().start()
    try:
        spec.update(bootstrap=broker.bootstrap, topic="bench-profile", broker_pid=broker.pid)
        create_topic(broker.bootstrap, spec["topic"], spec["partitions"])
        worker_cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
        cmd = ["py-spy", "record", "--rate", str(args.profile_rate), "--format", "raw", "-o", str(out)]
        proc = subprocess.run([*cmd, "--", *worker_cmd], capture_output=True, text=True, timeout=600)
    finally:
        broker.stop()
    result = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not result or not out.exists():
        print(proc.stdout[-2000:], proc.stderr[-2000:])
        return 1
    run = json.loads(result[-1])
    print(
        f"{spec['client']} {spec['mode']} {spec['value_size']} B, {batch_label(spec['batch_size'])} batches, "
        f"{spec['keys']} keys, idempotence={spec['idempotence']}: {spec['records'] / run['elapsed']:,.0f} records/s "
        f"under py-spy ({run['cpu'] / spec['records'] * 1e6:.2f} µs CPU/record; GC {run.get('gc_total_ms', 0):.0f} ms "
        f"in {run.get('gc_collections', 0)} collections); raw stacks in {out}"
    )
    print(profile_top(out, args.profile_top))
    return 0


def load_average() -> float:
    return os.getloadavg()[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated, of {', '.join(SUITES)}")
    parser.add_argument("--records", type=int, default=100_000, help="records per throughput run")
    parser.add_argument("--value-size", type=int, default=100, help="value bytes (default 100)")
    parser.add_argument(
        "--values",
        choices=("hex", "json"),
        default="hex",
        help="random hex (default; compression gains ~3%%), or JSON events (lz4 ~7x smaller)",
    )
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions per cell")
    parser.add_argument("--quick", action="store_true", help="short sanity run (a few minutes)")
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    parser.add_argument("--rate", type=int, default=10_000, help="latency suite: records/s")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="latency suite: seconds per run")
    parser.add_argument("--memory-records", type=int, default=1_000_000)
    parser.add_argument("--loop", choices=LOOPS, default="uvloop", help="the loop of the latency/scaling/memory runs")
    parser.add_argument(
        "--verify",
        choices=("first", "all", "none"),
        default="first",
        help="read every record back from the broker after the runs of the first rep (default), all, or none",
    )
    parser.add_argument(
        "--noisy-load",
        type=float,
        default=0.5,
        help="a run during which other processes used more than this many cores is repeated (default 0.5)",
    )
    parser.add_argument("--noisy-retries", type=int, default=2, help="at most this many repeats per run (default 2)")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated filter on the table and scaling suites: modes (each, bulk), batch sizes (16k, 64k), keys "
        "(keyed, keyless), loops (asyncio, uvloop), idempotence (idem, noidem), clients",
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run aioprod as of this git revision (e.g. main) beside the working tree's, interleaved, "
        "in the table and scaling suites, to measure what a change costs",
    )
    parser.add_argument("--update-docs", action="store_true", help=f"rewrite the results block of {DOCS}")
    parser.add_argument(
        "--profile",
        choices=MODES,
        help="instead of the benchmark: run one path of one client (--records records) under py-spy and "
        "print the top functions by self and inclusive time",
    )
    parser.add_argument("--profile-client", choices=CLIENTS, default="aioprod")
    parser.add_argument("--profile-batch-size", type=int, default=16384)
    parser.add_argument("--profile-keys", type=int, default=0)
    parser.add_argument("--profile-partitions", type=int, default=3)
    parser.add_argument("--profile-loop", choices=LOOPS, default="uvloop")
    parser.add_argument("--profile-no-idempotence", action="store_true")
    parser.add_argument("--profile-rate", type=int, default=1000, help="py-spy samples per second")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--profile-out", type=Path, help="raw py-spy output (default profile-CLIENT-MODE.txt)")
    parser.add_argument("--render", type=Path, help="print (and with --update-docs, publish) a saved --json run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        sys.stdout.flush()
        os._exit(0)  # the memory workers leave a million records queued: don't drain them

    if args.profile:
        return profile(args)
    if args.render:
        saved = json.loads(args.render.read_text())
        markdown = render(saved["machine"], saved["settings"], summarise(saved["runs"]))
        print_rich(markdown)
        if any("failed" in r for r in saved["runs"]):
            print("runs failed (see the tables): not publishing", file=sys.stderr)
            return 1
        if args.update_docs:
            update_docs(markdown, DOCS)
            print(f"updated {DOCS}")
        return 0
    if args.quick:
        args.records, args.reps = min(args.records, 20_000), 1
        args.memory_records = min(args.memory_records, 200_000)
        args.latency_seconds = min(args.latency_seconds, 2.0)
    suites = args.suites.split(",")
    plan: list[Spec] = []
    wanted = set(args.only.split(",")) if args.only else set()
    if "table" in suites:
        plan += [s for s in table_plan(args.records, args.value_size) if matches(s, wanted)]
    if "latency" in suites:
        plan += latency_plan(args.rate, args.latency_seconds, args.loop)
    if "scaling" in suites:
        plan += [s for s in scaling_plan(args.records, args.loop) if matches(s, wanted)]
    src = snapshot_source()
    for spec in plan:
        spec["src"] = src
        spec["values"] = args.values
    baseline_src = None
    if args.baseline:
        baseline_src = export_source(args.baseline)
        LABELS[BASELINE] = SHORT[BASELINE] = f"aioprod @ {args.baseline}"
        copies = [dict(s, client=BASELINE, src=baseline_src) for s in plan if s["client"] == "aioprod"]
        plan = regroup([*plan, *copies])
    memory = memory_plan(args.memory_records, args.loop) if "memory" in suites else []
    for spec in memory:
        spec["src"] = src

    info = machine_info()
    info["aioprod source"] += f" (snapshot {tree_digest(Path(src))})"
    if baseline_src is not None:
        info["aioprod baseline"] = f"git {args.baseline} (snapshot {tree_digest(Path(baseline_src))})"
    load_before = f"{load_average():.2f}"
    print(f"broker: {info['broker']}; {info['cpus']} CPUs ({info['cpu']}); load average {load_before}", flush=True)
    print(f"{len(plan)} runs x {args.reps} reps, then {len(memory)} memory runs x {min(args.reps, 3)}", flush=True)
    runs: list[Result] = []
    broker = Tansu()
    started = time.monotonic()
    try:
        for rep in range(args.reps):
            for spec in rotate(plan, rep):
                timeout = 90 + spec["records"] / 2000
                verify = args.verify == "all" or (args.verify == "first" and rep == 0)
                run = one_run(broker, spec, timeout, verify)
                # Someone else's work took a core meanwhile: try again (keep the quietest run).
                for _ in range(args.noisy_retries):
                    if "failed" in run or other_load(run) <= args.noisy_load:
                        break
                    print(f"  (other load {other_load(run):.2f} cores: running it again)", flush=True)
                    again = one_run(broker, spec, timeout, verify)
                    again["noisy_retries"] = run.get("noisy_retries", 0) + 1
                    if "failed" in again:  # a repeat that failed (lost records, errors) is a result too
                        run = again
                        break
                    if other_load(again) < other_load(run):
                        run = again
                run["rep"] = rep
                runs.append(run)
                print(progress_line(run, rep, time.monotonic() - started), flush=True)
        for rep in range(min(args.reps, 3)):
            for spec in memory:
                run = one_run(broker, spec, 120 + spec["records"] / 5000, False)
                run["rep"] = rep
                runs.append(run)
                print(progress_line(run, rep, time.monotonic() - started), flush=True)
    finally:
        broker.stop()
        shutil.rmtree(src, ignore_errors=True)
        if baseline_src is not None:
            shutil.rmtree(baseline_src, ignore_errors=True)

    settings = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "records": args.records,
        "value_size": args.value_size,
        "values": args.values,
        "reps": args.reps,
        "rate": args.rate,
        "latency_seconds": args.latency_seconds,
        "load_before": load_before,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    markdown = render(info, settings, summarise(runs))
    print()
    print_rich(markdown)
    print(f"total {settings['wall_seconds']}s")
    if args.json:
        args.json.write_text(json.dumps({"settings": settings, "machine": info, "runs": runs}, indent=1))
    failed = any("failed" in r for r in runs)
    if args.update_docs and failed:
        print(f"runs failed (see the tables): {DOCS} not updated", file=sys.stderr)
    elif args.update_docs:
        update_docs(markdown, DOCS)
        print(f"updated {DOCS}")
    return 1 if failed else 0


def regroup(plan: list[Spec]) -> list[Spec]:
    """Put runs of the same cell next to each other, keeping the first-seen order of cells."""
    cells: dict[tuple[Any, ...], list[Spec]] = {}
    for spec in plan:
        cells.setdefault(group_key(spec), []).append(spec)
    return [spec for group in cells.values() for spec in group]


def matches(spec: Spec, wanted: set[str]) -> bool:
    """``--only``: within each dimension named, the spec's value must be among those named."""
    dimensions = {
        "mode": ({"each", "bulk"}, spec["mode"]),
        "batch": ({"16k", "64k"}, f"{spec['batch_size'] // 1024}k"),
        "keys": ({"keyed", "keyless"}, "keyed" if spec["keys"] else "keyless"),
        "loop": ({"asyncio", "uvloop"}, spec["loop"]),
        "idempotence": ({"idem", "noidem"}, "idem" if spec["idempotence"] else "noidem"),
        "client": (set(CLIENTS), "aioprod" if spec["client"] == BASELINE else spec["client"]),
    }
    for known, value in dimensions.values():
        chosen = wanted & known
        if chosen and value not in chosen and not (known == {"asyncio", "uvloop"} and value == NO_LOOP):
            return False
    return True


def progress_line(run: Result, rep: int, elapsed: float) -> str:
    label = (
        f"[{elapsed:6.1f}s] rep {rep + 1} {run['suite']:7} {run['mode']:4} {batch_label(run['batch_size']):6} "
        f"keys={run['keys']:<5} p={run['partitions']:<4} linger={run['linger_ms']:<2} "
        f"idem={'on ' if run['idempotence'] else 'off'} "
        f"{run['loop']:7} {SHORT[run['client']]:11}"
    )
    if "failed" in run:
        return f"{label} FAILED: {run['failed']}" + (f"\n{run['stack']}" if "stack" in run else "")
    if run["kind"] == "memory":
        return f"{label} {(run['rss_after'] - run['rss_before']) / run['records']:8.0f} B/record"
    text = (
        f"{label} {run['records'] / run['elapsed']:>10,.0f} rec/s  "
        f"cpu {run['cpu'] / run['records'] * 1e6:5.2f} µs/rec  "
        f"other {other_load(run):4.2f} steal {steal_load(run):4.2f}"
    )
    if run["kind"] == "latency":
        text += f"  p50 {run['p50_ms']:.2f} p99 {run['p99_ms']:.2f} max {run['max_ms']:.1f} ms"
        text += f" at {run['max_at_s']:.2f}s"
    if "gc_total_ms" in run:
        text += f"  gc {run['gc_total_ms']:.0f} ms ({run['gc_full']} full, longest {run['gc_max_ms']:.1f})"
    return text


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

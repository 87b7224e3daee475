"""``aioprod perf``: the producer's throughput and ack latency, like kafka-producer-perf-test.

Same flags and the same arithmetic as the Java tool, so numbers can be put side by side:
records/s over the time from the first send to the last ack, MB/s as payload MiB per
second, and per-record latency from the ``send()`` call to the ack. ``--throughput``
paces sends to a target rate the way Java's ThroughputThrottler does (sleep only when
ahead of schedule by a couple of milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from aioprod.cli.common import (
    CliError,
    bootstrap_option,
    cluster_or_embedded,
    config_option,
    console,
    debug_option,
    describe,
    embedded_hint,
    producer_options,
    resolve_bootstrap,
    run,
)
from aioprod.cli.metrics_table import java_style_lines
from aioprod.cli.stats import AckTracker, LatencySummary
from aioprod.metrics import MetricsSnapshot
from aioprod.producer.producer import Producer

_MIN_SLEEP = 0.002  # as Java's throttler: shorter waits are not worth a sleep


@dataclass
class PerfResult:
    topic: str
    records: int
    record_size: int
    throughput_limit: float | None
    bootstrap: str
    embedded_broker: bool
    acked: int
    failed: int
    elapsed: float
    latency: LatencySummary
    first_error: str | None

    @property
    def records_per_sec(self) -> float:
        return self.acked / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def mb_per_sec(self) -> float:
        return self.records_per_sec * self.record_size / (1024 * 1024)

    def as_dict(self) -> dict[str, Any]:
        latency = self.latency
        return {
            "topic": self.topic,
            "records": self.records,
            "record_size": self.record_size,
            "throughput_limit": self.throughput_limit,
            "bootstrap": self.bootstrap,
            "embedded_broker": self.embedded_broker,
            "acked": self.acked,
            "failed": self.failed,
            "elapsed_s": self.elapsed,
            "records_per_sec": self.records_per_sec,
            "mb_per_sec": self.mb_per_sec,
            "latency_ms": {
                "avg": latency.avg,
                "max": latency.max,
                "p50": latency.p50,
                "p95": latency.p95,
                "p99": latency.p99,
                "p99_9": latency.p999,
            },
            "first_error": self.first_error,
        }


def payload(size: int) -> bytes:
    """Random uppercase letters, as the Java tool sends (compressible like text, not zeros)."""
    rng = random.Random(0)
    return bytes(rng.randrange(65, 91) for _ in range(size))


@contextlib.asynccontextmanager
async def live_progress(progress: Progress | None, total: int, tracker: AckTracker) -> AsyncIterator[None]:
    """Refresh the bar from the ack counters ten times a second (not once per record)."""
    if progress is None:
        yield
        return
    task = progress.add_task("acked", total=total)

    async def tick() -> None:
        while True:
            progress.update(task, completed=tracker.acked + tracker.failed)
            await asyncio.sleep(0.1)

    with progress:
        ticker = asyncio.create_task(tick())
        try:
            yield
        finally:
            ticker.cancel()
            await asyncio.wait([ticker])
            progress.update(task, completed=tracker.acked + tracker.failed)


async def run_perf(
    options: dict[str, Any], topic: str, records: int, record_size: int, rate: float | None, progress: Progress | None
) -> tuple[AckTracker, float, MetricsSnapshot]:
    """Send ``records`` records, paced to ``rate`` records/s if given; (tracker, elapsed s,
    the producer's metrics once every record has its outcome)."""
    value = payload(record_size)
    tracker = AckTracker()
    async with Producer(options) as producer:
        await producer.partitions_for(topic)  # metadata (and auto-creation) is not part of the measurement
        async with live_progress(progress, records, tracker):
            started = time.perf_counter()
            for i in range(records):
                if rate is not None:
                    ahead = started + i / rate - time.perf_counter()
                    if ahead > _MIN_SLEEP:
                        await asyncio.sleep(ahead)
                sent_at = time.perf_counter()
                try:
                    future = await producer.send(topic, value)
                except (TypeError, ValueError) as exc:
                    tracker.fail(exc)
                    continue
                tracker.track(future, sent_at)
            await tracker.wait()
            elapsed = (tracker.last_ack or time.perf_counter()) - started
        metrics = producer.metrics_snapshot()
    return tracker, elapsed, metrics


def render(result: PerfResult, out: Console) -> None:
    latency = result.latency
    limit = "unlimited" if result.throughput_limit is None else f"{result.throughput_limit:,g} records/s"
    where = f"{result.bootstrap} (embedded Tansu broker)" if result.embedded_broker else result.bootstrap
    out.print(f"aioprod perf: {result.records:,} records of {result.record_size:,} bytes to {result.topic}")
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("cluster", where)
    table.add_row("configured throughput", limit)
    table.add_row("records acked", f"{result.acked:,}")
    table.add_row("records failed", f"{result.failed:,}")
    table.add_row("elapsed", f"{result.elapsed:.3f} s")
    table.add_row("records/s", f"{result.records_per_sec:,.1f}")
    table.add_row("MB/s", f"{result.mb_per_sec:,.2f}")
    table.add_row("avg latency", f"{latency.avg:.2f} ms")
    table.add_row("max latency", f"{latency.max:.2f} ms")
    for name, value in (("p50", latency.p50), ("p95", latency.p95), ("p99", latency.p99), ("p99.9", latency.p999)):
        table.add_row(f"{name} latency", f"{value:.2f} ms")
    out.print(table)


@click.command(short_help="Measure throughput and ack latency, like kafka-producer-perf-test.")
@click.option("-t", "--topic", required=True, help="Topic to produce to.")
@click.option("-n", "--num-records", type=click.IntRange(min=1), required=True, help="How many records to send.")
@click.option("-s", "--record-size", type=click.IntRange(min=0), required=True, help="Value size in bytes.")
@click.option(
    "--throughput",
    type=float,
    default=-1.0,
    show_default=True,
    help="Target records/s; -1 (or any value <= 0) means as fast as possible.",
)
@bootstrap_option
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON object instead of a table.")
@click.option(
    "--print-metrics",
    is_flag=True,
    help="Also print the producer's metrics at the end (Java names, as kafka-producer-perf-test does).",
)
@debug_option
def perf(
    topic: str,
    num_records: int,
    record_size: int,
    throughput: float,
    bootstrap: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
    print_metrics: bool,
) -> None:
    """Measure throughput and ack latency, like kafka-producer-perf-test.

    Shows a live progress bar (on stderr, when it is a terminal), then records/s, MB/s
    (MiB of payload per second), average and max latency and its p50/p95/p99/p99.9,
    where latency is from the send() call to the broker's ack, per record.

    Without -b (or AIOPROD_BOOTSTRAP_SERVERS) the run uses an embedded Tansu broker on
    loopback, and says so: useful to try the tool, not to judge a cluster.
    Exits 1 if any record failed.

    \b
    Examples:
      aioprod perf --topic perf --num-records 100000 --record-size 100
      aioprod perf -b kafka1:9092 -t perf -n 1000000 -s 1024 --throughput 50000 -X linger.ms=10
      aioprod perf -b kafka1:9092 -t perf -n 100000 -s 100 -X acks=1 -X compression.type=lz4 --json
      aioprod perf -t perf -n 100000 -s 100 --print-metrics
    """
    servers = resolve_bootstrap(bootstrap, overrides)
    options = producer_options(servers or "127.0.0.1:9092", overrides)
    rate = throughput if throughput > 0 else None
    out = console()
    err = console(stderr=True)
    with cluster_or_embedded(servers) as (target, broker):
        options["bootstrap_servers"] = target
        if broker is not None:
            err.print(f"No bootstrap servers given: using an embedded Tansu broker on {target} (memory storage)")
        progress = None
        if err.is_terminal:
            progress = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            )
        try:
            tracker, elapsed, metrics = run(run_perf(options, topic, num_records, record_size, rate, progress))
        except Exception as exc:
            raise CliError(f"perf run failed on {target}: {describe(exc)}{embedded_hint(broker)}") from exc
    result = PerfResult(
        topic=topic,
        records=num_records,
        record_size=record_size,
        throughput_limit=rate,
        bootstrap=target,
        embedded_broker=broker is not None,
        acked=tracker.acked,
        failed=tracker.failed,
        elapsed=elapsed,
        latency=tracker.summary(),
        first_error=describe(tracker.first_error) if tracker.first_error is not None else None,
    )
    if as_json:
        click.echo(json.dumps(result.as_dict() | ({"metrics": dataclasses.asdict(metrics)} if print_metrics else {})))
    else:
        render(result, out)
        if print_metrics:
            click.echo("\n".join(java_style_lines(metrics)))
    if result.failed:
        raise CliError(f"{result.failed:,} of {num_records:,} records failed (first: {result.first_error})")

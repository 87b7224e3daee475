"""``aioprod perf``: the producer's throughput and ack latency, like kafka-producer-perf-test.

Same flags and the same arithmetic as the Java tool, so numbers can be put side by side:
records/s over the whole run (the first send to the last outcome, as Java's tool), MB/s as
payload MiB per second, and per-record latency from the ``send()`` call to the ack.
``--throughput`` paces sends to a target rate the way Java's ThroughputThrottler does
(sleep only when ahead of schedule by a couple of milliseconds).

While it runs: a progress bar with rate and ETA on a terminal, else an interim line every
``--reporting-interval`` (5 s) on stderr, as Java's tool prints; a new kind of failure is
reported the moment it first happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from aioprod.cli.cluster import check_first, topic_problem, watch_topic
from aioprod.cli.common import (
    ClientOptions,
    CliError,
    CliUsageError,
    client_options,
    cluster_or_embedded,
    console,
    debug_option,
    describe,
    echo,
    embedded_hint,
    open_producer,
    parse_delimiter,
    quiet_config,
    record_outcomes,
    run,
    table,
    topic_names,
    warn,
)
from aioprod.cli.metrics_table import java_style_lines
from aioprod.cli.stats import AckTracker, LatencySummary
from aioprod.errors import KafkaError
from aioprod.metrics import MetricsSnapshot
from aioprod.protocol.primitives import varint_size
from aioprod.protocol.records import RecordBatchBuilder

_MIN_SLEEP = 0.002  # as Java's throttler: shorter waits are not worth a sleep
_MIB = 1024 * 1024
_LETTERS = bytes(65 + b % 26 for b in range(256))  # a random byte to an uppercase letter


@dataclass
class PerfResult:
    topic: str
    records: int
    record_size: int | None
    payloads: int | None
    keys: int | None
    throughput_limit: float | None
    bootstrap: str
    embedded_broker: bool
    acked: int
    failed: int
    unsent: int
    acked_bytes: int
    elapsed: float
    latency: LatencySummary
    first_error: str | None
    #: The producer's acks: with 0, "acked" counts records whose bytes left, which no broker acknowledged.
    acks: int = -1

    @property
    def records_per_sec(self) -> float:
        return self.acked / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def mb_per_sec(self) -> float:
        return self.acked_bytes / _MIB / self.elapsed if self.elapsed > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` form, rounded as docs/cli.md shows: seconds to 4 places, rates to 1
        (records/s) and 4 (MB/s), latencies to 2 (ms)."""
        latency = self.latency
        return {
            "topic": self.topic,
            "records": self.records,
            "record_size": self.record_size,
            "payloads": self.payloads,
            "keys": self.keys,
            "throughput_limit": self.throughput_limit,
            "bootstrap": self.bootstrap,
            "embedded_broker": self.embedded_broker,
            "acks": "all" if self.acks == -1 else self.acks,
            "acked": self.acked,
            "failed": self.failed,
            "unsent": self.unsent,
            "elapsed_s": round(self.elapsed, 4),
            "records_per_sec": round(self.records_per_sec, 1),
            "mb_per_sec": round(self.mb_per_sec, 4),
            "latency_ms": {
                "avg": round(latency.avg, 2),
                "max": round(latency.max, 2),
                "p50": round(latency.p50, 2),
                "p95": round(latency.p95, 2),
                "p99": round(latency.p99, 2),
                "p99_9": round(latency.p999, 2),
            },
            "first_error": self.first_error,
        }


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of records/s (-1 for as fast as possible)")
    return value


def payload(size: int) -> bytes:
    """Random uppercase letters, as the Java tool sends (compressible like text, not zeros)."""
    return random.Random(0).randbytes(size).translate(_LETTERS)


def load_payloads(path: Path, delimiter: bytes) -> list[bytes]:
    """The payload file split at ``delimiter``, empty pieces dropped (Java's --payload-file)."""
    payloads = [piece for piece in path.read_bytes().split(delimiter) if piece]
    if not payloads:
        raise CliUsageError(f"--payload-file {path}: no payloads in it")
    return payloads


class Reporter:
    """What the user sees while the run goes: a bar on a terminal, else interim lines; failures at once."""

    def __init__(self, err: Console, total: int, interval: float) -> None:
        self._err = err
        self._total = total
        self._interval = interval
        self._kinds: set[str] = set()
        self.progress: Progress | None = None
        if err.is_terminal:
            self.progress = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} records/s"),
                TextColumn("{task.fields[failed]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            )

    def failed(self, exc: BaseException, _tag: Any) -> None:
        """A new kind of failure is said the moment it first happens; later ones are counted."""
        kind = type(exc).__name__
        if kind not in self._kinds:
            self._kinds.add(kind)
            warn(f"records are failing: {describe(exc)}")

    def said(self, exc: BaseException) -> None:
        """This kind of failure was said already."""
        self._kinds.add(type(exc).__name__)

    @contextlib.asynccontextmanager
    async def running(self, tracker: AckTracker) -> AsyncIterator[None]:
        task = asyncio.create_task(self._bar(tracker) if self.progress is not None else self._lines(tracker))
        try:
            if self.progress is None:
                yield
            else:
                with self.progress:
                    yield
        finally:
            task.cancel()
            await asyncio.wait([task])

    async def _bar(self, tracker: AckTracker) -> None:
        assert self.progress is not None
        bar = self.progress.add_task("acked", total=self._total, rate="0", failed="")
        started = time.perf_counter()
        while True:
            done = tracker.acked + tracker.failed + tracker.unsent
            rate = tracker.acked / max(time.perf_counter() - started, 1e-9)
            failed = f"[red]{tracker.failed:,} failed" if tracker.failed else ""
            self.progress.update(bar, completed=done, rate=f"{rate:,.0f}", failed=failed)
            await asyncio.sleep(0.1)

    async def _lines(self, tracker: AckTracker) -> None:
        tracker.window()
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self._interval)
            now = time.perf_counter()
            window = tracker.window()
            seconds = now - last
            last = now
            self._err.print(
                f"aioprod perf: {window.acked:,} records acked, {window.failed:,} failed, "
                f"{window.acked / seconds:,.1f} records/s, {window.avg_ms:.2f} ms avg latency, "
                f"{window.max_ms:.2f} ms max latency; in total {tracker.sent:,} sent, "
                f"{tracker.acked:,} acked, {tracker.failed:,} failed, {tracker.outstanding:,} awaiting an ack",
                markup=False,
                highlight=False,
                soft_wrap=True,  # one line per interval, however wide: these go to logs
            )


async def run_perf(
    options: dict[str, Any],
    topic: str,
    records: int,
    values: Callable[[int], bytes],
    keys: int | None,
    rate: float | None,
    tracker: AckTracker,
    reporter: Reporter,
) -> tuple[float, str, MetricsSnapshot, str | None, int]:
    """Send ``records`` records, paced to ``rate`` records/s if given; (elapsed s, topic
    problem, the producer's metrics once every record has its outcome, why it stopped early,
    its acks)."""
    check = watch_topic(options, topic)
    stopped: str | None = None
    try:
        async with open_producer(options, tracker) as producer:
            try:
                await check_first(check, producer, topic)
                await producer.partitions_for(topic)  # metadata (and auto-creation) is not part of the measurement
            except Exception as exc:
                where = options["bootstrap_servers"]
                raise CliError(f"perf run failed on {where}: {describe(exc)}{topic_problem(check)}") from exc
            async with reporter.running(tracker):
                started = time.perf_counter()
                for i in range(records):
                    if rate is not None:
                        ahead = started + i / rate - time.perf_counter()
                        if ahead > _MIN_SLEEP:
                            await asyncio.sleep(ahead)
                    value = values(i)
                    key = None if keys is None else b"key-%d" % (i % keys)
                    sent_at = time.perf_counter()
                    try:
                        future = await producer.send(topic, value, key)
                    except (TypeError, ValueError) as exc:
                        tracker.fail(exc)
                        continue
                    except KafkaError as exc:
                        # The cluster, not this record (buffer full for max.block.ms): every later
                        # send would wait as long. Stop sending; what was sent still gets its outcome,
                        # reported as the run goes on and in the results.
                        stopped = f"stopped sending after {i:,} of {records:,} records: {describe(exc)}"
                        warn(stopped)
                        reporter.said(exc)  # the line above said it: not again as "records are failing"
                        tracker.fail(exc)  # this record; the rest were never sent
                        tracker.unsent += records - i - 1
                        break
                    tracker.track(future, sent_at, len(value))
                await tracker.wait()
                # The whole run, failures and stalls included (Java's tool does the same).
                elapsed = time.perf_counter() - started
            metrics = producer.metrics_snapshot()
    finally:
        check.cancel()
    return elapsed, topic_problem(check), metrics, stopped, producer.config.acks


def render(result: PerfResult, out: Console) -> None:
    latency = result.latency
    limit = "unlimited" if result.throughput_limit is None else f"{result.throughput_limit:,g} records/s"
    where = f"{result.bootstrap} (embedded Tansu broker)" if result.embedded_broker else result.bootstrap
    size = f"{result.record_size:,} bytes" if result.record_size is not None else f"{result.payloads:,} payloads"
    out.print(f"aioprod perf: {result.records:,} records of {size} to {result.topic}", markup=False)
    rows = table(out, "metric", "value", right=("value",))
    rows.add_row("cluster", where)
    rows.add_row("configured throughput", limit)
    if result.keys is not None:
        rows.add_row("keys", f"{result.keys:,} distinct")
    if result.acks == 0:
        rows.add_row("records sent (acks=0)", f"{result.acked:,}")
    else:
        rows.add_row("records acked", f"{result.acked:,}")
    rows.add_row("records failed", f"{result.failed:,}")
    if result.unsent:
        rows.add_row("records unsent", f"{result.unsent:,}")
    rows.add_row("elapsed", f"{result.elapsed:.3f} s")
    rows.add_row("records/s", f"{result.records_per_sec:,.1f}")
    rows.add_row("MB/s", f"{result.mb_per_sec:,.2f}")
    rows.add_row("avg latency", f"{latency.avg:.2f} ms")
    rows.add_row("max latency", f"{latency.max:.2f} ms")
    for name, value in (("p50", latency.p50), ("p95", latency.p95), ("p99", latency.p99), ("p99.9", latency.p999)):
        rows.add_row(f"{name} latency", f"{value:.2f} ms")
    out.print(rows)


@click.command(short_help="Measure throughput and ack latency, like kafka-producer-perf-test.")
@click.option("-t", "--topic", required=True, callback=topic_names, help="Topic to produce to.")
@click.option("-n", "--num-records", type=click.IntRange(min=1), required=True, help="How many records to send.")
@click.option("-s", "--record-size", type=click.IntRange(min=0), help="Value size in bytes (or --payload-file).")
@click.option(
    "--payload-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Values picked at random from this file's pieces (or --record-size).",
)
@click.option("--payload-delimiter", metavar="DELIM", default="\\n", show_default=True, help="Splits the payload file.")
@click.option(
    "--keys", type=click.IntRange(min=1), help="Key the records with N distinct keys (key-0 ... key-N-1, cycled)."
)
@click.option(
    "--throughput",
    type=float,
    callback=lambda _ctx, _param, value: _finite(value),
    default=-1.0,
    show_default=True,
    help="Target records/s; -1 (or any value <= 0) means as fast as possible.",
)
@click.option(
    "--reporting-interval",
    type=click.IntRange(min=1),
    default=5000,
    show_default=True,
    metavar="MS",
    help="Interim lines on stderr this often (when stderr is not a terminal).",
)
@client_options
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
    record_size: int | None,
    payload_file: Path | None,
    payload_delimiter: str,
    keys: int | None,
    throughput: float,
    reporting_interval: int,
    client: ClientOptions,
    as_json: bool,
    print_metrics: bool,
) -> None:
    """Measure throughput and ack latency, like kafka-producer-perf-test.

    Values are --record-size random uppercase letters, or pieces of --payload-file
    picked at random; keys are null, or --keys N distinct keys. Reports records/s
    and MB/s over the whole run (first send to last outcome), average and max latency
    and its p50/p95/p99/p99.9, where latency is from the send() call to the ack.

    While running: a progress bar with rate and ETA when stderr is a terminal,
    otherwise an interim line every --reporting-interval ms; the first failure of
    each kind is printed when it happens. Without -b (or AIOPROD_BOOTSTRAP_SERVERS)
    the run uses an embedded Tansu broker on loopback, and says so: useful to try
    the tool, not to judge a cluster. Exits 1 if any record failed.

    \b
    Examples:
      aioprod perf --topic perf --num-records 100000 --record-size 100
      aioprod perf -b kafka1:9092 -t perf -n 1000000 -s 1024 --throughput 50000 -X linger.ms=10
      aioprod perf -b kafka1:9092 -t perf -n 100000 --payload-file events.jsonl --keys 1000 --json
      aioprod perf -t perf -n 100000 -s 100 --print-metrics
    """
    if (record_size is None) == (payload_file is None):
        given = "not both" if record_size is not None else "one of them is needed"
        raise CliUsageError(f"give either --record-size or --payload-file ({given})")
    servers = client.resolve_bootstrap()
    options = client.producer_options(servers or "127.0.0.1:9092")
    if payload_file is not None:
        payloads = load_payloads(payload_file, parse_delimiter(payload_delimiter, "--payload-delimiter"))
        rng = random.Random()
        values: Callable[[int], bytes] = lambda _i: payloads[rng.randrange(len(payloads))]  # noqa: E731
    else:
        assert record_size is not None
        limit = quiet_config(options).max_request_size
        longest_key = None if keys is None else b"key-%d" % (keys - 1)
        # The batch one record makes, as the producer's check counts it (Java's upper bound): an
        # empty value's, plus the value's bytes and the longer length they need (no payload built).
        empty = RecordBatchBuilder.estimate_size_in_bytes(longest_key, b"")
        wire = empty + record_size + varint_size(record_size) - varint_size(0)
        if wire > limit:
            # Every record would fail as too large: say so before building a payload that size.
            raise CliUsageError(
                f"--record-size {record_size:,} is larger than max.request.size ({limit:,}) with the record's and "
                f"its batch's overhead (about {wire:,} bytes): every record would fail (raise it with "
                "-X max.request.size=..., and the broker's message.max.bytes)"
            )
        fixed = payload(record_size)
        values = lambda _i: fixed  # noqa: E731
    rate = throughput if throughput > 0 else None
    out = console()
    err = console(stderr=True)
    acked_bytes = 0

    def on_ack(_metadata: Any, size: int) -> None:
        nonlocal acked_bytes
        acked_bytes += size

    reporter = Reporter(err, num_records, reporting_interval / 1000)
    tracker = AckTracker(on_ack=on_ack, on_error=reporter.failed)
    record_outcomes(tracker)
    with cluster_or_embedded(servers) as (target, broker):
        options["bootstrap_servers"] = target
        if broker is not None:
            err.print(f"No bootstrap servers given: using an embedded Tansu broker on {target} (memory storage)")
        try:
            elapsed, problem, metrics, stopped, acks = run(
                run_perf(options, topic, num_records, values, keys, rate, tracker, reporter), broker
            )
        except CliError as exc:
            if broker is not None and not broker.running:
                raise CliError(f"{exc.message}; {tracker.counts()}") from exc
            raise
        except Exception as exc:
            raise CliError(f"perf run failed on {target}: {describe(exc)}{embedded_hint(broker)}") from exc
    result = PerfResult(
        topic=topic,
        records=num_records,
        record_size=record_size,
        payloads=None if payload_file is None else len(payloads),
        keys=keys,
        throughput_limit=rate,
        bootstrap=target,
        embedded_broker=broker is not None,
        acked=tracker.acked,
        failed=tracker.failed,
        unsent=tracker.unsent,
        acked_bytes=acked_bytes,
        elapsed=elapsed,
        latency=tracker.summary(),
        first_error=describe(tracker.first_error) if tracker.first_error is not None else None,
        acks=acks,
    )
    if as_json:
        extra = {"metrics": _json_safe(dataclasses.asdict(metrics))} if print_metrics else {}
        echo(json.dumps(result.as_dict() | extra, allow_nan=False))
    else:
        render(result, out)
        if print_metrics:
            echo("\n".join(java_style_lines(metrics)))
    if stopped is not None:
        raise CliError(f"{stopped}{problem}; {tracker.counts()}")
    if result.failed:
        raise CliError(f"{result.failed:,} of {num_records:,} records failed (first: {result.first_error}){problem}")


def _json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as None: JSON has no NaN (an average over an empty
    window is NaN), and strict parsers refuse the ``NaN`` Python's json writes by default."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    return value

"""``aioprod smoke``: produce N records and prove the broker wrote exactly those.

"Every future resolved" is not enough evidence: the check compares each partition's end
offset (ListOffsets) before and after the run with the number of records acked there,
and the acked offsets with the new log positions, so lost or duplicated writes show up.

Tansu (the embedded broker) answers ListOffsets "latest" with the last *batch's* base
offset + 1 rather than the log end, so on Tansu the run sends one record per batch
(``batch.size=1``) unless ``-X batch.size`` says otherwise; the report says so.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import click

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
    quiet_config,
    record_outcomes,
    run,
    topic_names,
)
from aioprod.cli.stats import AckTracker, LatencySummary
from aioprod.producer.record_future import RecordMetadata


@dataclass
class SmokeResult:
    topic: str
    records: int
    before: dict[int, int]
    after: dict[int, int] = field(default_factory=dict)
    acked_offsets: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    acked: int = 0
    failed: int = 0
    first_error: BaseException | None = None
    elapsed: float = 0.0
    latency: LatencySummary | None = None
    notes: list[str] = field(default_factory=list)
    #: Tansu: an end offset read before the run may follow someone else's multi-record batch,
    #: so it is only a lower bound of the log end; the check then starts at the first acked offset.
    approximate_before: bool = False

    def problems(self) -> list[str]:
        """Everything that contradicts "N records written, each exactly once"."""
        found = []
        if self.failed:
            found.append(f"{self.failed} of {self.records} records failed (first: {describe(self.first_error)})")
        for partition in sorted(set(self.acked_offsets) - set(self.after)):
            found.append(f"records were acked on partition {partition}, which ListOffsets does not report")
        for partition, end in self.after.items():
            start = self.before.get(partition, 0)
            offsets = sorted(self.acked_offsets.get(partition, ()))
            if self.approximate_before and start > 0 and offsets and offsets[0] > start:
                start = offsets[0]
            if end - start != len(offsets):
                found.append(
                    f"partition {partition}: end offset advanced by {end - start} ({start} -> {end}) "
                    f"but {len(offsets)} records were acked there"
                )
            elif offsets != list(range(start, end)):
                found.append(f"partition {partition}: acked offsets are not exactly the new offsets {start}..{end - 1}")
        return found


TANSU_CLUSTER_ID = "tansu_cluster"  # Tansu's default --cluster-id
TANSU_EXISTING_NOTE = (
    "the topic already held data, whose end offsets Tansu reports approximately: each partition is checked "
    "from its first acked offset"
)
TANSU_NOTE = "Tansu's ListOffsets counts batches, not records: sent one record per batch (-X batch.size=N overrides)"


async def run_smoke(
    options: dict[str, Any], topic: str, records: int, tracker: AckTracker, *, embedded: bool, batch_size_given: bool
) -> SmokeResult:
    """Produce ``records`` keyed records to ``topic`` and collect what the check needs."""
    check = watch_topic(options, topic)
    try:
        async with open_producer(options, quiet=True) as probe:
            try:
                await check_first(check, probe, topic)
                before = await probe.end_offsets(topic)
            except Exception as exc:
                where = options["bootstrap_servers"]
                raise CliError(f"smoke test failed on {where}: {describe(exc)}{topic_problem(check)}") from exc
            result = SmokeResult(topic, records, before=before)
            tansu = embedded or probe.cluster().cluster_id == TANSU_CLUSTER_ID
    finally:
        check.cancel()
    if tansu and not batch_size_given:
        options = {**options, "batch_size": 1}
        result.notes.append(TANSU_NOTE)
        if any(before.values()):
            result.approximate_before = True
            result.notes.append(TANSU_EXISTING_NOTE)

    def on_ack(metadata: RecordMetadata, _tag: Any) -> None:
        result.acked_offsets[metadata.partition].append(metadata.offset)

    tracker.on_ack = on_ack
    async with open_producer(options, tracker) as producer:
        started = time.perf_counter()
        for i in range(records):
            sent_at = time.perf_counter()
            future = await producer.send(topic, b"aioprod smoke record %d" % i, key=b"smoke-%d" % i)
            tracker.track(future, sent_at)
        await tracker.wait()
        result.elapsed = (tracker.last_ack or time.perf_counter()) - started
        result.after = await producer.end_offsets(topic)
    result.acked, result.failed, result.first_error = tracker.acked, tracker.failed, tracker.first_error
    result.latency = tracker.summary()
    return result


def as_dict(result: SmokeResult, cluster: str, embedded: bool, problems: list[str]) -> dict[str, Any]:
    """The ``--json`` form of the report."""
    latency = result.latency or LatencySummary(0, 0, 0, 0, 0, 0, 0)
    return {
        "ok": not problems,
        "cluster": cluster,
        "embedded_broker": embedded,
        "topic": result.topic,
        "records": result.records,
        "acked": result.acked,
        "failed": result.failed,
        "partitions": len(result.after),
        "partitions_written": sum(1 for offsets in result.acked_offsets.values() if offsets),
        "end_offsets": {
            str(p): {"before": result.before.get(p, 0), "after": end} for p, end in sorted(result.after.items())
        },
        "elapsed_s": round(result.elapsed, 4),
        "records_per_sec": round(result.acked / result.elapsed if result.elapsed > 0 else 0.0, 1),
        "latency_ms": {"p50": round(latency.p50, 2), "p99": round(latency.p99, 2), "max": round(latency.max, 2)},
        "notes": result.notes,
        "problems": problems,
    }


def unfinished(
    cluster: str, embedded: bool, topic: str, records: int, tracker: AckTracker, error: str
) -> dict[str, Any]:
    """The ``--json`` form of a run that could not finish: the counts so far, and why."""
    return {
        "ok": False,
        "cluster": cluster,
        "embedded_broker": embedded,
        "topic": topic,
        "records": records,
        "acked": tracker.acked,
        "failed": tracker.failed,
        "problems": [error],
    }


def report(result: SmokeResult, cluster: str, problems: list[str]) -> list[tuple[str, str]]:
    """The report's (label, text) rows."""
    latency = result.latency or LatencySummary(0, 0, 0, 0, 0, 0, 0)
    written = sum(1 for offsets in result.acked_offsets.values() if offsets)
    rate = result.acked / result.elapsed if result.elapsed > 0 else 0.0
    rows = [
        ("cluster", cluster),
        ("topic", result.topic),
        ("records", f"{result.records:,} sent, {result.acked:,} acked, {result.failed:,} failed"),
        ("partitions", f"{len(result.after)} ({written} written to; end offsets checked)"),
        ("throughput", f"{rate:,.0f} records/s ({result.elapsed:.3f} s)"),
        ("ack latency", f"p50 {latency.p50:.2f} ms, p99 {latency.p99:.2f} ms, max {latency.max:.2f} ms"),
    ]
    rows += [("note", note) for note in result.notes]
    rows += [("PROBLEM", problem) for problem in problems]
    return rows


@click.command()
@client_options
@click.option(
    "-n", "--records", default=1000, show_default=True, type=click.IntRange(min=1), help="How many records to produce."
)
@click.option(
    "-t",
    "--topic",
    default="aioprod-smoke",
    show_default=True,
    callback=topic_names,
    help="Topic (auto-created if allowed).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@debug_option
def smoke(client: ClientOptions, records: int, topic: str, as_json: bool) -> None:
    """Produce records and check that the broker stored exactly them.

    Without -b (or AIOPROD_BOOTSTRAP_SERVERS), an embedded Tansu broker is started on a
    free loopback port for the run (needs: pip install 'aioprod[embedded]').

    Checks: every record is acknowledged, and each partition's end offset advanced by
    exactly the number of records acked on it (the topic may already hold data).
    Exits 0 when all checks pass, 1 otherwise.

    \b
    Examples:
      aioprod smoke
      aioprod smoke -b kafka1:9092 --records 10000 --topic smoke-test
      aioprod smoke -b localhost:9092 -X acks=1 -X max.block.ms=5000 --json
    """
    servers = client.resolve_bootstrap()
    # Validate the options before starting anything, with a placeholder address when none is given.
    options = client.producer_options(servers or "127.0.0.1:9092")
    if quiet_config(options).acks == 0:
        raise CliUsageError("smoke checks every acknowledgement, and acks=0 asks for none: use acks=1 or all")
    out = console()
    tracker = AckTracker()
    record_outcomes(tracker)
    with cluster_or_embedded(servers) as (target, broker):
        options["bootstrap_servers"] = target
        cluster = f"{target} (embedded Tansu broker, memory storage)" if broker else target
        if broker is not None and not as_json:
            out.print(f"No bootstrap servers given: started an embedded Tansu broker on {target}")
        try:
            result = run(
                run_smoke(
                    options,
                    topic,
                    records,
                    tracker,
                    embedded=broker is not None,
                    batch_size_given=client.sets("batch_size"),
                ),
                broker,
            )
        except Exception as exc:
            if not isinstance(exc, CliError):
                failure = CliError(f"smoke test failed on {target}: {describe(exc)}{embedded_hint(broker)}")
            elif broker is not None and not broker.running:  # what became of the records, as docs/cli.md says
                failure = CliError(f"{exc.message}; {tracker.counts()}")
            else:
                failure = exc
            if as_json:  # a script reading the report gets one, saying what went wrong
                echo(json.dumps(unfinished(cluster, broker is not None, topic, records, tracker, failure.message)))
            if failure is exc:
                raise  # (not "from" itself)
            raise failure from exc
    problems = result.problems()
    if as_json:
        echo(json.dumps(as_dict(result, cluster, broker is not None, problems)))
    else:
        out.print(f"aioprod smoke: {'FAILED' if problems else 'OK'}", style="bold red" if problems else "bold green")
        for label, text in report(result, cluster, problems):
            out.print(f"  {label:<12} {text}", markup=False)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CliError(f"smoke test failed: {problems[0]}{more}")

"""What the benchmark may publish (benchmarks/bench_producers.py): a failed or partial run is not
a clean result, and every client's clock covers what an application pays per record."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = importlib.import_module("bench_producers")

LOST = "broker holds 99,990 records, expected 100,001"


def fake_run(spec: dict[str, Any], rate: float, other: float = 0.0, **extra: Any) -> dict[str, Any]:
    elapsed = spec["records"] / rate
    return {
        **spec,
        "elapsed": elapsed,
        "cpu": 2.0 * spec["records"] / 1e6,
        "broker_cpu": 0.1,
        "other_cpu": other * elapsed,
        "steal": 0.0,
        "errors": 0,
        "first_error": None,
        "rep": 0,
        **extra,
    }


def each_runs() -> list[dict[str, Any]]:
    """Every await-each cell of the table, aioprod at 500,000 records/s and aiokafka at 100,000."""
    return [
        fake_run(spec, 500_000 if spec["client"] == "aioprod" else 100_000)
        for spec in bench.table_plan(100_000, 100)
        if spec["mode"] == "each" and spec["client"] in ("aioprod", "aiokafka")
    ]


def test_a_target_in_every_cell_is_met_only_with_every_cell_measured() -> None:
    runs = each_runs()
    assert bench.target_lines(bench.summarise(runs))[0].endswith("**met**")
    failed = [dict(r) for r in runs]
    next(r for r in failed if r["client"] == "aioprod" and r["batch_size"] == 65536)["failed"] = LOST
    partial = [r for r in runs if r["batch_size"] == 16384 and r["keys"] and r["loop"] == "uvloop"]
    for kept in (failed, partial):
        line = bench.target_lines(bench.summarise(kept))[0]
        assert line.startswith("- await-each ≥ 2.5x aiokafka in every cell") and "cells without a valid result" in line
        assert not line.endswith("**met**"), line


def test_a_saved_run_with_a_failed_run_is_not_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = each_runs()
    runs[0]["failed"] = LOST
    settings = {"date": "x", "records": 100_000, "value_size": 100, "reps": 1, "rate": 10_000}
    settings |= {"latency_seconds": 10, "load_before": "0", "wall_seconds": 1}
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"settings": settings, "machine": {}, "runs": runs}))
    written: list[str] = []
    monkeypatch.setattr(bench, "update_docs", lambda markdown, path: written.append(markdown))
    monkeypatch.setattr(bench, "print_rich", lambda markdown: None)
    assert bench.main(["--render", str(saved), "--update-docs"]) == 1
    assert written == []


def test_a_repeat_of_a_noisy_run_that_fails_is_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[dict[str, Any]] = []

    def one_run(broker: Any, spec: dict[str, Any], timeout: float, verify: Any) -> dict[str, Any]:
        attempts.append(spec)
        if len(attempts) == 1:
            return fake_run(spec, 500_000, other=0.9)  # other load: run again
        return fake_run(spec, 500_000, failed=LOST)

    class NoBroker:
        def stop(self) -> None:
            pass

    monkeypatch.setattr(bench, "one_run", one_run)
    monkeypatch.setattr(bench, "Tansu", NoBroker)
    monkeypatch.setattr(bench, "machine_info", lambda: {"broker": "b", "cpus": "2", "cpu": "c", "aioprod source": "s"})
    (tmp_path / "src").mkdir()
    monkeypatch.setattr(bench, "snapshot_source", lambda: str(tmp_path / "src"))
    monkeypatch.setattr(bench, "print_rich", lambda markdown: None)
    out = tmp_path / "out.json"
    args = ["--suites", "table", "--only", "aioprod,each,16k,keyed,uvloop,idem", "--reps", "1", "--json", str(out)]
    assert bench.main(args) == 1
    assert len(attempts) == 2
    assert [r.get("failed") for r in json.loads(out.read_text())["runs"]] == [LOST]


def test_settling_reads_every_records_metadata_as_await_does() -> None:
    # aioprod's RecordFuture builds a record's RecordMetadata when asked; the peers build theirs
    # as the ack arrives, inside the clock: exception() alone left that cost out for aioprod.
    class Acked:
        results = 0

        def done(self) -> bool:
            return True

        def exception(self) -> None:
            return None

        def result(self) -> tuple[str, int, int, int]:
            Acked.results += 1
            return ("t", 0, 0, 0)

    assert asyncio.run(bench.settle([Acked() for _ in range(10)])) == (0, None)
    assert Acked.results == 10

"""docs/observability.md documents every metric the producer reports, in the right table."""

from __future__ import annotations

import re
from pathlib import Path

from aioprod.metrics import BROKER_METRICS, PRODUCER_METRICS, TOPIC_METRICS

DOC = Path(__file__).resolve().parent.parent / "docs" / "observability.md"


def tables() -> dict[str, set[str]]:
    """Section heading -> the metric names in its table's first column."""
    found: dict[str, set[str]] = {}
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("### "):
            section = line[4:]
        elif line.startswith("| `") and section:
            first = line.split("|")[1]
            found.setdefault(section, set()).update(re.findall(r"`([a-z-]+)`", first))
    return found


def test_every_metric_is_in_its_table() -> None:
    documented = tables()
    assert documented["Producer-wide"] == set(PRODUCER_METRICS)
    assert documented["Per topic (`snapshot.topics[topic]`)"] == set(TOPIC_METRICS)
    assert documented["Per broker (`snapshot.brokers[node_id]`)"] == set(BROKER_METRICS)

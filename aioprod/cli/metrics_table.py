"""The metrics after a run, printed as kafka-producer-perf-test's ``--print-metrics`` does:
``group:name:{tags} : value``, sorted, so the two tools' outputs can be compared line by line."""

from __future__ import annotations

import math

from aioprod.metrics import MetricsSnapshot


def java_style_lines(snapshot: MetricsSnapshot) -> list[str]:
    """One ``group:name:{tags}`` line per metric, as Java's ``ToolsUtils.printMetrics``."""
    client = f"client-id={snapshot.client_id}"
    named: dict[str, float] = {}
    for name, value in snapshot.producer.items():
        named[f"producer-metrics:{name}:{{{client}}}"] = value
    for topic, values in snapshot.topics.items():
        for name, value in values.items():
            named[f"producer-topic-metrics:{name}:{{{client}, topic={topic}}}"] = value
    for node, values in snapshot.brokers.items():
        for name, value in values.items():
            named[f"producer-node-metrics:{name}:{{{client}, node-id=node-{node}}}"] = value
    width = max(len(key) for key in named)
    lines = ["", f"{'Metric Name':<{width}}   Value"]
    lines.extend(f"{key:<{width}} : {_java_double(value)}" for key, value in sorted(named.items()))
    return lines


def _java_double(value: float) -> str:
    """``String.format("%.3f", value)``: NaN and Infinity spelled as Java spells them."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return f"{value:.3f}"

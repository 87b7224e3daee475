"""Prometheus: the producers' metrics as a ``prometheus_client`` collector.

::

    from prometheus_client import REGISTRY, start_http_server
    from aioprod.prometheus import ProducerCollector

    REGISTRY.register(ProducerCollector(producer))  # one collector for all your producers
    start_http_server(9100)

Names are the Java producer's with underscores, under ``kafka_producer_``
(``kafka_producer_record_send_total``, ``kafka_producer_request_latency_avg``); the
per-topic ones under ``kafka_producer_topic_`` with a ``topic`` label, the per-broker ones
under ``kafka_producer_node_`` with a ``node_id`` label. Every sample has a ``client_id``
label. Metrics whose Java name ends in ``-total`` are counters, the rest gauges.

Needs ``prometheus_client`` (``pip install 'aioprod[prometheus]'``), imported when a
collector is made, never by ``aioprod`` itself. A scrape may come from any thread: each
producer's snapshot is taken on its own event loop. A producer whose loop does not take it in
time (a blocked loop: every producer is asked at once, within one 5 s budget), or that cannot
be used in this process (a forked child), is left out of that scrape with a warning, so the
others are still exported. A scrape on an event loop (a ``/metrics`` handler) takes that loop's
producers' snapshots there, and waits for the others' within the same budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.util
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from aioprod.errors import ProducerClosedError
from aioprod.metrics import BROKER_METRICS, PRODUCER_METRICS, TOPIC_METRICS, MetricsSnapshot

__all__ = ["ProducerCollector", "metric_name"]

log = logging.getLogger(__name__)

#: Seconds a scrape waits for the producers' snapshots, all together (Prometheus' default
#: scrape_timeout is 10 s).
SCRAPE_BUDGET = 5.0


class _HasMetrics(Protocol):
    """A :class:`~aioprod.Producer` or :class:`~aioprod.SyncProducer`."""

    @property
    def config(self) -> Any: ...

    def metrics_snapshot(self) -> MetricsSnapshot: ...


#: (name prefix, the group's metrics, label names) for producer, topic and broker metrics.
_GROUPS = (
    ("kafka_producer_", PRODUCER_METRICS, ("client_id",)),
    ("kafka_producer_topic_", TOPIC_METRICS, ("client_id", "topic")),
    ("kafka_producer_node_", BROKER_METRICS, ("client_id", "node_id")),
)


def metric_name(prefix: str, java_name: str) -> str:
    """The Prometheus name of a Java metric name: ``record-send-rate`` → ``kafka_producer_record_send_rate``."""
    return prefix + java_name.replace("-", "_")


class ProducerCollector:
    """A collector for any number of producers, told apart by their ``client_id``."""

    def __init__(self, *producers: _HasMetrics) -> None:
        if importlib.util.find_spec("prometheus_client") is None:
            raise ImportError("ProducerCollector needs prometheus_client: pip install 'aioprod[prometheus]'")
        self._producers: dict[str, _HasMetrics] = {}
        for producer in producers:
            self.add(producer)

    def add(self, producer: _HasMetrics) -> None:
        """Collect ``producer`` too (its ``client_id`` must not be collected already)."""
        client_id = producer.config.client_id
        if client_id in self._producers:
            raise ValueError(
                f"a producer with client_id {client_id!r} is collected already: give each producer its own client_id"
            )
        self._producers[client_id] = producer

    def remove(self, producer: _HasMetrics) -> None:
        """Stop collecting ``producer`` (a closed one exports its final figures until then)."""
        if self._producers.get(producer.config.client_id) is producer:
            del self._producers[producer.config.client_id]

    def describe(self) -> Iterator[Any]:
        """The metric families without samples: registering takes no snapshot."""
        return self._families([])

    def collect(self) -> Iterator[Any]:
        snapshots = []
        for client_id, take in self._snapshots():
            try:
                snapshots.append(take())
            except (TimeoutError, ProducerClosedError) as exc:
                # A blocked loop, or a SyncProducer of the parent process in a forked child: not
                # a reason to blind the scrape of every other producer.
                why = str(exc) or f"no snapshot within the scrape's {SCRAPE_BUDGET:g} s"
                log.warning("producer %r left out of this scrape: %s", client_id, why)
        return self._families(snapshots)

    def _snapshots(self) -> list[tuple[str, Callable[[], MetricsSnapshot]]]:
        """How to take each producer's snapshot for this scrape.

        Every producer is asked at once, on threads of its own, within one ``SCRAPE_BUDGET`` under
        Prometheus' default scrape_timeout (10 s): one after the other, each blocked loop would
        hold the scrape ``SNAPSHOT_TIMEOUT`` (10 s). A producer of the event loop this scrape runs
        on (a ``/metrics`` handler) is taken here: a thread would wait for the very loop this
        scrape holds. (The others go to threads then too: waited for here, a blocked loop of
        another producer held this loop, the application's, ``SNAPSHOT_TIMEOUT`` per producer.)
        """
        # Read once: another thread may add or remove a producer while this scrape runs.
        producers = list(self._producers.items())
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        here = {client_id for client_id, producer in producers if running is not None and _loop_of(producer) is running}
        elsewhere = [(client_id, producer) for client_id, producer in producers if client_id not in here]
        futures: dict[str, concurrent.futures.Future[MetricsSnapshot]] = {}
        if elsewhere:
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=len(elsewhere), thread_name_prefix="aioprod-scrape"
            )
            try:
                futures = {client_id: pool.submit(producer.metrics_snapshot) for client_id, producer in elsewhere}
            finally:
                pool.shutdown(wait=False)
        deadline = time.monotonic() + SCRAPE_BUDGET
        return [
            (client_id, producer.metrics_snapshot)
            if client_id in here
            else (client_id, functools.partial(_result_by, futures[client_id], deadline))
            for client_id, producer in producers
        ]

    def _families(self, snapshots: list[MetricsSnapshot]) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for prefix, table, labels in _GROUPS:
            for java_name, meaning in table.items():
                name = metric_name(prefix, java_name)
                family = (
                    CounterMetricFamily(name, meaning, labels=labels)
                    if java_name.endswith("-total")
                    else GaugeMetricFamily(name, meaning, labels=labels)
                )
                for snapshot in snapshots:
                    for label_values, values in _rows(snapshot, labels):
                        family.add_metric(label_values, values[java_name])
                yield family


def _rows(snapshot: MetricsSnapshot, labels: tuple[str, ...]) -> Iterator[tuple[list[str], dict[str, float]]]:
    client_id = snapshot.client_id
    if labels == ("client_id",):
        yield [client_id], snapshot.producer
    elif labels[1] == "topic":
        for topic, values in snapshot.topics.items():
            yield [client_id, topic], values
    else:
        for node, values in snapshot.brokers.items():
            yield [client_id, str(node)], values


def _loop_of(producer: _HasMetrics) -> asyncio.AbstractEventLoop | None:
    """The event loop a producer takes its snapshots on, once started (a SyncProducer's is its own
    thread's: never a scrape's)."""
    return getattr(getattr(producer, "_producer", producer), "_loop", None)


def _result_by(future: concurrent.futures.Future[MetricsSnapshot], deadline: float) -> MetricsSnapshot:
    return future.result(max(0.0, deadline - time.monotonic()))

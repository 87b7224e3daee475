"""The Prometheus exposition of the producers' metrics, scraped on the scripted cluster: the
names, types and labels a dashboard queries, and the collector's set of producers."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import aioprod.prometheus as prometheus_module
from aioprod import Producer
from aioprod.metrics import BROKER_METRICS, PRODUCER_METRICS, TOPIC_METRICS, MetricsSnapshot
from aioprod.prometheus import ProducerCollector
from tests.brokers import refused_port
from tests.conftest import Scripted
from tests.engine.test_metrics import _FakeProducerForScrapes


def scrape(registry: CollectorRegistry) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], dict[str, str]]:
    """(sample name and sorted labels -> value, family name -> type) of one scrape."""
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    return samples, {f.name: f.type for f in families}


async def test_every_metric_is_exported_by_its_name_type_and_labels(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.create_topic("orders.v1", 1)
    registry = CollectorRegistry()
    async with Producer(bootstrap_servers=cluster.bootstrap, client_id="svc", linger_ms=0) as p:
        registry.register(ProducerCollector(p))
        for value in (b"a", b"b", b"c"):
            await p.send_and_wait("orders.v1", value)
        snapshot = p.metrics_snapshot()
        samples, types = scrape(registry)  # on the producer's loop: its snapshot is taken here
    producer, topic = (("client_id", "svc"),), (("client_id", "svc"), ("topic", "orders.v1"))
    node = (("client_id", "svc"), ("node_id", "1"))
    assert samples[("kafka_producer_record_send_total", producer)] == 3
    assert samples[("kafka_producer_topic_record_send_total", topic)] == 3
    assert samples[("kafka_producer_node_request_total", node)] == snapshot.brokers[1]["request-total"] > 0
    for prefix, table, labels in (
        ("kafka_producer_", PRODUCER_METRICS, producer),
        ("kafka_producer_topic_", TOPIC_METRICS, topic),
        ("kafka_producer_node_", BROKER_METRICS, node),
    ):
        for java_name in table:
            name = prefix + java_name.replace("-", "_")
            assert (name, labels) in samples, name
            # A counter's family drops "_total"; buffer-total-bytes is a gauge, its name unchanged.
            kind = "counter" if java_name.endswith("-total") else "gauge"
            assert types[name.removesuffix("_total") if kind == "counter" else name] == kind, name


async def test_a_replaced_producers_removal_leaves_its_successor_exported(scripted: Scripted) -> None:
    # docs/observability.md: a service replacing a failed producer removes the old one and adds
    # the new one under the same client_id; removing the old one again must not drop the new one.
    registry, collector = CollectorRegistry(), ProducerCollector()
    registry.register(collector)
    old = Producer(bootstrap_servers=scripted.cluster.bootstrap, client_id="svc")
    new = Producer(bootstrap_servers=scripted.cluster.bootstrap, client_id="svc", buffer_memory=1000)
    collector.add(old)
    collector.remove(old)
    collector.add(new)
    collector.remove(old)  # the old one's clean-up, once more
    samples, _ = scrape(registry)
    assert samples[("kafka_producer_buffer_total_bytes", (("client_id", "svc"),))] == 1000


def test_one_collector_per_registry_the_second_is_refused_at_register() -> None:
    # One collector exports all the producers; a second one's families would repeat the names,
    # an exposition Prometheus refuses whole. register() says so, before any scrape.
    registry = CollectorRegistry()
    registry.register(ProducerCollector(Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", client_id="a")))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(ProducerCollector(Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", client_id="b")))


def test_a_scrape_whose_budget_is_spent_waits_for_no_further_producer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Every producer shares the scrape's one budget: once it is spent (an injected clock says so at
    # once), a producer that has not answered is left out without a wait of its own; each waited
    # a whole budget, several blocked loops held the scrape past Prometheus' scrape_timeout.
    release = threading.Event()
    fine = Producer(bootstrap_servers=f"127.0.0.1:{refused_port()}", client_id="fine")

    def blocked() -> MetricsSnapshot:  # answers 10 s later, or when the scrape is over
        release.wait(10)
        return fine.metrics_snapshot()

    readings = iter([0.0])  # the deadline is taken at 0; every later reading is past it
    monkeypatch.setattr(prometheus_module, "SCRAPE_BUDGET", 5.0)
    monkeypatch.setattr(prometheus_module, "time", SimpleNamespace(monotonic=lambda: next(readings, 5.0)))
    registry = CollectorRegistry()
    registry.register(ProducerCollector(*(_FakeProducerForScrapes(name, blocked) for name in ("x", "y"))))
    try:
        exported = generate_latest(registry).decode()
    finally:
        release.set()
    assert 'client_id="x"' not in exported and 'client_id="y"' not in exported
    assert "producer 'x' left out of this scrape" in caplog.text
    assert "producer 'y' left out of this scrape" in caplog.text

"""OpenTelemetry and prometheus_client are optional: aioprod never imports them unless asked."""

from __future__ import annotations

import subprocess
import sys

import pytest

import aioprod.prometheus


def test_aioprod_imports_neither_unless_asked() -> None:
    code = (
        "import sys, asyncio\n"
        "from aioprod import Producer\n"
        "import aioprod.metrics\n"
        "async def main():\n"
        "    async with Producer(bootstrap_servers='127.0.0.1:1', statistics_interval_ms=1000,"
        " statistics_callback=print) as p:\n"
        "        p.metrics()\n"
        "asyncio.run(main())\n"
        "assert 'opentelemetry' not in sys.modules, 'opentelemetry imported'\n"
        "assert 'prometheus_client' not in sys.modules, 'prometheus_client imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_collector_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aioprod.prometheus.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install 'aioprod\[prometheus\]'"):
        aioprod.prometheus.ProducerCollector()

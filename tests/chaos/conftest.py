"""A Tansu broker behind the fault-injecting proxy, for the tests of this package."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.brokers import TansuBroker, free_port
from tests.chaos.proxy import FaultProxy


@pytest.fixture
async def proxied_broker() -> AsyncIterator[tuple[TansuBroker, FaultProxy]]:
    """A broker that advertises the proxy's address, so every connection passes the proxy."""
    proxy_port = free_port()
    broker = TansuBroker(advertised_port=proxy_port).start()
    proxy = await FaultProxy(broker.port, proxy_port).start()
    try:
        yield broker, proxy
    finally:
        await proxy.close()
        broker.stop()

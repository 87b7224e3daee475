"""A Tansu broker behind the fault-injecting proxy, for the tests of this package."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import pytest

from tests.brokers import PersistentTansuBroker, S3Server, TansuBroker, free_port
from tests.chaos.proxy import FaultProxy

B = TypeVar("B", bound=TansuBroker)


@contextlib.asynccontextmanager
async def behind_a_proxy(make: Callable[[int], B]) -> AsyncIterator[tuple[B, FaultProxy]]:
    """``make(proxy_port)``'s broker, started, advertising the proxy's address, so that every
    connection passes the proxy."""
    proxy_port = free_port()
    broker = make(proxy_port)
    broker.start()
    proxy = await FaultProxy(broker.port, proxy_port).start()
    try:
        yield broker, proxy
    finally:
        await proxy.close()
        broker.stop()


@pytest.fixture
async def proxied_broker() -> AsyncIterator[tuple[TansuBroker, FaultProxy]]:
    async with behind_a_proxy(lambda port: TansuBroker(advertised_port=port)) as pair:
        yield pair


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The S3 server that keeps the data of ``persistent_proxied_broker`` (moto, a dev extra)."""
    missing = [name for name in ("moto", "flask", "flask_cors") if importlib.util.find_spec(name) is None]
    if missing:
        message = f"the S3 server needs {', '.join(missing)}: pip install -e '.[dev]'"
        if os.environ.get("CI"):
            pytest.fail(f"the broker-restart-with-data-kept test must run in CI: {message}", pytrace=False)
        pytest.skip(message)
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def persistent_proxied_broker(s3_server: S3Server) -> AsyncIterator[tuple[PersistentTansuBroker, FaultProxy]]:
    """As ``proxied_broker``, with the broker's data in S3: a restart keeps the log and the
    producers' sequences."""
    async with behind_a_proxy(lambda port: PersistentTansuBroker(s3_server, advertised_port=port)) as pair:
        yield pair

"""KIP-368 re-authentication on the scripted fake cluster, taught here to accept every SASL
handshake and authentication with a session lifetime (a fake, for one precise fault: a token
provider that never answers). Real brokers: tests/integration/test_security.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from aioprod.errors import KafkaTimeoutError
from aioprod.net.auth import ConnectionSecurity, OAuthBearerToken, SaslAuthenticator, TokenCache
from aioprod.net.connection import BrokerConnection
from aioprod.protocol import messages as m
from aioprod.protocol.framing import decode_request_header, encode_response
from tests.conftest import Scripted
from tests.fakes import cluster as fake_cluster

SESSION_MS = 10_000


def accept_every_sasl_client(monkeypatch: pytest.MonkeyPatch, cluster: fake_cluster.ScriptedCluster) -> None:
    """The fake cluster answers SaslHandshake and SaslAuthenticate: any mechanism, any
    credentials, a session of SESSION_MS."""
    requests = dict(fake_cluster.REQUESTS)
    requests[m.SaslHandshakeRequest.API_KEY] = m.SaslHandshakeRequest
    requests[m.SaslAuthenticateRequest.API_KEY] = m.SaslAuthenticateRequest
    monkeypatch.setattr(fake_cluster, "REQUESTS", requests)
    cluster.versions[m.SaslHandshakeRequest.API_KEY] = (0, 1)
    cluster.versions[m.SaslAuthenticateRequest.API_KEY] = (0, 2)
    handle = fake_cluster.ScriptedCluster.handle

    async def with_sasl(self: fake_cluster.ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        header, _ = decode_request_header(frame)
        if header.api_key == m.SaslHandshakeRequest.API_KEY:
            answer: Any = m.SaslHandshakeResponse(0, ["OAUTHBEARER"])
        elif header.api_key == m.SaslAuthenticateRequest.API_KEY:
            answer = m.SaslAuthenticateResponse(0, None, b"", session_lifetime_ms=SESSION_MS)
        else:
            return await handle(self, conn, frame)
        return encode_response(answer, header.api_version, header.correlation_id)

    monkeypatch.setattr(fake_cluster.ScriptedCluster, "handle", with_sasl)


async def test_a_reauthentication_whose_token_never_comes_ends_at_the_request_timeout(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection holds every request while it re-authenticates; with no bound, a token
    # provider that never answered (an OAuth server down) held them, and the leader, for good.
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    wall = [time.time()]
    calls = 0

    async def provider() -> OAuthBearerToken:
        nonlocal calls
        calls += 1
        if calls > 1:
            await asyncio.get_running_loop().create_future()  # never answers
        return OAuthBearerToken("token", wall[0] + 60, {})

    tokens = TokenCache(provider, clock=lambda: wall[0])
    security = ConnectionSecurity(tls_context=None, authenticator=SaslAuthenticator("OAUTHBEARER", tokens=tokens))
    node = cluster.nodes[1]
    conn = BrokerConnection(
        1, node.host, node.port, client_id="t", request_timeout=5.0, max_in_flight=5, security=security
    )
    await conn.open(setup_timeout=5.0)
    wall[0] += 59  # the token is due for refresh at the next authentication
    answers: list[Any] = []
    await asyncio.sleep(SESSION_MS / 1000)  # virtual time: re-authentication has begun, and waits
    conn.send_nowait(m.MetadataRequest(topics=[]), answers.append)  # held meanwhile
    await asyncio.sleep(5.0)  # the request timeout, in virtual time
    assert calls == 2 and conn.closed
    assert [type(answer) for answer in answers] == [KafkaTimeoutError]
    assert "re-authentication" in str(answers[0])

"""KIP-368 re-authentication on the scripted fake cluster, taught here to accept every SASL
handshake and authentication with a session lifetime (a fake, for one precise fault: a token
provider that never answers). Real brokers: tests/integration/test_security.py."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from decimal import Decimal
from typing import Any

import pytest

from aioprod import Producer
from aioprod.errors import AuthenticationError, DeliveryTimeoutError, KafkaError, KafkaTimeoutError
from aioprod.net import auth
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


def oauth_producer(cluster: fake_cluster.ScriptedCluster, provider: Any, **options: Any) -> Producer:
    """A producer that authenticates with OAUTHBEARER tokens from ``provider``."""
    return Producer(
        bootstrap_servers=cluster.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=provider,
        **options,
    )


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
    wall[0] += 61  # the token has expired by the next authentication: nothing to fall back on
    answers: list[Any] = []
    await asyncio.sleep(SESSION_MS / 1000)  # virtual time: re-authentication has begun, and waits
    conn.send_nowait(m.MetadataRequest(topics=[]), answers.append)  # held meanwhile
    await asyncio.sleep(5.0)  # the request timeout, in virtual time
    assert calls == 2 and conn.closed
    assert [type(answer) for answer in answers] == [KafkaTimeoutError]
    assert "re-authentication" in str(answers[0])


async def test_a_failed_token_refresh_does_not_fail_records_in_flight(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    cluster.create_topic("t", 1)
    wall = [1_000_000.0]
    monkeypatch.setattr(auth.TokenCache.__init__, "__defaults__", (lambda: wall[0],))
    calls = 0
    outage = [False]

    def provider() -> OAuthBearerToken:
        nonlocal calls
        calls += 1
        if outage[0]:
            raise RuntimeError("identity provider briefly unreachable")
        return OAuthBearerToken("token", wall[0] + 60)

    async with oauth_producer(cluster, provider, linger_ms=0, client_id="billing") as p:
        await (await p.send("t", b"first"))
        node = cluster.nodes[1]
        node.holding = True  # the broker writes the next batch; its response is slow
        second = await p.send("t", b"second")
        await asyncio.sleep(0.1)
        wall[0] += 50  # the token (60 s) is due for refresh, and still valid for 10 s
        outage[0] = True  # ... and the identity provider is unreachable for a few seconds
        await asyncio.sleep(SESSION_MS / 1000)  # re-authentication happens meanwhile
        outage[0] = False
        node.release()
        result = await asyncio.gather(second, return_exceptions=True)
        assert not isinstance(result[0], BaseException), f"in-flight record failed: {result[0]!r}"
        assert p.metrics()["connection-close-total"] == 0  # re-authenticated with the still-valid token
    assert cluster.partition("t").values.count(b"second") == 1
    # Whose token it was, with two producers in the process: the producer's client id.
    (warning,) = [r.getMessage() for r in caplog.records if "using the current token" in r.getMessage()]
    assert warning.startswith("[billing] sasl_oauth_token_provider failed: RuntimeError")


async def test_a_refused_reauthentication_retries_the_records_it_held(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record sent while the connection re-authenticates, and the re-authentication refused:
    the record goes out on the next connection; the refusal is the connection's, not its."""
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    handle = fake_cluster.ScriptedCluster.handle
    authenticated: set[int] = set()
    reauthenticating, refuse = asyncio.Event(), asyncio.Event()

    async def refusing_the_first_reauthentication(
        self: fake_cluster.ScriptedCluster, conn: Any, frame: bytes
    ) -> bytes | None:
        header, _ = decode_request_header(frame)
        if header.api_key == m.SaslAuthenticateRequest.API_KEY:
            if id(conn) in authenticated and not reauthenticating.is_set():
                reauthenticating.set()
                await refuse.wait()
                answer = m.SaslAuthenticateResponse(58, "session refused", b"", session_lifetime_ms=0)
                return encode_response(answer, header.api_version, header.correlation_id)
            authenticated.add(id(conn))
        return await handle(self, conn, frame)

    monkeypatch.setattr(fake_cluster.ScriptedCluster, "handle", refusing_the_first_reauthentication)
    cluster.create_topic("t", 1)
    async with oauth_producer(
        cluster,
        lambda: OAuthBearerToken("token", time.time() + 3600),
        linger_ms=0,
    ) as p:
        await (await p.send("t", b"first"))
        await reauthenticating.wait()
        held = await p.send("t", b"second")
        refuse.set()
        assert (await held).offset == 1
    assert cluster.partition("t").values == [b"first", b"second"]


async def test_close_callbacks_do_not_grow_with_each_reauthentication(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    tokens = TokenCache(lambda: OAuthBearerToken("token", time.time() + 10**9))
    security = ConnectionSecurity(tls_context=None, authenticator=SaslAuthenticator("OAUTHBEARER", tokens=tokens))
    node = cluster.nodes[1]
    conn = BrokerConnection(
        1, node.host, node.port, client_id="t", request_timeout=5.0, max_in_flight=5, security=security
    )
    await conn.open(setup_timeout=5.0)
    after_first = len(conn._close_callbacks)
    await asyncio.sleep(SESSION_MS / 1000 * 200)  # ~200 re-authentications, virtual time
    grown = len(conn._close_callbacks)
    conn.close()
    assert grown <= after_first + 2


async def _send_one(scripted: Scripted, provider) -> KafkaError:
    cluster = scripted.cluster
    cluster.create_topic("t", 1)
    async with oauth_producer(
        cluster,
        provider,
        max_block_ms=5000,
        request_timeout_ms=2000,
        delivery_timeout_ms=10_000,
    ) as p:
        with pytest.raises(KafkaError) as info:
            await (await p.send("t", b"x"))
    return info.value


async def test_invalid_extensions_from_the_provider_are_an_authentication_error(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    accept_every_sasl_client(monkeypatch, scripted.cluster)
    error = await _send_one(scripted, lambda: OAuthBearerToken("tok", time.time() + 3600, {"logical_cluster": "lkc-1"}))
    assert isinstance(error, AuthenticationError), f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("expires_at", ["datetime", "str"])
async def test_a_token_expiry_that_is_not_a_number_is_an_authentication_error_at_once(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, expires_at: str
) -> None:
    # google-auth's credentials.expiry is a datetime: compared with the clock, a bare TypeError
    # escaped, was retried as a lost connection, and send() ended in a timeout after max_block_ms.
    in_an_hour = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    given = in_an_hour if expires_at == "datetime" else str(int(in_an_hour.timestamp()))
    accept_every_sasl_client(monkeypatch, scripted.cluster)
    started = scripted.clock.now
    error = await _send_one(scripted, lambda: OAuthBearerToken("tok", given))  # type: ignore[arg-type]
    assert isinstance(error, AuthenticationError), f"{type(error).__name__}: {error}"
    assert f"expires_at must be a number of seconds since the epoch, got a {type(given).__name__}" in str(error)
    assert scripted.clock.now - started < 1  # the first attempt's error, not max_block_ms later


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("eyJhbGciOi.eyJzdWIi.sig\n", "'\\n' at character 24 of 24"),  # read from a file with its newline
        ("eyJ hbG", "' ' at character 4 of 7"),
        ("abc\x01auth=forged", "'\\x01' at character 4"),  # would frame an extension of its own
        ("", "the token is empty"),
        (b"eyJhbGciOi", "the token must be a str, got a bytes"),  # sent as "Bearer b'eyJ...'"
    ],
)
async def test_a_token_a_broker_cannot_parse_is_refused_by_name_never_quoted(token: object, said: str) -> None:
    # Sent as it was, Kafka refused it as "invalid credentials", sending the user after the
    # credentials instead of the provider's output.
    cache = TokenCache(lambda: OAuthBearerToken(token, time.time() + 3600))  # type: ignore[arg-type]
    with pytest.raises(AuthenticationError) as info:
        await cache.get()
    assert said in str(info.value)
    if isinstance(token, str) and len(token) > 4:
        assert token[:5] not in str(info.value)


@pytest.mark.parametrize("expires_at", [Decimal(4_000_000_000), 4_000_000_000, 4_000_000_000.5])
@pytest.mark.parametrize("form", ["dataclass", "tuple"])
async def test_any_number_is_an_expiry_in_either_form(expires_at: object, form: str) -> None:
    # The type check first added refused a Decimal (or numpy's integers) in an OAuthBearerToken
    # that the tuple form took, and had worked before.
    made = OAuthBearerToken("tok", expires_at) if form == "dataclass" else ("tok", expires_at)  # type: ignore[arg-type]
    token = await TokenCache(lambda: made).get()
    assert token.expires_at == float(expires_at)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "expires_at",
    [float("nan"), Decimal("NaN"), float("inf"), Decimal("-Infinity"), bytearray(b"4000000000"), 10**400],
    ids=["nan", "decimal-nan", "inf", "decimal-minus-inf", "bytearray", "beyond-a-float"],
)
@pytest.mark.parametrize("form", ["dataclass", "tuple"])
async def test_an_expiry_that_is_no_time_is_refused_in_either_form(expires_at: object, form: str) -> None:
    # NaN compares false with every time: taken, never reused, the provider asked at each
    # connection. A bytearray was taken where bytes were refused; 10**400 was a bare OverflowError.
    def provider() -> object:
        return OAuthBearerToken("tok", expires_at) if form == "dataclass" else ("tok", expires_at)  # type: ignore[arg-type]

    cache = TokenCache(provider)
    for _ in range(2):
        with pytest.raises(
            AuthenticationError, match=r"expires_at must be a (finite )?number of seconds since the epoch"
        ):
            await cache.get()


async def test_a_jwt_and_a_base64_token_pass_the_check() -> None:
    for value in ("eyJhbGciOi.eyJzdWIi.sig-_", "dG9rZW4+/w=="):
        assert (await TokenCache(lambda v=value: OAuthBearerToken(v, time.time() + 3600)).get()).value == value


async def test_an_idle_connection_is_closed_even_while_its_session_is_renewed(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Re-authentication runs on a timer, idle connections included, and its SASL requests
    # counted as use: with sessions shorter than connections_max_idle_ms, a producer gone quiet
    # kept an authenticated connection per broker for good (Java re-authenticates only what
    # it sends on).
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    cluster.create_topic("t", 1)
    async with oauth_producer(
        cluster,
        lambda: OAuthBearerToken("token", time.time() + 10**6),
        linger_ms=0,
        connections_max_idle_ms=30_000,
        metadata_max_age_ms=10**9,  # no metadata refresh to use it either
    ) as p:
        await (await p.send("t", b"x"))
        await scripted.clock.advance(300)  # ten idle limits, thirty sessions
        open_connections = len(list(p._pool.connections()))
        closes = p.metrics()["connection-close-total"]
    assert SESSION_MS < 30_000
    assert closes >= 1 and open_connections == 0


async def test_records_expiring_as_credentials_are_refused_say_so(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Credentials revoked while the producer runs: records for a known topic wait for their
    # leader as they would for a broker restart (Java's behaviour: an authentication failure
    # may be passing), and expired with a bare "not sent", the log the only place saying why.
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    revoked = [False]
    answer_sasl_with(monkeypatch, 58, revoked)  # SASL_AUTHENTICATION_FAILED once revoked
    cluster.create_topic("t", 1)
    async with oauth_producer(
        cluster, lambda: OAuthBearerToken("token", time.time() + 3600), linger_ms=0, delivery_timeout_ms=60_000
    ) as p:
        await (await p.send("t", b"first"))
        revoked[0] = True
        await scripted.clock.advance(SESSION_MS / 1000)  # the re-authentication is refused
        with pytest.raises(KafkaError) as info:
            await (await p.send("t", b"second"))
    assert isinstance(info.value, DeliveryTimeoutError) and not info.value.possibly_persisted
    assert "; not sent: AuthenticationError: SASL OAUTHBEARER authentication failed at broker" in str(info.value)
    assert isinstance(info.value.__cause__, AuthenticationError)


async def test_a_sasl_answer_that_is_no_refusal_is_a_lost_connection_tried_again(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every SaslAuthenticate error was an AuthenticationError, failing the records at once: a
    # broker's UNKNOWN_SERVER_ERROR too. Java takes only the authentication codes for a refusal.
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    handle = fake_cluster.ScriptedCluster.handle
    broken = [2]

    async def failing_twice(self: fake_cluster.ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        header, _ = decode_request_header(frame)
        if header.api_key == m.SaslAuthenticateRequest.API_KEY and broken[0]:
            broken[0] -= 1
            answer = m.SaslAuthenticateResponse(-1, "internal error", b"", 0)
            return encode_response(answer, header.api_version, header.correlation_id)
        return await handle(self, conn, frame)

    monkeypatch.setattr(fake_cluster.ScriptedCluster, "handle", failing_twice)
    cluster.create_topic("t", 1)
    async with oauth_producer(cluster, lambda: OAuthBearerToken("token", time.time() + 3600)) as p:
        metadata = await p.send_and_wait("t", b"v")
    assert metadata.offset == 0 and broken == [0]
    assert cluster.partition("t").values == [b"v"]


def answer_sasl_with(monkeypatch: pytest.MonkeyPatch, code: int, failing: list[bool]) -> None:
    """While ``failing[0]``, every SaslAuthenticate is answered ``code``."""
    handle = fake_cluster.ScriptedCluster.handle

    async def answering(self: fake_cluster.ScriptedCluster, conn: Any, frame: bytes) -> bytes | None:
        header, _ = decode_request_header(frame)
        if header.api_key == m.SaslAuthenticateRequest.API_KEY and failing[0]:
            answer = m.SaslAuthenticateResponse(code, "broker says no", b"", 0)
            return encode_response(answer, header.api_version, header.correlation_id)
        return await handle(self, conn, frame)

    monkeypatch.setattr(fake_cluster.ScriptedCluster, "handle", answering)


@pytest.mark.parametrize("code", [58, -1])
async def test_a_connection_error_from_authentication_is_not_its_own_cause(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # `raise error from exc` with error the very exception: its own __cause__, a cycle.
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    answer_sasl_with(monkeypatch, code, [True])
    tokens = TokenCache(lambda: OAuthBearerToken("token", time.time() + 3600))
    security = ConnectionSecurity(tls_context=None, authenticator=SaslAuthenticator("OAUTHBEARER", tokens=tokens))
    node = cluster.nodes[1]
    conn = BrokerConnection(
        1, node.host, node.port, client_id="t", request_timeout=5.0, max_in_flight=5, security=security
    )
    with pytest.raises(KafkaError) as info:
        await conn.open(setup_timeout=5.0)
    assert info.value.__cause__ is not info.value


@pytest.mark.parametrize("code", [58, -1, 31, 35])
async def test_a_transactional_record_expiring_on_a_refused_reconnection_fails_and_the_loop_runs(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # The expiry error named the leader's last connection error, which was its own cause: the
    # transaction manager walked that chain for ever, the event loop frozen at 100 % CPU.
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    failing = [False]
    answer_sasl_with(monkeypatch, code, failing)
    cluster.create_topic("t", 1)
    async with oauth_producer(
        cluster,
        lambda: OAuthBearerToken("token", time.time() + 3600),
        transactional_id="tx",
        linger_ms=0,
        delivery_timeout_ms=6000,
        request_timeout_ms=5000,
    ) as p:
        p.begin_transaction()
        await (await p.send("t", b"first"))
        failing[0] = True
        cluster.disconnect(1)  # the leader's reconnections are answered `code`
        await scripted.clock.advance(0.5)
        with pytest.raises(DeliveryTimeoutError):
            await (await p.send("t", b"second"))  # never sent: expires naming the refusal
        failing[0] = False
        # Abortable, as in Java: a SaslAuthenticate answer's code (31, 35 fatal to a transaction
        # elsewhere) is not what the record failed of.
        await p.abort_transaction()


async def test_a_provider_that_never_answers_is_named(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    accept_every_sasl_client(monkeypatch, scripted.cluster)

    async def provider() -> OAuthBearerToken:
        await asyncio.get_running_loop().create_future()
        raise AssertionError

    error = await _send_one(scripted, provider)
    assert "ApiVersions" not in str(error)
    assert "sasl_oauth_token_provider" in str(error)


async def test_an_expired_token_is_never_handed_out_after_a_failed_refresh() -> None:
    now = [0.0]
    calls = [0]

    def provider() -> OAuthBearerToken:
        calls[0] += 1
        if calls[0] == 1:
            return OAuthBearerToken("first", 100.0)
        if calls[0] == 2:
            raise RuntimeError("identity provider briefly down")
        return OAuthBearerToken("second", 1000.0)

    cache = TokenCache(provider, clock=lambda: now[0])
    assert (await cache.get()).value == "first"
    now[0] = 99.5  # past the refresh point; the refresh fails; the token is valid 0.5 s more
    assert (await cache.get()).value == "first"
    now[0] = 100.2  # the token has expired: the provider must be asked again
    token = await cache.get()
    assert token.expires_at > now[0], f"handed out {token.value!r}, expired {now[0] - token.expires_at:.1f}s ago"


async def test_a_slow_failed_refresh_does_not_hand_out_a_token_that_expired_meanwhile() -> None:
    now = [0.0]
    calls = [0]

    async def provider() -> OAuthBearerToken:
        calls[0] += 1
        if calls[0] == 1:
            return OAuthBearerToken("first", 100.0)
        now[0] += 10.0  # the identity provider times out after 10 s
        raise RuntimeError("timed out")

    cache = TokenCache(provider, clock=lambda: now[0])
    await cache.get()
    now[0] = 95.0  # 5 s left when the refresh starts, none when it fails
    with pytest.raises(AuthenticationError, match="sasl_oauth_token_provider failed"):
        await cache.get()  # no valid token left: the provider's failure, not the expired token


async def test_a_token_that_expired_while_the_provider_ran_is_refused() -> None:
    clock = [1000.0]

    def provider() -> OAuthBearerToken:
        clock[0] += 10.0  # a slow identity provider
        return OAuthBearerToken("t", expires_at=1005.0)  # valid when asked for, expired when it came

    with pytest.raises(AuthenticationError, match="returned a token that expired 5s ago"):
        await TokenCache(provider, clock=lambda: clock[0]).get()


async def test_a_hanging_refresh_does_not_stop_a_producer_holding_a_valid_token(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The re-authentication waited for the identity provider's hanging call and timed out at
    # request_timeout_ms, closing the connection; every reconnect waited on it again: nothing
    # was produced, though the current token was valid ten more minutes (Java's refresh thread
    # runs beside the connections, which keep the current credential).
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    cluster.create_topic("t", 1)
    wall = [1_000_000.0]
    monkeypatch.setattr(auth.TokenCache.__init__, "__defaults__", (lambda: wall[0],))
    hanging = [False]

    async def provider() -> OAuthBearerToken:
        if hanging[0]:
            await asyncio.sleep(600)
        return OAuthBearerToken("token", wall[0] + 3600)

    async with oauth_producer(cluster, provider, linger_ms=0, delivery_timeout_ms=60_000) as p:
        await (await p.send("t", b"first"))
        wall[0] += 3000  # past the refresh point (80 %); the token is valid 600 s more
        hanging[0] = True
        await asyncio.sleep(SESSION_MS / 1000)  # the re-authentication asks the provider
        assert (await (await p.send("t", b"second"))).offset == 1


async def test_a_provider_slower_than_the_request_timeout_still_gets_its_token_used(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each connection attempt cancelled the provider's call at request_timeout_ms and the next
    # one started it again: a provider needing 40 s never finished, within any max_block_ms.
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    cluster.create_topic("t", 1)
    calls = 0

    async def provider() -> OAuthBearerToken:
        nonlocal calls
        calls += 1
        await asyncio.sleep(40)
        return OAuthBearerToken("token", 10**10)

    options: dict[str, Any] = {"request_timeout_ms": 30_000, "max_block_ms": 120_000, "delivery_timeout_ms": 180_000}
    async with oauth_producer(cluster, provider, linger_ms=0, **options) as p:
        assert (await (await p.send("t", b"x"))).offset == 0
    assert calls == 1


async def test_closing_the_producer_stops_its_provider_call(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The call went on after close(), for up to PROVIDER_CALL_LIMIT on the user's loop (a web
    # server's), and finished into the closed producer's cache.
    accept_every_sasl_client(monkeypatch, scripted.cluster)
    started, stopped = asyncio.Event(), asyncio.Event()

    async def provider() -> OAuthBearerToken:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    producer = oauth_producer(scripted.cluster, provider)
    await producer.start()
    sending = asyncio.ensure_future(producer.send("t", b"x"))
    await started.wait()
    await producer.close(timeout=0)
    with contextlib.suppress(KafkaError):
        await sending
    assert stopped.is_set()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "aioprod-token-refresh" and not t.done()]


async def test_credentials_refused_for_a_while_do_not_refuse_new_topics_once_accepted_again(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While the refreshes fail to authenticate, a send to a topic not known yet is refused at
    # once (waiting cannot fix credentials). Once a refresh authenticates again, it waits for
    # the topic as usual: the refusal is not kept.
    cluster = scripted.cluster
    accept_every_sasl_client(monkeypatch, cluster)
    refused = [False]
    answer_sasl_with(monkeypatch, 58, refused)  # SASL_AUTHENTICATION_FAILED while refused
    cluster.create_topic("t", 1)
    cluster.create_topic("u", 1)
    token = lambda: OAuthBearerToken("token", time.time() + 3600)  # noqa: E731
    async with oauth_producer(cluster, token, linger_ms=0, metadata_max_age_ms=1000) as p:
        await (await p.send("t", b"first"))
        refused[0] = True
        cluster.disconnect(1)  # reconnections refused: the refreshes fail to authenticate
        await scripted.clock.advance(3)
        with pytest.raises(AuthenticationError):
            await p.send("u", b"while refused")
        refused[0] = False
        await scripted.clock.advance(3)  # a refresh authenticates again
        assert (await (await p.send("u", b"accepted again"))).topic == "u"
    assert cluster.partition("u").values == [b"accepted again"]

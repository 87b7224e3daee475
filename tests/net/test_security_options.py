"""Security options: validation, secrets kept out of every printout, OAuth token refresh, MSK IAM."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import urllib.parse
from collections import deque
from pathlib import Path

import pytest

from aioprod.certs import CertificateAuthority
from aioprod.config import ProducerConfig
from aioprod.errors import AuthenticationError, ConfigError
from aioprod.net.auth import PROVIDER_CALL_LIMIT, OAuthBearerToken, TokenCache, msk_iam_token_provider
from aioprod.secure_gateway import SecureGateway
from tests.conftest import Scripted

SECRET = "hunter2-very-secret"
PLAIN_JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="key" password="{SECRET}";'


def config(**options: object) -> ProducerConfig:
    return ProducerConfig.from_options({"bootstrap_servers": "h:9092", **options})


def test_java_jaas_config_supplies_plain_credentials() -> None:
    c = config(**{"security.protocol": "SASL_SSL", "sasl.jaas.config": PLAIN_JAAS})
    assert c.sasl_mechanism == "PLAIN" and c.sasl_username == "key"
    assert c.sasl_password is not None and c.sasl_password.reveal() == SECRET
    assert c.tls_context is not None and c.tls_context.check_hostname


def test_librdkafka_and_aiokafka_names_are_accepted() -> None:
    c = config(
        **{
            "security.protocol": "sasl_plaintext",
            "sasl.mechanisms": "scram-sha-512",
            "sasl_plain_username": "u",
            "sasl_plain_password": SECRET,
        }
    )
    assert (c.security_protocol, c.sasl_mechanism, c.sasl_username) == ("SASL_PLAINTEXT", "SCRAM-SHA-512", "u")


def test_secrets_never_appear_in_repr_or_str() -> None:
    c = config(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password=SECRET,
    )
    assert SECRET not in repr(c) and SECRET not in str(c)
    jaas = config(security_protocol="SASL_SSL", sasl_jaas_config=PLAIN_JAAS)
    assert SECRET not in repr(jaas)
    assert OAuthBearerToken("tok-" + SECRET, 1.0).__repr__().find(SECRET) == -1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"security_protocol": "SASL_SLL"}, "did you mean 'SASL_SSL'"),
        ({"security_protocol": "PLAINTEXT", "sasl_mechanism": "PLAIN"}, "SASL needs SASL_PLAINTEXT or SASL_SSL"),
        ({"security_protocol": "SASL_PLAINTEXT", "ssl_ca_location": "/x"}, "TLS needs SSL or SASL_SSL"),
        ({"security_protocol": "SSL", "ssl_ca_location": "/no/such/ca.pem"}, "no such file"),
        ({"security_protocol": "SSL", "ssl_endpoint_identification_algorithm": "http"}, "'https'"),
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism is required"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "GSSAPI is not supported"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "AWS_MSK_IAM"}, "msk_iam_token_provider"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-257"}, "did you mean 'SCRAM-SHA-256'"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"}, "needs sasl_username"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "needs sasl_oauth_token_provider"),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_jaas_config": PLAIN_JAAS.replace("plain.PlainLoginModule", "scram.ScramLoginModule"),
            },
            "set sasl_mechanism to SCRAM-SHA-256 or SCRAM-SHA-512",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_jaas_config": PLAIN_JAAS, "sasl_password": SECRET},
            "given twice",
        ),
        ({"security_protocol": "SASL_SSL", "sasl_jaas_config": f"nonsense {SECRET}"}, "sasl_jaas_config"),
        # A delegation token's JAAS line: its tokenauth was dropped, and the token id was refused
        # by the broker as a SCRAM user with "invalid credentials".
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_jaas_config": PLAIN_JAAS.replace("plain.PlainLoginModule", "scram.ScramLoginModule").replace(
                    ";", ' tokenauth="true";'
                ),
            },
            'tokenauth="true" \\(a delegation token\\) is not supported',
        ),
        ({"sasl.pasword": SECRET}, "did you mean 'sasl.password'"),
        # Bytes that are not UTF-8 (a Latin-1 password read from a file or the environment):
        # retried until max_block_ms, with the whole password in every warning and the error.
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": SECRET + "\udce9",
            },
            "sasl_password is not valid text: character 20",
        ),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_username": SECRET + "\udce9",
                "sasl_password": "p",
            },
            "sasl_username is not valid text",
        ),
    ],
)
def test_mistakes_are_named_and_never_echo_a_secret(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        config(**options)
    assert SECRET not in str(info.value)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_tokens_are_reused_then_refreshed_before_they_expire() -> None:
    clock = Clock()
    issued: list[str] = []

    async def provider() -> OAuthBearerToken:
        issued.append(f"token-{len(issued)}")
        return OAuthBearerToken(issued[-1], clock.now + 100, {"logicalCluster": "lkc"})

    cache = TokenCache(provider, clock=clock)
    assert (await cache.get()).value == "token-0"
    clock.now += 79  # before 80 % of the lifetime: the same token
    assert (await cache.get()).value == "token-0"
    clock.now += 2  # past 80 %, still 19 s before expiry: a new one
    assert (await cache.get()).value == "token-1"
    assert cache.fetches == 2


async def test_a_sync_provider_may_return_a_tuple() -> None:
    clock = Clock()
    cache = TokenCache(lambda: ("tok", clock.now + 60), clock=clock)
    token = await cache.get()
    assert (token.value, token.expires_at) == ("tok", clock.now + 60)


async def test_an_expiry_in_milliseconds_is_caught_with_a_hint() -> None:
    clock = Clock()
    cache = TokenCache(lambda: ("tok", 10.0), clock=clock)  # a duration, not a time
    with pytest.raises(AuthenticationError, match="seconds since the epoch"):
        await cache.get()


async def test_a_failing_provider_is_an_authentication_error() -> None:
    def provider() -> OAuthBearerToken:
        raise RuntimeError("identity provider down")

    with pytest.raises(AuthenticationError, match="identity provider down"):
        await TokenCache(provider).get()


async def test_msk_iam_helper_signs_locally_and_converts_the_millisecond_expiry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signer presigns a kafka-cluster:Connect URL with the default credential chain (no network)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    token = await msk_iam_token_provider("eu-west-1")()
    url = base64.urlsafe_b64decode(token.value + "=" * (-len(token.value) % 4)).decode()
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    assert urllib.parse.urlparse(url).hostname == "kafka.eu-west-1.amazonaws.com"
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert time.time() < token.expires_at < time.time() + 3600  # seconds, not milliseconds


async def test_a_provider_answer_in_the_wrong_order_does_not_quote_the_token() -> None:
    # (expires_at, token) the wrong way round: float()'s own message quoted the token, into
    # the AuthenticationError and the warnings.
    token = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.SECRET-SIGNATURE"
    cache = TokenCache(lambda: ("1900000000", token))
    with pytest.raises(AuthenticationError, match=r"in that order") as info:
        await cache.get()
    assert "SECRET-SIGNATURE" not in str(info.value)


async def test_an_expiry_in_milliseconds_is_refused_naming_it() -> None:
    # A Java habit (lifetimeMs): the token looked valid for 55,000 years, was never refreshed,
    # and once the real JWT expired every reconnect presented it again, for good.
    cache = TokenCache(lambda: OAuthBearerToken("jwt", (time.time() + 3600) * 1000))
    with pytest.raises(AuthenticationError, match="not milliseconds"):
        await cache.get()


async def test_a_provider_call_stuck_for_good_is_given_up_and_made_again(scripted: Scripted) -> None:
    # A provider awaiting an identity provider that never answers (no timeout of its own) held
    # every connection for good: the one call under way is never restarted by its waiters.
    calls = 0

    async def provider() -> OAuthBearerToken:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.Event().wait()
        return OAuthBearerToken("tok", time.time() + 3600)

    cache = TokenCache(provider)
    first = asyncio.ensure_future(cache.get())
    await scripted.clock.advance(PROVIDER_CALL_LIMIT + 1)
    with pytest.raises(AuthenticationError, match="did not answer within 120s"):
        await first
    assert (await cache.get()).value == "tok" and calls == 2


async def test_a_providers_own_timeout_is_its_failure() -> None:
    async def provider() -> OAuthBearerToken:
        raise TimeoutError("identity provider: read timed out")

    with pytest.raises(AuthenticationError, match="failed: TimeoutError: identity provider: read timed out"):
        await TokenCache(provider).get()


async def test_an_empty_extension_from_the_provider_names_the_provider() -> None:
    cache = TokenCache(lambda: OAuthBearerToken("tok", time.time() + 3600, {"logicalCluster": ""}))
    with pytest.raises(AuthenticationError, match="sasl_oauth_token_provider"):
        await cache.get()


@pytest.mark.parametrize("case", ["swapped", "the key twice", "an empty certificate"])
def test_a_file_without_a_certificate_is_not_blamed_on_the_key_password(tmp_path: Path, case: str) -> None:
    cert, key = CertificateAuthority().issue("client", client=True).write(tmp_path, "client")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    certificate, key_file = {"swapped": (key, cert), "the key twice": (key, key), "an empty certificate": (empty, key)}[
        case
    ]
    with pytest.raises(ConfigError, match="ssl_certificate_location holds no PEM certificate") as info:
        ProducerConfig.from_options(
            bootstrap_servers="h:9093",
            security_protocol="SSL",
            ssl_certificate_location=str(certificate),
            ssl_key_location=str(key_file),
        )
    assert "ssl_key_password" not in str(info.value)


def test_a_certificate_without_its_key_names_ssl_key_location(tmp_path: Path) -> None:
    # OpenSSL says "PEM lib" for a missing key as for a wrong password: the hint blamed the password.
    cert, _key = CertificateAuthority().issue("client", client=True).write(tmp_path, "client")
    with pytest.raises(ConfigError, match="set ssl_key_location") as info:
        ProducerConfig.from_options(
            bootstrap_servers="h:9093", security_protocol="SSL", ssl_certificate_location=str(cert)
        )
    assert "ssl_key_password" not in str(info.value)


async def test_the_embedded_brokers_gateway_skips_tansus_answers_to_acks_0_produce() -> None:
    # Tansu answers acks=0 Produce; the gateway in front of it (aioprod broker --tls/--sasl)
    # expects no answer to them, paired each answer with the oldest request waiting, and died on
    # one with none waiting (IndexError), tearing down the client's connection with its records.
    reader = asyncio.StreamReader()
    waiting: deque[tuple[int, asyncio.Future[bytes]]] = deque()
    metadata: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    waiting.append((8, metadata))
    for correlation_id in (6, 7, 8, 9):  # acks=0 answers around the one awaited
        reader.feed_data(struct.pack(">ii", 4, correlation_id))
    reader.feed_eof()
    await SecureGateway._from_upstream(reader, waiting)
    assert metadata.result() == struct.pack(">ii", 4, 8) and not waiting


class FakeClientThatNeverReads:
    """The gateway's writer to a client that sends requests and never reads an answer: the
    first write fills its socket buffer, and drain() waits for good."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self._never = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.written.append(data)

    async def drain(self) -> None:
        await self._never.wait()


class FakeUpstream:
    """The gateway's writer to Tansu, which SaslHandshake requests never reach."""

    def write(self, data: bytes) -> None:
        raise AssertionError("a SASL request went to the broker")

    async def drain(self) -> None:
        pass


async def test_the_embedded_brokers_gateway_stops_reading_a_client_that_never_reads_its_answers() -> None:
    # It read on and queued every answer: a client pipelining requests without reading grew the
    # gateway by ~100 MB in 20 s (repro/gateway_slow_reader.py). Kafka mutes such a connection.
    from aioprod import secure_gateway

    gateway = SecureGateway(
        secure_gateway.GatewayConfig(listen_port=0, upstream_port=0, sasl_mechanisms=("PLAIN",), users={"u": "p"})
    )
    limit = getattr(secure_gateway, "MAX_PENDING_RESPONSES", 1000)
    reader = asyncio.StreamReader()
    requests = 3 * limit
    for correlation_id in range(requests):  # SaslHandshake v1, answered by the gateway itself
        body = struct.pack(">hhih", 17, 1, correlation_id, 1) + b"c" + struct.pack(">h", 5) + b"PLAIN"
        reader.feed_data(struct.pack(">i", len(body)) + body)
    reader.feed_eof()
    outbox = secure_gateway._Outbox()
    client = FakeClientThatNeverReads()
    tasks = [
        asyncio.ensure_future(gateway._from_client(reader, FakeUpstream(), outbox, deque())),  # type: ignore[arg-type]
        asyncio.ensure_future(gateway._to_client(client, outbox)),  # type: ignore[arg-type]
    ]
    try:
        for _ in range(50):  # no I/O: every step either task can take, without the fix the whole input
            await asyncio.sleep(0)
        assert not tasks[0].done(), "the gateway read every request of a client that reads no answer"
        assert outbox.qsize() <= limit
        assert len(client.written) == 1
    finally:
        for task in tasks:
            task.cancel()

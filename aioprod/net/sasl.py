"""SASL mechanisms as sans-IO exchanges: bytes from the broker in, bytes to send out.

Each exchange produces the client's first message with :meth:`SaslExchange.start`, then
answers each server message with :meth:`SaslExchange.step` until :attr:`complete`. Nothing
here does I/O or knows about Kafka framing: :mod:`aioprod.net.auth` carries these bytes in
SaslAuthenticate requests. Failures raise :class:`ExchangeError`, which the caller turns
into an :class:`~aioprod.errors.AuthenticationError` naming the broker.

- PLAIN: RFC 4616.
- SCRAM-SHA-256 / SCRAM-SHA-512: RFC 5802 and RFC 7677, as Kafka implements them (no
  channel binding, at least 4096 iterations, the server's signature always verified).
- OAUTHBEARER: RFC 7628's client response, as Kafka's ``OAuthBearerSaslClient`` sends it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "MECHANISMS",
    "SCRAM_MECHANISMS",
    "ExchangeError",
    "JaasConfig",
    "OAuthBearerExchange",
    "PlainExchange",
    "SaslExchange",
    "ScramExchange",
    "parse_jaas_config",
]

SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS, "OAUTHBEARER")

#: Kafka's ScramMechanism.minIterations: fewer means a server that weakens the password hash.
SCRAM_MIN_ITERATIONS = 4096
#: PBKDF2 runs on the event loop: a server asking for more would freeze it (0.6 s per million
#: SHA-512 rounds; 2**31 - 1 is 20 minutes). Kafka's ScramMechanism.maxIterations is 16384.
SCRAM_MAX_ITERATIONS = 1 << 20


class ExchangeError(Exception):
    """The server's SASL messages are malformed, or it failed to prove its identity."""


class SaslExchange:
    """One authentication attempt of one mechanism; create a new one per attempt."""

    mechanism: str
    complete: bool = False

    def start(self) -> bytes:
        raise NotImplementedError

    def step(self, server_message: bytes) -> bytes | None:
        """The next message to send, or None when the exchange is complete."""
        raise NotImplementedError


class PlainExchange(SaslExchange):
    """RFC 4616: one message, ``authzid NUL authcid NUL password``; the broker's reply is empty."""

    mechanism = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        self._message = b"\0" + username.encode() + b"\0" + password.encode()

    def __repr__(self) -> str:
        return "<PlainExchange>"

    def start(self) -> bytes:
        return self._message

    def step(self, server_message: bytes) -> bytes | None:
        self.complete = True
        return None


def _saslname(username: str) -> str:
    # RFC 5802 section 5.1: ',' and '=' are escaped in the username.
    return username.replace("=", "=3D").replace(",", "=2C")


def _attributes(message: str) -> dict[str, str]:
    attrs = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ExchangeError(f"malformed SCRAM message attribute {part[:40]!r}")
        attrs[key] = value
    return attrs


class ScramExchange(SaslExchange):
    """RFC 5802 client: client-first, then client-final with the proof, then verify the server.

    ``nonce`` is for tests against the RFC's vectors; normally 32 random bytes are used.
    """

    def __init__(self, mechanism: str, username: str, password: str, *, nonce: str | None = None) -> None:
        if mechanism in SCRAM_MECHANISMS:
            self._hash = SCRAM_MECHANISMS[mechanism]
        elif mechanism == "SCRAM-SHA-1":  # only so that RFC 5802's own vectors can be checked
            self._hash = "sha1"
        else:
            raise ValueError(f"not a SCRAM mechanism: {mechanism!r}")
        self.mechanism = mechanism
        self._password = password.encode()
        self._nonce = nonce or base64.b64encode(secrets.token_bytes(32)).decode()
        self._client_first_bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def __repr__(self) -> str:
        return f"<ScramExchange {self.mechanism}>"

    def start(self) -> bytes:
        return ("n,," + self._client_first_bare).encode()

    def step(self, server_message: bytes) -> bytes | None:
        if self._server_signature is None:
            return self._client_final(server_message)
        self._verify_server_final(server_message)
        self.complete = True
        return None

    def _client_final(self, server_first_bytes: bytes) -> bytes:
        try:
            server_first = server_first_bytes.decode()
        except UnicodeDecodeError as exc:
            raise ExchangeError("server-first-message is not UTF-8") from exc
        attrs = _attributes(server_first)
        if "e" in attrs:
            raise ExchangeError(f"server error: {attrs['e']}")
        if "m" in attrs:
            raise ExchangeError("server-first-message requires an unsupported SCRAM extension")
        try:
            nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"], validate=True), int(attrs["i"])
        except (KeyError, ValueError) as exc:
            raise ExchangeError(f"malformed server-first-message: {exc}") from exc
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ExchangeError("server nonce does not extend the client nonce")
        if iterations < SCRAM_MIN_ITERATIONS:
            raise ExchangeError(
                f"server asks for {iterations} iterations, fewer than the minimum {SCRAM_MIN_ITERATIONS}"
            )
        if iterations > SCRAM_MAX_ITERATIONS:
            raise ExchangeError(
                f"server asks for {iterations} iterations, more than the maximum {SCRAM_MAX_ITERATIONS}"
            )
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _verify_server_final(self, server_final: bytes) -> None:
        try:
            attrs = _attributes(server_final.decode())
        except UnicodeDecodeError as exc:
            raise ExchangeError("server-final-message is not UTF-8") from exc
        if "e" in attrs:
            raise ExchangeError(f"server error: {attrs['e']}")
        try:
            signature = base64.b64decode(attrs["v"], validate=True)
        except (KeyError, ValueError) as exc:
            raise ExchangeError("malformed server-final-message") from exc
        assert self._server_signature is not None
        if not hmac.compare_digest(signature, self._server_signature):
            raise ExchangeError("the server's signature does not match: it does not know this user's password")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()


# Kafka's OAuthBearerClientInitialResponse KEY and VALUE, matched whole (fullmatch: '$' would
# let a trailing newline through).
_EXTENSION_KEY = re.compile(r"[A-Za-z]+")
_EXTENSION_VALUE = re.compile(r"[\x21-\x7E \t\r\n]+")


class OAuthBearerExchange(SaslExchange):
    """RFC 7628 client response: ``n,,^Aauth=Bearer <token>^A[key=value^A]...^A``.

    A broker that rejects the token answers with a JSON error instead of an empty message;
    the client then sends a lone ``^A`` and the broker fails the authentication, so the
    JSON is kept in :attr:`server_error` for the message the caller raises.
    """

    mechanism = "OAUTHBEARER"

    def __init__(self, token: str, extensions: Mapping[str, str] | None = None) -> None:
        parts = [f"auth=Bearer {token}"]
        for key, value in (extensions or {}).items():
            if key == "auth" or not _EXTENSION_KEY.fullmatch(key) or not _EXTENSION_VALUE.fullmatch(value):
                raise ValueError(f"invalid SASL extension {key!r}")
            parts.append(f"{key}={value}")
        self._message = ("n,,\x01" + "\x01".join(parts) + "\x01\x01").encode()
        self.server_error: str | None = None

    def __repr__(self) -> str:
        return "<OAuthBearerExchange>"

    def start(self) -> bytes:
        return self._message

    def step(self, server_message: bytes) -> bytes | None:
        if server_message and self.server_error is None:
            self.server_error = server_message.decode("utf-8", "replace")
            return b"\x01"
        self.complete = True
        return None


# -- Java's sasl.jaas.config -------------------------------------------------------------------

_JAAS = re.compile(
    r"\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)\s*(?P<rest>.*?);?\s*$", re.S
)
# Kafka's JaasConfig tokenizer takes '"' and "'" as quotes.
_JAAS_OPTION = re.compile(
    r"""\s*(?P<key>[\w.\-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|'(?P<single>(?:[^'\\]|\\.)*)'|(?P<bare>[^\s"';]+))""",
    re.S,
)

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


@dataclass(frozen=True)
class JaasConfig:
    """One login module entry of a ``sasl.jaas.config`` string. ``repr`` hides the options."""

    module: str
    options: Mapping[str, str]

    def __repr__(self) -> str:
        return f"JaasConfig(module={self.module!r}, options=<{len(self.options)} hidden>)"


def parse_jaas_config(text: str) -> JaasConfig:
    """Parse ``<LoginModule> required key="value" ...;`` (what Java users paste from their configs).

    Raises ``ValueError`` with a message that never quotes option values (they hold passwords).
    """
    match = _JAAS.match(text)
    if match is None:
        raise ValueError("expected '<LoginModule class> required key=\"value\" ...;'")
    rest = match.group("rest")
    options: dict[str, str] = {}
    position = 0
    while position < len(rest.rstrip()):
        option = _JAAS_OPTION.match(rest, position)
        if option is None:
            raise ValueError(f'cannot parse the options after {len(options)} option(s): expected key="value"')
        quoted = option.group("quoted") if option.group("quoted") is not None else option.group("single")
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else option.group("bare")
        options[option.group("key")] = value
        position = option.end()
    return JaasConfig(match.group("module"), options)

"""SASL authentication of broker connections, and KIP-368 re-authentication.

After the ApiVersions handshake, :meth:`SaslAuthenticator.authenticate` sends SaslHandshake
and then SaslAuthenticate requests carrying one :mod:`aioprod.net.sasl` exchange. When the
broker answers with a session lifetime, the connection re-authenticates at 85-95 % of it
(the Java client's window): new requests are held back while the old ones complete in
order, and none is failed or sent twice.

OAUTHBEARER tokens come from the user's provider through one :class:`TokenCache` per
producer, which asks for a new token once 80 % of the current one's lifetime has passed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aioprod.errors import (
    AuthenticationError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    SaslMechanismNotEnabledError,
    UnsupportedVersionError,
    error_for_code,
)
from aioprod.event_log import ClientLogger
from aioprod.net.sasl import (
    SCRAM_MECHANISMS,
    ExchangeError,
    OAuthBearerExchange,
    PlainExchange,
    SaslExchange,
    ScramExchange,
)
from aioprod.protocol.messages import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

if TYPE_CHECKING:
    from aioprod.config import ProducerConfig
    from aioprod.net.connection import BrokerConnection

__all__ = ["ConnectionSecurity", "OAuthBearerToken", "SaslAuthenticator", "TokenCache", "msk_iam_token_provider"]

log = logging.getLogger(__name__)
Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]

#: Kafka's SASL_AUTHENTICATION_FAILED and UNSUPPORTED_SASL_MECHANISM error codes.
_AUTHENTICATION_FAILED = 58
_UNSUPPORTED_MECHANISM = 33
_ILLEGAL_SASL_STATE = 34
_MAX_ROUNDS = 8
#: Re-authenticate within this fraction of the session lifetime (KIP-368, as the Java client).
REAUTH_WINDOW = (0.85, 0.95)
#: Fetch a new token once this fraction of the current one's lifetime has passed (Java's
#: sasl.login.refresh.window.factor).
TOKEN_REFRESH_FACTOR = 0.8
#: How long a connection with a still-valid token waits for a refresh before using that token.
_REFRESH_WAIT = 5.0
#: How long one call of an async token provider may take: one stuck for good (a request to the
#: identity provider without a timeout) is given up, and the next connection calls it again.
PROVIDER_CALL_LIMIT = 120.0
#: An expires_at past this (the year 5138) is milliseconds since the epoch, not seconds.
_EXPIRY_IN_MILLISECONDS = 1e11


@dataclass(frozen=True)
class OAuthBearerToken:
    """What an OAUTHBEARER token provider returns. ``repr`` hides the token.

    ``expires_at`` is in seconds since the epoch (``time.time()``'s clock); ``extensions``
    are sent as SASL extensions (e.g. Confluent Cloud's ``logicalCluster``).
    """

    value: str = field(repr=False)
    expires_at: float
    extensions: Mapping[str, str] = field(default_factory=dict)


#: RFC 6750's b64token: what a bearer token may hold (Kafka's broker takes less: [-_.a-zA-Z0-9]+).
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def _as_token(result: Any) -> OAuthBearerToken:
    if isinstance(result, OAuthBearerToken):
        expires_at = _seconds(result.expires_at, "OAuthBearerToken.expires_at")
        return _checked_value(OAuthBearerToken(result.value, expires_at, result.extensions))
    if isinstance(result, tuple) and len(result) in (2, 3) and isinstance(result[0], str):
        extensions = result[2] if len(result) == 3 else {}
        hint = " (is the tuple (token, expires_at), in that order?)"
        return _checked_value(OAuthBearerToken(result[0], _seconds(result[1], "expires_at", hint), dict(extensions)))
    raise TypeError(
        "sasl_oauth_token_provider must return an OAuthBearerToken or a (token, expires_at[, extensions]) tuple, "
        f"got {type(result).__name__}"
    )


def _seconds(value: Any, name: str, hint: str = "") -> float:
    """An expiry as float seconds: any number (a Decimal, numpy's integers), never a bool, a
    string or a datetime (google-auth's ``credentials.expiry``), which compared with the clock
    raised a bare TypeError that was retried as a lost connection."""
    try:
        if isinstance(value, str | bytes | bytearray | bool):
            raise TypeError
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        # Not float()'s own message: it quotes the value, which may be the token itself.
        raise TypeError(
            f"{name} must be a number of seconds since the epoch, got a {type(value).__name__}{hint}"
        ) from None
    if not math.isfinite(seconds):
        # NaN compares false with every time (taken, then never reused); no token lasts forever.
        raise TypeError(f"{name} must be a finite number of seconds since the epoch, got {seconds}")
    return seconds


def _checked_value(token: OAuthBearerToken) -> OAuthBearerToken:
    """The token, if a broker can parse it: sent as it was, a newline read from a file with it
    came back as "invalid credentials", and a ``\\x01`` in it framed an extension of its own."""
    value = token.value
    if not isinstance(value, str):
        raise TypeError(f"the token must be a str, got a {type(value).__name__}")
    if not value:
        raise TypeError("the token is empty")
    if not _B64TOKEN.fullmatch(value):
        # Where it goes wrong, never the token itself.
        bad = next((i for i, c in enumerate(value) if c != "=" and not _B64TOKEN.fullmatch(c)), None)
        if bad is None:
            raise TypeError("the token is not a bearer token: '=' may only end it (RFC 6750)")
        raise TypeError(
            f"the token has {value[bad]!r} at character {bad + 1} of {len(value)}, which a bearer token "
            "cannot hold (RFC 6750; a trailing newline read from a file?)"
        )
    return token


class _ProviderStuck(Exception):
    """The provider's call ran past PROVIDER_CALL_LIMIT."""


class TokenCache:
    """The current OAUTHBEARER token, shared by all of a producer's connections.

    One provider call at a time; a token past 80 % of its lifetime is replaced before use,
    so connections and re-authentications never present an expired one. ``clock`` is
    injectable for tests.
    """

    def __init__(
        self, provider: Callable[[], Any], clock: Callable[[], float] = time.time, *, logger: Logger = log
    ) -> None:
        self._provider = provider
        self._clock = clock
        self._log = logger
        self._token: OAuthBearerToken | None = None
        self._refresh_at = 0.0
        #: The one provider call under way: shared by every caller, never cancelled by them (a
        #: connection that gives up waiting must not restart a slow provider from scratch).
        self._refreshing: asyncio.Task[OAuthBearerToken] | None = None
        self.fetches = 0

    async def get(self) -> OAuthBearerToken:
        if self._token is not None and self._clock() < self._refresh_at:
            return self._token
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.get_running_loop().create_task(
                self._refresh(), name="aioprod-token-refresh"
            )
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, even unawaited
        current = self._token
        remaining = 0.0 if current is None else current.expires_at - self._clock()
        if current is None or remaining <= 0:
            return await asyncio.shield(task)
        # A still-valid token: a refresh is not a reason to hold a connection back for long (Java's
        # refresh thread runs beside the connections, which keep the current credential).
        await asyncio.wait([task], timeout=min(_REFRESH_WAIT, remaining / 2))
        if task.done() and not task.cancelled() and task.exception() is None:
            return task.result()
        return current if current.expires_at > self._clock() else await asyncio.shield(task)

    def close(self) -> None:
        """Stop the provider call under way: its producer is closing, and the call outlived it
        (up to PROVIDER_CALL_LIMIT, on the user's loop)."""
        if self._refreshing is not None:
            self._refreshing.cancel()

    async def _refresh(self) -> OAuthBearerToken:
        try:
            token = await self._fetch()
        except AuthenticationError as exc:
            current = self._token
            now = self._clock()  # the provider may have taken a while to fail
            if current is None or current.expires_at <= now:
                raise
            # A refresh that fails while the current token is still valid is not a reason to
            # fail anything (Java's refresh thread retries while the old credential is used).
            self._log.warning(
                "%s; using the current token (valid %.0fs more) and retrying later", exc, current.expires_at - now
            )
            self._refresh_at = min(now + min(30.0, max(1.0, (current.expires_at - now) / 4)), current.expires_at)
            return current
        now = self._clock()  # the provider may have taken a while
        self.fetches += 1
        self._token = token
        self._refresh_at = now + TOKEN_REFRESH_FACTOR * (token.expires_at - now)
        return token

    async def _fetch(self) -> OAuthBearerToken:
        """One call of the provider, its answer checked (extensions included: refused here, by
        name, not later as a failed handshake)."""
        try:
            result = self._provider()
            if inspect.isawaitable(result):
                limit = asyncio.timeout(PROVIDER_CALL_LIMIT)
                try:
                    async with limit:
                        result = await result
                except TimeoutError:
                    if not limit.expired():
                        raise  # the provider's own
                    raise _ProviderStuck from None
            token = _as_token(result)
            OAuthBearerExchange(token.value, token.extensions)
        except asyncio.CancelledError:
            raise
        except _ProviderStuck:
            raise AuthenticationError(
                f"sasl_oauth_token_provider did not answer within {PROVIDER_CALL_LIMIT:.0f}s: given up, and called "
                "again on the next connection",
                mechanism="OAUTHBEARER",
                broker="-",
            ) from None
        except Exception as exc:
            message = f"sasl_oauth_token_provider failed: {type(exc).__name__}: {exc}"
            raise AuthenticationError(message, mechanism="OAUTHBEARER", broker="-") from exc
        now = self._clock()  # after the provider answered: its token must still be valid
        if token.expires_at <= now:
            raise AuthenticationError(
                f"sasl_oauth_token_provider returned a token that expired {now - token.expires_at:.0f}s ago "
                "(expires_at must be seconds since the epoch, not milliseconds or a duration)",
                mechanism="OAUTHBEARER",
                broker="-",
            )
        if token.expires_at > _EXPIRY_IN_MILLISECONDS:
            raise AuthenticationError(
                f"sasl_oauth_token_provider returned expires_at={token.expires_at:.0f}, thousands of years away: "
                "expires_at must be seconds since the epoch, not milliseconds",
                mechanism="OAUTHBEARER",
                broker="-",
            )
        return token


class SaslAuthenticator:
    """Authenticates connections with one mechanism and one set of credentials."""

    def __init__(
        self,
        mechanism: str,
        *,
        username: str | None = None,
        password: str | None = None,
        tokens: TokenCache | None = None,
        rng: random.Random | None = None,
        logger: Logger = log,
    ) -> None:
        self.mechanism = mechanism
        self._log = logger
        self._username = username
        self._password = password
        self._tokens = tokens
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"<SaslAuthenticator {self.mechanism}>"

    def close(self) -> None:
        if self._tokens is not None:
            self._tokens.close()

    async def _exchange(self) -> SaslExchange:
        if self.mechanism == "OAUTHBEARER":
            assert self._tokens is not None
            token = await self._tokens.get()
            return OAuthBearerExchange(token.value, token.extensions)  # extensions checked by the cache
        assert self._username is not None and self._password is not None
        if self.mechanism in SCRAM_MECHANISMS:
            return ScramExchange(self.mechanism, self._username, self._password)
        return PlainExchange(self._username, self._password)

    async def authenticate(self, conn: BrokerConnection) -> None:
        """SaslHandshake + SaslAuthenticate on ``conn``; schedules the next re-authentication."""
        broker = f"{conn.host}:{conn.port}"
        lifetime_ms = await self._authenticate(conn, broker)
        if lifetime_ms > 0:
            delay = lifetime_ms / 1000 * self._rng.uniform(*REAUTH_WINDOW)

            def cancel(_conn: Any, _error: Any) -> None:
                timer.cancel()

            def fire() -> None:
                conn.off_close(cancel)  # one callback per pending timer, not one per re-authentication
                self._start_reauthentication(conn)

            timer = asyncio.get_running_loop().call_later(delay, fire)
            conn.on_close(cancel)

    async def _authenticate(self, conn: BrokerConnection, broker: str) -> int:
        if SaslAuthenticateRequest.API_KEY not in conn.api_versions:
            raise UnsupportedVersionError(
                f"broker {broker} does not support SaslAuthenticate (Kafka 1.0+ is needed for SASL)"
            )
        if self.mechanism == "OAUTHBEARER":
            conn.phase = "SASL OAUTHBEARER authentication (waiting for sasl_oauth_token_provider)"
        exchange = await self._exchange()
        conn.phase = f"SASL {self.mechanism} authentication"
        try:
            handshake: SaslHandshakeResponse = await conn.send(
                SaslHandshakeRequest(mechanism=self.mechanism), bypass_hold=True
            )
        except KafkaConnectionError as exc:
            raise KafkaConnectionError(f"SASL {self.mechanism} handshake with broker {broker} failed: {exc}") from exc
        if handshake.error_code == _UNSUPPORTED_MECHANISM:
            enabled = tuple(handshake.mechanisms)
            listed = ", ".join(enabled) or "(none listed)"
            detail = f"it enables: {listed}"
            if self.mechanism in enabled:  # e.g. Tansu without --authentication echoes the request
                detail = f"it lists {listed} but refused it: is this listener SASL at all? (check security_protocol)"
            raise SaslMechanismNotEnabledError(
                f"broker {broker} does not enable SASL mechanism {self.mechanism}; {detail}",
                mechanism=self.mechanism,
                broker=broker,
                enabled=enabled,
            )
        if handshake.error_code:
            raise AuthenticationError(
                f"SASL {self.mechanism} handshake with broker {broker} failed (error code {handshake.error_code})"
                + (
                    ": the listener does not expect SASL (check security_protocol)"
                    if handshake.error_code == _ILLEGAL_SASL_STATE
                    else ""
                ),
                mechanism=self.mechanism,
                broker=broker,
            )
        message: bytes | None = exchange.start()
        lifetime_ms = 0
        for _ in range(_MAX_ROUNDS):
            assert message is not None
            response: SaslAuthenticateResponse = await conn.send(
                SaslAuthenticateRequest(auth_bytes=message), bypass_hold=True
            )
            if response.error_code:
                raise self._failure(response, exchange, broker)
            lifetime_ms = response.session_lifetime_ms
            try:
                message = exchange.step(response.auth_bytes)
            except ExchangeError as exc:
                raise AuthenticationError(
                    f"SASL {self.mechanism} authentication with broker {broker} failed: {exc}",
                    mechanism=self.mechanism,
                    broker=broker,
                ) from None
            if message is None:
                self._log.debug("authenticated with broker %s using %s", broker, self.mechanism)
                return lifetime_ms
        raise AuthenticationError(
            f"SASL {self.mechanism} exchange with broker {broker} did not finish in {_MAX_ROUNDS} rounds",
            mechanism=self.mechanism,
            broker=broker,
        )

    def _failure(self, response: SaslAuthenticateResponse, exchange: SaslExchange, broker: str) -> KafkaError:
        if response.error_code not in (_AUTHENTICATION_FAILED, _UNSUPPORTED_MECHANISM, _ILLEGAL_SASL_STATE):
            # No refusal of the credentials (a broker's internal error, a timeout behind it): as
            # the Java client, a lost connection, tried again, not a failure of every record. The
            # answer is named, not chained: its code (31, 35) decides nothing about the records.
            answer = error_for_code(response.error_code, response.error_message or "SaslAuthenticate")
            return KafkaConnectionError(
                f"SASL {self.mechanism} authentication with broker {broker} was answered "
                f"{type(answer).__name__}: {answer}; trying again"
            )
        detail = response.error_message or "invalid credentials"
        if isinstance(exchange, OAuthBearerExchange) and exchange.server_error:
            detail += f" (broker says: {exchange.server_error})"
        if response.error_code != _AUTHENTICATION_FAILED:
            detail += f" (error code {response.error_code})"
        return AuthenticationError(
            f"SASL {self.mechanism} authentication failed at broker {broker}: {detail}",
            mechanism=self.mechanism,
            broker=broker,
        )

    def _start_reauthentication(self, conn: BrokerConnection) -> None:
        if conn.closed:
            return
        task = asyncio.get_running_loop().create_task(self._reauthenticate(conn), name=f"aioprod-reauth-{conn.node_id}")

        def cancel(_conn: Any, _error: Any) -> None:
            task.cancel()

        conn.on_close(cancel)
        task.add_done_callback(lambda _task: conn.off_close(cancel))

    async def _reauthenticate(self, conn: BrokerConnection) -> None:
        # Bounded as the first authentication is (by the request timeout): the connection holds
        # every request meanwhile, and a token provider that never answers held them for good.
        conn.hold()
        try:
            async with asyncio.timeout(conn.request_timeout):
                await self.authenticate(conn)
        except TimeoutError:
            error = KafkaTimeoutError(
                f"re-authentication with broker {conn.host}:{conn.port} did not complete within "
                f"{conn.request_timeout:.3g}s (request_timeout_ms)"
            )
            self._log.warning("%s", error)
            conn.close(error)
        except KafkaError as exc:
            self._log.warning("re-authentication with broker %s:%s failed: %s", conn.host, conn.port, exc)
            # Requests in flight were sent in a valid session: for them this is a lost connection
            # (retriable); a reconnection reports the authentication error itself if it persists.
            lost = KafkaConnectionError(f"re-authentication with broker {conn.host}:{conn.port} failed: {exc}")
            lost.__cause__ = exc
            conn.close(lost)
        finally:
            conn.release()


@dataclass(frozen=True)
class ConnectionSecurity:
    """What every connection of one producer needs to be secured: TLS context, authenticator."""

    tls_context: ssl.SSLContext | None
    authenticator: SaslAuthenticator | None

    @classmethod
    def from_config(cls, config: ProducerConfig) -> ConnectionSecurity | None:
        if config.security_protocol == "PLAINTEXT":
            return None
        authenticator = None
        if config.sasl_mechanism is not None and config.security_protocol.startswith("SASL_"):
            provider = config.sasl_oauth_token_provider
            logger = ClientLogger(log, config.client_id)
            authenticator = SaslAuthenticator(
                config.sasl_mechanism,
                username=config.sasl_username,
                password=None if config.sasl_password is None else config.sasl_password.reveal(),
                tokens=TokenCache(provider, logger=logger) if provider is not None else None,
                logger=logger,
            )
        return cls(config.tls_context, authenticator)


def msk_iam_token_provider(
    region: str,
    *,
    aws_profile: str | None = None,
    role_arn: str | None = None,
    role_session_name: str | None = None,
) -> Callable[[], Awaitable[OAuthBearerToken]]:
    """An OAUTHBEARER token provider for Amazon MSK IAM authentication.

    Built on ``aws-msk-iam-sasl-signer-python`` (``pip install 'aioprod[msk-iam]'``),
    imported on first use. Credentials come from the default AWS chain, a named profile,
    or a role to assume. The signer blocks (it may call STS), so it runs in a thread; it
    reports expiry in milliseconds, converted here to seconds.
    """
    try:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
    except ImportError as exc:
        raise ImportError(
            "Amazon MSK IAM authentication needs aws-msk-iam-sasl-signer-python: pip install 'aioprod[msk-iam]'"
        ) from exc

    def generate() -> tuple[str, int]:
        if role_arn is not None:
            session = role_session_name or "aioprod"
            return MSKAuthTokenProvider.generate_auth_token_from_role_arn(region, role_arn, session)  # type: ignore[no-any-return]
        if aws_profile is not None:
            return MSKAuthTokenProvider.generate_auth_token_from_profile(region, aws_profile)  # type: ignore[no-any-return]
        return MSKAuthTokenProvider.generate_auth_token(region)  # type: ignore[no-any-return]

    async def provide() -> OAuthBearerToken:
        token, expiry_ms = await asyncio.to_thread(generate)
        return OAuthBearerToken(token, expiry_ms / 1000)

    return provide

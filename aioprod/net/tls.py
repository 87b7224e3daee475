"""TLS for broker connections: the SSL context from the options, and failures named plainly.

The context verifies the broker's certificate against ``ssl_ca_location`` (or the system's
CAs when none is given) and, unless ``ssl_endpoint_identification_algorithm`` is ``""``
(the Java client's switch), checks that the certificate names the host the client
connected to. A user's own ``ssl_context`` is used as it is.
"""

from __future__ import annotations

import ssl

from aioprod.errors import ConfigError, KafkaConnectionError, SslAuthenticationError

__all__ = ["build_ssl_context", "connection_error", "tls_failure"]


def build_ssl_context(
    *,
    ca_location: str | None,
    certificate_location: str | None,
    key_location: str | None,
    key_password: str | None,
    check_hostname: bool,
) -> ssl.SSLContext:
    """A client context from PEM files; a file that cannot be used is a :class:`ConfigError`."""
    try:
        context = ssl.create_default_context(cafile=ca_location)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"ssl_ca_location {ca_location!r}: cannot load CA certificates ({_reason(exc)})") from exc
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if certificate_location is not None:
        try:
            # A callable, never None: with None, OpenSSL would prompt on the terminal for an
            # encrypted key's password.
            context.load_cert_chain(certificate_location, key_location, password=lambda: key_password or "")
        except (OSError, ssl.SSLError) as exc:
            files = f"ssl_certificate_location {certificate_location!r}"
            if key_location is not None:
                files += f" / ssl_key_location {key_location!r}"
            reason = str(exc).lower()
            key_file = key_location or certificate_location
            hint = ""
            if ("bad decrypt" in reason or "pem lib" in reason) and _holds(key_file, b"ENCRYPTED"):
                hint = " (wrong or missing ssl_key_password?)"
            if not _holds(certificate_location, b"-----BEGIN CERTIFICATE-----"):
                hint = " (ssl_certificate_location holds no PEM certificate: swapped with ssl_key_location?)"
            elif key_location is None and not _holds_private_key(certificate_location):
                hint = " (the file holds no private key: set ssl_key_location)"
            elif not _holds_private_key(key_file):
                hint = " (ssl_key_location holds no PEM private key)"
            raise ConfigError(f"{files}: cannot load the client certificate and key ({_reason(exc)}){hint}") from exc
    return context


def _holds(path: str, marker: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return marker in f.read()
    except OSError:
        return True  # not ours to explain


def _holds_private_key(path: str) -> bool:
    return _holds(path, b"PRIVATE KEY-----")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


#: Alerts a broker sends about the client's certificate (a server checks no other): without the
#: hint, "CERTIFICATE_EXPIRED" read as the broker's own certificate having expired.
_CLIENT_CERTIFICATE_ALERTS = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_REVOKED",
    "CERTIFICATE_UNKNOWN",
    "UNSUPPORTED_CERTIFICATE",
)


def tls_failure(exc: ssl.SSLError, host: str, port: int) -> SslAuthenticationError:
    """A typed, non-retriable error naming the broker and what failed in the handshake."""
    broker = f"{host}:{port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or _reason(exc)
        return SslAuthenticationError(
            f"TLS certificate verification failed for broker {broker}: {detail}", broker=broker
        )
    reason = _reason(exc)
    hint = ""
    if "WRONG_VERSION_NUMBER" in reason.upper() or "record layer failure" in reason:
        hint = " (is this a TLS listener? security_protocol=SSL/SASL_SSL needs one)"
    elif any(alert in reason.upper() for alert in _CLIENT_CERTIFICATE_ALERTS):
        hint = " (the broker refused this client's certificate: check ssl_certificate_location)"
    return SslAuthenticationError(f"TLS handshake with broker {broker} failed: {reason}{hint}", broker=broker)


def connection_error(exc: OSError, host: str, port: int, what: str) -> SslAuthenticationError | KafkaConnectionError:
    """The error for an I/O failure: TLS alerts are authentication errors, the rest connection errors."""
    # An EOF or reset mid-handshake is the network, not the certificates: retriable.
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return tls_failure(exc, host, port)
    return KafkaConnectionError(f"{what} {host}:{port} failed: {exc}")

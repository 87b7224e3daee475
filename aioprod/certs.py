"""A throwaway certificate authority, for the embedded broker's TLS and for tests.

Needs the ``cryptography`` package (``pip install 'aioprod[embedded]'``). Keys are EC P-256:
fast to make, accepted by every TLS stack Kafka clients use.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "IssuedCertificate"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate and its private key, PEM-encoded (the key encrypted when a password was given)."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Write ``stem.pem`` and ``stem.key`` (mode 0600) into ``directory``."""
        cert, key = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return cert, key


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, common_name: str = "aioprod test CA", *, valid_days: int = 30) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = _name(common_name)
        now = datetime.datetime.now(datetime.UTC)
        self._valid_days = valid_days
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            # Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): a CA needs its
            # key identifier, and a certificate it issues the authority key identifier.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        hostnames: tuple[str, ...] = (),
        client: bool = False,
        key_password: str | None = None,
        expired: bool = False,
    ) -> IssuedCertificate:
        """A leaf certificate; ``hostnames`` (DNS names or IP addresses) become its subjectAltName."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start = now - datetime.timedelta(days=3 if expired else 0, minutes=5)
        end = now - datetime.timedelta(days=1) if expired else now + datetime.timedelta(days=self._valid_days)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        if hostnames:
            names: list[x509.GeneralName] = []
            for host in hostnames:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return IssuedCertificate(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key, key_password))

    def write(self, directory: Path, stem: str = "ca") -> Path:
        path = directory / f"{stem}.pem"
        path.write_bytes(self.cert_pem)
        return path

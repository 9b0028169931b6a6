"""A throwaway PKI for tests: one CA, server and client certificates as PEM files.

Real TLS is the point: the fake API server authenticates client certificates
(user = CN, groups = O) and presents a front-proxy client certificate, exactly
as kube-apiserver does, so tests must hold real keys.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class CertPaths:
    """PEM files of one issued certificate and its key, plus the issuing CA."""

    cert: Path
    key: Path
    ca: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 keeps key generation in the milliseconds; RSA would slow every test.
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class CertificateAuthority:
    """A self-signed CA that writes what it issues into ``directory``."""

    def __init__(self, directory: Path | str, name: str = "fake-ca") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = _new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            _base(subject, subject, self._key.public_key(), ca=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = self.directory / f"{_safe(name)}.crt"
        self.cert_path.write_bytes(self.pem().encode())
        _write_key(self.directory / f"{_safe(name)}.key", self._key)

    def pem(self) -> str:
        """The CA certificate as PEM text (what a ConfigMap or caBundle holds)."""
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def issue_server(
        self, name: str = "server", hosts: Sequence[str] = ("127.0.0.1", "localhost")
    ) -> CertPaths:
        """A serving certificate; each host becomes an IP or DNS SAN."""
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        return self._issue(
            file_stem=f"server-{_safe(name)}",
            subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]),
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
            sans=sans,
        )

    def issue_client(self, common_name: str, groups: Sequence[str] = ()) -> CertPaths:
        """A client certificate as Kubernetes reads it: user = CN, groups = O."""
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        return self._issue(
            file_stem=f"client-{_safe(common_name)}",
            subject=x509.Name(attributes),
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
            sans=[],
        )

    def _issue(
        self,
        file_stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName],
    ) -> CertPaths:
        key = _new_key()
        builder = (
            _base(subject, self.certificate.subject, key.public_key(), ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path = self.directory / f"{file_stem}.crt"
        key_path = self.directory / f"{file_stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return CertPaths(cert=cert_path, key=key_path, ca=self.cert_path)


def _base(
    subject: x509.Name, issuer: x509.Name, public_key: Any, *, ca: bool
) -> x509.CertificateBuilder:
    """What every certificate here shares; `ca` decides whether it may sign others."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )

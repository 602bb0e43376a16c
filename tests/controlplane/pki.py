"""Certificates for the test control plane: one CA, the apiserver's serving certificate, client
certificates, and the service-account signing key."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAYS = 7


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, org: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(parts)


class Authority:
    """A CA that writes what it issues as PEM files into one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = _key()
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("image-preflight-test-ca"))
            .issuer_name(_name("image-preflight-test-ca"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = folder / "ca.crt"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, cn: str, *, org: str | None = None, server_names: tuple[str, ...] = ()
              ) -> tuple[Path, Path]:
        """Write stem.crt and stem.key; a server certificate when `server_names` is given."""
        key = _key()
        now = dt.datetime.now(dt.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names:
            sans: list[x509.GeneralName] = []
            for name in server_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(name)))
                except ValueError:
                    sans.append(x509.DNSName(name))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            usage = ExtendedKeyUsageOID.SERVER_AUTH
        else:
            usage = ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        crt, pem = self.folder / f"{stem}.crt", self.folder / f"{stem}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.write_bytes(_pem_key(key))
        return crt, pem


def service_account_keys(folder: Path) -> tuple[Path, Path]:
    """The key pair the apiserver signs service-account tokens with: (public, private)."""
    key = _key()
    private, public = folder / "sa.key", folder / "sa.pub"
    private.write_bytes(_pem_key(key))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return public, private

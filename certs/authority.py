"""Create a CA, issue the webhook's serving certificate, and judge existing ones.

Pure functions over keys and certificates; the caller passes `now`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Union

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from image_preflight.certs.request import KeyKind

PrivateKey = Union[ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey]

RSA_BITS = 2048
CA_COMMON_NAME = "image-preflight webhook CA"
# Backdate notBefore so an apiserver whose clock runs a little behind still accepts a fresh cert.
CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Authority:
    cert: x509.Certificate
    key: PrivateKey


def new_private_key(kind: KeyKind) -> PrivateKey:
    if kind == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    raise ValueError(f"unknown key kind {kind!r}")


def key_kind(key: PrivateKey) -> KeyKind | None:
    """The kind this module would generate, or None for any other key (other curve or size)."""
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return "ecdsa"
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size == RSA_BITS:
        return "rsa"
    return None


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    """Every name a client in the cluster may use for the Service; the apiserver uses `.svc`."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def create_authority(key: PrivateKey, now: dt.datetime, days: int) -> Authority:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    public_key = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert=cert, key=key)


def issue_serving_cert(
    ca: Authority, key: PrivateKey, service: str, namespace: str, now: dt.datetime, days: int
) -> x509.Certificate:
    """A serving certificate for the Service, never outliving the CA that signs it."""
    names = service_dns_names(service, namespace)
    not_after = min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace}.svc")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            # RSA key exchange encrypts to the server key; ECDSA keys only sign.
            _key_usage(digital_signature=True, key_encipherment=isinstance(key, rsa.RSAPrivateKey)),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )


def key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    return cert.public_key() == key.public_key()


def expires_within(cert: x509.Certificate, now: dt.datetime, days: int) -> bool:
    return cert.not_valid_after_utc - now <= dt.timedelta(days=days)


def authority_problem(ca: Authority, now: dt.datetime, renew_before_days: int) -> str | None:
    """Why an existing CA must be replaced, or None when it can be kept."""
    if not key_matches(ca.cert, ca.key):
        return "ca.key does not match ca.crt"
    if not _is_ca(ca.cert):
        return "ca.crt is not a CA certificate"
    if now < ca.cert.not_valid_before_utc:
        return "CA is not valid yet"
    if expires_within(ca.cert, now, renew_before_days):
        return f"CA expires within {renew_before_days} days"
    return None


def serving_cert_problem(
    cert: x509.Certificate,
    key: PrivateKey,
    ca: Authority,
    service: str,
    namespace: str,
    wanted_kind: KeyKind,
    now: dt.datetime,
    renew_before_days: int,
) -> str | None:
    """Why an existing serving certificate must be reissued, or None when it can be kept."""
    if not key_matches(cert, key):
        return "tls.key does not match tls.crt"
    if key_kind(key) != wanted_kind:
        return f"key is not {wanted_kind}"
    if set(dns_names(cert)) != set(service_dns_names(service, namespace)):
        return f"names differ from {service}.{namespace}.svc"
    if not signed_by(cert, ca.cert):
        return "not signed by the current CA"
    if now < cert.not_valid_before_utc:
        return "not valid yet"
    if expires_within(cert, now, renew_before_days):
        return f"expires within {renew_before_days} days"
    return None


def dns_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName)


def signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _key_usage(
    *, digital_signature: bool = False, key_encipherment: bool = False, cert_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )

"""The certificate files in one directory: read them, keep what is still good, replace the rest."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from image_preflight.certs.authority import (
    Authority,
    PrivateKey,
    authority_problem,
    create_authority,
    issue_serving_cert,
    new_private_key,
    serving_cert_problem,
)
from image_preflight.certs.request import CertRequest
from image_preflight.errors import InputError
from image_preflight.files.atomic import write_all_atomic

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
KEY_MODE = 0o600
CERT_MODE = 0o644


@dataclass(frozen=True, slots=True)
class CertFiles:
    ca: Authority
    serving_cert: x509.Certificate
    serving_key: PrivateKey
    ca_created: bool
    serving_issued: bool
    report: tuple[str, ...]  # one line per decision, for the user
    # What must be written for `out_dir` to hold the above: (path, PEM, mode), keys first.
    writes: tuple[tuple[Path, bytes, int], ...] = ()


def ensure_certificates(out_dir: Path, request: CertRequest, now: dt.datetime) -> CertFiles:
    """Make `out_dir` hold a usable CA and serving certificate, changing only what must change."""
    files = plan_certificates(out_dir, request, now)
    write_certificates(out_dir, files)
    return files


def plan_certificates(out_dir: Path, request: CertRequest, now: dt.datetime) -> CertFiles:
    """What `out_dir` must hold: the certificates kept and those created, written nowhere yet
    (write_certificates writes them)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: not a directory")
    ca_path, tls_path = out_dir / CA_CERT, out_dir / TLS_CERT
    writes: list[tuple[Path, bytes, int]] = []

    ca, ca_reason = _existing_authority(out_dir, now, request.renew_before_days)
    if ca is None:
        ca = _lifetime(out_dir, request.ca_days, "--ca-days",
                       lambda: create_authority(new_private_key(request.key_kind), now, request.ca_days))
        # Key first: a crash in between leaves a mismatched pair, which the next run replaces.
        writes += [(out_dir / CA_KEY, private_key_pem(ca.key), KEY_MODE),
                   (ca_path, certificate_pem(ca.cert), CERT_MODE)]
        ca_line = f"created CA {ca_path} valid until {_when(ca.cert)} ({ca_reason})"
    else:
        ca_line = f"kept CA {ca_path} valid until {_when(ca.cert)}"

    host = f"{request.service}.{request.namespace}.svc"
    cert, key, reason = _existing_serving(out_dir, ca, request, now)
    if reason is not None or cert is None or key is None:  # the pair on disk is kept only whole
        key = new_private_key(request.key_kind)
        cert = _lifetime(out_dir, request.days, "--days",
                         lambda: issue_serving_cert(ca, key, request.service, request.namespace, now, request.days))
        writes += [(out_dir / TLS_KEY, private_key_pem(key), KEY_MODE),
                   (tls_path, certificate_pem(cert), CERT_MODE)]
        tls_line = f"issued serving certificate {tls_path} for {host} valid until {_when(cert)} ({reason})"
    else:
        tls_line = f"kept serving certificate {tls_path} for {host} valid until {_when(cert)}"

    return CertFiles(
        ca=ca,
        serving_cert=cert,
        serving_key=key,
        ca_created=ca_reason is not None,
        serving_issued=reason is not None,
        report=(ca_line, tls_line),
        writes=tuple(writes),
    )


def write_certificates(out_dir: Path, files: CertFiles, *more: tuple[Path, bytes, int | None]) -> None:
    """Write what plan_certificates decided, and `more` files, all or none (files/atomic.py)."""
    if files.writes:
        _ensure_dir(out_dir)
    write_all_atomic([*files.writes, *more])


def _lifetime(out_dir: Path, days: int, option: str, make):
    """`make()`, a certificate ending `days` from now; InputError when that is past the last date
    a certificate (and datetime) can hold, 9999-12-31 (RFC 5280 4.1.2.5)."""
    try:
        return make()
    except OverflowError:
        raise InputError(f"{out_dir}: {option} {days}: the certificate would end after 9999-12-31") from None


def _existing_authority(
    out_dir: Path, now: dt.datetime, renew_before_days: int
) -> tuple[Authority | None, str | None]:
    """The CA on disk when it can be kept, else None and why it cannot."""
    cert = load_certificate(out_dir / CA_CERT)
    key = load_private_key(out_dir / CA_KEY)
    if cert is None and key is None:
        return None, f"no CA in {out_dir}"
    if cert is None:
        return None, f"{CA_CERT} is missing"
    if key is None:
        return None, f"{CA_KEY} is missing"
    ca = Authority(cert=cert, key=key)
    problem = authority_problem(ca, now, renew_before_days)
    return (None, problem) if problem else (ca, None)


def _existing_serving(
    out_dir: Path, ca: Authority, request: CertRequest, now: dt.datetime
) -> tuple[x509.Certificate | None, PrivateKey | None, str | None]:
    """The serving pair on disk and why it must be reissued (None when it can be kept)."""
    cert = load_certificate(out_dir / TLS_CERT)
    key = load_private_key(out_dir / TLS_KEY)
    if cert is None:
        return None, None, f"{TLS_CERT} is missing"
    if key is None:
        return None, None, f"{TLS_KEY} is missing"
    problem = serving_cert_problem(
        cert, key, ca, request.service, request.namespace, request.key_kind, now, request.renew_before_days
    )
    return cert, key, problem


def load_certificate(path: Path) -> x509.Certificate | None:
    """The first PEM certificate in `path`, None when the file does not exist."""
    data = _read(path)
    if data is None:
        return None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise InputError(f"{path}: not a PEM certificate; fix or remove it") from None


def load_private_key(path: Path) -> PrivateKey | None:
    """An unencrypted PEM ECDSA or RSA key from `path`, None when the file does not exist."""
    data = _read(path)
    if data is None:
        return None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise InputError(f"{path}: encrypted private keys are not supported") from None
    except (ValueError, UnsupportedAlgorithm):
        raise InputError(f"{path}: not a PEM private key; fix or remove it") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise InputError(f"{path}: only ECDSA and RSA keys are supported")
    return key


def certificate_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def private_key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _ensure_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{out_dir}: not a directory") from None
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot create directory: {exc.strerror or exc}") from None


def _when(cert: x509.Certificate) -> str:
    return cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")

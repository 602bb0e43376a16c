"""`image-preflight certs`' flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from image_preflight.certs.request import (
    CA_DAYS,
    DAYS,
    KEY_KIND,
    KEY_KINDS,
    MAX_DAYS,
    RENEW_BEFORE_DAYS,
    CertRequest,
    KeyKind,
)
from image_preflight.commands import add_command
from image_preflight.errors import UsageError
from image_preflight.flags import DIR, FILE, NAME, Flags, Kind, between, flag

_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _days(low: int) -> Kind:
    return Kind("DAYS", int, between(low, MAX_DAYS, " (100 years)"))


DAYS_KIND = _days(1)


def register(subparsers, epilog: str | None = None) -> None:
    add_command(
        subparsers, "certs", CertsConfig, "image_preflight.certs.command",
        epilog=epilog,
        help="create or renew the webhook's CA and serving certificate",
        description="Create a CA and a serving certificate for SERVICE.NAMESPACE.svc in DIR, "
        "reusing what is still valid. Reports go to stderr; --secret YAML to stdout.",
    )


@dataclass(frozen=True)
class CertsConfig(Flags):
    service: str = flag(kind=NAME, required=True, help="the webhook's Service name")
    namespace: str = flag(kind=Kind("NAMESPACE"), required=True, help="the Service's namespace")
    out_dir: Path = flag(kind=DIR, required=True, help="the folder for ca.crt, ca.key, tls.crt and tls.key")
    days: int = flag(DAYS, kind=DAYS_KIND, help="the serving certificate's lifetime")
    ca_days: int = flag(CA_DAYS, kind=DAYS_KIND, help="the CA's lifetime")
    renew_before: int = flag(RENEW_BEFORE_DAYS, kind=_days(0),
                             help="replace certificates expiring within DAYS (less than --days and --ca-days)")
    key: KeyKind = flag(KEY_KIND, choices=KEY_KINDS, help="ecdsa (P-256) or rsa (2048)")
    secret: bool = flag(False, help="print a kubernetes.io/tls Secret to stdout")
    secret_name: str | None = flag(None, kind=NAME, help="that Secret's name", unset="SERVICE-tls")
    patch_webhook: Path | None = flag(None, kind=FILE, unset="none",
                                      help="set caBundle on every webhook configuration in this YAML file, in place")

    def check(self) -> None:
        if not _DNS1035_LABEL.fullmatch(self.service):
            raise UsageError(f"--service: {self.service!r} is not a valid Service name (RFC 1035 label)")
        if not _DNS1123_LABEL.fullmatch(self.namespace):
            raise UsageError(f"--namespace: {self.namespace!r} is not a valid namespace (RFC 1123 label)")
        # Otherwise every run would find its fresh certificate already due for renewal.
        for flag_name, value in (("--days", self.days), ("--ca-days", self.ca_days)):
            if self.renew_before >= value:
                raise UsageError(f"--renew-before {self.renew_before}: must be less than {flag_name} {value}")
        if not _DNS1123_SUBDOMAIN.fullmatch(self.secret_named) or len(self.secret_named) > 253:
            raise UsageError(f"--secret-name: {self.secret_named!r} is not a valid Secret name")

    @property
    def request(self) -> CertRequest:
        """The service, the lifetimes and the key, as the store takes them."""
        return CertRequest(service=self.service, namespace=self.namespace, days=self.days, ca_days=self.ca_days,
                           renew_before_days=self.renew_before, key_kind=self.key)

    @property
    def secret_named(self) -> str:
        return self.secret_name or f"{self.service}-tls"

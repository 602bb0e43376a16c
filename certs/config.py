"""`image-preflight certs`' flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from image_preflight.errors import UsageError

KEY_KINDS = ("ecdsa", "rsa")  # certs.authority's, named here so that --help need not load cryptography
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="create or renew the webhook's CA and serving certificate",
        description="Create a CA and a serving certificate for SERVICE.NAMESPACE.svc in DIR, "
        "reusing what is still valid. Reports go to stderr; --secret YAML to stdout.",
    )
    parser.add_argument("--service", required=True, help="the webhook's Service name")
    parser.add_argument("--namespace", required=True, help="the Service's namespace")
    parser.add_argument("--out-dir", required=True, type=Path, help="directory for ca.crt, ca.key, tls.crt, tls.key")
    parser.add_argument("--days", type=int, default=365, help="serving certificate lifetime (default 365)")
    parser.add_argument("--ca-days", type=int, default=3650, help="CA lifetime (default 3650)")
    parser.add_argument(
        "--renew-before", type=int, default=30, metavar="DAYS",
        help="replace certificates expiring within DAYS (default 30)",
    )
    parser.add_argument("--key", choices=KEY_KINDS, default="ecdsa", help="ecdsa (P-256, default) or rsa (2048)")
    parser.add_argument("--secret", action="store_true", help="print a kubernetes.io/tls Secret to stdout")
    parser.add_argument("--secret-name", help="name of that Secret (default SERVICE-tls)")
    parser.add_argument(
        "--patch-webhook", type=Path, metavar="FILE",
        help="set caBundle on every webhook configuration in this YAML file, in place",
    )
    parser.set_defaults(run=_run)


@dataclass(frozen=True)
class CertsConfig:
    service: str
    namespace: str
    out_dir: Path
    days: int = 365
    ca_days: int = 3650
    renew_before: int = 30
    key: str = "ecdsa"
    secret: bool = False
    secret_name: str | None = None  # None: SERVICE-tls
    patch_webhook: Path | None = None

    def __post_init__(self) -> None:
        if not _DNS1035_LABEL.fullmatch(self.service):
            raise UsageError(f"--service: {self.service!r} is not a valid Service name (RFC 1035 label)")
        if not _DNS1123_LABEL.fullmatch(self.namespace):
            raise UsageError(f"--namespace: {self.namespace!r} is not a valid namespace (RFC 1123 label)")
        for flag, value in (("--days", self.days), ("--ca-days", self.ca_days)):
            if value < 1:
                raise UsageError(f"{flag}: must be at least 1, got {value}")
        if self.renew_before < 0:
            raise UsageError(f"--renew-before: must not be negative, got {self.renew_before}")
        # Otherwise every run would find its fresh certificate already due for renewal.
        for flag, value in (("--days", self.days), ("--ca-days", self.ca_days)):
            if self.renew_before >= value:
                raise UsageError(f"--renew-before: {self.renew_before} must be less than {flag} {value}")
        if self.key not in KEY_KINDS:
            raise UsageError(f"--key: {self.key!r} is not one of {', '.join(KEY_KINDS)}")
        if self.secret_name is None:
            object.__setattr__(self, "secret_name", f"{self.service}-tls")
        if not _DNS1123_SUBDOMAIN.fullmatch(self.secret_name) or len(self.secret_name) > 253:
            raise UsageError(f"--secret-name: {self.secret_name!r} is not a valid Secret name")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CertsConfig:
        return cls(
            service=args.service, namespace=args.namespace, out_dir=args.out_dir, days=args.days,
            ca_days=args.ca_days, renew_before=args.renew_before, key=args.key, secret=args.secret,
            secret_name=args.secret_name, patch_webhook=args.patch_webhook,
        )


def _run(args: argparse.Namespace) -> int:
    config = CertsConfig.from_args(args)
    from image_preflight.certs.command import run

    return run(config)

"""`image-preflight certs`' flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from image_preflight.certs.request import CA_DAYS, DAYS, KEY_KIND, KEY_KINDS, RENEW_BEFORE_DAYS, CertRequest
from image_preflight.commands import runner
from image_preflight.errors import UsageError

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
    parser.add_argument("--days", type=int, default=DAYS, help=f"serving certificate lifetime (default {DAYS})")
    parser.add_argument("--ca-days", type=int, default=CA_DAYS, help=f"CA lifetime (default {CA_DAYS})")
    parser.add_argument(
        "--renew-before", type=int, default=RENEW_BEFORE_DAYS, metavar="DAYS",
        help=f"replace certificates expiring within DAYS (default {RENEW_BEFORE_DAYS})",
    )
    parser.add_argument("--key", choices=KEY_KINDS, default=KEY_KIND,
                        help=f"ecdsa (P-256) or rsa (2048); default {KEY_KIND}")
    parser.add_argument("--secret", action="store_true", help="print a kubernetes.io/tls Secret to stdout")
    parser.add_argument("--secret-name", help="name of that Secret (default SERVICE-tls)")
    parser.add_argument(
        "--patch-webhook", type=Path, metavar="FILE",
        help="set caBundle on every webhook configuration in this YAML file, in place",
    )
    parser.set_defaults(run=runner(CertsConfig, "image_preflight.certs.command"))


@dataclass(frozen=True)
class CertsConfig:
    request: CertRequest  # the service, the lifetimes and the key, as the store takes them
    out_dir: Path
    secret: bool = False
    secret_name: str | None = None  # None: SERVICE-tls
    patch_webhook: Path | None = None

    def __post_init__(self) -> None:
        request = self.request
        if not _DNS1035_LABEL.fullmatch(request.service):
            raise UsageError(f"--service: {request.service!r} is not a valid Service name (RFC 1035 label)")
        if not _DNS1123_LABEL.fullmatch(request.namespace):
            raise UsageError(f"--namespace: {request.namespace!r} is not a valid namespace (RFC 1123 label)")
        lifetimes = (("--days", request.days), ("--ca-days", request.ca_days))
        for flag, value in lifetimes:
            if value < 1:
                raise UsageError(f"{flag}: must be at least 1, got {value}")
        renew_before = request.renew_before_days
        if renew_before < 0:
            raise UsageError(f"--renew-before: must not be negative, got {renew_before}")
        # Otherwise every run would find its fresh certificate already due for renewal.
        for flag, value in lifetimes:
            if renew_before >= value:
                raise UsageError(f"--renew-before: {renew_before} must be less than {flag} {value}")
        if request.key_kind not in KEY_KINDS:
            raise UsageError(f"--key: {request.key_kind!r} is not one of {', '.join(KEY_KINDS)}")
        if self.secret_name is None:
            object.__setattr__(self, "secret_name", f"{request.service}-tls")
        if not _DNS1123_SUBDOMAIN.fullmatch(self.secret_name) or len(self.secret_name) > 253:
            raise UsageError(f"--secret-name: {self.secret_name!r} is not a valid Secret name")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CertsConfig:
        request = CertRequest(service=args.service, namespace=args.namespace, days=args.days, ca_days=args.ca_days,
                              renew_before_days=args.renew_before, key_kind=args.key)
        return cls(request=request, out_dir=args.out_dir, secret=args.secret, secret_name=args.secret_name,
                   patch_webhook=args.patch_webhook)

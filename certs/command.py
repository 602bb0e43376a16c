"""`image-preflight certs`: keep the webhook's CA and serving certificate in a directory."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path

from image_preflight.certs.authority import KEY_KINDS
from image_preflight.certs.manifests import patch_webhook_file, tls_secret, to_yaml
from image_preflight.certs.store import CertRequest, certificate_pem, ensure_certificates, private_key_pem
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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    request = certificate_request(args)
    secret_name = args.secret_name if args.secret_name is not None else f"{args.service}-tls"
    if not _DNS1123_SUBDOMAIN.fullmatch(secret_name) or len(secret_name) > 253:
        raise UsageError(f"--secret-name: {secret_name!r} is not a valid Secret name")
    if args.patch_webhook is not None and not args.patch_webhook.is_file():
        raise UsageError(f"{args.patch_webhook}: no such file")

    files = ensure_certificates(args.out_dir, request, dt.datetime.now(dt.timezone.utc))
    for line in files.report:
        print(line, file=sys.stderr)
    ca_pem = certificate_pem(files.ca.cert)

    if args.patch_webhook is not None:
        result = patch_webhook_file(args.patch_webhook, ca_pem, args.service, args.namespace)
        print(
            f"set caBundle on {result.webhooks} webhooks in {result.configurations} "
            f"configurations in {args.patch_webhook}",
            file=sys.stderr,
        )
        for other in result.other_services:
            print(
                f"warning: {args.patch_webhook}: webhook {other}, "
                f"but the certificate is for {args.service}.{args.namespace}",
                file=sys.stderr,
            )

    if args.secret:
        secret = tls_secret(
            secret_name,
            args.namespace,
            certificate_pem(files.serving_cert),
            private_key_pem(files.serving_key),
            ca_pem,
        )
        sys.stdout.write(to_yaml(secret))
    return 0


def certificate_request(args: argparse.Namespace) -> CertRequest:
    if not _DNS1035_LABEL.fullmatch(args.service):
        raise UsageError(f"--service: {args.service!r} is not a valid Service name (RFC 1035 label)")
    if not _DNS1123_LABEL.fullmatch(args.namespace):
        raise UsageError(f"--namespace: {args.namespace!r} is not a valid namespace (RFC 1123 label)")
    for flag, value in (("--days", args.days), ("--ca-days", args.ca_days)):
        if value < 1:
            raise UsageError(f"{flag}: must be at least 1, got {value}")
    if args.renew_before < 0:
        raise UsageError(f"--renew-before: must not be negative, got {args.renew_before}")
    # Otherwise every run would find its fresh certificate already due for renewal.
    for flag, value in (("--days", args.days), ("--ca-days", args.ca_days)):
        if args.renew_before >= value:
            raise UsageError(f"--renew-before: {args.renew_before} must be less than {flag} {value}")
    return CertRequest(
        service=args.service,
        namespace=args.namespace,
        days=args.days,
        ca_days=args.ca_days,
        renew_before_days=args.renew_before,
        key_kind=args.key,
    )

"""`image-preflight certs`: keep the webhook's CA and serving certificate in a directory.

The runner: certs/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import datetime as dt
import sys

from image_preflight.certs.config import CertsConfig
from image_preflight.certs.manifests import patch_webhook_file, tls_secret, to_yaml
from image_preflight.certs.store import certificate_pem, ensure_certificates, private_key_pem
from image_preflight.errors import InputError


def run(config: CertsConfig) -> int:
    request = config.request
    if config.patch_webhook is not None and not config.patch_webhook.is_file():
        raise InputError(f"{config.patch_webhook}: no such file")

    files = ensure_certificates(config.out_dir, request, dt.datetime.now(dt.timezone.utc))
    for line in files.report:
        print(line, file=sys.stderr)
    ca_pem = certificate_pem(files.ca.cert)

    if config.patch_webhook is not None:
        result = patch_webhook_file(config.patch_webhook, ca_pem, request.service, request.namespace)
        print(
            f"set caBundle on {result.webhooks} webhooks in {result.configurations} "
            f"configurations in {config.patch_webhook}",
            file=sys.stderr,
        )
        for other in result.other_services:
            print(
                f"warning: {config.patch_webhook}: webhook {other}, "
                f"but the certificate is for {request.service}.{request.namespace}",
                file=sys.stderr,
            )

    if config.secret:
        secret = tls_secret(
            config.secret_named,
            request.namespace,
            certificate_pem(files.serving_cert),
            private_key_pem(files.serving_key),
            ca_pem,
        )
        sys.stdout.write(to_yaml(secret))
    return 0


"""`image-preflight certs`: keep the webhook's CA and serving certificate in a directory.

The runner: certs/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import datetime as dt
import sys

from image_preflight.certs.config import CertsConfig
from image_preflight.certs.manifests import tls_secret, to_yaml, webhook_patch
from image_preflight.certs.store import certificate_pem, plan_certificates, private_key_pem, write_certificates
from image_preflight.errors import InputError


def run(config: CertsConfig) -> int:
    request = config.request
    if config.patch_webhook is not None and not config.patch_webhook.is_file():
        raise InputError(f"{config.patch_webhook}: no such file")

    # Everything is decided before anything is written, then written all or none: a lifetime
    # that cannot be, or a webhook file that cannot be patched, leaves the folder as it was.
    files = plan_certificates(config.out_dir, request, dt.datetime.now(dt.timezone.utc))
    ca_pem = certificate_pem(files.ca.cert)
    patched, result = (webhook_patch(config.patch_webhook, ca_pem, request.service, request.namespace)
                       if config.patch_webhook is not None else (None, None))
    write_certificates(config.out_dir, files, *([patched] if patched is not None else []))
    for line in files.report:
        print(line, file=sys.stderr)

    if result is not None:
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

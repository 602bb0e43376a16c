"""A server TLS context that picks up a rotated certificate without a restart.

cert-manager rewrites tls.crt/tls.key in place. A poller rebuilds the context when the files
change, and the SNI callback hands each new handshake the newest context; connections already
open keep theirs, so no request is dropped.
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path

from image_preflight.files.poll import Poller, file_stamp

log = logging.getLogger(__name__)


TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
DEFAULT_TLS_VERSION = "1.3"  # the apiserver's Go client speaks 1.3; 1.2 for callers that cannot
# With 1.2 allowed: forward-secret AEAD suites only (Go's defaults for TLS 1.2 servers, less RSA kx).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(cert: Path, key: Path, *, min_version: str = DEFAULT_TLS_VERSION,
                   client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[min_version]
    context.set_ciphers(TLS12_CIPHERS)
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        # Optional at the handshake, since the kubelet's probes present none; the admission paths
        # then require one (webhook/app.py).
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cafile=client_ca)
    return context


def caller_names(peercert: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A verified client certificate's subject common names, and its DNS names in lower case, from
    the form ssl decodes it to (SSLSocket.getpeercert())."""
    common = tuple(value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName")
    dns = tuple(value.lower() for key, value in peercert.get("subjectAltName", ()) if key == "DNS")
    return common, dns


class CallerNames:
    """--client-name: the names of which a caller's certificate must hold one, as its subject's
    common name (compared exactly, as the apiserver reads a client certificate's user name,
    staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go, CommonNameUserConversion)
    or as a DNS subject alternative name (compared without case, as DNS names are: RFC 4343;
    no wildcards). Empty: any name."""

    def __init__(self, names=()) -> None:
        self.names = frozenset(names)
        self._dns = frozenset(name.lower() for name in self.names)

    def __bool__(self) -> bool:
        return bool(self.names)

    def admit(self, found: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
        common, dns = found
        return not self.names or not self.names.isdisjoint(common) or not self._dns.isdisjoint(dns)


class ReloadingContext:
    def __init__(self, cert: Path, key: Path, *, interval: float = 10.0, min_version: str = DEFAULT_TLS_VERSION,
                 client_ca: Path | None = None) -> None:
        self.cert, self.key, self.interval = cert, key, interval
        self.min_version, self.client_ca = min_version, client_ca
        self._stamp = file_stamp(cert, key)
        self.current = self._context()
        # The context the server listens with; it only routes handshakes to `current` (OpenSSL
        # keeps the listening context's verify mode, so both are built alike).
        self.listening = self._context()
        self.listening.sni_callback = self._choose
        self._poller = Poller(self.reload_if_changed, interval=interval, name="tls-reload")

    def _choose(self, ssl_object, _server_name, _context) -> None:
        ssl_object.context = self.current

    def reload_if_changed(self) -> bool:
        stamp = file_stamp(self.cert, self.key)
        if stamp == self._stamp:
            return False
        try:
            context = self._context()
        except (OSError, ssl.SSLError) as exc:
            # Mid-rotation the pair may not match yet; the next poll tries again.
            log.warning("keeping the current certificate: %s", exc)
            return False
        self.current, self._stamp = context, stamp
        log.info("loaded a new serving certificate from %s", self.cert)
        return True

    def _context(self) -> ssl.SSLContext:
        return server_context(self.cert, self.key, min_version=self.min_version, client_ca=self.client_ca)

    def start(self) -> threading.Thread:
        return self._poller.start()

    def stop(self) -> None:
        self._poller.stop()

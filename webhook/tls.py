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


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert, key)
    return context


class ReloadingContext:
    def __init__(self, cert: Path, key: Path, *, interval: float = 10.0) -> None:
        self.cert, self.key, self.interval = cert, key, interval
        self._stamp = file_stamp(cert, key)
        self.current = server_context(cert, key)
        # The context the server listens with; it only routes handshakes to `current`.
        self.listening = server_context(cert, key)
        self.listening.sni_callback = self._choose
        self._poller = Poller(self.reload_if_changed, interval=interval, name="tls-reload")

    def _choose(self, ssl_object, _server_name, _context) -> None:
        ssl_object.context = self.current

    def reload_if_changed(self) -> bool:
        stamp = file_stamp(self.cert, self.key)
        if stamp == self._stamp:
            return False
        try:
            context = server_context(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            # Mid-rotation the pair may not match yet; the next poll tries again.
            log.warning("keeping the current certificate: %s", exc)
            return False
        self.current, self._stamp = context, stamp
        log.info("loaded a new serving certificate from %s", self.cert)
        return True

    def start(self) -> threading.Thread:
        return self._poller.start()

    def stop(self) -> None:
        self._poller.stop()

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
        self._stamp = self._files_stamp()
        self.current = server_context(cert, key)
        # The context the server listens with; it only routes handshakes to `current`.
        self.listening = server_context(cert, key)
        self.listening.sni_callback = self._choose
        self._stop = threading.Event()

    def _choose(self, ssl_object, _server_name, _context) -> None:
        ssl_object.context = self.current

    def _files_stamp(self) -> tuple:
        stamps = []
        for path in (self.cert, self.key):
            try:
                stat = path.stat()
                stamps.append((stat.st_mtime_ns, stat.st_size, stat.st_ino))
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def reload_if_changed(self) -> bool:
        stamp = self._files_stamp()
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
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.reload_if_changed()

        thread = threading.Thread(target=loop, name="tls-reload", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

"""Notice when files change, by polling: cert-manager and kubelet-mounted Secrets and ConfigMaps
replace files through symlink swaps that inotify on the file itself would miss."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def file_stamp(*paths: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """What changes when any of `paths` is rewritten or replaced (None for a missing file)."""
    stamps: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            stat = path.stat()
            stamps.append((stat.st_mtime_ns, stat.st_size, stat.st_ino))
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def _one_line(exc: Exception) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - the type alone still says what failed
        text = ""
    text = text if text.isprintable() else repr(text)[1:-1]
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


class Poller:
    """Calls `poll` every `interval` seconds on a daemon thread until stopped; a poll that fails
    is logged and the next one runs as planned."""

    def __init__(self, poll: Callable[[], object], *, interval: float, name: str) -> None:
        self._poll, self.interval, self._name = poll, interval, name
        self._stop = threading.Event()

    def start(self) -> threading.Thread:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                try:
                    self._poll()
                except Exception as exc:  # noqa: BLE001 - a dead poller would keep stale state forever, unseen
                    log.warning("%s: poll failed, trying again in %gs: %s", self._name, self.interval, _one_line(exc))
                    log.debug("%s: poll failure", self._name, exc_info=True)

        thread = threading.Thread(target=loop, name=self._name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

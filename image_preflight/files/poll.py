"""Notice when files change, by polling: cert-manager and kubelet-mounted Secrets and ConfigMaps
replace files through symlink swaps that inotify on the file itself would miss."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path


def file_stamp(*paths: Path) -> tuple:
    """What changes when any of `paths` is rewritten or replaced (None for a missing file)."""
    stamps = []
    for path in paths:
        try:
            stat = path.stat()
            stamps.append((stat.st_mtime_ns, stat.st_size, stat.st_ino))
        except OSError:
            stamps.append(None)
    return tuple(stamps)


class Poller:
    """Calls `poll` every `interval` seconds on a daemon thread until stopped."""

    def __init__(self, poll: Callable[[], object], *, interval: float, name: str) -> None:
        self._poll, self.interval, self._name = poll, interval, name
        self._stop = threading.Event()

    def start(self) -> threading.Thread:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self._poll()

        thread = threading.Thread(target=loop, name=self._name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

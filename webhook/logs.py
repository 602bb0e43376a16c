"""Logging for `serve`: one JSON line per decision, at a cost a profile cannot find.

A StreamHandler writes and flushes stderr for every record: a system call per review, a fifth of
the time of an answer. Here lines go to a buffer that is flushed every FLUSH_S, and at once for
warnings and errors. Where calls came from, threads and processes are not recorded (the logging
HOWTO's "Optimization": nothing here reads them).
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable

from image_preflight.files.poll import Poller

FLUSH_S = 0.1


class BufferedStderrHandler(logging.StreamHandler):
    def __init__(self) -> None:
        raw = io.FileIO(os.dup(2), "w")
        super().__init__(io.TextIOWrapper(io.BufferedWriter(raw, 1 << 16), encoding="utf-8",
                                          errors="backslashreplace"))
        self._poller = Poller(self.flush_now, interval=FLUSH_S, name="log-flush")
        self._poller.start()

    def flush(self) -> None:
        pass  # emit() calls this for every record; the poller flushes instead

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.levelno >= logging.WARNING:
            self.flush_now()

    def write_line(self, line: str) -> None:
        """A decision line without a LogRecord: what the handler would write for "%(message)s"."""
        with self.lock:
            self.stream.write(line + "\n")

    def flush_now(self) -> None:
        with self.lock:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                pass  # stderr gone (closed pipe): nothing left to tell

    def close(self) -> None:
        self._poller.stop()
        self.flush_now()
        super().close()


def decision_writer() -> Callable[[str], None] | None:
    """Where `serve` writes decision lines directly: the handler configure() installed, when the
    decision logger is on and nothing else listens (elsewhere, as in tests, lines are records)."""
    root = logging.getLogger()
    decision = logging.getLogger("image_preflight.decision")
    if (len(root.handlers) == 1 and isinstance(root.handlers[0], BufferedStderrHandler)
            and not decision.handlers and decision.isEnabledFor(logging.INFO)):
        return root.handlers[0].write_line
    return None


def configure(level: str) -> None:
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = BufferedStderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])

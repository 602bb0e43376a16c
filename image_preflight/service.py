"""How a long-running face runs (`serve`, `agent --publish`, `watchdog`): one JSON line per log
record on stderr, /metrics on its own port, SIGTERM and SIGINT, and a shutdown that stops what was
started in the reverse order and closes the API client last.

Log lines go to a buffer flushed every FLUSH_S, and at once for warnings and errors: a
StreamHandler's write and flush per record is a system call per admission review, a fifth of the
time of an answer. Every line is one JSON object that begins with "time" (RFC 3339 in UTC, to the
millisecond: 2026-12-03T21:06:51.123Z) and "level" (debug, info, warning, error, critical). A
record whose message is already a JSON object (a decision, a watchdog action) keeps its fields
after those two; any other, the server's own (uvicorn's) among them, becomes
{"time", "level", "logger", "message"}, with "error" holding the traceback of an exception.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from image_preflight.errors import BrokenLoopError, UnavailableError
from image_preflight.files.poll import Poller

FLUSH_S = 0.1
log = logging.getLogger(__name__)


_second: tuple[int, str] = (0, "1970-01-01T00:00:00")  # the last second formatted, and its text


def rfc3339(epoch: float) -> str:
    """`epoch` as RFC 3339 in UTC to the millisecond, 2026-12-03T21:06:51.123Z (strftime once a second)."""
    global _second
    whole, millis = divmod(int(epoch * 1000), 1000)
    second = _second  # read once: another thread may replace it meanwhile
    if whole != second[0]:
        second = _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{second[1]}.{millis:03d}Z"


def _head(epoch: float, level: str) -> str:
    """A line's first two fields, the opening brace and no closing one."""
    return f'{{"time":"{rfc3339(epoch)}","level":"{level}"'


def _with_head(head: str, line: str) -> str:
    """The JSON object `line` with `head`'s fields first."""
    rest = line[1:].lstrip()
    return head + ("}" if rest.startswith("}") else "," + rest)


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        level = record.levelname.lower()
        if message.startswith("{") and message.endswith("}"):
            try:
                fields = json.loads(message)
            except ValueError:
                fields = None
            if isinstance(fields, dict):  # already one JSON object: its fields after time and level
                if "time" not in fields and "level" not in fields:
                    return _with_head(_head(record.created, level), message)
                fields = {key: value for key, value in fields.items() if key not in ("time", "level")}
                return _with_head(_head(record.created, level), json.dumps(fields, ensure_ascii=False))
        line = {"time": rfc3339(record.created), "level": level, "logger": record.name, "message": message}
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


class BufferedStderrHandler(logging.StreamHandler):
    def __init__(self) -> None:
        raw = io.FileIO(os.dup(2), "w")
        super().__init__(io.TextIOWrapper(io.BufferedWriter(raw, 1 << 16), encoding="utf-8",
                                          errors="backslashreplace"))
        self.setFormatter(JsonLines())
        self._poller = Poller(self.flush_now, interval=FLUSH_S, name="log-flush")
        self._poller.start()

    def flush(self) -> None:
        pass  # emit() calls this for every record; the poller flushes instead

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.levelno >= logging.WARNING:
            self.flush_now()

    def write_line(self, line: str) -> None:
        """A JSON object without a LogRecord, written as JsonLines writes an info record's."""
        line = _with_head(_head(time.time(), "info"), line)
        self.acquire()
        try:
            self.stream.write(line + "\n")
        finally:
            self.release()

    def flush_now(self) -> None:
        self.acquire()
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone (closed pipe): nothing left to tell
        finally:
            self.release()

    def close(self) -> None:
        self._poller.stop()
        self.flush_now()
        super().close()


def configure_logging(level: str) -> None:
    """The one handler: JSON lines on stderr, buffered. Where calls came from, threads and processes
    are not recorded (the logging HOWTO's "Optimization": nothing here reads them)."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.basicConfig(level=level.upper(), handlers=[BufferedStderrHandler()], force=True)


def line_writer(logger: str) -> Callable[[str], None] | None:
    """Where `logger`'s JSON lines (info) may be written without a LogRecord: the handler
    configure_logging installed, when that logger is on and nothing else listens (elsewhere, as
    in tests, lines are records)."""
    root = logging.getLogger()
    named = logging.getLogger(logger)
    if (len(root.handlers) == 1 and isinstance(root.handlers[0], BufferedStderrHandler)
            and not named.handlers and named.isEnabledFor(logging.INFO)):
        return root.handlers[0].write_line
    return None


class Stops:
    """What a face started, stopped in the reverse order, each even when one before it failed."""

    def __init__(self) -> None:
        self._stops: list[Callable[[], object]] = []

    def add(self, stop: Callable[[], object]) -> None:
        self._stops.append(stop)

    def close(self) -> None:
        while self._stops:
            stop = self._stops.pop()
            try:
                stop()
            except Exception:  # noqa: BLE001 - the rest must still stop
                log.exception("while stopping")


def serve_metrics(port: int, host: str, registry, stops: Stops) -> None:
    """Plain-HTTP /metrics on `port` (0: none), stopped with `stops`."""
    if not port:
        return
    from prometheus_client import start_http_server

    try:
        httpd, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UnavailableError(f"--metrics-port {port}: cannot listen ({exc.strerror or exc})") from None

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()

    stops.add(stop)


class Signals:
    """SIGTERM and SIGINT, from the moment a face begins to start until it has stopped: each sets
    `stopped` and calls every wake given to on_stop (for a loop that waits on its own condition).
    Installed before anything answers, so a signal that comes as soon as /metrics does still stops
    the face cleanly; the previous handlers are put back on exit. Only the main thread may set
    handlers: elsewhere (a face run inside a test) nothing is installed."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._wakes: list[Callable[[], object]] = []
        self._previous: dict[int, Any] = {}  # what signal.signal returned, to give back

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._stopping) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *_) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def on_stop(self, wake: Callable[[], object]) -> None:
        """Call `wake` when a signal comes (at once if one came already)."""
        self._wakes.append(wake)
        if self.stopped.is_set():
            wake()

    def _stopping(self, *_) -> None:
        self.stopped.set()
        for wake in list(self._wakes):
            wake()

    def run(self, work: Callable[[threading.Event], object], name: str) -> object:
        """Run `work(stopped)` in a thread until it returns (a loop that waits on its own condition
        gives its wake to on_stop first). The main thread only joins, so a handler never interrupts
        code holding a lock.
        BrokenLoopError when `work` ends on an exception: every face that runs a loop here fails
        alike, as the CLI says it."""
        done: list[object] = []
        failed: list[BaseException] = []

        def loop() -> None:
            try:
                done.append(work(self.stopped))
            except BaseException as exc:  # noqa: BLE001 - raised again in the main thread, as BrokenLoopError
                log.exception("the %s loop failed", name)  # the traceback, as one JSON line with the others
                failed.append(exc)

        worker = threading.Thread(target=loop, name=name, daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(1.0)
        if failed:
            said = " ".join(f"{type(failed[0]).__name__}: {failed[0]}".split())
            raise BrokenLoopError(
                f"the {name} loop ended unexpectedly ({said}; its traceback is logged)") from failed[0]
        return done[0]

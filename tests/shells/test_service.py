"""image_preflight/service.py, the one way `serve`, `agent --publish` and `watchdog` run: JSON log
lines, /metrics, signals restored, what was started stopped in the reverse order."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import threading

import pytest

from image_preflight.errors import BrokenLoopError, UnavailableError
from image_preflight.service import BufferedStderrHandler, JsonLines, Signals, Stops, rfc3339, serve_metrics


def _record(message: str, *args, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("image_preflight.agent", level, __file__, 1, message, args, None)


def test_every_record_is_one_json_line_with_time_and_level_and_a_json_message_keeps_its_fields():
    formatter = JsonLines()
    record = _record('pinned %s ("needed")', "docker.io/library/a:1")
    record.created = 1796245611.1239  # 2026-12-02T21:06:51.123Z
    assert json.loads(formatter.format(record)) == {
        "time": "2026-12-02T21:06:51.123Z", "level": "info", "logger": "image_preflight.agent",
        "message": 'pinned docker.io/library/a:1 ("needed")'}
    action = _record('{"action": "failed", "job": "j"}', level=logging.WARNING)
    action.created = 1796245611.999
    line = formatter.format(action)
    assert line.startswith('{"time":"2026-12-02T21:06:51.999Z","level":"warning",')
    assert json.loads(line) == {"time": "2026-12-02T21:06:51.999Z", "level": "warning", "action": "failed", "job": "j"}
    # A message that only looks like an object is a message; one naming its own time or level keeps
    # one of each, the record's.
    assert json.loads(formatter.format(_record("{not json}")))["message"] == "{not json}"
    assert json.loads(formatter.format(_record('{"level": "x", "a": 1}')))["level"] == "info"
    assert json.loads(formatter.format(_record("{}"))).keys() == {"time", "level"}


def test_the_time_of_a_line_is_rfc3339_utc_to_the_millisecond_every_second():
    assert [rfc3339(t) for t in (0, 1796245611.1239, 1796245611.9999, 1796245612.0)] == [
        "1970-01-01T00:00:00.000Z", "2026-12-02T21:06:51.123Z", "2026-12-02T21:06:51.999Z",
        "2026-12-02T21:06:52.000Z"]


def test_a_line_written_without_a_record_is_shaped_as_a_records(monkeypatch):
    """serve's decision lines (service.line_writer) and uvicorn's own (through logging) alike."""
    read, write = os.pipe()
    monkeypatch.setattr(os, "dup", lambda fd, dup=os.dup: write if fd == 2 else dup(fd))
    handler = BufferedStderrHandler()
    try:
        handler.write_line('{"uid":"u","decision":"allowed"}')
        handler.emit(logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process", (), None))
    finally:
        handler.close()
    lines = [json.loads(line) for line in os.read(read, 65536).decode().splitlines()]
    os.close(read)
    assert [list(line)[:2] for line in lines] == [["time", "level"], ["time", "level"]]
    assert [line["level"] for line in lines] == ["info", "info"]
    assert lines[0]["decision"] == "allowed" and lines[1]["logger"] == "uvicorn.error"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]) for line in lines)


def test_stops_run_in_the_reverse_order_and_each_even_after_one_fails(caplog):
    stops, ran = Stops(), []
    stops.add(lambda: ran.append("api client"))
    stops.add(lambda: 1 / 0)
    stops.add(lambda: ran.append("watch"))
    stops.close()
    assert ran == ["watch", "api client"]
    assert [r.getMessage() for r in caplog.records] == ["while stopping"]
    stops.close()  # nothing left to run twice
    assert ran == ["watch", "api client"]


def test_a_busy_metrics_port_is_unavailable_and_a_free_one_stops_with_the_rest():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(UnavailableError, match=rf"^--metrics-port {busy.getsockname()[1]}: cannot listen"):
            serve_metrics(busy.getsockname()[1], "127.0.0.1", None, Stops())
    from prometheus_client import CollectorRegistry

    stops = Stops()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    serve_metrics(port, "127.0.0.1", CollectorRegistry(), stops)
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    stops.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_sigterm_stops_the_work_wakes_it_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    woken = threading.Event()

    def work(stop: threading.Event) -> str:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        woken.wait(10)  # a loop waiting on its own condition: only `wake` ends this wait
        return "stopped" if stop.is_set() else "not stopped"

    with Signals() as signals:
        signals.on_stop(woken.set)
        assert signals.run(work, "test") == "stopped"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_while_the_face_starts_stops_its_loop_as_soon_as_it_runs():
    before = signal.getsignal(signal.SIGTERM)
    woken = threading.Event()
    with Signals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)  # as soon as /metrics answers, before the loop runs
        assert signals.stopped.wait(5)
        signals.on_stop(woken.set)  # a wake given after the signal is called at once
        assert woken.is_set()
        assert signals.run(lambda stop: stop.is_set(), "test") is True
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_loop_that_raises_is_a_broken_loop_error_in_one_line_its_traceback_logged(caplog):
    before = signal.getsignal(signal.SIGTERM)

    def work(stop: threading.Event) -> None:
        raise ValueError("no such\nfield")  # one line all the same

    with caplog.at_level(logging.ERROR, logger="image_preflight.service"), pytest.raises(BrokenLoopError) as raised:
        with Signals() as signals:
            signals.run(work, "test")
    assert str(raised.value) == "the test loop ended unexpectedly (ValueError: no such field; its traceback is logged)"
    assert isinstance(raised.value.__cause__, ValueError)
    (record,) = caplog.records
    assert record.getMessage() == "the test loop failed" and record.exc_info[0] is ValueError
    assert signal.getsignal(signal.SIGTERM) is before

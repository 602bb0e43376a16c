"""image_preflight/service.py, the one way `serve`, `agent --publish` and `watchdog` run: JSON log
lines, /metrics, signals restored, what was started stopped in the reverse order."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading

import pytest

from image_preflight.errors import UnavailableError
from image_preflight.service import JsonLines, Stops, serve_metrics, until_signalled


def _record(message: str, *args, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("image_preflight.agent", level, __file__, 1, message, args, None)


def test_every_record_is_one_json_line_and_a_json_message_is_its_own_line():
    formatter = JsonLines()
    plain = json.loads(formatter.format(_record('pinned %s ("needed")', "docker.io/library/a:1")))
    assert plain == {"level": "info", "logger": "image_preflight.agent", "message": 'pinned docker.io/library/a:1 ("needed")'}
    action = '{"action": "failed", "job": "j"}'
    assert formatter.format(_record(action, level=logging.WARNING)) == action


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

    assert until_signalled(work, "test", wake=woken.set) == "stopped"
    assert signal.getsignal(signal.SIGTERM) is before

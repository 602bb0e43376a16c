"""`serve` holds at most --max-connections connections, counted from the TCP accept: callers that
open connections and say nothing, or keep them idle, cannot keep a new caller out. The one closed
is the one idle longest, never one being answered; the process may open the files it needs."""

from __future__ import annotations

import http.client
import json
import re
import resource
import selectors
import socket

import pytest

from image_preflight.webhook.config import MAX_CONNECTIONS
from image_preflight.webhook.limits import RESERVED_FILES, connection_bound
from image_preflight.webhook.protocol import DeadlineProtocol
from tests.builders.reviews import EXAMPLE_NODES, missing_job_review
from tests.serving import HOST, wait_until

HELD = 1100


@pytest.fixture
def soft_open_files_limit_1024():
    """The soft RLIMIT_NOFILE a container runtime often starts a process with, restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * HELD + 2 * RESERVED_FILES:
        pytest.skip(f"the hard open files limit ({hard}) cannot hold both ends of {HELD} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _evicted(webhook) -> float:
    found = re.search(r"^image_preflight_connections_evicted_total (\S+)$", webhook.metrics(), re.M)
    assert found, "no eviction counter in /metrics"
    return float(found.group(1))


def _closed(sockets: list[socket.socket], wait_s: float = 1.0) -> set[int]:
    """The indexes of the sockets the server has closed: readable, though it never sends unasked."""
    with selectors.DefaultSelector() as selector:  # epoll: select(2) stops at descriptor 1024
        for index, sock in enumerate(sockets):
            selector.register(sock, selectors.EVENT_READ, index)
        closed: set[int] = set()
        while True:
            ready = selector.select(timeout=wait_s)
            if not ready:
                return closed
            for key, _ in ready:
                closed.add(key.data)
                selector.unregister(key.fileobj)


def test_1100_silent_connections_under_a_1024_open_files_limit_leave_a_new_caller_answered(
        start_webhook, soft_open_files_limit_1024, monkeypatch):
    # A deadline far beyond the test: every connection closed was closed by the bound.
    monkeypatch.setattr(DeadlineProtocol, "header_deadline", 300.0)
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 2 * HELD  # raised to the hard limit at start
    held = []
    try:
        for _ in range(HELD):  # TCP only: never a TLS ClientHello, never a byte
            held.append(socket.create_connection(("127.0.0.1", webhook.port), timeout=15))
        status, reply = webhook.post(missing_job_review())
        assert status == 200 and reply["response"]["allowed"] is False
        # 1,101 accepted, 1,024 held: the 77 accepted first went, the newest caller stayed.
        evicted = HELD + 1 - MAX_CONNECTIONS
        assert _closed(held) == set(range(evicted))
        assert _evicted(webhook) == evicted
    finally:
        for sock in held:
            sock.close()


def _answered(webhook, connection) -> bool:
    """Whether `connection`, open before, still gets an answer."""
    try:
        status, _ = webhook.post(missing_job_review(), connection=connection)
    except (OSError, http.client.HTTPException):
        return False
    return status == 200


def _being_answered(webhook, body: bytes = b"{"):
    """A connection whose request the server is answering: its headers read (it said 100 Continue),
    its body still arriving."""
    connection = webhook.connect()
    connection.sock.sendall(f"POST /validate?timeout=30s HTTP/1.1\r\nHost: {HOST}\r\n"
                            "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                            f"Content-Length: {len(json.dumps(missing_job_review()))}\r\n\r\n".encode())
    said = b""
    while not said.endswith(b"\r\n\r\n"):
        said += connection.sock.recv(1)
    assert said.startswith(b"HTTP/1.1 100 "), said
    connection.sock.sendall(body)
    return connection


def test_the_connection_idle_longest_goes_first_and_one_being_answered_never(start_webhook, monkeypatch):
    monkeypatch.setattr(DeadlineProtocol, "header_deadline", 300.0)
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES), "--max-connections", "40")
    review = json.dumps(missing_job_review()).encode()
    slow = _being_answered(webhook, review[:10])  # the oldest connection, being answered throughout
    kept_alive = []  # each done with one answer, idle since, in this order
    for _ in range(30):
        kept_alive.append(webhook.connect())
        assert _answered(webhook, kept_alive[-1])
    silent = [webhook.connect() for _ in range(20)]  # handshaken, no request
    try:
        # 51 open, then a new caller: 12 closed, the 12 kept alive that fell idle first.
        status, reply = webhook.post(missing_job_review())
        assert status == 200 and reply["response"]["allowed"] is False
        assert _evicted(webhook) == 12
        assert [_answered(webhook, c) for c in kept_alive] == [False] * 12 + [True] * 18
        assert all(_answered(webhook, c) for c in silent)
        slow.sock.sendall(review[10:])  # the request held since the start is answered
        reply = http.client.HTTPResponse(slow.sock)
        reply.begin()
        assert reply.status == 200 and json.loads(reply.read())["response"]["allowed"] is False
    finally:
        for connection in [slow, *kept_alive, *silent]:
            connection.close()


def test_with_every_connection_being_answered_a_new_one_is_closed_until_one_is_done(start_webhook):
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES), "--max-connections", "2")
    busy = [_being_answered(webhook), _being_answered(webhook)]
    try:
        assert not _reached(webhook)
        assert _evicted(webhook) == 1
        busy[0].close()  # its request abandoned: the server closes its side
        wait_until(lambda: _reached(webhook), "a new caller is answered again")
    finally:
        for connection in busy:
            connection.close()


def _reached(webhook) -> bool:
    try:
        status, _ = webhook.post(missing_job_review())
    except (OSError, http.client.HTTPException):
        return False
    return status == 200


@pytest.mark.parametrize(("wanted", "open_files", "bound"), [
    (1024, 1 << 20, 1024),  # the limit raised to a container's usual hard limit
    (1024, 1024, 1024 - RESERVED_FILES),  # a hard limit of 1,024: the files besides connections first
    (5, 10, 1),
])
def test_the_bound_is_the_flag_unless_the_open_files_limit_leaves_fewer(wanted, open_files, bound):
    assert connection_bound(wanted, open_files) == bound

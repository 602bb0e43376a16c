"""The header deadline holds for every server on an event loop, not only the first to be reached."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from image_preflight.webhook import protocol
from image_preflight.webhook.protocol import DeadlineProtocol
from tests.serving import wait_until


async def _ok(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def two_servers_one_loop():
    """Two uvicorn servers with the deadline protocol, served by one event loop in one thread."""
    servers = [uvicorn.Server(uvicorn.Config(_ok, host="127.0.0.1", port=0, http=DeadlineProtocol, loop="asyncio",
                                             lifespan="off", log_level="warning", access_log=False))
               for _ in range(2)]
    for server in servers:
        server.install_signal_handlers = lambda: None

    async def both() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    thread = threading.Thread(target=asyncio.run, args=(both(),), daemon=True)
    thread.start()
    wait_until(lambda: all(s.started for s in servers) or not thread.is_alive(), "both servers listen")
    assert all(s.started for s in servers)
    yield [s.servers[0].sockets[0].getsockname()[1] for s in servers]
    for server in servers:
        server.should_exit = True
    thread.join(timeout=15)
    assert not thread.is_alive()


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_the_second_server_on_a_loop_closes_a_slow_header_client_too(two_servers_one_loop, monkeypatch):
    monkeypatch.setattr(DeadlineProtocol, "header_deadline", 0.5)
    first, second = two_servers_one_loop
    with socket.create_connection(("127.0.0.1", first)) as sock:  # the first server is reached first
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", second)) as slow:
            started = time.monotonic()
            slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # headers never completed
            assert _closed_within(slow, 2 * protocol.SWEEP_S + 1.5), "the second server never swept"
            assert time.monotonic() - started < 2 * protocol.SWEEP_S + 1.5


def test_the_uvicorn_internals_protocol_py_relies_on_are_there():
    """webhook/protocol.py subclasses uvicorn's HttpToolsProtocol, uvicorn's internals: the one place
    the project leans on them. A uvicorn release that renames one fails here, by name, rather than
    as a connection left open."""
    import inspect

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    protocol, cycle = inspect.getsource(HttpToolsProtocol), inspect.getsource(RequestResponseCycle)
    for attribute in ("self.cycle", "self.server_state", "self.connections", "self.loop", "self.transport",
                      "self.scope", "self.pipeline"):
        assert attribute in protocol, attribute
    for hook in ("connection_made", "connection_lost", "on_message_begin", "on_headers_complete",
                 "on_response_complete", "shutdown"):
        assert callable(getattr(HttpToolsProtocol, hook, None)), hook
    for attribute in ("self.keep_alive", "self.response_complete", "on_response=self.on_response_complete"):
        assert attribute in cycle + protocol, attribute


def test_the_uvloop_tls_protocol_protocol_py_builds_is_there():
    """DeadlineLoop puts uvloop's own TLS protocol under each connection, as uvloop's TLS server
    does: its constructor, and the protocol calls it answers to."""
    import ssl

    import uvloop
    from uvloop.loop import SSLProtocol

    loop = uvloop.new_event_loop()
    try:
        SSLProtocol(loop, asyncio.Protocol(), ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), loop.create_future(),
                    server_side=True, ssl_handshake_timeout=1.0, ssl_shutdown_timeout=None)
    finally:
        loop.close()
    for hook in ("connection_made", "connection_lost", "get_buffer", "buffer_updated"):
        assert callable(getattr(SSLProtocol, hook, None)), hook

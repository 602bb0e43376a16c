"""uvicorn's httptools protocol with a deadline for a request's headers, and a shutdown that
never closes a connection under a request.

uvicorn times out idle keep-alive connections, but not a request whose bytes trickle in: a client
could hold a connection (and its memory) forever by sending one header byte a second. The
apiserver sends a request's headers at once, so a connection whose request headers are not
complete within HEADER_DEADLINE_S of its first byte (or, for its first request, of the TCP accept,
TLS handshake included) is not the apiserver's: it is closed. The body has the app's own deadline
(a 408, after which the connection is closed too).

The handshake comes before uvicorn's protocol sees the connection, and asyncio gives it 60 s:
DeadlineLoop, the event loop `serve` runs (uvicorn's `loop` setting takes its import string),
stamps each protocol with the time of its accept and gives a TLS server's handshakes what is left
of the deadline by then, which is all of it.

One sweep a second per server checks every connection of that server, so a request costs two
attribute writes rather than a timer of its own.

At shutdown uvicorn closes each idle keep-alive connection at once. The apiserver may be writing a
request on it at that moment, and Go's transport retries no POST on a connection closed under it
(net/http transport.go, shouldRetryRequest): the call fails with EOF, and under failurePolicy Fail
so does the creation. Here a stopping server answers every further request on a connection with
`Connection: close`, so the client stops using it first, and closes a connection still idle after
IDLE_DRAIN_S, one its client has stopped choosing (Go reuses the most recently used first).

A server holds at most its protocol's `max_connections` TCP connections, counted from the accept,
TLS handshake included (OpenConnections). One accepted beyond the bound closes the connection idle
longest: never spoken, or done with its last answer; never one whose request is being answered. So
callers that open connections and say nothing cannot keep a new caller out, and the apiserver's
connections, reused call after call, are the last to go. uvicorn's own `limit_concurrency`
does the opposite: idle connections keep their places, and requests beyond the bound are answered
503, which the apiserver turns into its failurePolicy.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import cast

import uvloop

# uvicorn's internals, here only: no public hook sees a request's first byte or the end of its
# headers, nor lets a shutdown answer with Connection: close. tests/webhook/test_header_deadline.py
# names each internal relied on, so a uvicorn release that moves one fails there.
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# uvloop's TLS protocol, the one its TLS servers put under each connection (uvloop/sslproto.pyx),
# outside its public API: DeadlineLoop puts it there itself, to hold the connection from its
# accept rather than from the end of its handshake. test_header_deadline.py names it too.
from uvloop.loop import SSLProtocol  # type: ignore[attr-defined]  # internal: uvloop's stubs leave it out

from image_preflight.webhook.tls import caller_names

# The scope keys saying the connection's client presented a certificate the TLS layer verified
# (with --client-ca; the handshake refuses one that does not verify), and the names it holds.
CLIENT_VERIFIED = "image_preflight.client_verified"
CLIENT_NAMES = "image_preflight.client_names"
HEADER_DEADLINE_S = 10.0  # the apiserver's default timeoutSeconds; its requests need milliseconds
SWEEP_S = 1.0
# Well inside the Pod's termination grace (30 s, after the 10 s preStop sleep).
IDLE_DRAIN_S = 5.0

# (loop, server state) pairs with a sweep scheduled: each server has its own connections, and
# several servers may share a loop.
_swept: set[tuple[asyncio.AbstractEventLoop, object]] = set()


class DeadlineLoop(uvloop.Loop):
    """uvloop's event loop, whose servers stamp each protocol with the loop time of its TCP accept,
    close a TLS connection whose handshake is not done by the header deadline, and hold their
    connections within the protocol's `max_connections`."""

    async def create_server(self, protocol_factory, *args, ssl=None,
                            ssl_handshake_timeout=None, ssl_shutdown_timeout=None, **kwargs):
        held = OpenConnections()

        def accepted():
            protocol = protocol_factory()
            protocol.accepted_at = self.time()
            protocol.held = held
            if ssl is None:
                return protocol
            return _CountedTLS(self, protocol, ssl, ssl_handshake_timeout or protocol.header_deadline,
                               ssl_shutdown_timeout)

        # TLS is set up under each accepted connection here (_CountedTLS), as uvloop's own TLS
        # server would (uvloop/handles/streamserver.pyx, _on_listen), so the server itself is plain.
        return await super().create_server(accepted, *args, **kwargs)


class _CountedTLS(SSLProtocol):
    """uvloop's TLS under one accepted connection, which counts it from the accept (its protocol's
    `opened`) to the close, handshake included."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: "DeadlineProtocol", context, handshake_timeout: float,
                 shutdown_timeout: float | None) -> None:
        handshaken = loop.create_future()
        super().__init__(loop, app, context, handshaken, server_side=True, ssl_handshake_timeout=handshake_timeout,
                         ssl_shutdown_timeout=shutdown_timeout)
        self.app, self.raw = app, None
        handshaken.add_done_callback(self._handshaken)

    def connection_made(self, transport) -> None:
        self.raw = transport
        super().connection_made(transport)
        if not self.app.opened(transport):
            transport.abort()

    def connection_lost(self, exc) -> None:
        self.app.left()
        super().connection_lost(exc)

    def _handshaken(self, handshaken: asyncio.Future) -> None:
        # As uvloop's TLS server does (streamserver.pyx, __on_ssl_connected): a failed handshake
        # closes the connection.
        if not handshaken.cancelled() and handshaken.exception() is not None and self.raw is not None:
            self.raw.abort()


class OpenConnections:
    """One server's TCP connections, from the accept to the close, within a bound: when a new one
    is past it, the connection idle longest is closed (OpenConnections.admit).

    `idle` holds the connections not being answered, in the order they fell idle: at the accept,
    or when their last answer was sent; a request's complete headers take its connection out until
    the answer is sent. Two dictionary operations a request, and O(1) to find whom to close."""

    def __init__(self) -> None:
        self.open: set[DeadlineProtocol] = set()
        self.idle: OrderedDict[DeadlineProtocol, None] = OrderedDict()

    def admit(self, protocol: "DeadlineProtocol") -> bool:
        """Count a connection just accepted, closing the connections idle longest while more than
        its protocol's max_connections are open; False (uncounted) when every other one is being
        answered: then it is the one to close."""
        self.open.add(protocol)
        self.idle[protocol] = None
        bound = protocol.max_connections
        while bound is not None and len(self.open) > bound:
            longest = next(iter(self.idle))
            self.leave(longest)
            if protocol.on_evicted is not None:
                protocol.on_evicted()
            if longest is protocol:
                return False
            longest.evict()
        return True

    def busy(self, protocol: "DeadlineProtocol") -> None:
        self.idle.pop(protocol, None)

    def idle_now(self, protocol: "DeadlineProtocol") -> None:
        if protocol in self.open:
            self.idle[protocol] = None

    def leave(self, protocol: "DeadlineProtocol") -> None:
        self.open.discard(protocol)
        self.idle.pop(protocol, None)


class DeadlineProtocol(HttpToolsProtocol):
    header_deadline = HEADER_DEADLINE_S
    # The most TCP connections a server holds (bounded()); None: no bound.
    max_connections: int | None = None
    on_evicted: Callable[[], None] | None = None  # called for each connection closed to keep the bound
    accepted_at: float | None = None  # loop time of the TCP accept (DeadlineLoop)
    held: OpenConnections | None = None  # the server's connections (DeadlineLoop)
    _raw = None  # the TCP transport, under TLS if any
    _waiting_since: float | None = None  # loop time the current request (or the connection) began
    _draining = False
    _client_verified = False
    _client_names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    @classmethod
    def bounded(cls, max_connections: int, on_evicted: Callable[[], None] | None = None) -> type[DeadlineProtocol]:
        """This protocol, for a server (of DeadlineLoop) holding at most `max_connections`."""
        return type(cls.__name__, (cls,), {
            "max_connections": max_connections,
            "on_evicted": staticmethod(on_evicted) if on_evicted is not None else None})

    def opened(self, raw) -> bool:
        """Count the TCP connection just accepted (DeadlineLoop); False when it is to be closed."""
        self._raw = raw
        return self.held is None or self.held.admit(self)

    def left(self) -> None:
        if self.held is not None:
            self.held.leave(self)

    def evict(self) -> None:
        if self._raw is not None:  # it is: only a connection opened() counted is evicted
            self._raw.abort()  # at once, and with it its file descriptor

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self._raw is None and not self.opened(transport):  # without TLS, counted here at the accept
            transport.abort()
            return
        # After the handshake: the first request's headers are due a deadline after the accept.
        self._waiting_since = self.accepted_at if self.accepted_at is not None else self.loop.time()
        # Called once the handshake is done: a verified client certificate is known by now.
        peercert = transport.get_extra_info("peercert")
        self._client_verified = bool(peercert)
        if peercert:
            self._client_names = caller_names(peercert)
        swept = (self.loop, self.server_state)
        if swept not in _swept:
            _swept.add(swept)
            self.loop.call_later(SWEEP_S, _sweep, swept, self.connections)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._waiting_since is None:
            self._waiting_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._waiting_since = None
        if self.held is not None:
            self.held.busy(self)
        scope = cast("dict[str, object]", self.scope)  # ASGI's keys, and a server may add its own
        scope[CLIENT_VERIFIED] = self._client_verified
        scope[CLIENT_NAMES] = self._client_names
        super().on_headers_complete()
        if self._draining and self.cycle is not None:
            self.cycle.keep_alive = False  # the answer says Connection: close

    def on_response_complete(self) -> None:
        answering_next = bool(self.pipeline)  # a pipelined request, started by uvicorn's own
        super().on_response_complete()
        if self.held is not None and not answering_next:
            self.held.idle_now(self)

    def connection_lost(self, exc) -> None:
        self.left()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        self._draining = True
        if self.cycle is None or self.cycle.response_complete:
            self.loop.call_later(IDLE_DRAIN_S, self._close_if_idle)
        else:
            self.cycle.keep_alive = False

    def _close_if_idle(self) -> None:
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()


def _sweep(swept: tuple[asyncio.AbstractEventLoop, object], connections: set) -> None:
    loop = swept[0]
    if loop.is_closed() or not connections:  # the next connection schedules it again
        _swept.discard(swept)
        return
    now = loop.time()
    for protocol in list(connections):
        since = getattr(protocol, "_waiting_since", None)
        if since is not None and now - since > protocol.header_deadline and not protocol.transport.is_closing():
            protocol.transport.close()
    loop.call_later(SWEEP_S, _sweep, swept, connections)

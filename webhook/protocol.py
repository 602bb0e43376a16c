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
"""

from __future__ import annotations

import asyncio

import uvloop
# uvicorn's internals, here only: no public hook sees a request's first byte or the end of its
# headers, nor lets a shutdown answer with Connection: close. tests/webhook/test_header_deadline.py
# names each internal relied on, so a uvicorn release that moves one fails there.
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The scope key saying the connection's client presented a certificate the TLS layer verified
# (with --client-ca; the handshake refuses one that does not verify).
CLIENT_VERIFIED = "image_preflight.client_verified"
HEADER_DEADLINE_S = 10.0  # the apiserver's default timeoutSeconds; its requests need milliseconds
SWEEP_S = 1.0
# Well inside the Pod's termination grace (30 s, after the 10 s preStop sleep).
IDLE_DRAIN_S = 5.0

# (loop, server state) pairs with a sweep scheduled: each server has its own connections, and
# several servers may share a loop.
_swept: set[tuple[asyncio.AbstractEventLoop, object]] = set()


class DeadlineLoop(uvloop.Loop):
    """uvloop's event loop, whose servers stamp each protocol with the loop time of its TCP accept
    and, with TLS, close a connection whose handshake is not done by the header deadline."""

    async def create_server(self, protocol_factory, *args, **kwargs):  # type: ignore[override]
        def accepted():
            protocol = protocol_factory()
            protocol.accepted_at = self.time()
            return protocol

        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", DeadlineProtocol.header_deadline)
        return await super().create_server(accepted, *args, **kwargs)


class DeadlineProtocol(HttpToolsProtocol):
    header_deadline = HEADER_DEADLINE_S
    accepted_at: float | None = None  # loop time of the TCP accept (DeadlineLoop)
    _waiting_since: float | None = None  # loop time the current request (or the connection) began
    _draining = False
    _client_verified = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # After the handshake: the first request's headers are due a deadline after the accept.
        self._waiting_since = self.accepted_at if self.accepted_at is not None else self.loop.time()
        # Called once the handshake is done: a verified client certificate is known by now.
        self._client_verified = bool(transport.get_extra_info("peercert"))
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
        self.scope[CLIENT_VERIFIED] = self._client_verified
        super().on_headers_complete()
        if self._draining and self.cycle is not None:
            self.cycle.keep_alive = False  # the answer says Connection: close

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

"""uvicorn's httptools protocol with a deadline for a request's headers.

uvicorn times out idle keep-alive connections, but not a request whose bytes trickle in: a client
could hold a connection (and its memory) forever by sending one header byte a second. The
apiserver sends a request's headers at once, so a connection whose request headers are not
complete within HEADER_DEADLINE_S of its first byte (or of the connection, for one that sends
nothing) is not the apiserver's: it is closed. The body has the app's own deadline (a 408, after
which the connection is closed too).

One sweep a second per event loop checks every connection, so a request costs two attribute
writes rather than a timer of its own.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_DEADLINE_S = 10.0  # the apiserver's default timeoutSeconds; its requests need milliseconds
SWEEP_S = 1.0

_swept_loops: set[asyncio.AbstractEventLoop] = set()


class DeadlineProtocol(HttpToolsProtocol):
    header_deadline = HEADER_DEADLINE_S
    _waiting_since: float | None = None  # loop time the current request (or the connection) began

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        if self.loop not in _swept_loops:
            _swept_loops.add(self.loop)
            self.loop.call_later(SWEEP_S, _sweep, self.loop, self.connections)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._waiting_since is None:
            self._waiting_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._waiting_since = None
        super().on_headers_complete()


def _sweep(loop: asyncio.AbstractEventLoop, connections: set) -> None:
    if loop.is_closed():
        _swept_loops.discard(loop)
        return
    now = loop.time()
    for protocol in list(connections):
        since = getattr(protocol, "_waiting_since", None)
        if since is not None and now - since > protocol.header_deadline and not protocol.transport.is_closing():
            protocol.transport.close()
    loop.call_later(SWEEP_S, _sweep, loop, connections)

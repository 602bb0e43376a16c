"""containerd's image events, so the agent lists the images the moment they change.

CRI has no image events; containerd's events service (on the same socket) does. A thread keeps
one `Events/Subscribe` stream open and calls `on_change` for every image event in the CRI
namespace, and once after each subscription that follows a gap, since events of the gap are lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from image_preflight.agent import containerd_events_pb2, containerd_events_pb2_grpc
from image_preflight.agent.cri import socket_path

log = logging.getLogger(__name__)

CRI_NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps its images in
IMAGE_TOPIC_PREFIX = "/images/"  # /images/create, /images/update, /images/delete
# Selectors within one filter must all match (containerd's filters package).
IMAGE_EVENTS_FILTER = f'topic~="^{IMAGE_TOPIC_PREFIX}",namespace=="{CRI_NAMESPACE}"'
SUBSCRIBE = "containerd.services.events.v1.Events/Subscribe"
# A stream still open this long after Subscribe is taken as registered: containerd sends nothing
# until an event, and a refused or failing stream ends well within it.
SUBSCRIBED_AFTER_S = 0.2
RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 10.0
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class ImageEvents:
    """Subscribes in a thread of its own from `start()` until `close()`.

    `on_change()` runs in that thread: keep it short (set an event). `on_unavailable(reason)` is
    called once if the runtime has no containerd events service; the thread then ends.
    """

    def __init__(
        self,
        endpoint: str,
        on_change: Callable[[], None],
        *,
        on_unavailable: Callable[[str], None] | None = None,
        retry_initial: float = RETRY_INITIAL_S,
        retry_max: float = RETRY_MAX_S,
    ) -> None:
        self.endpoint = endpoint
        self._on_change = on_change
        self._on_unavailable = on_unavailable
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._channel = grpc.insecure_channel("unix://" + socket_path(endpoint), options=_CHANNEL_OPTIONS)
        self._events = containerd_events_pb2_grpc.EventsStub(self._channel)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="image-events", daemon=True)
        self.subscriptions = 0  # streams that were registered
        self.received = 0  # image events in the CRI namespace

    @property
    def where(self) -> str:
        return f"containerd events at {self.endpoint}"

    @property
    def alive(self) -> bool:
        """Whether the thread still subscribes (False once closed, or with no events service)."""
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Ends the stream and the thread; returns once the thread has ended (or `timeout`)."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            if self._call is not None:
                self._call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._channel.close()

    def __enter__(self) -> ImageEvents:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        delay = self._retry_initial
        broken = False  # one warning per outage, not one per attempt
        while not self._closed.is_set():
            opened = time.monotonic()
            outcome = self._stream(again=broken)
            if outcome is None:  # closed
                return
            registered, err = outcome
            code = err.code() if isinstance(err, grpc.Call) else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                if self._on_unavailable is not None:
                    self._on_unavailable(f"{self.where}: {SUBSCRIBE} not implemented (the runtime is not containerd)")
                return
            details = " ".join(str(err.details() if isinstance(err, grpc.Call) else err).split())
            why = f"{code.name if code is not None else 'error'}: {details}"
            if registered:
                broken = False
                # A stream that keeps breaking soon after it opens keeps backing off.
                if time.monotonic() - opened >= self._retry_max:
                    delay = self._retry_initial
            if not broken:
                log.warning("%s: %s (%s); subscribing again with backoff", self.where,
                            "stream broken" if registered else "cannot subscribe", why)
                broken = True
            else:
                log.debug("%s: cannot subscribe (%s); next try in %g s", self.where, why, delay)
            if self._closed.wait(delay):
                return
            delay = min(delay * 2, self._retry_max)

    def _stream(self, *, again: bool) -> tuple[bool, grpc.RpcError] | None:
        """One subscription until it ends: (whether it was registered, the error that ended it);
        None once closed. `again`: after an outage."""
        with self._lock:
            if self._closed.is_set():
                return None
            call = self._events.Subscribe(containerd_events_pb2.SubscribeRequest(filters=[IMAGE_EVENTS_FILTER]))
            self._call = call
        ended = threading.Event()
        call.add_done_callback(lambda _: ended.set())
        registered = False
        try:
            # Events queue in the client meanwhile, so none is lost while we wait.
            if not ended.wait(SUBSCRIBED_AFTER_S):
                registered = True
                self.subscriptions += 1
                if again:
                    log.info("%s: subscribed again; listing once for the events missed meanwhile", self.where)
                else:
                    log.debug("%s: subscribed to image events", self.where)
                # Events before now are lost (a gap, or the agent's first list ran before this).
                self._on_change()
            for envelope in call:
                registered = True
                # The filter already asks for these; checked again in case a runtime ignores it.
                if envelope.namespace == CRI_NAMESPACE and envelope.topic.startswith(IMAGE_TOPIC_PREFIX):
                    self.received += 1
                    self._on_change()
        except grpc.RpcError as err:
            if self._closed.is_set():
                return None
            return registered, err
        finally:
            with self._lock:
                self._call = None
        if self._closed.is_set():
            return None
        # The server ended the stream without an error: resubscribe like after a break.
        return registered, _EndedStream("the runtime closed the stream")


class _EndedStream(grpc.RpcError):
    def __init__(self, details: str) -> None:
        super().__init__(details)

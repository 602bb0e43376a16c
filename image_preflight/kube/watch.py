"""Keep an in-memory view of one kind of cluster object current: list, then watch, and recover.

This is the I/O shell around the pure core: it talks to the apiserver through the official
client and hands plain dicts (camelCase, as the API returns them) to callbacks. It reads raw
JSON instead of building models, which is far too slow for objects carrying thousands of
image names.

Every watch has one shape: a function named for what it follows (`node_watcher`,
`node_images_watcher`, `runtime_class_watcher`, `needed_images_watcher`, the watchdog's
`watchers`) returns ResourceWatchers, not started; whoever owns their lifetime starts and stops them.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable, Iterator

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ReadTimeoutError

from image_preflight.errors import UnavailableError
from image_preflight.kube.pages import Pages
from image_preflight.kube.status import describe_error

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT = 10.0
_LIST_READ_TIMEOUT = 120.0
NODE_PAGE = 5  # nodes per list page: each can carry thousands of image names
PAGE = 500  # objects per list page for small objects (kubectl's chunk size)
# How long an open watch may say nothing before it is dropped and resumed. The apiserver's watch
# cache sends a bookmark about every minute (k8s.io/apiserver@v0.37.2 pkg/storage/cacher:
# defaultBookmarkFrequency in cacher.go, cacheWatcher.nextBookmarkTime, fired in 1 s buckets);
# 30 s more absorb a busy apiserver. But it sends only bookmarks newer than the resourceVersion a
# watch began at (cacheWatcher.process), and none without the cache, so until a stream's first
# bookmark a watch on objects nothing changes is rightly silent until the server ends it at
# timeoutSeconds (endpoints/handlers/get.go handleWatch): that phase gets timeoutSeconds plus this.
# Both stay below serve's --max-inventory-age (webhook/config.py), so one silent stream is replaced
# before the replica turns unready. The answer to the watch request comes at once, so it gets this bound too.
SILENCE_TIMEOUT_S = 90.0
# client-go's reflector backs off to 30 s to spare a large apiserver from thousands of clients;
# two webhook replicas cost nothing, and each second of backoff after an apiserver restart is a
# second of decisions on a stale view (tests/cluster/test_cluster_faults.py measures it).
BACKOFF_MAX_S = 5.0


class _Expired(UnavailableError):
    """The resourceVersion we resume from is gone: only a fresh list helps."""


class _StreamError(UnavailableError):
    """The watch stream carried an ERROR event other than 410."""


class _Silent(UnavailableError):
    """The watch said nothing for longer than its bound while its connection stayed open."""


class ResourceWatcher:
    """List and watch what `list_objects` lists, handing raw dicts to the callbacks.

    `list_objects(**query)` is a generated client's list method with everything but the query
    bound, e.g. `CoreV1Api(api).list_node`; `what` names it in logs and the thread. `replace` gets
    the full list after every (re)list, `upsert` each added or modified object, `delete` each
    deleted one. With `absent_retry`, a 404
    (the resource is not served, e.g. its CRD is not installed), or another of `absent_statuses`,
    counts as an empty list, logged once, and the list is tried again quietly about every
    `absent_retry` seconds.
    A watch that says nothing for `silence_timeout` seconds once it has delivered a bookmark (for
    `watch_timeout_seconds` plus that before) is dropped and resumed, counted as "silent".
    """

    def __init__(
        self,
        list_objects: Callable[..., Any],
        *,
        replace: Callable[[Iterable[dict]], None],
        upsert: Callable[[dict], None],
        delete: Callable[[dict], None],
        what: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout_seconds: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = BACKOFF_MAX_S,
        on_restart: Callable[[str], None] | None = None,
        absent_retry: float | None = None,
        absent_statuses: tuple[int, ...] = (404,),
        silence_timeout: float = SILENCE_TIMEOUT_S,
        page_size: int = PAGE,
    ):
        self._list_objects = list_objects
        self._replace, self._upsert, self._delete = replace, upsert, delete
        self._what = what
        self._absent_retry = absent_retry
        self._absent_statuses = absent_statuses
        self.absent = False  # the last list answered 404 (only with absent_retry)
        # Only the selectors given are sent: a list method without field_selector (none lacks it
        # today) is never handed one.
        self._selectors = {key: value for key, value in
                           (("label_selector", label_selector), ("field_selector", field_selector)) if value}
        self._watch_timeout = watch_timeout_seconds
        self._silence_timeout = silence_timeout
        self._page_size = page_size
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._on_restart = on_restart
        self._resource_version: str | None = None
        self._response = None  # the open watch response, so stop() can interrupt a blocked read
        self._response_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()
        self.last_sync: float | None = None
        self.listed_resource_version: str | None = None  # the last list's snapshot, where its watch starts

    @property
    def resource_version(self) -> str | None:
        """The newest resourceVersion seen (from a list, an event or a bookmark)."""
        return self._resource_version

    def start(self) -> threading.Thread:
        self._stop_event.clear()
        self._thread = threading.Thread(
            target=self.run, args=(self._stop_event,), name=f"{self._what}-watch", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop_event.set()
        self._interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def run(self, stop: threading.Event) -> None:
        """List and watch until `stop` is set; no exception escapes."""
        backoff = self._backoff_initial
        need_list = True
        while not stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                    backoff = self._backoff_initial
                if self._watch(stop):
                    backoff = self._backoff_initial
                if not stop.is_set():
                    self._restart("closed")
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any failure
                if stop.is_set():
                    break
                if isinstance(exc, _Silent):
                    # Only the connection is suspect: resume at once from where the stream stopped.
                    log.warning("%s watch: %s; watching again from resourceVersion %s",
                                self._what, describe_error(exc), self._resource_version)
                    self._restart("silent")
                    continue
                if (self._absent_retry is not None and isinstance(exc, ApiException)
                        and exc.status in self._absent_statuses):
                    need_list = True
                    self._on_absent(exc)
                    stop.wait(self._absent_retry * random.uniform(0.5, 1.0))
                    continue
                expired = isinstance(exc, _Expired) or (isinstance(exc, ApiException) and exc.status == 410)
                if expired and not need_list:
                    log.info("%s watch: resourceVersion %s expired (%s); listing again",
                             self._what, self._resource_version, describe_error(exc))
                    need_list = True
                    self._restart("expired")
                    continue
                delay = min(backoff, self._backoff_max) * random.uniform(0.5, 1.0)
                log.warning("%s watch: %s; retrying in %.2fs", self._what, describe_error(exc), delay)
                self._restart("error")
                stop.wait(delay)
                backoff = min(backoff * 2, self._backoff_max)

    # -- internals ----------------------------------------------------------------------------

    def _restart(self, reason: str) -> None:
        if self._on_restart is None:
            return
        try:
            self._on_restart(reason)
        except Exception as exc:  # noqa: BLE001 - a metrics hook must not stop the watch
            log.warning("%s watch: on_restart(%r) failed: %s", self._what, reason, describe_error(exc))

    def _on_absent(self, exc: ApiException) -> None:
        if self.absent:
            return
        log.log(logging.INFO if exc.status == 404 else logging.WARNING,
                "%s watch: not served (%s); looking again every %gs", self._what, describe_error(exc),
                self._absent_retry)
        try:
            self._replace([])
        except Exception as failure:  # noqa: BLE001 - retried at the next 404
            log.warning("%s watch: emptying the view failed: %s", self._what, describe_error(failure))
            return
        self.absent = True
        self.synced.set()

    def _list(self) -> None:
        pages = Pages(self._list_objects, self._page_size, self._selectors,
                      timeout=(_CONNECT_TIMEOUT, _LIST_READ_TIMEOUT))
        # The sink converts page by page, so a 200-node cluster's full image lists never sit
        # in memory as raw JSON all at once. An expired continue token is a 410: re-listed.
        self._replace(pages.items())
        if self.absent:
            log.info("%s watch: served again", self._what)
            self.absent = False
        self._resource_version = self.listed_resource_version = pages.resource_version
        self.last_sync = time.monotonic()
        self.synced.set()

    def _watch(self, stop: threading.Event) -> bool:
        """Follow one watch stream to its end; True if it delivered anything."""
        try:
            response = self._list_objects(
                watch=True,
                resource_version=self._resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                **self._selectors,
                _preload_content=False,
                _request_timeout=(_CONNECT_TIMEOUT, self._silence_timeout),
            )
        except MaxRetryError as exc:  # urllib3 retries a request whose answer timed out, then this
            if isinstance(exc.reason, ReadTimeoutError):
                raise _Silent(f"no answer to the watch request within {self._silence_timeout:g}s") from exc
            raise
        with self._response_lock:
            self._response = response
        delivered = bookmarked = False
        bound = self._watch_timeout + self._silence_timeout  # no bookmark yet: see SILENCE_TIMEOUT_S
        _set_read_timeout(response, bound)
        try:
            if stop.is_set():  # stop() may have run before the response was registered
                return delivered
            try:
                for line in _lines(response):
                    event = json.loads(line)
                    self._apply(event)
                    delivered = True
                    if stop.is_set():
                        break
                    if event.get("type") == "BOOKMARK" and not bookmarked:
                        bookmarked, bound = True, self._silence_timeout  # the next is due within a minute
                        _set_read_timeout(response, bound)
            except ReadTimeoutError as exc:
                raise _Silent(f"nothing received for {bound:g}s on an open watch") from exc
        finally:
            with self._response_lock:
                self._response = None
            # A stream left half-read must not go back to the connection pool.
            response.close()
            response.release_conn()
        return delivered

    def _apply(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired(obj.get("message", "410 Gone"))
            raise _StreamError(f"watch ERROR event: {obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        metadata = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED"):
            self._upsert(obj)
        elif kind == "DELETED":
            self._delete(obj)
        elif kind != "BOOKMARK":
            raise _StreamError(f"watch event of unknown type {kind!r}")
        # Advance only after the sink took the event, so a failure replays it.
        if metadata.get("resourceVersion"):
            self._resource_version = metadata["resourceVersion"]
        self.last_sync = time.monotonic()

    def _interrupt(self) -> None:
        with self._response_lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks a read waiting on the socket
            except Exception:  # noqa: BLE001 - best effort during shutdown
                pass


def _set_read_timeout(response, seconds: float) -> None:
    """Change how long each read of an open response may wait (the client fixes it per request)."""
    # On the socket under urllib3's response: `connection.sock` is http.client's attribute, outside
    # urllib3's connection interface. Neither urllib3 nor the client changes the read timeout of a
    # response already streaming, and a watch's bound shrinks at its first bookmark
    # (SILENCE_TIMEOUT_S). tests/shells/test_node_watch.py
    # (test_urllib3_still_lets_a_streaming_watch_change_its_read_timeout) fails if that moves.
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def _lines(response) -> Iterator[str]:
    """Newline-delimited JSON events from a chunked watch response (chunks need not align)."""
    buffer = bytearray()
    for chunk in response.stream(amt=None, decode_content=False):
        start = len(buffer)
        buffer += chunk
        newline = buffer.find(b"\n", start)
        while newline != -1:
            line = bytes(buffer[:newline])
            del buffer[: newline + 1]
            if line.strip():
                yield line.decode("utf-8")
            newline = buffer.find(b"\n")
    if buffer.strip():
        yield buffer.decode("utf-8")

"""An in-process double of the Kubernetes apiserver, spoken to by the real `kubernetes` client.

Tests of normal behaviour run against the real control plane (tests/controlplane). This double is
kept only for conditions the real apiserver cannot be made to produce on demand:

- error answers injected into the next requests: 5xx, a 409 conflict, an HTTP 410, also to
  hold lists failing while a test arranges the state a client will find (`fail_next`);
- a watch connection dropped mid-stream while the server stays up (`drop_watches`);
- a watch stream ended at a chosen moment (`end_watches`);
- a watch connection that stays open and says nothing more, no events and no bookmarks, as behind
  a half-dead proxy or from a stuck apiserver (`silence_watches`), also from the moment a watch is
  answered (`silence_next_watches`);
- the event history forgotten at a chosen moment, so that the next watch resumed from before
  it gets an in-band 410 Expired (`compact`);
- a stored object that its CustomResourceDefinition's schema would refuse (`put_object` stores
  any object as it is).

What it serves, for cluster-scoped resources registered with `register`: get, list (in pages with
limit and continue, as the watchers list), create and replace, and watch from a resourceVersion
with bookmarks, under one global resourceVersion. Requests it does not serve (selectors, patch,
delete, namespaces, subresources, a watch without a resourceVersion) are refused with an error
rather than answered approximately. Simplifications: continue tokens page over the latest state,
not a snapshot; writes check no preconditions (a create replaces an existing object, a replace
ignores the resourceVersion it is given); watches stay open until ended (timeoutSeconds is
ignored); a bookmark comes every `bookmark_interval` even when nothing changed (the apiserver's
watch cache sends one only once the resourceVersion moved past the one the watch began at).
"""

from __future__ import annotations

import base64
import copy
import json
import queue
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from kubernetes import client as k8s_client

_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    500: "InternalError",
    503: "ServiceUnavailable",
}
_UNSERVED_QUERY = ("labelSelector", "fieldSelector")


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]


@dataclass(frozen=True, slots=True)
class _Resource:
    group: str
    version: str
    resource: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def gvr(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.resource)


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    type: str
    gvr: tuple[str, str, str]
    obj: dict  # stored objects are never mutated in place, so sharing is safe


class ApiError(Exception):
    """Becomes a `Status` reply (or an ERROR watch event)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": _REASONS.get(self.code, "Unknown"), "code": self.code}


class _Watcher:
    """One open watch connection; the store pushes events into its queue under the lock."""

    def __init__(self, conn: socket.socket, silent: bool = False):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.conn = conn
        self.silent = silent  # sends nothing more, stays open until ended or its client hangs up


_DROP = object()  # close the connection abruptly
_END = object()  # end the stream cleanly


class FakeApiServer:
    def __init__(self, *, bookmark_interval: float = 1.0):
        self.bookmark_interval = bookmark_interval
        self._lock = threading.RLock()
        self._resources: dict[tuple[str, str, str], _Resource] = {}
        self._objects: dict[tuple[str, str, str, str], dict] = {}
        self._rv = 0
        self._history: list[_Event] = []
        self._compacted_rv = 0  # watches from an rv below this get 410
        self._watchers: set[_Watcher] = set()
        self._connections: set[socket.socket] = set()
        self._requests: list[RecordedRequest] = []
        self._failures: tuple[int, int, str | None] = (0, 500, None)  # (count left, status, message)
        self._silent_next = 0  # watches still to be opened silent
        self._httpd: ThreadingHTTPServer | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "FakeApiServer":
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True).start()
        return self

    def close(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._end_watches(_END)
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn)
        self._httpd.server_close()
        self._httpd = None

    def __enter__(self) -> "FakeApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- registration and direct access -----------------------------------------------------

    def register(self, *, group: str = "", version: str = "v1", resource: str, kind: str) -> None:
        """Serve a cluster-scoped resource."""
        res = _Resource(group, version, resource, kind)
        with self._lock:
            self._resources[res.gvr] = res

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def watch_requests(self, resource: str) -> list[RecordedRequest]:
        """Recorded watch calls on collection paths ending in `resource`."""
        return [r for r in self.requests
                if r.path.endswith("/" + resource) and r.query.get("watch", "").lower() in ("1", "true")]

    def put_object(self, resource: str, obj: dict, *, group: str = "", version: str = "v1") -> dict:
        """Create or replace, emitting ADDED or MODIFIED; returns the stored object."""
        res = self._resource(group, version, resource)
        if not (obj.get("metadata") or {}).get("name"):
            raise ValueError(f"put_object({resource}): metadata.name is required")
        return copy.deepcopy(self._store(res, copy.deepcopy(obj)))

    def delete_object(self, resource: str, name: str, *, group: str = "", version: str = "v1") -> dict:
        """Delete, emitting DELETED; raises KeyError when absent."""
        res = self._resource(group, version, resource)
        with self._lock:
            old = self._objects.pop((*res.gvr, name))
            self._rv += 1
            gone = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self._rv)}}
            self._emit(_Event(self._rv, "DELETED", res.gvr, gone))
            return copy.deepcopy(gone)

    def get_object(self, resource: str, name: str, *, group: str = "", version: str = "v1") -> dict | None:
        res = self._resource(group, version, resource)
        with self._lock:
            obj = self._objects.get((*res.gvr, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, resource: str, *, group: str = "", version: str = "v1") -> list[dict]:
        res = self._resource(group, version, resource)
        with self._lock:
            return [copy.deepcopy(o) for k, o in sorted(self._objects.items()) if k[:3] == res.gvr]

    # -- test controls ----------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 500, message: str | None = None) -> None:
        """The next n requests (of any kind) answer `status` with a Status body.

        Replaces failures still pending, so `fail_next(0)` heals the server.
        """
        with self._lock:
            self._failures = (n, status, message)

    def drop_watches(self) -> None:
        """Close every open watch connection without ending the chunked stream."""
        self._end_watches(_DROP)

    def end_watches(self) -> None:
        """End every open watch stream cleanly, as a server-side timeout does."""
        self._end_watches(_END)

    def silence_watches(self) -> None:
        """Every open watch stays open and sends nothing more: no events, no bookmarks."""
        with self._lock:
            for watcher in self._watchers:
                watcher.silent = True

    def silence_next_watches(self, n: int) -> None:
        """The next n watches answer 200 and then send nothing, not even the events they replay."""
        with self._lock:
            self._silent_next = n

    def compact(self) -> None:
        """Forget the event history: a watch from any rv before now gets 410 Expired."""
        with self._lock:
            self._history.clear()
            self._compacted_rv = self._rv

    # -- internals --------------------------------------------------------------------------

    def _end_watches(self, how: object) -> None:
        with self._lock:
            watchers = list(self._watchers)
            self._watchers.clear()
        for watcher in watchers:
            watcher.queue.put(how)
            if how is _DROP:
                _shutdown(watcher.conn)

    def _resource(self, group: str, version: str, resource: str) -> _Resource:
        with self._lock:
            try:
                return self._resources[(group, version, resource)]
            except KeyError:
                raise KeyError(f"resource {group or 'core'}/{version}/{resource} is not registered") from None

    def _emit(self, event: _Event) -> None:
        # Called with the lock held, after the rv was bumped and stamped into the object.
        self._history.append(event)
        for watcher in self._watchers:
            watcher.queue.put(event)

    def _store(self, res: _Resource, obj: dict) -> dict:
        with self._lock:
            meta = dict(obj.get("metadata") or {})
            key = (*res.gvr, meta["name"])
            old = self._objects.get(key)
            if old is None:
                meta["uid"] = str(uuid.uuid4())
                meta["creationTimestamp"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            else:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            stored = {**obj, "apiVersion": res.api_version, "kind": res.kind, "metadata": meta}
            self._objects[key] = stored
            self._emit(_Event(self._rv, "MODIFIED" if old else "ADDED", res.gvr, stored))
            return stored

    def _record(self, method: str, path: str, query: dict[str, str]) -> tuple[int, str | None] | None:
        with self._lock:
            self._requests.append(RecordedRequest(method, path, query))
            left, status, message = self._failures
            if left <= 0:
                return None
            self._failures = (left - 1, status, message)
            return status, message

    def _route(self, path: str) -> tuple[_Resource, str | None]:
        """The resource and object name of /api/v1/<resource>[/<name>] or
        /apis/<group>/<version>/<resource>[/<name>]."""
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            rest = []
        with self._lock:
            res = self._resources.get((group, version, rest[0])) if 1 <= len(rest) <= 2 else None
        if res is None:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        return res, rest[1] if len(rest) == 2 else None

    # -- verbs --------------------------------------------------------------------------------

    def list(self, res: _Resource, query: dict[str, str]) -> dict:
        """One page of `limit` objects (all without it) after the name in the continue token."""
        with self._lock:
            items = [(k[3], o) for k, o in sorted(self._objects.items()) if k[:3] == res.gvr]
            rv = self._rv
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token := query.get("continue"):
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except ValueError:
                raise ApiError(400, f"invalid continue token {token!r}") from None
            items = [(name, o) for name, o in items if name > after]
        limit = int(query.get("limit") or 0)
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = base64.urlsafe_b64encode(items[-1][0].encode()).decode()
        return {"kind": res.kind + "List", "apiVersion": res.api_version, "metadata": meta,
                "items": [o for _, o in items]}

    def get(self, res: _Resource, name: str) -> dict:
        with self._lock:
            obj = self._objects.get((*res.gvr, name))
        if obj is None:
            raise ApiError(404, f'{res.resource} "{name}" not found')
        return obj

    def write(self, res: _Resource, body: Any, name: str | None) -> dict:
        """Create (name None) or replace: either stores the body as given."""
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, f"request body for {res.resource} must be an object with metadata")
        if not body["metadata"].get("name") or name not in (None, body["metadata"]["name"]):
            raise ApiError(400, f"metadata.name {body['metadata'].get('name')!r} does not name {name!r}")
        return self._store(res, body)

    def open_watch(self, res: _Resource, query: dict[str, str], conn: socket.socket) -> tuple[_Watcher | None, list]:
        """Register a watcher; returns it with the events to send first (an ERROR ends the stream)."""
        rv_text = query.get("resourceVersion", "")
        try:
            since = int(rv_text)
        except ValueError:
            raise ApiError(400, f"resourceVersion {rv_text!r}: this double serves watches from a resourceVersion "
                           "only") from None
        with self._lock:
            if since < self._compacted_rv:
                return None, [ApiError(410, f"too old resource version: {since} ({self._compacted_rv})")]
            initial = [e for e in self._history if e.rv > since and e.gvr == res.gvr]
            watcher = _Watcher(conn, silent=self._silent_next > 0)
            self._silent_next = max(0, self._silent_next - 1)
            self._watchers.add(watcher)
        return watcher, initial

    def close_watch(self, watcher: _Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    def bookmark_rv(self, watcher: _Watcher) -> int | None:
        """The current rv if this watcher has been handed every event up to it."""
        with self._lock:
            return self._rv if watcher.queue.empty() else None


def _hung_up(conn: socket.socket) -> bool:
    """Whether the client closed its end (nothing else arrives on a watch connection)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeApiServer  # set on the subclass built in start()

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def setup(self) -> None:
        super().setup()
        with self.fake._lock:
            self.fake._connections.add(self.connection)

    def finish(self) -> None:
        with self.fake._lock:
            self.fake._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        fake = self.fake
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        failure = fake._record(method, parts.path, query)
        try:
            if failure is not None:
                code, message = failure
                raise ApiError(code, message or f"injected failure ({code})")
            if unserved := [k for k in _UNSERVED_QUERY if query.get(k)]:
                raise ApiError(400, f"{', '.join(unserved)}: not served by this double")
            body = json.loads(raw) if raw else None
            res, name = fake._route(parts.path)
            if method == "GET" and name is None:
                if query.get("watch", "").lower() in ("1", "true"):
                    self._watch(res, query)
                    return
                self._send_json(200, fake.list(res, query))
            elif method == "GET":
                self._send_json(200, fake.get(res, name))
            elif method == "POST" and name is None:
                self._send_json(201, fake.write(res, body, None))
            elif method == "PUT" and name is not None:
                self._send_json(200, fake.write(res, body, name))
            else:
                raise ApiError(405, f"method {method} not allowed on {parts.path}")
        except json.JSONDecodeError as exc:
            self._send_json(400, ApiError(400, f"request body is not JSON: {exc}").status())
        except ApiError as exc:
            self._send_json(exc.code, exc.status())

    def _send_json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, event_type: str, obj: dict) -> None:
        data = json.dumps({"type": event_type, "object": obj}).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _watch(self, res: _Resource, query: dict[str, str]) -> None:
        fake = self.fake
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("1", "true")
        watcher, initial = fake.open_watch(res, query, self.connection)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            ending = self._events(watcher, initial, res, bookmarks)
        except OSError:  # the client went away
            ending = _DROP
        finally:
            if watcher is not None:
                fake.close_watch(watcher)
        if ending is _DROP:
            self.close_connection = True
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _events(self, watcher: _Watcher | None, initial: list, res: _Resource, bookmarks: bool) -> object:
        for item in initial:
            if isinstance(item, ApiError):
                self._chunk("ERROR", item.status())
                return _END
            if watcher is not None and watcher.silent:
                break
            self._chunk(item.type, item.obj)
        if watcher is None:
            return _END
        next_bookmark = time.monotonic() + self.fake.bookmark_interval
        while True:
            if watcher.silent:
                timeout = 0.05  # look for the client hanging up
            else:
                timeout = max(0.0, next_bookmark - time.monotonic()) if bookmarks else None
            try:
                item = watcher.queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _DROP or item is _END:
                return item
            if watcher.silent:
                if _hung_up(self.connection):
                    return _DROP
                continue
            if isinstance(item, _Event) and item.gvr == res.gvr:
                self._chunk(item.type, item.obj)
            now = time.monotonic()
            if bookmarks and now >= next_bookmark:
                rv = self.fake.bookmark_rv(watcher)
                if rv is not None:
                    self._chunk("BOOKMARK", {"kind": res.kind, "apiVersion": res.api_version,
                                             "metadata": {"resourceVersion": str(rv)}})
                    next_bookmark = now + self.fake.bookmark_interval


# ---------------------------------------------------------------------------------------------
# client helpers


def make_api_client(server: FakeApiServer) -> k8s_client.ApiClient:
    """An ApiClient of the official library talking plain HTTP to `server`."""
    config = k8s_client.Configuration()
    config.host = server.url
    config.proxy = None  # never route 127.0.0.1 through an environment proxy
    return k8s_client.ApiClient(config)


def write_kubeconfig(server: FakeApiServer, path: Path) -> Path:
    """A kubeconfig with one context pointing at `server` (token auth, ignored by the server)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config))
    return path

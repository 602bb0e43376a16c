"""An in-process Kubernetes API server for tests, spoken to by the real `kubernetes` client.

It keeps objects in memory with list/watch semantics close to the real apiserver's: one global
resourceVersion, a bounded event history for watch replay, 410 Expired when a watch starts
before that history, bookmarks, timeoutSeconds, and test controls to break things on purpose.

Known simplifications: strategic merge patch is applied as a JSON merge patch (lists are
replaced, not merged by key); list continue tokens page over the latest state, not a snapshot;
field selectors accept any dotted path; watches without timeoutSeconds stay open until closed.
"""

from __future__ import annotations

import base64
import collections
import copy
import json
import queue
import re
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from kubernetes import client as k8s_client

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


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
    namespaced: bool
    status_subresource: bool

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
    old: dict | None


class ApiError(Exception):
    """Becomes a `Status` reply (or an ERROR watch event)."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.message = message
        self.details = details

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


# ---------------------------------------------------------------------------------------------
# selectors and patches


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses (`a in (x,y),b`)."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


_LABEL_NOT_EXISTS = re.compile(r"^!\s*([^\s=!(),]+)$")
_LABEL_SET = re.compile(r"^([^\s=!(),]+)\s+(in|notin)\s*\(([^)]*)\)$")
_LABEL_EQ = re.compile(r"^([^\s=!(),]+)\s*(==|!=|=)\s*([^\s=!(),]*)$")
_LABEL_EXISTS = re.compile(r"^([^\s=!(),]+)$")


def parse_label_selector(text: str) -> Callable[[dict], bool]:
    """Label selector grammar of the apiserver: =, ==, !=, in, notin, key, !key."""
    checks: list[Callable[[dict], bool]] = []
    for term in _split_top_level(text):
        if m := _LABEL_NOT_EXISTS.match(term):
            checks.append(lambda labels, k=m[1]: k not in labels)
        elif m := _LABEL_SET.match(term):
            values = {v.strip() for v in m[3].split(",") if v.strip()}
            if m[2] == "in":
                checks.append(lambda labels, k=m[1], vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=m[1], vs=values: labels.get(k) not in vs)
        elif m := _LABEL_EQ.match(term):
            if m[2] == "!=":
                checks.append(lambda labels, k=m[1], v=m[3]: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=m[1], v=m[3]: labels.get(k) == v)
        elif m := _LABEL_EXISTS.match(term):
            checks.append(lambda labels, k=m[1]: k in labels)
        else:
            raise ApiError(400, f"unable to parse requirement: {term!r} in labelSelector {text!r}")
    return lambda obj: all(check((obj.get("metadata") or {}).get("labels") or {}) for check in checks)


_FIELD_TERM = re.compile(r"^([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*)$")


def _field_value(obj: dict, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str) -> Callable[[dict], bool]:
    """`path=value`, `path==value`, `path!=value`, comma-separated, ANDed."""
    checks: list[Callable[[dict], bool]] = []
    for term in _split_top_level(text):
        m = _FIELD_TERM.match(term)
        if not m:
            raise ApiError(400, f"invalid field selector term {term!r} in fieldSelector {text!r}")
        path, op, want = m[1], m[2], m[3].strip()
        if op == "!=":
            checks.append(lambda obj, p=path, w=want: _field_value(obj, p) != w)
        else:
            checks.append(lambda obj, p=path, w=want: _field_value(obj, p) == w)
    return lambda obj: all(check(obj) for check in checks)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"json patch path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        else:
            doc = doc[part]
    return doc


def json_patch(doc: dict, ops: list) -> dict:
    """RFC 6902 operations add, remove, replace, test, move, copy."""
    doc = copy.deepcopy(doc)
    for op in ops:
        try:
            kind = op["op"]
            parts = _pointer(op["path"])
            if kind == "test":
                if _walk(doc, parts) != op["value"]:
                    raise ApiError(422, f"json patch test failed at {op['path']!r}")
                continue
            if kind in ("move", "copy"):
                source = _pointer(op["from"])
                value = copy.deepcopy(_walk(doc, source))
                if kind == "move":
                    parent = _walk(doc, source[:-1])
                    del parent[int(source[-1]) if isinstance(parent, list) else source[-1]]
                kind, op = "add", {"value": value}
            if not parts:
                raise ApiError(422, "json patch may not replace the whole object")
            parent = _walk(doc, parts[:-1])
            last = parts[-1]
            if kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(last)] = op["value"]
                else:
                    if last not in parent:
                        raise ApiError(422, f"json patch replace of missing path {'/' + '/'.join(parts)!r}")
                    parent[last] = op["value"]
            elif kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if last == "-" else int(last), op["value"])
                else:
                    parent[last] = op["value"]
            else:
                raise ApiError(422, f"unsupported json patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, f"json patch operation {op!r} failed: {exc!r}") from None
    return doc


# ---------------------------------------------------------------------------------------------
# the server


@dataclass(frozen=True, slots=True)
class _Route:
    res: _Resource
    namespace: str | None  # None = cluster-scoped resource or all namespaces
    name: str | None
    subresource: str | None


class _Watcher:
    """One open watch connection; the store pushes events into its queue under the lock."""

    def __init__(self, conn: socket.socket):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.conn = conn


_DROP = object()  # close the connection abruptly
_END = object()  # end the stream cleanly


class FakeApiServer:
    def __init__(self, *, history_size: int = 1000, bookmark_interval: float = 1.0):
        self.bookmark_interval = bookmark_interval
        self._lock = threading.RLock()
        self._resources: dict[tuple[str, str, str], _Resource] = {}
        self._objects: dict[tuple[str, str, str, str, str], dict] = {}
        self._rv = 0
        self._history: collections.deque[_Event] = collections.deque(maxlen=history_size)
        self._compacted_rv = 0  # watches from an rv below this get 410
        self._watchers: set[_Watcher] = set()
        self._connections: set[socket.socket] = set()
        self._requests: list[RecordedRequest] = []
        self._failures: tuple[int, int, str | None] = (0, 500, None)  # (count left, status, message)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "FakeApiServer":
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True)
        self._thread.start()
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

    def register(self, *, group: str = "", version: str = "v1", resource: str, kind: str,
                 namespaced: bool, status_subresource: bool = False) -> None:
        res = _Resource(group, version, resource, kind, namespaced, status_subresource)
        with self._lock:
            self._resources[res.gvr] = res

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

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
        meta = obj.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace")
        if not name:
            raise ValueError(f"put_object({resource}): metadata.name is required")
        if res.namespaced and not namespace:
            raise ValueError(f"put_object({resource}/{name}): metadata.namespace is required")
        with self._lock:
            old = self._objects.get(self._key(res, namespace, name))
            stored = self._store(res, copy.deepcopy(obj), old, "MODIFIED" if old else "ADDED")
            return copy.deepcopy(stored)

    def delete_object(self, resource: str, name: str, *, namespace: str | None = None,
                      group: str = "", version: str = "v1") -> dict:
        """Delete, emitting DELETED; raises KeyError when absent."""
        res = self._resource(group, version, resource)
        with self._lock:
            key = self._key(res, namespace, name)
            if key not in self._objects:
                raise KeyError(f"{resource} {namespace + '/' if namespace else ''}{name} not found")
            return copy.deepcopy(self._remove(res, key))

    def get_object(self, resource: str, name: str, *, namespace: str | None = None,
                   group: str = "", version: str = "v1") -> dict | None:
        res = self._resource(group, version, resource)
        with self._lock:
            obj = self._objects.get(self._key(res, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, resource: str, *, group: str = "", version: str = "v1") -> list[dict]:
        res = self._resource(group, version, resource)
        with self._lock:
            return [copy.deepcopy(o) for k, o in sorted(self._objects.items()) if k[:3] == res.gvr]

    # -- test controls ----------------------------------------------------------------------

    def drop_watches(self) -> None:
        """Close every open watch connection without ending the chunked stream."""
        self._end_watches(_DROP)

    def end_watches(self) -> None:
        """End every open watch stream cleanly, as a server-side timeout does."""
        self._end_watches(_END)

    def compact(self) -> None:
        """Forget the event history: a watch from any rv before now gets 410 Expired."""
        with self._lock:
            self._history.clear()
            self._compacted_rv = self._rv

    def fail_next(self, n: int, status: int = 500, message: str | None = None) -> None:
        """The next n requests (of any kind) answer `status` with a Status body.

        Replaces failures still pending, so `fail_next(0)` heals the server.
        """
        with self._lock:
            self._failures = (n, status, message)

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

    @staticmethod
    def _key(res: _Resource, namespace: str | None, name: str) -> tuple[str, str, str, str, str]:
        return (*res.gvr, namespace or "", name)

    def _emit(self, event_type: str, res: _Resource, obj: dict, old: dict | None) -> None:
        # Called with the lock held; the rv was already bumped and stamped into obj.
        if len(self._history) == self._history.maxlen:
            self._compacted_rv = self._history[0].rv
        event = _Event(self._rv, event_type, res.gvr, obj, old)
        self._history.append(event)
        for watcher in self._watchers:
            watcher.queue.put(event)

    def _store(self, res: _Resource, obj: dict, old: dict | None, event_type: str) -> dict:
        meta = dict(obj.get("metadata") or {})
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        if not res.namespaced:
            meta.pop("namespace", None)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        obj = {**obj, "apiVersion": res.api_version, "kind": res.kind, "metadata": meta}
        self._objects[self._key(res, meta.get("namespace"), meta["name"])] = obj
        self._emit(event_type, res, obj, old)
        return obj

    def _remove(self, res: _Resource, key: tuple) -> dict:
        old = self._objects.pop(key)
        self._rv += 1
        gone = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self._rv)}}
        self._emit("DELETED", res, gone, None)
        return gone

    def _record(self, method: str, path: str, query: dict[str, str]) -> tuple[int, str | None] | None:
        with self._lock:
            self._requests.append(RecordedRequest(method, path, query))
            left, status, message = self._failures
            if left <= 0:
                return None
            self._failures = (left - 1, status, message)
            return status, message

    def _route(self, path: str) -> _Route:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        with self._lock:
            resources = dict(self._resources)
        namespace = None
        # /namespaces/<ns>/<resource>... unless it addresses the namespace object itself.
        if len(rest) >= 3 and rest[0] == "namespaces" and (group, version, rest[2]) in resources:
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3 or (group, version, rest[0]) not in resources:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        res = resources[(group, version, rest[0])]
        if namespace is not None and not res.namespaced:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and not (sub == "status" and res.status_subresource):
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        if res.namespaced and name is not None and namespace is None:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        return _Route(res, namespace, name, sub)

    def _not_found(self, route: _Route) -> ApiError:
        return ApiError(404, f'{route.res.resource} "{route.name}" not found',
                        details={"name": route.name, "group": route.res.group, "kind": route.res.resource})

    def _conflict(self, route: _Route) -> ApiError:
        return ApiError(409, f'Operation cannot be fulfilled on {route.res.resource} "{route.name}": the object '
                        "has been modified; please apply your changes to the latest version and try again",
                        reason="Conflict",
                        details={"name": route.name, "group": route.res.group, "kind": route.res.resource})

    # -- verbs --------------------------------------------------------------------------------

    def _matcher(self, route: _Route, query: dict[str, str]) -> Callable[[dict], bool]:
        by_label = parse_label_selector(query.get("labelSelector", ""))
        by_field = parse_field_selector(query.get("fieldSelector", ""))
        namespace = route.namespace

        def matches(obj: dict) -> bool:
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                return False
            return by_label(obj) and by_field(obj)

        return matches

    def list(self, route: _Route, query: dict[str, str]) -> dict:
        matches = self._matcher(route, query)
        with self._lock:
            items = sorted(
                ((k[3], k[4]), o) for k, o in self._objects.items() if k[:3] == route.res.gvr and matches(o)
            )
            rv = self._rv
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token := query.get("continue"):
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
            except ValueError:
                raise ApiError(400, f"invalid continue token {token!r}") from None
            items = [(k, o) for k, o in items if k > after]
        limit = int(query.get("limit") or 0)
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(items[-1][0]).encode()).decode()
        return {
            "kind": route.res.kind + "List",
            "apiVersion": route.res.api_version,
            "metadata": meta,
            "items": [o for _, o in items],
        }

    def get(self, route: _Route) -> dict:
        with self._lock:
            obj = self._objects.get(self._key(route.res, route.namespace, route.name))
        if obj is None:
            raise self._not_found(route)
        return obj

    def _check_body(self, route: _Route, body: Any, name: str | None) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, f"request body for {route.res.resource} must be a JSON object")
        for field, want in (("apiVersion", route.res.api_version), ("kind", route.res.kind)):
            if body.get(field) not in (None, want):
                raise ApiError(400, f"{field} {body.get(field)!r} does not match {want!r} for {route.res.resource}")
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(422, f"{route.res.kind}: metadata: Required value")
        if route.res.namespaced:
            if meta.get("namespace") not in (None, route.namespace):
                raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the request")
            meta = {**meta, "namespace": route.namespace}
        if name is not None and meta.get("name") not in (None, name):
            raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})")
        return {**body, "metadata": meta}

    def create(self, route: _Route, body: Any) -> dict:
        if route.namespace is None and route.res.namespaced:
            raise ApiError(405, f"create {route.res.resource} needs a namespace in the path")
        obj = self._check_body(route, body, None)
        meta = dict(obj["metadata"])
        meta.pop("resourceVersion", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, f"{route.res.kind}: metadata.name: Required value: name or generateName is required")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        obj["metadata"] = meta
        with self._lock:
            key = self._key(route.res, route.namespace, meta["name"])
            if key in self._objects:
                raise ApiError(409, f'{route.res.resource} "{meta["name"]}" already exists', reason="AlreadyExists",
                               details={"name": meta["name"], "group": route.res.group, "kind": route.res.resource})
            return self._store(route.res, obj, None, "ADDED")

    def _write(self, route: _Route, old: dict, new: dict) -> dict:
        """Apply the status-subresource rules, the rv precondition, and store."""
        if route.res.status_subresource:
            if route.subresource == "status":
                new = {**old, "status": new.get("status"), "metadata": {**old["metadata"],
                       "resourceVersion": new["metadata"].get("resourceVersion")}}
            else:
                new = {**new, "status": old.get("status")}
            if new.get("status") is None:
                new.pop("status")
        given = new["metadata"].get("resourceVersion")
        if given and given != old["metadata"]["resourceVersion"]:
            raise self._conflict(route)
        return self._store(route.res, new, old, "MODIFIED")

    def replace(self, route: _Route, body: Any) -> dict:
        obj = self._check_body(route, body, route.name)
        obj["metadata"] = {**obj["metadata"], "name": route.name}
        with self._lock:
            old = self._objects.get(self._key(route.res, route.namespace, route.name))
            if old is None:
                raise self._not_found(route)
            return self._write(route, old, obj)

    def patch(self, route: _Route, body: Any, content_type: str) -> dict:
        with self._lock:
            old = self._objects.get(self._key(route.res, route.namespace, route.name))
            if old is None:
                raise self._not_found(route)
            if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if not isinstance(body, dict):
                    raise ApiError(400, f"{content_type} body must be a JSON object")
                new = merge_patch(old, body)
                rv = (body.get("metadata") or {}).get("resourceVersion")
            elif content_type == "application/json-patch+json":
                if not isinstance(body, list):
                    raise ApiError(400, "application/json-patch+json body must be a JSON array")
                new = json_patch(old, body)
                rv = new["metadata"].get("resourceVersion")
            else:
                raise ApiError(415, f"the body of the request was in an unknown format - accepted media types "
                                    f"include: application/json-patch+json, application/merge-patch+json, "
                                    f"application/strategic-merge-patch+json (got {content_type!r})")
            new = self._check_body(route, new, route.name)
            new["metadata"] = {**new["metadata"], "resourceVersion": rv}
            return self._write(route, old, new)

    def delete(self, route: _Route, body: Any) -> dict:
        preconditions = (body.get("preconditions") if isinstance(body, dict) else None) or {}
        with self._lock:
            key = self._key(route.res, route.namespace, route.name)
            old = self._objects.get(key)
            if old is None:
                raise self._not_found(route)
            for field in ("resourceVersion", "uid"):
                if preconditions.get(field) not in (None, old["metadata"][field]):
                    raise self._conflict(route)
            self._remove(route.res, key)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": route.name, "group": route.res.group, "kind": route.res.resource,
                        "uid": old["metadata"]["uid"]},
        }

    def open_watch(self, route: _Route, query: dict[str, str], conn: socket.socket) -> tuple[_Watcher | None, list]:
        """Register a watcher; returns it with the events to send first (an ERROR ends the stream)."""
        rv_text = query.get("resourceVersion", "")
        with self._lock:
            if rv_text in ("", "0"):
                initial = [_Event(int(o["metadata"]["resourceVersion"]), "ADDED", k[:3], o, None)
                           for k, o in sorted(self._objects.items()) if k[:3] == route.res.gvr]
            else:
                try:
                    since = int(rv_text)
                except ValueError:
                    raise ApiError(400, f"invalid resourceVersion {rv_text!r}") from None
                if since < self._compacted_rv:
                    error = ApiError(410, f"too old resource version: {since} ({self._compacted_rv})")
                    return None, [error]
                initial = [e for e in self._history if e.rv > since and e.gvr == route.res.gvr]
            watcher = _Watcher(conn)
            self._watchers.add(watcher)
        return watcher, initial

    def close_watch(self, watcher: _Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    def bookmark_rv(self, watcher: _Watcher) -> int | None:
        """The current rv if this watcher has been handed every event up to it."""
        with self._lock:
            return self._rv if watcher.queue.empty() else None


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _watch_view(event: _Event, matches: Callable[[dict], bool]) -> tuple[str, dict] | None:
    """What one watcher sees of an event: selector changes turn MODIFIED into ADDED/DELETED."""
    if event.type != "MODIFIED":
        return (event.type, event.obj) if matches(event.obj) else None
    now, before = matches(event.obj), event.old is not None and matches(event.old)
    if now and before:
        return ("MODIFIED", event.obj)
    if now:
        return ("ADDED", event.obj)
    if before:
        return ("DELETED", event.obj)
    return None


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
            body = json.loads(raw) if raw else None
            route = fake._route(parts.path)
            if method == "GET" and route.name is None:
                if query.get("watch", "").lower() in ("1", "true"):
                    self._watch(route, query)
                    return
                self._send_json(200, fake.list(route, query))
            elif method == "GET":
                self._send_json(200, fake.get(route))
            elif method == "POST" and route.name is None and route.subresource is None:
                self._send_json(201, fake.create(route, body))
            elif method == "PUT" and route.name is not None:
                self._send_json(200, fake.replace(route, body))
            elif method == "PATCH" and route.name is not None:
                content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                self._send_json(200, fake.patch(route, body, content_type))
            elif method == "DELETE" and route.name is not None and route.subresource is None:
                self._send_json(200, fake.delete(route, body))
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

    def _watch(self, route: _Route, query: dict[str, str]) -> None:
        fake = self.fake
        matches = fake._matcher(route, query)  # selector errors answer before the stream starts
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout else None
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("1", "true")
        watcher, initial = fake.open_watch(route, query, self.connection)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            ending = self._events(watcher, initial, route, matches, deadline, bookmarks)
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

    def _events(self, watcher: _Watcher | None, initial: list, route: _Route, matches: Callable[[dict], bool],
                deadline: float | None, bookmarks: bool) -> object:
        for item in initial:
            if isinstance(item, ApiError):
                self._chunk("ERROR", item.status())
                return _END
            if view := _watch_view(item, matches):
                self._chunk(*view)
        if watcher is None:
            return _END
        return self._stream(watcher, route, matches, deadline, bookmarks)

    def _stream(self, watcher: _Watcher, route: _Route, matches: Callable[[dict], bool],
                deadline: float | None, bookmarks: bool) -> object:
        fake = self.fake
        next_bookmark = time.monotonic() + fake.bookmark_interval
        while True:
            now = time.monotonic()
            waits = [t - now for t in (deadline, next_bookmark if bookmarks else None) if t is not None]
            try:
                item = watcher.queue.get(timeout=max(0.0, min(waits)) if waits else None)
            except queue.Empty:
                item = None
            if item is _DROP or item is _END:
                return item
            if isinstance(item, _Event) and item.gvr == route.res.gvr and (view := _watch_view(item, matches)):
                self._chunk(*view)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return _END
            if bookmarks and now >= next_bookmark:
                rv = fake.bookmark_rv(watcher)
                if rv is not None:
                    self._chunk("BOOKMARK", {"kind": route.res.kind, "apiVersion": route.res.api_version,
                                             "metadata": {"resourceVersion": str(rv)}})
                    next_bookmark = now + fake.bookmark_interval


# ---------------------------------------------------------------------------------------------
# client helpers and fixtures


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


@pytest.fixture
def fake_apiserver() -> Iterator[FakeApiServer]:
    """A started server with core/v1 nodes registered and a short bookmark interval."""
    with FakeApiServer(bookmark_interval=0.2) as server:
        server.register(group="", version="v1", resource="nodes", kind="Node", namespaced=False)
        yield server


@pytest.fixture
def fake_api_client(fake_apiserver: FakeApiServer) -> Iterator[k8s_client.ApiClient]:
    api_client = make_api_client(fake_apiserver)
    yield api_client
    api_client.close()

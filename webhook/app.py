"""The HTTPS face: POST /validate (and /mutate with steering) for the apiserver, /healthz and /readyz
for the kubelet."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from image_preflight.core.admission.answers import Answer, internal_error, refusal
from image_preflight.core.admission.body import BadReview, parse_review
from image_preflight.core.admission.mutation import steer
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.inventory import Inventory
from image_preflight.webhook.metrics import Metrics
from image_preflight.webhook.protocol import CLIENT_NAMES, CLIENT_VERIFIED
from image_preflight.webhook.tls import CallerNames

MAX_BODY = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0  # the apiserver's default timeoutSeconds
# The largest timeoutSeconds a webhook configuration may hold (pkg/apis/admissionregistration/
# validation/validation.go, validateWebhook: "must be between 1 and 30 seconds"): a caller asking
# for longer is not the apiserver.
MAX_TIMEOUT = 30.0
# Bodies read across several receives at once (the apiserver's arrive whole or within
# milliseconds): beyond this the request is answered 503 at once, so slow senders hold at most
# MAX_SLOW_BODIES * MAX_BODY of memory, well inside the Pod's limit.
MAX_SLOW_BODIES = 16
decision_log = logging.getLogger("image_preflight.decision")
log = logging.getLogger(__name__)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)$")
_TIMEOUT_PARAM = re.compile(r"(?:^|&)timeout=([^&]*)")


@dataclass
class WebhookState:
    inventory: Callable[[], Inventory]  # the current inventory
    ready: Callable[[], bool]  # synced and fresh
    settings: Settings
    metrics: Metrics
    # Writes a decision line directly (service.line_writer); None: through logging.
    write_decision: Callable[[str], None] | None = None
    # Admission paths answer only callers whose certificate the TLS layer verified (--client-ca),
    # and, when given, holds one of these names (--client-name).
    require_client_cert: bool = False
    client_names: CallerNames = CallerNames()


class _TooLarge(Exception):
    pass


def parse_timeout(value: str | None) -> float:
    """The apiserver's `?timeout=10s` (a Go duration), at most MAX_TIMEOUT; unreadable means the
    default."""
    match = _DURATION.match(value or "")
    if not match:
        return DEFAULT_TIMEOUT
    number, unit = float(match.group(1)), match.group(2)
    return min(MAX_TIMEOUT, number / 1000 if unit == "ms" else number * 60 if unit == "m" else number)


class AdmissionEndpoint:
    """POST /validate (or /mutate) as a plain ASGI app: the apiserver calls it for every Job and
    Pod, so it skips the framework's request objects (a third of the time of an answer) and does
    only what the contract needs. `answer` is core.admission.review.admit or core.admission.mutation.steer."""

    def __init__(self, state: WebhookState, answer: Callable[..., Answer] = admit) -> None:
        self.state = state
        self.answer = answer
        self.slow_bodies = 0  # bodies being read across receives now (one event loop: no lock)

    async def __call__(self, scope, receive, send) -> None:
        started = time.perf_counter()
        if self.state.require_client_cert and not scope.get(CLIENT_VERIFIED):
            return await _reply(send, 401, _error("a client certificate from the configured CA is required"),
                                close=True)
        if self.state.client_names and not self.state.client_names.admit(scope.get(CLIENT_NAMES, ((), ()))):
            return await _reply(send, 403, _error(_not_named(scope.get(CLIENT_NAMES, ((), ())))), close=True)
        content_type, declared = b"", b""
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == b"content-length":
                declared = value
        content_type = content_type.split(b";")[0].strip().lower()
        if content_type != b"application/json":
            shown = content_type.decode("latin-1")
            return await _reply(send, 400, _error(f"content type {shown or 'none'!r} is not application/json"))
        if declared.isdigit() and int(declared) > MAX_BODY:
            return await _reply(send, 413, _error(f"body larger than {MAX_BODY} bytes"), close=True)
        try:
            body = await self._body(scope, receive)
        except _TooLarge:
            return await _reply(send, 413, _error(f"body larger than {MAX_BODY} bytes"), close=True)
        except _Busy:
            return await _reply(send, 503, _error(f"{MAX_SLOW_BODIES} bodies already arriving; try again"),
                                close=True)
        except TimeoutError:
            # The rest of the body will not come in time: this connection is done.
            return await _reply(send, 408, _error("body not received before the request's timeout"), close=True)
        except _Disconnected:
            return None
        try:
            review = parse_review(body, loads=orjson.loads)
        except BadReview as exc:
            return await _reply(send, 400, _error(str(exc)))
        try:
            answer = self.answer(review, self.state.inventory(), self.state.settings, now=time.time())
        except BadReview as exc:  # nested too deep to answer
            return await _reply(send, 400, _error(str(exc)))
        except Exception as exc:  # never a 500: the apiserver would apply failurePolicy blindly
            log.exception("decision failed for uid %s", review["request"]["uid"])
            answer = internal_error(review, exc)
        _record(self.state, answer, time.perf_counter() - started)
        await _reply(send, 200, _dumps(answer.review))

    async def _body(self, scope, receive) -> bytes:
        # The apiserver's body usually arrives with its headers: then no deadline is needed.
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        first = message.get("body", b"")
        if not message.get("more_body", False):
            return first
        if len(first) > MAX_BODY:
            raise _TooLarge
        if self.slow_bodies >= MAX_SLOW_BODIES:
            raise _Busy
        timeout = _TIMEOUT_PARAM.search(scope.get("query_string", b"").decode("latin-1"))
        self.slow_bodies += 1
        try:
            # Answer well inside the apiserver's deadline; past it nobody is listening.
            async with asyncio.timeout(parse_timeout(timeout.group(1) if timeout else None) * 0.9):
                return first + await _read_body(receive, len(first))
        finally:
            self.slow_bodies -= 1


class _Disconnected(Exception):
    pass


class _Busy(Exception):
    pass


async def _read_body(receive, size: int = 0) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _not_named(found: tuple[tuple[str, ...], tuple[str, ...]]) -> str:
    """Why a verified certificate is refused, in one line: the names it holds, none of them allowed."""
    common, dns = found
    held = ", ".join([*(f"CN {name!r}" for name in common), *(f"DNS {name!r}" for name in dns)]) or "no name"
    return f"the client certificate ({held[:200]}) names no caller allowed by --client-name"


def _dumps(value: object) -> bytes:
    """One JSON encode per answer. A lone surrogate (a node name from a snapshot file's escapes)
    is not UTF-8, which orjson refuses: then the standard library escapes it, still valid JSON."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _error(message: str) -> bytes:
    return _dumps(refusal(message))


async def _reply(send, status: int, body: bytes, *, close: bool = False) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))  # uvicorn closes the connection after this answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _AdmissionFirst:
    """POST to an admission path goes straight to its endpoint; everything else is FastAPI's.

    Routed through FastAPI (its middleware stack and router), the review of
    benchmarks/webhook_load.py took 13-16 µs more in process, and `webhook_load.py --fastapi`
    measured 0.42x and 0.38x the bare stack beside 0.53x and 0.52x for this dispatch (two runs,
    2026-12-03, docs/benchmarks.md): below the 0.5x the webhook must keep, so the admission paths
    skip it."""

    def __init__(self, endpoints: dict[str, AdmissionEndpoint], app: FastAPI) -> None:
        self.endpoints, self.fastapi = endpoints, app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is not None:
                return await endpoint(scope, receive, send)
        return await self.fastapi(scope, receive, send)


def create_app(state: WebhookState) -> _AdmissionFirst:
    endpoints = {"/validate": AdmissionEndpoint(state)}
    if state.settings.steer:
        endpoints["/mutate"] = AdmissionEndpoint(state, steer)
    app = FastAPI(title="image-preflight", docs_url=None, redoc_url=None, openapi_url=None)
    for path, endpoint in endpoints.items():
        # Another method on an admission path reaches FastAPI, whose route for it answers 405.
        # Starlette's Route takes an ASGI app as its endpoint; add_route's annotation names only
        # the request-function form.
        app.add_route(path, cast("Callable[[Request], Awaitable[Response]]", endpoint), methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if state.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "inventory not synced or stale"}, status_code=503)

    return _AdmissionFirst(endpoints, app)


def _record(state: WebhookState, answer: Answer, elapsed: float) -> None:
    state.metrics.count(answer.kind, answer.operation, answer.decision, elapsed)
    if state.write_decision is not None or decision_log.isEnabledFor(logging.INFO):
        record = answer.log_record()
        record["latency_ms"] = round(elapsed * 1e6) / 1000  # to the microsecond; round(x, 3) costs twice
        line = _dumps(record).decode("utf-8")
        (state.write_decision or decision_log.info)(line)

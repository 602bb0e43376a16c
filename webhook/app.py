"""The HTTPS face: POST /validate for the apiserver, /healthz and /readyz for the kubelet."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route

from image_preflight.core.admission import BadReview, Outcome, Settings, admit, parse_review
from image_preflight.core.inventory import Inventory
from image_preflight.webhook.metrics import Metrics

MAX_BODY = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0  # the apiserver's default timeoutSeconds
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


class _TooLarge(Exception):
    pass


def parse_timeout(value: str | None) -> float:
    """The apiserver's `?timeout=10s` (a Go duration); unreadable means the default."""
    match = _DURATION.match(value or "")
    if not match:
        return DEFAULT_TIMEOUT
    number, unit = float(match.group(1)), match.group(2)
    return number / 1000 if unit == "ms" else number * 60 if unit == "m" else number


class AdmissionEndpoint:
    """POST /validate as a plain ASGI app: the apiserver calls it for every Job and Pod, so it
    skips the framework's request objects (a third of the time of an answer) and does only
    what the contract needs."""

    def __init__(self, state: WebhookState) -> None:
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        started = time.perf_counter()
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")
        if content_type != "application/json":
            return await _reply(send, 400, _error(f"content type {content_type or 'none'!r} is not application/json"))
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > MAX_BODY:
            return await _reply(send, 413, _error(f"body larger than {MAX_BODY} bytes"))
        timeout = _TIMEOUT_PARAM.search(scope.get("query_string", b"").decode("latin-1"))
        try:
            # Answer well inside the apiserver's deadline; past it nobody is listening.
            async with asyncio.timeout(parse_timeout(timeout.group(1) if timeout else None) * 0.9):
                body = await _read_body(receive)
        except _TooLarge:
            return await _reply(send, 413, _error(f"body larger than {MAX_BODY} bytes"))
        except TimeoutError:
            return await _reply(send, 408, _error("body not received before the request's timeout"))
        except _Disconnected:
            return None
        try:
            review = parse_review(body)
        except BadReview as exc:
            return await _reply(send, 400, _error(str(exc)))
        try:
            outcome = admit(review, self.state.inventory(), self.state.settings, now=time.time())
        except Exception as exc:  # never a 500: the apiserver would apply failurePolicy blindly
            log.exception("decision failed for uid %s", review["request"]["uid"])
            outcome = _internal_error(review, exc)
        _record(self.state.metrics, outcome, time.perf_counter() - started)
        await _reply(send, 200, json.dumps(outcome.review, separators=(",", ":")).encode())


class _Disconnected(Exception):
    pass


async def _read_body(receive) -> bytes:
    chunks, size = [], 0
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


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _reply(send, status: int, body: bytes) -> None:
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})


class _AdmissionFirst:
    """POST /validate goes straight to the endpoint; the framework's middleware layers would
    otherwise take as long as the decision itself. Everything else is FastAPI's."""

    def __init__(self, endpoint: AdmissionEndpoint, app: FastAPI) -> None:
        self.endpoint, self.fastapi = endpoint, app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/validate":
            return await self.endpoint(scope, receive, send)
        return await self.fastapi(scope, receive, send)


def create_app(state: WebhookState) -> _AdmissionFirst:
    endpoint = AdmissionEndpoint(state)
    app = FastAPI(title="image-preflight", docs_url=None, redoc_url=None, openapi_url=None)
    app.router.routes.append(Route("/validate", endpoint, methods=["POST"]))

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if state.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "inventory not synced or stale"}, status_code=503)

    return _AdmissionFirst(endpoint, app)


def _internal_error(review: dict, exc: Exception) -> Outcome:
    request = review["request"]
    response = {
        "uid": request["uid"],
        "allowed": True,
        "warnings": [f"image-preflight: internal error, not checked ({type(exc).__name__})"],
    }
    return Outcome(
        review={"apiVersion": review["apiVersion"], "kind": review["kind"], "response": response},
        decision="error",
        uid=request["uid"],
        operation=str(request.get("operation", "")),
        detail=str(exc),
    )


def _record(metrics: Metrics, outcome: Outcome, elapsed: float) -> None:
    metrics.requests.labels(outcome.kind or "-", outcome.operation or "-", outcome.decision).inc()
    metrics.latency.observe(elapsed)
    record = outcome.log_record()
    record["latency_ms"] = round(elapsed * 1000, 3)
    decision_log.info(json.dumps(record, separators=(",", ":")))
